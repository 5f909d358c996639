"""Locust headless as a subprocess, watched: scenario files, a run that snapshots its records at the first failure,
and checks that no record line was lost or rewritten. Used by the fault tests and tools/fault_table.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from loadtest.server_process import ROOT
from ttsrecords.records import REQUEST_SCHEMA, SCENARIO_SCHEMA

LOCUST = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "tts.py")]


def write_scenario(tmp_path: Path, steps=(4,), warmup=0.5, measure=3.0, drain=0.5, timeout_s=30, name="fault",
                   seed=7, **extra) -> Path:
    """A scenario file (JSON is YAML) in tmp_path: a short/medium prompt mix, the given steps and phase lengths."""
    doc = {"schema": SCENARIO_SCHEMA, "name": name, "seed": seed, "mix": {"short": 3, "medium": 1, "long": 0},
           "timeout_s": timeout_s, "phases": {"warmup_s": warmup, "measure_s": measure, "drain_s": drain},
           "steps": list(steps), **extra}
    p = tmp_path / f"{name}.yaml"
    p.write_text(json.dumps(doc))  # JSON is YAML
    return p


def damaged_lines(path: Path) -> tuple[list[dict], list[str]]:
    """(records, what is damaged): lines that do not parse and a missing final newline. The record reader skips a
    truncated last line on purpose; this is the check that none was written."""
    if not path.exists():
        return [], []
    raw = path.read_bytes().decode("utf-8", "replace")
    problems = [] if raw == "" or raw.endswith("\n") else [f"{path}: last line truncated: {raw[-200:]!r}"]
    recs = []
    for i, line in enumerate(raw.split("\n")[:-1]):  # whole lines only: a partial last one is counted above
        try:
            recs.append(json.loads(line))
        except ValueError as e:
            problems.append(f"{path}:{i + 1} is not valid JSON ({e}): {line[:200]!r}")
    return recs, problems


def intact_lines(path: Path) -> list[dict]:
    """Every line of a JSONL file parses and the file ends with a newline: no truncated record."""
    recs, problems = damaged_lines(path)
    assert not problems, problems[:3]
    return recs


def complete_lines(path: Path) -> list[str]:
    """The whole lines of a file that may be being appended to right now (a partial last line is left out)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    return raw.decode("utf-8", "replace").split("\n")[:-1]


class WatchedRun:
    """Locust headless in the background; snapshots requests.jsonl at the first failed record (the fault moment).

    After the run, `before` holds the lines that existed when the fault was first seen; a test checks they are all
    still there, unchanged and in order (records written before a fault are never lost or rewritten).
    """

    def __init__(self, url: str, scenario: Path, run_dir: Path, *extra: str, env: dict | None = None):
        self.run_dir = run_dir
        self.cmd = [*LOCUST, "--headless", "--host", url, "--scenario", str(scenario), "--run-dir", str(run_dir),
                    "--csv", str(run_dir / "locust"), "--only-summary", *extra]
        self.env = env
        self.before: list[str] | None = None
        self.elapsed: float | None = None
        self.returncode: int | None = None
        self.output = ""

    def run(self, timeout_s: float = 60.0, fault_seen=None) -> WatchedRun:
        """fault_seen: optional callable; default = a failed record is in the file."""
        req = self.run_dir / "requests.jsonl"
        seen = fault_seen or (lambda: any('"ok":false' in line for line in complete_lines(req)))
        t0 = time.monotonic()
        with open(self.run_dir.parent / f"{self.run_dir.name}.out", "w+") as out:
            proc = subprocess.Popen(self.cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=self.env)
            try:
                while proc.poll() is None:
                    if self.before is None and seen():
                        self.before = complete_lines(req)
                    if time.monotonic() - t0 > timeout_s:
                        raise AssertionError(f"Locust still running after {timeout_s} s")
                    time.sleep(0.05)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
            out.seek(0)
            self.output = out.read()
        self.elapsed = time.monotonic() - t0
        self.returncode = proc.returncode
        return self

    def records(self) -> list[dict]:
        return intact_lines(self.run_dir / "requests.jsonl")

    def check_kept(self) -> list[dict]:
        """Files intact, manifest counts every line, and every line seen at the fault moment is still there."""
        recs = self.records()
        counters = intact_lines(self.run_dir / "counters.jsonl")
        man = json.loads((self.run_dir / "manifest.json").read_text())
        assert man["requests_lines"] == len(recs) and man["counters_lines"] == len(counters)
        assert self.before is not None, "the fault was never seen in the records"
        final = (self.run_dir / "requests.jsonl").read_text().split("\n")[:-1]
        assert final[: len(self.before)] == self.before, "records written before the fault changed or vanished"
        for r in recs:
            assert r["schema"] == REQUEST_SCHEMA
            assert r["ok"] == (r["error"] is None), r
        return recs

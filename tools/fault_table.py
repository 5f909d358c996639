"""Writes reports/bench/faults.md: every simulator fault class through Locust and through the A/B runner, what the
suite did, and how many records were lost. `python -m tools.fault_table` (a few minutes; not part of `make test`;
the assertions live in tests/test_faults_locust.py and tests/test_faults_ab.py, this only tabulates one run of each).

Records lost = lines present in requests.jsonl at the first failed record (the fault moment) that are missing or
changed at the end, plus lines that do not parse, plus the difference to the manifest's line count.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadtest.server_process import ROOT
from tools.locust_run import WatchedRun, damaged_lines, write_scenario
from tools.sim_server import SimServer

LOCUST_FAULTS = [
    ("killed mid-step", "faults.kill_after_steps=150", []),
    ("hung (accepts, never answers)", "faults.hang_after_requests=6", ["--request-timeout", "1.5"]),
    ("5xx burst (20 x 503)", "faults.error_burst={after: 10, length: 20, status: 503}", []),
    ("stream cut after first chunk (every 3rd)", "faults.cut_stream_every=3", []),
    ("malformed audio, stream (every 4th)", "faults.malformed_audio_every=4", []),
    ("malformed audio, wav (every 4th)", "faults.malformed_audio_every=4", ["--mode", "wav"]),
]
AB_FAULTS = [
    ("killed mid-step", "faults.kill_after_steps=100", []),
    ("hung after 5 requests", "faults.hang_after_requests=5", []),
    ("hung from the start", "faults.hang_after_requests=0", ["--ready-timeout", "8"]),
    ("5xx burst", "faults.error_burst={after: 3, length: 5, status: 500}", []),
    ("stream cut (every 2nd)", "faults.cut_stream_every=2", []),
    ("malformed audio (every 2nd)", "faults.malformed_audio_every=2", []),
    ("slow readiness (30 s > --ready-timeout 8)", "faults.slow_readiness_s=30", ["--ready-timeout", "8"]),
]


EXTRA = """## Also covered by tests, not tabulated

- Slow readiness under Locust alone: `--ready-timeout` (default 10 s) polls `/health`; a server that binds 3 s late gets
  a clean run with no failed record; one that is not ready in time gives one `error: server ... not ready within N s`
  line, exit 1 and no run folder (tests/test_faults_locust.py).
- SIGTERM and SIGINT in the middle of a Locust measure phase: exit within seconds, manifest written, every line written
  before the signal still there (before this issue, SIGTERM killed Locust with no manifest: Locust 2.47 installs its
  SIGTERM handler only after a shape run returns).
- Interruption and resume of the A/B runner: tests/test_ab_runner.py (its owner's).
"""


def parse_file(path: Path) -> tuple[list[dict], int]:
    """(records, lines that do not parse or a missing final newline)."""
    recs, problems = damaged_lines(path)
    return recs, len(problems)


def reasons(recs) -> str:
    c = collections.Counter((r["error"] or "")[:38].split(":")[0] for r in recs if not r["ok"])
    return "; ".join(f"{k} x{v}" for k, v in c.most_common(3)) or "-"


def locust_rows(tmp: Path) -> list[str]:
    rows = []
    for i, (name, fault, extra) in enumerate(LOCUST_FAULTS):
        d = tmp / f"l{i}"
        d.mkdir()
        scen = write_scenario(d, measure=3.0)
        with SimServer("fixed", overrides=[fault]) as sim:
            run = WatchedRun(sim.url, scen, d / "run", *extra).run(timeout_s=60)
        recs, bad = parse_file(d / "run" / "requests.jsonl")
        final = (d / "run" / "requests.jsonl").read_text().split("\n")[:-1]
        before = run.before or []
        lost = sum(1 for a, b in zip(before, final, strict=False) if a != b) + max(0, len(before) - len(final)) + bad
        man = json.loads((d / "run" / "manifest.json").read_text())
        lost += abs(man["requests_lines"] - len(recs))
        rows.append(f"| {name} | `{fault}` {' '.join(extra)} | exit {run.returncode} after {run.elapsed:.0f} s; "
                    f"{sum(not r['ok'] for r in recs)} of {len(recs)} records failed: {reasons(recs)} | "
                    f"{len(before)} | {lost} |")
        print(rows[-1], flush=True)
    return rows


def ab_rows(tmp: Path) -> list[str]:
    rows = []
    for i, (name, fault, extra) in enumerate(AB_FAULTS):
        d = tmp / f"ab{i}"
        d.mkdir()
        scen = write_scenario(d, timeout_s=1)
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "loadtest.ab", "--backend", "sim", "--sim-config",
                            "configs/sim/fast.yaml", "--scenario", str(scen), "--rounds", "1", "--aa-rounds", "0",
                            "--levels", "4", "--warmup-s", "0.5", "--measure-s", "1.5", "--drain-s", "0", "--seed", "1",
                            "--out", str(d), "--name", "run", "--b-sim-set", fault, *extra], cwd=ROOT,
                           capture_output=True, text=True, timeout=180)
        took = time.monotonic() - t0
        run = d / "run"
        blocks = {json.loads(f.read_text())["arm"]: (f.parent, json.loads(f.read_text()))
                  for f in run.glob("blocks/*/block.json")}
        bdir, b = blocks["B"]
        recs, bad = parse_file(bdir / "requests.jsonl")
        lost = bad
        lm = bdir / "manifest.json"
        if lm.exists():
            lost += abs(json.loads(lm.read_text())["requests_lines"] - len(recs))
        for f in run.rglob("*.jsonl"):
            lost += parse_file(f)[1] if f != bdir / "requests.jsonl" else 0
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
        in_report = any(x["block_id"] == b["block_id"] for x in summary.get("invalid_blocks", []))
        a_status = blocks["A"][1]["status"]
        rows.append(f"| {name} | `{fault}` {' '.join(extra)} | exit {p.returncode} after {took:.0f} s; A {a_status}, "
                    f"B **{b['status']}**: {b['reason']}; B records: {sum(not r['ok'] for r in recs)} of "
                    f"{len(recs)} failed ({reasons(recs)}); report lists B as invalid: "
                    f"{'yes' if in_report else 'no'} | {lost} |")
        print(rows[-1], flush=True)
    return rows


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="faults-") as t:
        tmp = Path(t)
        lrows = locust_rows(tmp)
        arows = ab_rows(tmp)
    text = "\n".join([
        "# Fault table",
        "",
        f"Generated by `python -m tools.fault_table` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        "simulator `configs/sim/fast.yaml` plus one fault option (`ttssim --set`), on a shared 2-core machine. "
        "The assertions behind each row are in tests/test_faults_locust.py and tests/test_faults_ab.py.",
        "",
        "## Locust headless (4 users, 0.5 s warm-up + 3 s measure + 0.5 s drain)",
        "",
        "Records before fault = lines in requests.jsonl when the first failed record appeared; lost = those missing "
        "or changed at the end + unparsable lines + difference to manifest.json's count.",
        "",
        "| fault | simulator option | what the suite did | records before fault | records lost |",
        "|---|---|---|---|---|",
        *lrows,
        "",
        "## A/B runner + statistics + report (1 round: A healthy, fault in arm B only via --b-sim-set)",
        "",
        "Lost = unparsable lines in any JSONL of the run + difference between B's requests.jsonl and the count in "
        "its Locust manifest.",
        "",
        "| fault | simulator option | what the suite did | records lost |",
        "|---|---|---|---|",
        *arows,
        "",
        EXTRA,
    ])
    out = ROOT / "reports" / "bench" / "faults.md"
    out.write_text(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

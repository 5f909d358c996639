"""A plain Locust run as a Locust user types it: real Locust processes against a real simulator process.

The README's line (`-u 4 -t 20s`, no --scenario) runs one level and ends with a summary and the load-run report; a
server killed mid-run stops the run within seconds with the cause on stderr, in the manifest, on the page and on the
dashboard; SIGTERM stops it as interrupted; a --variant that is not the server's is refused; the bare command fails
before any web line; the web UI binds 127.0.0.1 and runs to a finished run folder through its HTTP API.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from conftest import (
    LOCUST,
    ROOT,
    complete_lines,
    free_port,
    intact_lines,
    listening_addresses,
    locust,
    one_error,
    write_scenario,
)

from loadtest.locust_help import asks_for_our_help
from tools import browser
from tools.sim_server import SimServer
from ttsrecords import records
from ttsreport import board as bd

pytestmark = pytest.mark.slow  # Locust and a simulator, each in its own process

EPOCH = re.compile(r"\b1[6-9]\d{8}(\.\d+)?\b")  # a raw epoch time (seconds since 1970, 2020s-2030s)


def _popen(args: list[str], cwd: Path = ROOT) -> subprocess.Popen:
    return subprocess.Popen([*LOCUST, *args], cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_lines(path: Path, n: int, timeout_s: float = 30.0) -> list[str]:
    end = time.monotonic() + timeout_s
    while len(complete_lines(path)) < n and time.monotonic() < end:
        time.sleep(0.05)
    lines = complete_lines(path)
    assert len(lines) >= n, f"{len(lines)} records after {timeout_s} s"
    return lines


def test_readme_line_runs_one_level_and_writes_its_report(tmp_path):
    """`locust -f loadtest/tts.py --headless --host URL -u 4 -t 20s` from another folder: one level at c=4, a printed
    summary with the report's path, a report with the level, the server's variant and no 'None' or raw epoch."""
    with SimServer("fixed") as sim:
        p = subprocess.run([*LOCUST, "--headless", "--host", sim.url, "-u", "4", "-t", "20s", "--csv",
                            str(tmp_path / "locust")], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "will be ignored" not in p.stderr and "spawn rate is very high" not in p.stderr
    assert "Traceback" not in p.stderr
    assert "one level: 4 user(s)" in p.stderr
    (run,) = (tmp_path / "reports").iterdir()
    report = re.search(r"^report: (.+index\.html)$", p.stdout, re.M)
    assert report and Path(report.group(1)) == (run / "index.html").resolve(), p.stdout[-2000:]
    assert re.search(r"^  c=4: \d+ ok / 0 failed", p.stdout, re.M), p.stdout[-2000:]
    recs = intact_lines(run / "requests.jsonl")
    assert {r["concurrency"] for r in recs} == {4}
    assert {r["variant"] for r in recs} == {"fixed"}  # from the server's /metrics, no --variant given
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "complete" and man["reason"] is None
    assert man["server"]["variant"] == "fixed" and man["server"]["backend"] == "simulated"
    assert [s["concurrency"] for s in man["scenario"]["steps"]] == [4]
    steps = man["scenario"]["steps"][0]
    assert steps["warmup_s"] + steps["measure_s"] + steps["drain_s"] == pytest.approx(20.0)
    html = (run / "index.html").read_text()
    assert "c=4" in html and "variant fixed" in html and "req/s" in html and "audio-s/s" in html
    assert "None" not in html and not EPOCH.search(html), EPOCH.search(html)
    assert "<svg" in html  # the latency CDF of the level
    # one Locust entry per request: no second (TTFA) row, and as many SPEECH requests as records
    stats = (tmp_path / "locust_stats.csv").read_text().splitlines()
    assert not any(line.startswith("TTFA") for line in stats)
    agg = next(line for line in stats if ",Aggregated," in line)
    ended = [r for r in recs if r["error"] != records.CUT_AT_LEVEL_END]  # a drain request cut at the end: no entry
    assert int(agg.split(",")[2]) == len(ended)
    if browser.find_chromium() is not None:
        res = browser.inspect(run / "index.html", tmp_path / "shot.png")
        assert res["problems"] == [] and res["svgs"] >= 1


def test_server_killed_mid_run_stops_within_seconds_with_the_cause(tmp_path):
    run = tmp_path / "run"
    with SimServer("fixed") as sim:
        proc = _popen(["--headless", "--host", sim.url, "-u", "3", "-t", "60s", "--run-dir", str(run)])
        try:
            _wait_lines(run / "requests.jsonl", 5)
            t_kill = time.time()
            sim.proc.kill()
            t0 = time.monotonic()
            out, err = proc.communicate(timeout=60)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 3, err[-3000:]
    # the cause is seen within 10 s; the report is built after (a process of its own)
    cause = [line for line in err.splitlines() if line.startswith("error: the server stopped answering")]
    assert len(cause) == 1 and "refused" in cause[0].lower(), err[-3000:]
    assert took < 60 and "Traceback" not in err
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "failed" and "refused" in man["reason"].lower()
    assert 0 < man["stopped"] - t_kill < 10.0
    recs = intact_lines(run / "requests.jsonl")
    assert man["requests_lines"] == len(recs) and sum(r["ok"] for r in recs) >= 1
    assert "refused" in (run / "index.html").read_text().lower()
    assert "refused" in (run / "summary.md").read_text().lower()
    (row,) = bd.model(tmp_path).runs
    assert row.status == "failed" and any("refused" in n.lower() for n in row.notes)


def test_sigterm_stops_the_run_as_interrupted(tmp_path):
    run = tmp_path / "run"
    with SimServer("fixed") as sim:
        proc = _popen(["--headless", "--host", sim.url, "-u", "3", "-t", "60s", "--run-dir", str(run), "--no-report"])
        try:
            before = _wait_lines(run / "requests.jsonl", 5)
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            out, err = proc.communicate(timeout=60)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 143 and took < 20, (proc.returncode, took)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "interrupted" and man["reason"].startswith("interrupted by SIGTERM")
    assert complete_lines(run / "requests.jsonl")[: len(before)] == before


def test_wrong_variant_is_refused_before_anything_is_written(tmp_path):
    with SimServer("fixed") as sim:
        p = locust(["--headless", "--host", sim.url, "-u", "2", "-t", "10s", "--variant", "original", "--run-dir",
                    str(tmp_path / "r")])
    one_error(p, "--variant original", "reports variant fixed")
    assert not (tmp_path / "r").exists()


def test_options_refused_in_one_line_before_any_web_line():
    p = locust([], timeout=30)
    line = one_error(p, "--host is required")
    assert "Starting web interface" not in p.stderr, line
    p = locust(["--headless", "--host", "http://127.0.0.1:9", "-u", "2", "-t", "30s", "--scenario",
                "configs/scenarios/smoke.yaml"], timeout=30)
    one_error(p, "-u/--users", "-t/--run-time", "--scenario")
    for cmd in ([".venv/bin/python", "loadtest/tts.py", "--help"], [".venv/bin/locust", "-f", "loadtest/tts.py", "--help"],
                [*LOCUST, "--help"]):
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
        for opt in ("--scenario", "--variant", "--keep-going", "--run-dir", "--users", "--web-host"):
            assert opt in p.stdout, (cmd, opt)
    plain = subprocess.run([".venv/bin/locust", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert "--users" in plain.stdout and "--run-dir" not in plain.stdout  # another locustfile's help stays Locust's


def test_web_ui_on_loopback_runs_to_a_finished_run_folder(tmp_path):
    """The web UI binds 127.0.0.1 only; started through its HTTP API it runs the scenario to a run folder."""
    scen = write_scenario(tmp_path, steps=(2,), warmup=0.5, measure=3.0, drain=0.5)
    run, port = tmp_path / "run", free_port()
    with SimServer("fixed") as sim:
        proc = _popen(["--host", sim.url, "--web-port", str(port), "--scenario", str(scen), "--run-dir", str(run)])
        try:
            end = time.monotonic() + 30
            while not listening_addresses(port) and time.monotonic() < end:
                time.sleep(0.1)
            assert listening_addresses(port) == {"0100007F"}  # 127.0.0.1, nothing else
            r = httpx.post(f"http://127.0.0.1:{port}/swarm", data={"user_count": 1, "spawn_rate": 1,
                                                                    "host": sim.url}, timeout=10)
            assert r.status_code == 200, r.text[:300]
            end = time.monotonic() + 60
            while not (run / "index.html").exists() and time.monotonic() < end:
                time.sleep(0.2)
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "complete" and man["server"]["variant"] == "fixed"
    assert {r["concurrency"] for r in intact_lines(run / "requests.jsonl")} == {2}


@pytest.mark.parametrize(("argv", "ours"), [
    (["python", ".venv/bin/locust", "-f", "{tts}", "--help"], True),
    (["python", "-m", "locust", "-h", "--locustfile={tts}"], True),
    (["python", ".venv/bin/locust", "-f{tts},other.py", "-h"], True),
    (["python", ".venv/bin/locust", "-f", "{tts}", "--headless"], False),  # no help asked
    (["python", ".venv/bin/locust", "-f", "other.py", "--help"], False),
    (["python", "-m", "pytest", "--help", "{tts}"], False),  # not locust
])
def test_the_help_hook_acts_only_for_locust_help_on_this_locustfile(argv, ours):
    assert asks_for_our_help([a.format(tts=ROOT / "loadtest" / "tts.py") for a in argv]) is ours

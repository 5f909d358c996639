"""The A/B runner and the report through the simulator's faults (record contract version 2).

One A/B round (two windows, one fresh server start each: design fresh); the fault is switched on for arm B only
(--b-sim-set), so each run shows both sides. Infrastructure faults (the server dies, never gets ready) make B's window
"failed": its round reruns at once in a new attempt (the first kept under attempts/), fails again, and the run goes
on. Failed REQUESTS are data: a window where some requests failed is "complete" and counts them by kind; one where
nothing succeeded is "invalid". Every JSONL file stays intact and the report lists the bad window.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, intact_lines, write_scenario

pytestmark = pytest.mark.slow  # each test runs the A/B runner: two simulator processes and two Locust runs

FAULTS = {
    # fault: (--b-sim-set value, extra args, B's status, what its reason must say (None: no reason), what B's failed
    # records must say, the measure-phase error kind B's window counts)
    # "failed" is infrastructure (the server did not start or died); "invalid": the load ran and nothing succeeded
    "killed": ("faults.kill_after_steps=100", [], "failed", "server died", ("connect", "stream broken"), None),
    # every request after the 5th hangs until its 1 s timeout: nothing in the measure phase succeeds (or, on a slow
    # box, no measure-phase request was even recorded); either way the reason counts "no response"
    "hung": ("faults.hang_after_requests=5", [], "invalid", "no response", ("no response",), None),
    "hung from the start": ("faults.hang_after_requests=0", ["--ready-timeout", "8"], "failed",
                            "not ready within 8 s", None, None),
    # short bursts that repeat every 4 requests: any 3 consecutive requests hold a failure, so the measure phase
    # (1.5 s at c=4, several requests even on a slow box) always sees some, never only the warm-up
    "5xx burst": ("faults.error_burst={after: 2, length: 2, status: 500, every: 4}", [], "complete", None,
                  ("http 500",), "http 500"),
    "cut streams": ("faults.cut_stream_every=2", [], "complete", None, ("stream broken",), "stream broken"),
    "malformed audio": ("faults.malformed_audio_every=2", [], "complete", None, ("odd pcm byte count",),
                        "odd PCM byte count"),
    "slow readiness": ("faults.slow_readiness_s=30", ["--ready-timeout", "8"], "failed", "not ready within 8 s", None,
                       None),
    # ready means ready: /health answers and the stages are up, but the first real request (a Base request with
    # ref_text) kills the engine: the start never counts as ready, no load runs against it
    "engine killed by the first request": ("faults.ref_text_request=fatal", [], "failed",
                                           "first real request (base) failed", None, None),
    # every request after the readiness request fails: the window ends its start and the round reruns in a new one
    "every request fails": ("faults.error_burst={after: 1, length: 1000000, status: 500}", [], "failed",
                            "every one of its", ("http 500",), None),
}
# --ready-timeout covers the simulator's own start (torch import, ~3-5 s on a busy 2-core box), so 8 s, not less.
WITH_REPORT = {"killed", "5xx burst"}  # the report step costs a few seconds; two faults show it copes


def run_ab(tmp_path, b_set: str, extra: list[str], report: bool):
    # per-request timeout of the blocks: 1 s, so a request stuck on the hung server fails (with a record) before the
    # 2 s block ends; a request still in flight when Locust stops is not recorded at all
    scen = write_scenario(tmp_path, timeout_s=1)
    cmd = [sys.executable, "-m", "loadtest.ab", "--backend", "sim", "--sim-config", "configs/sim/fast.yaml",
           "--scenario", str(scen), "--rounds", "1", "--aa-rounds", "0", "--levels", "4", "--warmup-s", "0.5",
           "--measure-s", "1.5", "--drain-s", "0", "--seed", "1", "--out", str(tmp_path), "--name", "run",
           "--b-sim-set", b_set, *extra, *([] if report else ["--no-report"])]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_ab_run_survives(tmp_path, fault):
    b_set, extra, status, block_reason, record_reasons, measure_error = FAULTS[fault]
    p = run_ab(tmp_path, b_set, extra, fault in WITH_REPORT)
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "run"
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "complete" and man["ended"]
    blocks = {json.loads(f.read_text())["arm"]: json.loads(f.read_text()) for f in run.glob("blocks/*/block.json")}
    assert set(blocks) == {"A", "B"}  # the run went on past the faulted window (in either order)
    assert blocks["A"]["status"] == "complete", blocks["A"]
    b = blocks["B"]
    assert b["status"] == status, b
    if block_reason is None:
        assert b["reason"] is None
    else:  # marked, with a reason, also on the console
        assert block_reason.lower() in b["reason"].lower(), b
        assert b["block_id"] in p.stdout and b["status"] in p.stdout
    for f in run.rglob("*.jsonl"):
        intact_lines(f)  # no truncated line anywhere
    bdir = run / "blocks" / b["block_id"]
    start = json.loads((run / "starts" / f"{b['start']:03d}" / "start.json").read_text())
    assert (run / "starts" / f"{b['start']:03d}" / "server.log").is_file() and start["arm"] == "B"
    if status == "failed":  # infrastructure: the round ran again at once, and failed again
        assert b["attempt"] == 1 and start["status"] == "failed" and start["reason"], start
        assert man["reruns"] and man["reruns"][0]["attempt"] == 1
        assert (run / "attempts").is_dir() and any(p.name.startswith(b["block_id"]) for p in (run / "attempts").iterdir())
    else:  # the load ran: no rerun, the records say what happened
        assert b["attempt"] == 0 and not man.get("reruns") and not (run / "attempts").exists()
    if record_reasons is not None:
        recs = intact_lines(bdir / "requests.jsonl")
        bad = [r for r in recs if not r["ok"]]
        assert bad and all(any(k in r["error"].lower() for k in record_reasons) for r in bad), bad[:3]
        measure = [r for r in recs if r["phase"] == "measure"]
        m_bad = [r for r in measure if not r["ok"]]
        outcomes = b.get("requests")
        if measure_error is not None:  # the window counts exactly what its records say
            assert outcomes["measure"] == len(measure) and outcomes["measure_failed"] == len(m_bad) > 0
            assert outcomes["measure_errors"] == {measure_error: len(m_bad)}, outcomes
        if status == "invalid" and measure:
            assert len(m_bad) == len(measure) and b["reason"].startswith(f"all {len(measure)} measure-phase"), b
        elif status == "invalid":
            assert b["reason"].startswith("no measure-phase request was recorded"), b
        if status == "complete":
            assert 0 < len(m_bad) < len(measure)  # some failed, some succeeded: data
    else:  # the server never got ready: no load was run against it
        assert not (bdir / "requests.jsonl").exists()
    a_recs = intact_lines(run / "blocks" / blocks["A"]["block_id"] / "requests.jsonl")
    assert a_recs and all(r["ok"] for r in a_recs)
    if fault in WITH_REPORT:
        summary = json.loads((run / "summary.json").read_text())
        invalid = {x["block_id"]: x["reason"] for x in summary["invalid_blocks"]}
        assert blocks["A"]["block_id"] not in invalid and (run / "index.html").is_file()
        if status == "failed":
            assert b["block_id"] in invalid
            assert b["block_id"] in (run / "summary.md").read_text()  # the report names the excluded window
        if status == "complete" and measure_error is not None:  # failed requests are data: the window is used ...
            assert b["block_id"] not in invalid
            comp = json.loads((run / "comparison.json").read_text())
            rates = [comp["per_level"][lv]["error_rate"] for lv in comp["per_level"]]
            assert any(r["rate_b"] or r["rate_a"] for r in rates), rates  # ... and its error rate is shown

"""The A/B runner and the report through the simulator's faults (issue 7 part 1).

One A/B round (two blocks, one fresh server each); the fault is switched on for arm B only (--b-sim-set), so each run
shows both sides: the healthy block completes, the faulted one is marked with its reason, the run goes on to the end,
every JSONL file in the run folder is intact, and the report names the bad block instead of using it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, intact_lines, write_scenario

pytestmark = pytest.mark.slow  # each test runs the A/B runner: two simulator processes and two Locust runs

FAULTS = {
    # fault: (--b-sim-set value, extra args, B's status, what its reason must say, what B's records must say)
    # "failed" is infrastructure (the server did not start or died); "invalid" means the load ran and its records say
    # what went wrong: the reason counts the failed measure-phase requests by kind
    "killed": ("faults.kill_after_steps=100", [], "failed", "server died", ("connect", "stream broken")),
    "hung": ("faults.hang_after_requests=5", [], "invalid", "no response", ("no response",)),
    "hung from the start": ("faults.hang_after_requests=0", ["--ready-timeout", "8"], "failed",
                            "not ready within 8 s", None),
    # short bursts that repeat every 4 requests: any 3 consecutive requests hold a failure, so the measure phase
    # (1.5 s at c=4, several requests even on a slow box) always sees some, never only the warm-up
    "5xx burst": ("faults.error_burst={after: 2, length: 2, status: 500, every: 4}", [], "invalid",
                  "measure-phase requests failed: http 500 (", ("http 500",)),
    "cut streams": ("faults.cut_stream_every=2", [], "invalid", "measure-phase requests failed: stream broken (",
                    ("stream broken",)),
    "malformed audio": ("faults.malformed_audio_every=2", [], "invalid",
                        "measure-phase requests failed: odd pcm byte count (", ("odd pcm byte count",)),
    "slow readiness": ("faults.slow_readiness_s=30", ["--ready-timeout", "8"], "failed", "not ready within 8 s", None),
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
    b_set, extra, status, block_reason, record_reasons = FAULTS[fault]
    p = run_ab(tmp_path, b_set, extra, fault in WITH_REPORT)
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "run"
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "complete" and man["ended"]
    blocks = {json.loads(f.read_text())["arm"]: json.loads(f.read_text()) for f in run.glob("blocks/*/block.json")}
    assert set(blocks) == {"A", "B"}  # the run went on past the faulted block (in either order)
    assert blocks["A"]["status"] == "complete", blocks["A"]
    b = blocks["B"]
    assert b["status"] == status and b["reason"], b  # marked, with a reason
    assert block_reason.lower() in b["reason"].lower()
    assert b["block_id"] in p.stdout and b["status"] in p.stdout  # said on the console too
    for f in run.rglob("*.jsonl"):
        intact_lines(f)  # no truncated line anywhere
    bdir = run / "blocks" / b["block_id"]
    assert (bdir / "server.log").is_file()
    if record_reasons is not None:
        recs = intact_lines(bdir / "requests.jsonl")
        bad = [r for r in recs if not r["ok"]]
        assert bad and all(any(k in r["error"].lower() for k in record_reasons) for r in bad), bad[:3]
        measure = [r for r in recs if r["phase"] == "measure"]
        m_bad = [r for r in measure if not r["ok"]]
        if status == "invalid" and m_bad:  # the reason counts exactly what the records say
            assert b["reason"].startswith(f"{len(m_bad)} of {len(measure)} measure-phase requests failed: "), b
        elif status == "invalid":
            assert b["reason"].startswith("no measure-phase request was recorded"), b
    else:  # the server never got ready: no load was run against it
        assert not (bdir / "requests.jsonl").exists()
    a_recs = intact_lines(run / "blocks" / blocks["A"]["block_id"] / "requests.jsonl")
    assert a_recs and all(r["ok"] for r in a_recs)
    if fault in WITH_REPORT:
        summary = json.loads((run / "summary.json").read_text())
        invalid = {x["block_id"]: x["reason"] for x in summary["invalid_blocks"]}
        assert b["block_id"] in invalid and blocks["A"]["block_id"] not in invalid
        assert (run / "index.html").is_file()
        assert b["block_id"] in (run / "summary.md").read_text()  # the report names the excluded block

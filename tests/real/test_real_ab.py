"""`make ab BACKEND=vllm-cpu` end to end on the real vllm-omni 0.16.0 server on this CPU, from its arguments to its
report: the runner prepares and starts the real server tree itself, hot-swaps the variant through the control file,
checks each window's sync counts against the variant's closed form, stops the tree, and the statistics and the report
read what it wrote. A short scenario (one level, one round): the path is the test, not the verdict."""

from __future__ import annotations

import json
import subprocess

import pytest
from real_gate import require_real_server

from loadtest import experiment as ex
from loadtest.server_process import ROOT
from ttsrecords import cpuserver

require_real_server()

pytestmark = [pytest.mark.slow, pytest.mark.real, pytest.mark.timeout(1200)]

# every request is 63 codec frames on the CPU stage file (talker max_tokens = min_tokens = 64)
AUDIO_S = 63 / 12.5
# one level; a count phase long enough for the first request after a start to reach the code predictor (in a CI
# run a 2 s count phase saw no call: the first request took 13 s); a measure window and a drain longer than the
# slowest request seen at c=1 (34 s: now and then a stream's end comes about 20 s after code2wav finished), so that
# some request starts inside the window and none of its requests runs into the next switch
SCENARIO = """schema: tts-scenario/1
name: real-ab-short
mode: stream
loop: closed
seed: 7
mix: {short: 1}
timeout_s: 90
phases: {count_s: 8, warmup_s: 10, measure_s: 45, drain_s: 40}
steps:
  - {concurrency: 1}
"""


def _vllm_processes() -> list[str]:
    p = subprocess.run(["pgrep", "-af", "vllm-omni serve"], capture_output=True, text=True)
    return [line for line in p.stdout.splitlines() if "pgrep" not in line]


def test_make_ab_on_the_real_cpu_server_from_arguments_to_report(tmp_path):
    scenario = tmp_path / "short.yaml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "runs"
    before = _vllm_processes()
    p = subprocess.run(["make", "-s", "ab", "A=original", "B=fixed", "BACKEND=vllm-cpu", "DESIGN=swap", "ROUNDS=1",
                        "AA_ROUNDS=0", "SEED=7", f"SCENARIO={scenario}", f"OUT={out}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=1100)
    runs = sorted(out.iterdir()) if out.is_dir() else []
    assert p.returncode == 0 and len(runs) == 1, p.stdout[-3000:] + p.stderr[-3000:]
    run = runs[0]
    assert "report: " in p.stdout and (run / "index.html").is_file()

    man = json.loads((run / "manifest.json").read_text())
    assert {a["backend"] for a in man["arms"].values()} == {ex.CPU_BACKEND}
    assert {a["stages"] for a in man["arms"].values()} == {cpuserver.STAGES}

    summary = json.loads((run / "summary.json").read_text())
    assert summary["backend"]["name"] == ex.CPU_BACKEND and summary["simulated"] is False
    assert summary["complete_blocks"] == summary["planned_blocks"] == 2, summary["invalid_blocks"]
    for block in summary["blocks"]:
        m = block["manipulation"]
        # the plugin in the real talker worker counted the variant the runner switched to, syncs as its closed form
        assert block["valid"] and m["ok"] and m["server_variants"] == [block["variant"]], block
        assert m["source"] == "count" and m["syncs"] == m["expected_syncs"], m
        assert block["simulated_counters"] is False
        level = block["levels"]["1"]
        assert level["n_ok"] >= 1 and level["error_rate"] == 0.0, level
        assert level["audio_s_mean"] == pytest.approx(AUDIO_S), level
    assert {b["variant"] for b in summary["blocks"]} == {"original", "fixed"}
    syncs = {b["variant"]: b["manipulation"]["syncs"] for b in summary["blocks"]}
    assert min(syncs.values()) > 0, syncs  # the count phase saw calls in both windows

    comp = json.loads((run / "comparison.json").read_text())
    assert comp["simulated"] is False and comp["headline"]["kind"] in ("inconclusive", "faster", "slower",
                                                                      "equivalent"), comp["headline"]
    md = (run / "summary.md").read_text()
    assert "REAL vllm-omni 0.16.0" in md and "SIMULATED" not in md
    # the runner stopped the tree it started
    assert _vllm_processes() == before
    print(f"\ntest-real: make ab on the real server: {run.name}, syncs {syncs}, headline "
          f"{comp['headline']['text']}")

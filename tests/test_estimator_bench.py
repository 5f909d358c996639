"""The known-answer bench of the work-rate estimators (tools/estimator_bench.py): its truth and its reading of a run."""

from __future__ import annotations

import pytest
from conftest import ROOT

from tools import estimator_bench as eb

PROFILE = str(ROOT / "configs/sim/default.yaml")
PROMPTS = str(ROOT / "configs/prompts/en.yaml")


def test_the_truth_of_a_known_slowdown_is_the_step_models_own():
    """Every step 25 % slower: a closed loop's rates fall to about 1/1.25 (a little less than the full 25 %, since the
    last chunk's code2wav is no step), its median latency rises by about as much."""
    a = eb.truth(PROFILE, (), 8, PROMPTS, (("medium", 1.0),), 1614)
    b = eb.truth(PROFILE, ("model.extra_step_pct=25",), 8, PROMPTS, (("medium", 1.0),), 1614)
    ratio = b["audio_throughput"] / a["audio_throughput"]
    assert 0.80 <= ratio < 0.81 and b["throughput_rps"] / a["throughput_rps"] == pytest.approx(ratio)
    assert 1.23 < b["e2e_p50"] / a["e2e_p50"] <= 1.25


def test_the_bench_reads_a_run_folder_with_both_estimators_and_p50():
    res = eb.analyse(str(ROOT / "reports/example"))  # original vs fixed: no step-model truth for two variants
    assert res["design"] == "swap" and res["rounds"] == 3 and res["variants"] == ["original", "fixed"]
    row = res["levels"]["8"]
    assert row["truth"]["audio_throughput"] is None
    for key in ("audio_throughput", "audio_throughput_window", "e2e_p50"):
        m = row["metrics"][key]
        assert len(m["per_round"]) == 3 and m["ratio"] > 0 and m["sd_pct"] is not None
    page = eb.render([res], "python -m tools.estimator_bench reports/example")
    assert "| example | swap | fixed vs original | c=8 | – |" in page

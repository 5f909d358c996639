"""Windows sized to their requests (loadtest.window_fit): the planner's rules and its prediction of request lengths."""

from __future__ import annotations

import pytest
from conftest import ROOT

from loadtest import window_fit as wf
from ttsrecords.scenario import parse_scenario

PROFILE = str(ROOT / "configs/sim/default.yaml")


def _scenario(**phases):
    base = {"count_s": 1, "warmup_s": 4, "measure_s": 6, "drain_s": 4, **phases}
    return parse_scenario({"schema": "tts-scenario/1", "name": "t", "mix": {"short": 1}, "seed": 5, "phases": base,
                           "steps": [8, 64]}, path="t.yaml")


def test_the_rules_name_each_phase_that_is_too_short():
    sc = _scenario()
    lat = [wf.LevelLatency(8, 2.0, 3.0), wf.LevelLatency(64, 5.0, 5.5)]
    found = wf.problems(sc, lat)
    assert found == ["c=64: measure 6 s < 2 x its mean request latency 5.0 s (set measure_s >= 10)",
                     "c=64: warm-up 4 s < its mean request latency 5.0 s (set warmup_s >= 5)",
                     "c=64: drain 4 s < its longest request 5.5 s: a measured request would outlive its level "
                     "(set drain_s >= 5)"]  # a phase ends on the shape's 1 s tick: up to 1 s late
    assert wf.problems(_scenario(measure_s=10, warmup_s=5, drain_s=4.5), lat) == []
    open_loop = parse_scenario({"schema": "tts-scenario/1", "name": "o", "loop": "open", "mix": {"short": 1},
                                "phases": {"warmup_s": 1, "measure_s": 1, "drain_s": 0},
                                "steps": [{"concurrency": 8, "rate": 2.0}]}, path="o.yaml")
    assert wf.problems(open_loop, [wf.LevelLatency(8, 9.0, 9.0)]) == []  # the window estimator: no such rule


def test_the_prediction_replays_the_stand_in_and_a_slower_arm_needs_longer_phases():
    sc = _scenario()
    fast, slow = wf.predict(sc, [(PROFILE, (), "fixed")]), wf.predict(sc, [(PROFILE, ("model.extra_step_pct=25",), "fixed")])
    assert [x.concurrency for x in fast] == [8, 64]
    for f, s in zip(fast, slow, strict=True):
        assert 0 < f.mean_s <= f.longest_s and s.mean_s == pytest.approx(1.25 * f.mean_s, rel=0.03)
    assert fast[1].mean_s > fast[0].mean_s  # a bigger batch, a longer step
    both = wf.predict(sc, [(PROFILE, (), "fixed"), (PROFILE, ("model.extra_step_pct=25",), "fixed")])
    assert both == slow  # the slowest arm sets the phases

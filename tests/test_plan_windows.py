"""The plan as typed windows (ttsrecords.windows): what the planner writes into manifest.json reads back into the same
windows, the version-1 plan upgrades at load time, and a malformed plan is one line (the runner's side:
tests/test_runner_rounds.py)."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from conftest import ROOT

from loadtest.design import make_plan
from ttsrecords.windows import PlanError, PlannedWindow, plan_from_list, plan_to_list, rounds_of, starts_of


@pytest.mark.parametrize("design,pairs", [("fresh", None), ("swap", None), ("nested", 2)])
def test_a_plan_round_trips_through_json(design, pairs):
    plan = make_plan(4, 1, "original", None, 7, design=design, window_pairs=pairs, levels=[8, 64, 16])
    back = plan_from_list(json.loads(json.dumps(plan_to_list(plan))))
    assert back == plan and all(isinstance(w, PlannedWindow) for w in back)
    assert set(plan_to_list(plan)[0]) == {f.name for f in fields(PlannedWindow)}  # every field is written
    assert any(w.variant is None for w in back)  # an arm without the plugin stays None, not "None"


def test_the_committed_plans_read_back_into_the_windows_they_were_written_from():
    for path in sorted((ROOT / "reports").glob("**/manifest.json")):
        man = json.loads(path.read_text(encoding="utf-8"))
        if "plan" not in man:
            continue
        plan = plan_from_list(man["plan"])
        assert plan_to_list(plan) == man["plan"], path  # nothing lost, nothing invented
        assert starts_of(plan) == man["starts"], path


def test_a_version_1_plan_gets_what_its_format_left_implicit():
    man = json.loads((ROOT / "tests/fixtures/v1-run/manifest.json").read_text(encoding="utf-8"))
    plan = plan_from_list(man["plan"])
    assert [w.block_id for w in plan] == [w["block_id"] for w in man["plan"]]
    assert [w.start for w in plan] == list(range(len(plan)))  # version 1: a server start per window
    assert all([w.position for w in r] == [0, 1] for r in rounds_of(plan))
    assert all(w.spec == ("A" if w.kind == "aa" else w.arm) for w in plan) and not any(w.switch for w in plan)


@pytest.mark.parametrize("bad,says", [
    ("x", "a list of windows"),
    ([{"block_id": "000", "round": 0, "kind": "ab"}], "plan entry 0: no arm"),
    ([7], "plan entry 0: not an object"),
    ([{"block_id": "000", "round": 0, "kind": "ba", "arm": "A"}], "kind 'ba'"),
    ([{"block_id": "000", "round": "0", "kind": "ab", "arm": "A"}], "round '0'"),
    ([{"block_id": "000", "round": 0, "kind": "ab", "arm": "A", "start": None}], "start None"),
])
def test_a_malformed_plan_is_one_line(bad, says):
    with pytest.raises(PlanError, match=says) as e:
        plan_from_list(bad)
    assert "\n" not in str(e.value)


"""The A/B runner's plan (unit tier): designs fresh / swap / nested, balanced ABBA/BAAB orders, A/A rounds interleaved
at seeded positions, level orders per round, the window's own scenario, the experiment behind a run and the design's
arguments."""

from __future__ import annotations

import argparse
import json
from collections import Counter

import pytest
from conftest import ROOT

from loadtest import ab, plan, provenance, scenario
from loadtest import experiment as ex
from loadtest.design import aa_positions, level_order, make_plan
from loadtest.scenario import load_scenario
from ttsrecords.scenario import parse_scenario
from ttsrecords.windows import plan_from_list, rounds_of, starts_of

LEVELS = [8, 16, 64, 256]


def _pairs(p):
    return [tuple(w.arm for w in r) for r in rounds_of(p)]


def test_every_round_is_one_window_of_each_side_and_aa_windows_run_arm_a():
    for design in ("fresh", "swap", "nested"):
        p = make_plan(6, 2, "original", "fixed", 5, design=design, window_pairs=2, levels=LEVELS)
        assert len(p) == 16 and len({w.block_id for w in p}) == 16
        for r in rounds_of(p):
            assert sorted(w.arm for w in r) == ["A", "B"] and [w.position for w in r] == [0, 1]
            for w in r:
                assert w.variant == ("fixed" if (w.kind, w.arm) == ("ab", "B") else "original")
                assert w.spec == ("A" if w.kind == "aa" else w.arm)
        assert Counter(w.kind for w in p) == {"ab": 12, "aa": 4}
        assert [w.block_id[:3] for w in p] == [f"{i:03d}" for i in range(16)]


def test_swap_and_nested_orders_are_balanced_abba_baab():
    for seed in range(20):
        for design, pairs in (("swap", None), ("nested", 2), ("nested", 4)):
            p = make_plan(8, 0, "original", "fixed", seed, design=design, window_pairs=pairs, levels=LEVELS)
            for st in starts_of(p):
                orders = [tuple(w.arm for w in r) for r in rounds_of([w for w in p if w.start == st["start"]])]
                for i in range(0, len(orders) - 1, 2):
                    assert orders[i] == orders[i + 1][::-1]  # AB then BA, or BA then AB
                firsts = Counter(o[0] for o in orders)
                assert abs(firsts["A"] - firsts["B"]) <= len(orders) % 2
    for seed in range(10):  # W = 1: the pairs span neighbouring starts
        orders = _pairs(make_plan(6, 1, "a", "b", seed, design="nested", window_pairs=1))
        ab_orders = [o for o, r in zip(orders, rounds_of(make_plan(6, 1, "a", "b", seed, design="nested",
                                                                   window_pairs=1)), strict=True)
                     if r[0].kind == "ab"]
        assert all(ab_orders[i] == ab_orders[i + 1][::-1] for i in range(0, 6, 2))
    both = {tuple(_pairs(make_plan(4, 0, "a", "b", s, design="swap"))[:2]) for s in range(30)}
    assert both == {(("A", "B"), ("B", "A")), (("B", "A"), ("A", "B"))}  # the seed chooses ABBA or BAAB


def test_fresh_is_a_coin_flip_per_round_with_a_start_per_window():
    p = make_plan(8, 0, "original", "fixed", 11)
    assert [w.start for w in p] == list(range(16)) and not any(w.switch for w in p)
    assert {o[0] for o in _pairs(p)} == {"A", "B"}
    assert p == make_plan(8, 0, "original", "fixed", 11) != make_plan(8, 0, "original", "fixed", 12)


def test_aa_rounds_sit_at_seeded_random_positions_never_all_first():
    seen = set()
    for seed in range(200):
        p = make_plan(4, 1, "original", "fixed", seed)
        pos = [r for r in range(5) if rounds_of(p)[r][0].kind == "aa"]
        assert len(pos) == 1 and pos != [0]
        seen.add(pos[0])
    assert seen == {1, 2, 3, 4}  # every other position occurs
    for seed in range(50):
        pos = aa_positions(6, 2, __import__("random").Random(seed))
        assert pos != [0, 1] and len(set(pos)) == 2
    # sequential: the A/A rounds all come before the earliest possible stop (aa + min_rounds positions)
    for seed in range(50):
        p = make_plan(10, 2, "original", "fixed", seed, aa_within=2 + 3)
        assert max(w.round for w in p if w.kind == "aa") < 5
    assert aa_positions(3, 2, __import__("random").Random(0), within=2) == [0, 1]  # nothing else possible


def test_level_order_is_a_seeded_permutation_per_round_shared_by_its_windows():
    for design, pairs in (("fresh", None), ("swap", None), ("nested", 2)):
        p = make_plan(10, 2, "original", "fixed", 3, design=design, window_pairs=pairs, levels=LEVELS)
        assert all(sorted(w.levels) == sorted(LEVELS) for w in p)
        for rnd in rounds_of(p):  # the two windows compared with each other meet the same level history
            assert len(rnd) == 2 and rnd[0].levels == rnd[1].levels
            assert tuple(level_order(LEVELS, 3, rnd[0].round)) == rnd[0].levels  # a rerun: the same order
        orders = [tuple(rnd[0].levels) for rnd in rounds_of(p)]
        assert len(set(orders)) > 5  # random across rounds: no level tied to the time since a start
    assert [w.levels for w in make_plan(10, 1, "original", "fixed", 4, levels=LEVELS)] != \
        [w.levels for w in make_plan(10, 1, "original", "fixed", 3, levels=LEVELS)]  # seeded


def test_nested_is_s_starts_of_w_pairs_and_switches_are_marked():
    p = make_plan(6, 0, "original", "fixed", 2, design="nested", window_pairs=2, levels=LEVELS)
    starts = starts_of(p)
    assert [len(s["rounds"]) for s in starts] == [2, 2, 2] and all(s["spec"] == "A" for s in starts)
    for s in starts:
        ws = [w for w in p if w.start == s["start"]]
        assert not ws[0].switch  # the first window of a start: the control file is written with its variant
        for prev, w in zip(ws, ws[1:], strict=False):
            assert w.switch == (prev.variant != w.variant)
    # A/A rounds join the start of the A/B round after them; the starts still hold W A/B pairs each
    p = make_plan(4, 2, "original", "fixed", 9, design="nested", window_pairs=2)
    for s in starts_of(p):
        assert sum(1 for r in s["rounds"] if rounds_of(p)[r][0].kind == "ab") == 2
    with pytest.raises(ValueError, match="window_pairs"):
        make_plan(4, 0, "a", "b", 1, design="nested")
    with pytest.raises(ValueError, match="unknown design"):
        make_plan(4, 0, "a", "b", 1, design="abab")


def test_window_scenario_keeps_each_levels_own_phases_drain_included(tmp_path):
    sc = parse_scenario({"phases": {"count_s": 2, "warmup_s": 3, "measure_s": 5, "drain_s": 0},
                         "steps": [{"concurrency": 8, "measure_s": 7}, 64, {"concurrency": 256, "drain_s": 9}]},
                        path="x.yaml")
    out = scenario.window_scenario(sc, [2, 0, 1], tmp_path / "w.yaml", count=True, settle_s=4)
    w = load_scenario(out)
    assert [s.concurrency for s in w.steps] == [256, 8, 64]
    assert [s.drain_s for s in w.steps] == [9, 0, 0]  # the drain goes with its level (window_fit sizes it)
    assert [s.measure_s for s in w.steps] == [5, 7, 5]  # the level keeps its own
    assert [s.warmup_s for s in w.steps] == [3 + 4, 3, 3]  # the settle after a switch lengthens the first warm-up
    assert all(s.count_s == 2 for s in w.steps)
    none = load_scenario(scenario.window_scenario(sc, [0, 1, 2], tmp_path / "n.yaml", count=False))
    assert all(s.count_s == 0 for s in none.steps)  # an arm without the plugin: no control file, no count phase
    assert scenario.window_seconds(sc) == 3 * 2 + 3 * 3 + 5 + 7 + 5 + 9 and scenario.window_seconds(sc, False) == 35


def test_count_phase_needs_a_warmup_after_it():
    with pytest.raises(ValueError, match="warmup_s must be > 0 after a count phase"):
        parse_scenario({"phases": {"count_s": 1, "warmup_s": 0, "measure_s": 5, "drain_s": 0}, "steps": [8]})
    with pytest.raises(ValueError, match="unknown key"):  # the count phase is set once, for every level
        parse_scenario({"phases": {"warmup_s": 1, "measure_s": 5, "drain_s": 0}, "steps": [{"concurrency": 8,
                                                                                              "count_s": 1}]})


def _args(**kw):
    a = ab.parse_args([])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _design(**kw):
    exp = plan.experiment_for({"a": "original", "b": "fixed", "simulate": True})
    return plan.resolve_design(_args(**kw), exp, shorthand=not kw.get("experiment"))


def test_design_arguments():
    d = _design(design="nested", rounds=6, seed=1)
    assert (d["starts"], d["window_pairs"], d["rounds"]) == (3, 2, 6) and d["settle_s"] == plan.DEFAULT_SETTLE_S
    d = _design(design="nested", starts=2, window_pairs=3, seed=1)
    assert (d["starts"], d["window_pairs"], d["rounds"]) == (2, 3, 6)
    d = _design(design="nested", starts=4, rounds=8, seed=1)
    assert (d["starts"], d["window_pairs"]) == (4, 2)
    d = _design(pilot=True, seed=1)
    assert (d["name"], d["starts"], d["window_pairs"], d["aa_rounds"], d["rounds"]) == ("nested", 2, 2, 0, 4)
    d = _design(until_decided=True, max_rounds=12, min_rounds=4, seed=1)
    assert d["rounds"] == 12 and d["sequential"]["min_rounds"] == 4
    d = _design(seed=1)
    assert (d["name"], d["rounds"], d["aa_rounds"], d["settle_s"], d["sequential"]) == ("fresh", 3, 1, 0.0, None)
    for kw, msg in ((dict(design="nested", starts=2, window_pairs=2, rounds=5), "contradicts"),
                    (dict(starts=2), "belong to --design nested"), (dict(max_rounds=4), "belong to --until-decided"),
                    (dict(until_decided=True, max_rounds=3, min_rounds=4), "min-rounds"),
                    (dict(pilot=True, design="swap"), "--pilot"), (dict(rounds=0), "--rounds"),
                    (dict(design="swap", settle_s=-1.0), "--settle-s")):
        with pytest.raises(SystemExit, match=msg):
            _design(seed=1, **kw)


def test_plan_from_a_pilot(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"schema": "tts-plan/1", "starts": 5, "windows_per_start": 3,
                                                    "halfwidth_pct": 0.8, "cost_s": 3600}))
    d = _design(plan_from=str(tmp_path), seed=1)
    assert (d["name"], d["starts"], d["window_pairs"], d["rounds"]) == ("nested", 5, 3, 15)
    assert d["plan_from"]["halfwidth_pct"] == 0.8 and len(d["plan_from"]["sha256"]) == 64
    (tmp_path / "plan.json").write_text(json.dumps({"schema": "tts-plan/1", "starts": 0, "windows_per_start": 3}))
    with pytest.raises(SystemExit, match="starts must be an integer >= 1"):
        _design(plan_from=str(tmp_path), seed=1)
    with pytest.raises(SystemExit, match="no plan.json"):
        _design(plan_from=str(tmp_path / "nope"), seed=1)


def test_the_experiment_of_a_run():
    sim = plan.experiment_for({"a": "original", "b": "fixed", "simulate": True, "sim_config": "configs/sim/fast.yaml",
                               "sim_set": ["model.base_ms=2"], "b_sim_set": ["model.extra_step_pct=2"]})
    a, b = plan.arms_of(sim).values()
    assert sim.simulated and (a.variant, b.variant) == ("original", "fixed")
    assert a.sim.config == b.sim.config == "configs/sim/fast.yaml"
    assert a.sim.set == ("model.base_ms=2",) and b.sim.set == ("model.base_ms=2", "model.extra_step_pct=2")
    # a known-answer delay is hot-swappable (the control file's "sim" object); any other setting needs a restart
    assert plan.hot_swap_problem(a, b) is None
    assert plan.hot_sim(a) == {"model.extra_step_pct": 0.0, "model.extra_step_ms": 0.0}
    assert plan.hot_sim(b) == {"model.extra_step_pct": 2.0, "model.extra_step_ms": 0.0}
    cold = plan.experiment_for({"a": "original", "b": "fixed", "simulate": True, "sim_config": "configs/sim/fast.yaml",
                                "b_sim_set": ["model.base_ms=3"]})
    assert plan.hot_swap_problem(*plan.arms_of(cold).values()) == (
        "the simulator's settings differ beyond the hot-swappable ['model.extra_step_pct', 'model.extra_step_ms'] "
        "([] vs ['model.base_ms=3'])")
    same = plan.experiment_for({"a": "original", "b": "fixed", "simulate": True})
    assert plan.hot_swap_problem(*plan.arms_of(same).values()) is None
    # known answer: the same variant on both sides, B slowed by --b-sim-set
    ka = plan.experiment_for({"a": "fixed", "b": "fixed", "simulate": True, "b_sim_set": ["model.extra_step_pct=2"]})
    a, b = plan.arms_of(ka).values()
    assert a.variant == b.variant == "fixed" and b.evidence.sync_signature == "fixed" and a.label != b.label
    real = plan.experiment_for({"a": "original", "b": "fixed"})
    assert not real.simulated and all(plan.has_control(x) for x in real.arms.values())
    assert plan.hot_swap_problem(*plan.arms_of(real).values()) is None  # one 0.16.0 image runs both variants
    rel = plan.experiment_for({"experiment": "configs/experiments/release-016-fixed-vs-030.yaml"})
    a, b = plan.arms_of(rel).values()
    assert plan.has_control(a) and not plan.has_control(b)
    assert "no plugin" in plan.hot_swap_problem(a, b)
    with pytest.raises(plan.ex.ExperimentError, match="unknown variant 'turbo'"):
        plan.experiment_for({"a": "turbo", "b": "fixed"})


def test_ready_timeout_pays_for_the_modelled_start_up():
    quick = plan.experiment_for({"a": "original", "b": "fixed", "simulate": True,
                                 "sim_config": "configs/sim/fast.yaml"})
    slow = plan.experiment_for({"a": "original", "b": "fixed", "simulate": True,
                                "sim_config": "configs/sim/h100-startup.yaml"})
    assert plan.ready_timeout(quick) == ex.SIM_READY_S
    assert plan.ready_timeout(slow) == ex.SIM_READY_S + 90.0
    assert plan.ready_timeout(plan.experiment_for({"a": "original", "b": "fixed"})) == plan.ex.HEALTH_TIMEOUT_S


def test_new_run_writes_the_manifest_of_design_and_experiment(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "_run_quiet", lambda cmd, timeout=5.0: None)  # git, nvidia-smi: not in the unit tier
    monkeypatch.setenv("HF_TOKEN", "hf_secret_sentinel_1614")
    a = _args(experiment="configs/experiments/sim/mission-sim.yaml", design="swap", levels="8,64", out=str(tmp_path),
              name="r", count_s=1.0)
    run, m = plan.new_run(a)
    assert m["schema"] == "tts-ab/2" and m["experiment"]["name"] == "mission-sim" and m["experiment"]["simulated"]
    assert m["design"]["name"] == "swap" and m["design"]["starts"] == 1 and m["design"]["hot_swap"]
    assert (m["design"]["rounds"], m["design"]["aa_rounds"], m["design"]["seed"]) == (2, 1, 1614)  # from the file
    assert m["arms"]["A"]["variant"] == "original" and m["arms"]["B"]["simulated"]
    assert m["labels"] == {"A": "original", "B": "fixed"} and m["backend"]["simulated"]
    assert len(m["plan"]) == 6 and all(sorted(w["levels"]) == [8, 64] for w in m["plan"])
    assert all(w["order"] == [[8, 64].index(c) for c in w["levels"]] for w in m["plan"])
    assert m["starts"] == starts_of(plan_from_list(m["plan"])) and "switches" not in m and m["status"] == "planned"
    assert json.loads((run / "manifest.json").read_text()) == m
    assert "hf_secret_sentinel_1614" not in json.dumps(m)  # a secret never reaches the run folder


def test_new_run_refuses_what_it_cannot_run_in_one_line(tmp_path):
    cases = [
        (dict(design="swap", b_sim_set=["model.base_ms=3"]), "needs hot-swappable arms"),
        (dict(design="swap", count_s=0.0), "set phases.count_s > 0"),
        (dict(experiment="configs/experiments/sim/mission-sim.yaml", a="fixed"), "--a/--b are the mission shorthand"),
        (dict(experiment="configs/experiments/release-016-fixed-vs-030.yaml", design="nested", dry_run=True),
         "no plugin"),
        (dict(experiment="configs/experiments/sim/mission-sim.yaml", backend="vllm"), "simulator only"),
        # a simulated stand-in can swap only what its real arms could
        (dict(experiment="configs/experiments/release-016-fixed-vs-030.yaml", simulate=True, design="swap"),
         "no plugin"),
        (dict(experiment="nope.yaml"), "cannot read"),
        (dict(a="original", b="original"), "both 'original'"),
        (dict(sim_config="configs/sim/nope.yaml"), "not found"),
    ]
    for kw, msg in cases:
        with pytest.raises(SystemExit, match=msg) as e:
            plan.new_run(_args(out=str(tmp_path), name="x", **kw))
        assert str(e.value).startswith("error: ") and "\n" not in str(e.value)
        assert not (tmp_path / "x").exists()


def test_demo_preset_is_a_swap_design_on_the_demo_files():
    a = _args()
    for k, v in ab.DEMO.items():
        setattr(a, k, v)
    # one start, at least 3 A/B rounds (the minimum for an interval); A/A rounds are left to real runs so the demo
    # fits in 5 minutes (README)
    assert a.design == "swap" and a.rounds >= 3
    sc = load_scenario(str(ROOT / a.scenario))
    assert sc.steps[0].count_s > 0 and min(s.concurrency for s in sc.steps) == 8
    assert argparse.Namespace is type(a)


def test_the_shorthand_with_other_variants_is_named_after_them():
    # make ab A=original B=vectorized: the mission file asks original vs fixed, the title must not say so
    other = plan.experiment_for({"a": "original", "b": "vectorized"})
    assert other.name == "vllm-omni-016-original-vs-vectorized" and "#1614" not in other.idea
    assert [a.variant for a in other.arms.values()] == ["original", "vectorized"]
    assert plan.experiment_for({"a": "original", "b": "fixed"}).name == "mission-016-original-vs-fixed"


def test_a_known_answer_run_is_not_named_after_the_mission():
    # --a X --b X --b-sim-set ...: the report's title and idea must say what ran, not "original vs fixed"
    ka = plan.experiment_for({"a": "vectorized", "b": "vectorized", "simulate": True,
                              "b_sim_set": ["model.extra_step_pct=2"]})
    assert "original" not in ka.name and "vectorized" in ka.name
    assert "model.extra_step_pct=2" in ka.idea and "PR" not in ka.idea


def test_the_dry_run_header_says_what_this_run_would_do(capsys, monkeypatch):
    """Options over the experiment file: the header names the scenario, rounds and seed the plan lines use."""
    monkeypatch.setattr(provenance, "_run_quiet", lambda cmd, timeout=5.0: None)
    assert ab.main(["--experiment", "configs/experiments/sim/mission-sim.yaml", "--scenario",
                    "configs/scenarios/smoke.yaml", "--rounds", "4", "--aa-rounds", "0", "--seed", "99",
                    "--dry-run"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("# scenario "))
    assert header.startswith("# scenario configs/scenarios/smoke.yaml; design: 0 A/A + 4 A/B rounds, seed 99"), header
    assert "0 A/A + 4 A/B rounds" in out.split("## the plan")[1]

"""tools/designs_bench.py on synthetic run folders whose variance components and costs are known (unit tier).

Per-request noise is 0, so a window's throughput is c / latency exactly and every pair's ln(B/A) is the designed
one: the spreads, the nested components and the costs the tool measures are known in closed form, whatever the level.
The three one-level runs are written once per module and only read by the tests.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import synthetic_runs as sr

from tools import calibrate as cal
from tools import designs_bench as db

LEVEL = 4  # any level: throughput is c / latency exactly (a small one writes fewer requests)
EFFECT = math.log(0.99)
V_FRESH, V_SWAP, V_START, V_PAIR = 4e-4, 1e-4, 1e-4, 3e-5


def _pair(rnd, kind, d, start_a, start_b, ab_first, levels=(LEVEL,)):
    lat = {"A": 0.2, "B": 0.2 * math.exp(-d)}
    arms = ("A", "B") if ab_first else ("B", "A")
    starts = {"A": start_a, "B": start_b}
    return [sr.Window(rnd, kind, arm, "fixed", starts[arm], pos, {c: lat[arm] for c in levels})
            for pos, arm in enumerate(arms)]


def fresh_run(path):
    d_ab = [EFFECT + x for x in sr.designed_effects(6, V_FRESH)]
    d_aa = sr.designed_effects(4, V_FRESH)
    wins, start = [], 0
    for i, (kind, d) in enumerate([("ab", x) for x in d_ab] + [("aa", x) for x in d_aa]):
        wins += _pair(i, kind, d, start, start + 1, i % 2 == 0)
        start += 2
    return sr.write_run(path, wins, levels=(LEVEL,), design="fresh", noise=0.0)


def swap_run(path):
    d_ab = [EFFECT + x for x in sr.designed_effects(8, V_SWAP)]
    d_aa = sr.designed_effects(4, V_SWAP)
    wins = []
    for i, (kind, d) in enumerate([("ab", x) for x in d_ab] + [("aa", x) for x in d_aa]):
        wins += _pair(i, kind, d, 0, 0, i % 2 == 0)
    return sr.write_run(path, wins, levels=(LEVEL,), design="swap", noise=0.0)


def nested_run(path, starts=4, pairs=3, levels=(LEVEL,), v_start=V_START):
    g = sr.designed_effects(starts, v_start)
    e = sr.designed_effects(pairs, V_PAIR)
    wins, rnd = [], 0
    for s in range(starts):
        for p in range(pairs):
            wins += _pair(rnd, "ab", EFFECT + g[s] + e[p], s, s, (s + p) % 2 == 0, levels)
            rnd += 1
    return sr.write_run(path, wins, levels=levels, design="nested", noise=0.0,
                        manifest={"design": {"name": "nested", "window_pairs": pairs, "starts": starts}})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The fresh, swap and nested runs (read only by the tests)."""
    root = tmp_path_factory.mktemp("designs")
    return {name: f(root / name) for name, f in (("fresh", fresh_run), ("swap", swap_run), ("nested", nested_run))}


@pytest.fixture(scope="module")
def pools(runs):
    return [cal.pool_record(run) for run in runs.values()]


def test_measured_spreads_components_and_costs_are_the_designed_ones(pools):
    meas = db.measure(pools, str(LEVEL))
    d = meas["designs"]
    assert math.isclose(d["fresh"]["var_pair"], V_FRESH, rel_tol=1e-6)
    assert math.isclose(d["swap"]["var_pair"], V_SWAP, rel_tol=1e-6)
    assert math.isclose(d["fresh"]["mean_ab"], EFFECT, abs_tol=1e-9)
    comp = d["nested"]["components"]
    # balanced 4 x 3: MS_pair = V_PAIR, MS_start = 3 V_START, sigma2_start = (MS_start - MS_pair) / 3
    assert math.isclose(comp["ms_pair"], V_PAIR, rel_tol=1e-6)
    assert math.isclose(comp["sigma2_start"], V_START - V_PAIR / 3, rel_tol=1e-6)
    assert comp["sigma2_start_upper"] > comp["sigma2_start"]
    costs = db.costs_of(meas, None)
    # synthetic starts: ready 12 s + stop 2 s; a one-level window: 9.5 s of phases + 0.5 s
    assert math.isclose(costs["start_s"], 14.0) and math.isclose(costs["fresh_window_s"], 10.0)
    assert math.isclose(costs["pair_s"], 20.0)
    assert math.isclose(db.costs_of(meas, 120.0)["start_s"], 122.0)
    model = db.model_of(meas)
    sources = {"within": "within_start_swap", "fresh": "fresh_measured"}
    fresh = db.layout("fresh", model, costs, 1200.0, sources)
    swap = db.layout("swap", model, costs, 1200.0, sources)
    nested = db.layout("nested", model, costs, 1200.0, sources)
    assert fresh["rounds"] == 1200 // 48 and fresh["var_unit"] == model["fresh_measured"]
    assert swap["pairs"] == (1200 - 14) // 20
    assert nested["feasible"] and nested["cost_s"] <= 1200.0
    assert nested["starts"] * (14 + nested["windows_per_start"] * 20) == nested["cost_s"]


def test_the_one_level_run_of_a_design_is_measured_and_the_other_cross_checks(tmp_path, pools):
    two = cal.pool_record(nested_run(tmp_path / "two-levels", levels=(2, LEVEL), v_start=4 * V_START))
    meas = db.measure([two, *pools], str(LEVEL))
    assert meas["pools"]["nested"] == "nested"
    comp = meas["designs"]["nested"]["components"]
    assert math.isclose(comp["sigma2_start"], V_START - V_PAIR / 3, rel_tol=1e-6)
    cross = meas["cross"]["two-levels"]
    assert math.isclose(cross["sigma2_start_raw"], 4 * V_START - V_PAIR / 3, rel_tol=1e-6)
    assert cross["levels"] == ["2", str(LEVEL)]


@pytest.mark.slow  # a Monte Carlo rate check (4 x 400 simulated experiments)
def test_swap_interval_misses_start_variance_and_nested_holds_it():
    rng = np.random.default_rng(7)
    swap = {"design": "swap", "pairs": 12, "var_pair": 1e-5, "sigma2_start": 1e-4, "feasible": True}
    nested = {"design": "nested", "starts": 6, "windows_per_start": 2, "var_pair": 1e-5, "sigma2_start": 1e-4,
              "feasible": True}
    n = 400
    s_null = db.simulate(swap, 0.0, n, rng)
    s_clean = db.simulate(swap, 0.0, n, rng, sigma2_start=0.0)
    n_null = db.simulate(nested, 0.0, n, rng)
    assert s_null["claims"] / n > 0.5  # a start effect 3x the pair noise, never in the swap interval
    assert cal.inf.wilson(s_clean["claims"], n)[0] <= 0.05 <= cal.inf.wilson(s_clean["claims"], n)[1] + 0.02
    lo, hi = cal.inf.wilson(n_null["claims"], n)
    assert lo <= 0.05 <= hi + 0.02
    eff = db.simulate(nested, math.log(0.9), n, rng)
    assert eff["slower"] == n and eff["faster"] == 0


def test_command_line_from_runs_and_from_raw_form(tmp_path, capsys, runs):
    runs = [str(r) for r in runs.values()]
    raw, out1, out2 = tmp_path / "designs.json", tmp_path / "a.md", tmp_path / "b.md"
    args = ["--level", str(LEVEL), "--trials", "40", "--check-units", "fresh=3,swap=3,nested=2"]
    assert db.main(["--pools", *runs, "--json", str(raw), "--out", str(out1), *args]) == 0
    assert db.main(["--from-json", str(raw), "--out", str(out2), *args]) == 0

    def strip(text):
        return [ln for ln in text.splitlines() if "analysis run time" not in ln and not ln.startswith("python -m")]
    assert strip(out1.read_text()) == strip(out2.read_text())
    text = out1.read_text()
    for needle in ("fresh", "swap", "nested", "Start-up 120 s", "Wilson", "Disjoint real experiments"):
        assert needle in text


def test_bad_input_is_one_line(capsys, runs):
    run = str(runs["fresh"])
    assert db.main(["--pools", run, "--level", str(LEVEL)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no run of design swap, nested" in err[0]
    assert db.main(["--pools", run, str(runs["swap"]), str(runs["nested"]), "--level", "99"]) == 2
    assert "no level c=99" in capsys.readouterr().err

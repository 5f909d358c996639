"""tools/calibrate.py on synthetic run folders with known answers (unit tier: no process, no server).

Per-request noise is 0 in most pools here, so each window's throughput is c / latency exactly and every per-round log
ratio is the one designed: the experiments' outcomes are known before the rule runs. The pools whose tests only read
them are written once per module.
"""

from __future__ import annotations

import json
import math

import pytest
import synthetic_runs as sr

from tools import calibrate

LEVELS = (4, 16)
LATENCY_S = 0.8  # arm A's request latency: any value gives the same known answers; a long one writes fewer requests


def nested_pool(path, *, starts=6, pairs=2, aa_per_start=1, d_ab=None, aa_bias=0.0, noise=0.0, seed=3):
    """A nested run: each start holds `pairs` A/B pairs (ln throughput B/A = d_ab(start, pair)) and `aa_per_start` A/A
    rounds (the window labelled B has ln ratio aa_bias). Pair order alternates AB/BA."""
    d_ab = d_ab or (lambda s, p: math.log(0.95))
    wins, rnd = [], 0
    for s in range(starts):
        kinds = ["aa"] * aa_per_start + ["ab"] * pairs
        for i, kind in enumerate(kinds):
            d = aa_bias if kind == "aa" else d_ab(s, i - aa_per_start)
            arms = ("A", "B") if (s + i) % 2 == 0 else ("B", "A")
            for pos, arm in enumerate(arms):
                lat = LATENCY_S * (math.exp(-d) if arm == "B" else 1.0)
                variant = "fixed"
                wins.append(sr.Window(rnd, kind, arm, variant, s, pos, {c: lat for c in LEVELS}))
            rnd += 1
    return sr.write_run(path, wins, levels=LEVELS, design="nested", noise=noise, seed=seed,
                        manifest={"settings": {"b_sim_set": ["model.extra_step_pct=5"]}})


@pytest.fixture(scope="module")
def noisy_pool(tmp_path_factory):
    """The default pool with 3 % per-request noise (read only by the tests)."""
    return nested_pool(tmp_path_factory.mktemp("calibrate") / "pool", noise=0.03)


def test_experiments_are_disjoint_and_take_whole_starts(tmp_path):
    pool = calibrate.pool_record(nested_pool(tmp_path / "pool", starts=7, aa_per_start=2))
    exps = calibrate.partition(pool, 3, 4)
    ab = calibrate.pairs_of(pool, "ab")
    start_of = {r: arms["A"]["start"] for r, arms in ab.items()}
    assert len([e for e in exps if e["ab"]]) == 2  # 7 starts -> 2 experiments of 3, one start left out
    assert len([e for e in exps if e["aa"]]) == 3  # 14 A/A rounds -> 3 experiments of 4, 2 left out
    seen: set[int] = set()
    for e in exps:
        rounds = set(e["ab"]) | set(e["aa"])
        assert not rounds & seen, "a round in two experiments"
        seen |= rounds
        if e["ab"]:
            assert {start_of[r] for r in e["ab"]} == set(e["units"])
            assert len(e["ab"]) == 3 * 2  # every pair of each of its starts
        assert len(e["aa"]) in (0, 4)


def test_known_answers_are_recovered(tmp_path):
    # B 5 % slower (throughput ratio 0.95) with a start effect of +-0.5 %: found at every level, never the wrong way;
    # A/A rounds identical: no claim and not "equivalent" either (no spread: a set-up to check), the interval (a point)
    # covering 1.
    offs = {0: 0.005, 1: -0.005, 2: 0.0}
    pool = calibrate.pool_record(nested_pool(tmp_path / "pool", d_ab=lambda s, p: math.log(0.95) + offs[s % 3]))
    res = calibrate.calibrate(pool, 3, 3)
    c = res["counts"]
    assert c["ab_detect_4"] == [2, 2] and c["ab_detect_16"] == [2, 2] and c["ab_detect_all"] == [2, 2]
    assert c["ab_wrong_direction"] == [0, 2] and c["ab_false_equivalence"] == [0, 2]
    assert c["aa_any_claim"] == [0, 2] and c["aa_equivalent_all"] == [0, 2] and c["aa_covers_4"] == [2, 2]
    # each experiment's starts are 0,1,2 or 3,4,5: the same three start effects, so its interval is the same and
    # holds the realised ratio of the other experiment (0.95 exactly, the offsets averaging 0)
    assert c["ab_covers_16"] == [2, 2]
    for e in res["experiments"]:
        for lv in ("4", "16"):
            assert math.isclose(e["realised_leave_out"][lv], 0.95, rel_tol=1e-6)
            assert math.isclose(e["ab"]["levels"][lv]["ratio"], 0.95, rel_tol=1e-6)
    assert math.isclose(res["pool_ratio"]["4"]["ratio"], 0.95, rel_tol=1e-6)
    # decided on p50 latency instead (the sensitivity analysis): B's latency is 1/0.95 of A's, found the same way
    p50 = res["sensitivity"]["e2e_p50"]
    assert p50["ab_detect_4"] == [2, 2] and p50["ab_wrong_direction"] == [0, 2] and p50["aa_any_claim"] == [0, 2]
    text = calibrate.render([pool], [res], ["x"])
    assert "## The same experiments decided on another metric (sensitivity, in-sample)" in text
    assert "| detection of the known effect, c=4 | 2/2 = 100 % [34, 100] | 2/2 = 100 % [34, 100] |" in text


def test_a_biased_aa_pair_is_claimed(tmp_path):
    # The A/A experiments really go through the rule: a 3 % bias on the window labelled B, with noise, is claimed.
    pool = calibrate.pool_record(nested_pool(tmp_path / "pool", aa_per_start=2, aa_bias=math.log(1.03), noise=0.02))
    c = calibrate.calibrate(pool, 3, 3)["counts"]
    assert c["aa_any_claim"][1] == 4 and c["aa_any_claim"][0] == 4
    assert c["aa_covers_16"][0] == 0


def test_command_line_writes_raw_form_and_recomputes_from_it(tmp_path, capsys, noisy_pool):
    run = noisy_pool
    raw, out1, out2 = tmp_path / "pool.json", tmp_path / "a.md", tmp_path / "b.md"
    assert calibrate.main(["--pools", str(run), "--json", str(raw), "--out", str(out1), "--command-note", "x"]) == 0
    assert calibrate.main(["--from-json", str(raw), "--out", str(out2), "--command-note", "x"]) == 0
    assert out1.read_text() == out2.read_text()
    obj = json.loads(raw.read_text())
    assert obj["schema"] == calibrate.SCHEMA
    w = obj["pools"][0]["windows"][0]
    assert {"round", "kind", "arm", "start", "position", "timing", "levels"} <= set(w)
    assert set(w["levels"]["16"]) >= {"throughput_rps", "n", "n_error", "within_var"}
    text = out1.read_text()
    assert "Wilson" in text and "false claims at true 1" in text and "detection of the known effect" in text
    assert raw.stat().st_size < 100_000


def test_bad_input_is_one_line(tmp_path, capsys, noisy_pool):
    run = noisy_pool
    assert calibrate.main(["--pools", str(run), "--units", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at least 2 units" in err[0]
    (tmp_path / "other.json").write_text('{"schema": "something-else"}')
    assert calibrate.main(["--from-json", str(tmp_path / "other.json")]) == 2
    assert "not a tts-calibration-pools/1 file" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert calibrate.main(["--pools", str(tmp_path / "empty")]) == 2
    assert "not an A/B run folder" in capsys.readouterr().err
    assert calibrate.main(["--pools", str(run), "--units", "20"]) == 2
    assert "fewer than 20 units" in capsys.readouterr().err


def test_an_interrupted_pool_ends_with_its_last_window(tmp_path):
    # A pool stopped mid-run has no "ended" in its manifest: its wall clock ends with the last window that ended.
    run = nested_pool(tmp_path / "pool", starts=3)
    man_path = run / "manifest.json"
    man = json.loads(man_path.read_text())
    man["ended"], man["status"] = None, "running"
    man_path.write_text(json.dumps(man))
    pool = calibrate.pool_record(run)
    assert pool["ended"] == "2026-01-01T00:01:00Z"
    assert pool["wall_s"] == 60.0


def _rounds_pool(d_aa, d_ab):
    """A raw-form pool whose rounds have exactly these ln(B/A) values of the primary metric (A/A rounds first)."""
    wins = []
    for r, (kind, d) in enumerate([("aa", x) for x in d_aa] + [("ab", x) for x in d_ab]):
        for arm, v in (("A", 10.0), ("B", 10.0 * math.exp(d))):
            wins.append({"block_id": f"{r:03d}-{arm}", "round": r, "kind": kind, "arm": arm, "start": 0,
                         "position": arm == "B", "valid": True, "levels": {"8": {calibrate.PRIMARY_METRIC: v}}})
    return {"design": "swap", "windows": wins}


def test_assumption_checks_find_bias_dependence_and_outliers():
    import numpy as np

    rng = np.random.default_rng(5)
    x = rng.normal(0.0, 0.01, 40)
    iid = list(x - x.mean())  # mean exactly 0: its interval holds 0 whatever the draw
    ar = [0.0]
    for _ in range(39):  # strongly autocorrelated rounds (a drift the pairing did not cancel)
        ar.append(0.9 * ar[-1] + rng.normal(0.0, 0.01))
    ok = {a["kind"]: a for a in calibrate.assumptions(_rounds_pool(iid, [x - 0.02 for x in iid]), "8")}
    assert ok["aa"]["mean_ci"][0] <= 0 <= ok["aa"]["mean_ci"][1] and abs(ok["aa"]["lag1"]) <= ok["aa"]["lag1_band"]
    assert ok["aa"]["shapiro_p"] >= 0.01 and ok["aa"]["sd_ci"][0] < 0.01 < ok["aa"]["sd_ci"][1]
    assert math.isclose(ok["ab"]["mean"], ok["aa"]["mean"] - 0.02) and math.isclose(ok["ab"]["sd"], ok["aa"]["sd"])
    biased = {a["kind"]: a for a in calibrate.assumptions(_rounds_pool([x + 0.02 for x in iid], ar), "8")}
    assert biased["aa"]["mean_ci"][0] > 0  # a 2 % A/A bias at 1 % noise over 40 rounds
    assert biased["ab"]["lag1"] > biased["ab"]["lag1_band"]  # the drift
    outlier = {a["kind"]: a for a in calibrate.assumptions(_rounds_pool(iid[:-1] + [0.2], iid), "8")}
    assert outlier["aa"]["shapiro_p"] < 0.01
    text = "\n".join(calibrate.assumptions_lines({"levels": ["8"], "assumptions": {"8": list(biased.values())}}))
    assert "**biased**" in text and "**correlated**" in text
    flat = calibrate.assumptions(_rounds_pool([0.0] * 5, [0.01] * 5), "8")  # no spread: no normality test
    assert all(a["shapiro_p"] is None and a["sd"] == 0 for a in flat)


def test_left_out_rounds_are_named_with_their_reason(tmp_path, capsys, noisy_pool):
    pool = _rounds_pool([0.0] * 4, [0.01] * 6)
    cut = calibrate.exclude_rounds(pool, "1-2, 7", "a test run shared the box")
    assert sorted({w["round"] for w in cut["windows"]}) == [0, 3, 4, 5, 6, 8, 9]
    assert cut["excluded"] == {"rounds": [1, 2, 7], "why": "a test run shared the box"}
    assert len(pool["windows"]) == 20  # the pool itself is untouched
    assert calibrate._ranges([1, 2, 3, 7, 9, 10]) == "1-3, 7, 9-10"
    for spec, why, msg in (("3-1", "x", "not a round or a range"), ("a", "x", "not a round or a range"),
                           ("2", " ", "needs --exclude-why")):
        try:
            calibrate.exclude_rounds(pool, spec, why)
        except ValueError as e:
            assert msg in str(e)
        else:
            raise AssertionError(spec)
    run = noisy_pool
    assert calibrate.main(["--pools", str(run), "--exclude-rounds", "2-x", "--exclude-why", "y"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--exclude-rounds" in err[0]
    out = tmp_path / "v.md"
    assert calibrate.main(["--pools", str(run), "--exclude-rounds", "0-2", "--exclude-why", "busy box",
                           "--out", str(out)]) == 0
    assert "**rounds left out of every number below: 0-2** (busy box)" in out.read_text()
    assert "--exclude-rounds 0-2 --exclude-why 'busy box'" in out.read_text()


def test_a_real_change_is_detected_in_the_direction_the_pool_shows():
    """Without a known delay on B (original vs fixed: B faster), detection counts "faster" and "slower" is the wrong
    direction; under a known delay it stays "slower"."""
    rows = [{"aa": None, "ab": {"levels": {"8": {"n": 3, "kind": k, "ci": [1.01, 1.08]}}}, "realised_leave_out": None}
            for k in ("faster", "faster", "inconclusive")]
    c = calibrate.counts(rows, ["8"], "faster")
    assert c["ab_detect_8"] == [2, 3] and c["ab_wrong_direction"] == [0, 3]
    assert calibrate.counts(rows, ["8"], "slower")["ab_wrong_direction"] == [2, 3]


def host_delay_pool(delay_us=500.0, spc_a=0.0006, spc_b=0.0011, e2e_a=7.8, audio_s=5.04):
    """The raw form of a real-server pool: one A/B round at c=2 whose windows' counters say what B's host delay
    costs per call (the report's prediction reads those)."""
    def win(arm, spc, pos):
        lv = {"audio_throughput": 1.0, "e2e_p50": e2e_a, "seconds_per_call": spc, "stall_seconds_per_call": None,
              "mean_batch": 1.95, "e2e_mean": e2e_a, "audio_s_mean": audio_s, "within_var": {}}
        return {"block_id": f"00{pos}-r0-ab-{arm}", "round": 0, "kind": "ab", "arm": arm, "start": 0, "position": pos,
                "status": "complete", "valid": True, "invalid_reason": None, "level_order": [2], "timing": {},
                "levels": {"2": lv}}
    return {"name": "real-pool", "design": "swap", "variants": {"A": "fixed", "B": "fixed"},
            "backend": {"name": "vllm-cpu", "simulated": False, "version": "real vllm-omni 0.16.0 server on CPU"},
            "settings": {"b_host_delay_us": delay_us, "executor": "uni", "b_sim_set": []},
            "windows": [win("A", spc_a, 0), win("B", spc_b, 1)], "starts": []}


def test_a_real_server_pool_predicts_its_known_answer_from_the_counters():
    """B's host delay: the report's prediction (measured s per call x 15 calls per step x 12.5 steps per audio
    second x audio per request, against A's mean latency), not the simulator's 1/(1+X)."""
    pool = host_delay_pool()
    saving = (0.0006 - 0.0011) * 15 * 5.04 * 12.5  # s per request (negative: B slower)
    assert calibrate.predicted_ratio(pool, "2") == pytest.approx(7.8 / (7.8 - saving))
    assert calibrate.expected_word(pool, ["2"]) == "slower"
    assert not calibrate.is_simulated(pool)
    text = calibrate.known_answer_text(pool)
    assert "host delay of 500 us per build_attn_metadata call" in text and "1/(1+X" not in text
    no_delay = {**pool, "settings": {**pool["settings"], "b_host_delay_us": None}}
    assert calibrate.predicted_ratio(no_delay, "2") is None
    assert calibrate.is_simulated({"settings": {}})  # a pool from before backends were recorded: the simulator

"""Statistics on synthetic run folders with known answers (no server, no Locust: fast)."""

from __future__ import annotations

import json

import pytest
from conftest import make_run

from tts_predictor.domain import CALLS_PER_STEP, CODEC_FRAME_RATE_HZ
from ttsrecords import outcomes as oc
from ttsrecords import records
from ttsreport.analysis import Options, summarize, write_statistics
from ttsreport.blocks import closed_loop_rates, level_stats, outlived_levels
from ttsreport.prediction import read_micro


def test_known_effect_detected(tmp_path):
    run = make_run(tmp_path / "r", rounds=6, slow_b=0.05, noise=0.005)
    summary, comp = summarize(run)
    assert summary["simulated"] and not summary["partial"] and not summary["invalid_blocks"]
    assert comp["headline"]["kind"] == "slower" and comp["headline"]["metric"] == "audio_throughput"  # the default
    for lv in ("8", "64"):
        for key, role in (("audio_throughput", "primary"), ("throughput_rps", "secondary")):
            thr = comp["per_level"][lv]["metrics"][key]
            assert thr["kind"] == "slower" and thr["role"] == role, thr["text"]
            # B's latency x1.05 in a closed loop: throughput ratio 1/1.05, and the interval around it
            assert thr["ci"][0] < thr["ratio"] < thr["ci"][1] and abs(thr["ratio"] - 1 / 1.05) < 0.01
        lat = comp["per_level"][lv]["metrics"]["e2e_p50"]
        assert lat["kind"] == "slower" and lat["role"] == "secondary" and "uncorrected" in lat["text"]
        assert lat["text"].startswith("slower: B p50 latency ×1.0")


@pytest.mark.slow  # a Monte Carlo rate check: 60 run folders written and analysed
def test_aa_rarely_claims(tmp_path):
    """60 synthetic A/A experiments: a headline claim at most 7 times (P = 1.1 % at a true 5 % rate; the precise
    rate is tools/verdict_synthetic.py's, over 10,000 experiments)."""
    claims = 0
    for seed in range(60):
        run = make_run(tmp_path / f"r{seed}", rounds=5, slow_b=0.0, noise=0.005, seed=seed, levels=(8, 16))
        _, comp = summarize(run)
        claims += comp["headline"]["kind"] in ("faster", "slower", "mixed")
    assert claims <= 7


def test_wide_interval_is_inconclusive_with_rounds_needed(tmp_path):
    run = make_run(tmp_path / "r", rounds=3, slow_b=0.0, noise=0.03, seed=5)  # wide; at 0.05 "out of reach"
    _, comp = summarize(run)
    row = comp["headline"]["levels"]["64"]
    assert row["kind"] == "inconclusive" and row["rounds_needed"] >= 1
    assert "power" in row["rounds_needed_assumption"] and "Holm" in row["rounds_needed_assumption"]


def test_manipulation_check_excludes_block_loudly(tmp_path):
    run = make_run(tmp_path / "r", rounds=3)
    # the A window of the first A/B round (variant original) shows the fixed signature
    bad = next(p for p in sorted((run / "blocks").iterdir()) if "-ab-A" in p.name)
    lines = [json.loads(x) for x in (bad / "counters.jsonl").read_text().splitlines()]
    for x in lines:
        if x["kind"] == "delta":
            x["syncs"] = x["observed_calls"] * 5  # the fixed signature in an 'original' block
    (bad / "counters.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary, comp = summarize(run)
    assert [b["block_id"] for b in summary["invalid_blocks"]] == [bad.name]
    assert "manipulation check failed" in summary["invalid_blocks"][0]["reason"]
    assert comp["rounds"]["ab"] == 2 and comp["invalid_blocks"]
    assert comp["per_level"]["8"]["metrics"]["throughput_rps"]["n"] == 2  # the round is out, both windows


def test_missing_counters_fail_the_check():
    chk = oc.manipulation_check("fixed", [])
    assert not chk["ok"] and "no sync counters" in chk["reason"]
    ok = oc.manipulation_check("original", [{"kind": "delta", "syncs": 2 * 16 + 4 * 2, "observed_calls": 2,
                                             "observed_tokens": 2 * 16, "variant": "original"}])
    assert ok["ok"], ok


def test_partial_run_and_truncated_line(tmp_path):
    run = make_run(tmp_path / "r", rounds=2, status="interrupted")
    blk = sorted((run / "blocks").iterdir())[-1]
    with open(blk / "requests.jsonl", "a") as f:
        f.write('{"schema": "tts-request/1", "conc')  # an interrupted writer
    summary, comp = summarize(run)
    assert summary["partial"] and any("truncated" in n for n in summary["notes"])


def test_unknown_schema_refused(tmp_path):
    run = make_run(tmp_path / "r", rounds=2)
    blk = sorted((run / "blocks").iterdir())[0]
    with open(blk / "requests.jsonl", "a") as f:
        f.write(json.dumps({"schema": "tts-request/9"}) + "\n")
    with pytest.raises(ValueError, match="unknown schema"):
        summarize(run)


def test_level_metrics_match_definitions():
    reqs = [{"phase": "measure", "ok": True, "e2e_s": e, "ttfa_s": e / 10, "audio_s": 2.0, "rtf": e / 2,
             "t_start": float(i)} for i, e in enumerate([1.0, 2.0, 3.0, 4.0])]
    reqs += [{"phase": "measure", "ok": False, "error": "http 500", "t_start": 4.0},
             {"phase": "warmup", "ok": True, "e2e_s": 100.0, "audio_s": 2.0, "t_start": -1.0}]
    s = level_stats(reqs, {"duration_s": 8.0})
    assert s["throughput_rps"] == pytest.approx(4 / 8) and s["audio_throughput"] == pytest.approx(8 / 8)
    assert s["e2e_p50"] == pytest.approx(2.5) and s["error_rate"] == pytest.approx(0.2)
    assert s["errors"] == {"http 500": 1}
    s2 = level_stats(reqs, None)  # no counters: window from the start times, 5 starts over 4 s -> 5 s
    assert s2["window_source"] == "records" and s2["window_s"] == pytest.approx(5.0)


def test_prediction_from_counters(tmp_path):
    run = make_run(tmp_path / "r", rounds=2)
    _, comp = summarize(run)
    p = comp["per_level"]["64"]["prediction"]
    # synthetic: original 3e-4*2 s/call, fixed 1e-4*2 s/call at c=64; 4 s audio = 50 codec frames; 15 calls/step
    assert p["saving_per_call_s"] == pytest.approx(4e-4)
    assert p["frames_per_request"] == pytest.approx(4 * CODEC_FRAME_RATE_HZ) == pytest.approx(50)
    assert p["e2e_saving_s"] == pytest.approx(4e-4 * CALLS_PER_STEP * 50)
    assert p["e2e_diff_pct"] < 0 and p["e2e_ratio"] == pytest.approx(1 + p["e2e_diff_pct"] / 100)
    assert p["model"] is None or p["model"]["ratio"] is None  # no sim_config in this manifest: no fitted model


def test_write_statistics_json_is_strict(tmp_path):
    run = make_run(tmp_path / "r", rounds=2)
    ps = write_statistics(run)
    for p in ps:
        obj = json.loads(p.read_text())
        assert obj["schema"] in (records.SUMMARY_SCHEMA, records.COMPARISON_SCHEMA)


def test_prediction_from_micro_results(tmp_path):
    rows = [{"scenario": sc, "num_reqs": n, "max_seq_len": 16, "variant": v, "median_us": us}
            for sc, n, v, us in [("decode", 8, "original", 100.0), ("decode", 64, "original", 500.0),
                                 ("prefill", 64, "original", 800.0), ("decode", 64, "fixed", 200.0),
                                 ("decode", 8, "fixed", 60.0), ("prefill", 64, "fixed", 200.0)]]
    (tmp_path / "results.json").write_text(json.dumps({"schema": records.MICRO_SCHEMA, "rows": rows}))
    micro = read_micro(tmp_path / "results.json")
    assert micro[("original", 64)] == pytest.approx((800 + 14 * 500) / 15 * 1e-6)
    run = make_run(tmp_path / "r", rounds=2)
    _, comp = summarize(run, Options(micro=str(tmp_path / "results.json")))
    p = comp["per_level"]["64"]["prediction"]
    assert p["source"] == "micro benchmark"
    assert p["saving_per_call_s"] == pytest.approx(((800 + 14 * 500) - (200 + 14 * 200)) / 15 * 1e-6)


def test_throughput_counts_lifetime_share_inside_the_window():
    reqs = [{"phase": "warmup", "ok": True, "e2e_s": 3.0, "audio_s": 1.0, "t_start": 8.0},  # 1 of 3 s inside
            {"phase": "measure", "ok": True, "e2e_s": 1.0, "audio_s": 2.0, "t_start": 12.0},  # all inside
            {"phase": "measure", "ok": True, "e2e_s": 15.0, "audio_s": 2.0, "t_start": 14.0},  # 6 of 15 s inside
            {"phase": "measure", "ok": False, "error": "x", "t_start": 15.0}]
    s = level_stats(reqs, None, (10.0, 20.0))
    assert s["window_source"] == "snapshots" and s["completed_in_window"] == 2
    assert s["throughput_rps"] == pytest.approx((1 / 3 + 1 + 6 / 15) / 10)
    assert s["audio_throughput"] == pytest.approx((1 / 3 + 2 + 2 * 6 / 15) / 10)
    assert s["e2e_p50"] == pytest.approx(8.0)  # latency: requests started in the measure phase


def _closed(bucket: str, e2e: float, audio: float, ok: bool = True, phase: str = "measure", t: float = 0.0) -> dict:
    return {"phase": phase, "ok": ok, "e2e_s": e2e, "audio_s": audio if ok else None, "bucket": bucket,
            "t_start": t, "error": None if ok else "http 500"}


def test_closed_loop_rates_are_littles_law_over_the_mix_not_the_sample():
    """c x E[audio] / E[latency] with bucket means weighed by the scenario's mix: a window that drew twice as many
    short prompts as the mix says reads the same rate as one that drew them in proportion (same work per bucket)."""
    mix = {"short": 1, "medium": 1}
    even = [_closed("short", 2.0, 2.5), _closed("short", 2.2, 2.5), _closed("medium", 9.0, 11.0),
            _closed("medium", 9.4, 11.0)]
    skewed = even + [_closed("short", 2.0, 2.5), _closed("short", 2.2, 2.5)]
    a, b = closed_loop_rates(even, 8, mix), closed_loop_rates(skewed, 8, mix)
    e_mix, a_mix = (2.1 + 9.2) / 2, (2.5 + 11.0) / 2
    assert a["stratified"] and a["audio_throughput"] == pytest.approx(8 * a_mix / e_mix)
    assert a["throughput_rps"] == pytest.approx(8 / e_mix)
    assert b["audio_throughput"] == pytest.approx(a["audio_throughput"])  # the prompt draw does not move it
    plain = closed_loop_rates(skewed, 8, None)  # no mix known: the plain ratio of sums, which the draw moves
    assert not plain["stratified"] and plain["audio_throughput"] == pytest.approx(8 * 32.0 / 26.8)


def test_closed_loop_rates_count_a_failure_as_time_without_audio_and_fall_back_without_a_bucket():
    mix = {"short": 1, "medium": 1}
    rows = [_closed("short", 2.0, 2.5), _closed("short", 4.0, 0.0, ok=False), _closed("medium", 9.0, 11.0),
            _closed("medium", 9.0, 11.0)]
    r = closed_loop_rates(rows, 4, mix)
    assert r["audio_throughput"] == pytest.approx(4 * (0.5 * 1.25 + 0.5 * 11.0) / (0.5 * 3.0 + 0.5 * 9.0))
    assert r["throughput_rps"] == pytest.approx(4 * (0.5 * 0.5 + 0.5) / 6.0)
    assert r["var_log"]["audio_throughput"] > 0  # the within-window variance of the variance components
    only_short = closed_loop_rates(rows[:2], 4, mix)  # the window holds no medium prompt: no mix weights to apply
    assert not only_short["stratified"] and only_short["audio_throughput"] == pytest.approx(4 * 2.5 / 6.0)


def test_level_stats_uses_the_closed_loop_estimator_and_keeps_the_window_one_beside_it():
    reqs = [_closed("short", 1.0, 2.0, t=12.0), _closed("short", 15.0, 2.0, t=14.0),
            _closed("short", 3.0, 1.0, phase="warmup", t=8.0)]
    s = level_stats(reqs, None, (10.0, 20.0), concurrency=2, workload={"loop": "closed", "mix": {"short": 1}})
    assert s["rate_estimator"] == "closed_loop" and s["throughput_rps"] == pytest.approx(2 / 8.0)
    assert s["audio_throughput"] == pytest.approx(2 * 2.0 / 8.0)  # started in the measure phase, counted whole
    assert s["throughput_rps_window"] == pytest.approx((1 / 3 + 1 + 6 / 15) / 10)  # the lifetime shares
    open_loop = level_stats(reqs, None, (10.0, 20.0), concurrency=2, workload={"loop": "open", "mix": None})
    assert open_loop["rate_estimator"] == "window" and open_loop["throughput_rps"] == s["throughput_rps_window"]


def test_a_measured_request_that_outlived_its_levels_drain_is_found():
    snap = {"kind": "snapshot", "concurrency": 8, "ok": True, "step": 0}
    block = {"workload": {"drains": {8: 1.0}},
             "counters": [{**snap, "edge": "start", "t": 0.0}, {**snap, "edge": "end", "t": 10.0}],
             "requests": [{**r, "concurrency": 8} for r in (
                 _closed("short", 5.0, 2.0, t=9.0), _closed("short", 1.2, 2.0, t=9.5),
                 _closed("short", 9.0, 2.0, phase="drain", t=10.5))]}
    assert outlived_levels(block) == {8: (1, pytest.approx(3.0))}  # 14 s against 10 + 1; 10.7 is within the slack
    block["workload"]["drains"] = {8: 4.0}
    assert outlived_levels(block) == {}

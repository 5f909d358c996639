"""The statistics on synthetic version-2 run folders with known answers (tests/synthetic_runs.py): the verdict through
the inference API, failures as data, A/A bias, nested designs (known variance components), the order effect,
requests spanning a switch, telemetry, streaming continuity, vllm-omni series, the fitted model's prediction, the
sequential look and the pilot plan commands (in-process, through main(argv)), old runs and unknown schemas."""

from __future__ import annotations

import json
import math
import random
import shutil

import numpy as np
import pytest
import synthetic_runs as sr
from conftest import ROOT
from scipy import stats as sps

from ttsrecords import records as rec
from ttsreport import __main__ as cli
from ttsreport import inference as inf
from ttsreport import render, report
from ttsreport.analysis import Options, summarize, write_statistics
from ttsreport.blocks import block_summary
from ttsreport.runfolder import load_run


def report_md(run) -> str:
    """summary.md as `python -m ttsreport <run>` writes it, from the JSON it writes, without drawing index.html's
    figures (most of the command's time; the page is tested in test_report_html.py)."""
    write_statistics(run)
    return render.markdown(*report.load(run))


def test_fresh_known_effect_reads_the_same_for_every_metric(tmp_path):
    """B's latency x1/1.05: throughput x1.05 and latency x0.952, both "B 1.05x faster"."""
    run = sr.fresh(tmp_path / "r", rounds=6, aa_rounds=1, b_factor=1 / 1.05)
    summary, comp = summarize(run)
    assert comp["schema"] == rec.COMPARISON_SCHEMA and summary["schema"] == rec.SUMMARY_SCHEMA
    head = comp["headline"]
    assert head["rule"] == "fixed" and head["kind"] == "faster" and "Holm" in head["correction"]
    for lv in ("2", "8"):
        thr, lat = (comp["per_level"][lv]["metrics"][m] for m in ("throughput_rps", "e2e_p50"))
        assert abs(thr["ratio"] - 1.05) < 0.01 and thr["ci"][0] < 1.05 < thr["ci"][1]
        assert abs(lat["ratio"] - 1 / 1.05) < 0.01
        assert abs(thr["gain"] - lat["gain"]) < 0.01  # one estimand: the same speed-up read from either metric
        assert lat["role"] == "secondary" and not lat["corrected"] and "uncorrected" in lat["text"]
        assert head["levels"][lv]["p_holm"] >= thr["p_value"]
        assert comp["per_level"][lv]["error_rate"]["kind"] == "inconclusive"  # no failures anywhere
    assert comp["without_failures"] is None  # no round had a failure: the second analysis would be the first
    assert comp["settings"]["margin_pct"] == 1.0 and comp["settings"]["margin_source"] == "default"
    assert comp["settings"]["unit"] == "round" and comp["settings"]["design"] == "fresh"


def test_equivalence_with_the_margin_from_the_scenario_and_the_override(tmp_path):
    run = sr.fresh(tmp_path / "r", rounds=8, b_factor=1.0, noise=0.02, scenario={"margin_pct": 3.0})
    _, comp = summarize(run)
    assert comp["settings"]["margin_pct"] == 3.0 and comp["settings"]["margin_source"] == "scenario.yaml"
    assert comp["headline"]["kind"] == "equivalent", comp["headline"]["text"]
    _, tight = summarize(run, Options(margin_pct=0.01))
    assert tight["settings"]["margin_source"] == "--margin-pct"
    assert tight["headline"]["kind"] == "inconclusive"  # ±0.01 % is narrower than any interval of 8 rounds
    assert cli.main([str(run), "--margin-pct", "0.01"]) == 0
    assert json.loads((run / "comparison.json").read_text())["settings"]["margin_pct"] == 0.01


def test_primary_metric_from_the_experiment(tmp_path):
    run = sr.fresh(tmp_path / "r", rounds=5, b_factor=1 / 1.05,
                   manifest={"experiment": {"name": "x", "primary_metric": "e2e_p50", "arms": {}}})
    _, comp = summarize(run)
    assert comp["primary_metric"] == "e2e_p50" and comp["headline"]["metric"] == "e2e_p50"
    assert comp["headline"]["kind"] == "faster"  # lower latency is better: "faster" in the metric's own direction
    assert comp["per_level"]["8"]["metrics"]["e2e_p50"]["role"] == "primary"
    assert comp["per_level"]["8"]["metrics"]["throughput_rps"]["role"] == "secondary"


def test_aa_bias_is_flagged_loudly_and_never_moves_a_threshold(tmp_path):
    run = sr.fresh(tmp_path / "r", rounds=4, aa_rounds=4, b_factor=1 / 1.05, aa_factor=1.05)
    _, comp = summarize(run)
    aa = comp["per_level"]["8"]["aa"]["throughput_rps"]
    assert aa["warn"] and aa["n"] == 4 and aa["ci"][1] < 1.0  # the second A window 5 % slower
    assert comp["aa_warnings"] and "A/A throughput" in comp["aa_warnings"][0]
    # the A/B verdict does not depend on the A/A rounds (no floor): without them, the same interval
    same = tmp_path / "without-aa"
    shutil.copytree(run, same)
    for blk in (same / "blocks").iterdir():
        if "-aa-" in blk.name:
            shutil.rmtree(blk)
    _, ref = summarize(same)
    assert not ref["aa_warnings"] and ref["rounds"] == {"ab": 4, "aa": 0}
    assert comp["per_level"]["8"]["metrics"]["throughput_rps"]["ci"] == ref["per_level"]["8"]["metrics"][
        "throughput_rps"]["ci"]
    assert comp["headline"]["kind"] == ref["headline"]["kind"] == "faster"
    assert "A/A BIAS" in report_md(run)


def test_failures_are_data_with_a_second_analysis(tmp_path):
    """B fails 30 measure requests at c=8 in every round: its error rate has a verdict; the rounds are kept in the
    primary analysis and left out of the second one."""
    run = sr.fresh(tmp_path / "r", rounds=6, b_factor=1 / 1.05,
                   failures=lambda i, arm: {8: 30} if arm == "B" else ({8: 1} if i == 0 else {}))
    summary, comp = summarize(run)
    assert not summary["invalid_blocks"]  # failed requests alone never invalidate a window
    er = comp["per_level"]["8"]["error_rate"]
    assert er["kind"] == "more_failures" and er["rate_b"] > er["rate_a"] and er["ci_pp"][0] > 0
    assert comp["per_level"]["2"]["error_rate"]["kind"] == "inconclusive"
    clean = comp["without_failures"]
    assert clean["left_out"]["8"] == sorted(comp["per_level"]["8"]["error_rate"]["rounds_with_failures"])
    assert len(clean["left_out"]["8"]) == 6 and clean["left_out"]["2"] == []
    assert clean["levels"]["8"]["n"] == 0 and clean["levels"]["2"]["n"] == 6
    assert clean["differs"] == ["8"]  # no round left at c=8: inconclusive there, unlike the first analysis
    assert comp["per_level"]["8"]["metrics"]["throughput_rps"]["n"] == 6


def _nested_designed(tmp_path, name, *, S=6, W=4, s2_start=0.02 ** 2, s2_pair=0.01 ** 2, mean=0.05, noise=0.0,
                     carry_over=0.0, seed=3, latency=0.2):
    """Start effects with sample variance s2_start + s2_pair/W and pair effects with sample variance s2_pair inside
    every start (mean 0 there, in a seeded order): the method of moments recovers s2_start and s2_pair exactly.
    With no per-request noise that holds at any latency (arm A's, s); a long one writes fewer requests."""
    u = sr.designed_effects(S, s2_start + s2_pair / W)
    rng = random.Random(seed)
    e = {}
    for s in range(S):
        e[s] = sr.designed_effects(W, s2_pair) if s2_pair else [0.0] * W
        rng.shuffle(e[s])
    return sr.nested(tmp_path / name, starts=S, pairs=W, d=lambda s, p: mean + u[s] + e[s][p], noise=noise,
                     carry_over=carry_over, seed=seed, latency=latency), u


def test_nested_known_components_and_the_start_as_the_unit(tmp_path):
    """Known answer, exact: no per-request noise, so every window's throughput is c / latency and the components are
    the designed ones to rounding; the interval is the t interval over the 6 start means (5 df)."""
    run, u = _nested_designed(tmp_path, "n", latency=0.8)
    _, comp = summarize(run)
    res = comp["per_level"]["4"]["metrics"]["throughput_rps"]
    assert res["unit"] == "start" and res["n"] == 6 and res["df"] == 5 and res["n_rounds"] == 24
    half = sps.t.ppf(0.975, 5) * math.sqrt(np.var(u, ddof=1) / 6)
    assert res["ci"] == pytest.approx([math.exp(0.05 - half), math.exp(0.05 + half)], rel=1e-9)
    c = comp["per_level"]["4"]["design"]["components"]
    assert c["sigma2_start"] == pytest.approx(0.02 ** 2, rel=1e-6)
    assert c["sigma2_pair"] == pytest.approx(0.01 ** 2, rel=1e-6)
    assert c["sigma2_within"] == pytest.approx(0.0, abs=1e-12) and c["n_starts"] == 6
    # the per-pair t interval (ignoring the starts) would be much narrower: the start carries most of the variance
    d = [math.log(r["ratio"]) for r in res["rounds"]]
    assert sps.t.ppf(0.975, 23) * np.std(d, ddof=1) / math.sqrt(24) < 0.6 * half


def test_nested_within_window_variance_from_the_requests(tmp_path):
    """With per-request noise (lognormal sd s), a window's throughput has sampling variance ~ s^2 / n on the log
    scale (Little's law); ln(B/A) twice that. The run's sigma2_within must match it: requests per window n ~ 120,
    s = 0.1, so 2 s^2 / n ~ 1.7e-4; the bound is generous because n varies and the estimate is itself noisy (each
    window's sample variance of 120 latencies has a relative sd of ~13 %, averaged over 48 windows)."""
    run, _ = _nested_designed(tmp_path, "n", noise=0.1)
    summary, comp = summarize(run)
    ns = [b["levels"]["4"]["n_ok"] for b in summary["blocks"]]
    expected = 2 * (math.exp(0.1 ** 2) - 1) / np.mean(ns)
    c = comp["per_level"]["4"]["design"]["components"]
    assert 0.8 * expected < c["sigma2_within"] < 1.25 * expected, (c["sigma2_within"], expected)
    # the designed start and pair variances stay inside their sampling error (the noise adds ~1e-4 to a pair's d)
    assert 0.5 * 0.02 ** 2 < c["sigma2_start"] < 2.0 * 0.02 ** 2


def test_order_effect_shows_carry_over(tmp_path):
    run, _ = _nested_designed(tmp_path, "n", s2_pair=0.0, carry_over=0.03, latency=0.8)
    _, comp = summarize(run)
    oe = comp["per_level"]["4"]["design"]["order_effect"]
    assert oe["n_ab"] == 12 and oe["n_ba"] == 12
    assert oe["ratio"] == pytest.approx(math.exp(0.03), rel=0.01) and oe["warn"]
    _, ref = summarize(_nested_designed(tmp_path, "m", s2_pair=0.0, latency=0.8)[0])
    assert not ref["per_level"]["4"]["design"]["order_effect"]["warn"]


def test_swap_design_is_conditional_on_its_start(tmp_path):
    wins = [sr.Window(r, "ab", arm, "original" if arm == "A" else "fixed", 0, pos,
                      {4: 0.2 if arm == "A" else 0.19})
            for r in range(4) for pos, arm in enumerate(("A", "B") if r % 2 else ("B", "A"))]
    run = sr.write_run(tmp_path / "s", wins, levels=(4,), design="swap")
    summary, comp = summarize(run)
    assert comp["settings"]["unit"] == "round" and "conditional on that start" in comp["settings"]["swap_note"]
    assert comp["per_level"]["4"]["metrics"]["throughput_rps"]["n"] == 4
    assert comp["per_level"]["4"]["design"]["components"] is None  # one start: no between-start variance
    assert summary["design"] == {"name": "swap", "unit": "round", "starts": 1, "level_order": None}
    head = comp["headline"]  # the claim is about this server start, and says so in its word
    assert head["kind"] == "faster" and head["word"] == "faster in this server start", head["text"]
    assert head["text"] == "B faster in this server start at every level (4)"
    assert comp["per_level"]["4"]["metrics"]["e2e_p50"]["text"].startswith("faster in this server start: ")
    assert cli.main([str(run)]) == 0
    md = (run / "summary.md").read_text()
    assert "- c=4: **faster in this server start**" in md
    assert ": faster in this server start — B faster in this server start at every level (4) (Holm" in md


def test_requests_spanning_a_switch_are_left_out(tmp_path):
    run, _ = _nested_designed(tmp_path, "n", S=2, W=2)
    data = load_run(run)
    blk = data["blocks"][0]
    start = data["starts"][blk["meta"]["start"]]
    plain = block_summary(blk, None)
    edges = [c["t"] for c in blk["counters"] if c.get("kind") == "snapshot" and c["edge"] in ("start", "end")]
    t_mid = (edges[0] + edges[1]) / 2  # a switch in the middle of the first measure window
    switched = block_summary(blk, {**start, "switches": [{"t": t_mid, "confirmed_t": t_mid + 0.01}]})
    lv = str(blk["meta"]["levels"][0])
    spanning = [r for r in blk["requests"] if r["ok"] and r["t_start"] < t_mid + 0.01 and t_mid < r["t_start"] + r["e2e_s"]]
    assert switched["spanning"]["left_out"] == len(spanning) > 0
    assert switched["levels"][lv]["n"] == plain["levels"][lv]["n"] - sum(r["phase"] == "measure" for r in spanning)
    assert switched["levels"][lv]["n_spanning"] == len(spanning)


def test_requests_of_an_earlier_level_inside_a_measure_window_are_warned_about(tmp_path):
    # A level after a higher one: that level's stopped users finish their requests during the next level's warm-up;
    # one still running 2 s into the next measure window means that window ran under extra load.
    run = sr.fresh(tmp_path / "r", rounds=2, aa_rounds=0)
    assert not any("were still running" in w for w in summarize(run)[0]["warnings"])
    blk = next(p for p in sorted((run / "blocks").iterdir()))
    meta = json.loads((blk / "block.json").read_text())
    first, second = meta["levels"][0], meta["levels"][1]
    t0 = next(c["t"] for c in map(json.loads, (blk / "counters.jsonl").read_text().splitlines())
              if c.get("kind") == "snapshot" and c.get("edge") == "start" and c["concurrency"] == second)
    reqs = [json.loads(x) for x in (blk / "requests.jsonl").read_text().splitlines()]
    late = {**next(r for r in reqs if r["concurrency"] == first and r["ok"]), "t_start": t0 - 1.0, "e2e_s": 3.0,
            "phase": "drain"}
    (blk / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in reqs + [late]))
    warn = [w for w in summarize(run)[0]["warnings"] if "were still running" in w]
    assert warn == [f"c={second}: requests of the level before it were still running up to 2.0 s into its measure "
                    "window (up to 1 requests, in 1 window(s)): the level was measured under extra load; lengthen "
                    "its warm-up past the preceding level's request lifetime"]


def test_a_measure_window_on_a_saturated_host_is_warned_about(tmp_path):
    run = sr.fresh(tmp_path / "r", rounds=2, aa_rounds=0)
    summary, _ = summarize(run)
    assert not any("CPUs were at least" in w for w in summary["warnings"])
    blk = next(p for p in sorted((run / "blocks").iterdir()))
    meta = json.loads((blk / "block.json").read_text())
    lv = meta["levels"][0]
    t0, t1 = (next(c["t"] for c in map(json.loads, (blk / "counters.jsonl").read_text().splitlines())
                   if c.get("kind") == "snapshot" and c.get("edge") == edge and c["concurrency"] == lv)
              for edge in ("start", "end"))
    with (blk / "telemetry.jsonl").open("a") as f:  # the host's CPUs 95-99 % busy inside that measure window
        for i, pct in enumerate((95.0, 99.0)):
            f.write(json.dumps(rec.TelemetrySample(t=t0 + (i + 1) * (t1 - t0) / 3, source="host",
                                                   host_cpu_pct=pct).to_dict()) + "\n")
    summary, _ = summarize(run)
    row = next(b for b in summary["blocks"] if b["block_id"] == blk.name)["levels"][str(lv)]["telemetry"]
    assert row["host_cpu_pct"] == 97.0 and "host" in row["sources"]
    warn = [w for w in summary["warnings"] if "CPUs were at least" in w]
    assert warn == [f"the host's CPUs were at least 90 % busy in 1 measure window(s) ({blk.name} c={lv}: 97 %): "
                    "timings there include waiting for a CPU; keep other jobs off the load generator's host"]


@pytest.mark.parametrize("source", ["process", "nvml"])
def test_telemetry_averaged_over_the_measure_windows(tmp_path, source):
    run = sr.fresh(tmp_path / "r", rounds=2, telemetry=source)
    summary, _ = summarize(run)
    t = summary["telemetry"]
    assert t["available"] and t["gpu"] == (source == "nvml")
    row = t["A"]["8"]
    if source == "nvml":  # synthetic: util 60 + 30 * c/max(c), memory 30,000 + 100 * c/max(c), clock constant
        assert row["gpu_util_pct"] == pytest.approx(90, abs=2) and row["sm_clock_mhz"] == 1980.0
        assert row["mem_used_mib"] == pytest.approx(30_100) and row["cpu_pct"] is None
    else:
        assert row["cpu_pct"] == pytest.approx(120, abs=3) and row["rss_mib"] == 512.0
        assert row["gpu_util_pct"] is None
        assert t["A"]["2"]["cpu_pct"] == pytest.approx(90, abs=3)
        md = report_md(run)  # no GPU: the GPU columns say so, the process columns show the path runs
        assert "| c=8 | A | not available | not available | not available | not available | 12" in md
    none = sr.fresh(tmp_path / "n", rounds=2, telemetry=None)
    assert not summarize(none)[0]["telemetry"]["available"]


def test_streaming_continuity_per_arm_and_its_verdict(tmp_path):
    wins = []
    for r in range(4):
        for pos, arm in enumerate(("A", "B")):
            wins.append(sr.Window(r, "ab", arm, "original" if arm == "A" else "fixed", 2 * r + pos, pos, {8: 0.2},
                                  underrun_s=0.0, stalled_share=0.0 if arm == "A" else 0.4))
    run = sr.write_run(tmp_path / "r", wins, levels=(8,))
    summary, comp = summarize(run)
    c = comp["per_level"]["8"]["continuity"]
    assert c["available"] and c["arms"]["A"]["continuity_ok_share"] == 1.0
    assert c["arms"]["B"]["continuity_ok_share"] == pytest.approx(0.6, abs=0.06)
    assert c["arms"]["B"]["underrun_mean_s"] == pytest.approx(0.25 * 0.4, abs=0.02)
    assert c["underrun_share"]["kind"] == "more_failures" and "B stalls more" in c["underrun_share"]["text"]
    assert comp["per_level"]["8"]["metrics"]["stream_rtf_p50"]["n"] == 4


def test_vllm_omni_series_per_window(tmp_path):
    run = sr.fresh(tmp_path / "r", rounds=2, omni=True, latency=0.2)
    summary, _ = summarize(run)
    u = summary["upstream"]
    assert u["available"]
    h = u["A"]["8"]["histograms"]["vllm_omni:e2e_request_latency_s"]
    assert h["mean"] == pytest.approx(0.2, rel=0.05) and h["count"] > 100 and 0.1 <= h["p50"] <= 0.25
    assert set(u["A"]["8"]["histograms"]) >= {"vllm_omni:stage_gen_time_s{stage=0,stage_type=llm}"}
    assert u["A"]["8"]["counters"]["vllm_omni:requests_success_total{finished_reason=stop}"] == h["count"]
    assert not summarize(sr.fresh(tmp_path / "n", rounds=2))[0]["upstream"]["available"]


def test_fitted_model_prediction_and_fidelity_for_a_simulated_run(tmp_path):
    run = sr.fresh(tmp_path / "r", rounds=3, sim_config="configs/sim/default.yaml")
    summary, comp = summarize(run)
    fit = json.loads((ROOT / "configs/sim/default.yaml.fit.json").read_text())
    assert summary["fidelity"]["line"] == fit["fidelity"]
    m = comp["per_level"]["8"]["prediction"]["model"]
    assert m["ci"][0] < m["ratio"] < m["ci"][1] and m["ratio"] == pytest.approx(1 + m["pct"] / 100)
    unfitted = sr.fresh(tmp_path / "u", rounds=3, sim_config="configs/sim/fast.yaml")
    s2, c2 = summarize(unfitted)
    assert "no .fit.json" in s2["fidelity"]["reason"] and c2["per_level"]["8"]["prediction"]["model"]["ratio"] is None
    real = sr.fresh(tmp_path / "v", rounds=3, simulated=False)
    s3, c3 = summarize(real)
    assert s3["fidelity"] is None and c3["per_level"]["8"]["prediction"]["model"] is None


def test_confounded_release_comparison_and_arm_info(tmp_path):
    arms = {a: {"arm": a, "label": a, "backend": "vllm", "vllm_omni": v, "image": f"img:{v}", "plugin": p,
                "evidence": "log"} for a, v, p in (("A", "0.16.0", "installed, variant fixed"),
                                                   ("B", "0.30.0", "none: no _LocalPredictorKVCache"))}
    run = sr.fresh(tmp_path / "r", rounds=2, aa_rounds=0, simulated=False,
                   manifest={"experiment": {"name": "release", "confounded": "0.16.0 vs 0.30.0: everything differs",
                                            "primary_metric": "throughput_rps", "arms": arms}})
    summary, _ = summarize(run)
    assert summary["experiment"]["confounded"].startswith("0.16.0 vs 0.30.0")
    assert summary["arms_info"]["B"]["plugin"].startswith("none") and summary["arms_info"]["A"]["image"] == "img:0.16.0"
    assert summary["arms_info"]["A"]["evidence_result"] == {"checked": 2, "ok": 2, "failures": []}
    md = report_md(run)
    assert "RELEASE VS RELEASE" in md and "img:0.30.0" in md and "none: no _LocalPredictorKVCache" in md


# ----------------------------------------------------------------------------------------------- commands


SEQ = (3, 10)  # min_rounds, max_rounds


def test_look_appends_one_line_and_says_stop(tmp_path, capsys):
    run = sr.fresh(tmp_path / "r", rounds=6, b_factor=1 / 1.05, sequential=SEQ)
    assert cli.main([str(run), "--look"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "STOP" in out[0]
    assert cli.main([str(run), "--look"]) == 0
    rows, _ = rec.read_jsonl(run / "looks.jsonl", rec.LOOK_SCHEMA)
    assert len(rows) == 2
    line = rows[-1]
    assert line["schema"] == rec.LOOK_SCHEMA and line["stop"] is True and line["rounds"] == 6
    assert line["kind"] == "faster" and set(line["levels"]) == {"2", "8"}
    assert line["levels"]["8"]["ci"][0] > 1.0 and line["metric"] == "throughput_rps"
    # the report of a sequential run: its headline from the sequential rule, the looks in a table
    md = report_md(run)
    comp = json.loads((run / "comparison.json").read_text())
    assert comp["headline"]["rule"] == "sequential" and comp["headline_fixed"]["rule"] == "fixed"
    seq_ci, fixed_ci = comp["headline"]["levels"]["8"]["ci"], comp["headline_fixed"]["levels"]["8"]["ci"]
    assert seq_ci[0] < fixed_ci[0] and seq_ci[1] > fixed_ci[1]  # repeated intervals are wider
    for row in comp["headline"]["levels"].values():  # the card's interval is the one that decided the claim
        assert row["kind"] == "faster" and row["ci_decision"][0] > 1.0 and "Holm step" in row["ci_decision_what"]
    summary = json.loads((run / "summary.json").read_text())
    assert len(summary["looks"]) == 2 and "Sequential looks" in md


def test_look_waits_for_min_rounds_and_refuses_a_fixed_run(tmp_path, capsys):
    run = sr.fresh(tmp_path / "r", rounds=2, b_factor=1 / 1.05, sequential=SEQ, planned_rounds=10)
    assert cli.main([str(run), "--look"]) == 0
    line = json.loads((run / "looks.jsonl").read_text().splitlines()[-1])
    assert line["stop"] is False and line["kind"] == "inconclusive" and line["rounds"] == 2
    # the same two rounds as the whole plan: the look after the last unit decides, it never says continue
    done = sr.fresh(tmp_path / "d", rounds=2, b_factor=1 / 1.05, sequential=SEQ)
    assert cli.main([str(done), "--look"]) == 0
    line = json.loads((done / "looks.jsonl").read_text().splitlines()[-1])
    assert line["stop"] is True and line["reason"].startswith("last look") and line["kind"] == "inconclusive"
    fixed = sr.fresh(tmp_path / "f", rounds=2)
    capsys.readouterr()
    assert cli.main([str(fixed), "--look"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "sequential" in err[0]
    assert not (fixed / "looks.jsonl").exists()


def test_plan_from_a_nested_pilot(tmp_path, capsys):
    run, _ = _nested_designed(tmp_path, "pilot", S=3, W=2, noise=0.05)
    assert cli.main([str(run), "--plan", "--target-halfwidth-pct", "1"]) == 0
    out = capsys.readouterr().out
    plan = json.loads((run / "plan.json").read_text())
    assert plan["schema"] == rec.PLAN_SCHEMA and plan["starts"] >= 2 and plan["windows_per_start"] >= 1
    assert plan["costs"]["start_s"] == pytest.approx(12.0 + 2.0)  # start.json ready_s + stop_s
    assert plan["costs"]["window_pair_s"] > 0 and "half-width = t(S-1)" in plan["formula"]
    assert plan["halfwidth_pct"] <= 1.0 and f"S={plan['starts']}" in out and plan["formula"] in out
    ch = plan["chance_of_target"]  # the plan says how likely it is to reach its target, and from how little it knows
    assert 0.0 < ch["known_variances"] < 1.0 and 0.0 < ch["with_pilot_uncertainty"] < 1.0
    assert {k: ch["pilot_df"][k] for k in ("start", "pair")} == {"start": 2, "pair": 3} and set(ch["per_level"]) == set(plan["levels"])
    assert f"chance of reaching it {100 * ch['known_variances']:.0f} %" in out and f"has {ch['pilot_df']['unit']} df" in out
    s2s, s2p = plan["components"]["sigma2_start"], plan["components"]["sigma2_pair"]
    s2w = plan["components"]["sigma2_within"]
    S, W = plan["starts"], plan["windows_per_start"]
    hw = sps.t.ppf(0.975, S - 1) * math.sqrt(s2s / S + (s2p + s2w) / (S * W))
    assert 100 * math.expm1(hw) == pytest.approx(plan["halfwidth_pct"])
    fresh = sr.fresh(tmp_path / "f", rounds=3)
    capsys.readouterr()
    assert cli.main([str(fresh), "--plan"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nested" in err[0] and not (fresh / "plan.json").exists()


def test_unknown_schema_is_refused_in_one_line(tmp_path, capsys):
    run = sr.fresh(tmp_path / "r", rounds=2)
    blk = sorted((run / "blocks").iterdir())[0] / "block.json"
    obj = json.loads(blk.read_text())
    blk.write_text(json.dumps({**obj, "schema": "tts-block/9"}))
    assert cli.main([str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown schema 'tts-block/9'" in err[0] and "block.json" in err[0]
    assert not (run / "summary.json").exists()


def test_version_1_run_is_analysed_with_the_new_method(tmp_path):
    # tests/fixtures/v1-run: the raw files of the version-1 demo run that was reports/example until a fresh demo
    # replaced it (git f487f05), without its generated summary and report
    run = tmp_path / "example"
    shutil.copytree(ROOT / "tests/fixtures/v1-run", run)
    summary, comp = summarize(run)
    assert json.loads((run / "manifest.json").read_text())["schema"] == "tts-ab/1"
    assert comp["headline"]["rule"] == "fixed" and comp["headline"]["kind"] in ("faster", "slower", "equivalent",
                                                                                 "inconclusive", "mixed")
    lv = comp["levels"][0]
    assert comp["per_level"][lv]["metrics"]["stream_rtf_p50"]["n"] == 0  # no continuity fields in version 1
    assert not comp["per_level"][lv]["continuity"]["available"] and not summary["telemetry"]["available"]
    assert all(b["level_order"] is None for b in summary["blocks"])


def test_within_window_variance_matches_the_spread_between_windows(tmp_path):
    """Known answer: 40 windows of the same closed loop (c=8, latency 0.2 s, per-request lognormal sd 0.1, ~240
    requests each) differ only by sampling noise, so the variance of ln(metric) between them is what each window's
    within-window estimate should say. The ratio of a sample variance over 39 df to the truth lies in [0.58, 1.57]
    with 99 % probability (chi-square); the bound [0.55, 1.65] leaves room for the estimates' own noise."""
    wins = [sr.Window(i, "ab", "A", "original", i, 0, {8: 0.2}) for i in range(40)]
    run = sr.write_run(tmp_path / "w", wins, levels=(8,), noise=0.1, telemetry=None)
    data = load_run(run)
    rows = [block_summary(b, None)["levels"]["8"] for b in data["blocks"]]
    for metric in ("throughput_rps", "e2e_p50", "e2e_p90"):
        between = np.var(np.log([r[metric] for r in rows]), ddof=1)
        within = np.mean([r["within_var"][metric] for r in rows])
        assert 0.55 < between / within < 1.65, (metric, between, within)


def test_a_plain_locust_run_has_no_headline_but_a_report(tmp_path):
    run = sr.fresh(tmp_path / "ab", rounds=1, aa_rounds=0)
    single = tmp_path / "locust"
    single.mkdir()
    blk = sorted((run / "blocks").iterdir())[0]
    for name in ("requests.jsonl", "counters.jsonl"):
        shutil.copy(blk / name, single / name)
    summary, comp = summarize(single)
    assert comp["headline"] is None and comp["rounds"] == {"ab": 0, "aa": 0}
    assert [b["kind"] for b in summary["blocks"]] == ["single"] and summary["arms"]["A"]["8"]["throughput_rps"]
    assert cli.main([str(single)]) == 0
    page = (single / "summary.md").read_text()  # its own load-run page (ttsreport.loadrun), not a one-armed A/B
    assert page.startswith("# Load run") and "c=8" in page and "No valid A/B round" not in page


def test_an_arm_that_failed_in_one_round_is_the_headline_not_a_speed_claim(tmp_path):
    """reports/example with every c=8 request of arm B failed in round 0: the remaining two rounds would read
    "faster"; the report names the failure in the headline, makes no speed claim at c=8, lists the skipped round and
    shows the error-rate verdict on the card."""
    run = tmp_path / "example"
    shutil.copytree(ROOT / "reports" / "example", run)
    (blk,) = (run / "blocks").glob("*-r0-ab-B")
    lines, n8 = [], 0
    for line in (blk / "requests.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["concurrency"] == 8:
            r.update(ok=False, error="http 503: busy", status=503, ttfa_s=None, audio_s=None, rtf=None, bytes=0)
            n8 += r["phase"] == "measure"
        lines.append(json.dumps(r))
    (blk / "requests.jsonl").write_text("\n".join(lines) + "\n")
    assert cli.main([str(run)]) == 0
    comp = json.loads((run / "comparison.json").read_text())
    head = comp["headline"]
    assert n8 > 0 and head["kind"] == "failed"
    assert head["text"].startswith("B failed at c=8 in 1 of 3 rounds: no speed claim")
    row8 = head["levels"]["8"]
    assert row8["kind"] == "failed" and row8["ci_decision"] is None and not row8["equivalent"]
    for res in comp["per_level"]["8"]["metrics"].values():  # no metric claims anything at c=8
        assert res["kind"] == "failed", (res["label"], res["kind"])
    assert head["levels"]["64"]["kind"] == "faster"  # the other level keeps its verdict, in its own words
    assert head["levels"]["64"]["word"] == "faster in this server start"
    md = (run / "summary.md").read_text()
    headline = next(x for x in md.splitlines() if x.startswith("**Primary metric"))
    assert "B failed at c=8 in 1 of 3 rounds" in headline and "faster in this server start at 1 of 2 levels" in headline
    assert "- c=8: **failed**" in md and "error rate: " in md.split("- c=8: **failed**")[1].splitlines()[0]
    assert f"c=8: round 0: B failed {n8} of {n8} measure-phase requests at c=8" in md  # the skipped unit, reported
    page = (run / "index.html").read_text()
    assert "ARM FAILED at c=8" in page and "k-failed" in page


def test_an_arm_that_times_out_its_slowest_requests_gets_no_latency_claim_they_could_make(tmp_path):
    """Known answer: reports/example with arm B failing (timing out) the slowest 40 % of its c=8 measure-phase requests
    in every round. Below the 50 % of an arm failure, but latency over B's survivors would favour B: no latency
    metric says "B faster" at c=8 (withheld, with the failure shares as the reason and no interval), a FAILURE SHARES
    DIFFER banner names both shares, and c=64 (no failures) keeps its verdicts."""
    run = tmp_path / "example"
    shutil.copytree(ROOT / "reports" / "example", run)
    before = json.loads((run / "comparison.json").read_text())
    failed = total = 0
    for blk in sorted((run / "blocks").glob("*-ab-B")):
        rows = [json.loads(x) for x in (blk / "requests.jsonl").read_text().splitlines()]
        measured = sorted((r for r in rows if r["concurrency"] == 8 and r["phase"] == "measure"), key=lambda r: r["e2e_s"])
        for r in measured[len(measured) - int(0.4 * len(measured)):]:
            r.update(ok=False, error="timeout", status=None, ttfa_s=None, audio_s=None, rtf=None, bytes=0)
            failed += 1
        total += len(measured)
        (blk / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main([str(run)]) == 0
    comp = json.loads((run / "comparison.json").read_text())
    latency = [m for m in ("e2e_p50", "e2e_p90", "ttfa_p50", "rtf_p50") if m in comp["per_level"]["8"]["metrics"]]
    assert latency and 0.3 < failed / total < 0.5
    for m in latency:
        res = comp["per_level"]["8"]["metrics"][m]
        gap = res["failure_gap"]
        assert gap["b_share"] > 0.3 and gap["a_share"] == 0 and gap["allowed"] == "slower", m
        assert res["kind"] in ("inconclusive", "slower") and not res["equivalent"], (m, res["kind"])
        if gap["withheld"]:
            assert res["ci_decision"] is None and res["text"].startswith("no "), m
    assert any(comp["per_level"]["8"]["metrics"][m]["failure_gap"]["withheld"] for m in latency)
    for m in latency:  # c=64 had no failure: the same verdict as before
        assert comp["per_level"]["64"]["metrics"][m]["kind"] == before["per_level"]["64"]["metrics"][m]["kind"]
        assert not (comp["per_level"]["64"]["metrics"][m].get("failure_gap") or {}).get("allowed")
    page = (run / "index.html").read_text()
    assert "FAILURE SHARES DIFFER at c=8" in page and "FAILURE SHARES DIFFER at c=64" not in page


def test_a_failure_gap_withholds_only_the_claim_the_failures_could_have_made():
    """withhold_for_failure_gap and decide_levels: B failing more withholds "faster" and "equivalent", keeps
    "slower"; a gap within the limit changes nothing; Holm never claims a withheld direction."""
    a = [1.0, 1.02, 0.99, 1.01, 1.0, 0.98]
    kw = {"higher_is_better": False, "margin_pct": 5.0, "confidence": 0.95, "label": "p50 latency"}
    jitter = [1.004, 0.997, 1.002, 0.995, 1.003, 0.999]  # some spread between rounds (none reads "no spread")
    faster = inf.compare_rounds(a, [x * 0.9 * j for x, j in zip(a, jitter, strict=True)], **kw)
    slower = inf.compare_rounds(a, [x * 1.1 * j for x, j in zip(a, jitter, strict=True)], **kw)
    equal = inf.compare_rounds(a, [x * j for x, j in zip(a, jitter, strict=True)], **kw)
    assert (faster["kind"], slower["kind"], equal["kind"]) == ("faster", "slower", "equivalent")
    w = inf.withhold_for_failure_gap(faster, 0.0, 0.3, 2.0)
    assert w["kind"] == "inconclusive" and w["failure_gap"]["withheld"] and w["ci_decision"] is None
    assert "withheld" in w["ci_decision_what"] and faster["kind"] == "faster"  # a copy: the input is unchanged
    assert inf.withhold_for_failure_gap(slower, 0.0, 0.3, 2.0)["kind"] == "slower"
    e = inf.withhold_for_failure_gap(equal, 0.0, 0.3, 2.0)
    assert e["kind"] == "inconclusive" and not e["equivalent"]
    assert inf.withhold_for_failure_gap(slower, 0.3, 0.0, 2.0)["kind"] == "inconclusive"  # A failed more: mirror
    assert inf.withhold_for_failure_gap(faster, 0.0, 0.015, 2.0)["kind"] == "faster"  # 1.5 points: within the limit
    dec = inf.decide_levels({"8": w, "64": inf.withhold_for_failure_gap(slower, 0.0, 0.3, 2.0)})
    assert dec["levels"]["8"]["kind"] == "inconclusive" and dec["levels"]["8"]["ci_decision"] is None
    assert dec["levels"]["64"]["kind"] == "slower"


def test_a_zero_spread_run_says_check_the_set_up(tmp_path):
    """B identical to A in every window (no per-request noise): no claim, not even "equivalent"."""
    run = sr.fresh(tmp_path / "r", rounds=3, b_factor=1.0, noise=0.0)
    summary, comp = summarize(run)
    assert comp["headline"]["kind"] == "no_spread" and "check the set-up" in comp["headline"]["text"]
    assert all(r["kind"] == "no_spread" for r in comp["headline"]["levels"].values())


def test_a_sequential_run_with_a_failed_arm_claims_nothing_there(tmp_path):
    """Every c=8 request of B failed in round 0 of a sequential run: the sequential rule alone would see only the
    other rounds; the headline names the failure and c=8 gets no speed claim and no deciding interval."""
    run = sr.fresh(tmp_path / "r", rounds=6, b_factor=1 / 1.05, sequential=SEQ,
                   failures=lambda i, arm: {8: 10_000} if (i == 0 and arm == "B") else {})
    _, comp = summarize(run)
    head = comp["headline"]
    assert head["rule"] == "sequential" and head["kind"] == "failed" and not head["decided"]
    assert head["text"].startswith("B failed at c=8 in 1 of 6 rounds: no speed claim there")
    assert head["levels"]["8"]["kind"] == "failed" and head["levels"]["8"]["ci_decision"] is None
    assert head["levels"]["2"]["kind"] == "faster" and head["levels"]["2"]["ci_decision"][0] > 1.0


def test_windows_run_under_other_code_than_the_run_start_are_named(tmp_path):
    run = sr.fresh(tmp_path / "r", rounds=2, aa_rounds=0)
    man = json.loads((run / "manifest.json").read_text())
    man["code_fingerprint"] = "aaaa"
    (run / "manifest.json").write_text(json.dumps(man))
    blocks = sorted((run / "blocks").iterdir())
    for i, b in enumerate(blocks):
        meta = json.loads((b / "block.json").read_text())
        meta["code_fingerprint"] = "bbbb" if i == len(blocks) - 1 else "aaaa"
        (b / "block.json").write_text(json.dumps(meta))
    warn = [w for w in summarize(run)[0]["warnings"] if "code changed" in w]
    assert len(warn) == 1 and f"1 window(s) ran other code: {blocks[-1].name} (bbbb)" in warn[0], warn
    meta = json.loads((blocks[-1] / "block.json").read_text())
    meta["code_fingerprint"] = "aaaa"
    (blocks[-1] / "block.json").write_text(json.dumps(meta))
    assert not [w for w in summarize(run)[0]["warnings"] if "code changed" in w]


@pytest.mark.parametrize("name, level, arm, rnd", [("ab-20261204T221722Z", "2", "B", 4),
                                                    ("ab-20261203T135304Z", "1", "A", 2)])
def test_a_window_too_short_for_a_request_is_invalid_not_failed(tmp_path, name, level, arm, rnd):
    """Two real CPU-server runs: one arm started no measure-phase request in a 0.06-0.14 s measure window and had no
    error there. That window-level is invalid (not measured), listed and left out: never "failed", never a zero."""
    run = tmp_path / name
    shutil.copytree(ROOT / "reports" / "vllm-cpu" / name, run)
    assert cli.main([str(run)]) == 0
    comp = json.loads((run / "comparison.json").read_text())
    head = comp["headline"]
    assert head["kind"] != "failed" and all(r["kind"] != "failed" for r in head["levels"].values())
    for res in comp["per_level"][level]["metrics"].values():
        assert res["kind"] != "failed" and not res["failed"]["rounds"], (res["label"], res["kind"])
    (nm,) = comp["per_level"][level]["not_measured"]
    assert nm["round"] == rnd and nm["arm"] == arm and "window shorter than a request" in nm["reason"]
    row = next(r for r in comp["per_level"][level]["metrics"][comp["primary_metric"]]["rounds"] if r["round"] == rnd)
    assert row["a"] is None and row["b"] is None  # left out, not a zero
    md = (run / "summary.md").read_text()
    assert "failed" not in md.split("## Verdicts per level")[0].replace("failed / all", "")
    assert f"NOT MEASURED at c={level} in 1 of" in md and "fix the failure" not in md
    assert f"round {rnd}: invalid at c={level}: {arm} not measured" in md  # listed with the skipped units


def test_a_sequential_claim_made_before_a_failure_stays(tmp_path):
    """B is faster at every level; every c=8 request of B fails in the last round, after the looks had claimed
    "faster" there: the claim stays (docs/method.md: a claim, once made, stays), with the failure named first."""
    run = sr.fresh(tmp_path / "r", rounds=6, b_factor=1 / 1.05, sequential=SEQ,
                   failures=lambda i, arm: {8: 10_000} if (i == 5 and arm == "B") else {})
    _, comp = summarize(run)
    head = comp["headline"]
    row = head["levels"]["8"]
    assert row["kind"] == "faster" and row["ci_decision"][0] > 1.0 and "the claim stays" in row["text"]
    assert head["kind"] == "failed" and head["text"].startswith("B failed at c=8 in 1 of 6 rounds (B faster there")


def test_a_failure_keeps_only_the_claim_it_can_strengthen():
    """B fails in one round; the rounds where both worked say B is 5 % slower: "slower" stands (the failure can only
    strengthen it), named after the failure. The same rounds with A failed instead: "failed", no claim."""
    rng = np.random.default_rng(5)
    a = 100 * np.exp(rng.normal(0, 0.03, 5))
    b = list(a * np.exp(rng.normal(-0.05, 0.005, 5)))
    b[2] = 1.0  # the failed round's survivors: nothing like the others
    kw = {"higher_is_better": True, "margin_pct": 1.0, "confidence": 0.95}
    bf = inf.compare_rounds(a, b, **kw, failed=[None, None, "B", None, None])
    assert bf["kind"] == "slower" and bf["claim_allowed"] == "slower" and bf["ci_decision"][1] < 1.0
    assert bf["text"].startswith("B failed in 1 of 5 rounds, and slower in the rounds where both worked")
    af = inf.compare_rounds(a, b, **kw, failed=[None, None, "A", None, None])
    assert af["kind"] == "failed" and af["ci_decision"] is None
    dec = inf.decide_levels({"8": bf, "64": inf.compare_rounds(a, a * 1.001 ** np.arange(5), **kw)})
    assert dec["kind"] == "failed" and dec["levels"]["8"]["kind"] == "slower"
    assert dec["text"].startswith("B failed at c=8 in 1 of 5 rounds (B slower there in the rounds where both worked)")
    assert dec["levels"]["8"]["ci_decision"][1] < 1.0


def test_a_measure_window_beside_other_jobs_is_warned_about(tmp_path):
    """Other jobs on the box (the host line's other_cpu_pct: CPU outside the suite's process tree) in a measure window:
    the report names the window, since a difference there may be theirs."""
    run = sr.fresh(tmp_path / "r", rounds=2, aa_rounds=0)
    summary, _ = summarize(run)
    assert not any("other jobs on the host" in w for w in summary["warnings"])
    assert all("other_cpu_pct" not in lv["telemetry"] for b in summary["blocks"] for lv in b["levels"].values()
               if lv.get("telemetry"))  # never sampled: left out, not null
    blk = next(p for p in sorted((run / "blocks").iterdir()))
    lv = json.loads((blk / "block.json").read_text())["levels"][0]
    t0, t1 = (next(c["t"] for c in map(json.loads, (blk / "counters.jsonl").read_text().splitlines())
                   if c.get("kind") == "snapshot" and c.get("edge") == edge and c["concurrency"] == lv)
              for edge in ("start", "end"))
    with (blk / "telemetry.jsonl").open("a") as f:
        for i, pct in enumerate((30.0, 50.0)):
            f.write(json.dumps(rec.TelemetrySample(t=t0 + (i + 1) * (t1 - t0) / 3, source="host", host_cpu_pct=60.0,
                                                   other_cpu_pct=pct).to_dict()) + "\n")
    summary, _ = summarize(run)
    row = next(b for b in summary["blocks"] if b["block_id"] == blk.name)["levels"][str(lv)]["telemetry"]
    assert row["other_cpu_pct"] == 40.0
    warn = [w for w in summary["warnings"] if "other jobs on the host" in w]
    assert warn == [f"other jobs on the host (processes outside the suite's own) used at least 20 % of a core in 1 "
                    f"measure window(s) ({blk.name} c={lv}: 40 %): a difference between those windows may be theirs; "
                    "run with the host to itself"]

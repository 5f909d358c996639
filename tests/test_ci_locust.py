"""tools/ci_locust.py: the CI profile under the suite's Locust run, beside the public CI points (pure parts)."""

from __future__ import annotations

import json

import yaml
from conftest import ROOT

from loadtest.scenario import load_scenario
from tools import ci_locust
from ttssim import public
from ttssim.config import load_config


def test_the_scenario_runs_the_ci_levels_with_the_ci_mean_audio_length():
    """c=1 and c=16, closed loop, streaming; the short/medium mix's mean audio (the CI profile's frames per
    character) within 10 % of the CI's 6.75 s."""
    sc = load_scenario(ROOT / ci_locust.SCENARIO)
    assert [s.concurrency for s in sc.steps] == [1, 16] and sc.mode == "stream" and sc.loop == "closed"
    cfg = load_config(ROOT / ci_locust.PROFILE)
    buckets = yaml.safe_load((ROOT / sc.prompts).read_text())["buckets"]
    weight = sum(sc.mix.values())
    mean_s = sum(w * sum(len(p["text"]) for p in buckets[k]) / len(buckets[k]) for k, w in sc.mix.items() if w)
    mean_s *= cfg.audio.frames_per_char / 12.5 / weight
    assert abs(mean_s / public.CI_MEAN_AUDIO_S - 1) < 0.10, mean_s


def test_rows_pair_each_public_point_with_the_measured_level_and_flag_misses():
    levels = {1: {"n": 20, "ttfa_p50": 0.150, "rtf_p50": 0.2, "audio_tput": 6.0, "mean_batch": 1.0},
              16: {"n": 300, "ttfa_p50": 1.2, "rtf_p50": 0.47, "audio_tput": 40.0, "mean_batch": 12.0}}
    rows = ci_locust.rows(levels)
    wanted = {(p.level, p.metric) for p in public.CI_POINTS if p.level in levels
              and p.metric in ("ttfp_p50", "rtf_p50", "audio_tput")}
    assert len(rows) == sum(1 for p in public.CI_POINTS if (p.level, p.metric) in wanted)
    c1 = next(r for r in rows if r["c"] == 1 and r["label"].startswith("p50 time"))
    assert c1["got"] == 150.0 and round(c1["resid"], 1) == round(100 * (150.0 / 141.2791 - 1), 1)
    md = ci_locust.markdown(rows, levels, "header")
    assert "| 16 | p50 time to first audio ms | 799.3 | 1200 | +50 % | NO |" in md
    assert "Largest residual: 85 %" in md  # 1200 ms against the JSON's 647 and "c=16: 12.0" in md


def test_the_fidelity_page_renders_the_cpu_comparison_from_its_committed_file(tmp_path):
    """The fidelity page's CPU section reads reports/bench/sim-vs-cpu.json (what tools/sim_vs_real writes): every
    level with its role and residuals; a missing file says so in one line instead of failing the page."""
    from tools import fidelity
    from ttssim import heldout

    text = "\n".join(fidelity.cpu_section(heldout.PATH))
    res = json.loads(heldout.PATH.read_text())
    for r in res["rows"]:
        role = "held out" if r["held_out"] else "fit"
        assert f"| {r['concurrency']} | {role} | {r['residual_pct']['ttfa_p50']:+.0f} % |" in text
    assert f"Largest held-out residual: {res[heldout.KEY]:.0f} %" in text
    missing = fidelity.cpu_section(tmp_path / "none.json")
    assert missing[-1] == f"Not measured: {tmp_path / 'none.json'} is missing (`make sim-vs-real`)."

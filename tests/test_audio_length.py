"""Output length per arm: the length control each arm's release honours (manifest, plan-time warning) and the
report's comparison of audio seconds per prompt (ttsreport.audiolength), on synthetic run folders with a known
difference (tests/synthetic_runs.py) and through the pure function on known numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import synthetic_runs as sr
from conftest import ROOT

from loadtest import experiment as ex
from loadtest.evidence import REQUEST_LENGTH, STAGE_LENGTH, arm_manifest, length_control, length_warning
from loadtest.launch import dry_run
from ttsrecords import cpuserver
from ttsreport import audiolength as al
from ttsreport import render, report
from ttsreport.analysis import summarize, write_statistics

PROMPTS = (2.0, 3.5, 5.0, 6.5, 8.0, 4.2)  # audio seconds of six prompts


def _req(prompt: str, audio: float | None, ok: bool = True) -> dict:
    return {"prompt_id": prompt, "audio_s": audio, "ok": ok}


def test_compare_audio_known_ratio_and_interval():
    """Three prompts, B exactly 1.2x A on each: ratio 1.2, a point interval, "differs"."""
    a = [_req("x", 2.0), _req("x", 4.0), _req("y", 5.0), _req("z", 1.0)]
    b = [_req("x", 3.6), _req("y", 6.0), _req("z", 1.2), _req("w", 9.0), _req("z", None, ok=False)]
    out = al.compare_audio(a, b)
    assert out["kind"] == "differs" and out["prompts"] == 3 and out["prompts_b_only"] == 1
    assert out["ratio"] == pytest.approx(1.2) and out["ci"] == pytest.approx([1.2, 1.2])
    assert out["requests"] == [4, 4] and "20.0 % longer" in out["text"]


def test_compare_audio_t_interval_over_prompts():
    """The interval is Student t over the prompts' log-ratios (checked against numpy/scipy by hand)."""
    from scipy import stats

    ratios = [1.01, 0.97, 1.04, 0.99, 1.02]
    a = [_req(f"p{i}", 3.0) for i in range(5)]
    b = [_req(f"p{i}", 3.0 * r) for i, r in enumerate(ratios)]
    out = al.compare_audio(a, b, confidence=0.9)
    d = np.log(ratios)
    h = stats.t.ppf(0.95, 4) * d.std(ddof=1) / math.sqrt(5)
    assert out["ratio"] == pytest.approx(math.exp(d.mean()))
    assert out["ci"] == pytest.approx([math.exp(d.mean() - h), math.exp(d.mean() + h)])
    assert out["kind"] == "matches" and "matches" in out["text"]


def test_compare_audio_small_but_certain_difference_is_within_tolerance():
    """Exactly 1 % longer on every prompt: the interval excludes 1, but 1 % is inside the 2 % tolerance."""
    a = [_req(f"p{i}", 2.0 + i) for i in range(4)]
    b = [_req(f"p{i}", (2.0 + i) * 1.01) for i in range(4)]
    assert al.compare_audio(a, b)["kind"] == "matches"
    assert al.compare_audio(a, b, tolerance_pct=0.5)["kind"] == "differs"


def test_compare_audio_too_few_prompts_and_bad_settings():
    out = al.compare_audio([_req("p", 4.0)], [_req("p", 5.0)])
    assert out["kind"] == "unknown" and out["ratio"] is None and "at least 2" in out["text"]
    with pytest.raises(ValueError):
        al.compare_audio([], [], tolerance_pct=-1)


def test_synthetic_run_b_20_pct_longer_warns(tmp_path):
    run = sr.fresh(tmp_path / "longer", rounds=4, aa_rounds=1, prompt_audio=PROMPTS, b_audio_factor=1.2)
    _, comp = summarize(run)
    audio = comp["audio_per_prompt"]
    assert audio["kind"] == "differs" and audio["prompts"] == len(PROMPTS)
    assert audio["ci"][0] > 1.0 and audio["ratio"] == pytest.approx(1.2, rel=0.03)
    write_statistics(run)
    md = render.markdown(*report.load(run))
    assert "AUDIO LENGTH DIFFERS" in md and "longer than arm A's" in md
    page = render.html_page(*report.load(run))
    assert "AUDIO LENGTH DIFFERS" in page


def test_synthetic_run_equal_lengths_gives_the_quiet_line(tmp_path):
    run = sr.fresh(tmp_path / "equal", rounds=4, aa_rounds=1, prompt_audio=PROMPTS)
    _, comp = summarize(run)
    audio = comp["audio_per_prompt"]
    assert audio["kind"] == "matches" and audio["ci"][0] <= 1.0 <= audio["ci"][1]
    write_statistics(run)
    md = render.markdown(*report.load(run))
    assert "AUDIO LENGTH DIFFERS" not in md
    assert "Audio per prompt (B vs A): audio per prompt matches between the arms" in md


def test_length_control_per_release():
    exp = ex.load_experiment(ROOT / "configs/experiments/release-016-fixed-vs-030.yaml")
    v016, v030 = (length_control(a) for a in exp.arms.values())
    assert v016["honours"] == STAGE_LENGTH and v016["max_frames"] == 4096  # qwen3_tts_b64.yaml's talker
    assert "configs/stages/qwen3_tts_b64.yaml" in v016["source"]
    assert v030["honours"] == REQUEST_LENGTH and v030["max_frames"] is None
    cpu = length_control(ex.on_cpu(ex.mission()).arms["A"])
    assert cpu["max_frames"] == 64 and cpuserver.STAGES in cpu["source"]  # the CPU stage file's talker max_tokens
    rc1 = length_control(next(iter(ex.load_experiment(
        ROOT / "configs/experiments/v032rc1-cp-kv-cache.yaml").arms.values())))
    assert "12 codec frames per text token" in rc1["cap"]
    assert arm_manifest(exp.arms["v016"])["length_control"] == v016


@pytest.mark.slow  # runs docker/serve.sh --dry-run (a process)
def test_length_warning_at_plan_and_dry_run_time(tmp_path):
    exp = ex.load_experiment(ROOT / "configs/experiments/release-016-fixed-vs-030.yaml")
    w = length_warning(exp.arms)
    assert w and "v016: stage max_tokens (4096 frames)" in w and "v030: request max_new_tokens" in w
    assert f"# WARNING: {w}" in dry_run(exp)
    assert length_warning(ex.mission().arms) is None  # both arms on one stage file
    assert length_warning(ex.simulated(exp).arms) is None  # the simulator honours one default for both
    from loadtest import ab

    out = tmp_path / "out.txt"
    import contextlib

    with out.open("w") as f, contextlib.redirect_stdout(f):
        assert ab.main(["--experiment", "configs/experiments/release-016-fixed-vs-030.yaml", "--dry-run"]) == 0
    assert f"\nWARNING: {w.replace('v016', 'A').replace('v030', 'B')}" in out.read_text()

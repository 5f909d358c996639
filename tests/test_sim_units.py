"""ttssim without a server: config, model arithmetic, audio rules (fast; the HTTP tests are in test_sim_api etc.)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import yaml
from conftest import ROOT as REPO

from tts_predictor.metrics import syncs_per_step
from ttssim.audio import Voice
from ttssim.config import AudioConfig, ModelConfig, SimConfig, load_config
from ttssim.model import (
    Code2WavDecoder,
    call_shapes,
    chunk_due,
    code2wav_delay_s,
    gpu_host_variant_step_s,
    predict_total_step_s,
    predict_ttfa_s,
    step_target_s,
)


def test_default_yaml_equals_builtin_defaults():
    data = yaml.safe_load((REPO / "configs/sim/default.yaml").read_text())
    builtin = SimConfig().as_dict()
    for section, values in data.items():
        for key, value in values.items():
            expected = builtin[section][key]
            assert (list(expected) if isinstance(expected, tuple) else expected) == value, f"{section}.{key}"
    assert load_config(REPO / "configs/sim/default.yaml") == SimConfig()


def test_fast_yaml_loads_and_overrides_apply():
    cfg = load_config(REPO / "configs/sim/fast.yaml", ["model.extra_step_pct=5", "faults.error_burst={after: 2}"])
    assert cfg.model.max_batch_size == 16 and cfg.model.extra_step_pct == 5.0
    assert cfg.faults.error_burst == {"after": 2, "length": 1, "status": 500, "every": 0}


@pytest.mark.parametrize("override", ["model.base_msx=1", "model.base_ms=fast", "model.max_batch_size=0",
                                      "nosection.key=1", "faults.error_burst={status: 200}", "model.base_ms=-1",
                                      "server.sync_sample_calls=some"])
def test_bad_config_is_refused(override):
    with pytest.raises(ValueError):
        load_config(None, [override])


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf", ".NaN", ".Inf"])
@pytest.mark.parametrize("key", ["model.base_ms", "audio.frames_per_char", "faults.slow_readiness_s"])
def test_nan_and_inf_are_refused_with_a_clear_error(tmp_path, key, value):
    with pytest.raises(ValueError, match=rf"{key} must be a finite number, got (nan|inf|-inf)"):
        load_config(None, [f"{key}={value}"])
    section, name = key.split(".")
    f = tmp_path / "c.yaml"
    f.write_text(f"{section}:\n  {name}: {value}\n")
    with pytest.raises(ValueError, match=rf"{key} must be a finite number"):
        load_config(f)


def test_call_shapes_are_one_prefill_and_fourteen_decodes():
    shapes = call_shapes(16)
    assert shapes[0] == (2, 2) and len(shapes) == 15
    assert shapes[1:] == [(1, s) for s in range(3, 17)]


def test_step_target_known_answer():
    m = ModelConfig(base_ms=2.0, per_request_ms=1.0, prefill_ms=5.0, stall_us_per_sync=10.0)
    # 2 + 8*1 + 1*5 = 15 ms rest, + 3 ms variant, + 188 syncs * 10 µs = 1.88 ms
    assert step_target_s(m, 8, 1, 0.003, syncs_per_step("original", 8), "cpu") == pytest.approx(0.01988)
    assert step_target_s(m, 8, 1, 0.003, 188, "cuda") == pytest.approx(0.018)  # no modelled stall on CUDA
    inj = dataclasses.replace(m, extra_step_ms=4.0, extra_step_pct=10.0)
    assert step_target_s(inj, 8, 1, 0.003, 188, "cpu") == pytest.approx(0.01988 * 1.1 + 0.004)


def test_predict_total_equals_sum_of_step_targets():
    m = ModelConfig(extra_step_pct=3.0, extra_step_ms=1.0)
    batches, admitted, per_step_variant = [1, 4, 4, 9, 2], [1, 3, 0, 5, 0], 0.002
    total = sum(step_target_s(m, b, a, per_step_variant, syncs_per_step("original", b), "cpu")
                for b, a in zip(batches, admitted, strict=True))
    calls = 15 * len(batches)
    tokens = sum(16 * b for b in batches)
    pred = predict_total_step_s(m, variant="original", steps=len(batches), batch_requests=sum(batches),
                                admitted=sum(admitted), calls=calls, tokens=tokens,
                                variant_s=per_step_variant * len(batches))
    assert pred == pytest.approx(total)


def test_ci_profile_ttfa_closed_form_matches_the_virtual_engine_and_the_public_c1_number():
    """The CI profile's lone-request TTFA: the closed form, the virtual engine's replay and the public c=1 TTFP
    (141 ms, vllm-omni CI) within the fidelity the profile states (the fit leaves c=1 TTFP about +16 %)."""
    from ttssim import virtual

    cfg = load_config(REPO / "configs/sim/h100-1.7b-ci.yaml")
    per_step = gpu_host_variant_step_s("vectorized", 1)
    closed = predict_ttfa_s(cfg.model, cfg.audio.initial_chunk_frames, "vectorized", per_step, "cuda")
    run = virtual.run(cfg, virtual.Workload(1, 1, (50,)), "vectorized")
    assert run.outcomes[0].ttfa_s == pytest.approx(closed)
    assert 0.8 * 0.141 < closed < 1.4 * 0.141


def test_chunks_follow_initial_then_steady_size():
    a = AudioConfig(chunk_frames=25, initial_chunk_frames=1)
    due = [n for n in range(1, 60) if chunk_due(n, 0 if n <= 1 else 1 + 25 * ((n - 2) // 25), 60, a)]
    assert due == [1, 26, 51]
    assert chunk_due(57, 51, 57, a)  # the end always flushes
    assert [n for n in range(1, 60) if chunk_due(n, 25 * ((n - 1) // 25), 80, AudioConfig())] == [25, 50]
    with pytest.raises(ValueError, match="initial_chunk_frames"):
        load_config(None, ["audio.initial_chunk_frames=26"])


def test_code2wav_delay_and_gpu_host_variant_time_known_answers():
    m = ModelConfig(code2wav_chunk_ms=20.0, code2wav_per_request_ms=0.5)
    assert code2wav_delay_s(m, 8) == pytest.approx(0.024)
    # at the H100 benchmark's own points: 15 calls x the published µs
    assert gpu_host_variant_step_s("original", 8) == pytest.approx(15 * 253.3e-6)
    assert gpu_host_variant_step_s("fixed", 32) == pytest.approx(15 * 329.5e-6)
    assert gpu_host_variant_step_s("original", 6) == pytest.approx(15 * (116.6 + (253.3 - 116.6) / 2) * 1e-6)
    assert gpu_host_variant_step_s("original", 0) == 0.0


def test_codec_is_12_5_hz_in_whole_1920_sample_frames():
    a = AudioConfig()
    assert (a.sample_rate, a.samples_per_frame, a.frame_rate_hz) == (24000, 1920, 12.5)
    with pytest.raises(ValueError, match="unknown keys"):
        load_config(None, ["audio.frame_rate_hz=12"])


def test_audio_length_rule_and_determinism():
    v = Voice(AudioConfig())
    assert v.num_frames("a" * 100, 2048) == 84  # 0.833 frames per character (15 characters per 12.5 frames/s)
    assert v.num_frames("hi", 2048) == 13  # at least a second
    assert v.num_frames("a" * 1000, 50) == 50  # capped by max_new_tokens
    rows = v.frame_index("Hello there", 30)
    pcm = v.pcm(rows)
    assert pcm == Voice(AudioConfig()).pcm(Voice(AudioConfig()).frame_index("Hello there", 30))
    samples = np.frombuffer(pcm, dtype="<i2")
    assert samples.size == 30 * 1920 and np.sqrt(np.mean(samples.astype(float) ** 2)) > 1000
    assert v.pcm(v.frame_index("Other text!", 30)) != pcm


def test_hot_settings_apply_known_answer_delays_and_refuse_the_rest():
    from ttssim.config import HOT_SETTINGS, apply_hot, hot_values, load_config, setting_key

    cfg = load_config(REPO / "configs/sim/fast.yaml")
    assert hot_values(cfg) == dict.fromkeys(HOT_SETTINGS, 0.0)
    hot = apply_hot(cfg, {"model.extra_step_pct": 1.5})
    assert hot.model.extra_step_pct == 1.5 and hot.model.base_ms == cfg.model.base_ms
    assert hot_values(hot)["model.extra_step_pct"] == 1.5
    with pytest.raises(ValueError, match="not hot-swappable"):
        apply_hot(cfg, {"model.base_ms": 3})
    with pytest.raises(ValueError, match="must not be negative"):
        apply_hot(cfg, {"model.extra_step_ms": -1})
    assert setting_key("model.extra_step_pct=2") == "model.extra_step_pct"


def test_code2wav_decoder_takes_one_chunk_at_a_time_in_hand_over_order():
    """First-chunk decodes 100 ms, later ones 10 ms: two first chunks handed over together leave 100 ms apart, a
    later chunk waits behind them, and an idle decoder starts at the hand-over."""
    m = dataclasses.replace(ModelConfig(), code2wav_decode_first_ms=100.0, code2wav_decode_ms=10.0)
    d = Code2WavDecoder(m)
    assert [d.pcm_at(0.0, True), d.pcm_at(0.0, True)] == pytest.approx([0.1, 0.2])
    assert d.pcm_at(0.05, False) == pytest.approx(0.21)
    assert d.pcm_at(1.0, False) == pytest.approx(1.01)
    plain = Code2WavDecoder(ModelConfig())  # no decode times: no queue, the PCM leaves at its hand-over
    assert not plain.queues and [plain.pcm_at(0.3, True), plain.pcm_at(0.1, True)] == [0.3, 0.1]


def test_first_audio_queues_behind_the_decoder_in_the_virtual_engine():
    """Four requests sent together, one frame to the first chunk: their first audio leaves one first-chunk decode
    apart (the decoder is the busy stage), while without the decoder they all arrive together."""
    from ttssim import virtual

    base = load_config(None, ["model.max_batch_size=8", "model.code2wav_chunk_ms=0", "audio.initial_chunk_frames=1"])
    queued = dataclasses.replace(base, model=dataclasses.replace(base.model, code2wav_decode_first_ms=200.0))
    load = virtual.Workload(4, 4, (40,))
    free = sorted(o.ttfa_s for o in virtual.run(base, load, "vectorized").outcomes)
    waits = sorted(o.ttfa_s for o in virtual.run(queued, load, "vectorized").outcomes)
    assert max(free) - min(free) == pytest.approx(0.0, abs=1e-9)
    assert np.diff(waits) == pytest.approx([0.2, 0.2, 0.2])
    assert waits[0] == pytest.approx(free[0] + 0.2)

"""The step-time model in one place, as pure functions: the engine sleeps by it and the benchmark predicts with it.

Keeping both on the same formula is what makes "measured step time vs model" a test of the engine's clock (sleep
accuracy, event-loop interference), not of two diverging copies of the arithmetic.
"""

from __future__ import annotations

from tts_predictor.metrics import expected_syncs

from .config import ModelConfig


def call_shapes(max_seq_len: int = 16) -> list[tuple[int, int]]:
    """(query_len, seq_len) of the 15 predictor calls of one talker step: prefill 2/2, then decodes 1/3 .. 1/16."""
    return [(2, 2)] + [(1, s) for s in range(3, max_seq_len + 1)]


def stall_per_sync_s(cfg: ModelConfig, device_type: str) -> float:
    """Modelled GPU round trip per synchronisation: only on CPU, where nothing really waits."""
    return cfg.stall_us_per_sync * 1e-6 if device_type == "cpu" else 0.0


def modelled_rest_s(cfg: ModelConfig, batch: int, admitted: int) -> float:
    """The part of a step that is not the predictor's host layout: talker forward, sampling, prefills."""
    return (cfg.base_ms + cfg.per_request_ms * batch + cfg.prefill_ms * admitted) * 1e-3


def step_target_s(cfg: ModelConfig, batch: int, admitted: int, variant_s: float, syncs: float, device_type: str) -> float:
    """Full modelled step: rest + real variant time + stall, then the injected delay (absolute and relative)."""
    natural = modelled_rest_s(cfg, batch, admitted) + variant_s + syncs * stall_per_sync_s(cfg, device_type)
    return natural * (1.0 + cfg.extra_step_pct / 100.0) + cfg.extra_step_ms * 1e-3


def predict_total_step_s(
    cfg: ModelConfig, *, variant: str, steps: float, batch_requests: float, admitted: float, calls: float,
    tokens: float, variant_s: float, device_type: str = "cpu",
) -> float:
    """Sum of step targets over a window, from counters only (the model is linear in batch, syncs and prefills)."""
    syncs = expected_syncs(variant, calls, tokens)
    natural = (
        (cfg.base_ms * steps + cfg.per_request_ms * batch_requests + cfg.prefill_ms * admitted) * 1e-3
        + variant_s + syncs * stall_per_sync_s(cfg, device_type)
    )
    return natural * (1.0 + cfg.extra_step_pct / 100.0) + cfg.extra_step_ms * 1e-3 * steps


def predict_ttfa_s(cfg: ModelConfig, chunk_frames: int, variant: str, variant_step_s: float, device_type="cpu") -> float:
    """Time to first audio for a lone request on an idle engine.

    The first step carries its prefill; the first chunk exists after `chunk_frames` steps and reaches the client
    `code2wav_chunk_ms` later. HTTP overhead is not modelled.
    """
    shapes = call_shapes()
    tokens = sum(q for q, _ in shapes)
    syncs = expected_syncs(variant, len(shapes), tokens)
    first = step_target_s(cfg, 1, 1, variant_step_s, syncs, device_type)
    rest = step_target_s(cfg, 1, 0, variant_step_s, syncs, device_type)
    return first + (chunk_frames - 1) * rest + cfg.code2wav_chunk_ms * 1e-3

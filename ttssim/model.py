"""The step-time model in one place, as pure functions: the engine sleeps by it, the virtual engine
(ttssim.virtual) replays it without a clock, the fit (ttssim.fit) adjusts its parameters, the benchmarks predict
with it.

Keeping every user on the same formulas is what makes "measured vs model" a test of the engine's clock (sleep
accuracy, event-loop interference) and "model vs public number" a test of the model, not of diverging copies.
"""

from __future__ import annotations

import bisect
import math
import random

from tts_predictor import domain
from tts_predictor.metrics import expected_syncs

from .config import AudioConfig, ModelConfig

# Seed H100 function benchmark of build_attn_metadata (vllm-omni PR #1614 discussion): µs per call, 50-iteration
# median, by requests in the batch. What one call costs on a GPU host, stalls included (docs/simulator.md).
H100_CALL_US = {
    "original": ((1, 41.6), (4, 116.6), (8, 253.3), (32, 879.2), (128, 3759.6)),
    "fixed": ((1, 42.2), (4, 69.6), (8, 111.1), (32, 329.5), (128, 1239.1)),
}


def call_shapes(max_seq_len: int = 16) -> list[tuple[int, int]]:
    """(query_len, seq_len) of the 15 predictor calls of one talker step: prefill 2/2, then decodes 1/3 .. 1/16."""
    return [(domain.PREFILL_QUERY_LEN, 2)] + [(domain.DECODE_QUERY_LEN, s) for s in range(3, max_seq_len + 1)]


def stall_per_sync_s(cfg: ModelConfig, device_type: str) -> float:
    """Modelled GPU round trip per synchronisation: only on CPU, where nothing really waits."""
    return cfg.stall_us_per_sync * 1e-6 if device_type == "cpu" else 0.0


def modelled_rest_s(cfg: ModelConfig, batch: int, admitted: int, noise: float = 1.0) -> float:
    """The part of a step that is not the predictor's host layout: talker forward, sampling, prefills; times the
    host noise factor of the step (StepNoise)."""
    return (cfg.base_ms + cfg.per_request_ms * batch + cfg.prefill_ms * admitted) * 1e-3 * noise


def step_target_s(cfg: ModelConfig, batch: int, admitted: int, variant_s: float, syncs: float, device_type: str,
                  noise: float = 1.0) -> float:
    """Full modelled step: rest (times its noise factor) + real variant time + stall, then the injected delay
    (absolute and relative)."""
    natural = modelled_rest_s(cfg, batch, admitted, noise) + variant_s + syncs * stall_per_sync_s(cfg, device_type)
    return natural * (1.0 + cfg.extra_step_pct / 100.0) + cfg.extra_step_ms * 1e-3


class StepNoise:
    """The slow and fast stretches of a real host (other processes, frequency changes, the Python scheduler): a
    lognormal factor with mean 1 and log-scale sd `step_noise_sd` on the modelled part of a step, held for
    `step_noise_hold_s` of engine time, then drawn anew (every step when the hold is 0). Mean 1, so throughput and
    the mean step are unchanged in expectation; a hold of a few seconds spreads whole requests, which is what a real
    server's p90 over its p50 shows and i.i.d. per-step noise would average away over a request's steps. Seeded:
    a run is reproducible."""

    def __init__(self, cfg: ModelConfig, seed: int = 0):
        self.sd, self.hold_s = cfg.step_noise_sd, cfg.step_noise_hold_s
        self._rng = random.Random(seed)
        self._until = -math.inf
        self._factor = 1.0

    def factor(self, t: float) -> float:
        """The factor of a step that starts at engine time t (steps must come in time order)."""
        if self.sd <= 0.0:
            return 1.0
        if self.hold_s <= 0.0 or t >= self._until:
            self._factor = math.exp(self._rng.gauss(0.0, self.sd) - 0.5 * self.sd * self.sd)
            self._until = (math.floor(t / self.hold_s) + 1) * self.hold_s if self.hold_s > 0.0 else t
        return self._factor


def code2wav_delay_s(cfg: ModelConfig, batch: int) -> float:
    """Latency from a chunk's last frame to its PCM: a fixed part plus a part that grows with the running batch
    (code2wav decodes every running request's chunks and so waits longer when more are in flight)."""
    return (cfg.code2wav_chunk_ms + cfg.code2wav_per_request_ms * batch) * 1e-3


class Code2WavDecoder:
    """vllm-omni's code2wav stage as one decoder that takes chunks one at a time, first come first served (the
    0.24.0 high-concurrency deploy profile's `decode_batch_max_size: 1`, code2wav on its own GPU): a chunk's PCM
    leaves its decode time after the later of its hand-over and the previous chunk's PCM, so first audio queues
    behind every chunk handed over before it once the decoder is the busy stage. With both decode times 0 it is no
    queue at all: the PCM leaves at its hand-over (code2wav_delay_s alone, the model of the older profiles)."""

    def __init__(self, cfg: ModelConfig):
        self.first_s = cfg.code2wav_decode_first_ms * 1e-3
        self.next_s = cfg.code2wav_decode_ms * 1e-3
        self.free_at = -math.inf

    @property
    def queues(self) -> bool:
        return self.first_s > 0.0 or self.next_s > 0.0

    def pcm_at(self, handed_over_s: float, first_chunk: bool) -> float:
        """When the PCM of a chunk handed over at `handed_over_s` leaves (calls must come in hand-over order)."""
        if not self.queues:
            return handed_over_s
        self.free_at = max(handed_over_s, self.free_at) + (self.first_s if first_chunk else self.next_s)
        return self.free_at


def chunk_due(frames_done: int, frames_sent: int, total_frames: int, audio: AudioConfig) -> bool:
    """A chunk leaves when the request is finished, after `initial_chunk_frames` for the first chunk, and after
    `chunk_frames` more for every later one (vllm-omni's initial_codec_chunk_frames / codec_chunk_frames)."""
    if frames_done >= total_frames:
        return True
    need = audio.initial_chunk_frames if frames_sent == 0 else audio.chunk_frames
    return frames_done - frames_sent >= need


def gpu_host_variant_step_s(variant: str, batch: int) -> float:
    """Host time of one step's 15 build_attn_metadata calls on an H100 host, interpolated from the seed function
    benchmark (linear in batch between its points, extrapolated from the last two). `vectorized` has no public
    number: it is taken as the fixed variant's single-request cost, flat (no per-request sync)."""
    if batch <= 0:
        return 0.0
    table = H100_CALL_US["fixed" if variant == "vectorized" else variant]
    if variant == "vectorized":
        return domain.CALLS_PER_STEP * table[0][1] * 1e-6
    xs = [n for n, _ in table]
    i = min(max(bisect.bisect_left(xs, batch), 1), len(xs) - 1)
    (x0, y0), (x1, y1) = table[i - 1], table[i]
    us = y0 + (y1 - y0) * (batch - x0) / (x1 - x0)
    return domain.CALLS_PER_STEP * max(us, table[0][1]) * 1e-6


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

    The first step carries its prefill; the first chunk exists after `chunk_frames` steps (the config's
    initial_chunk_frames) and reaches the client code2wav_delay_s(batch 1) plus the idle decoder's first-chunk decode
    (Code2WavDecoder) later. HTTP overhead is not modelled.
    """
    shapes = call_shapes()
    tokens = sum(q for q, _ in shapes)
    syncs = expected_syncs(variant, len(shapes), tokens)
    first = step_target_s(cfg, 1, 1, variant_step_s, syncs, device_type)
    rest = step_target_s(cfg, 1, 0, variant_step_s, syncs, device_type)
    return first + (chunk_frames - 1) * rest + code2wav_delay_s(cfg, 1) + cfg.code2wav_decode_first_ms * 1e-3

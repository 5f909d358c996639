"""Every public measurement the simulator claims to model, with its source: the data the fit and the fidelity
benchmark compare against (restated with context in docs/simulator.md).

Metrics use vllm-omni's benchmark definitions (`vllm bench serve --omni --backend openai-audio-speech`, read from
vllm_omni/benchmarks/patch/patch.py and benchmarks/metrics/metrics.py of vllm-omni 0.30.0): TTFP = send -> first
non-empty PCM chunk; RTF = a request's send -> last byte over its audio seconds (PCM bytes / 2 / 24000); audio
throughput = summed audio seconds of the measured requests / benchmark duration; medians over requests.
"""

from __future__ import annotations

from dataclasses import dataclass

CI_JSON = "vllm-omni tests/dfx/perf/tests/test_tts.json (test_qwen3_tts_base, H100 baseline)"
CI_JUL = "vllm-omni PR #5231 (CI 7-day average, Jul 5-11 2026)"
CI_JUN = "vllm-omni PR #4289 / #4521 (CI average, Jun 1-8 2026; JSON baseline = 0.95 x average)"
SEED = "vllm-omni PR #1614 discussion (seed E2E run, 0.6B-Base, 0.16.0, batch 8, c=8, 3 runs x 24 requests)"
ISSUE_4855 = "vllm-omni issue #4855 (c=64: ~100 ms per talker step vs ~10 ms of forward, GPU busy ~12-13 %)"

# Units: ttfp_p50 and e2e_p50 in ms, rtf_p50 dimensionless, audio_tput in audio-s/s, req_tput in req/s,
# step_ms in ms, effect_e2e_pct in % (fixed vs original, p50 E2E).
METRIC_KNOBS = {
    "ttfp_p50": "prefill_ms, code2wav_chunk_ms, initial_chunk_frames; the code2wav decoder's queue "
                "(code2wav_decode_first_ms, code2wav_decode_ms); queueing above the batch limit (max_batch_size)",
    "rtf_p50": "base_ms + per_request_ms x batch (step time), the decoder's queue and queue wait above "
               "max_batch_size",
    "audio_tput": "per_request_ms and base_ms at the batch the level reaches (max_batch_size caps it)",
    "req_tput": "step time x frames per request",
    "e2e_p50": "step time x frames per request",
    "step_ms": "base_ms + per_request_ms x batch",
    "effect_e2e_pct": "the variant's host time per step relative to the whole step (base_ms, per_request_ms)",
}


@dataclass(frozen=True)
class Point:
    """One public number. `sigma` is the relative uncertainty used to weight the fit (for effect_e2e_pct an
    absolute one, in percentage points); `fit` says whether the fit uses it (False: shown, not fitted)."""

    setup: str
    level: int
    metric: str
    value: float
    sigma: float
    source: str
    fit: bool = True
    variant: str = "original"


# The CI's baselines mix two periods (PR #5231 kept some June values where July regressed by >7 %). The fit uses the
# one consistent period, the Jul 5-11 averages; the JSON baselines are shown beside them. sigma 10 %: the Jun->Jul
# drift of the same points is 1-29 % (same code base, different days).
CI_POINTS = (
    Point("ci-1.7b", 1, "ttfp_p50", 141.2791, 0.10, CI_JUL),
    Point("ci-1.7b", 1, "rtf_p50", 0.1591, 0.10, CI_JUL),
    Point("ci-1.7b", 8, "ttfp_p50", 226.747, 0.10, CI_JUL),
    Point("ci-1.7b", 8, "rtf_p50", 0.3597, 0.10, CI_JUL),
    Point("ci-1.7b", 8, "audio_tput", 24.2296, 0.10, CI_JUL),
    Point("ci-1.7b", 16, "ttfp_p50", 799.3196, 0.10, CI_JUL),
    Point("ci-1.7b", 16, "rtf_p50", 0.4694, 0.10, CI_JUL),
    Point("ci-1.7b", 16, "audio_tput", 40.3552, 0.10, CI_JUL),
    Point("ci-1.7b", 64, "ttfp_p50", 5726.9927, 0.10, CI_JUL),
    Point("ci-1.7b", 64, "rtf_p50", 1.5709, 0.10, CI_JUL),
    Point("ci-1.7b", 64, "audio_tput", 43.2572, 0.10, CI_JSON + " (= Jul 5-11 average)"),
    Point("ci-1.7b", 64, "step_ms", 100.0, 0.25, ISSUE_4855),
    # the JSON baselines as the issue quotes them (not fitted: a mix of periods, see above)
    Point("ci-1.7b", 8, "rtf_p50", 0.3313, 0.10, CI_JSON + " (kept Jun value)", fit=False),
    Point("ci-1.7b", 16, "ttfp_p50", 647.1272, 0.10, CI_JSON + " (kept Jun value)", fit=False),
    Point("ci-1.7b", 16, "rtf_p50", 0.3642, 0.10, CI_JSON + " (kept Jun value)", fit=False),
    Point("ci-1.7b", 64, "ttfp_p50", 4777.2714, 0.10, CI_JSON + " (kept Jun value)", fit=False),
    Point("ci-1.7b", 64, "rtf_p50", 1.2282, 0.10, CI_JSON + " (kept Jun value)", fit=False),
)

# Seed run: ranges over 3 runs -> midpoints; sigma from the ranges (half range / mean, at least 2 %); the effect's
# sigma: the two arms' run-to-run spread (about 1.3 % and 3.2 %) over 3 runs each -> ~2 points.
SEED_POINTS = (
    Point("seed-0.6b-b8", 8, "req_tput", 1.465, 0.035, SEED),
    Point("seed-0.6b-b8", 8, "req_tput", 1.485, 0.02, SEED, variant="fixed"),
    Point("seed-0.6b-b8", 8, "e2e_p50", 4616.5, 0.02, SEED),
    Point("seed-0.6b-b8", 8, "e2e_p50", 4456.5, 0.035, SEED, variant="fixed"),
    Point("seed-0.6b-b8", 8, "effect_e2e_pct", -3.5, 2.0, SEED, variant="fixed"),
)

ALL_POINTS = CI_POINTS + SEED_POINTS


@dataclass(frozen=True)
class Setup:
    """How a public measurement was taken, as far as its sources say (docs/simulator.md)."""

    name: str
    profile: str  # configs/sim/<profile>
    levels: tuple[tuple[int, int, int], ...]  # (concurrency, measured requests, warm-up requests)
    variants: tuple[str, ...]
    runs: int = 1


# CI: `vllm bench serve` with --max-concurrency c --request-rate inf, num_prompts 20/80/128/128, warm-ups max(2, c)
# (tests/dfx/perf/scripts/run_benchmark.py), seed-tts EN voice clone prompts; vllm-omni main of June-July 2026 uses
# the default deploy config (0.22.0 / 0.24.0 vllm_omni/deploy/qwen3_tts.yaml: max_num_seqs 10 for both stages,
# initial_codec_chunk_frames 1, codec_chunk_frames 25) with code2wav on the second GPU (stage_overrides devices 1).
CI_SETUP = Setup("ci-1.7b", "h100-1.7b-ci.yaml", ((1, 20, 2), (8, 80, 8), (16, 128, 16), (64, 128, 64)),
                 ("vectorized",))
SEED_SETUP = Setup("seed-0.6b-b8", "h100-0.6b-b8.yaml", ((8, 24, 0),), ("original", "fixed"), runs=3)

# Audio seconds per request in the CI's seed-tts EN voice-clone set: 135.04 s over 20 prompts = 6.75 s mean
# (1.7B-Base, vllm-omni PR #2835 benchmark output). The spread is not published: 20 lengths evenly from 4.25 to
# 9.25 s, in a fixed shuffled order.
CI_MEAN_AUDIO_S = 6.752
CI_FRAMES = tuple(round(12.5 * (CI_MEAN_AUDIO_S + 2.5 * (-1 + 2 * (7 * i % 20) / 19))) for i in range(20))

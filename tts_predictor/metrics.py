"""Names and help texts of every server-side metric: the one place they are defined.

The simulator and the vLLM plugin both register these (via `make_predictor_metrics`), the scraper and the
statistics read them by these names, and the Grafana dashboards query them.
prometheus_client is imported lazily so the package itself needs only torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .domain import DECODE_CALLS_PER_STEP, DECODE_QUERY_LEN, PREFILL_QUERY_LEN

# --- predictor (both backends) -------------------------------------------------------------------------------
CALLS = "tts_predictor_build_attn_metadata_calls_total"
SECONDS = "tts_predictor_build_attn_metadata_seconds"
SYNCS = "tts_predictor_device_syncs_total"
OBSERVED_CALLS = "tts_predictor_sync_observed_calls_total"
OBSERVED_TOKENS = "tts_predictor_sync_observed_tokens_total"
TOKENS = "tts_predictor_tokens_total"
REQUESTS = "tts_predictor_batch_requests_total"
INFO = "tts_predictor_info"

# --- the real server's step clock (plugin; the quantity the simulator models) ---------------------------------
STEP_INTERVAL = "tts_predictor_step_interval_seconds"
STEP_BATCH = "tts_predictor_step_batch_size"

# --- hot swap control channel (plugin and simulator; tts_predictor.control) ------------------------------------
SWITCHES = "tts_predictor_variant_switches_total"
ACTIVE_VARIANT = "tts_predictor_active_variant"
CONTROL_EPOCH = "tts_predictor_control_epoch"
OBSERVE_ENABLED = "tts_predictor_observe_enabled"
CONTROL_ERRORS = "tts_predictor_control_errors_total"

# --- engine (simulator; on vllm-omni the talker step count is derived from prefill calls) ---------------------
STEPS = "tts_engine_steps_total"
STEP_SECONDS = "tts_engine_step_seconds"
BATCH_SIZE = "tts_engine_batch_size"
RUNNING = "tts_engine_running_requests"
WAITING = "tts_engine_waiting_requests"
FRAMES = "tts_engine_frames_total"
ENGINE_REQUESTS = "tts_engine_requests_total"

# --- simulator only (ttssim): what it modelled, injected and how its clock kept up ----------------------------
SIM_MODELLED_SECONDS = "tts_sim_modelled_seconds_total"
SIM_STALL_SECONDS = "tts_sim_stall_seconds_total"
SIM_INJECTED_SECONDS = "tts_sim_injected_seconds_total"
SIM_OBSERVER_SECONDS = "tts_sim_observer_seconds_total"
SIM_LATE_STEPS = "tts_sim_late_steps_total"
SIM_PREFILLS = "tts_sim_prefills_total"
SIM_FAULTS = "tts_sim_faults_total"
SIM_HTTP_REQUESTS = "tts_sim_http_requests_total"
SIM_TTFA_MODEL = "tts_sim_ttfa_model_seconds"
SIM_TTFA_SERVED = "tts_sim_ttfa_served_seconds"
SIM_DEFERRED_SAMPLES = "tts_sim_deferred_observer_samples_total"

HELP = {
    CALLS: "Calls of the code predictor's build_attn_metadata (15 per talker step: 1 prefill + 14 decodes).",
    SECONDS: "Host wall time of build_attn_metadata per call, seconds.",
    SYNCS: "GPU synchronisations observed inside build_attn_metadata (sync observer; only on sampled calls, "
    "see tts_predictor_sync_observed_calls_total; syncs per call = ratio of the two).",
    OBSERVED_CALLS: "Calls of build_attn_metadata that ran under the sync observer (the sample behind device_syncs).",
    OBSERVED_TOKENS: "Query tokens of the calls that ran under the sync observer (to check original's T+4 exactly).",
    TOKENS: "Query tokens laid out by build_attn_metadata (T summed over calls).",
    REQUESTS: "Requests in the batch, summed over build_attn_metadata calls (mean batch = this / calls).",
    INFO: "Which predictor variant and backend this process runs; backend='simulated' marks the simulator.",
    STEP_INTERVAL: "Time between the first build_attn_metadata calls of consecutive talker steps in one process, "
    "seconds (the real server's step clock; a gap longer than an idle threshold starts a new busy period).",
    STEP_BATCH: "Requests in a talker step (from the step's first build_attn_metadata call).",
    SWITCHES: "Variant switches applied through the control file, by the variant switched to.",
    ACTIVE_VARIANT: "1 for the variant this process runs now, 0 for the others.",
    CONTROL_EPOCH: "Epoch of the control file last applied (the runner's confirmation that a switch took effect).",
    OBSERVE_ENABLED: "1 while the sync observer samples calls, 0 while it is switched off (timing windows).",
    CONTROL_ERRORS: "Control file changes refused (unknown variant, broken JSON, ...), by reason; the server kept "
    "its current settings.",
    STEPS: "Talker steps executed by the engine (one codec frame for every running request).",
    STEP_SECONDS: "Wall time of one engine step, seconds (simulated model time + real variant time), from the previous "
    "step's end (its start after idle) to its end: the cadence clients see.",
    BATCH_SIZE: "Requests advanced per engine step.",
    RUNNING: "Requests currently in the running batch.",
    WAITING: "Requests admitted but waiting for a batch slot.",
    FRAMES: "Codec frames produced (12.5 per second of audio).",
    ENGINE_REQUESTS: "Speech requests finished by the engine, by outcome.",
    SIM_MODELLED_SECONDS: "Simulator: modelled rest-of-step time slept (base + per-request + prefill), seconds.",
    SIM_STALL_SECONDS: "Simulator: modelled GPU stall slept for synchronisations (CPU device only), seconds. Syncs are "
    "the observer's count on sampled calls and the closed form (T+4 / 5 / 0) on the others.",
    SIM_INJECTED_SECONDS: "Simulator: injected extra step delay (extra_step_ms / extra_step_pct), seconds.",
    SIM_OBSERVER_SECONDS: "Simulator: host time of the sampled sync-observer calls (extra shadow calls, not in the "
    "predictor counters; their cost is hidden in the step's sleep when it fits).",
    SIM_LATE_STEPS: "Simulator: steps that started more than catch-up allows after their deadline (clock reset).",
    SIM_PREFILLS: "Simulator: requests admitted into the running batch (each adds prefill_ms to its step).",
    SIM_FAULTS: "Simulator: injected faults, by kind.",
    SIM_HTTP_REQUESTS: "Simulator: HTTP requests answered, by handler and status.",
    SIM_TTFA_MODEL: "Simulator: the model's time to first audio per request, from the steps it actually ran in "
    "(queue wait + step targets incl. measured variant time + code2wav); client TTFA minus this = HTTP + clock error.",
    SIM_TTFA_SERVED: "Simulator: measured time from the speech handler's start to the first streamed PCM chunk handed "
    "to the socket; minus tts_sim_ttfa_model_seconds = the simulator's clock error, client TTFA minus this = HTTP.",
    SIM_DEFERRED_SAMPLES: "Simulator: sync-observer samples put off by one step because a chunk delivery was due "
    "while the sample would hold the event loop (the sample still runs, one step later).",
}

# Histogram buckets: µs-scale for the predictor call, ms-scale for the step.
SECONDS_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1)
STEP_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TTFA_BUCKETS = STEP_BUCKETS + (5.0, 10.0)  # time to first audio: a step's scale up to a long queue wait


@dataclass(frozen=True)
class PredictorMetrics:
    calls: object
    seconds: object
    syncs: object
    observed_calls: object
    observed_tokens: object
    tokens: object
    requests: object
    info: object


def make_predictor_metrics(registry=None) -> PredictorMetrics:
    """Create the predictor metrics on `registry` (default: prometheus_client's global one)."""
    from prometheus_client import REGISTRY, Counter, Histogram, Info

    reg = REGISTRY if registry is None else registry

    def counter(name):  # prometheus_client appends _total itself
        return Counter(name.removesuffix("_total"), HELP[name], ["variant"], registry=reg)

    return PredictorMetrics(
        calls=counter(CALLS),
        seconds=Histogram(SECONDS, HELP[SECONDS], ["variant"], buckets=SECONDS_BUCKETS, registry=reg),
        syncs=counter(SYNCS),
        observed_calls=counter(OBSERVED_CALLS),
        observed_tokens=counter(OBSERVED_TOKENS),
        tokens=counter(TOKENS),
        requests=counter(REQUESTS),
        info=Info(INFO.removesuffix("_info"), HELP[INFO], registry=reg),
    )


def syncs_per_call(variant: str, num_tokens: int) -> int:
    """The closed form every variant must show (docs/sources.md): original T+4, fixed 5, vectorized 0."""
    if variant == "original":
        return num_tokens + 4
    if variant == "fixed":
        return 5
    if variant == "vectorized":
        return 0
    raise ValueError(f"unknown variant {variant!r}")


def expected_syncs(variant: str, calls: float, tokens: float) -> float:
    """Syncs a variant must show over `calls` observed calls carrying `tokens` query tokens in all."""
    if variant == "original":
        return tokens + 4 * calls
    if variant == "fixed":
        return 5 * calls
    if variant == "vectorized":
        return 0.0
    raise ValueError(f"unknown variant {variant!r}")


def syncs_per_step(variant: str, batch: int) -> int:
    """Syncs of one talker step at batch B: 1 prefill (T=2B) + 14 decodes (T=B)."""
    if batch <= 0:
        return 0
    return (syncs_per_call(variant, PREFILL_QUERY_LEN * batch)
            + DECODE_CALLS_PER_STEP * syncs_per_call(variant, DECODE_QUERY_LEN * batch))

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
HOST_DELAY = "tts_predictor_host_delay_seconds_total"
HOST_DELAY_CALLS = "tts_predictor_host_delay_calls_total"
INFO = "tts_predictor_info"
ATTENTION_INFO = "tts_predictor_attention_info"

# --- the real server's step clock (plugin; the quantity the simulator models) ---------------------------------
STEP_INTERVAL = "tts_predictor_step_interval_seconds"
STEP_BATCH = "tts_predictor_step_batch_size"
# A gap this long between two steps means the talker had nothing to run (no step is that long at the batch sizes we
# sweep: the simulator's c=256 step is ~0.4 s): it starts a new busy period instead of being counted as a step.
STEP_IDLE_S = 1.0

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
    REQUESTS: "Rows of the batch build_attn_metadata lays out, summed over calls (mean = this / calls): the PADDED "
    "batch on a GPU, where the talker's batch is padded up to a CUDA-graph capture size, so it can exceed the "
    "requests in flight (the real batch: vLLM's vllm:num_requests_running).",
    HOST_DELAY: "Positive control: host time spent in the control file's fixed extra delay (host_delay_us) inside "
                "build_attn_metadata.",
    HOST_DELAY_CALLS: "Positive control: build_attn_metadata calls that carried the control file's extra delay.",
    INFO: "Which predictor variant and backend this process runs; backend='simulated' marks the simulator.",
    ATTENTION_INFO: "1 for each attention backend / metadata builder class that the code predictor's local KV cache "
    "hands its metadata to (the builder's own host reads count in the sync signature: docs/control.md).",
    STEP_INTERVAL: "Time between the first build_attn_metadata calls (the prefill) of consecutive talker steps, "
    f"seconds, labelled by the variant of the earlier step (the step it measures); a gap of {STEP_IDLE_S:g} s or "
    "more follows idle time and is not counted.",
    STEP_BATCH: "Rows of a talker step (num_reqs of the step's prefill call; PADDED to a CUDA-graph capture size on "
    "a GPU, not the requests in it), by the variant that ran the step.",
    SWITCHES: "Variant switches applied through the control file (at a step boundary), by the variant switched to.",
    ACTIVE_VARIANT: "1 for the variant the predictor runs now, 0 for the others (control file; multiprocess: the "
    "minimum over live processes, so 1 means every predictor process runs it).",
    CONTROL_EPOCH: "'epoch' of the control setting in effect (0 when the file has none; multiprocess: minimum over "
    "live processes): the runner's confirmation that its change took effect.",
    OBSERVE_ENABLED: "1 while the sync observer samples calls, 0 while the control file switched it off (timing "
    "windows; multiprocess: minimum over live processes).",
    CONTROL_ERRORS: "Control file changes refused (unknown variant, broken JSON, missing file, ...), by reason; the "
    "server kept its current setting.",
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
# The step clock (STEP_INTERVAL): talker steps take ~5-200 ms (vllm-omni #4855: ~100 ms at c=64), so the buckets are
# dense there, up to the idle threshold STEP_IDLE_S.
STEP_INTERVAL_BUCKETS = (0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05, 0.06, 0.07,
                         0.08, 0.09, 0.1, 0.12, 0.14, 0.16, 0.18, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, STEP_IDLE_S)
# prometheus_client multiprocess mode (docs/metrics-transport.md): a gauge's value across the processes' files.
# "livemin": the minimum over live processes, so ACTIVE_VARIANT reads 1 and CONTROL_EPOCH reads N only once EVERY
# process that runs the predictor applied it (one talker worker per server here; tensor-parallel workers would each
# have their own); gauges are created only in processes that run the predictor, so idle processes do not pin it.
CONTROL_GAUGE_MODE = "livemin"


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
    host_delay: object
    host_delay_calls: object


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
        host_delay=counter(HOST_DELAY),
        host_delay_calls=counter(HOST_DELAY_CALLS),
    )


@dataclass(frozen=True)
class StepMetrics:
    interval: object
    batch: object


def make_step_metrics(registry=None) -> StepMetrics:
    """The step clock, the same quantity in the plugin and the simulator (tts_predictor.step_clock)."""
    from prometheus_client import REGISTRY, Histogram

    reg = REGISTRY if registry is None else registry
    return StepMetrics(
        interval=Histogram(STEP_INTERVAL, HELP[STEP_INTERVAL], ["variant"], buckets=STEP_INTERVAL_BUCKETS,
                           registry=reg),
        batch=Histogram(STEP_BATCH, HELP[STEP_BATCH], ["variant"], buckets=BATCH_BUCKETS, registry=reg),
    )


@dataclass(frozen=True)
class ControlMetrics:
    switches: object
    active: object
    epoch: object
    observe: object
    errors: object


def make_control_metrics(registry=None) -> ControlMetrics:
    """Metrics of the control channel (tts_predictor.control.ControlChannel)."""
    from prometheus_client import REGISTRY, Counter, Gauge

    reg = REGISTRY if registry is None else registry
    mode = CONTROL_GAUGE_MODE
    return ControlMetrics(
        switches=Counter(SWITCHES.removesuffix("_total"), HELP[SWITCHES], ["variant"], registry=reg),
        active=Gauge(ACTIVE_VARIANT, HELP[ACTIVE_VARIANT], ["variant"], multiprocess_mode=mode, registry=reg),
        epoch=Gauge(CONTROL_EPOCH, HELP[CONTROL_EPOCH], multiprocess_mode=mode, registry=reg),
        observe=Gauge(OBSERVE_ENABLED, HELP[OBSERVE_ENABLED], multiprocess_mode=mode, registry=reg),
        errors=Counter(CONTROL_ERRORS.removesuffix("_total"), HELP[CONTROL_ERRORS], ["reason"], registry=reg),
    )


def make_attention_info(registry=None):
    """Gauge naming the attention backend/builder classes (a Gauge, not an Info: Info is not multiprocess-safe)."""
    from prometheus_client import REGISTRY, Gauge

    reg = REGISTRY if registry is None else registry
    return Gauge(ATTENTION_INFO, HELP[ATTENTION_INFO], ["backend", "builder"], multiprocess_mode="max", registry=reg)


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

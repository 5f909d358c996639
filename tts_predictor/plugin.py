"""vLLM general plugin: puts one predictor variant into vllm-omni 0.16.0's code predictor, with counters.

Entry point (pyproject.toml): group ``vllm.general_plugins``, ``tts_predictor_variant = tts_predictor.plugin:register``.
vLLM calls ``register()`` once in every process it starts (API server, engine core, workers) before any model is
built. ``TTS_PREDICTOR_VARIANT`` (original|fixed|vectorized, default original) picks the variant:

- ``original``: the stock ``_LocalPredictorKVCache.build_attn_metadata`` of vllm-omni 0.16.0, called as it is;
- ``fixed`` / ``vectorized``: the layout from ``tts_predictor.variants``, handed to vLLM's
  ``attn_utils.build_attn_metadata`` with the same arguments, early returns and return tuple as the stock method.

Every arm, the stock one included, runs inside the same wrapper that counts calls, host seconds, query tokens and
batch requests, and every ``TTS_PREDICTOR_SYNC_SAMPLE``-th call (default 32; 0 = never) runs under the sync
observer (CUDA sync-debug warnings on a GPU, the logical observer elsewhere). Counters are created lazily on the
first call, so only the process that runs the talker registers them; they reach the API server's ``/metrics``
through prometheus_client's multiprocess mode (docs/metrics-transport.md).

Fail closed: an unknown variant, a vllm-omni other than 0.16.0, a target whose signature or source differs from
the one our variants reproduce, or an NPU platform with a non-stock variant raises ``PluginError``, which vLLM does
not catch around a plugin's function: the process stops with the message.

This is the only module of the project that imports vllm / vllm_omni, and only inside ``register()``.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import os
import textwrap
import threading
import time

from .domain import DEFAULT_VARIANT

ENV_VARIANT = "TTS_PREDICTOR_VARIANT"
ENV_SAMPLE = "TTS_PREDICTOR_SYNC_SAMPLE"
ENV_SKIP_SOURCE_CHECK = "TTS_PREDICTOR_SKIP_SOURCE_CHECK"
DEFAULT_SAMPLE = 32  # coprime with the 15 calls of a talker step: the sample walks through prefill and decodes

SUPPORTED_VLLM_OMNI = "0.16.0"
TARGET_MODULE = "vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code_predictor_vllm"
TARGET_CLASS = "_LocalPredictorKVCache"
TARGET_METHOD = "build_attn_metadata"
# (name, kind) of the target's parameters; kinds as inspect.Parameter.kind.name
TARGET_PARAMS = (
    ("self", "POSITIONAL_OR_KEYWORD"),
    ("num_reqs", "KEYWORD_ONLY"),
    ("query_lens", "KEYWORD_ONLY"),
    ("seq_lens", "KEYWORD_ONLY"),
)
# keyword arguments the stock method passes to vLLM's attn_utils.build_attn_metadata (we pass the same)
ATTN_UTILS_PARAMS = (
    "attn_metadata_builders", "num_reqs", "num_tokens", "query_start_loc_gpu", "query_start_loc_cpu", "seq_lens",
    "max_seq_len", "block_tables", "slot_mappings", "kv_cache_config",
)
# sha256 of the dedented source of the stock method and of the class's __init__ in the vllm-omni 0.16.0 wheel:
# our variants reproduce exactly this code and rely on the attributes this __init__ sets.
TARGET_SOURCE_SHA256 = {
    TARGET_METHOD: "431e86e1412ca3e277ed740f8347a4653ce935ce5211a89d0f4913ef94f2d543",
    "__init__": "2ffe1e8f79584c19e8e5da4308145a1fc4fcd1f3edbffde3dd678f1be9591ed6",
}
MARK = "__tts_predictor_variant__"
LOGGER_NAME = "vllm.tts_predictor.plugin"  # a child of vLLM's logger, so vLLM's handler prints it

logger = logging.getLogger(LOGGER_NAME)
_lock = threading.Lock()
_installed: dict[str, str] = {}  # "variant" -> name, set once per process


class PluginError(RuntimeError):
    """The plugin refuses to run: the process must not serve with an unknown or unverified predictor."""


def selected_variant(environ=None) -> str:
    """The variant named by TTS_PREDICTOR_VARIANT, or PluginError if it is not one we have."""
    from .variants import VARIANTS

    env = os.environ if environ is None else environ
    name = env.get(ENV_VARIANT, DEFAULT_VARIANT).strip()
    if name not in VARIANTS:
        raise PluginError(
            f"tts_predictor plugin: {ENV_VARIANT}={name!r} is not a known predictor variant; "
            f"use one of {sorted(VARIANTS)}"
        )
    return name


def sample_every(environ=None) -> int:
    env = os.environ if environ is None else environ
    raw = env.get(ENV_SAMPLE, str(DEFAULT_SAMPLE)).strip()
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise PluginError(f"tts_predictor plugin: {ENV_SAMPLE}={raw!r} must be an integer >= 0 (0 = never observe)")
    return n


def source_sha256(obj) -> str:
    return hashlib.sha256(textwrap.dedent(inspect.getsource(obj)).encode()).hexdigest()


def check_target(module, cls, version: str, environ=None) -> None:
    """Everything we rely on, checked before anything is replaced. Raises PluginError naming what differs."""
    env = os.environ if environ is None else environ
    if version != SUPPORTED_VLLM_OMNI:
        raise PluginError(
            f"tts_predictor plugin: vllm-omni {version} found, but the predictor variants reproduce vllm-omni "
            f"{SUPPORTED_VLLM_OMNI}'s {TARGET_CLASS}.{TARGET_METHOD}; refusing to start"
        )
    method = cls.__dict__.get(TARGET_METHOD)
    if method is None or not callable(method):
        raise PluginError(f"tts_predictor plugin: {TARGET_MODULE}.{TARGET_CLASS} has no method {TARGET_METHOD}")
    params = tuple((p.name, p.kind.name) for p in inspect.signature(method).parameters.values())
    if params != TARGET_PARAMS:
        raise PluginError(
            f"tts_predictor plugin: {TARGET_CLASS}.{TARGET_METHOD} has signature {params}, expected {TARGET_PARAMS}"
        )
    attn_utils = getattr(module, "attn_utils", None)
    fn = getattr(attn_utils, "build_attn_metadata", None)
    if fn is None:
        raise PluginError(f"tts_predictor plugin: {TARGET_MODULE} no longer uses vLLM's attn_utils.build_attn_metadata")
    have = set(inspect.signature(fn).parameters)
    missing = [p for p in ATTN_UTILS_PARAMS if p not in have]
    if missing:
        raise PluginError(f"tts_predictor plugin: vLLM's attn_utils.build_attn_metadata lacks parameters {missing}")
    if env.get(ENV_SKIP_SOURCE_CHECK, "") == "1":
        logger.warning("tts_predictor plugin: %s=1, the source of %s is NOT verified", ENV_SKIP_SOURCE_CHECK, TARGET_CLASS)
        return
    for name, want in TARGET_SOURCE_SHA256.items():
        try:
            got = source_sha256(cls.__dict__[name])
        except (OSError, TypeError, KeyError) as e:
            raise PluginError(
                f"tts_predictor plugin: cannot read the source of {TARGET_CLASS}.{name} to verify it ({e}); "
                f"set {ENV_SKIP_SOURCE_CHECK}=1 to run unverified"
            ) from e
        if got != want:
            raise PluginError(
                f"tts_predictor plugin: {TARGET_CLASS}.{name} differs from vllm-omni {SUPPORTED_VLLM_OMNI} "
                f"(sha256 {got[:12]}..., expected {want[:12]}...): the variants would not reproduce it; "
                f"set {ENV_SKIP_SOURCE_CHECK}=1 to run unverified"
            )


def make_layout_method(variant_fn, module):
    """``build_attn_metadata`` for a layout variant: the stock method's contract, our layout.

    ``module.attn_utils`` is looked up at call time, exactly as the stock method's global is, so whatever attention
    utilities the stock method would use, this one uses too.
    """
    import torch

    def build_attn_metadata(self, *, num_reqs, query_lens, seq_lens):
        num_reqs = int(num_reqs)
        if num_reqs <= 0:
            return {}, torch.empty((0,), dtype=torch.int64, device=self.device), {}
        if num_reqs > self.max_batch_size:
            raise ValueError(f"num_reqs={num_reqs} exceeds local predictor max_batch_size={self.max_batch_size}")
        query_lens_i32 = query_lens.to(dtype=torch.int32, device="cpu")
        seq_lens_i32 = seq_lens.to(dtype=torch.int32, device="cpu")
        if query_lens_i32.shape[0] != num_reqs or seq_lens_i32.shape[0] != num_reqs:
            raise ValueError(
                f"query_lens {tuple(query_lens_i32.shape)} / seq_lens {tuple(seq_lens_i32.shape)} "
                f"do not hold num_reqs={num_reqs} entries"
            )
        layout = variant_fn(
            query_lens_i32, seq_lens_i32, self._block_table, block_size=self.block_size, device=self.device
        )
        if layout.num_tokens <= 0:
            return {}, torch.empty((0,), dtype=torch.int64, device=self.device), {}
        attn_metadata = module.attn_utils.build_attn_metadata(
            self.attn_metadata_builders,
            num_reqs=num_reqs,
            num_tokens=layout.num_tokens,
            query_start_loc_gpu=layout.query_start_loc_device,
            query_start_loc_cpu=layout.query_start_loc,
            seq_lens=layout.seq_lens_device,
            max_seq_len=layout.max_seq_len,
            block_tables=[layout.block_table],
            slot_mappings=[layout.slot_mapping],
            kv_cache_config=self.kv_cache_config,
        )
        slot_mappings_by_layer = {
            name: layout.slot_mapping for group in self.kv_cache_config.kv_cache_groups for name in group.layer_names
        }
        return attn_metadata, layout.positions, slot_mappings_by_layer

    build_attn_metadata.__qualname__ = f"{TARGET_CLASS}.{TARGET_METHOD}"
    build_attn_metadata.__doc__ = f"tts_predictor variant {variant_fn.__name__!r} (tts_predictor.variants)."
    return build_attn_metadata


class _Instrument:
    """The counters around one arm. Metrics and observers are made on first use, in the process that calls."""

    def __init__(self, variant: str, every: int):
        self.variant = variant
        self.every = every
        self.calls = 0
        self._metrics = None
        self._labelled = None
        self._first_call_logged = False
        self._lock = threading.Lock()

    def metrics(self):
        if self._labelled is None:
            with self._lock:
                if self._labelled is None:
                    self._labelled = _labelled_metrics(self.variant)
        return self._labelled

    def observer_for(self, kv):
        obs = getattr(kv, "_tts_sync_observer", None)
        if obs is None:
            from .sync_observer import SyncObserver

            dev = kv.device if hasattr(kv.device, "type") else __import__("torch").device(kv.device)
            obs = SyncObserver(dev)
            if obs.method == "logical":
                # the logical observer recognises "device" tensors by the identity of the device object; on a host
                # device the cache's own object is the one every arm passes to .to(), so watch that one
                obs.device = kv.device
            kv._tts_sync_observer = obs
        return obs

    def wrap(self, impl):
        inst = self

        def build_attn_metadata(self, *, num_reqs, query_lens, seq_lens):
            with inst._lock:
                inst.calls += 1
                n = inst.calls
            observe = inst.every > 0 and n % inst.every == 0
            if observe:
                with inst.observer_for(self).observe(device_tensors=[self._block_table]) as count:
                    out = impl(self, num_reqs=num_reqs, query_lens=query_lens, seq_lens=seq_lens)
                seconds = None  # an observed call is slowed by the observer: kept out of the time histogram
            else:
                t0 = time.perf_counter()
                out = impl(self, num_reqs=num_reqs, query_lens=query_lens, seq_lens=seq_lens)
                seconds = time.perf_counter() - t0
            tokens = int(out[1].shape[0])  # positions: one per query token; a shape, no device read
            m = inst.metrics()
            m["calls"].inc()
            m["tokens"].inc(tokens)
            m["requests"].inc(max(int(num_reqs), 0))
            if seconds is not None:
                m["seconds"].observe(seconds)
            else:
                m["observed_calls"].inc()
                m["observed_tokens"].inc(tokens)
                m["syncs"].inc(count.syncs)
            if not inst._first_call_logged:
                inst._first_call_logged = True
                logger.info(
                    "tts_predictor: first %s call in pid %d runs variant %r (num_reqs=%d, tokens=%d, device=%s)",
                    TARGET_METHOD, os.getpid(), inst.variant, int(num_reqs), tokens, self.device,
                )
            return out

        build_attn_metadata.__qualname__ = f"{TARGET_CLASS}.{TARGET_METHOD}"
        build_attn_metadata.__doc__ = impl.__doc__
        build_attn_metadata.__wrapped__ = impl
        setattr(build_attn_metadata, MARK, self.variant)
        build_attn_metadata.tts_instrument = self
        return build_attn_metadata


_METRICS = None


def _labelled_metrics(variant: str) -> dict:
    """The process's predictor metrics (created once, on prometheus_client's default registry), for `variant`."""
    global _METRICS
    from . import metrics as names

    with _lock:
        if _METRICS is None:
            _METRICS = names.make_predictor_metrics()
            try:  # not exported in multiprocess mode (prometheus_client keeps Info in-process); the label is
                _METRICS.info.info({"variant": variant, "backend": "vllm-omni", "pid": str(os.getpid())})
            except Exception:  # noqa: BLE001 - an info label must never stop serving
                pass
    m = _METRICS
    return {
        "calls": m.calls.labels(variant=variant),
        "seconds": m.seconds.labels(variant=variant),
        "syncs": m.syncs.labels(variant=variant),
        "observed_calls": m.observed_calls.labels(variant=variant),
        "observed_tokens": m.observed_tokens.labels(variant=variant),
        "tokens": m.tokens.labels(variant=variant),
        "requests": m.requests.labels(variant=variant),
    }


def _omni_version() -> str:
    import vllm_omni

    return str(getattr(vllm_omni, "__version__", "unknown"))


def register() -> None:
    """vLLM general-plugin entry point. Idempotent within a process; raises PluginError to refuse."""
    variant = selected_variant()
    every = sample_every()
    with _lock:
        if _installed:
            if _installed["variant"] != variant:
                raise PluginError(
                    f"tts_predictor plugin: this process already runs variant {_installed['variant']!r}, "
                    f"cannot switch to {variant!r}"
                )
            return
    try:
        import prometheus_client  # noqa: F401 - the counters are the point; no counters, no serving

        module = importlib.import_module(TARGET_MODULE)
    except ImportError as e:
        raise PluginError(f"tts_predictor plugin: cannot import what it instruments ({e})") from e
    cls = getattr(module, TARGET_CLASS, None)
    if cls is None:
        raise PluginError(f"tts_predictor plugin: {TARGET_MODULE} has no class {TARGET_CLASS}")
    current = cls.__dict__.get(TARGET_METHOD)
    if getattr(current, MARK, None) is not None:
        raise PluginError(
            f"tts_predictor plugin: {TARGET_CLASS}.{TARGET_METHOD} is already replaced by variant "
            f"{getattr(current, MARK)!r} in this process"
        )
    check_target(module, cls, _omni_version())
    if variant != "original":
        platform = getattr(module, "current_omni_platform", None)
        if platform is not None and platform.is_npu():
            raise PluginError(
                f"tts_predictor plugin: variant {variant!r} implements the CUDA/CPU path only; this is an NPU"
            )
    from .variants import VARIANTS

    impl = current if variant == "original" else make_layout_method(VARIANTS[variant], module)
    wrapped = _Instrument(variant, every).wrap(impl)
    with _lock:
        setattr(cls, TARGET_METHOD, wrapped)
        _installed["variant"] = variant
    logger.info(
        "tts_predictor: variant %r installed in %s.%s (pid %d, vllm-omni %s, sync sample 1/%s)",
        variant, TARGET_CLASS, TARGET_METHOD, os.getpid(), SUPPORTED_VLLM_OMNI, every or "never",
    )


def installed_variant() -> str | None:
    """The variant this process runs, or None if register() has not installed one."""
    return _installed.get("variant")

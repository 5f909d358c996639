"""vLLM general plugin: puts the predictor variants into vllm-omni 0.16.0's code predictor, with counters.

Entry point (pyproject.toml): group ``vllm.general_plugins``, ``tts_predictor_variant = tts_predictor.plugin:register``.
vLLM calls ``register()`` once in every process it starts (API server, engine core, workers) before any model is
built. Which code runs:

- without ``TTS_PREDICTOR_CONTROL``: ``TTS_PREDICTOR_VARIANT`` (original|fixed|vectorized, default
  ``domain.DEFAULT_VARIANT``) for the life of the process;
- with ``TTS_PREDICTOR_CONTROL=/path/control.json`` (tts_predictor.control, docs/control.md): all three arms are
  installed, the file says which one runs and whether the sync observer samples, and a change is applied at the
  next talker-step boundary (the step's prefill call), never between a step's prefill and its 14 decodes.

The arms: ``original`` is the stock ``_LocalPredictorKVCache.build_attn_metadata`` of vllm-omni 0.16.0, called as
it is; ``fixed`` / ``vectorized`` are the layouts from ``tts_predictor.variants``, handed to vLLM's
``attn_utils.build_attn_metadata`` with the same arguments, early returns and return tuple as the stock method.
Every arm runs inside the same wrapper that counts calls, host seconds, query tokens and batch requests under the
label of the variant that ran the call, and every ``TTS_PREDICTOR_SYNC_SAMPLE``-th call (default 32; 0 = never)
runs under the sync observer while observing is on. The wrapper also keeps the step clock (tts_predictor.step_clock)
and names the attention backend and metadata builder the cache uses. Metrics are created lazily on the first call,
so only the process that runs the talker registers them; they reach the API server's ``/metrics`` through
prometheus_client's multiprocess mode (docs/metrics-transport.md).

Fail closed: an unknown variant, a target whose signature or source code differs from vllm-omni 0.16.0's (checked
on the function's own code object, so a ``functools.wraps`` wrapper does not pass for the stock method, and that code
object compared with the verified source compiled again, so other code under the stock file and line does not
either), a control
file that is missing or invalid at start-up, or an NPU platform with a non-stock variant raises ``PluginError``,
which vLLM does not catch around a plugin's function: the process stops with the message. The vllm-omni version
string is logged, not trusted: a build from another commit whose target code is identical is accepted.

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

from .control import ENV_CONTROL, ControlChannel, ControlError
from .domain import DEFAULT_VARIANT, PREFILL_QUERY_LEN
from .step_clock import StepClock

ENV_VARIANT = "TTS_PREDICTOR_VARIANT"
ENV_SAMPLE = "TTS_PREDICTOR_SYNC_SAMPLE"
ENV_SKIP_SOURCE_CHECK = "TTS_PREDICTOR_SKIP_SOURCE_CHECK"
DEFAULT_SAMPLE = 32  # coprime with the 15 calls of a talker step: the sample walks through prefill and decodes

SUPPORTED_VLLM_OMNI = "0.16.0"  # the release whose code the hashes below are taken from
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
# sha256 of the dedented source of the stock method's and the class __init__'s own code objects in the vllm-omni
# 0.16.0 wheel: our variants reproduce exactly this code and rely on the attributes this __init__ sets.
TARGET_SOURCE_SHA256 = {
    TARGET_METHOD: "431e86e1412ca3e277ed740f8347a4653ce935ce5211a89d0f4913ef94f2d543",
    "__init__": "2ffe1e8f79584c19e8e5da4308145a1fc4fcd1f3edbffde3dd678f1be9591ed6",
}
MARK = "__tts_predictor_variant__"
STATE_ATTR = "_tts_predictor_state"  # per _LocalPredictorKVCache instance: its step clock and the arm it runs
CONTROLLED = "controlled"  # MARK of a wrapper whose arm the control file picks
LOGGER_NAME = "vllm.tts_predictor.plugin"  # a child of vLLM's logger, so vLLM's handler prints it

logger = logging.getLogger(LOGGER_NAME)
_lock = threading.Lock()
_installed: dict = {}  # "variant", "control", "runtime": set once per process


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


def source_sha256(fn) -> str:
    """sha256 of the dedented source of `fn`'s OWN code object.

    `inspect.getsource(fn)` unwraps `__wrapped__` first, so a `functools.wraps(stock)` wrapper would show the stock
    source; the code object cannot be redirected that way. Raises TypeError for anything but a plain function."""
    code = getattr(fn, "__code__", None)
    if code is None or not inspect.isfunction(fn):
        raise TypeError(f"{fn!r} is not a plain Python function")
    return hashlib.sha256(textwrap.dedent(inspect.getsource(code)).encode()).hexdigest()


def _same_code(a, b) -> bool:
    """Two code objects run the same: bytecode, names, constants (nested code compared the same way), arguments.
    Line numbers, the file name and the qualified name are left out: they say where the code claims to come from."""
    if (a.co_code, a.co_names, a.co_varnames, a.co_freevars, a.co_cellvars, a.co_argcount, a.co_posonlyargcount,
            a.co_kwonlyargcount, a.co_flags, a.co_name) != \
            (b.co_code, b.co_names, b.co_varnames, b.co_freevars, b.co_cellvars, b.co_argcount, b.co_posonlyargcount,
             b.co_kwonlyargcount, b.co_flags, b.co_name) or len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts, strict=True):
        if inspect.iscode(x) or inspect.iscode(y):
            if not (inspect.iscode(x) and inspect.iscode(y) and _same_code(x, y)):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def runs_its_source(fn) -> bool:
    """`fn`'s code object is what the file its source hash was read from compiles to at that place.

    The source hash reads the text at the code object's file name and line, so a changed function compiled under the
    stock file name and line would pass it; the code it runs would not pass this. The whole file is compiled again
    (a method's bytecode depends on its module: imported names, `from __future__`), the code object defined at the
    same line found and the two compared."""
    code = fn.__code__
    lines, _ = inspect.findsource(code)
    module = compile("".join(lines), code.co_filename, "exec", dont_inherit=True)
    stock = [c for c in _nested_code(module) if c.co_name == code.co_name and c.co_firstlineno == code.co_firstlineno]
    return len(stock) == 1 and _same_code(stock[0], code)


def _nested_code(code):
    for c in code.co_consts:
        if inspect.iscode(c):
            yield c
            yield from _nested_code(c)


def check_target(module, cls, version: str, environ=None) -> None:
    """Everything we rely on, checked before anything is replaced. Raises PluginError naming what differs.

    The source of the target's own code is the authority, not the version string: vllm-omni images built from
    another commit call themselves e.g. 0.16.1.devN+g<sha> while carrying the same predictor code."""
    env = os.environ if environ is None else environ
    method = cls.__dict__.get(TARGET_METHOD)
    if method is None or not callable(method):
        raise PluginError(f"tts_predictor plugin: {TARGET_MODULE}.{TARGET_CLASS} has no method {TARGET_METHOD}")
    try:
        sig = inspect.signature(method, follow_wrapped=False)
    except (TypeError, ValueError) as e:
        raise PluginError(
            f"tts_predictor plugin: cannot read the signature of {TARGET_CLASS}.{TARGET_METHOD} ({e})"
        ) from e
    params = tuple((p.name, p.kind.name) for p in sig.parameters.values())
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
        logger.warning("tts_predictor plugin: %s=1, the source of %s in vllm-omni %s is NOT verified",
                       ENV_SKIP_SOURCE_CHECK, TARGET_CLASS, version)
        return
    for name, want in TARGET_SOURCE_SHA256.items():
        target = cls.__dict__.get(name)
        try:
            got = source_sha256(target)
        except (OSError, TypeError) as e:
            raise PluginError(
                f"tts_predictor plugin: cannot read the source of {TARGET_CLASS}.{name} in vllm-omni {version} to "
                f"verify it ({e}); set {ENV_SKIP_SOURCE_CHECK}=1 to run unverified"
            ) from e
        if got != want:
            raise PluginError(
                f"tts_predictor plugin: {TARGET_CLASS}.{name} differs from vllm-omni {SUPPORTED_VLLM_OMNI} "
                f"(installed vllm-omni {version}; sha256 {got[:12]}..., expected {want[:12]}...): the variants would "
                f"not reproduce it; set {ENV_SKIP_SOURCE_CHECK}=1 to run unverified"
            )
        try:
            same = runs_its_source(target)
        except (OSError, SyntaxError, ValueError) as e:
            raise PluginError(f"tts_predictor plugin: cannot compile the verified source of {TARGET_CLASS}.{name} "
                              f"again to compare it with the code that runs ({e})") from e
        if not same:
            raise PluginError(
                f"tts_predictor plugin: {TARGET_CLASS}.{name} runs other code than its verified 0.16.0 source (its "
                "code object differs from that source compiled again: a changed function under the stock file name "
                f"and line); set {ENV_SKIP_SOURCE_CHECK}=1 to run unverified"
            )
        if target.__globals__ is not module.__dict__ or target.__closure__ is not None:
            raise PluginError(
                f"tts_predictor plugin: {TARGET_CLASS}.{name} has the 0.16.0 source but is not {TARGET_MODULE}'s own "
                f"function (other globals or a closure): what it calls cannot be verified"
            )
    if version != SUPPORTED_VLLM_OMNI:
        logger.warning("tts_predictor plugin: vllm-omni %s is not %s, but %s and __init__ are the %s code "
                       "(source sha256 verified): accepted", version, SUPPORTED_VLLM_OMNI, TARGET_CLASS,
                       SUPPORTED_VLLM_OMNI)


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


def is_step_start(num_reqs, query_lens, seq_lens) -> bool:
    """The talker step's first predictor call: the prefill, query length 2 over a fresh 2-token sequence.

    In 0.16.0 the prefill has query_lens = seq_lens = 2 for every request and the 14 decodes seq_lens >= 3; the
    inputs are host tensors, so reading one element costs no device sync (a device tensor is never read here)."""
    try:
        if int(num_reqs) <= 0 or not seq_lens.is_cpu or not query_lens.is_cpu:
            return False
        return int(seq_lens[0]) == PREFILL_QUERY_LEN and int(query_lens[0]) == PREFILL_QUERY_LEN
    except (AttributeError, IndexError, TypeError, ValueError, RuntimeError):
        return False  # not the stock call pattern: no boundary here; the stock contract answers the call itself


class _CacheState:
    """What one _LocalPredictorKVCache runs: the arm and observe switch of its current step, and its step clock."""

    __slots__ = ("variant", "observe", "generation", "clock", "delay_s")

    def __init__(self, variant: str, observe: bool, generation: int, clock: StepClock, delay_s: float = 0.0):
        self.variant, self.observe, self.generation, self.clock = variant, observe, generation, clock
        self.delay_s = delay_s  # the positive control's extra host delay per call (control file host_delay_us)


class _Runtime:
    """The arms, the control channel and the counters of this process. Metrics are made on first use."""

    def __init__(self, impls: dict, variant: str, every: int, channel: ControlChannel | None):
        self.impls = impls
        self.static_variant = variant
        self.every = every
        self.channel = channel
        self.calls = 0
        self._labelled: dict[str, dict] = {}
        self._shared = None
        self._first_call_logged = False
        self._events_logged: set[str] = set()  # variants whose first observed call's sync events were logged
        self._lock = threading.Lock()

    # --- metrics ------------------------------------------------------------------------------------------------
    def metrics(self, variant: str) -> dict:
        m = self._labelled.get(variant)
        if m is None:
            with self._lock:
                m = self._labelled.get(variant)
                if m is None:
                    m = _labelled_metrics(variant, self.static_variant, self.channel)
                    self._labelled[variant] = m
        return m

    def shared(self):
        if self._shared is None:
            with self._lock:
                if self._shared is None:
                    self._shared = _shared_metrics(self.channel)
        return self._shared

    # --- per cache ----------------------------------------------------------------------------------------------
    def state_for(self, kv) -> _CacheState:
        st = getattr(kv, STATE_ATTR, None)
        if st is None:
            shared = self.shared()
            if self.channel is not None:
                s = self.channel.setting
                st = _CacheState(s.variant, s.observe, self.channel.generation, StepClock(shared["step"]),
                                 s.host_delay_us / 1e6)
            else:
                st = _CacheState(self.static_variant, True, 0, StepClock(shared["step"]))
            setattr(kv, STATE_ATTR, st)
            _record_attention(kv, shared["attention"])
        return st

    def step_start(self, st: _CacheState, num_reqs) -> None:
        """A talker step begins: take up a pending control change, then tick the step clock."""
        now = time.perf_counter()
        ch = self.channel
        if ch is not None:
            with self._lock:
                ch.at_step_boundary()
                setting, generation = ch.setting, ch.generation
            if st.generation != generation:
                st.variant, st.observe, st.generation = setting.variant, setting.observe, generation
                st.delay_s = setting.host_delay_us / 1e6
        st.clock.step_start(now, int(num_reqs), st.variant)

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

    # --- the method --------------------------------------------------------------------------------------------
    def wrap(self):
        rt = self

        def build_attn_metadata(self, *, num_reqs, query_lens, seq_lens):
            st = rt.state_for(self)
            if is_step_start(num_reqs, query_lens, seq_lens):
                rt.step_start(st, num_reqs)  # the only place the arm or the observe switch can change
            variant = st.variant
            impl = rt.impls[variant]
            with rt._lock:
                rt.calls += 1
                n = rt.calls
            observe = st.observe and rt.every > 0 and n % rt.every == 0
            if observe:
                with rt.observer_for(self).observe(device_tensors=[self._block_table]) as count:
                    out = impl(self, num_reqs=num_reqs, query_lens=query_lens, seq_lens=seq_lens)
                seconds = None  # an observed call is slowed by the observer: kept out of the time histogram
            else:
                t0 = time.perf_counter()
                out = impl(self, num_reqs=num_reqs, query_lens=query_lens, seq_lens=seq_lens)
                seconds = time.perf_counter() - t0
            if st.delay_s > 0:
                delayed = _spin(st.delay_s)
                if seconds is not None:
                    seconds += delayed
            tokens = int(out[1].shape[0])  # positions: one per query token; a shape, no device read
            m = rt.metrics(variant)
            if st.delay_s > 0:
                m["host_delay"].inc(delayed)
                m["host_delay_calls"].inc()
            m["calls"].inc()
            m["tokens"].inc(tokens)
            m["requests"].inc(max(int(num_reqs), 0))
            if seconds is not None:
                m["seconds"].observe(seconds)
            else:
                m["observed_calls"].inc()
                m["observed_tokens"].inc(tokens)
                m["syncs"].inc(count.syncs)
                if variant not in rt._events_logged:  # what was counted, once per variant and process: the
                    rt._events_logged.add(variant)  # first thing to read when a signature does not hold
                    logger.info("tts_predictor: first observed call of variant %r in pid %d: %d syncs over %d "
                                "tokens (%s)", variant, os.getpid(), count.syncs, tokens, ", ".join(count.events))
            if not rt._first_call_logged:
                rt._first_call_logged = True
                logger.info(
                    "tts_predictor: first %s call in pid %d runs variant %r (num_reqs=%d, tokens=%d, device=%s)",
                    TARGET_METHOD, os.getpid(), variant, int(num_reqs), tokens, self.device,
                )
            return out

        build_attn_metadata.__qualname__ = f"{TARGET_CLASS}.{TARGET_METHOD}"
        if self.channel is None:
            (impl,) = self.impls.values()
            build_attn_metadata.__doc__ = impl.__doc__
            build_attn_metadata.__wrapped__ = impl
            setattr(build_attn_metadata, MARK, self.static_variant)
        else:
            build_attn_metadata.__doc__ = "tts_predictor: the arm named by the control file, chosen per talker step."
            setattr(build_attn_metadata, MARK, CONTROLLED)
        build_attn_metadata.tts_runtime = self
        return build_attn_metadata


def _spin(seconds: float) -> float:
    """Busy-wait (a sleep's wake-up jitter is larger than the delays meant here); returns the time it took."""
    t0 = time.perf_counter()
    end = t0 + seconds
    while time.perf_counter() < end:
        pass
    return time.perf_counter() - t0


_METRICS = None
_SHARED = None


def _labelled_metrics(variant: str, start_variant: str, channel) -> dict:
    """The process's predictor metrics (created once, on prometheus_client's default registry), for `variant`."""
    global _METRICS
    from . import metrics as names

    with _lock:
        if _METRICS is None:
            _METRICS = names.make_predictor_metrics()
            try:  # not exported in multiprocess mode (prometheus_client keeps Info in-process)
                _METRICS.info.info({"variant": CONTROLLED if channel else start_variant, "backend": "vllm-omni",
                                    "pid": str(os.getpid()), "control": channel.file.path if channel else ""})
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
        "host_delay": m.host_delay.labels(variant=variant),
        "host_delay_calls": m.host_delay_calls.labels(variant=variant),
    }


def _shared_metrics(channel) -> dict:
    """Step clock, attention info and (with a control file) the control metrics: once per process."""
    global _SHARED
    from . import metrics as names

    with _lock:
        if _SHARED is None:
            _SHARED = {"step": names.make_step_metrics(), "attention": names.make_attention_info()}
            if channel is not None:
                channel.attach_metrics(names.make_control_metrics())
    return _SHARED


def _record_attention(kv, gauge) -> None:
    """Log and export which attention backend and metadata builder this cache hands its metadata to."""
    try:
        backends = sorted({b.get_name() for b in getattr(kv, "attn_backends", {}).values()})
        builders = sorted({type(b).__qualname__ for b in getattr(kv, "attn_metadata_builders", [])})
        backend, builder = ",".join(backends) or "unknown", ",".join(builders) or "unknown"
        gauge.labels(backend=backend, builder=builder).set(1)
        logger.info("tts_predictor: %s in pid %d uses attention backend %s, metadata builder %s (device %s)",
                    TARGET_CLASS, os.getpid(), backend, builder, getattr(kv, "device", "?"))
    except Exception as e:  # noqa: BLE001 - a label must never stop serving
        logger.warning("tts_predictor: could not name the attention backend (%s)", e)


def _omni_version() -> str:
    import vllm_omni

    return str(getattr(vllm_omni, "__version__", "unknown"))


def register() -> None:
    """vLLM general-plugin entry point. Idempotent within a process; raises PluginError to refuse."""
    variant = selected_variant()
    every = sample_every()
    try:
        channel = ControlChannel.from_env(logger)
    except ControlError as e:
        raise PluginError(f"tts_predictor plugin: {ENV_CONTROL}: {e}") from None
    control = channel.file.path if channel else None
    with _lock:
        if _installed:
            if (_installed["variant"], _installed["control"]) != (variant, control):
                raise PluginError(
                    f"tts_predictor plugin: this process already runs variant {_installed['variant']!r} "
                    f"(control {_installed['control']}), cannot switch to {variant!r} (control {control})"
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
    version = _omni_version()
    check_target(module, cls, version)
    if variant != "original" or channel is not None:
        platform = getattr(module, "current_omni_platform", None)
        if platform is not None and platform.is_npu():
            raise PluginError(
                f"tts_predictor plugin: variant {variant!r} / a control file: the layout variants implement the "
                "CUDA/CPU path only; this is an NPU"
            )
    from .variants import VARIANTS

    if channel is None:
        impls = {variant: current if variant == "original" else make_layout_method(VARIANTS[variant], module)}
        start = variant
    else:
        impls = {name: current if name == "original" else make_layout_method(fn, module)
                 for name, fn in VARIANTS.items()}
        start = channel.setting.variant
        if ENV_VARIANT in os.environ and variant != start:
            logger.warning("tts_predictor: %s=%s is overridden by the control file %s (variant %r)",
                           ENV_VARIANT, variant, control, start)
    runtime = _Runtime(impls, start, every, channel)
    wrapped = runtime.wrap()
    with _lock:
        setattr(cls, TARGET_METHOD, wrapped)
        _installed.update(variant=variant, control=control, runtime=runtime)
    logger.info(
        "tts_predictor: variant %r installed in %s.%s (pid %d, vllm-omni %s, sync sample 1/%s%s)",
        start, TARGET_CLASS, TARGET_METHOD, os.getpid(), version, every or "never",
        f", control file {control}: all variants ready, observe {channel.setting.observe}, epoch "
        f"{channel.setting.epoch}" if channel else "",
    )


def installed_variant() -> str | None:
    """The variant this process runs now (the control file's, when there is one), or None before register()."""
    rt = _installed.get("runtime")
    if rt is None:
        return None
    return rt.channel.setting.variant if rt.channel is not None else rt.static_variant


def installed_control() -> ControlChannel | None:
    """The control channel of this process, if register() installed one."""
    rt = _installed.get("runtime")
    return None if rt is None else rt.channel

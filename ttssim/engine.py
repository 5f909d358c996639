"""The simulated talker: an asyncio step loop with continuous batching that runs the real predictor variant.

Each step admits waiting requests (up to max_prefills_per_step, up to max_batch_size running), calls the variant 15
times on real tensors (the 0.16.0 block table, `device=observer.device`), measures that host time, then sleeps until
the step's modelled end (ttssim.model). Steps run on a deadline clock: a step that wakes a little late starts the
next one from its logical deadline, so sleep granularity does not accumulate into the mean step time; a step later
than `CATCH_UP_S` resets the clock and is counted as late. Frames are produced at the end of a step (its logical
deadline); after `initial_chunk_frames`, then every `chunk_frames` frames (and at the end) a PCM chunk reaches the
request ttssim.model.code2wav_delay_s after that deadline (then through the profile's code2wav decoder queue, if it
has one: ttssim.model.Code2WavDecoder). Three things keep deliveries on the model's time while the
loop also runs real work: they are scheduled at the absolute deadline + code2wav (not relative to a late wake-up or to
the PCM synthesis), every step first yields once so that handlers woken by a delivery write before the variant calls
hold the loop, and the sampled sync-observer call is put off by a step when a delivery falls due inside it.
The step clock (tts_predictor_step_interval_seconds / tts_predictor_step_batch_size) is the one the vLLM plugin
exports: one step's first predictor call to the next, while the engine stays busy.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch

from tts_predictor import metrics as M
from tts_predictor.control import ControlChannel
from tts_predictor.metrics import syncs_per_call
from tts_predictor.step_clock import StepClock
from tts_predictor.sync_observer import SyncObserver
from tts_predictor.variants import VARIANTS

from . import model as sim_model
from .audio import Voice
from .config import SimConfig, apply_hot

log = logging.getLogger("ttssim.engine")

CATCH_UP_S = 0.020
KILL_AFTER_CALL = 8  # kill_after_steps fault: SIGKILL after this many of the 15 calls of the step


class QueueFull(Exception):
    """The waiting queue is at its configured limit: the caller answers 503 at once."""


# vLLM 0.16.0's EngineDeadError text (vllm/v1/engine/exceptions.py): what a dead engine answers every request
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class EngineDead(Exception):
    """The step loop stopped with an error; nothing more will be produced."""


_ids = itertools.count(1)


@dataclass(eq=False)
class SpeechRequest:
    """One request inside the engine; `out` receives PCM chunks, then None (done) or an EngineDead."""

    text: str
    total_frames: int
    rows: np.ndarray
    id: int = field(default_factory=lambda: next(_ids))
    frames_done: int = 0
    frames_sent: int = 0
    t_submit: float = 0.0
    model_s: float | None = None  # modelled time since submit, while waiting for the first chunk
    aborted: bool = False
    finished: bool = False
    out: asyncio.Queue = field(default_factory=asyncio.Queue)


class EngineMetrics:
    """Engine and simulator metrics (names and help from tts_predictor.metrics)."""

    def __init__(self, registry, variant: str):
        from prometheus_client import Counter, Gauge, Histogram

        def c(name, labels=()):
            return Counter(name.removesuffix("_total"), M.HELP[name], list(labels), registry=registry)

        self.predictor = M.make_predictor_metrics(registry)
        self.use_variant(variant)
        self.step_clock = M.make_step_metrics(registry)  # the plugin's step clock, same definition (StepClock)
        self.steps = c(M.STEPS)
        self.step_seconds = Histogram(M.STEP_SECONDS, M.HELP[M.STEP_SECONDS], buckets=M.STEP_BUCKETS, registry=registry)
        self.batch = Histogram(M.BATCH_SIZE, M.HELP[M.BATCH_SIZE], buckets=M.BATCH_BUCKETS, registry=registry)
        self.running = Gauge(M.RUNNING, M.HELP[M.RUNNING], registry=registry)
        self.waiting = Gauge(M.WAITING, M.HELP[M.WAITING], registry=registry)
        self.frames = c(M.FRAMES)
        self.requests = c(M.ENGINE_REQUESTS, ["outcome"])
        self.modelled = c(M.SIM_MODELLED_SECONDS)
        self.stall = c(M.SIM_STALL_SECONDS)
        self.injected = c(M.SIM_INJECTED_SECONDS)
        self.observer = c(M.SIM_OBSERVER_SECONDS)
        self.late = c(M.SIM_LATE_STEPS)
        self.prefills = c(M.SIM_PREFILLS)
        self.ttfa_model = Histogram(M.SIM_TTFA_MODEL, M.HELP[M.SIM_TTFA_MODEL], buckets=M.TTFA_BUCKETS, registry=registry)
        self.ttfa_served = Histogram(M.SIM_TTFA_SERVED, M.HELP[M.SIM_TTFA_SERVED], buckets=M.TTFA_BUCKETS,
                                     registry=registry)
        self.deferred = c(M.SIM_DEFERRED_SAMPLES)
        self.faults = c(M.SIM_FAULTS, ["kind"])
        self.http = c(M.SIM_HTTP_REQUESTS, ["handler", "status"])

    def use_variant(self, variant: str) -> None:
        """Count the predictor calls from now on under `variant` (a control-file switch at a step boundary)."""
        p = self.predictor
        self.calls, self.seconds = p.calls.labels(variant), p.seconds.labels(variant)
        self.syncs, self.observed_calls = p.syncs.labels(variant), p.observed_calls.labels(variant)
        self.observed_tokens, self.tokens = p.observed_tokens.labels(variant), p.tokens.labels(variant)
        self.batch_requests = p.requests.labels(variant)


class Engine:
    """Continuous-batching step loop around one predictor variant."""

    def __init__(self, cfg: SimConfig, variant: str, device: str, registry, control: ControlChannel | None = None):
        if control is not None:  # the control file decides, from the first step (docs/control.md)
            variant = control.setting.variant
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
        self.cfg, self.variant = cfg, variant
        self.fn = VARIANTS[variant]
        self.control = control
        self.observe = True if control is None else control.setting.observe
        if control is not None:
            self._take_sim(control.setting)
        self.observer = SyncObserver(device)
        self.device = self.observer.device  # identity matters for the logical observer on CPU
        self.device_type = self.device.type
        m = cfg.model
        bps = (m.max_seq_len + m.block_size - 1) // m.block_size
        # like 0.16.0's _LocalPredictorKVCache: row i holds blocks i*bps .. i*bps+bps-1
        table = torch.arange(m.max_batch_size * bps, dtype=torch.int32).reshape(m.max_batch_size, bps)
        self.block_table = table.to(self.device) if self.device_type != "cpu" else table
        self.shapes = sim_model.call_shapes(m.max_seq_len)
        self.voice = Voice(cfg.audio)
        self.registry = registry
        self.metrics = EngineMetrics(registry, variant)
        self.noise = sim_model.StepNoise(m)
        self.decoder = sim_model.Code2WavDecoder(m)
        self.clock = StepClock(self.metrics.step_clock)  # fed at each step's end with its first call's time
        self._step_t0 = 0.0
        if control is not None:
            control.attach_metrics(M.make_control_metrics(registry))
        self.waiting: deque[SpeechRequest] = deque()
        self.running: list[SpeechRequest] = []
        self.step_index = 0
        self.dead: BaseException | None = None
        self._wake = asyncio.Event()
        self._inputs: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._mismatch_logged = False
        self._due: deque[float] = deque()  # loop times of scheduled chunk deliveries, in order
        self._sample_pending = False  # an observer sample was put off because a delivery was due
        self._observer_cost_s = 0.0  # last sample's host time: how long the next one will hold the loop

    # --- requests -------------------------------------------------------------------------------------------
    def submit(self, text: str, max_new_tokens: int, t_arrival: float | None = None) -> SpeechRequest:
        """Queue a request (never blocks). Raises QueueFull or EngineDead.

        `t_arrival` (event-loop time the HTTP handler started) makes the TTFA model count the real, measured
        request preparation (body read, JSON, ref_audio decode) like it counts the real variant time."""
        if self.dead is not None:
            raise EngineDead(str(self.dead))
        # the limit is on requests waiting for a batch slot: those the next step boundary admits do not count, so
        # whether the step loop has run since they arrived (event-loop timing) does not decide who gets a 503
        m = self.cfg.model
        starting = min(max(0, m.max_batch_size - len(self.running)), m.max_prefills_per_step)
        queued = max(0, len(self.waiting) - starting)
        if queued >= m.max_waiting:
            raise QueueFull(f"{queued} requests are waiting for a batch slot (limit {m.max_waiting})")
        n = self.voice.num_frames(text, max_new_tokens)
        req = SpeechRequest(text=text, total_frames=n, rows=self.voice.frame_index(text, n),
                            t_submit=asyncio.get_running_loop().time() if t_arrival is None else t_arrival)
        self.waiting.append(req)
        self.metrics.waiting.set(len(self.waiting))
        self._wake.set()
        return req

    def abort(self, req: SpeechRequest) -> None:
        """The client went away: drop the request at the next step boundary."""
        if not req.finished and not req.aborted:
            req.aborted = True
            self.metrics.requests.labels("aborted").inc()

    def die(self, message: str) -> None:
        """The ref_text_request=fatal fault: the engine is dead from now on, with vLLM's own log lines (vLLM 0.16.0
        v1/engine/core.py "EngineCore encountered a fatal error.", v1/engine/exceptions.py EngineDeadError)."""
        print("ERROR ttssim FAULT [core.py] EngineCore encountered a fatal error.", file=sys.stderr, flush=True)
        print(f"vllm.v1.engine.exceptions.EngineDeadError: {message}", file=sys.stderr, flush=True)
        self.dead = RuntimeError(message)
        for r in list(self.running) + list(self.waiting):
            r.out.put_nowait(EngineDead(message))
        self.running.clear()
        self.waiting.clear()

    # --- the step loop --------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Run steps until cancelled; on an internal error fail every request instead of leaving it waiting."""
        try:
            await self._loop()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - any engine failure must reach every waiting client
            log.exception("engine step loop failed")
            self.dead = e
            for r in list(self.running) + list(self.waiting):
                r.out.put_nowait(EngineDead(f"engine failed: {e}"))
            self.running.clear()
            self.waiting.clear()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        prev_end: float | None = None  # end of the previous step while busy: step time = end-to-end cadence
        mt = self.metrics
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                deadline = prev_end = None
                self.clock.idle()  # a gap of idleness is no step, however short
                await self._wake.wait()
            now = loop.time()
            # let handlers woken by a chunk delivery (same loop iteration as this wake-up) write it first
            await asyncio.sleep(0)
            if deadline is None:
                start = now
            elif now - deadline > CATCH_UP_S:
                start = now
                mt.late.inc()
            else:
                start = deadline  # absorb small wake-up lateness into this step's sleep
            admitted = self._admit(start)
            batch = len(self.running)
            if batch == 0:
                deadline = prev_end = None
                continue
            self._step_boundary()
            variant_s, syncs, call_s = self._predictor_calls(batch)
            m = self.cfg.model
            noise = self.noise.factor(start)
            rest = sim_model.modelled_rest_s(m, batch, admitted, noise)
            stall = syncs * sim_model.stall_per_sync_s(m, self.device_type)
            target = sim_model.step_target_s(m, batch, admitted, variant_s, syncs, self.device_type, noise)
            deadline = start + target
            self._observe_sample(batch, loop)
            for r in self.running:
                if r.model_s is not None and r.frames_sent == 0:
                    r.model_s += target
            # always yield, even when late: chunk deliveries and HTTP handlers run in this gap
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            end = loop.time()
            # every counter of a step moves here, between two yields: a scrape never sees a step's calls without it
            self._count_calls(batch, call_s)
            self.clock.step_start(self._step_t0, batch, self.variant)
            mt.steps.inc()
            # from the previous step's end, so the bookkeeping between steps (counters, chunks) is in the step time
            mt.step_seconds.observe(end - (now if prev_end is None else prev_end))
            prev_end = end
            mt.batch.observe(batch)
            mt.modelled.inc(rest)
            mt.stall.inc(stall)
            mt.injected.inc(target - (rest + variant_s + stall))
            mt.prefills.inc(admitted)
            self._produce(loop, deadline, batch)
            self.step_index += 1

    def _step_boundary(self) -> None:
        """Take up a control-file change before the step's first call: the whole step runs one variant."""
        if self.control is None or not self.control.at_step_boundary():
            return
        setting = self.control.setting
        self.observe = setting.observe
        self._take_sim(setting)
        if setting.variant != self.variant:
            self.variant, self.fn = setting.variant, VARIANTS[setting.variant]
            self.metrics.use_variant(setting.variant)
            self._mismatch_logged = False

    def _take_sim(self, setting) -> None:
        """The control file's "sim" object: the hot-swappable known-answer settings (ttssim.config.HOT_SETTINGS)."""
        if "sim" not in setting.extra:
            return
        try:
            self.cfg = apply_hot(self.cfg, setting.extra["sim"])
        except ValueError as e:
            log.error("control file: \"sim\" refused, the simulator keeps its settings: %s", e)

    def _admit(self, start: float) -> int:
        self.running = [r for r in self.running if not r.aborted]
        admitted = 0
        m = self.cfg.model
        while self.waiting and len(self.running) < m.max_batch_size and admitted < m.max_prefills_per_step:
            r = self.waiting.popleft()
            if r.aborted:
                continue
            self.running.append(r)
            r.model_s = max(0.0, start - r.t_submit)
            admitted += 1
        self.metrics.waiting.set(len(self.waiting))
        self.metrics.running.set(len(self.running))
        return admitted

    def _call_inputs(self, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """query_lens/seq_lens of the 15 calls at this batch size (built outside the timed region, as in 0.16.0)."""
        cached = self._inputs.get(batch)
        if cached is None:
            cached = [
                (torch.full((batch,), q, dtype=torch.int32), torch.full((batch,), s, dtype=torch.int32))
                for q, s in self.shapes
            ]
            if len(self._inputs) > 64:
                self._inputs.clear()
            self._inputs[batch] = cached
        return cached

    def _predictor_calls(self, batch: int) -> tuple[float, float, list[float]]:
        """The 15 real calls; returns (host seconds, syncs by the closed form, seconds of each call)."""
        bs, kill = self.cfg.model.block_size, self.cfg.faults.kill_after_steps
        syncs, call_s = 0, []
        self._step_t0 = time.perf_counter()  # the step clock's step start: its first predictor call
        for i, (ql, sl) in enumerate(self._call_inputs(batch)):
            if kill is not None and self.step_index >= kill and i == KILL_AFTER_CALL:
                _kill_self(self.step_index, i)
            t0 = time.perf_counter()
            self.fn(ql, sl, self.block_table, block_size=bs, device=self.device)
            call_s.append(time.perf_counter() - t0)
            syncs += syncs_per_call(self.variant, batch * self.shapes[i][0])
        return sum(call_s), syncs, call_s

    def _count_calls(self, batch: int, call_s: list[float]) -> None:
        mt = self.metrics
        for (q, _), dt in zip(self.shapes, call_s, strict=True):
            mt.calls.inc()
            mt.seconds.observe(dt)
            mt.tokens.inc(batch * q)
            mt.batch_requests.inc(batch)

    def _observe_sample(self, batch: int, loop: asyncio.AbstractEventLoop) -> None:
        """Every Nth step, re-run one (or all 15) calls under the sync observer: the observer costs 3-7x a call.

        The sample is a shadow call outside the step's measured work, so its timing is free: when a chunk delivery
        falls due while it would hold the loop, it moves to the next step (counted) instead of delaying the audio.
        With a control file the observer runs only while the file says so (the load generator's untimed count
        phases), so it samples every step then: a short count phase still sees its variant's signature."""
        every = 1 if self.control is not None else self.cfg.server.sync_sample_every_steps
        if not self.observe or (self.step_index % every and not self._sample_pending):
            return
        now = loop.time()
        while self._due and self._due[0] <= now:
            self._due.popleft()
        if self._due and self._due[0] <= now + 1.5 * self._observer_cost_s + 5e-4:
            if not self._sample_pending:
                self.metrics.deferred.inc()
            self._sample_pending = True
            return
        self._sample_pending = False
        inputs = self._call_inputs(batch)
        if self.cfg.server.sync_sample_calls == "all":
            picks = range(len(inputs))
        else:
            picks = [(self.step_index // every) % len(inputs)]
        mt, bs = self.metrics, self.cfg.model.block_size
        t0 = time.perf_counter()
        for i in picks:
            ql, sl = inputs[i]
            with self.observer.observe(device_tensors=[self.block_table]) as count:
                self.fn(ql, sl, self.block_table, block_size=bs, device=self.device)
            tokens = batch * self.shapes[i][0]
            mt.syncs.inc(count.syncs)
            mt.observed_calls.inc()
            mt.observed_tokens.inc(tokens)
            expected = syncs_per_call(self.variant, tokens)
            if count.syncs != expected and not self._mismatch_logged:
                self._mismatch_logged = True
                log.warning("sync observer saw %d syncs where the closed form says %d (%s, T=%d)",
                            count.syncs, expected, self.variant, tokens)
        self._observer_cost_s = time.perf_counter() - t0
        mt.observer.inc(self._observer_cost_s)

    def _produce(self, loop: asyncio.AbstractEventLoop, step_end: float, batch: int) -> None:
        """One frame for every running request; hand out chunks at step_end + code2wav; retire finished requests."""
        delay = sim_model.code2wav_delay_s(self.cfg.model, batch)
        still = []
        produced = 0
        for r in self.running:
            if r.aborted:
                continue
            r.frames_done += 1
            produced += 1
            done = r.frames_done >= r.total_frames
            if sim_model.chunk_due(r.frames_done, r.frames_sent, r.total_frames, self.cfg.audio):
                at = self.decoder.pcm_at(step_end + delay, r.frames_sent == 0)
                if r.frames_sent == 0:
                    self.metrics.ttfa_model.observe(r.model_s + at - step_end)
                pcm = self.voice.pcm(r.rows[r.frames_sent:r.frames_done])
                r.frames_sent = r.frames_done
                loop.call_at(at, _deliver, r.out, pcm, done)
                if not self._due or self._due[-1] != at:
                    self._due.append(at)
            if done:
                r.finished = True
                self.metrics.requests.labels("ok").inc()
            else:
                still.append(r)
        self.metrics.frames.inc(produced)
        self.running = still
        self.metrics.running.set(len(self.running))


def _deliver(out: asyncio.Queue, pcm: bytes, done: bool) -> None:
    out.put_nowait(pcm)
    if done:
        out.put_nowait(None)


def _kill_self(step: int, call: int) -> None:
    """Fault injection: die like an OOM-killed worker, mid-step, with no cleanup."""
    print(f"ttssim FAULT: SIGKILL in the middle of step {step} (after call {call} of 15)", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)

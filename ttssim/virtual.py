"""The engine's rules replayed in virtual time: what a configuration predicts for a closed-loop benchmark, in
milliseconds of CPU instead of minutes of wall clock.

Same rules as ttssim.engine (FIFO admission at step boundaries up to max_batch_size and max_prefills_per_step, a
step time from ttssim.model, one frame per running request per step, chunks by ttssim.model.chunk_due delivered
code2wav_delay_s after the step, through ttssim.model.Code2WavDecoder's queue where the profile has one), but the predictor's host time comes from a function of the batch (by default the
H100 function benchmark, ttssim.model.gpu_host_variant_step_s) instead of running the variant. The fit uses it to
search parameters; the fidelity benchmark compares it with the real simulator and with the public numbers.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from . import model as sim_model
from .config import SimConfig


@dataclass(frozen=True)
class Workload:
    """A closed-loop benchmark like `vllm bench serve --max-concurrency c --request-rate inf`: `warmups` requests
    first (not measured), then `requests` measured ones; request i asks for frames[i % len(frames)] frames."""

    concurrency: int
    requests: int
    frames: tuple[int, ...]
    warmups: int = 0


@dataclass
class Outcome:
    """One measured request as a client sees it (seconds since its send)."""

    frames: int
    ttfa_s: float
    e2e_s: float


@dataclass
class VirtualRun:
    outcomes: list[Outcome]
    duration_s: float  # first measured send -> last measured response
    steps: int = 0
    step_time_s: float = 0.0  # sum of step durations while measured requests ran
    batch_sum: int = 0  # sum of batch sizes over those steps
    step_log: list[tuple[int, int, float]] = field(default_factory=list)  # (batch, admitted, seconds) per step


def run(cfg: SimConfig, load: Workload, variant: str = "original",
        variant_step_s: Callable[[str, int], float] = sim_model.gpu_host_variant_step_s,
        keep_steps: bool = False, seed: int = 0) -> VirtualRun:
    """Replay `load` against `cfg`; deterministic (no clock; the host noise, if the profile has one, from `seed`)."""
    m, a = cfg.model, cfg.audio
    clients = _Clients(load)
    waiting: deque[int] = deque()
    running: list[list[int]] = []  # [id, frames_done, frames_sent, total_frames]
    first_t: dict[int, float] = {}
    deliveries: list[tuple[float, int, int, bool]] = []  # (time, seq, id, last chunk)
    seq = 0
    noise = sim_model.StepNoise(m, seed)
    decoder = sim_model.Code2WavDecoder(m)
    res = VirtualRun([], 0.0)
    clients.start(0.0)
    t = 0.0
    while True:
        while deliveries and deliveries[0][0] <= t:
            at, _, rid, last = heapq.heappop(deliveries)
            first_t.setdefault(rid, at)
            if last:
                clients.done(rid, at, first_t[rid], res)
        waiting.extend(clients.arrivals_until(t))
        if not running and not waiting:
            nxt = [x for x in (clients.next_send(), deliveries[0][0] if deliveries else None) if x is not None]
            if not nxt:
                break
            t = max(t, min(nxt))
            continue
        admitted = 0
        while waiting and len(running) < m.max_batch_size and admitted < m.max_prefills_per_step:
            rid = waiting.popleft()
            running.append([rid, 0, 0, clients.frames[rid]])
            admitted += 1
        batch = len(running)
        dur = sim_model.step_target_s(m, batch, admitted, variant_step_s(variant, batch), 0, "cuda", noise.factor(t))
        t += dur
        if clients.measuring:
            res.steps += 1
            res.batch_sum += batch
            res.step_time_s += dur
        if keep_steps:
            res.step_log.append((batch, admitted, dur))
        delay = sim_model.code2wav_delay_s(m, batch)
        still = []
        for r in running:
            r[1] += 1
            if sim_model.chunk_due(r[1], r[2], r[3], a):
                at = decoder.pcm_at(t + delay, r[2] == 0)
                r[2] = r[1]
                heapq.heappush(deliveries, (at, seq, r[0], r[1] >= r[3]))
                seq += 1
            if r[1] < r[3]:
                still.append(r)
        running = still
    res.duration_s = clients.last_end - clients.measure_start if clients.measure_start is not None else 0.0
    return res


# a profile with host noise (ttssim.model.StepNoise) is replayed with at least NOISE_REQUESTS measured requests per
# seed over NOISE_SEEDS pooled (the same seeds every time): its quantiles are then the model's, not one draw's
NOISE_REQUESTS = 240
NOISE_SEEDS = (0, 1)


def closed_loop(cfg: SimConfig, concurrency: int, frames: Sequence[int], requests: int, variant: str = "fixed",
                variant_step_s: Callable[[str, int], float] = sim_model.gpu_host_variant_step_s) -> list[VirtualRun]:
    """A closed loop at `concurrency` (as many warm-up requests first) over the request lengths `frames` in turn:
    one run of `requests` for a noiseless profile, NOISE_SEEDS runs of max(requests, NOISE_REQUESTS) otherwise."""
    if cfg.model.step_noise_sd <= 0:
        return [run(cfg, Workload(concurrency, requests, tuple(frames), concurrency), variant, variant_step_s)]
    load = Workload(concurrency, max(requests, NOISE_REQUESTS), tuple(frames), concurrency)
    return [run(cfg, load, variant, variant_step_s, seed=seed) for seed in NOISE_SEEDS]


class _Clients:
    """Closed-loop senders with a concurrency limit: warm-up requests first (all finished before the measured
    phase starts, like vllm bench serve's warm-up gather), then the measured requests."""

    def __init__(self, load: Workload):
        self.load = load
        self.phases = [n for n in (load.warmups, load.requests) if n]
        self.measured_phase = len(self.phases) - 1
        self.phase = 0
        self.sent = self.finished = 0
        self.sends: list[tuple[float, int]] = []
        self.send_t: dict[int, float] = {}
        self.frames: dict[int, int] = {}
        self.measured: set[int] = set()
        self.next_id = 0
        self.measure_start: float | None = None
        self.last_end = 0.0

    @property
    def measuring(self) -> bool:
        return self.phase == self.measured_phase and self.measure_start is not None

    def start(self, at: float) -> None:
        for _ in range(min(self.load.concurrency, self.phases[self.phase])):
            self._send(at)

    def _send(self, at: float) -> None:
        rid = self.next_id
        self.next_id += 1
        self.sent += 1
        if self.phase == self.measured_phase:
            self.measured.add(rid)
            k = self.sent - 1
            if self.measure_start is None:
                self.measure_start = at
        else:
            k = 0  # vllm bench serve warms up with its first prompt
        self.frames[rid] = self.load.frames[k % len(self.load.frames)]
        heapq.heappush(self.sends, (at, rid))

    def next_send(self) -> float | None:
        return self.sends[0][0] if self.sends else None

    def arrivals_until(self, t: float) -> list[int]:
        out = []
        while self.sends and self.sends[0][0] <= t:
            at, rid = heapq.heappop(self.sends)
            self.send_t[rid] = at
            out.append(rid)
        return out

    def done(self, rid: int, at: float, first: float, res: VirtualRun) -> None:
        if rid in self.measured:
            res.outcomes.append(Outcome(self.frames[rid], first - self.send_t[rid], at - self.send_t[rid]))
            self.last_end = max(self.last_end, at)
        self.finished += 1
        if self.sent < self.phases[self.phase]:
            self._send(at)
        elif self.finished == self.phases[self.phase] and self.phase < len(self.phases) - 1:
            self.phase += 1
            self.sent = self.finished = 0
            self.start(at)


def median(values: Sequence[float]) -> float:
    v = sorted(values)
    n = len(v)
    if not n:
        return float("nan")
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

"""The load schedule: which step and phase a run is in at time t, and what happens at each phase edge. Pure, so it is
tested without Locust.

A level runs count -> warmup -> measure -> drain. The count phase exists only where the load generator holds the
server's control file: at its start the control file turns the sync observer on (and names the window's variant:
the hot-swap switch of a window happens at its first count phase), the runner waits until the server's epoch gauge
shows the write, then snapshots the counters; at its end it snapshots again and turns the observer off, so the
timing window after the warm-up runs with zero observed calls.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ttsrecords.scenario import Scenario, Step


@dataclass(frozen=True)
class Phase:
    """Where the run stands: published to every worker so each request is tagged at its start."""

    step: int
    concurrency: int
    phase: str  # count | warmup | measure | drain (ttsrecords.records.PHASES)
    users: int  # Locust users for this step (closed loop: = concurrency)
    rate: float | None  # open loop: arrivals per second, all workers together
    started: float  # run time (s) at which this phase began
    ends: float  # run time (s) at which it ends

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def users_for(step: Step, loop: str) -> int:
    return step.concurrency if loop == "closed" else int(step.users or min(step.concurrency, 32))


class Schedule:
    """Steps back to back, each count -> warm-up -> measure -> drain; a zero-length phase is skipped, and so is every
    count phase when `count` is False (no control file: nothing could switch the observer)."""

    def __init__(self, scenario: Scenario, count: bool = True):
        self.scenario = scenario
        self._phases: list[Phase] = []
        t = 0.0
        for s in scenario.steps:
            for name, length in (("count", s.count_s if count else 0.0), ("warmup", s.warmup_s),
                                 ("measure", s.measure_s), ("drain", s.drain_s)):
                if length <= 0:
                    continue
                self._phases.append(Phase(s.index, s.concurrency, name, users_for(s, scenario.loop), s.rate, t, t + length))
                t += length
        self.duration_s = t

    @property
    def phases(self) -> tuple[Phase, ...]:
        return tuple(self._phases)

    def at(self, t: float) -> Phase | None:
        """The phase running at run time t, or None once the schedule is over."""
        for p in self._phases:
            if p.started <= t < p.ends:
                return p
        return None


class PhaseTracker:
    """Turns ticks into phase transitions (so scrapes and broadcasts happen once per edge, not per tick)."""

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.current: Phase | None = None

    def tick(self, t: float) -> tuple[Phase | None, list[tuple[Phase | None, Phase | None]]]:
        """Return the phase at t and the transitions (old, new) crossed since the last tick, in order.

        Ticks come about once a second, so a phase shorter than that could be jumped over; its edges are
        still reported so the measure window of every step gets its start and end scrape.
        """
        new = self.schedule.at(t)
        if new == self.current:
            return new, []
        phases = self.schedule.phases
        old = self.current
        i = phases.index(old) + 1 if old is not None else 0
        j = phases.index(new) if new is not None else len(phases)
        seq: list[Phase | None] = [old, *phases[i:j], new] if j >= i else [old, new]
        self.current = new
        return new, list(zip(seq[:-1], seq[1:], strict=True))


class PhaseHold:
    """Keeps a phase open past its scheduled end while what must happen in it has, for certain, not happened yet:
    a count phase until the sync observer has seen a predictor call (on the real CPU server a c=1 stream now and
    then stalls for 40 s, and a count window without a call has nothing to verify), and the warm-up after a count
    phase until the server has shown the observer-off write (a scrape of a busy CPU server took up to 44 s, and the
    measure window must not open with the observer on). `ready(phase)` answers: False holds; True, or None (cannot
    be known: a failed probe, no control channel), lets the phase end. The schedule runs on run time less the holds,
    so every later phase keeps its length. At most `limit_s` per phase (the request timeout: a serving engine makes
    a predictor call, and applies a control write, within one request's time)."""

    HELD = ("count", "warmup")

    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.held_s = 0.0
        self.by_phase: dict[tuple[int, str], float] = {}  # (step, phase) -> how long it was held past its end

    def schedule_time(self, run_time: float, current: Phase | None,
                      ready: Callable[[Phase], bool | None] | None) -> float:
        """The schedule's time at `run_time`; `ready` is asked only at a due end of a phase that can be held."""
        t = run_time - self.held_s
        if current is None or current.phase not in self.HELD or t < current.ends or ready is None:
            return t
        key = (current.step, current.phase)
        held = self.by_phase.get(key, 0.0)
        if held >= self.limit_s or ready(current) is not False:
            return t
        extra = t - current.ends + 1e-3  # just inside the phase again
        self.held_s += extra
        self.by_phase[key] = held + extra
        return run_time - self.held_s

    @classmethod
    def most_s(cls, scenario: Scenario, limit_s: float, count: bool = True) -> float:
        """The longest the holds can make one window's load: every holdable phase of every level held to the limit
        (nothing is held without count phases). The runner's watchdog allows for it."""
        return len(scenario.steps) * len(cls.HELD) * limit_s if count else 0.0

    def record(self) -> dict[str, float]:
        """For the run manifest: {"<step>/<phase>": seconds held}."""
        return {f"{k[0]}/{k[1]}": round(v, 3) for k, v in sorted(self.by_phase.items())}


# --- what happens at a phase edge -------------------------------------------------------------------------------

WRITE, CONFIRM, SNAPSHOT = "control", "confirm", "snapshot"


@dataclass(frozen=True)
class EdgeAction:
    """One thing the load generator does at a phase edge, in order: write the control file (observe on/off, epoch),
    wait until the server's epoch gauge shows `epoch` (confirm), or snapshot the counters at `edge`."""

    kind: str  # WRITE | CONFIRM | SNAPSHOT
    step: int
    concurrency: int
    phase: str | None = None  # WRITE: the phase that begins with the write
    edge: str | None = None  # SNAPSHOT: ttsrecords.records.EDGES
    observe: bool | None = None  # WRITE
    epoch: int | None = None  # WRITE, CONFIRM


def count_epoch(base: int, step: int, observe: bool) -> int:
    """The epoch of a window's control write: two per level (observer on at the count edge, off at the warm-up edge),
    after the window's base, so every write of a server start has a new, increasing epoch."""
    return base + 2 * step + (1 if observe else 2)


def epochs_per_window(levels: int) -> int:
    return 2 * levels


def edge_actions(old: Phase | None, new: Phase | None, epoch_base: int | None) -> list[EdgeAction]:
    """The actions of one transition old -> new: first those that close `old`, then those that open `new`.

    Leaving a count phase: the observer off (epoch base+2s+2), confirm it, then snapshot count_end (every observed call
    of the window is in it; on the real CPU server one scrape took 15 s, which must not keep the observer on into the
    warm-up). Leaving measure: snapshot end.
    Entering a count phase: the observer on with the window's variant (epoch base+2s+1), confirm it, snapshot
    count_start. Entering measure: snapshot start. Without a control file (epoch_base None) there are no count phases,
    so only the measure snapshots remain."""
    out: list[EdgeAction] = []
    if old is not None and old.phase == "count":
        if epoch_base is not None:  # the observer off first: a slow scrape must not keep it on into the warm-up
            epoch = count_epoch(epoch_base, old.step, False)
            out.append(EdgeAction(WRITE, old.step, old.concurrency, phase=new.phase if new else "warmup",
                                  observe=False, epoch=epoch))
            out.append(EdgeAction(CONFIRM, old.step, old.concurrency, epoch=epoch))
        out.append(EdgeAction(SNAPSHOT, old.step, old.concurrency, edge="count_end"))
    if old is not None and old.phase == "measure":
        out.append(EdgeAction(SNAPSHOT, old.step, old.concurrency, edge="end"))
    if new is not None and new.phase == "count":
        if epoch_base is not None:
            epoch = count_epoch(epoch_base, new.step, True)
            out.append(EdgeAction(WRITE, new.step, new.concurrency, phase="count", observe=True, epoch=epoch))
            out.append(EdgeAction(CONFIRM, new.step, new.concurrency, epoch=epoch))
        out.append(EdgeAction(SNAPSHOT, new.step, new.concurrency, edge="count_start"))
    if new is not None and new.phase == "measure":
        out.append(EdgeAction(SNAPSHOT, new.step, new.concurrency, edge="start"))
    return out

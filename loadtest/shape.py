"""The load schedule: which step and phase a run is in at time t. Pure, so it is tested without Locust."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.scenario import Scenario, Step


@dataclass(frozen=True)
class Phase:
    """Where the run stands: published to every worker so each request is tagged at its start."""

    step: int
    concurrency: int
    phase: str  # warmup | measure | drain
    users: int  # Locust users for this step (closed loop: = concurrency)
    rate: float | None  # open loop: arrivals per second, all workers together
    started: float  # run time (s) at which this phase began
    ends: float  # run time (s) at which it ends

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def users_for(step: Step, loop: str) -> int:
    return step.concurrency if loop == "closed" else int(step.users or min(step.concurrency, 32))


class Schedule:
    """Steps back to back, each warm-up -> measure -> drain; a zero-length phase is skipped."""

    def __init__(self, scenario: Scenario):
        self.scenario = scenario
        self._phases: list[Phase] = []
        t = 0.0
        for s in scenario.steps:
            for name, length in (("warmup", s.warmup_s), ("measure", s.measure_s), ("drain", s.drain_s)):
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

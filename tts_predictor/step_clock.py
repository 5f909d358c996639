"""The talker step clock: the same definition in the real server (plugin) and in the simulator.

A step starts with its first code-predictor call (the prefill). The interval between two consecutive step starts is
the earlier step's duration as the server lived it (talker forward, code predictor, sampling, scheduling: all of
it); it is labelled by the variant that ran that earlier step. A gap of `metrics.STEP_IDLE_S` or more means the
talker was idle: not a step, so not counted (the next step starts a new busy period). Every step's batch (requests)
is counted under the variant that runs it, so intervals = steps - busy periods.
"""

from __future__ import annotations

from .metrics import STEP_IDLE_S


class StepClock:
    """Feed it every step start; it observes `metrics.StepMetrics` (interval and batch histograms)."""

    def __init__(self, step_metrics=None, idle_s: float = STEP_IDLE_S):
        self.metrics = step_metrics
        self.idle_s = idle_s
        self._last_t: float | None = None
        self._last_variant: str | None = None
        self._children: dict = {}
        self.steps = 0
        self.intervals = 0

    def _child(self, which: str, variant: str):
        key = (which, variant)
        child = self._children.get(key)
        if child is None:
            child = getattr(self.metrics, which).labels(variant=variant)
            self._children[key] = child
        return child

    def idle(self) -> None:
        """The talker went idle (a server that knows it, like the simulator): the next step starts a new busy period
        whatever the gap. The plugin cannot know it and relies on the idle threshold alone."""
        self._last_t = None

    def step_start(self, now: float, batch: int, variant: str) -> float | None:
        """Record a step that starts at `now` (seconds, monotonic); returns the interval it closed, if any."""
        interval = None
        if self._last_t is not None and 0.0 <= now - self._last_t < self.idle_s:
            interval = now - self._last_t
            self.intervals += 1
            if self.metrics is not None:
                self._child("interval", self._last_variant).observe(interval)
        self.steps += 1
        if self.metrics is not None:
            self._child("batch", variant).observe(batch)
        self._last_t, self._last_variant = now, variant
        return interval

"""Server counters: /metrics scraped at both edges of every measure phase and of every count phase, stored raw and as
per-window deltas (CounterDelta, window "measure" or "count").

`parse_metrics` is the suite's one Prometheus text parser (prometheus_client's, keyed by `sample_key`); the tools and
tests use it too. Metric names come only from tts_predictor.metrics. A failed scrape is written as a snapshot with
ok=false and makes the step's delta null, it never stops the run. HTTP goes through httpx.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tts_predictor import metrics as m
from tts_predictor.domain import CALLS_PER_STEP
from ttsrecords.records import CounterDelta, CounterSnapshot
from ttsrecords.samples import by_label, gauge, sample_key, total


def parse_metrics(text: str) -> tuple[dict[str, float], list[tuple[str, dict[str, str], float]]]:
    """Samples of an exposition, keyed by sample_key; `_created` timestamps are dropped (not counters)."""
    flat: dict[str, float] = {}
    rows = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            flat[sample_key(s.name, s.labels)] = float(s.value)
            rows.append((s.name, dict(s.labels), float(s.value)))
    return flat, rows


def samples(text: str) -> dict[str, float]:
    """Just the {sample_key: value} mapping of an exposition (see parse_metrics)."""
    return parse_metrics(text)[0]


def _diff(a: float | None, b: float | None) -> float | None:
    if b is None:  # not exposed at the end: unknown
        return None
    if a is None:  # a labelled child appears on first use: it started from zero inside the window
        a = 0.0
    if b < a:  # counter reset (server restarted): unknown
        return None
    return b - a


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def variants_moved(start_rows, end_rows) -> list[str]:
    """Every variant label whose predictor calls moved between two scrapes, most calls first."""
    a, b = by_label(start_rows, m.CALLS, "variant"), by_label(end_rows, m.CALLS, "variant")
    moved = {v: b[v] - a.get(v, 0.0) for v in b if b[v] - a.get(v, 0.0) > 0}
    return sorted(moved, key=lambda v: (-moved[v], v))


def _int(x: float | None) -> int | None:
    return None if x is None else int(x)


def _bool(x: float | None) -> bool | None:
    return None if x is None else bool(x)


def compute_delta(start_rows, end_rows, *, duration_s: float | None, variant_hint: str | None) -> dict[str, Any]:
    """Differences of the predictor/engine counters over one window and the ratios the statistics compare, which
    variants' calls moved in it, the control channel's gauges at both edges and the step clock over it.

    start_rows None means one edge's scrape failed: every difference is unknown (variant: the hint).
    """
    failed = start_rows is None
    start_rows = start_rows or []
    d = {key: None if failed else _diff(total(start_rows, name), total(end_rows, name)) for key, name in (
        ("calls", m.CALLS), ("seconds", m.SECONDS + "_sum"), ("syncs", m.SYNCS),
        ("observed_calls", m.OBSERVED_CALLS), ("observed_tokens", m.OBSERVED_TOKENS), ("tokens", m.TOKENS),
        ("batch_requests", m.REQUESTS), ("steps", m.STEPS), ("step_seconds", m.STEP_SECONDS + "_sum"),
        ("frames", m.FRAMES), ("requests_finished", m.ENGINE_REQUESTS),
    )}
    clock = {key: None if failed else _diff(total(start_rows, name), total(end_rows, name)) for key, name in (
        ("step_interval_count", m.STEP_INTERVAL + "_count"), ("step_interval_sum", m.STEP_INTERVAL + "_sum"),
        ("step_batch_count", m.STEP_BATCH + "_count"), ("step_batch_sum", m.STEP_BATCH + "_sum"),
    )}
    moved = [] if failed else variants_moved(start_rows, end_rows)
    variant = moved[0] if moved else (variant_hint if failed else None)
    steps = d["steps"]
    if steps is None and d["calls"] is not None:  # vllm-omni has no engine counters: 15 predictor calls per step
        steps = d["calls"] / CALLS_PER_STEP
    per_call = _ratio(d["syncs"], d["observed_calls"])
    calls_per_step = _ratio(d["calls"], steps)
    return {
        "duration_s": duration_s,
        "variant": variant,
        **d,
        "steps": steps,
        "syncs_per_call": per_call,
        "syncs_per_step": per_call * calls_per_step if per_call is not None and calls_per_step is not None else None,
        "calls_per_request": _ratio(d["calls"], d["requests_finished"]),
        "seconds_per_request": _ratio(d["seconds"], d["requests_finished"]),
        "mean_batch": _ratio(d["batch_requests"], d["calls"]),
        "variants_moved": tuple(moved),
        "epoch_start": None if failed else _int(gauge(start_rows, m.CONTROL_EPOCH)),
        "epoch_end": _int(gauge(end_rows, m.CONTROL_EPOCH)),
        "observe_start": None if failed else _bool(gauge(start_rows, m.OBSERVE_ENABLED)),
        "observe_end": _bool(gauge(end_rows, m.OBSERVE_ENABLED)),
        **clock,
    }


def http_get(url: str, timeout_s: float) -> str:
    r = httpx.get(url, timeout=timeout_s)
    r.raise_for_status()
    return r.text


# snapshot edge -> (window, "open" | "close")
WINDOW_EDGES = {"start": ("measure", "open"), "end": ("measure", "close"), "count_start": ("count", "open"),
                "count_end": ("count", "close")}


class Scraper:
    """Scrapes every target at an edge and appends lines to counters.jsonl through `write`: a snapshot per target,
    and at a closing edge (end, count_end) the window's delta against its opening edge."""

    def __init__(self, targets: list[str], write: Callable[[dict], None], *, variant_hint: str | None = None,
                 fetch: Callable[[str, float], str] = http_get, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.time):
        self.targets = list(targets)
        self._write, self._fetch, self._timeout, self._clock = write, fetch, timeout_s, clock
        self.variant_hint = variant_hint
        self._starts: dict[tuple[int, str, str], tuple[float, list | None]] = {}

    def scrape(self, step: int, concurrency: int, edge: str) -> None:
        for target in self.targets:
            self._scrape_one(step, concurrency, edge, target)

    def _scrape_one(self, step: int, concurrency: int, edge: str, target: str) -> None:
        t = self._clock()
        rows = None
        error = None
        flat: dict[str, float] = {}
        try:
            flat, rows = parse_metrics(self._fetch(target, self._timeout))
        except Exception as e:  # unreachable server, bad text, HTTP error: recorded, never fatal
            error = f"{type(e).__name__}: {str(e)[:200]}"
        self._write(CounterSnapshot(step=step, concurrency=concurrency, edge=edge, t=t, target=target,
                                    ok=error is None, error=error, samples=flat).to_dict())
        window, side = WINDOW_EDGES[edge]
        if side == "open":
            self._starts[(step, target, window)] = (t, rows)
            return
        t0, start_rows = self._starts.pop((step, target, window), (None, None))
        if start_rows is not None and rows is not None:
            delta = compute_delta(start_rows, rows, duration_s=t - t0, variant_hint=self.variant_hint)
        else:  # one edge failed: all numbers unknown, the line still says the step existed
            delta = compute_delta(None, [], duration_s=(t - t0) if t0 is not None else None,
                                  variant_hint=self.variant_hint)
        self._write(CounterDelta(step=step, concurrency=concurrency, target=target, window=window, **delta).to_dict())

    def _first_rows(self) -> list:
        """The first target's samples now (raises what the fetch or the parser raises)."""
        return parse_metrics(self._fetch(self.targets[0], self._timeout))[1]

    def count_moved(self, step: int) -> bool | None:
        """Has the sync observer seen a predictor call since this step's count_start snapshot (first target)? False
        also before that snapshot is taken; None when it cannot be known: a failed scrape, a server without the
        plugin's control channel."""
        if not self.targets:
            return None
        opened = self._starts.get((step, self.targets[0], "count"))
        if opened is None:  # the window is not open yet (the edge actions are still confirming or scraping)
            return False
        if opened[1] is None:  # the count_start scrape failed: no base to compare with
            return None
        try:
            rows = self._first_rows()
        except Exception:  # a failed probe is only a missed look; the count_end snapshot records the truth
            return None
        if gauge(rows, m.CONTROL_EPOCH) is None:  # no control channel: nothing switched the observer on
            return None
        # a labelled counter has no sample before its first call (after a start): none counts as zero
        return (total(rows, m.OBSERVED_CALLS) or 0.0) > (total(opened[1], m.OBSERVED_CALLS) or 0.0)

    def confirm_epoch(self, epoch: int, timeout_s: float, *, sleep: Callable[[float], None] = time.sleep,
                      interval_s: float = 0.2) -> float | None:
        """Poll the first target until its control epoch gauge reads `epoch` or more (the server applied the write:
        it applies changes at its next step). Returns the time it did, None after timeout_s (never raises). Every poll
        makes the server render its whole exposition, so not too often."""
        if not self.targets:
            return None
        deadline = self._clock() + timeout_s
        while True:
            try:
                value = gauge(self._first_rows(), m.CONTROL_EPOCH)
                if value is not None and value >= epoch:
                    return self._clock()
            except Exception:  # a failed poll is only a missed chance; the snapshot after it records the truth
                pass
            if self._clock() >= deadline:
                return None
            sleep(interval_s)

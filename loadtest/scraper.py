"""Server counters: /metrics scraped at both edges of every measure phase, stored raw and as per-step deltas.

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

from loadtest.records import CounterDelta, CounterSnapshot
from tts_predictor import metrics as m
from tts_predictor.domain import CALLS_PER_STEP


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample_key(name: str, labels: dict[str, str]) -> str:
    """`name{k="v",...}` with sorted labels, or the bare name when there are none (as in the text format)."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(labels[k])}"' for k in sorted(labels)) + "}"


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


def total(rows, name: str) -> float | None:
    """Sum of a sample name over all label sets; None if the server does not expose it."""
    vals = [v for n, _, v in rows if n == name]
    return sum(vals) if vals else None


def variant_of(rows) -> str | None:
    for n, labels, _ in rows:
        if n == m.INFO and labels.get("variant"):
            return labels["variant"]
    for n, labels, _ in rows:
        if n == m.CALLS and labels.get("variant"):
            return labels["variant"]
    return None


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


def compute_delta(start_rows, end_rows, *, duration_s: float | None, variant_hint: str | None) -> dict[str, Any]:
    """Per-step differences of the predictor/engine counters and the ratios the statistics compare.

    start_rows None means the start scrape failed: every difference is unknown.
    """
    failed = start_rows is None
    start_rows = start_rows or []
    d = {key: None if failed else _diff(total(start_rows, name), total(end_rows, name)) for key, name in (
        ("calls", m.CALLS), ("seconds", m.SECONDS + "_sum"), ("syncs", m.SYNCS),
        ("observed_calls", m.OBSERVED_CALLS), ("observed_tokens", m.OBSERVED_TOKENS), ("tokens", m.TOKENS),
        ("batch_requests", m.REQUESTS), ("steps", m.STEPS), ("step_seconds", m.STEP_SECONDS + "_sum"),
        ("frames", m.FRAMES), ("requests_finished", m.ENGINE_REQUESTS),
    )}
    steps = d["steps"]
    if steps is None and d["calls"] is not None:  # vllm-omni has no engine counters: 15 predictor calls per step
        steps = d["calls"] / CALLS_PER_STEP
    per_call = _ratio(d["syncs"], d["observed_calls"])
    calls_per_step = _ratio(d["calls"], steps)
    return {
        "duration_s": duration_s,
        "variant": variant_of(end_rows) or variant_of(start_rows) or variant_hint,
        **d,
        "steps": steps,
        "syncs_per_call": per_call,
        "syncs_per_step": per_call * calls_per_step if per_call is not None and calls_per_step is not None else None,
        "calls_per_request": _ratio(d["calls"], d["requests_finished"]),
        "seconds_per_request": _ratio(d["seconds"], d["requests_finished"]),
        "mean_batch": _ratio(d["batch_requests"], d["calls"]),
    }


def http_get(url: str, timeout_s: float) -> str:
    r = httpx.get(url, timeout=timeout_s)
    r.raise_for_status()
    return r.text


class Scraper:
    """Scrapes every target at an edge and appends lines to counters.jsonl through `write`."""

    def __init__(self, targets: list[str], write: Callable[[dict], None], *, variant_hint: str | None = None,
                 fetch: Callable[[str, float], str] = http_get, timeout_s: float = 5.0,
                 clock: Callable[[], float] = time.time):
        self.targets = list(targets)
        self._write, self._fetch, self._timeout, self._clock = write, fetch, timeout_s, clock
        self.variant_hint = variant_hint
        self._starts: dict[tuple[int, str], tuple[float, list | None]] = {}

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
        if edge == "start":
            self._starts[(step, target)] = (t, rows)
            return
        t0, start_rows = self._starts.pop((step, target), (None, None))
        if start_rows is not None and rows is not None:
            delta = compute_delta(start_rows, rows, duration_s=t - t0, variant_hint=self.variant_hint)
        else:  # one edge failed: all numbers unknown, the line still says the step existed
            delta = compute_delta(None, [], duration_s=(t - t0) if t0 is not None else None,
                                  variant_hint=self.variant_hint)
        self._write(CounterDelta(step=step, concurrency=concurrency, target=target, **delta).to_dict())

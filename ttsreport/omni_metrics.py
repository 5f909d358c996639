"""vllm-omni's own Prometheus series (0.30.0 and later): which ones the suite scrapes, and their per-window deltas.

Our plugin's counters (tts_predictor.metrics) exist only in the 0.16.0 image; from 0.30.0 on the server itself
exports `vllm_omni:*` families (vllm_omni/metrics/definitions.py, prometheus.py and modality.py of the 0.30.0 wheel),
recorded unless the server runs with --disable-log-stats (docker/serve.sh passes --log-stats). These names are
upstream's, restated here once so the scraper and the statistics refer to this module only; tests/upstream checks them
against the installed 0.30.0 package.

`window_delta(start_rows, end_rows)` is pure: two parsed snapshots (rows of (sample name, labels, value), as
loadtest.scraper.parse_metrics returns them) in, the window's differences out. The scraper wiring comes later.
"""

from __future__ import annotations

import math
from typing import Any

PREFIX = "vllm_omni:"

# Histograms (seconds unless said otherwise), labels model_name + stage + replica unless said otherwise.
HISTOGRAMS = {
    "vllm_omni:audio_ttfp_s": "request arrival to first audio packet (streaming only)",
    "vllm_omni:audio_rtf": "real-time factor: stage generation time / audio duration (dimensionless)",
    "vllm_omni:audio_underrun_s": "worst player deficit of a streamed request (> 0: the listener heard a gap)",
    "vllm_omni:audio_duration_s": "generated audio duration per request",
    "vllm_omni:e2e_request_latency_s": "arrival to complete response (labels: model_name)",
    "vllm_omni:request_queue_wait_s": "submit arrival to stage submit (labels: model_name)",
    # labels model_name + stage + stage_type; upstream's help says diffusion/image stages, so a TTS server may leave
    # it empty: scraped anyway, a missing family is reported as missing, never as zero
    "vllm_omni:stage_gen_time_s": "per-stage generation time",
}
# Counters (the exposition adds _total to the sample name).
COUNTERS = {
    "vllm_omni:requests_success_total": "finished requests by finished_reason (stop, length, abort)",
    "vllm_omni:requests_failed_total": "failed requests by reason",
    "vllm_omni:audio_continuity_ok_total": "streamed requests whose worst underrun stayed under threshold_ms",
    "vllm_omni:audio_frames_total": "audio samples produced (per model: not summable across models)",
    "vllm_omni:audio_skipped_requests_total": "200 OK with empty audio (code2wav rejected the codes), by reason",
    "vllm_omni:speech_stream_aborted_total": "speech streams ended early, by reason",
    "vllm_omni:speech_stream_completed_total": "speech streams that completed",
    "vllm_omni:prompt_tokens_total": "prompt tokens over all stages",
    "vllm_omni:generation_tokens_total": "generated tokens over all stages",
}
GAUGES = {
    "vllm_omni:num_requests_running": "requests running in the pipeline (value at the window's end)",
    "vllm_omni:num_requests_waiting": "requests waiting to be scheduled (value at the window's end)",
}
QUANTILES = (0.5, 0.9, 0.99)

Rows = list[tuple[str, dict[str, str], float]]


def _labels_key(labels: dict[str, str], drop: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in drop))


def _index(rows: Rows | None, name: str, drop: tuple[str, ...] = ()) -> dict[tuple, float]:
    out: dict[tuple, float] = {}
    for n, labels, value in rows or ():
        if n == name:
            key = _labels_key(labels, drop)
            out[key] = out.get(key, 0.0) + float(value)
    return out


def _diff(a: float | None, b: float | None) -> float | None:
    """b - a for a counter; a series first seen at the end started at 0 inside the window; a drop is a reset."""
    if b is None:
        return None
    a = 0.0 if a is None else a
    return None if b < a else b - a


def _buckets(rows: Rows | None, name: str) -> dict[tuple, dict[float, float]]:
    out: dict[tuple, dict[float, float]] = {}
    for n, labels, value in rows or ():
        if n == name + "_bucket" and "le" in labels:
            le = math.inf if labels["le"] in ("+Inf", "inf", "Inf") else float(labels["le"])
            out.setdefault(_labels_key(labels, ("le",)), {})[le] = float(value)
    return out


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus histogram_quantile over cumulative bucket counts: linear inside the bucket that holds rank q*n.

    None when the window holds no observation; the highest finite bound when the rank falls in the +Inf bucket.
    """
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    n = buckets[bounds[-1]]
    rank = q * n
    lower, below = 0.0, 0.0
    for b in bounds:
        c = buckets[b]
        if c >= rank:
            if math.isinf(b):
                finite = [x for x in bounds if not math.isinf(x)]
                return finite[-1] if finite else None
            if c == below:
                return b
            return lower + (b - lower) * (rank - below) / (c - below)
        lower, below = b, c
    return None


def _histogram_delta(start: Rows | None, end: Rows, name: str) -> list[dict[str, Any]] | None:
    end_count = _index(end, name + "_count")
    if not end_count:
        return None
    start_count, start_sum, end_sum = _index(start, name + "_count"), _index(start, name + "_sum"), _index(end,
                                                                                                        name + "_sum")
    start_b, end_b = _buckets(start, name), _buckets(end, name)
    series = []
    for key in sorted(end_count):
        count = _diff(start_count.get(key), end_count[key])
        total = _diff(start_sum.get(key), end_sum.get(key)) if count is not None else None
        window: dict[float, float] | None = {}
        for le, c in end_b.get(key, {}).items():
            d = _diff(start_b.get(key, {}).get(le), c)
            if d is None:
                window = None
                break
            window[le] = d
        row: dict[str, Any] = {"labels": dict(key), "count": count, "sum": total,
                               "mean": total / count if count and total is not None else None}
        for q in QUANTILES:
            row[f"p{round(q * 100)}"] = quantile(q, window) if window and count is not None else None
        series.append(row)
    return series


def window_delta(start_rows: Rows | None, end_rows: Rows) -> dict[str, Any]:
    """Per-window differences of every scraped vllm_omni series, per label set.

    `start_rows` None (the start scrape failed) makes every difference unknown (None) but keeps the gauges' end values.
    A family absent at the end is None ("not exposed"), never 0. Counters that went down (server restart) are None.
    """
    failed = start_rows is None
    out: dict[str, Any] = {"histograms": {}, "counters": {}, "gauges": {}}
    for name in HISTOGRAMS:
        series = _histogram_delta(start_rows or [], end_rows, name)
        if series is not None and failed:
            series = [{**s, **{k: None for k in s if k != "labels"}} for s in series]
        out["histograms"][name] = series
    for name in COUNTERS:
        end = _index(end_rows, name)
        if not end:
            out["counters"][name] = None
            continue
        start = _index(start_rows, name)
        out["counters"][name] = [{"labels": dict(k), "delta": None if failed else _diff(start.get(k), v)}
                                 for k, v in sorted(end.items())]
    for name in GAUGES:
        end = _index(end_rows, name)
        out["gauges"][name] = [{"labels": dict(k), "value": v} for k, v in sorted(end.items())] if end else None
    return out


def exposed(rows: Rows) -> set[str]:
    """Which of the scraped families a snapshot has (a server without --log-stats, or before 0.30, has none)."""
    names = {n for n, _, _ in rows}
    have = {h for h in HISTOGRAMS if h + "_count" in names}
    return have | {c for c in COUNTERS if c in names} | {g for g in GAUGES if g in names}

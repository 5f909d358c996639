"""Per-window numbers of a run: the metrics of each window (block) and level, from what runfolder.load_run read.

Pure functions over the stored files (ttsrecords.records is their contract; a file of an unknown schema is refused with
a one-line message); rounds.py pairs the windows and comparison.py compares them. Besides the metric table's values,
each level of a window carries the sampling variance of its metrics inside the window (for the variance components
of a nested design), its streaming continuity, the server's telemetry and vllm-omni's own series over the measure
window, and the requests that spanned a variant switch (left out of the window's metrics).
"""

from __future__ import annotations

import math
import zlib

import numpy as np

from tts_predictor import metrics as pm
from ttsrecords import outcomes as oc
from ttsrecords.measures import METRICS, PRIMARY_METRIC, VERDICT_METRICS, Metric  # noqa: F401 (re-exported)
from ttsrecords.samples import rows_of, stored_total
from ttsreport import omni_metrics

WITHIN_RESAMPLES = 200  # bootstrap resamples over a window's requests for the sampling variance of a percentile
QUANTILE_METRICS = {"e2e_p50": ("e2e_s", 50), "e2e_p90": ("e2e_s", 90), "e2e_p99": ("e2e_s", 99),
                    "ttfa_p50": ("ttfa_s", 50), "rtf_p50": ("rtf", 50), "stream_rtf_p50": ("stream_rtf", 50)}
TELEMETRY_FIELDS = ("gpu_util_pct", "sm_clock_mhz", "mem_used_mib", "power_w", "cpu_pct", "rss_mib", "host_cpu_pct",
                    "other_cpu_pct")
SAMPLED_SINCE = {"other_cpu_pct"}  # fields older runs never sampled: left out of their summaries, not written as null
SUMMED_OVER_GPUS = ("mem_used_mib", "power_w")  # per-GPU values that add up; utilisation and clock are averaged

OUTLIVED_TOLERANCE_S = 0.5  # scheduling slack between a phase's end and the next level's first request


def outlived_levels(block: dict) -> dict[int, tuple[int, float]]:
    """Per level: (measured requests that ran past the level's drain, the longest overrun in s). Such a request ran
    partly under the next level's load: the closed-loop estimator needs each level's drain >= its longest request
    (loadtest/window_fit.py)."""
    drains = (block.get("workload") or {}).get("drains") or {}
    out = {}
    for c, (_a, b) in measure_edges(block["counters"]).items():
        if c not in drains:
            continue
        end = b + drains[c]
        over = [r["t_start"] + r["e2e_s"] - end for r in block["requests"] if r.get("concurrency") == c
                and r.get("phase") == "measure" and r.get("e2e_s") is not None]
        late = [x for x in over if x > OUTLIVED_TOLERANCE_S]
        if late:
            out[c] = (len(late), max(late))
    return out


# ----------------------------------------------------------------------------------------------- small helpers


def _f(x) -> float | None:
    """JSON-safe float (None for missing/NaN/inf)."""
    if x is None:
        return None
    x = float(x)
    return None if not math.isfinite(x) else x


def _mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return _f(np.mean(xs)) if xs else None


def _deltas(counters: list[dict]) -> dict[int, dict]:
    """Counter deltas of the measure windows by concurrency level (last one wins if a level was repeated)."""
    return {int(c["concurrency"]): c for c in oc.deltas(counters, "measure") if c.get("concurrency") is not None}


def _snapshots(counters: list[dict], edge: str) -> dict[int, dict]:
    """The ok snapshot at one edge per level (the last one wins)."""
    return {int(c["concurrency"]): c for c in counters if c.get("kind") == "snapshot" and c.get("edge") == edge
            and c.get("concurrency") is not None and c.get("ok", True)}


def _snapshot_pairs(counters: list[dict], value, keep=lambda a, b: True) -> dict[int, tuple[float, float]]:
    """Per level: (start, end) of value(snapshot) over the scraper's measure-window snapshots (None values skipped;
    an end pair that keep() refuses leaves the level's earlier pair in place)."""
    start: dict[int, float] = {}
    out: dict[int, tuple[float, float]] = {}
    for c in counters:
        if c.get("kind") != "snapshot" or c.get("concurrency") is None:
            continue
        v = value(c)
        if v is None:
            continue
        lv = int(c["concurrency"])
        if c.get("edge") == "start":
            start[lv] = v
        elif c.get("edge") == "end" and lv in start and keep(start[lv], v):
            out[lv] = (start[lv], v)
    return out


def _snapshot_deltas(counters: list[dict], name: str) -> dict[int, float]:
    """Per level: end minus start of a counter in the raw snapshots (for names the delta lines do not carry)."""
    pairs = _snapshot_pairs(counters, lambda c: stored_total(c.get("samples"), name))
    return {lv: b - a for lv, (a, b) in pairs.items()}


def measure_edges(counters: list[dict]) -> dict[int, tuple[float, float]]:
    """Measure window per level from the scraper's start/end snapshots (absolute epoch seconds)."""
    return _snapshot_pairs(counters, lambda c: None if c.get("t") is None else float(c["t"]), keep=lambda a, b: b > a)


# ----------------------------------------------------------------------------------------------- one window, one level


def _seed(*parts) -> int:
    return zlib.crc32(":".join(str(p) for p in parts).encode())


def _var_log_quantile(x: np.ndarray, p: float, rng: np.random.Generator) -> float | None:
    """Sampling variance of ln(percentile p of x) by a bootstrap over the window's requests."""
    if x.size < 5 or np.any(x <= 0):
        return None
    idx = rng.integers(0, x.size, size=(WITHIN_RESAMPLES, x.size))
    q = np.percentile(x[idx], p, axis=1)
    return _f(np.var(np.log(q), ddof=1))


def _var_log_ratio_of_means(num: np.ndarray | None, den: np.ndarray) -> float | None:
    """Delta-method variance of ln(mean num / mean den) (num None: of -ln(mean den)) over n paired requests."""
    n = den.size
    if n < 2 or den.mean() <= 0:
        return None
    v = den.var(ddof=1) / den.mean() ** 2
    if num is not None:
        if num.mean() <= 0:
            return None
        v += num.var(ddof=1) / num.mean() ** 2 - 2 * np.cov(num, den)[0, 1] / (num.mean() * den.mean())
    return _f(max(v, 0.0) / n)


def within_variances(ok: list[dict], seed: int) -> dict[str, float | None]:
    """Sampling variance of ln(metric) inside one window, from its ok measure requests (for the variance components).

    Throughput in a closed loop is c / mean latency (Little's law: c users always busy), so its sampling variance is
    that of the mean latency (delta method); a Poisson count variance would treat the requests as arrivals of an open
    loop and overstate it many times. Audio throughput is c * mean audio / mean latency (a ratio of means). A
    percentile's variance comes from a bootstrap over the window's requests (seeded per window and level).
    """
    rng = np.random.default_rng(seed)
    e2e = np.array([r["e2e_s"] for r in ok if r.get("e2e_s")], dtype=float)
    audio = np.array([r.get("audio_s") or 0.0 for r in ok if r.get("e2e_s")], dtype=float)
    out: dict[str, float | None] = {
        "throughput_rps": _var_log_ratio_of_means(None, e2e),
        "audio_throughput": _var_log_ratio_of_means(audio, e2e) if audio.size and audio.mean() > 0 else None,
    }
    for key, (field_, p) in QUANTILE_METRICS.items():
        x = np.array([r[field_] for r in ok if r.get(field_) is not None], dtype=float)
        out[key] = _var_log_quantile(x, p, rng)
    return out


def closed_loop_rates(meas: list[dict], concurrency: int, mix: dict[str, float] | None) -> dict:
    """Work rates of a closed loop from the requests that started in the measure phase (Little's law).

    With c users that send back to back, each user is a renewal process whose cycle is one request, so the level's
    long-run rates are c x E[ok] / E[elapsed] requests/s and c x E[audio] / E[elapsed] audio-s/s, expectations over the
    scenario's prompt mix (renewal-reward theorem). The means are taken per prompt bucket and weighed by the mix,
    so the two arms of a pair are compared on the same work even when the slower one got less far through the
    prompt stream; no window edge cuts a request (docs/method.md, section 4). A failed request holds its user for
    its elapsed time and yields no audio. Falls back to the plain ratio of sums when a bucket of the mix has no
    request in the window (`stratified` False). Also returns the sampling variance of ln(rate) by the delta method
    (the within-window variance of the variance components)."""
    rows = [r for r in meas if r.get("e2e_s") is not None and r["e2e_s"] > 0]
    if not rows:
        return {}
    by_bucket: dict[str, list[dict]] = {}
    for r in rows:
        by_bucket.setdefault(str(r.get("bucket")), []).append(r)
    weights = {b: w for b, w in (mix or {}).items() if w > 0}
    stratified = bool(weights) and all(b in by_bucket for b in weights) and set(by_bucket) <= set(weights)
    if not stratified:
        weights, by_bucket = {"all": 1.0}, {"all": rows}
    total = sum(weights.values())
    cols = {b: (np.array([float(r["e2e_s"]) for r in by_bucket[b]]),
                np.array([float(r.get("audio_s") or 0.0) if r.get("ok") else 0.0 for r in by_bucket[b]]),
                np.array([1.0 if r.get("ok") else 0.0 for r in by_bucket[b]])) for b in weights}
    e_mix = sum(w / total * cols[b][0].mean() for b, w in weights.items())
    a_mix = sum(w / total * cols[b][1].mean() for b, w in weights.items())
    o_mix = sum(w / total * cols[b][2].mean() for b, w in weights.items())

    def var_log(num: int, num_mix: float) -> float | None:
        if num_mix <= 0 or any(len(cols[b][0]) < 2 for b in weights):
            return None
        v = sum((w / total) ** 2 * np.var(cols[b][num] / num_mix - cols[b][0] / e_mix, ddof=1) / len(cols[b][0])
                for b, w in weights.items())
        return _f(v)

    return {"throughput_rps": _f(concurrency * o_mix / e_mix) if o_mix > 0 else None,
            "audio_throughput": _f(concurrency * a_mix / e_mix) if a_mix > 0 else None,
            "var_log": {"throughput_rps": var_log(2, o_mix), "audio_throughput": var_log(1, a_mix)},
            "stratified": stratified, "n_used": len(rows)}


def continuity(ok: list[dict]) -> dict:
    """Streaming continuity of one window and level: ok streamed requests with continuity fields (version 2)."""
    streamed = [r for r in ok if r.get("mode", "stream") == "stream" and r.get("underrun_s") is not None]
    under = np.array([r["underrun_s"] for r in streamed], dtype=float)
    srtf = np.array([r["stream_rtf"] for r in streamed if r.get("stream_rtf") is not None], dtype=float)
    n_ok = sum(bool(r.get("continuity_ok")) for r in streamed)
    return {"n_streamed": len(streamed), "n_continuity_ok": n_ok,
            "underrun_mean_s": _f(under.mean()) if under.size else None,
            "underrun_p90_s": _f(np.percentile(under, 90)) if under.size else None,
            "continuity_ok_share": _f(n_ok / len(streamed)) if streamed else None,
            "stream_rtf_p50": _f(np.percentile(srtf, 50)) if srtf.size else None}


def level_stats(requests: list[dict], delta: dict | None, edges: tuple[float, float] | None = None,
                level_requests: list[dict] | None = None, seed: int = 0, within: bool = True,
                concurrency: int | None = None, workload: dict | None = None) -> dict:
    """Metrics of one window at one level (measure phase only), per the METRICS table.

    Work rates (throughput_rps, audio_throughput): in a closed loop with the level's concurrency known, Little's law
    over the requests that started in the measure phase, per prompt bucket and weighed by the scenario's mix
    (closed_loop_rates; `rate_estimator` "closed_loop"). Otherwise, and always as the `*_window` fields beside it
    (the earlier estimator, kept for the known-answer bench): with the window's edges known, every ok request of the
    level counts for the share of its lifetime inside the window; without edges, ok requests started in the measure
    phase / window length. The window estimator moves with which requests the window's edges cut and which prompts
    fall inside (reports/bench/estimator.md, run old25: a known 25 % slowdown, truth x0.80, read x0.73-0.81 with
    1.5-12 % per-round spread).
    """
    meas = [r for r in requests if r.get("phase") == "measure"]
    ok = [r for r in meas if r.get("ok")]
    n_all, n_ok = len(meas), len(ok)
    if edges:
        a, b = edges
        window, window_src = b - a, "snapshots"
        n_thr = audio_thr = 0.0
        completed = 0
        for r in level_requests or requests:
            e = r.get("e2e_s")
            if not r.get("ok") or not e or e <= 0:
                continue
            t0, t1 = r["t_start"], r["t_start"] + e
            share = max(0.0, min(t1, b) - max(t0, a)) / e
            n_thr += share
            audio_thr += share * (r.get("audio_s") or 0.0)
            completed += a <= t1 < b
    else:
        window = _f(delta.get("duration_s")) if delta else None
        window_src = "counters"
        if not window:
            starts = np.array([r["t_start"] for r in meas], dtype=float)
            window = float((starts.max() - starts.min()) * len(starts) / (len(starts) - 1)) if len(starts) > 1 else None
            window_src = "records"
        n_thr, audio_thr = n_ok, float(sum(r.get("audio_s") or 0.0 for r in ok))
        completed = n_ok
    e2e = np.array([r["e2e_s"] for r in ok if r.get("e2e_s") is not None], dtype=float)
    ttfa = np.array([r["ttfa_s"] for r in ok if r.get("ttfa_s") is not None], dtype=float)
    audio = np.array([r.get("audio_s") or 0.0 for r in ok], dtype=float)
    rtf = np.array([r["rtf"] for r in ok if r.get("rtf") is not None], dtype=float)

    def q(x, p):
        return _f(np.percentile(x, p)) if x.size else None

    closed = (workload or {}).get("loop", "closed") == "closed" and concurrency
    rates = closed_loop_rates(meas, int(concurrency), (workload or {}).get("mix")) if closed else {}
    window_rps = _f(n_thr / window) if window else None
    window_audio = _f(audio_thr / window) if window else None
    out = {
        "n": n_all, "n_ok": n_ok, "n_error": n_all - n_ok, "window_s": window, "window_source": window_src,
        "completed_in_window": completed,
        "rate_estimator": "closed_loop" if rates else "window",
        "rate_stratified": rates.get("stratified") if rates else None,
        "throughput_rps": rates.get("throughput_rps") if rates else window_rps,
        "audio_throughput": rates.get("audio_throughput") if rates else window_audio,
        "throughput_rps_window": window_rps, "audio_throughput_window": window_audio,
        "e2e_p50": q(e2e, 50), "e2e_p90": q(e2e, 90), "e2e_p99": q(e2e, 99),
        "ttfa_p50": q(ttfa, 50), "rtf_p50": q(rtf, 50),
        "error_rate": _f((n_all - n_ok) / n_all) if n_all else None,
        "audio_s_mean": _f(audio.mean()) if audio.size else None,
        "e2e_mean": _f(e2e.mean()) if e2e.size else None,
        "errors": oc.error_counts(meas),
    }
    out.update(continuity(ok))
    out["within_var"] = within_variances(ok, seed) if within else None
    if out["within_var"] is not None and rates:
        out["within_var"].update(rates["var_log"])
    out.update(_counter_stats(delta, n_ok))
    return out


def _counter_stats(delta: dict | None, n_ok: int) -> dict:
    """Server-side numbers of a level from its measure-window counter delta: syncs per call/step/request, seconds
    per call. In a version-2 run the observer is off in the measure window, so the sync ratios are null there and
    come from the count window (see block_summary)."""
    if not delta:
        return {"syncs_per_call": None, "syncs_per_step": None, "syncs_per_request": None,
                "seconds_per_call": None, "calls_per_request": None, "mean_batch": None}
    calls, secs = delta.get("calls"), delta.get("seconds")
    syncs, ocalls = delta.get("syncs"), delta.get("observed_calls")
    steps, finished = delta.get("steps"), delta.get("requests_finished") or n_ok or None
    spc = _f(syncs / ocalls) if syncs is not None and ocalls else _f(delta.get("syncs_per_call"))
    # On a sampled observer, per-step and per-request syncs scale the per-call rate up to all calls.
    sps_ = _f(spc * calls / steps) if spc is not None and calls and steps else _f(delta.get("syncs_per_step"))
    spr = _f(spc * calls / finished) if spc is not None and calls and finished else None
    return {
        "syncs_per_call": spc, "syncs_per_step": sps_, "syncs_per_request": spr,
        "seconds_per_call": _f(secs / calls) if secs is not None and calls else None,
        "calls_per_request": _f(calls / finished) if calls and finished else _f(delta.get("calls_per_request")),
        "mean_batch": _f(delta.get("mean_batch")),
    }


def telemetry_window(samples: list[dict], edges: tuple[float, float] | None) -> dict | None:
    """Mean of each telemetry field over one measure window: per GPU first, then averaged over GPUs (utilisation,
    clock) or summed (memory, power); the process source (CPU %, RSS) where no GPU was readable. None without
    samples inside the window."""
    if not edges or not samples:
        return None
    a, b = edges
    inside = [s for s in samples if s.get("t") is not None and a <= float(s["t"]) <= b]
    if not inside:
        return None
    out: dict = {"samples": len(inside), "sources": sorted({str(s.get("source")) for s in inside})}
    for name in TELEMETRY_FIELDS:
        per_gpu: dict = {}
        for s in inside:
            if s.get(name) is not None:
                per_gpu.setdefault(s.get("gpu"), []).append(float(s[name]))
        means = [float(np.mean(v)) for v in per_gpu.values()]
        if not means and name in SAMPLED_SINCE:
            continue
        out[name] = _f(sum(means) if name in SUMMED_OVER_GPUS else np.mean(means)) if means else None
    # the runner samples the server container's GPU(s) only (loadtest.telemetry.container_gpus): say which
    out["gpu_indices"] = sorted({s.get("gpu") for s in inside if s.get("gpu") is not None}, key=str)
    out["gpus"] = len(out["gpu_indices"])
    return out


def upstream_window(counters: list[dict], level: int) -> dict | None:
    """vllm-omni's own series over one measure window (ttsreport.omni_metrics.window_delta), None when the server
    exposes none of them (our 0.16.0 plugin, the simulator)."""
    start, end = _snapshots(counters, "start").get(level), _snapshots(counters, "end").get(level)
    if end is None:
        return None
    end_rows = rows_of(end.get("samples"), omni_metrics.PREFIX)
    if not end_rows:
        return None
    start_rows = rows_of(start.get("samples"), omni_metrics.PREFIX) if start is not None else None
    delta = omni_metrics.window_delta(start_rows, end_rows)
    return {kind: {k: v for k, v in fams.items() if v is not None} for kind, fams in delta.items()}


def _switch_spans(start: dict | None) -> list[tuple[float, float]]:
    """Time spans in which a variant switch of this server start was in flight: from the control write to the
    server's confirmation (the write alone where no confirmation was recorded)."""
    spans = []
    for sw in (start or {}).get("switches") or []:
        if sw.get("t") is None:
            continue
        t = float(sw["t"])
        spans.append((t, max(t, float(sw.get("confirmed_t") or t))))
    return spans


def spanning_requests(block: dict, start: dict | None) -> list[dict]:
    """The window's requests in flight while a variant switch of its server start was: they ran under either arm."""
    spans = _switch_spans(start)
    return [r for r in block["requests"] if _spans_switch(r, spans)]


def _spans_switch(r: dict, spans: list[tuple[float, float]]) -> bool:
    e = r.get("e2e_s")
    if not spans or e is None or r.get("t_start") is None:
        return False
    t0, t1 = float(r["t_start"]), float(r["t_start"]) + float(e)
    return any(t0 < hi and lo < t1 for lo, hi in spans)


def _count_sync_ratios(counters: list[dict]) -> dict[int, dict]:
    """Syncs per call / step from the count windows (the observer on; version 2), by level."""
    out = {}
    for d in oc.deltas(counters, "count"):
        if d.get("concurrency") is None:
            continue
        syncs, ocalls, calls, steps = d.get("syncs"), d.get("observed_calls"), d.get("calls"), d.get("steps")
        spc = _f(syncs / ocalls) if syncs is not None and ocalls else None
        out[int(d["concurrency"])] = {"syncs_per_call": spc,
                                      "syncs_per_step": _f(spc * calls / steps) if spc is not None and calls and steps
                                      else None}
    return out


def block_summary(block: dict, start: dict | None = None, within: bool = True) -> dict:
    """Everything about one window: its metadata, validity (status + manipulation check), the requests that spanned
    a variant switch of its server start (left out), and per level its metrics, telemetry and upstream series.
    within=False skips the sampling variances inside the window (only the variance components need them)."""
    meta = block["meta"]
    spanning = spanning_requests(block, start)
    span_ids = {id(r) for r in spanning}
    by_level: dict[int, list[dict]] = {}
    for r in block["requests"]:
        if r.get("concurrency") is not None and id(r) not in span_ids:
            by_level.setdefault(int(r["concurrency"]), []).append(r)
    deltas, edges = _deltas(block["counters"]), measure_edges(block["counters"])
    count_syncs = _count_sync_ratios(block["counters"])
    stalls = _snapshot_deltas(block["counters"], pm.SIM_STALL_SECONDS)
    levels = {}
    for c in sorted(by_level):
        row = level_stats(by_level[c], deltas.get(c), edges.get(c), by_level[c], _seed(meta.get("block_id"), c),
                          within, concurrency=c, workload=block.get("workload"))
        if c in count_syncs:  # version 2: the sync ratios come from the count window (observer on)
            row.update({k: v for k, v in count_syncs[c].items() if v is not None})
            if row.get("syncs_per_call") is not None and row.get("calls_per_request") is not None:
                row["syncs_per_request"] = _f(row["syncs_per_call"] * row["calls_per_request"])
        calls = (deltas.get(c) or {}).get("calls")
        # simulator only: the GPU stall it sleeps per sync is not inside the host time of the call
        row["stall_seconds_per_call"] = _f(stalls[c] / calls) if c in stalls and calls else None
        row["telemetry"] = telemetry_window(block.get("telemetry") or [], edges.get(c))
        row["upstream"] = upstream_window(block["counters"], c)
        row["n_spanning"] = sum(1 for r in spanning if r.get("concurrency") == c)
        levels[str(c)] = row
    check = oc.manipulation_check(meta.get("variant"), block["counters"])
    why = oc.block_validity(meta, check, measured=bool(levels))
    simulated = any('backend="simulated"' in k for c in block["counters"] if c.get("kind") == "snapshot"
                    for k in (c.get("samples") or {}))
    runner_requests = meta.get("requests") or {}
    return {k: meta.get(k) for k in ("block_id", "round", "kind", "arm", "variant", "status", "started", "ended")} | {
        "start": meta.get("start"), "position": meta.get("position"), "level_order": meta.get("levels") or None,
        "attempt": meta.get("attempt"), "failed_before": meta.get("failed_before"), "timing": meta.get("timing") or {},
        "valid": why is None, "invalid_reason": why, "manipulation": check, "simulated_counters": simulated,
        "spanning": {"left_out": len(spanning), "measure": sum(r.get("phase") == "measure" for r in spanning),
                     "runner": runner_requests.get("spanning")},
        "telemetry_samples": len(block.get("telemetry") or []),
        "levels": levels,
    }

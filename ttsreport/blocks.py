"""Per-block metrics of a run: the metric table, loading a run folder and the numbers of each block and level.

Pure functions over the stored files (loadtest.records is their contract); analysis.py compares them over rounds.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from loadtest import records as rec
from loadtest.measures import METRICS, PRIMARY_METRIC, VERDICT_METRICS, Metric  # noqa: F401 (re-exported)
from tts_predictor import metrics as pm

# ----------------------------------------------------------------------------------------------- reading a run


def load_run(run_dir: str | Path) -> dict:
    """Load manifest and blocks of an A/B run (or a single Locust run, seen as one block of arm A)."""
    run = Path(run_dir)
    manifest = rec.read_json(run / "manifest.json") or {}
    if manifest and manifest.get("schema") not in rec.RUN_MANIFESTS:
        raise ValueError(f"{run}/manifest.json: unknown schema {manifest.get('schema')!r}")
    notes: list[str] = []
    blocks = []
    block_dirs = sorted((run / "blocks").iterdir()) if (run / "blocks").is_dir() else []
    if not block_dirs and (run / "requests.jsonl").exists():  # a plain Locust run
        variant = manifest.get("variant")
        block_dirs = [run]
        synthetic = {"block_id": run.name, "round": 0, "kind": "single", "arm": "A", "variant": variant,
                     "status": "complete", "reason": None}
    else:
        synthetic = None
    for bdir in block_dirs:
        if not bdir.is_dir():
            continue
        meta = synthetic or rec.read_json(bdir / "block.json")
        if meta is None:
            notes.append(f"{bdir.name}: no block.json (block never started) — skipped")
            continue
        if meta.get("schema", rec.BLOCK_SCHEMA) != rec.BLOCK_SCHEMA:
            raise ValueError(f"{bdir}/block.json: unknown schema {meta.get('schema')!r}")
        reqs, n1 = rec.read_jsonl(bdir / "requests.jsonl", rec.REQUEST_SCHEMA)
        ctrs, n2 = rec.read_jsonl(bdir / "counters.jsonl", rec.COUNTERS_SCHEMA)
        notes += n1 + n2
        blocks.append({"meta": meta, "requests": reqs, "counters": ctrs})
    return {"dir": str(run), "manifest": manifest, "blocks": blocks, "notes": notes}



# ----------------------------------------------------------------------------------------------- per block


def _f(x) -> float | None:
    """JSON-safe float (None for missing/NaN)."""
    if x is None:
        return None
    x = float(x)
    return None if not math.isfinite(x) else x


def _deltas(counters: list[dict]) -> dict[int, dict]:
    """Counter deltas of the measure phase by concurrency level (last one wins if a level was repeated)."""
    return {int(c["concurrency"]): c for c in counters if c.get("kind") == "delta" and c.get("concurrency") is not None}


def _sample_sum(samples: dict, name: str) -> float | None:
    vals = [v for k, v in (samples or {}).items() if k == name or k.startswith(name + "{")]
    return float(sum(vals)) if vals else None


def _snapshot_pairs(counters: list[dict], value, keep=lambda a, b: True) -> dict[int, tuple[float, float]]:
    """Per level: (start, end) of value(snapshot) over the scraper's start/end snapshots (None values skipped; an
    end pair that keep() refuses leaves the level's earlier pair in place)."""
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
    pairs = _snapshot_pairs(counters, lambda c: _sample_sum(c.get("samples"), name))
    return {lv: b - a for lv, (a, b) in pairs.items()}


def measure_edges(counters: list[dict]) -> dict[int, tuple[float, float]]:
    """Measure window per level from the scraper's start/end snapshots (absolute epoch seconds)."""
    return _snapshot_pairs(counters, lambda c: None if c.get("t") is None else float(c["t"]), keep=lambda a, b: b > a)


def level_stats(requests: list[dict], delta: dict | None, edges: tuple[float, float] | None = None,
                block_requests: list[dict] | None = None) -> dict:
    """Metrics of one block at one level (measure phase only), per the METRICS table.

    With the window's edges known, every ok request counts for the share of its lifetime inside the window, whatever
    phase it started in (one request = one unit of work spread over its duration). On the simulator's known-answer
    pool this had 40 % less block-to-block spread than counting completions, which jump by whole closed-loop
    "waves" at window edges. Requests still running when Locust stops are never recorded, so the last level needs a
    drain about as long as its latency (summary warns when it is missing). Without edges: ok requests started in
    the measure phase / window length.
    """
    meas = [r for r in requests if r.get("phase") == "measure"]
    ok = [r for r in meas if r.get("ok")]
    n_all, n_ok = len(meas), len(ok)
    if edges:
        a, b = edges
        window, window_src = b - a, "snapshots"
        n_thr = audio_thr = 0.0
        completed = 0
        for r in block_requests or requests:
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

    out = {
        "n": n_all, "n_ok": n_ok, "n_error": n_all - n_ok, "window_s": window, "window_source": window_src,
        "completed_in_window": completed,
        "throughput_rps": _f(n_thr / window) if window else None,
        "audio_throughput": _f(audio_thr / window) if window else None,
        "e2e_p50": q(e2e, 50), "e2e_p90": q(e2e, 90), "e2e_p99": q(e2e, 99),
        "ttfa_p50": q(ttfa, 50), "rtf_p50": q(rtf, 50),
        "error_rate": _f((n_all - n_ok) / n_all) if n_all else None,
        "audio_s_mean": _f(audio.mean()) if audio.size else None,
        "e2e_mean": _f(e2e.mean()) if e2e.size else None,
        "errors": rec.error_counts(meas),
    }
    out.update(_counter_stats(delta, n_ok))
    return out


def _counter_stats(delta: dict | None, n_ok: int) -> dict:
    """Server-side numbers of a level from its counter delta: syncs per call/step/request, seconds per call."""
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




def block_summary(block: dict) -> dict:
    """Everything about one block: its metadata, validity (status + manipulation check) and per-level metrics."""
    meta = block["meta"]
    by_level: dict[int, list[dict]] = {}
    for r in block["requests"]:
        if r.get("concurrency") is not None:
            by_level.setdefault(int(r["concurrency"]), []).append(r)
    deltas, edges = _deltas(block["counters"]), measure_edges(block["counters"])
    stalls = _snapshot_deltas(block["counters"], pm.SIM_STALL_SECONDS)
    levels = {}
    for c in sorted(by_level):
        row = level_stats(by_level[c], deltas.get(c), edges.get(c), block["requests"])
        calls = (deltas.get(c) or {}).get("calls")
        # simulator only: the GPU stall it sleeps per sync is not inside the host time of the call
        row["stall_seconds_per_call"] = _f(stalls[c] / calls) if c in stalls and calls else None
        levels[str(c)] = row
    check = rec.manipulation_check(meta.get("variant"), block["counters"])
    why = rec.block_validity(meta, check, measured=bool(levels))
    simulated = any('backend="simulated"' in k for c in block["counters"] if c.get("kind") == "snapshot"
                    for k in (c.get("samples") or {}))
    return {k: meta.get(k) for k in ("block_id", "round", "kind", "arm", "variant", "status", "started", "ended")} | {
        "valid": why is None, "invalid_reason": why, "manipulation": check, "simulated_counters": simulated,
        "levels": levels,
    }


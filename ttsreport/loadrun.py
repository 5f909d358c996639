"""The numbers of a plain Locust run (one server, no arms): per level, its failures, the server's identity, the curve.

A plain Locust run is not a one-armed A/B: there is nothing to compare, so no verdict. Per level it has requests ok
and failed, throughput, latency percentiles, time to first audio, streaming RTF, continuity, the batch per step and
the predictor's sync counters where the server exports them; over levels, throughput against concurrency and the
saturation knee. The per-window numbers are ttsreport.blocks' (block_summary, level_stats), as in an A/B report.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ttsrecords import outcomes as oc
from ttsrecords import records as rec
from ttsrecords.loadrun import LOAD_MANIFESTS, read_load_manifest

from .blocks import block_summary
from .runfolder import load_run

# The knee: from one level to the next, users grew by a factor k and throughput by g; the server still scales while
# (g - 1) / (k - 1) is at least this share (doubling users adds at least a quarter of the throughput doubling would).
KNEE_SHARE = 0.25
QUOTES = 3  # distinct server texts quoted per failure kind


def is_load_run(run_dir: str | Path) -> bool:
    """A plain Locust run folder: a Locust manifest (or only its records) and no A/B windows."""
    run = Path(run_dir)
    if (run / "blocks").is_dir():
        return False
    man = rec.read_json(run / "manifest.json") if (run / "manifest.json").is_file() else None
    if man is not None:
        return man.get("schema", rec.RUN_SCHEMA) in LOAD_MANIFESTS
    return (run / "requests.jsonl").is_file()


def _q(x: list[float], p: float) -> float | None:
    return float(np.percentile(np.array(x, dtype=float), p)) if x else None


def failures(requests: list[dict]) -> list[dict]:
    """Failed requests by kind (every phase), most frequent first, each with the server's own texts quoted."""
    bad = [r for r in requests if not r.get("ok") and not oc.is_cut(r)]  # a drain request cut at its level's end: none
    kinds = Counter(oc.error_kind(r.get("error")) for r in bad)
    out = []
    for kind, n in kinds.most_common():
        texts = Counter(r.get("error") or "unknown error" for r in bad if oc.error_kind(r.get("error")) == kind)
        out.append({"kind": kind, "n": n, "quotes": [{"text": t, "n": k} for t, k in texts.most_common(QUOTES)],
                    "phases": dict(Counter(r.get("phase") for r in bad if oc.error_kind(r.get("error")) == kind))})
    return out


def _sync_rows(counters: list[dict]) -> dict[int, dict]:
    """Per level, the predictor's measure-window counter delta: which variants' calls moved, calls, syncs."""
    out = {}
    for d in counters:
        if d.get("kind") == "delta" and d.get("window", "measure") == "measure" and d.get("concurrency") is not None:
            out[int(d["concurrency"])] = {"variants": d.get("variants_moved") or ([d["variant"]] if d.get("variant")
                                                                                  else []),
                                          "calls": d.get("calls"), "syncs": d.get("syncs"),
                                          "observed_calls": d.get("observed_calls")}
    return out


def knee(levels: list[dict]) -> dict | None:
    """The saturation knee over levels in concurrency order: the first level after which throughput grows by less
    than KNEE_SHARE of what the added users would give if the server scaled; None with fewer than 2 levels."""
    pts = [(lv["concurrency"], lv["audio_throughput"], lv["e2e_p50"]) for lv in levels
           if lv.get("audio_throughput") is not None]
    if len(pts) < 2:
        return None
    for (c0, t0, l0), (c1, t1, l1) in zip(pts, pts[1:], strict=False):
        if not t0 or c1 <= c0:
            continue
        share = (t1 / t0 - 1) / (c1 / c0 - 1)
        if share < KNEE_SHARE:
            return {"level": c0, "next": c1, "share": share, "throughput_x": t1 / t0,
                    "latency_x": (l1 / l0) if l0 and l1 else None,
                    "words": f"saturation knee at about c={c0}: from c={c0} to c={c1} users x{c1 / c0:.3g}, audio "
                             f"throughput x{t1 / t0:.3g}" + (f", p50 latency x{l1 / l0:.3g}" if l0 and l1 else "")}
    c_last = pts[-1][0]
    return {"level": None, "next": None, "share": None, "throughput_x": None, "latency_x": None,
            "words": f"no saturation knee up to c={c_last}: throughput still grows with the users"}


def numbers(run_dir: str | Path) -> dict[str, Any]:
    """Everything the load-run page shows, from the run folder's own files."""
    run = load_run(run_dir)
    raw = run["manifest"] or {}
    man = read_load_manifest(raw, f"{run_dir}/manifest.json") if raw else None
    block = run["blocks"][0] if run["blocks"] else None
    summary = block_summary(block) if block else {"levels": {}}
    requests = block["requests"] if block else []
    syncs = _sync_rows(block["counters"]) if block else {}
    levels = []
    for key, row in sorted(summary["levels"].items(), key=lambda kv: int(kv[0])):
        c = int(key)
        mine = [r for r in requests if r.get("concurrency") == c]
        meas_ok = [r for r in mine if r.get("phase") == "measure" and r.get("ok")]
        ttfa = [r["ttfa_s"] for r in meas_ok if r.get("ttfa_s") is not None]
        srtf = [r["stream_rtf"] for r in meas_ok if r.get("stream_rtf") is not None]
        levels.append({
            "concurrency": c, **{k: row.get(k) for k in (
                "n", "n_ok", "n_error", "throughput_rps", "audio_throughput", "e2e_p50", "e2e_p90", "e2e_p99",
                "rtf_p50", "n_streamed", "n_continuity_ok", "continuity_ok_share", "underrun_mean_s",
                "underrun_p90_s", "mean_batch", "syncs_per_call", "window_s", "rate_estimator", "telemetry")},
            "ttfa_p50": _q(ttfa, 50), "ttfa_p90": _q(ttfa, 90), "ttfa_p99": _q(ttfa, 99),
            "stream_rtf_p50": _q(srtf, 50), "stream_rtf_p90": _q(srtf, 90),
            "all_phases": len(mine), "all_failed": sum(not r.get("ok") and not oc.is_cut(r) for r in mine),
            "sync": syncs.get(c),
            "e2e_ok": sorted(r["e2e_s"] for r in meas_ok if r.get("e2e_s") is not None),
        })
    started, ended = (man.started, man.ended) if man else (None, None)
    return {
        "run_dir": str(run_dir), "run_id": Path(run_dir).name, "manifest": man,
        "status": man.status if man else "running, or stopped before writing manifest.json",
        "reason": man.reason if man else None,
        "duration_s": (ended - started) if started and ended else None,
        "levels": levels, "failures": failures(requests), "requests": len(requests),
        "failed": sum(not r.get("ok") and not oc.is_cut(r) for r in requests),
        "knee": knee(levels) if len(levels) > 1 else None,
        "simulated": bool(block and summary.get("simulated_counters")),
        "notes": run["notes"],
    }

"""Statistics of an A/B run: summary.json (per block, per arm) and comparison.json (per level: differences over
rounds, CIs, verdicts, prediction), computed from the stored files of `reports/<run>/`.

Pure functions over those files (loadtest.records is their contract; a record with an unknown schema is refused).
Everything the report shows is computed here; the report only reads the two JSON files.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy import stats as sps

from loadtest.records import COMPARISON_SCHEMA, SUMMARY_SCHEMA

from .blocks import METRICS, PRIMARY_METRIC, VERDICT_METRICS, block_summary, load_run, measure_edges
from .prediction import prediction, read_micro
from .verdict import Settings, decide, diff_stats, holm, rounds_for_halfwidth


def paired_rounds(blocks: list[dict], kind: str) -> dict[int, dict[str, dict]]:
    """Rounds of `kind` in which both arms have a valid block."""
    rounds: dict[int, dict[str, dict]] = {}
    for b in blocks:
        if b["kind"] == kind and b["valid"]:
            rounds.setdefault(int(b["round"]), {})[b["arm"]] = b
    return {r: arms for r, arms in sorted(rounds.items()) if {"A", "B"} <= set(arms)}


def _rel_diffs(pairs: dict[int, dict[str, dict]], level: str, metric: str) -> np.ndarray:
    out = []
    for arms in pairs.values():
        la, lb = arms["A"]["levels"].get(level), arms["B"]["levels"].get(level)
        if la and lb and la[metric] and lb[metric] is not None:
            out.append(100.0 * (lb[metric] / la[metric] - 1.0))
    return np.array(out, dtype=float)


def _arm_bands(blocks: list[dict], levels: list[str], level_cl: float = 0.95) -> dict:
    """Per arm, level and metric: mean over valid A/B blocks with a Student-t band (for the report's plots)."""
    out: dict = {}
    for arm in ("A", "B"):
        bs = [b for b in blocks if b["valid"] and b["arm"] == arm and b["kind"] in ("ab", "single")]
        out[arm] = {}
        for lv in levels:
            row = {}
            for key in list(METRICS) + ["syncs_per_call", "syncs_per_step", "syncs_per_request", "seconds_per_call"]:
                v = np.array([b["levels"][lv][key] for b in bs if lv in b["levels"] and b["levels"][lv][key] is not None])
                if not v.size:
                    row[key] = None
                    continue
                lo = hi = float(v.mean())
                if v.size >= 2 and v.std(ddof=1) > 0:
                    lo, hi = (float(x) for x in sps.t.interval(level_cl, v.size - 1, loc=v.mean(), scale=sps.sem(v)))
                row[key] = {"mean": float(v.mean()), "lo": lo, "hi": hi, "n": int(v.size)}
            out[arm][lv] = row
    return out


def _distributions(run: dict, summaries: list[dict], levels: list[str]) -> dict:
    """Pooled e2e latency quantiles per arm and level over valid A/B blocks (CDF curves for the report)."""
    probs = [float(p) for p in np.linspace(0, 100, 41)]
    valid_ids = {s["block_id"] for s in summaries if s["valid"] and s["kind"] in ("ab", "single")}
    arms: dict = {"probs": probs, "A": {}, "B": {}}
    for blk in run["blocks"]:
        m = blk["meta"]
        if m.get("block_id") not in valid_ids:
            continue
        for r in blk["requests"]:
            if r.get("phase") == "measure" and r.get("ok") and r.get("e2e_s") is not None:
                arms[m["arm"]].setdefault(str(r["concurrency"]), []).append(r["e2e_s"])
    for arm in ("A", "B"):
        arms[arm] = {lv: [float(x) for x in np.percentile(arms[arm][lv], probs)] for lv in levels if lv in arms[arm]}
    return arms


def compare(summaries: list[dict], levels: list[str], s: Settings, metrics=VERDICT_METRICS) -> tuple[dict, int, int, float]:
    """Per level and metric: differences over rounds, intervals, A/A floor, verdict. Also used by the calibration."""
    k = max(len(levels), 1)
    level_cl = 1.0 - (1.0 - s.confidence) / k  # Bonferroni: every level's CI at 1 - alpha/k keeps the family-wise level
    ab, aa = paired_rounds(summaries, "ab"), paired_rounds(summaries, "aa")
    per_level: dict = {}
    for i, lv in enumerate(levels):
        row = {}
        for metric in metrics:
            st = diff_stats(_rel_diffs(ab, lv, metric), level_cl, s, s.seed + 1000 * i + VERDICT_METRICS.index(metric))
            aa_d = _rel_diffs(aa, lv, metric)
            st["aa_values"] = [float(v) for v in aa_d]
            # RMS: |d| for one A/A round; with more rounds it settles at the typical single-round A/A difference
            # (bias and spread together) instead of growing like a maximum would
            st["aa_floor"] = float(np.sqrt(np.mean(aa_d ** 2))) if aa_d.size else None
            st["rounds_for_margin"] = (rounds_for_halfwidth(st["sd"], s.margin_pct, level_cl, s.max_rounds)
                                       if st["sd"] is not None else None)
            row[metric] = st
        per_level[lv] = row
    for metric in metrics:  # Holm across levels on the per-level t tests (reported beside the CI verdict)
        adj = holm([per_level[lv][metric]["p_value"] for lv in levels])
        for lv, p in zip(levels, adj, strict=True):
            st = per_level[lv][metric]
            st["p_holm"] = p
            st["verdict"] = decide(METRICS[metric].better, st, st["aa_floor"], level_cl, s.margin_pct, s.max_rounds)
    return per_level, len(ab), len(aa), level_cl


def summarize(run_dir: str | Path, settings: Settings | None = None, micro_path: str | Path | None = None) -> tuple[dict, dict]:
    """Compute summary.json and comparison.json for a run folder (pure: reads files, returns dicts)."""
    s = settings or Settings()
    run = load_run(run_dir)
    man = run["manifest"]
    summaries = [block_summary(b) for b in run["blocks"]]
    levels = sorted({lv for b in summaries for lv in b["levels"]}, key=int)
    variants = man.get("variants") or {"A": next((b["variant"] for b in summaries if b["arm"] == "A"), None),
                                       "B": next((b["variant"] for b in summaries if b["arm"] == "B"), None)}
    backend = man.get("backend") or {}
    backend_name = backend.get("name") if isinstance(backend, dict) else backend
    simulated = backend_name in ("sim", "simulated", "simulator") or any(b["simulated_counters"] for b in summaries)
    planned = len(man.get("plan") or [])
    complete = sum(b["status"] == "complete" for b in summaries)
    partial = (man.get("status") not in (None, "complete")) or (planned and complete < planned) or \
        any(b["status"] == "interrupted" for b in summaries)
    invalid = [{"block_id": b["block_id"], "round": b["round"], "kind": b["kind"], "arm": b["arm"],
                "variant": b["variant"], "reason": b["invalid_reason"]} for b in summaries if not b["valid"]]

    warnings_ = []
    for lv in levels:  # a window shorter than a couple of request lifetimes measures the ramp, not the steady state
        rows = [b["levels"][lv] for b in summaries if b["valid"] and lv in b["levels"]]
        short = [r for r in rows if r["window_s"] and r["e2e_p50"] and r["window_s"] < 2 * r["e2e_p50"]]
        if short:
            worst = max(r["e2e_p50"] for r in short)
            warnings_.append(f"c={lv}: the measure window ({short[0]['window_s']:.0f} s) is shorter than twice the p50 "
                             f"latency (up to {worst:.1f} s) in {len(short)} of {len(rows)} blocks: throughput there "
                             "is a start-up transient, not a steady state; use longer phases for a real answer")
    for b in run["blocks"]:  # requests running at the stop are never recorded: the last window needs a drain after it
        ends = [r["t_start"] + r["e2e_s"] for r in b["requests"] if r.get("e2e_s") is not None]
        edges = measure_edges(b["counters"])
        if ends and edges:
            last = max(edges, key=lambda c: edges[c][1])
            if max(ends) < edges[last][1] + 0.5:
                warnings_.append(f"c={last}: no drain after the last measure window (block {b['meta'].get('block_id')}"
                                 "): requests still running at the stop are unrecorded, so its throughput reads low")
                break
    summary = {
        "schema": SUMMARY_SCHEMA, "warnings": warnings_, "run_dir": str(run_dir), "run_id": man.get("run_id", Path(run_dir).name),
        "variants": variants, "backend": backend, "simulated": bool(simulated), "partial": bool(partial),
        "run_status": man.get("status"), "planned_blocks": planned, "complete_blocks": complete,
        "started": man.get("started"), "ended": man.get("ended"), "git_revision": man.get("git_revision"),
        "scenario": man.get("scenario"), "levels": levels,
        "metrics": {k: {"label": m.label, "unit": m.unit, "better": m.better, "definition": m.definition}
                    for k, m in METRICS.items()},
        "blocks": summaries, "invalid_blocks": invalid, "arms": _arm_bands(summaries, levels),
        "distributions": _distributions(run, summaries, levels), "notes": run["notes"],
    }

    per_level, ab_n, aa_n, level_cl = compare(summaries, levels, s, metrics=VERDICT_METRICS)
    k = max(len(levels), 1)
    micro = read_micro(micro_path)
    a_blocks = [b for b in summaries if b["valid"] and b["arm"] == "A" and b["kind"] == "ab"]
    b_blocks = [b for b in summaries if b["valid"] and b["arm"] == "B" and b["kind"] == "ab"]
    preds = {lv: prediction(lv, a_blocks, b_blocks, variants, micro) for lv in levels}
    comparison = {
        "schema": COMPARISON_SCHEMA, "run_id": summary["run_id"], "variants": variants,
        "simulated": summary["simulated"], "partial": summary["partial"], "invalid_blocks": invalid,
        "settings": {"confidence": s.confidence, "per_level_confidence": level_cl, "levels": k,
                     "correction": f"Bonferroni over {k} levels for the CIs (each at {100 * level_cl:.2f} %); "
                                   "Holm-adjusted p-values of per-level one-sample t tests reported beside them",
                     "ci_method": "hull of BCa bootstrap (scipy.stats.bootstrap, seeded) and Student-t interval "
                                  "over per-round relative differences",
                     "margin_pct": s.margin_pct, "power": s.power, "n_resamples": s.n_resamples, "seed": s.seed,
                     "aa_floor": "root mean square of the relative differences of the A/A rounds at that level and metric "
                                 "(|d| for one round)",
                     "no_difference_rule": "whole CI inside ±max(margin, A/A floor)"},
        "rounds": {"ab": ab_n, "aa": aa_n}, "levels": levels, "primary_metric": PRIMARY_METRIC,
        "per_level": per_level, "prediction": preds,
    }
    return summary, comparison


def write_statistics(run_dir: str | Path, settings: Settings | None = None, micro_path=None) -> tuple[Path, Path]:
    """Compute and write summary.json + comparison.json next to the run's raw files."""
    summary, comparison = summarize(run_dir, settings, micro_path)
    run = Path(run_dir)
    paths = run / "summary.json", run / "comparison.json"
    for p, obj in zip(paths, (summary, comparison), strict=True):
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        tmp.replace(p)
    return paths

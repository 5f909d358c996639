"""comparison.json's content from window summaries: per level, every metric's verdict (the primary one corrected over
the levels: Holm, or the sequential rule's looks), the error rate, streaming continuity, the A/A check, the design's
variance components and order effect, and the second analysis without the rounds that had failed requests.

analysis.py reads a run folder and calls compare(); tools/calibrate.py calls it on drawn experiments. Every rule is
in ttsreport.inference (docs/method.md).
"""

from __future__ import annotations

import math

import numpy as np

from ttsrecords import runsettings as rs
from ttsrecords.records import COMPARISON_SCHEMA

from . import inference as inf
from . import rounds as rd
from .blocks import (
    METRICS,
    PRIMARY_METRIC,
    VERDICT_METRICS,
)

BOOTSTRAP = 2000  # percentile bootstrap of the primary metric: a diagnostic beside the t interval, never the verdict
CONTINUITY_KEYS = ("underrun_mean_s", "underrun_p90_s", "continuity_ok_share", "stream_rtf_p50")


def compare_metric(pairs: dict, level: str, metric: str, *, unit: str, margin_pct: float, confidence: float,
                   keep=None, bootstrap: int = 0, scope: str | None = None) -> dict:
    """compare_rounds for one metric at one level (the start as the unit when `unit` is "start"), with the per-round
    values behind it; a round in which an arm failed there (rounds.failed_arms) makes the level "failed"."""
    v = rd.values(pairs, level, metric, keep)
    groups = v["start"] if unit == "start" else None
    if groups is not None and any(g is None for g in groups):
        raise ValueError(f"a nested design needs the start of every window (c={level}, {metric})")
    m = METRICS[metric]
    res = inf.compare_rounds(v["a"], v["b"], higher_is_better=m.better == "higher", margin_pct=margin_pct,
                             confidence=confidence, groups=groups, label=m.label, bootstrap=bootstrap,
                             failed=v["failed"], scope=scope)
    nm = len({x["round"] for x in v["not_measured"]})
    if nm:  # the rounds compare_rounds counts as missing include those not measured, which v's notes list with why
        res["notes"] = [n for n in res["notes"] if "a value was missing" not in n]
        if res["n_skipped"] > nm:
            res["notes"].append(f"{res['n_skipped'] - nm} round(s) skipped: a value was missing (None/NaN) in A or B")
    res["notes"] = res["notes"] + v["notes"]
    res["not_measured"] = v["not_measured"]
    if m.over_ok:  # survivors only: a gap in failure shares withholds the claim the failures could have made
        f = rd.failures(pairs, level)
        used = {r for r, a, b in zip(v["round"], v["a"], v["b"], strict=True) if a is not None and b is not None}
        tot = {x: [sum(c for r, c in zip(f["round"], f[f"{x}_{k}"], strict=True) if r in used) for k in ("failed", "total")]
               for x in ("a", "b")}
        if tot["a"][1] and tot["b"][1]:
            res = inf.withhold_for_failure_gap(res, tot["a"][0] / tot["a"][1], tot["b"][0] / tot["b"][1],
                                               rd.FAILURE_GAP_PP)
    res["rounds"] = [{"round": r, "start": s, "order": o, "a": a, "b": b,
                      "ratio": None if a is None or b is None else b / a}
                     for r, s, o, a, b in zip(v["round"], v["start"], v["order"], v["a"], v["b"], strict=True)]
    return res


def unit_log_ratios(pairs: dict, level: str, metric: str, unit: str, *, drop_failed: bool = False
                    ) -> list[float | None]:
    """ln(B/A) per unit in run order: per round, or per server start (the mean of its rounds) in a nested design.
    drop_failed: a round in which an arm failed there (rounds.failed_arms) counts as missing."""
    v = rd.values(pairs, level, metric)
    d = [None if a is None or b is None or (drop_failed and f) else math.log(b / a)
         for a, b, f in zip(v["a"], v["b"], v["failed"], strict=True)]
    if unit != "start":
        return d
    by: dict = {}
    for s, x in zip(v["start"], d, strict=True):
        by.setdefault(s, [])
        if x is not None:
            by[s].append(x)
    return [float(np.mean(xs)) if xs else None for xs in by.values()]


def first_failed_unit(pairs: dict, level: str, metric: str, unit: str) -> int | None:
    """The index (in unit_log_ratios' order) of the first unit holding a round in which an arm failed; None if none."""
    v = rd.values(pairs, level, metric)
    keys = v["round"] if unit != "start" else list(dict.fromkeys(v["start"]))
    for i, k in enumerate(keys):
        rounds = [f for r, s, f in zip(v["round"], v["start"], v["failed"], strict=True)
                  if (r if unit != "start" else s) == k]
        if any(rounds):
            return i
    return None


def headline_fixed(results: dict, alpha: float, scope: str | None = None) -> dict:
    """The primary metric over levels by Holm (inference.decide_levels)."""
    dec = inf.decide_levels(results, alpha, scope=scope)
    return {"rule": "fixed", **dec}


def headline_sequential(pairs: dict, levels: list[str], metric: str, unit: str, seq: dict,
                        fixed_results: dict | None = None, scope: str | None = None, *, final: bool = False) -> dict:
    """The primary metric over levels by the sequential rule on every unit so far (its repeated intervals), with the
    boundary for the units the looks count (min_units..max_units: rounds, or starts in a nested design); `final`:
    no unit is left to run, so this look decides.

    A level without spread in the fixed analysis (`fixed_results`: compare_rounds per level) is no claim here either.
    A level where an arm failed (the failed rounds count as missing) keeps a claim the looks made before its first
    failure (a claim, once made, stays), or makes the one claim its failures can only strengthen (B failed: "slower";
    A failed: "faster", inference.claim_allowed); otherwise it is "failed"."""
    d = {lv: unit_log_ratios(pairs, lv, metric, unit, drop_failed=True) for lv in levels}
    kw = {"min_rounds": seq["min_units"], "max_rounds": seq["max_units"], "alpha": seq["alpha"],
          "margin_pct": seq["margin_pct"], "higher_is_better": METRICS[metric].better == "higher"}
    look = inf.sequential_look(d, final=final, **kw)
    out = {**look, "rule": "sequential", "correction": look["rule"], "settings": seq, "scope": scope}
    kinds = {}
    for lv, row in out["levels"].items():  # the look gives each word the interval that decided it (ci_decision)
        fixed = (fixed_results or {}).get(lv) or {}
        row["failed"] = fixed.get("failed")
        gap = fixed.get("failure_gap") or {}
        if fixed.get("kind") == "no_spread":
            row.update(kind="no_spread", text=fixed["text"], ci_decision=None, ci_decision_what=None)
        elif gap.get("allowed") and row["kind"] in inf.CLAIMS and row["kind"] != gap["allowed"]:
            row.update(kind="inconclusive", text=fixed["text"], ci_decision=None,
                       ci_decision_what=f"withheld: failure shares differ by {gap['gap_pp']:+.1f} pp")
        elif (fixed.get("failed") or {}).get("rounds"):
            first = first_failed_unit(pairs, lv, metric, unit)
            before = (inf.sequential_look(d, look=first, **kw)["levels"][lv]
                      if first is not None and first >= seq["min_units"] else {})
            if before.get("kind") in ("faster", "slower"):  # claimed before the failure: the claim stays
                row.update({k: before[k] for k in ("kind", "ci_decision", "ci_decision_what", "ratio")},
                           text=f"{inf.failure_words(fixed['failed'])} after B was claimed {before['kind']} at look "
                                f"{first}: the claim stays; {before['text']}")
            elif row["kind"] in ("faster", "slower") and row["kind"] == inf.claim_allowed(fixed["failed"]):
                row["text"] = (f"{inf.failure_words(fixed['failed'])}, and {row['kind']} in the rounds where both "
                               f"worked: {row['text']}; the failures can only strengthen it")
            else:
                row.update(kind="failed", text=fixed["text"], ci_decision=None, ci_decision_what=None)
        row["word"] = inf.verdict_word(row["kind"], scope)
        kinds[lv] = row["kind"]
    out["kind"], out["text"] = inf._headline(kinds, scope=scope, failures={lv: r.get("failed")
                                                                             for lv, r in out["levels"].items()})
    out["word"] = inf.verdict_word(out["kind"], scope) if out["kind"] in inf.KINDS else out["kind"]
    out["decided"] = all(k in inf.CLAIMS for k in kinds.values())
    if look["decided"] and not out["decided"]:
        out["reason"] = "the sequential rule decided every level, but an arm failed or showed no spread at one"
    if out["decided"] and not look["stop"]:  # every level claimed, some before a failure: nothing left to decide
        out.update(stop=True, reason="every level decided (a claim made before a failure stays)")
    return out


def _aa(pairs_aa: dict, pairs_ab: dict, level: str, metric: str, confidence: float) -> dict:
    """A/A check of one metric at one level, with the per-round A/B spread beside it."""
    v = rd.values(pairs_aa, level, metric)
    ab = [x for x in unit_log_ratios(pairs_ab, level, metric, "round") if x is not None]
    sd_ab = float(np.std(ab, ddof=1)) if len(ab) >= 2 else None
    return inf.aa_check(v["a"], v["b"], confidence=confidence, ab_sd_log=sd_ab, ab_n=len(ab),
                        label=METRICS[metric].label)


def _design(pairs: dict, level: str, metric: str, design: str, confidence: float) -> dict:
    """Variance components (nested designs: between starts, between window pairs, within a window) and the order
    effect (any design with 2 pairs in each order) of ln(B/A) at one level."""
    v = rd.values(pairs, level, metric)
    rows = [(math.log(b / a), s, o, r) for a, b, s, o, r in zip(v["a"], v["b"], v["start"], v["order"], v["round"],
                                                                 strict=True) if a is not None and b is not None]
    out: dict = {"components": None, "components_reason": None, "order_effect": None}
    if design == "nested":
        within = []
        for _d, _s, _o, r in rows:
            arms = pairs[r]
            wv = [((arms[x]["levels"].get(level) or {}).get("within_var") or {}).get(metric) for x in ("A", "B")]
            within.append(None if None in wv else wv[0] + wv[1])
        d, starts = [x[0] for x in rows], [x[1] for x in rows]
        if None in within:
            within = None
            out["components_reason"] = "a window's sampling variance is unknown (too few requests): no within term"
        try:
            comp = inf.variance_components(d, starts, within_var=within)
            out["components"] = {k: comp[k] for k in ("sigma2_start", "sigma2_pair", "sigma2_within", "raw",
                                                      "truncated", "sd_start", "sd_pair", "n", "n_starts",
                                                      "n_windows", "mean_log", "method")}
            if comp["sigma2_within"] is not None:
                out["components"]["sd_within"] = math.sqrt(comp["sigma2_within"])
        except ValueError as e:
            out["components_reason"] = str(e)
    else:
        out["components_reason"] = (f"design {design}: windows are not nested in several server starts, so the "
                                    "between-start and between-pair variances cannot be told apart")
    orders = [x[2] for x in rows]
    if all(o in ("AB", "BA") for o in orders) and rows:
        out["order_effect"] = inf.order_effect([x[0] for x in rows], orders, confidence=confidence)
    return out


def _continuity(pairs: dict, level: str, confidence: float) -> dict:
    """Streaming continuity of both arms at one level: per-arm means over rounds, and the share of streamed requests
    with an underrun compared as a failure rate (B - A in percentage points)."""
    arms: dict = {}
    for x in ("A", "B"):
        rows = [p[x]["levels"].get(level) or {} for p in pairs.values()]
        arms[x] = {k: mean_or_none([r.get(k) for r in rows]) for k in CONTINUITY_KEYS}
        arms[x]["n_streamed"] = int(sum(r.get("n_streamed") or 0 for r in rows))
    counts = {x: ([], []) for x in ("A", "B")}
    for p in pairs.values():
        for x in ("A", "B"):
            r = p[x]["levels"].get(level) or {}
            n = int(r.get("n_streamed") or 0)
            counts[x][0].append(n - int(r.get("n_continuity_ok") or 0))
            counts[x][1].append(n)
    share = None
    if sum(counts["A"][1]) and sum(counts["B"][1]):
        share = inf.compare_error_rates(counts["A"][0], counts["A"][1], counts["B"][0], counts["B"][1],
                                        confidence=confidence)
        share["text"] = share["text"].replace("failure rate", "streams with an underrun").replace(
            "B fails more", "B stalls more").replace("B fails less", "B stalls less")
    return {"arms": arms, "underrun_share": share, "available": bool(arms["A"]["n_streamed"] or arms["B"]["n_streamed"])}


def mean_or_none(xs) -> float | None:
    xs = [float(x) for x in xs if x is not None]
    return float(np.mean(xs)) if xs else None


def compare(summaries: list[dict], levels: list[str], *, design: str = "fresh", primary: str = PRIMARY_METRIC,
            margin_pct: float = rs.DEFAULT_MARGIN_PCT, confidence: float = 0.95, sequential: dict | None = None,
            final_look: bool = False, metrics: tuple[str, ...] = VERDICT_METRICS) -> dict:
    """comparison.json (without the predictions) from window summaries: also what tools/calibrate.py runs on each
    drawn experiment."""
    unit, scope = rd.DESIGN_UNITS[design], rd.DESIGN_SCOPE[design]
    alpha = round(1.0 - confidence, 12)
    ab, aa = rd.paired_rounds(summaries, "ab"), rd.paired_rounds(summaries, "aa")
    metrics = tuple(dict.fromkeys((primary, *metrics)))
    per_level: dict = {}
    primary_results = {}
    for lv in levels:
        row: dict = {"metrics": {}}
        for m in metrics:
            res = compare_metric(ab, lv, m, unit=unit, margin_pct=margin_pct, confidence=confidence,
                                 bootstrap=BOOTSTRAP if m == primary else 0, scope=scope)
            if m == primary:
                res["role"], res["corrected"] = "primary", True
                primary_results[lv] = res
            else:
                res = inf.mark_secondary(res)
            row["metrics"][m] = res
        row["not_measured"] = row["metrics"][primary].get("not_measured") or []
        f = rd.failures(ab, lv)
        row["error_rate"] = inf.compare_error_rates(f["a_failed"], f["a_total"], f["b_failed"], f["b_total"],
                                                    confidence=confidence)
        row["error_rate"]["rounds_with_failures"] = [r for r, xa, xb in zip(f["round"], f["a_failed"], f["b_failed"],
                                                                            strict=True) if xa or xb]
        row["continuity"] = _continuity(ab, lv, confidence)
        row["aa"] = {m: _aa(aa, ab, lv, m, confidence) for m in metrics} if aa else {}
        row["design"] = _design(ab, lv, primary, design, confidence)
        per_level[lv] = row
    headline = fixed = None
    if levels and primary_results and ab:  # a plain Locust run (one arm) has nothing to decide
        fixed = headline_fixed(primary_results, alpha, scope)
        fixed["metric"] = primary
        headline = fixed
        if sequential:
            headline = headline_sequential(ab, levels, primary, unit, sequential, primary_results, scope,
                                           final=final_look)
            headline["metric"] = primary
    clean = _without_failures(ab, levels, primary, unit, margin_pct, confidence, fixed, alpha)
    aa_warn = [f"c={lv}: {per_level[lv]['aa'][primary]['text']}" for lv in levels
               if per_level[lv]["aa"].get(primary, {}).get("warn")]
    aa_warn_secondary = [f"c={lv}: {r['text']}" for lv in levels for m, r in per_level[lv]["aa"].items()
                         if m != primary and r.get("warn")]
    return {
        "schema": COMPARISON_SCHEMA, "levels": levels, "primary_metric": primary,
        "rounds": {"ab": len(ab), "aa": len(aa)},
        "settings": {
            "confidence": confidence, "alpha": alpha, "margin_pct": margin_pct, "design": design, "unit": unit,
            "estimand": "Per round d = ln(B/A); ratio = exp(mean d); interval = exp(Student t interval of d)"
                        + (" over server starts (each start's mean d)" if unit == "start" else " over rounds"),
            "decision": f"Faster/slower when the {100 * confidence:g} % interval excludes 1; equivalent within "
                        f"±{margin_pct:g} % by two one-sided tests at alpha {alpha:g}; otherwise inconclusive",
            "multiplicity": f"Primary metric {METRICS[primary].label}: "
                            + ("the sequential rule (Holm over levels on its sequential p-values)" if sequential
                               else f"Holm over {len(levels)} level(s)")
                            + " decides the headline; every other metric is an estimate with its own interval, "
                              "secondary and uncorrected",
            "bootstrap": f"A percentile bootstrap ({BOOTSTRAP} resamples over the units) of the primary metric is a "
                         "diagnostic, never the verdict",
            "sequential": sequential,
            "scope": scope,
            "failed_share": rd.FAILED_SHARE,
            "failure_rule": (f"an arm failed at a level in a round when at least {100 * rd.FAILED_SHARE:g} % of its "
                             "measure-phase requests there failed; such a level is a finding of its own and no speed "
                             "claim is made there from the other rounds. A window-level with no failed request that "
                             "measured nothing (no measure-phase request started, or no output) is invalid (not "
                             "measured), left out and listed, never failed"),
            "swap_note": ("one server start holds every window: the interval is conditional on that start "
                          "(start-to-start variance is not in it; a nested design measures it), so every verdict "
                          f"reads '{scope}'") if design == "swap" else None,
        },
        "headline": headline, "headline_fixed": fixed if sequential else None, "without_failures": clean,
        "aa_warnings": aa_warn, "aa_warnings_secondary": aa_warn_secondary, "per_level": per_level,
    }


def _without_failures(ab: dict, levels: list[str], primary: str, unit: str, margin_pct: float, confidence: float,
                      fixed: dict | None, alpha: float) -> dict | None:
    """The second analysis of the primary metric: at each level, only the rounds in which neither window had a failed
    measure-phase request there (Holm over levels as in the first). None when no round had a failure (it would equal
    the first). `differs` lists the levels whose decision changes."""
    left_out = {lv: [r for r, arms in ab.items() if not rd.without_failures(lv)(r, arms)] for lv in levels}
    if fixed is None or not any(left_out.values()):
        return None
    results = {lv: compare_metric(ab, lv, primary, unit=unit, margin_pct=margin_pct, confidence=confidence,
                                  keep=rd.without_failures(lv)) for lv in levels}
    dec = inf.decide_levels(results, alpha)
    differs = [lv for lv in levels if dec["levels"][lv]["kind"] != fixed["levels"][lv]["kind"]]
    return {"rule": "rounds in which neither window had a failed measure-phase request at that level",
            "left_out": left_out, "headline": dec, "levels": results, "differs": differs}

"""The verdict over concurrency levels: Holm on the levels' difference tests and on their TOSTs, and the headline.

Pure functions of compare_rounds results (core.py), one per level; docs/method.md section 3 explains the rules.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from .core import CLAIMS, KINDS, _interval, failure_words, rounds_needed, verdict_word


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm (1979) step-down adjusted p-values; None (no test possible) passes through and does not count."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    m, out, running = len(idx), list(pvalues), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def _headline(kinds: Mapping, *, scope: str | None = None, failures: Mapping | None = None) -> tuple[str, str]:
    """One kind and one sentence from the per-level kinds (level keys are shown as given).

    A failed level is the headline's first finding ("B failed at c=8 in 1 of 3 rounds", from `failures`: level ->
    compare_rounds' `failed`), and the headline kind is then "failed": no level's speed claim outranks an arm that
    produced nothing. A level without spread comes next ("no spread at c=8: check the set-up"): identical
    measurements say the set-up is wrong. `scope` qualifies every claim word ("faster in this server start")."""
    by: dict[str, list[str]] = {k: [] for k in KINDS}
    failed_at = [lv for lv, k in kinds.items() if k == "failed" or ((failures or {}).get(lv) or {}).get("rounds")]
    for lvl, k in kinds.items():
        by["failed" if lvl in failed_at else k].append(str(lvl))
    total = len(kinds)
    w = {k: verdict_word(k, scope) for k in KINDS}
    parts = [f"{w[k]} at {len(v)} of {total} level{'s' if total != 1 else ''} ({', '.join(v)})" for k, v in by.items()
             if v and k not in ("failed", "no_spread")]
    flat = f"no spread at c={', '.join(by['no_spread'])}: check the set-up" if by["no_spread"] else ""
    if failed_at:
        found = "; ".join(failure_words((failures or {}).get(lv) or {"by_arm": {"an arm": 1}, "of": 1}, f"at c={lv}")
                          + (f" (B {w[kinds[lv]]} there in the rounds where both worked)" if kinds[lv] in CLAIMS else
                             ": no speed claim there") for lv in failed_at)
        rest = "; ".join(x for x in (flat, *parts) if x)
        return "failed", found + (f"; elsewhere {rest}" if rest else "")
    if flat:
        return "no_spread", flat + (f"; elsewhere {'; '.join(parts)}" if parts else "")
    if total and len(by["faster"]) == total:
        return "faster", f"B {w['faster']} at every level ({', '.join(by['faster'])})"
    if total and len(by["slower"]) == total:
        return "slower", f"B {w['slower']} at every level ({', '.join(by['slower'])})"
    if total and len(by["equivalent"]) == total:
        return "equivalent", f"{w['equivalent']} at every level ({', '.join(by['equivalent'])})"
    if by["faster"] and by["slower"]:
        return "mixed", "mixed: " + "; ".join(parts)
    if by["faster"]:
        return "faster", "B " + "; ".join(parts)
    if by["slower"]:
        return "slower", "B " + "; ".join(parts)
    return "inconclusive", "; ".join(parts) if parts else "no levels"


def decide_levels(results_by_level: Mapping, alpha: float | None = None, *, scope: str | None = None) -> dict:
    """The headline of the primary metric over concurrency levels: Holm on the difference tests and on the TOSTs.

    A difference ("faster"/"slower") is claimed at a level when its Holm-adjusted p-value is <= alpha: the chance of
    any false difference claim over the levels stays <= alpha whatever their dependence. Equivalence likewise: Holm
    on the levels' TOST p-values (a level is "equivalent", or a claim "within the margin", when its adjusted TOST
    p-value is < alpha), so the chance that any card says "equivalent" where the truth lies on or beyond the margin
    stays <= alpha (per level it was 19 % over 4 levels on the margin). `ci_simultaneous` is the Bonferroni
    interval at 1 - alpha/L for display beside Holm. `results_by_level` maps a level to compare_rounds' result.

    `ci_decision` is the interval that decided the word (`ci_decision_what` names it): for a difference claim the
    interval at the level Holm tested it at, 1 - alpha/(L - k) at step k (it excludes 1 exactly when that step
    rejects); for "equivalent" the TOST interval at its Holm step, 1 - 2 alpha/(L - k), inside the margin exactly
    when that step rejects; for "inconclusive" the Bonferroni
    interval at 1 - alpha/L, which contains 1 whenever Holm does not claim. A "failed" or "no_spread" level is never a
    claim (a failed level's p-value still counts in Holm's L: leaving it out would loosen the others).
    """
    if not results_by_level:
        raise ValueError("decide_levels needs at least one level")
    levels = list(results_by_level)
    if alpha is None:
        alphas = {round(r["alpha"], 12) for r in results_by_level.values()}
        if len(alphas) != 1:
            raise ValueError(f"levels were compared at different confidences {sorted(alphas)}: pass alpha")
        alpha = alphas.pop()
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
    raw = [results_by_level[lv]["p_value"] for lv in levels]
    adjusted = holm(raw)
    n_tested = sum(p is not None for p in adjusted)
    step = {levels[i]: k for k, i in enumerate(sorted((i for i, p in enumerate(raw) if p is not None),
                                                      key=lambda i: raw[i]))}  # holm()'s order
    raw_tost = [results_by_level[lv]["p_tost"] for lv in levels]
    adjusted_tost = holm(raw_tost)
    n_tost = sum(p is not None for p in raw_tost)
    step_tost = {levels[i]: k for k, i in enumerate(sorted((i for i, p in enumerate(raw_tost) if p is not None),
                                                           key=lambda i: raw_tost[i]))}
    per_level, kinds = {}, {}
    for lv, p_holm, p_tost_holm in zip(levels, adjusted, adjusted_tost, strict=True):
        r = results_by_level[lv]
        row = {k: r.get(k) for k in ("ratio", "ci", "ci_tost", "p_value", "p_tost", "n", "unit", "equivalent", "gain",
                                     "mean_log", "sd_log", "se", "df", "margin_pct", "failed")}
        row["p_holm"], row["p_tost_holm"] = p_holm, p_tost_holm
        row["equivalent"] = bool(r.get("equivalent")) and p_tost_holm is not None and p_tost_holm < alpha
        row["ci_simultaneous"] = row["ci_decision"] = row["ci_decision_what"] = None
        if r["se"] is not None and n_tested:
            lo, hi = _interval(r["mean_log"], r["se"], r["df"], 1.0 - alpha / n_tested)
            row["ci_simultaneous"] = [math.exp(lo), math.exp(hi)]
        holm_kind = None
        if p_holm is not None and p_holm <= alpha and r["mean_log"] != 0:
            holm_kind = "faster" if (r["mean_log"] > 0) == r["higher_is_better"] else "slower"
        gap = r.get("failure_gap") or {}
        if gap.get("allowed"):  # a metric over ok requests: no claim and no equivalence the failures could have made
            row["equivalent"] = False
        if (r.get("failed") or {}).get("rounds") and r["kind"] != "no_spread" and (
                holm_kind is None or holm_kind != r.get("claim_allowed")):
            kind = "failed"  # a failed level claims only what its failures can strengthen
        elif r["kind"] in ("failed", "no_spread"):
            kind = r["kind"]
        elif gap.get("allowed") and holm_kind != gap["allowed"]:
            kind = "inconclusive"
            row["ci_decision"], row["ci_decision_what"] = None, f"withheld: failure shares differ by {gap['gap_pp']:+.1f} pp"
        elif holm_kind is not None:
            kind = holm_kind
            level_k = 1.0 - alpha / (n_tested - step[lv])
            lo, hi = _interval(r["mean_log"], r["se"], r["df"], level_k)
            row["ci_decision"] = [math.exp(lo), math.exp(hi)]
            row["ci_decision_what"] = f"Holm step {step[lv] + 1} of {n_tested}: {100 * level_k:.4g} % interval"
        elif row["equivalent"]:
            kind = "equivalent"
            row["ci_decision"], row["ci_decision_what"] = _tost_step_interval(r, alpha, step_tost[lv], n_tost)
        else:
            kind = "inconclusive"
            row["ci_decision"] = row["ci_simultaneous"]
            if row["ci_decision"] is not None:
                row["ci_decision_what"] = (f"Bonferroni over {n_tested} level(s): {100 * (1 - alpha / n_tested):.4g} % "
                                           "interval, contains 1")
        row["kind"] = kinds[lv] = kind
        row["word"] = verdict_word(kind, scope)
        row["rounds_needed"], row["rounds_needed_assumption"] = 0, ""
        if kind == "inconclusive" and r["n"] >= 2 and r["sd_log"]:  # a claim must pass Holm's strictest step
            row["rounds_needed"], why = rounds_needed(r["n"], r["mean_log"], r["sd_log"], alpha=alpha / n_tested,
                                                      alpha_equivalence=alpha, margin_log=r["margin_log"],
                                                      unit=r["unit"])
            row["rounds_needed_assumption"] = f"{why}; claim at alpha/{n_tested} = {alpha / n_tested:.3g} (Holm)"
        elif kind in ("inconclusive", "failed", "no_spread"):
            row["rounds_needed"], row["rounds_needed_assumption"] = r["rounds_needed"], r["rounds_needed_assumption"]
        row["text"] = _level_text(r, row, kind, n_tost)
        per_level[lv] = row
    kind, text = _headline(kinds, scope=scope, failures={lv: r.get("failed") for lv, r in results_by_level.items()})
    return {"kind": kind, "word": verdict_word(kind, scope) if kind in KINDS else kind, "text": text,
            "decided": all(k in CLAIMS for k in kinds.values()), "scope": scope, "alpha": alpha, "levels": per_level,
            "correction": f"Holm over {n_tested} level(s) for difference claims; Holm over {n_tost} level(s) on the "
                          f"TOST p-values for equivalence"}


def _tost_step_interval(r: Mapping, alpha: float, step: int, n_tost: int) -> tuple[list[float], str]:
    """The TOST interval Holm tested a level's equivalence at: 1 - 2 alpha / (L - k) at step k (with one level, the
    ordinary 1 - 2 alpha interval); it lies inside the margin exactly when that step rejects."""
    a_k = alpha / (n_tost - step)
    lo, hi = _interval(r["mean_log"], r["se"], r["df"], 1.0 - 2.0 * a_k)
    where = f"Holm step {step + 1} of {n_tost}: " if n_tost > 1 else ""
    return [math.exp(lo), math.exp(hi)], f"{where}{100 * (1 - 2 * a_k):.4g} % TOST interval, inside ±{r['margin_pct']:g} %"


def _level_text(r: Mapping, row: Mapping, kind: str, n_tost: int) -> str:
    """A level's sentence after the corrections: compare_rounds' own when nothing changed, else the corrected word
    with the interval that decided it."""
    margin_note = f"; the difference lies within the ±{r['margin_pct']:g} % margin"
    text = r["text"]
    if r.get("equivalent") and not row["equivalent"]:
        text = text.replace(margin_note, "")  # Holm over the TOSTs did not keep "within the margin"
    if kind == r["kind"] and (kind != "equivalent" or n_tost == 1):
        return text
    ci, what = row["ci_decision"], row["ci_decision_what"]
    shown = f" [{ci[0]:.3f}, {ci[1]:.3f}] ({what})" if ci else ""
    if kind == "equivalent":
        return f"{row['word']} within ±{r['margin_pct']:g} %: B ×{r['ratio']:.3f}{shown}"
    if r["kind"] == "equivalent":
        return (f"{row['word']} after Holm over {n_tost} levels: B ×{r['ratio']:.3f}{shown}; equivalent at this level "
                f"alone (TOST p {r['p_tost']:.3g}, Holm-adjusted {row['p_tost_holm']:.3g})")
    return f"{row['word']} after Holm: {text}"

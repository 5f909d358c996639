"""Failure rates: Wilson and Newcombe intervals, targets, the arms' error rates compared."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import special as sc

from .core import _check_confidence, _interval, _mean_se, _t_p

# ----------------------------------------------------------------------------------------------- failures


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson (1927) score interval of a proportion k/n; (0, 1) when n is 0."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"wilson needs 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    z = float(sc.ndtri(0.5 + _check_confidence(confidence) / 2))
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def target_met(k: int, n: int, target: float, *, at_most: bool = True, confidence: float = 0.95) -> str:
    """How a measured rate k/n stands against a target (a rate at most / at least `target`), by its Wilson interval:
    "met" when the whole interval is on the target's side, "violated" when the whole interval is beyond it, and
    "not shown to violate" when the interval straddles it (a rule at exactly its nominal level always lands there)."""
    lo, hi = wilson(k, n, confidence)
    inside, beyond = (hi <= target, lo > target) if at_most else (lo >= target, hi < target)
    return "met" if inside else "violated" if beyond else "not shown to violate"


def newcombe(k1: int, n1: int, k2: int, n2: int, confidence: float = 0.95) -> tuple[float, float]:
    """Newcombe (1998, method 10) hybrid score interval of p1 - p2 from two Wilson intervals."""
    p1, p2 = k1 / n1, k2 / n2
    l1, u1 = wilson(k1, n1, confidence)
    l2, u2 = wilson(k2, n2, confidence)
    d = p1 - p2
    return d - math.sqrt((p1 - l1) ** 2 + (u2 - p2) ** 2), d + math.sqrt((u1 - p1) ** 2 + (p2 - l2) ** 2)


def _counts(name: str, values: Sequence) -> list[int]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or v is None or float(v) != int(v) or int(v) < 0:
            raise ValueError(f"{name}[{i}] = {v!r}: counts must be whole numbers >= 0")
        out.append(int(v))
    return out


def compare_error_rates(a_failed: Sequence, a_total: Sequence, b_failed: Sequence, b_total: Sequence, *,
                        confidence: float = 0.95) -> dict:
    """Failure rate of B minus A in percentage points, per round counts in, with an interval that behaves at 0.

    Two intervals, and the reported one is their hull: a paired t interval on the per-round rate differences (the
    round is the unit, so round-to-round variation is in it) and Newcombe's hybrid score interval on the pooled
    counts (sensible at 0 failures and for rare events, where the t interval collapses to a point). A difference is
    claimed only when both agree, so neither approximation's weak spot can make the claim alone; with one round, or
    the same difference in every round, there is no paired interval and so no claim (`no_claim_reason`).
    """
    level = _check_confidence(confidence)
    cols = [_counts(n, v) for n, v in (("a_failed", a_failed), ("a_total", a_total), ("b_failed", b_failed),
                                       ("b_total", b_total))]
    if len({len(c) for c in cols}) != 1:
        raise ValueError("a_failed, a_total, b_failed, b_total must have one count per round each")
    fa, ta, fb, tb = cols
    rows, skipped = [], 0
    for i, (xa, na, xb, nb) in enumerate(zip(fa, ta, fb, tb, strict=True)):
        if xa > na or xb > nb:
            raise ValueError(f"round {i}: more failures than requests ({xa}/{na} in A, {xb}/{nb} in B)")
        if na == 0 or nb == 0:
            skipped += 1
            continue
        rows.append((xa, na, xb, nb))
    out = {"confidence": level, "n": len(rows), "n_skipped": skipped, "diff_pp": None, "ci_pp": None,
           "ci_t_pp": None, "ci_newcombe_pp": None, "pooled_diff_pp": None, "rate_a": None, "rate_b": None,
           "kind": "inconclusive", "text": "", "p_value": None, "no_claim_reason": None,
           "method": "hull of a paired t interval over rounds and Newcombe's hybrid score interval on pooled counts"}
    if not rows:
        out["text"] = "inconclusive: no round with requests in both arms"
        return out
    xa, na, xb, nb = (sum(r[j] for r in rows) for j in range(4))
    diffs = np.array([r[2] / r[3] - r[0] / r[1] for r in rows], dtype=float)
    n, mean, sd, se = _mean_se(diffs)
    nlo, nhi = newcombe(xb, nb, xa, na, level)
    lo, hi = nlo, nhi
    out.update(rate_a=xa / na, rate_b=xb / nb, pooled_diff_pp=100 * (xb / nb - xa / na), diff_pp=100 * mean,
               ci_newcombe_pp=[100 * nlo, 100 * nhi])
    if se is not None and se > 0:
        tlo, thi = _interval(mean, se, n - 1, level)
        out["ci_t_pp"] = [100 * tlo, 100 * thi]
        out["p_value"] = _t_p(mean, se, n - 1)
        lo, hi = min(lo, tlo), max(hi, thi)
    lo, hi = max(lo, -1.0), min(hi, 1.0)  # a difference of two rates lies in [-1, 1]
    out["ci_pp"] = [100 * lo, 100 * hi]
    why = None
    if out["ci_t_pp"] is None and (xa or xb):  # the hull needs both intervals: Newcombe alone treats requests as independent
        why = ("one round: no round-to-round spread to put beside the pooled counts" if n < 2 else
               "no spread in the per-round differences: the paired interval is a point")
    elif lo > 0:
        out["kind"] = "more_failures"
    elif hi < 0:
        out["kind"] = "fewer_failures"
    out["no_claim_reason"] = why
    if why:  # no interval decided this "inconclusive" (the paired one is missing): none is shown beside the word
        out["ci_pp"] = None
    words = {"more_failures": "B fails more", "fewer_failures": "B fails less", "inconclusive": "inconclusive"}
    shown = "" if why else f" [{100 * lo:+.2f}, {100 * hi:+.2f}]"
    out["text"] = (f"{words[out['kind']]}: failure rate B {100 * xb / nb:.2f} % vs A {100 * xa / na:.2f} %, "
                   f"B − A {100 * mean:+.2f} pp{shown} over {n} round(s)"
                   + (f"; no claim: {why}" if why else ""))
    return out

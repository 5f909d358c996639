"""Sequential rounds: the O'Brien-Fleming-shaped boundary from simulated null paths, the look, the repeated
interval. Pure functions of per-unit ln(B/A) values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
from scipy import special as sc

from ttsrecords.runsettings import MAX_SEQ_UNITS, MIN_UNITS

from .core import SEQ_SEED, _check_margin, _headline, _mean_se, _number, holm

SEQ_PATHS = 200_000  # simulated null paths behind the sequential boundary (level known to about ±0.05 points)
LOG_BOUND_CAP = math.log(1e6)  # a repeated interval's bound beyond a ratio of 1e6 (or 1e-6) is shown there: unbounded


def sequential_claim_interval(d: Sequence, *, min_rounds: int, max_rounds: int, alpha_step: float) -> list | None:
    """The repeated interval (as ratios) that decides a sequential difference claim made at Holm's level alpha_step
    (alpha / (L - k) at step k): the same O'Brien-Fleming boundary as sequential_look, intersected over the looks, so
    it excludes 1 when the claim is made. `d` holds the level's per-unit ln(B/A) (None/NaN skipped, as there)."""
    vals = np.array([x for i, v in enumerate(d) if (x := _number("d", i, v)) is not None], dtype=float)
    two, one = _null_maxima(int(min_rounds), int(max_rounds))
    c = _mc_quantile(two, alpha_step)
    s = _sequential_level(vals, min_rounds=min_rounds, max_rounds=max_rounds, c_diff=c, c_eq=_mc_quantile(one, 0.05),
                          two=two, delta=0.0)
    return None if s["ci_log"] is None else [math.exp(x) for x in s["ci_log"]]


# ----------------------------------------------------------------------------------------------- sequential rounds


def _z_path(x: np.ndarray, looks: np.ndarray) -> np.ndarray:
    """t statistic of mean == 0 at each look n (rows are paths), mapped to the normal scale by its p-value."""
    n = looks.astype(float)
    s1 = np.cumsum(x, axis=-1)[..., looks - 1]
    s2 = np.cumsum(x * x, axis=-1)[..., looks - 1]
    mean = s1 / n
    var = np.maximum(s2 - n * mean * mean, 0.0) / (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / np.sqrt(var / n)
    t = np.where(np.isnan(t), 0.0, t)
    return np.sign(t) * -sc.ndtri(sc.stdtr(n - 1, -np.abs(t)))


@lru_cache(maxsize=32)
def _null_maxima(min_rounds: int, max_rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted maxima over looks of |z_n| sqrt(n/N) and of z_n sqrt(n/N) on simulated null paths (normal noise).

    The t statistic's path under "true mean = theta" does not depend on theta or on the spread (it is pivotal), so
    these samples give the exact boundary of the O'Brien-Fleming shape for any data, up to Monte Carlo error.
    """
    rng = np.random.default_rng(SEQ_SEED)
    looks = np.arange(min_rounds, max_rounds + 1)
    w = np.sqrt(looks / max_rounds)
    two, one = np.empty(SEQ_PATHS), np.empty(SEQ_PATHS)
    chunk = max(1, 2_000_000 // max_rounds)
    for start in range(0, SEQ_PATHS, chunk):
        k = min(chunk, SEQ_PATHS - start)
        z = _z_path(rng.standard_normal((k, max_rounds)), looks) * w
        two[start:start + k] = np.abs(z).max(axis=1)
        one[start:start + k] = z.max(axis=1)
    return np.sort(two), np.sort(one)


def _mc_margin(p: float, paths: int) -> float:
    """Two Monte Carlo standard errors of a simulated tail probability p: the boundary errs on the safe side."""
    return 2.0 * math.sqrt(p * (1.0 - p) / paths)


def _mc_quantile(sorted_m: np.ndarray, tail: float) -> float:
    """The constant C with P(M >= C) <= tail, from sorted simulated maxima: the empirical quantile at
    tail - 2 Monte Carlo standard errors, so the true level is below `tail` unless the simulation is 2 se off."""
    paths = len(sorted_m)
    safe = max(tail - _mc_margin(tail, paths), 1.0 / (paths + 1))
    idx = min(paths - 1, max(0, math.ceil((1.0 - safe) * (paths + 1)) - 1))
    return float(sorted_m[idx])


def _mc_pvalue(sorted_m: np.ndarray, observed: float) -> float:
    """Monte Carlo p-value (1 + #{M >= observed}) / (P + 1), plus 2 Monte Carlo standard errors (as _mc_quantile)."""
    paths = len(sorted_m)
    count = paths - int(np.searchsorted(sorted_m, observed, side="left"))
    p = (1 + count) / (paths + 1)
    return min(1.0, p + _mc_margin(p, paths))


def sequential_boundary(min_rounds: int, max_rounds: int, alpha: float, *, one_sided: bool = False) -> dict:
    """Critical t values per look n = min_rounds..max_rounds of the sequential rule at overall level alpha.

    Boundary on the normal scale: C / sqrt(n / max_rounds) (the O'Brien-Fleming shape: strict early, near the
    fixed-sample value at the end); the t statistic is put on that scale through its p-value; C is set so that the
    chance that a true-null path ever crosses (either side, or the upper side if one_sided) is alpha.
    """
    _check_rounds(min_rounds, max_rounds)
    two, one = _null_maxima(int(min_rounds), int(max_rounds))
    c = _mc_quantile(one if one_sided else two, alpha)
    looks = np.arange(min_rounds, max_rounds + 1)
    z = c / np.sqrt(looks / max_rounds)
    t = _t_of_tail(looks - 1, sc.ndtr(-z))
    return {"C": c, "looks": looks.tolist(), "z": z.tolist(), "t": t.tolist(), "alpha": alpha,
            "one_sided": one_sided, "paths": SEQ_PATHS, "seed": SEQ_SEED}


def _check_rounds(min_rounds: int, max_rounds: int) -> None:
    if int(min_rounds) != min_rounds or int(max_rounds) != max_rounds:
        raise ValueError("min_rounds and max_rounds must be whole numbers")
    if not MIN_UNITS <= min_rounds <= max_rounds:
        raise ValueError(f"need {MIN_UNITS} <= min_rounds <= max_rounds, got {min_rounds}, {max_rounds}")
    if max_rounds > MAX_SEQ_UNITS:
        raise ValueError(f"max_rounds {max_rounds} > {MAX_SEQ_UNITS}: use a fixed design (the boundary is simulated per "
                         "look)")


def _t_crit(looks: np.ndarray, c: float, max_rounds: int) -> np.ndarray:
    """Critical |t| at each look n: the t value with the same tail probability as z = C / sqrt(n / max_rounds)."""
    z = c / np.sqrt(looks / max_rounds)
    return _t_of_tail(looks - 1, sc.ndtr(-z))


def _t_of_tail(df, tail):
    """The t value (df degrees of freedom) with upper-tail probability `tail`; +inf where the tail underflowed to 0
    (stdtrit(df, 0) is -inf, which would flip an interval inside out)."""
    tail = np.asarray(tail, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(tail > 0, -sc.stdtrit(df, np.where(tail > 0, tail, 0.5)), np.inf)


def _sequential_level(d: np.ndarray, *, min_rounds: int, max_rounds: int, c_diff: float, c_eq: float,
                      two: np.ndarray, delta: float) -> dict:
    """Running statistics of one level over its looks: sequential p, repeated intervals (intersected), decisions."""
    d = d[:max_rounds]
    n_used = int(d.size)
    _, mean_all, sd_all, _ = _mean_se(d)
    out = {"n": n_used, "mean_log": None if n_used == 0 else mean_all, "sd_log": sd_all, "p_sequential": None,
           "ci_log": None, "ci_equivalence_log": None, "equivalent_at": None, "empty": False}
    if n_used < min_rounds:
        return out
    looks = np.arange(min_rounds, n_used + 1)
    n = looks.astype(float)
    x = d - d[0]  # centred on the first value: prefix sums of squares stay accurate
    s1, s2 = np.cumsum(x)[looks - 1], np.cumsum(x * x)[looks - 1]
    mean_c = s1 / n
    sd = np.sqrt(np.maximum(s2 - n * mean_c * mean_c, 0.0) / (n - 1))
    mean = mean_c + d[0]
    sd = np.where(sd < 1e-12 * np.maximum(1.0, np.abs(mean)), 0.0, sd)  # as _mean_se: identical values, no spread
    se = sd / np.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(se > 0, mean / se, np.where(mean == 0, 0.0, np.copysign(np.inf, mean)))
    z = np.sign(t) * -sc.ndtri(sc.stdtr(n - 1, -np.abs(t)))
    m_obs = float(np.max(np.abs(z) * np.sqrt(n / max_rounds)))
    with np.errstate(invalid="ignore"):
        hd = np.where(se > 0, _t_crit(looks, c_diff, max_rounds) * se, 0.0)
        he = np.where(se > 0, _t_crit(looks, c_eq, max_rounds) * se, 0.0)
    lo_e, hi_e = np.maximum.accumulate(mean - he), np.minimum.accumulate(mean + he)
    inside = np.flatnonzero((lo_e > -delta) & (hi_e < delta))
    lo_d, hi_d = float(np.max(mean - hd)), float(np.min(mean + hd))
    # early looks have boundaries of thousands of se (t with 1-2 df at a tiny tail): bounds stay finite on the log
    # scale, clipped at +-LOG_BOUND_CAP, so exp() and JSON never see an overflow or an infinity
    lo_d, hi_d = max(lo_d, -LOG_BOUND_CAP), min(hi_d, LOG_BOUND_CAP)
    lo_e, hi_e = np.clip(lo_e, -LOG_BOUND_CAP, LOG_BOUND_CAP), np.clip(hi_e, -LOG_BOUND_CAP, LOG_BOUND_CAP)
    out.update(p_sequential=_mc_pvalue(two, m_obs), ci_log=[lo_d, hi_d],
               ci_equivalence_log=[float(lo_e[-1]), float(hi_e[-1])],
               equivalent_at=int(looks[inside[0]]) if inside.size else None,
               empty=lo_d > hi_d or lo_e[-1] > hi_e[-1])
    return out


def sequential_look(d_values_by_level: Mapping, *, look: int | None = None, min_rounds: int, max_rounds: int,
                    alpha: float = 0.05, margin_pct: float, higher_is_better: bool, final: bool = False) -> dict:
    """The state of a sequential experiment after `look` rounds: may it stop, and what does it say per level?

    `d_values_by_level` maps a level to its per-round ln(B/A) (None/NaN = missing round; see log_ratios); only the
    first `look` rounds are used (default: all). Looks are taken after every round from min_rounds on, and the rule
    holds whatever happens in between. Per level: a sequential t test whose boundary has the O'Brien-Fleming shape,
    calibrated on the exact (pivotal) null distribution of the t path; Holm over levels on its sequential p-values
    decides differences; the repeated interval at one-sided alpha per side (intersected over looks) decides
    equivalence. Every claim, once made, stays. stop: every level decided, max_rounds reached, or `final` (the
    plan has no unit left, e.g. units were lost to failed windows): the last look decides, it never says continue.
    min_rounds / max_rounds count the units of `d_values_by_level` (rounds, or server starts in a nested design).
    """
    _check_rounds(min_rounds, max_rounds)
    margin = _check_margin(margin_pct)
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
    if not d_values_by_level:
        raise ValueError("sequential_look needs at least one level")
    if look is not None and look < 0:
        raise ValueError(f"look must be >= 0, got {look}")
    delta = math.log1p(margin / 100.0)
    levels = list(d_values_by_level)
    n_levels = len(levels)
    values, rounds_seen, notes = {}, 0, []
    for lv in levels:
        raw = list(d_values_by_level[lv])
        raw = raw if look is None else raw[:look]
        rounds_seen = max(rounds_seen, len(raw))
        vals = []
        for i, v in enumerate(raw):
            f = _number(f"d[{lv}]", i, v)
            if f is not None:
                if math.isinf(f):
                    raise ValueError(f"d[{lv}][{i}] = {f!r}: a log ratio must be finite")
                vals.append(f)
        if len(vals) < len(raw):
            notes.append(f"{lv}: {len(raw) - len(vals)} missing round(s) skipped")
        if len(vals) > max_rounds:
            notes.append(f"{lv}: only the first {max_rounds} rounds are used (max_rounds)")
        values[lv] = np.array(vals, dtype=float)
    two, one = _null_maxima(int(min_rounds), int(max_rounds))
    c_diff = _mc_quantile(two, alpha / n_levels)  # simultaneous (Bonferroni) repeated intervals for display
    c_eq = _mc_quantile(one, alpha)
    stats = {lv: _sequential_level(values[lv], min_rounds=min_rounds, max_rounds=max_rounds, c_diff=c_diff,
                                   c_eq=c_eq, two=two, delta=delta) for lv in levels}
    adjusted = holm([stats[lv]["p_sequential"] for lv in levels])
    per_level, kinds = {}, {}
    for lv, p_holm in zip(levels, adjusted, strict=True):
        s = stats[lv]
        row = {"n": s["n"], "ratio": None if s["mean_log"] is None else math.exp(s["mean_log"]),
               "p_sequential": s["p_sequential"], "p_holm": p_holm, "ci": None, "ci_equivalence": None,
               "equivalent": s["equivalent_at"] is not None, "equivalent_at": s["equivalent_at"]}
        if s["ci_log"] is not None:
            row["ci"] = [math.exp(x) for x in s["ci_log"]]
            row["ci_equivalence"] = [math.exp(x) for x in s["ci_equivalence_log"]]
        if s["empty"]:
            notes.append(f"{lv}: the repeated intervals no longer overlap (the effect drifted between rounds)")
        if p_holm is not None and p_holm <= alpha and s["mean_log"]:
            kind = "faster" if (s["mean_log"] > 0) == bool(higher_is_better) else "slower"
        elif row["equivalent"]:
            kind = "equivalent"
        else:
            kind = "inconclusive"
        row["kind"] = kinds[lv] = kind
        if row["ci"] is None:
            row["text"] = f"{lv}: waiting for {min_rounds} rounds ({s['n']} so far)"
        elif kind == "equivalent":
            row["text"] = (f"equivalent within ±{margin:g} %: B ×{row['ratio']:.3f}, repeated interval "
                           f"[{row['ci_equivalence'][0]:.3f}, {row['ci_equivalence'][1]:.3f}]")
        else:
            lo, hi = s["ci_log"]
            row["text"] = f"{kind}: B ×{row['ratio']:.3f} [{math.exp(lo):.3f}, {math.exp(hi):.3f}] (sequential)"
        per_level[lv] = row
    kind, text = _headline(kinds)
    decided = all(k != "inconclusive" for k in kinds.values())
    at_max = rounds_seen >= max_rounds
    stop = decided or at_max or final
    reason = ("every level decided" if decided else f"max_rounds ({max_rounds}) reached: undecided levels stay "
              "inconclusive" if at_max else f"last look ({rounds_seen} of {max_rounds} units, no unit left to run): "
              "undecided levels stay inconclusive" if final else "continue: not every level is decided")
    return {"stop": stop, "reason": reason, "decided": decided, "kind": kind, "text": text, "look": rounds_seen,
            "levels": per_level, "alpha": alpha, "margin_pct": margin, "notes": notes,
            "rule": (f"sequential t test after every round from {min_rounds} to {max_rounds}; O'Brien-Fleming shaped "
                     f"boundary C/sqrt(n/{max_rounds}) calibrated on {SEQ_PATHS} simulated null paths (seed "
                     f"{SEQ_SEED}); Holm over {n_levels} level(s) for differences; equivalence by repeated intervals "
                     f"at one-sided alpha={alpha:g}"),
            "boundary": {"C_difference_simultaneous": c_diff, "C_equivalence": c_eq}}

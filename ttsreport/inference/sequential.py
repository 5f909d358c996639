"""Sequential rounds: a plain t test at the first look on a share of alpha, the O'Brien-Fleming-shaped boundary from
simulated null paths on the rest, the look, the repeated interval. Pure functions of per-unit ln(B/A) values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
from scipy import special as sc

from ttsrecords.runsettings import MAX_SEQ_UNITS, MIN_UNITS

from .core import NO_SPREAD_LOG, SEQ_SEED, _check_margin, _mean_se, _number
from .levels import _headline, holm

SEQ_PATHS = 200_000  # simulated null paths behind the sequential boundary (level known to about ±0.05 points)
LOG_BOUND_CAP = math.log(1e6)  # a repeated interval's bound beyond a ratio of 1e6 (or 1e-6) is shown there: unbounded
# Share of a difference test's alpha spent at the first look on a plain t test (Bonferroni split with the
# O'Brien-Fleming sequence, which gets the rest): an O'Brien-Fleming boundary at 2-3 units is a t quantile with 1-2
# df at a tail of 1e-8 or less, so no effect however large could stop there. 0.3: a 10 % effect at 1 % per-round
# spread is decided at a first look of 3 rounds 98 % of the time, at 0.4-0.5 points of power for small effects
# later (docs/method.md, section 5; reports/bench/verdicts-synthetic.md).
FIRST_LOOK_SHARE = 0.3


def sequential_claim_interval(d: Sequence, *, min_rounds: int, max_rounds: int, alpha_step: float) -> list | None:
    """The repeated interval (as ratios) that decides a sequential difference claim made at Holm's level alpha_step
    (alpha / (L - k) at step k): the same O'Brien-Fleming boundary as sequential_look, intersected over the looks, so
    it excludes 1 when the claim is made. `d` holds the level's per-unit ln(B/A) (None/NaN skipped, as there)."""
    vals = np.array([x for i, v in enumerate(d) if (x := _number("d", i, v)) is not None], dtype=float)
    two, one = _null_maxima(int(min_rounds), int(max_rounds))
    s = _sequential_level(vals, min_rounds=min_rounds, max_rounds=max_rounds, alpha_diff=alpha_step,
                          c_eq=_mc_quantile(one, 0.05), two=two, delta=0.0)
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


def first_look_share(min_rounds: int, max_rounds: int) -> float:
    """The share of a difference test's alpha spent on the plain t test at the first look: all of it when that is
    the only look (the rule is then the ordinary t test), else FIRST_LOOK_SHARE."""
    return 1.0 if min_rounds == max_rounds else FIRST_LOOK_SHARE


def sequential_boundary(min_rounds: int, max_rounds: int, alpha: float, *, one_sided: bool = False) -> dict:
    """Critical t values per look n = min_rounds..max_rounds of the sequential rule at overall level alpha.

    Difference (two-sided): at the first look, a plain t test at alpha * first_look_share; at every look the
    O'Brien-Fleming-shaped boundary C / sqrt(n / max_rounds) on the normal scale (the t statistic put there through
    its p-value), C set so that a true-null path crosses it with chance alpha * (1 - share). A path that crosses
    either has claimed; by Bonferroni the chance is at most alpha. Equivalence (one_sided): the O'Brien-Fleming
    boundary alone at alpha. `t` is the critical |t| per look (the tighter of the two at the first look), `z` its
    normal-scale value.
    """
    _check_rounds(min_rounds, max_rounds)
    two, one = _null_maxima(int(min_rounds), int(max_rounds))
    share = 0.0 if one_sided else first_look_share(min_rounds, max_rounds)
    looks = np.arange(min_rounds, max_rounds + 1)
    t = np.full(looks.size, np.inf)
    c = math.inf
    if share < 1.0:
        c = _mc_quantile(one if one_sided else two, alpha * (1.0 - share))
        t = _t_crit(looks, c, max_rounds)
    if share > 0.0:
        t[0] = min(t[0], _t_of_tail(min_rounds - 1, alpha * share / 2.0))
    z = -sc.ndtri(sc.stdtr(looks - 1, -t))
    if share == 1.0:
        c = float(z[0])  # a single look: the ordinary t test, whose normal-scale value is its z
    return {"C": c, "looks": looks.tolist(), "z": z.tolist(), "t": t.tolist(), "alpha": alpha,
            "one_sided": one_sided, "first_look_share": share, "paths": SEQ_PATHS, "seed": SEQ_SEED}


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
    (stdtrit(df, 0) is -inf, which would flip an interval inside out) or where stdtrit itself fails at a tail near
    the underflow (scipy 1.x returns +inf for stdtrit(3, 1e-300): the bound would read minus infinity)."""
    tail = np.asarray(tail, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(tail > 0, -sc.stdtrit(df, np.where(tail > 0, tail, 0.5)), np.inf)
    return np.where(np.isfinite(t) & (t > 0) | (tail >= 0.5), t, np.inf)


def _sequential_level(d: np.ndarray, *, min_rounds: int, max_rounds: int, alpha_diff: float, c_eq: float,
                      two: np.ndarray, delta: float) -> dict:
    """Running statistics of one level over its looks: sequential p, repeated intervals (intersected), decisions.

    Differences at level alpha_diff: the first look's plain t test at alpha_diff * share and the O'Brien-Fleming
    sequence at alpha_diff * (1 - share); p_sequential = min(p_first / share, p_obf / (1 - share)) (Bonferroni), and
    the repeated interval at each look is the narrower of the two (both centred on the look's mean), so it excludes 0
    exactly when p_sequential <= alpha_diff."""
    share = first_look_share(min_rounds, max_rounds)
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
    p_first = float(2.0 * sc.stdtr(min_rounds - 1, -abs(t[0])))
    p_obf = _mc_pvalue(two, m_obs)
    p_seq = min(1.0, p_first / share, p_obf / (1.0 - share) if share < 1.0 else math.inf)
    t_diff = _t_crit(looks, _mc_quantile(two, alpha_diff * (1.0 - share)), max_rounds) if share < 1.0 else \
        np.full(looks.size, np.inf)
    t_diff[0] = min(t_diff[0], float(_t_of_tail(min_rounds - 1, alpha_diff * share / 2.0)))
    with np.errstate(invalid="ignore"):
        hd = np.where(se > 0, t_diff * se, 0.0)
        he = np.where(se > 0, _t_crit(looks, c_eq, max_rounds) * se, 0.0)
    lo_e, hi_e = np.maximum.accumulate(mean - he), np.minimum.accumulate(mean + he)
    inside = np.flatnonzero((lo_e > -delta) & (hi_e < delta))
    lo_d, hi_d = float(np.max(mean - hd)), float(np.min(mean + hd))
    # early looks have boundaries of thousands of se (t with 1-2 df at a tiny tail): bounds stay finite on the log
    # scale, clipped at +-LOG_BOUND_CAP, so exp() and JSON never see an overflow or an infinity
    lo_d, hi_d = max(lo_d, -LOG_BOUND_CAP), min(hi_d, LOG_BOUND_CAP)
    lo_e, hi_e = np.clip(lo_e, -LOG_BOUND_CAP, LOG_BOUND_CAP), np.clip(hi_e, -LOG_BOUND_CAP, LOG_BOUND_CAP)
    out.update(p_sequential=p_seq, p_first_look=p_first, p_obrien_fleming=p_obf, ci_log=[lo_d, hi_d],
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
    decides differences; the repeated interval at one-sided alpha / L per side (intersected over looks; Bonferroni
    over the L levels) decides equivalence. Every claim, once made, stays. stop: every level decided, max_rounds reached, or `final` (the
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
    share = first_look_share(min_rounds, max_rounds)
    # simultaneous (Bonferroni over levels) repeated intervals for display: alpha / n_levels per level
    c_diff = _mc_quantile(two, alpha / n_levels * (1.0 - share)) if share < 1.0 else math.inf
    c_eq = _mc_quantile(one, alpha / n_levels)  # Bonferroni over the levels: any false 'equivalent' <= alpha
    stats = {lv: _sequential_level(values[lv], min_rounds=min_rounds, max_rounds=max_rounds,
                                   alpha_diff=alpha / n_levels, c_eq=c_eq, two=two, delta=delta) for lv in levels}
    adjusted = holm([stats[lv]["p_sequential"] for lv in levels])
    tested = [lv for lv in levels if stats[lv]["p_sequential"] is not None]
    step = {lv: k for k, lv in enumerate(sorted(tested, key=lambda x: stats[x]["p_sequential"]))}  # holm()'s order
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
        claim = None  # a Holm claim's repeated interval at its step (log scale): its side gives the direction, so a
        if p_holm is not None and p_holm <= alpha:  # claim made at an early look keeps its word when the mean drifts
            a_k = alpha / (len(tested) - step[lv])
            claim = _sequential_level(values[lv], min_rounds=min_rounds, max_rounds=max_rounds, alpha_diff=a_k,
                                      c_eq=c_eq, two=two, delta=delta)["ci_log"]
        what = None
        if s["sd_log"] is not None and s["n"] >= min_rounds and s["sd_log"] < NO_SPREAD_LOG:
            kind, ci = "no_spread", None  # as compare_rounds: identical ratios point at the set-up, never a claim
        elif claim is not None and (claim[0] > 0) != (claim[1] < 0):
            kind = "faster" if (claim[0] > 0) == bool(higher_is_better) else "slower"
            ci = [math.exp(x) for x in claim]
            what = f"Holm step {step[lv] + 1} of {len(tested)}: repeated interval at alpha {a_k:.3g}"
        elif claim is not None:  # the looks' intervals exclude 1 on both sides: they contradict each other
            kind, ci = "inconclusive", None
            notes.append(f"{lv}: repeated intervals exclude 1 on both sides (the effect drifted between rounds): "
                         "no claim")
        elif row["equivalent"]:
            kind, ci = "equivalent", row["ci_equivalence"]
            what = (f"repeated interval for equivalence, one-sided alpha{f'/{n_levels}' if n_levels > 1 else ''} per "
                    f"side, inside ±{margin:g} %")
        else:
            kind, ci = "inconclusive", row["ci"]
            what = f"Bonferroni over {len(tested)} level(s): repeated interval, contains 1" if ci else None
        row["kind"] = kinds[lv] = kind
        row["ci_decision"], row["ci_decision_what"] = ci, what
        if row["ci"] is None:
            row["text"] = f"{lv}: waiting for {min_rounds} rounds ({s['n']} so far)"
        elif kind == "no_spread":
            row["text"] = (f"no spread: check the set-up: B ×{row['ratio']:.4f} in each of {s['n']} units to within "
                           f"{100 * NO_SPREAD_LOG:g} % (sequential); no claim")
        elif ci is None:
            row["text"] = f"{kind}: B ×{row['ratio']:.3f} (sequential; the looks' intervals contradict each other)"
        else:
            row["text"] = (f"{kind}{f' within ±{margin:g} %' if kind == 'equivalent' else ''}: B ×{row['ratio']:.3f} "
                           f"[{ci[0]:.3f}, {ci[1]:.3f}] (sequential; {what})")
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
            "rule": (f"sequential t test after every round from {min_rounds} to {max_rounds}: a plain t test at the "
                     f"first look on {100 * share:g} % of alpha"
                     + (f", an O'Brien-Fleming shaped boundary C/sqrt(n/{max_rounds}) on the rest, calibrated on "
                        f"{SEQ_PATHS} simulated null paths (seed {SEQ_SEED})" if share < 1.0 else "")
                     + f"; Holm over {n_levels} level(s) for differences; equivalence by repeated intervals at "
                       f"one-sided alpha={alpha / n_levels:g} (Bonferroni over {n_levels} level(s))"),
            # a single look (min_rounds == max_rounds) has no O'Brien-Fleming part: no C (None, JSON has no inf)
            "boundary": {"C_difference_simultaneous": c_diff if math.isfinite(c_diff) else None, "C_equivalence": c_eq,
                         "first_look_share": share}}

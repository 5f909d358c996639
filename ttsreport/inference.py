"""Inference for the A/B verdict: one estimand (the ratio B/A, worked on the log scale), its interval, the decision.

Pure functions of per-round numbers; nothing here reads files. A round (one A and one B measurement, random order)
is the independent unit; requests inside a round never are. With `groups` (server starts holding several rounds) the
start becomes the unit, so the interval carries start-to-start variance. Every rule is explained, with its public
source, in docs/method.md; tools/verdict_synthetic.py measures its error rates on synthetic data with known answers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np
from scipy import special as sc

from ttsrecords.runsettings import MAX_SEQ_UNITS, MIN_UNITS

KINDS = ("faster", "slower", "equivalent", "inconclusive", "failed", "no_spread")
CLAIMS = ("faster", "slower", "equivalent")  # the kinds that say something about the arms
NO_SPREAD_LOG = 1e-5  # per-unit sd of ln(B/A) below this (0.001 %) is "no spread: check the set-up", never a claim
POWER = 0.8  # power the "rounds needed" estimate aims at
SPREAD_BOUND = 0.8  # one-sided confidence of the upper bound on the spread that estimate assumes
MAX_UNITS = 10_000  # beyond this many rounds (or starts) a target counts as out of reach
OUT_OF_REACH = 200  # more units than this, at the spread's upper bound, is "out of reach at this noise"
SEQ_PATHS = 200_000  # simulated null paths behind the sequential boundary (level known to about ±0.05 points)
LOG_BOUND_CAP = math.log(1e6)  # a repeated interval's bound beyond a ratio of 1e6 (or 1e-6) is shown there: unbounded
SEQ_SEED = 20260  # fixed: the boundary is a deterministic function of (min_rounds, max_rounds, alpha)


# ----------------------------------------------------------------------------------------------- small helpers


def _t_quantile(df: float, p: float) -> float:
    """Student-t quantile (scipy.special: a ufunc, fast enough to call per trial in the benchmark)."""
    return float(sc.stdtrit(df, p))


def _t_two_sided_p(t: float, df: float) -> float:
    return float(2.0 * sc.stdtr(df, -abs(t)))


def _check_confidence(confidence: float) -> float:
    if not 0.5 < float(confidence) < 1.0:
        raise ValueError(f"confidence must lie in (0.5, 1), got {confidence!r}")
    return float(confidence)


def _check_margin(margin_pct: float) -> float:
    m = float(margin_pct)
    if not math.isfinite(m) or m < 0:
        raise ValueError(f"margin_pct must be a finite number >= 0, got {margin_pct!r}")
    return m


def _number(name: str, i: int, v) -> float | None:
    """A per-round value as float; None for a missing one (None/NaN). Anything else that is not a number refused."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ValueError(f"{name}[{i}] = {v!r} is not a number") from None
    return None if math.isnan(f) else f


def log_ratios(a: Sequence, b: Sequence) -> tuple[np.ndarray, np.ndarray, int]:
    """d_r = ln(B_r / A_r) for the rounds where both values exist; also the kept indices and the skipped count.

    None/NaN in either arm skips that round (counted); a zero, negative or infinite value is refused, because a ratio
    of such numbers is not a measurement (a round that produced nothing is a failure, see compare_error_rates).
    """
    if len(a) != len(b):
        raise ValueError(f"a and b must pair by round: {len(a)} values for A, {len(b)} for B")
    d, kept, skipped = [], [], 0
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        fa, fb = _number("a", i, x), _number("b", i, y)
        for name, f in (("a", fa), ("b", fb)):
            if f is not None and (math.isinf(f) or f <= 0):
                raise ValueError(f"{name}[{i}] = {f!r}: a ratio needs positive, finite values")
        if fa is None or fb is None:
            skipped += 1
            continue
        d.append(math.log(fb / fa))
        kept.append(i)
    return np.array(d, dtype=float), np.array(kept, dtype=int), skipped


def _mean_se(d: np.ndarray) -> tuple[int, float, float | None, float | None]:
    """n, mean, sd (ddof 1) and standard error of a sample (sd and se None below two values)."""
    n = int(d.size)
    if n == 0:
        return 0, math.nan, None, None
    mean = float(d.mean())
    if n < 2:
        return n, mean, None, None
    sd = float(d.std(ddof=1))
    if sd < 1e-12 * max(1.0, abs(mean)):  # rounding noise of identical values counts as no spread
        sd = 0.0
    return n, mean, sd, sd / math.sqrt(n)


def _interval(mean: float, se: float, df: float, level: float) -> tuple[float, float]:
    """Two-sided Student-t interval at `level` (a point when se is 0)."""
    if se == 0:
        return mean, mean
    h = _t_quantile(df, 0.5 + level / 2) * se
    return mean - h, mean + h


def _t_p(mean: float, se: float, df: float, null: float = 0.0) -> float:
    """Two-sided p of the t test of mean == null (zero spread: 0 or 1)."""
    if se == 0:
        return 1.0 if mean == null else 0.0
    return _t_two_sided_p((mean - null) / se, df)


def _tost_p(mean: float, se: float, df: float, delta: float) -> float:
    """Two one-sided tests (Schuirmann 1987) of |true mean| >= delta: the larger of the two one-sided p-values."""
    if delta <= 0:
        return 1.0
    if se == 0:
        return 0.0 if abs(mean) < delta else 1.0
    p_low = float(sc.stdtr(df, -(mean + delta) / se))  # H0: mean <= -delta
    p_high = float(sc.stdtr(df, -(delta - mean) / se))  # H0: mean >= +delta
    return max(p_low, p_high)


def _gain(mean_log: float, higher_is_better: bool) -> float:
    """How many times faster B is (> 1: faster, < 1: slower) in the metric's own direction."""
    return math.exp(mean_log if higher_is_better else -mean_log)


def _speed_words(mean_log: float, higher_is_better: bool) -> str:
    g = _gain(mean_log, higher_is_better)
    return f"B {g:.3f}x faster" if g >= 1 else f"B {1 / g:.3f}x slower"


def _ratio_words(label: str, mean_log: float, lo: float, hi: float) -> str:
    return f"B {label} ×{math.exp(mean_log):.3f} [{math.exp(lo):.3f}, {math.exp(hi):.3f}]"


def _plural(n: int, unit: str) -> str:
    return f"{n} more {unit}{'' if n == 1 else 's'}"


# ----------------------------------------------------------------------------------------------- rounds needed


def _first_n(power_at, lo: int = 2, hi: int = MAX_UNITS) -> int | None:
    """Smallest n in [lo, hi] with power_at(n) >= POWER (power rises with n), or None."""
    if power_at(hi) < POWER:
        return None
    if power_at(lo) >= POWER:
        return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if power_at(mid) >= POWER else (mid, hi)
    return hi


def rounds_needed(n: int, mean_log: float, sd_log: float | None, *, alpha: float, margin_log: float,
                  unit: str = "round", alpha_equivalence: float | None = None) -> tuple[int | None, str]:
    """About how many more units (rounds or starts) would settle an undecided comparison, and what that assumes.

    A range: the units in all at the observed spread, and at its one-sided 80 % upper confidence bound (chi-square on
    n-1 df; with a handful of rounds the estimate is low about half the time). The number returned is the upper end.
    Two targets: a claim (80 % power of the two-sided t test if the true ratio is the current estimate) and
    equivalence within the margin (80 % power of TOST at the current estimate, when it lies inside the margin); the
    nearer one is advised. Beyond OUT_OF_REACH more units the answer is "out of reach at this noise" (None). The
    advice is sequential: extending a run and looking again is a second test, so the text says to run the extension
    under the sequential rule (UNTIL=decided), which spends alpha across its looks.
    alpha is the claim's level (alpha/L for Holm's strictest step over L levels); alpha_equivalence defaults to it.
    """
    alpha_eq = alpha if alpha_equivalence is None else alpha_equivalence
    if n < 2 or sd_log is None:
        need = max(2 - n, 1)
        return need, f"no spread yet: {_plural(need, unit)} give the first estimate of it"
    if sd_log == 0:
        return None, "zero spread observed: no power calculation applies (measurements identical to the last digit)"
    df = n - 1
    sd_up = sd_log * math.sqrt(df / float(sc.chdtri(df, SPREAD_BOUND)))  # P(sigma <= sd_up) = 0.8
    m = abs(mean_log)

    def targets_at(sd: float) -> list[tuple[int, str]]:
        found = []
        if m > 0:
            def claim_power(k: int) -> float:
                return 1.0 - float(sc.nctdtr(k - 1, m * math.sqrt(k) / sd, _t_quantile(k - 1, 1 - alpha / 2)))
            k = _first_n(claim_power)
            if k is not None:
                found.append((k, f"a claim if the true ratio is ×{math.exp(mean_log):.4f}"))
        if margin_log > m:
            def tost_power(k: int) -> float:
                tc = _t_quantile(k - 1, 1 - alpha_eq)
                p1 = 1.0 - float(sc.nctdtr(k - 1, (margin_log + m) * math.sqrt(k) / sd, tc))
                p2 = 1.0 - float(sc.nctdtr(k - 1, (margin_log - m) * math.sqrt(k) / sd, tc))
                return max(0.0, p1 + p2 - 1.0)
            k = _first_n(tost_power)
            if k is not None:
                found.append((k, f"equivalence within ±{100 * math.expm1(margin_log):.3g} % if the true ratio is "
                                 f"×{math.exp(mean_log):.4f}"))
        return found

    spread = (f"per-{unit} spread of ln(B/A) {sd_log:.4g} observed over {n} {unit}s, {sd_up:.4g} at its one-sided "
              f"{100 * SPREAD_BOUND:.0f} % upper bound")
    up, est = targets_at(sd_up), targets_at(sd_log)
    if not up and m == 0 and margin_log <= m:
        return None, (f"out of reach within {MAX_UNITS} {unit}s: the estimate sits on the margin or at exactly 1 "
                      f"({spread})")
    if not up:
        return None, (f"out of reach at this noise: more than {MAX_UNITS} {unit}s for {100 * POWER:.0f} % power "
                      f"({spread}); reduce the noise (longer windows, a quieter host) or test a wider margin")
    k, what = min(up)
    k_est = min((x for x, w in est if w == what), default=k)
    need = max(k - n, 1)
    if need > OUT_OF_REACH:
        return None, (f"out of reach at this noise: {_plural(need, unit)} ({k} in all) for {100 * POWER:.0f} % power "
                      f"to reach {what} at the spread's upper bound ({max(k_est - n, 1)} at its estimate; {spread}); "
                      "reduce the noise (longer windows, a quieter host) or test a wider margin")
    low = max(k_est - n, 1)
    span = f"{low}-{need}" if low < need else f"{need}"
    return need, (f"about {span} more {unit}s ({k_est}-{k} in all: at the observed spread and at its upper bound) "
                  f"for {100 * POWER:.0f} % power to reach {what} ({spread}). Run it again under the sequential "
                  f"rule (UNTIL=decided, a maximum of at least {k} {unit}s), which keeps the false-claim rate over "
                  "its looks, with this run as its pilot; adding rounds to this run and looking again is a second "
                  "test and raises false claims (docs/method.md, section 6)")


# ----------------------------------------------------------------------------------------------- one comparison


def compare_rounds(a: Sequence, b: Sequence, *, higher_is_better: bool, margin_pct: float, confidence: float,
                   groups: Sequence | None = None, label: str = "metric", bootstrap: int = 0,
                   failed: Sequence | None = None, scope: str | None = None) -> dict:
    """Compare arm B with arm A over paired rounds: ratio B/A, Student-t interval on ln(B/A), and a verdict.

    d_r = ln(B_r/A_r); point = exp(mean d); interval = exp(Student t on d): the point and the interval describe the
    same quantity (the geometric mean ratio). kind: "faster"/"slower" when the `confidence` interval excludes 1
    ("faster" = better in the metric's own direction); else "equivalent" when two one-sided tests at
    alpha = 1 - confidence put the ratio inside [1/(1+m), 1+m] (the (1-2 alpha) interval lies inside); else
    "inconclusive". An A/A floor plays no part. With `groups` (a label per round, e.g. the server start) the unit is
    the group: the mean d of each group, then t over groups, so start-to-start variance is in the interval.
    `bootstrap` > 0 adds a percentile bootstrap interval over the units as a diagnostic; it never enters the verdict.

    Two results are never claims. "failed": `failed` (one entry per round: None, or the arm(s) that failed there,
    e.g. "B") names a round in which an arm produced nothing; the remaining rounds are summarised but no speed claim
    is made from them (the rounds left are not a random sample of the arm's behaviour). "no_spread": every unit gave
    the same ratio to within NO_SPREAD_LOG; real measurements always vary, so that is a set-up to check (a B arm
    running A's code, a cached answer), not certainty. `scope` (e.g. "in this server start") qualifies the verdict
    word when the interval is conditional on something the design cannot vary (`word`).
    """
    level = _check_confidence(confidence)
    margin = _check_margin(margin_pct)
    alpha = 1.0 - level
    delta = math.log1p(margin / 100.0)
    d, kept, skipped = log_ratios(a, b)
    notes = [f"{skipped} round(s) skipped: a value was missing (None/NaN) in A or B"] if skipped else []
    failures = _failed_rounds(failed, len(a))
    unit, n_rounds, group_sizes = "round", int(d.size), None
    if groups is not None:
        if len(groups) != len(a):
            raise ValueError(f"groups must label every round: {len(groups)} labels for {len(a)} rounds")
        labels = [groups[i] for i in kept]
        if any(g is None for g in labels):
            raise ValueError("groups: every kept round needs a label (found None)")
        order = list(dict.fromkeys(labels))
        members = {g: [] for g in order}
        for g, x in zip(labels, d, strict=True):
            members[g].append(x)
        d = np.array([np.mean(members[g]) for g in order], dtype=float)
        unit, group_sizes = "start", {str(g): len(members[g]) for g in order}
    n, mean, sd, se = _mean_se(d)
    out = {
        "label": label, "higher_is_better": bool(higher_is_better), "confidence": level, "alpha": alpha,
        "unit": unit, "n": n, "n_rounds": n_rounds, "n_skipped": skipped, "group_sizes": group_sizes,
        "mean_log": None if n == 0 else mean, "sd_log": sd, "se": se, "df": n - 1 if n >= 2 else None,
        "ratio": None if n == 0 else math.exp(mean), "ci": None, "ci_log": None,
        "p_value": None, "tost_level": 1.0 - 2.0 * alpha, "ci_tost": None, "p_tost": None,
        "margin_pct": margin, "margin_log": delta, "equivalence_bounds": [1.0 / (1.0 + margin / 100.0),
                                                                          1.0 + margin / 100.0],
        "equivalent": False, "gain": None if n == 0 else _gain(mean, higher_is_better),
        "kind": "inconclusive", "text": "", "rounds_needed": None, "rounds_needed_assumption": "",
        "ci_bootstrap": None, "notes": notes, "failed": failures, "scope": scope, "word": "inconclusive",
        "no_spread": False,
    }
    if failures["rounds"]:
        _fail(out, label)
        if n >= 2:
            lo, hi = _interval(mean, se, n - 1, level)
            out.update(ci_log=[lo, hi], ci=[math.exp(lo), math.exp(hi)], p_value=_t_p(mean, se, n - 1))
        return out
    if n < 2:
        need, why = rounds_needed(n, mean, None, alpha=alpha, margin_log=delta, unit=unit)
        out.update(rounds_needed=need, rounds_needed_assumption=why)
        shown = f"B {label} ×{math.exp(mean):.3f} from one {unit}" if n == 1 else f"no {unit} with both values"
        out["text"] = f"inconclusive: {shown}; about {_plural(need, unit)} needed (no spread yet)"
        return out
    df = n - 1
    lo, hi = _interval(mean, se, df, level)
    tlo, thi = _interval(mean, se, df, 1.0 - 2.0 * alpha)
    p, p_tost = _t_p(mean, se, df), _tost_p(mean, se, df, delta)
    equivalent = p_tost < alpha
    out.update(ci_log=[lo, hi], ci=[math.exp(lo), math.exp(hi)], ci_tost=[math.exp(tlo), math.exp(thi)],
               p_value=p, p_tost=p_tost, equivalent=equivalent)
    if sd < NO_SPREAD_LOG:
        out.update(kind="no_spread", word="no spread", no_spread=True, p_value=None, p_tost=None, equivalent=False,
                   rounds_needed=None)
        notes.append(f"no spread: every {unit} gave the same ratio (sd of ln(B/A) {sd:.2g} < {NO_SPREAD_LOG:g})")
        out["text"] = (f"no spread: check the set-up: B {label} ×{math.exp(mean):.4f} in each of {n} {unit}s to "
                       f"within {100 * NO_SPREAD_LOG:g} %; real measurements vary, so identical ratios point at the "
                       "set-up (B running A's code, a cached or constant answer), not at certainty; no claim")
        return out
    if lo > 0 or hi < 0:
        better = (mean > 0) == bool(higher_is_better)
        out["kind"] = "faster" if better else "slower"
        out["word"] = verdict_word(out["kind"], scope)
        out["text"] = f"{out['word']}: {_ratio_words(label, mean, lo, hi)} ({_speed_words(mean, higher_is_better)})"
        if equivalent:
            out["text"] += f"; the difference lies within the ±{margin:g} % margin"
        out["rounds_needed"] = 0
    elif equivalent:
        out["kind"] = "equivalent"
        out["word"] = verdict_word("equivalent", scope)
        out["text"] = (f"{out['word']} within ±{margin:g} %: B {label} ×{math.exp(mean):.3f}, "
                       f"{100 * (1 - 2 * alpha):.0f} % interval [{math.exp(tlo):.3f}, {math.exp(thi):.3f}] inside "
                       f"[{out['equivalence_bounds'][0]:.3f}, {out['equivalence_bounds'][1]:.3f}]")
        out["rounds_needed"] = 0
    else:
        need, why = rounds_needed(n, mean, sd, alpha=alpha, margin_log=delta, unit=unit)
        out.update(rounds_needed=need, rounds_needed_assumption=why)
        more = (f"about {_plural(need, unit)}" if need is not None else "out of reach at this noise"
                if why.startswith("out of reach at this noise") else "more rounds would not settle it")
        out["text"] = f"inconclusive: {_ratio_words(label, mean, lo, hi)}; {more}"
    if bootstrap and n >= 3:
        rng = np.random.default_rng(SEQ_SEED)
        means = d[rng.integers(0, n, size=(int(bootstrap), n))].mean(axis=1)
        blo, bhi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
        out["ci_bootstrap"] = [math.exp(float(blo)), math.exp(float(bhi))]
    return out


def verdict_word(kind: str, scope: str | None = None) -> str:
    """The word a reader sees: the kind, qualified by the scope for a claim ("faster in this server start")."""
    word = kind.replace("_", " ")
    return f"{word} {scope}" if scope and kind in CLAIMS else word


def _failed_rounds(failed: Sequence | None, n: int) -> dict:
    """Which rounds had a failed arm, and how many per arm: {"rounds": [index], "by_arm": {"B": 1}, "of": n}."""
    out: dict = {"rounds": [], "by_arm": {}, "of": n}
    if failed is None:
        return out
    if len(failed) != n:
        raise ValueError(f"failed must mark every round: {len(failed)} entries for {n} rounds")
    for i, f in enumerate(failed):
        if f:
            out["rounds"].append(i)
            for arm in ("A", "B"):
                if arm in str(f):
                    out["by_arm"][arm] = out["by_arm"].get(arm, 0) + 1
    return out


def failure_words(failures: Mapping, where: str = "") -> str:
    """'B failed in 1 of 3 rounds' ('B failed at c=8 in ...' with where='at c=8'; both arms named when both did)."""
    by, n = failures["by_arm"], failures["of"]
    at = f" {where}" if where else ""
    return " and ".join(f"{arm} failed{at} in {k} of {n} round{'s' if n != 1 else ''}" for arm, k in sorted(by.items()))


def _fail(out: dict, label: str) -> None:
    """Mark a compare_rounds result as failed: no claim, no equivalence, no rounds-needed advice."""
    out.update(kind="failed", word="failed", p_value=None, p_tost=None, equivalent=False, rounds_needed=None,
               rounds_needed_assumption="an arm failed: fix the failure and rerun; more rounds do not repair it")
    shown = "" if out["ratio"] is None else f" (the other rounds read B {label} ×{out['ratio']:.3f})"
    out["text"] = f"failed: {failure_words(out['failed'])}: no speed claim from the remaining rounds{shown}"


# ----------------------------------------------------------------------------------------------- levels


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
    for lvl, k in kinds.items():
        by[k].append(str(lvl))
    total = len(kinds)
    w = {k: verdict_word(k, scope) for k in KINDS}
    parts = [f"{w[k]} at {len(v)} of {total} level{'s' if total != 1 else ''} ({', '.join(v)})" for k, v in by.items()
             if v and k not in ("failed", "no_spread")]
    flat = f"no spread at c={', '.join(by['no_spread'])}: check the set-up" if by["no_spread"] else ""
    if by["failed"]:
        found = "; ".join(failure_words((failures or {}).get(lv) or {"by_arm": {"an arm": 1}, "of": 1}, f"at c={lv}")
                          for lv in by["failed"])
        rest = "; ".join(x for x in (flat, *parts) if x)
        return "failed", f"{found}: no speed claim there" + (f"; elsewhere {rest}" if rest else "")
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
    """The headline of the primary metric over concurrency levels: Holm on the difference tests, TOST per level.

    A difference ("faster"/"slower") is claimed at a level when its Holm-adjusted p-value is <= alpha: the chance of
    any false difference claim over the levels stays <= alpha whatever their dependence. Equivalence is tested per
    level at alpha without correction: "equivalent at every level" is an intersection-union test (Berger 1982),
    whose size is alpha because it needs every level's test to reject. `ci_simultaneous` is the Bonferroni
    interval at 1 - alpha/L for display beside Holm. `results_by_level` maps a level to compare_rounds' result.

    `ci_decision` is the interval that decided the word (`ci_decision_what` names it): for a difference claim the
    interval at the level Holm tested it at, 1 - alpha/(L - k) at step k (it excludes 1 exactly when that step
    rejects); for "equivalent" the (1 - 2 alpha) TOST interval inside the margin; for "inconclusive" the Bonferroni
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
    per_level, kinds = {}, {}
    for lv, p_holm in zip(levels, adjusted, strict=True):
        r = results_by_level[lv]
        row = {k: r.get(k) for k in ("ratio", "ci", "ci_tost", "p_value", "p_tost", "n", "unit", "equivalent", "gain",
                                     "mean_log", "sd_log", "se", "df", "margin_pct", "failed")}
        row["p_holm"] = p_holm
        row["ci_simultaneous"] = row["ci_decision"] = row["ci_decision_what"] = None
        if r["se"] is not None and n_tested:
            lo, hi = _interval(r["mean_log"], r["se"], r["df"], 1.0 - alpha / n_tested)
            row["ci_simultaneous"] = [math.exp(lo), math.exp(hi)]
        if r["kind"] in ("failed", "no_spread"):
            kind = r["kind"]
        elif p_holm is not None and p_holm <= alpha and r["mean_log"] != 0:
            kind = "faster" if (r["mean_log"] > 0) == r["higher_is_better"] else "slower"
            level_k = 1.0 - alpha / (n_tested - step[lv])
            lo, hi = _interval(r["mean_log"], r["se"], r["df"], level_k)
            row["ci_decision"] = [math.exp(lo), math.exp(hi)]
            row["ci_decision_what"] = f"Holm step {step[lv] + 1} of {n_tested}: {100 * level_k:.4g} % interval"
        elif r["p_tost"] is not None and r["p_tost"] < alpha:
            kind = "equivalent"
            row["ci_decision"] = r["ci_tost"]
            row["ci_decision_what"] = f"{100 * (1 - 2 * alpha):.4g} % TOST interval, inside ±{r['margin_pct']:g} %"
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
        row["text"] = r["text"] if kind == r["kind"] else f"{row['word']} after Holm: {r['text']}"
        per_level[lv] = row
    kind, text = _headline(kinds, scope=scope, failures={lv: r.get("failed") for lv, r in results_by_level.items()})
    return {"kind": kind, "word": verdict_word(kind, scope) if kind in KINDS else kind, "text": text,
            "decided": all(k in CLAIMS for k in kinds.values()), "scope": scope, "alpha": alpha, "levels": per_level,
            "correction": f"Holm over {n_tested} level(s) for difference claims; equivalence per level at alpha "
                          f"(intersection-union for 'equivalent at every level')"}


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


def mark_secondary(result: dict) -> dict:
    """A copy of a compare_rounds result labelled as a secondary metric: an estimate whose interval is uncorrected."""
    out = dict(result)
    out["role"] = "secondary"
    out["corrected"] = False
    out["text"] = f"{result['text']} (secondary metric, {100 * result['confidence']:.0f} % interval, uncorrected)"
    return out


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
    words = {"more_failures": "B fails more", "fewer_failures": "B fails less", "inconclusive": "inconclusive"}
    out["text"] = (f"{words[out['kind']]}: failure rate B {100 * xb / nb:.2f} % vs A {100 * xa / na:.2f} %, "
                   f"B − A {100 * mean:+.2f} pp [{100 * lo:+.2f}, {100 * hi:+.2f}] over {n} round(s)"
                   + (f"; no claim: {why}" if why else ""))
    return out


# ----------------------------------------------------------------------------------------------- A/A rounds


def aa_check(a: Sequence, b: Sequence, *, confidence: float = 0.95, ab_sd_log: float | None = None,
             ab_n: int | None = None, label: str = "metric") -> dict:
    """A/A rounds check the method: their mean ratio should be 1. They never move a claim threshold.

    warn when the A/A interval excludes 1 (a bias: order effect, warm-up, a drifting machine). The A/A spread (sd of
    ln(A2/A1)) is shown beside the A/B spread (ab_sd_log over ab_n units) with an F interval on their ratio: an A/B
    spread well above the A/A spread says the effect itself varies from round to round.
    """
    level = _check_confidence(confidence)
    d, _kept, skipped = log_ratios(a, b)
    n, mean, sd, se = _mean_se(d)
    out = {"n": n, "n_skipped": skipped, "ratio": None if n == 0 else math.exp(mean), "mean_log": None,
           "sd_log": sd, "ci": None, "p_value": None, "warn": False, "sd_log_ab": ab_sd_log,
           "spread_ratio": None, "spread_ratio_ci": None, "text": ""}
    if n < 2:
        out["text"] = f"A/A: {n} round(s), no interval yet"
        return out
    lo, hi = _interval(mean, se, n - 1, level)
    out.update(mean_log=mean, ci=[math.exp(lo), math.exp(hi)], p_value=_t_p(mean, se, n - 1))
    out["warn"] = lo > 0 or hi < 0
    verdict = ("the A/A interval excludes 1: a bias or order effect in the set-up" if out["warn"]
               else "no bias shown")
    out["text"] = f"A/A {label} ×{math.exp(mean):.3f} [{math.exp(lo):.3f}, {math.exp(hi):.3f}]: {verdict}"
    if ab_sd_log is not None and ab_n is not None and ab_n >= 2 and sd > 0:
        ratio = ab_sd_log / sd
        f_lo = float(sc.fdtri(ab_n - 1, n - 1, 0.5 + level / 2))
        f_hi = float(sc.fdtri(ab_n - 1, n - 1, 0.5 - level / 2))
        out.update(spread_ratio=ratio, spread_ratio_ci=[ratio / math.sqrt(f_lo), ratio / math.sqrt(f_hi)])
        out["text"] += (f"; per-round spread A/A {sd:.4f} vs A/B {ab_sd_log:.4f} (ratio {ratio:.2f} "
                        f"[{out['spread_ratio_ci'][0]:.2f}, {out['spread_ratio_ci'][1]:.2f}])")
    return out


# ----------------------------------------------------------------------------------------------- nested designs


def _labels(name: str, labels: Sequence, n: int) -> list:
    if len(labels) != n:
        raise ValueError(f"{name} must label every value: {len(labels)} labels for {n} values")
    if any(x is None for x in labels):
        raise ValueError(f"{name}: a label is None")
    return list(labels)


def variance_components(d: Sequence, starts: Sequence, windows: Sequence | None = None,
                        within_var: float | Sequence | None = None) -> dict:
    """Variance of d = ln(B/A) between server starts, between window pairs inside a start, and inside a window.

    Method of moments on the nested ANOVA mean squares (Searle 1971; unbalanced designs allowed). Without `windows`
    every value is one window pair: sigma2_start and sigma2_pair. With `windows` (a label per value, unique inside
    its start) values sharing (start, window) are repeated measurements of one window pair and sigma2_within is
    their variance. With `within_var` (the known sampling variance of each value, e.g. from its window's request
    count) sigma2_within is its mean and sigma2_pair is net of it. Negative estimates are reported in `raw` and set
    to 0 (listed in `truncated`).
    """
    y = np.array([float(v) for v in d], dtype=float)
    if not np.all(np.isfinite(y)):
        raise ValueError("variance_components: d must be finite numbers (drop missing rounds first)")
    s_lab = _labels("starts", starts, y.size)
    if windows is not None and within_var is not None:
        raise ValueError("give windows (measured within-window spread) or within_var (known), not both")
    ids = list(dict.fromkeys(s_lab))
    a = len(ids)
    if a < 2:
        raise ValueError(f"variance_components needs at least 2 starts, got {a}")
    grand = float(y.mean())
    by_start = {s: y[[i for i, x in enumerate(s_lab) if x == s]] for s in ids}
    n_i = np.array([by_start[s].size for s in ids], dtype=float)
    big_n = float(y.size)
    ss_a = float(sum(v.size * (v.mean() - grand) ** 2 for v in by_start.values()))
    df_a = a - 1
    ms_a = ss_a / df_a
    raw: dict[str, float | None] = {}
    if windows is None:
        ss_w = float(sum(((v - v.mean()) ** 2).sum() for v in by_start.values()))
        df_w = int(big_n - a)
        if df_w < 1:
            raise ValueError("variance_components needs a start with at least 2 window pairs")
        ms_w = ss_w / df_w
        n0 = (big_n - float((n_i ** 2).sum()) / big_n) / df_a
        raw["sigma2_pair"] = ms_w
        raw["sigma2_start"] = (ms_a - ms_w) / n0
        raw["sigma2_within"] = None
        mean_squares = {"start": ms_a, "pair": ms_w}
        dfs = {"start": df_a, "pair": df_w}
        coeffs = {"n0": n0}
        if within_var is not None:
            wv = np.broadcast_to(np.array(within_var, dtype=float), y.shape)
            if not np.all(np.isfinite(wv)) or np.any(wv < 0):
                raise ValueError("within_var must be finite and >= 0")
            raw["sigma2_within"] = float(wv.mean())
            raw["sigma2_pair"] = ms_w - raw["sigma2_within"]
        n_windows = int(big_n)
    else:
        w_lab = _labels("windows", windows, y.size)
        cells: dict[tuple, list[float]] = {}
        for s, w, v in zip(s_lab, w_lab, y, strict=True):
            cells.setdefault((s, w), []).append(float(v))
        b_total = len(cells)
        ss_b = ss_e = 0.0
        sum_nij2_over_ni = sum_nij2 = 0.0
        for s in ids:
            ms = by_start[s].mean()
            sizes = []
            for (s2, _w), vals in cells.items():
                if s2 != s:
                    continue
                v = np.array(vals)
                ss_b += v.size * (v.mean() - ms) ** 2
                ss_e += float(((v - v.mean()) ** 2).sum())
                sizes.append(v.size)
            sz = np.array(sizes, dtype=float)
            sum_nij2_over_ni += float((sz ** 2).sum()) / sz.sum()
            sum_nij2 += float((sz ** 2).sum())
        df_b, df_e = b_total - a, int(big_n - b_total)
        if df_b < 1 or df_e < 1:
            raise ValueError("variance_components with windows needs a start with 2 windows and a window with "
                             "2 values")
        ms_b, ms_e = ss_b / df_b, ss_e / df_e
        k1 = (big_n - sum_nij2_over_ni) / df_b
        k2 = (sum_nij2_over_ni - sum_nij2 / big_n) / df_a
        k3 = (big_n - float((n_i ** 2).sum()) / big_n) / df_a
        raw["sigma2_within"] = ms_e
        raw["sigma2_pair"] = (ms_b - ms_e) / k1
        raw["sigma2_start"] = (ms_a - ms_e - k2 * raw["sigma2_pair"]) / k3
        mean_squares = {"start": ms_a, "pair": ms_b, "within": ms_e}
        dfs = {"start": df_a, "pair": df_b, "within": df_e}
        coeffs = {"k1": k1, "k2": k2, "k3": k3}
        n_windows = b_total
    est = {k: (None if v is None else max(0.0, v)) for k, v in raw.items()}
    truncated = [k for k, v in raw.items() if v is not None and v < 0]
    return {"sigma2_start": est["sigma2_start"], "sigma2_pair": est["sigma2_pair"],
            "sigma2_within": est["sigma2_within"], "raw": raw, "truncated": truncated,
            "sd_start": math.sqrt(est["sigma2_start"]), "sd_pair": math.sqrt(est["sigma2_pair"]),
            "n": int(big_n), "n_starts": a, "n_windows": n_windows, "mean_log": grand,
            "mean_squares": mean_squares, "df": dfs, "coefficients": coeffs,
            "method": "method of moments on nested ANOVA mean squares (unbalanced allowed; negatives set to 0)"}


def order_effect(d: Sequence, order: Sequence, *, confidence: float = 0.95) -> dict:
    """Carry-over check: mean ln(B/A) of pairs run A then B minus that of pairs run B then A, with a Welch interval.

    With no carry-over (warm caches, thermal state, a leaking queue) the order does not matter and the difference is
    0; warn when its interval excludes 0. `order` holds "AB" or "BA" per value of d.
    """
    level = _check_confidence(confidence)
    labels = _labels("order", order, len(d))
    groups: dict[str, list[float]] = {"AB": [], "BA": []}
    skipped = 0
    for i, (v, o) in enumerate(zip(d, labels, strict=True)):
        if o not in groups:
            raise ValueError(f"order[{i}] = {o!r}: must be 'AB' or 'BA'")
        f = _number("d", i, v)
        if f is None:
            skipped += 1
            continue
        if math.isinf(f):
            raise ValueError(f"d[{i}] = {f!r}: a log ratio must be finite")
        groups[o].append(f)
    ab, ba = np.array(groups["AB"]), np.array(groups["BA"])
    out = {"n_ab": int(ab.size), "n_ba": int(ba.size), "n_skipped": skipped, "mean_ab": None, "mean_ba": None,
           "diff_log": None, "ratio": None, "ci_log": None, "ci": None, "df": None, "p_value": None, "warn": False}
    if ab.size < 2 or ba.size < 2:
        out["text"] = f"order effect: needs 2 pairs in each order (AB {ab.size}, BA {ba.size})"
        return out
    va, vb = ab.var(ddof=1) / ab.size, ba.var(ddof=1) / ba.size
    diff = float(ab.mean() - ba.mean())
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (ab.size - 1) + vb ** 2 / (ba.size - 1)) if se > 0 else ab.size + ba.size - 2
    lo, hi = _interval(diff, se, df, level)
    out.update(mean_ab=float(ab.mean()), mean_ba=float(ba.mean()), diff_log=diff, ratio=math.exp(diff),
               ci_log=[lo, hi], ci=[math.exp(lo), math.exp(hi)], df=float(df), p_value=_t_p(diff, se, df),
               warn=lo > 0 or hi < 0)
    out["text"] = (f"order effect (AB vs BA) ×{math.exp(diff):.3f} [{math.exp(lo):.3f}, {math.exp(hi):.3f}]: "
                   + ("carry-over between the arms of a pair" if out["warn"] else "none shown"))
    return out


def plan_nested(components: Mapping, cost_start_s: float, cost_window_s: float, target_halfwidth_pct: float,
                confidence: float = 0.95, *, max_starts: int = 1000, max_windows: int = 1000) -> dict:
    """The cheapest (S starts, W window pairs per start) whose interval on ln(B/A) is at most the target half-width.

    var(mean d) = sigma2_start / S + sigma2_pair / (S W), with the t quantile on S - 1 df (the start is the unit);
    cost = S cost_start_s + S W cost_window_s (cost_window_s: one window pair, A and B). sigma2_within, when given,
    adds to sigma2_pair (each window's own sampling noise). `w_continuous` is the classic optimum
    sqrt(cost_start sigma2_pair / (cost_window sigma2_start)) (Cochran 1977, two-stage sampling).
    """
    level = _check_confidence(confidence)
    s2s = float(components.get("sigma2_start") or 0.0)
    s2p = float(components.get("sigma2_pair") or 0.0) + float(components.get("sigma2_within") or 0.0)
    for name, v in (("sigma2_start", s2s), ("sigma2_pair", s2p), ("cost_start_s", cost_start_s),
                    ("cost_window_s", cost_window_s), ("target_halfwidth_pct", target_halfwidth_pct)):
        if not math.isfinite(float(v)) or float(v) < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if target_halfwidth_pct <= 0:
        raise ValueError("target_halfwidth_pct must be > 0")
    h = math.log1p(target_halfwidth_pct / 100.0)
    formula = (f"half-width = t(S-1) * sqrt({s2s:.4g}/S + {s2p:.4g}/(S*W)) on ln(B/A); "
               f"cost = S*{cost_start_s:g} s + S*W*{cost_window_s:g} s")
    s = np.arange(2, max_starts + 1, dtype=float)
    t = sc.stdtrit(s - 1, 0.5 + level / 2)
    room = (h / t) ** 2 - s2s / s  # what the window term may use
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(room > 0, np.ceil(np.where(s2p > 0, s2p / (s * room), 1.0) * (1 - 1e-12)), np.inf)
    w = np.maximum(w, 1.0)
    ok = np.isfinite(w) & (w <= max_windows)
    out = {"feasible": bool(ok.any()), "formula": formula, "confidence": level,
           "target_halfwidth_pct": float(target_halfwidth_pct), "starts": None, "windows_per_start": None,
           "cost_s": None, "halfwidth_pct": None, "w_continuous": None}
    if s2s > 0 and cost_window_s > 0:
        out["w_continuous"] = math.sqrt(cost_start_s * s2p / (cost_window_s * s2s))
    if not ok.any():
        out["reason"] = (f"no design with at most {max_starts} starts and {max_windows} window pairs per start "
                         "reaches the target")
        return out
    cost = np.where(ok, s * cost_start_s + s * w * cost_window_s, np.inf)
    i = int(np.argmin(cost))
    S, W = int(s[i]), int(w[i])
    hw = float(t[i]) * math.sqrt(s2s / S + s2p / (S * W))
    out.update(starts=S, windows_per_start=W, cost_s=float(cost[i]), halfwidth_pct=100.0 * math.expm1(hw))
    return out


def plan_chance(components: Mapping, starts: int, windows_per_start: int, target_halfwidth_pct: float,
                confidence: float = 0.95, *, draws: int = 4000, seed: int = SEQ_SEED) -> dict:
    """The chance that a planned (S, W) run reaches the target half-width, which plan_nested alone does not say.

    plan_nested sizes for t * sigma; the run's own interval is t * s, with s estimated from its S - 1 degrees of
    freedom, so even with the true variances it falls short about half the time (`known_variances`:
    P(chi2 on S-1 df <= (S-1) h^2 S / (t^2 sigma2_unit)), sigma2_unit = sigma2_start + sigma2_pair / W). The pilot's
    variances are estimates too: `with_pilot_uncertainty` averages that chance over draws of the pilot's mean squares
    from their chi-square distributions (a parametric bootstrap of the method of moments; needs the `mean_squares`,
    `df` and `coefficients` of variance_components without windows)."""
    level = _check_confidence(confidence)
    S, W = int(starts), int(windows_per_start)
    if S < 2 or W < 1:
        raise ValueError(f"plan_chance needs S >= 2 starts and W >= 1 window pairs, got {S}, {W}")
    h = math.log1p(float(target_halfwidth_pct) / 100.0)
    t = _t_quantile(S - 1, 0.5 + level / 2)
    limit = (S - 1) * h * h * S / (t * t)  # chi2 draws below limit * 1/sigma2_unit reach the target

    def chance(s2_start, s2_pair):
        unit = np.asarray(s2_start) + np.asarray(s2_pair) / W
        with np.errstate(divide="ignore"):
            return np.where(unit > 0, sc.chdtr(S - 1, limit / np.maximum(unit, 1e-300)), 1.0)

    s2s = float(components.get("sigma2_start") or 0.0)
    s2p = float(components.get("sigma2_pair") or 0.0) + float(components.get("sigma2_within") or 0.0)
    out = {"known_variances": float(chance(s2s, s2p)), "with_pilot_uncertainty": None, "pilot_df": None,
           "method": "chi-square on the planned run's S-1 df; pilot mean squares redrawn from their chi-square"}
    ms, df, co = components.get("mean_squares"), components.get("df"), components.get("coefficients")
    if ms and df and co and "n0" in co and "pair" in ms:
        rng = np.random.default_rng(seed)
        ms_a = ms["start"] * rng.chisquare(df["start"], draws) / df["start"]
        ms_w = ms["pair"] * rng.chisquare(df["pair"], draws) / df["pair"]
        out["with_pilot_uncertainty"] = float(np.mean(chance(np.maximum(0.0, (ms_a - ms_w) / co["n0"]), ms_w)))
        out["pilot_df"] = {"start": int(df["start"]), "pair": int(df["pair"])}
    return out

"""The core of the A/B verdict: one estimand (the ratio B/A, worked on the log scale), its interval, the decision.

Pure functions of per-round numbers; nothing here reads files. A round (one A and one B measurement, random order)
is the independent unit; requests inside a round never are. With `groups` (server starts holding several rounds) the
start becomes the unit, so the interval carries start-to-start variance. Every rule is explained, with its public
source, in docs/method.md; tools/verdict_synthetic.py measures its error rates on synthetic data with known answers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy import special as sc

KINDS = ("faster", "slower", "equivalent", "inconclusive", "failed", "no_spread")
CLAIMS = ("faster", "slower", "equivalent")  # the kinds that say something about the arms
NO_SPREAD_LOG = 1e-5  # per-unit sd of ln(B/A) below this (0.001 %) is "no spread: check the set-up", never a claim
POWER = 0.8  # power the "rounds needed" estimate aims at
SPREAD_BOUND = 0.8  # one-sided confidence of the upper bound on the spread that estimate assumes
MAX_UNITS = 10_000  # beyond this many rounds (or starts) a target counts as out of reach
OUT_OF_REACH = 200  # more units than this, at the spread's upper bound, is "out of reach at this noise"
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
                  f"rule (UNTIL=decided, a maximum of at least {k} {unit}s), with this run as its pilot: the new "
                  "run's own false-claim rate stays at most alpha over all its looks, so report its verdict alone "
                  "(reading this run's verdict as well makes two tests of one question); adding rounds to this run "
                  "and looking again is a second test and raises false claims (docs/method.md, section 6)")


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
    if failures["rounds"]:  # the summary beside a failed level describes the other rounds only
        other = ~np.isin(kept, failures["rounds"])
        d, kept = d[other], kept[other]
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
        "no_spread": False, "ci_decision": None, "ci_decision_what": None, "claim_allowed": None,
    }
    if failures["rounds"]:
        _fail(out, label)
        if n >= 2:
            lo, hi = _interval(mean, se, n - 1, level)
            out.update(ci_log=[lo, hi], ci=[math.exp(lo), math.exp(hi)], p_value=_t_p(mean, se, n - 1))
            kind = ("faster" if (mean > 0) == bool(higher_is_better) else "slower") if lo > 0 or hi < 0 else None
            if kind is not None and kind == out["claim_allowed"] and sd >= NO_SPREAD_LOG:
                _claim_despite_failure(out, kind, label, mean, lo, hi, level, scope)
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
        out["ci_decision"], out["ci_decision_what"] = out["ci"], f"{100 * level:.4g} % interval, excludes 1"
    elif equivalent:
        out["kind"] = "equivalent"
        out["word"] = verdict_word("equivalent", scope)
        out["text"] = (f"{out['word']} within ±{margin:g} %: B {label} ×{math.exp(mean):.3f}, "
                       f"{100 * (1 - 2 * alpha):.0f} % interval [{math.exp(tlo):.3f}, {math.exp(thi):.3f}] inside "
                       f"[{out['equivalence_bounds'][0]:.3f}, {out['equivalence_bounds'][1]:.3f}]")
        out["rounds_needed"] = 0
        out["ci_decision"] = out["ci_tost"]
        out["ci_decision_what"] = f"{100 * (1 - 2 * alpha):.4g} % TOST interval, inside ±{margin:g} %"
    else:
        out["ci_decision"], out["ci_decision_what"] = out["ci"], f"{100 * level:.4g} % interval, contains 1"
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


def claim_allowed(failures: Mapping) -> str | None:
    """The one claim a level with failed rounds may still make: the direction its failures can only strengthen.
    Only B failed: "slower" (the rounds where B worked are, if anything, its better ones, so they bias against
    "B slower"); only A failed: "faster"; both arms, or none: no claim."""
    arms = set((failures or {}).get("by_arm") or {})
    return {"B": "slower", "A": "faster"}.get(arms.pop()) if len(arms) == 1 else None


def _claim_despite_failure(out: dict, kind: str, label: str, mean: float, lo: float, hi: float, level: float,
                           scope: str | None) -> None:
    """A level whose failures can only strengthen its claim keeps the claim from the rounds where both arms worked,
    with the failure named first."""
    out.update(kind=kind, word=verdict_word(kind, scope), rounds_needed=0, ci_decision=out["ci"],
               ci_decision_what=f"{100 * level:.4g} % interval over the {out['n']} {out['unit']}s where both arms "
                                "worked, excludes 1")
    out["text"] = (f"{failure_words(out['failed'])}, and {out['word']} in the rounds where both worked: "
                   f"{_ratio_words(label, mean, lo, hi)}; the failures can only strengthen '{kind}'")


def _fail(out: dict, label: str) -> None:
    """Mark a compare_rounds result as failed: no claim, no equivalence, no rounds-needed advice."""
    out.update(kind="failed", word="failed", p_value=None, p_tost=None, equivalent=False, rounds_needed=None,
               rounds_needed_assumption="an arm failed: fix the failure and rerun; more rounds do not repair it",
               claim_allowed=claim_allowed(out["failed"]))
    k = out["failed"]["of"] - len(out["failed"]["rounds"])
    shown = "" if out["ratio"] is None else (f" (the other {k} round{'s' if k != 1 else ''}, without the failed "
                                             f"ones, read B {label} ×{out['ratio']:.3f})")
    out["text"] = f"failed: {failure_words(out['failed'])}: no speed claim from the remaining rounds{shown}"


def withhold_for_failure_gap(res: dict, share_a: float, share_b: float, limit_pp: float) -> dict:
    """A compare_rounds result for a metric over ok requests only, when the arms' failure shares differ by more than
    `limit_pp` points: a copy whose claim is withheld unless the failures could only weaken it.

    Latency over the requests that worked favours the arm that failed more (a timeout removes its slowest requests):
    B failing more can only make B look faster, so "B slower" stands and "B faster" or "equivalent" does not (A
    failing more: the mirror). A withheld claim is "inconclusive" with the failure shares as the reason and no
    interval (none decided it: the shares did). `failure_gap` records the shares and the one claim allowed."""
    gap = 100.0 * (share_b - share_a)
    out = dict(res)
    out["failure_gap"] = {"a_share": share_a, "b_share": share_b, "gap_pp": gap, "limit_pp": limit_pp,
                          "withheld": False, "allowed": None}
    if abs(gap) <= limit_pp or res["kind"] in ("failed", "no_spread"):
        return out
    allowed = "slower" if gap > 0 else "faster"
    out["failure_gap"]["allowed"] = allowed
    out["equivalent"] = False
    if res["kind"] == "inconclusive" or res["kind"] == allowed:
        if res["kind"] == allowed:
            out["text"] = (f"{res['text']}; the failure shares (A {100 * share_a:.1f} %, B {100 * share_b:.1f} %) "
                           f"can only strengthen '{allowed}'")
        return out
    out["failure_gap"]["withheld"] = True
    out.update(kind="inconclusive", word=verdict_word("inconclusive", res.get("scope")), rounds_needed=None,
               rounds_needed_assumption="the arms fail at different rates: fix the failures; more rounds do not "
                                        "repair a comparison of survivors",
               ci_decision=None, ci_decision_what=f"withheld: failure shares differ by {gap:+.1f} pp")
    favoured = "B" if gap > 0 else "A"
    out["text"] = (f"no {res['label']} claim: failure shares differ (A {100 * share_a:.1f} %, B {100 * share_b:.1f} % "
                   f"of measure-phase requests, more than {limit_pp:g} points apart); over the requests that worked "
                   f"the metric favours {favoured}, which failed more (B ×{res['ratio']:.3f} read, {res['kind']} "
                   "withheld)")
    return out


def mark_secondary(result: dict) -> dict:
    """A copy of a compare_rounds result labelled as a secondary metric: an estimate whose interval is uncorrected."""
    out = dict(result)
    out["role"] = "secondary"
    out["corrected"] = False
    out["text"] = f"{result['text']} (secondary metric, {100 * result['confidence']:.0f} % interval, uncorrected)"
    return out

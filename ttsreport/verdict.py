"""The interval arithmetic over per-round differences and the verdict rule built on it.

`diff_stats` turns the per-round relative differences of one level and metric into an estimate and a CI; `decide`
turns that CI, the A/A floor and a margin into one sentence. It never says "no difference" when the CI is wider than
the claim, and never claims a difference smaller than the A/A noise floor.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps


@dataclass(frozen=True)
class Settings:
    """Knobs of the comparison; written into comparison.json so a verdict can be traced to them."""

    confidence: float = 0.95  # family-wise over the levels (Bonferroni-adjusted per level)
    margin_pct: float = 1.0  # the margin a "no difference" claim and the rounds-needed estimate aim at
    power: float = 0.8  # for the minimum detectable effect
    n_resamples: int = 4999
    seed: int = 20260
    max_rounds: int = 10_000



def hodges_lehmann(x: np.ndarray) -> float:
    """One-sample Hodges–Lehmann estimate: median of the Walsh averages (robust centre of the per-round differences)."""
    i, j = np.triu_indices(len(x))
    return float(np.median((x[i] + x[j]) / 2.0))


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm step-down adjusted p-values (None passes through)."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    order = sorted(idx, key=lambda i: pvalues[i])
    m, out, running = len(order), list(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


def mde(sd: float, n: int, level: float, power: float) -> float:
    """Minimum detectable effect (two-sided test at `level`, given power) from the observed spread over n rounds."""
    df = n - 1
    return float((sps.t.ppf(0.5 + level / 2, df) + sps.t.ppf(power, df)) * sd / math.sqrt(n))


def diff_stats(d: np.ndarray, level: float, s: Settings, seed: int) -> dict:
    """Interval estimates for the mean of per-round relative differences (in %).

    The verdict uses the hull of the bootstrap (BCa, seeded) and the Student-t interval: with a handful of rounds the
    bootstrap cannot reach beyond the sample's range (3 rounds cover the centre only ~75 % of the time), so alone it
    would claim too much; the t interval keeps the small-n coverage honest, the bootstrap guards against skew.
    """
    n = len(d)
    out = {"n": n, "values": [float(v) for v in d], "mean": None, "hl": None, "sd": None, "ci_boot": None, "ci_t": None,
           "ci": None, "half_width": None, "p_value": None, "mde": None}
    if n == 0:
        return out
    out["mean"], out["hl"] = float(d.mean()), hodges_lehmann(d)
    if n < 2:
        return out
    sd = float(d.std(ddof=1))
    out["sd"] = sd
    se = sd / math.sqrt(n)
    t_lo, t_hi = (d.mean(), d.mean()) if sd == 0 else sps.t.interval(level, n - 1, loc=d.mean(), scale=se)
    out["ci_t"] = [float(t_lo), float(t_hi)]
    lo, hi = float(t_lo), float(t_hi)
    if n >= 3 and sd > 0:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            b = sps.bootstrap((d,), np.mean, confidence_level=level, n_resamples=s.n_resamples, method="BCa",
                              rng=np.random.default_rng(seed))
        b_lo, b_hi = float(b.confidence_interval.low), float(b.confidence_interval.high)
        if math.isfinite(b_lo) and math.isfinite(b_hi):
            out["ci_boot"] = [b_lo, b_hi]
            lo, hi = min(lo, b_lo), max(hi, b_hi)
    out["ci"] = [lo, hi]
    out["half_width"] = (hi - lo) / 2
    out["p_value"] = 1.0 if sd == 0 and d.mean() == 0 else (0.0 if sd == 0 else float(sps.ttest_1samp(d, 0.0).pvalue))
    out["mde"] = mde(sd, n, level, s.power)
    return out





def t_halfwidth(sd: float, n: int, level: float) -> float:
    """Student-t half-width of a mean over n rounds with spread sd."""
    return float(sps.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n))


def rounds_for_halfwidth(sd: float, target: float, level: float, cap: int = 10_000) -> int:
    """Smallest number of rounds whose t half-width at `level` is <= target, given the observed spread."""
    if sd == 0:
        return 2
    if target <= 0:
        return cap
    n = 2
    while n < cap and t_halfwidth(sd, n, level) > target:
        n = n + 1 if n < 64 else int(n * 1.1)
    return min(n, cap)


def _plural(n: int) -> str:
    return f"{n} more round{'s' if n != 1 else ''}"


def decide(better: str, st: dict, floor: float | None, level: float, margin: float, cap: int = 10_000) -> dict:
    """Verdict for per-round relative differences B vs A in % (`st` from diff_stats).

    better: "higher" or "lower" — which sign of the difference means B is faster.
    Claim: CI excludes 0 and |HL| exceeds the A/A floor. No difference: whole CI inside ±max(margin, floor).
    Otherwise inconclusive, with the rounds needed (same spread, same estimate) for either outcome to be reached.
    """
    sign = 1.0 if better == "higher" else -1.0
    y = max(margin, floor or 0.0)
    n = st["n"]
    if st.get("ci") is None:
        need = max(3 - n, 1)
        return {"kind": "inconclusive", "more_rounds": need, "bound": y,
                "text": f"inconclusive: about {_plural(need)} needed (no spread yet)"}
    lo, hi = st["ci"]
    centre = st["hl"]
    gain, glo, ghi = sign * centre, *sorted((sign * lo, sign * hi))
    beyond_floor = floor is None or abs(centre) > floor
    if (lo > 0 or hi < 0) and beyond_floor:
        word = "faster" if gain > 0 else "slower"
        return {"kind": word, "more_rounds": 0, "bound": y, "estimate": abs(gain),
                "text": f"B {word} by {abs(gain):.1f} % [{glo:+.1f}, {ghi:+.1f}]"}
    if -y <= lo and hi <= y:
        return {"kind": "no_difference", "more_rounds": 0, "bound": y, "text": f"no difference beyond ±{y:.1f} %"}
    # Half-width that would settle it if the estimate stayed where it is: fit inside ±y, or clear zero (and the floor).
    targets = [y - abs(centre)] if abs(centre) < y else []
    if abs(centre) > (floor or 0.0):
        targets.append(abs(centre))
    target = max(targets) if targets else margin / 2
    need = max(rounds_for_halfwidth(st["sd"], target, level, cap) - n, 1)
    note = " (within the A/A noise floor)" if (lo > 0 or hi < 0) else ""
    return {"kind": "inconclusive", "more_rounds": need, "bound": y,
            "text": f"inconclusive{note}: about {_plural(need)} needed"}

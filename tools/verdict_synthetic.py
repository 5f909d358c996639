"""Known-answer benchmark of ttsreport.inference on synthetic paired rounds (nothing here is measured on a server).

Every cell draws independent experiments with a KNOWN effect (normal noise on the log scale with shared round
effects unless a row says otherwise), runs the public API on each exactly as a run would, and counts outcomes.
Every rate comes with its Wilson 95 % interval. Run:

    python -m tools.verdict_synthetic --out reports/bench/verdicts-synthetic.md

A fixed seed (printed) makes the file reproducible; --trials scales every cell (null cells use 5x as many).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import special as sc
from scipy import stats as sps

from ttsreport import inference as inf
from ttsreport.rounds import FAILURE_GAP_PP

SEED = 20261
SD = 0.01  # per-round sd of d = ln(B/A) in most cells (1 %)
ROUND_SD = 0.03  # shared round effect on both arms (cancels in d; present so the pairing is exercised)
MARGIN = 1.0  # %
CONF = 0.95


class Bench:
    """Collects rows (rates with Wilson intervals, or plain numbers) per section."""

    def __init__(self, seed: int, trials: int):
        self.seed, self.trials, self.rows, self.cell = seed, trials, [], 0

    def rng(self) -> np.random.Generator:
        self.cell += 1
        return np.random.default_rng([self.seed, self.cell])

    def rate(self, section: str, cell: str, quantity: str, k: int, n: int, target: str = "",
             check: str | None = None) -> dict:
        """check: 'le5' (a rate at most 5 %), 'ge93' (at least 93 %), 'near0' (at most 0.5 %), 'zero' (none at
        all), 'all' (every one), or None (reported only). ok: inference.target_met's word for the Wilson interval ("met",
        "not shown to violate", "violated"); 'zero': True when k is 0."""
        lo, hi = inf.wilson(int(k), int(n))
        ok = None
        if check == "le5":
            ok = inf.target_met(int(k), int(n), 0.05)
        elif check == "ge93":
            ok = inf.target_met(int(k), int(n), 0.93, at_most=False)
        elif check == "ge90":
            ok = inf.target_met(int(k), int(n), 0.90, at_most=False)
        elif check == "near0":
            ok = inf.target_met(int(k), int(n), 0.005)
        elif check == "zero":
            ok = k == 0
        elif check == "all":
            ok = k == n
        row = {"section": section, "cell": cell, "quantity": quantity, "k": int(k), "n": int(n), "rate": k / n,
               "lo": lo, "hi": hi, "target": target, "ok": ok}
        self.rows.append(row)
        return row

    def value(self, section: str, cell: str, quantity: str, text: str, target: str = "", ok=None, **raw) -> None:
        self.rows.append({"section": section, "cell": cell, "quantity": quantity, "text": text, "target": target,
                          "ok": ok, **raw})


# ----------------------------------------------------------------------------------------------- data


def rounds(rng, trials: int, n: int, effect: float, sd: float = SD, noise: str = "normal"):
    """A and B per round (trials x n): B = A-arm level x exp(effect + noise); d = ln(B/A) has mean effect, sd sd."""
    u = rng.normal(0.0, ROUND_SD, (trials, n))
    half = sd / math.sqrt(2.0)
    if noise == "normal":
        ea, eb = rng.normal(0, half, (trials, n)), rng.normal(0, half, (trials, n))
    elif noise == "t3":  # heavy tails, scaled to the same sd
        ea = rng.standard_t(3, (trials, n)) * half / math.sqrt(3.0)
        eb = rng.standard_t(3, (trials, n)) * half / math.sqrt(3.0)
    elif noise.startswith("lognormal"):  # B alone has occasional slow/fast rounds: d is skewed
        s = float(noise.split(":")[1])
        raw = rng.lognormal(0.0, s, (trials, n))
        m, v = math.exp(s * s / 2), (math.exp(s * s) - 1) * math.exp(s * s)
        ea = rng.normal(0, half, (trials, n))
        eb = (raw - m) / math.sqrt(v) * half
    else:
        raise ValueError(noise)
    a = 100.0 * np.exp(u + ea)
    b = 100.0 * np.exp(u + effect + eb)
    return a, b


def exact_power(effect_sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of the two-sided one-sample t test (both tails) from the noncentral t distribution."""
    tc = sps.t.ppf(1 - alpha / 2, n - 1)
    ncp = effect_sd * math.sqrt(n)
    return float(sps.nct.sf(tc, n - 1, ncp) + sps.nct.cdf(-tc, n - 1, ncp))


def tost_power(margin_sd: float, n: int, alpha: float = 0.05) -> float:
    """Power of TOST at a true difference of 0 (margin in sd units): P(both one-sided tests reject), exact."""
    tc = sps.t.ppf(1 - alpha, n - 1)
    # both reject iff |mean| / se < margin/se - tc: integrate over the sd estimate (chi distribution)
    s = np.linspace(1e-6, 4.0, 4001)
    dens = sps.chi.pdf(s * math.sqrt(n - 1), n - 1) * math.sqrt(n - 1)
    half = np.maximum(margin_sd * math.sqrt(n) - tc * s, 0.0)
    return float(np.trapezoid(dens * (2 * sps.norm.cdf(half) - 1), s))


def compare(a, b, higher=True, margin=MARGIN, groups=None):
    return inf.compare_rounds(a, b, higher_is_better=higher, margin_pct=margin, confidence=CONF, groups=groups)


# ----------------------------------------------------------------------------------------------- cells


def fixed_design(B: Bench) -> None:
    sec = "Fixed design: one level"
    for n in (3, 5, 8, 20):
        t = B.trials * 5
        a, b = rounds(B.rng(), t, n, 0.0)
        kinds = [compare(a[i], b[i])["kind"] for i in range(t)]
        B.rate(sec, f"true ratio 1, n={n}", "false claims (faster or slower)",
               sum(k in ("faster", "slower") for k in kinds), t, "<= 5 %", "le5")
    # power at 1.2 sd, 8 rounds, against a plain paired t test on the same data
    n, eff = 8, 1.2 * SD
    a, b = rounds(B.rng(), B.trials, n, eff)
    ours = sum(compare(a[i], b[i])["kind"] == "faster" for i in range(B.trials))
    plain_log = int((sps.ttest_rel(np.log(b), np.log(a), axis=1).pvalue < 0.05).sum())
    plain_raw = int((sps.ttest_rel(b, a, axis=1).pvalue < 0.05).sum())
    ex = exact_power(1.2, n)
    r = B.rate(sec, "effect 1.2 sd, n=8", "power: compare_rounds says faster", ours, B.trials,
               f"within 3 points of the plain t test; exact {100 * ex:.1f} %")
    r["ok"] = abs(ours - plain_log) / B.trials <= 0.03 and abs(ours / B.trials - ex) <= 0.03
    B.rate(sec, "effect 1.2 sd, n=8", "power: scipy ttest_rel on ln values (same data)", plain_log, B.trials,
           "reference")
    B.rate(sec, "effect 1.2 sd, n=8", "power: scipy ttest_rel on raw values B−A (same data)", plain_raw, B.trials,
           "reference")
    for k_sd in (0.25, 0.5, 1.0, 1.5, 2.0):
        a, b = rounds(B.rng(), B.trials, 8, k_sd * SD)
        ours = sum(compare(a[i], b[i])["kind"] == "faster" for i in range(B.trials))
        ex = exact_power(k_sd, 8)
        r = B.rate(sec, f"effect {k_sd} sd, n=8", "power (says faster)", ours, B.trials,
                   f"exact t power {100 * ex:.1f} %")
        r["ok"] = r["lo"] - 0.01 <= ex <= r["hi"] + 0.01
    # wrong direction, both metric directions
    a, b = rounds(B.rng(), B.trials, 8, 1.2 * SD)
    B.rate(sec, "throughput B +1.2 sd better, n=8", "wrong direction (says slower)",
           sum(compare(a[i], b[i])["kind"] == "slower" for i in range(B.trials)), B.trials, "≈ 0", "near0")
    a, b = rounds(B.rng(), B.trials, 8, -1.2 * SD)  # latency: B lower = B faster
    res = [compare(a[i], b[i], higher=False)["kind"] for i in range(B.trials)]
    B.rate(sec, "latency B −1.2 sd (B faster), n=8", "says faster", res.count("faster"), B.trials,
           f"exact {100 * exact_power(1.2, 8):.1f} %")
    B.rate(sec, "latency B −1.2 sd (B faster), n=8", "wrong direction (says slower)", res.count("slower"), B.trials,
           "≈ 0", "near0")


def equivalence(B: Bench) -> None:
    sec = "Equivalence (TOST, margin ±1 % = ratio in [1/1.01, 1.01])"
    n, sd = 20, 0.005
    bound = math.log1p(MARGIN / 100)
    for name, eff in (("true ratio 1.01 (on the margin)", bound), ("true ratio 1/1.01 (on the margin)", -bound),
                      ("true ratio 1.011 (just beyond)", math.log(1.011))):
        t = B.trials * 5
        a, b = rounds(B.rng(), t, n, eff, sd)
        k = sum(compare(a[i], b[i])["equivalent"] for i in range(t))  # also when "faster ... within the margin"
        B.rate(sec, f"{name}, sd 0.5 %, n={n}", "equivalence claimed", k, t, "<= 5 %", "le5")
    a, b = rounds(B.rng(), B.trials, n, 0.0, sd)
    k = sum(compare(a[i], b[i])["kind"] == "equivalent" for i in range(B.trials))
    B.rate(sec, f"true ratio 1, sd 0.5 %, n={n}", "equivalence claimed (power)", k, B.trials, "reported")


def coverage(B: Bench) -> None:
    sec = "Coverage of the intervals"
    for n in (3, 8, 20):
        eff = SD
        a, b = rounds(B.rng(), B.trials, n, eff)
        cover = cover_tost = 0
        for i in range(B.trials):
            r = compare(a[i], b[i])
            cover += r["ci"][0] <= math.exp(eff) <= r["ci"][1]
            cover_tost += r["ci_tost"][0] <= math.exp(eff) <= r["ci_tost"][1]
        B.rate(sec, f"effect 1 sd, n={n}", "95 % interval covers the true ratio", cover, B.trials, ">= 93 %", "ge93")
        B.rate(sec, f"effect 1 sd, n={n}", "90 % (TOST) interval covers it", cover_tost, B.trials, "≈ 90 %")


def robustness(B: Bench) -> None:
    sec = "Robustness: heavy-tailed and skewed noise"
    for noise, label in (("t3", "t with 3 df"), ("lognormal:0.5", "lognormal σ=0.5 on B"),
                         ("lognormal:1", "lognormal σ=1 on B")):
        for n in (5, 8):
            t = B.trials
            a, b = rounds(B.rng(), t, n, 0.0, noise=noise)
            k = sum(compare(a[i], b[i])["kind"] in ("faster", "slower") for i in range(t))
            B.rate(sec, f"{label}, true ratio 1, n={n}", "false claims", k, t, "<= 5 %", "le5")
            a, b = rounds(B.rng(), t, n, SD, noise=noise)
            cis = [compare(a[i], b[i])["ci"] for i in range(t)]
            c = sum(lo <= math.exp(SD) <= hi for lo, hi in cis)
            B.rate(sec, f"{label}, effect 1 sd, n={n}", "95 % interval covers", c, t, ">= 93 %", "ge93")


def multilevel(B: Bench) -> None:
    sec = "Several levels: Holm headline on the primary metric"
    n = 8
    for levels, rho in ((3, 0.0), (3, 0.5), (5, 0.5)):
        t = B.trials * 5
        rng = B.rng()
        shared = rng.normal(0, SD * math.sqrt(rho), (t, n))
        holm_any = naive_any = 0
        for i in range(t):
            res = {}
            for lv in range(levels):
                d = shared[i] + rng.normal(0, SD * math.sqrt(1 - rho), n)
                a = 100.0 * np.exp(rng.normal(0, ROUND_SD, n))
                res[f"c{lv}"] = compare(a, a * np.exp(d))
            head = inf.decide_levels(res)
            holm_any += any(v["kind"] in ("faster", "slower") for v in head["levels"].values())
            naive_any += any(v["kind"] in ("faster", "slower") for v in res.values())
        cell = f"{levels} levels, between-level correlation {rho}, true ratio 1, n={n}"
        B.rate(sec, cell, "family-wise false claims, Holm", holm_any, t, "<= 5 %", "le5")
        B.rate(sec, cell, "same data, each level at 95 % uncorrected", naive_any, t, "contrast")
    # power at the one level that has an effect, others null
    rng = B.rng()
    hits = 0
    for _ in range(B.trials):
        res = {}
        for lv, eff in (("c1", 1.5 * SD), ("c2", 0.0), ("c3", 0.0)):
            a = 100.0 * np.exp(rng.normal(0, ROUND_SD, n))
            res[lv] = compare(a, a * np.exp(rng.normal(eff, SD, n)))
        hits += inf.decide_levels(res)["levels"]["c1"]["kind"] == "faster"
    B.rate(sec, "3 levels, effect 1.5 sd at one, n=8", "power at that level after Holm", hits, B.trials,
           f"single-level exact {100 * exact_power(1.5, n):.1f} %")


def run_sequential(d_by_level: dict, **kw) -> dict:
    """What a runner that calls sequential_look after every round ends with. Claims are sticky, so "every level
    decided" only switches on: the first such look is found by bisection, then read as the runner would read it."""
    full = inf.sequential_look(d_by_level, **kw)
    if not full["decided"]:
        return full
    return inf.sequential_look(d_by_level, look=first_decided_look(d_by_level, kw), **kw)


def first_decided_look(d_by_level: dict, kw: dict) -> int:
    lo, hi = kw["min_rounds"], kw["max_rounds"]  # decided is monotone in the look: bisection
    while lo < hi:
        mid = (lo + hi) // 2
        if inf.sequential_look(d_by_level, look=mid, **kw)["decided"]:
            hi = mid
        else:
            lo = mid + 1
    return lo


def sequential(B: Bench) -> None:
    sec = "Sequential: a look after every round (min 3, max 20)"
    kw = {"min_rounds": 3, "max_rounds": 20, "alpha": 0.05, "higher_is_better": True}
    N = kw["max_rounds"]
    # true 0, one level
    t = B.trials * 5
    rng = B.rng()
    d = rng.normal(0, SD, (t, N))
    out = [run_sequential({"c": d[i]}, margin_pct=MARGIN, **kw) for i in range(t)]
    false = sum(o["levels"]["c"]["kind"] in ("faster", "slower") for o in out)
    B.rate(sec, "true ratio 1, sd 1 %, margin 1 %", "false difference claims", false, t, "<= 5 %", "le5")
    B.rate(sec, "true ratio 1, sd 1 %, margin 1 %", "equivalence claimed (correct)",
           sum(o["levels"]["c"]["kind"] == "equivalent" for o in out), t, "reported")
    B.value(sec, "true ratio 1, sd 1 %, margin 1 %", "rounds at stop",
            f"mean {np.mean([o['look'] for o in out]):.1f}, median {np.median([o['look'] for o in out]):.0f}")
    # the same looks with a fixed-sample t test at each look (what not to do)
    n = np.arange(1, N + 1)
    cs, cs2 = np.cumsum(d, 1), np.cumsum(d * d, 1)
    mean = cs / n
    sdv = np.sqrt(np.maximum(cs2 - n * mean ** 2, 0) / np.maximum(n - 1, 1))
    tt = np.abs(mean[:, 2:] / (sdv[:, 2:] / np.sqrt(n[2:])))
    naive = int((tt > sc.stdtrit(n[2:] - 1, 0.975)).any(axis=1).sum())
    B.rate(sec, "true ratio 1, same data", "a plain 95 % t test at every look", naive, t, "contrast")
    # margin 0: nothing but a difference can stop it, so every path runs to max_rounds (the boundary's worst case)
    for levels in (1, 3):
        rng = B.rng()
        shared = rng.normal(0, SD * math.sqrt(0.5), (t, N))
        out = []
        for i in range(t):
            lv = {f"c{j}": (shared[i] + rng.normal(0, SD * math.sqrt(0.5), N)) if levels > 1 else
                  rng.normal(0, SD, N) for j in range(levels)}
            out.append(run_sequential(lv, margin_pct=0.0, **kw))
        fw = sum(any(r["kind"] in ("faster", "slower") for r in o["levels"].values()) for o in out)
        B.rate(sec, f"{levels} level{'s' if levels > 1 else ''}{', correlation 0.5' if levels > 1 else ''}, true "
               "ratio 1, margin 0 (runs to max_rounds)", "false difference claims" if levels == 1 else
               "family-wise false claims", fw, t, "<= 5 %", "le5")
    # equivalence at the margin
    bound = math.log1p(MARGIN / 100)
    for name, eff in (("true ratio 1.01 (on the margin)", bound), ("true ratio 1/1.01 (on the margin)", -bound)):
        rng = B.rng()
        d = rng.normal(eff, 0.005, (t, N))
        out = [run_sequential({"c": d[i]}, margin_pct=MARGIN, **kw) for i in range(t)]
        B.rate(sec, f"{name}, sd 0.5 %", "equivalence claimed (stopping when decided)",
               sum(o["levels"]["c"]["equivalent"] for o in out), t, "<= 5 %", "le5")
        out = [inf.sequential_look({"c": d[i]}, margin_pct=MARGIN, **kw) for i in range(t)]
        B.rate(sec, f"{name}, sd 0.5 %", "equivalence claimed at any look up to 20 (never stopping: worst case)",
               sum(o["levels"]["c"]["equivalent"] for o in out), t, "<= 5 %", "le5")
    # three correlated levels at true 0
    rng = B.rng()
    shared = rng.normal(0, SD * math.sqrt(0.5), (t, N))
    out = []
    for i in range(t):
        lv = {f"c{j}": shared[i] + rng.normal(0, SD * math.sqrt(0.5), N) for j in range(3)}
        out.append(run_sequential(lv, margin_pct=MARGIN, **kw))
    fw = sum(any(r["kind"] in ("faster", "slower") for r in o["levels"].values()) for o in out)
    B.rate(sec, "3 levels, correlation 0.5, true ratio 1", "family-wise false claims", fw, t, "<= 5 %", "le5")
    # power and rounds at a few effects (margin 0.5 % so that only a difference settles these)
    for k_sd in (0.5, 1.0, 1.2, 2.0):
        rng = B.rng()
        d = rng.normal(k_sd * SD, SD, (B.trials, N))
        out = [run_sequential({"c": d[i]}, margin_pct=0.5, **kw) for i in range(B.trials)]
        looks = [o["look"] for o in out]
        r = B.rate(sec, f"effect {k_sd} sd, margin 0.5 %", "says faster", sum(o["levels"]["c"]["kind"] == "faster"
                                                                              for o in out), B.trials,
                   f"fixed n=20: {100 * exact_power(k_sd, 20):.1f} %, fixed n=8: {100 * exact_power(k_sd, 8):.1f} %")
        r["mean_rounds"] = float(np.mean(looks))
        B.value(sec, f"effect {k_sd} sd, margin 0.5 %", "rounds at stop",
                f"mean {np.mean(looks):.1f}, median {np.median(looks):.0f}, max {max(looks)}")
        B.rate(sec, f"effect {k_sd} sd, margin 0.5 %", "wrong direction (says slower)",
               sum(o["levels"]["c"]["kind"] == "slower" for o in out), B.trials, "≈ 0", "near0")


def _t_paths(d: np.ndarray, looks: np.ndarray):
    """Mean, sd and t statistic of every prefix n in looks (rows are experiments)."""
    n = looks.astype(float)
    s1, s2 = np.cumsum(d, 1)[:, looks - 1], np.cumsum(d * d, 1)[:, looks - 1]
    mean = s1 / n
    sd = np.sqrt(np.maximum(s2 - n * mean ** 2, 0) / (n - 1))
    return mean, sd, mean / (sd / np.sqrt(n))


def _cs_radius(n: np.ndarray, c: float, alpha: float) -> np.ndarray:
    """Half-width / sd of the t-mixture confidence sequence (Lai 1976) for a normal mean with unknown variance:
    the set of mu where the scale-invariant mixture likelihood ratio (mixing N(0, 1/c) over the standardised effect)
    stays below 1/alpha; derived in closed form."""
    k = ((1 / alpha) * np.sqrt((n + c) / c)) ** (2 / n)
    a = n * (1 - k * c / (n + c))
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.sqrt((k - 1) * (n - 1) / a)
    return np.where(a > 0, r, np.inf)


def sequential_alternatives(B: Bench) -> None:
    """The two rules not chosen, on the same kind of data: t->z conversion with the known-variance boundary constant,
    and an always-valid confidence sequence (no max_rounds needed)."""
    sec = "Sequential: a look after every round (min 3, max 20)"
    N, lo, alpha, t = 20, 3, 0.05, B.trials * 5
    looks = np.arange(lo, N + 1)
    w = np.sqrt(looks / N)
    rng = B.rng()
    z_known = np.cumsum(rng.standard_normal((200_000, N)), 1)[:, looks - 1] / np.sqrt(looks)  # known variance
    c_normal = float(np.quantile(np.abs(z_known * w).max(1), 1 - alpha))
    d = rng.normal(0, SD, (t, N))
    _, _, tt = _t_paths(d, looks)
    z = np.sign(tt) * -sc.ndtri(sc.stdtr(looks - 1, -np.abs(tt)))
    k = int((np.abs(z) * w >= c_normal).any(1).sum())
    B.rate(sec, "true ratio 1, margin 0; rule NOT chosen: same boundary shape, C from known-variance theory "
           f"({c_normal:.3f}), t->z conversion only", "false claims", k, t, "contrast")
    n = looks.astype(float)
    best = min(np.exp(np.linspace(-8, 4, 241)), key=lambda c: float(_cs_radius(np.array([float(N)]), c, alpha)[0]))
    rad = _cs_radius(n, best, alpha)
    for eff, rows in ((0.0, t), (SD, B.trials)):
        d = rng.normal(eff, SD, (rows, N))
        mean, sd, _ = _t_paths(d, looks)
        with np.errstate(invalid="ignore"):
            low = np.maximum.accumulate(np.where(np.isfinite(rad), mean - rad * sd, -np.inf), 1)
            high = np.minimum.accumulate(np.where(np.isfinite(rad), mean + rad * sd, np.inf), 1)
        claims = int(((low[:, -1] > 0) | (high[:, -1] < 0)).sum())
        what = "false claims" if eff == 0 else "says a difference (power)"
        B.rate(sec, f"{'true ratio 1' if eff == 0 else 'effect 1 sd'}; rule NOT chosen: t-mixture confidence "
               f"sequence (c={best:.3g}), looks 3..20", what, claims, rows, "contrast")


def early_looks(B: Bench) -> None:
    """A large effect at a small spread: decided at the first permitted look? And the whole procedure's false-claim
    rate with the first look's t test on a share of alpha (margin 0: every null path runs to max_rounds)."""
    from ttsreport.inference.sequential import FIRST_LOOK_SHARE
    sec = f"Sequential: the first look (a plain t test on {100 * FIRST_LOOK_SHARE:g} % of alpha)"
    for lo in (3, 2):
        kw = {"min_rounds": lo, "max_rounds": 20, "alpha": 0.05, "higher_is_better": True, "margin_pct": MARGIN}
        for pct, levels in ((25, 1), (10, 1), (25, 2)):
            rng = B.rng()
            first = wrong = 0
            for _ in range(B.trials):
                d = {f"c{j}": rng.normal(math.log1p(pct / 100), SD, lo) for j in range(levels)}
                look = inf.sequential_look(d, look=lo, **kw)
                first += look["stop"] and all(r["kind"] == "faster" for r in look["levels"].values())
                wrong += any(r["kind"] == "slower" for r in look["levels"].values())
            what = f"B ×{1 + pct / 100:g} at sd 1 %, {levels} level{'s' if levels > 1 else ''}, min {lo}, max 20"
            # the ceiling: a plain t test on all of alpha (over Holm's first step) at that look, exact
            df, ncp = lo - 1, math.log1p(pct / 100) / SD * math.sqrt(lo)
            share = FIRST_LOOK_SHARE / levels
            exact = float(sps.nct.sf(sps.t.ppf(1 - 0.05 * share / 2, df), df, ncp))
            ceiling = float(sps.nct.sf(sps.t.ppf(1 - 0.05 / levels / 2, df), df, ncp))
            B.rate(sec, what, "decided (every level faster) at the first permitted look", first, B.trials,
                   f"exact {100 * exact:.1f} % per level; a t test on all of alpha there: {100 * ceiling:.1f} %",
                   None if lo == 2 or pct == 10 else "ge93")
            B.rate(sec, what, "wrong direction", wrong, B.trials, "≈ 0", "near0")
    t = B.trials * 5
    for lo, hi in ((2, 20), (2, 6), (3, 6)):
        rng = B.rng()
        kw = {"min_rounds": lo, "max_rounds": hi, "alpha": 0.05, "higher_is_better": True, "margin_pct": 0.0}
        d = rng.normal(0, SD, (t, hi))
        claims = sum(inf.sequential_look({"c": d[i]}, **kw)["levels"]["c"]["kind"] in ("faster", "slower")
                     for i in range(t))
        B.rate(sec, f"true ratio 1, margin 0 (runs to max_rounds), min {lo}, max {hi}",
               "false difference claims (the whole procedure)", claims, t, "<= 5 %", "le5")


def nested(B: Bench) -> None:
    sec = "Nested designs: window pairs inside server starts"
    S, W, s_start, s_pair = 6, 4, SD, SD
    for eff in (0.0, SD):
        rng = B.rng()
        t = B.trials
        cov_g = cov_p = claim_g = claim_p = 0
        groups = np.repeat(np.arange(S), W)
        for _ in range(t):
            d = eff + np.repeat(rng.normal(0, s_start, S), W) + rng.normal(0, s_pair, S * W)
            a = 100.0 * np.exp(rng.normal(0, ROUND_SD, S * W))
            b = a * np.exp(d)
            rg, rp = compare(a, b, groups=groups), compare(a, b)
            cov_g += rg["ci"][0] <= math.exp(eff) <= rg["ci"][1]
            cov_p += rp["ci"][0] <= math.exp(eff) <= rp["ci"][1]
            claim_g += rg["kind"] in ("faster", "slower")
            claim_p += rp["kind"] in ("faster", "slower")
        cell = f"{S} starts x {W} pairs, sd start 1 %, sd pair 1 %, true ratio {math.exp(eff):.2f}"
        B.rate(sec, cell, "95 % interval covers, grouped by start", cov_g, t, ">= 93 %", "ge93")
        B.rate(sec, cell, "95 % interval covers, plain per-pair t (wrong)", cov_p, t, "under-covers")
        if eff == 0:
            B.rate(sec, cell, "false claims, grouped", claim_g, t, "<= 5 %", "le5")
            B.rate(sec, cell, "false claims, plain per-pair t (wrong)", claim_p, t, "contrast")
    # variance components with known truth, unbalanced two-level and three-level
    rng = B.rng()
    truth = {"sigma2_start": 1e-4, "sigma2_pair": 2.25e-4}
    est = {k: [] for k in truth}
    for _ in range(B.trials):
        sizes = rng.integers(2, 7, size=8)
        starts = np.repeat(np.arange(8), sizes)
        d = rng.normal(0, math.sqrt(truth["sigma2_start"]), 8)[starts] + \
            rng.normal(0, math.sqrt(truth["sigma2_pair"]), starts.size)
        raw = inf.variance_components(d, starts)["raw"]
        for k in truth:
            est[k].append(raw[k])
    for k, v in truth.items():
        m, se = float(np.mean(est[k])), float(np.std(est[k], ddof=1) / math.sqrt(len(est[k])))
        B.value(sec, "8 starts, 2–6 pairs each (unbalanced)", f"mean estimate of {k} (untruncated)",
                f"{m:.3e} ± {2 * se:.1e} (2 se); truth {v:.3e}", "unbiased", abs(m - v) <= 3 * se)
    rng = B.rng()
    truth3 = {"sigma2_start": 1e-4, "sigma2_pair": 0.5e-4, "sigma2_within": 2e-4}
    est = {k: [] for k in truth3}
    for _ in range(B.trials):
        S3, W3, R3 = 6, 3, 2
        starts = np.repeat(np.arange(S3), W3 * R3)
        windows = np.tile(np.repeat(np.arange(W3), R3), S3)
        d = (rng.normal(0, math.sqrt(truth3["sigma2_start"]), S3)[starts]
             + rng.normal(0, math.sqrt(truth3["sigma2_pair"]), S3 * W3)[starts * W3 + windows]
             + rng.normal(0, math.sqrt(truth3["sigma2_within"]), starts.size))
        raw = inf.variance_components(d, starts, windows=windows)["raw"]
        for k in truth3:
            est[k].append(raw[k])
    for k, v in truth3.items():
        m, se = float(np.mean(est[k])), float(np.std(est[k], ddof=1) / math.sqrt(len(est[k])))
        B.value(sec, "6 starts x 3 windows x 2 values", f"mean estimate of {k} (untruncated)",
                f"{m:.3e} ± {2 * se:.1e} (2 se); truth {v:.3e}", "unbiased", abs(m - v) <= 3 * se)
    # a plan from known components, then that design simulated
    comps = {"sigma2_start": 1e-4, "sigma2_pair": 4e-4}
    plan = inf.plan_nested(comps, cost_start_s=120, cost_window_s=60, target_halfwidth_pct=1.0)
    S, W = plan["starts"], plan["windows_per_start"]
    rng = B.rng()
    cov, widths = 0, []
    groups = np.repeat(np.arange(S), W)
    for _ in range(B.trials):
        d = np.repeat(rng.normal(0, 0.01, S), W) + rng.normal(0, 0.02, S * W)
        a = 100.0 * np.exp(rng.normal(0, ROUND_SD, S * W))
        r = compare(a, a * np.exp(d), groups=groups)
        cov += r["ci"][0] <= 1.0 <= r["ci"][1]
        widths.append(100 * (r["ci"][1] / r["ratio"] - 1))
    B.value(sec, "plan_nested(sd start 1 %, sd pair 2 %, 120 s/start, 60 s/pair, ±1 %)", "plan",
            f"S={S} starts x W={W} pairs, cost {plan['cost_s']:.0f} s, planned half-width "
            f"{plan['halfwidth_pct']:.2f} % (W* continuous {plan['w_continuous']:.2f})", "", None,
            plan={k: plan[k] for k in ("starts", "windows_per_start", "cost_s", "halfwidth_pct", "w_continuous")})
    B.value(sec, "that design simulated", "observed half-width",
            f"median {np.median(widths):.2f} %, mean {np.mean(widths):.2f} % (target 1 %: the plan aims at the "
            "expected width; a sample sd below sigma gives a narrower one and vice versa)")
    B.rate(sec, "that design simulated", "95 % interval covers", cov, B.trials, ">= 93 %", "ge93")


def checks(B: Bench) -> None:
    sec = "A/A rounds, order effect, failures"
    rng = B.rng()
    t = B.trials * 5
    warns = 0
    for _ in range(t):
        a = 100 * np.exp(rng.normal(0, ROUND_SD, 4))
        warns += inf.aa_check(a, a * np.exp(rng.normal(0, SD, 4)))["warn"]
    B.rate(sec, "4 A/A rounds, no bias", "warn (interval excludes 1)", warns, t, "<= 5 %", "le5")
    rng = B.rng()
    warns = 0
    for _ in range(B.trials):
        a = 100 * np.exp(rng.normal(0, ROUND_SD, 4))
        warns += inf.aa_check(a, a * np.exp(rng.normal(2 * SD, SD, 4)))["warn"]
    B.rate(sec, "4 A/A rounds, order bias of 2 sd", "warn", warns, B.trials, "reported")
    for gamma in (0.0, 1.0):
        rng = B.rng()
        warns = 0
        for _ in range(B.trials if gamma else t):
            order = rng.permutation(["AB"] * 10 + ["BA"] * 10)
            d = rng.normal(0.005, SD, 20) + gamma * SD * np.where(order == "AB", 0.5, -0.5)
            warns += inf.order_effect(d, order)["warn"]
        B.rate(sec, f"20 pairs (10 AB, 10 BA), carry-over {gamma} sd", "warn (carry-over shown)", warns,
               B.trials if gamma else t, "<= 5 %" if gamma == 0 else "reported", "le5" if gamma == 0 else None)
    # failures: 8 rounds x 200 requests per arm, per-block rates drawn from a beta with mean m and sd 1 point
    n_req = 200
    for m_a, m_b in ((0.01, 0.01), (0.0, 0.0), (0.01, 0.04)):
        rng = B.rng()
        tt = t if m_a == m_b else B.trials
        hull = newc = tonly = 0
        for _ in range(tt):
            if m_a == 0:
                fa, fb = np.zeros(8, int), np.zeros(8, int)
            else:
                fa = rng.binomial(n_req, rng.beta(*_beta(m_a, 0.01), 8))
                fb = rng.binomial(n_req, rng.beta(*_beta(m_b, 0.01), 8))
            tot = np.full(8, n_req)
            r = inf.compare_error_rates(fa, tot, fb, tot)
            hull += r["kind"] != "inconclusive"
            lo, hi = r["ci_newcombe_pp"]
            newc += lo > 0 or hi < 0
            if r["ci_t_pp"] is not None:
                tonly += r["ci_t_pp"][0] > 0 or r["ci_t_pp"][1] < 0
        cell = f"8 rounds x {n_req} requests, failure rate A {100 * m_a:g} %, B {100 * m_b:g} %"
        if m_a == m_b:
            B.rate(sec, cell, "claims (hull of paired t and Newcombe)", hull, tt, "<= 5 %", "le5")
            if m_a > 0:
                B.rate(sec, cell, "claims by Newcombe on pooled counts alone", newc, tt, "contrast")
                B.rate(sec, cell, "claims by the paired t alone", tonly, tt, "contrast")
        else:
            B.rate(sec, cell, "says B fails more", hull, tt, "reported")


def not_claims(B: Bench) -> None:
    """What must never be a claim: a round in which an arm failed, no spread, an error rate from one round; and the
    interval a card shows against the word it shows."""
    sec = "Findings that are not claims, and the interval beside each word"
    n = 4
    rng = B.rng()  # B 5 % faster in the rounds that worked (5 sd), B produced nothing in one round
    claims = dropped = heads = 0
    for _ in range(B.trials):
        a, b = rounds(rng, 1, n, 0.05)
        b = list(b[0])
        lost = int(rng.integers(0, n))
        b[lost] = None
        r = inf.compare_rounds(a[0], b, higher_is_better=True, margin_pct=MARGIN, confidence=CONF,
                               failed=["B" if i == lost else None for i in range(n)])
        claims += r["kind"] in inf.CLAIMS
        dropped += compare(a[0], b)["kind"] in inf.CLAIMS  # the round silently skipped, as before the rule
        heads += inf.decide_levels({"8": r, "64": compare(a[0], a[0] * np.exp(rng.normal(0.05, SD, n)))})[
            "kind"] == "failed"
    cell = f"{n} rounds, B ×1.05 where it worked, B produced nothing in 1 round"
    B.rate(sec, cell, "speed claim at that level (faster/slower/equivalent)", claims, B.trials, "0", "zero")
    B.rate(sec, cell, "same data, the failed round skipped as missing (the old behaviour)", dropped, B.trials,
           "contrast")
    B.rate(sec, cell + ", second level fine", "headline names the failure (kind 'failed')", heads, B.trials, "all",
           "all")
    rng = B.rng()
    claims = 0
    t = B.trials * 5
    for _ in range(t):  # a constant ratio (every unit the same) from 2-5 units, anywhere in ±2 %
        k = int(rng.integers(2, 6))
        a = 100.0 * np.exp(rng.normal(0, ROUND_SD, k))
        claims += compare(a, a * math.exp(float(rng.uniform(-0.02, 0.02))))["kind"] in inf.CLAIMS
    B.rate(sec, "zero spread: the same ratio (in ±2 %) in each of 2-5 units", "any claim (faster/slower/equivalent)",
           claims, t, "0", "zero")
    for k, sd in ((2, 0.001), (3, 0.001), (2, SD)):
        rng = B.rng()
        a, b = rounds(rng, t, k, 0.0, sd)
        alarms = sum(compare(a[i], b[i])["kind"] == "no_spread" for i in range(t))
        theory = float(sc.gammainc((k - 1) / 2, (k - 1) * (inf.NO_SPREAD_LOG / sd) ** 2 / 2))
        B.rate(sec, f"real spread sd {100 * sd:g} %, {k} units", "read as 'no spread' (a false alarm)", alarms, t,
               f"chi-square {100 * theory:.2g} %")
    rng = B.rng()  # error rates, one round of 200 requests per arm, both arms 1 % with round-to-round variation
    ours = newc = 0
    for _ in range(t):
        fa = rng.binomial(200, rng.beta(*_beta(0.01, 0.01), 1))
        fb = rng.binomial(200, rng.beta(*_beta(0.01, 0.01), 1))
        r = inf.compare_error_rates(fa, [200], fb, [200])
        ours += r["kind"] != "inconclusive"
        lo, hi = r["ci_newcombe_pp"]
        newc += lo > 0 or hi < 0
    cell = "error rate, 1 round x 200 requests, A and B 1 % (sd 1 point between rounds)"
    B.rate(sec, cell, "claims (no paired interval: none)", ours, t, "0", "zero")
    B.rate(sec, cell, "claims by Newcombe on the pooled counts alone", newc, t, "contrast")
    rng = B.rng()  # the card's interval against its word, over random data (1-5 levels, 2-9 units, effects ±3 sd)
    bad = cards = 0
    for _ in range(B.trials):
        res = {}
        for lv in range(int(rng.integers(1, 6))):
            k = int(rng.integers(2, 10))
            a, b = rounds(rng, 1, k, float(rng.uniform(-0.03, 0.03)), float(rng.uniform(0.001, 0.03)))
            res[str(lv)] = compare(a[0], b[0])
        for row in inf.decide_levels(res)["levels"].values():
            cards += 1
            ci = row["ci_decision"]
            bad += not (
                (row["kind"] == "faster" and ci[0] > 1.0) or (row["kind"] == "slower" and ci[1] < 1.0)
                or (row["kind"] == "equivalent" and 1 / (1 + MARGIN / 100) < ci[0] and ci[1] < 1 + MARGIN / 100)
                or (row["kind"] == "inconclusive" and ci[0] <= 1.0 <= ci[1]) or (row["kind"] == "no_spread"
                                                                               and ci is None))
    B.rate(sec, f"{B.trials} experiments of 1-5 levels, 2-9 rounds, effects up to ±3 %", "cards whose interval "
           "contradicts their word (Holm step / TOST / Bonferroni)", bad, cards, "0", "zero")
    lines_interval(B, sec)
    rng = B.rng()  # swap: every pair in one start; a start-by-arm effect (sd 1 %) moves every pair of the start alike
    for pairs in (4, 8, 16, 32):
        claims = 0
        for _ in range(B.trials):
            start_arm = float(rng.normal(0, 0.01))
            d = start_arm + rng.normal(0, 0.0017, pairs)  # the per-pair sd measured on swap (reports/bench/designs.md)
            a = 100.0 * np.exp(rng.normal(0, ROUND_SD, pairs))
            r = inf.compare_rounds(a, a * np.exp(d), higher_is_better=True, margin_pct=MARGIN, confidence=CONF,
                                   scope="in this server start")
            claims += r["kind"] in ("faster", "slower")
        B.rate(sec, f"swap, {pairs} pairs in one start, server's true ratio 1, start x arm sd 1 %",
               "claims, each worded 'in this server start' (true of that start, not of the server)", claims,
               B.trials, "reported: why the word says so")


def _agrees(kind: str, ci, higher: bool = True) -> bool:
    """Whether an interval (ratios B/A) can have decided the word beside it (margin ±MARGIN %)."""
    if ci is None:
        return kind in ("no_spread", "failed", "inconclusive")
    lo, hi = ci
    up, down = (lo > 1.0, hi < 1.0) if higher else (hi < 1.0, lo > 1.0)
    return {"faster": up, "slower": down, "inconclusive": lo <= 1.0 <= hi,
            "equivalent": 1 / (1 + MARGIN / 100) < lo and hi < 1 + MARGIN / 100}.get(kind, False)


def lines_interval(B: Bench, sec: str) -> None:
    """Every other line that shows a word beside an interval: secondary rows (compare_rounds alone), the looks
    (table, --look line, looks.jsonl, the dashboard's live view: sequential_look's rows and the line printed from
    them), the failures section (decide_levels on the rounds without failures) and the error-rate line."""
    from ttsreport import looks as lk
    rng = B.rng()
    counts = {"secondary": [0, 0], "looks": [0, 0], "error rate": [0, 0]}
    for _ in range(B.trials):
        n_lv, k = int(rng.integers(1, 5)), int(rng.integers(2, 10))
        d = {}
        for lv in range(n_lv):
            a, b = rounds(rng, 1, k, float(rng.uniform(-0.03, 0.03)), float(rng.uniform(0.001, 0.03)))
            higher = bool(rng.integers(0, 2))
            r = inf.compare_rounds(a[0], b[0], higher_is_better=higher, margin_pct=MARGIN, confidence=CONF)
            counts["secondary"][0] += not _agrees(r["kind"], r["ci_decision"], higher)
            counts["secondary"][1] += 1
            d[str(lv)] = np.log(b[0] / a[0])
        look = inf.sequential_look(d, min_rounds=2, max_rounds=max(k, 3), margin_pct=MARGIN, higher_is_better=True)
        for lv, row in look["levels"].items():
            if row["ci"] is None and row["ci_decision"] is None:
                continue  # waiting for min_rounds: no word yet
            ci = row["ci_decision"]
            line = lk.one_line({"rounds": k, "stop": look["stop"], "reason": look["reason"], "levels": {lv: row}})
            shown = ci is None or f"[{ci[0]:.3f}, {ci[1]:.3f}]" in line and f"[{ci[0]:.3f}, {ci[1]:.3f}]" in row["text"]
            counts["looks"][0] += not (_agrees(row["kind"], ci) and shown)
            counts["looks"][1] += 1
        tot = rng.integers(1, 60, k)
        pa, pb = float(rng.uniform(0, 0.3)), float(rng.choice([0.0, 0.3, 1.0]))
        for fa, fb in ((rng.binomial(tot, pa), rng.binomial(tot, pb)), (np.zeros(k, int), tot)):
            e = inf.compare_error_rates(fa, tot, fb, tot)
            ci = e["ci_pp"]
            ok = ((e["kind"] == "more_failures" and ci[0] > 0) or (e["kind"] == "fewer_failures" and ci[1] < 0)
                  or (e["kind"] == "inconclusive" and (ci is None or ci[0] <= 0 <= ci[1])))
            counts["error rate"][0] += not ok
            counts["error rate"][1] += 1
    names = {"secondary": "secondary rows (each metric's own interval: claim / TOST / plain)",
             "looks": "sequential look rows and the printed look line (Holm-step repeated interval / equivalence / "
                      "simultaneous)",
             "error rate": "error-rate lines (hull; none shown when no interval decided it), incl. B failing "
                           "every request in every round"}
    for key, (bad, n) in counts.items():
        B.rate(sec, f"{B.trials} experiments of 1-4 levels, 2-9 rounds", names[key] + ": interval contradicts "
               "the word", bad, n, "0", "zero")


def equivalence_levels(B: Bench) -> None:
    """"Equivalent" over several levels: every level at x1.011 (just beyond a 1 % margin) or exactly on it, sd 0.5 %,
    20 rounds, 4 independent levels: how often does some card say "equivalent" (or a claim "within the margin")?
    decide_levels applies Holm to the TOST p-values and sequential_look Bonferroni to its equivalence intervals, so
    the family-wise rate is the target (the audit found 10.4 % / 15.3 % per level, uncorrected); and the price in
    power: every level at x1.000."""
    sec = "Several levels: Holm headline on the primary metric"
    cases = (("x1.011 (just beyond the margin)", math.log(1.011), "le5"),
             ("x1.01 (on the margin)", math.log1p(MARGIN / 100), "le5"),
             ("x1.000 (inside the margin: power)", 0.0, None))
    for name, eff, check in cases:
        rng = B.rng()
        some = every = seq_some = 0
        for _ in range(B.trials):
            res, ds = {}, {}
            for lv in range(4):
                a = 100.0 * np.exp(rng.normal(0, ROUND_SD, 20))
                b = a * np.exp(rng.normal(eff, 0.005, 20))
                res[str(lv)], ds[str(lv)] = compare(a, b), list(np.log(b / a))
            rows = inf.decide_levels(res)["levels"].values()
            some += any(r["equivalent"] for r in rows)  # "equivalent", or a claim "within the margin"
            every += all(r["kind"] == "equivalent" for r in rows)
            look = inf.sequential_look(ds, min_rounds=3, max_rounds=20, margin_pct=MARGIN, higher_is_better=True)
            seq_some += any(r["kind"] == "equivalent" for r in look["levels"].values())
        cell = f"4 independent levels, each {name}, sd 0.5 %, 20 rounds"
        target = "<= 5 %" if check else "reported (power)"
        B.rate(sec, cell, "some card says 'equivalent' or 'within the margin' (Holm over the TOSTs)", some, B.trials,
               target, check)
        B.rate(sec, cell, "'equivalent at every level'", every, B.trials, target, check)
        B.rate(sec, cell, "sequential (min 3, max 20): some level 'equivalent' at the last look (Bonferroni)",
               seq_some, B.trials, target, check)


def failures_power(B: Bench) -> None:
    """Power when windows fail now and then: B 2 % faster at sd 1 %, each window failing with probability 1 % (either
    arm), one level. A round where only A failed may still say "faster" (the failure can only strengthen it); a claim
    the looks made before a failure stays; a round where B failed blocks "faster" (it could be the reason)."""
    sec = "Failures are data: power when 1 % of windows fail"
    rng = B.rng()
    n_max, lo = 20, 3
    kw = {"min_rounds": lo, "max_rounds": n_max, "alpha": 0.05, "higher_is_better": True, "margin_pct": 0.5}
    fixed = seq = wrong = 0
    rounds_used = []
    for _ in range(B.trials):
        a, b = rounds(rng, 1, n_max, 0.02)
        a, b = a[0], b[0].copy()
        fa, fb = rng.random(n_max) < 0.01, rng.random(n_max) < 0.01
        failed = ["A and B" if x and y else "A" if x else "B" if y else None for x, y in zip(fa, fb, strict=True)]
        b[fb] *= 0.3  # the failed arm's few survivors: nothing like its other rounds
        a[fa & ~fb] *= 0.3
        r = inf.compare_rounds(a, b, higher_is_better=True, margin_pct=0.5, confidence=CONF, failed=failed)
        fixed += r["kind"] == "faster"
        wrong += r["kind"] == "slower"
        d = [None if f else float(np.log(y / x)) for x, y, f in zip(a, b, failed, strict=True)]
        first = next((i for i, f in enumerate(failed) if f), None)
        kind, used = "inconclusive", n_max
        for k in range(lo, n_max + 1):  # the runner's looks, as comparison.headline_sequential reads them
            now = inf.sequential_look({"c": d[:k]}, final=k == n_max, **kw)["levels"]["c"]["kind"]
            if first is not None and first < k:
                before = (inf.sequential_look({"c": d}, look=first, **kw)["levels"]["c"]["kind"] if first >= lo
                          else None)
                allowed = inf.claim_allowed({"by_arm": {x: 1 for f in failed[:k] if f for x in ("A", "B") if x in f}})
                now = before if before in ("faster", "slower") else now if now == allowed else "failed"
            if now in inf.CLAIMS:
                kind, used = now, k
                break
            kind = now
        seq += kind == "faster"
        rounds_used.append(used)
    cell = "B ×1.02 at sd 1 %, 1 % of windows fail (either arm), one level"
    B.rate(sec, cell, "says faster, fixed design of 20 rounds", fixed, B.trials,
           f"no failure in B's 20 windows: {100 * 0.99 ** 20:.1f} %; the audit found 68 % before the direction rule")
    B.rate(sec, cell, "says faster, sequential (min 3, max 20)", seq, B.trials,
           ">= 90 % (the audit: 85 % before claims stayed)", "ge90")
    B.value(sec, cell, "rounds at stop (sequential)", f"mean {np.mean(rounds_used):.1f}, median "
            f"{np.median(rounds_used):.0f}")
    B.rate(sec, cell, "wrong direction (fixed)", wrong, B.trials, "≈ 0", "near0")


def not_measured(B: Bench) -> None:
    """A window too short to hold a request (no measure-phase request started, 0 errors) in the slower arm: the
    statistics' rounds (ttsreport.rounds.values) leave the round out as invalid; never 'failed', never a zero."""
    from ttsreport import rounds as rd
    sec = "Findings that are not claims, and the interval beside each word"
    rng = B.rng()
    failed = zero = listed = claims = 0
    for _ in range(B.trials):
        n = 4
        a, b = rounds(rng, 1, n, -0.05)  # B 5 % slower
        lost = int(rng.integers(0, n))
        pairs = {}
        for r in range(n):
            lb = {"n": 0, "n_error": 0, "window_s": 0.06, "throughput_rps": None, "e2e_p50": None} if r == lost else \
                {"n": 10, "n_error": 0, "window_s": 30.0, "throughput_rps": float(b[0][r]), "e2e_p50": 3.0}
            la = {"n": 12, "n_error": 0, "window_s": 30.0, "throughput_rps": float(a[0][r]), "e2e_p50": 3.0}
            pairs[r] = {"A": {"levels": {"2": la}, "block_id": f"{2 * r:03d}-A", "start": 0},
                        "B": {"levels": {"2": lb}, "block_id": f"{2 * r + 1:03d}-B", "start": 0}}
        v = rd.values(pairs, "2", "throughput_rps")
        res = inf.compare_rounds(v["a"], v["b"], higher_is_better=True, margin_pct=MARGIN, confidence=CONF,
                                 failed=v["failed"])
        failed += res["kind"] == "failed" or any(v["failed"])
        zero += any(x is not None and x <= 0 for x in v["a"] + v["b"])
        listed += [x["round"] for x in v["not_measured"]] == [lost]
        claims += res["kind"] == "slower"
    cell = "4 rounds, B ×0.95, B's window at c=2 too short for a request (n 0, 0 errors) in 1 round"
    B.rate(sec, cell, "called 'failed'", failed, B.trials, "0", "zero")
    B.rate(sec, cell, "read as a zero", zero, B.trials, "0", "zero")
    B.rate(sec, cell, "listed as not measured (that round)", listed, B.trials, "all", "all")
    B.rate(sec, cell, "says slower from the 3 measured rounds", claims, B.trials, "reported")


def _beta(mean: float, sd: float) -> tuple[float, float]:
    k = mean * (1 - mean) / sd ** 2 - 1
    return mean * k, (1 - mean) * k


def planning(B: Bench) -> None:
    sec = "Rounds needed: pilot of 4 rounds, then the advised number more"
    cap = 200
    for name, eff, sd in (("effect 1.5 sd (a claim to reach)", 0.015, SD), ("true ratio 1, sd 0.5 % (equivalence)",
                                                                             0.0, 0.005)):
        rng = B.rng()
        settled = asked = over = false = right = 0
        advised = []
        for _ in range(B.trials):
            a, b = rounds(rng, 1, 4, eff, sd)
            r = compare(a[0], b[0])
            if r["kind"] != "inconclusive":
                false += eff == 0 and r["kind"] in ("faster", "slower")
                continue
            asked += 1
            need = r["rounds_needed"]
            if need is None or need > cap:
                over += 1
                continue
            advised.append(need)
            a2, b2 = rounds(rng, 1, need, eff, sd)
            r2 = compare(np.concatenate([a[0], a2[0]]), np.concatenate([b[0], b2[0]]))
            settled += r2["kind"] != "inconclusive"
            right += r2["kind"] == ("equivalent" if eff == 0 else "faster")
            false += eff == 0 and r2["kind"] in ("faster", "slower")
        B.rate(sec, name, "settled after the advised rounds (of pilots left undecided)", settled, asked,
               "80 % power at the 80 % spread bound")
        B.rate(sec, name, "settled with the right answer", right, asked, "reported")
        if eff:
            oracle = next(k for k in range(2, 1000) if exact_power(eff / sd, k) >= inf.POWER)
        else:
            oracle = next(k for k in range(2, 1000) if tost_power(math.log1p(MARGIN / 100) / sd, k) >= inf.POWER)
        B.value(sec, name, "advice", f"median {np.median(advised):.0f} more rounds, 90th percentile "
                f"{np.percentile(advised, 90):.0f}; {over} of {asked} advised more than {cap} (not run); knowing "
                f"the true effect and sd, {oracle} rounds in all give {100 * inf.POWER:.0f} % power")
        if eff == 0:
            B.rate(sec, name, "false difference claims over pilot + extension (two looks)", false, B.trials,
                   "reported (a second look: see method)")


def plan_calibration(B: Bench) -> None:
    """plan.json's chance_of_target against what the planned runs do: pilots of 2 starts x 2 window pairs drawn from a
    known truth, plan_nested for ±1 % (a start costs 4 window pairs), the planned run drawn from the same truth; its
    own 95 % t interval over starts reaches the half-width or not. The audit's truth (sd 1 % between starts, 0.5 %
    between pairs) is the calibration target (within ±5 points); three other truths check that the chance never
    overstates (predicted at most 5 points above the realised rate)."""
    sec = "Planning: plan.json's chance of reaching the target, against the planned runs"
    target = 1.0
    h = math.log1p(target / 100)
    truths = ((0.01, 0.005, True), (0.005, 0.01, False), (0.0, 0.01, False), (0.002, 0.005, False))
    for s_start, s_pair, audit in truths:
        rng = B.rng()
        known, post, reached, rated80 = [], [], [], []
        for _ in range(B.trials):
            starts = np.repeat(np.arange(2), 2)
            d = rng.normal(0, s_start, 2)[starts] + rng.normal(0, s_pair, 4)
            comp = inf.variance_components(d, starts)
            p = inf.plan_nested(comp, 200.0, 50.0, target)
            if not p["feasible"]:
                continue
            S, W = p["starts"], p["windows_per_start"]
            ch = inf.plan_chance(comp, S, W, target)
            unit = rng.normal(0, s_start, S) + rng.normal(0, s_pair, (S, W)).mean(axis=1)
            ok = bool(float(sc.stdtrit(S - 1, 0.975)) * unit.std(ddof=1) / math.sqrt(S) <= h)
            known.append(ch["known_variances"])
            post.append(ch["with_pilot_uncertainty"])
            reached.append(ok)
            if ch["with_pilot_uncertainty"] >= 0.8:
                rated80.append(ok)
        n = len(reached)
        cell = (f"pilot 2 starts x 2 pairs, truth sd {100 * s_start:g} % start / {100 * s_pair:g} % pair, target "
                f"±{target:g} %" + (" (the audit's truth)" if audit else ""))
        r = B.rate(sec, cell, "planned runs that reach the target", int(sum(reached)), n,
                   f"predicted (mean over pilots): {100 * np.mean(post):.1f} % given the pilot (F pivot), "
                   f"{100 * np.mean(known):.1f} % with the pilot's variances taken as true")
        shown = f"{100 * np.mean(post):.1f} % vs {100 * r['rate']:.1f} % [{100 * r['lo']:.1f}, {100 * r['hi']:.1f}]"
        if audit:
            B.value(sec, cell, "calibration: mean predicted chance given the pilot within 5 points of the realised "
                    "rate", shown, "within ±5 points", bool(abs(np.mean(post) - r["rate"]) <= 0.05))
        else:
            B.value(sec, cell, "never overstates: mean predicted chance given the pilot at most 5 points above the "
                    "realised rate", shown, "<= realised + 5 points", bool(np.mean(post) - r["rate"] <= 0.05))
        if rated80:
            B.rate(sec, cell, "pilots rated >= 80 % given the pilot: planned runs that reach the target",
                   int(sum(rated80)), len(rated80), "reported (the audit found 17.7 % for the old rating)")


def survivor_latency(B: Bench) -> None:
    """Latency over the requests that worked, when B times out its slowest share: the same latency law in both arms
    (lognormal, sigma 0.3, 60 measure requests per window, 8 rounds), B failing its slowest 10 / 30 / 45 % (below
    the 50 % of an arm failure). p50 over the survivors favours B; the failure-gap rule (rounds.FAILURE_GAP_PP,
    inference.withhold_for_failure_gap) withholds "faster" and "equivalent" and keeps only "slower"."""
    sec = "Latency over the survivors: an arm that times out its slowest requests"
    for share in (0.10, 0.30, 0.45):
        rng = B.rng()
        naive = kept = wrong_eq = 0
        for _ in range(B.trials):
            a_p50, b_p50, fa, fb, na, nb = [], [], 0, 0, 0, 0
            for _r in range(8):
                la, lb = np.exp(rng.normal(0, 0.3, 60)), np.exp(rng.normal(0, 0.3, 60))
                cut = 60 - int(round(share * 60))
                a_p50.append(float(np.median(la)))
                b_p50.append(float(np.median(np.sort(lb)[:cut])))
                na, nb, fb = na + 60, nb + 60, fb + 60 - cut
            res = compare(a_p50, b_p50, higher=False, margin=5.0)
            naive += res["kind"] == "faster"
            w = inf.withhold_for_failure_gap(res, fa / na, fb / nb, FAILURE_GAP_PP)
            kept += w["kind"] == "faster"
            wrong_eq += w["kind"] == "equivalent"
        cell = f"same latency law, B times out its slowest {100 * share:g} %, 8 rounds, p50 latency"
        B.rate(sec, cell, "says 'B faster' without the rule (p50 over the survivors)", naive, B.trials,
               "reported (the audit's own set-up read 4-18 %)")
        B.rate(sec, cell, "says 'B faster' with the failure-gap rule", kept, B.trials, "0", "zero")
        B.rate(sec, cell, "says 'equivalent' with the failure-gap rule", wrong_eq, B.trials, "0", "zero")


# ----------------------------------------------------------------------------------------------- output


def fmt_rate(r: dict) -> str:
    if "k" not in r:
        return r["text"]
    return f"{r['k']}/{r['n']} = {100 * r['rate']:.1f} % [{100 * r['lo']:.1f}, {100 * r['hi']:.1f}]"


def markdown(B: Bench, seconds: float, command: str) -> str:
    lines = [
        "# Known-answer benchmark of the verdict's inference (synthetic data)",
        "",
        "Everything below is **simulated**: synthetic paired rounds with a known true ratio, no server involved. "
        "Each cell draws independent experiments, runs the public API of `ttsreport/inference/` on each exactly as "
        "a run would (compare_rounds, decide_levels, sequential_look, variance_components, plan_nested, aa_check, "
        "order_effect, compare_error_rates), and counts outcomes. Rates: k/n = % [Wilson 95 % interval].",
        "",
        f"Command: `{command}`  ",
        f"Seed: {B.seed} (cell i uses numpy default_rng([seed, i])); trials per cell: {B.trials} "
        f"({5 * B.trials} in the cells that test a false-claim rate); run time {seconds:.0f} s on one core.",
        "",
        "Model unless a row says otherwise: ln A_r = ln 100 + u_r + e_Ar, ln B_r = ln 100 + u_r + δ + e_Br, with a "
        f"shared round effect u_r ~ N(0, {ROUND_SD}²) (cancels in the pair) and arm noise such that d_r = ln(B_r/A_r)"
        f" has sd {SD} (\"1 sd\" below = 1 % on the ratio). Margin ±{MARGIN:g} % (ratio in [1/1.01, 1.01]), "
        f"confidence {100 * CONF:.0f} %. \"ok\" for a rate target: **met** when the whole Wilson interval lies on the "
        "target's side, **not shown to violate** when the interval straddles the target (a rule working at exactly its "
        "nominal 5 % always lands here: its interval holds 5 %), **VIOLATED** when the whole interval lies beyond it; "
        "yes/NO for a tolerance check (a power within 3 points, a count of 0); a blank ok is a number reported for "
        "comparison, not a test.",
        "",
    ]
    sections = list(dict.fromkeys(r["section"] for r in B.rows))
    for sec in sections:
        lines += [f"## {sec}", "", "| cell | quantity | result | target | ok |", "|---|---|---|---|---|"]
        for r in B.rows:
            if r["section"] != sec:
                continue
            lines.append(f"| {r['cell']} | {r['quantity']} | {fmt_rate(r)} | {r['target']} | {OK_WORDS[r['ok']]} |")
        lines.append("")
    failed = failures(B.rows)
    lines += ["## Summary", "",
              f"{sum(r['ok'] in (True, 'met') for r in B.rows)} checks met, "
              f"{sum(r['ok'] == 'not shown to violate' for r in B.rows)} not shown to violate their target (the "
              f"Wilson interval holds the target), {len(failed)} violated or not met"
              + (": " + "; ".join(f"{r['cell']} — {r['quantity']}" for r in failed) if failed else "."), ""]
    return "\n".join(lines)


OK_WORDS = {None: "", True: "yes", False: "**NO**", "met": "met", "not shown to violate": "not shown to violate",
            "violated": "**VIOLATED**"}


def failures(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["ok"] in (False, "violated")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.verdict_synthetic", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="markdown file to write (a .json of the raw numbers goes beside it)")
    ap.add_argument("--trials", type=int, default=2000, help="experiments per cell (false-claim cells use 5x)")
    ap.add_argument("--seed", type=int, default=SEED)
    ap.add_argument("--only", default="", help="comma-separated cells to run (a quick check; the page is written "
                                                "with those sections only)")
    args = ap.parse_args(argv)
    if args.trials < 50:
        print("error: --trials must be >= 50", file=sys.stderr)
        return 2
    print(f"seed {args.seed}, {args.trials} trials per cell", flush=True)
    B = Bench(args.seed, args.trials)
    t0 = time.perf_counter()
    steps = (fixed_design, equivalence, coverage, robustness, multilevel, sequential, sequential_alternatives,
             early_looks, nested, checks, equivalence_levels, failures_power, not_claims, not_measured, planning, plan_calibration,
             survivor_latency)
    only = set(args.only.split(",")) if args.only else None
    if only and not only <= {f.__name__ for f in steps}:
        print(f"error: --only names one of {', '.join(f.__name__ for f in steps)}", file=sys.stderr)
        return 2
    for step in steps:
        if only and step.__name__ not in only:
            continue
        t1 = time.perf_counter()
        step(B)
        print(f"{step.__name__}: {time.perf_counter() - t1:.0f} s", flush=True)
    seconds = time.perf_counter() - t0
    cmd = "python -m tools.verdict_synthetic --out " + args.out + \
        (f" --trials {args.trials}" if args.trials != 2000 else "") + (f" --seed {args.seed}" if args.seed != SEED else "") \
        + (f" --only {args.only}" if args.only else "")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(B, seconds, cmd), encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({"seed": args.seed, "trials": args.trials, "command": cmd,
                                                    "simulated": True, "rows": B.rows}, indent=1) + "\n",
                                        encoding="utf-8")
    failed = failures(B.rows)
    print(f"wrote {out} ({len(failed)} checks violated or not met)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

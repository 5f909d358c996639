"""Known-answer calibration of the verdicts: false-positive and detection rate from a pool of real windows.

A pool is one A/B run made by `loadtest.ab` with the same variant in both arms, a known extra step delay on arm B of
the A/B rounds (`--b-sim-set model.extra_step_pct=2`), and many A/A rounds. Experiments are drawn from it:
- detection: R A/B rounds -> does the headline (primary metric, Holm over levels) say "B slower"?
- false positive: R A/A rounds relabelled as R "A/B" rounds (which window plays A drawn per round) -> any claim?
Every experiment runs through the same `ttsreport.analysis.compare` as a real run (the log-ratio estimand and the
rule of docs/method.md; A/A rounds never move a threshold, so none is drawn into an experiment). Experiments overlap
(subsampling without replacement inside each one), so the rates are estimates whose effective sample size is nearer
the number of disjoint experiments the pool holds; both counts are written next to the rates.
Also reports the interval half-width reached within a time budget per arm (the 1 % at c=64 target) and its time
split.

`python -m tools.calibrate reports/<pool> [--rounds 5] [--experiments 300] [--out reports/bench/verdicts.md]`
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as sps

from ttsreport import inference as inf
from ttsreport.analysis import compare
from ttsreport.blocks import METRICS, PRIMARY_METRIC, block_summary, load_run
from ttsreport.rounds import paired_rounds

CONFIDENCE = 0.95
MARGIN_PCT = 1.0


def _relabel(b: dict, rnd: int, kind: str, arm: str) -> dict:
    return {**b, "round": rnd, "kind": kind, "arm": arm}


def pool_pairs(summaries: list[dict]) -> tuple[list[tuple[dict, dict]], list[tuple[dict, dict]]]:
    """(A/B pairs, A/A pairs) of valid windows from the pool, by round."""
    out: dict[str, list] = {"ab": [], "aa": []}
    for kind in ("ab", "aa"):
        for arms in paired_rounds(summaries, kind).values():
            out[kind].append((arms["A"], arms["B"]))
    return out["ab"], out["aa"]


def experiment(ab_pairs, levels) -> dict:
    """The headline of one drawn experiment: per level the primary metric's decision after Holm."""
    blocks = []
    for r, (a, b) in enumerate(ab_pairs):
        blocks += [_relabel(a, r, "ab", "A"), _relabel(b, r, "ab", "B")]
    comp = compare(blocks, levels, primary=PRIMARY_METRIC, margin_pct=MARGIN_PCT, confidence=CONFIDENCE,
                   metrics=(PRIMARY_METRIC,))
    return {lv: {**comp["headline"]["levels"][lv], "result": comp["per_level"][lv]["metrics"][PRIMARY_METRIC]}
            for lv in levels}


def rate(k: int, n: int) -> str:
    lo, hi = inf.wilson(k, n) if n else (0.0, 1.0)
    return f"{k}/{n} = {100 * k / n:.1f} % (Wilson 95 % {100 * lo:.1f}–{100 * hi:.1f} %)" if n else "n/a"


def _values(pairs, level: str) -> tuple[list, list]:
    a = [x["levels"].get(level, {}).get(PRIMARY_METRIC) for x, _ in pairs]
    b = [y["levels"].get(level, {}).get(PRIMARY_METRIC) for _, y in pairs]
    return a, b


def halfwidth_within_budget(summaries: list[dict], level: str, budget_s: float, manifest_dir: Path) -> dict:
    """Interval half-width (95 %, one level, on ln(B/A), shown in %) of the primary metric over the A/B rounds whose
    windows fit `budget_s` per arm."""
    timings = {}
    for p in (manifest_dir / "blocks").iterdir():
        meta = json.loads((p / "block.json").read_text())
        timings[meta["block_id"]] = meta.get("timing") or {}
    rounds = paired_rounds(summaries, "ab")
    used, spent, pairs = 0, {"A": 0.0, "B": 0.0}, []
    split = {"ready_s": 0.0, "load_s": 0.0, "stop_s": 0.0, "total_s": 0.0}
    for arms in rounds.values():
        t = {arm: timings.get(arms[arm]["block_id"], {}).get("total_s") or 0.0 for arm in "AB"}
        if max(spent["A"] + t["A"], spent["B"] + t["B"]) > budget_s:
            break
        for arm in "AB":
            spent[arm] += t[arm]
            for k in split:
                split[k] += timings.get(arms[arm]["block_id"], {}).get(k) or 0.0
        pairs.append((arms["A"], arms["B"]))
        used += 1
    out = {"rounds": used, "seconds_per_arm": spent, "split": split, "half_width_pct": None, "ratio": None,
           "ci": None, "sd_log": None}
    if pairs:
        a, b = _values(pairs, level)
        res = inf.compare_rounds(a, b, higher_is_better=METRICS[PRIMARY_METRIC].better == "higher",
                                 margin_pct=MARGIN_PCT, confidence=CONFIDENCE)
        if res["ci_log"] is not None:
            h = (res["ci_log"][1] - res["ci_log"][0]) / 2
            out.update(half_width_pct=100 * math.expm1(h), ratio=res["ratio"], ci=res["ci"], sd_log=res["sd_log"])
    return out


def draw(ab_pairs, aa_pairs, levels, R: int, n: int, rng) -> list[str]:
    """Table rows (Markdown) of n drawn detection and n drawn A/A experiments of R rounds each."""
    det = {lv: 0 for lv in levels}
    fp = {lv: 0 for lv in levels}
    det_all = fp_any = wrong_dir = 0
    for _ in range(n):
        res = experiment([ab_pairs[i] for i in rng.choice(len(ab_pairs), R, replace=False)], levels)
        kinds = {lv: r["kind"] for lv, r in res.items()}
        for lv in levels:
            det[lv] += kinds[lv] == "slower"
        det_all += all(k == "slower" for k in kinds.values())
        wrong_dir += any(k == "faster" for k in kinds.values())
        idx = rng.choice(len(aa_pairs), R, replace=False)
        # alternate which window of an A/A pair plays arm A, so a first-vs-second order effect is not hidden
        drawn = [aa_pairs[i] if rng.random() < 0.5 else aa_pairs[i][::-1] for i in idx]
        claims = {lv: r["kind"] in ("faster", "slower") for lv, r in experiment(drawn, levels).items()}
        for lv in levels:
            fp[lv] += claims[lv]
        fp_any += any(claims.values())
    d_disjoint = len(ab_pairs) // R
    f_disjoint = len(aa_pairs) // R
    rows = [f"| {R} | false-positive rate (A/A claims a difference at any level) | {rate(fp_any, n)} | <= 5 % "
            f"| {f_disjoint} |"]
    rows += [f"| {R} | detection rate at c={lv} (\"B slower\") | {rate(det[lv], n)} | >= 80 % | {d_disjoint} |"
             for lv in levels]
    if len(levels) > 1:
        rows.append(f"| {R} | detection at every level | {rate(det_all, n)} | | {d_disjoint} |")
    rows.append(f"| {R} | wrong direction (\"B faster\") | {rate(wrong_dir, n)} | 0 | {d_disjoint} |")
    return rows


def parametric(ab_pairs, aa_pairs, level: str, rounds: list[int], n: int, seed: int) -> list[str]:
    """Many independent experiments from a normal model of the pool's per-round ln(B/A), through the same
    inference.compare_rounds as a run: a large-sample check of the rule's error rates at the measured noise."""
    def d(pairs):
        a, b = _values(pairs, level)
        return np.array([math.log(y / x) for x, y in zip(a, b, strict=True) if x and y])
    aa, ab = d(aa_pairs), d(ab_pairs)
    if aa.size < 3 or ab.size < 3:
        return []
    sd_aa, mu_ab, sd_ab = float(aa.std(ddof=1)), float(ab.mean()), float(ab.std(ddof=1))
    rng = np.random.default_rng(seed)
    higher = METRICS[PRIMARY_METRIC].better == "higher"
    rows = [f"Normal model at c={level}: A/A per-round sd of ln(B/A) {sd_aa:.4f}, A/B mean {mu_ab:+.4f} sd "
            f"{sd_ab:.4f}; {n} independent experiments per R (inference.compare_rounds at {CONFIDENCE:.0%}, one "
            "level; a normal model has no heavy tails, the pool above has whatever the machine did).", "",
            "| R | false-positive rate | detection rate | MDE (80 % power) at this spread |", "|---|---|---|---|"]
    for R in rounds:
        fp = det = 0
        ones = [1.0] * R
        for _ in range(n):
            r0 = inf.compare_rounds(ones, np.exp(rng.normal(0.0, sd_aa, R)).tolist(), higher_is_better=higher,
                                    margin_pct=MARGIN_PCT, confidence=CONFIDENCE)
            fp += r0["kind"] in ("faster", "slower")
            r1 = inf.compare_rounds(ones, np.exp(rng.normal(mu_ab, sd_ab, R)).tolist(), higher_is_better=higher,
                                    margin_pct=MARGIN_PCT, confidence=CONFIDENCE)
            det += r1["kind"] == "slower"
        mde = (sps.t.ppf(0.5 + CONFIDENCE / 2, R - 1) + sps.t.ppf(0.8, R - 1)) * sd_ab / math.sqrt(R)
        rows.append(f"| {R} | {rate(fp, n)} | {rate(det, n)} | ×{math.exp(mde):.4f} |")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.calibrate", description=__doc__.splitlines()[0])
    ap.add_argument("pool", help="A/B run folder: same variant both arms, known delay on B, many A/A rounds")
    ap.add_argument("--rounds", default="5", help="A/B rounds per drawn experiment (plus 1 A/A round); a list: 5,8")
    ap.add_argument("--experiments", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--level", default=None, help="level for the half-width target (default: the highest <= 64)")
    ap.add_argument("--budget-s", type=float, default=600.0, help="time per arm for the half-width target")
    ap.add_argument("--trim-end-s", type=float, default=0.0,
                    help="end each measure window this much early (for a pool recorded without a drain)")
    ap.add_argument("--parametric", type=int, default=1000, help="experiments per R of the normal model (0: none)")
    ap.add_argument("--out", default=None, help="write the Markdown result here (e.g. reports/bench/verdicts.md)")
    a = ap.parse_args(argv)
    pool = Path(a.pool)
    run = load_run(pool)
    if a.trim_end_s:  # a pool recorded without a drain: end every window early, inside what was recorded
        for b in run["blocks"]:
            for c in b["counters"]:
                if c.get("kind") == "snapshot" and c.get("edge") == "end" and c.get("t") is not None:
                    c["t"] = float(c["t"]) - a.trim_end_s
    summaries = [block_summary(b) for b in run["blocks"]]
    levels = sorted({lv for b in summaries for lv in b["levels"]}, key=int)
    ab_pairs, aa_pairs = pool_pairs(summaries)
    table = []
    for R in [int(x) for x in str(a.rounds).split(",")]:
        if R < 2 or len(ab_pairs) < R or len(aa_pairs) < R:
            print(f"error: pool has {len(ab_pairs)} A/B and {len(aa_pairs)} A/A valid rounds; need >= {max(R, 2)} "
                  "of each", file=sys.stderr)
            return 2
        table += draw(ab_pairs, aa_pairs, levels, R, a.experiments, np.random.default_rng(a.seed))
    n = a.experiments
    level = a.level or max((lv for lv in levels if int(lv) <= 64), key=int, default=levels[-1])
    hw = halfwidth_within_budget(summaries, level, a.budget_s, pool)
    man = run["manifest"]
    sets = (man.get("settings") or {}).get("b_sim_set")
    lines = [
        "# Known-answer calibration of the verdicts (simulator)", "",
        f"Pool: `{pool}` — {len(ab_pairs)} valid A/B rounds (B with `{', '.join(sets or [])}`), {len(aa_pairs)} valid "
        f"A/A rounds, variants {man.get('variants')}, levels {levels}, scenario phases "
        f"{(man.get('settings') or {}).get('phase_overrides')}, scenario overrides "
        f"{(man.get('settings') or {}).get('scenario_set')}, sim config {(man.get('sim_config') or {}).get('path')}"
        + (f"; every measure window ended {a.trim_end_s:g} s early (the pool ran without a drain)." if a.trim_end_s
           else "."),
        f"Each drawn experiment: R rounds, the headline on {METRICS[PRIMARY_METRIC].label} with the suite's rule "
        f"(ratio B/A with a {CONFIDENCE:.0%} Student t interval on ln(B/A), Holm over {len(levels)} level(s), margin "
        f"{MARGIN_PCT:g} %; docs/method.md). {n} experiments of each kind per R, drawn without replacement inside an "
        "experiment; experiments overlap, so the binomial intervals are optimistic: the last column says how many "
        "disjoint experiments the pool holds.", "",
        "| R | quantity | result | target | disjoint |", "|---|---|---|---|---|", *table,
    ]
    if a.parametric:
        lines += ["", "## The same rule on a normal model of this pool's spread", "",
                  *parametric(ab_pairs, aa_pairs, level, [int(x) for x in str(a.rounds).split(",")],
                              a.parametric, a.seed)]
    lines += ["", f"## CI half-width within {a.budget_s / 60:.0f} min per arm at c={level}", ""]
    if hw["half_width_pct"] is not None:
        sp = hw["split"]
        tot = sp["total_s"] or 1.0
        lines += [
            f"{hw['rounds']} A/B rounds fit ({hw['seconds_per_arm']['A']:.0f} s arm A, "
            f"{hw['seconds_per_arm']['B']:.0f} s arm B). {METRICS[PRIMARY_METRIC].label} B/A ×{hw['ratio']:.4f} "
            f"[{hw['ci'][0]:.4f}, {hw['ci'][1]:.4f}], per-round sd of ln(B/A) {(hw['sd_log'] or 0):.4f}, 95 % CI "
            f"half-width **{hw['half_width_pct']:.2f} %** (Student t on ln(B/A)). Target: <= 1 %.", "",
            f"Time split of those blocks: server start to ready {sp['ready_s']:.0f} s ({100 * sp['ready_s'] / tot:.0f} %),"
            f" Locust run (warm-up + measure + drain + its start) {sp['load_s']:.0f} s "
            f"({100 * sp['load_s'] / tot:.0f} %), server stop {sp['stop_s']:.0f} s ({100 * sp['stop_s'] / tot:.0f} %), "
            f"total {tot:.0f} s.",
        ]
    else:
        lines.append("not enough rounds for a half-width")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text, encoding="utf-8")
    return 0 if math.isfinite(n) else 1


if __name__ == "__main__":
    sys.exit(main())

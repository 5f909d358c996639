"""Known-answer calibration of the verdicts: false-positive and detection rate from a pool of real blocks.

A pool is one A/B run made by `loadtest.ab` with the same variant in both arms, a known extra step delay on arm B of
the A/B rounds (`--b-sim-set model.extra_step_pct=2`), and many A/A rounds. Experiments are drawn from it:
- detection: R A/B rounds + 1 A/A round (the floor) -> does the throughput verdict say "B slower"?
- false positive: R + 1 A/A rounds relabelled as R "A/B" rounds + 1 A/A round -> does it claim anything?
Every experiment runs through the same `ttsreport.analysis.compare` as a real run. Experiments overlap (subsampling without
replacement inside each one), so the rates are estimates whose effective sample size is nearer the number of
disjoint experiments the pool holds; both counts are written next to the rates.
Also reports the CI half-width reached within a time budget per arm (the 1 % at c=64 target) and its time split.

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

from ttsreport.analysis import compare, paired_rounds
from ttsreport.blocks import METRICS, PRIMARY_METRIC, block_summary, load_run
from ttsreport.verdict import Settings, decide, diff_stats, mde


def _relabel(b: dict, rnd: int, kind: str, arm: str) -> dict:
    return {**b, "round": rnd, "kind": kind, "arm": arm}


def pool_pairs(summaries: list[dict]) -> tuple[list[tuple[dict, dict]], list[tuple[dict, dict]]]:
    """(A/B pairs, A/A pairs) of valid blocks from the pool, by round."""
    out: dict[str, list] = {"ab": [], "aa": []}
    for kind in ("ab", "aa"):
        for arms in paired_rounds(summaries, kind).values():
            out[kind].append((arms["A"], arms["B"]))
    return out["ab"], out["aa"]


def experiment(ab_pairs, aa_pairs, levels, settings) -> dict:
    """Run the comparison on one drawn experiment; returns per level the throughput verdict."""
    blocks = []
    for r, (a, b) in enumerate(aa_pairs):
        blocks += [_relabel(a, r, "aa", "A"), _relabel(b, r, "aa", "B")]
    base = len(aa_pairs)
    for r, (a, b) in enumerate(ab_pairs):
        blocks += [_relabel(a, base + r, "ab", "A"), _relabel(b, base + r, "ab", "B")]
    per_level, *_ = compare(blocks, levels, settings, metrics=(PRIMARY_METRIC,))
    return {lv: per_level[lv][PRIMARY_METRIC] for lv in levels}


def rate(k: int, n: int) -> str:
    ci = sps.binomtest(k, n).proportion_ci(0.95, method="exact") if n else None
    return f"{k}/{n} = {100 * k / n:.1f} % (95 % CI {100 * ci.low:.1f}–{100 * ci.high:.1f} %)" if n else "n/a"


def halfwidth_within_budget(summaries: list[dict], level: str, budget_s: float, manifest_dir: Path) -> dict:
    """CI half-width (95 %, one level) of throughput over the A/B rounds whose blocks fit `budget_s` per arm."""
    timings = {}
    for p in (manifest_dir / "blocks").iterdir():
        meta = json.loads((p / "block.json").read_text())
        timings[meta["block_id"]] = meta.get("timing") or {}
    rounds = paired_rounds(summaries, "ab")
    used, spent, diffs, split = 0, {"A": 0.0, "B": 0.0}, [], {"ready_s": 0.0, "load_s": 0.0, "stop_s": 0.0,
                                                               "total_s": 0.0}
    for arms in rounds.values():
        t = {arm: timings.get(arms[arm]["block_id"], {}).get("total_s") or 0.0 for arm in "AB"}
        if max(spent["A"] + t["A"], spent["B"] + t["B"]) > budget_s:
            break
        for arm in "AB":
            spent[arm] += t[arm]
            for k in split:
                split[k] += timings.get(arms[arm]["block_id"], {}).get(k) or 0.0
        la, lb = arms["A"]["levels"].get(level), arms["B"]["levels"].get(level)
        if la and lb and la[PRIMARY_METRIC] and lb[PRIMARY_METRIC] is not None:
            diffs.append(100.0 * (lb[PRIMARY_METRIC] / la[PRIMARY_METRIC] - 1.0))
        used += 1
    d = np.array(diffs)
    res = diff_stats(d, 0.95, Settings(), 7) if d.size else {"half_width": None, "hl": None, "ci": None}
    return {"rounds": used, "seconds_per_arm": spent, "split": split, "half_width": res.get("half_width"),
            "ci_t": res.get("ci_t"), "hl": res.get("hl"), "sd": res.get("sd"),
            "t_half_width": None if res.get("ci_t") is None else (res["ci_t"][1] - res["ci_t"][0]) / 2}


def draw(ab_pairs, aa_pairs, levels, settings, R: int, n: int, rng) -> list[str]:
    """Table rows (Markdown) of n drawn detection and n drawn A/A experiments of R rounds each."""
    det = {lv: 0 for lv in levels}
    fp = {lv: 0 for lv in levels}
    det_all = fp_any = wrong_dir = 0
    for _ in range(n):
        abs_ = [ab_pairs[i] for i in rng.choice(len(ab_pairs), R, replace=False)]
        floor = [aa_pairs[rng.integers(len(aa_pairs))]]
        res = experiment(abs_, floor, levels, settings)
        kinds = {lv: r["verdict"]["kind"] for lv, r in res.items()}
        for lv in levels:
            det[lv] += kinds[lv] == "slower"
        det_all += all(k == "slower" for k in kinds.values())
        wrong_dir += any(k == "faster" for k in kinds.values())
        idx = rng.choice(len(aa_pairs), R + 1, replace=False)
        # alternate which block of an A/A pair plays arm A, so a first-vs-second order effect is not hidden
        drawn = [aa_pairs[i] if rng.random() < 0.5 else aa_pairs[i][::-1] for i in idx]
        res = experiment(drawn[1:], drawn[:1], levels, settings)
        claims = {lv: r["verdict"]["kind"] in ("faster", "slower") for lv, r in res.items()}
        for lv in levels:
            fp[lv] += claims[lv]
        fp_any += any(claims.values())
    d_disjoint = min(len(ab_pairs) // R, len(aa_pairs))
    f_disjoint = len(aa_pairs) // (R + 1)
    rows = [f"| {R} | false-positive rate (A/A claims a difference at any level) | {rate(fp_any, n)} | <= 5 % "
            f"| {f_disjoint} |"]
    rows += [f"| {R} | detection rate at c={lv} (\"B slower\") | {rate(det[lv], n)} | >= 80 % | {d_disjoint} |"
             for lv in levels]
    if len(levels) > 1:
        rows.append(f"| {R} | detection at every level | {rate(det_all, n)} | | {d_disjoint} |")
    rows.append(f"| {R} | wrong direction (\"B faster\") | {rate(wrong_dir, n)} | 0 | {d_disjoint} |")
    return rows


def parametric(ab_pairs, aa_pairs, level: str, settings, rounds: list[int], n: int, seed: int) -> list[str]:
    """Many independent experiments from a normal model of the pool's per-round differences, through the same
    diff_stats + decide as a run: a large-sample check of the rule's error rates at the measured noise."""
    def diffs(pairs):
        out = []
        for a, b in pairs:
            la, lb = a["levels"].get(level), b["levels"].get(level)
            if la and lb and la[PRIMARY_METRIC] and lb[PRIMARY_METRIC] is not None:
                out.append(100.0 * (lb[PRIMARY_METRIC] / la[PRIMARY_METRIC] - 1.0))
        return np.array(out)
    aa, ab = diffs(aa_pairs), diffs(ab_pairs)
    if aa.size < 3 or ab.size < 3:
        return []
    sd_aa, mu_ab, sd_ab = float(aa.std(ddof=1)), float(ab.mean()), float(ab.std(ddof=1))
    rng = np.random.default_rng(seed)
    cl = settings.confidence  # one level
    better = METRICS[PRIMARY_METRIC].better
    rows = [f"Normal model at c={level}: A/A per-round sd {sd_aa:.2f} %, A/B mean {mu_ab:+.2f} % sd {sd_ab:.2f} %; "
            f"{n} independent experiments per R (same diff_stats + decide as a run; a normal model has no heavy "
            "tails, the pool above has whatever the machine did).", "",
            "| R | false-positive rate | detection rate | MDE (80 % power) at this spread |", "|---|---|---|---|"]
    for R in rounds:
        fp = det = 0
        for i in range(n):
            floor = float(abs(rng.normal(0.0, sd_aa)))
            s0 = diff_stats(rng.normal(0.0, sd_aa, R), cl, settings, i)
            fp += decide(better, s0, floor, cl, settings.margin_pct)["kind"] in ("faster", "slower")
            s1 = diff_stats(rng.normal(mu_ab, sd_ab, R), cl, settings, i)
            det += decide(better, s1, floor, cl, settings.margin_pct)["kind"] == "slower"
        rows.append(f"| {R} | {rate(fp, n)} | {rate(det, n)} | {mde(sd_ab, R, cl, settings.power):.2f} % |")
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
    settings = Settings(n_resamples=999)
    table = []
    for R in [int(x) for x in str(a.rounds).split(",")]:
        if len(ab_pairs) < R or len(aa_pairs) < R + 1:
            print(f"error: pool has {len(ab_pairs)} A/B and {len(aa_pairs)} A/A valid rounds; need >= {R} and >= "
                  f"{R + 1}", file=sys.stderr)
            return 2
        table += draw(ab_pairs, aa_pairs, levels, settings, R, a.experiments, np.random.default_rng(a.seed))
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
        f"Each drawn experiment: R A/B rounds + 1 A/A round (noise floor), verdict on throughput with the suite's "
        f"rule ({settings.confidence:.0%} family-wise, Bonferroni over {len(levels)} level(s), margin "
        f"{settings.margin_pct} %). {n} experiments of each kind per R, drawn without replacement inside an "
        "experiment; experiments overlap, so the binomial intervals are optimistic: the last column says how many "
        "disjoint experiments the pool holds.", "",
        "| R | quantity | result | target | disjoint |", "|---|---|---|---|---|", *table,
    ]
    if a.parametric:
        lines += ["", "## The same rule on a normal model of this pool's spread", "",
                  *parametric(ab_pairs, aa_pairs, level, Settings(n_resamples=499),
                              [int(x) for x in str(a.rounds).split(",")], a.parametric, a.seed)]
    lines += ["", f"## CI half-width within {a.budget_s / 60:.0f} min per arm at c={level}", ""]
    if hw["half_width"] is not None:
        sp = hw["split"]
        tot = sp["total_s"] or 1.0
        lines += [
            f"{hw['rounds']} A/B rounds fit ({hw['seconds_per_arm']['A']:.0f} s arm A, "
            f"{hw['seconds_per_arm']['B']:.0f} s arm B). Throughput B vs A: HL {hw['hl']:+.2f} %, per-round sd "
            f"{(hw['sd'] or 0):.2f} %, 95 % CI half-width **{hw['half_width']:.2f} %** (hull of BCa and t; t alone "
            f"{hw['t_half_width']:.2f} %). Target: <= 1 %.", "",
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

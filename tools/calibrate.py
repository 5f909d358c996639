"""Known-answer calibration of the verdict rule on real A/B runs, of the simulator or of a real server (what is in
sample is named).

The rule (ttsreport/inference/, docs/method.md) was designed and tested on synthetic data only
(reports/bench/verdicts-synthetic.md); nothing here tunes it. A pool is one or more real runs of `loadtest.ab`
whose arms differ only by a known answer: A/B rounds with a known slowdown on arm B and interleaved A/A rounds (true
ratio 1). On the simulator the slowdown is an extra step delay (`--b-sim-set model.extra_step_pct=X`, expected
throughput ratio about 1/(1+X/100)); on a real server it is the plugin's host delay per build_attn_metadata call
(`--b-host-delay-us US`), whose expected ratio is the report's own prediction from the window counters
(ttsreport.prediction: the measured host time per call of each arm x calls per step x steps per request).

The pool is cut into DISJOINT experiments (no round in two of them): k consecutive units each, where a unit is what
the design's interval is computed over (nested: a server start, with every window pair inside it; fresh and swap: a
round). Each experiment's A/B rounds and, separately, its A/A rounds (relabelled as A/B rounds, arms as recorded)
run through the suite's own comparison (ttsreport.comparison.compare: ratio B/A, Student t on ln(B/A) over the units,
Holm over levels, TOST at the margin), and the outcomes are counted: false claims at a true ratio of 1, detection
and wrong direction at the known delay, coverage, equivalence claims. Every rate carries its Wilson 95 % interval;
its precision is set by the number of disjoint experiments, which is small, and the report says so. Beside the
counts, every round of the pool checks what the synthetic benchmark assumes of d (no A/A bias, independent rounds,
normal spread): where that holds, the synthetic benchmark's precise rates are the ones that apply.

The raw form (`--json`, schema tts-calibration-pools/1) holds per window and level the metric values, request counts
and the window's sampling variance, with start, round, order and timing, plus the run's settings and command: enough
to recompute every number (`--from-json`). tools/designs_bench.py reads the same form.

    python -m tools.calibrate --pools reports/<run> [...] --json reports/bench/verdicts-pool.json \
        --out reports/bench/verdicts.md
    python -m tools.calibrate --from-json reports/bench/verdicts-pool.json --out reports/bench/verdicts.md
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
from scipy import special as sc

from ttsreport import inference as inf
from ttsreport import rounds as rd
from ttsreport.blocks import METRICS, PRIMARY_METRIC, block_summary
from ttsreport.comparison import compare
from ttsreport.prediction import prediction
from ttsreport.runfolder import load_run

SCHEMA = "tts-calibration-pools/1"
KEPT_METRICS = tuple(dict.fromkeys(  # the primary decides; requests/s beside it for the noise table
    (PRIMARY_METRIC, "throughput_rps", "audio_throughput", "e2e_p50", "ttfa_p50", "audio_s_mean")))
CONFIDENCE = 0.95
MARGIN_PCT = 1.0
# per window and level, beside the metrics: what ttsreport.prediction needs to predict the known answer's ratio
# the same experiments decided on these metrics too, beside the primary (in-sample: see sensitivity)
SENSITIVITY_METRICS = ("e2e_p50",)
PREDICTION_KEYS = ("seconds_per_call", "stall_seconds_per_call", "mean_batch", "e2e_mean", "audio_s_mean")
LOADAVG_FILE = "loadavg.json"  # optional, written beside a pool run by whoever ran it: {"start": "...", "end": "..."}


# ----------------------------------------------------------------------------------------------- raw form


def _num(x) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else round(float(x), 9)


def pool_record(run_dir: str | Path) -> dict:
    """The small raw form of one run: settings, starts and, per window and level, what the statistics compare."""
    run = load_run(run_dir)
    man = run["manifest"]
    if not man or not run["blocks"]:
        raise ValueError(f"{run_dir}: not an A/B run folder (no manifest.json or no blocks/)")
    design = rd.design_of(man)
    windows = []
    for b in run["blocks"]:
        s = block_summary(b, run["starts"].get(b["meta"].get("start")), within=True)
        levels = {}
        for lv, row in s["levels"].items():
            levels[lv] = {k: _num(row.get(k)) for k in dict.fromkeys(KEPT_METRICS + PREDICTION_KEYS)}
            levels[lv].update(n=row.get("n"), n_error=row.get("n_error"), window_s=_num(row.get("window_s")),
                              n_spanning=row.get("n_spanning"),
                              host_cpu_pct=_num((row.get("telemetry") or {}).get("host_cpu_pct")),
                              within_var={k: _num(v) for k, v in (row.get("within_var") or {}).items()
                                          if k in KEPT_METRICS})
        windows.append({"block_id": s["block_id"], "round": s["round"], "kind": s["kind"], "arm": s["arm"],
                        "start": s["start"], "position": s["position"], "status": s["status"], "valid": s["valid"],
                        "invalid_reason": s["invalid_reason"], "level_order": s["level_order"],
                        "timing": s["timing"], "levels": levels})
    starts = [{"start": k, "arm": v.get("arm"), "status": v.get("status"), "ready_s": v.get("ready_s"),
               "stop_s": v.get("stop_s"), "windows": len(v.get("windows") or [])} for k, v in sorted(run["starts"].items())]
    load = None
    if (Path(run_dir) / LOADAVG_FILE).is_file():
        load = json.loads((Path(run_dir) / LOADAVG_FILE).read_text(encoding="utf-8"))
    settings = man.get("settings") or {}
    keep = ("a", "b", "sim_config", "sim_set", "b_sim_set", "design", "rounds", "aa_rounds", "starts",
            "window_pairs", "settle_s", "phase_overrides", "levels", "last_drain_s", "scenario_set", "scenario",
            "backend", "b_host_delay_us", "executor", "levels_override")
    ended = man.get("ended")
    if not ended:  # an interrupted run: its wall clock ends with the last window that ended
        ended = max((str(b["meta"].get("ended")) for b in run["blocks"] if b["meta"].get("ended")), default=None)
    return {"name": Path(run_dir).name, "design": design, "git_revision": man.get("git_revision"),
            "started": man.get("started"), "ended": ended, "wall_s": _wall_s(man.get("started"), ended),
            "status": man.get("status"), "command": man.get("command"), "seed": (man.get("seeds") or {}).get("order"),
            "variants": man.get("variants"), "labels": man.get("labels"), "sim_config": man.get("sim_config"),
            "backend": man.get("backend"),
            "settings": {k: settings.get(k) for k in keep if k in settings}, "host": man.get("host"),
            "design_args": {k: v for k, v in (man.get("design") or {}).items()
                            if k in ("rounds", "aa_rounds", "starts", "window_pairs", "settle_s", "seed")}
            if isinstance(man.get("design"), dict) else None,
            "load_average": load, "starts": starts, "windows": windows}


def _wall_s(started: str | None, ended: str | None) -> float | None:
    try:
        a, b = (datetime.fromisoformat(str(t).replace("Z", "+00:00")) for t in (started, ended))
    except (TypeError, ValueError):
        return None
    return (b - a).total_seconds()


def write_pools(path: str | Path, pools: list[dict]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"schema": SCHEMA, "pools": pools}, indent=None, separators=(",", ":"))
                          + "\n", encoding="utf-8")


def read_pools(*paths: str | Path) -> list[dict]:
    """Every pool of one or more raw files (a file of another schema is refused)."""
    pools = []
    for p in paths:
        try:
            obj = json.loads(Path(p).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"{p}: cannot read ({e})") from None
        if not isinstance(obj, dict) or obj.get("schema") != SCHEMA:
            raise ValueError(f"{p}: not a {SCHEMA} file")
        pools += obj["pools"]
    return pools


# ----------------------------------------------------------------------------------------------- experiments


def levels_of(pool: dict) -> list[str]:
    return sorted({lv for w in pool["windows"] if w["valid"] for lv in w["levels"]}, key=int)


def summaries_of(pool: dict, rounds: set | None = None, as_ab: bool = False) -> list[dict]:
    """Window summaries in the shape ttsreport.comparison.compare reads, for the given rounds (None: all); as_ab
    relabels A/A rounds as A/B rounds (a true-0 experiment through the same rule)."""
    out = []
    for w in pool["windows"]:
        if rounds is not None and w["round"] not in rounds:
            continue
        levels = {lv: {**v, "within_var": dict(v.get("within_var") or {})} for lv, v in w["levels"].items()}
        out.append({"block_id": w["block_id"], "round": w["round"], "kind": "ab" if as_ab else w["kind"],
                    "arm": w["arm"], "start": w["start"], "position": w["position"], "valid": w["valid"],
                    "started": None, "levels": levels})
    return out


def pairs_of(pool: dict, kind: str) -> dict[int, dict]:
    """Rounds of `kind` with both windows valid: round -> {"A": window, "B": window}."""
    return rd.paired_rounds(pool["windows"], kind)


def unit_of(pool: dict, arms: dict) -> int:
    """The unit a round belongs to: its server start in a nested design, else the round itself."""
    return int(arms["A"]["start"]) if pool["design"] == "nested" else int(arms["A"]["round"])


def partition(pool: dict, k: int, k_aa: int | None = None) -> list[dict]:
    """Disjoint experiments: the A/B rounds in chunks of k consecutive units (nested: whole server starts, every pair
    inside them; fresh/swap: rounds), the A/A rounds in chunks of k_aa (default k) consecutive rounds. An A/A round's
    unit is the round in every design: both its windows run arm A inside one start, so there is no start x arm
    variance for a start unit to carry (the report's A/A check treats them so too). Remainders of fewer units are
    left out (reported)."""
    k_aa = k if k_aa is None else k_aa
    ab, aa = pairs_of(pool, "ab"), pairs_of(pool, "aa")
    units: dict[int, list[int]] = {}
    for r, arms in sorted(ab.items()):
        units.setdefault(unit_of(pool, arms), []).append(r)
    keys = sorted(units)
    ab_chunks = [(keys[i:i + k], sorted(r for u in keys[i:i + k] for r in units[u]))
                 for i in range(0, len(keys) - k + 1, k)]
    aa_r = sorted(aa)
    aa_chunks = [aa_r[i:i + k_aa] for i in range(0, len(aa_r) - k_aa + 1, k_aa)]
    n = max(len(ab_chunks), len(aa_chunks))
    return [{"units": ab_chunks[i][0] if i < len(ab_chunks) else [],
             "ab": ab_chunks[i][1] if i < len(ab_chunks) else [],
             "aa": aa_chunks[i] if i < len(aa_chunks) else []} for i in range(n)]


def decide(pool: dict, rounds: list[int], kind: str, levels: list[str], metric: str = PRIMARY_METRIC) -> dict | None:
    """The suite's comparison of one experiment, `metric` deciding (the primary metric unless a sensitivity analysis
    asks for another): per level the decision after Holm, the ratio, the 95 % interval and the TOST interval; None
    when the experiment has no rounds of that kind."""
    if not rounds:
        return None
    summ = summaries_of(pool, set(rounds), as_ab=kind == "aa")
    design = "fresh" if kind == "aa" else pool["design"]  # an A/A round is its own unit (see partition)
    comp = compare(summ, levels, design=design, margin_pct=MARGIN_PCT, confidence=CONFIDENCE,
                   metrics=(metric,), primary=metric)
    head = comp["headline"]
    if head is None:
        return None
    per = {}
    for lv in levels:
        r = comp["per_level"][lv]["metrics"][metric]
        per[lv] = {"kind": head["levels"][lv]["kind"], "ratio": r["ratio"], "ci": r["ci"], "ci_tost": r["ci_tost"],
                   "n": r["n"], "p_holm": head["levels"][lv]["p_holm"]}
    return {"headline": head["kind"], "levels": per, "rounds": rounds}


def log_ratio(arms: dict, level: str, metric: str = PRIMARY_METRIC) -> float | None:
    """d = ln(B/A) of one round's metric at one level; None where either window lacks a positive value."""
    a, b = (arms[x]["levels"].get(level, {}).get(metric) for x in ("A", "B"))
    return math.log(b / a) if a and b and a > 0 and b > 0 else None


def unit_means(pool: dict, level: str, kind: str = "ab", exclude: set | None = None) -> dict[int, float]:
    """Mean ln(B/A) of the primary metric per unit (start or round) at one level."""
    by: dict[int, list[float]] = {}
    for r, arms in pairs_of(pool, kind).items():
        d = None if exclude and r in exclude else log_ratio(arms, level)
        if d is not None:
            by.setdefault(unit_of(pool, arms), []).append(d)
    return {u: float(np.mean(v)) for u, v in by.items()}


def pooled_ratio(pool: dict, level: str, kind: str = "ab", exclude: set | None = None,
                 metric: str = PRIMARY_METRIC) -> dict:
    """The pool's realised ratio B/A at one level over its units (each unit's mean ln ratio; A/A: rounds), with a
    95 % t interval."""
    pairs = pairs_of(pool, kind)
    a, b, groups = [], [], []
    for r, arms in pairs.items():
        if exclude and r in exclude:
            continue
        a.append(arms["A"]["levels"].get(level, {}).get(metric))
        b.append(arms["B"]["levels"].get(level, {}).get(metric))
        groups.append(unit_of(pool, arms))
    res = inf.compare_rounds(a, b, higher_is_better=METRICS[metric].better == "higher", margin_pct=MARGIN_PCT,
                             confidence=CONFIDENCE, groups=groups if pool["design"] == "nested" and kind == "ab" else None)
    return {"ratio": res["ratio"], "ci": res["ci"], "n": res["n"], "n_rounds": res["n_rounds"], "sd_log": res["sd_log"]}


def _position(w: dict, level: str) -> int | None:
    order = [str(x) for x in (w.get("level_order") or [])]
    return order.index(level) if level in order else None


def _settled(w: dict) -> bool:
    return bool((w.get("timing") or {}).get("settle_s"))


def noise_structure(pool: dict, level: str, metric: str = PRIMARY_METRIC) -> list[dict]:
    """Spread of d = ln(B/A) by how the pair's two windows were run: the level at the same place in both windows'
    level orders or not, and how many of the two windows began with a settle after a switch. A/B values are centred
    on the pool's A/B mean at this level, A/A values on 0. A diagnostic of the set-up, not part of the rule."""
    groups: dict[tuple, list[float]] = {}
    for kind in ("ab", "aa"):
        rows = []
        for arms in pairs_of(pool, kind).values():
            d = log_ratio(arms, level, metric)
            if d is None:
                continue
            same = _position(arms["A"], level) == _position(arms["B"], level)
            rows.append(((kind, same, _settled(arms["A"]) + _settled(arms["B"])), d))
        centre = float(np.mean([d for _, d in rows])) if kind == "ab" and rows else 0.0
        for key, d in rows:
            groups.setdefault(key, []).append(d - centre)
    out = []
    for (kind, same, settled), v in sorted(groups.items(), key=lambda kv: (kv[0][0], not kv[0][1], kv[0][2])):
        x = np.array(v)
        out.append({"kind": kind, "same_position": same, "settled_windows": settled, "n": int(x.size),
                    "rms": float(np.sqrt(np.mean(x ** 2)))})
    return out


def assumptions(pool: dict, level: str, metric: str = PRIMARY_METRIC) -> list[dict]:
    """What the synthetic benchmark assumes of the per-round d = ln(B/A), checked on every round of the pool (not
    only the few disjoint experiments): A/A rounds centred on 0 (their mean is the bias check), A/B rounds on their
    own mean. Per kind: rounds, mean with its 95 % t interval, sd with its chi-square 95 % interval, the lag-1
    autocorrelation of d in run order with the band an independent series stays inside 95 % of the time
    (±1.96/sqrt(n)), and the Shapiro-Wilk p of normality. If these hold, the synthetic rates (thousands of
    experiments per cell) apply to windows like these; the disjoint experiments above only check that directly."""
    from scipy import stats

    out = []
    for kind in ("aa", "ab"):
        d = np.array([x for _, arms in sorted(pairs_of(pool, kind).items())
                      if (x := log_ratio(arms, level, metric)) is not None])
        n = int(d.size)
        if n < 3:
            continue
        mean, sd = float(d.mean()), float(d.std(ddof=1))
        half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
        sd_ci = [sd * math.sqrt((n - 1) / float(stats.chi2.ppf(q, n - 1))) for q in (0.975, 0.025)]
        x = d - mean
        lag1 = float(np.sum(x[1:] * x[:-1]) / np.sum(x * x)) if np.sum(x * x) > 0 else 0.0
        out.append({"kind": kind, "n": n, "mean": mean, "mean_ci": [mean - half, mean + half], "sd": sd,
                    "sd_ci": sd_ci, "lag1": lag1, "lag1_band": 1.96 / math.sqrt(n),
                    "shapiro_p": float(stats.shapiro(d).pvalue) if sd > 1e-12 else None})
    return out


def expected_power(effect_log: float, sd_unit: float, n: int, alpha: float) -> float:
    """Two-sided t test power (noncentral t) for n units of per-unit sd at a true mean ln ratio (one direction)."""
    if n < 2 or not sd_unit:
        return float("nan")
    tc = float(sc.stdtrit(n - 1, 1 - alpha / 2))
    return 1.0 - float(sc.nctdtr(n - 1, abs(effect_log) * math.sqrt(n) / sd_unit, tc))


def calibrate(pool: dict, k: int, k_aa: int | None = None) -> dict:
    """Every experiment of the pool (k units of A/B rounds, k_aa A/A rounds) and the counts behind each rate (pure:
    the raw form in)."""
    levels = levels_of(pool)
    exps = partition(pool, k, k_aa)
    alpha = 1 - CONFIDENCE
    rows = []
    for i, e in enumerate(exps):
        ab = decide(pool, e["ab"], "ab", levels)
        aa = decide(pool, e["aa"], "aa", levels)
        realised = {lv: pooled_ratio(pool, lv, exclude=set(e["ab"]))["ratio"] for lv in levels} if ab else None
        rows.append({"experiment": i, "units": e["units"], "ab": ab, "aa": aa, "realised_leave_out": realised})
    n_units_ab = {lv: len(unit_means(pool, lv, "ab")) for lv in levels}
    summary = {"levels": levels, "k": k, "k_aa": k if k_aa is None else k_aa, "design": pool["design"],
               "experiments": rows, "expected": expected_word(pool, levels),
               "pool_ratio": {lv: pooled_ratio(pool, lv) for lv in levels},
               "pool_ratio_aa": {lv: pooled_ratio(pool, lv, kind="aa") for lv in levels},
               "pool_latency_ratio": {lv: pooled_ratio(pool, lv, metric="e2e_p50") for lv in levels},
               "units_ab": n_units_ab, "counts": counts(rows, levels, expected_word(pool, levels))}
    # what the rule should do at this pool's own spread (a reference for the observed rates, not a tuning)
    exp_power = {}
    for lv in levels:
        u = np.array(list(unit_means(pool, lv, "ab").values()))
        if u.size >= 3:
            sd = float(u.std(ddof=1))
            eff = float(u.mean())
            exp_power[lv] = {"sd_unit": sd, "effect_log": eff, "holm_first": expected_power(eff, sd, k, alpha / len(levels)),
                             "unadjusted": expected_power(eff, sd, k, alpha)}
    summary["expected_power"] = exp_power
    summary["sensitivity"] = {m: sensitivity(pool, exps, levels, m) for m in SENSITIVITY_METRICS}
    summary["assumptions"] = {lv: assumptions(pool, lv) for lv in levels}
    summary["noise"] = {lv: noise_structure(pool, lv, "throughput_rps") for lv in levels}
    summary["noise_audio"] = {lv: noise_structure(pool, lv, "audio_throughput") for lv in levels}
    return summary


def sensitivity(pool: dict, exps: list[dict], levels: list[str], metric: str) -> dict:
    """The counts of the same disjoint experiments decided on another metric (a sensitivity analysis: that metric was
    looked at after the pool was seen, so its rates are in-sample)."""
    rows = []
    for i, e in enumerate(exps):
        ab = decide(pool, e["ab"], "ab", levels, metric)
        realised = ({lv: pooled_ratio(pool, lv, exclude=set(e["ab"]), metric=metric)["ratio"] for lv in levels}
                    if ab else None)
        rows.append({"experiment": i, "ab": ab, "aa": decide(pool, e["aa"], "aa", levels, metric),
                     "realised_leave_out": realised})
    return counts(rows, levels, expected_word(pool, levels))


def counts(rows: list[dict], levels: list[str], expected: str = "slower") -> dict:
    """(k, n) per rate: false claims, equivalence and coverage at true 1 (A/A); detection (the `expected` word),
    wrong direction, false equivalence and coverage of the realised ratio at the known effect (A/B)."""
    wrong = "faster" if expected == "slower" else "slower"
    c: dict[str, list[int]] = {}

    def add(key: str, hit: bool) -> None:
        c.setdefault(key, [0, 0])
        c[key][0] += bool(hit)
        c[key][1] += 1

    for row in rows:
        aa, ab = row["aa"], row["ab"]
        if aa is not None and all(aa["levels"][lv]["n"] >= 2 for lv in levels):
            kinds = {lv: aa["levels"][lv]["kind"] for lv in levels}
            add("aa_any_claim", any(k in ("faster", "slower") for k in kinds.values()))
            add("aa_equivalent_all", all(k == "equivalent" for k in kinds.values()))
            for lv in levels:
                add(f"aa_claim_{lv}", kinds[lv] in ("faster", "slower"))
                add(f"aa_equivalent_{lv}", kinds[lv] == "equivalent")
                lo, hi = aa["levels"][lv]["ci"]
                add(f"aa_covers_{lv}", lo <= 1.0 <= hi)
        elif aa is not None:
            add("aa_too_small", True)
        if ab is not None and all(ab["levels"][lv]["n"] >= 2 for lv in levels):
            kinds = {lv: ab["levels"][lv]["kind"] for lv in levels}
            add("ab_detect_all", all(k == expected for k in kinds.values()))
            add("ab_wrong_direction", any(k == wrong for k in kinds.values()))
            add("ab_false_equivalence", any(k == "equivalent" for k in kinds.values()))
            for lv in levels:
                add(f"ab_detect_{lv}", kinds[lv] == expected)
                known = (row["realised_leave_out"] or {}).get(lv)
                if known is not None:
                    lo, hi = ab["levels"][lv]["ci"]
                    add(f"ab_covers_{lv}", lo <= known <= hi)
    return c


# ----------------------------------------------------------------------------------------------- the report


def rate(kn: list[int] | None) -> str:
    if not kn or not kn[1]:
        return "n/a"
    k, n = kn
    lo, hi = inf.wilson(k, n)
    return f"{k}/{n} = {100 * k / n:.0f} % [{100 * lo:.0f}, {100 * hi:.0f}]"


def _fmt_ratio(r: dict) -> str:
    return "n/a" if r.get("ratio") is None else f"×{r['ratio']:.4f} {_fmt_ci(r['ci'])}"


def _fmt_ci(ci) -> str:
    return "n/a" if not ci else f"[{ci[0]:.4f}, {ci[1]:.4f}]"


def describe_pool(pool: dict) -> list[str]:
    """Lines that say what the pool is: command, revision, date, load, size, time, validity, phases, warnings."""
    ws = pool["windows"]
    valid = sum(w["valid"] for w in ws)
    invalid = [f"{w['block_id']}: {w['invalid_reason']}" for w in ws if not w["valid"]]
    ab, aa = pairs_of(pool, "ab"), pairs_of(pool, "aa")
    short = [(w["block_id"], lv) for w in ws if w["valid"] for lv, v in w["levels"].items()
             if v.get("window_s") and v.get("e2e_p50") and v["window_s"] < 2 * v["e2e_p50"]]
    p50 = {lv: max((w["levels"][lv]["e2e_p50"] or 0) for w in ws if w["valid"] and lv in w["levels"])
           for lv in levels_of(pool)}
    win = {lv: min((w["levels"][lv]["window_s"] or 0) for w in ws if w["valid"] and lv in w["levels"])
           for lv in levels_of(pool)}
    load = pool.get("load_average") or {}
    cmd = " ".join(pool.get("command") or [])
    s = pool["settings"]
    wall = pool.get("wall_s")
    return [
        f"- run `{pool['name']}` (design {pool['design']}, seed {pool.get('seed')}), git revision "
        f"`{(pool.get('git_revision') or '?')[:12]}`, {pool.get('started')} → {pool.get('ended')} "
        f"({(wall or 0) / 60:.1f} min wall clock); load average (1, 5, 15 min) at start `{load.get('start', 'not recorded')}`, "
        f"at end `{load.get('end', 'not recorded')}`",
        f"- command: `{cmd}`",
        f"- arms: A `{(pool.get('labels') or {}).get('A')}`, B `{(pool.get('labels') or {}).get('B')}`; "
        + (f"sim config `{(pool.get('sim_config') or {}).get('path')}`" if is_simulated(pool) else
           f"backend `{s.get('backend')}`, executor `{s.get('executor')}`, levels {s.get('levels_override')}")
        + f"; phases {s.get('phase_overrides')}, last drain "
        f"{s.get('last_drain_s')}, scenario `{s.get('scenario')}`, scenario overrides {s.get('scenario_set')}, design "
        f"{pool.get('design_args')}",
        f"- {len(pool['starts'])} server starts, {len(ws)} windows ({valid} valid), {len(ab)} A/B rounds and {len(aa)} "
        f"A/A rounds with both windows valid" + (f"; invalid: {'; '.join(invalid)}" if invalid else ""),
        "- shortest measure window / longest window p50 latency per level: "
        + ", ".join(f"c={lv}: {win[lv]:.1f} s / {p50[lv]:.2f} s" for lv in p50)
        + (f"; **{len(short)} window-levels shorter than twice their p50**" if short else
           "; every measure window is longer than twice its p50 latency (no short-window warning)"),
    ] + ([f"- **rounds left out of every number below: {_ranges(pool['excluded']['rounds'])}** "
          f"({pool['excluded']['why']}); the rounds were chosen after the pool was seen, so every rate of this pool "
          "is **in-sample** (a sensitivity analysis, not a calibration)"] if pool.get("excluded") else [])


def _ranges(rounds: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    out, run = [], []
    for r in sorted(rounds):
        if run and r != run[-1] + 1:
            out.append(run)
            run = []
        run.append(r)
    out += [run] if run else []
    return ", ".join(f"{g[0]}-{g[-1]}" if len(g) > 1 else str(g[0]) for g in out)


def exclude_rounds(pool: dict, spec: str, why: str) -> dict:
    """The pool without the rounds of `spec` ("8-24,30"), saying which and why (a sensitivity analysis: the report
    of the whole pool stays the headline)."""
    rounds: set[int] = set()
    for part in filter(None, (x.strip() for x in spec.split(","))):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) < int(lo):
            raise ValueError(f"--exclude-rounds: {part!r} is not a round or a range like 8-24")
        rounds |= set(range(int(lo), int(hi or lo) + 1))
    if not why.strip():
        raise ValueError("--exclude-rounds needs --exclude-why: the reason is part of the report")
    return {**pool, "windows": [w for w in pool["windows"] if w["round"] not in rounds],
            "excluded": {"rounds": sorted(rounds), "why": why.strip()}}


def sensitivity_lines(res: dict) -> list[str]:
    """The headline rates again with each sensitivity metric deciding, beside the primary's."""
    sens = res.get("sensitivity") or {}
    if not sens:
        return []
    keys = [("aa_any_claim", "false claims at true 1, any level"),
            *[(f"ab_detect_{lv}", f"detection of the known effect, c={lv}") for lv in res["levels"]],
            ("ab_wrong_direction", "wrong direction, any level")]
    head = " | ".join([METRICS[PRIMARY_METRIC].label + " (primary)"] + [METRICS[m].label for m in sens])
    lines = ["## The same experiments decided on another metric (sensitivity, in-sample)", "",
             "The primary metric was fixed before this pool ran; the metric(s) beside it were looked at after the pool "
             "was seen, so their rates are in-sample: a reason to pre-register a different primary metric for the "
             "next pool, not a calibration of it.", "", f"| quantity | {head} |",
             "|---|" + "---|" * (1 + len(sens))]
    for key, label in keys:
        lines.append(f"| {label} | {rate(res['counts'].get(key))} | "
                     + " | ".join(rate(c.get(key)) for c in sens.values()) + " |")
    return lines + [""]


def render(pools: list[dict], results: list[dict], commands: list[str]) -> str:
    """verdicts.md from the pools and their calibrate() results (the first pool is the headline)."""
    pool, res = pools[0], results[0]
    levels, k = res["levels"], res["k"]
    c = res["counts"]
    n_ab = c.get("ab_wrong_direction", [0, 0])[1]
    n_aa = c.get("aa_any_claim", [0, 0])[1]
    unit = "server starts" if pool["design"] == "nested" else "rounds"
    sim = is_simulated(pool)
    where = ("Everything here ran on the **simulator** (ttssim, `configs/sim/default.yaml`: modelled step times around "
             "the real variant code on CPU)" if sim else
             f"Everything here ran on a **real server**: {(pool.get('backend') or {}).get('version')}, executor "
             f"`{pool['settings'].get('executor') or 'default'}`")
    lines = [
        "# Known-answer calibration of the verdicts on real " + ("simulator runs" if sim else "server runs")
        + (" (in-sample: rounds left out after the fact)" if pool.get("excluded") else ""), "",
        where + ", through the production path (`python -m loadtest.ab`, Locust, the runner, the "
        "statistics). The rule under test (ttsreport/inference/, docs/method.md) was designed and checked on "
        "synthetic data only (reports/bench/verdicts-synthetic.md: thousands of experiments per cell, which is where "
        "its error rates are known precisely); it was **not tuned on this pool**. This pool checks that the rule "
        "behaves on real windows as on synthetic ones, with the precision its few disjoint experiments allow.", "",
        ("**What is in sample.** The rule's thresholds were not tuned on these pools, but the primary metric "
         f"({METRICS[PRIMARY_METRIC].label}) was chosen partly on the `cal-nested` pool (docs/method.md, section 4): "
         "where that pool appears below, its rates are in-sample; the expected detection beside each rate is computed "
         "from the same pool's spread (an in-sample reference, not a prediction)." if sim else
         "**What is in sample.** Nothing of the rule, its thresholds or its primary metric "
         f"({METRICS[PRIMARY_METRIC].label}) was chosen on this pool; the expected detection beside each rate is "
         "computed from the same pool's spread (an in-sample reference, not a prediction), and so is the "
         "sensitivity table below.")
        + " The first pool is the headline: when its design "
        "is swap, every window shares one server start and its verdicts hold for that start only (a report says "
        "\"faster in this server start\"); start-to-start variance is in the intervals of the nested and fresh "
        "pools only.", "",
        "## Commands", "", "```",
        *[" ".join(p.get("command") or []) for p in pools], *commands, "```", "",
        "## The pool", "", *[ln for p in pools for ln in describe_pool(p)], "",
        known_answer_text(pool), "",
        f"Experiments: the pool is cut into disjoint experiments (no round in two of them). A/B: **k = {k} "
        f"consecutive {unit}** each (in a nested design the start is the unit of the interval, so an experiment takes "
        f"whole starts with every window pair inside them). A/A: **{res['k_aa']} consecutive A/A rounds** each, the "
        "round as the unit (both windows of an A/A round run arm A inside one start: there is no start x arm variance "
        "for a start unit to carry, and the report's A/A check treats them so too). Each experiment goes through "
        "`ttsreport.comparison.compare` exactly as a run's report does (A/A rounds relabelled A/B, arms as recorded): "
        f"ratio B/A = exp(mean ln(B/A)) over the units, 95 % Student t interval, Holm over {len(levels)} levels for "
        f"the headline, TOST at ±{MARGIN_PCT:g} % for equivalence. The pool holds **{n_ab} disjoint A/B experiments "
        f"and {n_aa} disjoint A/A experiments**: every rate below is k/n with its Wilson 95 % interval, and with n "
        f"this small the intervals are wide (0/{n_aa} has an upper end of {100 * inf.wilson(0, max(n_aa, 1))[1]:.0f} "
        "%). They can reveal a gross failure of the rule on real data, not confirm a 5 % error rate to a point; that "
        "is the synthetic benchmark's job.", "",
        "## Realised effect (whole pool)", "",
        f"| level | {METRICS[PRIMARY_METRIC].label} B/A (A/B rounds, 95 % CI over {unit}) | "
        + ("nominal 1/(1+X)" if _x_pct(pool) is not None else "predicted (counters)" if _host_delay_us(pool) else "predicted") + " | "
        f"A/A {METRICS[PRIMARY_METRIC].label} ratio | "
        "p50 latency B/A | units |", "|---|---|---|---|---|---|",
    ]
    for lv in levels:
        pr, pa, pl = res["pool_ratio"][lv], res["pool_ratio_aa"][lv], res["pool_latency_ratio"][lv]
        want = predicted_ratio(pool, lv)
        lines.append(f"| c={lv} | {_fmt_ratio(pr)} | "
                     + (f"×{want:.4f}" if want is not None else "n/a")
                     + f" | {_fmt_ratio(pa)} | {_fmt_ratio(pl)} | {pr['n']} ({pr['n_rounds']} rounds) |")
    lines += ["", "## Rates (disjoint experiments, Wilson 95 % intervals)", "",
              "\"met\": the whole Wilson interval lies on the target's side; \"not shown to violate\": the interval "
              "reaches the target (with a few experiments it always does); \"violated\": the whole interval lies "
              "beyond it.", "",
              "| quantity | result | target | ok |", "|---|---|---|---|"]

    def row(label, key, target="", ok=None):
        lines.append(f"| {label} | {rate(c.get(key))} | {target} | {'' if ok is None else ok(c.get(key))} |")

    def le5(kn):
        if not kn or not kn[1]:
            return ""
        verdict = inf.target_met(kn[0], kn[1], 0.05)
        return "**violated**" if verdict == "violated" else verdict

    row("**false claims at true 1: any level claimed (headline, Holm)**", "aa_any_claim", "≤ 5 %", le5)
    for lv in levels:
        row(f"false claims at true 1, c={lv}", f"aa_claim_{lv}", "≤ 5 %", le5)
    for lv in levels:
        row(f"95 % interval covers 1 (A/A), c={lv}", f"aa_covers_{lv}", "≈ 95 %")
    row("equivalence (±1 %) claimed at every level, true 1", "aa_equivalent_all", "reported (TOST power)")
    for lv in levels:
        row(f"equivalence claimed at c={lv}, true 1", f"aa_equivalent_{lv}", "reported (TOST power)")
    for lv in levels:
        ep = res["expected_power"].get(lv)
        ref = (f"expected {100 * ep['holm_first']:.0f}–{100 * ep['unadjusted']:.0f} % at this pool's spread"
               if ep else "")
        row(f"**detection of the known effect (\"{res['expected']}\"), c={lv}**", f"ab_detect_{lv}", ref)
    row("detection at every level", "ab_detect_all", "")
    wrong = "faster" if res["expected"] == "slower" else "slower"
    row(f"wrong direction (\"{wrong}\" at any level)", "ab_wrong_direction", "≈ 0", le5)
    row("false equivalence (±1 %) at the known delay, any level", "ab_false_equivalence", "≤ 5 %", le5)
    for lv in levels:
        row(f"95 % interval covers the realised ratio (leave-experiment-out), c={lv}", f"ab_covers_{lv}", "≈ 95 %")
    if c.get("aa_too_small"):
        lines.append(f"\n{c['aa_too_small'][1]} A/A experiment(s) had fewer than 2 units with A/A rounds and were "
                     "not counted.")
    lines += ["", "Expected detection: the exact power of the t test (noncentral t) for k units at the pool's own "
              "per-unit spread and realised effect, at alpha/2 (Holm's first step over 2 levels) and at alpha; it is "
              "a reference computed on the same data, not an independent prediction.", ""] if len(levels) > 1 else [
        "", "Expected detection: the exact power of the t test (noncentral t) for k units at the pool's own per-unit "
        "spread and realised effect, at alpha (one level: Holm is the plain test); it is a reference computed on the "
        "same data, not an independent prediction.", ""]
    lines += sensitivity_lines(res)
    lines += assumptions_lines(res)
    lines += ["## Every experiment", "", "| # | units | A/A: per level (ratio [95 % CI] → decision) | "
              "A/B: per level (ratio [95 % CI] → decision; realised ratio left out) |", "|---|---|---|---|"]
    for e in res["experiments"]:
        def cell(d, realised=None):
            if d is None:
                return "none"
            parts = []
            for lv in levels:
                r = d["levels"][lv]
                if r["ratio"] is None:
                    parts.append(f"c={lv}: no units")
                    continue
                parts.append(f"c={lv}: ×{r['ratio']:.4f} {_fmt_ci(r['ci'])} → {r['kind']}"
                             + (f" (realised ×{realised[lv]:.4f})" if realised and realised.get(lv) else ""))
            return "; ".join(parts) + f" ({len(d['rounds'])} rounds)"
        lines.append(f"| {e['experiment']} | {', '.join(map(str, e['units']))} | {cell(e['aa'])} | "
                     f"{cell(e['ab'], e['realised_leave_out'])} |")
    lines += ["", "## Where the spread comes from (diagnostic of the set-up)", "",
              "Root mean square of d = ln(B/A) per pair (A/B centred on the pool's A/B mean at that level, A/A on 0), "
              "by how the pair's two windows ran: the level at the same place in both windows' seeded level orders or "
              "not, and how many of the two windows began with the settle after a hot-swap switch. Throughput in "
              "requests/s, and audio throughput (audio seconds per second) beside it.", "",
              "| level | pair | same level position | windows after a switch | pairs | rms of d, throughput | "
              "rms of d, audio throughput |", "|---|---|---|---|---|---|---|"]
    for lv in levels:
        audio = {(g["kind"], g["same_position"], g["settled_windows"]): g for g in res["noise_audio"][lv]}
        for g in res["noise"][lv]:
            au = audio.get((g["kind"], g["same_position"], g["settled_windows"]))
            au_txt = "n/a" if au is None else f"{100 * au['rms']:.2f} %"
            lines.append(f"| c={lv} | {g['kind'].upper()} | {'yes' if g['same_position'] else 'no'} | "
                         f"{g['settled_windows']} | {g['n']} | {100 * g['rms']:.2f} % | "
                         f"{au_txt} |")
    if len(pools) > 1:
        lines += ["", "## Other pools through the same rule", ""]
        tot = {key: [sum(r["counts"].get(key, [0, 0])[i] for r in results) for i in (0, 1)]
               for key in ("aa_any_claim", "ab_wrong_direction")}
        lines.append(f"- **all {len(pools)} pools together** (disjoint experiments, each pool cut as above): false "
                     f"claims at true 1 {rate(tot['aa_any_claim'])}; wrong direction "
                     f"{rate(tot['ab_wrong_direction'])}")
        for p, r in zip(pools[1:], results[1:], strict=True):
            cc = r["counts"]
            lines.append(f"- `{p['name']}` ({p['design']}, k = {r['k']}): false claims at true 1 "
                         f"{rate(cc.get('aa_any_claim'))}; detection "
                         + ", ".join(f"c={lv} {rate(cc.get(f'ab_detect_{lv}'))}" for lv in r["levels"])
                         + f"; wrong direction {rate(cc.get('ab_wrong_direction'))}")
    return "\n".join(lines) + "\n"


def assumptions_lines(res: dict) -> list[str]:
    """The assumption checks of calibrate()'s result as a Markdown section."""
    lines = ["## Do the synthetic benchmark's assumptions hold on these windows?", "",
             "Every round of the pool, not only the disjoint experiments: d = ln(B/A) of the primary metric per round, "
             "A/A rounds (true 0: their mean is the bias check) and A/B rounds (centred on their own mean for the "
             "autocorrelation). The synthetic benchmark draws d independent and normal around a fixed mean; where "
             "that holds here, its rates (thousands of experiments per cell) are the ones that apply to windows like "
             "these. Lag-1 autocorrelation: an independent series stays within ±1.96/sqrt(n) 95 % of the time. "
             "Shapiro-Wilk: a p below 0.01 reads as not normal.", "",
             "| level | rounds | n | mean d [95 % CI] | sd of d [95 % CI] | lag-1 autocorrelation (band) | "
             "Shapiro-Wilk p | reading |", "|---|---|---|---|---|---|---|---|"]
    for lv in res["levels"]:
        for a in res["assumptions"][lv]:
            lo, hi = a["mean_ci"]
            reading = []
            if a["kind"] == "aa":
                reading.append("no bias" if lo <= 0 <= hi else "**biased**")
            reading.append("independent" if abs(a["lag1"]) <= a["lag1_band"] else "**correlated**")
            if a["shapiro_p"] is not None:
                reading.append("normal" if a["shapiro_p"] >= 0.01 else "**not normal**")
            lines.append(f"| c={lv} | {a['kind'].upper()} | {a['n']} | {100 * a['mean']:+.2f} % [{100 * lo:+.2f}, "
                         f"{100 * hi:+.2f}] | {100 * a['sd']:.2f} % [{100 * a['sd_ci'][0]:.2f}, "
                         f"{100 * a['sd_ci'][1]:.2f}] | {a['lag1']:+.2f} (±{a['lag1_band']:.2f}) | "
                         f"{'n/a' if a['shapiro_p'] is None else format(a['shapiro_p'], '.2f')} | "
                         f"{', '.join(reading)} |")
    return lines + [""]


def expected_word(pool: dict, levels: list[str]) -> str:
    """The verdict the known answer calls for: "slower" under a known delay on B; without one (a real change, such as
    original vs fixed) the direction of the whole pool's realised ratio at the first level."""
    if (_x_pct(pool) or 0.0) > 0 or (_host_delay_us(pool) or 0.0) > 0:
        return "slower"
    r = pooled_ratio(pool, levels[0]).get("ratio") if levels else None
    return "faster" if r is not None and r > 1.0 else "slower"


def is_simulated(pool: dict) -> bool:
    """A pool of the simulator (every pool before real-server pools recorded their backend was one)."""
    return bool((pool.get("backend") or {}).get("simulated", True))


def _host_delay_us(pool: dict) -> float | None:
    x = pool["settings"].get("b_host_delay_us")
    return float(x) if x else None


def predicted_ratio(pool: dict, level: str) -> float | None:
    """The throughput ratio B/A the known answer predicts at a level: 1/(1+X/100) for the simulator's extra step
    delay; for a host delay, the report's own prediction from the A/B windows' counters (ttsreport.prediction)."""
    xpct = _x_pct(pool)
    if xpct is not None:
        return 1 / (1 + xpct / 100)
    if _host_delay_us(pool) is None:
        return None
    windows = summaries_of(pool, {r for r in pairs_of(pool, "ab")})
    arm = {x: [w for w in windows if w["arm"] == x and w["valid"] and level in w["levels"]] for x in ("A", "B")}
    p = prediction(level, arm["A"], arm["B"], pool.get("variants") or {}, None)
    return None if p.get("throughput_diff_pct") is None else 1 + p["throughput_diff_pct"] / 100


def known_answer_text(pool: dict) -> str:
    """One paragraph: what arm B carried and what ratio that predicts."""
    head = ("Known answers: A/A rounds (both windows arm A: true ratio 1) interleaved at seeded random positions; "
            "A/B rounds with ")
    if _host_delay_us(pool) is not None:
        return (head + f"the plugin's host delay of {_host_delay_us(pool):g} us per build_attn_metadata call on arm B "
                "(a fixed busy wait inside the real code predictor, counted in tts_predictor_host_delay_calls_total). "
                "Its predicted throughput ratio is the report's own prediction from the A/B windows' counters "
                "(ttsreport.prediction: measured host seconds per call of each arm x 15 calls per step x frames per "
                "request, against A's mean latency); the realised ratio is measured below and used as the known "
                "value.")
    x = ", ".join(pool["settings"].get("b_sim_set") or []) or "none"
    return (head + f"`{x}` on arm B. That delay lengthens every talker step by that share; a request's latency also "
            "holds parts that are not steps (code2wav of the last chunk, HTTP), so the throughput ratio it causes is "
            "only approximately 1/(1+X/100); the realised ratio is measured below and used as the known value.")


def _x_pct(pool: dict) -> float | None:
    for s in pool["settings"].get("b_sim_set") or []:
        key, _, val = s.partition("=")
        if key.strip() == "model.extra_step_pct":
            return float(val)
    return None


# ----------------------------------------------------------------------------------------------- command line


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.calibrate", description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--pools", nargs="+", metavar="RUN", help="A/B run folders (the first is the headline pool)")
    src.add_argument("--from-json", nargs="+", metavar="FILE", help="raw form(s) written by --json")
    ap.add_argument("--units", default="3", help="units (nested: starts; else rounds) per experiment; one per pool, "
                                                 "comma-separated, the last repeats (default 3)")
    ap.add_argument("--aa-units", type=int, default=3, help="A/A rounds per A/A experiment (default 3)")
    ap.add_argument("--json", default=None, help="write the raw form here (with --pools)")
    ap.add_argument("--out", default=None, help="write the Markdown here (e.g. reports/bench/verdicts.md)")
    ap.add_argument("--command-note", action="append", default=[], help="a command line to list in the report")
    ap.add_argument("--exclude-rounds", default=None, metavar="A-B[,C]",
                    help="leave these rounds of the first pool out (a sensitivity analysis), with --exclude-why")
    ap.add_argument("--exclude-why", default="", help="why those rounds are left out (printed in the report)")
    a = ap.parse_args(argv)
    try:
        ks = [int(x) for x in str(a.units).split(",")]
        if any(x < 2 for x in ks) or a.aa_units < 2:
            raise ValueError("--units: an experiment needs at least 2 units (a t interval needs 2)")
        pools = [pool_record(p) for p in a.pools] if a.pools else read_pools(*a.from_json)
        if not pools:
            raise ValueError("no pool")
        if a.json and a.pools:
            write_pools(a.json, pools)  # the raw form holds every round, whatever is left out below
        if a.exclude_rounds:
            pools[0] = exclude_rounds(pools[0], a.exclude_rounds, a.exclude_why)
        results = []
        for i, p in enumerate(pools):
            k = ks[min(i, len(ks) - 1)]
            results.append(calibrate(p, k, a.aa_units))
            if not any(e["ab"] for e in results[-1]["experiments"]):
                raise ValueError(f"{p['name']}: fewer than {k} units of A/B rounds: no experiment")
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cmds = list(a.command_note) or [
        "python -m tools.calibrate --from-json " + " ".join(a.from_json or [a.json or "<raw.json>"])
        + f" --units {a.units} --aa-units {a.aa_units}"
        + (f" --exclude-rounds {a.exclude_rounds} --exclude-why '{a.exclude_why}'" if a.exclude_rounds else "")
        + (f" --out {a.out}" if a.out else "")]
    text = render(pools, results, cmds)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())

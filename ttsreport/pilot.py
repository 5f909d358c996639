"""`python -m ttsreport <run> --plan [--target-halfwidth-pct 1]`: from a short nested pilot, the number of server
starts S and window pairs per start W that reach a target interval half-width at the least cost; `<run>/plan.json`
(schema tts-plan/1), which `make ab ... PLAN_FROM=<pilot>` reads.

Per level, the primary metric's ln(B/A) per window pair is split into variance components (inference.
variance_components: between starts, between pairs inside a start, and within a window, the last from each window's
requests, see blocks.within_variances); inference.plan_nested then finds the cheapest (S, W). Costs come from the
pilot itself: a start costs its start.json ready_s (+ stop_s), a window pair the two windows' load time (block
timing load_s, else total_s, else ended - started). The plan must hold at every level, so the level that needs the
most is the one that decides. plan.json also says how likely the plan is to reach the target (inference.
plan_chance): a plan sized for t * sigma reaches it about half the time even with the true variances, and a small
pilot leaves the variances themselves open.
"""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import numpy as np

from ttsrecords import records as rec

from . import inference as inf
from . import rounds as rd
from .analysis import confidence_of, primary_of
from .blocks import block_summary
from .runfolder import load_run

PLAN_FILE = "plan.json"


def _window_s(block: dict) -> float | None:
    t = block.get("timing") or {}
    for key in ("load_s", "window_s", "total_s"):
        if t.get(key):
            return float(t[key])
    try:
        a, b = (datetime.fromisoformat(str(block[k]).replace("Z", "+00:00")) for k in ("started", "ended"))
        return (b - a).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def costs(run: dict, summaries: list[dict], pairs: dict) -> dict:
    """Seconds per server start (ready + stop, mean over the pilot's starts) and per window pair (A + B windows)."""
    start_s = [float(s["ready_s"]) + float(s.get("stop_s") or 0.0) for s in run["starts"].values()
               if s.get("ready_s") is not None]
    pair_s = []
    for arms in pairs.values():
        w = [_window_s(arms[x]) for x in ("A", "B")]
        if None not in w:
            pair_s.append(sum(w))
    if not start_s:
        raise ValueError("the pilot's starts/*/start.json record no ready_s: the cost of a start is unknown")
    if not pair_s:
        raise ValueError("the pilot's windows record no timing: the cost of a window pair is unknown")
    return {"start_s": float(np.mean(start_s)), "window_pair_s": float(np.mean(pair_s)),
            "from": {"starts": len(start_s), "window_pairs": len(pair_s)}}


def plan(run_dir: str | Path, *, target_halfwidth_pct: float = 1.0, confidence: float | None = None) -> dict:
    """plan.json's content (not yet written) from a nested pilot run."""
    if not (math.isfinite(target_halfwidth_pct) and target_halfwidth_pct > 0):
        raise ValueError(f"--target-halfwidth-pct must be a number > 0, got {target_halfwidth_pct!r}")
    run = load_run(run_dir)
    man = run["manifest"]
    if not man:
        raise ValueError(f"{run_dir}: no manifest.json (not an A/B run)")
    design = rd.design_of(man)
    confidence, _src = confidence_of(man, confidence)
    primary, _ = primary_of(man)
    summaries = [block_summary(b, run["starts"].get(b["meta"].get("start"))) for b in run["blocks"]]
    pairs = rd.paired_rounds(summaries, "ab")
    levels = sorted({lv for b in summaries if b["valid"] for lv in b["levels"]}, key=int)
    if not pairs or not levels:
        raise ValueError(f"{run_dir}: no valid A/B window pair to plan from")
    cost = costs(run, summaries, pairs)
    per_level: dict = {}
    levels_comp: dict = {}
    for lv in levels:
        v = rd.values(pairs, lv, primary)
        d, starts, within = [], [], []
        for a, b, s, r in zip(v["a"], v["b"], v["start"], v["round"], strict=True):
            if a is None or b is None:
                continue
            wv = [((pairs[r][x]["levels"].get(lv) or {}).get("within_var") or {}).get(primary) for x in ("A", "B")]
            d.append(math.log(b / a))
            starts.append(s)
            within.append(None if None in wv else wv[0] + wv[1])
        try:
            comp = inf.variance_components(d, starts, within_var=None if None in within else within)
        except ValueError as e:
            raise ValueError(f"c={lv}: {e} (a pilot needs a nested design: at least 2 starts and a start with 2 "
                             f"window pairs; this run's design is {design})") from None
        levels_comp[lv] = comp
        p = inf.plan_nested(comp, cost["start_s"], cost["window_pair_s"], target_halfwidth_pct, confidence)
        if p["feasible"]:
            p["chance"] = inf.plan_chance(comp, p["starts"], p["windows_per_start"], target_halfwidth_pct, confidence)
        per_level[lv] = {"components": {k: comp[k] for k in ("sigma2_start", "sigma2_pair", "sigma2_within",
                                                             "truncated", "n", "n_starts")}, **p}
    infeasible = [lv for lv, p in per_level.items() if not p["feasible"]]
    if infeasible:
        raise ValueError(f"no design reaches ±{target_halfwidth_pct:g} % at c={','.join(infeasible)}: "
                         f"{per_level[infeasible[0]].get('reason')}")
    lv = max(per_level, key=lambda k: (per_level[k]["cost_s"], int(k)))
    p = per_level[lv]
    # the chosen (S, W) at every level: its chance there; the plan's chance is the lowest over the levels
    chance = {k: inf.plan_chance(levels_comp[k], p["starts"], p["windows_per_start"], target_halfwidth_pct,
                                 confidence) for k in per_level}
    return {"schema": rec.PLAN_SCHEMA, "starts": p["starts"], "windows_per_start": p["windows_per_start"],
            "cost_s": p["cost_s"], "halfwidth_pct": p["halfwidth_pct"], "formula": p["formula"],
            "components": p["components"], "costs": {"start_s": cost["start_s"], "window_pair_s": cost["window_pair_s"]},
            "target_halfwidth_pct": target_halfwidth_pct, "confidence": confidence, "metric": primary,
            "deciding_level": lv, "pilot": man.get("run_id", Path(run_dir).name), "pilot_design": design,
            "costs_from": cost["from"], "levels": per_level,
            "chance_of_target": {
                "known_variances": min(c["known_variances"] for c in chance.values()),
                "with_pilot_uncertainty": min((c["with_pilot_uncertainty"] for c in chance.values()
                                               if c["with_pilot_uncertainty"] is not None), default=None),
                "per_level": chance, "pilot_df": p["chance"]["pilot_df"],
                "meaning": "the chance that the planned run's own interval reaches the target half-width at every "
                           "level (the lowest over the levels): with the pilot's variances taken as true, and "
                           "the predictive chance given the pilot (the pivot s2_run / s2_pilot ~ F(S-1, nu), nu by "
                           "Satterthwaite); the second is the one to plan with"},
            "rule": "the cheapest (S starts, W window pairs per start) whose t interval on ln(B/A) reaches the target "
                    "at every level (inference.plan_nested); the level needing the most decides"}


def write_plan(run_dir: str | Path, obj: dict) -> Path:
    path = Path(run_dir) / PLAN_FILE
    rec.write_json(path, obj)
    return path


def one_line(obj: dict) -> str:
    ch = obj.get("chance_of_target") or {}
    odds = ""
    if ch.get("known_variances") is not None:
        odds = f"; chance of reaching it {100 * ch['known_variances']:.0f} % at the pilot's variances"
        if ch.get("with_pilot_uncertainty") is not None:
            odds += (f", {100 * ch['with_pilot_uncertainty']:.0f} % given the pilot's own uncertainty (its "
                     f"estimate of the planned unit's variance has {ch['pilot_df'].get('unit', '?')} df)")
    return (f"plan: S={obj['starts']} starts x W={obj['windows_per_start']} window pairs per start, about "
            f"{obj['cost_s'] / 60:.1f} min, half-width {obj['halfwidth_pct']:.2f} % at c={obj['deciding_level']} "
            f"(target {obj['target_halfwidth_pct']:g} %){odds}; {obj['formula']}")

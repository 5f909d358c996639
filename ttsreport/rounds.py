"""Rounds of a run: which windows pair up, the per-round values of a metric, and the unit of the interval.

A round is one arm-A window and one arm-B window of the same round number (kind "ab"; kind "aa": both run arm A),
compared level by level; both windows must be valid. The unit of the interval follows the design (manifest
`design`): "fresh" - every round is its own unit; "nested" - the server start is the unit (its rounds share
start-to-start variance); "swap" - one server start holds every window, so the unit is the window pair and the
interval is conditional on that start (start-to-start variance is not in it; the report says so).
"""

from __future__ import annotations

import re

DESIGN_UNITS = {"fresh": "round", "swap": "round", "nested": "start"}
# What a claim covers: a swap run's windows all share one server start, so its verdict holds for that start only
DESIGN_SCOPE = {"fresh": None, "swap": "in this server start", "nested": None}
FAILED_SHARE = 0.5  # an arm whose window failed at least this share of its measure-phase requests at a level failed
# a metric over ok requests only (Metric.over_ok) makes no claim the failures could have made when the arms' failure
# shares at a level differ by more than this many percentage points (pooled over the rounds): "a few points"
FAILURE_GAP_PP = 2.0


def design_of(manifest: dict) -> str:
    """The run's design ("fresh" for version-1 runs, which had one fresh server per window)."""
    d = manifest.get("design")
    if isinstance(d, dict):
        d = d.get("name") or d.get("design")
    d = d or (manifest.get("settings") or {}).get("design") or "fresh"
    if d not in DESIGN_UNITS:
        raise ValueError(f"manifest.json: design {d!r} is not one of {sorted(DESIGN_UNITS)}")
    return str(d)


def paired_rounds(blocks: list[dict], kind: str) -> dict[int, dict[str, dict]]:
    """Rounds of `kind` in which both arms have a valid window, by round number."""
    rounds: dict[int, dict[str, dict]] = {}
    for b in blocks:
        if b["kind"] == kind and b["valid"]:
            rounds.setdefault(int(b["round"]), {})[b["arm"]] = b
    return {r: arms for r, arms in sorted(rounds.items()) if {"A", "B"} <= set(arms)}


def _sequence(block_id: str) -> int | None:
    m = re.match(r"^(\d+)", str(block_id))
    return int(m.group(1)) if m else None


def order_of(arms: dict[str, dict]) -> str | None:
    """"AB" when the A window ran first in its pair, "BA" otherwise: the window's `position` (version 2), else the
    run order in the block ids (version 1: "003-r1-ab-A"), else the start time."""
    a, b = arms["A"], arms["B"]
    if a.get("position") is not None and b.get("position") is not None and a["position"] != b["position"]:
        return "AB" if a["position"] < b["position"] else "BA"
    sa, sb = _sequence(a["block_id"]), _sequence(b["block_id"])
    if sa is not None and sb is not None and sa != sb:
        return "AB" if sa < sb else "BA"
    if a.get("started") and b.get("started") and a["started"] != b["started"]:
        return "AB" if str(a["started"]) < str(b["started"]) else "BA"
    return None


def start_of(arms: dict[str, dict]) -> int | None:
    """The server start of a pair (nested/swap: both windows share it; fresh: the A window's start)."""
    s = arms["A"].get("start")
    return None if s is None else int(s)


def failed_arms(arms: dict[str, dict], level: str) -> tuple[str | None, list[str]]:
    """Which arm(s) of a round failed at a level ("A", "B", "A and B" or None) and why, one phrase per arm.

    An arm failed when at least FAILED_SHARE of its measure-phase requests there failed: it produced too little to be
    the arm's behaviour, so the round says that the arm broke there, not how fast it was. "failed" needs failed
    requests: a window that measured nothing with no error is not measured (unmeasured_arms), never failed."""
    bad, why = [], []
    for x in ("A", "B"):
        v = arms[x]["levels"].get(level) or {}
        n, err = int(v.get("n") or 0), int(v.get("n_error") or 0)
        if n and err >= FAILED_SHARE * n:
            bad.append(x)
            why.append(f"{x} failed {err} of {n} measure-phase requests at c={level}")
    return (" and ".join(bad) or None), why


def unmeasured_arms(arms: dict[str, dict], level: str) -> tuple[str | None, list[str]]:
    """Which arm(s) of a round did not measure a level at all, and why: no failed measure-phase request there, and
    either none started in its measure window or none produced output inside it (a window shorter than a request:
    the real CPU server's slow arm met 0.06-0.14 s windows). Such a window-level is invalid, not a zero and not a
    failure: the slower arm starts fewer requests, so calling it failed would blame the slower arm for the clock."""
    lv = {x: arms[x]["levels"].get(level) for x in ("A", "B")}
    if all(v is None for v in lv.values()):
        return None, []
    bad, why = [], []
    for x in ("A", "B"):
        v = lv[x] or {}
        n, err = int(v.get("n") or 0), int(v.get("n_error") or 0)
        thr = v.get("throughput_rps")
        if err or (n and thr is not None and thr > 0):
            continue
        what = "no measure-phase request started in it" if n == 0 else "no request produced output inside it"
        w = v.get("window_s")
        ref = [u.get("e2e_p50") for u in lv.values() if u and u.get("e2e_p50")]
        if w is not None and (not ref or w < max(ref)):
            reason = f"window shorter than a request ({w:.3g} s measure window, {what}, 0 errors)"
        elif w is not None:
            reason = f"nothing measured in a {w:.3g} s measure window ({what}, 0 errors)"
        else:
            reason = f"the window did not run this level ({what}, 0 errors)"
        bad.append(x)
        why.append(f"{x} not measured at c={level}: {reason}")
    return (" and ".join(bad) or None), why


def positive(v) -> float | None:
    """A metric value usable in a ratio: None for missing, zero or negative (a level where nothing succeeded is a
    failure, counted by the error rate, not a ratio)."""
    return None if v is None or v <= 0 else float(v)


def values(pairs: dict[int, dict[str, dict]], level: str, metric: str, keep=None) -> dict:
    """Per-round A and B values of one metric at one level, with the round, its start and its order.

    keep(round, arms) may leave rounds out (e.g. rounds with failed requests). Missing values stay None (inference
    skips and counts them). A round in which an arm did not measure the level (unmeasured_arms) is invalid there:
    both values None, listed in `not_measured` with why. A zero or negative value is None too, with a note.
    `failed` marks the arm(s) that failed in each round (failed_arms)."""
    out: dict = {"round": [], "a": [], "b": [], "start": [], "order": [], "failed": [], "notes": [],
                 "not_measured": []}
    for rnd, arms in pairs.items():
        if keep is not None and not keep(rnd, arms):
            continue
        la, lb = arms["A"]["levels"].get(level), arms["B"]["levels"].get(level)
        va = None if la is None else la.get(metric)
        vb = None if lb is None else lb.get(metric)
        failed, why = failed_arms(arms, level)
        out["notes"] += [f"round {rnd}: {w}: the arm failed there (no speed claim at this level)" for w in why]
        unmeasured, why_not = unmeasured_arms(arms, level)
        if unmeasured and not failed:
            out["not_measured"] += [{"round": rnd, "arm": w[0], "reason": w} for w in why_not]
            out["notes"] += [f"round {rnd}: invalid at c={level}: {w}; left out (not a zero, not a failure); rerun "
                             "it under the design's rule" for w in why_not]
            va = vb = None
        for arm, v, lvl in (("A", va, la), ("B", vb, lb)):
            if v is not None and v <= 0:
                where = ("counted in the error rate" if (lvl or {}).get("n_error") else
                         "no output and no error there")
                out["notes"].append(f"round {rnd}: {metric} {v:g} in {arm} at c={level} (nothing succeeded there): "
                                    f"skipped in the ratio, {where}")
        out["round"].append(rnd)
        out["a"].append(positive(va))
        out["b"].append(positive(vb))
        out["start"].append(start_of(arms))
        out["order"].append(order_of(arms))
        out["failed"].append(failed)
    return out


def failures(pairs: dict[int, dict[str, dict]], level: str) -> dict:
    """Per-round measure-phase request counts and failures of both arms at one level (for the error-rate verdict)."""
    out: dict = {"round": [], "a_failed": [], "a_total": [], "b_failed": [], "b_total": []}
    for rnd, arms in pairs.items():
        la, lb = arms["A"]["levels"].get(level) or {}, arms["B"]["levels"].get(level) or {}
        out["round"].append(rnd)
        out["a_failed"].append(int(la.get("n_error") or 0))
        out["a_total"].append(int(la.get("n") or 0))
        out["b_failed"].append(int(lb.get("n_error") or 0))
        out["b_total"].append(int(lb.get("n") or 0))
    return out


def without_failures(level: str):
    """keep() for values(): rounds in which neither window had a failed measure-phase request at this level."""
    def keep(_rnd, arms) -> bool:
        return all(not (arms[x]["levels"].get(level) or {}).get("n_error") for x in ("A", "B"))
    return keep

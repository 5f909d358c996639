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

    An arm failed when its window has no measure-phase request at a level the other arm ran, or when at least
    FAILED_SHARE of them failed: it produced nothing (or too little to be the arm's behaviour), so the round says that
    the arm broke there, not how fast it was."""
    lv = {x: arms[x]["levels"].get(level) for x in ("A", "B")}
    if all(v is None for v in lv.values()):
        return None, []
    bad, why = [], []
    for x in ("A", "B"):
        v = lv[x] or {}
        n, err = int(v.get("n") or 0), int(v.get("n_error") or 0)
        if n == 0:
            bad.append(x)
            why.append(f"{x} had no measure-phase request at c={level}")
        elif err >= FAILED_SHARE * n:
            bad.append(x)
            why.append(f"{x} failed {err} of {n} measure-phase requests at c={level}")
    return (" and ".join(bad) or None), why


def positive(v) -> float | None:
    """A metric value usable in a ratio: None for missing, zero or negative (a level where nothing succeeded is a
    failure, counted by the error rate, not a ratio)."""
    return None if v is None or v <= 0 else float(v)


def values(pairs: dict[int, dict[str, dict]], level: str, metric: str, keep=None) -> dict:
    """Per-round A and B values of one metric at one level, with the round, its start and its order.

    keep(round, arms) may leave rounds out (e.g. rounds with failed requests). Missing values stay None (inference
    skips and counts them); a zero or negative value is None too, with a note. `failed` marks the arm(s) that failed
    in each round (failed_arms)."""
    out: dict = {"round": [], "a": [], "b": [], "start": [], "order": [], "failed": [], "notes": []}
    for rnd, arms in pairs.items():
        if keep is not None and not keep(rnd, arms):
            continue
        la, lb = arms["A"]["levels"].get(level), arms["B"]["levels"].get(level)
        va = None if la is None else la.get(metric)
        vb = None if lb is None else lb.get(metric)
        failed, why = failed_arms(arms, level)
        out["notes"] += [f"round {rnd}: {w}: the arm failed there (no speed claim at this level)" for w in why]
        for arm, v in (("A", va), ("B", vb)):
            if v is not None and v <= 0:
                out["notes"].append(f"round {rnd}: {metric} {v:g} in {arm} at c={level} (nothing succeeded there): "
                                    "skipped in the ratio, counted in the error rate")
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

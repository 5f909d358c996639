"""The planned windows of an A/B run: the plan as typed records.

The planner (loadtest.design, loadtest.plan) makes them, the manifest stores them as a list of plain objects under
"plan" (and, after a sequential stop, "plan_not_run"), and the runner, the statistics and the dashboard read them back
through `plan_from_list`, the one reader, which also upgrades the version-1 plan (block_id, round, kind, arm, variant
only) by filling in what that format left implicit. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

KINDS = ("ab", "aa")  # an A/B round compares arm A with arm B; an A/A round runs arm A twice (labelled A and B)
ARMS = ("A", "B")


class PlanError(ValueError):
    """A manifest's plan that cannot be read: one line naming the entry and what is wrong with it."""


@dataclass(frozen=True)
class PlannedWindow:
    """One window of the plan: one arm through every level of the scenario, inside one planned server start."""

    block_id: str  # the window's folder under blocks/
    round: int  # the round it belongs to (two windows compared level by level)
    kind: str  # "ab" or "aa"
    arm: str  # its side of the comparison, "A" or "B"
    variant: str | None  # the plugin variant it runs (None: an arm without the plugin)
    spec: str  # the experiment arm whose settings serve it ("A" for both windows of an A/A round)
    start: int  # the planned server start that holds it
    position: int  # 0 or 1: first or second window of its round
    levels: tuple[int, ...] = ()  # the concurrency levels in the order this window runs them
    order: tuple[int, ...] = ()  # the same order as indices into the scenario's steps
    switch: bool = False  # swap/nested: its settings differ from the window before it in the same start

    def to_dict(self) -> dict[str, Any]:
        return {"block_id": self.block_id, "round": self.round, "kind": self.kind, "arm": self.arm,
                "variant": self.variant, "spec": self.spec, "start": self.start, "position": self.position,
                "levels": list(self.levels), "order": list(self.order), "switch": self.switch}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, index: int = 0, position: int = 0) -> PlannedWindow:
        """Read one entry; a version-1 entry has no spec, start, position, levels, order or switch: its spec follows
        from the kind, every window had its own start (`index`, its place in the plan), `position` is its place in
        its round, and it ran the scenario's steps in their own order."""
        if not isinstance(d, dict):
            raise PlanError(f"plan entry {index}: not an object ({type(d).__name__})")
        missing = [k for k in ("block_id", "round", "kind", "arm") if d.get(k) is None]
        if missing:
            raise PlanError(f"plan entry {index}: no {', '.join(missing)}")
        if d["kind"] not in KINDS or d["arm"] not in ARMS or not isinstance(d["round"], int):
            raise PlanError(f"plan entry {index} ({d['block_id']}): kind {d['kind']!r}, arm {d['arm']!r}, round "
                            f"{d['round']!r} (known kinds {KINDS}, arms {ARMS}, rounds whole numbers)")
        for k in ("start", "position"):
            if k in d and (not isinstance(d[k], int) or isinstance(d[k], bool)):
                raise PlanError(f"plan entry {index} ({d['block_id']}): {k} {d[k]!r} (a whole number)")
        spec = d.get("spec") or ("A" if d["kind"] == "aa" else d["arm"])
        return cls(block_id=str(d["block_id"]), round=d["round"], kind=d["kind"], arm=d["arm"],
                   variant=d.get("variant"), spec=spec, start=d.get("start", index),
                   position=d.get("position", position), levels=tuple(int(c) for c in d.get("levels") or ()),
                   order=tuple(int(i) for i in d.get("order") or ()), switch=bool(d.get("switch", False)))


def plan_from_list(items: Any) -> list[PlannedWindow]:
    """The plan stored in a manifest, typed (None or a missing plan: no windows); PlanError on a malformed entry."""
    if items is None:
        return []
    if not isinstance(items, list):
        raise PlanError(f"plan: a list of windows expected, not {type(items).__name__}")
    seen: dict[Any, int] = {}
    out = []
    for i, d in enumerate(items):
        r = d.get("round") if isinstance(d, dict) else None
        out.append(PlannedWindow.from_dict(d, index=i, position=seen.get(r, 0)))
        seen[r] = seen.get(r, 0) + 1
    return out


def windows_to_run(plan: list[PlannedWindow], plan_not_run: list[PlannedWindow]) -> list[PlannedWindow]:
    """The plan less the windows a sequential stop left out (the runner keeps the planned plan whole)."""
    left_out = {w.block_id for w in plan_not_run}
    return [w for w in plan if w.block_id not in left_out]


def manifest_windows(manifest: dict[str, Any]) -> list[PlannedWindow]:
    """The windows a manifest says its run runs: "plan" less "plan_not_run" (folders from before the runner kept
    the plan whole had it cut at the stop already: the same answer)."""
    return windows_to_run(plan_from_list(manifest.get("plan")), plan_from_list(manifest.get("plan_not_run")))


def plan_to_list(plan: list[PlannedWindow]) -> list[dict[str, Any]]:
    return [w.to_dict() for w in plan]


def with_order(w: PlannedWindow, levels: list[int], order: list[int]) -> PlannedWindow:
    """The same window with its levels and their indices into the scenario's steps."""
    return replace(w, levels=tuple(levels), order=tuple(order))


def rounds_of(plan: list[PlannedWindow]) -> list[list[PlannedWindow]]:
    """The plan's windows grouped by round, in order."""
    out: dict[int, list[PlannedWindow]] = {}
    for w in plan:
        out.setdefault(w.round, []).append(w)
    return [out[r] for r in sorted(out)]


def starts_of(plan: list[PlannedWindow]) -> list[dict[str, Any]]:
    """The planned server starts as the manifest stores them: {start, spec, rounds, windows}; spec: the arm whose
    server starts (a start that holds both arms' windows starts arm A's server and switches variants inside it)."""
    out: dict[int, dict[str, Any]] = {}
    for w in plan:
        s = out.setdefault(w.start, {"start": w.start, "spec": w.spec, "rounds": [], "windows": []})
        if w.spec != s["spec"]:
            s["spec"] = "A"
        if w.round not in s["rounds"]:
            s["rounds"].append(w.round)
        s["windows"].append(w.block_id)
    return [out[k] for k in sorted(out)]


def last_of_start(plan: list[PlannedWindow], w: PlannedWindow) -> bool:
    """Whether no later window of the plan runs in w's server start (the start stops after it)."""
    return not any(x.start == w.start for x in plan[plan.index(w) + 1:])


def unit_ends(plan: list[PlannedWindow], round_: int) -> bool:
    """Whether round `round_` is the last of its planned server start (where a nested design's unit ends)."""
    start = next((w.start for w in plan if w.round == round_), None)
    return not any(w.start == start and w.round > round_ for w in plan)

"""Scenario files on disk: read and validate one, write a run's effective scenario and each window's.

The format itself (its types, validation and document) is ttsrecords.scenario; this module does the YAML I/O.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import yaml

from ttsrecords.scenario import Scenario, ScenarioError, parse_scenario


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; every problem is a ScenarioError naming the file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ScenarioError(f"cannot read scenario {p}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise ScenarioError(f"{p}: not valid YAML: {e}") from None
    return parse_scenario(data, path=str(p), sha256=hashlib.sha256(raw).hexdigest())


# --- the scenario of a run and of each of its windows ----------------------------------------------------------


def effective_scenario(path: Path, out: Path, phases: dict, levels: list[int] | None,
                       sets: list[str] | None = None, last_drain_s: float | None = None) -> Path:
    """Copy the scenario into the run folder, with phase lengths / levels / keys overridden if asked (recorded, hashed)."""
    data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    for kv in sets or []:
        key, _, value = kv.partition("=")
        if not key or not _:
            raise ValueError(f"--scenario-set wants KEY=VALUE, got {kv!r}")
        data[key] = yaml.safe_load(value)
    if phases:
        data["phases"] = {**data.get("phases", {}), **phases}
    if levels:  # a level the file lists keeps its own phases; another one takes the file's `phases`
        own = {(st["concurrency"] if isinstance(st, dict) else st): st for st in data.get("steps") or []}
        data["steps"] = [own[c] if isinstance(own.get(c), dict) else {"concurrency": c} for c in levels]
    if last_drain_s is not None and data.get("steps"):
        last = data["steps"][-1]
        data["steps"][-1] = {**(last if isinstance(last, dict) else {"concurrency": last}), "drain_s": last_drain_s}
    out.write_text(f"# effective scenario of this run, from {path}\n" + yaml.safe_dump(data, sort_keys=False),
                   encoding="utf-8")
    load_scenario(str(out))  # validate now: a bad override fails before any server starts
    return out


def window_scenario(run_scenario: Scenario, order: list[int], out: Path, *, count: bool, settle_s: float = 0.0,
                    block_id: str = "") -> Path:
    """The scenario of one window: the run's steps in the window's order (indices into the run's steps).

    A level keeps its own count, warm-up, measure and drain lengths: the drain lets the requests that started in the
    level's measure phase finish under the level's own load (loadtest/window_fit.py sizes it by the level's longest
    request), so it goes with the level wherever the window's order puts it (the requests still running when a window
    ends are recorded: Locust's stop timeout lets them finish, loadtest.session). settle_s lengthens the first
    warm-up (after a hot-swap switch). count False: no count phase (an arm without the plugin has no control file)."""
    steps = run_scenario.steps
    count_s = steps[0].count_s if count else 0.0
    window = replace(run_scenario, steps=tuple(
        replace(steps[idx], index=pos, warmup_s=steps[idx].warmup_s + (settle_s if pos == 0 else 0.0),
                count_s=count_s) for pos, idx in enumerate(order)))
    head = (f"# window {block_id}: the run's scenario with the levels in this window's seeded order, the drain by "
            f"position{f', {settle_s:g} s settle after a switch' if settle_s else ''}"
            f"{'' if count else ', no count phase (no control file)'}\n")
    out.write_text(head + yaml.safe_dump(window.to_document(), sort_keys=False), encoding="utf-8")
    load_scenario(str(out))
    return out


def window_seconds(scenario: Scenario, count: bool = True) -> float:
    """Length of one window's load: every level's count, warm-up, measure and drain."""
    return sum((s.count_s if count else 0.0) + s.warmup_s + s.measure_s + s.drain_s for s in scenario.steps)

"""The settings a run fixes before it starts, in the one place of the manifest where every reader finds them.

- The sequential rule (`make ab UNTIL=decided`): `manifest["design"]["sequential"]`, built by `sequential()` and read
  by `sequential_of()`; the planner writes it, the runner and ttsreport read it. The runner's own record of what
  its looks did lives under `LOOK_LOG`, never under a key the planner owns.
- The pre-registered analysis (margin, confidence, primary metric): `manifest["analysis"]`, built by `analysis()`
  and read by `analysis_of()`.

Standard library only: the load side writes these, the statistics read them, and neither imports the other.
Every bad value is a `SettingsError` with a one-line message that names the option.
"""

from __future__ import annotations

import math

from ttsrecords.windows import PlannedWindow, unit_ends

# A/B rounds before a sequential look may stop the run (the first look). Three: a t interval from two units has one
# degree of freedom, and its repeated boundary at n = 2 is so wide that a look there almost never decides.
DEFAULT_MIN_ROUNDS = 3
MIN_UNITS = 2  # the fewest units (rounds, or starts in a nested design) with a t interval
MAX_SEQ_UNITS = 1000  # the boundary is simulated per look: beyond this use a fixed design
LOOK_LOG = "sequential_looks"  # the runner's log of its looks: count, errors, ignored stops, where it stopped
DEFAULT_MARGIN_PCT = 1.0
DEFAULT_CONFIDENCE = 0.95
LOOK_RULE = ("python -m ttsreport <run> --look after each unit (a round; a server start in a nested design); stop "
             "when looks.jsonl's last line says stop (honoured once min_rounds A/B rounds and every A/A round ran); "
             "the look after the last unit decides")


class SettingsError(ValueError):
    """A setting a run cannot start with: the message is one line naming the option."""


def _whole(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SettingsError(f"{name} must be a whole number, got {v!r}")
    return v


def sequential(min_rounds: int | None, max_rounds: int, *, design: str, window_pairs: int | None = None) -> dict:
    """The sequential settings of a run (what `design.sequential` holds): rounds as asked, and the units the looks
    count with the boundary's number of looks, min_units..max_units. A nested design's unit is the server start
    (its W window pairs are one unit): max_units = its starts, min_units = the starts that hold min_rounds, never
    fewer than MIN_UNITS."""
    max_rounds = _whole("--max-rounds", max_rounds)
    if min_rounds is None:
        min_rounds = min(DEFAULT_MIN_ROUNDS, max_rounds)
    min_rounds = _whole("--min-rounds", min_rounds)
    if design == "nested":
        pairs = _whole("--window-pairs", window_pairs)
        if pairs < 1:
            raise SettingsError(f"--window-pairs must be >= 1, got {pairs}")
        unit, max_units, min_units = "start", math.ceil(max_rounds / pairs), max(MIN_UNITS, math.ceil(min_rounds / pairs))
    else:
        unit, max_units, min_units = "round", max_rounds, min_rounds
    what = "server starts (the unit of a nested design)" if unit == "start" else "A/B rounds"
    if max_units < MIN_UNITS:
        raise SettingsError(f"--max-rounds {max_rounds} gives {max_units} {what}: a sequential run needs at least "
                            f"{MIN_UNITS} (the fewest with an interval)")
    if min_units < MIN_UNITS:
        raise SettingsError(f"--min-rounds {min_rounds}: the first look needs at least {MIN_UNITS} {what} (the "
                            "fewest with an interval)")
    if min_units > max_units or min_rounds > max_rounds:
        raise SettingsError(f"want --min-rounds <= --max-rounds, got {min_rounds} and {max_rounds}"
                            + (f" ({min_units} > {max_units} starts of {window_pairs} pairs)" if unit == "start"
                               else ""))
    if max_units > MAX_SEQ_UNITS:
        raise SettingsError(f"--max-rounds {max_rounds}: more than {MAX_SEQ_UNITS} looks; use a fixed design")
    return {"until": "decided", "unit": unit, "min_rounds": min_rounds, "max_rounds": max_rounds,
            "window_pairs": window_pairs if unit == "start" else None, "min_units": min_units, "max_units": max_units,
            "look": LOOK_RULE}


def sequential_of(manifest: dict) -> dict | None:
    """The run's sequential settings (None: a fixed design), from design.sequential. Folders written before that
    was their one home kept them at the manifest's top level or in its settings; those still load, counting
    rounds as their units."""
    design = manifest.get("design")
    seq = design.get("sequential") if isinstance(design, dict) else None
    if seq is None:  # older folders; a runner's look log there has no max_rounds and is no setting
        settings = manifest.get("settings") or {}
        for old in (manifest.get("sequential"), settings.get("sequential")):
            if isinstance(old, dict) and old.get("max_rounds") is not None:
                seq = old
                break
        else:
            if settings.get("until") != "decided":
                return None
            seq = settings
    if not isinstance(seq, dict):
        raise SettingsError(f"manifest.json: design.sequential must be a mapping, got {seq!r}")
    if seq.get("max_rounds") is None:
        raise SettingsError("manifest.json: a sequential run without max_rounds")
    if seq.get("max_units") is not None:
        out = dict(seq)
        for k in ("min_rounds", "max_rounds", "min_units", "max_units"):
            out[k] = _whole(f"manifest.json: design.sequential.{k}", seq.get(k))
        return out
    mx = _whole("manifest.json: max_rounds", seq["max_rounds"])
    mn = seq.get("min_rounds")
    mn = min(DEFAULT_MIN_ROUNDS, mx) if mn is None else _whole("manifest.json: min_rounds", mn)
    return {"until": "decided", "unit": "round", "min_rounds": mn, "max_rounds": mx, "window_pairs": None,
            "min_units": mn, "max_units": mx, "look": LOOK_RULE,
            **{k: seq[k] for k in ("alpha", "margin_pct") if seq.get(k) is not None}}


def record(manifest: dict, *, sequential: dict | None, analysis: dict | None) -> dict:
    """Put the settings into their homes in a manifest: the planner's writer, and every test folder's."""
    design = manifest.get("design")
    if not isinstance(design, dict):
        design = manifest["design"] = {"name": design}
    design["sequential"] = sequential
    if analysis is not None:
        manifest["analysis"] = analysis
    return manifest


def look_due(plan: list[PlannedWindow], round_: int, seq: dict) -> bool:
    """Whether a unit ends with this round, so the runner looks after it: every round, or in a nested design the
    last round of its server start."""
    return seq.get("unit") != "start" or unit_ends(plan, round_)


def stop_refused(plan: list[PlannedWindow], round_: int, min_rounds: int) -> tuple[int, str | None]:
    """A look said stop after this round: the A/B rounds done by then, and why the stop is not honoured yet (fewer
    than min_rounds A/B rounds, or A/A rounds still to run), None when it is."""
    ab_done = len({x.round for x in plan if x.kind == "ab" and x.round <= round_})
    aa_left = sorted({x.round for x in plan if x.kind == "aa" and x.round > round_})
    if ab_done < min_rounds:
        return ab_done, f"{ab_done} of the minimum {min_rounds} A/B rounds"
    if aa_left:
        return ab_done, f"A/A rounds {aa_left} still to run"
    return ab_done, None


def analysis(margin_pct: float | None = None, confidence: float | None = None,
             primary_metric: str | None = None, *, verdict_metrics=()) -> dict:
    """The pre-registered analysis of a run (what `manifest["analysis"]` holds), validated; None values take the
    defaults. verdict_metrics: the names a primary metric may have."""
    m = DEFAULT_MARGIN_PCT if margin_pct is None else margin_pct
    c = DEFAULT_CONFIDENCE if confidence is None else confidence
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m < 0:
        raise SettingsError(f"margin_pct must be a finite number >= 0 (per cent), got {margin_pct!r}")
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.5 <= c < 1:
        raise SettingsError(f"confidence must lie in [0.5, 1), got {confidence!r}")
    if primary_metric is not None and verdict_metrics and primary_metric not in verdict_metrics:
        raise SettingsError(f"primary_metric {primary_metric!r} is not one of {list(verdict_metrics)}")
    return {"margin_pct": float(m), "confidence": float(c), "primary_metric": primary_metric}


def analysis_of(manifest: dict) -> dict:
    """The pre-registered analysis settings of a run ({} for folders written before they were recorded)."""
    a = manifest.get("analysis")
    if a is None:
        return {}
    if not isinstance(a, dict):
        raise SettingsError(f"manifest.json: analysis must be a mapping, got {a!r}")
    return a

"""What the statistics write and the report reads: summary.json (`Summary`) and comparison.json (`Comparison`).

The statistics (ttsreport.analysis) compute both as plain JSON values and write them only through these types, so a
field they forget or invent fails there, not in a report built later; the report, the plots and the dashboard read
them back only through `read_results`. The top-level fields are typed and listed in docs/architecture.md; what sits
inside a field (a window's summary, a level's verdicts) stays JSON and is described there too. The field order is
the order in the file, so a rewrite is byte for byte the same. Standard library only.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any

from ttsrecords.records import COMPARISON_SCHEMA, SUMMARY_SCHEMA

SUMMARY_FILE = "summary.json"
COMPARISON_FILE = "comparison.json"


class ResultsError(ValueError):
    """summary.json or comparison.json that this code cannot read: one line naming the file and the cause."""


def _from_dict(cls, d: Any, schema: str, what: str):
    if not isinstance(d, dict):
        raise ResultsError(f"{what}: not a JSON object ({type(d).__name__})")
    if d.get("schema") != schema:
        raise ResultsError(f"{what}: schema {d.get('schema')!r}, this code reads {schema!r} (rerun python -m ttsreport "
                           "<run> to rebuild it)")
    names = [f.name for f in fields(cls)]
    missing = [f.name for f in fields(cls) if f.default is MISSING and f.name not in d]
    unknown = sorted(set(d) - set(names))
    if missing or unknown:
        raise ResultsError(f"{what}: " + "; ".join(x for x in (
            f"no {', '.join(missing)}" if missing else "", f"unknown {', '.join(unknown)}" if unknown else "") if x))
    return cls(**{k: d[k] for k in names if k in d})


def _to_dict(obj) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


@dataclass(frozen=True)
class Summary:
    """summary.json: the run as the statistics saw it, window by window and arm by arm (no verdicts)."""

    schema: str
    run_id: str
    run_dir: str
    warnings: list[str]  # what the reader must know before trusting a number (each shown in the report)
    notes: list[str]  # the reader's notes while loading the files (a skipped truncated line, ...)
    experiment: dict[str, Any]  # name, idea, confounded, primary_metric
    arms_info: dict[str, Any]  # per arm: what it runs (label, variant, image, evidence, starts)
    variants: dict[str, Any]  # {"A": variant, "B": variant}
    backend: Any  # the manifest's backend record (name, version, simulated, image digests)
    simulated: bool
    fidelity: dict[str, Any] | None  # simulated runs: the profile, its fit's fidelity line, or why there is none
    design: dict[str, Any]  # name, unit, starts, level_order
    partial: bool  # a planned window has no result, or the run did not complete
    run_status: str | None
    planned_blocks: int
    complete_blocks: int
    started: str | None
    ended: str | None
    git_revision: str | None
    scenario: Any  # the manifest's scenario record (path, sha256s)
    levels: list[str]  # the concurrency levels, as strings, ascending
    metrics: dict[str, Any]  # per metric key: label, unit, better, definition, verdict
    blocks: list[dict[str, Any]]  # one summary per window (ttsreport.blocks.block_summary)
    invalid_blocks: list[dict[str, Any]]  # block_id, round, kind, arm, variant, reason
    starts: list[dict[str, Any]]  # one row per server start
    arms: dict[str, Any]  # per level, arm and metric: mean and band over the valid windows
    telemetry: dict[str, Any]  # per level and arm: GPU and process telemetry over the measure windows
    upstream: dict[str, Any]  # per level and arm: vllm-omni's own series
    distributions: dict[str, Any]  # per level and arm: request-level quantiles
    looks: list[dict[str, Any]]  # the sequential looks (looks.jsonl), in order

    @classmethod
    def from_dict(cls, d: Any, what: str = SUMMARY_FILE) -> Summary:
        return _from_dict(cls, d, SUMMARY_SCHEMA, what)

    def to_dict(self) -> dict[str, Any]:
        return _to_dict(self)


@dataclass(frozen=True)
class Comparison:
    """comparison.json: the verdicts, B against A, per level and metric, with the settings that produced them."""

    schema: str
    levels: list[str]
    primary_metric: str
    rounds: dict[str, int]  # {"ab": A/B rounds, "aa": A/A rounds} that entered
    settings: dict[str, Any]  # confidence, alpha, margin_pct (+ source), design, unit, estimand, decision, ...
    headline: dict[str, Any] | None  # the decision on the primary metric (sequential rule when the run has one)
    headline_fixed: dict[str, Any] | None  # a sequential run: the fixed-sample analysis beside it
    without_failures: dict[str, Any] | None  # the primary metric without rounds that had failures (when any had)
    aa_warnings: list[str]
    aa_warnings_secondary: list[str]
    per_level: dict[str, Any]  # per level: metrics, error_rate, continuity, aa, design, prediction
    run_id: str
    variants: dict[str, Any]
    simulated: bool
    partial: bool
    invalid_blocks: list[dict[str, Any]]
    audio_per_prompt: dict[str, Any] | None = None  # audio seconds per prompt, B against A (absent before it existed)
    positive_control: dict[str, float] | None = None  # {arm: host delay in microseconds} (absent before it existed)

    @classmethod
    def from_dict(cls, d: Any, what: str = COMPARISON_FILE) -> Comparison:
        return _from_dict(cls, d, COMPARISON_SCHEMA, what)

    def to_dict(self) -> dict[str, Any]:
        """In the order the file has always had: the verdicts first, the run's identity last."""
        d = _to_dict(self)
        head = [k for k in COMPARISON_ORDER if k in d and (d[k] is not None or k not in OPTIONAL)]
        return {k: d[k] for k in head}


OPTIONAL = ("audio_per_prompt", "positive_control")
COMPARISON_ORDER = ("schema", "levels", "primary_metric", "rounds", "settings", "headline", "headline_fixed",
                    "without_failures", "aa_warnings", "aa_warnings_secondary", "per_level", *OPTIONAL, "run_id",
                    "variants", "simulated", "partial", "invalid_blocks")


def read_results(run_dir: str | os.PathLike) -> tuple[Summary, Comparison]:
    """summary.json and comparison.json of a run folder, typed; ResultsError (one line) when either cannot be read."""
    out = []
    for name, cls in ((SUMMARY_FILE, Summary), (COMPARISON_FILE, Comparison)):
        path = Path(run_dir) / name
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ResultsError(f"{path}: {e.strerror or e} (run python -m ttsreport {run_dir})") from None
        except ValueError as e:
            raise ResultsError(f"{path}: not JSON ({e})") from None
        out.append(cls.from_dict(doc, str(path)))
    return out[0], out[1]


def write_results(run_dir: str | os.PathLike, summary: Summary, comparison: Comparison) -> tuple[Path, Path]:
    """Replace both files (each through a temporary file, so a reader never sees half of one)."""
    run = Path(run_dir)
    paths = run / SUMMARY_FILE, run / COMPARISON_FILE
    for p, obj in zip(paths, (summary.to_dict(), comparison.to_dict()), strict=True):
        tmp = p.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(obj, indent=1, allow_nan=False) + "\n", encoding="utf-8")
        tmp.replace(p)
    return paths

"""The record contract: the files a run writes, the one reader for them, and the rules that judge a block.

docs/architecture.md shows the formats. Frozen dataclasses so a measured record cannot change; every line carries its
schema so a reader can refuse a format it does not know. The A/B runner, the statistics, the report and the tests all
use this module, so it imports only the standard library and tts_predictor's plain-Python names (no numpy, no scipy).
"""

from __future__ import annotations

import json
import os
import re
import threading
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tts_predictor import metrics as pm

# --- schema ids: the one place each is spelled ------------------------------------------------------------------
REQUEST_SCHEMA = "tts-request/1"  # requests.jsonl lines
COUNTERS_SCHEMA = "tts-counters/1"  # counters.jsonl lines
RUN_SCHEMA = "tts-run/1"  # manifest.json of a Locust run
AB_SCHEMA = "tts-ab/1"  # manifest.json of an A/B run
BLOCK_SCHEMA = "tts-block/1"  # blocks/<id>/block.json
SUMMARY_SCHEMA = "tts-summary/1"  # summary.json (statistics)
COMPARISON_SCHEMA = "tts-comparison/1"  # comparison.json (statistics)
MICRO_SCHEMA = "tts-micro/1"  # results.json of the micro benchmark (tools/micro.py), read by the prediction
RUN_MANIFESTS = (AB_SCHEMA, RUN_SCHEMA)

PHASES = ("warmup", "measure", "drain")
MODES = ("stream", "wav")
BLOCK_STATUSES = ("complete", "invalid", "failed", "interrupted")
# Manipulation check: observed syncs within 2 % of the closed form (exact on the simulator; sampling on a real server).
SYNC_TOLERANCE = 0.02


# --- record types ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it; times in seconds, unrounded."""

    run_id: str
    worker: str
    step: int
    concurrency: int
    phase: str
    mode: str
    ok: bool
    error: str | None
    status: int | None
    ttfa_s: float | None
    e2e_s: float | None
    audio_s: float | None
    rtf: float | None
    bytes: int
    t_start: float
    prompt_id: str
    bucket: str
    variant: str | None
    seq: int | None = None  # index of the prompt in this process's deterministic sequence (None: no prompt drawn)
    schema: str = REQUEST_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {"schema": d.pop("schema"), **d}


REQUEST_FIELDS = tuple(f.name for f in fields(RequestRecord))


@dataclass(frozen=True)
class CounterSnapshot:
    """The raw /metrics samples of one target at one edge of a measure phase (ok=false: the scrape failed)."""

    step: int
    concurrency: int
    edge: str  # "start" | "end"
    t: float
    target: str
    ok: bool
    error: str | None
    samples: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        return {"schema": COUNTERS_SCHEMA, "kind": "snapshot", **asdict(self)}


@dataclass(frozen=True)
class CounterDelta:
    """End minus start of the predictor/engine counters over one measure phase, and their ratios (None: unknown)."""

    step: int
    concurrency: int
    target: str
    duration_s: float | None
    variant: str | None
    calls: float | None
    seconds: float | None
    syncs: float | None
    observed_calls: float | None
    observed_tokens: float | None
    tokens: float | None
    batch_requests: float | None
    steps: float | None
    step_seconds: float | None
    frames: float | None
    requests_finished: float | None
    syncs_per_call: float | None
    syncs_per_step: float | None
    calls_per_request: float | None
    seconds_per_request: float | None
    mean_batch: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"schema": COUNTERS_SCHEMA, "kind": "delta", **asdict(self)}


@dataclass
class BlockRecord:
    """blocks/<id>/block.json: one fresh server start of one variant. Mutable on purpose: it is written as
    "interrupted" before the block starts and replaced when it ends, so a killed runner leaves the truth behind."""

    block_id: str
    round: int
    kind: str  # "aa" | "ab"
    arm: str  # "A" | "B"
    variant: str
    status: str = "interrupted"
    reason: str | None = "block in progress (runner stopped)"
    started: str | None = None
    ended: str | None = None
    server_url: str | None = None
    failed_before: int = 0  # earlier failed attempts of this block (kept under attempts/)
    timing: dict[str, float] = field(default_factory=dict)
    requests: dict[str, Any] | None = None  # request_outcomes() of the block, once its load ran

    def to_dict(self) -> dict[str, Any]:
        d = {"schema": BLOCK_SCHEMA, **asdict(self)}
        if d["requests"] is None:
            del d["requests"]
        return d


# --- reading and writing -----------------------------------------------------------------------------------------


def read_jsonl(path: str | os.PathLike, schema: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows of a JSONL file and notes about it: the one reader of every record file.

    A missing file has no rows. A truncated last line (a writer killed mid-line) is skipped with a note; any other
    line that is not JSON, or a line whose schema is not `schema`, is refused (ValueError naming file and line).
    """
    path = Path(path)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    if not path.exists():
        return rows, notes
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                notes.append(f"{path}: truncated last line skipped")
                continue
            raise ValueError(f"{path}:{i + 1}: not JSON") from None
        if schema is not None and obj.get("schema", schema) != schema:
            raise ValueError(f"{path}:{i + 1}: unknown schema {obj.get('schema')!r} (this reader knows {schema!r})")
        rows.append(obj)
    return rows, notes


def request_from_dict(obj: dict[str, Any]) -> RequestRecord:
    """A RequestRecord from one parsed line; refuse an unknown schema or missing fields."""
    if obj.get("schema") != REQUEST_SCHEMA:
        raise ValueError(f"unknown request record schema {obj.get('schema')!r} (expected {REQUEST_SCHEMA!r})")
    missing = [name for name in REQUEST_FIELDS if name not in obj]
    if missing:
        raise ValueError(f"request record lacks fields {missing}")
    return RequestRecord(**{name: obj[name] for name in REQUEST_FIELDS})


def parse_request(line: str) -> RequestRecord:
    """Parse one requests.jsonl line (see request_from_dict)."""
    return request_from_dict(json.loads(line))


def read_requests(path: str | os.PathLike) -> list[RequestRecord]:
    """requests.jsonl as records; a truncated last line is skipped with a warning (read_jsonl's note)."""
    rows, notes = read_jsonl(path, REQUEST_SCHEMA)
    for note in notes:
        warnings.warn(note, stacklevel=2)
    return [request_from_dict(r) for r in rows]


def read_json(path: str | os.PathLike) -> dict[str, Any] | None:
    """A JSON file (manifest, block.json), None when it does not exist."""
    path = Path(path)
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def write_json(path: str | os.PathLike, obj: dict[str, Any]) -> None:
    """Atomic replace: a reader (or a resume) never sees half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def dumps(obj: Any) -> str:
    """One compact JSON line; floats keep full repr precision (json does not round)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


class JsonlWriter:
    """Append-only JSONL file, flushed after every line so a crash loses at most the line being written."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()
        self.lines = 0

    def write_line(self, line: str) -> None:
        with self._lock:
            self._f.write(line + "\n")
            self._f.flush()
            self.lines += 1

    def write(self, obj: dict[str, Any]) -> None:
        self.write_line(dumps(obj))

    def close(self) -> None:
        with self._lock:
            if not self._f.closed:
                self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- judging a block ---------------------------------------------------------------------------------------------


def error_kind(error: str | None) -> str:
    """A request's error reason without its details: 'http 503', 'stream broken', 'no response', ..."""
    head = (error or "unknown error").split(":", 1)[0].strip()
    if re.fullmatch(r"http \d+", head):
        return head
    return re.sub(r"\s+(after\s+)?\d.*$", "", head) or head


def error_counts(requests: list[dict[str, Any]]) -> dict[str, int]:
    """Failed requests by error kind, most frequent first."""
    return dict(Counter(error_kind(r.get("error")) for r in requests if not r.get("ok")).most_common())


def request_outcomes(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of a block's request rows: measure-phase requests and failures by kind, and failures elsewhere."""
    measure = [r for r in requests if r.get("phase") == "measure"]
    other = [r for r in requests if r.get("phase") != "measure"]
    return {"measure": len(measure), "measure_failed": sum(not r.get("ok") for r in measure),
            "measure_errors": error_counts(measure), "other": len(other),
            "other_failed": sum(not r.get("ok") for r in other), "other_errors": error_counts(other)}


def _top(errors: dict[str, int], n: int = 3) -> str:
    items = sorted(errors.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} ({v})" for k, v in items[:n])
    return text + (f", {len(items) - n} other kinds" if len(items) > n else "")


def request_verdict(outcomes: dict[str, Any]) -> str | None:
    """None when the measure phases are usable; else the reason the block is invalid."""
    o = outcomes
    if o["measure_failed"]:
        return f"{o['measure_failed']} of {o['measure']} measure-phase requests failed: {_top(o['measure_errors'])}"
    if not o["measure"]:
        why = "no measure-phase request was recorded"
        if o["other_failed"]:
            why += f" ({o['other_failed']} of {o['other']} warm-up/drain requests failed: {_top(o['other_errors'])})"
        return why
    return None


def manipulation_check(variant: str | None, counters: list[dict[str, Any]]) -> dict[str, Any]:
    """Do the block's sync counters show its variant's signature (metrics.expected_syncs)? Missing counters fail."""
    ds = [c for c in counters if c.get("kind") == "delta"]
    syncs = sum(c.get("syncs") or 0 for c in ds)
    ocalls = sum(c.get("observed_calls") or 0 for c in ds)
    otokens = sum(c.get("observed_tokens") or 0 for c in ds)
    labels = sorted({c.get("variant") for c in ds if c.get("variant")})
    res = {"variant": variant, "server_variants": labels, "syncs": syncs, "observed_calls": ocalls,
           "observed_tokens": otokens, "expected_syncs": None, "ok": False, "reason": None}
    if not ds or not ocalls:
        res["reason"] = "no sync counters observed (scrape failed or observer off): variant cannot be verified"
        return res
    if labels and labels != [variant]:
        res["reason"] = f"server reports variant {labels}, block expected {variant!r}"
        return res
    try:
        exp = pm.expected_syncs(variant, ocalls, otokens)
    except (ValueError, KeyError):
        res["reason"] = f"unknown variant {variant!r}"
        return res
    res["expected_syncs"] = exp
    if abs(syncs - exp) <= SYNC_TOLERANCE * max(exp, 1.0):
        res["ok"] = True
    else:
        res["reason"] = (f"syncs {syncs:g} != expected {exp:g} for {variant} over {ocalls:g} calls / {otokens:g} tokens "
                         f"({syncs / ocalls:.2f} vs {exp / ocalls:.2f} per call)")
    return res


def load_verdict(variant: str | None, outcomes: dict[str, Any], counters: list[dict[str, Any]]) -> str | None:
    """Right after a block's load: None when its data can be used, else why it is invalid (requests first, then the
    manipulation check)."""
    why = request_verdict(outcomes)
    if why is not None:
        return why
    check = manipulation_check(variant, counters)
    return None if check["ok"] else f"manipulation check failed: {check['reason']}"


def block_validity(block: dict[str, Any], check: dict[str, Any], measured: bool) -> str | None:
    """Whether the statistics may use a stored block: None if so, else why not. The stored status decides first (the
    runner's load_verdict already judged the requests), then the manipulation check, then whether anything was
    measured."""
    status = block.get("status")
    if status != "complete":
        return f"status {status}" + (f": {block.get('reason')}" if block.get("reason") else "")
    if not check["ok"]:
        return f"manipulation check failed: {check['reason']}"
    if not measured:
        return "no measured requests"
    return None

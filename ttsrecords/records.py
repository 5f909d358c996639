"""The record contract: the files a run writes, the one reader for them, and the rules that judge a block.

docs/architecture.md shows the formats. Frozen dataclasses so a measured record cannot change; every line carries its
schema so a reader can refuse a format it does not know. The A/B runner, the statistics, the report and the tests all
use this module, so it imports only the standard library and tts_predictor's plain-Python names (no numpy, no scipy).
"""

from __future__ import annotations

import json
import os
import threading
import warnings
from dataclasses import MISSING, asdict, dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

# --- schema ids: the one place each is spelled ------------------------------------------------------------------
# Version 2: count phases with the sync observer on and timing windows with it off, streaming
# continuity per request, blocks that are windows inside a server start (hot swap), per-start records, telemetry.
# Readers accept version 1 files too (LEGACY): a missing field reads as None and a run without count phases is
# judged the version-1 way (its manipulation check uses the measure windows), so old runs still load.
REQUEST_SCHEMA = "tts-request/2"  # requests.jsonl lines
COUNTERS_SCHEMA = "tts-counters/2"  # counters.jsonl lines
RUN_SCHEMA = "tts-run/2"  # manifest.json of a Locust run
AB_SCHEMA = "tts-ab/2"  # manifest.json of an A/B run
BLOCK_SCHEMA = "tts-block/2"  # blocks/<id>/block.json: one Locust window (one arm, every level once)
START_SCHEMA = "tts-start/1"  # starts/<id>/start.json: one server start (one or more windows)
TELEMETRY_SCHEMA = "tts-telemetry/1"  # blocks/<id>/telemetry.jsonl lines
LOOK_SCHEMA = "tts-look/1"  # looks.jsonl lines: the sequential rule's decision after a round
PLAN_SCHEMA = "tts-plan/1"  # plan.json of a nested pilot: starts and windows per start for a target half-width
PREFLIGHT_SCHEMA = "tts-preflight/1"  # reports/preflight-<UTC>/preflight.json
SUMMARY_SCHEMA = "tts-summary/2"  # summary.json (statistics)
COMPARISON_SCHEMA = "tts-comparison/2"  # comparison.json (statistics)
MICRO_SCHEMA = "tts-micro/1"  # results.json of the micro benchmark (tools/micro.py), read by the prediction
PROGRESS_SCHEMA = "tts-progress/1"  # progress.json of a running A/B run: where it stands (the dashboard reads it)
SCENARIO_SCHEMA = "tts-scenario/1"  # scenario files (configs/scenarios/*.yaml, a run's and each window's scenario.yaml)
GPU_CHECK_SCHEMA = "tts-gpu-check/1"  # check.json of make gpu-check (tools/gpu_check.py): steps, budgets, versions
GPU_AB_SCHEMA = "tts-gpu-ab/1"  # ab.json of make gpu-check: the closed-loop swap A/B (tools/closed_loop.py)
SIM_PROFILE_DIR = "sim"  # <run>/sim/<config name> (+ .fit.json): the simulator profiles a run used, copied in


def sim_profile_copy(run_dir: str | os.PathLike, config_path: str) -> Path:
    """Where a run folder keeps its copy of the simulator profile `config_path` (its fit beside it)."""
    return Path(run_dir) / SIM_PROFILE_DIR / Path(config_path).name
LEGACY = {REQUEST_SCHEMA: ("tts-request/1",), COUNTERS_SCHEMA: ("tts-counters/1",), RUN_SCHEMA: ("tts-run/1",),
          AB_SCHEMA: ("tts-ab/1",), BLOCK_SCHEMA: ("tts-block/1",)}
RUN_MANIFESTS = (AB_SCHEMA, RUN_SCHEMA, *LEGACY[AB_SCHEMA], *LEGACY[RUN_SCHEMA])

# A level's phases in order. "count": the sync observer is on (the manipulation check counts syncs here; not timed);
# "warmup": observer off, the server settles; "measure": the timing window (observer off: zero observed calls);
# "drain": requests of the window finish. A scenario without count_s has no count phase (version-1 behaviour).
PHASES = ("count", "warmup", "measure", "drain")
MODES = ("stream", "wav")
BLOCK_STATUSES = ("complete", "invalid", "failed", "interrupted")
START_STATUSES = ("ready", "failed", "interrupted", "stopped")
DESIGNS = ("fresh", "swap", "nested")
# counters.jsonl snapshot edges: measure window, count window
EDGES = ("start", "end", "count_start", "count_end")
WINDOWS = ("measure", "count")
# Streaming continuity: a player starts at the first chunk and plays in real time; underrun_s is its total stall
# time (every stall counts, short ones add up); the stream is continuous when that total is at most this threshold
# (vllm-omni's benchmark: audio_continuity.py, the same 100 ms; docs/sources.md).
UNDERRUN_THRESHOLD_S = 0.1


# --- record types ------------------------------------------------------------------------------------------------


@cache
def _field_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _from_flat(cls: type, d: Any, what: str, **converted: Any) -> Any:
    """A record of `cls` from its parsed JSON object (the inverse of its to_dict): fields it lacks that have a
    default read as that default (a version-1 line), a missing required field or a non-object is one ValueError;
    `converted` replaces fields whose JSON form differs (a list that the record keeps as a tuple)."""
    if not isinstance(d, dict):
        raise ValueError(f"{what}: not a JSON object")
    missing = [f.name for f in fields(cls)
               if f.default is MISSING and f.default_factory is MISSING and f.name not in d]
    if missing:
        raise ValueError(f"{what} lacks fields {missing}")
    try:
        return cls(**{n: d[n] for n in _field_names(cls) if n in d and n != "schema"}
                   | {k: v for k, v in converted.items() if k in d})
    except TypeError as e:
        raise ValueError(f"{what}: {e}") from None


def _flat(record: Any) -> dict[str, Any]:
    """A flat record's fields in declaration order, the values themselves: the same dict as `asdict` for fields that
    hold scalars, without its deep copy of every value (most of the cost of writing a line, once per request)."""
    return {name: getattr(record, name) for name in _field_names(type(record))}


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
    # streaming continuity (stream mode, ok requests; None otherwise): a player that starts at the first chunk
    underrun_s: float | None = None  # total playback stall of a player that starts at the first chunk
    continuity_ok: bool | None = None  # underrun_s <= UNDERRUN_THRESHOLD_S
    stream_rtf: float | None = None  # (e2e_s - ttfa_s) / audio_s: generation speed once audio flows
    chunks: int | None = None  # non-empty body chunks received
    schema: str = REQUEST_SCHEMA

    def to_dict(self) -> dict[str, Any]:
        d = _flat(self)
        return {"schema": d.pop("schema"), **d}

    @classmethod
    def from_dict(cls, d: Any) -> RequestRecord:
        return request_from_dict(d)


REQUEST_FIELDS = tuple(f.name for f in fields(RequestRecord))


@dataclass(frozen=True)
class CounterSnapshot:
    """The raw /metrics samples of one target at one edge of a measure phase (ok=false: the scrape failed)."""

    step: int
    concurrency: int
    edge: str  # EDGES: "start" | "end" (measure window), "count_start" | "count_end" (count window)
    t: float
    target: str
    ok: bool
    error: str | None
    samples: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        d = _flat(self)
        d["samples"] = dict(self.samples)  # names to floats: a shallow copy is a full one
        return {"schema": COUNTERS_SCHEMA, "kind": "snapshot", **d}

    @classmethod
    def from_dict(cls, d: Any) -> CounterSnapshot:
        return _from_flat(cls, d, "counter snapshot")


@dataclass(frozen=True)
class CounterDelta:
    """End minus start of the predictor/engine counters over one window of a level (the measure phase, or the count
    phase with window="count"), and their ratios (None: unknown).

    variant: the one label whose calls moved in the window (None if none moved); variants_moved lists every label
    that moved (more than one: the window mixed variants). epoch / observe / active_variant: the control channel's
    gauges at the window's end and start (None where the server has no control channel)."""

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
    mean_batch: float | None  # rows per build_attn_metadata call: the PADDED batch on a GPU (CUDA-graph sizes)
    window: str = "measure"  # WINDOWS
    variants_moved: tuple[str, ...] = ()
    epoch_start: int | None = None
    epoch_end: int | None = None
    observe_start: bool | None = None
    observe_end: bool | None = None
    step_interval_count: float | None = None  # the step clock over the window (tts_predictor_step_interval_seconds)
    step_interval_sum: float | None = None
    step_batch_count: float | None = None
    step_batch_sum: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = _flat(self)
        d["variants_moved"] = list(d["variants_moved"] or ())
        return {"schema": COUNTERS_SCHEMA, "kind": "delta", **d}

    @classmethod
    def from_dict(cls, d: Any) -> CounterDelta:
        moved = tuple(d.get("variants_moved") or ()) if isinstance(d, dict) else ()
        return _from_flat(cls, d, "counter delta", variants_moved=moved)


@dataclass(frozen=True)
class ControlWrite:
    """A change the load generator wrote to the server's control file (counters.jsonl, kind "control"): the
    observer switched on for a count phase or off for timing, or the variant for a window."""

    step: int
    concurrency: int
    phase: str  # the phase that begins with this write
    t: float  # epoch seconds, when the file was replaced
    variant: str
    observe: bool
    epoch: int

    def to_dict(self) -> dict[str, Any]:
        return {"schema": COUNTERS_SCHEMA, "kind": "control", **_flat(self)}

    @classmethod
    def from_dict(cls, d: Any) -> ControlWrite:
        return _from_flat(cls, d, "control write")


@dataclass(frozen=True)
class ControlConfirm:
    """Whether the server showed a control write (counters.jsonl, kind "confirm"): its epoch gauge read the write's
    epoch or more within the wait (it applies a write at its next step; an idle server makes none). On a busy CPU
    server one scrape took up to 44 s, so `waited_s` says how long the edge actions were held up."""

    step: int
    concurrency: int
    epoch: int
    t: float  # epoch seconds, when the wait ended
    waited_s: float
    shown: bool

    def to_dict(self) -> dict[str, Any]:
        return {"schema": COUNTERS_SCHEMA, "kind": "confirm", **_flat(self)}

    @classmethod
    def from_dict(cls, d: Any) -> ControlConfirm:
        return _from_flat(cls, d, "control confirm")


@dataclass(frozen=True)
class TelemetrySample:
    """blocks/<id>/telemetry.jsonl: one sample of the server's resources (>= 2 Hz during the block).

    source "nvml": GPU utilisation %, SM clock MHz, memory used MiB, power W (per GPU index); source "process": the
    server's process tree (CPU % of one core summed over processes, RSS MiB), where no GPU can be read; source
    "host": every CPU of the load generator's host, busy % of their capacity (other jobs on the box show here)."""

    t: float
    source: str  # "nvml" | "process"
    gpu: int | None = None
    gpu_util_pct: float | None = None
    sm_clock_mhz: float | None = None
    mem_used_mib: float | None = None
    power_w: float | None = None
    cpu_pct: float | None = None
    rss_mib: float | None = None
    host_cpu_pct: float | None = None
    # source "host": CPU of the processes outside the suite's own tree (the runner, its Locust processes and a server
    # it started), % of one core: other jobs on the box. None where the server runs outside that tree (Docker).
    other_cpu_pct: float | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"schema": TELEMETRY_SCHEMA, **_flat(self)}
        if d["other_cpu_pct"] is None:  # written where measured: lines of earlier writers stay as they were
            del d["other_cpu_pct"]
        return d

    @classmethod
    def from_dict(cls, d: Any) -> TelemetrySample:
        return _from_flat(cls, d, "telemetry sample")


@dataclass
class BlockRecord:
    """blocks/<id>/block.json: one window of one arm through every level (in `levels` order), inside server start
    `start` (design "fresh": one window per start). Mutable on purpose: it is written as "interrupted" before the
    window starts and replaced when it ends, so a killed runner leaves the truth behind.

    round: the pair this window belongs to (A and B windows of one round are compared; kind "aa": both arm A).
    position: 0 or 1, the window's place in its pair (the order effect is B-first vs A-first)."""

    block_id: str
    round: int
    kind: str  # "aa" | "ab"
    arm: str  # "A" | "B"
    variant: str | None  # the predictor variant of the arm (None: an arm without the plugin)
    start: int = 0
    position: int = 0
    levels: list[int] = field(default_factory=list)  # concurrency levels in the order this window ran them
    epoch: int | None = None  # control epoch base of the window (None: no control channel)
    attempt: int = 0  # reruns of this window's round after an infrastructure failure
    status: str = "interrupted"
    reason: str | None = "block in progress (runner stopped)"
    started: str | None = None
    ended: str | None = None
    server_url: str | None = None
    failed_before: int = 0  # earlier failed attempts of this block (kept under attempts/)
    code_fingerprint: str | None = None  # the suite's sources when its load started (loadtest.provenance.code_fingerprint)
    timing: dict[str, float] = field(default_factory=dict)
    requests: dict[str, Any] | None = None  # request_outcomes() of the block, once its load ran

    def to_dict(self) -> dict[str, Any]:
        d = {"schema": BLOCK_SCHEMA, **asdict(self)}
        if d["requests"] is None:
            del d["requests"]
        return d

    @classmethod
    def from_dict(cls, d: Any) -> BlockRecord:
        return _from_flat(cls, d, "block.json")


@dataclass
class StartRecord:
    """starts/<id>/start.json: one server start of an arm's server spec and the windows run in it. Written when the
    start begins and replaced as it goes; `server.log` beside it is the server's output (evidence lines)."""

    start: int
    arm: str  # the arm whose server spec started (in swap/nested designs the windows switch variants inside it)
    status: str = "interrupted"  # START_STATUSES
    reason: str | None = None
    started: str | None = None
    ready_s: float | None = None  # launch to /health: the cost of a start
    ended: str | None = None
    stop_s: float | None = None
    windows: list[str] = field(default_factory=list)  # block ids, in order
    evidence: dict[str, Any] | None = None  # the arm's evidence check: {"ok": bool, "reason": str | None}
    switches: list[dict[str, Any]] = field(default_factory=list)  # {"t", "variant", "epoch", "confirmed_t"}
    compile_cache: str | None = None  # "cold" | "warm": docker/serve.sh's compile-cache line; None: the simulator
    ready_check: str | None = None  # the stages' log line and the first real request (loadtest.readiness)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": START_SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, d: Any) -> StartRecord:
        return _from_flat(cls, d, "start.json")


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
        if schema is not None and obj.get("schema", schema) not in (schema, *LEGACY.get(schema, ())):
            known = " or ".join(repr(x) for x in (schema, *LEGACY.get(schema, ())))
            raise ValueError(f"{path}:{i + 1}: unknown schema {obj.get('schema')!r} (this reader knows {known})")
        rows.append(obj)
    return rows, notes


def request_from_dict(obj: dict[str, Any]) -> RequestRecord:
    """A RequestRecord from one parsed line (version 1 lines too: their later fields read as None); refuse an
    unknown schema or missing fields."""
    schema = obj.get("schema")
    if schema not in (REQUEST_SCHEMA, *LEGACY[REQUEST_SCHEMA]):
        raise ValueError(f"unknown request record schema {schema!r} (expected {REQUEST_SCHEMA!r})")
    return _from_flat(RequestRecord, obj, "request record")


CounterLine = CounterSnapshot | CounterDelta | ControlWrite | ControlConfirm
COUNTER_LINE_TYPES: dict[str, type] = {"snapshot": CounterSnapshot, "delta": CounterDelta, "control": ControlWrite,
                                       "confirm": ControlConfirm}


def counter_line_from_dict(obj: Any) -> CounterLine:
    """One counters.jsonl line as the record its `kind` names (a line of another kind is one ValueError)."""
    kind = obj.get("kind") if isinstance(obj, dict) else None
    if kind not in COUNTER_LINE_TYPES:
        raise ValueError(f"counters line of unknown kind {kind!r} (known: {', '.join(COUNTER_LINE_TYPES)})")
    return COUNTER_LINE_TYPES[kind].from_dict(obj)


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


# --- record values ------------------------------------------------------------------------------------------------


# A drain-phase request that the load generator itself stopped when its level ended (loadtest.session): filler that
# kept the level's load while the measured requests finished, not a failure of the server. Not in any failure count.
CUT_AT_LEVEL_END = "cut: its level ended (a drain request, not measured)"

"""Versioned records written by the load generator (docs/architecture.md is the contract).

Frozen dataclasses so a record cannot change after it was measured; every line carries its schema so the
statistics can refuse a format they do not know.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

REQUEST_SCHEMA = "tts-request/1"
COUNTERS_SCHEMA = "tts-counters/1"
RUN_SCHEMA = "tts-run/1"
PHASES = ("warmup", "measure", "drain")
MODES = ("stream", "wav")


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


def parse_request(line: str) -> RequestRecord:
    """Parse one requests.jsonl line; refuse an unknown schema or missing fields."""
    obj = json.loads(line)
    if obj.get("schema") != REQUEST_SCHEMA:
        raise ValueError(f"unknown request record schema {obj.get('schema')!r} (expected {REQUEST_SCHEMA!r})")
    missing = [name for name in REQUEST_FIELDS if name not in obj]
    if missing:
        raise ValueError(f"request record lacks fields {missing}")
    return RequestRecord(**{name: obj[name] for name in REQUEST_FIELDS})


def read_requests(path: str | os.PathLike) -> list[RequestRecord]:
    with open(path, encoding="utf-8") as f:
        return [parse_request(line) for line in f if line.strip()]


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


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

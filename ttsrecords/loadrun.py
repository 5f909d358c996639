"""The manifest.json of a plain Locust run (`tts-run/2`), typed: how the run ended and why, and what the server said
it was, beside the settings the load generator fixed.

A plain Locust run is `locust -f loadtest/tts.py` without the A/B runner: one folder, one server, the levels of a
scenario (or one level from Locust's -u/-t). Version 2 files written before `status` existed read as "complete" when
they have an end time (they were written only when Locust finished) and say so in `status_source`. Keys this code
does not know are kept in `extra`. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ttsrecords.records import LEGACY, RUN_SCHEMA

LOAD_MANIFESTS = (RUN_SCHEMA, *LEGACY[RUN_SCHEMA])
# complete: every level ran; failed: stopped early because the server stopped answering or refused what we send
# (reason says which, and when); interrupted: SIGTERM / Ctrl-C, or Locust quit before the schedule ended
LOAD_STATUSES = ("complete", "failed", "interrupted")
NOT_REPORTED = "not reported"  # what a server identity field reads when the server's /metrics has none


class LoadManifestError(ValueError):
    """A Locust run's manifest.json this code cannot read: one line naming the cause."""


@dataclass(frozen=True)
class ServerIdentity:
    """What the server said it is on /metrics when the run started: variant, version and backend as it reports them
    (NOT_REPORTED where it has none), and where the variant label of the records came from."""

    variant: str = NOT_REPORTED
    version: str = NOT_REPORTED
    backend: str = NOT_REPORTED  # simulated | vllm | vllm-cpu ... (tts_predictor_info's backend label)
    device: str = NOT_REPORTED
    source: str = "not recorded (a run written before the server's identity was)"  # the URL read, or why not
    variant_source: str = "none"  # server | --variant (the server reports none) | none

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Any) -> ServerIdentity:
        if not isinstance(d, dict):
            return cls()
        return cls(**{f.name: str(d[f.name]) for f in fields(cls) if d.get(f.name) is not None})


@dataclass
class LoadManifest:
    """A plain Locust run's manifest. `status` and `reason` say how it ended; `stopped` (epoch s) when the cause was
    seen; `level_from` the one line that said how Locust's -u/-r/-t became the run's level (null for a scenario)."""

    schema: str = RUN_SCHEMA
    run_id: str = ""
    status: str = "complete"  # LOAD_STATUSES
    reason: str | None = None
    stopped: float | None = None
    status_source: str = "recorded"  # recorded | "assumed: written before status existed"
    mode: str | None = None
    seed: int | None = None
    variant: str | None = None
    model: str | None = None
    host: str | None = None
    metrics_urls: list[str] = field(default_factory=list)
    timeout_s: float | None = None
    control: str | None = None
    control_epoch: int | None = None
    audio_check: str | None = None  # null: each answer's length checked against its text; "off: why" otherwise
    server: ServerIdentity = field(default_factory=ServerIdentity)
    level_from: str | None = None
    role: str | None = None
    scenario: Any = None
    started: float | None = None
    ended: float | None = None
    git_revision: str | None = None
    locust_version: str | None = None
    argv: list[str] = field(default_factory=list)
    workers: dict[str, Any] = field(default_factory=dict)
    phase_holds_s: Any = None
    requests_lines: int = 0
    counters_lines: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("extra", "status_source"):
                continue
            v = getattr(self, f.name)
            out[f.name] = v.to_dict() if isinstance(v, ServerIdentity) else v
        return {**out, **self.extra}

    @classmethod
    def from_dict(cls, d: Any, what: str = "manifest.json") -> LoadManifest:
        if not isinstance(d, dict):
            raise LoadManifestError(f"{what}: not a JSON object ({type(d).__name__})")
        if d.get("schema", RUN_SCHEMA) not in LOAD_MANIFESTS:
            raise LoadManifestError(f"{what}: schema {d.get('schema')!r} is not a Locust run's (known: "
                                    f"{', '.join(LOAD_MANIFESTS)})")
        names = {f.name for f in fields(cls)} - {"extra", "status_source"}
        kw = {k: d[k] for k in names if k in d and d[k] is not None}
        kw["server"] = ServerIdentity.from_dict(d.get("server"))
        if "status" not in d:
            kw["status"] = "complete" if d.get("ended") else "interrupted"
            kw["status_source"] = "assumed: written before status existed"
        elif d["status"] not in LOAD_STATUSES:
            raise LoadManifestError(f"{what}: status {d['status']!r} is not one of {', '.join(LOAD_STATUSES)}")
        extra = {k: v for k, v in d.items() if k not in names}
        return cls(**kw, extra=extra)


def read_load_manifest(d: Any, what: str = "manifest.json") -> LoadManifest:
    """A plain Locust run's manifest, typed; LoadManifestError (one line) when it cannot be read."""
    return LoadManifest.from_dict(d, what)

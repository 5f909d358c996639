"""The A/B run's manifest.json, typed: what the planner fixed before the run (`RunManifest`) and what the runner
recorded while it ran (`RunLog`), in one flat file as before.

The two never share a key: the planner (loadtest.plan.new_run) writes the planned fields once; the runner writes only
`RUNNER_KEYS` through its `RunLog` (status, looks, reruns, switches, preparation, ...) and never rewrites a planned
field, not even the plan after a sequential stop (it records the windows it will not run in `plan_not_run`;
`windows_to_run` is the plan less those). `read_manifest` is the one reader the statistics and the dashboard use; it
upgrades version 1 (backend and design as bare names) at load time. Keys this code does not know are kept in `extra`
and written back, so reading and rewriting a manifest loses nothing. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from ttsrecords.records import AB_SCHEMA, LEGACY
from ttsrecords.runsettings import LOOK_LOG
from ttsrecords.windows import PlannedWindow, plan_from_list, plan_to_list, windows_to_run

AB_MANIFESTS = (AB_SCHEMA, *LEGACY[AB_SCHEMA])
SIMULATED_NAMES = ("sim", "simulated", "simulator")  # backend names a run folder may carry for the simulator
RUN_STATUSES = ("planned", "running", "complete", "interrupted", "failed")


class ManifestError(ValueError):
    """A manifest.json this code cannot read: one line naming the cause."""


@dataclass
class RunLog:
    """What the runner records while the run goes on; the planner writes none of it (status starts as "planned")."""

    status: str = "planned"  # RUN_STATUSES
    reason: str | None = None  # why the run failed (status "failed")
    ended: str | None = None  # UTC, when the runner stopped
    telemetry: dict[str, Any] | None = None  # which telemetry the run could read (NVML, process, host)
    cpu: dict[str, Any] | None = None  # the CPU plan: server CPUs, governors, the load generator's affinity
    preparation: dict[str, Any] | None = None  # images and model made before the first start: {ok, steps}
    reruns: list[dict[str, Any]] = field(default_factory=list)  # {round, attempt, because}: a round run again
    switches: list[dict[str, Any]] = field(default_factory=list)  # every hot swap, from the starts' records
    plan_not_run: list[PlannedWindow] = field(default_factory=list)  # after a sequential stop: the windows left out
    sequential_looks: dict[str, Any] | None = None  # {looks, look_errors, ignored_stops, stopped}
    resumed: list[str] = field(default_factory=list)  # UTC of every resume (make ab RESUME=<run>)
    present: frozenset[str] = frozenset({"status"})  # the keys the file has (a rewrite keeps exactly those)

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            if f.name == "present":
                continue
            key = LOOK_LOG if f.name == "sequential_looks" else f.name
            v = getattr(self, f.name)
            if key in self.present or v not in (None, [], {}):
                out[key] = plan_to_list(v) if f.name == "plan_not_run" else v
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunLog:
        kw = {f.name: d[LOOK_LOG if f.name == "sequential_looks" else f.name] for f in fields(cls)
              if f.name != "present" and (LOOK_LOG if f.name == "sequential_looks" else f.name) in d}
        kw["plan_not_run"] = plan_from_list(kw.get("plan_not_run"))
        for k in ("reruns", "switches", "resumed"):
            kw[k] = list(kw.get(k) or [])
        kw["status"] = kw.get("status") or "planned"
        return cls(**kw, present=frozenset(k for k in RUNNER_KEYS if k in d) | {"status"})


RUNNER_KEYS = tuple(LOOK_LOG if f.name == "sequential_looks" else f.name for f in fields(RunLog) if f.name != "present")


@dataclass(frozen=True)
class RunManifest:
    """What the planner fixed before the run: the experiment and its arms, the design (with the sequential rule),
    the pre-registered analysis, the settings, provenance, and the plan as typed windows."""

    schema: str
    run_id: str
    created: str | None = None
    started: str | None = None
    experiment: dict[str, Any] | None = None  # path, name, idea, sha256, shorthand, primary_metric, simulated, ...
    arms: dict[str, Any] | None = None  # per side: what the arm runs (loadtest.evidence.arm_manifest)
    variants: dict[str, Any] | None = None  # {"A": variant, "B": variant}
    labels: dict[str, Any] | None = None
    confounded: Any = None  # why the arms differ in more than the variant, or None
    length_warning: str | None = None
    backend: dict[str, Any] = field(default_factory=dict)  # name, simulated, version, image digests
    design: dict[str, Any] = field(default_factory=dict)  # name, rounds, aa_rounds, seed, sequential, ...
    seeds: dict[str, Any] | None = None
    scenario: dict[str, Any] | None = None  # path, sha256, effective_sha256
    sim_config: dict[str, Any] | None = None
    sim_profiles: Any = None  # the simulator profiles copied into the run folder, with their sha256
    settings: dict[str, Any] = field(default_factory=dict)
    analysis: dict[str, Any] | None = None  # the pre-registered margin, confidence, primary metric
    plan: tuple[PlannedWindow, ...] = ()
    starts: list[dict[str, Any]] | None = None  # the planned server starts (windows_of.starts_of)
    resume_policy: dict[str, Any] | None = None
    command: list[str] | None = None
    git_revision: str | None = None
    code_fingerprint: str | None = None
    host: dict[str, Any] | None = None  # the environment: python, packages, GPUs, images
    log: RunLog = field(default_factory=RunLog)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this code does not know, kept as they were
    nulls: frozenset[str] = frozenset()  # planned keys the file holds as null (a rewrite keeps them)

    @property
    def backend_name(self) -> str | None:
        return self.backend.get("name")

    @property
    def simulated(self) -> bool:
        return bool(self.backend.get("simulated")) or self.backend_name in SIMULATED_NAMES

    @property
    def design_name(self) -> str:
        return self.design.get("name") or "fresh"

    @property
    def windows_to_run(self) -> list[PlannedWindow]:
        """The plan less what a sequential stop left out (windows.windows_to_run)."""
        return windows_to_run(list(self.plan), self.log.plan_not_run)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name in ("log", "extra", "nulls"):
                continue
            v = getattr(self, f.name)
            if f.name == "plan":
                v = plan_to_list(list(v))
            if v is not None or f.name in ("schema", "run_id") or f.name in self.nulls:
                out[f.name] = v
        return {**out, **self.log.to_dict(), **self.extra}

    @classmethod
    def from_dict(cls, d: Any, what: str = "manifest.json") -> RunManifest:
        if not isinstance(d, dict):
            raise ManifestError(f"{what}: not a JSON object ({type(d).__name__})")
        if d.get("schema") not in AB_MANIFESTS:
            raise ManifestError(f"{what}: schema {d.get('schema')!r} is not an A/B run's (known: "
                                f"{', '.join(AB_MANIFESTS)})")
        names = {f.name for f in fields(cls)} - {"log", "extra", "nulls"}
        kw = {k: d[k] for k in names if k in d and d[k] is not None}
        try:
            kw["plan"] = tuple(plan_from_list(d.get("plan")))
            log = RunLog.from_dict(d)
        except ValueError as e:
            raise ManifestError(f"{what}: {e}") from None
        for k, shape in (("backend", "name"), ("design", "name")):  # version 1: a bare name
            if k in kw and not isinstance(kw[k], dict):
                kw[k] = {shape: kw[k]}
        kw.setdefault("run_id", "")
        extra = {k: v for k, v in d.items() if k not in names and k not in RUNNER_KEYS}
        return cls(**kw, log=log, extra=extra, nulls=frozenset(k for k in names if k in d and d[k] is None))


def read_manifest(d: Any, what: str = "manifest.json") -> RunManifest:
    """An A/B run's manifest, typed (version 1 upgraded); ManifestError (one line) when it cannot be read."""
    return RunManifest.from_dict(d, what)

"""The scenario file format (`tts-scenario/1`, configs/scenarios/*.yaml): load steps and phase lengths.

`parse_scenario` validates a loaded document with errors that name the field; `Scenario.to_document` writes one that
parses back to the same scenario (the run's and each window's scenario.yaml); `to_dict` / `from_dict` carry a parsed
scenario between processes (the Locust master sends it to its workers). Standard library only: reading the YAML text
is the load side's job (loadtest.scenario).

A level runs count -> warmup -> measure -> drain (records.PHASES). `phases.count_s` (default 0: none) is the count
phase: the sync observer on, nothing timed; it runs only where the server has a control file (the A/B runner's
servers), and it is set for every level at once (phases only), so every window switches and counts at each level.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ttsrecords.records import MODES, SCENARIO_SCHEMA

LOOPS = ("closed", "open")
_TOP_KEYS = {"schema", "name", "description", "mode", "loop", "seed", "prompts", "voice", "mix", "timeout_s",
             "spawn_rate", "language", "phases", "steps"}
_PHASE_KEYS = {"warmup_s", "measure_s", "drain_s"}
_DEFAULT_KEYS = _PHASE_KEYS | {"count_s"}  # count_s: in `phases` only (the same count phase at every level)
_STEP_KEYS = _PHASE_KEYS | {"concurrency", "rate", "users"}


class ScenarioError(ValueError):
    """A scenario file is unusable; the message names the file and the field."""


@dataclass(frozen=True)
class Step:
    index: int
    concurrency: int  # closed loop: users; open loop: cap on in-flight requests per worker process
    warmup_s: float
    measure_s: float
    drain_s: float
    rate: float | None = None  # open loop: Poisson arrivals per second (all workers together)
    users: int | None = None  # open loop: arrival generators (default min(concurrency, 32))
    count_s: float = 0.0  # count phase before the warm-up (observer on, not timed); 0: none

    @property
    def duration_s(self) -> float:
        return self.count_s + self.warmup_s + self.measure_s + self.drain_s


@dataclass(frozen=True)
class Scenario:
    name: str
    path: str
    sha256: str
    mode: str
    loop: str
    seed: int
    prompts: str
    voice: str
    mix: dict[str, float]
    timeout_s: float
    spawn_rate: float
    language: str
    steps: tuple[Step, ...]

    @property
    def duration_s(self) -> float:
        return sum(s.duration_s for s in self.steps)

    def request_limit_s(self, override: float | None = None) -> float:
        """One request's time limit: `--request-timeout` when given, else the scenario's timeout_s. The load
        generator's client, its phase holds and the runner's watchdog all bound by it, so they agree."""
        return override or self.timeout_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps"] = [asdict(s) for s in self.steps]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Scenario:
        """The scenario `to_dict` wrote (master -> workers)."""
        return cls(**{**d, "steps": tuple(Step(**s) for s in d["steps"]), "mix": dict(d["mix"])})

    def to_document(self) -> dict[str, Any]:
        """The scenario as a file document: `parse_scenario` reads it back to this scenario (path and sha256 are the
        file's). The count phase is one setting for every level (phases.count_s), as the format has it."""
        steps = []
        for s in self.steps:
            d = {"concurrency": s.concurrency, "warmup_s": s.warmup_s, "measure_s": s.measure_s, "drain_s": s.drain_s}
            if self.loop == "open":
                d.update(rate=s.rate, users=s.users)
            steps.append(d)
        return {"schema": SCENARIO_SCHEMA, "name": self.name, "mode": self.mode, "loop": self.loop, "seed": self.seed,
                "prompts": self.prompts, "voice": self.voice, "mix": dict(self.mix), "timeout_s": self.timeout_s,
                "spawn_rate": self.spawn_rate, "language": self.language,
                "phases": {"count_s": self.steps[0].count_s if self.steps else 0.0}, "steps": steps}


def _number(where: str, value: Any, *, minimum: float = 0.0, allow_equal: bool = True) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ScenarioError(f"{where} must be a number, got {value!r}")
    if not math.isfinite(value):  # YAML's .nan / .inf: an unbounded timeout or phase is never meant
        raise ScenarioError(f"{where} must be a finite number, got {value!r}")
    if value < minimum or (not allow_equal and value == minimum):
        op = ">=" if allow_equal else ">"
        raise ScenarioError(f"{where} must be {op} {minimum}, got {value!r}")
    return float(value)


def _int(where: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ScenarioError(f"{where} must be an integer, got {value!r}")
    if value < minimum:
        raise ScenarioError(f"{where} must be >= {minimum}, got {value!r}")
    return value


def _unknown(where: str, got: dict, allowed: set[str]) -> None:
    extra = sorted(set(got) - allowed)
    if extra:
        raise ScenarioError(f"{where}: unknown key(s) {extra}; allowed: {sorted(allowed)}")


def parse_scenario(data: Any, *, path: str = "<scenario>", sha256: str = "", base: Path | None = None) -> Scenario:
    """Validate a loaded YAML document. Relative prompt/voice paths are resolved against the repo root (cwd)."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    _unknown(path, data, _TOP_KEYS)
    if data.get("schema", SCENARIO_SCHEMA) != SCENARIO_SCHEMA:
        raise ScenarioError(f"{path}: schema must be {SCENARIO_SCHEMA!r}, got {data.get('schema')!r}")
    mode = data.get("mode", "stream")
    if mode not in MODES:
        raise ScenarioError(f"{path}: mode must be one of {MODES}, got {mode!r}")
    loop = data.get("loop", "closed")
    if loop not in LOOPS:
        raise ScenarioError(f"{path}: loop must be one of {LOOPS}, got {loop!r}")
    seed = _int(f"{path}: seed", data.get("seed", 0), minimum=0)
    mix_raw = data.get("mix", {"short": 1, "medium": 1, "long": 1})
    if not isinstance(mix_raw, dict) or not mix_raw:
        raise ScenarioError(f"{path}: mix must be a mapping bucket -> weight, got {mix_raw!r}")
    mix = {str(k): _number(f"{path}: mix.{k}", v) for k, v in mix_raw.items()}
    if sum(mix.values()) <= 0:
        raise ScenarioError(f"{path}: mix weights must not all be zero")
    defaults = data.get("phases", {})
    if not isinstance(defaults, dict):
        raise ScenarioError(f"{path}: phases must be a mapping with {sorted(_PHASE_KEYS)}")
    _unknown(f"{path}: phases", defaults, _DEFAULT_KEYS)
    count_s = _number(f"{path}: phases.count_s", defaults.get("count_s", 0))
    steps_raw = data.get("steps")
    if not isinstance(steps_raw, list) or not steps_raw:
        raise ScenarioError(f"{path}: steps must be a non-empty list like [{{concurrency: 8}}, {{concurrency: 16}}]")
    steps = []
    for i, raw in enumerate(steps_raw):
        where = f"{path}: steps[{i}]"
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = {"concurrency": raw}
        if not isinstance(raw, dict):
            raise ScenarioError(f"{where} must be a mapping or an integer concurrency, got {raw!r}")
        _unknown(where, raw, _STEP_KEYS)
        if "concurrency" not in raw:
            raise ScenarioError(f"{where}: concurrency is required")
        conc = _int(f"{where}.concurrency", raw["concurrency"])
        phase = {}
        for key in ("warmup_s", "measure_s", "drain_s"):
            if key not in raw and key not in defaults:
                raise ScenarioError(f"{where}: {key} missing (set it in the step or in phases)")
            phase[key] = _number(f"{where}.{key}", raw.get(key, defaults.get(key)))
        if phase["measure_s"] <= 0:
            raise ScenarioError(f"{where}.measure_s must be > 0")
        rate = users = None
        if loop == "open":
            if "rate" not in raw:
                raise ScenarioError(f"{where}: rate (requests per second) is required when loop is open")
            rate = _number(f"{where}.rate", raw["rate"], allow_equal=False)
            users = _int(f"{where}.users", raw.get("users", min(conc, 32)))
        elif "rate" in raw or "users" in raw:
            raise ScenarioError(f"{where}: rate/users only apply when loop is open")
        if count_s > 0 and phase["warmup_s"] <= 0:  # the observer switches off at the next step, inside the warm-up
            raise ScenarioError(f"{where}.warmup_s must be > 0 after a count phase (phases.count_s): the observer "
                                "switches off at the server's next step, which must fall before the measure phase")
        steps.append(Step(index=i, concurrency=conc, rate=rate, users=users, count_s=count_s, **phase))
    spawn_rate = _number(f"{path}: spawn_rate", data.get("spawn_rate", 10000), allow_equal=False)
    timeout_s = _number(f"{path}: timeout_s", data.get("timeout_s", 600), allow_equal=False)
    prompts = str(data.get("prompts", "configs/prompts/en.yaml"))
    voice = str(data.get("voice", "configs/voices/ref.yaml"))
    return Scenario(
        name=str(data.get("name", Path(path).stem)),
        path=path,
        sha256=sha256,
        mode=mode,
        loop=loop,
        seed=seed,
        prompts=prompts,
        voice=voice,
        mix=mix,
        timeout_s=timeout_s,
        spawn_rate=spawn_rate,
        language=str(data.get("language", "English")),
        steps=tuple(steps),
    )

"""Scenario files (configs/scenarios/*.yaml): load steps and phase lengths, validated with errors that name the field.

A level runs count -> warmup -> measure -> drain (ttsrecords.records.PHASES). `phases.count_s` (default 0: none) is the
count phase: the sync observer on, nothing timed; it runs only where the server has a control file (the A/B runner's
servers), and it is set for every level at once (phases only), so every window switches and counts at each level.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

SCENARIO_SCHEMA = "tts-scenario/1"
LOOPS = ("closed", "open")
MODES = ("stream", "wav")
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


def scenario_from_dict(d: dict[str, Any]) -> Scenario:
    """Rebuild a Scenario sent over the wire (master -> workers) by Scenario.to_dict()."""
    steps = tuple(Step(**s) for s in d["steps"])
    return Scenario(**{**d, "steps": steps, "mix": dict(d["mix"])})


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
    if levels:
        data["steps"] = [{"concurrency": c} for c in levels]
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

    A level keeps its own count, warm-up and measure lengths; the drain belongs to the POSITION (the drain of the run's
    i-th step goes to the window's i-th step), so the last level of every window has the run's last drain, whatever
    level that is (requests still running when Locust stops are never recorded). settle_s lengthens the first
    warm-up (after a hot-swap switch). count False: no count phase (an arm without the plugin has no control file)."""
    steps = run_scenario.steps
    doc_steps = []
    for pos, idx in enumerate(order):
        s = steps[idx]
        d = {"concurrency": s.concurrency, "warmup_s": s.warmup_s + (settle_s if pos == 0 else 0.0),
             "measure_s": s.measure_s, "drain_s": steps[pos].drain_s}
        if run_scenario.loop == "open":
            d.update(rate=s.rate, users=s.users)
        doc_steps.append(d)
    count_s = steps[0].count_s if count else 0.0
    doc = {"schema": "tts-scenario/1", "name": run_scenario.name, "mode": run_scenario.mode,
           "loop": run_scenario.loop, "seed": run_scenario.seed, "prompts": run_scenario.prompts,
           "voice": run_scenario.voice, "mix": run_scenario.mix, "timeout_s": run_scenario.timeout_s,
           "spawn_rate": run_scenario.spawn_rate, "language": run_scenario.language,
           "phases": {"count_s": count_s}, "steps": doc_steps}
    head = (f"# window {block_id}: the run's scenario with the levels in this window's seeded order, the drain by "
            f"position{f', {settle_s:g} s settle after a switch' if settle_s else ''}"
            f"{'' if count else ', no count phase (no control file)'}\n")
    out.write_text(head + yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    load_scenario(str(out))
    return out


def window_seconds(scenario: Scenario, count: bool = True) -> float:
    """Length of one window's load: every level's count, warm-up, measure and drain."""
    return sum((s.count_s if count else 0.0) + s.warmup_s + s.measure_s + s.drain_s for s in scenario.steps)

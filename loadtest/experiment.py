"""Experiment files: one idea per file, two or more named arms, each arm a complete server spec.

`python -m loadtest.experiment configs/experiments/X.yaml [--dry-run] [--simulate] [--port 8091]` validates the file
and, with --dry-run, prints every command of every arm (image pull/build, model fetch, run on 127.0.0.1, health wait,
graceful stop, removal) without running any. A bad file is one line on stderr naming the file and the key, exit 2.

This module is the format: the arms' types, the file's validation and the experiments derived from one (no side
effects). The A/B runner calls:
  load_experiment(path) -> Experiment             validated; raises ExperimentError (one line)
  mission(a, b) -> Experiment                      today's `make ab A=... B=...`: the mission file, variants replaced
  simulated(exp) / on_cpu(exp, executor)           every arm on the simulator (labelled simulated) / on this CPU
How an arm's server is prepared and started is loadtest.launch; what proves and records what an arm ran (evidence,
manifest, audio length) is loadtest.evidence.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tts_predictor.domain import DEFAULT_VARIANT, MODEL_NAME, VARIANT_NAMES
from ttsrecords import cpuserver
from ttsrecords.paths import ROOT

SCHEMA = "tts-experiment/1"
MISSION = "configs/experiments/mission-016-original-vs-fixed.yaml"
# vllm-omni releases the suite has images for (docker/serve.sh SUPPORTED); the plugin exists for the first only.
PLUGIN_VERSION = "0.16.0"
UPSTREAM_VERSIONS = ("0.30.0", "0.32.0rc1")
SUPPORTED_VERSIONS = (PLUGIN_VERSION, *UPSTREAM_VERSIONS)
FILE_BACKENDS = ("vllm", "sim")  # what an experiment file's arm may name
CPU_BACKEND = "vllm-cpu"  # the real 0.16.0 server on this CPU with a tiny random model (cpu_server/serve.py)
BACKENDS = (*FILE_BACKENDS, CPU_BACKEND)  # what a run may put its arms on (--backend)
CPU_WHAT = "real vllm-omni 0.16.0 server on CPU (tiny random model: the pipeline is real, the timings are not a GPU's)"
CPU_SCENARIO = "configs/scenarios/cpu.yaml"  # levels a 2-core CPU server can hold (the default of its runs)
# The CPU arms' simulator stand-in (what loadtest.window_fit predicts their request lengths from): the profile fitted
# to the CPU server (with the stock mp executor), every request 63 frames as the CPU stage file makes them; for uni
# every step 62 % longer, which puts the stand-in's means at 7.06 s (c=1) and 7.73 s (c=2) against the 6.99 s and
# 7.80 s measured with uni on 2026-12-07 (docs/real-cpu-server.md, "Executor"; tests/test_cpu_settings.py).
CPU_SIM = "configs/sim/cpu-tiny.yaml"
_CPU_FRAMES = ("audio.min_frames=63", "audio.default_max_new_tokens=63")
CPU_SIM_SETS = {"mp": _CPU_FRAMES, "uni": (*_CPU_FRAMES, "model.extra_step_pct=62")}
# How long a start may take to answer /health: the runner's and preflight's wait (loadtest.launch passes the first
# two on, to serve.py as --health-timeout-s and to docker/serve.sh as HEALTH_TIMEOUT_S)
CPU_HEALTH_TIMEOUT_S = cpuserver.HEALTH_TIMEOUT_S  # serve.py's wait for /health, and the runner's
HEALTH_TIMEOUT_S = 1200  # first start of a block: model load + torch.compile + CUDA graphs (image and model are ready)
SIM_READY_S = 120.0  # the simulator's own start (torch import, a busy box) on top of its modelled model.startup_s
REVISION_PATTERN = re.compile(r"[0-9a-f]{40}")  # a full commit: what MODEL_REVISION must be
_IMAGE = re.compile(r"[a-z0-9][a-z0-9._/-]*:[A-Za-z0-9._-]+(@sha256:[0-9a-f]{64})?")
_DEPLOY = re.compile(r"[A-Za-z0-9_.-]+\.yaml")
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class ExperimentError(ValueError):
    """A bad experiment file: the message is one line, `file: key: problem`."""


@dataclass(frozen=True)
class Evidence:
    """What proves an arm was live. Every listed item must hold, and at least one positive item is required."""

    sync_signature: str | None = None  # the plugin's sync counters equal this variant's closed form (0.16.0, sim)
    log_present: tuple[str, ...] = ()  # regexes, each must match the server log
    log_absent: tuple[str, ...] = ()  # regexes, none may match the server log
    metric_present: tuple[str, ...] = ()  # sample names that must be exposed with a value > 0


@dataclass(frozen=True)
class SimSpec:
    """How the simulator stands in for an arm (`--set section.key=value` overrides of ttssim)."""

    variant: str = DEFAULT_VARIANT
    config: str | None = None
    set: tuple[str, ...] = ()


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    backend: str
    vllm_omni: str | None = None
    base_image: str | None = None
    variant: str | None = None  # 0.16.0 only (the plugin)
    stages: str | None = None  # 0.16.0: a file of configs/stages/
    deploy: str | None = None  # >= 0.30.0: a deploy file name (stock, or ours under configs/stages/deploy/<version>/)
    server_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    evidence: Evidence = field(default_factory=Evidence)
    sim: SimSpec | None = None
    simulated_from: str | None = None  # set by simulated(): what this simulator arm stands in for
    host_delay_us: float = 0.0  # positive control: the plugin's extra host delay per build_attn_metadata call
    executor: str | None = None  # CPU server only: vLLM's executor in every stage (ttsrecords.cpuserver; None: its default)

    @property
    def image(self) -> str | None:
        """The image docker/serve.sh builds for this arm (its IMAGE default)."""
        if self.backend != "vllm":
            return None
        return f"tts-vllm-omni:{self.vllm_omni}-{self.variant}" if self.vllm_omni == PLUGIN_VERSION \
            else f"tts-vllm-omni:{self.vllm_omni}"


@dataclass(frozen=True)
class Experiment:
    path: str
    name: str
    idea: str
    scenario: str
    rounds: int
    aa_rounds: int
    seed: int
    primary_metric: str
    arms: dict[str, Arm]
    model: str = MODEL_NAME
    model_revision: str | None = None
    confounded: str | None = None  # arms on different releases: everything differs, the report must say so
    simulated: bool = False
    # the pre-registered analysis (`analysis:` and `design:` of the file; None: the command line's or the default)
    margin_pct: float | None = None
    confidence: float | None = None
    until_decided: bool = False
    min_rounds: int | None = None
    max_rounds: int | None = None
    request: str = "base"  # loadtest.prompts.REQUEST_KINDS: what every request of the run is (preflight's fallback)

    @property
    def backends(self) -> set[str]:
        return {a.backend for a in self.arms.values()}



# ----------------------------------------------------------------------------------------------- loading


class _Reader:
    """Typed access to one mapping of the file, with errors that name the file and the full key."""

    def __init__(self, path: str, data: Any, where: str = ""):
        self.path, self.where = path, where
        if not isinstance(data, dict):
            self.fail(f"must be a mapping, got {type(data).__name__}")
        self.data = data

    def fail(self, msg: str):
        raise ExperimentError(f"{self.path}: {self.where or '(top level)'}: {msg}")

    def key(self, k: str) -> str:
        return f"{self.where}.{k}" if self.where else k

    def only(self, allowed: set[str]) -> None:
        unknown = sorted(set(self.data) - allowed)
        if unknown:
            raise ExperimentError(f"{self.path}: {self.key(unknown[0])}: unknown key (allowed: {sorted(allowed)})")

    def get(self, k: str, types: tuple, required: bool = False, default: Any = None) -> Any:
        if k not in self.data or self.data[k] is None:
            if required:
                raise ExperimentError(f"{self.path}: {self.key(k)}: missing")
            return default
        v = self.data[k]
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            raise ExperimentError(f"{self.path}: {self.key(k)}: want {'/'.join(t.__name__ for t in types)}, "
                                  f"got {v!r}")
        return v

    def sub(self, k: str, required: bool = False) -> _Reader | None:
        if k not in self.data or self.data[k] is None:
            if required:
                raise ExperimentError(f"{self.path}: {self.key(k)}: missing")
            return None
        return _Reader(self.path, self.data[k], self.key(k))

    def strings(self, k: str) -> tuple[str, ...]:
        v = self.get(k, (list,), default=[])
        for i, item in enumerate(v):
            if not isinstance(item, (str, int, float)) or isinstance(item, bool):
                raise ExperimentError(f"{self.path}: {self.key(k)}[{i}]: want a string, got {item!r}")
        return tuple(str(x) for x in v)


def _regexes(r: _Reader, k: str) -> tuple[str, ...]:
    out = r.strings(k)
    for i, pattern in enumerate(out):
        try:
            re.compile(pattern)
        except re.error as e:
            raise ExperimentError(f"{r.path}: {r.key(k)}[{i}]: not a regular expression ({e})") from None
    return out


def _evidence(r: _Reader | None, arm_where: str, path: str) -> Evidence:
    if r is None:
        raise ExperimentError(f"{path}: {arm_where}.evidence: missing (what proves this arm was live?)")
    r.only({"sync_signature", "log_present", "log_absent", "metric_present"})
    sig = r.get("sync_signature", (str,))
    if sig is not None and sig not in VARIANT_NAMES:
        r.fail(f"sync_signature {sig!r} is not one of {list(VARIANT_NAMES)}")
    ev = Evidence(sig, _regexes(r, "log_present"), _regexes(r, "log_absent"), r.strings("metric_present"))
    if not (ev.sync_signature or ev.log_present or ev.metric_present):
        r.fail("no positive evidence: give sync_signature, log_present or metric_present "
               "(log_absent alone proves nothing: an empty log has no line of any kind)")
    return ev


def _sim_spec(r: _Reader | None) -> SimSpec | None:
    if r is None:
        return None
    r.only({"variant", "config", "set"})
    variant = r.get("variant", (str,), default=DEFAULT_VARIANT)
    if variant not in VARIANT_NAMES:
        r.fail(f"variant {variant!r} is not one of {list(VARIANT_NAMES)}")
    config = r.get("config", (str,))
    sets = r.strings("set")
    from ttssim.config import load_config  # plain YAML + dataclasses, no torch

    if config is not None and not (ROOT / config).is_file():
        raise ExperimentError(f"{r.path}: {r.key('config')}: no such file {config}")
    try:
        load_config(ROOT / config if config else None, list(sets))
    except (ValueError, OSError) as e:
        raise ExperimentError(f"{r.path}: {r.key('set')}: {e}") from None
    return SimSpec(variant, config, sets)


def _arm(path: str, name: str, r: _Reader) -> Arm:
    r.only({"label", "backend", "vllm_omni", "base_image", "variant", "stages", "deploy", "server_args", "env",
            "evidence", "sim"})
    backend = r.get("backend", (str,), required=True)
    if backend not in FILE_BACKENDS:
        r.fail(f"backend {backend!r} is not one of {list(FILE_BACKENDS)}")
    label = r.get("label", (str,), default=name)
    env_r = r.sub("env")
    env: list[tuple[str, str]] = []
    if env_r is not None:
        for k, v in env_r.data.items():
            if not isinstance(k, str) or not _ENV_KEY.fullmatch(k):
                raise ExperimentError(f"{path}: {env_r.key(str(k))}: not an environment variable name")
            if isinstance(v, (dict, list)) or v is None:
                raise ExperimentError(f"{path}: {env_r.key(k)}: want a scalar value, got {v!r}")
            env.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
    evidence = _evidence(r.sub("evidence"), r.where, path)
    sim = _sim_spec(r.sub("sim"))
    if backend == "sim":
        for k in ("vllm_omni", "base_image", "variant", "stages", "deploy", "server_args", "env"):
            if r.data.get(k) not in (None, [], {}):
                raise ExperimentError(f"{path}: {r.key(k)}: a sim arm takes its settings from `sim:` only")
        if sim is None:
            r.fail("a sim arm needs `sim:` (variant, config, set)")
        return Arm(name, label, "sim", variant=sim.variant, evidence=evidence, sim=sim)

    version = str(r.get("vllm_omni", (str, float), required=True))
    if version not in SUPPORTED_VERSIONS:
        raise ExperimentError(f"{path}: {r.key('vllm_omni')}: {version} has no image here "
                              f"(supported: {list(SUPPORTED_VERSIONS)})")
    base_image = r.get("base_image", (str,), required=True)
    if not _IMAGE.fullmatch(base_image) or base_image.endswith(":latest"):
        raise ExperimentError(f"{path}: {r.key('base_image')}: want a pinned repo:tag[@sha256:digest], "
                              f"got {base_image!r}")
    tag = base_image.split("@")[0].rsplit(":", 1)[1]
    if tag.lstrip("v") != version:
        raise ExperimentError(f"{path}: {r.key('base_image')}: tag {tag} does not match vllm_omni {version}")
    server_args = r.strings("server_args")
    for i, a in enumerate(server_args):
        if a.split("=")[0] in ("--host", "--port", "--stage-configs-path", "--deploy-config", "--served-model-name",
                               "--revision", "--tokenizer-revision", "--stage-init-timeout", "--init-timeout"):
            raise ExperimentError(f"{path}: {r.key('server_args')}[{i}]: {a} is set by docker/serve.sh; "
                                  "use the arm's own key (stages/deploy) or the experiment's model")
    if version == PLUGIN_VERSION:
        variant = r.get("variant", (str,), default=DEFAULT_VARIANT)
        if variant not in VARIANT_NAMES:
            r.fail(f"variant {variant!r} is not one of {list(VARIANT_NAMES)}")
        stages = r.get("stages", (str,), required=True)
        if not (ROOT / "configs/stages" / stages).is_file() or "/" in stages:
            raise ExperimentError(f"{path}: {r.key('stages')}: no such file in configs/stages/: {stages}")
        if r.data.get("deploy") is not None:
            raise ExperimentError(f"{path}: {r.key('deploy')}: vllm-omni 0.16.0 has no deploy files (use stages)")
        if evidence.sync_signature not in (None, variant):
            raise ExperimentError(f"{path}: {r.key('evidence.sync_signature')}: {evidence.sync_signature} "
                                  f"but the arm runs variant {variant}")
        return Arm(name, label, "vllm", version, base_image, variant, stages, None, server_args, tuple(env),
                   evidence, sim)
    for k in ("variant", "stages"):
        if r.data.get(k) is not None:
            raise ExperimentError(f"{path}: {r.key(k)}: only vllm-omni {PLUGIN_VERSION} has the plugin and stage "
                                  f"configs; {version} has nothing to patch (use deploy)")
    if evidence.sync_signature is not None:
        raise ExperimentError(f"{path}: {r.key('evidence.sync_signature')}: vllm-omni {version} runs no plugin, "
                              "so there are no sync counters; use log_present/metric_present")
    deploy = r.get("deploy", (str,), default="qwen3_tts.yaml")
    if not _DEPLOY.fullmatch(deploy):
        raise ExperimentError(f"{path}: {r.key('deploy')}: want a deploy file name, got {deploy!r}")
    if deploy.startswith("tts_loadtest_") and not (ROOT / "configs/stages/deploy" / version / deploy).is_file():
        raise ExperimentError(f"{path}: {r.key('deploy')}: no such overlay configs/stages/deploy/{version}/{deploy}")
    return Arm(name, label, "vllm", version, base_image, None, None, deploy, server_args, tuple(env), evidence, sim)


def load_experiment(path: str | Path) -> Experiment:
    """Read and validate an experiment file; every problem is an ExperimentError naming the file and the key.
    Long on purpose: one pass over the top-level keys in the file's order, each rule beside the key it checks."""
    p = str(path)
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ExperimentError(f"{p}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(top level)"
        raise ExperimentError(f"{p}: {where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    r = _Reader(p, data)
    r.only({"schema", "name", "idea", "scenario", "design", "primary_metric", "model", "confounded", "arms",
            "analysis", "request"})
    if r.get("schema", (str,), required=True) != SCHEMA:
        r.fail(f"schema must be {SCHEMA!r}")
    name = r.get("name", (str,), required=True)
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        raise ExperimentError(f"{p}: name: want lower-case letters, digits, . _ -, got {name!r}")
    idea = r.get("idea", (str,), required=True).strip()
    scenario = r.get("scenario", (str,), required=True)
    from loadtest.scenario import load_scenario
    from ttsrecords.scenario import ScenarioError

    if not (ROOT / scenario).is_file():
        raise ExperimentError(f"{p}: scenario: no such file {scenario}")
    try:
        load_scenario(str(ROOT / scenario))
    except (ScenarioError, ValueError, OSError) as e:
        raise ExperimentError(f"{p}: scenario: {str(e).splitlines()[0]}") from None
    design = r.sub("design", required=True)
    design.only({"rounds", "aa_rounds", "seed", "until", "min_rounds", "max_rounds"})
    rounds = design.get("rounds", (int,), required=True)
    aa_rounds = design.get("aa_rounds", (int,), default=1)
    seed = design.get("seed", (int,), required=True)
    if rounds < 1 or aa_rounds < 0:
        design.fail("rounds must be >= 1 and aa_rounds >= 0")
    until = design.get("until", (str,))
    if until not in (None, "decided"):
        raise ExperimentError(f"{p}: design.until: the only rule is 'decided', got {until!r}")
    min_rounds, max_rounds = design.get("min_rounds", (int,)), design.get("max_rounds", (int,))
    if (min_rounds is not None or max_rounds is not None) and until is None:
        design.fail("min_rounds / max_rounds belong to until: decided")
    pre = r.sub("analysis")
    margin = confidence = None
    if pre is not None:
        pre.only({"margin_pct", "confidence"})
        margin, confidence = pre.get("margin_pct", (int, float)), pre.get("confidence", (int, float))
        from ttsrecords.runsettings import SettingsError, analysis

        try:
            analysis(margin, confidence)
        except SettingsError as e:
            raise ExperimentError(f"{p}: analysis: {e}") from None
    primary = r.get("primary_metric", (str,), required=True)
    from ttsrecords.measures import METRICS, VERDICT_METRICS

    if primary not in VERDICT_METRICS:
        raise ExperimentError(f"{p}: primary_metric: {primary!r} is not one of {list(VERDICT_METRICS)}"
                              + (" (it has no verdict)" if primary in METRICS else ""))
    model, revision = MODEL_NAME, None
    m = r.sub("model")
    if m is not None:
        m.only({"name", "revision"})
        model = m.get("name", (str,), default=MODEL_NAME)
        revision = m.get("revision", (str,))
        if revision is not None and not REVISION_PATTERN.fullmatch(revision):
            raise ExperimentError(f"{p}: model.revision: want the 40-hex commit of {model}, got {revision!r}")
    from loadtest.prompts import CUSTOM_VOICE_MODEL, REQUEST_KINDS

    request = r.get("request", (str,), default="base")
    if request not in REQUEST_KINDS:
        r.fail(f"request {request!r} is not one of {list(REQUEST_KINDS)}")
    if (request == "custom_voice") != (model == CUSTOM_VOICE_MODEL):
        raise ExperimentError(f"{p}: request: {request} with model {model}: custom_voice requests need "
                              f"model.name {CUSTOM_VOICE_MODEL} (built-in speakers), and that model serves no Base "
                              "request")
    arms_r = r.sub("arms", required=True)
    if len(arms_r.data) < 2:
        arms_r.fail("an experiment needs two or more arms")
    arms = {}
    for arm_name in arms_r.data:
        if not isinstance(arm_name, str) or not re.fullmatch(r"[A-Za-z0-9_-]+", arm_name):
            raise ExperimentError(f"{p}: arms.{arm_name}: want an arm name of letters, digits, _ -")
        arms[arm_name] = _arm(p, arm_name, arms_r.sub(arm_name, required=True))
    labels = [a.label for a in arms.values()]
    if len(set(labels)) != len(labels):
        arms_r.fail(f"arm labels must differ, got {labels}")
    confounded = r.get("confounded", (str,))
    versions = {a.vllm_omni for a in arms.values() if a.backend == "vllm"}
    if len(versions) > 1 and not confounded:
        raise ExperimentError(f"{p}: confounded: missing: arms run different vllm-omni releases "
                              f"({sorted(versions)}), so everything differs, not one function; say so in "
                              "`confounded:` (the report prints it)")
    if {a.backend for a in arms.values()} == {"vllm", "sim"}:
        arms_r.fail("mixes vllm and sim arms: a simulator is no control for a GPU server (use --simulate)")
    return Experiment(p, name, idea, scenario, rounds, aa_rounds, seed, primary, arms, model, revision,
                      confounded.strip() if confounded else None,
                      simulated=all(a.backend == "sim" for a in arms.values()), margin_pct=margin,
                      confidence=confidence, until_decided=until == "decided", min_rounds=min_rounds,
                      max_rounds=max_rounds,
                      request=request)


def mission(a: str = "original", b: str = "fixed", path: str | Path = ROOT / MISSION) -> Experiment:
    """`make ab A=... B=...`: the mission's experiment with its two arms' variants set to a and b."""
    exp = load_experiment(path)
    arms = {}
    for (name, arm), variant in zip(exp.arms.items(), (a, b), strict=True):
        if variant not in VARIANT_NAMES:
            raise ExperimentError(f"{exp.path}: arms.{name}.variant: {variant!r} is not one of {list(VARIANT_NAMES)}")
        ev = replace(arm.evidence, sync_signature=variant)
        sim = replace(arm.sim, variant=variant) if arm.sim else None
        arms[name] = replace(arm, label=variant, variant=variant, evidence=ev, sim=sim)
    if a == b:
        raise ExperimentError(f"{exp.path}: arms: A and B are both {a!r} (an A/A run is the design's aa_rounds)")
    if (a, b) == tuple(arm.variant for arm in exp.arms.values()):
        return replace(exp, arms=arms)
    # other variants than the file's: the report's title and idea say what ran, not the file's question
    return replace(exp, arms=arms, name=f"vllm-omni-016-{a}-vs-{b}",
                   idea=f"vllm-omni 0.16.0, build_attn_metadata {a} (A) against {b} (B) through the plugin, "
                        "nothing else changed")


def simulated(exp: Experiment) -> Experiment:
    """Every vllm arm replaced by its `sim:` stand-in, labelled simulated: the pipeline runs here, proves nothing
    about vllm-omni. The evidence becomes the simulator's sync signature of the stand-in's variant."""
    arms = {}
    for name, arm in exp.arms.items():
        if arm.backend == "sim":
            arms[name] = arm
            continue
        if arm.sim is None:
            raise ExperimentError(f"{exp.path}: arms.{name}.sim: missing: this arm cannot be simulated")
        what = f"vllm-omni {arm.vllm_omni} {arm.variant or arm.deploy}"
        arms[name] = Arm(name, arm.label, "sim", variant=arm.sim.variant, sim=arm.sim,
                         evidence=Evidence(sync_signature=arm.sim.variant), simulated_from=what)
    return replace(exp, arms=arms, simulated=True)


def on_cpu(exp: Experiment, executor: str | None = None) -> Experiment:
    """Every vllm-omni 0.16.0 arm moved to the real server on this CPU (cpu_server/serve.py, same variant, scenario
    CPU_SCENARIO); a sim arm stays, an arm of another release has no CPU server here (ExperimentError). The evidence
    keeps the plugin's sync signature and drops the log patterns, which name GPU attention backends (FLASH_ATTN).
    executor: every arm's (ttsrecords.cpuserver.EXECUTORS; None: serve.py's default, recorded as such). The
    simulator stand-in becomes CPU_SIM with CPU_SIM_SETS[executor] (a GPU profile says nothing about this server)."""
    executor = executor or cpuserver.DEFAULT_EXECUTOR
    cpuserver.check(executor)
    arms = {}
    for name, arm in exp.arms.items():
        if arm.backend == "sim":
            arms[name] = arm
            continue
        if arm.vllm_omni != PLUGIN_VERSION or arm.variant is None:
            raise ExperimentError(f"{exp.path}: arms.{name}: vllm-omni {arm.vllm_omni} has no CPU server here "
                                  f"(BACKEND={CPU_BACKEND} runs {PLUGIN_VERSION} with the plugin)")
        arms[name] = Arm(name, arm.label, CPU_BACKEND, vllm_omni=PLUGIN_VERSION, variant=arm.variant,
                         evidence=replace(arm.evidence, log_present=(), log_absent=()),
                         sim=SimSpec(arm.variant, CPU_SIM, CPU_SIM_SETS[executor]), executor=executor)
    return replace(exp, arms=arms, scenario=CPU_SCENARIO)


# ----------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    from loadtest.launch import dry_run  # launch builds on this module: imported when the command line runs

    p = argparse.ArgumentParser(prog="python -m loadtest.experiment", description=__doc__.splitlines()[0])
    p.add_argument("file", help="configs/experiments/<name>.yaml")
    p.add_argument("--dry-run", action="store_true", help="print every command of every arm, run none")
    p.add_argument("--simulate", action="store_true", help="every arm on the simulator (its sim: block)")
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--model-revision", default=None, help="default: the file's model.revision, then $MODEL_REVISION")
    args = p.parse_args(argv)
    try:
        exp = load_experiment(args.file)
        if args.simulate:
            exp = simulated(exp)
        if args.dry_run:
            sys.stdout.write(dry_run(exp, args.port, args.model_revision))
        else:
            kinds = ", ".join(f"{a.name}={a.label} ({a.backend}{' ' + a.vllm_omni if a.vllm_omni else ''})"
                              for a in exp.arms.values())
            print(f"{exp.path}: ok: {exp.name}: {kinds}{' [SIMULATED]' if exp.simulated else ''}")
    except ExperimentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # through the imported module: launch raises its ExperimentError, which main catches
    from loadtest import experiment

    sys.exit(experiment.main())

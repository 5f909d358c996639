"""Experiment files: one idea per file, two or more named arms, each arm a complete server spec.

`python -m loadtest.experiment configs/experiments/X.yaml [--dry-run] [--simulate] [--port 8091]` validates the file
and, with --dry-run, prints every command of every arm (image pull/build, model fetch, run on 127.0.0.1, health wait,
graceful stop, removal) without running any. A bad file is one line on stderr naming the file and the key, exit 2.

The A/B runner calls (the module has no other side effects):
  load_experiment(path) -> Experiment             validated; raises ExperimentError (one line)
  mission(a, b) -> Experiment                      today's `make ab A=... B=...`: the mission file, variants replaced
  simulated(exp) -> Experiment                     every arm on the simulator (its `sim:` block), labelled simulated
  images(exp, model_revision=None) -> [Command]    pull, build, fetch the model: run once before block 1, untimed
  server_launch(arm, port, ...) -> Launch          argv + env of one block's server, its health URL and stop budget
  check_evidence(arm, server_log_text, metrics_rows) -> (ok, reason)   the arm's manipulation check (pure)
  arm_manifest(arm) -> dict                        what the run manifest records about an arm (plugin or none, its
                                                   base image digest or a tag-only warning, its length control)
  length_control(arm) -> dict / length_warning(arms) -> str | None   what sets each request's audio length per arm
All docker commands are written in docker/serve.sh alone; an arm only chooses its environment and arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from tts_predictor.domain import DEFAULT_VARIANT, MODEL_NAME, VARIANT_NAMES
from tts_predictor.plugin import ENV_SKIP_SOURCE_CHECK
from ttsrecords import cpuserver
from ttsrecords.paths import ROOT
from ttsrecords.samples import total

SCHEMA = "tts-experiment/1"
SERVE_SH = "docker/serve.sh"
MISSION = "configs/experiments/mission-016-original-vs-fixed.yaml"
# vllm-omni releases the suite has images for (docker/serve.sh SUPPORTED); the plugin exists for the first only.
PLUGIN_VERSION = "0.16.0"
UPSTREAM_VERSIONS = ("0.30.0", "0.32.0rc1")
SUPPORTED_VERSIONS = (PLUGIN_VERSION, *UPSTREAM_VERSIONS)
FILE_BACKENDS = ("vllm", "sim")  # what an experiment file's arm may name
CPU_BACKEND = "vllm-cpu"  # the real 0.16.0 server on this CPU with a tiny random model (cpu_server/serve.py)
BACKENDS = (*FILE_BACKENDS, CPU_BACKEND)  # what a run may put its arms on (--backend)
CPU_SERVE = "cpu_server/serve.py"  # started as a process only (flags in, exit status out; ttsrecords/cpuserver.py)
CPU_WHAT = "real vllm-omni 0.16.0 server on CPU (tiny random model: the pipeline is real, the timings are not a GPU's)"
CPU_SCENARIO = "configs/scenarios/cpu.yaml"  # levels a 2-core CPU server can hold (the default of its runs)
# The CPU arms' simulator stand-in (what loadtest.window_fit predicts their request lengths from): the profile fitted
# to the CPU server (with the stock mp executor), every request 63 frames as the CPU stage file makes them; for uni
# every step 62 % longer, which puts the stand-in's means at 7.06 s (c=1) and 7.73 s (c=2) against the 6.99 s and
# 7.80 s measured with uni on 2026-12-07 (docs/real-cpu-server.md, "Executor"; tests/test_cpu_settings.py).
CPU_SIM = "configs/sim/cpu-tiny.yaml"
_CPU_FRAMES = ("audio.min_frames=63", "audio.default_max_new_tokens=63")
CPU_SIM_SETS = {"mp": _CPU_FRAMES, "uni": (*_CPU_FRAMES, "model.extra_step_pct=62")}
# what a run gives the CPU server, passed to serve.py as --stop-grace-s and --health-timeout-s (server_launch)
CPU_STOP_GRACE_S = 30  # SIGTERM to SIGKILL in cpu_server/serve.py
CPU_HEALTH_TIMEOUT_S = 900  # serve.py's wait for /health, and the runner's (venv and model are prepared before block 1)
HOST = "127.0.0.1"
STOP_GRACE_S = 30  # docker stop -t: vLLM's own shutdown; docker/serve.sh STOP_GRACE_S
CONTROL_FILE = "control.json"  # the control file's name in a start's folder (docker/serve.sh CONTROL_FILE default)
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


@dataclass(frozen=True)
class Command:
    """One preparation step (pull, build, fetch): run it with `env` added to the caller's environment."""

    what: str
    argv: list[str]
    env: dict[str, str]


@dataclass(frozen=True)
class Launch:
    """One block's server: start argv with env added; ready when health_url answers 200; stop with SIGTERM to the
    process group and allow stop_timeout_s before anything harder (serve.sh stops its container gracefully)."""

    arm: str
    argv: list[str]
    env: dict[str, str]
    health_url: str
    base_url: str
    stop_timeout_s: float
    simulated: bool


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
    """Read and validate an experiment file; every problem is an ExperimentError naming the file and the key."""
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


# ----------------------------------------------------------------------------------------------- commands


def _serve_env(arm: Arm, exp_model: str, revision: str | None, port: int) -> dict[str, str]:
    env = {"VLLM_OMNI": arm.vllm_omni or "", "BASE_IMAGE": arm.base_image or "", "PORT": str(port), "HOST": HOST,
           "MODEL": exp_model, "STOP_GRACE_S": str(STOP_GRACE_S), "HEALTH_TIMEOUT_S": str(HEALTH_TIMEOUT_S)}
    if arm.vllm_omni == PLUGIN_VERSION:
        env.update(VARIANT=arm.variant or DEFAULT_VARIANT, STAGES=arm.stages or "")
    else:
        env["DEPLOY"] = arm.deploy or "qwen3_tts.yaml"
    if revision:
        env["MODEL_REVISION"] = revision
    return env


def _serve_argv(arm: Arm, mode: str | None = None) -> list[str]:
    argv = ["bash", SERVE_SH] + ([mode] if mode else [])
    for k, v in arm.env:
        argv += ["--env", f"{k}={v}"]
    if arm.server_args and mode is None:
        argv += ["--", *arm.server_args]
    return argv


def _revision(exp: Experiment, model_revision: str | None) -> str | None:
    return model_revision or exp.model_revision or os.environ.get("MODEL_REVISION") or None


def images(exp: Experiment, model_revision: str | None = None) -> list[Command]:
    """What must exist before block 1 (outside every ready timeout): each base image pulled, each of our images
    built, the model fetched at the pinned revision. Empty for a simulated experiment."""
    cmds: list[Command] = []
    if any(a.backend == CPU_BACKEND for a in exp.arms.values()):
        cmds.append(Command("build the CPU server's venv and tiny model", [sys.executable, CPU_SERVE, "--prepare"],
                            {}))
    seen: set[str] = set()
    revision = _revision(exp, model_revision)
    first = None
    for arm in exp.arms.values():
        if arm.backend != "vllm" or arm.image in seen:
            continue
        seen.add(arm.image)
        first = first or arm
        env = _serve_env(arm, exp.model, revision, 8091)
        if arm.base_image not in {c.env.get("BASE_IMAGE") for c in cmds if c.what.startswith("pull")}:
            cmds.append(Command(f"pull {arm.base_image}", _serve_argv(arm, "--pull-only"), env))
        cmds.append(Command(f"build {arm.image}", _serve_argv(arm, "--build-only"), env))
    if first is not None:
        cmds.append(Command(f"fetch {exp.model}@{revision or '<MODEL_REVISION>'}",
                            _serve_argv(first, "--fetch-model"), _serve_env(first, exp.model, revision, 8091)))
    return cmds


def server_launch(exp: Experiment, arm: Arm, port: int, *, model_revision: str | None = None,
                  control_dir: str | None = None, port_file: str | None = None) -> Launch:
    """How to start this arm's server for one block on 127.0.0.1:port. The caller starts argv in its own process
    group with env added to its environment, waits for health_url, and stops it with SIGTERM + stop_timeout_s.
    control_dir: the folder holding the control file (CONTROL_FILE; the caller writes it first), for arms with the
    plugin and for the simulator."""
    base = f"http://{HOST}:{port}"
    if arm.backend == "sim":
        sim = arm.sim or SimSpec(arm.variant or DEFAULT_VARIANT)
        argv = [sys.executable, "-m", "ttssim", "--variant", sim.variant, "--host", HOST, "--port", str(port)]
        if sim.config:
            argv += ["--config", sim.config]
        for s in sim.set:
            argv += ["--set", s]
        if control_dir:  # the simulator reads the same control file as the plugin (docs/control.md)
            argv += ["--control", str(Path(control_dir) / CONTROL_FILE)]
        if port_file:
            argv += ["--port-file", port_file]
        return Launch(arm.name, argv, {}, base + "/health", base, 15.0, simulated=True)
    if arm.backend == CPU_BACKEND:
        argv = [sys.executable, CPU_SERVE, "--variant", arm.variant, "--host", HOST, "--port", str(port),
                "--health-timeout-s", str(CPU_HEALTH_TIMEOUT_S), "--stop-grace-s", str(CPU_STOP_GRACE_S)]
        if arm.executor:
            argv += ["--executor", arm.executor]
        if control_dir:
            argv += ["--control", str(Path(control_dir) / CONTROL_FILE)]
        return Launch(arm.name, argv, {}, base + "/health", base, CPU_STOP_GRACE_S + 30.0, simulated=False)
    env = _serve_env(arm, exp.model, _revision(exp, model_revision), port)
    if control_dir:
        if arm.vllm_omni != PLUGIN_VERSION:
            raise ExperimentError(f"{exp.path}: arms.{arm.name}: a control channel needs the plugin "
                                  f"(vllm-omni {PLUGIN_VERSION})")
        env["CONTROL_DIR"] = control_dir
    # serve.sh needs STOP_GRACE_S for docker stop plus a few seconds for docker rm and its own exit
    return Launch(arm.name, _serve_argv(arm), env, base + "/health", base, STOP_GRACE_S + 15.0, simulated=False)


def dry_run(exp: Experiment, port: int = 8091, model_revision: str | None = None, hot_swap: bool = False) -> str:
    """Every command of every arm, in the order a run would use them; nothing is started. hot_swap (designs swap and
    nested): each server start is the first arm's spec with a control file, the other arms run inside it."""
    out = [f"# experiment {exp.name} ({exp.path}): {exp.idea}",
           f"# scenario {exp.scenario}; design: {exp.aa_rounds} A/A + {exp.rounds} A/B rounds, seed {exp.seed}; "
           f"primary metric {exp.primary_metric}; requests: {exp.request} ({exp.model})"]
    if exp.simulated:
        out.append("# SIMULATED: every arm runs on ttssim (modelled timings), NOT on vllm-omni")
    if exp.confounded:
        out.append(f"# CONFOUNDED: {exp.confounded}")
    if length_warning(exp.arms):
        out.append(f"# WARNING: {length_warning(exp.arms)}")
    prep = images(exp, model_revision)
    if prep:
        out.append("## before block 1 (untimed): images and model")
        for c in prep:
            out.append(f"# {c.what}: {' '.join(f'{k}={shlex.quote(v)}' for k, v in c.env.items())} "
                       f"{shlex.join(c.argv)}")
    arms = list(exp.arms.values())
    if hot_swap:
        first = arms[0]
        out.append(f"## one server per start (hot swap): arm {first.name}'s spec with a control file in the start's "
                   "folder; every window writes its arm's variant there and the server switches at a step boundary")
        for arm in arms[1:]:
            out.append(f"## arm {arm.name} ({arm.label}): no server of its own, runs as variant "
                       f"{arm.variant or arm.sim and arm.sim.variant} inside arm {first.name}'s starts")
        arms = [first]
    for arm in arms:
        launch = server_launch(exp, arm, port, model_revision=model_revision)
        out.append(f"## arm {arm.name} ({arm.label}): " + (
            f"SIMULATED stand-in for {arm.simulated_from}" if arm.simulated_from else
            "SIMULATED (ttssim)" if arm.backend == "sim" else CPU_WHAT if arm.backend == CPU_BACKEND else
            f"vllm-omni {arm.vllm_omni}, image {arm.image} on {arm.base_image}"))
        out.append(f"# evidence: {_describe(arm.evidence)}")
        if pin_warning(arm):
            out.append(f"# WARNING: {pin_warning(arm)}")
        if arm.backend == CPU_BACKEND:
            proc = subprocess.run(launch.argv + ["--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
            out.append(proc.stdout.rstrip() or proc.stderr.strip())
            continue
        if arm.backend == "sim":
            argv = launch.argv + (["--control", f"<run>/starts/<n>/{CONTROL_FILE}"] if hot_swap else [])
            out.append(shlex.join(argv))
            out.append(f"# health: poll {launch.health_url}; stop: SIGTERM")
            continue
        env = {**os.environ, **launch.env}
        with tempfile.TemporaryDirectory(prefix="tts-dry-start-") as start_dir:
            if hot_swap:  # serve.sh checks the folder and its file; the runner writes them in starts/<n>/ first
                Path(start_dir, CONTROL_FILE).write_text("{}")
                env["CONTROL_DIR"] = start_dir
            proc = subprocess.run(launch.argv[:2] + ["--dry-run"] + launch.argv[2:], cwd=ROOT,
                                  env=env, capture_output=True, text=True, timeout=60)
            proc.stdout = proc.stdout.replace(start_dir, "<run>/starts/<n>")
        if proc.returncode != 0:
            raise ExperimentError(f"{exp.path}: arms.{arm.name}: docker/serve.sh refused: "
                                  f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
        out.append(proc.stdout.rstrip())
    return "\n".join(out) + "\n"


def _describe(ev: Evidence) -> str:
    parts = []
    if ev.sync_signature:
        parts.append(f"sync counters = {ev.sync_signature}'s closed form")
    parts += [f"log has /{p}/" for p in ev.log_present] + [f"log lacks /{p}/" for p in ev.log_absent]
    parts += [f"metric {m} > 0" for m in ev.metric_present]
    return "; ".join(parts)


def pinned_digest(base_image: str | None) -> str | None:
    """The sha256 digest a base image reference pins (`repo:tag@sha256:...`), None for a tag-only reference."""
    if not base_image or "@" not in base_image:
        return None
    return base_image.split("@", 1)[1]


def pin_warning(arm: Arm) -> str | None:
    """A tag can be re-pushed, so two runs of the same file may run different images; only a digest pins."""
    if arm.backend != "vllm" or pinned_digest(arm.base_image):
        return None
    return (f"arm {arm.name}: base image {arm.base_image} is pinned by tag only (a tag can be re-pushed); write "
            f"base_image: {arm.base_image}@sha256:<digest> (docs/gpu-host.md, \"Pinning the base images\")")


def local_digests(image: str, run=subprocess.run) -> list[str]:
    """The repository digests Docker holds for a pulled image (`docker image inspect .RepoDigests`); [] when Docker
    or the image is not there. What a tag-only arm actually ran, recorded next to the tag."""
    try:
        p = run(["docker", "image", "inspect", "--format", "{{json .RepoDigests}}", image], capture_output=True,
                text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if p.returncode != 0:
        return []
    try:
        found = json.loads(p.stdout or "[]") or []
    except ValueError:
        return []
    return sorted(d for d in found if isinstance(d, str) and "@sha256:" in d)


# docker/serve.sh says before each start whether the image's compile-cache folder held anything (warm) or not (cold)
_CACHE_LINE = re.compile(r"^serve\.sh: compile cache (cold|warm): ", re.M)


def compile_cache_state(server_log_text: str | None) -> str | None:
    """"cold" or "warm" for a start of docker/serve.sh (its server log), None when the log does not say."""
    m = _CACHE_LINE.search(server_log_text or "")
    return m.group(1) if m else None


def arm_manifest(arm: Arm) -> dict[str, Any]:
    """The arm as the run manifest records it; says whether our plugin is in the image, and why not when it is not."""
    if arm.backend == "sim":
        return {"arm": arm.name, "label": arm.label, "backend": "sim", "simulated": True,
                "simulated_from": arm.simulated_from, "variant": arm.variant,
                "sim_config": arm.sim.config if arm.sim else None, "sim_set": list(arm.sim.set) if arm.sim else [],
                "length_control": length_control(arm), "evidence": _describe(arm.evidence)}
    if arm.backend == CPU_BACKEND:
        # executor and the thread/wait env the server gets from serve.py and from this process's environment
        settings = cpuserver.recorded(arm.executor or cpuserver.DEFAULT_EXECUTOR, PLUGIN_VERSION, os.environ)
        return {"arm": arm.name, "label": arm.label, "backend": CPU_BACKEND, "simulated": False,
                "vllm_omni": PLUGIN_VERSION, "what": CPU_WHAT, "plugin": f"installed, variant {arm.variant}",
                "variant": arm.variant, "stages": cpuserver.STAGES, "host_delay_us": arm.host_delay_us,
                **settings, "length_control": length_control(arm), "evidence": _describe(arm.evidence)}
    plugin = (f"installed, variant {arm.variant}" if arm.vllm_omni == PLUGIN_VERSION else
              f"none: vllm-omni {arm.vllm_omni} has no _LocalPredictorKVCache to patch (removed by #1617)")
    return {"arm": arm.name, "label": arm.label, "backend": "vllm", "simulated": False, "vllm_omni": arm.vllm_omni,
            "base_image": arm.base_image, "base_image_digest": pinned_digest(arm.base_image),
            "base_image_pin": "digest" if pinned_digest(arm.base_image) else "tag only",
            "pin_warning": pin_warning(arm), "image": arm.image, "plugin": plugin,
            "plugin_source_check": "skipped" if dict(arm.env).get(ENV_SKIP_SOURCE_CHECK) == "1" else "on",
            "stages": arm.stages, "executor": _stage_executor(arm),
            "deploy": arm.deploy, "server_args": list(arm.server_args), "env": dict(arm.env),
            "host_delay_us": arm.host_delay_us, "length_control": length_control(arm),
            "evidence": _describe(arm.evidence)}


def _stage_executor(arm: Arm) -> str | None:
    """The executor a 0.16.0 arm's stage file names ("mp", "uni"; "mixed: ..." when its stages differ), None for a
    deploy-file arm (the release's default unless server_args say otherwise)."""
    if arm.vllm_omni != PLUGIN_VERSION or not arm.stages:
        return None
    found = executors_of(ROOT / "configs/stages" / arm.stages, PLUGIN_VERSION)
    names = sorted({str(x) for x in found})
    return names[0] if len(names) == 1 else "mixed: " + ", ".join(str(x) for x in found)


def executors_of(config: Path, release: str) -> list[str | None]:
    """The executor each stage of a stage/deploy file names (None where it names none: vLLM's choice)."""
    data = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    if release == PLUGIN_VERSION:
        return [(st.get("engine_args") or {}).get("distributed_executor_backend") for st in data.get("stage_args") or []]
    return [data.get("distributed_executor_backend")] * max(1, len(data.get("stages") or []))


# ----------------------------------------------------------------------------------------------- output length

# What sets the length of a request's audio, per release. 0.16.0 builds the talker's sampling params from the stage
# file and never passes the request's max_new_tokens to it (its speech route validates the field, then the talker
# runs to the stage's max_tokens or the codec end id); 0.30.0 honours the request's max_new_tokens; 0.32.0rc1 does and
# also caps a runaway output. Requests of this suite send no max_new_tokens (loadtest.prompts.speech_payload).
STAGE_LENGTH = "stage max_tokens"
REQUEST_LENGTH = "request max_new_tokens"
RELEASE_LENGTH = {PLUGIN_VERSION: (STAGE_LENGTH, None), "0.30.0": (REQUEST_LENGTH, None),
                  "0.32.0rc1": (REQUEST_LENGTH, "Base: at most 12 codec frames per text token, at least 192")}
REQUEST_MAX_NEW_TOKENS = None  # what every request sends: nothing, so the release's (or the simulator's) default


def _talker_max_tokens(stage_file: Path) -> int | None:
    """The talker stage's (stage_id 0) default_sampling_params.max_tokens of a 0.16.0 stage file, None if absent."""
    data = yaml.safe_load(stage_file.read_text(encoding="utf-8")) or {}
    for st in data.get("stage_args") or []:
        if isinstance(st, dict) and st.get("stage_id") == 0:
            v = (st.get("default_sampling_params") or {}).get("max_tokens")
            return v if isinstance(v, int) else None
    return None


def length_control(arm: Arm) -> dict[str, Any]:
    """The length control this arm's release honours: `honours` (STAGE_LENGTH | REQUEST_LENGTH), `max_frames` (the
    codec frames every request may run to, None: the release's own default), `source` (where the number comes from),
    `cap` (a release's own limit on runaway outputs, or None) and `text` (the three in words)."""
    if arm.backend == "sim":
        from ttssim.config import load_config

        try:
            cfg = load_config(ROOT / arm.sim.config if arm.sim and arm.sim.config else None,
                              list(arm.sim.set) if arm.sim else [])
        except (OSError, ValueError) as e:  # the server refuses the same settings at its start, where the run says so
            cfg, why = None, str(e)
        lc = {"honours": REQUEST_LENGTH,
              "max_frames": REQUEST_MAX_NEW_TOKENS or (cfg.audio.default_max_new_tokens if cfg else None),
              "source": "the simulator's audio.default_max_new_tokens (requests send none)" if cfg else
                        f"the simulator's config did not load ({why})", "cap": None}
    elif arm.backend == CPU_BACKEND or arm.vllm_omni == PLUGIN_VERSION:
        stages = cpuserver.STAGES if arm.backend == CPU_BACKEND else f"configs/stages/{arm.stages}"
        lc = {"honours": STAGE_LENGTH, "max_frames": _talker_max_tokens(ROOT / stages),
              "source": f"{stages}: talker (stage 0) default_sampling_params.max_tokens", "cap": None}
    else:
        honours, cap = RELEASE_LENGTH[arm.vllm_omni]
        lc = {"honours": honours, "max_frames": REQUEST_MAX_NEW_TOKENS,
              "source": f"vllm-omni {arm.vllm_omni}: the request's max_new_tokens (requests send none: the "
                        "release's default)", "cap": cap}
    n = "its default" if lc["max_frames"] is None else f"{lc['max_frames']} frames"
    return {**lc, "text": f"{lc['honours']} ({n}{', capped ' + lc['cap'] if lc['cap'] else ''})"}


def length_warning(arms: dict[str, Arm]) -> str | None:
    """A warning when the arms' length controls differ: audio per request can then differ for reasons that are not
    speed (the report compares audio seconds per prompt between the arms)."""
    controls = {name: length_control(arm) for name, arm in arms.items()}
    keys = {(c["honours"], c["max_frames"], c["cap"]) for c in controls.values()}
    if len(keys) <= 1:
        return None
    return ("the arms set audio length differently (" + "; ".join(f"{n}: {c['text']}" for n, c in
                                                                   controls.items())
            + "): audio per request can differ for reasons that are not speed; the report compares audio seconds "
              "per prompt between the arms")


# ----------------------------------------------------------------------------------------------- evidence


def check_evidence(arm: Arm, server_log_text: str | None, metrics_samples) -> tuple[bool, str]:
    """The arm's manipulation check over one block: its server log and its last /metrics snapshot.

    metrics_samples: rows (sample name, labels, value) of one scrape at the block's end (loadtest.scraper
    parse_metrics(text)[1]); the server is fresh per block, so counters are the block's totals. A block whose arm
    fails this check is invalid: the reason says which item failed.
    """
    ev = arm.evidence
    log = server_log_text or ""
    rows = list(metrics_samples or [])
    for pattern in ev.log_present:
        if not re.search(pattern, log, re.M):
            return False, f"the server log has no line matching /{pattern}/"
    for pattern in ev.log_absent:
        m = re.search(pattern, log, re.M)
        if m:
            end = log.find("\n", m.end())
            line = log[log.rfind("\n", 0, m.start()) + 1:len(log) if end < 0 else end].strip()
            return False, f"the server log has a line matching /{pattern}/: {line[:200]}"
    for name in ev.metric_present:
        v = total(rows, name)
        if v is None:
            return False, f"metric {name} is not exposed"
        if v <= 0:
            return False, f"metric {name} is {v:g}, not > 0"
    if ev.sync_signature:
        from tts_predictor import metrics as pm
        from ttsrecords.records import signature_holds

        # the variants that ran calls, and the one the info metric names (a server on a control file names no
        # variant there: its info says "controlled"; labels a plugin creates at zero ran nothing)
        variants = {labels.get("variant") for n, labels, v in rows
                    if (n == pm.CALLS and v > 0 or n == pm.INFO) and labels.get("variant") in VARIANT_NAMES}
        if variants != {ev.sync_signature}:
            return False, (f"the server reports variant(s) {sorted(variants)}, expected {ev.sync_signature}"
                           if variants else "the server exposes no tts_predictor counters (plugin not loaded?)")
        syncs, calls, tokens = (total(rows, n) for n in (pm.SYNCS, pm.OBSERVED_CALLS, pm.OBSERVED_TOKENS))
        if syncs is None or calls is None or tokens is None:
            return False, "the sync counters are missing"
        if calls <= 0:
            return False, "no call was observed by the sync sampler"
        holds, expected = signature_holds(ev.sync_signature, syncs, calls, tokens)
        if not holds:
            return False, (f"{syncs:g} syncs over {calls:g} observed calls ({tokens:g} tokens); "
                           f"{ev.sync_signature} means {expected:g}")
    return True, "evidence holds: " + _describe(ev)


# ----------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
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


if __name__ == "__main__":
    sys.exit(main())

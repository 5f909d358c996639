"""How an experiment's arms are prepared and started: the commands per backend, written here once.

  images(exp, model_revision=None) -> [Command]    pull, build, fetch the model: run once before block 1, untimed
  server_launch(exp, arm, port, ...) -> Launch     argv + env of one block's server, its health URL and stop budget
  dry_run(exp, ...) -> str                         every command of every arm, none run (`python -m loadtest.experiment
                                                   FILE --dry-run`)
The simulator is `python -m ttssim`, the real CPU server `cpu_server/serve.py` (a process: flags in, exit status
out), vllm-omni `docker/serve.sh`: all docker commands are written in serve.sh alone; an arm only chooses its
environment and arguments. The arms themselves are loadtest.experiment's.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from loadtest.evidence import describe, length_warning, pin_warning
from loadtest.experiment import (
    CPU_BACKEND,
    CPU_HEALTH_TIMEOUT_S,
    CPU_WHAT,
    HEALTH_TIMEOUT_S,
    PLUGIN_VERSION,
    Arm,
    Experiment,
    ExperimentError,
    SimSpec,
)
from tts_predictor.domain import DEFAULT_VARIANT
from ttsrecords import cpuserver
from ttsrecords.paths import ROOT

SERVE_SH = "docker/serve.sh"
CPU_SERVE = "cpu_server/serve.py"  # started as a process only (flags in, exit status out; ttsrecords/cpuserver.py)
HOST = "127.0.0.1"
STOP_GRACE_S = 30  # docker stop -t: vLLM's own shutdown; docker/serve.sh STOP_GRACE_S
CPU_STOP_GRACE_S = cpuserver.STOP_GRACE_S  # SIGTERM to SIGKILL in cpu_server/serve.py, passed as --stop-grace-s
CONTROL_FILE = "control.json"  # the control file's name in a start's folder (docker/serve.sh CONTROL_FILE default)


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
        out.append(f"# evidence: {describe(arm.evidence)}")
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

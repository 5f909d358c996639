"""`make preflight`: a minute that catches what would otherwise surface an hour into an A/B run.

    python -m loadtest.preflight [--backend sim|vllm] [--variant V[,V...]] [--experiment FILE] [--prepare] [--dry-run]

Every step prints PASS / FAIL / SKIP (a FAIL with its fix) and everything goes to
`reports/preflight-<UTC>/preflight.json` (`{"checks": [{"name", "status", "detail", "fix"?, "warning"?}, ...]}`),
next to the server's log. Steps, in order (docs/gpu-host.md, "First: make preflight", says what each FAIL means):

  host       Docker Engine answers, a container gets the GPU (runtime list or `docker run --gpus ... nvidia-smi`),
             the container's GPU(s): model and free memory, free disk (vllm; SKIP on sim)
  image      per image of the experiment: present; inside it vllm_omni.__version__, the plugin entry point
             `tts_predictor_variant` (group vllm.general_plugins), CUDA; the model snapshot of MODEL_REVISION in HF_CACHE
  server     one server with a control file for every plugin arm (hot swap: the variants take turns in one server),
             one plain server per arm without the plugin (vllm-omni >= 0.30); ready = /health and the log's stages
             line; then the Base fallback (request kinds base -> base_xvector -> custom_voice, the first that
             answers; a dead engine stops the server's checks) and priming (the first level's concurrency in
             untimed requests); after the stop, the host's /dev/shm compared with before the start
  variant    per variant: control file written (variant, observe on, a new epoch) -> one WAV and one streamed PCM
             Base request (decoded, 24 kHz, non-silent, plausible duration; the server's error text verbatim on
             failure) -> /metrics: tts_predictor_control_epoch shows the epoch, calls moved under this variant's
             label only, syncs over the observed calls = tts_predictor.metrics.expected_syncs
  telemetry  NVML readable (vllm); the server's process tree in /proc (sim: no GPU)

BACKEND: sim runs the simulator (GPU steps SKIP, well under a minute); vllm runs docker/serve.sh. Without --backend
the rule of `make serve` (ttssim/launch.py) decides: vllm when `docker info` lists an NVIDIA runtime, else sim.
--dry-run prints every command and runs none (nothing is written). Exit 0 when nothing failed, 1 when a check
failed, 2 for bad arguments (one line).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from loadtest import experiment as ex
from loadtest.preflight.host import (
    Gpu,
    check_cpu,
    check_disk,
    check_gpu_memory,
    check_host,
    choose_backend,
)
from loadtest.preflight.images import check_images, prepare
from loadtest.preflight.report import PreflightError, Report, Shell, rel_path
from loadtest.preflight.requests import prime_check, request_fallback
from loadtest.preflight.serve import (
    STARTED,
    Server,
    check_log_evidence,
    check_telemetry,
    run_plain_arm,
    run_variant,
    start_server,
    stop_server,
)
from loadtest.readiness import make_probe
from loadtest.scenario import load_scenario
from loadtest.server_process import ROOT
from tts_predictor.domain import VARIANT_NAMES
from ttsrecords.records import PREFLIGHT_SCHEMA, write_json


def load(args) -> tuple[ex.Experiment, list[str]]:
    """The experiment (sim: every arm on the simulator) and the variants to check, validated."""
    try:
        exp = ex.load_experiment(args.experiment) if args.experiment else ex.mission()
        if args.backend == "sim":
            exp = ex.simulated(exp)
        elif exp.simulated:
            raise PreflightError(f"{exp.path}: every arm runs on the simulator; use --backend sim")
        elif args.backend == ex.CPU_BACKEND:
            exp = ex.on_cpu(exp)
    except ex.ExperimentError as e:
        raise PreflightError(str(e)) from None
    if args.variant:
        variants = [v.strip() for v in args.variant.split(",") if v.strip()]
        bad = [v for v in variants if v not in VARIANT_NAMES]
        if bad or not variants:
            raise PreflightError(f"--variant {args.variant!r}: want one or more of {', '.join(VARIANT_NAMES)}")
    elif args.experiment:
        variants = list(dict.fromkeys(a.variant for a in exp.arms.values()
                                      if a.variant and (a.backend == "sim" or a.vllm_omni == ex.PLUGIN_VERSION)))
    else:
        variants = list(VARIANT_NAMES)
    return exp, variants


def run_preflight(args, print_line: Callable[[str], None] = print) -> int:
    """Every step in order, preflight.json, the exit status. Long on purpose: which step blocks which reads top down."""
    t_start = time.monotonic()
    started = datetime.now(timezone.utc)
    backend, why = args.backend, args.why
    exp, variants = load(args)
    shell = Shell(args.dry_run, print_line)
    rep = Report(print_line)
    folder = Path(args.out) if args.out else ROOT / "reports" / f"preflight-{started.strftime('%Y%m%dT%H%M%SZ')}"
    label = "REAL vllm-omni in Docker (GPU)" if backend == "vllm" else ex.CPU_WHAT if backend == ex.CPU_BACKEND \
        else "SIMULATED server (ttssim): modelled timings, NOT vllm-omni"
    print_line(f"make preflight: BACKEND={backend} -> {label}, because {why}"
               + (" [DRY RUN: commands are printed, none runs]" if args.dry_run else ""))
    print_line(f"# experiment {exp.name} ({rel_path(exp.path)}); variants {', '.join(variants) or 'none'}"
               + (f"; results in {rel_path(folder)}" if not args.dry_run else ""))
    if not args.dry_run:
        folder.mkdir(parents=True, exist_ok=True)
    probe = make_probe(exp.model, exp.request)
    try:
        first_level = load_scenario(str(ROOT / exp.scenario)).steps[0].concurrency
    except Exception:  # the experiment loader validated it; a scenario without steps primes with one request
        first_level = 1

    gpus: list[Gpu] = []
    blocked: list[str] = []
    resolved: dict | None = None  # --prepare: the model's commit on the hub (resolve_revision)
    if backend == "vllm":
        gpus = check_host(rep, shell)
        if not rep.failed("host.docker"):
            check_disk(rep, shell)
        if args.prepare:
            resolved = prepare(rep, shell, exp)
        shares = check_images(rep, shell, exp)
        check_gpu_memory(rep, gpus, shares)
        blocked = [] if args.dry_run else rep.failed()  # a dry run lists every later command too
    elif backend == ex.CPU_BACKEND:
        check_cpu(rep, shell)
        blocked = [] if args.dry_run else rep.failed()
    else:
        for name in ("host.docker", "host.nvidia_runtime", "host.gpu", "host.gpu_memory"):
            rep.add(name, "skip", "BACKEND=sim: no Docker, no GPU needed")
        rep.add("image", "skip", "BACKEND=sim: the simulator runs from this checkout")

    plugin_arms = [a for a in exp.arms.values() if a.backend == "sim" or a.vllm_omni == ex.PLUGIN_VERSION]
    plain_arms = [a for a in exp.arms.values() if a not in plugin_arms]
    telemetry_done = False

    def finish(server: Server | None) -> None:
        nonlocal telemetry_done
        if not telemetry_done:  # while a server runs: the simulator's telemetry is its process tree
            check_telemetry(rep, shell, server, backend)
            telemetry_done = True
        if server is not None:
            stop_server(rep, server)

    if blocked:
        rep.add("server", "skip", f"blocked: {', '.join(blocked)} failed (fix those first)")
    else:
        if plugin_arms and variants:
            server = start_server(rep, shell, exp, plugin_arms[0], folder, variants[0], hot_swap=True)
            if server is None and not shell.dry_run:
                rep.add("variant", "skip", f"blocked: server.{plugin_arms[0].name} failed")
            else:
                works = request_fallback(rep, shell, exp, server, f"request.{plugin_arms[0].name}")
                prime_check(rep, shell, server, works, first_level, f"prime.{plugin_arms[0].name}")
                if works is None and not shell.dry_run:
                    rep.add("variant", "skip", f"blocked: request.{plugin_arms[0].name} failed")
                else:
                    for epoch, variant in enumerate(variants, start=1):
                        if not run_variant(rep, shell, server, variant, epoch, works or probe):
                            left = variants[variants.index(variant) + 1:]
                            if left:
                                rep.add("variant", "skip", f"not run: {', '.join(left)} (the engine died)")
                            break
                if server is not None:
                    check_log_evidence(rep, server, plugin_arms)
                finish(server)
        for arm in plain_arms:
            server = start_server(rep, shell, exp, arm, folder, None, hot_swap=False)
            if server is None and not shell.dry_run:
                rep.add(f"arm.{arm.name}", "skip", f"blocked: server.{arm.name} failed")
                continue
            works = request_fallback(rep, shell, exp, server, f"request.{arm.name}")
            prime_check(rep, shell, server, works, first_level, f"prime.{arm.name}")
            if works is not None or shell.dry_run:
                run_plain_arm(rep, shell, arm, server, works or probe)
            finish(server)
    if not telemetry_done and backend == "vllm":
        check_telemetry(rep, shell, None, backend)
    elapsed = time.monotonic() - t_start
    counts = rep.counts()
    verdict = "FAILED" if counts["fail"] else "OK"
    if args.dry_run:
        print_line(f"preflight dry run: {len(rep.checks)} steps listed, nothing run ({elapsed:.1f} s)")
        return 0
    doc = {"schema": PREFLIGHT_SCHEMA, "backend": backend, "why": why, "simulated": backend == "sim", "experiment": rel_path(exp.path),
           "variants": variants, "started": started.isoformat(timespec="seconds"), "elapsed_s": round(elapsed, 2),
           "ok": not counts["fail"], "counts": counts, "model_revision": resolved,
           "checks": [c.to_dict() for c in rep.checks]}
    write_json(folder / "preflight.json", doc)
    print_line(f"preflight {verdict}: {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip in "
               f"{elapsed:.1f} s -> {rel_path(folder / 'preflight.json')}")
    return 1 if counts["fail"] else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.preflight", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=ex.BACKENDS, default=None,
                   help="default: vllm when `docker info` lists an NVIDIA runtime, else sim (as make serve)")
    p.add_argument("--variant", default=None, help="variant(s) to check, comma-separated (default: every variant, "
                   "or the experiment's)")
    p.add_argument("--experiment", default=None, help="an experiment file (default: the mission, "
                   f"{ex.MISSION})")
    p.add_argument("--prepare", action="store_true", help="vllm: pull, build and fetch first (minutes)")
    p.add_argument("--dry-run", action="store_true", help="print every command, run none, write nothing")
    p.add_argument("--out", default=None, help="result folder (default reports/preflight-<UTC>)")
    args = p.parse_args(argv)
    try:
        args.backend, args.why = choose_backend(args.backend)
        return run_preflight(args)
    except PreflightError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:  # Ctrl-C or a bug mid-run: no server is left behind (a stopped one returns at once)
        while STARTED:
            STARTED.pop().stop()

"""What `make serve` runs: pick the backend, say loudly which, and hand over the process (exec).

- BACKEND=sim: `python -m ttssim` (the simulator, this package).
- BACKEND=vllm: `bash docker/serve.sh [--dry-run]` with VARIANT, PORT, DEVICE, HOST in the environment (the real
  vllm-omni 0.16.0 image; that script belongs to docker/).
- BACKEND=vllm-cpu: `python cpu_server/serve.py --variant V --port P [--executor uni|mp] [--dry-run]`: the real
  vllm-omni 0.16.0 server on this CPU (AVX-512) with a tiny random model; that script belongs to cpu_server/. Never
  chosen automatically. --executor (make serve EXECUTOR=...) is that backend's only: a GPU stage file names its own.
- no BACKEND: vllm when `docker info` lists an NVIDIA runtime or a container gets the GPU without one
  (`bash docker/serve.sh --probe-gpu`: `docker run --gpus all ... nvidia-smi -L` in a local image), else the simulator.
DRY_RUN=1 prints the decision and the command; for the simulator it runs nothing, for vllm it passes --dry-run on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

from tts_predictor.domain import VARIANT_NAMES
from ttsrecords.paths import ROOT

SERVE_SH = "docker/serve.sh"
CPU_SERVE = "cpu_server/serve.py"


def nvidia_runtime() -> tuple[bool, str]:
    """(True, why) when Docker answers and lists an NVIDIA runtime; never raises, bounded in time."""
    docker = shutil.which("docker")
    if docker is None:
        return False, "no docker executable on PATH"
    try:
        out = subprocess.run([docker, "info", "--format", "{{json .Runtimes}}"], capture_output=True, text=True,
                             timeout=15)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"`docker info` failed: {e}"
    if out.returncode != 0:
        return False, f"`docker info` exited {out.returncode}: {out.stderr.strip()[:200]}"
    try:
        runtimes = json.loads(out.stdout or "{}") or {}
    except ValueError:
        runtimes = {}
    text = " ".join(runtimes) if isinstance(runtimes, dict) else str(out.stdout)
    if "nvidia" in text.lower():
        return True, "`docker info` lists the NVIDIA runtime"
    return probe_gpu(f"`docker info` lists no NVIDIA runtime (runtimes: {text or 'none'})")


def probe_gpu(before: str, env: dict | None = None) -> tuple[bool, str]:
    """`docker run --gpus` works without a runtime entry (the toolkit's hook), so a container that sees the GPU
    decides (docker/serve.sh --probe-gpu, in an image already on the host)."""
    try:
        out = subprocess.run(["bash", SERVE_SH, "--probe-gpu"], cwd=ROOT, capture_output=True, text=True,
                             timeout=120, env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{before}; the GPU probe failed: {e}"
    if out.returncode == 0:
        return True, f"{before}, but `docker run --gpus` sees {out.stdout.strip().splitlines()[0][:120]}"
    last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1][:200]
    return False, f"{before}; no GPU in a container either ({last})"


def _sim(args) -> tuple[list[str], dict]:
    argv = [sys.executable, "-m", "ttssim", "--variant", args.variant, "--host", args.host, "--port",
            str(args.port), "--device", args.device]
    if args.config:
        argv += ["--config", args.config]
    return argv, {}


def _vllm(args) -> tuple[list[str], dict]:
    env = {"VARIANT": args.variant, "PORT": str(args.port), "DEVICE": args.device, "HOST": args.host}
    return ["bash", SERVE_SH] + (["--dry-run"] if args.dry_run else []), env


def _vllm_cpu(args) -> tuple[list[str], dict]:
    argv = [sys.executable, CPU_SERVE, "--variant", args.variant, "--port", str(args.port), "--host", args.host]
    argv += ["--executor", args.executor] if args.executor else []
    return argv + (["--dry-run"] if args.dry_run else []), {}


# backend -> (what it is, in the banner, {release} from VLLM_OMNI; the script it needs; how to build its command)
BACKENDS = {
    "sim": ("SIMULATED server (ttssim): modelled timings, NOT a real TTS server", None, _sim),
    "vllm": ("REAL vllm-omni {release} (Docker, GPU)", SERVE_SH, _vllm),
    "vllm-cpu": ("REAL vllm-omni {release} on CPU, tiny random model (cpu_server/serve.py)", CPU_SERVE, _vllm_cpu),
}


def build(args) -> tuple[str, list[str], dict, str]:
    """(backend, argv, env, reason)."""
    if args.backend:
        backend, reason = args.backend, f"BACKEND={args.backend} was given"
    else:
        has_gpu, why = nvidia_runtime()
        backend, reason = ("vllm" if has_gpu else "sim"), why
    argv, extra = BACKENDS[backend][2](args)
    return backend, argv, {**os.environ, **extra}, reason


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ttssim.launch", description=__doc__.splitlines()[0])
    p.add_argument("--variant", required=True, choices=VARIANT_NAMES)
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--device", default="cpu")
    p.add_argument("--config", default=None, help="simulator config (ignored by BACKEND=vllm)")
    p.add_argument("--backend", choices=list(BACKENDS), default=None)
    p.add_argument("--executor", choices=("uni", "mp"), default=None,
                   help="BACKEND=vllm-cpu only: vLLM's executor in every stage (cpu_server/serve.py; default mp; uni: quieter on 0.16.0)")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.executor and args.backend != "vllm-cpu":
        print(f"make serve: EXECUTOR={args.executor} is for BACKEND=vllm-cpu only (a GPU server's stage file names "
              "its executor: configs/stages/)", file=sys.stderr)
        return 2
    backend, cmd, env, reason = build(args)
    what, script, _ = BACKENDS[backend]
    what = what.format(release=os.environ.get("VLLM_OMNI") or "0.16.0")  # both scripts' default
    bar = "=" * 96
    print(f"{bar}\n== make serve: BACKEND={backend} -> {what}\n== because {reason}\n== {' '.join(cmd)}\n{bar}",
          flush=True)
    if script and not (ROOT / script).is_file():
        print(f"make serve: {script} is missing: the {backend} backend is not set up in this checkout", file=sys.stderr)
        return 2
    if backend == "sim" and args.dry_run:
        print("DRY_RUN: not starting the simulator")
        return 0
    os.chdir(ROOT)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        print(f"make serve: cannot run {cmd[0]}: {e}", file=sys.stderr)
        return 2
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

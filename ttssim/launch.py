"""What `make serve` runs: pick the backend, say loudly which, and hand over the process (exec).

- BACKEND=sim: `python -m ttssim` (the simulator, this package).
- BACKEND=vllm: `bash docker/serve.sh [--dry-run]` with VARIANT, PORT, DEVICE, HOST in the environment (the real
  vllm-omni 0.16.0 image; that script belongs to docker/).
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
from pathlib import Path

from tts_predictor.domain import VARIANT_NAMES

REPO = Path(__file__).resolve().parent.parent
SERVE_SH = "docker/serve.sh"


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
        out = subprocess.run(["bash", SERVE_SH, "--probe-gpu"], cwd=REPO, capture_output=True, text=True,
                             timeout=120, env={**os.environ, **(env or {})})
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"{before}; the GPU probe failed: {e}"
    if out.returncode == 0:
        return True, f"{before}, but `docker run --gpus` sees {out.stdout.strip().splitlines()[0][:120]}"
    last = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1][:200]
    return False, f"{before}; no GPU in a container either ({last})"


def build(args) -> tuple[str, list[str], dict, str]:
    """(backend, argv, env, reason)."""
    if args.backend:
        backend, reason = args.backend, f"BACKEND={args.backend} was given"
    else:
        has_gpu, why = nvidia_runtime()
        backend, reason = ("vllm" if has_gpu else "sim"), why
    env = dict(os.environ)
    if backend == "vllm":
        env.update(VARIANT=args.variant, PORT=str(args.port), DEVICE=args.device, HOST=args.host)
        argv = ["bash", SERVE_SH] + (["--dry-run"] if args.dry_run else [])
    else:
        argv = [sys.executable, "-m", "ttssim", "--variant", args.variant, "--host", args.host, "--port",
                str(args.port), "--device", args.device]
        if args.config:
            argv += ["--config", args.config]
    return backend, argv, env, reason


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ttssim.launch", description=__doc__.splitlines()[0])
    p.add_argument("--variant", required=True, choices=VARIANT_NAMES)
    p.add_argument("--port", type=int, default=8091)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--device", default="cpu")
    p.add_argument("--config", default=None, help="simulator config (ignored by BACKEND=vllm)")
    p.add_argument("--backend", choices=["sim", "vllm"], default=None)
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    backend, cmd, env, reason = build(args)
    what = ("REAL vllm-omni 0.16.0 (Docker, GPU)" if backend == "vllm"
            else "SIMULATED server (ttssim): modelled timings, NOT a real TTS server")
    bar = "=" * 96
    print(f"{bar}\n== make serve: BACKEND={backend} -> {what}\n== because {reason}\n== {' '.join(cmd)}\n{bar}",
          flush=True)
    if backend == "vllm" and not (REPO / SERVE_SH).is_file():
        print(f"make serve: {SERVE_SH} is missing: the Docker backend is not set up in this checkout", file=sys.stderr)
        return 2
    if backend == "sim" and args.dry_run:
        print("DRY_RUN: not starting the simulator")
        return 0
    os.chdir(REPO)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as e:
        print(f"make serve: cannot run {cmd[0]}: {e}", file=sys.stderr)
        return 2
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main())

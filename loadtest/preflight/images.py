"""The image checks (`image.*`, `model.*`) and `--prepare`: per image of the experiment, present, then inspected from
inside (vllm-omni's version, the plugin's entry point or its absence, CUDA, the model snapshot through the HF_CACHE
mount); the pinned model snapshot on the host; --prepare resolves the model's commit, then pulls, builds, fetches."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

from loadtest import hub, launch
from loadtest.experiment import PLUGIN_VERSION, Arm, Experiment
from loadtest.preflight.host import hf_cache
from loadtest.preflight.report import Report, Shell, last_line, rel_path
from loadtest.server_process import ROOT

PLUGIN_ENTRY_POINT = "tts_predictor_variant"  # pyproject.toml, [project.entry-points."vllm.general_plugins"]
PLUGIN_GROUP = "vllm.general_plugins"
CONTAINER_HF = "/home/tts/.cache/huggingface"  # docker/serve.sh CONTAINER_HF


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


def stage_memory_shares(arm: Arm) -> list[float] | None:
    """gpu_memory_utilization of each stage of a 0.16.0 arm's stage file (configs/stages/), None if not known here."""
    if arm.stages is None:
        return None
    text = (ROOT / "configs/stages" / arm.stages).read_text(encoding="utf-8")
    return [float(x) for x in re.findall(r"gpu_memory_utilization:\s*([0-9.]+)", text)]


def model_revision(exp: Experiment) -> str | None:
    return exp.model_revision or os.environ.get("MODEL_REVISION") or None


def snapshot_dir(root: Path | str, model: str, revision: str) -> str:
    return f"{root}/hub/models--{model.replace('/', '--')}/snapshots/{revision}"


def _prep_line(c: launch.Command) -> str:
    return " ".join(f"{k}={shlex.quote(v)}" for k, v in c.env.items() if k in ("VLLM_OMNI", "VARIANT", "BASE_IMAGE",
                                                                             "MODEL_REVISION")) + " " + \
        shlex.join(c.argv)


def resolve_revision(rep: Report, shell: Shell, exp: Experiment) -> dict:
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
                         f"{rel_path(exp.path)}), then rerun")
    return out


def prepare(rep: Report, shell: Shell, exp: Experiment) -> dict:
    """--prepare: resolve the model's commit, then pull, build and fetch (loadtest.launch.images), each a check
    with a progress line before ("prepare [i/n] <what> ...") and its elapsed time after. The server starts that
    follow warm each image's compile cache (docker/serve.sh COMPILE_CACHE), so a run's first start is not a cold one.
    Returns what resolve_revision found (preflight.json's `model_revision`)."""
    shell.print_line("# PREPARE: resolve the model's commit, pull, build, fetch; the server start(s) below then warm "
                     "the compile cache")
    cmds = launch.images(exp)
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
            rep.add(name, "fail", f"{c.what}: {last_line(err or out) or f'exit {rc}'}",
                    f"run it by hand to see the whole output: {_prep_line(c)}")
    return found


def check_images(rep: Report, shell: Shell, exp: Experiment) -> dict[str, list[float]]:
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
            fetch = [c for c in launch.images(exp) if c.what.startswith("fetch")]
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
        prep = [c for c in launch.images(exp) if arm.image in c.what or arm.base_image in c.what]
        rc, out, err = shell.run(["docker", "image", "inspect", "--format", "{{.Id}}", arm.image], 30)
        if shell.dry_run:
            rep.add(f"image.{tag}", "skip", f"dry run: {arm.image}")
        elif rc != 0:
            rep.add(f"image.{tag}", "fail", f"image {arm.image} is not on this host ({last_line(err) or f'exit {rc}'})",
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
            msg = last_line(err or out) or f"exit {rc}"
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


def _image_checks(rep: Report, arm: Arm, tag: str, info: dict, revision: str | None) -> None:
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
    if arm.vllm_omni == PLUGIN_VERSION:
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

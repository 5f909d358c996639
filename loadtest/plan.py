"""What an A/B run will do, written down before it starts: the block plan, the effective scenario, the environment
and the manifest (schema tts-ab/1) that records them all.

The plan is A/A rounds first (the noise floor), then A/B rounds whose arm order is drawn from a recorded seed; one
block is one fresh server start of one variant. The manifest records no environment variables, so no tokens.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import random
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import yaml

from loadtest.records import AB_SCHEMA, write_json
from loadtest.scenario import Scenario, ScenarioError, load_scenario
from tts_predictor.domain import VARIANT_NAMES

ROOT = Path(__file__).resolve().parent.parent
DONE = ("complete", "invalid")  # a resumed run never repeats these: their load ran; a rerun would only hide the cause
# A "failed" block (infrastructure) runs again on a resume while fewer than this many earlier attempts of it failed:
# once more, then it stays failed (a server that never starts is not retried forever). "interrupted" always runs again.
FAILED_RERUNS_MAX = 1
RESUME_POLICY = {"never_rerun": list(DONE), "always_rerun": ["interrupted"], "failed_reruns_max": FAILED_RERUNS_MAX,
                 "how": "block.json counts earlier failed attempts of the block in failed_before (they are kept under "
                        "attempts/); a failed block with failed_before >= failed_reruns_max is not run again"}
READY_TIMEOUT_S = {"sim": 120.0, "vllm": 1200.0}  # vllm: image build and weights download on the first block


def utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_plan(rounds: int, aa_rounds: int, a: str, b: str, seed: int) -> list[dict]:
    """A/A rounds first, then A/B rounds; the arm order of every round is drawn from `seed`."""
    rng = random.Random(seed)
    plan = []
    for r in range(aa_rounds + rounds):
        kind = "aa" if r < aa_rounds else "ab"
        order = ["A", "B"] if rng.random() < 0.5 else ["B", "A"]
        for arm in order:
            variant = a if (kind == "aa" or arm == "A") else b
            plan.append({"block_id": f"{len(plan):03d}-r{r}-{kind}-{arm}", "round": r, "kind": kind, "arm": arm,
                         "variant": variant})
    return plan


def effective_scenario(path: Path, out: Path, phases: dict, levels: list[int] | None,
                       sets: list[str] | None = None, last_drain_s: float | None = None) -> Path:
    """Copy the scenario into the run folder, with phase lengths / levels / keys overridden if asked (recorded, hashed)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
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
        data["steps"][-1] = {**data["steps"][-1], "drain_s": last_drain_s}
    out.write_text(f"# effective scenario of this run, from {path}\n" + yaml.safe_dump(data, sort_keys=False),
                   encoding="utf-8")
    load_scenario(str(out))  # validate now: a bad override fails before any server starts
    return out


def block_seconds(scenario: Scenario) -> float:
    """Length of one block's load: every step's warm-up, measure and drain."""
    return sum(s.warmup_s + s.measure_s + s.drain_s for s in scenario.steps)


def _run_quiet(cmd: list[str], timeout: float = 5.0) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_revision() -> str | None:
    """The checkout's commit (None outside a git checkout)."""
    return _run_quiet(["git", "-C", str(ROOT), "rev-parse", "HEAD"])


def environment(backend: str, variants: tuple[str, ...] = ()) -> dict:
    """What the manifest records about the machine and the code: no environment variables, so no tokens."""
    gpu = _run_quiet(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    rev = git_revision()
    dirty = _run_quiet(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    info = {"git_revision": rev, "git_dirty": bool(dirty), "python": platform.python_version(),
            "platform": platform.platform(), "cpus": os.cpu_count(), "gpu": gpu.splitlines() if gpu else None}
    if backend == "sim":
        try:
            from importlib.metadata import version

            info["backend_version"] = f"ttssim (tts-loadtest {version('tts-loadtest')})"
        except Exception:
            info["backend_version"] = "ttssim"
    else:
        # docker/serve.sh builds one image per variant (IMAGE, default tts-vllm-omni:0.16.0-<variant>) on vllm-omni
        images = {v: os.environ.get("IMAGE", f"tts-vllm-omni:0.16.0-{v}") for v in variants}
        ids = {v: _run_quiet(["docker", "image", "inspect", "--format", "{{.Id}}", img]) for v, img in images.items()}
        info["backend_version"] = "vllm-omni 0.16.0 (docker/serve.sh)"
        info["image_digest"] = {v: {"image": images[v], "id": ids[v]} for v in variants}
    return info


def new_run(a: argparse.Namespace) -> tuple[Path, dict]:
    """Check the arguments, create reports/<run>/ with its effective scenario and manifest; SystemExit("error: ...")
    before anything is written when an argument is bad."""
    for v in (a.a, a.b):
        if v not in VARIANT_NAMES:
            raise SystemExit(f"error: unknown variant {v!r} (known: {', '.join(sorted(VARIANT_NAMES))})")
    if a.rounds < 1 or a.aa_rounds < 0:
        raise SystemExit("error: --rounds must be >= 1 and --aa-rounds >= 0")
    if a.request_timeout is not None and not (a.request_timeout > 0 and a.request_timeout != float("inf")):
        raise SystemExit(f"error: --request-timeout must be a positive number of seconds, got {a.request_timeout:g}")
    scen = Path(a.scenario)
    if a.backend == "sim" and not Path(a.sim_config).is_file():
        raise SystemExit(f"error: simulator config {a.sim_config} not found")
    if a.backend == "vllm" and not (ROOT / "docker" / "serve.sh").is_file():
        raise SystemExit("error: BACKEND=vllm needs docker/serve.sh")
    if a.backend == "vllm" and shutil.which("docker") is None:
        raise SystemExit("error: BACKEND=vllm needs Docker (not found); use BACKEND=sim")
    try:
        levels = [int(x) for x in a.levels.split(",")] if a.levels else None
    except ValueError:
        raise SystemExit(f"error: --levels wants comma-separated integers, got {a.levels!r}") from None
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**31)
    name = a.name or f"ab-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    run = Path(a.out) / name
    if run.exists():
        raise SystemExit(f"error: {run} exists (use --resume {run} to continue it)")
    run.mkdir(parents=True)
    phases = {k: v for k, v in (("warmup_s", a.warmup_s), ("measure_s", a.measure_s), ("drain_s", a.drain_s))
              if v is not None}
    try:
        effective_scenario(scen, run / "scenario.yaml", phases, levels, a.scenario_set, a.last_drain_s)
    except (OSError, yaml.YAMLError, ScenarioError, ValueError) as e:
        shutil.rmtree(run)
        raise SystemExit(f"error: scenario {scen}: {e}") from None
    settings = {"a": a.a, "b": a.b, "backend": a.backend, "rounds": a.rounds, "aa_rounds": a.aa_rounds,
                "scenario": str(scen), "sim_config": a.sim_config, "sim_set": a.sim_set, "b_sim_set": a.b_sim_set,
                "phase_overrides": phases, "levels_override": levels, "scenario_set": a.scenario_set,
                "last_drain_s": a.last_drain_s, "ready_timeout_s": a.ready_timeout or READY_TIMEOUT_S[a.backend],
                "request_timeout_s": a.request_timeout, "micro": a.micro}
    manifest = {
        "schema": AB_SCHEMA, "run_id": name, "created": utc(), "started": utc(), "ended": None, "status": "planned",
        "variants": {"A": a.a, "B": a.b}, "backend": {"name": a.backend, "simulated": a.backend == "sim"},
        "seeds": {"order": seed, "scenario": load_scenario(str(run / "scenario.yaml")).seed},
        "scenario": {"path": str(scen), "sha256": sha256(scen), "effective_sha256": sha256(run / "scenario.yaml")},
        "sim_config": ({"path": a.sim_config, "sha256": sha256(Path(a.sim_config))} if a.backend == "sim" else None),
        "settings": settings, "plan": make_plan(a.rounds, a.aa_rounds, a.a, a.b, seed), "resume_policy": RESUME_POLICY,
        "command": ["python", "-m", "loadtest.ab", *(sys.argv[1:] if sys.argv else [])],
    }
    env = environment(a.backend, (a.a, a.b))
    manifest["backend"].update(version=env.pop("backend_version"), image_digest=env.pop("image_digest", None))
    manifest["git_revision"] = env.pop("git_revision")
    manifest["host"] = env
    write_json(run / "manifest.json", manifest)
    return run, manifest

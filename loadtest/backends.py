"""The servers an A/B block can start: one backend is one function in a table, from the run's settings and a block
of the plan to a ServerSpec (command, environment, where the port comes from, how long a stop may take).

Starting and stopping the server (loadtest.server_process) and the Locust window (loadtest.runner) know nothing
about backends, so a new kind of arm (another server build, another image) is one more entry here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from loadtest.server_process import ROOT, ServerSpec, free_port


def sim(settings: dict, block: dict, bdir: Path) -> ServerSpec:
    """The simulator: binds port 0 and reports the port through a file; arm B of A/B rounds gets --b-sim-set too."""
    port_file = bdir / "port"
    cmd = [sys.executable, "-m", "ttssim", "--variant", block["variant"], "--host", "127.0.0.1", "--port", "0",
           "--port-file", str(port_file), "--config", settings["sim_config"]]
    sets = list(settings.get("sim_set") or [])
    if block["kind"] == "ab" and block["arm"] == "B":
        sets += settings.get("b_sim_set") or []
    for kv in sets:
        cmd += ["--set", kv]
    return ServerSpec(cmd=cmd, env=dict(os.environ), port_file=port_file, stop_wait_s=15.0)


def vllm(settings: dict, block: dict, bdir: Path) -> ServerSpec:
    """vllm-omni 0.16.0 in Docker (docker/serve.sh): variant and port from the environment, like `make serve`; a
    fixed free port (the container cannot report one); a stop waits for the container's removal."""
    port = free_port()
    env = {**os.environ, "VARIANT": block["variant"], "PORT": str(port), "HOST": "127.0.0.1"}
    return ServerSpec(cmd=["bash", str(ROOT / "docker" / "serve.sh")], env=env, port=port, stop_wait_s=120.0)


BACKENDS: dict[str, Callable[[dict, dict, Path], ServerSpec]] = {"sim": sim, "vllm": vllm}

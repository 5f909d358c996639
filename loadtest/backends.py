"""The server a start runs: an experiment arm (loadtest.experiment) turned into a ServerSpec for loadtest.server_process.

The arm decides what runs (the simulator, or vllm-omni in Docker through docker/serve.sh); launch.server_launch
writes its command. This module only adds what a start of the A/B runner needs around it: the start's folder, the
port (the simulator binds port 0 and reports it through a file; a container gets a fixed free port) and the control
file, so the windows inside the start can switch the observer and, for a hot swap, the variant.
"""

from __future__ import annotations

import os
from pathlib import Path

from loadtest import experiment as ex
from loadtest.launch import CONTROL_FILE, server_launch
from loadtest.server_process import ServerSpec, free_port


def control_path(start_dir: Path) -> Path:
    return start_dir / CONTROL_FILE


def server_spec(exp: ex.Experiment, arm: ex.Arm, start_dir: Path, control: bool) -> ServerSpec:
    """How to start `arm` for one server start in start_dir (control: with starts/<n>/control.json, written first)."""
    control_dir = str(start_dir) if control else None
    if arm.backend == "sim":
        port_file = start_dir / "port"
        launch = server_launch(exp, arm, 0, port_file=str(port_file), control_dir=control_dir)
        return ServerSpec(cmd=launch.argv, env={**os.environ, **launch.env}, port_file=port_file,
                          stop_wait_s=launch.stop_timeout_s)
    port = free_port()
    launch = server_launch(exp, arm, port, control_dir=control_dir)
    return ServerSpec(cmd=launch.argv, env={**os.environ, **launch.env}, port=port, stop_wait_s=launch.stop_timeout_s)

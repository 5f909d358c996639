"""A real simulator process on a port of its own choosing, for tests, benchmarks, soak and the fault table.

A thin layer over loadtest.server_process (the suite's one server harness): the simulator binds port 0 and reports
its port through a file, so concurrent runs never race for ports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from loadtest.experiment import SIM_READY_S
from loadtest.server_process import ROOT, ServerError, ServerProcess, ServerSpec

REPO = ROOT


class SimServer:
    """`with SimServer("fixed", config="configs/sim/fast.yaml", overrides=[...]) as s: s.url`.

    start() returns once the port file says the server listens (wait_port=False: at once; then wait_for_port()).
    """

    def __init__(self, variant: str, *, config: str | os.PathLike | None = "configs/sim/fast.yaml",
                 overrides: list[str] = (), device: str = "cpu", wait_s: float = SIM_READY_S, wait_port: bool = True):
        self.variant, self.config, self.overrides, self.device = variant, config, list(overrides), device
        self.wait_s, self.wait_port = wait_s, wait_port
        self._dir = tempfile.TemporaryDirectory(prefix="ttssim-")
        self.port_file = Path(self._dir.name) / "port"
        self.log_path = Path(self._dir.name) / "server.log"
        cmd = [sys.executable, "-m", "ttssim", "--variant", variant, "--port", "0", "--device", device,
               "--port-file", str(self.port_file)]
        if config is not None:
            cmd += ["--config", str(REPO / config)]
        for o in self.overrides:
            cmd += ["--set", o]
        self.server = ServerProcess(ServerSpec(cmd=cmd, port_file=self.port_file, stop_wait_s=5.0), self.log_path)

    @property
    def proc(self) -> subprocess.Popen | None:
        return self.server.proc

    @property
    def port(self) -> int | None:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> SimServer:
        self.server.start()
        if self.wait_port:
            self.wait_for_port(self.wait_s)
        return self

    def wait_for_port(self, timeout_s: float) -> int:
        try:
            return self.server.wait_port(timeout_s)
        except ServerError as e:
            raise RuntimeError(f"simulator: {e}:\n{self.log()}") from None

    def wait_ready(self, timeout_s: float | None = None) -> str:
        """Port and /health answering 200 (the A/B runner's notion of ready)."""
        return self.server.wait_ready(self.wait_s if timeout_s is None else timeout_s)

    def log(self) -> str:
        return self.server.log_tail()

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM to its process group, then SIGKILL if it does not exit in time; returns the exit code."""
        return self.server.stop(signal.SIGTERM, timeout_s)

    def __enter__(self) -> SimServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
        self._dir.cleanup()

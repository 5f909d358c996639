"""Start a real simulator process on a free port and stop it again: for tests, the benchmark and the A/B runner.

The server binds port 0 and reports its port through a file, so concurrent test runs never race for ports.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


class SimServer:
    """`with SimServer("fixed", config="configs/sim/fast.yaml", overrides=[...]) as s: s.url`."""

    def __init__(self, variant: str, *, config: str | os.PathLike | None = "configs/sim/fast.yaml",
                 overrides: list[str] = (), device: str = "cpu", wait_s: float = 60.0, wait_port: bool = True):
        self.variant, self.config, self.overrides, self.device = variant, config, list(overrides), device
        self.wait_s, self.wait_port = wait_s, wait_port
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="ttssim-")
        self.port_file = Path(self._dir.name) / "port"
        self.log_path = Path(self._dir.name) / "server.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SimServer:
        cmd = [sys.executable, "-m", "ttssim", "--variant", self.variant, "--port", "0", "--device", self.device,
               "--port-file", str(self.port_file)]
        if self.config is not None:
            cmd += ["--config", str(REPO / self.config)]
        for o in self.overrides:
            cmd += ["--set", o]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        if self.wait_port:
            self.wait_for_port(self.wait_s)
        return self

    def wait_for_port(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.port_file.exists():
                self.port = int(self.port_file.read_text())
                return self.port
            if self.proc.poll() is not None:
                raise RuntimeError(f"simulator exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        raise TimeoutError(f"simulator did not listen within {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time; returns the exit code."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout_s)
        if getattr(self, "_log", None):
            self._log.close()
        return None if self.proc is None else self.proc.returncode

    def __enter__(self) -> SimServer:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
        self._dir.cleanup()

"""One server process and its life: start a command in its own process group, learn its port, wait until /health
answers, stop the whole group gracefully (SIGTERM, wait, SIGKILL).

The one harness behind the A/B runner's blocks, the simulator harness of the tests and tools (tools/sim_server.py),
the soak and the benchmarks; `wait_healthy` is also the locustfile's readiness check. A server that can bind port 0
reports its port through a file (no race for free ports); one that cannot gets a fixed port from `free_port()`.
HTTP goes through httpx.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from ttsrecords.paths import ROOT

STOP_WAIT_S = 15.0


class ServerError(RuntimeError):
    """The server exited or did not become ready; the message says which and where its log is."""


def free_port() -> int:
    """A port nobody listens on right now (the OS's choice); for servers that cannot report a port they bound."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(url: str, timeout_s: float = 2.0) -> tuple[bool, str]:
    """(True, "") when <url>/health answers 200, else (False, the reason); never raises."""
    try:
        r = httpx.get(url.rstrip("/") + "/health", timeout=timeout_s)
    except (httpx.HTTPError, OSError, ValueError) as e:  # refused, reset, timeout, bad URL
        return False, f"{type(e).__name__}: {str(e)[:160]}"
    if r.status_code == 200:
        return True, ""
    return False, f"/health answered HTTP {r.status_code}"


def wait_healthy(url: str, timeout_s: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, alive: Callable[[], bool] | None = None,
                 check: Callable[[str, float], tuple[bool, str]] = health) -> None:
    """Poll <url>/health until it answers 200 (each try bounded by the time left). ValueError for a URL that is not
    http(s)://host[:port]; TimeoutError with the last reason after timeout_s; ServerError if `alive()` turns False."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s)://host[:port] URL: {url!r}")
    deadline = clock() + timeout_s
    while True:
        if alive is not None and not alive():
            raise ServerError("server exited before it was ready")
        ok, last = check(url, max(0.1, min(2.0, deadline - clock())))
        if ok:
            return
        if clock() >= deadline:
            raise TimeoutError(f"not ready within {timeout_s:g} s ({last})")
        sleep(min(0.25, max(0.0, deadline - clock())))


def stop_group(proc: subprocess.Popen | None, sig: int = signal.SIGTERM, wait_s: float = STOP_WAIT_S) -> int | None:
    """Stop a process started in its own session, children included: `sig`, wait, then SIGKILL. Returns its code."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    return proc.returncode


@dataclass
class ServerSpec:
    """How to start one server: its command and environment, and where its port comes from (port_file when it binds
    port 0 and reports the port, else the fixed `port`), and how long a graceful stop may take."""

    cmd: list[str]
    env: dict[str, str] | None = None
    port: int | None = None
    port_file: Path | None = None
    stop_wait_s: float = STOP_WAIT_S
    host: str = "127.0.0.1"


class ServerProcess:
    """`with ServerProcess(spec, log_path) as s: s.wait_ready(60); s.url` — one server in its own process group."""

    def __init__(self, spec: ServerSpec, log_path: str | os.PathLike, *, cwd: str | os.PathLike = ROOT):
        self.spec = spec
        self.log_path = Path(log_path)
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.port: int | None = spec.port

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.spec.cmd, cwd=self.cwd, env=self.spec.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _exited(self) -> ServerError:
        return ServerError(f"server exited with code {self.proc.returncode} before it was ready (see {self.log_path.name})")

    def wait_port(self, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> int:
        """The port: fixed, or read from the port file once the server wrote it (it writes it once listening)."""
        deadline = time.monotonic() + timeout_s
        while self.port is None:
            pf = self.spec.port_file
            text = pf.read_text().strip() if pf is not None and pf.exists() else ""
            if text:
                self.port = int(text)
                break
            if not self.alive():
                raise self._exited()
            if time.monotonic() >= deadline:
                raise ServerError(f"server not ready within {timeout_s:g} s: not listening (see {self.log_path.name})")
            sleep(0.05)
        return self.port

    def wait_ready(self, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> str:
        """Port, then /health answering 200, within timeout_s in all; returns the URL. ServerError otherwise."""
        t0 = time.monotonic()
        self.wait_port(timeout_s, sleep)
        try:
            wait_healthy(self.url, max(0.0, timeout_s - (time.monotonic() - t0)), sleep=sleep, alive=self.alive)
        except ServerError:
            raise self._exited() from None
        except TimeoutError:
            if not self.alive():
                raise self._exited() from None
            raise ServerError(f"server not ready within {timeout_s:g} s (see {self.log_path.name})") from None
        return self.url

    def stop(self, sig: int = signal.SIGTERM, wait_s: float | None = None) -> int | None:
        """Graceful group stop (see stop_group); returns the exit code (None if never started)."""
        return stop_group(self.proc, sig, self.spec.stop_wait_s if wait_s is None else wait_s)

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

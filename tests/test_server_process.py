"""The one server harness (loadtest.server_process): readiness with a scripted clock (unit tier), and real process
groups started, found ready and stopped (slow tier)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from loadtest.server_process import ServerError, ServerProcess, ServerSpec, free_port, health, wait_healthy


class Clock:
    def __init__(self):
        self.t = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def test_wait_healthy_polls_until_200_within_the_time_left():
    clock, answers, asked = Clock(), [(False, "ConnectError: refused")] * 3 + [(True, "")], []

    def check(url, timeout_s):
        asked.append(timeout_s)
        return answers.pop(0)

    wait_healthy("http://127.0.0.1:1", 10.0, clock=clock, sleep=clock.sleep, check=check)
    assert clock.sleeps == [0.25, 0.25, 0.25] and all(0.1 <= t <= 2.0 for t in asked)


def test_wait_healthy_gives_up_with_the_last_reason_and_refuses_bad_urls():
    clock = Clock()
    with pytest.raises(TimeoutError, match=r"not ready within 1 s \(/health answered HTTP 503\)"):
        wait_healthy("http://127.0.0.1:1", 1.0, clock=clock, sleep=clock.sleep,
                     check=lambda url, t: (False, "/health answered HTTP 503"))
    assert clock.t == pytest.approx(1.0)
    for bad in ("127.0.0.1:8091", "ftp://127.0.0.1/", "http://"):
        with pytest.raises(ValueError, match="not an http"):
            wait_healthy(bad, 1.0, check=lambda url, t: (True, ""))
    with pytest.raises(ServerError, match="exited before it was ready"):
        wait_healthy("http://127.0.0.1:1", 5.0, alive=lambda: False, check=lambda url, t: (False, "x"))


def test_health_of_a_port_nobody_listens_on_says_why():
    ok, why = health(f"http://127.0.0.1:{free_port()}", 1.0)
    assert not ok and "refused" in why.lower()


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """True once pid no longer runs (absent, or a zombie waiting for init to reap it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_a_server_that_exits_before_it_is_ready_is_one_clear_error(tmp_path):
    spec = ServerSpec(cmd=[sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"],
                      port_file=tmp_path / "port")
    with ServerProcess(spec, tmp_path / "server.log") as s:
        with pytest.raises(ServerError, match=r"server exited with code 3 before it was ready \(see server.log\)"):
            s.wait_ready(30)
    assert "boom" in s.log_tail()


@pytest.mark.slow
def test_port_file_then_health_then_a_graceful_stop(tmp_path):
    port_file = tmp_path / "fake.port"
    spec = ServerSpec(cmd=[sys.executable, "-m", "tools.fakeserver", "--port", "0", "--port-file", str(port_file)],
                      port_file=port_file)
    s = ServerProcess(spec, tmp_path / "fake.log", cwd=ROOT).start()
    try:
        url = s.wait_ready(60)
        assert url == f"http://127.0.0.1:{int(port_file.read_text())}" and health(url)[0]
    finally:
        rc = s.stop()
    assert rc is not None and not s.alive() and not health(url, 1.0)[0]


@pytest.mark.slow
def test_stop_takes_the_whole_group_and_kills_what_ignores_sigterm(tmp_path):
    child = tmp_path / "child.pid"
    # bash and a child that both ignore SIGTERM: the group gets SIGTERM, then SIGKILL after the wait
    spec = ServerSpec(cmd=["bash", "-c", f"trap '' TERM; sleep 300 & echo $! > {child}; wait"], stop_wait_s=0.5)
    s = ServerProcess(spec, tmp_path / "group.log").start()
    deadline = time.monotonic() + 10
    while not (child.exists() and child.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(child.read_text())
    assert s.stop() == -9  # SIGKILL: it ignored SIGTERM
    assert _gone(pid), "the server's child outlived the group stop"
    assert os.getpgid(os.getpid()) != s.proc.pid  # it had a group of its own: the test's group was never signalled

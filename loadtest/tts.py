"""Locustfile of the TTS load test: `locust -f loadtest/tts.py --host http://HOST:PORT [-u N -t 30s | --scenario ...]`.

Wiring only: options (loadtest.locust_cli), a user class and a load shape hooked to loadtest.session, where the logic
lives. `locust -f loadtest/tts.py --help` lists the suite's options (loadtest/locust_help.py says how), as does
`python loadtest/tts.py --help`.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

import gevent
import gevent.pool
from locust import LoadTestShape, User, constant, events, task
from locust.runners import MasterRunner, WorkerRunner

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from any cwd

from loadtest.locust_cli import add_options  # noqa: E402
from loadtest.session import (  # noqa: E402
    CONNECT_BACKOFF_S,
    MSG_FLUSH,
    MSG_PHASE,
    MSG_RECORDS,
    SHIP_INTERVAL_S,
    Session,
)
from ttsrecords.scenario import ScenarioError  # noqa: E402

_session: Session | None = None


class _OncePerRun(logging.Filter):
    """Locust warns at every level that starts all its users at once (the scenario's spawn rate): the levels do that
    on purpose, so the warning is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "spawn rate is very high" not in record.getMessage()


logging.getLogger("locust.runners").addFilter(_OncePerRun())


@events.init_command_line_parser.add_listener
def _options(parser, **_kw):
    add_options(parser)


@events.init.add_listener
def _init(environment, runner=None, **_kw):
    global _session
    role = "master" if isinstance(runner, MasterRunner) else "worker" if isinstance(runner, WorkerRunner) else "local"
    try:
        _session = Session(environment, role)
    except (ScenarioError, ValueError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    if role != "worker" and environment.parsed_options.headless:
        # SIGTERM / Ctrl-C during a headless run: the shape ends at its next tick, in-flight requests finish, the
        # manifest says interrupted, the exit code is non-zero, no traceback. (Locust 2.47 installs its own SIGTERM
        # handler only after a headless shape run returns; the web UI keeps Locust's own handling, and a run stopped
        # there is marked interrupted when Locust quits before its schedule ended.)
        for sig, name in ((signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "SIGINT")):
            gevent.signal_handler(sig, _on_signal, name)
    if role == "master":
        runner.register_message(MSG_RECORDS, lambda environment, msg, **kw: _session.on_records_message(msg.node_id,
                                                                                                          msg.data))
    elif role == "worker":
        runner.register_message(MSG_PHASE, lambda environment, msg, **kw: _session.on_phase_message(msg.data))

        def flush(environment, msg, **kw):
            environment.runner.stop()  # kills the users, fires test_stop, which ships the final records
            _session.ship(final=True)  # no-op if test_stop already did

        runner.register_message(MSG_FLUSH, flush)

        def ship_loop():
            while True:
                gevent.sleep(SHIP_INTERVAL_S)
                _session.ship()

        gevent.spawn(ship_loop)


def _on_signal(name: str) -> None:
    """A headless run stops as interrupted; before it starts or once it is finishing there is nothing to stop."""
    if _session is not None:
        _session.interrupt(name)


@events.test_start.add_listener
def _test_start(environment, **_kw):
    _session.on_test_start()
    if _session.role == "master":
        _session.expect_workers(c.id for c in environment.runner.clients.all)


@events.test_stop.add_listener
def _test_stop(environment, **_kw):
    if _session.role == "worker":
        _session.ship(final=True)
    else:
        _session.finish()


@events.quitting.add_listener
def _quitting(environment, **_kw):
    if _session is not None and _session.role != "worker":
        _session.finish()


class TTSUser(User):
    """Closed loop: one request after another, no think time. Open loop: a Poisson arrival source."""

    wait_time = constant(0)

    def on_start(self):
        self.transport = None
        self.inflight = gevent.pool.Group()

    @task
    def speak(self):
        s = _session
        if not s.ready():
            gevent.sleep(0.05)
            return
        if s.scenario.loop == "closed":
            if self.transport is None:
                self.transport = s.new_transport(self.host)
            rec = s.one_request(self.transport)
            if not rec.ok and rec.status is None and rec.error.startswith("connect"):
                gevent.sleep(CONNECT_BACKOFF_S)
            return
        gevent.sleep(s.next_arrival_gap())
        ph = s.phase
        if ph is None:
            return
        if self.transport is None:
            self.transport = s.new_transport(self.host, connections=max(p.concurrency for p in s.scenario.steps))
        if s.inflight >= ph.concurrency:
            s.drop(ph)
            return
        self.inflight.spawn(s.tracked_request, self.transport)

    def on_stop(self):
        # stopped gracefully (a lower level, or the end): the open loop's in-flight requests finish and are recorded
        self.inflight.join(timeout=_session.run["timeout_s"] if _session and _session.run else 0)
        self.inflight.kill(block=False)
        if self.transport is not None:
            self.transport.close()


class TTSShape(LoadTestShape):
    """Levels of the scenario, each count (with --control) / warm-up / measure / drain; the schedule itself is
    loadtest.shape.Schedule, the edge actions loadtest.shape.edge_actions. It reads Locust's -u/-r/-t itself (one
    level: loadtest.locust_cli.one_level)."""

    use_common_options = True

    def tick(self):
        return _session.tick(self.get_run_time())


if __name__ == "__main__":  # `python loadtest/tts.py --help`: Locust's help with the suite's options
    from locust.argument_parser import get_parser

    get_parser().parse_args(sys.argv[1:] or ["--help"])

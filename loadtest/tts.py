"""Locustfile of the TTS load test: `locust -f loadtest/tts.py --host http://HOST:PORT [--scenario ...]`.

Wiring only: options, a user class and a load shape hooked to loadtest.session, where the logic lives.
"""

from __future__ import annotations

import os
import signal
import sys

import gevent
import gevent.pool
from locust import LoadTestShape, User, constant, events, task
from locust.runners import MasterRunner, WorkerRunner

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from any cwd

from loadtest.session import (  # noqa: E402
    CONNECT_BACKOFF_S,
    MSG_FLUSH,
    MSG_PHASE,
    MSG_RECORDS,
    SHIP_INTERVAL_S,
    Session,
    add_options,
)
from ttsrecords.scenario import ScenarioError  # noqa: E402

_session: Session | None = None


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
    if role != "worker":
        # Locust 2.47 installs its own SIGTERM handler only after a shape run returns: a SIGTERM during the run would
        # kill the process with no manifest. Until then, treat SIGTERM as Ctrl-C, which Locust handles (stop, flush).
        gevent.signal_handler(signal.SIGTERM, lambda: os.kill(os.getpid(), signal.SIGINT))
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
    loadtest.shape.Schedule, the edge actions loadtest.shape.edge_actions."""

    def tick(self):
        return _session.tick(self.get_run_time())

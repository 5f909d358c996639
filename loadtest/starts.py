"""The run's server starts: the runner asks for the planned start a window runs in; this launches it (stopping the
one before), proves it ready (the server's own stages line and one real request, within the ready timeout) and stops
it, keeping starts/<id>/start.json (ttsrecords.records.StartRecord) up to date at every step."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loadtest import experiment as ex
from loadtest.backends import control_path, server_spec
from loadtest.evidence import compile_cache_state
from loadtest.plan import has_control
from loadtest.provenance import utc
from loadtest.readiness import REQUEST_TIMEOUT_S as READY_REQUEST_S
from loadtest.readiness import confirm_ready, make_probe
from loadtest.server_process import ServerError, ServerProcess
from tts_predictor.control import write_control
from ttsrecords import records as rec


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived: stop the current window cleanly, keep everything written so far."""


@dataclass
class Start:
    """The server start in use: its record, folder, process, control file and where its epochs stand."""

    planned: int
    record: rec.StartRecord
    dir: Path
    server: ServerProcess
    url: str
    control: Path | None
    variant: str | None  # what the control file names now
    spec: str | None = None  # whose settings it names now (the arm; in a known-answer run the variants are the same)
    next_epoch: int = 1

    def save(self) -> None:
        rec.write_json(self.dir / "start.json", self.record.to_dict())


class Starts:
    """The server start in use (`active`) and how a new one begins and ends."""

    def __init__(self, run: Path, exp: ex.Experiment, arms: dict[str, ex.Arm], ready_timeout_s: float,
                 sleep: Callable[[float], None], procs: list):
        self.run, self.exp, self.arms, self.ready_timeout_s = run, exp, arms, ready_timeout_s
        self.sleep = sleep  # raises Interrupted on SIGINT/SIGTERM
        self.procs = procs  # the runner's processes, stopped when it ends
        self.active: Start | None = None
        self.probe = None  # readiness.Probe: the request that proves a start ready (made once)

    def _next_id(self) -> int:
        folder = self.run / "starts"
        ids = [int(p.name) for p in folder.iterdir() if p.name.isdigit()] if folder.is_dir() else []
        return max(ids, default=-1) + 1

    def ensure(self, planned: int, side: str, variant: str | None, spec: str, *, observe: bool, extra: dict,
               meta: rec.BlockRecord) -> Start:
        """Planned start `planned`, running: the one in use, or a new one of arm `side` (the old one stopped first).
        A new start's control file names `variant` (arm `spec`'s settings, `extra`) with the observer `observe`;
        its readiness time lands in the window's `meta` (the window that launched it pays for it)."""
        a = self.active
        if a is not None and a.planned == planned and a.server.alive():
            return a
        meta.timing["ready_s"] = None
        if a is not None:
            self.stop()
        n = self._next_id()
        meta.start = n
        sdir = self.run / "starts" / f"{n:03d}"
        sdir.mkdir(parents=True)
        arm = self.arms[side]
        control = control_path(sdir) if has_control(arm) else None
        record = rec.StartRecord(start=n, arm=side, started=utc(), reason="start in progress (runner stopped)")
        rec.write_json(sdir / "start.json", record.to_dict())
        if control is not None:  # no count phase: the observer stays on, the version-1 way (timing windows see it)
            write_control(control, variant, observe=observe, epoch=0, **extra)
        server = ServerProcess(server_spec(self.exp, arm, sdir, control is not None), sdir / "server.log").start()
        self.procs.append(server.proc)
        t0 = time.monotonic()
        try:
            url = server.wait_ready(self.ready_timeout_s, sleep=self.sleep)
            if self.probe is None:
                self.probe = make_probe(self.exp.model, self.exp.request)
            # the stages' line and one request get at least a request's time even after a start that used up
            # nearly all of the ready timeout
            left = max(READY_REQUEST_S, self.ready_timeout_s - (time.monotonic() - t0))
            record.ready_check = confirm_ready(server, self.probe, left, sleep=self.sleep)
        except Interrupted:
            record.status, record.reason = "interrupted", "SIGINT/SIGTERM while the server started"
            self._end(server, record, sdir)
            raise
        except (ServerError, OSError, ValueError) as e:
            record.status, record.reason = "failed", str(e)
            record.ready_s = None
            self._end(server, record, sdir)
            raise RuntimeError(str(e)) from None
        record.ready_s = meta.timing["ready_s"] = round(time.monotonic() - t0, 2)
        record.status, record.reason = "ready", None
        record.compile_cache = compile_cache_state(server.log_tail(200_000))
        self.active = Start(planned, record, sdir, server, url, control, variant if control else None,
                            spec if control else None)
        self.active.save()
        return self.active

    def _end(self, server: ServerProcess, record: rec.StartRecord, sdir: Path) -> None:
        t = time.monotonic()
        server.stop()
        record.stop_s = round(time.monotonic() - t, 2)
        record.ended = utc()
        rec.write_json(sdir / "start.json", record.to_dict())

    def stop(self, status: str = "stopped", reason: str | None = None) -> float | None:
        """Stop the start in use: status "stopped" after its windows, "failed" when it died, "interrupted". Returns
        the stop's seconds (None: no start was in use)."""
        a, self.active = self.active, None
        if a is None:
            return None
        if not a.server.alive() and status == "stopped":
            status, reason = "failed", reason or f"server exited with code {a.server.proc.returncode} (see server.log)"
        a.record.status, a.record.reason = status, reason
        self._end(a.server, a.record, a.dir)
        return a.record.stop_s

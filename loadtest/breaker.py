"""When a plain Locust run stops because the server stopped answering: the rule, apart from the load.

A server that dies mid-run used to turn a run into a storm of refused connections until its end. The breaker watches
what each request ended with and what the health check says, and names a cause once the server is gone:
- connection failures (refused, reset before an answer: the client's "connect: ..." records) with no success between
  them: CONNECT_FAILURES of them within WINDOW_S;
- requests the server accepted and never answered ("no response: ..."): TIMEOUT_FAILURES within TIMEOUT_WINDOW_S,
  no success between them;
- `/health` failing HEALTH_FAILURES times in a row (one look every HEALTH_EVERY_S).
HTTP errors, cut streams and bad audio are the server answering: they are data, recorded, and never stop a run
(FailFast in session.py stops a run whose first requests are all refused alike). Pure logic with a clock passed in.
"""

from __future__ import annotations

import time
from collections import deque
from datetime import datetime, timezone

WINDOW_S = 5.0
CONNECT_FAILURES = 5
TIMEOUT_WINDOW_S = 60.0
TIMEOUT_FAILURES = 5
HEALTH_EVERY_S = 1.0
HEALTH_TIMEOUT_S = 2.0
HEALTH_FAILURES = 3


def utc_clock(t: float) -> str:
    """An epoch time as the line shows it: 04:42:24Z (UTC)."""
    return datetime.fromtimestamp(t, timezone.utc).strftime("%H:%M:%SZ")


class Breaker:
    """`add` each outcome and `health` each look; both return the cause (one line) the first time the rule holds,
    else None. `cause` and `when` keep it."""

    def __init__(self, clock=time.time):
        self.clock = clock
        self.connect: deque[tuple[float, str]] = deque()
        self.timeouts: deque[tuple[float, str]] = deque()
        self.health_failed = 0
        self.cause: str | None = None
        self.when: float | None = None

    def add(self, ok: bool, status: int | None, error: str | None) -> str | None:
        if self.cause is not None:
            return None
        now = self.clock()
        if ok:
            self.connect.clear()
            self.timeouts.clear()
            return None
        if status is not None or not error:
            return None  # the server answered: an HTTP error or a cut stream is data
        if error.startswith("connect"):
            return self._count(self.connect, now, error, WINDOW_S, CONNECT_FAILURES, "connection failures")
        if error.startswith("no response"):
            return self._count(self.timeouts, now, error, TIMEOUT_WINDOW_S, TIMEOUT_FAILURES, "requests unanswered")
        return None

    def health(self, ok: bool, reason: str | None = None) -> str | None:
        if self.cause is not None:
            return None
        if ok:
            self.health_failed = 0
            return None
        self.health_failed += 1
        if self.health_failed < HEALTH_FAILURES:
            return None
        return self._trip(self.clock(), f"the server's /health failed {self.health_failed} times in a row "
                                        f"({reason or 'no answer'})")

    def _count(self, q: deque, now: float, error: str, window: float, n: int, what: str) -> str | None:
        q.append((now, error))
        while q and q[0][0] < now - window:
            q.popleft()
        if len(q) < n:
            return None
        return self._trip(now, f"{len(q)} {what} in {now - q[0][0]:.1f} s, none answered between them: {error}")

    def _trip(self, now: float, what: str) -> str:
        self.when = now
        self.cause = f"the server stopped answering at {utc_clock(now)}: {what}"
        return self.cause

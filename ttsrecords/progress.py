"""<run>/progress.json: where a running A/B run stands (the runner writes it every few seconds, the dashboard reads it).

Its own module beside the record contract: it is not a measurement, it is replaced as the run goes.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ttsrecords.records import PROGRESS_SCHEMA, read_json

PROGRESS_FILE = "progress.json"
PROGRESS_STATES = ("starting", "load", "look", "ended")


@dataclass(frozen=True)
class Progress:
    """<run>/progress.json: where a running A/B run stands, the numbers of the runner's console line (rounds, window,
    phase, time left), replaced atomically every few seconds while it runs and once when it ends. Everything else a
    live view shows (windows judged invalid, sequential looks) is in the run's own files already.

    state: "starting" (a window's server start or preparation), "load" (Locust runs the window), "look" (the
    sequential rule after a round), "ended" (the run stopped: `status` says how). level / phase: where the window's
    schedule stands by its own clock since Locust was launched (Locust's start-up makes it lead by a few seconds;
    None once that schedule is over while Locust still stops)."""

    t: float  # epoch seconds of this update
    state: str  # PROGRESS_STATES
    status: str  # the run's status: running | complete | interrupted | failed
    rounds_done: int  # rounds whose windows are all done (complete or invalid)
    rounds_planned: int
    windows_planned: int
    round: int | None = None  # the current round (0-based, as in block ids)
    kind: str | None = None  # "ab" | "aa"
    window: int | None = None  # the current window, 1-based position in the plan
    block_id: str | None = None
    arm: str | None = None
    label: str | None = None  # what the window runs (variant or arm label)
    level: int | None = None  # concurrency the window's schedule is at
    phase: str | None = None  # PHASES
    elapsed_s: float | None = None  # of the window's load
    length_s: float | None = None  # the window's scheduled length
    left_s: float | None = None  # estimated seconds left in the run (the console's estimate)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": PROGRESS_SCHEMA, **asdict(self)}


PROGRESS_FIELDS = tuple(f.name for f in fields(Progress))


def read_progress(run_dir: str | os.PathLike) -> Progress | None:
    """<run>/progress.json as a Progress (None: the file does not exist, e.g. a run of an older runner); refuse an
    unknown schema or a state outside PROGRESS_STATES (ValueError naming the file)."""
    path = Path(run_dir) / PROGRESS_FILE
    try:
        obj = read_json(path)
    except ValueError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if obj is None:
        return None
    if obj.get("schema") != PROGRESS_SCHEMA:
        raise ValueError(f"{path}: unknown schema {obj.get('schema')!r} (this reader knows {PROGRESS_SCHEMA!r})")
    if obj.get("state") not in PROGRESS_STATES:
        raise ValueError(f"{path}: state {obj.get('state')!r} is not one of {list(PROGRESS_STATES)}")
    try:
        return Progress(**{k: obj[k] for k in PROGRESS_FIELDS if k in obj})
    except TypeError as e:
        raise ValueError(f"{path}: {e}") from None

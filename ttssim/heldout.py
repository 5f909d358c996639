"""The simulator's held-out error against the real CPU server, read from the one committed file that holds it
(reports/bench/sim-vs-cpu.json, written by tools/sim_vs_real.py): every SIMULATED banner quotes it from here."""

from __future__ import annotations

import json
from pathlib import Path

from ttsrecords.paths import ROOT

PATH = ROOT / "reports" / "bench" / "sim-vs-cpu.json"
KEY = "heldout_within_pct"


def write(result: dict, path: Path = PATH) -> None:
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")


def line() -> str:
    """'held-out error vs the real CPU server: within X % (reports/bench/sim-vs-cpu.md)', or why there is none."""
    try:
        pct = json.loads(PATH.read_text(encoding="utf-8"))[KEY]
    except (OSError, ValueError, KeyError):
        return "held-out error vs the real CPU server: not measured (tools/sim_vs_real.py)"
    return f"held-out error vs the real CPU server: within {pct:.0f} % (reports/bench/sim-vs-cpu.md)"

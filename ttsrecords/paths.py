"""Where the suite's checkout is: configs, reports and the sources live relative to it (installed editable)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

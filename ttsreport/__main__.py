"""`python -m ttsreport reports/<run>`: rebuild statistics and report from the stored files (partial runs too)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .analysis import write_statistics
from .report import write_report
from .verdict import Settings


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsreport", description=__doc__)
    ap.add_argument("run", help="run folder, e.g. reports/<run>")
    ap.add_argument("--margin", type=float, default=1.0, help="target margin in %% (default 1)")
    ap.add_argument("--confidence", type=float, default=0.95, help="family-wise confidence (default 0.95)")
    ap.add_argument("--micro", help="results.json of `make micro` for the prediction (default: the counters)")
    a = ap.parse_args(argv)
    run = Path(a.run)
    if not run.is_dir():
        print(f"error: {run} is not a folder", file=sys.stderr)
        return 2
    try:
        write_statistics(run, Settings(confidence=a.confidence, margin_pct=a.margin), a.micro)
        index = write_report(run)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())

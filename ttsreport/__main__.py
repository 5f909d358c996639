"""`python -m ttsreport reports/<run>`: rebuild statistics and report from the stored files (partial runs too).

A plain Locust run (`locust -f loadtest/tts.py`, no A/B windows) gets its own load-run page (ttsreport.loadpage), not
the A/B report; `--summary` prints its short summary before the page's path (what Locust prints when it ends).

`--look` appends the sequential rule's decision after the rounds so far to <run>/looks.jsonl (the runner's stop
signal) and prints it; `--plan` writes <run>/plan.json from a nested pilot. Bad input: one line on stderr, exit 2;
any other failure of the analysis: one line, exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .analysis import Options, write_statistics
from .loadpage import summary_text, write_load_report
from .loadrun import is_load_run
from .looks import append_look, look
from .looks import one_line as look_line
from .pilot import one_line as plan_line
from .pilot import plan, write_plan
from .render import write_report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ttsreport", description=__doc__.splitlines()[0])
    ap.add_argument("run", help="run folder, e.g. reports/<run>")
    ap.add_argument("--margin-pct", type=float, default=None,
                    help="equivalence margin in %% (default: the run's pre-registered margin, recorded in its "
                         "manifest; given, it overrides that and the report says so)")
    ap.add_argument("--confidence", type=float, default=None,
                    help="confidence of every interval (default: the run's pre-registered confidence, else 0.95)")
    ap.add_argument("--micro", help="results.json of `make micro` for the prediction (default: the counters)")
    what = ap.add_mutually_exclusive_group()
    what.add_argument("--look", action="store_true", help="sequential look: append one line to <run>/looks.jsonl")
    what.add_argument("--plan", action="store_true", help="plan S starts x W window pairs from a nested pilot")
    ap.add_argument("--summary", action="store_true",
                    help="a plain Locust run: print its short summary before the report's path")
    ap.add_argument("--target-halfwidth-pct", type=float, default=1.0,
                    help="with --plan: the interval half-width to reach, in %% (default 1)")
    a = ap.parse_args(argv)
    run = Path(a.run)
    if not run.is_dir():
        print(f"error: {run} is not a folder", file=sys.stderr)
        return 2
    try:
        if is_load_run(run) and not (a.look or a.plan):
            index, nums = write_load_report(run)
            print(summary_text(nums, index) if a.summary else index)
            return 0
        if a.look:
            line = look(run, margin_pct=a.margin_pct, confidence=a.confidence)
            append_look(run, line)
            print(look_line(line))
            return 0
        if a.plan:
            obj = plan(run, target_halfwidth_pct=a.target_halfwidth_pct, confidence=a.confidence)
            path = write_plan(run, obj)
            print(plan_line(obj))
            print(path)
            return 0
        write_statistics(run, Options(confidence=a.confidence, margin_pct=a.margin_pct, micro=a.micro))
        index = write_report(run)
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as e:
        msg = str(e).replace("\n", " ") if not isinstance(e, KeyError) else f"missing field {e}"
        print(f"error: {run}: {msg}", file=sys.stderr)
        return 2
    except Exception as e:  # any other failure of the analysis: still one line and a non-zero exit, never a traceback
        msg = str(e).replace("\n", " ")
        print(f"error: {run}: the analysis failed ({type(e).__name__}: {msg})", file=sys.stderr)
        return 1
    print(index)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The A/B command line: `python -m loadtest.ab` (`make ab`, `make demo`).

`python -m loadtest.ab --a original --b fixed --backend sim --rounds 3 --aa-rounds 1 --scenario ... --sim-config ...`,
`--resume reports/<run>` to continue an interrupted run, `--demo` for `make demo`. It writes the plan and the manifest
(loadtest.plan), runs the blocks (loadtest.runner), then builds the statistics and the report by running
`python -m ttsreport <run>` and prints the report's path. Importing this module loads neither scipy nor ttsreport.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from loadtest.backends import BACKENDS
from loadtest.plan import ROOT, new_run, utc
from loadtest.records import AB_SCHEMA
from loadtest.runner import Runner
from tts_predictor.domain import DEFAULT_VARIANT

# `make demo`: the demo's settings (levels, phases, prompts, simulator batch and queue) and why live in
# configs/scenarios/demo.yaml and configs/sim/demo.yaml; the preset only points at them and fixes the plan
# (1 A/A + 3 A/B rounds = 8 blocks). It overrides nothing, so what those files say is what runs.
DEMO = {"a": DEFAULT_VARIANT, "b": "fixed", "backend": "sim", "rounds": 3, "aa_rounds": 1,
        "scenario": "configs/scenarios/demo.yaml", "sim_config": "configs/sim/demo.yaml",
        "sim_set": [], "b_sim_set": [], "levels": None, "warmup_s": None, "measure_s": None, "drain_s": None,
        "last_drain_s": None, "scenario_set": [], "name": None, "seed": None}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.ab", description=__doc__.splitlines()[0])
    p.add_argument("--a", default=DEFAULT_VARIANT, help="variant of arm A (the baseline)")
    p.add_argument("--b", default="fixed", help="variant of arm B")
    p.add_argument("--backend", choices=sorted(BACKENDS), default="sim")
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds (each: A and B in random order)")
    p.add_argument("--aa-rounds", type=int, default=1, help="A/A rounds first (noise floor)")
    p.add_argument("--scenario", default="configs/scenarios/ab-default.yaml")
    p.add_argument("--sim-config", default="configs/sim/default.yaml")
    p.add_argument("--sim-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="simulator override for every block (ttssim --set)")
    p.add_argument("--b-sim-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="simulator override for arm B of A/B rounds only (known-answer tests: model.extra_step_pct=2)")
    p.add_argument("--warmup-s", type=float, help="override the scenario's warm-up per step")
    p.add_argument("--measure-s", type=float, help="override the scenario's measure phase per step")
    p.add_argument("--drain-s", type=float, help="override the scenario's drain per step")
    p.add_argument("--levels", help="override the concurrency steps, e.g. 8,64")
    p.add_argument("--last-drain-s", type=float, help="drain after the last step only (requests still running when "
                   "Locust stops are never recorded, so the last level's latencies need it)")
    p.add_argument("--scenario-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a top-level scenario key (YAML value), e.g. 'mix={short: 1}'")
    p.add_argument("--seed", type=int, default=None, help="seed of the A/B order (default: random, recorded)")
    p.add_argument("--request-timeout", type=float, default=None,
                   help="seconds per request, passed to the locustfile (default: the scenario's timeout_s)")
    p.add_argument("--ready-timeout", type=float, default=None,
                   help="seconds to wait for /health per block (default 120 on sim, 1200 on vllm: image build, weights)")
    p.add_argument("--out", default="reports", help="parent folder of the run folder")
    p.add_argument("--name", default=None, help="run folder name (default ab-<UTC>)")
    p.add_argument("--micro", default=None, help="micro benchmark results.json for the prediction")
    p.add_argument("--resume", default=None, help="continue reports/<run> after its last completed block")
    p.add_argument("--demo", action="store_true", help="the `make demo` preset (original vs fixed + A/A, simulator)")
    p.add_argument("--no-report", action="store_true", help="skip statistics and report at the end")
    return p.parse_args(argv)


def build_report(run: Path, micro: str | None) -> Path | None:
    """Statistics and report of the run (`python -m ttsreport`, a separate process: the load side never imports the
    statistics); the index.html path, or None with the error printed."""
    cmd = [sys.executable, "-m", "ttsreport", str(run)] + (["--micro", micro] if micro else [])
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if p.returncode != 0 or not p.stdout.strip():
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        print(f"error: report for {run} failed: {why}", file=sys.stderr)
        return None
    return Path(p.stdout.strip().splitlines()[-1])


def _progress_printer():
    tty = sys.stdout.isatty()
    last = [0.0]

    def show(line: str) -> None:
        now = time.monotonic()
        if tty:
            print("\r" + line[:150].ljust(150), end="", flush=True)
        elif now - last[0] >= 10.0:
            print(line, flush=True)
            last[0] = now
    return show


def main(argv=None) -> int:
    a = parse_args(argv)
    os.chdir(ROOT)  # configs and the locustfile are addressed from the repository root
    if a.demo:
        for k, v in DEMO.items():
            setattr(a, k, v)
    if a.resume:
        run = Path(a.resume)
        mpath = run / "manifest.json"
        if not mpath.is_file():
            print(f"error: {mpath} not found: nothing to resume", file=sys.stderr)
            return 2
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        if manifest.get("schema") != AB_SCHEMA:
            print(f"error: {mpath}: not an A/B run (schema {manifest.get('schema')!r})", file=sys.stderr)
            return 2
        manifest.setdefault("resumed", []).append(utc())
        print(f"resuming {run}")
    else:
        try:
            run, manifest = new_run(a)
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 2
    runner = Runner(run, manifest, _progress_printer())
    print(f"A/B run {run}: {manifest['variants']['A']} (A) vs {manifest['variants']['B']} (B) on "
          f"{manifest['backend']['name']}, {len(manifest['plan'])} blocks of ~{runner.block_s:.0f} s", flush=True)
    status = runner.execute()
    print()
    index = None if a.no_report else build_report(run, manifest["settings"].get("micro"))
    if status == "interrupted":
        print(f"interrupted: partial data kept in {run}; continue with: make ab RESUME={run}", file=sys.stderr)
    if index:
        print(f"report: {index}")
    return 130 if status == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())

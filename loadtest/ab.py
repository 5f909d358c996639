"""The A/B command line: `python -m loadtest.ab` (`make ab`, `make demo`).

`--experiment configs/experiments/x.yaml` runs an experiment file (arms as server specs; `--simulate` puts every arm
on its simulator stand-in); `--a original --b fixed` is the shorthand for the mission's experiment (simulator unless
`--backend vllm`). `--design fresh|swap|nested`, `--until-decided --max-rounds N`, `--pilot`, `--plan-from DIR`,
`--resume reports/<run>` to continue an interrupted run, `--demo` for `make demo`, `--dry-run` to print every command
and the plan without running anything. It writes the plan and the manifest (loadtest.plan), runs the rounds
(loadtest.runner), then builds the statistics and the report by running `python -m ttsreport <run>` and prints the
report's path. Importing this module loads neither scipy nor ttsreport.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from loadtest import experiment as ex
from loadtest.launch import dry_run
from loadtest.plan import ROOT, describe, experiment_for, new_run
from loadtest.provenance import sha256, utc
from loadtest.runner import Runner
from ttsrecords import cpuserver
from ttsrecords import runsettings as rs
from ttsrecords.records import AB_SCHEMA, DESIGNS

# `make demo`: the demo's settings (levels, phases, prompts) and why live in configs/scenarios/demo.yaml; it runs on
# the fitted simulator profile (configs/sim/default.yaml, fidelity in docs/simulator.md). The preset only points at
# them and fixes the plan: one server start, windows hot-swapped in balanced ABBA order (design swap: no start-up per
# window), 3 A/B rounds = 6 windows. It overrides nothing in those files, so what they say is what runs.
DEMO = {"a": "original", "b": "fixed", "backend": "sim", "rounds": 3, "aa_rounds": 0, "design": "swap",
        "settle_s": 1.0, "scenario": "configs/scenarios/demo.yaml", "sim_config": "configs/sim/default.yaml"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.ab", description=__doc__.splitlines()[0])
    g = p.add_argument_group("what is compared")
    g.add_argument("--experiment", default=None, help="experiment file (configs/experiments/*.yaml): arms, scenario, "
                   "design defaults")
    g.add_argument("--a", default=None, help="shorthand: variant of arm A, the baseline (default original)")
    g.add_argument("--b", default=None, help="shorthand: variant of arm B (default fixed)")
    g.add_argument("--backend", choices=sorted(ex.BACKENDS), default=None,
                   help="sim: every arm on its simulator stand-in (default for the shorthand); vllm: the real servers")
    g.add_argument("--executor", choices=cpuserver.EXECUTORS, default=None,
                   help=f"--backend {ex.CPU_BACKEND} only: vLLM's executor in every stage of every arm (default: "
                        f"{cpuserver.DEFAULT_EXECUTOR}, the stock files; uni is quieter on a 2-core CPU, "
                        "docs/real-cpu-server.md)")
    g.add_argument("--simulate", action="store_true", help="every arm of the experiment on its simulator stand-in "
                   "(labelled SIMULATED)")
    g.add_argument("--sim-config", default=None, help="simulator config of every sim arm (shorthand default "
                   "configs/sim/default.yaml; an experiment's sim arms name their own)")
    g.add_argument("--sim-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="simulator override for every sim arm (ttssim --set)")
    g.add_argument("--b-sim-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="simulator override for arm B only (known-answer tests: model.extra_step_pct=2; with "
                        "--a X --b X the arms differ only by it)")
    g.add_argument("--b-host-delay-us", type=float, default=None, metavar="US",
                   help="positive control on a real server (vllm, vllm-cpu): arm B's plugin adds US microseconds of "
                        "host time to every build_attn_metadata call (the control file's host_delay_us); with --a X "
                        "--b X the arms differ only by it, a known slowdown the run must find")
    g = p.add_argument_group("design")
    g.add_argument("--design", choices=DESIGNS, default=None,
                   help="fresh: a server start per window (default); swap: one start, arms hot-swapped in ABBA/BAAB "
                        "order; nested: --starts S x --window-pairs W")
    g.add_argument("--rounds", type=int, default=None, help="A/B rounds (default 3, or the experiment's)")
    g.add_argument("--aa-rounds", type=int, default=None,
                   help="A/A rounds at seeded random positions among the A/B rounds (default 1, or the experiment's)")
    g.add_argument("--seed", type=int, default=None, help="seed of the plan (default: random, recorded; or the "
                   "experiment's)")
    g.add_argument("--starts", type=int, default=None, help="nested: server starts S")
    g.add_argument("--window-pairs", type=int, default=None, help="nested: A/B window pairs per start W (default 2)")
    g.add_argument("--settle-s", type=float, default=None,
                   help="swap/nested: extra warm-up after a switch, not measured (default 5)")
    g.add_argument("--until-decided", action="store_true",
                   help="sequential: after each round `python -m ttsreport <run> --look`; stop when it says so")
    g.add_argument("--max-rounds", type=int, default=None, help="sequential: most A/B rounds (default --rounds)")
    g.add_argument("--min-rounds", type=int, default=None,
                   help=f"sequential: A/B rounds before a stop (default {rs.DEFAULT_MIN_ROUNDS}, at least "
                        f"{rs.MIN_UNITS}; nested: at least {rs.MIN_UNITS} starts)")
    g = p.add_argument_group("pre-registered analysis (recorded in the manifest; ttsreport uses them)")
    g.add_argument("--margin-pct", type=float, default=None,
                   help="equivalence margin in %% (default: the experiment file's analysis.margin_pct, else "
                        f"{rs.DEFAULT_MARGIN_PCT:g})")
    g.add_argument("--confidence", type=float, default=None,
                   help=f"confidence of every interval (default: the experiment file's, else {rs.DEFAULT_CONFIDENCE:g})")
    g.add_argument("--primary-metric", default=None,
                   help="the metric that decides the headline (default: the experiment file's primary_metric)")
    g.add_argument("--pilot", action="store_true",
                   help="a short nested pilot (2 starts x 2 window pairs, no A/A), then `ttsreport --plan`")
    g.add_argument("--plan-from", default=None, metavar="DIR", help="nested design with S and W from DIR/plan.json")
    g.add_argument("--target-halfwidth-pct", type=float, default=None,
                   help="pilot: the CI half-width the plan aims at (passed to ttsreport --plan)")
    g = p.add_argument_group("load")
    g.add_argument("--scenario", default=None, help="scenario file (default ab-default.yaml, or the experiment's)")
    g.add_argument("--count-s", type=float, help="override the scenario's count phase per level (0: none)")
    g.add_argument("--warmup-s", type=float, help="override the scenario's warm-up per level")
    g.add_argument("--measure-s", type=float, help="override the scenario's measure phase per level")
    g.add_argument("--drain-s", type=float, help="override the scenario's drain per level")
    g.add_argument("--levels", help="override the concurrency levels, e.g. 8,64")
    g.add_argument("--last-drain-s", type=float, help="drain of the scenario's last-listed level only (a drain goes "
                   "with its level: it lets the level's measured requests finish under its own load)")
    g.add_argument("--scenario-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a top-level scenario key (YAML value), e.g. 'mix={short: 1}'")
    g.add_argument("--request-timeout", type=float, default=None,
                   help="seconds per request, passed to the locustfile (default: the scenario's timeout_s)")
    g.add_argument("--ready-timeout", type=float, default=None,
                   help="seconds from launch to /health per start (default: 120 + the simulator's modelled start-up; "
                        "1200 on vllm, images and model prepared before)")
    g = p.add_argument_group("run")
    g.add_argument("--out", default="reports", help="parent folder of the run folder")
    g.add_argument("--name", default=None, help="run folder name (default ab-<UTC>)")
    g.add_argument("--micro", default=None, help="micro benchmark results.json for the prediction")
    g.add_argument("--resume", default=None, help="continue reports/<run>: every round not done yet")
    g.add_argument("--demo", action="store_true", help="the `make demo` preset (original vs fixed + A/A, simulator)")
    g.add_argument("--dry-run", action="store_true", help="print every command and the plan; run and write nothing")
    g.add_argument("--no-report", action="store_true", help="skip statistics and report at the end")
    return p.parse_args(argv)


def ttsreport(run: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """`python -m ttsreport <run> ...` as a process: the load side never imports the statistics."""
    return subprocess.run([sys.executable, "-m", "ttsreport", str(run), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def build_report(run: Path, micro: str | None) -> Path | None:
    """Statistics and report of the run; the index.html path, or None with the error printed."""
    p = ttsreport(run, *(["--micro", micro] if micro else []))
    if p.returncode != 0 or not p.stdout.strip():
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        print(f"error: report for {run} failed: {why}", file=sys.stderr)
        return None
    return Path(p.stdout.strip().splitlines()[-1])


def pilot_plan(run: Path, target: float | None) -> int:
    """After a pilot: `python -m ttsreport <run> --plan` writes plan.json; print its answer."""
    p = ttsreport(run, "--plan", *(["--target-halfwidth-pct", f"{target:g}"] if target is not None else []))
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit code {p.returncode}"])[-1]
        print(f"error: plan from pilot {run} failed: {why}", file=sys.stderr)
        return 1
    print(p.stdout.rstrip())
    print(f"next: make ab ... PLAN_FROM={run}")
    return 0


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


def _resume(path: str) -> tuple[Path, dict]:
    run = Path(path)
    mpath = run / "manifest.json"
    if not mpath.is_file():
        raise SystemExit(f"error: {mpath} not found: nothing to resume")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except ValueError as e:
        raise SystemExit(f"error: {mpath}: not JSON ({e})") from None
    if manifest.get("schema") != AB_SCHEMA:
        raise SystemExit(f"error: {mpath}: not an A/B run of this runner (schema {manifest.get('schema')!r}, "
                         f"want {AB_SCHEMA!r})")
    e = manifest.get("experiment") or {}
    if e.get("path") and e.get("sha256") and (ROOT / e["path"]).is_file() and sha256(ROOT / e["path"]) != e["sha256"]:
        raise SystemExit(f"error: {e['path']} changed since {run} began: resume with the file it ran")
    manifest.setdefault("resumed", []).append(utc())
    print(f"resuming {run}")
    return run, manifest


def main(argv=None) -> int:
    a = parse_args(argv)
    os.chdir(ROOT)  # configs and the locustfile are addressed from the repository root
    if a.demo:
        for k, v in DEMO.items():
            setattr(a, k, v)
    try:
        if a.dry_run:
            with tempfile.TemporaryDirectory(prefix="tts-ab-dry-") as tmp:
                a.out, a.name = tmp, "dry-run"
                _, manifest = new_run(a)
                d = manifest["design"]  # the header says what this run would do, options over the file
                exp = replace(experiment_for(manifest["settings"]), scenario=manifest["scenario"]["path"],
                              rounds=d["rounds"], aa_rounds=d["aa_rounds"], seed=d["seed"])
                sys.stdout.write(dry_run(exp, hot_swap=d["hot_swap"]))
                print("## the plan (nothing was run or written)")
                print(describe(manifest))
            return 0
        run, manifest = _resume(a.resume) if a.resume else new_run(a)
        runner = Runner(run, manifest, _progress_printer())
    except SystemExit as e:
        print(e, file=sys.stderr)
        return 2
    except ex.ExperimentError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    labels = manifest["labels"]
    sim = " [SIMULATED]" if manifest["backend"]["simulated"] else ""
    print(f"A/B run {run}: {labels['A']} (A) vs {labels['B']} (B) on {manifest['backend']['name']}{sim}", flush=True)
    if manifest.get("confounded"):
        print(f"CONFOUNDED: {manifest['confounded']}", flush=True)
    print(describe(manifest), flush=True)
    status = runner.execute()
    print()
    index = None if a.no_report else build_report(run, manifest["settings"].get("micro"))
    if status == "interrupted":
        print(f"interrupted: partial data kept in {run}; continue with: make ab RESUME={run}", file=sys.stderr)
    if index:
        print(f"report: {index}")
    if status == "interrupted":
        return 130
    if status == "failed":
        return 1
    if index is None and not a.no_report:
        return 1  # the run's data are kept, but a command that promised a report and wrote none has failed
    if manifest["design"].get("pilot"):
        return pilot_plan(run, manifest["settings"].get("target_halfwidth_pct"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What an A/B run will do, written down before it starts: the experiment and its arms, the design and its window
plan (loadtest.design), the effective scenario, the environment and the manifest (schema tts-ab/2) that records them.

`make ab A=original B=fixed` is the shorthand for the mission's experiment (loadtest.experiment.mission) with the
simulator standing in unless BACKEND=vllm; `make ab EXPERIMENT=configs/experiments/x.yaml` runs a file. Every bad
argument is a one-line SystemExit("error: ...") before anything is written. The manifest records no environment
variables, so no tokens.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import yaml

from loadtest import experiment as ex
from loadtest.design import SWAPPED, make_plan  # noqa: F401  (make_plan: the tests build runs with it)
from loadtest.evidence import arm_manifest, length_warning, local_digests
from loadtest.launch import SERVE_SH
from loadtest.provenance import code_fingerprint, environment, package_version, sha256, utc
from loadtest.resume import RESUME_POLICY
from loadtest.scenario import effective_scenario, load_scenario
from tts_predictor.control import MAX_HOST_DELAY_US
from tts_predictor.domain import DEFAULT_VARIANT, VARIANT_NAMES
from ttsrecords import runsettings as rs
from ttsrecords.manifest import RunLog
from ttsrecords.paths import ROOT
from ttsrecords.records import AB_SCHEMA, sim_profile_copy, write_json
from ttsrecords.scenario import ScenarioError
from ttsrecords.windows import plan_from_list, plan_to_list, starts_of, with_order

SHORTHAND_SCENARIO = "configs/scenarios/ab-default.yaml"
SHORTHAND_SIM_CONFIG = "configs/sim/default.yaml"
DEFAULT_ROUNDS, DEFAULT_AA_ROUNDS = 3, 1
DEFAULT_WINDOW_PAIRS = 2  # nested: A/B window pairs per server start
DEFAULT_SETTLE_S = 5.0  # swap / nested: extra warm-up after a switch, not measured
PILOT = {"starts": 2, "window_pairs": 2, "aa_rounds": 0}  # `make ab PILOT=1`: a short nested pilot for --plan


# --- the experiment of a run -----------------------------------------------------------------------------------


def window_problems(sc, arms: dict[str, ex.Arm]) -> list[str]:
    """What in a closed-loop scenario's phases is too short for the requests of these arms, as their simulator
    stand-ins predict them (loadtest.window_fit); empty when an arm has no stand-in to predict from."""
    from loadtest import window_fit  # numpy and the simulator's virtual replay: only when a run is planned

    stand_ins = [(str(ROOT / x.sim.config) if x.sim and x.sim.config else None, tuple(x.sim.set) if x.sim else (),
                  x.sim.variant if x.sim else x.variant) for x in arms.values()]
    if sc.loop != "closed" or any(cfg is None for cfg, _s, _v in stand_ins):
        return []
    try:
        latencies = window_fit.predict(sc, stand_ins)
    except ValueError:  # a profile or override the simulator refuses: its server start says so, as it always did
        return []
    return window_fit.problems(sc, latencies)


def arms_of(exp: ex.Experiment) -> dict[str, ex.Arm]:
    """The experiment's first two arms as the comparison's A (baseline) and B."""
    arms = list(exp.arms.values())
    return {"A": arms[0], "B": arms[1]}


def experiment_for(s: dict) -> ex.Experiment:
    """The experiment a run's settings describe (new runs and resumes): a file or the mission shorthand, simulated if
    asked, with the simulator overrides of the command line. Raises ExperimentError (one line)."""
    if s.get("experiment"):
        exp = ex.load_experiment(ROOT / s["experiment"] if not Path(s["experiment"]).is_absolute() else s["experiment"])
        if len(exp.arms) != 2:
            raise ex.ExperimentError(f"{exp.path}: arms: the A/B runner compares two arms, this file has "
                                     f"{len(exp.arms)}")
    else:
        a, b = s["a"], s["b"]
        # same variant, B slowed by --b-sim-set (calibration) or by --b-host-delay-us (a real server's positive control)
        known_answer = a == b and bool(s.get("b_sim_set") or s.get("b_host_delay_us"))
        if a not in VARIANT_NAMES or b not in VARIANT_NAMES:
            bad = a if a not in VARIANT_NAMES else b
            raise ex.ExperimentError(f"unknown variant {bad!r} (known: {', '.join(sorted(VARIANT_NAMES))})")
        other = next(v for v in VARIANT_NAMES if v != a)
        exp = ex.mission(a, other if known_answer else b)
        if known_answer:
            arm_b = exp.arms["B"]
            sets = ", ".join(s.get("b_sim_set") or [])
            exp = replace(exp, arms={**exp.arms, "B": replace(
                arm_b, label=f"{a} ({sets})" if sets else a, variant=a,
                evidence=replace(arm_b.evidence, sync_signature=a),
                sim=replace(arm_b.sim, variant=a) if arm_b.sim else None)},
                name=f"known-answer-{a}",
                idea=f"{a} against itself, arm B slowed by {sets}: a known answer for the statistics" if sets else
                     f"{a} against itself, arm B slowed by the plugin's host delay: a known answer on a real server")
    if s.get("simulate") and not exp.simulated:
        exp = ex.simulated(exp)
    elif s.get("cpu"):
        exp = ex.on_cpu(exp, s.get("executor"))
    if s.get("b_host_delay_us"):
        exp = positive_control(exp, float(s["b_host_delay_us"]))
    arms = {}
    for side, (name, arm) in zip("AB", exp.arms.items(), strict=True):
        if arm.backend == "sim" and arm.sim is not None:
            sets = (*arm.sim.set, *(s.get("sim_set") or []), *((s.get("b_sim_set") or []) if side == "B" else []))
            arm = replace(arm, sim=replace(arm.sim, config=s.get("sim_config") or arm.sim.config, set=tuple(sets)))
        arms[name] = arm
    return replace(exp, arms=arms)


def positive_control(exp: ex.Experiment, delay_us: float) -> ex.Experiment:
    """Arm B with the plugin's fixed extra host delay per build_attn_metadata call (a known slowdown on a real
    server, counted by the plugin's tts_predictor_host_delay_* counters). ExperimentError (one line) where no plugin
    reads a control file, or on the simulator (whose known answer is --b-sim-set model.extra_step_pct=...)."""
    if not 0 < delay_us <= MAX_HOST_DELAY_US:
        raise ex.ExperimentError(f"--b-host-delay-us must be above 0 and at most {MAX_HOST_DELAY_US} "
                                 f"(tts_predictor.control), got {delay_us:g}")
    side, arm_b = list(exp.arms.items())[1]
    if arm_b.backend == "sim":
        raise ex.ExperimentError("--b-host-delay-us is the plugin's positive control on a real server (BACKEND=vllm "
                                 "or vllm-cpu); on the simulator use --b-sim-set model.extra_step_pct=...")
    if not has_control(arm_b):
        raise ex.ExperimentError(f"--b-host-delay-us: arm {side} has no plugin control file (vllm-omni "
                                 f"{arm_b.vllm_omni}; only {ex.PLUGIN_VERSION} carries the plugin)")
    label = f"{arm_b.label} + {delay_us:g} us host delay"
    return replace(exp, arms={**exp.arms, side: replace(arm_b, host_delay_us=delay_us, label=label)},
                   idea=f"{exp.idea} (arm B carries the plugin's positive control: a fixed {delay_us:g} us of host "
                        "time per build_attn_metadata call)")


def control_extra(arm: ex.Arm, swapped: bool) -> dict:
    """What a window's control writes carry beyond variant, observe and epoch: the arm's positive-control delay, and
    in designs that share a start between the arms (swapped) the simulator arm's hot-swappable settings."""
    extra: dict = {}
    hot = hot_sim(arm) if swapped else None
    if hot:
        extra["sim"] = hot
    if arm.host_delay_us:
        extra["host_delay_us"] = arm.host_delay_us
    return extra


def has_control(arm: ex.Arm) -> bool:
    """A server with a control file: the simulator and vllm-omni 0.16.0 with our plugin (it has a variant)."""
    return arm.variant is not None and (arm.backend == "sim" or arm.vllm_omni == ex.PLUGIN_VERSION)


def hot_swap_problem(a: ex.Arm, b: ex.Arm) -> str | None:
    """None when one server can run both arms (the same server spec, only the plugin variant differs); else why not."""
    if not (has_control(a) and has_control(b)):
        return "an arm has no plugin, so nothing can switch it (vllm-omni >= 0.30 arms need DESIGN=fresh)"
    if a.backend != b.backend:
        return f"the arms run on different backends ({a.backend}, {b.backend})"
    if a.backend == "sim":
        if a.sim.config != b.sim.config:
            return f"the simulator's config differs ({a.sim.config!r} vs {b.sim.config!r})"
        from ttssim.config import HOT_SETTINGS  # plain YAML; imported here so `import loadtest.ab` stays light

        cold_a, cold_b = cold_sets(a), cold_sets(b)
        if cold_a != cold_b:
            return (f"the simulator's settings differ beyond the hot-swappable {list(HOT_SETTINGS)} "
                    f"({list(cold_a)!r} vs {list(cold_b)!r})")
        return None
    for what in ("vllm_omni", "base_image", "stages", "deploy", "server_args", "env"):
        if getattr(a, what) != getattr(b, what):
            return f"{what} differs ({getattr(a, what)!r} vs {getattr(b, what)!r})"
    return None


def cold_sets(arm: ex.Arm) -> tuple[str, ...]:
    """A simulator arm's overrides that need a restart (all but ttssim.config.HOT_SETTINGS)."""
    from ttssim.config import HOT_SETTINGS, setting_key

    return tuple(s for s in (arm.sim.set if arm.sim else ()) if setting_key(s) not in HOT_SETTINGS)


def hot_sim(arm: ex.Arm) -> dict[str, float] | None:
    """The hot-swappable simulator settings an arm's windows write into the control file's "sim" object (designs
    swap and nested: two arms that differ only in them share a server start); None for an arm without them."""
    if arm.backend != "sim" or arm.sim is None:
        return None
    from ttssim.config import hot_values, load_config

    cfg = load_config(ROOT / arm.sim.config if arm.sim.config else None, list(arm.sim.set))
    return hot_values(cfg)


def ready_timeout(exp: ex.Experiment) -> float:
    """Seconds from launch to /health: the simulator's own start plus its modelled start-up; vllm: weights, compile
    and CUDA graphs (images and model are prepared before, outside this)."""
    if any(a.backend == "vllm" for a in exp.arms.values()):
        return float(ex.HEALTH_TIMEOUT_S)
    if any(a.backend == ex.CPU_BACKEND for a in exp.arms.values()):
        return float(ex.CPU_HEALTH_TIMEOUT_S)
    from ttssim.config import load_config  # plain YAML; imported here so `import loadtest.ab` stays light

    startup = 0.0
    for arm in exp.arms.values():
        try:
            cfg = load_config(ROOT / arm.sim.config if arm.sim and arm.sim.config else None,
                              list(arm.sim.set) if arm.sim else [])
            startup = max(startup, cfg.model.startup_s + cfg.faults.slow_readiness_s)
        except (ValueError, OSError):  # a bad override: the start itself fails and says so
            pass
    return ex.SIM_READY_S + startup


def read_plan_file(folder: str) -> dict:
    """S and W from a pilot's plan.json (`python -m ttsreport <pilot> --plan`); SystemExit with one line if unusable."""
    path = Path(folder) / "plan.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError:
        raise SystemExit(f"error: --plan-from {folder}: no plan.json there (run `python -m ttsreport {folder} --plan` "
                         "on a pilot run first)") from None
    except ValueError as e:
        raise SystemExit(f"error: {path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith("tts-plan/"):
        raise SystemExit(f"error: {path}: not a plan file (schema {doc.get('schema') if isinstance(doc, dict) else doc!r})")
    for k in ("starts", "windows_per_start"):
        if isinstance(doc.get(k), bool) or not isinstance(doc.get(k), int) or doc[k] < 1:
            raise SystemExit(f"error: {path}: {k} must be an integer >= 1, got {doc.get(k)!r}")
    return {"path": str(path), "sha256": sha256(path), "starts": doc["starts"],
            "windows_per_start": doc["windows_per_start"], "halfwidth_pct": doc.get("halfwidth_pct"),
            "cost_s": doc.get("cost_s")}


def resolve_design(a: argparse.Namespace, exp: ex.Experiment, shorthand: bool) -> dict:
    """Design name, rounds, A/A rounds, seed, S x W and the sequential settings from the command line and the
    experiment file (the command line wins); SystemExit with one line when they contradict each other."""
    design = a.design or "fresh"
    rounds = a.rounds if a.rounds is not None else (DEFAULT_ROUNDS if shorthand else exp.rounds)
    aa_rounds = a.aa_rounds if a.aa_rounds is not None else (DEFAULT_AA_ROUNDS if shorthand else exp.aa_rounds)
    seed = a.seed if a.seed is not None else (random.SystemRandom().randrange(2**31) if shorthand else exp.seed)
    starts, pairs, plan_from = a.starts, a.window_pairs, None
    if a.pilot:
        if a.until_decided or a.plan_from or (a.design not in (None, "nested")):
            raise SystemExit("error: --pilot runs its own short nested design; drop --design/--until-decided/--plan-from")
        design, starts, pairs, aa_rounds = "nested", PILOT["starts"], PILOT["window_pairs"], PILOT["aa_rounds"]
        rounds = starts * pairs
    elif a.plan_from:
        if a.design not in (None, "nested"):
            raise SystemExit("error: --plan-from gives a nested design (S starts x W pairs); drop --design")
        plan_from = read_plan_file(a.plan_from)
        design, starts, pairs = "nested", plan_from["starts"], plan_from["windows_per_start"]
        rounds = starts * pairs
    if rounds < 1 or aa_rounds < 0:
        raise SystemExit("error: --rounds must be >= 1 and --aa-rounds >= 0")
    for name, v in (("--starts", starts), ("--window-pairs", pairs)):
        if v is not None and v < 1:
            raise SystemExit(f"error: {name} must be >= 1, got {v}")
    if (starts is not None or pairs is not None) and design != "nested":
        raise SystemExit("error: --starts and --window-pairs belong to --design nested")
    until = a.until_decided or (not shorthand and exp.until_decided and not (a.pilot or a.plan_from))
    min_rounds = a.min_rounds if a.min_rounds is not None else (None if shorthand else exp.min_rounds)
    if until:
        max_rounds = a.max_rounds if a.max_rounds is not None else (
            exp.max_rounds if not shorthand and exp.max_rounds is not None else rounds)
        rounds = max_rounds
    elif a.max_rounds is not None or a.min_rounds is not None:
        raise SystemExit("error: --max-rounds/--min-rounds belong to --until-decided")
    if design == "nested":
        if starts is not None and pairs is not None and not until:
            if a.rounds is not None and not (a.pilot or a.plan_from) and a.rounds != starts * pairs:
                raise SystemExit(f"error: --rounds {a.rounds} contradicts --starts {starts} x --window-pairs {pairs}")
            rounds = starts * pairs
        elif starts is not None and pairs is None:
            pairs = math.ceil(rounds / starts)
        elif pairs is None:
            pairs = DEFAULT_WINDOW_PAIRS
        starts = math.ceil(rounds / pairs)
    sequential = None
    if until:
        try:
            sequential = rs.sequential(min_rounds, max_rounds, design=design, window_pairs=pairs)
        except rs.SettingsError as e:
            raise SystemExit(f"error: {e}") from None
    settle = a.settle_s if a.settle_s is not None else (DEFAULT_SETTLE_S if design in SWAPPED else 0.0)
    if settle < 0 or not math.isfinite(settle):
        raise SystemExit(f"error: --settle-s must be >= 0, got {settle:g}")
    return {"name": design, "rounds": rounds, "aa_rounds": aa_rounds, "seed": seed, "starts": starts,
            "window_pairs": pairs, "settle_s": settle if design in SWAPPED else 0.0, "sequential": sequential,
            "pilot": bool(a.pilot), "plan_from": plan_from,
            "target_halfwidth_pct": getattr(a, "target_halfwidth_pct", None)}


def pre_registered(a: argparse.Namespace, exp: ex.Experiment) -> dict:
    """The analysis fixed before the run (margin, confidence, primary metric) from the command line, else the
    experiment file, else the defaults, and where each came from; SystemExit with one line when one is bad."""
    from ttsrecords.measures import VERDICT_METRICS

    given = {"margin_pct": (getattr(a, "margin_pct", None), exp.margin_pct),
             "confidence": (getattr(a, "confidence", None), exp.confidence),
             "primary_metric": (getattr(a, "primary_metric", None), exp.primary_metric)}
    chosen = {k: cli if cli is not None else f for k, (cli, f) in given.items()}
    try:
        out = rs.analysis(**chosen, verdict_metrics=VERDICT_METRICS)
    except rs.SettingsError as e:
        raise SystemExit(f"error: {e}") from None
    where = "the experiment file" if a.experiment else "the mission's experiment file"
    out["source"] = {k: "command line" if cli is not None else where if f is not None else "default"
                     for k, (cli, f) in given.items()}
    return out


def copy_sim_profiles(run: Path, arms: dict[str, ex.Arm]) -> dict | None:
    """Copy the simulator profiles the arms run (and each one's fit) into the run folder, so its statistics read
    them from there and never from a checkout that may have been refitted since; what was copied, for the manifest.
    SystemExit when two profiles share a file name (one run folder keeps one of each name)."""
    from ttssim.config import FIT_SUFFIX  # plain YAML; imported here so `import loadtest.ab` stays light

    out = {}
    for path in sorted({arm.sim.config for arm in arms.values() if arm.backend == "sim" and arm.sim and arm.sim.config}):
        src = ROOT / path if not Path(path).is_absolute() else Path(path)
        dst = sim_profile_copy(run, path)
        if dst.exists():
            raise SystemExit(f"error: two simulator profiles named {dst.name}: give them different file names")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        fit = Path(str(src) + FIT_SUFFIX)
        if fit.is_file():
            shutil.copyfile(fit, Path(str(dst) + FIT_SUFFIX))
        out[path] = {"copy": str(dst.relative_to(run)), "sha256": sha256(src),
                     "fit": str(dst.relative_to(run)) + FIT_SUFFIX if fit.is_file() else None,
                     "fit_sha256": sha256(fit) if fit.is_file() else None}
    return out or None


def new_run(a: argparse.Namespace) -> tuple[Path, dict]:
    """Check the arguments, create reports/<run>/ with its effective scenario and manifest; SystemExit("error: ...")
    before anything is written when an argument is bad."""
    shorthand = not a.experiment
    if not shorthand and (a.a is not None or a.b is not None):
        raise SystemExit("error: --a/--b are the mission shorthand; an experiment file names its own arms")
    if a.backend not in (None, *ex.BACKENDS):
        raise SystemExit(f"error: --backend must be one of {', '.join(ex.BACKENDS)}, got {a.backend!r}")
    if a.backend == ex.CPU_BACKEND and a.simulate:
        raise SystemExit(f"error: --backend {ex.CPU_BACKEND} is a real server; --simulate contradicts it")
    simulate = bool(a.simulate) or a.backend == "sim" or (shorthand and a.backend is None)
    settings = {"experiment": a.experiment, "a": a.a or DEFAULT_VARIANT, "b": a.b or "fixed", "simulate": simulate,
                "cpu": a.backend == ex.CPU_BACKEND,
                "sim_config": a.sim_config or (SHORTHAND_SIM_CONFIG if shorthand else None),
                "sim_set": list(a.sim_set or []), "b_sim_set": list(a.b_sim_set or []),
                "b_host_delay_us": a.b_host_delay_us or 0.0}
    if getattr(a, "executor", None):
        if a.backend != ex.CPU_BACKEND:
            raise SystemExit(f"error: --executor sets the real CPU server's stages; it needs --backend {ex.CPU_BACKEND}")
        settings["executor"] = a.executor
    if settings["sim_config"] and not (ROOT / settings["sim_config"]).is_file():
        raise SystemExit(f"error: simulator config {settings['sim_config']} not found")
    try:
        exp = experiment_for(settings)
    except ex.ExperimentError as e:
        raise SystemExit(f"error: {e}") from None
    if a.backend in ("vllm", ex.CPU_BACKEND) and exp.simulated:
        raise SystemExit(f"error: --backend {a.backend}: {exp.path} runs on the simulator only (every arm is a sim "
                         "arm)")
    arms = arms_of(exp)
    if any(x.backend == "vllm" for x in arms.values()):
        if not (ROOT / SERVE_SH).is_file():
            raise SystemExit("error: BACKEND=vllm needs docker/serve.sh")
        if shutil.which("docker") is None and not getattr(a, "dry_run", False):
            raise SystemExit("error: BACKEND=vllm needs Docker (not found); use BACKEND=sim")
    if a.request_timeout is not None and not (a.request_timeout > 0 and a.request_timeout != float("inf")):
        raise SystemExit(f"error: --request-timeout must be a positive number of seconds, got {a.request_timeout:g}")
    d = resolve_design(a, exp, shorthand)
    pre = pre_registered(a, exp)
    if d["name"] in SWAPPED:
        why = hot_swap_problem(arms["A"], arms["B"])
        if why is None and simulate and settings["experiment"] is not None:  # a stand-in swaps only what the real
            real = ex.load_experiment(ROOT / settings["experiment"])  # arms could (the simulation proves the pipeline)
            if not real.simulated:
                why = hot_swap_problem(*arms_of(real).values())
        if why:
            raise SystemExit(f"error: --design {d['name']} needs hot-swappable arms (one server, only the plugin "
                             f"variant differs): {why}")
    try:
        levels = [int(x) for x in a.levels.split(",")] if a.levels else None
    except ValueError:
        raise SystemExit(f"error: --levels wants comma-separated integers, got {a.levels!r}") from None
    scen = Path(a.scenario or (exp.scenario if settings["cpu"] or not shorthand else SHORTHAND_SCENARIO))
    name = a.name or f"ab-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    run = Path(a.out) / name
    if run.exists():
        raise SystemExit(f"error: {run} exists (use --resume {run} to continue it)")
    run.mkdir(parents=True)
    phases = {k: v for k, v in (("warmup_s", a.warmup_s), ("measure_s", a.measure_s), ("drain_s", a.drain_s),
                                ("count_s", a.count_s)) if v is not None}
    try:
        effective_scenario(scen, run / "scenario.yaml", phases, levels, a.scenario_set, a.last_drain_s)
        sc = load_scenario(str(run / "scenario.yaml"))
        if d["name"] in SWAPPED and sc.steps[0].count_s <= 0:
            raise ValueError(f"--design {d['name']} switches arms at the count phase: set phases.count_s > 0 "
                             "(or --count-s)")
        short = window_problems(sc, arms)
    except (OSError, yaml.YAMLError, ScenarioError, ValueError) as e:
        shutil.rmtree(run)
        raise SystemExit(f"error: scenario {scen}: {str(e).splitlines()[0]}") from None
    if short and all(x.backend == "sim" for x in arms.values()):
        shutil.rmtree(run)
        raise SystemExit(f"error: scenario {scen}: windows too short for their requests ({'; '.join(short)}; "
                         "loadtest/window_fit.py)")
    if short:
        print(f"warning: scenario {scen} may be too short for the requests the arms' simulator stand-ins predict: "
              f"{'; '.join(short)}", file=sys.stderr)
    try:
        profiles = copy_sim_profiles(run, arms)
    except (OSError, SystemExit) as e:
        shutil.rmtree(run)
        raise SystemExit(str(e) if isinstance(e, SystemExit) else f"error: copying the simulator profile: {e}") from None
    seq = d["sequential"]
    plan = make_plan(d["rounds"], d["aa_rounds"], arms["A"].variant, arms["B"].variant, d["seed"], design=d["name"],
                     window_pairs=d["window_pairs"], levels=[s.concurrency for s in sc.steps],
                     aa_within=(d["aa_rounds"] + seq["min_rounds"]) if seq else None)
    order = {s.concurrency: i for i, s in enumerate(sc.steps)}
    if len(order) == len(sc.steps):
        plan = [with_order(w, list(w.levels), [order[c] for c in w.levels]) for w in plan]
    else:  # repeated concurrencies (an open-loop rate sweep): the scenario's own order, every window
        plan = [with_order(w, [s.concurrency for s in sc.steps], list(range(len(sc.steps)))) for w in plan]
    d["starts"] = len(starts_of(plan))
    d["aa_positions"] = sorted({w.round for w in plan if w.kind == "aa"})
    d["level_order"] = "seeded per round" if len(order) == len(sc.steps) else "fixed (repeated concurrencies)"
    d["hot_swap"] = d["name"] in SWAPPED
    backend = "sim" if exp.simulated else ex.CPU_BACKEND if settings["cpu"] else "vllm"
    settings.update(
        backend=backend, design=d["name"], rounds=d["rounds"], aa_rounds=d["aa_rounds"],
        scenario=str(scen), phase_overrides=phases, levels_override=levels, scenario_set=a.scenario_set,
        last_drain_s=a.last_drain_s, ready_timeout_s=a.ready_timeout or ready_timeout(exp),
        request_timeout_s=a.request_timeout, micro=a.micro,
        target_halfwidth_pct=getattr(a, "target_halfwidth_pct", None))
    images = sorted({x.image for x in arms.values() if x.backend == "vllm"})
    exp_file = Path(exp.path)
    manifest = {
        "schema": AB_SCHEMA, "run_id": name, "created": utc(), "started": utc(),
        "experiment": {"path": None if shorthand else a.experiment, "name": exp.name, "idea": exp.idea,
                       "sha256": sha256(exp_file) if exp_file.is_file() else None, "shorthand": shorthand,
                       "primary_metric": exp.primary_metric, "simulated": exp.simulated,
                       "confounded": exp.confounded, "request": exp.request, "model": exp.model},
        "arms": {side: arm_manifest(arm) for side, arm in arms.items()},
        "variants": {side: arm.variant for side, arm in arms.items()},
        "labels": {side: arm.label for side, arm in arms.items()},
        "confounded": exp.confounded,
        "length_warning": length_warning(arms),
        "backend": {"name": settings["backend"], "simulated": exp.simulated,
                    "version": package_version() if exp.simulated else ex.CPU_WHAT if backend == ex.CPU_BACKEND else
                    ", ".join(sorted({f"vllm-omni {x.vllm_omni}" for x in arms.values()})) + " (docker/serve.sh)"},
        "design": d, "seeds": {"order": d["seed"], "scenario": sc.seed, "levels": d["seed"]},
        "scenario": {"path": str(scen), "sha256": sha256(scen), "effective_sha256": sha256(run / "scenario.yaml")},
        "sim_config": ({"path": settings["sim_config"], "sha256": sha256(ROOT / settings["sim_config"])}
                       if settings["sim_config"] and exp.simulated else None),
        "sim_profiles": profiles,
        "settings": settings, "plan": plan_to_list(plan), "starts": starts_of(plan),
        "resume_policy": RESUME_POLICY,
        "command": ["python", "-m", "loadtest.ab", *(sys.argv[1:] if sys.argv else [])],
    }
    rs.record(manifest, sequential=d["sequential"], analysis=pre)
    env = environment(images)
    manifest["backend"]["image_digest"] = env.pop("image_digest", None)
    # what each base image tag resolved to on this host (a tag-only pin is otherwise unrecoverable afterwards)
    manifest["backend"]["base_image_digests"] = {b: local_digests(b) for b in sorted(
        {x.base_image for x in arms.values() if x.backend == "vllm" and x.base_image})} or None
    manifest["git_revision"] = env.pop("git_revision")
    manifest["code_fingerprint"] = code_fingerprint()
    manifest["host"] = env
    manifest.update(RunLog().to_dict())  # the runner's part, as it starts: status "planned"
    write_json(run / "manifest.json", manifest)
    return run, manifest


def describe(manifest: dict) -> str:
    """The plan in a few lines (the console, --dry-run)."""
    d, plan = manifest["design"], plan_from_list(manifest["plan"])
    starts = manifest.get("starts") or starts_of(plan)
    lines = [f"design {d['name']}: {d['aa_rounds']} A/A + {d['rounds']} A/B rounds "
             f"({len(plan)} windows in {len(starts)} server start{'s' if len(starts) != 1 else ''}"
             + (f", {d['window_pairs']} pairs per start" if d["name"] == "nested" else "")
             + (f", settle {d['settle_s']:g} s after a switch" if d["name"] in SWAPPED else "") + f"), seed {d['seed']}"]
    if manifest.get("length_warning"):
        lines.append(f"WARNING: {manifest['length_warning']}")
    s = rs.sequential_of(manifest)
    if s:
        lines.append(f"sequential: until decided, {s['min_rounds']}..{s['max_rounds']} A/B rounds"
                     + (f" = looks after {s['min_units']}..{s['max_units']} server starts" if s["unit"] == "start"
                        else ""))
    for st in starts:
        ws = [w for w in plan if w.start == st["start"]]
        lines.append(f"  start {st['start']} ({st['spec']}): " + " ".join(
            f"r{w.round}{w.kind.upper()}:{w.arm}{'*' if w.switch else ''}" for w in ws))
    return "\n".join(lines)


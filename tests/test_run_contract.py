"""The run's contract across the seam between the load side and the statistics, with the real writer and the real
reader on both sides: the sequential settings in one home (design.sequential, ttsrecords.runsettings) that the planner
writes and the runner and ttsreport read, the runner's look log under its own key, invalid MIN_ROUNDS / MAX_ROUNDS
refused before a run starts, the look counting the unit it tests (starts in a nested design) with the last look
deciding, no overflow at an early look, the pre-registered analysis settings, and the run folder that carries its
simulator profile. The slow tests run `make ab` / `make report` end to end on the simulator."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import synthetic_runs as sr
from conftest import ROOT

from loadtest import ab, plan, provenance, runner
from loadtest.experiment import ExperimentError, load_experiment
from ttsrecords import records as rec
from ttsrecords import runsettings as rs
from ttsrecords.windows import manifest_windows, plan_from_list, starts_of
from ttsreport import __main__ as cli
from ttsreport import inference as inf
from ttsreport import prediction
from ttsreport.analysis import sequential_of, summarize, write_statistics
from ttsreport.looks import look

# ----------------------------------------------------------------------------------------------- one home


def test_the_planners_sequential_settings_are_what_the_runner_and_the_statistics_read(new_run):
    run, man = new_run("--design", "swap", "--until-decided", "--max-rounds", "6", "--aa-rounds", "0")
    stored = json.loads((run / "manifest.json").read_text())
    seq = stored["design"]["sequential"]
    assert (seq["unit"], seq["min_rounds"], seq["max_rounds"], seq["min_units"], seq["max_units"]) == \
        ("round", rs.DEFAULT_MIN_ROUNDS, 6, rs.DEFAULT_MIN_ROUNDS, 6)
    assert "sequential" not in stored  # the top level is nobody's home
    assert rs.sequential_of(stored) == seq
    stats = sequential_of(stored, 1.0, 0.95)  # the statistics' reader: the same settings, plus alpha and margin
    assert {k: stats[k] for k in seq} == seq and stats["alpha"] == pytest.approx(0.05)
    # the runner's log of its looks goes under its own key and leaves the settings alone
    r = runner.Runner(run, stored, progress=lambda line: None)
    r.log.sequential_looks = {"looks": 1, "look_errors": [], "ignored_stops": []}
    r._save()
    again = json.loads((run / "manifest.json").read_text())
    assert rs.sequential_of(again) == seq and sequential_of(again, 1.0, 0.95)["max_units"] == 6


def test_nested_settings_count_starts(new_run):
    _, man = new_run("--design", "nested", "--window-pairs", "2", "--until-decided", "--max-rounds", "8",
                     "--aa-rounds", "0")
    seq = rs.sequential_of(man)
    assert (seq["unit"], seq["min_units"], seq["max_units"], seq["window_pairs"]) == ("start", 2, 4, 2)
    assert len(man["starts"]) == 4
    # the runner looks once per start: after the second round of each
    plan = plan_from_list(man["plan"])
    due = [rs.look_due(plan, r, seq) for r in sorted({w.round for w in plan})]
    assert due == [False, True] * 4


def test_folders_written_before_one_home_still_load():
    assert rs.sequential_of({"sequential": {"min_rounds": 3, "max_rounds": 10}})["max_units"] == 10
    # a folder from the broken runner: settings under design, its look log at the top level
    old = {"design": {"name": "swap", "sequential": {"until": "decided", "min_rounds": 2, "max_rounds": 6}},
           "sequential": {"looks": 2, "look_errors": [{"round": 1, "error": "x"}], "ignored_stops": []}}
    s = rs.sequential_of(old)
    assert (s["min_units"], s["max_units"]) == (2, 6)
    assert rs.sequential_of({"design": "fresh", "settings": {}}) is None
    with pytest.raises(rs.SettingsError, match="max_rounds"):
        rs.sequential_of({"settings": {"until": "decided"}})


# ----------------------------------------------------------------------------------------------- bad settings


@pytest.mark.parametrize("args, msg", [
    (["--min-rounds", "1", "--max-rounds", "1"], "at least 2"),
    (["--max-rounds", "1"], "at least 2"),
    (["--min-rounds", "1", "--max-rounds", "5"], "--min-rounds 1"),
    (["--min-rounds", "6", "--max-rounds", "5"], "--min-rounds <= --max-rounds"),
    (["--design", "nested", "--window-pairs", "3", "--max-rounds", "3"], "1 server starts"),
    (["--max-rounds", "2000"], "fixed design"),
])
def test_bad_sequential_rounds_are_refused_before_anything_is_written(tmp_path, capsys, args, msg):
    assert ab.main(["--until-decided", *args, "--out", str(tmp_path), "--dry-run"]) == 2
    assert ab.main(["--until-decided", *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith("error: ") and msg in e for e in err), err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, msg", [(["--margin-pct", "-1"], "margin_pct"), (["--confidence", "1.5"], "confidence"),
                                       (["--primary-metric", "nope"], "primary_metric")])
def test_bad_analysis_settings_are_refused_before_anything_is_written(tmp_path, capsys, args, msg):
    assert ab.main([*args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and msg in err[0]
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_make_ab_refuses_min_rounds_1_in_one_line():
    p = subprocess.run(["make", "-s", "ab", "UNTIL=decided", "MIN_ROUNDS=1", "MAX_ROUNDS=1", "DRY_RUN=1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    errors = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "at least 2" in errors[0], p.stderr
    assert "## the plan" not in p.stdout


# ----------------------------------------------------------------------------------------------- the looks


def test_an_early_look_never_overflows():
    """At n = 2 the O'Brien-Fleming boundary's t has one degree of freedom and a tail of 1e-16 or less: its repeated
    interval is thousands of se wide (its exp overflowed before). It stays finite and JSON-writable; only the first
    look's plain t test (on a share of alpha) can decide there, and only a large effect with a small spread."""
    rng = np.random.default_rng(3)
    # where the boundary's tail underflows to 0 (n = 2 of 1000 looks) its t is +inf, never -inf (an inverted interval)
    assert np.all(inf._t_crit(np.arange(2, 5), 2.5, 1000) == np.inf)
    for max_rounds in (10, 20):
        for d in ([0.3, 0.31], [0.5, -0.4], list(rng.normal(0, 0.2, 2))):
            res = inf.sequential_look({"8": d}, min_rounds=2, max_rounds=max_rounds, margin_pct=1,
                                      higher_is_better=True)
            row = res["levels"]["8"]
            assert all(math.isfinite(x) and x > 0 for x in row["ci"] + row["ci_equivalence"])
            big = d == [0.3, 0.31]  # x1.36 with a spread of 0.7 %: t = 86 on 1 df, p 0.007 < 0.3 * 0.05
            assert (row["kind"] == "faster" and res["stop"]) if big else (row["kind"] == "inconclusive"
                                                                          and not res["stop"])
            rec.dumps(res)  # no NaN, no infinity
    later = inf.sequential_look({"8": [0.3, 0.31, 0.29, 0.3]}, min_rounds=3, max_rounds=60, margin_pct=1,
                                higher_is_better=True)  # the first look decides even at 60 looks
    assert later["levels"]["8"]["kind"] == "faster" and math.isfinite(later["levels"]["8"]["ci"][1])


def test_the_last_look_decides():
    d = {"8": [0.01, -0.02, 0.015]}
    kw = dict(min_rounds=2, max_rounds=6, margin_pct=1, higher_is_better=True)
    assert not inf.sequential_look(d, **kw)["stop"]
    last = inf.sequential_look(d, final=True, **kw)
    assert last["stop"] and last["reason"].startswith("last look") and last["levels"]["8"]["kind"] == "inconclusive"


def _nested_run(tmp_path, name, *, starts, pairs, effect, planned_rounds=None, noise=0.003, seed=4):
    rng = np.random.default_rng(seed)
    d = {(s, p): effect + float(rng.normal(0, noise)) for s in range(starts) for p in range(pairs)}
    return sr.nested(tmp_path / name, starts=starts, pairs=pairs, d=lambda s, p: d[s, p], levels=(8,),
                     sequential=(3, 8), planned_rounds=planned_rounds, telemetry=None, noise=0.01)


def test_a_nested_look_counts_starts_with_a_boundary_for_that_many_looks(tmp_path):
    """2 pairs per start, MAX_ROUNDS 8: 4 starts are 4 looks (not 8), the first at 2 starts (min 3 rounds)."""
    run = _nested_run(tmp_path, "n", starts=3, pairs=2, effect=-0.2, planned_rounds=8)
    line = look(run)
    assert (line["unit"], line["min_units"], line["max_units"], line["starts"]) == ("start", 2, 4, 3)
    assert "C/sqrt(n/4)" in line["rule"] and line["levels"]["8"]["n"] == 3
    assert line["stop"] and line["kind"] == "slower" and line["reason"] == "every level decided"


def test_the_look_after_the_last_start_decides_even_when_units_were_lost(tmp_path):
    """A start whose windows were all invalid leaves 3 units of a planned 4: the look after the last start stops."""
    run = _nested_run(tmp_path, "lost", starts=4, pairs=2, effect=0.0, noise=0.02)
    for bdir in (run / "blocks").iterdir():  # start 1's windows were invalid (the manipulation check failed)
        meta = json.loads((bdir / "block.json").read_text())
        if meta["start"] == 1:
            rec.write_json(bdir / "block.json", {**meta, "status": "invalid", "reason": "on purpose"})
    line = look(run)
    assert line["starts"] == 3 and line["max_units"] == 4
    assert line["stop"] is True and line["reason"].startswith("last look")


def test_the_cli_turns_any_analysis_failure_into_one_line(tmp_path, capsys, monkeypatch):
    run = sr.fresh(tmp_path / "r", rounds=3, sequential=(3, 6))

    def boom(*a, **kw):
        raise OverflowError("math range error")

    monkeypatch.setattr(inf, "sequential_look", boom)
    assert cli.main([str(run), "--look"]) == 1
    assert cli.main([str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(e.startswith(f"error: {run}: the analysis failed (OverflowError") for e in err)


# ----------------------------------------------------------------------------------------------- pre-registered


def test_analysis_settings_are_recorded_and_used(new_run, tmp_path, capsys):
    run, man = new_run("--margin-pct", "2.5", "--confidence", "0.9")
    assert man["analysis"] == {"margin_pct": 2.5, "confidence": 0.9, "primary_metric": "audio_throughput",
                               "source": {"margin_pct": "command line", "confidence": "command line",
                                          "primary_metric": "the mission's experiment file"}}
    # the statistics use what the planner recorded (a synthetic folder written through the same functions)
    syn = sr.fresh(tmp_path / "s", rounds=2, aa_rounds=0, levels=(8,), telemetry=None,
                   analysis={"margin_pct": 2.5, "confidence": 0.9, "primary_metric": "throughput_rps"})
    _, comp = summarize(syn)
    s = comp["settings"]
    assert (s["margin_pct"], s["confidence"], s["margin_source"]) == (2.5, 0.9, "pre-registered")
    assert comp["primary_metric"] == "throughput_rps"
    # an override stays possible, and the report says it overrode the pre-registered margin
    assert cli.main([str(syn), "--margin-pct", "1"]) == 0
    comp = json.loads((syn / "comparison.json").read_text())
    assert comp["settings"]["margin_pct"] == 1 and "overriding the pre-registered ±2.5 %" in \
        comp["settings"]["margin_source"]
    assert "overriding the pre-registered ±2.5 %" in (syn / "summary.md").read_text()


def test_an_experiment_file_pre_registers_the_analysis_and_the_sequential_rule(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "_run_quiet", lambda cmd, timeout=5.0: None)
    text = (ROOT / "configs/experiments/sim/mission-sim.yaml").read_text()
    f = tmp_path / "x.yaml"
    f.write_text(text.replace("design: {aa_rounds: 1, rounds: 2, seed: 1614}",
                              "design: {aa_rounds: 0, rounds: 2, seed: 1614, until: decided, min_rounds: 2, "
                              "max_rounds: 5}\nanalysis: {margin_pct: 2, confidence: 0.9}"))
    exp = load_experiment(f)
    assert (exp.margin_pct, exp.confidence, exp.until_decided, exp.min_rounds, exp.max_rounds) == \
        (2, 0.9, True, 2, 5)
    _, man = plan.new_run(ab.parse_args(["--experiment", str(f), "--out", str(tmp_path / "o"), "--name", "e"]))
    assert man["analysis"]["margin_pct"] == 2 and man["analysis"]["source"]["margin_pct"] == "the experiment file"
    assert (man["design"]["sequential"]["min_rounds"], man["design"]["sequential"]["max_rounds"]) == (2, 5)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("design: {aa_rounds: 1, rounds: 2, seed: 1614}",
                                "design: {aa_rounds: 1, rounds: 2, seed: 1614}\nanalysis: {margin_pct: -1}"))
    with pytest.raises(ExperimentError, match="analysis: margin_pct"):
        load_experiment(bad)


# ----------------------------------------------------------------------------------------------- self-contained


def test_the_planner_copies_the_simulator_profile_into_the_run(new_run):
    run, man = new_run()
    copy = rec.sim_profile_copy(run, "configs/sim/fast.yaml")
    assert copy.read_bytes() == (ROOT / "configs/sim/fast.yaml").read_bytes()
    assert man["sim_profiles"]["configs/sim/fast.yaml"]["copy"] == "sim/fast.yaml"
    setup = prediction.sim_setup(man, run)
    assert setup["file"] == copy and not setup["from_checkout"]


@pytest.mark.slow
def test_the_example_gives_the_same_comparison_from_a_checkout_without_configs_sim(tmp_path, monkeypatch):
    """reports/example carries its simulator profile: analysed where no configs/sim/ exists, its comparison.json is
    the committed one byte for byte; without the copy (a folder from before) it falls back and says so."""
    run = tmp_path / "example"
    shutil.copytree(ROOT / "reports/example", run)
    clone = tmp_path / "clone"  # a checkout without configs/sim/
    clone.mkdir()
    monkeypatch.chdir(clone)
    monkeypatch.setattr(prediction, "ROOT", clone)
    write_statistics(run)
    assert (run / "comparison.json").read_bytes() == (ROOT / "reports/example/comparison.json").read_bytes()
    shutil.rmtree(run / rec.SIM_PROFILE_DIR)
    summary, comp = summarize(run)
    assert comp["per_level"]["8"]["prediction"]["model"]["ratio"] is None  # nothing to read the model from
    monkeypatch.setattr(prediction, "ROOT", ROOT)
    summary, comp = summarize(run)
    assert comp["per_level"]["8"]["prediction"]["model"]["ratio"] is not None
    assert any("carries no copy of its simulator profile" in w for w in summary["warnings"])


# ----------------------------------------------------------------------------------------------- end to end


def _quick_scenario(tmp_path: Path) -> Path:
    """One level (c=8, short prompts), 1 s count, 4 s warm-up, 8 s measure, 4 s drain: a window of about 18 s on the
    fitted profile configs/sim/default.yaml, whose ~65 ms modelled steps outweigh a busy box's CPU noise (on the
    millisecond steps of fast.yaml the per-round ratio of a 25 % slowdown scattered over 0.8-1.5); long enough for
    B 50 % slower (loadtest/window_fit.py: mean 3.5 s, longest 4.2 s)."""
    f = tmp_path / "quick.yaml"
    f.write_text("schema: tts-scenario/1\nname: quick\nmode: stream\nloop: closed\nseed: 1614\nmix: {short: 1}\n"
                 "timeout_s: 30\nphases: {count_s: 1, warmup_s: 4, measure_s: 8, drain_s: 4}\n"
                 "steps:\n  - {concurrency: 8}\n")
    return f


def _make_ab(tmp_path: Path, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path / "runs"
    p = subprocess.run(["make", "-s", "ab", "A=fixed", "B=fixed", "SIM_CONFIG=configs/sim/default.yaml",
                        f"SCENARIO={_quick_scenario(tmp_path)}", "AA_ROUNDS=0", "UNTIL=decided", "SEED=7",
                        "SETTLE_S=1", f"OUT={out}", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout)
    runs = sorted(out.iterdir()) if out.is_dir() else []
    assert len(runs) == 1, p.stdout[-2000:] + p.stderr[-3000:]
    return p, runs[0]


def _looks(run: Path) -> list[dict]:
    return rec.read_jsonl(run / "looks.jsonl", rec.LOOK_SCHEMA)[0]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_make_ab_until_decided_stops_early_on_a_known_slowdown(tmp_path):
    p, run = _make_ab(tmp_path, "B_SIM_SET=model.extra_step_pct=25", "DESIGN=swap", "MAX_ROUNDS=6")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "report: " in p.stdout and (run / "index.html").is_file()
    man = json.loads((run / "manifest.json").read_text())
    looks = _looks(run)
    assert not man[rs.LOOK_LOG]["look_errors"], man[rs.LOOK_LOG]
    assert looks[-1]["stop"] and man[rs.LOOK_LOG]["stopped"]["ab_rounds"] < 6  # before MAX_ROUNDS
    assert len(man["plan_not_run"]) > 0 and not any(x["stop"] for x in looks[:-1])
    comp = json.loads((run / "comparison.json").read_text())
    assert comp["headline"]["rule"] == "sequential" and comp["headline"]["kind"] == "slower", comp["headline"]
    assert "slower" in (run / "summary.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_make_ab_until_decided_without_an_effect_runs_to_max_rounds(tmp_path):
    p, run = _make_ab(tmp_path, "B_SIM_SET=model.extra_step_pct=0", "DESIGN=swap", "MAX_ROUNDS=4", "MARGIN_PCT=0")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    assert "report: " in p.stdout and (run / "index.html").is_file()
    man = json.loads((run / "manifest.json").read_text())
    looks = _looks(run)
    assert [x["rounds"] for x in looks] == [1, 2, 3, 4] and not man[rs.LOOK_LOG]["look_errors"]
    assert [x["stop"] for x in looks] == [False, False, False, True]  # the last look decides
    assert not man.get("plan_not_run") and man["analysis"]["margin_pct"] == 0
    comp = json.loads((run / "comparison.json").read_text())
    assert comp["headline"]["rule"] == "sequential" and comp["settings"]["margin_pct"] == 0
    # the same run resumed with a window file the statistics cannot read: nothing left to run, the report fails,
    # and `make ab` says so in one line and exits non-zero (it exited 0 before)
    blk = sorted((run / "blocks").iterdir())[0] / "block.json"
    blk.write_text(json.dumps({**json.loads(blk.read_text()), "schema": "tts-block/9"}))
    p = subprocess.run(["make", "-s", "ab", f"RESUME={run}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0, p.stdout[-2000:] + p.stderr[-2000:]  # (make itself exits 2 when its recipe fails)
    errors = [x for x in p.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and "report for" in errors[0] and "tts-block/9" in errors[0], p.stderr
    assert "report: " not in p.stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_nested_until_decided_stops_at_the_right_look(tmp_path):
    """2 window pairs per start, MAX_ROUNDS 6 = 3 starts: one look per start, counting starts (from 2), and the run
    stops at the first look whose rule says stop when replayed on the stored units (the last look at the latest).
    B is 50 % slower per step: on a box busy with other jobs a start's windows scatter widely, and the test is
    about where the run stops, not about the power of 3 starts."""
    p, run = _make_ab(tmp_path, "B_SIM_SET=model.extra_step_pct=50", "DESIGN=nested", "PAIRS=2", "MAX_ROUNDS=6")
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    man = json.loads((run / "manifest.json").read_text())
    looks = _looks(run)
    assert not man[rs.LOOK_LOG]["look_errors"], man[rs.LOOK_LOG]
    assert [x["starts"] for x in looks] == list(range(1, len(looks) + 1))  # one look per start, never per round
    assert all((x["min_units"], x["max_units"]) == (2, 3) for x in looks)
    stop_at = next(i for i, x in enumerate(looks) if x["stop"])
    assert stop_at == len(looks) - 1  # the run stopped at the first look that said stop
    assert len(starts_of(manifest_windows(man))) == len(looks) == len(list(run.glob("starts/*/start.json")))
    assert len(man["starts"]) == 3  # the planned starts stay as planned
    from ttsreport.blocks import block_summary
    from ttsreport.comparison import unit_log_ratios  # replay the rule on the stored units
    from ttsreport.rounds import paired_rounds
    from ttsreport.runfolder import load_run

    data = load_run(run)
    pairs = paired_rounds([block_summary(b, data["starts"].get(b["meta"].get("start"))) for b in data["blocks"]],
                          "ab")
    units = unit_log_ratios(pairs, "8", "audio_throughput", "start")
    seq = sequential_of(man, 1.0, 0.95)
    assert seq["unit"] == "start" and (seq["min_units"], seq["max_units"]) == (2, 3)
    replay = [inf.sequential_look({"8": units}, look=k, min_rounds=2, max_rounds=3, alpha=seq["alpha"],
                                  margin_pct=seq["margin_pct"], higher_is_better=True)["stop"]
              for k in range(1, len(units) + 1)]
    assert replay.index(True) == stop_at
    comp = json.loads((run / "comparison.json").read_text())
    head = comp["headline"]
    assert head["rule"] == "sequential" and head["kind"] in ("slower", "inconclusive"), head  # never a wrong claim
    assert head["levels"]["8"]["ratio"] < 0.9, head  # the known direction and size (x1/1.5 on a quiet box)


@pytest.mark.slow
def test_make_report_on_a_broken_run_folder_fails_in_one_line(tmp_path):
    run = sr.fresh(tmp_path / "r", rounds=2)
    (run / "manifest.json").write_text('{"schema": "tts-ab/2", "design": {"name": "fresh", "sequential": '
                                       '{"min_rounds": 2}}}')
    p = subprocess.run(["make", "-s", "report", f"RUN={run}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode != 0
    ours = [x for x in p.stderr.splitlines() if not x.startswith("make")]
    assert len(ours) == 1 and ours[0].startswith(f"error: {run}: ") and "max_rounds" in ours[0], p.stderr
    assert "Traceback" not in p.stderr and not (run / "summary.json").exists()

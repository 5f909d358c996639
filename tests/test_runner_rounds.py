"""The runner's round logic (unit tier, no process started): a failed window reruns its whole round at once in a new
attempt, resume runs what is not done (per window in fresh, per round in swap/nested), the sequential look decides
when to stop (with a stub in place of `python -m ttsreport --look`), and the hot-swap records: the switch confirmed
from the counters, requests that spanned it, the last snapshot the evidence check reads."""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace

import pytest

from loadtest import ab, plan, provenance, runner, window_check
from tts_predictor import metrics as m
from ttsrecords import records
from ttsrecords import runsettings as rs
from ttsrecords.manifest import RUNNER_KEYS, read_manifest
from ttsrecords.windows import plan_from_list, rounds_of


@pytest.fixture
def make_runner(new_run):
    def make(*args):
        run, manifest = new_run(*args)
        return runner.Runner(run, manifest, progress=lambda line: None)
    return make


def test_runner_records_the_cpu_plan_and_pins_only_a_gpu_run(make_runner, monkeypatch):
    r = make_runner()
    pinned = []
    monkeypatch.setattr(runner.pinning, "pin_load_generator", lambda p: pinned.append(p) or [0, 1])
    r.pin_cpus()
    assert r.log.cpu["server_cpus"] and "governors" in r.log.cpu and not pinned  # the simulator: recorded only
    assert json.loads((r.run / "manifest.json").read_text())["cpu"] == r.log.cpu
    r.s["backend"] = "vllm"
    r.pin_cpus()
    assert pinned and r.log.cpu["load_generator_affinity"] == "0-1"
    monkeypatch.setenv("SERVER_NUMA_NODE", "99")
    if not runner.pinning.numa_nodes():  # a kernel without NUMA nodes in /sys: no node to refuse
        return
    with pytest.raises(runner.PreparationFailed, match="SERVER_NUMA_NODE=99"):
        r.pin_cpus()


class Script:
    """run_window stand-in: statuses by (block_id, attempt) (default complete); writes block.json like the runner."""

    def __init__(self, r, outcomes=None):
        self.r, self.outcomes, self.calls = r, outcomes or {}, []

    def __call__(self, i, w, attempt):
        self.calls.append((w.block_id, attempt))
        status = self.outcomes.get((w.block_id, attempt), "complete")
        meta = records.BlockRecord(block_id=w.block_id, round=w.round, kind=w.kind, arm=w.arm,
                                   variant=w.variant, attempt=attempt, status=status,
                                   reason=None if status == "complete" else f"{status} on purpose")
        bdir = self.r.run / "blocks" / w.block_id
        bdir.mkdir(parents=True, exist_ok=True)
        records.write_json(bdir / "block.json", meta.to_dict())
        return meta.to_dict()


def test_a_failed_window_reruns_its_whole_round_at_once(make_runner, monkeypatch):
    r = make_runner("--rounds", "2", "--aa-rounds", "0")
    rounds = rounds_of(r.plan)
    first, second = rounds[0]
    script = Script(r, {(second.block_id, 0): "failed"})
    monkeypatch.setattr(r, "run_window", script)
    r.run_round(rounds[0], *r.todo(rounds[0]))
    # both windows again, in order, at once, attempt 1 (the complete one too: a pair belongs together)
    assert script.calls == [(first.block_id, 0), (second.block_id, 0), (first.block_id, 1),
                            (second.block_id, 1)]
    assert r.log.reruns == [{"round": 0, "attempt": 1, "because": f"{second.block_id}: failed on purpose"}]
    assert r.todo(rounds[0]) is None  # done


def test_a_round_that_keeps_failing_runs_out_its_last_attempt_and_is_not_retried(make_runner, monkeypatch):
    r = make_runner("--rounds", "1", "--aa-rounds", "0")
    (rnd,) = rounds_of(r.plan)
    first, second = rnd
    script = Script(r, {(first.block_id, 0): "failed", (first.block_id, 1): "failed"})
    monkeypatch.setattr(r, "run_window", script)
    r.run_round(rnd, *r.todo(rnd))
    # attempt 0 stops at the failure; the last attempt runs the whole round, so the healthy arm's data exists
    assert script.calls == [(first.block_id, 0), (first.block_id, 1), (second.block_id, 1)]
    assert r.todo(rnd) is None  # failed FAILED_RERUNS_MAX + 1 times: given up, also on a resume


def test_resume_runs_windows_in_fresh_and_whole_rounds_when_the_arms_share_a_start(make_runner, monkeypatch):
    for design, expect_both in (("fresh", False), ("swap", True)):
        r = make_runner("--rounds", "1", "--aa-rounds", "0", "--design", design)
        (rnd,) = rounds_of(r.plan)
        script = Script(r, {(rnd[1].block_id, 0): "interrupted"})
        monkeypatch.setattr(r, "run_window", script)
        r.run_round(rnd, *r.todo(rnd))
        todo, attempt = r.todo(rnd)
        assert attempt == 0  # an interruption is no failure
        assert [w.block_id for w in todo] == [w.block_id for w in (rnd if expect_both else rnd[1:])]


def _look(r, monkeypatch, lines, rc=0):
    """Stub `python -m ttsreport <run> --look`: appends the next line to looks.jsonl."""
    seq = iter(lines)

    def fake_run(cmd, **kw):
        assert cmd[-3:] == ["ttsreport", str(r.run), "--look"] and kw.get("timeout")
        line = next(seq)
        with open(r.run / "looks.jsonl", "a") as f:
            f.write(json.dumps({"schema": records.LOOK_SCHEMA, **line}) + "\n")
        return subprocess.CompletedProcess(cmd, rc, "", "error: no --look here" if rc else "")

    monkeypatch.setattr(runner.subprocess, "run", fake_run)


def test_sequential_look_stops_only_after_the_minimum_and_every_aa_round(make_runner, monkeypatch):
    r = make_runner("--until-decided", "--max-rounds", "6", "--min-rounds", "2", "--aa-rounds", "1")
    rounds = rounds_of(r.plan)
    aa_round = next(i for i, x in enumerate(rounds) if x[0].kind == "aa")
    assert aa_round < 1 + 2  # placed before the earliest stop
    stop = {"stop": True, "reason": "CI excludes 0 at every level", "kind": "ab"}
    _look(r, monkeypatch, [stop] * 7)
    decided = None
    for i, windows in enumerate(rounds):
        if r.look(windows):
            decided = i
            break
    ab_before = sum(1 for x in rounds[:decided + 1] if x[0].kind == "ab")
    assert ab_before == 2 and decided == 2  # 1 A/A + 2 A/B rounds: the minimum
    seq = r.log.sequential_looks
    assert r.m["design"]["sequential"]["max_rounds"] == 6  # the settings stay where the planner wrote them
    assert seq["stopped"]["after_round"] == 2 and seq["stopped"]["reason"] == stop["reason"] and seq["looks"] == 3
    assert len(seq["ignored_stops"]) == 2
    assert {w.round for w in r.plan} == {0, 1, 2} and {w.round for w in r.log.plan_not_run} == {3, 4, 5, 6}
    assert json.loads((r.run / "manifest.json").read_text())[rs.LOOK_LOG]["stopped"]["after_round"] == 2


def test_sequential_look_that_fails_or_says_go_on_never_stops(make_runner, monkeypatch, capsys):
    r = make_runner("--until-decided", "--max-rounds", "3", "--aa-rounds", "0")
    _look(r, monkeypatch, [{"stop": False, "reason": "not yet"}] * 3)
    assert not any(r.look(w) for w in rounds_of(r.plan))
    r2 = make_runner("--until-decided", "--max-rounds", "3", "--aa-rounds", "0")
    _look(r2, monkeypatch, [{"stop": True}] * 3, rc=2)
    assert not any(r2.look(w) for w in rounds_of(r2.plan))
    assert len(r2.log.sequential_looks["look_errors"]) == 3 and "no --look here" in r2.log.sequential_looks["look_errors"][0][
        "error"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all("sequential look after round" in e and "failed" in e for e in err)
    assert "maximum rounds" not in "".join(err) and err[-1].endswith("it was the last round")


def _snap(t, epoch, active, ok=True):
    return {"kind": "snapshot", "t": t, "ok": ok, "edge": "count_start",
            "samples": {m.CONTROL_EPOCH: epoch, f'{m.ACTIVE_VARIANT}{{variant="{active}"}}': 1.0,
                        f'{m.CALLS}{{variant="{active}"}}': 30.0}}


def test_switch_confirmed_from_the_first_snapshot_that_shows_it():
    counters = [_snap(9.0, 4, "original"),
                {"kind": "control", "t": 10.0, "variant": "fixed", "epoch": 5, "observe": True, "phase": "count"},
                _snap(10.2, 4, "original"), _snap(10.4, 5, "fixed", ok=False), _snap(10.5, 5, "fixed"),
                {"kind": "control", "t": 11.0, "variant": "fixed", "epoch": 6, "observe": False, "phase": "warmup"},
                _snap(11.5, 6, "fixed")]
    sw = window_check.switch_record(counters, "b1")
    assert sw == {"t": 10.0, "variant": "fixed", "epoch": 5, "confirmed_t": 10.5, "block_id": "b1"}
    assert window_check.switch_record(counters[:3], "b1")["confirmed_t"] is None
    assert window_check.switch_record([_snap(1, 0, "original")], "b1") is None
    rows = window_check.last_snapshot_rows(counters)
    assert (m.CONTROL_EPOCH, {}, 6.0) in rows and (m.CALLS, {"variant": "fixed"}, 30.0) in rows


def test_a_switch_is_trusted_only_when_written_and_shown():
    write = {"kind": "control", "t": 10.0, "variant": "fixed", "epoch": 5, "observe": True, "phase": "count"}
    sw, why = window_check.confirm_switch([write, _snap(10.5, 5, "fixed")], "b1", "fixed")
    assert sw["confirmed_t"] == 10.5 and why is None
    sw, why = window_check.confirm_switch([write, _snap(10.5, 4, "original")], "b1", "fixed")
    assert sw["confirmed_t"] is None and why == ("hot swap to fixed (epoch 5) not confirmed: no snapshot shows the "
                                                 "server running it")
    assert window_check.confirm_switch([_snap(1, 0, "original")], "b1", "fixed") == (
        None, "hot swap to fixed: no control write was recorded")


def test_a_shared_start_leaves_the_sync_signature_to_the_manipulation_check():
    """A hot-swap start's cumulative counters hold both arms' calls, so the signature check there would fail a good
    window; the arm's other evidence still decides, and the reason says where the signature went."""
    from loadtest import experiment as ex

    arm = ex.Arm(name="B", label="fixed", backend="sim", variant="fixed",
                 evidence=ex.Evidence(sync_signature="fixed", metric_present=(m.CALLS,)))
    last = _snap(2.0, 4, "fixed")
    last["samples"][f'{m.CALLS}{{variant="original"}}'] = 30.0  # the earlier arm's calls stay in the cumulative counters
    both = [_snap(1.0, 3, "original"), last]
    own_ok, _ = window_check.arm_evidence(arm, "", both, shared_start=False)
    ok, reason = window_check.arm_evidence(arm, "", both, shared_start=True)
    assert ok and "sync signature checked per window by the manipulation check" in reason and not own_ok
    none = replace(arm, evidence=ex.Evidence(metric_present=("tts_missing_total",)))
    assert window_check.arm_evidence(none, "", both, shared_start=True) == (
        False, "metric tts_missing_total is not exposed")


def test_a_look_stop_waits_for_the_minimum_and_the_aa_rounds():
    windows = plan_from_list([{"block_id": f"r{r}{a}", "round": r, "kind": k, "arm": a, "variant": "fixed",
                               "spec": a, "start": 2 * r + (a == "B"), "position": int(a == "B"), "order": [0],
                               "levels": [8]} for r, k in enumerate(["ab", "ab", "aa", "ab"]) for a in "AB"])
    assert rs.stop_refused(windows, 0, 2) == (1, "1 of the minimum 2 A/B rounds")
    assert rs.stop_refused(windows, 1, 2) == (2, "A/A rounds [2] still to run")
    assert rs.stop_refused(windows, 2, 2) == (2, None) and rs.stop_refused(windows, 3, 3) == (3, None)


def test_requests_that_span_a_switch_are_counted():
    sw = [{"t": 10.0, "confirmed_t": 10.5}]
    reqs = [{"t_start": 9.0, "e2e_s": 1.2, "phase": "count"},  # ran through the switch
            {"t_start": 10.4, "e2e_s": None, "phase": "count"},  # failed at once, inside it
            {"t_start": 10.6, "e2e_s": 3.0, "phase": "measure"},  # after it
            {"t_start": 5.0, "e2e_s": 4.0, "phase": "warmup"}]  # before it
    assert window_check.spanning(reqs, sw) == {"total": 2, "measure": 0}
    assert window_check.spanning([{"t_start": 9.9, "e2e_s": 1.0, "phase": "measure"}], sw) == {"total": 1, "measure": 1}
    assert window_check.spanning(reqs, []) == {"total": 0, "measure": 0}


def test_locust_command_of_a_window(tmp_path):
    cmd = runner.locust_cmd(tmp_path, "http://127.0.0.1:1", "fixed", tmp_path / "control.json", 12, 2.5)
    assert cmd[cmd.index("--exit-code-on-error") + 1] == "0" and cmd[cmd.index("--request-timeout") + 1] == "2.5"
    assert cmd[cmd.index("--scenario") + 1] == str(tmp_path / "scenario.yaml")
    assert cmd[cmd.index("--control") + 1] == str(tmp_path / "control.json") and "12" in cmd
    bare = runner.locust_cmd(tmp_path, "http://127.0.0.1:1", None, None, None, None)
    assert not {"--control", "--variant", "--request-timeout"} & set(bare)  # an arm without the plugin


def test_pilot_asks_the_statistics_for_the_plan_and_prints_it(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(cmd, **kw):
        calls.append(cmd)
        if "--target-halfwidth-pct" in cmd:
            return subprocess.CompletedProcess(cmd, 2, "", "error: the pilot has no valid start")
        return subprocess.CompletedProcess(cmd, 0, "S=6 starts x W=3 pairs: half-width 0.9 %\n", "")

    monkeypatch.setattr(ab.subprocess, "run", fake_run)
    assert ab.pilot_plan(tmp_path, None) == 0
    out = capsys.readouterr().out
    assert "S=6 starts" in out and f"PLAN_FROM={tmp_path}" in out
    assert calls[0][-3:] == ["ttsreport", str(tmp_path), "--plan"]
    assert ab.pilot_plan(tmp_path, 0.5) == 1
    assert calls[1][-2:] == ["--target-halfwidth-pct", "0.5"]
    assert "the pilot has no valid start" in capsys.readouterr().err


def test_sequential_settings_are_read_from_the_manifest_the_runner_writes(tmp_path, monkeypatch):
    """loadtest.plan puts the sequential settings under design.sequential; the runner's own record of its looks
    (manifest["sequential"]: counts and errors, no max_rounds) must not hide them from the look."""
    from ttsreport.analysis import sequential_of

    monkeypatch.setattr(provenance, "_run_quiet", lambda cmd, timeout=5.0: None)
    _, man = plan.new_run(ab.parse_args(["--out", str(tmp_path), "--name", "s", "--until-decided", "--max-rounds",
                                         "4", "--min-rounds", "2", "--aa-rounds", "0", "--levels", "8"]))
    want = {"min_rounds": 2, "max_rounds": 4, "min_units": 2, "max_units": 4, "alpha": 0.05, "margin_pct": 1.0}
    got = sequential_of(man, 1.0, 0.95)
    assert {k: got[k] for k in want} == want
    man["sequential"] = {"looks": 1, "look_errors": [], "ignored_stops": []}  # a look log where older runners kept it
    got = sequential_of(man, 1.0, 0.95)
    assert {k: got[k] for k in want} == want


def test_the_runner_writes_only_its_own_keys_and_refuses_a_broken_plan(make_runner):
    """The planner's fields (the plan too) stay as planned; what the runner records goes under RUNNER_KEYS."""
    r = make_runner()
    planned = json.loads((r.run / "manifest.json").read_text(encoding="utf-8"))
    r.log.plan_not_run = r.planned[2:]
    r.log.status, r.log.reruns = "running", [{"round": 0, "attempt": 1, "because": "x"}]
    r._save()
    man = json.loads((r.run / "manifest.json").read_text(encoding="utf-8"))
    assert {k: v for k, v in man.items() if k not in RUNNER_KEYS} == \
        {k: v for k, v in planned.items() if k not in RUNNER_KEYS}
    assert plan_from_list(man["plan_not_run"]) == r.planned[2:] and r.plan == r.planned[:2]
    assert read_manifest(man).to_dict() == man and read_manifest(man).windows_to_run == r.plan
    man["plan"][0].pop("arm")
    with pytest.raises(SystemExit, match="manifest.json: plan entry 0: no arm"):
        runner.Runner(r.run, man, progress=lambda line: None)


@pytest.mark.parametrize("design", ["swap", "fresh"])
def test_time_left_counts_a_server_start_once_per_start_not_in_every_window(make_runner, design):
    """A start's ready + stop time (80 s on the real CPU server) is a cost per start: folded into every window's
    overhead it tripled the real server's estimate (~144 min shown for a 95 min swap run)."""
    r = make_runner("--design", design, "--rounds", "3", "--aa-rounds", "0")
    r.overhead_s, r.start_cost_s = 5.0, 80.0
    plan = list(r.plan)
    later = plan[1:]
    starts_left = len({w.start for w in later} - {plan[0].start})
    assert starts_left == (0 if design == "swap" else len(plan) - 1)
    want = (r.window_s - 2.0) + len(later) * (r.window_s + 5.0) + starts_left * 80.0
    assert r._left_s(0, 2.0, r.window_s) == pytest.approx(want)

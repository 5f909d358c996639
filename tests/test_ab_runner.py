"""The A/B runner: its plan and block verdicts (unit tier), and real runs against the simulator (fresh server per
block, interruption, resume)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

from loadtest import ab, plan, records, runner
from loadtest.scenario import load_scenario
from loadtest.server_process import health

QUICK = ["--scenario", "configs/scenarios/smoke.yaml", "--sim-config", "configs/sim/fast.yaml", "--levels", "8",
         "--warmup-s", "1", "--measure-s", "3", "--drain-s", "0"]


def test_plan_aa_first_then_seeded_random_order():
    blocks = plan.make_plan(rounds=8, aa_rounds=2, a="original", b="fixed", seed=11)
    assert [p["kind"] for p in blocks] == ["aa"] * 4 + ["ab"] * 16
    assert all(p["variant"] == "original" for p in blocks[:4])
    firsts = [blocks[i]["arm"] for i in range(4, 20, 2)]
    assert set(firsts) == {"A", "B"}  # both orders occur
    for i in range(0, 20, 2):
        assert {blocks[i]["arm"], blocks[i + 1]["arm"]} == {"A", "B"} and blocks[i]["round"] == blocks[i + 1]["round"]
    assert blocks == plan.make_plan(8, 2, "original", "fixed", 11) != plan.make_plan(8, 2, "original", "fixed", 12)


def test_effective_scenario_overrides(tmp_path):
    out = plan.effective_scenario(ROOT / "configs/scenarios/demo.yaml", tmp_path / "s.yaml", {"measure_s": 2.5},
                                  [8, 64], ["mix={short: 1}"])
    sc = load_scenario(str(out))
    assert [s.concurrency for s in sc.steps] == [8, 64] and sc.steps[0].measure_s == 2.5
    assert sc.mix == {"short": 1}


def test_bad_input_fails_before_anything_is_written(tmp_path, capsys):
    assert ab.main(["--a", "nope", "--out", str(tmp_path)]) == 2
    assert "unknown variant 'nope'" in capsys.readouterr().err and not list(tmp_path.iterdir())
    assert ab.main(["--levels", "0", "--out", str(tmp_path), *QUICK[:4]]) == 2
    assert not list(tmp_path.iterdir())


def _blocks(run: Path) -> dict[str, dict]:
    return {p.name: json.loads((p / "block.json").read_text()) for p in sorted((run / "blocks").iterdir())}


def _all_json_lines_parse(run: Path) -> None:
    for f in run.rglob("*.jsonl"):
        for line in f.read_text().splitlines():
            json.loads(line)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_interrupt_then_resume_against_the_simulator(tmp_path):
    """SIGINT in block 2 stops load and server, leaves consistent files and a partial report; resume finishes."""
    cmd = [sys.executable, "-m", "loadtest.ab", "--a", "original", "--b", "fixed", "--rounds", "1", "--aa-rounds",
           "0", "--out", str(tmp_path), "--name", "run", "--seed", "3", *QUICK]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    run = tmp_path / "run"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        second = list((run / "blocks").glob("001-*/requests.jsonl")) if (run / "blocks").exists() else []
        if second:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.stdout.read()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "make ab RESUME=" in out and "report:" in out
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "interrupted" and man["schema"] == "tts-ab/1"
    assert "token" not in json.dumps(man).lower()
    blocks = _blocks(run)
    first, second = sorted(blocks)
    assert blocks[first]["status"] == "complete" and blocks[second]["status"] == "interrupted"
    _all_json_lines_parse(run)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["partial"] and "PARTIAL RUN" in (run / "index.html").read_text()
    # no server or Locust of ours left behind: their ports are closed
    for b in blocks.values():
        if b.get("server_url"):
            assert not health(b["server_url"], timeout_s=0.5)[0]

    started_first = blocks[first]["started"]
    assert ab.main(["--resume", str(run)]) == 0
    blocks = _blocks(run)
    assert blocks[first]["started"] == started_first  # not repeated
    assert blocks[second]["status"] == "complete"
    assert list((run / "attempts").iterdir())  # the interrupted attempt is kept aside
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "complete" and man["resumed"]
    summary = json.loads((run / "summary.json").read_text())
    assert not summary["partial"] and summary["complete_blocks"] == 2
    _all_json_lines_parse(run)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_server_that_does_not_start_fails_its_block_and_the_run_goes_on(tmp_path):
    rc = ab.main(["--a", "original", "--b", "fixed", "--rounds", "1", "--aa-rounds", "0", "--out", str(tmp_path),
                  "--name", "bad", "--seed", "1", "--sim-set", "model.no_such_key=1", "--no-report", *QUICK])
    assert rc == 0
    blocks = _blocks(tmp_path / "bad")
    assert len(blocks) == 2 and all(b["status"] == "failed" for b in blocks.values())
    assert all("server exited" in b["reason"] for b in blocks.values())
    assert all(b["failed_before"] == 0 for b in blocks.values())
    man = json.loads((tmp_path / "bad" / "manifest.json").read_text())
    assert man["resume_policy"]["failed_reruns_max"] == 1 and "failed" not in man["resume_policy"]["never_rerun"]

    # a resume runs each failed block once more (the first attempt kept aside) ...
    assert ab.main(["--resume", str(tmp_path / "bad"), "--no-report"]) == 0
    again = _blocks(tmp_path / "bad")
    assert all(b["status"] == "failed" and b["failed_before"] == 1 for b in again.values())
    assert sorted(p.name for p in (tmp_path / "bad" / "attempts").iterdir()) == sorted(f"{k}.1" for k in blocks)
    # ... and then no more: a server that never starts is not retried forever
    assert ab.main(["--resume", str(tmp_path / "bad"), "--no-report"]) == 0
    assert _blocks(tmp_path / "bad") == again
    assert len(list((tmp_path / "bad" / "attempts").iterdir())) == 2


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_failed_requests_make_the_block_invalid_with_their_reasons_and_resume_keeps_it(tmp_path, capsys):
    """A server that answers every request with 503: Locust's exit code does not decide (blocks are not 'failed'),
    the records do: each block is 'invalid' with the count and the reason, and a resume does not run it again."""
    rc = ab.main(["--a", "original", "--b", "fixed", "--rounds", "1", "--aa-rounds", "0", "--out", str(tmp_path),
                  "--name", "r", "--seed", "1", "--sim-set", "faults.error_burst={after: 0, length: 100000000, "
                  "status: 503}", "--request-timeout", "5", "--no-report", *QUICK])
    assert rc == 0
    run = tmp_path / "r"
    blocks = _blocks(run)
    assert len(blocks) == 2
    for bid, b in blocks.items():
        recs = [json.loads(x) for x in (run / "blocks" / bid / "requests.jsonl").read_text().splitlines()]
        measure = [r for r in recs if r["phase"] == "measure"]
        assert measure and not any(r["ok"] for r in measure)
        assert b["status"] == "invalid", b
        assert b["reason"] == f"{len(measure)} of {len(measure)} measure-phase requests failed: http 503 ({len(measure)})"
        assert b["requests"]["measure_errors"] == {"http 503": len(measure)}
    assert "INVALID BLOCK" in capsys.readouterr().err
    man = json.loads((run / "manifest.json").read_text())
    assert man["settings"]["request_timeout_s"] == 5
    assert ab.main(["--resume", str(run), "--no-report"]) == 0
    assert _blocks(run) == blocks and not (run / "attempts").exists()  # invalid blocks are never run again


def test_request_outcomes_and_verdict(tmp_path):
    """The runner judges a finished block from its files (a killed Locust's half line is skipped, not fatal)."""
    bdir = tmp_path
    rows = [("measure", True, None)] * 68 + [("measure", False, "http 503: queue full")] * 10 + \
        [("measure", False, "stream broken after 4800 bytes: ClientPayloadError: x")] * 2 + \
        [("warmup", False, "connect: ConnectionRefusedError")] * 3
    (bdir / "requests.jsonl").write_text(
        "".join(json.dumps({"phase": ph, "ok": ok, "error": err}) + "\n" for ph, ok, err in rows) + '{"pha')
    o, why = runner.judge("original", bdir)
    assert (o["measure"], o["measure_failed"], o["other"], o["other_failed"]) == (80, 12, 3, 3)
    assert o["measure_errors"] == {"http 503": 10, "stream broken": 2}
    assert records.request_verdict(o) is None  # failed requests are data: the error rate has its own verdict
    assert why.startswith("manipulation check failed")  # no counters were written: the variant cannot be verified
    one = [{"phase": "warmup", "ok": False, "error": "no response: TimeoutError"}]
    assert records.request_verdict(records.request_outcomes(one)) == (
        "no measure-phase request was recorded (1 of 1 other requests failed: no response (1))")
    ok = [{"phase": "measure", "ok": True, "error": None}]
    assert records.request_verdict(records.request_outcomes(ok)) is None
    # requests fine, but no counters: the manipulation check cannot verify the variant
    assert records.load_verdict("original", records.request_outcomes(ok), []).startswith("manipulation check failed")
    assert records.error_kind("odd PCM byte count 4801") == "odd PCM byte count"
    assert records.error_kind("http 500") == "http 500" and records.error_kind(None) == "unknown error"


def test_locust_runs_without_failure_exit_code_and_with_the_request_timeout(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "scenario.yaml").write_text((ROOT / "configs/scenarios/smoke.yaml").read_text())
    b = plan.make_plan(1, 0, "original", "fixed", 1)[0]
    for timeout, extra in ((None, []), (2.5, ["--request-timeout", "2.5"])):
        r = runner.Runner(run, {"settings": {"request_timeout_s": timeout}, "plan": []})
        cmd = r.locust_cmd(b, run / "blocks" / "x", "http://127.0.0.1:1")
        assert cmd[cmd.index("--exit-code-on-error") + 1] == "0"
        assert [x for x in cmd if x == "--request-timeout"] == extra[:1] and (not extra or "2.5" in cmd)
    assert ab.main(["--request-timeout", "nan", "--out", str(tmp_path / "o")]) == 2


def test_demo_preset_is_a_valid_run_description(tmp_path):
    a = ab.parse_args(["--demo"])
    for k, v in ab.DEMO.items():
        setattr(a, k, v)
    assert a.a == "original" and a.b == "fixed" and a.backend == "sim" and a.aa_rounds >= 1
    phases = {k: v for k, v in (("warmup_s", a.warmup_s), ("measure_s", a.measure_s), ("drain_s", a.drain_s))
              if v is not None}
    out = plan.effective_scenario(ROOT / a.scenario, tmp_path / "s.yaml", phases,
                                  [int(x) for x in a.levels.split(",")] if a.levels else None, a.scenario_set,
                                  a.last_drain_s)
    sc = load_scenario(str(out))
    assert min(s.concurrency for s in sc.steps) == 8 and max(s.concurrency for s in sc.steps) == 256
    assert sc.steps[-1].drain_s > 0 and sc.steps[0].drain_s == 0
    assert (ROOT / a.sim_config).is_file()


def test_demo_settings_live_in_the_config_files(tmp_path):
    """--demo only points at configs/scenarios/demo.yaml and configs/sim/demo.yaml: a reader of those files sees
    exactly what runs (the levels, phases, prompts, batch and queue the preset used to set in code)."""
    from ttssim.config import load_config

    d = ab.DEMO
    assert d["scenario"] == "configs/scenarios/demo.yaml" and d["sim_config"] == "configs/sim/demo.yaml"
    assert not any(d.get(k) for k in ("levels", "warmup_s", "measure_s", "drain_s", "last_drain_s", "sim_set",
                                      "b_sim_set", "scenario_set"))  # no overrides in code
    sc = load_scenario(str(ROOT / d["scenario"]))
    assert [s.concurrency for s in sc.steps] == [8, 64, 256]
    assert [(s.warmup_s, s.measure_s, s.drain_s) for s in sc.steps] == [(2, 4, 0), (2, 4, 0), (2, 4, 5)]
    assert sc.mix == {"short": 1}
    assert sc.duration_s * (d["rounds"] + d["aa_rounds"]) * 2 < 240  # 8 blocks of load inside `make demo`'s 5 min
    cfg = load_config(ROOT / d["sim_config"])
    assert cfg.model.max_batch_size >= 256 and cfg.model.max_waiting >= 1024
    fast = load_config(ROOT / "configs/sim/fast.yaml")  # otherwise the quick simulator of the tests
    assert cfg.model.__class__(**{**vars(cfg.model), "max_batch_size": 16, "max_waiting": 8}) == fast.model
    assert (cfg.audio, cfg.server, cfg.faults) == (fast.audio, fast.server, fast.faults)
    for f in (d["scenario"], d["sim_config"]):
        assert (ROOT / f).read_text().startswith("# `make demo`")  # the comments say why

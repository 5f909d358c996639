"""The A/B runner: its plan, and real runs against the simulator (fresh server per block, interruption, resume)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest import ab

ROOT = Path(__file__).resolve().parent.parent
QUICK = ["--scenario", "configs/scenarios/smoke.yaml", "--sim-config", "configs/sim/fast.yaml", "--levels", "8",
         "--warmup-s", "1", "--measure-s", "3", "--drain-s", "0"]


def test_plan_aa_first_then_seeded_random_order():
    plan = ab.make_plan(rounds=8, aa_rounds=2, a="original", b="fixed", seed=11)
    assert [p["kind"] for p in plan] == ["aa"] * 4 + ["ab"] * 16
    assert all(p["variant"] == "original" for p in plan[:4])
    firsts = [plan[i]["arm"] for i in range(4, 20, 2)]
    assert set(firsts) == {"A", "B"}  # both orders occur
    for i in range(0, 20, 2):
        assert {plan[i]["arm"], plan[i + 1]["arm"]} == {"A", "B"} and plan[i]["round"] == plan[i + 1]["round"]
    assert plan == ab.make_plan(8, 2, "original", "fixed", 11) != ab.make_plan(8, 2, "original", "fixed", 12)


def test_effective_scenario_overrides(tmp_path):
    out = ab.effective_scenario(ROOT / "configs/scenarios/demo.yaml", tmp_path / "s.yaml", {"measure_s": 2.5},
                                [8, 64], ["mix={short: 1}"])
    from loadtest.scenario import load_scenario

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
            assert not ab.health(b["server_url"], timeout=0.5)

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


@pytest.mark.timeout(120)
def test_server_that_does_not_start_fails_its_block_and_the_run_goes_on(tmp_path):
    rc = ab.main(["--a", "original", "--b", "fixed", "--rounds", "1", "--aa-rounds", "0", "--out", str(tmp_path),
                  "--name", "bad", "--seed", "1", "--sim-set", "model.no_such_key=1", "--no-report", *QUICK])
    assert rc == 0
    blocks = _blocks(tmp_path / "bad")
    assert len(blocks) == 2 and all(b["status"] == "failed" for b in blocks.values())
    assert all("server exited" in b["reason"] for b in blocks.values())


def test_demo_preset_is_a_valid_run_description(tmp_path):
    a = ab.parse_args(["--demo"])
    for k, v in ab.DEMO.items():
        setattr(a, k, v)
    assert a.a == "original" and a.b == "fixed" and a.backend == "sim" and a.aa_rounds >= 1
    phases = {"warmup_s": a.warmup_s, "measure_s": a.measure_s, "drain_s": a.drain_s}
    out = ab.effective_scenario(ROOT / a.scenario, tmp_path / "s.yaml", phases,
                                [int(x) for x in a.levels.split(",")], a.scenario_set, a.last_drain_s)
    from loadtest.scenario import load_scenario

    sc = load_scenario(str(out))
    assert min(s.concurrency for s in sc.steps) == 8 and max(s.concurrency for s in sc.steps) == 256
    assert sc.steps[-1].drain_s > 0 and sc.steps[0].drain_s == 0
    assert (ROOT / a.sim_config).is_file()

"""The plugin's positive control as an A/B arm: `make ab A=fixed B=fixed B_HOST_DELAY_US=500 BACKEND=vllm-cpu` plans
arm B with a fixed extra host delay per build_attn_metadata call, every control write of B's windows carries it (read
back by the plugin's own control reader), and the report says which arm carried it."""

from __future__ import annotations

import json

import pytest
import synthetic_runs as sr
from conftest import example_results

from loadtest import ab, plan, provenance
from loadtest.runner import locust_cmd
from loadtest.scraper import Scraper
from loadtest.session import EdgeRunner
from loadtest.shape import WRITE, EdgeAction
from tts_predictor.control import MAX_HOST_DELAY_US, read_control
from ttsreport import analysis, render, report
from ttsreport.report import banners


def _args(**kw):
    a = ab.parse_args([])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


def _new_run(tmp_path, monkeypatch, **kw):
    monkeypatch.setattr(provenance, "_run_quiet", lambda cmd, timeout=5.0: None)  # git, nvidia-smi: not in the unit tier
    a = _args(out=str(tmp_path), name="r", levels="1", **kw)
    return plan.new_run(a)


def test_arm_b_carries_the_delay_on_a_real_server_and_arm_a_does_not(tmp_path, monkeypatch):
    run, m = _new_run(tmp_path, monkeypatch, a="fixed", b="fixed", backend="vllm-cpu", design="swap",
                      b_host_delay_us=500.0)
    assert m["arms"]["B"]["host_delay_us"] == 500.0 and m["arms"]["A"]["host_delay_us"] == 0.0
    assert m["arms"]["B"]["variant"] == m["arms"]["A"]["variant"] == "fixed"
    assert m["labels"]["B"] == "fixed + 500 us host delay" and m["labels"]["A"] == "fixed"
    assert m["experiment"]["name"] == "known-answer-fixed"
    arms = plan.arms_of(plan.experiment_for(m["settings"]))  # a resume derives the same arms from the settings
    assert plan.control_extra(arms["B"], True) == {"host_delay_us": 500.0}
    assert plan.control_extra(arms["A"], True) == {}


@pytest.mark.parametrize("kw, words", [
    (dict(a="fixed", b="fixed", b_host_delay_us=500.0), "on the simulator use --b-sim-set"),
    (dict(a="fixed", b="fixed", backend="vllm-cpu", b_host_delay_us=MAX_HOST_DELAY_US + 1), "at most"),
    (dict(a="fixed", b="fixed", backend="vllm-cpu", b_host_delay_us=-5.0), "above 0"),
])
def test_refused_in_one_line_where_it_cannot_run(tmp_path, monkeypatch, kw, words):
    with pytest.raises(SystemExit) as e:
        _new_run(tmp_path, monkeypatch, **kw)
    msg = str(e.value)
    assert msg.startswith("error: ") and words in msg and "\n" not in msg
    assert not (tmp_path / "r").exists()


def test_locust_gets_the_delay_and_its_control_writes_carry_it_to_the_plugin(tmp_path):
    cmd = locust_cmd(tmp_path, "http://x", "fixed", tmp_path / "control.json", 4, None, {"host_delay_us": 250.0})
    assert cmd[cmd.index("--control-host-delay-us") + 1] == "250"
    assert "--control-host-delay-us" not in locust_cmd(tmp_path, "http://x", "fixed", tmp_path / "c.json", 4, None, {})
    ctl = tmp_path / "control.json"
    lines: list = []
    scen = type("S", (), {"steps": []})()
    edges = EdgeRunner(Scraper([], lines.append), lines.append, str(ctl), "fixed", scen, host_delay_us=250.0)
    edges.do(EdgeAction(WRITE, 0, 1, phase="measure", observe=False, epoch=7))
    setting = read_control(ctl)  # the plugin's own reader: the seam between the load side and the server
    assert (setting.variant, setting.epoch, setting.host_delay_us, setting.observe) == ("fixed", 7, 250.0, False)


def test_the_report_says_which_arm_carried_it():
    man = {"arms": {"A": {"host_delay_us": 0.0}, "B": {"host_delay_us": 500.0}}}
    assert analysis.positive_control(man) == {"B": 500.0}
    assert analysis.positive_control({"arms": {"A": {}, "B": {}}}) == {}
    summary, comparison = example_results({"simulated": False}, {"positive_control": {"B": 500.0}})
    text = json.dumps(banners(summary, comparison))
    assert "POSITIVE CONTROL" in text and "arm B carried a fixed extra 500 us" in text


def test_a_run_folder_with_the_control_in_its_manifest_gets_the_banner_in_both_reports(tmp_path):
    """Across the seam: the manifest's arms (as plan.new_run writes them) -> comparison.json -> the report."""
    arms = {side: {"arm": side, "label": label, "backend": "vllm-cpu", "simulated": False, "variant": "fixed",
                   "host_delay_us": delay} for side, label, delay in (("A", "fixed", 0.0),
                                                                       ("B", "fixed + 500 us host delay", 500.0))}
    run = sr.fresh(tmp_path / "pc", rounds=3, aa_rounds=0, manifest={"arms": arms})
    analysis.write_statistics(run)
    comp = json.loads((run / "comparison.json").read_text())
    assert comp["positive_control"] == {"B": 500.0}
    loaded = report.load(run)
    assert "POSITIVE CONTROL" in render.markdown(*loaded) and "POSITIVE CONTROL" in render.html_page(*loaded)

"""The simulator against the real CPU server: the level-restricted fit (ttssim.fit --levels/--whole-step/--noise/--ttfa),
the comparison tool (tools/sim_vs_real.py) on the committed measurement, and the held-out figure the SIMULATED
banners quote (ttssim.heldout). Reads stored files only: no server, no clock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from tools import sim_vs_real
from ttssim import fit, heldout, realfit
from ttssim.config import load_config

RUN = ROOT / "reports/bench/sim-vs-cpu/real"
PROFILE = ROOT / "configs/sim/cpu-tiny.yaml"


@pytest.mark.slow  # 12 s of fitting (the noise fit's bootstrap): beyond the unit tier's minute
def test_level_restricted_fit_reproduces_the_committed_profile(tmp_path):
    """Fit on c=1,4 only (the committed command): the committed profile, with its levels recorded."""
    out = tmp_path / "cpu.yaml"
    assert fit.main([str(RUN), "--levels", "1,4", "--whole-step", "--noise", "--ttfa", "--base",
                     "configs/sim/cpu-tiny-stage.yaml", "--out", str(out)]) == 0
    got, committed = load_config(out).model, load_config(PROFILE).model
    assert (got.base_ms, got.per_request_ms) == pytest.approx((committed.base_ms, committed.per_request_ms), abs=1e-3)
    assert got.max_batch_size == 4
    assert (got.step_noise_sd, got.step_noise_hold_s, got.code2wav_chunk_ms) == pytest.approx(
        (committed.step_noise_sd, committed.step_noise_hold_s, committed.code2wav_chunk_ms), rel=1e-3)
    assert got.step_noise_sd > 0.1  # the real requests spread: a noiseless profile puts every p90 on its p50
    stored = json.loads(Path(str(out) + ".fit.json").read_text())
    assert stored["levels"] == [1, 4] and stored["names"] == ["base_ms", "per_request_ms", "step_noise_sd",
                                                              "step_noise_hold_s", "code2wav_chunk_ms"]


def test_fit_has_no_more_unknowns_than_windows():
    """Two windows: base and slope only (a third column would be fitted exactly, to noise)."""
    windows = [w for w in realfit.read_windows(RUN) if w.concurrency in (1, 4)]
    assert len(windows) == 2
    assert realfit.fit_windows(realfit.whole_step(windows)).names == ["base_ms", "per_request_ms"]


def test_whole_step_keeps_the_predictor_time_in_the_step():
    windows = realfit.read_windows(RUN)
    assert all(w.predictor_s > 0 for w in windows)  # the real server's plugin measured it
    split, whole = realfit.fit_windows(windows), realfit.fit_windows(realfit.whole_step(windows))
    assert whole.values[0] > split.values[0]


@pytest.mark.slow  # the CLI as a process
def test_fit_refuses_levels_the_run_does_not_have(tmp_path):
    p = subprocess.run([sys.executable, "-m", "ttssim.fit", str(RUN), "--levels", "3"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "no window at the levels [3]" in p.stderr


def test_comparison_of_the_committed_run_matches_the_committed_page(tmp_path):
    md, js = tmp_path / "page.md", tmp_path / "fig.json"
    assert sim_vs_real.main(["--out", str(md), "--json", str(js)]) == 0
    res = json.loads(js.read_text())
    assert res["fit_levels"] == [1, 4]
    assert [r["concurrency"] for r in res["rows"] if r["held_out"]] == [2, 8]
    for r in res["rows"]:
        for k, v in r["residual_pct"].items():
            assert v == pytest.approx(100.0 * (r["sim"][k] / r["real"][k] - 1.0))
    held = max(abs(v) for r in res["rows"] if r["held_out"] for v in r["residual_pct"].values())
    assert res[heldout.KEY] == pytest.approx(round(held, 1))
    assert res == json.loads(heldout.PATH.read_text())  # the committed figure is today's
    assert md.read_text() == (ROOT / "reports/bench/sim-vs-cpu.md").read_text()


def test_closed_loop_rate_is_littles_law():
    assert sim_vs_real.closed_loop_rate(4, [2.0, 2.0, 2.0]) == pytest.approx(2.0)


def test_banner_line_quotes_the_committed_figure(tmp_path, monkeypatch):
    pct = json.loads(heldout.PATH.read_text())[heldout.KEY]
    assert heldout.line() == f"held-out error vs the real CPU server: within {pct:.0f} % (reports/bench/sim-vs-cpu.md)"
    monkeypatch.setattr(heldout, "PATH", tmp_path / "missing.json")
    assert "not measured" in heldout.line()


def test_report_banner_carries_the_held_out_figure():
    from conftest import example_results

    from ttsreport.report import banners

    out = banners(*example_results({"simulated": True, "fidelity": {"line": "fidelity: x"}}))
    assert any(heldout.line() in text for _, text in out)

"""The calibration script on a synthetic pool with a known effect on arm B (fast; the real pool is the simulator's)."""

from __future__ import annotations

from conftest import make_run

from tools import calibrate


def test_calibration_detects_known_effect_and_reports_rates(tmp_path, capsys):
    pool = make_run(tmp_path / "pool", rounds=8, aa_rounds=8, slow_b=0.05, noise=0.004, seed=4, levels=(16,),
                    a="fixed", b="fixed")
    out = tmp_path / "verdicts.md"
    assert calibrate.main([str(pool), "--rounds", "5", "--experiments", "40", "--parametric", "50", "--out", str(out)]) == 0
    text = out.read_text()
    assert "false-positive rate" in text and "detection rate at c=16" in text
    det = next(line for line in text.splitlines() if line.startswith("| 5 | detection rate at c=16"))
    fpr = next(line for line in text.splitlines() if line.startswith("| 5 | false-positive rate"))
    assert det.split("|")[3].strip().startswith("40/40")  # a 5 % effect at 0.4 % noise: always found
    assert int(fpr.split("|")[3].strip().split("/")[0]) <= 6  # A/A: rarely a claim
    assert "CI half-width" in text


def test_calibration_refuses_a_small_pool(tmp_path, capsys):
    pool = make_run(tmp_path / "pool", rounds=2, aa_rounds=1, levels=(8,))
    assert calibrate.main([str(pool), "--rounds", "5"]) == 2
    assert "need >=" in capsys.readouterr().err

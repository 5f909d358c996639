"""The micro benchmark CLI writes the promised files with every case, variant and the measured sync counts."""

from __future__ import annotations

import json

from tools import micro
from tts_predictor.domain import VARIANT_NAMES
from tts_predictor.metrics import syncs_per_call
from ttsrecords.records import MICRO_SCHEMA


def test_micro_cli_writes_results(tmp_path, capsys):
    assert micro.main(["--quick", "--rounds", "1", "--out", str(tmp_path)]) == 0
    (folder,) = tmp_path.iterdir()
    result = json.loads((folder / "results.json").read_text())
    assert result["schema"] == MICRO_SCHEMA and result["device"] == "cpu" and result["torch"]
    rows = result["rows"]
    keys = {(r["scenario"], r["num_reqs"], r["max_seq_len"], r["variant"]) for r in rows}
    for scenario in ("decode", "prefill", "mixed"):
        for n in micro.SIZES:
            assert {(scenario, n, v) for v in VARIANT_NAMES} <= {k[:2] + k[3:] for k in keys}
    assert {r["max_seq_len"] for r in rows if r["scenario"] == "blocks"} == set(micro.SCALING_MAX_SEQ)
    for r in rows:
        assert set(r) >= {"scenario", "num_reqs", "blocks_per_seq", "tokens", "variant", "median_us", "syncs_per_call"}
        assert r["median_us"] > 0
        assert r["syncs_per_call"] == syncs_per_call(r["variant"], r["tokens"])  # measured by the observer
    md = (folder / "results.md").read_text()
    assert "| decode | 256 |" in md and md in capsys.readouterr().out


def test_micro_rejects_bad_arguments(capsys):
    assert micro.main(["--rounds", "0"]) == 2
    assert "--rounds must be >= 1" in capsys.readouterr().err

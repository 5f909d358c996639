"""summary.json and comparison.json as typed results (ttsrecords.results): every committed pair reads back into the
types and writes out byte for byte, the writer refuses a field the type does not have, and the reader refuses a file
it cannot read in one line."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
from conftest import ROOT

from ttsrecords.results import (
    COMPARISON_FILE,
    SUMMARY_FILE,
    Comparison,
    ResultsError,
    Summary,
    read_results,
    write_results,
)

COMMITTED = sorted(p.parent for p in (ROOT / "reports").glob("**/comparison.json"))


@pytest.mark.parametrize("run", COMMITTED, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_results_round_trip_byte_for_byte(run, tmp_path):
    summary, comparison = read_results(run)
    assert isinstance(summary, Summary) and isinstance(comparison, Comparison)
    write_results(tmp_path, summary, comparison)
    for name in (SUMMARY_FILE, COMPARISON_FILE):
        assert (tmp_path / name).read_bytes() == (run / name).read_bytes(), name
    assert read_results(tmp_path) == (summary, comparison)


def test_the_fields_are_the_documented_ones():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for cls in (Summary, Comparison):
        line = next(x for x in doc.splitlines() if x.startswith(f"`{cls.__name__}` fields:"))
        assert line.split(":", 1)[1].strip().strip(".").replace("`", "").split(", ") == \
            [f.name for f in dataclasses.fields(cls)], cls.__name__


def test_a_writer_that_forgets_or_invents_a_field_fails_at_once():
    _, comparison = read_results(ROOT / "reports" / "example")
    d = comparison.to_dict()
    with pytest.raises(ResultsError, match="comparison.json: no per_level") as e:
        Comparison.from_dict({k: v for k, v in d.items() if k != "per_level"})
    assert "\n" not in str(e.value)
    with pytest.raises(ResultsError, match="unknown per_levl"):
        Comparison.from_dict({**d, "per_levl": {}})
    with pytest.raises(ResultsError, match="schema 'tts-comparison/9'"):
        Comparison.from_dict({**d, "schema": "tts-comparison/9"})


def test_a_run_without_readable_results_is_one_line(tmp_path):
    run = tmp_path / "r"
    shutil.copytree(ROOT / "reports" / "example", run)
    (run / COMPARISON_FILE).unlink()
    with pytest.raises(ResultsError, match="comparison.json: No such file") as e:
        read_results(run)
    assert "python -m ttsreport" in str(e.value) and "\n" not in str(e.value)
    (run / COMPARISON_FILE).write_text("{not json")
    with pytest.raises(ResultsError, match="comparison.json: not JSON"):
        read_results(run)
    (run / COMPARISON_FILE).write_text(json.dumps([1]))
    with pytest.raises(ResultsError, match="not a JSON object"):
        read_results(run)

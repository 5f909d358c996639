"""The run folder read into objects (ttsrecords.runfolder): every record type reads back from the dict it writes, and
every committed run folder reads typed, line for line what the dict reader (ttsreport.runfolder) sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT

from ttsrecords import records as rec
from ttsrecords import runfolder as rf
from ttsreport import runfolder as dict_reader

COMMITTED = sorted(p.parent for p in (ROOT / "reports").glob("**/manifest.json")
                   if (p.parent / "blocks").is_dir() and p.parent.parent.name != "blocks")

SAMPLES = [
    rec.RequestRecord(run_id="r", worker="w0", step=0, concurrency=2, phase="measure", mode="stream", ok=True,
                      error=None, status=200, ttfa_s=0.5, e2e_s=2.0, audio_s=5.04, rtf=0.4, bytes=1000, t_start=1.0,
                      prompt_id="p1", bucket="short", variant="fixed", seq=3, underrun_s=0.0, continuity_ok=True,
                      stream_rtf=0.3, chunks=6),
    rec.CounterSnapshot(step=0, concurrency=2, edge="start", t=1.0, target="http://x/metrics", ok=True, error=None,
                        samples={'tts_predictor_calls_total{variant="fixed"}': 5.0}),
    rec.CounterDelta(step=0, concurrency=2, target="t", duration_s=60.0, variant="fixed", calls=10.0, seconds=0.1,
                     syncs=0.0, observed_calls=0.0, observed_tokens=0.0, tokens=20.0, batch_requests=19.0, steps=1.0,
                     step_seconds=None, frames=None, requests_finished=None, syncs_per_call=None, syncs_per_step=None,
                     calls_per_request=None, seconds_per_request=None, mean_batch=1.9, variants_moved=("fixed",),
                     epoch_start=2, epoch_end=2, observe_start=False, observe_end=False),
    rec.ControlWrite(step=0, concurrency=2, phase="count", t=1.0, variant="fixed", observe=True, epoch=1),
    rec.ControlConfirm(step=0, concurrency=2, epoch=1, t=2.0, waited_s=1.0, shown=True),
    rec.TelemetrySample(t=1.0, source="process", cpu_pct=150.0, rss_mib=6000.0),
    rec.BlockRecord(block_id="000-r0-ab-A", round=0, kind="ab", arm="A", variant="fixed", levels=[2, 1],
                    status="complete", reason=None, timing={"ready_s": 80.0}, requests={"n": 3}),
    rec.StartRecord(start=0, arm="A", status="stopped", windows=["000-r0-ab-A"], evidence={"ok": True, "reason": None},
                    switches=[{"t": 1.0, "variant": "fixed", "epoch": 1, "confirmed_t": 1.5}]),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_every_record_type_reads_back_from_the_dict_it_writes(record):
    d = json.loads(json.dumps(record.to_dict()))  # through JSON, as on disk
    counter = d.get("schema") == rec.COUNTERS_SCHEMA
    back = rec.counter_line_from_dict(d) if counter else type(record).from_dict(d)
    assert back == record and back.to_dict() == record.to_dict()


def test_a_record_missing_a_required_field_or_of_an_unknown_kind_is_one_error():
    d = SAMPLES[0].to_dict()
    del d["e2e_s"]
    with pytest.raises(ValueError, match=r"request record lacks fields \['e2e_s'\]"):
        rec.RequestRecord.from_dict(d)
    with pytest.raises(ValueError, match="unknown kind 'gauge'"):
        rec.counter_line_from_dict({"schema": rec.COUNTERS_SCHEMA, "kind": "gauge"})
    with pytest.raises(ValueError, match="start.json: not a JSON object"):
        rec.StartRecord.from_dict([1])


def test_the_committed_runs_are_there():
    assert len(COMMITTED) >= 9 and ROOT / "reports" / "example" in COMMITTED


def _as_written(typed: dict, raw: dict) -> bool:
    """The typed record says what the line said: every field the line holds, with its value (the schema of a
    version-1 line reads as the current one); fields a line of an older writer lacks read as their defaults."""
    return all(typed.get(k) == v for k, v in raw.items() if k != "schema")


@pytest.mark.parametrize("run", COMMITTED, ids=lambda p: p.relative_to(ROOT / "reports").as_posix())
def test_every_committed_run_reads_typed_line_for_line(run):
    typed, raw = rf.load_run(run), dict_reader.load_run(run)
    assert typed.manifest is not None and typed.manifest.run_id == raw["manifest"]["run_id"]
    assert sorted(typed.starts) == sorted(raw["starts"])
    assert all(_as_written(s.to_dict(), raw["starts"][n]) for n, s in typed.starts.items())
    assert [w.meta.block_id for w in typed.windows] == [b["meta"]["block_id"] for b in raw["blocks"]]
    for w, b in zip(typed.windows, raw["blocks"], strict=True):
        assert _as_written(w.meta.to_dict(), b["meta"])
        for kind in ("requests", "counters", "telemetry"):
            lines = getattr(w, kind)
            assert len(lines) == len(b[kind]) and all(
                _as_written(x.to_dict(), y) for x, y in zip(lines, b[kind], strict=True)), (w.meta.block_id, kind)
    assert sum(len(w.requests) for w in typed.windows) > 0 and any(w.deltas() for w in typed.windows)


def test_a_folder_that_is_not_an_ab_run_is_one_error(tmp_path: Path):
    with pytest.raises(ValueError, match="not a folder"):
        rf.load_run(tmp_path / "absent")
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": rec.RUN_SCHEMA}))
    with pytest.raises(ValueError, match="not an A/B run manifest"):
        rf.load_run(tmp_path)
    bdir = tmp_path / "x" / "blocks" / "000-r0-ab-A"
    bdir.mkdir(parents=True)
    (bdir / "block.json").write_text(json.dumps({"schema": rec.BLOCK_SCHEMA, "round": 0}))
    with pytest.raises(ValueError, match=r"block.json: block.json lacks fields \['block_id', 'kind', 'arm', 'variant'\]"):
        rf.load_run(tmp_path / "x")

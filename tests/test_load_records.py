"""The record contract: schema on every line, unrounded floats, flushed per line, one tolerant reader that refuses
unknown schemas, the documented field order, and the rules that judge a block."""

from __future__ import annotations

import dataclasses
import json

import pytest
from conftest import ROOT

from ttsrecords.outcomes import block_validity, manipulation_check
from ttsrecords.records import (
    BLOCK_SCHEMA,
    COUNTERS_SCHEMA,
    REQUEST_FIELDS,
    REQUEST_SCHEMA,
    TELEMETRY_SCHEMA,
    BlockRecord,
    ControlConfirm,
    ControlWrite,
    CounterDelta,
    CounterSnapshot,
    JsonlWriter,
    RequestRecord,
    TelemetrySample,
    dumps,
    parse_request,
    read_jsonl,
    read_requests,
)

DOC_FIELDS = ("schema, run_id, worker, step, concurrency, phase, mode, ok, error, status, ttfa_s, e2e_s, audio_s, rtf, "
              "bytes, t_start, prompt_id, bucket, variant, seq, underrun_s, continuity_ok, stream_rtf, chunks")


def rec(**kw):
    base = dict(run_id="r", worker="w0", step=1, concurrency=16, phase="measure", mode="stream", ok=True, error=None,
                status=200, ttfa_s=0.123456789012345, e2e_s=1.000000000001, audio_s=2.5, rtf=0.4, bytes=120000,
                t_start=1796051742.1250868, prompt_id="s01", bucket="short", variant=None)
    base.update(kw)
    return RequestRecord(**base)


def test_schema_ids_are_the_documented_ones():
    from ttsrecords import records

    assert (records.REQUEST_SCHEMA, records.COUNTERS_SCHEMA, records.RUN_SCHEMA, records.AB_SCHEMA,
            records.BLOCK_SCHEMA, records.START_SCHEMA, records.TELEMETRY_SCHEMA, records.LOOK_SCHEMA,
            records.SUMMARY_SCHEMA, records.COMPARISON_SCHEMA, records.MICRO_SCHEMA) == (
        "tts-request/2", "tts-counters/2", "tts-run/2", "tts-ab/2", "tts-block/2", "tts-start/1", "tts-telemetry/1",
        "tts-look/1", "tts-summary/2", "tts-comparison/2", "tts-micro/1")
    assert records.LEGACY[records.REQUEST_SCHEMA] == ("tts-request/1",)  # version-1 runs still load


def test_fields_are_the_documented_contract():
    assert set(REQUEST_FIELDS) == {f.strip() for f in DOC_FIELDS.split(",")}
    assert list(json.loads(dumps(rec().to_dict())))[0] == "schema"


def test_written_per_line_and_unrounded(tmp_path):
    p = tmp_path / "requests.jsonl"
    w = JsonlWriter(p)
    w.write(rec().to_dict())
    assert p.read_text().count("\n") == 1  # visible before close: flushed per line
    w.write(rec(ok=False, error="http 500", rtf=None).to_dict())
    w.close()
    got = read_requests(p)
    assert got[0] == rec() and got[0].ttfa_s == 0.123456789012345 and got[0].t_start == 1796051742.1250868
    assert got[1].error == "http 500"
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec().ok = False  # frozen


def test_unknown_schema_refused():
    obj = rec().to_dict()
    obj["schema"] = "tts-request/9"
    with pytest.raises(ValueError, match="unknown request record schema"):
        parse_request(json.dumps(obj))
    del obj["schema"]
    with pytest.raises(ValueError):
        parse_request(json.dumps(obj))


def test_one_reader_skips_a_truncated_last_line_with_a_note(tmp_path):
    p = tmp_path / "requests.jsonl"
    p.write_text(dumps(rec().to_dict()) + "\n\n" + dumps(rec(seq=1).to_dict()) + "\n" + '{"schema": "tts-req')
    rows, notes = read_jsonl(p, REQUEST_SCHEMA)
    assert [r["seq"] for r in rows] == [None, 1] and notes == [f"{p}: truncated last line skipped"]
    with pytest.warns(UserWarning, match="truncated last line"):
        assert read_requests(p) == [rec(), rec(seq=1)]
    assert read_jsonl(tmp_path / "absent.jsonl") == ([], [])


def test_one_reader_refuses_a_broken_middle_line_and_an_unknown_schema(tmp_path):
    p = tmp_path / "requests.jsonl"
    p.write_text('{"broken\n' + dumps(rec().to_dict()) + "\n")
    with pytest.raises(ValueError, match=r"requests.jsonl:1: not JSON"):
        read_jsonl(p)
    p.write_text(dumps(rec().to_dict()) + "\n" + dumps({**rec().to_dict(), "schema": "tts-request/9"}) + "\n")
    with pytest.raises(ValueError, match=r":2: unknown schema 'tts-request/9'"):
        read_jsonl(p, REQUEST_SCHEMA)
    assert len(read_jsonl(p)[0]) == 2  # without a schema to check, every line is a row


def test_counter_and_block_records_keep_the_documented_field_order():
    snap = CounterSnapshot(step=0, concurrency=8, edge="start", t=1.5, target="u", ok=True, error=None,
                           samples={"a": 1.0})
    assert list(snap.to_dict()) == ["schema", "kind", "step", "concurrency", "edge", "t", "target", "ok", "error",
                                    "samples"]
    assert snap.to_dict()["schema"] == COUNTERS_SCHEMA and snap.to_dict()["kind"] == "snapshot"
    names = [f.name for f in dataclasses.fields(CounterDelta)]
    delta = CounterDelta(**dict.fromkeys(names, None)).to_dict()
    assert list(delta)[:5] == ["schema", "kind", "step", "concurrency", "target"] and delta["kind"] == "delta"
    assert list(delta)[5:] == ["duration_s", "variant", "calls", "seconds", "syncs", "observed_calls",
                               "observed_tokens", "tokens", "batch_requests", "steps", "step_seconds", "frames",
                               "requests_finished", "syncs_per_call", "syncs_per_step", "calls_per_request",
                               "seconds_per_request", "mean_batch", "window", "variants_moved", "epoch_start",
                               "epoch_end", "observe_start", "observe_end", "step_interval_count",
                               "step_interval_sum", "step_batch_count", "step_batch_sum"]
    assert delta["variants_moved"] == []
    block = BlockRecord(block_id="000-s000-r0-aa-A", round=0, kind="aa", arm="A", variant="original")
    assert list(block.to_dict()) == ["schema", "block_id", "round", "kind", "arm", "variant", "start", "position",
                                     "levels", "epoch", "attempt", "status", "reason", "started", "ended",
                                     "server_url", "failed_before", "code_fingerprint", "timing"]
    assert block.to_dict()["status"] == "interrupted"  # written before the block starts: a killed runner says so
    block.requests = {"measure": 1}
    assert block.to_dict()["requests"] == {"measure": 1} and block.to_dict()["schema"] == BLOCK_SCHEMA


def test_block_validity_stored_status_first_then_the_check_then_data():
    good = {"ok": True, "reason": None}
    bad = {"ok": False, "reason": "syncs 0 != expected 75"}
    assert block_validity({"status": "complete"}, good, measured=True) is None
    assert block_validity({"status": "invalid", "reason": "3 of 9 failed"}, good, True) == "status invalid: 3 of 9 failed"
    assert block_validity({"status": "complete"}, bad, True) == "manipulation check failed: syncs 0 != expected 75"
    assert block_validity({"status": "complete"}, good, measured=False) == "no measured requests"


def test_manipulation_check_needs_the_variants_signature():
    def delta(variant, syncs, calls=2, tokens=32):
        return {"kind": "delta", "syncs": syncs, "observed_calls": calls, "observed_tokens": tokens,
                "variant": variant}

    assert manipulation_check("original", [delta("original", 32 + 4 * 2)])["ok"]  # T+4 per call
    assert not manipulation_check("fixed", [])["ok"]
    wrong = manipulation_check("original", [delta("original", 5 * 2)])  # the fixed signature
    assert not wrong["ok"] and "expected 40" in wrong["reason"]
    other = manipulation_check("fixed", [delta("vectorized", 0)])
    assert not other["ok"] and "server reports variant ['vectorized']" in other["reason"]


def test_version_1_lines_still_read():
    """A run written before version 2 loads: its request lines lack the continuity fields, which read as None."""
    v1 = {k: v for k, v in rec().to_dict().items() if k not in ("underrun_s", "continuity_ok", "stream_rtf", "chunks")}
    v1["schema"] = "tts-request/1"
    got = parse_request(json.dumps(v1))
    assert got.underrun_s is None and got.continuity_ok is None and got.ttfa_s == rec().ttfa_s
    assert got.to_dict()["schema"] == REQUEST_SCHEMA  # re-written, it is a version-2 line
    del v1["e2e_s"]
    with pytest.raises(ValueError, match="lacks fields"):
        parse_request(json.dumps(v1))


def test_failed_requests_are_data_not_an_invalid_block():
    from ttsrecords.outcomes import request_outcomes, request_verdict

    rows = [{"phase": "measure", "ok": True}, {"phase": "measure", "ok": False, "error": "http 503: busy"},
            {"phase": "warmup", "ok": False, "error": "http 500"}]
    assert request_verdict(request_outcomes(rows)) is None  # one of two failed: usable, the error rate says it
    allbad = [r for r in rows if not r["ok"]]
    assert request_verdict(request_outcomes(allbad)) == "all 1 measure-phase requests failed: http 503 (1)"
    assert request_verdict(request_outcomes(rows[2:])).startswith("no measure-phase request was recorded")


def _d(window, variant, syncs, calls, tokens, moved=None):
    return {"kind": "delta", "window": window, "syncs": syncs, "observed_calls": calls, "observed_tokens": tokens,
            "variant": variant, "variants_moved": moved if moved is not None else [variant]}


def test_manipulation_check_uses_count_windows_and_needs_observer_free_timing():
    count = _d("count", "fixed", 5 * 10, 10, 160)
    quiet = _d("measure", "fixed", 0, 0, 0)
    ok = manipulation_check("fixed", [count, quiet])
    assert ok["ok"] and ok["source"] == "count" and not ok["observer_in_timing"] and ok["timing_observed_calls"] == 0
    noisy = manipulation_check("fixed", [count, _d("measure", "fixed", 15, 3, 48)])
    assert not noisy["ok"] and "inside the timing windows (3 observed calls)" in noisy["reason"]
    v1_line = {k: v for k, v in _d("measure", "fixed", 15, 3, 48).items() if k not in ("window", "variants_moved")}
    legacy = manipulation_check("fixed", [v1_line])  # a version-1 run: no count phases, the sample is in timing
    assert legacy["ok"] and legacy["observer_in_timing"] and legacy["source"] == "measure"


def test_manipulation_check_refuses_a_window_that_mixed_variants_and_skips_arms_without_the_plugin():
    mixed = _d("count", "fixed", 50, 10, 160, moved=["fixed", "original"])
    res = manipulation_check("fixed", [mixed])
    assert not res["ok"] and "several variants" in res["reason"]
    none = manipulation_check(None, [])
    assert none["ok"] and not none["applicable"]


COUNTER_KINDS = {"snapshot": CounterSnapshot, "delta": CounterDelta, "control": ControlWrite,
                 "confirm": ControlConfirm}


def _asdict_form(record) -> dict:
    """The line as to_dict built it with dataclasses.asdict (deep copies), the reference for the shallow to_dict."""
    d = dataclasses.asdict(record)
    if isinstance(record, RequestRecord):
        return {"schema": d.pop("schema"), **d}
    if isinstance(record, TelemetrySample):  # other_cpu_pct is written only where it was measured
        return {"schema": TELEMETRY_SCHEMA, **{k: v for k, v in d.items() if k != "other_cpu_pct" or v is not None}}
    kind = next(k for k, cls in COUNTER_KINDS.items() if isinstance(record, cls))
    if kind == "delta":
        d["variants_moved"] = list(d["variants_moved"] or ())
    return {"schema": COUNTERS_SCHEMA, "kind": kind, **d}


def _record_of(name: str, row: dict):
    if name == "requests.jsonl":
        return parse_request(json.dumps(row))
    cls = TelemetrySample if name == "telemetry.jsonl" else COUNTER_KINDS[row["kind"]]
    known = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in row.items() if k in known}
    if "variants_moved" in kw:
        kw["variants_moved"] = tuple(kw["variants_moved"])
    return cls(**kw)


@pytest.mark.parametrize("run", ["reports/example", "tests/fixtures/v1-run"])
def test_committed_record_lines_round_trip_through_the_writer_byte_for_byte(run):
    """Every request, counter and telemetry line of the committed runs, read and written again: the same bytes as
    the stored line (version 2); the first lines of every file (each kind of line) the same bytes as the
    deep-copying asdict writer (both versions); a record never shares a mutable value with the dict it writes."""
    lines = 0
    for path in sorted((ROOT / run / "blocks").glob("*/*.jsonl")):
        rows, notes = read_jsonl(path)
        assert not notes
        for i, (raw, row) in enumerate(zip(path.read_text(encoding="utf-8").splitlines(), rows, strict=True)):
            current = row["schema"] in (REQUEST_SCHEMA, COUNTERS_SCHEMA, TELEMETRY_SCHEMA)
            if i >= 20 and not current:
                break
            record = _record_of(path.name, row)
            line = dumps(record.to_dict())
            if i < 20:
                assert line == dumps(_asdict_form(record)), path
            if current:
                assert line == raw, path
            lines += 1
            if isinstance(record, CounterSnapshot):
                record.to_dict()["samples"]["x"] = 1.0
                assert "x" not in record.samples
    assert lines > 100


def test_a_confirm_line_round_trips_through_its_type():
    c = ControlConfirm(step=1, concurrency=2, epoch=7, t=1796408803.2, waited_s=12.5, shown=True)
    row = json.loads(dumps(c.to_dict()))
    assert row["kind"] == "confirm" and row["schema"] == COUNTERS_SCHEMA
    assert _record_of("counters.jsonl", row) == c and dumps(_asdict_form(c)) == dumps(c.to_dict())

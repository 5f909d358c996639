"""Records: schema on every line, unrounded floats, flushed per line, unknown schemas refused."""

from __future__ import annotations

import dataclasses
import json

import pytest

from loadtest.records import REQUEST_FIELDS, JsonlWriter, RequestRecord, dumps, parse_request, read_requests

DOC_FIELDS = ("schema, run_id, worker, step, concurrency, phase, mode, ok, error, status, ttfa_s, e2e_s, audio_s, rtf, "
              "bytes, t_start, prompt_id, bucket, variant, seq")


def rec(**kw):
    base = dict(run_id="r", worker="w0", step=1, concurrency=16, phase="measure", mode="stream", ok=True, error=None,
                status=200, ttfa_s=0.123456789012345, e2e_s=1.000000000001, audio_s=2.5, rtf=0.4, bytes=120000,
                t_start=1796051742.1250868, prompt_id="s01", bucket="short", variant=None)
    base.update(kw)
    return RequestRecord(**base)


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
    obj["schema"] = "tts-request/2"
    with pytest.raises(ValueError, match="unknown request record schema"):
        parse_request(json.dumps(obj))
    del obj["schema"]
    with pytest.raises(ValueError):
        parse_request(json.dumps(obj))

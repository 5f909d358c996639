"""The request client against a fake stream and a scripted clock: timings, audio checks, failure reasons."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile as sf

from loadtest.client import run_request


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class FakeResponse:
    def __init__(self, clock, status, chunks, headers=None, break_after=None):
        self.clock, self.status, self._chunks = clock, status, chunks
        self.headers = headers or {"content-type": "audio/pcm"}
        self.break_after = break_after
        self.closed = False

    def chunks(self):
        for i, (delay, data) in enumerate(self._chunks):
            if self.break_after is not None and i == self.break_after:
                raise ConnectionError("peer reset")
            self.clock.now += delay
            yield data

    def close(self):
        self.closed = True


class FakeTransport:
    def __init__(self, clock, response=None, header_delay=0.0, error=None):
        self.clock, self.response, self.header_delay, self.error = clock, response, header_delay, error
        self.calls = []

    def post(self, path, body, headers):
        self.calls.append((path, body, headers))
        self.clock.now += self.header_delay
        if self.error:
            raise self.error
        return self.response


def pcm(seconds, value=1000):
    return np.full(int(seconds * 24000), value, dtype="<i2").tobytes()


def wav(seconds, rate=24000, channels=1, value=1000):
    buf = io.BytesIO()
    sf.write(buf, np.full((int(seconds * rate), channels), value, dtype=np.int16), rate, format="WAV",
             subtype="PCM_16")
    return buf.getvalue()


def test_stream_ttfa_is_first_non_empty_chunk_and_e2e_the_last_byte():
    clk = Clock()
    # headers after 0.1 s, an empty chunk at +0.2, first audio at +0.3, the rest over 1.5 s more
    resp = FakeResponse(clk, 200, [(0.2, b""), (0.3, pcm(1.0)), (0.5, pcm(1.0)), (1.0, pcm(0.5))])
    t = FakeTransport(clk, resp, header_delay=0.1)
    out = run_request(t, b"{}", "stream", clock=clk)
    assert out.ok and out.error is None and out.status == 200
    assert out.ttfa_s == pytest.approx(0.6)  # 0.1 headers + 0.2 empty + 0.3: headers alone are not audio
    assert out.e2e_s == pytest.approx(2.1)  # clock stops at the last byte, not at the headers
    assert out.audio_s == pytest.approx(2.5)
    assert out.bytes == int(2.5 * 24000) * 2
    assert out.rtf == pytest.approx(2.1 / 2.5)
    assert resp.closed
    assert t.calls[0][0] == "/v1/audio/speech"


def test_wav_mode_decodes_frames():
    clk = Clock()
    body = wav(1.5)
    resp = FakeResponse(clk, 200, [(0.4, body[:1000]), (0.1, body[1000:])], {"content-type": "audio/wav"})
    out = run_request(FakeTransport(clk, resp), b"{}", "wav", clock=clk)
    assert out.ok, out.error
    assert out.audio_s == pytest.approx(1.5)
    assert out.e2e_s == pytest.approx(0.5)
    assert out.bytes == len(body)


@pytest.mark.parametrize(
    ("mode", "chunks", "reason"),
    [
        ("stream", [(0.1, b"\x01\x02\x03")], "odd PCM byte count 3"),
        ("stream", [(0.1, pcm(1.0, value=0))], "silent audio"),
        ("stream", [], "empty body"),
        ("wav", [(0.1, wav(1.0, rate=16000))], "sample rate 16000"),
        ("wav", [(0.1, wav(1.0, channels=2))], "2 channels"),
        ("wav", [(0.1, wav(1.0, value=0))], "silent audio"),
        ("wav", [(0.1, b"RIFFnonsense" * 10)], "wav does not decode"),
    ],
)
def test_audio_checks_fail_with_reason(mode, chunks, reason):
    clk = Clock()
    out = run_request(FakeTransport(clk, FakeResponse(clk, 200, chunks)), b"{}", mode, clock=clk)
    assert not out.ok
    assert reason in out.error
    assert out.rtf is None


def test_duration_outside_the_expected_range_fails():
    clk = Clock()
    resp = FakeResponse(clk, 200, [(0.1, pcm(0.5))])
    out = run_request(FakeTransport(clk, resp), b"{}", "stream", expected_s=(2.0, 10.0), clock=clk)
    assert not out.ok and "outside [2.00, 10.00]" in out.error
    assert out.audio_s == pytest.approx(0.5)


def test_http_error_status_and_body_in_reason():
    clk = Clock()
    resp = FakeResponse(clk, 503, [(0.05, b'{"error": "overloaded"}')], {"content-type": "application/json"})
    out = run_request(FakeTransport(clk, resp, header_delay=0.2), b"{}", "stream", clock=clk)
    assert not out.ok and out.status == 503
    assert out.error.startswith("http 503") and "overloaded" in out.error
    assert out.e2e_s == pytest.approx(0.25)


def test_connect_error_is_a_record_not_an_exception():
    clk = Clock()
    out = run_request(FakeTransport(clk, error=ConnectionRefusedError(111, "refused"), header_delay=0.01), b"{}",
                      "stream", clock=clk)
    assert not out.ok and out.status is None and out.error.startswith("connect: ConnectionRefusedError")
    assert out.e2e_s == pytest.approx(0.01)


def test_stream_broken_midway_keeps_ttfa_and_bytes():
    clk = Clock()
    resp = FakeResponse(clk, 200, [(0.3, pcm(1.0)), (0.3, pcm(1.0))], break_after=1)
    out = run_request(FakeTransport(clk, resp), b"{}", "stream", clock=clk)
    assert not out.ok and "stream broken after 48000 bytes" in out.error and "peer reset" in out.error
    assert out.ttfa_s == pytest.approx(0.3) and out.bytes == 48000 and resp.closed


def test_json_body_with_200_is_not_audio():
    clk = Clock()
    resp = FakeResponse(clk, 200, [(0.1, b'{"x": 12}')], {"content-type": "application/json"})
    out = run_request(FakeTransport(clk, resp), b"{}", "stream", clock=clk)
    assert not out.ok and "content-type" in out.error


def test_a_bug_in_the_transport_object_never_escapes():
    class Weird:
        status = 200
        headers = None  # .get on None raises AttributeError inside the client

        def chunks(self):
            yield b"x"

        def close(self):
            raise RuntimeError("close failed too")

    clk = Clock()
    out = run_request(FakeTransport(clk, Weird()), b"{}", "stream", clock=clk)
    assert not out.ok and out.error.startswith("client error: AttributeError")

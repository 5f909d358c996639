"""The request client against a fake stream and a scripted clock: timings, audio checks, failure reasons."""

from __future__ import annotations

import io
import socket
import threading
import time

import numpy as np
import pytest
import soundfile as sf

from loadtest.client import GeventTransport, run_request


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


def test_a_stream_that_trickles_past_the_request_timeout_fails():
    clk = Clock()
    # every chunk comes within the transport's per-read timeout, but the whole stream takes 3.5 s against 2 s
    chunks = [(0.5, pcm(0.5))] * 7
    out = run_request(FakeTransport(clk, FakeResponse(clk, 200, chunks)), b"{}", "stream", clock=clk, deadline_s=2.0)
    assert not out.ok and out.error.startswith("request timeout: still streaming after 2 s"), out.error
    assert out.e2e_s == pytest.approx(2.5) and out.ttfa_s == pytest.approx(0.5)  # stopped at the first chunk past it
    clk2 = Clock()
    ok = run_request(FakeTransport(clk2, FakeResponse(clk2, 200, chunks)), b"{}", "stream", clock=clk2, deadline_s=4.0)
    assert ok.ok and ok.e2e_s == pytest.approx(3.5)


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


# --- streaming continuity: a player that starts at the first chunk (vllm-omni's definition; client.Playback) ------


def stream(clk, *arrivals, header_delay=0.1):
    """Run a streamed request whose chunks arrive after the given delays: [(delay_s, pcm bytes), ...]."""
    resp = FakeResponse(clk, 200, list(arrivals))
    return run_request(FakeTransport(clk, resp, header_delay=header_delay), b"{}", "stream", clock=clk)


def test_no_stall_means_zero_underrun_and_continuity_ok():
    clk = Clock()
    # 1 s of audio first, then 1 s more every 0.5 s: the buffer never runs dry
    out = stream(clk, (0.2, pcm(1.0)), (0.5, pcm(1.0)), (0.5, pcm(1.0)), (0.5, pcm(0.5)))
    assert out.ok, out.error
    assert out.underrun_s == 0.0 and out.continuity_ok is True
    assert out.chunks == 4
    assert out.ttfa_s == pytest.approx(0.3) and out.e2e_s == pytest.approx(1.8)
    assert out.stream_rtf == pytest.approx((1.8 - 0.3) / 3.5)


def test_one_long_stall_is_measured_exactly():
    clk = Clock()
    # 0.5 s of audio at the start, the next chunk 0.8 s later: the player starves for 0.3 s; then it never starves
    out = stream(clk, (0.2, pcm(0.5)), (0.8, pcm(2.0)), (1.0, pcm(2.0)))
    assert out.ok, out.error
    assert out.underrun_s == pytest.approx(0.3, abs=1e-9)
    assert out.continuity_ok is False
    assert out.chunks == 3


def test_a_stall_just_under_the_threshold_is_continuous():
    clk = Clock()
    out = stream(clk, (0.2, pcm(0.5)), (0.59, pcm(1.0)))
    assert out.underrun_s == pytest.approx(0.09, abs=1e-9) and out.continuity_ok is True


@pytest.mark.parametrize(("stalls", "ok"), [(2, True), (5, False)])
def test_short_stalls_add_up(stalls, ok):
    # 0.2 s of audio per chunk, one every 0.24 s: each stall is 40 ms (well under 100 ms), but a player that pauses
    # and resumes has stalled 40 ms per chunk in all, so five of them break continuity (vllm-omni: worst deficit).
    clk = Clock()
    out = stream(clk, (0.2, pcm(0.2)), *[(0.24, pcm(0.2))] * stalls)
    assert out.ok, out.error
    assert out.underrun_s == pytest.approx(0.04 * stalls, abs=1e-9)
    assert out.continuity_ok is ok


def test_a_stall_after_a_large_buffer_is_not_counted_and_an_early_one_stays():
    clk = Clock()
    # starve 0.1 s at the second chunk, then a 5 s buffer: later gaps of 1 s are covered; the underrun stays 0.1
    out = stream(clk, (0.2, pcm(0.4)), (0.5, pcm(5.0)), (1.0, pcm(0.5)), (1.0, pcm(0.5)))
    assert out.underrun_s == pytest.approx(0.1, abs=1e-9)


def test_chunk_boundaries_off_sample_boundaries_count_whole_samples():
    clk = Clock()
    audio = pcm(1.5)
    # 24001 bytes = 12000.5 samples: the player has 12000 whole samples (0.5 s) when the next chunk comes 0.7 s later
    first, rest = audio[:24001], audio[24001:]
    out = stream(clk, (0.2, first), (0.7, rest[:3]), (0.0, rest[3:]))
    assert out.ok, out.error
    assert out.audio_s == pytest.approx(1.5)
    # whole samples: 0.7 - 0.5 = 0.2 exactly (half a sample would make it 0.2 - 1/48000)
    assert out.underrun_s == pytest.approx(0.2, abs=1e-12)
    assert out.chunks == 3


def test_wav_requests_have_no_continuity_fields():
    clk = Clock()
    body = wav(1.0)
    resp = FakeResponse(clk, 200, [(0.4, body[:500]), (2.0, body[500:])], {"content-type": "audio/wav"})
    out = run_request(FakeTransport(clk, resp), b"{}", "wav", clock=clk)
    assert out.ok, out.error
    assert (out.underrun_s, out.continuity_ok, out.stream_rtf, out.chunks) == (None, None, None, None)


@pytest.mark.parametrize("case", ["broken", "silent", "too short"])
def test_failed_streams_have_no_continuity_fields(case):
    clk = Clock()
    if case == "broken":
        resp = FakeResponse(clk, 200, [(0.3, pcm(1.0)), (2.0, pcm(1.0))], break_after=1)
    elif case == "silent":
        resp = FakeResponse(clk, 200, [(0.3, pcm(1.0, value=0)), (2.0, pcm(1.0, value=0))])
    else:
        resp = FakeResponse(clk, 200, [(0.3, pcm(0.2)), (2.0, pcm(0.2))])
    out = run_request(FakeTransport(clk, resp), b"{}", "stream", expected_s=(1.0, 9.0), clock=clk)
    assert not out.ok
    assert (out.underrun_s, out.continuity_ok, out.stream_rtf, out.chunks) == (None, None, None, None)


def test_the_outcome_has_the_record_fields_so_the_session_can_build_a_record():
    from dataclasses import asdict

    from ttsrecords.records import RequestRecord

    clk = Clock()
    out = stream(clk, (0.2, pcm(0.5)), (0.8, pcm(1.0)))
    rec = RequestRecord(run_id="r", worker="0", step=0, concurrency=1, phase="measure", mode="stream", t_start=0.0,
                        prompt_id="p", bucket="short", variant="fixed", seq=0, **asdict(out))
    assert rec.underrun_s == pytest.approx(0.3) and rec.continuity_ok is False and rec.chunks == 2


def test_playback_keeps_constant_state_per_chunk():
    from loadtest.client import Playback

    p = Playback()
    for i in range(10_000):
        p.arrive(i * 0.001, 2)
    assert not hasattr(p, "__dict__")  # slots only: no per-chunk list can grow
    assert p.chunks == 10_000 and p.received == 20_000
    # 1 sample per ms against 24 samples per ms of playback: the deficit at the last chunk is 9.999 s - 9999 samples
    assert p.underrun_s == pytest.approx(9.999 - 9999 / 24000)


# --- a 200 answer with an error body (vllm-omni 0.16.0's ErrorResponse) ------------------------------------------


def vllm_error(message, code=400, err_type="BadRequestError"):
    import json

    return json.dumps({"error": {"message": message, "type": err_type, "param": None, "code": code}}).encode()


@pytest.mark.parametrize("mode", ["stream", "wav"])
def test_http_200_with_an_error_body_quotes_the_server_verbatim(mode):
    clk = Clock()
    msg = "Unsupported speaker: Vivian. Supported speakers: aiden, dylan"
    body = vllm_error(msg)
    resp = FakeResponse(clk, 200, [(0.1, body[:20]), (0.1, body[20:])], {"content-type": "application/json"})
    out = run_request(FakeTransport(clk, resp, header_delay=0.3), b"{}", mode, clock=clk)
    assert not out.ok and out.status == 200
    assert out.error == f"http 200 error body (code 400): {msg}"
    assert out.e2e_s == pytest.approx(0.5) and resp.closed
    assert out.underrun_s is None and out.chunks is None


def test_a_long_error_message_is_bounded_and_kept_on_one_line():
    clk = Clock()
    msg = "Speech generation failed: " + "x" * 2000 + "\nTraceback line"
    resp = FakeResponse(clk, 200, [(0.1, vllm_error(msg, 500, "InternalServerError"))],
                        {"content-type": "application/json"})
    out = run_request(FakeTransport(clk, resp), b"{}", "stream", clock=clk)
    head = "http 200 error body (code 500): "
    assert out.error.startswith(head + "Speech generation failed: xxx")
    assert len(out.error) == len(head) + 300 and out.error.endswith("...") and "\n" not in out.error


def test_a_200_text_body_is_quoted_under_its_content_type():
    clk = Clock()
    resp = FakeResponse(clk, 200, [(0.1, b"Internal\nServer Error")], {"content-type": "text/plain; charset=utf-8"})
    out = run_request(FakeTransport(clk, resp), b"{}", "stream", clock=clk)
    assert out.error == "unexpected content-type 'text/plain; charset=utf-8': Internal Server Error"


# --- the httpx transport (preflight and tools), on httpx's own mock transport: no socket ---------------------------


def test_httpx_transport_streams_the_body_and_maps_connect_errors():
    import httpx

    from loadtest.client import HttpxTransport

    seen = {}

    def handler(request):
        seen["path"], seen["body"] = request.url.path, request.content
        return httpx.Response(200, headers={"Content-Type": "audio/pcm"}, content=iter([pcm(0.5), pcm(0.5)]))

    t = HttpxTransport("http://127.0.0.1:9/api", httpx_transport=httpx.MockTransport(handler))
    out = run_request(t, b'{"x": 1}', "stream")
    assert out.ok, out.error
    assert seen == {"path": "/api/v1/audio/speech", "body": b'{"x": 1}'}
    assert out.audio_s == pytest.approx(1.0) and out.chunks == 2

    def refuse(request):
        raise httpx.ConnectError("connection refused")

    out = run_request(HttpxTransport("http://127.0.0.1:9", httpx_transport=httpx.MockTransport(refuse)), b"{}",
                      "wav")
    assert not out.ok and out.error.startswith("connect: ConnectionError: connection refused")


def _chunked_server(chunks: list[bytes], gap_s: float, cut: bool = False) -> tuple[socket.socket, int]:
    """One HTTP/1.1 answer in chunked encoding over a real socket: the chunks `gap_s` apart, as a streaming server;
    `cut`: the connection closes after the chunks without the final zero-length chunk (a server that died)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def answer():
        conn, _ = srv.accept()
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: audio/pcm\r\ntransfer-encoding: chunked\r\n\r\n")
        for i, c in enumerate(chunks):
            if i:
                time.sleep(gap_s)
            conn.sendall(b"%x\r\n" % len(c) + c + b"\r\n")
        if not cut:
            conn.sendall(b"0\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_the_gevent_transport_hands_over_each_chunk_when_it_arrives():
    """Against a real socket: 1 s of audio every 0.4 s never starves a player, and every byte of a server chunk is
    credited when that chunk arrives. (geventhttpclient's read(64 KiB) waited for 64 KiB: the second chunk's arrival
    credited 1 byte, a 0.4 s 'stall' that was never there.)"""
    srv, port = _chunked_server([pcm(1.0)] * 3, 0.4)
    t = GeventTransport(f"http://127.0.0.1:{port}", timeout_s=30)
    try:
        out = run_request(t, b"{}", "stream")
    finally:
        t.close()
        srv.close()
    assert out.ok, out.error
    assert out.audio_s == pytest.approx(3.0) and out.bytes == 3 * len(pcm(1.0))
    assert out.underrun_s < 0.1 and out.continuity_ok is True, out.underrun_s
    assert out.e2e_s - out.ttfa_s >= 0.75  # the gaps were real: the audio came in over 0.8 s


def test_the_gevent_transport_reports_a_stream_the_server_cut_as_broken():
    """The connection closes before the end of the chunked body: a failure record, never a short 'ok' stream."""
    srv, port = _chunked_server([pcm(1.0)] * 2, 0.1, cut=True)
    t = GeventTransport(f"http://127.0.0.1:{port}", timeout_s=30)
    try:
        out = run_request(t, b"{}", "stream")
    finally:
        t.close()
        srv.close()
    assert not out.ok and out.error.startswith("stream broken after"), out

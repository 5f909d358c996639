"""Fault injection options of the simulator, each against a real server process.

These tests show that each fault happens as configured and is visible to a client; how the load generator and the
A/B runner survive them is tested with those components.
"""

from __future__ import annotations

import io
import re
import time

import httpx
import pytest
import soundfile as sf

from loadtest.scraper import samples
from tools.sim_server import SimServer
from tts_predictor.domain import SAMPLES_PER_CODEC_FRAME

pytestmark = pytest.mark.slow  # each fault against a simulator process

STREAM = {"input": "x" * 80, "stream": True, "response_format": "pcm"}  # 64 frames: 3 chunks


def read_stream(url, body=STREAM, timeout=20):
    """(chunks received, bytes, error or None) of one streaming request."""
    chunks, total = 0, 0
    try:
        with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                return 0, 0, f"HTTP {r.status_code}"
            for chunk in r.iter_raw():
                chunks += 1
                total += len(chunk)
    except httpx.HTTPError as e:
        return chunks, total, type(e).__name__
    return chunks, total, None


def test_killed_mid_step():
    with SimServer("original", overrides=["faults.kill_after_steps=30"]) as s:
        chunks, total, error = read_stream(s.url)
        assert error is not None and total < 64 * 4000  # the stream broke off
        assert s.proc.wait(10) == -9  # SIGKILL, no cleanup
        assert re.search(r"FAULT: SIGKILL in the middle of step 30 \(after call 8 of 15\)", s.log())
        with pytest.raises(httpx.ConnectError):
            httpx.get(s.url + "/health", timeout=2)


def test_hung_server_accepts_and_never_answers():
    with SimServer("fixed", overrides=["faults.hang_after_requests=1"]) as s:
        assert httpx.post(s.url + "/v1/audio/speech", json={"input": "one"}, timeout=10).status_code == 200
        t0 = time.perf_counter()
        with pytest.raises(httpx.ReadTimeout):  # connected (no ConnectError), but no answer
            httpx.post(s.url + "/v1/audio/speech", json={"input": "two"}, timeout=httpx.Timeout(1.0, connect=2))
        with pytest.raises(httpx.ReadTimeout):
            httpx.get(s.url + "/health", timeout=httpx.Timeout(0.5, connect=2))
        assert time.perf_counter() - t0 < 15  # the client's timeouts bound the wait (1.5 s; generous for a busy box)
        assert s.stop() == 0  # SIGTERM stops a hung server within stop()'s 5 s, or it would be SIGKILLed (-9)


def test_5xx_burst_then_recovery():
    with SimServer("fixed", overrides=["faults.error_burst={after: 1, length: 2, status: 503}"]) as s:
        codes = [httpx.post(s.url + "/v1/audio/speech", json={"input": "hi"}, timeout=10) for _ in range(4)]
        assert [r.status_code for r in codes] == [200, 503, 503, 200]
        err = codes[1].json()["error"]
        assert err["code"] == 503 and "injected" in err["message"]
        m = samples(httpx.get(s.url + "/metrics", timeout=5).text)
        assert m['tts_sim_faults_total{kind="error_burst"}'] == 2


def test_stream_cut_after_first_chunk():
    with SimServer("fixed", overrides=["faults.cut_stream_every=2"]) as s:
        whole = read_stream(s.url)
        cut = read_stream(s.url)
        assert whole == (whole[0], 64 * SAMPLES_PER_CODEC_FRAME * 2, None)
        assert cut[2] is not None and 0 < cut[1] <= 25 * SAMPLES_PER_CODEC_FRAME * 2  # only the first chunk arrived


def test_malformed_audio():
    with SimServer("fixed", overrides=["faults.malformed_audio_every=2"]) as s:
        url = s.url + "/v1/audio/speech"
        good = httpx.post(url, json={"input": "fine"}, timeout=10)
        sf.read(io.BytesIO(good.content))  # request 1 decodes
        bad = httpx.post(url, json={"input": "fine"}, timeout=10)
        assert bad.status_code == 200
        with pytest.raises(sf.LibsndfileError):
            sf.read(io.BytesIO(bad.content))
        read_stream(s.url)  # request 3: good
        _, total, error = read_stream(s.url)  # request 4: one byte short
        assert error is None and total % 2 == 1


def test_slow_readiness():
    s = SimServer("fixed", overrides=["faults.slow_readiness_s=2"], wait_port=False).start()
    try:
        deadline = time.monotonic() + 60
        while "slow readiness" not in s.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        s.wait_for_port(60)
        assert time.monotonic() - t0 >= 1.8  # not listening while "loading"
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
    finally:
        s.stop()

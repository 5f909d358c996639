"""The simulator's HTTP API over real HTTP against a real server process (fast config, free port)."""

from __future__ import annotations

import base64
import io
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from loadtest.scraper import samples
from tools.bench_sim import ref_audio_uri
from tools.sim_server import SimServer
from tts_predictor.domain import MODEL_NAME, SAMPLE_RATE_HZ, SAMPLES_PER_CODEC_FRAME

pytestmark = pytest.mark.slow  # a simulator process answers every request
SPF = SAMPLES_PER_CODEC_FRAME  # 1920 samples per 12.5 Hz codec frame at 24 kHz


@pytest.fixture(scope="module")
def sim():
    with SimServer("fixed", overrides=["server.max_body_bytes=300000"]) as s:
        yield s


def speech(sim, timeout=20, **body):
    return httpx.post(sim.url + "/v1/audio/speech", json=body, timeout=timeout)


def frames_for(text, mnt=2048):
    return min(max(12, int(np.ceil(len(text) * 0.8))), mnt)


def test_health_models_voices_metrics(sim):
    assert httpx.get(sim.url + "/health", timeout=5).json() == {"status": "healthy"}
    models = httpx.get(sim.url + "/v1/models", timeout=5).json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL_NAME
    assert httpx.get(sim.url + "/v1/audio/voices", timeout=5).json() == {"voices": []}
    text = httpx.get(sim.url + "/metrics", timeout=5).text
    info = [line for line in text.splitlines() if line.startswith("tts_predictor_info{")]
    assert info and 'backend="simulated"' in info[0] and 'variant="fixed"' in info[0]


def test_wav_decodes_with_the_promised_length(sim):
    text = "Hello world, this is a simulated voice."
    r = speech(sim, input=text)
    assert r.status_code == 200 and r.headers["Content-Type"] == "audio/wav"
    audio, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    assert sr == SAMPLE_RATE_HZ and audio.ndim == 1
    assert audio.size == frames_for(text) * SPF
    assert np.abs(audio).max() > 3000  # not silence


def test_base_clone_with_data_uri_and_max_new_tokens_cap(sim):
    r = speech(sim, input="a" * 200, task_type="Base", ref_audio=ref_audio_uri(), ref_text="A reference.",
               language="English", max_new_tokens=30)
    assert r.status_code == 200
    audio, sr = sf.read(io.BytesIO(r.content), dtype="int16")
    assert audio.size == 30 * SPF


def test_flac_and_pcm_formats(sim):
    text = "Formats."
    flac = speech(sim, input=text, response_format="flac")
    assert flac.status_code == 200 and flac.headers["Content-Type"] == "audio/flac"
    audio, _ = sf.read(io.BytesIO(flac.content), dtype="int16")
    pcm = speech(sim, input=text, response_format="pcm")
    assert pcm.status_code == 200 and pcm.content == audio.astype("<i2").tobytes()


def test_stream_delivers_first_chunk_before_the_end(sim):
    text = "s" * 125  # 100 frames: chunks at 25, 50, 75, 100
    t0 = time.perf_counter()
    arrivals, total = [], 0
    with httpx.stream("POST", sim.url + "/v1/audio/speech", timeout=20,
                      json={"input": text, "stream": True, "response_format": "pcm"}) as r:
        assert r.status_code == 200 and r.headers["Content-Type"] == "audio/pcm"
        for chunk in r.iter_raw():
            arrivals.append((time.perf_counter() - t0, len(chunk)))
            total += len(chunk)
    assert total == frames_for(text) * SPF * 2
    first, last = arrivals[0][0], arrivals[-1][0]
    # 75 more steps of >= 1.1 ms modelled time each follow the first chunk
    assert last - first > 0.075, arrivals
    whole = speech(sim, input=text, response_format="pcm").content
    assert len(whole) == total


def test_same_request_same_audio_across_calls(sim):
    a = speech(sim, input="Deterministic?", response_format="pcm").content
    b = speech(sim, input="Deterministic?", response_format="pcm").content
    assert a == b and len(a) == 12 * SPF * 2


BAD = [
    ({"input": "x", "task_type": "Base"}, 400, "requires 'ref_audio'"),
    ({"input": "x", "task_type": "Base", "ref_audio": "data:audio/wav;base64,AAAAAAAA"}, 400, "could not be decoded"),
    ({"input": "x", "task_type": "Base", "ref_audio": "data:audio/wav;base64,@@@"}, 400, "could not be decoded"),
    ({"input": "x", "task_type": "Base", "ref_audio": "data:audio/wav;base64,AAA"}, 400, "not valid base64"),
    ({"input": "x", "task_type": "Base", "ref_audio": "http://127.0.0.1:1/voice.wav"}, 400, "blocked address"),
    ({"input": "x", "task_type": "Base", "ref_audio": "http://10.1.2.3/voice.wav"}, 400, "blocked address"),
    ({"input": "x", "task_type": "Base", "ref_audio": "https://localhost/voice.wav"}, 400, "blocked address"),
    ({"input": "x", "task_type": "Base", "ref_audio": "http://[::1]/voice.wav"}, 400, "blocked address"),
    ({"input": "x", "task_type": "Base", "ref_audio": "file:///etc/passwd"}, 400, "must be a URL"),
    ({"input": "x", "response_format": "ogg"}, 400, "response_format"),
    ({"input": "x", "stream": True}, 400, "requires response_format='pcm'"),
    ({"input": "x", "stream": True, "response_format": "pcm", "speed": 2.0}, 400, "Speed adjustment"),
    ({"input": "   "}, 400, "cannot be empty"),
    ({"input": "x" * 5000}, 400, "too long"),
    ({}, 400, "Field required"),
    ({"input": 5}, 400, "'input' must be str"),
    ({"input": "x", "stream": "yes"}, 400, "'stream' must be bool"),
    ({"input": "x", "max_new_tokens": "5"}, 400, "'max_new_tokens' must be int"),
    ({"input": "x", "max_new_tokens": True}, 400, "'max_new_tokens' must be int"),
    ({"input": "x", "speed": "fast"}, 400, "'speed' must be int"),
    ({"input": "x", "max_new_tokens": 0}, 400, "at least 1"),
    ({"input": "x", "max_new_tokens": 5000}, 400, "cannot exceed 4096"),
    ({"input": "x", "language": "Klingon"}, 400, "Invalid language"),
    ({"input": "x", "ref_text": "only for Base"}, 400, "only valid for Base"),
    ({"input": "x", "task_type": "VoiceDesign"}, 400, "requires 'instructions'"),
    ({"input": "x", "task_type": "Other"}, 400, "task_type"),
    ({"input": "x", "stream_format": "sse"}, 400, "stream_format"),
    ({"input": "x", "model": "other/model"}, 404, "does not exist"),
]


@pytest.mark.parametrize(("body", "status", "fragment"), BAD, ids=[f"{i}-{b[2][:20]}" for i, b in enumerate(BAD)])
def test_bad_input_gets_a_json_error(sim, body, status, fragment):
    r = speech(sim, **body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert fragment in err["message"] and err["code"] == status and err["type"]


def test_transport_level_errors(sim):
    url = sim.url + "/v1/audio/speech"
    r = httpx.post(url, content=b"{not json", headers={"Content-Type": "application/json"}, timeout=5)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(url, content=b'{"input": "x"}', headers={"Content-Type": "text/plain"}, timeout=5)
    assert r.status_code == 400 and "Unsupported Media Type" in r.json()["error"]["message"]  # vLLM's 400
    big = {"input": "x", "task_type": "Base", "ref_audio": "data:audio/wav;base64," + base64.b64encode(
        b"\0" * 400_000).decode()}
    r = httpx.post(url, json=big, timeout=10)
    assert r.status_code == 413 and "exceeds" in r.json()["error"]["message"]
    assert httpx.get(sim.url + "/health", timeout=5).status_code == 200  # still alive


def test_http_counters_and_engine_counters_move(sim):
    before = samples(httpx.get(sim.url + "/metrics", timeout=5).text)
    assert speech(sim, input="Count me.").status_code == 200
    after = samples(httpx.get(sim.url + "/metrics", timeout=5).text)
    assert after['tts_engine_requests_total{outcome="ok"}'] == before['tts_engine_requests_total{outcome="ok"}'] + 1
    assert after["tts_engine_frames_total"] - before["tts_engine_frames_total"] == 12
    key = 'tts_sim_http_requests_total{handler="/v1/audio/speech",status="200"}'
    assert after[key] == before[key] + 1


def test_client_closing_streams_is_counted_quietly():
    """Clients that close a stream mid-way (Locust stopping its users does it to every stream in flight): each is
    counted as an aborted request, and server.log gets no traceback (it used to get one per stream, ~1 kB each)."""
    n = 6
    with SimServer("fixed", overrides=["model.base_ms=5"]) as s:
        opened = []
        for _ in range(n):  # one client (one connection) per stream, so closing it closes the socket
            c = httpx.Client(timeout=20)
            req = c.build_request("POST", s.url + "/v1/audio/speech",
                                  json={"input": "a long sentence " * 100, "stream": True, "response_format": "pcm"})
            r = c.send(req, stream=True)
            assert r.status_code == 200 and next(r.iter_raw())  # the stream is running
            opened.append((c, r))
        for c, r in opened:
            r.close()  # mid-stream: the connection cannot be reused, so it is closed
            c.close()
        key = 'tts_engine_requests_total{outcome="aborted"}'
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            m = samples(httpx.get(s.url + "/metrics", timeout=5).text)
            if m.get(key, 0) >= n:
                break
            time.sleep(0.2)
        assert m.get(key) == n, {k: v for k, v in m.items() if "requests" in k}
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200  # still serving
        time.sleep(0.5)
        log = s.log_path.read_text(errors="replace")
    assert "Traceback" not in log and "closing transport" not in log, log[-3000:]
    assert len(log.encode()) < 2000, log[-3000:]


def test_lone_surrogate_in_input_is_not_a_server_error(sim):
    # JSON may carry "\ud800"; the simulator's frame table encoded the text as strict UTF-8 and answered 500
    r = httpx.post(sim.url + "/v1/audio/speech", content=b'{"input": "a\\ud800b"}',
                   headers={"Content-Type": "application/json"}, timeout=20)
    assert r.status_code == 200 and r.headers["Content-Type"] == "audio/wav"
    assert sf.read(io.BytesIO(r.content), dtype="int16")[0].size == frames_for("a\ud800b") * SPF


@pytest.mark.parametrize("ctype, status", [("application/json; charset=utf-8", 200),
                                           ("application/json ; charset=utf-8", 400), ("text/plain", 400)])
def test_content_type_media_type_as_vllm_reads_it(sim, ctype, status):
    # vLLM 0.16.0's validate_json_request compares the text before ";" unstripped: a blank before ";" is refused
    r = httpx.post(sim.url + "/v1/audio/speech", content=b'{"input": "hi"}', headers={"Content-Type": ctype},
                   timeout=20)
    assert r.status_code == status

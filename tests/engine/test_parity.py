"""Request validation parity: the same bodies through vllm-omni 0.16.0's own speech route and through the simulator.

Real side: vllm-omni 0.16.0's FastAPI router (`vllm_omni.entrypoints.openai.api_server.router`: the
`/v1/audio/speech` route with vLLM's `validate_json_request` content-type dependency and FastAPI's body parsing
into `OpenAICreateSpeechRequest`), vLLM's own exception handlers, and `OmniOpenAIServingSpeech.create_speech`
(`_check_model`, `_validate_tts_request`, `_resolve_ref_audio` with its SSRF check, `create_audio`). Stubbed around
it, not in it: the engine (a fake engine client that yields one chunk of silence), the served-model registry, the
prompt-length estimate (it needs the model's HF tokenizer), speed resampling (librosa, after validation), DNS
(`socket.getaddrinfo`: a few test host names) and the ref_audio download (`urlopen` / aiohttp's `ClientSession`:
the same WAV on both sides). Simulator side: `ttssim.server.make_app` over a real engine (fast config).

A case "accepts" when the answer is audio (HTTP 200 with an audio/* content type). Every case must give the same
accept/reject on both sides, except the cases marked `stricter`, where vllm-omni accepts and the simulator
deliberately refuses (docs/api-parity.md); such a mark is checked too: if vllm-omni refused as well, the mark is wrong.
"""

from __future__ import annotations

import asyncio
import io
import socket
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm_omni", reason="engine venv only: make test-engine")
pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "tests"))  # the shared case list (the engine tier runs with tests/engine as its root)
from parity_cases import CASES, HOSTS, MODEL, SPEAKERS, WAV  # noqa: E402
from parity_cases import outcome as _outcome  # noqa: E402
from parity_cases import raw as _raw  # noqa: E402

# --- the two servers ------------------------------------------------------------------------------------------

class _FakeEngine:
    """Stands in for the stages: one chunk of silence per request (generation is not what is compared)."""

    errored = False
    dead_error = RuntimeError("engine dead")
    default_sampling_params_list: list = []

    def __init__(self):
        self.model_config = SimpleNamespace(model=MODEL)

    async def generate(self, prompt, request_id, sampling_params_list, output_modalities):
        import torch

        yield SimpleNamespace(multimodal_output={"audio": torch.zeros(2400), "sr": 24000})


class _FakeModels:
    lora_requests: dict = {}

    @staticmethod
    def is_base_model(name):
        return name == MODEL


def real_client():
    from fastapi import FastAPI, HTTPException
    from fastapi.exceptions import RequestValidationError
    from starlette.testclient import TestClient
    from vllm.entrypoints.openai.server_utils import http_exception_handler, validation_exception_handler
    from vllm_omni.entrypoints.openai import api_server
    from vllm_omni.entrypoints.openai.serving_speech import OmniOpenAIServingSpeech

    serving = OmniOpenAIServingSpeech.__new__(OmniOpenAIServingSpeech)  # __init__ needs a running engine
    serving.engine_client = _FakeEngine()
    serving.models = _FakeModels()
    serving.log_error_stack = False
    serving._tts_stage = SimpleNamespace(model_stage="qwen3_tts", tts_args={})
    serving._is_tts = True
    serving._max_instructions_length = serving._compute_max_instructions_length()
    serving.supported_speakers = {s.lower() for s in SPEAKERS}
    serving._tts_tokenizer = None
    serving._codec_frame_rate = None
    serving._estimate_prompt_len = lambda params: 16  # needs the model's tokenizer; not validation
    serving._apply_speed_adjustment = lambda audio, speed, sr: (audio, sr)  # librosa; after validation

    app = FastAPI()
    app.include_router(api_server.router)
    app.exception_handler(HTTPException)(http_exception_handler)  # as vLLM's build_app installs them
    app.exception_handler(RequestValidationError)(validation_exception_handler)
    app.state.openai_serving_speech = serving
    return TestClient(app)


async def _sim_outcomes(cases) -> dict:
    from aiohttp.test_utils import TestClient, TestServer
    from prometheus_client import CollectorRegistry

    from ttssim.config import load_config
    from ttssim.engine import Engine
    from ttssim.faults import Faults
    from ttssim.server import make_app

    cfg = load_config(REPO / "configs/sim/fast.yaml", [f"server.voices={list(SPEAKERS)}"])
    engine = Engine(cfg, "fixed", "cpu", CollectorRegistry())
    client = TestClient(TestServer(make_app(engine, Faults(cfg.faults), {"variant": "fixed"})))
    await client.start_server()
    out = {}
    try:
        for case in cases:
            headers = {} if case.content_type is None else {"Content-Type": case.content_type}
            async with client.post("/v1/audio/speech", data=_raw(case), headers=headers,
                                   skip_auto_headers=["Content-Type"]) as r:
                out[case.id] = _outcome(r.status, r.headers.get("Content-Type", ""), await r.read())
    finally:
        await client.close()
    return out


class _FakeDownload:
    """aiohttp's ClientSession for the simulator's ref_audio fetch: answers every GET with WAV."""

    def __init__(self, *a, **kw):
        pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    def get(self, url, **kw):
        reader = SimpleNamespace(read=_stream_of(WAV))
        return _Ctx(SimpleNamespace(status=200, content=reader))


class _Ctx:
    def __init__(self, value):
        self.value = value

    async def __aenter__(self):
        return self.value

    async def __aexit__(self, *exc):
        return False


def _stream_of(data: bytes):
    """An aiohttp StreamReader's read(n) over `data`: at most n bytes a call, then b"" at the end (the simulator
    reads until the end or past its byte limit)."""
    left = bytearray(data)

    async def read(n=-1):
        size = len(left) if n is None or n < 0 else min(n, len(left))
        out = bytes(left[:size])
        del left[:size]
        return out

    return read


@pytest.fixture(scope="module")
def outcomes():
    return collect_outcomes(CASES)


def collect_outcomes(cases):
    """{case id: outcome} for vllm-omni and for the simulator."""
    mp = pytest.MonkeyPatch()
    real_getaddrinfo = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host in HOSTS:
            fam = socket.AF_INET6 if ":" in HOSTS[host] else socket.AF_INET
            return [(fam, socket.SOCK_STREAM, 6, "", (HOSTS[host], port or 0))]
        if isinstance(host, str) and host.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real_getaddrinfo(host, port, *args, **kwargs)

    mp.setattr(socket, "getaddrinfo", getaddrinfo)
    from vllm_omni.entrypoints.openai import serving_speech

    import ttssim.server

    mp.setattr(serving_speech, "urlopen", lambda url, timeout=None: io.BytesIO(WAV))
    mp.setattr(ttssim.server, "ClientSession", _FakeDownload)
    try:
        real = {}
        with real_client() as client:
            for case in cases:
                headers = {} if case.content_type is None else {"Content-Type": case.content_type}
                r = client.post("/v1/audio/speech", content=_raw(case), headers=headers)
                real[case.id] = _outcome(r.status_code, r.headers.get("content-type", ""), r.content)
        sim = asyncio.run(_sim_outcomes(cases))
    finally:
        mp.undo()
    return real, sim


def test_case_ids_are_unique():
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_same_accept_or_reject(outcomes, case):
    real, sim = outcomes[0][case.id], outcomes[1][case.id]
    if case.stricter:
        assert real["accept"] and not sim["accept"], (case.stricter, real, sim)
    else:
        assert real["accept"] == sim["accept"], (real, sim)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_refusal_carries_the_same_code(outcomes, case):
    """The simulator's HTTP status is the code vllm-omni puts in its error (its HTTP status may differ: see
    docs/api-parity.md), and both answer in vLLM's error shape."""
    real, sim = outcomes[0][case.id], outcomes[1][case.id]
    if real["accept"] or sim["accept"]:
        return
    assert sim["error"]["code"] == sim["status"] and sim["error"]["message"]
    assert real["error"]["code"] == sim["status"], (real, sim)


def test_the_sweep_is_not_vacuous(outcomes):
    real, sim = outcomes
    accepted = sum(o["accept"] for o in real.values())
    assert 40 <= accepted <= len(CASES) - 60, accepted  # plenty of both
    stricter = [c for c in CASES if c.stricter]
    assert len(stricter) >= 8
    print(f"{len(CASES)} cases: vllm-omni accepts {accepted}, the simulator {sum(o['accept'] for o in sim.values())}",
          file=sys.stderr)

"""A ref_audio URL is read whole (to EOF or past the byte limit) before the size and length limits apply."""

from __future__ import annotations

import asyncio
import base64

import pytest
from aiohttp import web

from tools.bench_sim import ref_audio_uri
from ttssim import server
from ttssim.config import AudioConfig, ServerConfig

pytestmark = pytest.mark.slow  # a local HTTP server serves the reference file


async def _serve_slowly(wav: bytes):
    """A local server sending the WAV in small chunks with pauses (so one read sees only the first chunk)."""
    async def handler(request):
        resp = web.StreamResponse(headers={"Content-Type": "audio/wav"})
        await resp.prepare(request)
        for i in range(0, len(wav), 4096):
            await resp.write(wav[i:i + 4096])
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp
    app = web.Application()
    app.router.add_get("/voice.wav", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    return runner, f"http://127.0.0.1:{port}/voice.wav"


async def _resolve(wav: bytes, server_cfg: ServerConfig, audio_cfg: AudioConfig) -> str | None:
    runner, url = await _serve_slowly(wav)
    try:
        await server.resolve_ref_audio(url, server_cfg, audio_cfg)
        return None
    except server.ApiError as e:
        return str(e)
    finally:
        await runner.cleanup()


@pytest.fixture()
def local_urls(monkeypatch):
    async def allow(url, timeout_s):  # loopback is refused by the SSRF check (tested in test_sim_api); here it serves
        return None
    monkeypatch.setattr(server, "check_url_host", allow)


def _wav(seconds: float) -> bytes:
    return base64.b64decode(ref_audio_uri(seconds).split(",", 1)[1])


def test_url_reference_longer_than_the_limit_is_refused(local_urls):
    err = asyncio.run(_resolve(_wav(3.0), ServerConfig(), AudioConfig(max_ref_audio_s=2.0)))
    assert err is not None and "ref_audio" in err


def test_url_reference_over_the_byte_limit_is_refused(local_urls):
    wav = _wav(1.0)
    err = asyncio.run(_resolve(wav, ServerConfig(ref_audio_max_bytes=len(wav) - 1), AudioConfig()))
    assert err is not None and "exceeds" in err


def test_url_reference_within_limits_is_accepted(local_urls):
    assert asyncio.run(_resolve(_wav(1.0), ServerConfig(), AudioConfig())) is None

"""A tiny fixed-latency speech server (aiohttp) for the load generator's own tests and benchmark.

Same endpoints as vllm-omni for what the client uses (POST /v1/audio/speech, GET /health, /metrics). Latency is
fixed and known: first chunk after `ttfa_s`, then one chunk every `chunk_s`, so anything the client measures
beyond that nominal time is added by the client, the loopback, or this server's scheduling (reported at /stats).

    python -m tools.fakeserver --port 0 --port-file fake.port --ttfa-s 0.05 --chunk-s 0.02 --chunks 5
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import sys
import time

import numpy as np

from tts_predictor.domain import SAMPLE_RATE_HZ as RATE


def tone(seconds: float, offset: int = 0) -> bytes:
    n = int(round(seconds * RATE))
    t = np.arange(offset, offset + n)
    return (np.sin(2 * np.pi * 220 * t / RATE) * 8000).astype("<i2").tobytes()


class FixedServer:
    def __init__(self, ttfa_s=0.05, chunk_s=0.02, chunks=0, chunk_audio_s=0.5, chars_per_s=15.0):
        self.ttfa_s, self.chunk_s, self.chunks = ttfa_s, chunk_s, chunks
        self.chunk_audio_s, self.chars_per_s = chunk_audio_s, chars_per_s
        self.lateness: list[float] = []  # actual - nominal handling time, per finished request
        self.finished = 0
        self.started = 0
        self._chunk = tone(chunk_audio_s)

    def plan(self, text: str) -> int:
        if self.chunks:
            return self.chunks
        return max(1, math.ceil(len(text) / self.chars_per_s / self.chunk_audio_s))

    async def speech(self, request):
        from aiohttp import web

        t0 = time.perf_counter()
        self.started += 1
        raw = await request.read()
        if self.chunks:  # fixed plan: skip parsing the 200 kB body so the server stays cheap under load
            body = {"stream": b'"stream": true' in raw, "response_format": "pcm" if b'"pcm"' in raw else "wav"}
            if b'"task_type": "Base"' not in raw or b'"ref_audio": "data:' not in raw:
                return web.json_response({"error": "Base voice clone with a data: ref_audio expected"}, status=400)
        else:
            body = json.loads(raw)
            if body.get("task_type") != "Base" or not str(body.get("ref_audio", "")).startswith("data:"):
                return web.json_response({"error": "Base voice clone with a data: ref_audio expected"}, status=400)
        n = self.plan(str(body.get("input", "")))
        stream = bool(body.get("stream"))
        if stream and body.get("response_format") != "pcm":
            return web.json_response({"error": "stream requires response_format pcm"}, status=400)
        nominal = self.ttfa_s + (n - 1) * self.chunk_s
        if stream:
            resp = web.StreamResponse(headers={"Content-Type": "audio/pcm"})
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await asyncio.sleep(self.ttfa_s - (time.perf_counter() - t0))
            for i in range(n):
                if i:
                    await asyncio.sleep(t0 + self.ttfa_s + i * self.chunk_s - time.perf_counter())
                await resp.write(self._chunk)
            await resp.write_eof()
        else:
            await asyncio.sleep(nominal)
            import soundfile as sf

            buf = io.BytesIO()
            sf.write(buf, np.frombuffer(self._chunk * n, dtype="<i2"), RATE, format="WAV", subtype="PCM_16")
            resp = web.Response(body=buf.getvalue(), content_type="audio/wav")
        self.lateness.append(time.perf_counter() - t0 - nominal)
        self.finished += 1
        return resp

    async def health(self, request):
        from aiohttp import web

        return web.Response(text="ok")

    async def metrics(self, request):
        from aiohttp import web

        text = (
            "# TYPE tts_engine_requests_total counter\n"
            f'tts_engine_requests_total{{outcome="ok"}} {self.finished}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def stats(self, request):
        from aiohttp import web

        lat = np.array(self.lateness or [0.0])
        return web.json_response({"finished": self.finished, "started": self.started,
                                  "lateness_p50_s": float(np.percentile(lat, 50)),
                                  "lateness_p99_s": float(np.percentile(lat, 99)),
                                  "lateness_max_s": float(lat.max())})

    def app(self):
        from aiohttp import web

        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1/audio/speech", self.speech)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/stats", self.stats)
        return app


async def serve(server: FixedServer, host: str, port: int, port_file: str | None = None) -> None:
    from aiohttp import web

    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]
    print(json.dumps({"port": bound}), flush=True)
    if port_file:  # the port it got from port 0, for loadtest.server_process (written once listening)
        with open(port_file + ".tmp", "w") as f:
            f.write(str(bound))
        os.replace(port_file + ".tmp", port_file)
    while True:
        await asyncio.sleep(3600)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--port-file", default=None, help="write the bound port here once listening")
    ap.add_argument("--ttfa-s", type=float, default=0.05)
    ap.add_argument("--chunk-s", type=float, default=0.02)
    ap.add_argument("--chunks", type=int, default=0, help="fixed chunk count (0: from the text length)")
    ap.add_argument("--chunk-audio-s", type=float, default=0.5)
    return ap.parse_args(argv)


def main(argv=None) -> None:
    a = parse_args(argv)
    srv = FixedServer(a.ttfa_s, a.chunk_s, a.chunks, a.chunk_audio_s)
    try:
        asyncio.run(serve(srv, a.host, a.port, a.port_file))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

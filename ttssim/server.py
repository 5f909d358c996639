"""HTTP API of the simulator, shaped like vllm-omni 0.16.0's OpenAI speech server (learned from its serving_speech.py
and protocol/audio.py; no code taken). Errors use vLLM's JSON shape {"error": {message, type, param, code}}.

`make test-engine` sends the same bodies through vllm-omni 0.16.0's own route and through this server and checks the
same accept/reject (tests/engine/test_parity.py). Differences are deliberate and listed in docs/api-parity.md: the
simulator is stricter on JSON types (pydantic would coerce "5" to 5), input length, ref_audio length and emptiness,
and two SSRF address ranges; it answers a refusal with the HTTP status vllm-omni puts in its error body (vllm-omni
0.16.0 sends some of those with HTTP 200); a bounded body (413), a bounded waiting queue (503), `speed` by
resampling.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import time
from urllib.parse import urlparse

from aiohttp import ClientSession, ClientTimeout, web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .audio import decode_data_uri, encode
from .engine import ENGINE_DEAD_MESSAGE, Engine, EngineDead, QueueFull
from .faults import Faults

log = logging.getLogger("ttssim.server")

LANGUAGES = frozenset(
    {"Auto", "Chinese", "English", "Japanese", "Korean", "German", "French", "Russian", "Portuguese", "Spanish",
     "Italian"}
)
RESPONSE_FORMATS = ("wav", "pcm", "flac", "mp3", "aac", "opus")
TASK_TYPES = ("CustomVoice", "VoiceDesign", "Base")
MAX_INSTRUCTIONS = 500
INLINE_DECODE_BYTES = 512 * 1024
BLOCKED_NETWORKS = tuple(
    ipaddress.ip_network(n)
    for n in ("127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16", "0.0.0.0/8",
              "::1/128", "fc00::/7", "fe80::/10", "::/128")
)
# field -> (accepted python types, may be absent, may be null): vllm-omni's OpenAICreateSpeechRequest, where a field
# with a non-None default and no `| None` (response_format, stream) may be left out but not sent as null
FIELDS = {
    "input": ((str,), False, False),
    "model": ((str,), True, True),
    "voice": ((str,), True, True),
    "instructions": ((str,), True, True),
    "response_format": ((str,), True, False),
    "speed": ((int, float), True, True),
    "stream_format": ((str,), True, True),
    "stream": ((bool,), True, False),
    "task_type": ((str,), True, True),
    "language": ((str,), True, True),
    "ref_audio": ((str,), True, True),
    "ref_text": ((str,), True, True),
    "x_vector_only_mode": ((bool,), True, True),
    "max_new_tokens": ((int,), True, True),
}
JSON_MEDIA_TYPE = "application/json"  # vLLM's validate_json_request: the media type exactly, any case, any parameters

ENGINE_KEY = web.AppKey("engine", Engine)
FAULTS_KEY = web.AppKey("faults", Faults)
INFO_KEY = web.AppKey("info", dict)


class ApiError(Exception):
    """A client-facing error with vLLM's error shape."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError", param: str | None = None):
        super().__init__(message)
        self.message, self.status, self.err_type, self.param = message, status, err_type, param


def error_response(message: str, status: int = 400, err_type: str = "BadRequestError", param=None) -> web.Response:
    body = {"error": {"message": message, "type": err_type, "param": param, "code": status}}
    return web.json_response(body, status=status)


def is_json_content_type(value: str) -> bool:
    return value.split(";", 1)[0].lower() == JSON_MEDIA_TYPE  # no strip: vLLM refuses "application/json ; ..."


def validate_body(body, model_name: str, audio_cfg, voices=()) -> dict:
    """Type and value checks in the order vllm-omni applies them (protocol model, model check, TTS checks).

    `voices`: the CustomVoice speakers the server knows (none: any voice passes, as on a model without speakers)."""
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    for name, (types, may_be_absent, nullable) in FIELDS.items():
        if name not in body:
            if not may_be_absent:
                raise ApiError(f"Field required: '{name}'", param=name)
            continue
        value = body[name]
        if value is None:
            if not nullable:
                raise ApiError(f"'{name}' must not be null", param=name)
            continue
        if isinstance(value, bool) and bool not in types:
            raise ApiError(f"'{name}' must be {types[0].__name__}, got bool", param=name)
        if not isinstance(value, types):
            raise ApiError(f"'{name}' must be {types[0].__name__}, got {type(value).__name__}", param=name)
    req = {k: body.get(k) for k in FIELDS}
    fmt = req["response_format"] or "wav"
    if fmt not in RESPONSE_FORMATS:
        raise ApiError(f"response_format must be one of {', '.join(RESPONSE_FORMATS)}; got '{fmt}'",
                       param="response_format")
    req["response_format"] = fmt
    speed = 1.0 if req["speed"] is None else float(req["speed"])
    if not 0.25 <= speed <= 4.0:
        raise ApiError("speed must be between 0.25 and 4.0", param="speed")
    req["speed"] = speed
    if req["stream_format"] not in (None, "audio"):
        raise ApiError(f"stream_format '{req['stream_format']}' is not supported; use 'audio'", param="stream_format")
    if req["task_type"] is not None and req["task_type"] not in TASK_TYPES:
        raise ApiError(f"task_type must be one of {', '.join(TASK_TYPES)}", param="task_type")
    if req["stream"]:
        if fmt != "pcm":
            raise ApiError(f"Streaming (stream=true) requires response_format='pcm'. Got response_format='{fmt}'.",
                           param="response_format")
        if speed != 1.0:
            raise ApiError("Speed adjustment is not supported when streaming (stream=true). Set speed=1.0 or omit it.",
                           param="speed")
    if req["model"] and req["model"] != model_name:  # an empty name means the served model, as in vLLM
        raise ApiError(f"The model `{req['model']}` does not exist.", status=404, err_type="NotFoundError",
                       param="model")
    text = req["input"]
    if not text.strip():
        raise ApiError("Input text cannot be empty", param="input")
    if len(text) > audio_cfg.max_input_chars:
        raise ApiError(f"Input text too long ({len(text)} characters; max {audio_cfg.max_input_chars})", param="input")
    if req["language"] is not None and req["language"] not in LANGUAGES:
        raise ApiError(f"Invalid language '{req['language']}'. Supported: {', '.join(sorted(LANGUAGES))}",
                       param="language")
    task = req["task_type"] or "CustomVoice"
    if task == "CustomVoice" and req["voice"] is not None and voices:
        known = sorted({v.lower() for v in voices})
        if req["voice"].lower() not in known:
            raise ApiError(f"Invalid speaker '{req['voice'].lower()}'. Supported: {', '.join(known)}", param="voice")
    if task == "Base":
        if req["ref_audio"] is None:
            raise ApiError("Base task requires 'ref_audio' for voice cloning", param="ref_audio")
        if not req["ref_audio"].startswith(("http://", "https://", "data:")):
            raise ApiError("ref_audio must be a URL (http/https) or base64 data URL (data:...)", param="ref_audio")
    else:
        if req["ref_text"] is not None:
            raise ApiError("'ref_text' is only valid for Base task", param="ref_text")
        if req["x_vector_only_mode"] is not None:
            raise ApiError("'x_vector_only_mode' is only valid for Base task", param="x_vector_only_mode")
    if task == "VoiceDesign" and not req["instructions"]:
        raise ApiError("VoiceDesign task requires 'instructions' to describe the voice", param="instructions")
    if req["instructions"] and len(req["instructions"]) > MAX_INSTRUCTIONS:
        raise ApiError(f"Instructions too long (max {MAX_INSTRUCTIONS} characters)", param="instructions")
    mnt = req["max_new_tokens"]
    if mnt is not None and not 1 <= mnt <= 4096:
        raise ApiError("max_new_tokens must be at least 1" if mnt < 1 else "max_new_tokens cannot exceed 4096",
                       param="max_new_tokens")
    req["max_new_tokens"] = audio_cfg.default_max_new_tokens if mnt is None else mnt
    if "stream_format" in body and body["stream_format"] is None and not req["stream"]:
        # vllm-omni accepts the null, generates, then its encoder refuses it: refused here before any work
        raise ApiError("Unsupported stream format: None", param="stream_format")
    return req


async def check_url_host(url: str, timeout_s: float) -> None:
    """Refuse ref_audio URLs whose host resolves to a loopback, private or link-local address (SSRF)."""
    host = urlparse(url).hostname
    if not host:
        raise ApiError("ref_audio URL must include a hostname", param="ref_audio")
    loop = asyncio.get_running_loop()
    try:
        infos = await asyncio.wait_for(loop.getaddrinfo(host, None), timeout_s)
    except (OSError, asyncio.TimeoutError) as e:
        raise ApiError(f"ref_audio URL host could not be resolved: {e}", param="ref_audio") from None
    for info in infos:
        addr = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if getattr(addr, "ipv4_mapped", None):
            addr = addr.ipv4_mapped
        if any(addr in net for net in BLOCKED_NETWORKS):
            raise ApiError(f"ref_audio URL resolves to blocked address: {addr}", param="ref_audio")


async def resolve_ref_audio(ref: str, server_cfg, audio_cfg) -> None:
    """Decode (data:) or fetch (public http/https, bounded in time and size) the reference audio; 400 on failure."""
    if ref.startswith("data:"):
        data_uri = ref
    else:
        await check_url_host(ref, server_cfg.ref_audio_fetch_timeout_s)
        limit = server_cfg.ref_audio_max_bytes
        try:
            timeout = ClientTimeout(total=server_cfg.ref_audio_fetch_timeout_s)
            async with ClientSession(timeout=timeout) as s, s.get(ref, allow_redirects=False) as r:
                if r.status != 200:
                    raise ApiError(f"ref_audio URL returned HTTP {r.status}", param="ref_audio")
                # read to EOF or past the limit: one read(n) returns only what is buffered, so a short first
                # chunk used to pass as the whole file and the size and length limits never applied to URLs
                buf = bytearray()
                while len(buf) <= limit:
                    chunk = await r.content.read(limit + 1 - len(buf))
                    if not chunk:
                        break
                    buf += chunk
                raw = bytes(buf)
        except ApiError:
            raise
        except Exception as e:  # network errors of every kind become a 400, like vllm-omni's ValueError path
            raise ApiError(f"ref_audio URL could not be fetched: {e}", param="ref_audio") from None
        if len(raw) > limit:
            raise ApiError(f"ref_audio URL exceeds {limit} bytes", param="ref_audio")
        data_uri = "data:audio/wav;base64," + base64.b64encode(raw).decode("ascii")
    try:
        if len(data_uri) < INLINE_DECODE_BYTES:  # ~1 ms: cheaper than a thread hop on a busy machine
            decode_data_uri(data_uri, audio_cfg.max_ref_audio_s)
        else:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(None, decode_data_uri, data_uri, audio_cfg.max_ref_audio_s)
    except ValueError as e:
        raise ApiError(str(e), param="ref_audio") from None


# --- handlers -----------------------------------------------------------------------------------------------------
async def speech(request: web.Request) -> web.StreamResponse:
    t_arrival = asyncio.get_running_loop().time()
    engine, faults = request.app[ENGINE_KEY], request.app[FAULTS_KEY]
    cfg = engine.cfg
    if not is_json_content_type(request.headers.get("Content-Type", "")):  # vLLM answers this with 400
        return error_response("Unsupported Media Type: Only 'application/json' is allowed", 400)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return error_response(f"request body exceeds {cfg.server.max_body_bytes} bytes", 413, "RequestTooLargeError")
    try:
        body = json.loads(raw)
    except ValueError as e:
        return error_response(f"request body is not valid JSON: {e}")
    try:
        req = validate_body(body, cfg.model.name, cfg.audio, cfg.server.voices)
        if req["ref_audio"] is not None:
            await resolve_ref_audio(req["ref_audio"], cfg.server, cfg.audio)
    except ApiError as e:
        return error_response(e.message, e.status, e.err_type, e.param)
    n = faults.next_speech()
    if req["ref_text"] is not None and cfg.faults.ref_text_request:
        engine.metrics.faults.labels("ref_text_request").inc()
        if cfg.faults.ref_text_request == "fatal":
            engine.die(ENGINE_DEAD_MESSAGE)
            return error_response(ENGINE_DEAD_MESSAGE, 500, "EngineDeadError")
        return error_response("simulated fault: this server cannot serve a Base request with ref_text", 400)
    burst = faults.burst_status(n)
    if burst:
        engine.metrics.faults.labels("error_burst").inc()
        return error_response(f"simulated fault: injected {burst} (request {n})", burst, "InternalServerError")
    try:
        sreq = engine.submit(req["input"], req["max_new_tokens"], t_arrival=t_arrival)
    except QueueFull as e:
        engine.metrics.requests.labels("rejected").inc()
        return error_response(f"Server overloaded: {e}; retry later", 503, "ServiceUnavailableError")
    except EngineDead as e:
        return error_response(str(e), 503, "ServiceUnavailableError")
    malformed = faults.malformed(n)
    if malformed:
        engine.metrics.faults.labels("malformed_audio").inc()
    try:
        if req["stream"]:
            return await _stream(request, engine, faults, sreq, malformed, t_arrival)
        return await _whole(engine, sreq, req, malformed)
    finally:
        engine.abort(sreq)  # no-op when finished; frees the batch slot when the client left


async def _stream(request, engine, faults, sreq, malformed: bool, t_arrival: float) -> web.StreamResponse:
    """Raw PCM16 chunks as the engine produces them (headers go out at once, like a Starlette StreamingResponse).

    A client that closes the connection mid-stream (a load generator stopping its users does it to every stream in
    flight) is normal: the request is aborted (counted as tts_engine_requests_total{outcome="aborted"} by
    engine.abort in speech()) and one debug line is logged, no traceback."""
    cut = faults.cut_stream()
    resp = web.StreamResponse(status=200, headers={"Content-Type": "audio/pcm"})
    sent = 0
    try:
        await resp.prepare(request)
        first = True
        while True:
            item = await sreq.out.get()
            if item is None:
                break
            if isinstance(item, Exception):  # engine died: cut the stream so the client sees a truncated body
                _drop(request)
                return resp
            if malformed and first:
                item = item[:-1]  # the first chunk loses a byte: the stream is no longer whole PCM16 samples
            await resp.write(item)
            if first:
                engine.metrics.ttfa_served.observe(asyncio.get_running_loop().time() - t_arrival)
            sent += len(item)
            if first and cut:
                engine.metrics.faults.labels("cut_stream").inc()
                _drop(request)
                return resp
            first = False
        await resp.write_eof()
    except ConnectionResetError:  # aiohttp's ClientConnectionResetError: "Cannot write to closing transport"
        log.debug("client closed the stream after %d bytes", sent)
    return resp


async def _whole(engine, sreq, req, malformed: bool) -> web.Response:
    parts = []
    while True:
        item = await sreq.out.get()
        if item is None:
            break
        if isinstance(item, Exception):
            return error_response(f"Speech generation failed: {item}", 500, "InternalServerError")
        parts.append(item)
    try:
        data, media = encode(b"".join(parts), engine.cfg.audio.sample_rate, req["response_format"], req["speed"])
    except ValueError as e:
        return error_response(str(e))
    if malformed:
        data = b"JUNK" + data[4:12] + b"\xff\xff\xff\xff" + data[16:]
    return web.Response(body=data, content_type=media)


def _drop(request: web.Request) -> None:
    transport = request.transport
    if transport is not None:
        transport.abort()


async def health(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.dead is not None:
        return web.json_response({"status": "unhealthy", "reason": f"engine failed: {engine.dead}"}, status=503)
    return web.json_response({"status": "healthy"})


async def models(request: web.Request) -> web.Response:
    name = request.app[ENGINE_KEY].cfg.model.name
    card = {"id": name, "object": "model", "created": request.app[INFO_KEY]["started"], "owned_by": "vllm-omni",
            "root": name, "parent": None, "max_model_len": 4096, "permission": []}
    return web.json_response({"object": "list", "data": [card]})


async def voices(request: web.Request) -> web.Response:
    return web.json_response({"voices": sorted(request.app[ENGINE_KEY].cfg.server.voices)})


async def metrics_handler(request: web.Request) -> web.Response:
    body = generate_latest(request.app[ENGINE_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@web.middleware
async def outer(request: web.Request, handler):
    """Hang fault and per-handler HTTP counters (a hung server accepts and then never answers anything)."""
    app = request.app
    faults, engine = app[FAULTS_KEY], app[ENGINE_KEY]
    if faults.hanging(request.path):
        engine.metrics.faults.labels("hang").inc()
        await asyncio.Event().wait()
    try:
        resp = await handler(request)
    except web.HTTPException as e:
        resp = error_response(e.reason or str(e), e.status, "NotFoundError" if e.status == 404 else "BadRequestError")
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a bug must still answer in the API's error shape, never hang or drop
        log.exception("unhandled error in %s", request.path)
        resp = error_response(f"Speech generation failed: {e}", 500, "InternalServerError")
    route = request.match_info.route.resource
    name = route.canonical if route is not None else "unmatched"
    engine.metrics.http.labels(name, str(resp.status)).inc()
    return resp


def make_app(engine: Engine, faults: Faults, info: dict) -> web.Application:
    app = web.Application(middlewares=[outer], client_max_size=engine.cfg.server.max_body_bytes)
    app[ENGINE_KEY], app[FAULTS_KEY] = engine, faults
    app[INFO_KEY] = {"started": int(time.time()), **info}
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/audio/voices", voices)
    app.router.add_get("/metrics", metrics_handler)

    async def engine_task(app):
        task = asyncio.create_task(engine.run())
        yield
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass

    app.cleanup_ctx.append(engine_task)
    return app


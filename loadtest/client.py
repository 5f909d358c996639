"""One TTS request, timed to the last byte and validated. Never raises: every failure is an Outcome with a reason.

The transport is injected (a real HTTP client under Locust, a fake stream in tests) and so is the clock, so the
timing logic is tested with a scripted clock instead of sleeps. A streamed request also gets its playback
continuity (`Playback`: a player that starts at the first chunk) from the same clock that times TTFA.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from tts_predictor.domain import BYTES_PER_SAMPLE, SAMPLE_RATE_HZ, SAMPLES_PER_CODEC_FRAME
from ttsrecords.records import UNDERRUN_THRESHOLD_S

SPEECH_PATH = "/v1/audio/speech"
READ_SIZE = 64 * 1024
# A response can never be longer than max_new_tokens (4096) codec frames of 1920 samples of PCM16 (~15.7 MB); twice that
# bounds the client's memory when a broken server streams without end.
MAX_RESPONSE_BYTES = 2 * 4096 * SAMPLES_PER_CODEC_FRAME * BYTES_PER_SAMPLE
# A 200 answer that is JSON or text is an error body (vllm-omni 0.16.0 sends its ErrorResponse with HTTP 200); read at
# most this much of it, and quote at most ERROR_TEXT_CHARS of the server's message in the reason.
MAX_ERROR_BODY_BYTES = 64 * 1024
ERROR_TEXT_CHARS = 300


class Response(Protocol):
    status: int
    headers: Mapping[str, str]  # lower-case names

    def chunks(self) -> Iterator[bytes]:
        """Body bytes as they arrive; the first item is yielded as soon as any body byte is there."""

    def close(self) -> None: ...


class Transport(Protocol):
    def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> Response: ...


@dataclass(frozen=True)
class Outcome:
    """The measured fields of a request record (ttsrecords.records.RequestRecord has the same names)."""

    ok: bool
    error: str | None
    status: int | None
    ttfa_s: float | None
    e2e_s: float | None
    audio_s: float | None
    rtf: float | None
    bytes: int
    # streaming continuity: ok streamed requests only (None for wav and for failures); see Playback
    underrun_s: float | None = None
    continuity_ok: bool | None = None
    stream_rtf: float | None = None  # (e2e_s - ttfa_s) / audio_s
    chunks: int | None = None


class Playback:
    """A player of 24 kHz PCM16 mono that starts at the first chunk and then plays in real time; O(1) per chunk.

    Definition (matches vllm-omni's own benchmark: `vllm_omni/benchmarks/audio_continuity.py`,
    `compute_continuity_stats`, in the vllm-omni 0.30.0 wheel; added by vllm-omni PR #3618; docs/sources.md):
    at the arrival of every chunk after the first, the deficit is the time since the first chunk minus the audio
    received before this chunk (audio seconds = PCM bytes / 2 / 24000). `underrun_s` is the largest deficit over
    the stream (0 if the buffer never ran dry). That equals the total stall time of a player that pauses when its
    buffer is empty and resumes when the next chunk arrives, so every stall counts, however short, and short stalls
    add up. `continuity_ok` is `underrun_s <= UNDERRUN_THRESHOLD_S` (0.1 s, vllm-omni's default threshold).
    One difference of resolution: a player plays whole samples, so audio is counted in whole samples of all bytes
    received so far (vllm-omni divides bytes; the two differ by less than one sample, 42 µs).
    Arrival times come from the caller's clock (the one that times TTFA), taken when a chunk is handed over; both
    transports hand over what each socket read delivered, so a server chunk may come as two pieces microseconds
    apart (the first read also carries the headers), far below 0.1 s.
    """

    __slots__ = ("start", "received", "underrun_s", "chunks")

    def __init__(self) -> None:
        self.start: float | None = None
        self.received = 0  # bytes received so far
        self.underrun_s = 0.0
        self.chunks = 0

    def arrive(self, t: float, nbytes: int) -> None:
        """A non-empty chunk of nbytes arrived at time t (the clock that timed the request)."""
        if self.start is None:
            self.start = t
        else:
            deficit = (t - self.start) - (self.received // BYTES_PER_SAMPLE) / SAMPLE_RATE_HZ
            if deficit > self.underrun_s:
                self.underrun_s = deficit
        self.received += nbytes
        self.chunks += 1

    @property
    def continuity_ok(self) -> bool:
        return self.underrun_s <= UNDERRUN_THRESHOLD_S


def _short(e: BaseException) -> str:
    msg = str(e).strip().replace("\n", " ")
    return f"{type(e).__name__}: {msg[:200]}" if msg else type(e).__name__


def run_request(
    transport: Transport,
    body: bytes,
    mode: str,
    *,
    expected_s: tuple[float, float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    max_bytes: int = MAX_RESPONSE_BYTES,
    deadline_s: float | None = None,
) -> Outcome:
    """POST one speech request. TTFA = first non-empty body chunk; E2E = last byte (not headers). `deadline_s` bounds
    the whole request (the transport's timeout bounds each wait for a byte, so a stream that trickles would outlive
    it: a 149 s stream was seen under a 90 s timeout on the real CPU server); past it the request is a failure."""
    t0 = clock()
    status = None
    ttfa = None
    nbytes = 0
    resp = None
    try:
        try:
            resp = transport.post(SPEECH_PATH, body, {"Content-Type": "application/json"})
        except Exception as e:  # the request went out, or not: a timeout here is a server that accepted and is silent
            stage = "no response" if isinstance(e, TimeoutError) or "timed out" in str(e).lower() else "connect"
            return _fail(f"{stage}: {_short(e)}", None, None, clock() - t0, 0)
        status = resp.status
        if status != 200:
            snippet = b""
            try:  # read the whole (small) error body so the keep-alive connection stays usable
                for chunk in resp.chunks():
                    if len(snippet) < 300:
                        snippet += chunk
            except Exception:
                pass
            text = snippet[:300].decode("utf-8", "replace").strip().replace("\n", " ")
            return _fail(f"http {status}: {text}" if text else f"http {status}", status, None, clock() - t0, 0)
        ctype = str(resp.headers.get("content-type", "")).lower()
        if "application/json" in ctype or "text/" in ctype:
            return _error_body(resp, ctype, status, t0, clock, min(max_bytes, MAX_ERROR_BODY_BYTES))
        nonzero = False
        parts: list[bytes] = []
        player = Playback() if mode == "stream" else None
        try:
            for chunk in resp.chunks():
                if not chunk:
                    continue
                if player is not None:
                    now = clock()
                    player.arrive(now, len(chunk))
                    if ttfa is None:
                        ttfa = now - t0
                elif ttfa is None:
                    ttfa = clock() - t0
                nbytes += len(chunk)
                if deadline_s is not None and clock() - t0 > deadline_s:
                    return _fail(f"request timeout: still streaming after {deadline_s:g} s (reading stopped)", status,
                                 ttfa, clock() - t0, nbytes)
                if nbytes > max_bytes:
                    return _fail(f"response exceeds {max_bytes} bytes: reading stopped", status, ttfa, clock() - t0,
                                 nbytes)
                if player is None:
                    parts.append(chunk)
                elif not nonzero and chunk.count(0) != len(chunk):
                    nonzero = True
        except Exception as e:
            return _fail(f"stream broken after {nbytes} bytes: {_short(e)}", status, ttfa, clock() - t0, nbytes)
        e2e = clock() - t0
        if nbytes == 0:
            return _fail("empty body", status, ttfa, e2e, nbytes)
        if player is not None:
            if nbytes % BYTES_PER_SAMPLE:
                return _fail(f"odd PCM byte count {nbytes}", status, ttfa, e2e, nbytes)
            audio_s = nbytes / (SAMPLE_RATE_HZ * BYTES_PER_SAMPLE)
            if not nonzero:
                return _fail("silent audio (all samples zero)", status, ttfa, e2e, nbytes, audio_s)
        else:
            audio_s, err = check_wav(b"".join(parts))
            if err:
                return _fail(err, status, ttfa, e2e, nbytes, audio_s)
        if expected_s is not None and not (expected_s[0] <= audio_s <= expected_s[1]):
            return _fail(
                f"audio {audio_s:.2f} s outside [{expected_s[0]:.2f}, {expected_s[1]:.2f}] s expected for the text",
                status, ttfa, e2e, nbytes, audio_s,
            )
        if player is None:
            return Outcome(True, None, status, ttfa, e2e, audio_s, e2e / audio_s, nbytes)
        return Outcome(True, None, status, ttfa, e2e, audio_s, e2e / audio_s, nbytes, underrun_s=player.underrun_s,
                       continuity_ok=player.continuity_ok, stream_rtf=(e2e - ttfa) / audio_s, chunks=player.chunks)
    except Exception as e:  # a bug in this function must not kill the user: record it
        return _fail(f"client error: {_short(e)}", status, ttfa, clock() - t0, nbytes)
    finally:
        if resp is not None:
            try:
                resp.close()
            except Exception:
                pass


def _fail(reason, status, ttfa, e2e, nbytes, audio_s=None) -> Outcome:
    return Outcome(False, reason, status, ttfa, e2e, audio_s, None, nbytes)


def _error_body(resp: Response, ctype: str, status: int, t0: float, clock: Callable[[], float],
                limit: int) -> Outcome:
    """A 200 answer with a JSON or text body is no audio: read it (bounded) and quote the server's error verbatim.

    vllm-omni 0.16.0 returns its ErrorResponse, `{"error": {"message", "type", "param", "code"}}`, with HTTP 200 for
    model, validation and ref_audio errors (docs/api-parity.md)."""
    body = b""
    nbytes = 0
    ttfa = None
    try:
        for chunk in resp.chunks():
            if not chunk:
                continue
            if ttfa is None:
                ttfa = clock() - t0
            nbytes += len(chunk)
            body += chunk[:max(0, limit - len(body))]
            if nbytes >= limit:  # enough to quote; the rest is not read
                break
    except Exception:
        pass  # what arrived is quoted below
    e2e = clock() - t0
    message = error_message(body)
    if message is not None:
        text, code = message
        reason = f"http {status} error body" + (f" (code {code})" if code is not None else "") + f": {text}"
        return _fail(reason, status, ttfa, e2e, nbytes)
    snippet = _one_line(body.decode("utf-8", "replace"))
    return _fail(f"unexpected content-type {ctype!r}" + (f": {snippet}" if snippet else ""), status, ttfa, e2e,
                 nbytes)


def _one_line(text: str, limit: int = ERROR_TEXT_CHARS) -> str:
    """The text as it is, on one line (line breaks become spaces), cut to `limit` characters."""
    text = " ".join(line.strip() for line in text.strip().splitlines())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def error_message(body: bytes) -> tuple[str, object] | None:
    """(message, code) of an OpenAI/vLLM-style error body, or None when the body is not one. The message is the
    server's text on one line, at most ERROR_TEXT_CHARS long."""
    try:
        doc = json.loads(body.decode("utf-8", "replace"))
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    err = doc.get("error")
    if isinstance(err, dict):
        msg, code = err.get("message"), err.get("code")
    elif isinstance(err, str):
        msg, code = err, doc.get("code")
    elif "message" in doc and doc.get("object") == "error":  # older vLLM: the fields at the top level
        msg, code = doc.get("message"), doc.get("code")
    else:
        return None
    if isinstance(code, bool) or not isinstance(code, (int, str)):
        code = None
    return _one_line(str(msg if msg is not None else err)), code


def check_wav(data: bytes) -> tuple[float | None, str | None]:
    """Decode a WAV body; (audio seconds, None) if it is 24 kHz mono with non-zero samples, else a reason."""
    import numpy as np
    import soundfile as sf

    try:
        samples, sr = sf.read(io.BytesIO(data), dtype="int16", always_2d=True)
    except Exception as e:
        return None, f"wav does not decode: {_short(e)}"
    frames, channels = samples.shape
    audio_s = frames / sr if sr else None
    if sr != SAMPLE_RATE_HZ:
        return audio_s, f"wav sample rate {sr} Hz, expected {SAMPLE_RATE_HZ}"
    if channels != 1:
        return audio_s, f"wav has {channels} channels, expected mono"
    if frames == 0:
        return 0.0, "wav has no frames"
    if not np.any(samples):
        return audio_s, "silent audio (all samples zero)"
    return audio_s, None


# --- the real transport: geventhttpclient (what Locust's FastHttpUser uses), one keep-alive connection per user ---

class GeventResponse:
    def __init__(self, raw):
        self._raw = raw
        self.status = raw.status_code
        self.headers = {k.lower(): v for k, v in raw.items()}

    def chunks(self) -> Iterator[bytes]:
        """The body as it comes off the socket: each piece is what one socket read delivered (parsed), handed over at
        once. geventhttpclient's read(n) waits until n bytes are buffered, which re-blocked a stream into 64 KiB
        pieces and credited audio to the player late (every Locust run's stalls were overstated); this loop uses
        the pinned 2.6.1 response's own parser state (`_sock`, `feed`, `_body_buffer`, `message_complete`), as
        its read() does, and is tested against a real chunked socket server."""
        raw = self._raw
        while True:
            if raw._body_buffer:
                data = bytes(raw._body_buffer)
                del raw._body_buffer[:]
                yield data
                continue
            if raw.message_complete or raw._sock is None:
                return
            try:
                got = raw._sock.recv(READ_SIZE)
                raw.feed(got)
            except BaseException:
                raw.release()
                raise
            if not got and not raw._body_buffer:
                return  # the peer closed: the caller's byte count and the parser decide what that means

    def close(self) -> None:
        self._raw.release()


class GeventTransport:
    """HTTP/1.1 keep-alive client on gevent sockets; cooperative under Locust, no thread per user."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, connect_timeout_s: float = 10.0,
                 connections: int = 1):
        from geventhttpclient import HTTPClient

        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"host must be http(s)://host[:port], got {base_url!r}")
        self._prefix = u.path.rstrip("/")
        self._client = HTTPClient(
            u.hostname, u.port, ssl=u.scheme == "https", insecure=True, concurrency=connections,
            connection_timeout=connect_timeout_s, network_timeout=timeout_s,
        )

    def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> GeventResponse:
        return GeventResponse(self._client.request("POST", self._prefix + path, body=body, headers=dict(headers)))

    def close(self) -> None:
        self._client.close()


# --- the httpx transport: everything outside Locust's users (preflight, tools) speaks httpx (docs/architecture.md) ---

class HttpxResponse:
    def __init__(self, raw):
        self._raw = raw
        self.status = raw.status_code
        self.headers = {k.lower(): v for k, v in raw.headers.items()}

    def chunks(self) -> Iterator[bytes]:
        # iter_raw: the body bytes as they come off the socket (no decoding: audio is never content-encoded)
        yield from self._raw.iter_raw()

    def close(self) -> None:
        self._raw.close()


class HttpxTransport:
    """A blocking httpx client with the Transport interface: connect failures raise ConnectionError and read
    timeouts TimeoutError, which run_request turns into "connect: ..." and "no response: ..." records."""

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, connect_timeout_s: float = 10.0,
                 httpx_transport=None):
        import httpx

        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"host must be http(s)://host[:port], got {base_url!r}")
        self._httpx = httpx
        self._client = httpx.Client(base_url=base_url.rstrip("/"), transport=httpx_transport,
                                    timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s))

    def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> HttpxResponse:
        httpx = self._httpx
        try:
            request = self._client.build_request("POST", path, content=body, headers=dict(headers))
            return HttpxResponse(self._client.send(request, stream=True))
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:
            raise ConnectionError(str(e) or type(e).__name__) from e
        except httpx.TimeoutException as e:
            raise TimeoutError(str(e) or "timed out") from e

    def close(self) -> None:
        self._client.close()

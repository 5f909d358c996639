"""One TTS request, timed to the last byte and validated. Never raises: every failure is an Outcome with a reason.

The transport is injected (a real HTTP client under Locust, a fake stream in tests) and so is the clock, so the
timing logic is tested with a scripted clock instead of sleeps.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from tts_predictor.domain import BYTES_PER_SAMPLE, SAMPLE_RATE_HZ, SAMPLES_PER_CODEC_FRAME

SPEECH_PATH = "/v1/audio/speech"
READ_SIZE = 64 * 1024
# A response can never be longer than max_new_tokens (4096) codec frames of 1920 samples of PCM16 (~15.7 MB); twice that
# bounds the client's memory when a broken server streams without end.
MAX_RESPONSE_BYTES = 2 * 4096 * SAMPLES_PER_CODEC_FRAME * BYTES_PER_SAMPLE


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
    ok: bool
    error: str | None
    status: int | None
    ttfa_s: float | None
    e2e_s: float | None
    audio_s: float | None
    rtf: float | None
    bytes: int


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
) -> Outcome:
    """POST one speech request. TTFA = first non-empty body chunk; E2E = last byte (not headers)."""
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
        nonzero = False
        parts: list[bytes] = []
        try:
            for chunk in resp.chunks():
                if not chunk:
                    continue
                if ttfa is None:
                    ttfa = clock() - t0
                nbytes += len(chunk)
                if nbytes > max_bytes:
                    return _fail(f"response exceeds {max_bytes} bytes: reading stopped", status, ttfa, clock() - t0,
                                 nbytes)
                if mode == "wav":
                    parts.append(chunk)
                elif not nonzero and chunk.count(0) != len(chunk):
                    nonzero = True
        except Exception as e:
            return _fail(f"stream broken after {nbytes} bytes: {_short(e)}", status, ttfa, clock() - t0, nbytes)
        e2e = clock() - t0
        if "application/json" in ctype or "text/" in ctype:
            return _fail(f"unexpected content-type {ctype!r}", status, ttfa, e2e, nbytes)
        if nbytes == 0:
            return _fail("empty body", status, ttfa, e2e, nbytes)
        if mode == "stream":
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
        return Outcome(True, None, status, ttfa, e2e, audio_s, e2e / audio_s, nbytes)
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
        # read(1) returns as soon as the first body byte has arrived (TTFA); then large reads until the end.
        first = self._raw.read(1)
        if not first:
            return
        yield first
        while True:
            data = self._raw.read(READ_SIZE)
            if not data:
                return
            yield data

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

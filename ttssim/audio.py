"""Deterministic simulated speech: length from the text, samples from the text, never from the variant or timing.

Each 12.5 Hz codec frame is 1920 samples (tts_predictor.domain) of a tone whose pitch is a multiple of 12.5 Hz (so
every frame holds whole periods and frames join without clicks), chosen from the text. Chunks are slices of a small precomputed table, so a
chunk costs a copy, not a synthesis; the same request yields the same bytes under every variant.
"""

from __future__ import annotations

import base64
import hashlib
import io
import math

import numpy as np
import soundfile as sf

from .config import AudioConfig

_TABLE_SIZE = 64
_AMPLITUDE = 0.3


class Voice:
    """Frame table and length rule for one audio config."""

    def __init__(self, cfg: AudioConfig):
        self.cfg = cfg
        spf = cfg.samples_per_frame
        t = np.arange(spf, dtype=np.float64) / cfg.sample_rate
        ramp = np.minimum(1.0, np.minimum(np.arange(spf), np.arange(spf)[::-1]) / 48.0)  # 2 ms fade, no clicks
        rows = []
        for i in range(_TABLE_SIZE):
            f0 = cfg.frame_rate_hz * (8 + 2 * i)  # 100 Hz .. 1675 Hz, whole periods per frame
            wave = np.sin(2 * np.pi * f0 * t) + 0.4 * np.sin(2 * np.pi * 2 * f0 * t)
            rows.append(np.round(_AMPLITUDE * 32767 / 1.4 * wave * ramp).astype("<i2"))
        self.table = np.stack(rows)

    def num_frames(self, text: str, max_new_tokens: int) -> int:
        """Frames for `text`: frames_per_char per character, at least min_frames, at most max_new_tokens."""
        n = max(self.cfg.min_frames, math.ceil(len(text) * self.cfg.frames_per_char))
        return max(1, min(n, max_new_tokens))

    def frame_index(self, text: str, num_frames: int) -> np.ndarray:
        """Which table row each frame uses: a pure function of the text."""
        # surrogatepass: JSON may carry a lone surrogate ("\ud800"); strict UTF-8 raised and the request got a 500
        raw = text.encode("utf-8", "surrogatepass")
        seed = hashlib.sha256(raw).digest()[0] % _TABLE_SIZE
        codes = np.frombuffer(raw or b"\0", dtype=np.uint8).astype(np.int64)
        k = np.arange(num_frames, dtype=np.int64)
        return (codes[k % codes.size] * 7 + k * 5 + seed) % _TABLE_SIZE

    def pcm(self, rows: np.ndarray) -> bytes:
        """PCM16 little-endian bytes of the given frames."""
        return self.table[rows].tobytes()


def encode(pcm: bytes, sample_rate: int, response_format: str, speed: float = 1.0) -> tuple[bytes, str]:
    """Whole-response encoding like vllm-omni's create_audio (soundfile). `speed` resamples (pitch changes: simulated)."""
    samples = np.frombuffer(pcm, dtype="<i2")
    if speed != 1.0 and samples.size:
        n = max(1, int(round(samples.size / speed)))
        samples = np.interp(np.linspace(0, samples.size - 1, n), np.arange(samples.size), samples).astype("<i2")
    formats = {
        "wav": ("WAV", "audio/wav", {"subtype": "PCM_16"}),
        "pcm": ("RAW", "audio/pcm", {"subtype": "PCM_16"}),
        "flac": ("FLAC", "audio/flac", {}),
        "mp3": ("MP3", "audio/mpeg", {}),
        "opus": ("OGG", "audio/ogg", {"subtype": "OPUS"}),
    }
    if response_format not in formats:
        raise ValueError(f"response_format '{response_format}' is not supported by this server's libsndfile")
    fmt, media, kw = formats[response_format]
    if response_format == "opus":  # libopus supports 48 kHz and a few others, not 24 kHz in every build: resample
        samples, sample_rate = np.repeat(samples, 2), sample_rate * 2
    with io.BytesIO() as buf:
        sf.write(buf, samples, sample_rate, format=fmt, **kw)
        return buf.getvalue(), media


def decode_data_uri(uri: str, max_seconds: float) -> tuple[int, int]:
    """Decode a `data:` ref_audio like vllm-omni does (base64 after the comma, then soundfile).

    Returns (frames, sample_rate). Raises ValueError with a client-facing reason.
    """
    # as vllm-omni 0.16.0: everything after the first comma (the whole URI when there is none; the media type is not
    # looked at), decoded leniently (characters outside the base64 alphabet, line breaks included, are skipped)
    payload = uri.split(",", 1)[1] if "," in uri else uri
    try:
        raw = base64.b64decode(payload)
    except (ValueError, TypeError) as e:
        raise ValueError(f"ref_audio is not valid base64: {e}") from None
    try:
        info = sf.info(io.BytesIO(raw))
        data, sr = sf.read(io.BytesIO(raw), dtype="float32", always_2d=False)
    except Exception as e:  # libsndfile reports every unreadable input as a RuntimeError subclass
        raise ValueError(f"ref_audio could not be decoded as audio: {e}") from None
    if info.frames == 0 or sr <= 0:
        raise ValueError("ref_audio contains no samples")
    if info.frames / sr > max_seconds:
        raise ValueError(f"ref_audio is {info.frames / sr:.1f} s long; at most {max_seconds:g} s are accepted")
    return int(np.asarray(data).shape[0]), int(sr)

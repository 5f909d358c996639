"""Fault injection: deterministic, counter-based triggers so a test knows exactly which request fails.

Speech requests are numbered 1, 2, ... in arrival order (after validation). Kinds:
- kill_after_steps N: the engine SIGKILLs its own process in the middle of step N (ttssim.engine).
- hang_after_requests N: from speech request N+1 on, every endpoint (health and metrics too) accepts the connection
  and the request, then never answers; so does the request that trips it. N=0: hung from the start.
- error_burst {after, length, status, every}: requests after+1 .. after+length get `status` (5xx) with a JSON error;
  with every > 0 the burst repeats every `every` requests.
- cut_stream_every k: every k-th streaming request has its connection aborted right after the first chunk.
- malformed_audio_every k: every k-th request gets a WAV with a broken header, or a PCM stream one byte short
  (an odd byte count).
- slow_readiness_s: the port is bound only after this delay (like a model load), see ttssim.__main__.
"""

from __future__ import annotations

from .config import FaultConfig


class Faults:
    def __init__(self, cfg: FaultConfig):
        self.cfg = cfg
        self.speech_count = 0
        self.stream_count = 0
        self.hung = cfg.hang_after_requests == 0

    def next_speech(self) -> int:
        self.speech_count += 1
        return self.speech_count

    def hanging(self, path: str) -> bool:
        """True once the server has hung; a speech request may trip it."""
        n = self.cfg.hang_after_requests
        if n is None:
            return False
        if not self.hung and path == "/v1/audio/speech" and self.speech_count >= n:
            self.hung = True
        return self.hung

    def burst_status(self, n: int) -> int:
        b = self.cfg.error_burst
        if not b or n <= b["after"]:
            return 0
        k = n - b["after"] - 1
        if b["every"]:
            k %= b["every"]
        return b["status"] if k < b["length"] else 0

    def malformed(self, n: int) -> bool:
        k = self.cfg.malformed_audio_every
        return bool(k) and n % k == 0

    def cut_stream(self) -> bool:
        self.stream_count += 1
        k = self.cfg.cut_stream_every
        return bool(k) and self.stream_count % k == 0

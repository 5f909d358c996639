"""Ready means ready: a server start counts as ready when its stages said they initialised and one real request
succeeded, not when `/health` first answers (vllm-omni's checks nothing, and a start-up timeout only warns).

    probe = make_probe(model, kind)                 # one short sentence of the corpus, WAV and stream bodies
    detail = confirm_ready(server, probe, timeout_s) # after ServerProcess.wait_ready; ServerError when not ready
    prime(url, probe, n)                            # n concurrent untimed requests (preflight)

The A/B runner and preflight both use these, so a start that preflight passes is one the runner accepts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from loadtest import engine_log
from loadtest.client import HttpxTransport, Outcome, run_request
from loadtest.prompts import load_corpus, load_voice, speech_payload
from loadtest.server_process import ROOT, ServerError, ServerProcess

CORPUS = "configs/prompts/en.yaml"
VOICE = "configs/voices/ref.yaml"
REQUEST_TIMEOUT_S = 120.0  # one short sentence; a real server answers in seconds once it is ready
LOG_CHARS = 4_000_000


@dataclass(frozen=True)
class Probe:
    """The one request a readiness check or a preflight sends, in both modes."""

    text: str
    expected_s: tuple[float, float]
    bodies: dict[str, bytes]
    kind: str = "base"


def make_probe(model: str, kind: str = "base") -> Probe:
    corpus = load_corpus(ROOT / CORPUS)
    voice = load_voice(ROOT / VOICE)
    prompt = max(corpus.buckets["short"], key=lambda p: len(p.text))  # short, but a few dozen talker steps
    bodies = {mode: json.dumps(speech_payload(prompt.text, voice, model=model, language=corpus.language, mode=mode,
                                              kind=kind)).encode() for mode in ("wav", "stream")}
    return Probe(prompt.text, corpus.bounds.range_for(prompt.text), bodies, kind)


def wait_stages(server: ServerProcess, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> str:
    """The server log's stage line (engine_log.READY); ServerError when it says timeout or dead, or never says."""
    deadline = time.monotonic() + timeout_s
    while True:
        state, line = engine_log.stages_state(server.log_tail(LOG_CHARS))
        if state == "ready":
            return line or ""
        if state in ("dead", "timeout"):
            raise ServerError(f"not ready: the server log says {line!r} (see {server.log_path.name})")
        if not server.alive():
            raise ServerError(f"server exited with code {server.proc.returncode} before its stages initialised "
                              f"(see {server.log_path.name})")
        if time.monotonic() >= deadline:
            raise ServerError(f"not ready: /health answers, but the log shows no stage initialised within "
                              f"{timeout_s:g} s (see {server.log_path.name}; the line is logged at INFO, so "
                              "VLLM_LOGGING_LEVEL must not be above INFO)")
        sleep(0.2)


def confirm_ready(server: ServerProcess, probe: Probe, timeout_s: float,
                  sleep: Callable[[float], None] = time.sleep) -> str:
    """After /health: the stages' line in the log, then one real (WAV) request that succeeds. Returns a one-line
    detail; ServerError (one line) when the start is not ready, e.g. a Base request that fails or kills the engine."""
    t0 = time.monotonic()
    line = wait_stages(server, timeout_s, sleep)
    left = max(1.0, timeout_s - (time.monotonic() - t0))
    transport = HttpxTransport(server.url, timeout_s=min(REQUEST_TIMEOUT_S, left))
    try:
        out = run_request(transport, probe.bodies["wav"], "wav", expected_s=probe.expected_s)
    finally:
        transport.close()
    if not out.ok:
        dead = engine_log.dead_line(server.log_tail(LOG_CHARS))
        raise ServerError(f"not ready: the first real request ({probe.kind}) failed: {out.error}"
                          + (f"; the engine died: {dead!r}" if dead else ""))
    return f"stages initialised ({line[-80:]!r}); one {probe.kind} request answered {out.audio_s:.2f} s of audio"


def prime(url: str, probe: Probe, n: int, mode: str = "stream") -> list[Outcome]:
    """n concurrent untimed requests (the predictor's KV cache, the speech tokenizer and code2wav warm up on their
    first requests; vllm-omni's and sglang-omni's own benchmarks warm up with at least the concurrency)."""
    def one(_):
        transport = HttpxTransport(url, timeout_s=REQUEST_TIMEOUT_S)
        try:
            return run_request(transport, probe.bodies[mode], mode)
        finally:
            transport.close()

    with ThreadPoolExecutor(max_workers=max(1, min(n, 64))) as pool:
        return list(pool.map(one, range(n)))

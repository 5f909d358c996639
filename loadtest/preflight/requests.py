"""The request checks: the Base fallback (the experiment's request kind down REQUEST_KINDS until one answers; a dead
engine stops the server's checks), priming with the first level's concurrency, and one request through the suite's
client whose failure quotes the server's text verbatim."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from loadtest import engine_log
from loadtest.client import HttpxTransport, Outcome, run_request
from loadtest.experiment import Experiment
from loadtest.preflight.report import Report, Shell
from loadtest.prompts import CUSTOM_VOICE_MODEL, REQUEST_KINDS
from loadtest.readiness import REQUEST_TIMEOUT_S, Probe, make_probe, prime
from loadtest.server_process import health

if TYPE_CHECKING:  # serve.py starts the servers and imports this module
    from loadtest.preflight.serve import Server

LOG_READ_CHARS = 4_000_000  # the server log an evidence check reads (its tail, if longer)


# Public reports of Base requests failing on the image the mission uses (docs/sources.md, "Serving").
BASE_REPORTS = ("public reports: Qwen3-TTS *Base* requests fail on the vllm-omni v0.16.0 image / vLLM 0.16.0 "
                "(vllm-omni #2902 \"Unsupported speaker: Vivian\"; vllm-omni #1654 and gpustack #4817: 0.6B/1.7B-Base "
                "fail on vLLM 0.16.0 and work on 0.15.1). Compare the server's message above with those reports; "
                "the server's own log is server-<arm>.log in the preflight folder")


def describe(out: Outcome, mode: str) -> str:
    if mode == "wav":
        return f"WAV decoded: 24 kHz mono, {out.audio_s:.2f} s of audio in {out.e2e_s:.2f} s"
    return (f"PCM stream: {out.audio_s:.2f} s of 24 kHz audio, TTFA {out.ttfa_s:.3f} s, E2E {out.e2e_s:.2f} s, "
            f"{out.chunks} chunks, underrun {out.underrun_s:.3f} s ({'continuous' if out.continuity_ok else 'stalls'})")


KIND_TEXT = {"base": "Base with reference audio + transcript", "base_xvector": "Base with x_vector_only_mode "
             "(speaker embedding, no transcript)", "custom_voice": f"{CUSTOM_VOICE_MODEL} with a built-in speaker"}


def engine_dead(server: Server) -> str | None:
    """Why the server's engine is gone (its log's dead line, or /health no longer answering), None while it lives:
    after a fatal request every later check would fail for the wrong reason."""
    line = engine_log.dead_line(server.process.log_tail(LOG_READ_CHARS))
    if line:
        return f"the server log says {line!r}"
    ok, why = health(server.process.url, 5.0)
    return None if ok else f"/health stopped answering ({why})"


def request_fallback(rep: Report, shell: Shell, exp: Experiment, server: Server | None,
                     name: str) -> Probe | None:
    """The request kinds from the experiment's own (`request:`) down the fallback order (REQUEST_KINDS), one WAV
    request each on this server, until one works: the probe of that kind, or None (nothing works, or the engine
    died: then say so and stop, since every later check would fail for the wrong reason)."""
    kinds = list(REQUEST_KINDS[REQUEST_KINDS.index(exp.request):])
    if shell.dry_run or server is None:
        shell.print_line(f"# {name}: fallback, first that answers: " + " -> ".join(
            f"{k} ({KIND_TEXT[k]})" for k in kinds) + "; a dead engine stops the checks of this server")
        rep.add(name, "skip", "dry run: Base fallback " + " -> ".join(kinds))
        return None
    failures = []
    transport = HttpxTransport(server.process.url, timeout_s=REQUEST_TIMEOUT_S)
    try:
        for kind in kinds:
            if (kind == "custom_voice") != (exp.model == CUSTOM_VOICE_MODEL):
                failures.append(f"{kind}: needs model {CUSTOM_VOICE_MODEL} (another server)")
                continue
            probe = make_probe(exp.model, kind)
            out = run_request(transport, probe.bodies["wav"], "wav", expected_s=probe.expected_s)
            if out.ok:
                if kind == exp.request:
                    rep.add(name, "pass", f"{KIND_TEXT[kind]} works ({describe(out, 'wav')})")
                else:
                    rep.add(name, "pass", f"{KIND_TEXT[kind]} works; the experiment's {exp.request} did not",
                            warning=f"{'; '.join(failures)}. Run with `request: {kind}` in the experiment file")
                return probe
            failures.append(f"{kind}: {out.error}")
            dead = engine_dead(server)
            if dead:
                rep.add(name, "fail", f"the engine died on a {kind} request ({out.error}): {dead}; the checks of "
                        "this server stop here (every later one would fail for the wrong reason)",
                        f"{BASE_REPORTS}. Next in the fallback order: "
                        + (" -> ".join(kinds[kinds.index(kind) + 1:]) or "none")
                        + " (set `request:` in the experiment file and run preflight again)")
                return None
    finally:
        transport.close()
    rep.add(name, "fail", "no request kind works: " + "; ".join(failures),
            f"{BASE_REPORTS}. Last fallback: `request: custom_voice` with model.name {CUSTOM_VOICE_MODEL} (same code "
            "predictor; its own MODEL_REVISION)")
    return None


def prime_check(rep: Report, shell: Shell, server: Server | None, probe: Probe | None, n: int, name: str) -> None:
    """n concurrent untimed requests after ready (and after a switch), as the runner's warm-up phase sends."""
    if shell.dry_run or server is None or probe is None:
        shell.print_line(f"# {name}: {n} concurrent untimed {probe.kind if probe else 'stream'} requests (the first "
                         "level's concurrency) before anything is judged")
        rep.add(name, "skip", f"dry run: priming with {n} concurrent untimed requests" if shell.dry_run
                else "blocked: no working request kind")
        return
    t0 = time.monotonic()
    outs = prime(server.process.url, probe, n)
    ok = sum(o.ok for o in outs)
    detail = f"{ok} of {n} concurrent untimed {probe.kind} requests answered in {time.monotonic() - t0:.1f} s"
    if ok == n:
        rep.add(name, "pass", detail)
    else:
        errs = sorted({o.error for o in outs if not o.ok})[:3]
        rep.add(name, "fail", f"{detail}; errors: {'; '.join(errs)}",
                "a server that fails under its first level's concurrency: read its log (memory, queue limits)")


def request_check(rep: Report, name: str, transport, probe: Probe, mode: str, *, simulated: bool) -> Outcome:
    """One Base request through the suite's client; a failure quotes the server's error text verbatim."""
    out = run_request(transport, probe.bodies[mode], mode, expected_s=probe.expected_s)
    if out.ok:
        rep.add(name, "pass", describe(out, mode))
    else:
        fix = ("the simulator should answer this request: read server-<arm>.log in the preflight folder" if simulated
               else BASE_REPORTS)
        rep.add(name, "fail", f"{mode} request failed: {out.error}", fix)
    return out

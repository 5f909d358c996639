"""vllm-omni 0.30.0, today's release, served for real on this CPU (`make test-real-030`): the same command as
`make serve BACKEND=vllm-cpu VLLM_OMNI=0.30.0` (cpu_server/serve.py --vllm-omni 0.30.0: its own pinned venv, the
tiny model, cpu_server/qwen3_tts_cpu_030.yaml), one server for the module, the stock code predictor (the predictor
plugin targets 0.16.0). Runs only under TTS_TEST_REAL_030=1 (a first run downloads about 4 GB); skipped, with the
reason printed, when the CPU lacks AVX-512."""

from __future__ import annotations

import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from real_gate import require_real_server, serve, wait_healthy

from loadtest.client import HttpxTransport, run_request
from loadtest.readiness import make_probe
from loadtest.scraper import parse_metrics
from loadtest.server_process import ROOT, ServerProcess, ServerSpec, free_port
from tts_predictor import metrics as pm
from tts_predictor.domain import BYTES_PER_SAMPLE, CODEC_FRAME_RATE_HZ, MODEL_NAME, SAMPLES_PER_CODEC_FRAME

require_real_server("TTS_TEST_REAL_030", "make test-real-030")

pytestmark = [pytest.mark.slow, pytest.mark.real, pytest.mark.timeout(1500)]

RELEASE = "0.30.0"
READY_S = 900.0
STOP_WAIT_S = serve.STOP_GRACE_S + 60
# cpu_server/qwen3_tts_cpu_030.yaml: min_tokens 64 with half the codebook as stop ids, max_tokens 128: a request
# ends by a stop id after 64 or a few more codes; 63 frames at the very least, and never the budget
MIN_FRAMES, MAX_FRAMES = 63, 127


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("real030")
    port = free_port()
    cmd = [sys.executable, str(ROOT / "cpu_server" / "serve.py"), "--vllm-omni", RELEASE, "--port", str(port)]
    proc = ServerProcess(ServerSpec(cmd=cmd, env=dict(os.environ), port=port, stop_wait_s=STOP_WAIT_S),
                         folder / "server.log")
    t0 = time.monotonic()
    proc.start()
    proc.tracker = serve.Tracker(proc.proc.pid)
    try:
        wait_healthy(proc, proc.tracker, READY_S, "the 0.30.0 server")
        print(f"\ntest-real-030: server ready in {time.monotonic() - t0:.0f} s (venv, model and start), "
              f"{len(proc.tracker.pids)} processes")
        yield proc
    finally:
        if proc.alive():
            proc.stop(wait_s=STOP_WAIT_S)


def _request(url: str, mode: str):
    transport = HttpxTransport(url, timeout_s=300)
    try:
        return run_request(transport, make_probe(MODEL_NAME).bodies[mode], mode)
    finally:
        transport.close()


def test_the_banner_names_the_release_and_no_variant(server):
    log = server.log_tail(200_000)
    assert serve.banner(RELEASE) in log
    assert "variant none (stock 0.30.0 code predictor, no plugin)" in log


def test_models_lists_the_served_name(server):
    data = httpx.get(f"{server.url}/v1/models", timeout=30).json()
    assert MODEL_NAME in [m["id"] for m in data["data"]]


def test_base_wav_ends_by_a_stop_id_within_its_budget(server):
    """0.30.0 answers a Base request whose talker hit its budget with a 500; the deploy file's stop ids end it."""
    out = _request(server.url, "wav")
    assert out.ok, out.error
    assert MIN_FRAMES / CODEC_FRAME_RATE_HZ <= out.audio_s <= MAX_FRAMES / CODEC_FRAME_RATE_HZ, out.audio_s
    print(f"\ntest-real-030: WAV {out.audio_s:.2f} s of audio in {out.e2e_s:.2f} s")


def test_concurrent_streams_decode_in_whole_codec_frames(server):
    with ThreadPoolExecutor(max_workers=4) as pool:
        outs = list(pool.map(lambda _: _request(server.url, "stream"), range(4)))
    assert all(o.ok for o in outs), [o.error for o in outs]
    for o in outs:
        samples = o.bytes // BYTES_PER_SAMPLE
        assert o.bytes % BYTES_PER_SAMPLE == 0 and samples % SAMPLES_PER_CODEC_FRAME == 0, o.bytes
        assert MIN_FRAMES <= samples // SAMPLES_PER_CODEC_FRAME <= MAX_FRAMES, samples
    print(f"\ntest-real-030: 4 streams at once: {[round(o.audio_s, 2) for o in outs]} s of audio, first audio after "
          f"{[round(o.ttfa_s, 2) for o in outs]} s")


def test_metrics_have_vllm_series_and_no_plugin_counters(server):
    rows = parse_metrics(httpx.get(f"{server.url}/metrics", timeout=30).text)[1]
    names = {n for n, _, _ in rows}
    assert any(n.startswith("vllm:") for n in names), "no vllm:* series on /metrics"
    assert pm.CALLS not in names, "the predictor plugin ran on 0.30.0"


def test_zz_sigterm_leaves_no_process_and_no_shared_memory(server):
    """Last in the module: the stop is the test."""
    server.tracker.sample()
    pids, shm = set(server.tracker.pids), set(server.tracker.shm)
    assert len(pids) > 3
    t0 = time.monotonic()
    os.killpg(server.proc.pid, signal.SIGTERM)
    rc = server.proc.wait(timeout=STOP_WAIT_S)
    print(f"\ntest-real-030: stopped in {time.monotonic() - t0:.1f} s; {len(pids)} processes, "
          f"{len(shm)} /dev/shm segments seen")
    assert rc == 0, server.log_tail(2000)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}") and not serve._zombie(p)]
    assert not alive, alive
    assert not [s for s in shm if (Path("/dev/shm") / s).exists()]

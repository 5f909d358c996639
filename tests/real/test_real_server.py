"""The real vllm-omni 0.16.0 server on this CPU (`make test-real`): one server for the whole module, started once
through the same command as `make serve BACKEND=vllm-cpu` (cpu_server/serve.py), variants switched through the
control file. Runs only under `make test-real` (TTS_TEST_REAL=1: a first run builds a 4 GB venv and the tiny model);
skipped, with the reason printed, when the CPU lacks AVX-512.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from parity_cases import CASES, kills_the_real_engine, on_base, outcome, raw
from real_gate import require_real_server, serve, wait_healthy

from loadtest import engine_log, preflight
from loadtest import experiment as ex
from loadtest.client import HttpxTransport, run_request
from loadtest.prompts import load_corpus, load_voice, speech_payload
from loadtest.readiness import confirm_ready, make_probe, prime
from loadtest.scraper import parse_metrics
from loadtest.server_process import ROOT, ServerError, ServerProcess, ServerSpec, free_port
from tts_predictor import metrics as pm
from tts_predictor.control import write_control
from tts_predictor.domain import BYTES_PER_SAMPLE, CODEC_FRAME_RATE_HZ, MODEL_NAME, SAMPLES_PER_CODEC_FRAME

pytestmark = [pytest.mark.slow, pytest.mark.real, pytest.mark.timeout(1500)]

require_real_server()

READY_S = 900.0
# cpu_server/qwen3_tts_cpu.yaml: the talker's max_tokens = min_tokens (64) sets every request's length; the server
# returns 63 codec frames of audio for it (5.04 s; measured, every request)
AUDIO_FRAMES = 63
STOP_WAIT_S = serve.STOP_GRACE_S + 60
# the parity sweep sends every twelfth case the simulator accepts to the real server (4 of 37; each costs a whole
# generation on this CPU: the sweep took 136-430 s with every third and 309-551 s with every sixth, and the 14 cases
# the simulator refuses on purpose, `stricter`, are generations too, so the real server still accepts 18)
ACCEPTED_EVERY = 12


class Real:
    def __init__(self, proc: ServerProcess, control: Path, log: Path):
        self.proc, self.control, self.log = proc, control, log
        self.tracker: serve.Tracker | None = None
        self.epoch = 1
        corpus = load_corpus(ROOT / "configs/prompts/en.yaml")
        self.voice = load_voice(ROOT / "configs/voices/ref.yaml")
        self.text = corpus.buckets["short"][0].text
        self.language = corpus.language

    @property
    def url(self) -> str:
        return self.proc.url

    def body(self, mode: str, model: str = MODEL_NAME) -> bytes:
        return json.dumps(speech_payload(self.text, self.voice, model=model, language=self.language,
                                         mode=mode)).encode()

    def request(self, mode: str):
        transport = HttpxTransport(self.url, timeout_s=300)
        try:
            return run_request(transport, self.body(mode), mode)
        finally:
            transport.close()

    def metrics(self):
        return parse_metrics(httpx.get(f"{self.url}/metrics", timeout=30).text)[1]

    def switch(self, variant: str, **extra) -> None:
        """Write the control file; the talker worker applies it at its next step, before that step's calls (an idle
        server makes no step, so waiting here for the epoch gauge only ran out its time: 60 s a switch). A test
        checks the epoch after the request that follows."""
        self.epoch += 1
        write_control(self.control, variant, observe=True, epoch=self.epoch, **extra)


def _value(rows, name, **labels):
    vals = [v for n, lab, v in rows if n == name and all(lab.get(k) == x for k, x in labels.items())]
    return max(vals) if vals else None


def _calls_by_variant(rows) -> dict[str, float]:
    out: dict[str, float] = {}
    for n, lab, v in rows:
        if n == pm.CALLS:
            out[lab.get("variant", "")] = out.get(lab.get("variant", ""), 0.0) + v
    return out


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    """The simulator as its own process over HTTP (the engine tier's parity configuration: configs/sim/fast.yaml).
    Started before the real server (which `real` asks for it): the real server's idle workers poll and keep both
    cores busy, and a Python process started beside them can take minutes to import."""
    folder = tmp_path_factory.mktemp("sim")
    port = free_port()
    cmd = [sys.executable, "-m", "ttssim", "--variant", "fixed", "--port", str(port), "--config",
           str(ROOT / "configs" / "sim" / "fast.yaml")]
    proc = ServerProcess(ServerSpec(cmd=cmd, env=dict(os.environ), port=port), folder / "sim.log")
    proc.start()
    try:
        proc.wait_ready(300)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def real(tmp_path_factory, sim):
    folder = tmp_path_factory.mktemp("real")
    control = folder / "control.json"
    write_control(control, "fixed", observe=True, epoch=1)
    port = free_port()
    cmd = [sys.executable, str(ROOT / "cpu_server" / "serve.py"), "--variant", "fixed", "--port", str(port),
           "--control", str(control)]
    proc = ServerProcess(ServerSpec(cmd=cmd, env=dict(os.environ), port=port, stop_wait_s=STOP_WAIT_S),
                         folder / "server.log")
    r = Real(proc, control, folder / "server.log")
    t0 = time.monotonic()
    proc.start()
    r.tracker = serve.Tracker(proc.proc.pid)
    try:
        wait_healthy(proc, r.tracker, READY_S, "the real server")
        print(f"\ntest-real: server ready in {time.monotonic() - t0:.0f} s (venv, model and start), "
              f"{len(r.tracker.pids)} processes, log {r.log}")
        yield r
    finally:
        if proc.alive():
            proc.stop(wait_s=STOP_WAIT_S)


def _answers(url: str, cases, seconds: dict[str, float] | None = None) -> dict[str, dict]:
    """{case id: outcome} over HTTP, four at a time (the real server batches them); each case's wall time goes into
    `seconds` when given (the sweep prints its slowest cases, which is where its time goes)."""
    def one(case):
        headers = {} if case.content_type is None else {"Content-Type": case.content_type}
        t0 = time.monotonic()
        r = httpx.post(f"{url}/v1/audio/speech", content=raw(case), headers=headers, timeout=300)
        if seconds is not None:
            seconds[case.id] = time.monotonic() - t0
        return case.id, outcome(r.status_code, r.headers.get("content-type", ""), r.content)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, cases))


def test_models_lists_the_served_name(real):
    data = httpx.get(f"{real.url}/v1/models", timeout=30).json()
    assert MODEL_NAME in [m["id"] for m in data["data"]]


def test_base_wav_request(real):
    out = real.request("wav")
    assert out.ok, out.error
    assert out.audio_s == pytest.approx(AUDIO_FRAMES / CODEC_FRAME_RATE_HZ, abs=0.01)
    print(f"\ntest-real: WAV {out.audio_s:.2f} s of audio in {out.e2e_s:.2f} s")


def test_stream_decodes_in_whole_codec_frames(real):
    out = real.request("stream")
    assert out.ok, out.error
    samples = out.bytes // BYTES_PER_SAMPLE
    assert out.bytes % BYTES_PER_SAMPLE == 0 and samples % SAMPLES_PER_CODEC_FRAME == 0, out.bytes
    assert samples // SAMPLES_PER_CODEC_FRAME == AUDIO_FRAMES
    print(f"\ntest-real: stream {out.audio_s:.2f} s, first audio after {out.ttfa_s:.2f} s, {out.chunks} chunks")


def test_metrics_have_vllm_series_and_the_plugin_counting_under_fixed(real):
    rows = real.metrics()
    assert any(n.startswith("vllm:") for n, _, _ in rows), "no vllm:* series on /metrics"
    calls = _calls_by_variant(rows)
    assert calls.get("fixed", 0) > 0, calls
    assert calls.get("vectorized", 0) == 0 and calls.get("original", 0) == 0, calls


def test_control_file_moves_the_counting_to_vectorized(real):
    before = _calls_by_variant(real.metrics())
    real.switch("vectorized")
    assert real.request("wav").ok
    after = _calls_by_variant(real.metrics())
    assert after.get("vectorized", 0) > before.get("vectorized", 0), (before, after)
    assert after.get("fixed", 0) == before.get("fixed", 0), (before, after)
    assert _value(real.metrics(), pm.CONTROL_EPOCH) == real.epoch


def _sum(rows, name, **labels):
    return sum(v for n, lab, v in rows if n == name and all(lab.get(k) == x for k, x in labels.items()))


def test_ready_means_the_stages_said_so_and_one_request_answered(real):
    """The runner's and preflight's readiness on the real server: the log's stage line, then one Base request."""
    state, line = engine_log.stages_state(real.proc.log_tail(4_000_000))
    assert state == "ready" and "All stages initialized successfully" in line, (state, line)
    detail = confirm_ready(real.proc, make_probe(MODEL_NAME), timeout_s=300)
    assert detail.startswith("stages initialised") and "one base request answered" in detail, detail
    print(f"\ntest-real: ready: {detail}")


def test_priming_sends_as_many_concurrent_untimed_requests_as_asked(real):
    n = 3
    before = _sum(real.metrics(), pm.CALLS)
    outs = prime(real.url, make_probe(MODEL_NAME), n)
    assert len(outs) == n and all(o.ok for o in outs), [o.error for o in outs]
    assert all(o.audio_s == pytest.approx(AUDIO_FRAMES / CODEC_FRAME_RATE_HZ) for o in outs), [o.audio_s for o in outs]
    assert _sum(real.metrics(), pm.CALLS) > before  # they reached the talker worker's predictor


def test_the_parity_cases_get_the_same_answer_from_the_real_server_and_the_simulator(real, sim):
    """The engine tier's request cases over HTTP to the real server and to the simulator (those the Base server can
    take without losing its engine: parity_cases.on_base); the same accept or refuse, the `stricter` marks checked,
    a refusal's code equal to the simulator's status, and the engine alive at the end."""
    # each case the real server accepts costs a whole generation on this CPU (about 20 s at four at a time), so the
    # one-field bodies of the generated sweep that are valid or null are left to the engine tier, and of the cases the
    # simulator accepts every ACCEPTED_EVERY-th goes to the real server; every case the simulator refuses goes
    cases = [c for c in map(on_base, CASES) if c and not c.id.startswith(("valid-", "null-"))]
    got_sim = _answers(sim.url, cases)
    accepted_by_sim = [c for c in cases if got_sim[c.id]["accept"]]
    cases = [c for c in cases if not got_sim[c.id]["accept"]] + accepted_by_sim[::ACCEPTED_EVERY]
    assert len(cases) >= 60, len(cases)
    took: dict[str, float] = {}
    t0 = time.monotonic()
    got_real = _answers(real.url, cases, took)
    sweep_s = time.monotonic() - t0
    dead = engine_log.dead_line(real.proc.log_tail(4_000_000))
    assert dead is None, f"a parity case killed the real engine: {dead}"
    wrong = []
    for c in cases:
        r, s = got_real[c.id], got_sim[c.id]
        if c.stricter:
            ok = r["accept"] and not s["accept"]
        else:
            ok = r["accept"] == s["accept"] and (r["accept"] or r["error"]["code"] == s["status"])
        if not ok:
            wrong.append(f"{c.id}: real {r['accept']}/{(r['error'] or {}).get('code')} "
                         f"{str((r['error'] or {}).get('message'))[:100]!r}; simulator {s['accept']}/{s['status']}")
    accepted = sum(o["accept"] for o in got_real.values())
    print(f"\ntest-real: {len(cases)} parity cases over HTTP: the real server accepts {accepted}, the simulator "
          f"{sum(o['accept'] for o in got_sim.values())}; {len(wrong)} differ; {sweep_s:.0f} s, slowest "
          + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(took.items(), key=lambda kv: -kv[1])[:5]))
    assert not wrong, "\n".join(wrong)
    assert 15 <= accepted <= len(cases) - 20, accepted  # plenty of both


def test_positive_control_delay_is_applied_counted_and_switched_off(real):
    delay_us = 2000
    real.switch("vectorized", host_delay_us=delay_us)
    before = real.metrics()
    out = real.request("wav")
    after = real.metrics()
    assert out.ok, out.error
    calls = _sum(after, pm.HOST_DELAY_CALLS, variant="vectorized") - _sum(before, pm.HOST_DELAY_CALLS,
                                                                         variant="vectorized")
    secs = _sum(after, pm.HOST_DELAY, variant="vectorized") - _sum(before, pm.HOST_DELAY, variant="vectorized")
    all_calls = _calls_by_variant(after)["vectorized"] - _calls_by_variant(before)["vectorized"]
    assert calls == all_calls > 0, (calls, all_calls)
    assert secs >= calls * delay_us / 1e6 and secs < calls * delay_us / 1e6 * 1.5 + 0.5, (secs, calls)
    assert _value(after, pm.CONTROL_EPOCH) == real.epoch
    print(f"\ntest-real: positive control {delay_us} us x {calls:g} calls = {secs:.2f} s; WAV in {out.e2e_s:.2f} s")
    real.switch("vectorized")  # off again
    mid = real.metrics()
    assert real.request("wav").ok
    assert _value(real.metrics(), pm.CONTROL_EPOCH) == real.epoch
    assert _sum(real.metrics(), pm.HOST_DELAY_CALLS) == _sum(mid, pm.HOST_DELAY_CALLS)


def test_locust_one_level_on_the_real_server_writes_its_load_run_report(real, tmp_path):
    """The README's Locust line against the real CPU server (`-u 1 -t 30s`): one level, records of the variant asked
    (the earlier tests switched variants, so the counters carry several labels and the server reports none), a
    complete manifest naming a server that is not the simulator, the load-run report with its level."""
    real.switch("fixed")
    run = tmp_path / "locust-run"
    p = subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "tts.py"), "--headless",
                        "--host", real.url, "-u", "1", "-t", "30s", "--variant", "fixed", "--run-dir", str(run)],
                       cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "Traceback" not in p.stderr and "one level: 1 user(s)" in p.stderr
    assert re.search(r"^  c=1: [1-9]\d* ok / 0 failed", p.stdout, re.M), p.stdout[-2000:]
    recs = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    assert {r["concurrency"] for r in recs} == {1} and {r["variant"] for r in recs} == {"fixed"}
    assert any(r["ok"] and r["phase"] == "measure" for r in recs)
    man = json.loads((run / "manifest.json").read_text())
    assert man["status"] == "complete" and man["server"]["backend"] != "simulated", man["server"]
    assert man["audio_check"].startswith("off: ") and "tiny" in man["audio_check"]  # 63 frames whatever the text
    html = (run / "index.html").read_text()
    assert "c=1" in html and "req/s" in html and "SIMULATED" not in html
    print(f"\ntest-real: Locust -u 1 -t 30s: {len(recs)} records, {p.stdout.strip().splitlines()[-2]}")


def test_zy_a_fatal_request_kills_the_engine_health_still_answers_and_the_checks_stop(real):
    """Second to last: a CustomVoice request (no task type) on the Base model passes the API's validation, then the
    talker raises and the engine dies (vllm-omni 0.16.0, measured); /health still answers 200. The log says so,
    readiness refuses the start and preflight's request loop stops at its first failure."""
    fatal = {"model": MODEL_NAME, "input": "Hello there."}
    assert kills_the_real_engine(fatal)
    r = httpx.post(f"{real.url}/v1/audio/speech", json=fatal, timeout=120)
    assert not r.headers.get("content-type", "").startswith("audio/"), r.headers
    exp = ex.on_cpu(ex.mission("fixed", "original"))
    server = preflight.Server(arm=exp.arms["A"], process=real.proc, control=real.control, simulated=False)
    deadline = time.monotonic() + 60
    while preflight.engine_dead(server) is None and time.monotonic() < deadline:
        time.sleep(0.5)
    why = preflight.engine_dead(server)
    assert why and why.startswith("the server log says"), why
    assert "Unsupported speaker" in real.proc.log_tail(4_000_000)
    assert httpx.get(f"{real.url}/health", timeout=10).status_code == 200  # /health checks nothing
    with pytest.raises(ServerError, match="not ready: the server log says"):
        confirm_ready(real.proc, make_probe(MODEL_NAME), timeout_s=120)
    lines: list[str] = []
    rep = preflight.Report(print_line=lines.append)
    probe = preflight.request_fallback(rep, preflight.Shell(False, lines.append), exp, server, "request.base")
    assert probe is None
    assert [c.status for c in rep.checks] == ["fail"], rep.checks
    assert "the engine died on a base request" in rep.checks[0].detail and "stop here" in rep.checks[0].detail
    print(f"\ntest-real: dead engine after a CustomVoice request on the Base model: {why}")


def test_zz_sigterm_leaves_no_process_and_no_shared_memory(real):
    """Last in the module: the stop is the test."""
    real.tracker.sample()
    pids, shm = set(real.tracker.pids), set(real.tracker.shm)
    assert len(pids) > 3
    t0 = time.monotonic()
    os.killpg(real.proc.proc.pid, signal.SIGTERM)
    rc = real.proc.proc.wait(timeout=STOP_WAIT_S)
    print(f"\ntest-real: stopped in {time.monotonic() - t0:.1f} s; {len(pids)} processes, "
          f"{len(shm)} /dev/shm segments seen")
    assert rc == 0, real.proc.log_tail(2000)
    alive = [p for p in pids if os.path.exists(f"/proc/{p}") and not serve._zombie(p)]
    assert not alive, alive
    left = [s for s in shm if (Path("/dev/shm") / s).exists()]
    assert not left, left

"""Locust headless through every fault class of the simulator.

Each test runs the real locustfile against a real simulator process with one fault switched on and shows that
failures become records with their reason, that waits are bounded by the configured timeouts, that the run ends by
itself, and that the records written before the fault are all still there, unchanged, as valid JSON lines.
"""

from __future__ import annotations

import collections
import json
import signal
import subprocess
import sys
import time

import httpx
import pytest
from conftest import LOCUST, ROOT, WatchedRun, complete_lines, free_port, intact_lines, write_scenario

from loadtest.scraper import samples
from loadtest.server_process import ServerProcess, ServerSpec
from tools.sim_server import SimServer

pytestmark = pytest.mark.slow  # each test runs Locust against a simulator process


def reasons(recs) -> collections.Counter:
    return collections.Counter(r["error"].split(":")[0] if r["error"] else None for r in recs)


def fault_count(url: str, kind: str) -> float:
    m = samples(httpx.get(url + "/metrics", timeout=5).text)
    return m.get(f'tts_sim_faults_total{{kind="{kind}"}}', 0.0)


def test_killed_mid_step(tmp_path):
    """SIGKILL inside a step: in-flight streams break, later requests cannot connect; all records kept."""
    scen = write_scenario(tmp_path, measure=3.0)
    with SimServer("original", overrides=["faults.kill_after_steps=150"]) as sim:
        run = WatchedRun(sim.url, scen, tmp_path / "run").run(timeout_s=45)
        assert sim.proc.wait(5) == -9
    recs = run.check_kept()
    assert run.returncode == 3  # the run stopped because the server stopped answering (loadtest.breaker)
    man = json.loads((run.run_dir / "manifest.json").read_text())
    assert man["status"] == "failed" and "stopped answering" in man["reason"] and "refused" in man["reason"].lower()
    ok = [r for r in recs if r["ok"]]
    bad = [r for r in recs if not r["ok"]]
    assert ok and bad
    assert max(r["t_start"] for r in ok) < min(r["t_start"] for r in bad if r["error"].startswith("connect"))
    kinds = reasons(bad)
    assert set(kinds) <= {"connect", "stream broken after 0 bytes", "stream broken after 1 bytes"} | {
        k for k in kinds if k.startswith("stream broken after")}, kinds
    assert kinds["connect"] > 0
    # each of the 4 users backs off 0.25 s after a refused connection: at most ~16 records/s, not thousands
    assert kinds["connect"] <= 4 * (4.0 / 0.25 + 2), kinds["connect"]
    assert any("refused" in r["error"].lower() for r in bad)
    end = [c for c in run.run_dir.joinpath("counters.jsonl").read_text().splitlines() if '"edge":"end"' in c]
    assert all('"ok":false' in c and '"error":"' in c for c in end)  # a dead server's scrape is a failed record


def test_hung_server_bounded_by_request_timeout(tmp_path):
    """Accepts, never answers: each request fails after --request-timeout, the run still ends on schedule."""
    scen = write_scenario(tmp_path, measure=3.0, timeout_s=600)  # the scenario would wait 10 min: the flag wins
    with SimServer("fixed", overrides=["faults.hang_after_requests=6"]) as sim:
        run = WatchedRun(sim.url, scen, tmp_path / "run", "--request-timeout", "1.5").run(timeout_s=45)
        assert sim.proc.poll() is None  # still alive, just silent
    recs = run.check_kept()
    assert run.returncode == 3  # 5 requests unanswered, none answered between them: the run stops and says so
    bad = [r for r in recs if not r["ok"]]
    assert bad and all(r["error"].startswith("no response: ") and "timed out" in r["error"] for r in bad), bad[:3]
    assert json.loads((run.run_dir / "manifest.json").read_text())["status"] == "failed"
    # each waited for the 1.5 s flag, never the scenario's 600 s (the upper bound leaves room for a loaded box)
    assert all(1.4 <= r["e2e_s"] <= 15.0 for r in bad), [r["e2e_s"] for r in bad]
    assert sum(r["ok"] for r in recs) <= 6
    man = json.loads((run.run_dir / "manifest.json").read_text())
    assert man["timeout_s"] == 1.5
    # 4.5 s of scenario + a 1.5 s request + a 5 s scrape timeout + Locust start/stop: bounded (WatchedRun's 45 s
    # limit), not the scenario's 600 s


def test_5xx_burst_recorded_with_status_and_reason(tmp_path):
    """Requests 11..30 get an injected 503: exactly those 20 are failed records, with status and message."""
    scen = write_scenario(tmp_path, measure=3.0)
    burst = "faults.error_burst={after: 10, length: 20, status: 503}"
    with SimServer("fixed", overrides=[burst]) as sim:
        run = WatchedRun(sim.url, scen, tmp_path / "run").run(timeout_s=45)
        assert fault_count(sim.url, "error_burst") == 20
    recs = run.check_kept()
    bad = [r for r in recs if not r["ok"]]
    assert len(bad) == 20
    assert all(r["status"] == 503 and r["error"].startswith("http 503") and "injected" in r["error"] for r in bad)
    assert all(r["bytes"] == 0 and r["ttfa_s"] is None for r in bad)
    # the server recovered: requests after the burst succeed again
    assert any(r["ok"] and r["t_start"] > max(b["t_start"] for b in bad) for r in recs)
    stats = (run.run_dir / "locust_failures.csv").read_text()
    assert "http 503" in stats  # Locust's own report shows the reason too


def test_stream_cut_after_first_chunk(tmp_path):
    """Every 3rd stream is aborted after its first chunk: 'stream broken after N bytes', N = one chunk at most."""
    scen = write_scenario(tmp_path, measure=3.0)
    with SimServer("fixed", overrides=["faults.cut_stream_every=3"]) as sim:
        run = WatchedRun(sim.url, scen, tmp_path / "run").run(timeout_s=45)
        cut = fault_count(sim.url, "cut_stream")
    recs = run.check_kept()
    bad = [r for r in recs if not r["ok"]]
    assert bad and all(r["error"].startswith("stream broken after") for r in bad), reasons(bad)
    assert all(r["status"] == 200 and 0 < r["bytes"] <= 25 * 4000 for r in bad)  # one 25-frame chunk = 100 kB
    assert cut - 4 <= len(bad) <= cut  # a request in flight when the run stops is not recorded (at most 4 users)
    assert len(bad) == pytest.approx(len(recs) / 3, abs=5)


@pytest.mark.parametrize("mode,reason", [("stream", "odd PCM byte count"), ("wav", "wav does not decode")])
def test_malformed_audio(tmp_path, mode, reason):
    """A WAV with a broken header or a PCM stream one byte short is a failed record, never a success."""
    scen = write_scenario(tmp_path, measure=3.0)
    with SimServer("fixed", overrides=["faults.malformed_audio_every=4"]) as sim:
        run = WatchedRun(sim.url, scen, tmp_path / "run", "--mode", mode).run(timeout_s=45)
        n = fault_count(sim.url, "malformed_audio")
    recs = run.check_kept()
    bad = [r for r in recs if not r["ok"]]
    assert bad and all(r["error"].startswith(reason) and r["status"] == 200 for r in bad), reasons(bad)
    assert all(r["mode"] == mode for r in recs)
    assert n - 4 <= len(bad) <= n


def slow_sim(delay_s: float, tmp_path) -> ServerProcess:
    """The simulator on a port chosen up front (so Locust can be pointed at it before it listens)."""
    port = free_port()
    cmd = [sys.executable, "-m", "ttssim", "--variant", "fixed", "--port", str(port), "--config",
           str(ROOT / "configs/sim/fast.yaml"), "--set", f"faults.slow_readiness_s={delay_s}"]
    return ServerProcess(ServerSpec(cmd=cmd, port=port, stop_wait_s=10.0), tmp_path / "sim.log")


def test_slow_readiness_waited_for(tmp_path):
    """The port opens late (torch import + 3 s); --ready-timeout waits for /health: the run starts clean."""
    scen = write_scenario(tmp_path, measure=2.0)
    with slow_sim(3, tmp_path) as sim:
        t0 = time.monotonic()
        run = WatchedRun(sim.url, scen, tmp_path / "run", "--ready-timeout", "25").run(timeout_s=50,
                                                                                     fault_seen=lambda: True)
        assert sim.proc.poll() is None
    recs = run.check_kept()
    assert run.returncode == 0, run.output[-2000:]
    assert recs and all(r["ok"] for r in recs)
    assert min(r["t_start"] for r in recs) > time.time() - (time.monotonic() - t0) + 3  # no request before ready


def test_slow_readiness_beyond_the_wait_is_one_clear_error(tmp_path):
    """Server not ready within --ready-timeout: one error line, exit 1, no run folder written."""
    scen = write_scenario(tmp_path, measure=2.0)
    with slow_sim(30, tmp_path) as sim:
        t0 = time.monotonic()
        p = subprocess.run([*LOCUST, "--headless", "--host", sim.url, "--scenario", str(scen), "--run-dir",
                            str(tmp_path / "run"), "--ready-timeout", "1.5"], cwd=ROOT, capture_output=True,
                           text=True, timeout=30)
        took = time.monotonic() - t0
        assert sim.proc.poll() is None
    assert p.returncode == 1
    errors = [line for line in p.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "not ready within 1.5 s" in errors[0] and "refused" in errors[0], p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "run").exists()
    assert 1.4 <= took < 25  # it waited for the flag's 1.5 s, and gave up long before the server's 30 s


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_keeps_every_record(tmp_path, sig):
    """SIGTERM / Ctrl-C in the middle of a measure phase: Locust stops within seconds, writes its manifest, and the
    records file ends on a whole line with everything written before the signal."""
    scen = write_scenario(tmp_path, measure=20.0)
    run_dir = tmp_path / "run"
    with SimServer("fixed") as sim:
        proc = subprocess.Popen([*LOCUST, "--headless", "--host", sim.url, "--scenario", str(scen), "--run-dir",
                                 str(run_dir), "--only-summary"], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 20
            while len(complete_lines(run_dir / "requests.jsonl")) < 20 and time.monotonic() < deadline:
                time.sleep(0.05)
            before = complete_lines(run_dir / "requests.jsonl")
            assert len(before) >= 20
            proc.send_signal(sig)
            t0 = time.monotonic()
            rc = proc.wait(60)
            took = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
    # stops on its own (a hung Locust would run the 20 s measure phase out), and not -15: SIGTERM must not kill Locust
    # before it writes its manifest; the exit code says it was interrupted (128 + the signal)
    assert took < 20 and rc == 128 + sig, rc
    recs = intact_lines(run_dir / "requests.jsonl")
    final = (run_dir / "requests.jsonl").read_text().split("\n")[:-1]
    assert final[: len(before)] == before
    man = json.loads((run_dir / "manifest.json").read_text())
    assert man["requests_lines"] == len(recs) and man["ended"] < time.time() and man["status"] == "interrupted"
    intact_lines(run_dir / "counters.jsonl")

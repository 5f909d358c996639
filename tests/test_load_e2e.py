"""End to end: `locust -f loadtest/tts.py` headless against the simulator (and the fixed-latency fake server),
locally and as one master + two workers on loopback. Every port is picked by the OS."""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.records import read_jsonl, read_requests

ROOT = Path(__file__).resolve().parents[1]
LOCUST = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "tts.py")]

try:
    from ttssim.testing import SimServer
except Exception:  # the simulator is another package of the repo; without it only the fake-server tests run
    SimServer = None
needs_sim = pytest.mark.skipif(SimServer is None, reason="ttssim not importable")


def write_scenario(tmp_path, steps=(4, 8), warmup=1, measure=3, drain=1, **extra) -> Path:
    doc = {"schema": "tts-scenario/1", "name": "e2e", "seed": 5, "mix": {"short": 3, "medium": 1, "long": 0},
           "timeout_s": 30, "phases": {"warmup_s": warmup, "measure_s": measure, "drain_s": drain},
           "steps": list(steps), **extra}
    p = tmp_path / "scenario.yaml"
    p.write_text(json.dumps(doc))  # JSON is YAML
    return p


class FakeServer:
    def __init__(self, *args):
        self.proc = subprocess.Popen([sys.executable, "-m", "loadtest.fakeserver", "--port", "0", *args], cwd=ROOT,
                                     stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{json.loads(self.proc.stdout.readline())['port']}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:  # Locust's master needs a number its workers can be told; ask the OS for one
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def locust(args, timeout=60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*LOCUST, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)


def check_run(run_dir: Path, concurrencies, variant=None):
    recs = read_requests(run_dir / "requests.jsonl")
    assert recs, "no records"
    assert {r.phase for r in recs} == {"warmup", "measure", "drain"}
    meas = [r for r in recs if r.phase == "measure"]
    assert {r.concurrency for r in meas} == set(concurrencies)
    bad = [r.error for r in recs if not r.ok]
    assert not bad, bad[:5]
    for r in recs:
        assert r.mode == "stream" and r.status == 200 and r.variant == variant
        assert 0 < r.ttfa_s <= r.e2e_s and r.audio_s == pytest.approx(r.bytes / 48000)
        assert r.rtf == pytest.approx(r.e2e_s / r.audio_s) and r.bucket in ("short", "medium")
    man = json.loads((run_dir / "manifest.json").read_text())
    assert man["schema"] == "tts-run/1" and man["run_id"] == run_dir.name and man["requests_lines"] == len(recs)
    return recs, man


@needs_sim
def test_headless_against_the_simulator(tmp_path):
    scen = write_scenario(tmp_path)
    run_dir = tmp_path / "run"
    with SimServer("fixed") as sim:
        p = locust(["--headless", "--host", sim.url, "--scenario", str(scen), "--run-dir", str(run_dir),
                    "--variant", "fixed", "--csv", str(run_dir / "locust")])
    assert p.returncode == 0, p.stderr[-3000:]
    recs, man = check_run(run_dir, [4, 8], variant="fixed")
    counters = read_jsonl(run_dir / "counters.jsonl")
    snaps = [c for c in counters if c["kind"] == "snapshot"]
    deltas = [c for c in counters if c["kind"] == "delta"]
    assert [(s["step"], s["edge"]) for s in snaps] == [(0, "start"), (0, "end"), (1, "start"), (1, "end")]
    assert all(s["ok"] and s["samples"] for s in snaps)
    assert [d["concurrency"] for d in deltas] == [4, 8]
    for d in deltas:
        assert d["schema"] == "tts-counters/1" and d["variant"] == "fixed" and d["syncs_per_call"] == 5
        assert d["syncs_per_step"] == pytest.approx(75) and 2.5 < d["duration_s"] < 4.5 and d["requests_finished"] > 0
    with open(run_dir / "locust_stats.csv") as f:
        rows = {(r["Type"], r["Name"]) for r in csv.DictReader(f)}
    assert {("SPEECH", "stream c=4"), ("TTFA", "stream c=4"), ("SPEECH", "stream c=8")} <= rows


def test_same_seed_same_prompt_sequence_and_errors_become_records(tmp_path):
    """Against the fake server; the second run uses a dead metrics URL: the scrape fails, the run does not."""
    scen = write_scenario(tmp_path, steps=(4,), warmup=0.5, measure=2.5, drain=0.5)
    runs = []
    with FakeServer("--ttfa-s", "0.02", "--chunk-s", "0.004") as srv:
        for i, extra in enumerate(([], ["--metrics-url", f"http://127.0.0.1:{free_port()}/metrics"])):
            run_dir = tmp_path / f"run{i}"
            p = locust(["--headless", "--host", srv.url, "--scenario", str(scen), "--run-dir", str(run_dir), *extra])
            assert p.returncode == 0, p.stderr[-3000:]
            runs.append(check_run(run_dir, [4])[0])
    # compare by draw index: requests still in flight when the run stops are not recorded, so the
    # records' order in time can have gaps that differ between the two runs
    seqs = [{r.seq: r.prompt_id for r in rs} for rs in runs]
    common = sorted(set(seqs[0]) & set(seqs[1]))
    assert len(common) > 50 and common[0] == 0 and None not in common
    assert [seqs[0][k] for k in common] == [seqs[1][k] for k in common]
    assert len(set(seqs[0].values())) > 5  # a real mix, not one prompt repeated
    failed = [c for c in read_jsonl(tmp_path / "run1" / "counters.jsonl") if c["kind"] == "snapshot"]
    assert failed and not any(c["ok"] for c in failed) and all(c["error"] for c in failed)


def test_bad_scenario_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("phases: {warmup_s: 1, measure_s: 1, drain_s: 1}\nsteps: [{concurrency: -3}]\n")
    p = locust(["--headless", "--host", "http://127.0.0.1:9", "--scenario", str(bad), "--run-dir",
                str(tmp_path / "r")], timeout=30)
    assert p.returncode != 0
    assert "steps[0].concurrency must be >= 1" in p.stderr and str(bad) in p.stderr
    assert "Traceback" not in p.stderr


@needs_sim
def test_distributed_master_and_two_workers_merge_complete_records(tmp_path):
    scen = write_scenario(tmp_path, steps=(4, 8), warmup=1, measure=2, drain=1)
    run_dir = tmp_path / "run"
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with SimServer("fixed") as sim:
        master = subprocess.Popen(
            [*LOCUST, "--master", "--headless", "--expect-workers", "2", "--master-bind-host", "127.0.0.1",
             "--master-bind-port", str(port), "--host", sim.url, "--scenario", str(scen), "--run-dir", str(run_dir),
             "--variant", "fixed"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        workers = [subprocess.Popen([*LOCUST, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port)],
                                    cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for _ in range(2)]
        try:
            _, err = master.communicate(timeout=60)
            for w in workers:
                w.wait(timeout=20)
        finally:
            for proc in (master, *workers):
                if proc.poll() is None:
                    proc.kill()
    assert master.returncode == 0, err[-3000:]
    recs, man = check_run(run_dir, [4, 8], variant="fixed")
    per_worker = {p.name.split(".")[0]: read_requests(p) for p in (run_dir / "workers").glob("*.requests.jsonl")}
    assert set(per_worker) == {"w0", "w1"}
    assert sorted(r.worker for r in recs) == sorted(r.worker for rs in per_worker.values() for r in rs)
    assert sorted(recs, key=lambda r: (r.worker, r.t_start)) == sorted(
        [r for rs in per_worker.values() for r in rs], key=lambda r: (r.worker, r.t_start))
    assert man["role"] == "distributed" and len(man["workers"]) == 2
    assert all(w["final"] and w["received"] == w["sent"] > 0 for w in man["workers"].values())
    # both workers ran users at each level (8 users over 2 workers: 4 each) and the phases reached them
    for c in (4, 8):
        assert {r.worker for r in recs if r.phase == "measure" and r.concurrency == c} == {"w0", "w1"}
    assert len([c for c in read_jsonl(run_dir / "counters.jsonl") if c["kind"] == "delta"]) == 2

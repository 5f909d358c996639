"""End to end: `locust -f loadtest/tts.py` headless against the simulator (and the fixed-latency fake server),
locally and as one master + two workers on loopback. Every port is picked by the OS."""

from __future__ import annotations

import csv
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import pytest
from conftest import LOCUST, ROOT, FakeServer, free_port, locust, write_scenario

from loadtest.scenario import effective_scenario
from tools.sim_server import SimServer
from ttsrecords.records import CUT_AT_LEVEL_END, read_jsonl, read_requests

pytestmark = pytest.mark.slow  # Locust and a server, each in its own process


def scenario(tmp_path, steps=(4, 8), warmup=1, measure=3, drain=1, **extra):
    return write_scenario(tmp_path, steps=steps, warmup=warmup, measure=measure, drain=drain, name="e2e", seed=5,
                          **extra)


def counters(run_dir):
    rows, notes = read_jsonl(run_dir / "counters.jsonl")
    assert not notes
    return rows


def check_run(run_dir: Path, concurrencies, variant=None):
    recs = read_requests(run_dir / "requests.jsonl")
    assert recs, "no records"
    assert {r.phase for r in recs} == {"warmup", "measure", "drain"}
    meas = [r for r in recs if r.phase == "measure"]
    assert {r.concurrency for r in meas} == set(concurrencies)
    bad = [r.error for r in recs if not r.ok and r.error != CUT_AT_LEVEL_END]
    assert not bad, bad[:5]
    for r in (r for r in recs if r.error != CUT_AT_LEVEL_END):
        assert r.mode == "stream" and r.status == 200 and r.variant == variant
        assert 0 < r.ttfa_s <= r.e2e_s and r.audio_s == pytest.approx(r.bytes / 48000)
        assert r.rtf == pytest.approx(r.e2e_s / r.audio_s) and r.bucket in ("short", "medium")
    man = json.loads((run_dir / "manifest.json").read_text())
    assert man["schema"] == "tts-run/2" and man["run_id"] == run_dir.name and man["requests_lines"] == len(recs)
    return recs, man


def test_headless_against_the_simulator(tmp_path):
    scen = scenario(tmp_path)
    run_dir = tmp_path / "run"
    with SimServer("fixed") as sim:
        p = locust(["--headless", "--host", sim.url, "--scenario", str(scen), "--run-dir", str(run_dir),
                    "--variant", "fixed", "--csv", str(run_dir / "locust")])
    assert p.returncode == 0, p.stderr[-3000:]
    recs, man = check_run(run_dir, [4, 8], variant="fixed")
    rows = counters(run_dir)
    snaps = [c for c in rows if c["kind"] == "snapshot"]
    deltas = [c for c in rows if c["kind"] == "delta"]
    assert [(s["step"], s["edge"]) for s in snaps] == [(0, "start"), (0, "end"), (1, "start"), (1, "end")]
    assert all(s["ok"] and s["samples"] for s in snaps)
    assert [d["concurrency"] for d in deltas] == [4, 8]
    for d in deltas:
        assert d["schema"] == "tts-counters/2" and d["window"] == "measure" and d["variant"] == "fixed" and d["syncs_per_call"] == 5
        assert d["syncs_per_step"] == pytest.approx(75) and d["requests_finished"] > 0
        # the 3 s measure window, between two scrapes that the shape's 1 s tick places (generous for a loaded box)
        assert 1.0 < d["duration_s"] < 10.0
    with open(run_dir / "locust_stats.csv") as f:
        rows = {(r["Type"], r["Name"]) for r in csv.DictReader(f)}
    assert {("SPEECH", "stream c=4"), ("SPEECH", "stream c=8")} <= rows
    assert not any(kind == "TTFA" for kind, _ in rows)  # one entry per request: TTFA is in the records, not a request


def test_same_seed_same_prompt_sequence_and_errors_become_records(tmp_path):
    """Against the fake server; the second run uses a dead metrics URL: the scrape fails, the run does not."""
    scen = scenario(tmp_path, steps=(4,), warmup=0.5, measure=2.5, drain=0.5)
    runs = []
    with FakeServer("--ttfa-s", "0.02", "--chunk-s", "0.004", tmp=tmp_path) as srv:
        for i, extra in enumerate(([], ["--metrics-url", f"http://127.0.0.1:{free_port()}/metrics"])):
            run_dir = tmp_path / f"run{i}"
            p = locust(["--headless", "--host", srv.url, "--scenario", str(scen), "--run-dir", str(run_dir), *extra])
            assert p.returncode == 0, p.stderr[-3000:]
            runs.append(check_run(run_dir, [4])[0])
    # compare by draw index within each stream: the warm-up's from the first draw, the measure stream's (the session
    # restarts it at the measure edge, drain included) from its first draw, since how many prompts the warm-up drew
    # depends on timing; requests still in flight when the run stops are not recorded, so either stream can have
    # gaps that differ between the two runs
    def streams(rs):
        first = min(r.seq for r in rs if r.phase == "measure")
        return ({r.seq: r.prompt_id for r in rs if r.phase == "warmup"},
                {r.seq - first: r.prompt_id for r in rs if r.phase in ("measure", "drain")})

    (warm0, meas0), (warm1, meas1) = (streams(rs) for rs in runs)
    for a, b in ((warm0, warm1), (meas0, meas1)):
        common = sorted(set(a) & set(b))
        assert common and common[0] == 0 and None not in common
        assert [a[k] for k in common] == [b[k] for k in common]
    assert len(set(meas0) & set(meas1)) > 30
    assert len(set(meas0.values())) > 5  # a real mix, not one prompt repeated
    failed = [c for c in counters(tmp_path / "run1") if c["kind"] == "snapshot"]
    assert failed and not any(c["ok"] for c in failed) and all(c["error"] for c in failed)


def test_bad_scenario_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("phases: {warmup_s: 1, measure_s: 1, drain_s: 1}\nsteps: [{concurrency: -3}]\n")
    p = locust(["--headless", "--host", "http://127.0.0.1:9", "--scenario", str(bad), "--run-dir",
                str(tmp_path / "r")], timeout=30)
    assert p.returncode != 0
    assert "steps[0].concurrency must be >= 1" in p.stderr and str(bad) in p.stderr
    assert "Traceback" not in p.stderr


def test_distributed_master_and_two_workers_merge_complete_records(tmp_path):
    scen = scenario(tmp_path, steps=(4, 8), warmup=1, measure=2, drain=1)
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
    assert len([c for c in counters(run_dir) if c["kind"] == "delta"]) == 2


def test_open_loop_poisson_against_the_simulator(tmp_path):
    """configs/scenarios/open-poisson.yaml, shortened: arrivals come at the step's rate whatever the server does, a
    roomy cap never drops, a cap of one in flight turns arrivals beyond it into 'dropped' failure records."""
    scen = effective_scenario(
        ROOT / "configs/scenarios/open-poisson.yaml", tmp_path / "open.yaml",
        {"warmup_s": 1, "measure_s": 8, "drain_s": 1}, None,
        ["steps=[{concurrency: 64, rate: 5}, {concurrency: 1, rate: 20, users: 4}]", "mix={short: 1}"])
    run_dir = tmp_path / "run"
    with SimServer("fixed") as sim:
        p = locust(["--headless", "--host", sim.url, "--scenario", str(scen), "--run-dir", str(run_dir),
                    "--variant", "fixed", "--only-summary"], timeout=120)
    assert p.returncode in (0, 1), p.stderr[-3000:]  # 1: the dropped arrivals are failed requests
    recs = read_requests(run_dir / "requests.jsonl")
    man = json.loads((run_dir / "manifest.json").read_text())
    assert man["scenario"]["loop"] == "open" and man["requests_lines"] == len(recs)
    by_step = {c: [r for r in recs if r.concurrency == c] for c in (64, 1)}

    roomy = by_step[64]
    assert roomy and all(r.ok for r in roomy), [r.error for r in roomy if not r.ok][:3]
    measure = [r for r in roomy if r.phase == "measure"]
    # Poisson arrivals at 5/s over 8 s: 40 expected (sd 6.3); the bounds are 4 sd wide
    assert 15 <= len(measure) <= 65, len(measure)
    starts = sorted(r.t_start for r in roomy)
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert 0.5 < cv < 1.6, cv  # exponential gaps (coefficient of variation 1), not a closed loop's regular beat

    capped = by_step[1]
    # a request that started in the drain is cut when the level ends: its own record kind, neither dropped nor served
    dropped = [r for r in capped if not r.ok and r.error != CUT_AT_LEVEL_END]
    assert dropped and all(r.error == "dropped: 1 requests already in flight in this process" for r in dropped)
    assert all(r.prompt_id == "-" and r.status is None and r.bytes == 0 for r in dropped)
    served = [r for r in capped if r.ok]
    assert served  # the cap admits one at a time
    assert len([r for r in capped if r.phase == "measure"]) > len([r for r in served if r.phase == "measure"])
    deltas = [c for c in counters(run_dir) if c["kind"] == "delta"]
    assert [d["concurrency"] for d in deltas] == [64, 1] and all(d["variant"] == "fixed" for d in deltas)



def test_drain_requests_end_with_their_level_and_measured_ones_finish(tmp_path):
    """The drain keeps a level's load while its measured requests finish; a request that STARTED in the drain is
    stopped when the level ends (recorded as cut, no failure), so it does not run into the next level's warm-up and
    measure phase. Default profile: requests of 2-9 s against a 2 s drain."""
    scen = scenario(tmp_path, steps=(8, 4), warmup=2, measure=3, drain=2)
    run_dir = tmp_path / "run"
    with SimServer("fixed", config="configs/sim/default.yaml") as sim:
        p = locust(["--headless", "--host", sim.url, "--scenario", str(scen), "--run-dir", str(run_dir),
                    "--variant", "fixed", "--csv", str(run_dir / "locust")])
    assert p.returncode == 0, p.stderr[-3000:]
    recs = read_requests(run_dir / "requests.jsonl")
    cut = [r for r in recs if r.error == CUT_AT_LEVEL_END]
    assert cut and all(r.phase == "drain" and r.status == 200 for r in cut)
    assert all(r.ok for r in recs if r.phase == "measure")  # a measured request always runs to its end
    edges = {c["step"]: c["t"] for c in counters(run_dir) if c["kind"] == "snapshot" and c["edge"] == "end"}
    for r in cut:  # stopped within a chunk interval (about 2 s of audio at c=8) of its level's end: measure end + drain
        assert r.t_start + r.e2e_s < edges[r.step] + 2.0 + 3.5, (r.t_start, r.e2e_s, edges[r.step])
    with open(run_dir / "locust_stats.csv") as f:
        assert not any("(drain)" in row["Name"] and int(row["Failure Count"]) for row in csv.DictReader(f))

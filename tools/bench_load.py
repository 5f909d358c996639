"""Overhead of the load generator: one Locust process against the fixed-latency fake server.

Every request has a known nominal duration (first chunk after ttfa_s, then one chunk every chunk_s), so the
client-observed e2e minus nominal bounds what the client adds (it also contains the loopback and the fake
server's own scheduling lag, which the server reports separately). CPU share = CPU seconds of the Locust
process / wall seconds of its run (1.0 = one core saturated; gevent runs on one core).

    python -m tools.bench_load [--levels 64,128,256,512] [--out reports/bench/loadgen.md]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from loadtest.server_process import ROOT, ServerProcess, ServerSpec
from ttsrecords.records import SCENARIO_SCHEMA, read_requests


def pin(cpu: int) -> list[str]:
    """Server and Locust on different cores where taskset exists, so they do not queue behind each other."""
    return ["taskset", "-c", str(cpu)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def start_server(ttfa_s: float, chunk_s: float, chunks: int, tmp: Path) -> ServerProcess:
    port_file = tmp / f"fake-{ttfa_s}-{chunk_s}-{chunks}.port"
    port_file.unlink(missing_ok=True)
    cmd = [*pin(0), sys.executable, "-m", "tools.fakeserver", "--port", "0", "--port-file", str(port_file),
           "--ttfa-s", str(ttfa_s), "--chunk-s", str(chunk_s), "--chunks", str(chunks)]
    srv = ServerProcess(ServerSpec(cmd=cmd, port_file=port_file, stop_wait_s=10.0), tmp / "fakeserver.log").start()
    srv.wait_ready(30)
    return srv


def one_level(conc: int, ttfa_s: float, chunk_s: float, chunks: int, warmup: float, measure: float,
              tmp: Path) -> dict:
    nominal = ttfa_s + (chunks - 1) * chunk_s
    scen = tmp / f"bench-{conc}.yaml"
    scen.write_text(json.dumps({
        "schema": SCENARIO_SCHEMA, "name": f"bench-{conc}", "seed": 1, "mix": {"short": 1}, "timeout_s": 60,
        "phases": {"warmup_s": warmup, "measure_s": measure, "drain_s": 1}, "steps": [conc]}))
    run_dir = tmp / f"run-{conc}-{ttfa_s}"
    srv = start_server(ttfa_s, chunk_s, chunks, tmp)
    url = srv.url
    try:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        lag_file = tmp / f"lag-{conc}-{ttfa_s}.txt"
        env = {**os.environ, "TTS_LOADGEN_LAG_FILE": str(lag_file)}
        p = subprocess.run([*pin(1), sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest/tts.py"), "--headless",
                            "--host", url, "--scenario", str(scen), "--run-dir", str(run_dir), "--metrics-url",
                            "none", "--loglevel", "WARNING"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                           env=env)
        wall = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        stats = httpx.get(url + "/stats", timeout=5).json()
    finally:
        srv.stop()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    every = read_requests(run_dir / "requests.jsonl")
    n_all = len(every)
    recs = [r for r in every if r.phase == "measure"]
    ok = [r for r in recs if r.ok]
    excess = np.array([r.e2e_s - nominal for r in ok]) * 1000
    ttfa_excess = np.array([r.ttfa_s - ttfa_s for r in ok]) * 1000
    lo, hi = min(r.t_start for r in recs), max(r.t_start for r in recs)
    lags = np.array([float(a) for a, t in (ln.split() for ln in lag_file.read_text().splitlines())
                     if lo <= float(t) <= hi]) * 1000
    rate = len(recs) / measure
    return {
        "concurrency": conc, "nominal_ms": nominal * 1000, "locust_rc": p.returncode, "requests": len(recs),
        "failed": len(recs) - len(ok), "req_per_s": rate, "ideal_req_per_s": conc / nominal,
        "excess_p50_ms": float(np.percentile(excess, 50)), "excess_p99_ms": float(np.percentile(excess, 99)),
        "excess_max_ms": float(excess.max()), "ttfa_excess_p99_ms": float(np.percentile(ttfa_excess, 99)),
        "server_lateness_p50_ms": stats["lateness_p50_s"] * 1000,
        "server_lateness_p99_ms": stats["lateness_p99_s"] * 1000,
        "cpu_share": cpu / wall, "wall_s": wall, "cpu_ms_per_request": cpu * 1000 / max(1, n_all),
        "loop_lag_p50_ms": float(np.percentile(lags, 50)), "loop_lag_p99_ms": float(np.percentile(lags, 99)),
        "loop_lag_max_ms": float(lags.max()),
    }


def table(rows: list[dict]) -> str:
    head = ("| users | nominal e2e ms | req/s (ideal) | failed | **client loop lag p50 / p99 / max ms** | "
            "observed e2e excess p50 / p99 / max ms | TTFA excess p99 ms | fake-server own lateness p50 / p99 ms | "
            "Locust CPU share | CPU ms / request |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {r['nominal_ms']:.0f} | {r['req_per_s']:.1f} ({r['ideal_req_per_s']:.1f}) | "
            f"{r['failed']} | {r['loop_lag_p50_ms']:.2f} / {r['loop_lag_p99_ms']:.2f} / {r['loop_lag_max_ms']:.2f} | "
            f"{r['excess_p50_ms']:.2f} / {r['excess_p99_ms']:.2f} / {r['excess_max_ms']:.2f} | "
            f"{r['ttfa_excess_p99_ms']:.2f} | {r['server_lateness_p50_ms']:.2f} / {r['server_lateness_p99_ms']:.2f} | "
            f"{r['cpu_share']:.2f} | {r['cpu_ms_per_request']:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="128,256,512", help="users per run (stress series)")
    ap.add_argument("--measure-s", type=float, default=10.0)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        realistic = [one_level(c, 0.2, 0.2, 10, 3, a.measure_s, tmp) for c in (1, 64, 256)]
        stress = [one_level(int(c), 0.1, 0.1, 4, 3, a.measure_s, tmp) for c in a.levels.split(",")]
    result = {"realistic": realistic, "stress": stress, "cpus": os.cpu_count(), "python": platform.python_version()}
    print(json.dumps(result, indent=1))
    if a.out:
        Path(a.out).write_text(render(result, a))


def render(result: dict, a) -> str:
    return f"""# Load generator overhead (`python -m tools.bench_load`)

Machine: {result['cpus']} CPUs (shared with other work), Python {result['python']}; the fake server and Locust run
on the same machine, so they compete for the same cores. One Locust process (no workers), streaming mode,
closed loop, short prompts, {a.measure_s:.0f} s measure phase after 3 s warm-up.

Method: `tools/fakeserver.py` answers every request with a fixed schedule (first PCM chunk after `ttfa`,
then one 0.5 s chunk every `chunk` seconds), so its nominal e2e is known. *Client-observed excess* = e2e
measured by the client − nominal: an upper bound on what the load generator adds, since it also holds the
loopback and the fake server's own lateness (measured inside the server from handler entry to the last write,
shown separately). CPU share = CPU seconds of the Locust process / its wall seconds (1.00 = one core).

## Target: 256 streaming users, realistic pacing (ttfa 200 ms, 10 chunks 200 ms apart); 1 user = the floor

*Client loop lag* is measured inside the Locust process (TTS_LOADGEN_LAG_FILE): a greenlet sleeps 10 ms
and records how late it wakes up. That is the delay any ready socket read waits before the client handles it,
so it is the client-added latency of the clock stop at the last byte (plus the OS's own scheduling delay,
which the 1-user row shows).

{table(result['realistic'])}

## Where one worker falls behind (ttfa 100 ms, 4 chunks 100 ms apart: 2.5x the request rate per user)

{table(result['stress'])}
"""


if __name__ == "__main__":
    main()

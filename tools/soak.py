"""Soak: the simulator under N streaming users for a long time; no error, bounded memory, monotonic counters.

    python -m tools.soak [--users 256] [--duration-s 600] [--out reports/bench/soak.md]

Starts the simulator (default model config, port 0), runs the real locustfile headless with one closed-loop step,
and every --sample-s seconds samples the simulator's resident memory (/proc/<pid>/status VmRSS) and scrapes its
/metrics. Pass = no failed request, every counter (`_total`, `_count`, `_sum`, `_bucket`) non-decreasing between
scrapes, and RSS growth after the warm-up (max after warm-up minus the first sample after it) within --rss-bound-mib.
Not part of `make test`: it takes as long as --duration-s. Writes a Markdown report and a JSON of the raw samples.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from loadtest.scraper import samples
from loadtest.server_process import ROOT
from tools.sim_server import SimServer
from tts_predictor.domain import VARIANT_NAMES
from tts_predictor.metrics import ENGINE_REQUESTS
from ttsrecords.records import SCENARIO_SCHEMA, read_jsonl

MONOTONIC_SUFFIXES = ("_total", "_count", "_sum", "_bucket")


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def counter_samples(text: str) -> dict[str, float]:
    return {k: v for k, v in samples(text).items() if k.split("{", 1)[0].endswith(MONOTONIC_SUFFIXES)}


def monotonic_violations(prev: dict[str, float], cur: dict[str, float]) -> list[str]:
    """Counters that went down, or vanished, between two scrapes."""
    out = []
    for k, v in prev.items():
        if k not in cur:
            out.append(f"{k} vanished")
        elif cur[k] < v:
            out.append(f"{k}: {v} -> {cur[k]}")
    return out


def rss_growth(samples: list[dict], warmup_s: float) -> tuple[float | None, float | None, float | None]:
    """(first RSS after warm-up, max after warm-up minus it, least-squares slope MiB/min after warm-up)."""
    post = [s for s in samples if s["t"] >= warmup_s and s["sim_rss_mib"] is not None]
    if len(post) < 2:
        return None, None, None
    base = post[0]["sim_rss_mib"]
    growth = max(s["sim_rss_mib"] for s in post) - base
    n = len(post)
    mt = sum(s["t"] for s in post) / n
    mr = sum(s["sim_rss_mib"] for s in post) / n
    var = sum((s["t"] - mt) ** 2 for s in post)
    slope = sum((s["t"] - mt) * (s["sim_rss_mib"] - mr) for s in post) / var * 60.0 if var else 0.0
    return base, growth, slope


class Sampler(threading.Thread):
    def __init__(self, sim_pid: int, metrics_url: str, every_s: float):
        super().__init__(daemon=True)
        self.sim_pid, self.url, self.every = sim_pid, metrics_url, every_s
        self.locust_pid: int | None = None
        self.samples: list[dict] = []
        self.violations: list[str] = []
        self.scrape_errors: list[str] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        prev = None
        while not self.stop.is_set():
            t = time.monotonic() - self.t0
            row = {"t": round(t, 2), "sim_rss_mib": rss_mib(self.sim_pid),
                   "locust_rss_mib": rss_mib(self.locust_pid) if self.locust_pid else None,
                   "loadavg_1m": os.getloadavg()[0]}
            try:
                cur = counter_samples(httpx.get(self.url, timeout=10).text)
                row["counters"] = len(cur)
                row["requests_finished"] = sum(v for k, v in cur.items()
                                               if k.startswith(ENGINE_REQUESTS))
                if prev is not None:
                    self.violations += [f"t={t:.0f}s {v}" for v in monotonic_violations(prev, cur)]
                prev = cur
            except Exception as e:  # recorded: a failed scrape under load is itself a finding
                self.scrape_errors.append(f"t={t:.0f}s {type(e).__name__}: {str(e)[:120]}")
            self.samples.append(row)
            self.stop.wait(self.every)


def write_markdown(path: Path, res: dict) -> None:
    s = res["settings"]
    r = res["requests"]
    lines = [
        "# Soak: the simulator under sustained streaming load",
        "",
        f"`python -m tools.soak --users {s['users']} --duration-s {s['duration_s']:g}` on {res['machine']['when']}.",
        "",
        f"Machine: {res['machine']['cpus']} CPUs shared with other sessions (load average 1 min: mean "
        f"{res['machine']['loadavg_mean']:.1f}, max {res['machine']['loadavg_max']:.1f}), {res['machine']['platform']}. "
        "The simulator, Locust and everything else on the box share those cores, so latencies here say nothing "
        "about a GPU server; the soak checks robustness (errors, memory, counters), not speed.",
        "",
        f"Simulator: `ttssim --variant {s['variant']} --config {s['config']}` (batch up to its max_batch_size, "
        f"port 0). Load: one closed-loop step, {s['users']} streaming users, no think time, scenario mix "
        f"{s['mix']}, warm-up {s['warmup_s']:g} s (RSS baseline taken after it), sampling every {s['sample_s']:g} s.",
        "",
        "## Result: " + ("PASS" if res["pass"] else "FAIL"),
        "",
        "| check | bound | measured | ok |",
        "|---|---|---|---|",
        f"| failed requests | 0 | {r['failed']} of {r['total']} | {'yes' if r['failed'] == 0 else 'no'} |",
        f"| simulator RSS growth after warm-up | <= {s['rss_bound_mib']:g} MiB | "
        f"{_fmt(res['rss']['growth_mib'])} MiB (baseline {_fmt(res['rss']['baseline_mib'])} MiB, max "
        f"{_fmt(res['rss']['max_mib'])} MiB, slope {_fmt(res['rss']['slope_mib_per_min'], 2)} MiB/min) | "
        f"{'yes' if res['rss']['ok'] else 'no'} |",
        f"| counters non-decreasing between scrapes | 0 violations | {len(res['monotonic_violations'])} violations "
        f"over {res['scrapes']} scrapes | {'yes' if not res['monotonic_violations'] else 'no'} |",
        f"| /metrics scrapes failed | reported | {len(res['scrape_errors'])} | - |",
        f"| Locust exit code | 0 | {res['locust_returncode']} | {'yes' if res['locust_returncode'] == 0 else 'no'} |",
        "",
        "## Load",
        "",
        f"- requests recorded: {r['total']} ({r['per_phase']}); finished by the engine: "
        f"{res['engine_requests_finished']}",
        f"- throughput (measure phase): {_fmt(r['rps'], 2)} req/s, {_fmt(r['audio_s_per_s'], 1)} audio-s/s",
        f"- e2e p50 / p99: {_fmt(r['e2e_p50'], 2)} / {_fmt(r['e2e_p99'], 2)} s; TTFA p50 / p99: "
        f"{_fmt(r['ttfa_p50'], 2)} / {_fmt(r['ttfa_p99'], 2)} s",
        f"- Locust process RSS: {_fmt(res['locust_rss_first_mib'])} -> {_fmt(res['locust_rss_last_mib'])} MiB",
        f"- errors by reason: {dict(r['reasons']) or 'none'}",
        "",
        "## Simulator RSS over time (every ~30 s)",
        "",
        "| t (s) | sim RSS (MiB) | Locust RSS (MiB) | engine requests finished | load avg |",
        "|---|---|---|---|---|",
    ]
    last = -1e9
    for row in res["samples"]:
        if row["t"] - last >= 29 or row is res["samples"][-1]:
            lines.append(f"| {row['t']:.0f} | {_fmt(row['sim_rss_mib'])} | {_fmt(row['locust_rss_mib'])} | "
                         f"{_fmt(row.get('requests_finished'), 0)} | {row['loadavg_1m']:.1f} |")
            last = row["t"]
    n = max(1, res["engine_requests_finished"] or r["total"])
    lines += ["", f"Why the bound: the simulator keeps no per-request state after a request ends (queues and batch "
              "slots are freed, Prometheus counters have fixed label sets), so after warm-up its memory should be "
              f"flat. {s['rss_bound_mib']:g} MiB over {n:.0f} finished requests flags a leak of "
              f"{s['rss_bound_mib'] * 1024 / n:.0f} kB or more per request; the measured growth bounds any leak at "
              f"{(res['rss']['growth_mib'] or 0) * 1024 / n:.2f} kB per request in this run. A smaller leak needs a "
              "longer soak (then the RSS slope is the better signal).", ""]
    if res.get("note"):
        lines += [res["note"], ""]
    if res["monotonic_violations"]:
        lines += ["Counter violations (first 20):", ""] + [f"- {v}" for v in res["monotonic_violations"][:20]] + [""]
    if res["scrape_errors"]:
        lines += ["Scrape errors (first 20):", ""] + [f"- {v}" for v in res["scrape_errors"][:20]] + [""]
    path.write_text("\n".join(lines))


def _fmt(x, nd: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{nd}f}"


def _q(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.soak", description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=256)
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--warmup-s", type=float, default=60.0, help="excluded from the RSS baseline")
    p.add_argument("--sample-s", type=float, default=5.0)
    p.add_argument("--rss-bound-mib", type=float, default=64.0)
    p.add_argument("--variant", default="fixed", choices=VARIANT_NAMES)
    p.add_argument("--config", default="configs/sim/default.yaml")
    p.add_argument("--out", default="reports/bench/soak.md")
    p.add_argument("--keep-run", default=None, help="keep the Locust run folder here (default: a temp dir, deleted)")
    p.add_argument("--render", default=None, metavar="SOAK_JSON", help="only rewrite --out from a saved soak .json")
    p.add_argument("--note", default=None, help="a sentence added to the report (e.g. what else ran on the machine)")
    a = p.parse_args(argv)
    if a.render:
        res = json.loads(Path(a.render).read_text())
        if a.note:
            res["note"] = a.note
            Path(a.render).write_text(json.dumps(res, indent=1) + "\n")
        write_markdown(Path(a.out), res)
        return 0
    if a.users < 1 or a.duration_s <= a.warmup_s or a.sample_s <= 0:
        print("error: --users >= 1, --duration-s > --warmup-s and --sample-s > 0 required", file=sys.stderr)
        return 2
    os.chdir(ROOT)

    tmp = tempfile.TemporaryDirectory(prefix="soak-")
    run_dir = Path(a.keep_run) if a.keep_run else Path(tmp.name) / "run"
    mix = {"short": 1, "medium": 2, "long": 1}
    scen = Path(tmp.name) / "soak.yaml"
    scen.write_text(json.dumps({
        "schema": SCENARIO_SCHEMA, "name": "soak", "mode": "stream", "loop": "closed", "seed": 1614, "mix": mix,
        "timeout_s": 600, "phases": {"warmup_s": a.warmup_s, "measure_s": a.duration_s - a.warmup_s, "drain_s": 0},
        "steps": [{"concurrency": a.users}]}))
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with SimServer(a.variant, config=a.config) as sim:
        sampler = Sampler(sim.proc.pid, sim.url + "/metrics", a.sample_s)
        sampler.start()
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "tts.py"), "--headless", "--host",
               sim.url, "--scenario", str(scen), "--run-dir", str(run_dir), "--variant", a.variant,
               "--only-summary", "--loglevel", "WARNING"]
        with open(Path(tmp.name) / "locust.log", "wb") as log:
            locust = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
            sampler.locust_pid = locust.pid
            try:
                rc = locust.wait(a.duration_s + 180)
            except subprocess.TimeoutExpired:
                locust.kill()
                rc = locust.wait()
        sampler.stop.set()
        sampler.join(15)
        sim_alive = sim.proc.poll() is None
    recs, notes = read_jsonl(run_dir / "requests.jsonl")
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    meas = [r for r in recs if r["phase"] == "measure"]
    ok = [r for r in meas if r["ok"]]
    measure_s = a.duration_s - a.warmup_s
    base, growth, slope = rss_growth(sampler.samples, a.warmup_s)
    post = [s["sim_rss_mib"] for s in sampler.samples if s["t"] >= a.warmup_s and s["sim_rss_mib"] is not None]
    loads = [s["loadavg_1m"] for s in sampler.samples]
    locust_rss = [s["locust_rss_mib"] for s in sampler.samples if s["locust_rss_mib"] is not None]
    res = {
        "settings": {"users": a.users, "duration_s": a.duration_s, "warmup_s": a.warmup_s, "sample_s": a.sample_s,
                     "rss_bound_mib": a.rss_bound_mib, "variant": a.variant, "config": a.config, "mix": mix},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "when": when,
                    "loadavg_mean": sum(loads) / len(loads) if loads else 0.0, "loadavg_max": max(loads or [0.0])},
        "requests": {
            "total": len(recs), "failed": sum(not r["ok"] for r in recs),
            "per_phase": dict(collections.Counter(r["phase"] for r in recs)),
            "reasons": collections.Counter((r["error"] or "")[:60] for r in recs if not r["ok"]),
            "rps": len(ok) / measure_s, "audio_s_per_s": sum(r["audio_s"] for r in ok) / measure_s,
            "e2e_p50": _q([r["e2e_s"] for r in ok], 0.5), "e2e_p99": _q([r["e2e_s"] for r in ok], 0.99),
            "ttfa_p50": _q([r["ttfa_s"] for r in ok], 0.5), "ttfa_p99": _q([r["ttfa_s"] for r in ok], 0.99),
        },
        "rss": {"baseline_mib": base, "growth_mib": growth, "slope_mib_per_min": slope, "max_mib": max(post or [0]),
                "ok": growth is not None and growth <= a.rss_bound_mib},
        "locust_rss_first_mib": locust_rss[0] if locust_rss else None,
        "locust_rss_last_mib": locust_rss[-1] if locust_rss else None,
        "engine_requests_finished": max((s.get("requests_finished") or 0 for s in sampler.samples), default=0),
        "scrapes": sum("counters" in s for s in sampler.samples),
        "monotonic_violations": sampler.violations, "scrape_errors": sampler.scrape_errors,
        "locust_returncode": rc, "simulator_alive_at_end": sim_alive, "samples": sampler.samples, "note": a.note,
    }
    res["pass"] = bool(res["requests"]["failed"] == 0 and res["rss"]["ok"] and not sampler.violations and rc == 0
                       and sim_alive and res["requests"]["total"] > 0)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(out, res)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=dict) + "\n")
    print(f"soak {'PASS' if res['pass'] else 'FAIL'}: {res['requests']['total']} requests, "
          f"{res['requests']['failed']} failed, RSS growth {_fmt(growth)} MiB (bound {a.rss_bound_mib:g}), "
          f"{len(sampler.violations)} counter violations -> {out}")
    tmp.cleanup()
    return 0 if res["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())

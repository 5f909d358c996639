"""Block supervision of an A/B run: for each block of the plan not done yet, start a fresh server, run the scenario
through Locust headless into blocks/<id>/, judge the block, stop the server.

A block's record (block.json) is written "interrupted" before it starts and replaced when it ends, so a killed runner
leaves a folder that says the truth. Statuses: "complete"; "invalid" (the load ran but its data cannot be used:
measure-phase requests failed, none was recorded, or the manipulation check failed; the reason says which); "failed"
(infrastructure: the server did not start or died, Locust crashed or hung); "interrupted" (the runner was stopped).
Locust runs with --exit-code-on-error 0, so a failed request is judged from requests.jsonl, never from its exit code.
"""

from __future__ import annotations

import csv
import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from loadtest import records as rec
from loadtest.backends import BACKENDS
from loadtest.plan import DONE, FAILED_RERUNS_MAX, RESUME_POLICY, ROOT, block_seconds, utc
from loadtest.scenario import load_scenario
from loadtest.server_process import ServerProcess, stop_group

LOCUST_GRACE_S = 90.0  # beyond the scenario's own length before a block counts as hung
LOCUST_STOP_S = 20.0  # Locust flushes its files on SIGINT


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived: stop the current block cleanly, keep everything written so far."""


def previous_failures(meta_path: Path) -> int:
    """How many attempts of this block failed so far (the one in meta_path included), from its block.json."""
    try:
        old = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    return int(old.get("failed_before") or 0) + (old.get("status") == "failed")


def locust_exceptions(bdir: Path) -> str | None:
    """Exceptions raised inside Locust's users (a bug of the locustfile, not a failed request), from its CSV."""
    path = bdir / "locust_exceptions.csv"
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    if not rows:
        return None
    n = sum(int(r.get("Count") or 1) for r in rows)
    first = (rows[0].get("Message") or "").strip().splitlines()[0][:200] if rows[0].get("Message") else "?"
    return f"Locust users raised {n} exception(s), e.g. {first} (see locust_exceptions.csv)"


def judge(variant: str, bdir: Path) -> tuple[dict, str | None]:
    """A finished block's request outcomes and, if it is invalid, why (loadtest.records decides)."""
    requests, _ = rec.read_jsonl(bdir / "requests.jsonl", rec.REQUEST_SCHEMA)
    counters, _ = rec.read_jsonl(bdir / "counters.jsonl", rec.COUNTERS_SCHEMA)
    outcomes = rec.request_outcomes(requests)
    return outcomes, rec.load_verdict(variant, outcomes, counters)


class Runner:
    def __init__(self, run_dir: Path, manifest: dict, progress=print):
        self.run = run_dir
        self.m = manifest
        self.s = manifest["settings"]
        self.stop = False
        self.procs: list[subprocess.Popen] = []
        self.progress = progress
        self.scenario = load_scenario(str(run_dir / "scenario.yaml"))
        self.block_s = block_seconds(self.scenario)
        self.overhead_s = 10.0  # server start + Locust start + shutdown; refined as blocks finish

    # --- signals ------------------------------------------------------------------------------------------

    def install_signals(self) -> None:
        def handler(signum, _frame):
            if not self.stop:
                self.stop = True
                print(f"\n{signal.Signals(signum).name}: stopping the load and the server; files stay consistent",
                      file=sys.stderr, flush=True)

        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)

    def _sleep(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.stop:
                raise Interrupted
            time.sleep(min(0.2, max(0.0, end - time.monotonic())))

    # --- one block ------------------------------------------------------------------------------------------

    def _fresh_folder(self, b: dict) -> Path:
        """blocks/<id>/, with an earlier attempt (interrupted or failed) moved aside: records are never mixed."""
        bdir = self.run / "blocks" / b["block_id"]
        if bdir.exists():
            attempts = self.run / "attempts"
            attempts.mkdir(exist_ok=True)
            n = sum(1 for p in attempts.iterdir() if p.name.startswith(b["block_id"]))
            shutil.move(str(bdir), str(attempts / f"{b['block_id']}.{n + 1}"))
        bdir.mkdir(parents=True)
        return bdir

    def run_block(self, i: int, b: dict) -> dict:
        failed_before = previous_failures(self.run / "blocks" / b["block_id"] / "block.json")
        bdir = self._fresh_folder(b)
        meta = rec.BlockRecord(**b, started=utc(), failed_before=failed_before)
        rec.write_json(bdir / "block.json", meta.to_dict())
        server: ServerProcess | None = None
        locust = None
        t0 = time.monotonic()
        try:
            server = ServerProcess(BACKENDS[self.s["backend"]](self.s, b, bdir), bdir / "server.log").start()
            self.procs.append(server.proc)
            meta.server_url = server.wait_ready(self.s["ready_timeout_s"], sleep=self._sleep)
            meta.timing["ready_s"] = round(time.monotonic() - t0, 2)
            locust = self._start_locust(b, bdir, meta.server_url)
            t_load = time.monotonic()
            self._watch_load(i, b, bdir, server, locust, t_load)
            meta.timing["load_s"] = round(time.monotonic() - t_load, 2)
            meta.requests, why = judge(b["variant"], bdir)
            meta.status, meta.reason = ("complete", None) if why is None else ("invalid", why)
            if why is not None:
                print(f"\n!!! INVALID BLOCK {b['block_id']}: {why}", file=sys.stderr, flush=True)
        except Interrupted:
            meta.status, meta.reason = "interrupted", "SIGINT/SIGTERM during the block"
            stop_group(locust, signal.SIGINT, LOCUST_STOP_S)
            raise
        except (RuntimeError, OSError, ValueError) as e:
            meta.status, meta.reason = "failed", str(e)
        finally:
            stop_group(locust, signal.SIGINT, LOCUST_STOP_S)
            t_stop = time.monotonic()
            if server is not None:
                server.stop()
            meta.timing["stop_s"] = round(time.monotonic() - t_stop, 2)
            meta.timing["total_s"] = round(time.monotonic() - t0, 2)
            meta.ended = utc()
            rec.write_json(bdir / "block.json", meta.to_dict())
            self.overhead_s = max(5.0, time.monotonic() - t0 - self.block_s)
        return meta.to_dict()

    def _start_locust(self, b: dict, bdir: Path, url: str) -> subprocess.Popen:
        with open(bdir / "locust.log", "wb") as log:
            locust = subprocess.Popen(self.locust_cmd(b, bdir, url), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append(locust)
        return locust

    def _watch_load(self, i: int, b: dict, bdir: Path, server: ServerProcess, locust: subprocess.Popen,
                    t_load: float) -> None:
        """Until Locust exits: progress, and RuntimeError when the server dies, Locust hangs, crashes or wrote nothing."""
        while locust.poll() is None:
            if self.stop:
                raise Interrupted
            if not server.alive():
                raise RuntimeError(f"server died during the load (exit {server.proc.returncode}; see server.log)")
            el = time.monotonic() - t_load
            if el > self.block_s + LOCUST_GRACE_S:
                raise RuntimeError(f"Locust still running {el:.0f} s after start (scenario {self.block_s:.0f} s)")
            self.show(i, b, el)
            time.sleep(0.5)
        if not server.alive():
            raise RuntimeError(f"server died during the load (exit {server.proc.returncode}; see server.log)")
        if locust.returncode != 0:  # failed requests do not count here (--exit-code-on-error 0): Locust crashed
            raise RuntimeError(f"Locust exited with code {locust.returncode} (see locust.log)")
        if not (bdir / "requests.jsonl").exists():
            raise RuntimeError("Locust wrote no requests.jsonl")
        crashed = locust_exceptions(bdir)
        if crashed:
            raise RuntimeError(crashed)

    def locust_cmd(self, b: dict, bdir: Path, url: str) -> list[str]:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "tts.py"), "--headless",
               "--host", url, "--scenario", str(self.run / "scenario.yaml"), "--run-dir", str(bdir),
               "--metrics-url", url + "/metrics", "--variant", b["variant"], "--csv", str(bdir / "locust"),
               "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0"]
        if self.s.get("request_timeout_s"):
            cmd += ["--request-timeout", f"{self.s['request_timeout_s']:g}"]
        return cmd

    # --- progress -----------------------------------------------------------------------------------------

    def show(self, i: int, b: dict, elapsed: float) -> None:
        t, step = 0.0, None
        for s in self.scenario.steps:
            for name, length in (("warm-up", s.warmup_s), ("measure", s.measure_s), ("drain", s.drain_s)):
                if step is None and elapsed < t + length:
                    step = f"step {s.index + 1}/{len(self.scenario.steps)} c={s.concurrency} {name}"
                t += length
        left_blocks = len(self.m["plan"]) - i - 1
        left = max(0.0, self.block_s - elapsed) + left_blocks * (self.block_s + self.overhead_s)
        self.progress(f"round {b['round'] + 1}/{self.s['rounds'] + self.s['aa_rounds']} ({b['kind'].upper()}) · "
                      f"block {i + 1}/{len(self.m['plan'])} {b['arm']}={b['variant']} · {step or 'finishing'} · "
                      f"~{left / 60:.1f} min left")

    # --- the run --------------------------------------------------------------------------------------------

    def execute(self) -> str:
        """Run every block not done yet; returns the run status."""
        self.install_signals()
        self.m["status"] = "running"
        self.m.setdefault("resume_policy", RESUME_POLICY)
        rec.write_json(self.run / "manifest.json", self.m)
        try:
            for i, b in enumerate(self.m["plan"]):
                meta_path = self.run / "blocks" / b["block_id"] / "block.json"
                old = json.loads(meta_path.read_text()) if meta_path.exists() else {}
                if old.get("status") in DONE:
                    continue
                failures = previous_failures(meta_path) if old.get("status") == "failed" else 0
                if failures > FAILED_RERUNS_MAX:
                    print(f"block {b['block_id']}: failed {failures} times, not run again ({old.get('reason')})",
                          flush=True)
                    continue
                if self.stop:
                    raise Interrupted
                meta = self.run_block(i, b)
                print(f"\rblock {b['block_id']}: {meta['status']}" + (f" — {meta['reason']}" if meta["reason"] else "")
                      + " " * 20, flush=True)
            self.m["status"] = "complete"
        except Interrupted:
            self.m["status"] = "interrupted"
        finally:
            for p in self.procs:
                stop_group(p)
            self.m["ended"] = utc()
            rec.write_json(self.run / "manifest.json", self.m)
        return self.m["status"]

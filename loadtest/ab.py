"""The A/B runner: A/A rounds, then A/B rounds in seeded random order, one fresh server per block.

`python -m loadtest.ab --a original --b fixed --backend sim --rounds 3 --aa-rounds 1 --scenario ... --sim-config ...`
(`make ab`), `--resume reports/<run>` to continue an interrupted run, `--demo` for `make demo`.
Each block: start the server (simulator process or `bash docker/serve.sh`), wait until /health answers, run the
scenario's steps through Locust headless into blocks/<id>/, stop the server. A block's status is written before it
starts ("interrupted") and replaced when it ends, so a killed runner leaves a folder that says the truth.
Statuses: "complete"; "invalid" (the load ran but its data cannot be used: measure-phase requests failed, none was
recorded, or the manipulation check failed; the reason says which); "failed" (infrastructure: the server did not start
or died, Locust crashed or hung); "interrupted" (the runner was stopped). Locust runs with --exit-code-on-error 0, so a
failed request is judged from requests.jsonl, never from Locust's exit code.
At the end the statistics and the report are built (ttsreport) and the report's path is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import yaml

from loadtest.scenario import ScenarioError, load_scenario

AB_SCHEMA = "tts-ab/1"
BLOCK_SCHEMA = "tts-block/1"
ROOT = Path(__file__).resolve().parent.parent
DONE = ("complete", "invalid")  # a resumed run never repeats these: their load ran; a rerun would only hide the cause
# A "failed" block (infrastructure) runs again on a resume while fewer than this many earlier attempts of it failed:
# once more, then it stays failed (a server that never starts is not retried forever). "interrupted" always runs again.
FAILED_RERUNS_MAX = 1
RESUME_POLICY = {"never_rerun": list(DONE), "always_rerun": ["interrupted"], "failed_reruns_max": FAILED_RERUNS_MAX,
                 "how": "block.json counts earlier failed attempts of the block in failed_before (they are kept under "
                        "attempts/); a failed block with failed_before >= failed_reruns_max is not run again"}
# `make demo`: the demo's settings (levels, phases, prompts, simulator batch and queue) and why live in
# configs/scenarios/demo.yaml and configs/sim/demo.yaml; the preset only points at them and fixes the plan
# (1 A/A + 3 A/B rounds = 8 blocks). It overrides nothing, so what those files say is what runs.
DEMO = {"a": "original", "b": "fixed", "backend": "sim", "rounds": 3, "aa_rounds": 1,
        "scenario": "configs/scenarios/demo.yaml", "sim_config": "configs/sim/demo.yaml",
        "sim_set": [], "b_sim_set": [], "levels": None, "warmup_s": None, "measure_s": None, "drain_s": None,
        "last_drain_s": None, "scenario_set": [], "name": None, "seed": None}
SERVER_STOP_S = 15.0
LOCUST_GRACE_S = 90.0  # beyond the scenario's own length before a block counts as hung


class Interrupted(Exception):
    """SIGINT/SIGTERM arrived: stop the current block cleanly, keep everything written so far."""


def utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_json(path: Path, obj: dict) -> None:
    """Atomic replace: a reader (or a resume) never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _run_quiet(cmd: list[str], timeout: float = 5.0) -> str | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(backend: str, variants: tuple[str, ...] = ()) -> dict:
    """What the manifest records about the machine and the code: no environment variables, so no tokens."""
    gpu = _run_quiet(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    rev = _run_quiet(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    dirty = _run_quiet(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    info = {"git_revision": rev, "git_dirty": bool(dirty), "python": platform.python_version(),
            "platform": platform.platform(), "cpus": os.cpu_count(), "gpu": gpu.splitlines() if gpu else None}
    if backend == "sim":
        try:
            from importlib.metadata import version

            info["backend_version"] = f"ttssim (tts-loadtest {version('tts-loadtest')})"
        except Exception:
            info["backend_version"] = "ttssim"
    else:
        # docker/serve.sh builds one image per variant (IMAGE, default tts-vllm-omni:0.16.0-<variant>) on vllm-omni
        images = {v: os.environ.get("IMAGE", f"tts-vllm-omni:0.16.0-{v}") for v in variants}
        ids = {v: _run_quiet(["docker", "image", "inspect", "--format", "{{.Id}}", img]) for v, img in images.items()}
        info["backend_version"] = "vllm-omni 0.16.0 (docker/serve.sh)"
        info["image_digest"] = {v: {"image": images[v], "id": ids[v]} for v in variants}
    return info


# ----------------------------------------------------------------------------------------------- plan


def make_plan(rounds: int, aa_rounds: int, a: str, b: str, seed: int) -> list[dict]:
    """A/A rounds first, then A/B rounds; the arm order of every round is drawn from `seed`."""
    rng = random.Random(seed)
    plan = []
    for r in range(aa_rounds + rounds):
        kind = "aa" if r < aa_rounds else "ab"
        order = ["A", "B"] if rng.random() < 0.5 else ["B", "A"]
        for arm in order:
            variant = a if (kind == "aa" or arm == "A") else b
            plan.append({"block_id": f"{len(plan):03d}-r{r}-{kind}-{arm}", "round": r, "kind": kind, "arm": arm,
                         "variant": variant})
    return plan


def effective_scenario(path: Path, out: Path, phases: dict, levels: list[int] | None,
                       sets: list[str] | None = None, last_drain_s: float | None = None) -> Path:
    """Copy the scenario into the run folder, with phase lengths / levels / keys overridden if asked (recorded, hashed)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    for kv in sets or []:
        key, _, value = kv.partition("=")
        if not key or not _:
            raise ValueError(f"--scenario-set wants KEY=VALUE, got {kv!r}")
        data[key] = yaml.safe_load(value)
    if phases:
        data["phases"] = {**data.get("phases", {}), **phases}
    if levels:
        data["steps"] = [{"concurrency": c} for c in levels]
    if last_drain_s is not None and data.get("steps"):
        data["steps"][-1] = {**data["steps"][-1], "drain_s": last_drain_s}
    out.write_text(f"# effective scenario of this run, from {path}\n" + yaml.safe_dump(data, sort_keys=False),
                   encoding="utf-8")
    load_scenario(str(out))  # validate now: a bad override fails before any server starts
    return out


def block_seconds(scenario) -> float:
    return sum(s.warmup_s + s.measure_s + s.drain_s for s in scenario.steps)


# ----------------------------------------------------------------------------------------------- processes


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen | None, sig=signal.SIGTERM, wait: float = SERVER_STOP_S) -> None:
    """Stop a process we started (own session) and its children: signal, wait, then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        return
    try:
        proc.wait(wait)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def health(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


def previous_failures(meta_path: Path) -> int:
    """How many attempts of this block failed so far (the one in meta_path included), from its block.json."""
    try:
        old = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    return int(old.get("failed_before") or 0) + (old.get("status") == "failed")


def error_kind(error: str | None) -> str:
    """A request's error reason without its details: 'http 503', 'stream broken', 'no response', ..."""
    head = (error or "unknown error").split(":", 1)[0].strip()
    if re.fullmatch(r"http \d+", head):
        return head
    return re.sub(r"\s+(after\s+)?\d.*$", "", head) or head


def request_outcomes(path: Path) -> dict:
    """Counts of a block's requests.jsonl: measure-phase requests and failures by kind, and failures elsewhere."""
    out = {"measure": 0, "measure_failed": 0, "measure_errors": {}, "other": 0, "other_failed": 0, "other_errors": {}}
    measure, other = Counter(), Counter()
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a half-written last line of a killed Locust: the statistics reader reports it
            side = "measure" if r.get("phase") == "measure" else "other"
            out[side] += 1
            if not r.get("ok"):
                out[side + "_failed"] += 1
                (measure if side == "measure" else other)[error_kind(r.get("error"))] += 1
    out["measure_errors"], out["other_errors"] = dict(measure.most_common()), dict(other.most_common())
    return out


def _top(errors: dict, n: int = 3) -> str:
    items = sorted(errors.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} ({v})" for k, v in items[:n])
    return text + (f", {len(items) - n} other kinds" if len(items) > n else "")


def request_verdict(o: dict) -> str | None:
    """None when the measure phases are usable; else the reason the block is invalid."""
    if o["measure_failed"]:
        return f"{o['measure_failed']} of {o['measure']} measure-phase requests failed: {_top(o['measure_errors'])}"
    if not o["measure"]:
        why = "no measure-phase request was recorded"
        if o["other_failed"]:
            why += f" ({o['other_failed']} of {o['other']} warm-up/drain requests failed: {_top(o['other_errors'])})"
        return why
    return None


def locust_exceptions(bdir: Path) -> str | None:
    """Exceptions raised inside Locust's users (a bug of the locustfile, not a failed request), from its CSV."""
    import csv

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

    def server_cmd(self, b: dict, port: int, bdir: Path) -> tuple[list[str], dict]:
        env = {k: v for k, v in os.environ.items()}
        if self.s["backend"] == "sim":
            cmd = [sys.executable, "-m", "ttssim", "--variant", b["variant"], "--host", "127.0.0.1", "--port", "0",
                   "--port-file", str(bdir / "port"), "--config", self.s["sim_config"]]
            sets = list(self.s.get("sim_set") or [])
            if b["kind"] == "ab" and b["arm"] == "B":
                sets += self.s.get("b_sim_set") or []
            for kv in sets:
                cmd += ["--set", kv]
            return cmd, env
        # Assumption (docker/serve.sh, issue 6): variant and port come from the environment, like `make serve`.
        env.update(VARIANT=b["variant"], PORT=str(port), HOST="127.0.0.1")
        return ["bash", str(ROOT / "docker" / "serve.sh")], env

    def wait_ready(self, proc: subprocess.Popen, bdir: Path, port: int) -> str:
        deadline = time.monotonic() + self.s["ready_timeout_s"]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with code {proc.returncode} before it was ready (see server.log)")
            if self.s["backend"] == "sim":
                pf = bdir / "port"
                if pf.exists() and pf.read_text().strip():
                    port = int(pf.read_text().strip())
                else:
                    self._sleep(0.1)
                    continue
            url = f"http://127.0.0.1:{port}"
            if health(url):
                return url
            self._sleep(0.25)
        raise RuntimeError(f"server not ready within {self.s['ready_timeout_s']:g} s (see server.log)")

    def run_block(self, i: int, b: dict) -> dict:
        bdir = self.run / "blocks" / b["block_id"]
        failed_before = previous_failures(bdir / "block.json")
        if bdir.exists():  # an earlier attempt (interrupted or failed): keep it aside, never mix records
            attempts = self.run / "attempts"
            attempts.mkdir(exist_ok=True)
            n = sum(1 for p in attempts.iterdir() if p.name.startswith(b["block_id"]))
            shutil.move(str(bdir), str(attempts / f"{b['block_id']}.{n + 1}"))
        bdir.mkdir(parents=True)
        meta = {"schema": BLOCK_SCHEMA, **b, "status": "interrupted", "reason": "block in progress (runner stopped)",
                "started": utc(), "ended": None, "server_url": None, "failed_before": failed_before}
        write_json(bdir / "block.json", meta)
        server = locust = None
        t0 = time.monotonic()
        timing: dict[str, float] = {}
        meta["timing"] = timing
        try:
            port = free_port() if self.s["backend"] != "sim" else 0
            cmd, env = self.server_cmd(b, port, bdir)
            with open(bdir / "server.log", "wb") as log:
                server = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.append(server)
            url = self.wait_ready(server, bdir, port)
            meta["server_url"] = url
            timing["ready_s"] = round(time.monotonic() - t0, 2)
            lcmd = self.locust_cmd(b, bdir, url)
            with open(bdir / "locust.log", "wb") as log:
                locust = subprocess.Popen(lcmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.append(locust)
            t_load = time.monotonic()
            while locust.poll() is None:
                if self.stop:
                    raise Interrupted
                if server.poll() is not None:
                    raise RuntimeError(f"server died during the load (exit {server.returncode}; see server.log)")
                el = time.monotonic() - t_load
                if el > self.block_s + LOCUST_GRACE_S:
                    raise RuntimeError(f"Locust still running {el:.0f} s after start (scenario {self.block_s:.0f} s)")
                self.show(i, b, el)
                time.sleep(0.5)
            timing["load_s"] = round(time.monotonic() - t_load, 2)
            if server.poll() is not None:
                raise RuntimeError(f"server died during the load (exit {server.returncode}; see server.log)")
            if locust.returncode != 0:  # failed requests do not count here (--exit-code-on-error 0): Locust crashed
                raise RuntimeError(f"Locust exited with code {locust.returncode} (see locust.log)")
            if not (bdir / "requests.jsonl").exists():
                raise RuntimeError("Locust wrote no requests.jsonl")
            crashed = locust_exceptions(bdir)
            if crashed:
                raise RuntimeError(crashed)
            meta["requests"] = request_outcomes(bdir / "requests.jsonl")
            meta["status"], meta["reason"] = self.check(b, bdir, meta["requests"])
        except Interrupted:
            meta["status"], meta["reason"] = "interrupted", "SIGINT/SIGTERM during the block"
            stop_group(locust, signal.SIGINT, 20.0)  # Locust flushes its files on SIGINT
            raise
        except (RuntimeError, OSError) as e:
            meta["status"], meta["reason"] = "failed", str(e)
        finally:
            stop_group(locust, signal.SIGINT, 20.0)
            t_stop = time.monotonic()
            stop_group(server, wait=SERVER_STOP_S if self.s["backend"] == "sim" else 120.0)  # container removal
            timing["stop_s"] = round(time.monotonic() - t_stop, 2)
            timing["total_s"] = round(time.monotonic() - t0, 2)
            meta["ended"] = utc()
            write_json(bdir / "block.json", meta)
            self.overhead_s = max(5.0, time.monotonic() - t0 - self.block_s)
        return meta

    def locust_cmd(self, b: dict, bdir: Path, url: str) -> list[str]:
        cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "tts.py"), "--headless",
               "--host", url, "--scenario", str(self.run / "scenario.yaml"), "--run-dir", str(bdir),
               "--metrics-url", url + "/metrics", "--variant", b["variant"], "--csv", str(bdir / "locust"),
               "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0"]
        if self.s.get("request_timeout_s"):
            cmd += ["--request-timeout", f"{self.s['request_timeout_s']:g}"]
        return cmd

    def check(self, b: dict, bdir: Path, outcomes: dict | None = None) -> tuple[str, str | None]:
        """Request outcomes and the manipulation check right after the block, so the run says at once that a block
        is invalid (and why)."""
        from ttsreport.statistics import COUNTERS_SCHEMA, manipulation_check, read_jsonl

        why = request_verdict(outcomes if outcomes is not None else request_outcomes(bdir / "requests.jsonl"))
        if why is None:
            counters, _ = read_jsonl(bdir / "counters.jsonl", COUNTERS_SCHEMA)
            res = manipulation_check(b["variant"], counters)
            if res["ok"]:
                return "complete", None
            why = f"manipulation check failed: {res['reason']}"
        print(f"\n!!! INVALID BLOCK {b['block_id']}: {why}", file=sys.stderr, flush=True)
        return "invalid", why

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
        write_json(self.run / "manifest.json", self.m)
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
            write_json(self.run / "manifest.json", self.m)
        return self.m["status"]


# ----------------------------------------------------------------------------------------------- entry


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.ab", description=__doc__.splitlines()[0])
    p.add_argument("--a", default="original", help="variant of arm A (the baseline)")
    p.add_argument("--b", default="fixed", help="variant of arm B")
    p.add_argument("--backend", choices=["sim", "vllm"], default="sim")
    p.add_argument("--rounds", type=int, default=3, help="A/B rounds (each: A and B in random order)")
    p.add_argument("--aa-rounds", type=int, default=1, help="A/A rounds first (noise floor)")
    p.add_argument("--scenario", default="configs/scenarios/ab-default.yaml")
    p.add_argument("--sim-config", default="configs/sim/default.yaml")
    p.add_argument("--sim-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="simulator override for every block (ttssim --set)")
    p.add_argument("--b-sim-set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="simulator override for arm B of A/B rounds only (known-answer tests: model.extra_step_pct=2)")
    p.add_argument("--warmup-s", type=float, help="override the scenario's warm-up per step")
    p.add_argument("--measure-s", type=float, help="override the scenario's measure phase per step")
    p.add_argument("--drain-s", type=float, help="override the scenario's drain per step")
    p.add_argument("--levels", help="override the concurrency steps, e.g. 8,64")
    p.add_argument("--last-drain-s", type=float, help="drain after the last step only (requests still running when "
                   "Locust stops are never recorded, so the last level's latencies need it)")
    p.add_argument("--scenario-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a top-level scenario key (YAML value), e.g. 'mix={short: 1}'")
    p.add_argument("--seed", type=int, default=None, help="seed of the A/B order (default: random, recorded)")
    p.add_argument("--request-timeout", type=float, default=None,
                   help="seconds per request, passed to the locustfile (default: the scenario's timeout_s)")
    p.add_argument("--ready-timeout", type=float, default=None,
                   help="seconds to wait for /health per block (default 120 on sim, 1200 on vllm: image build, weights)")
    p.add_argument("--out", default="reports", help="parent folder of the run folder")
    p.add_argument("--name", default=None, help="run folder name (default ab-<UTC>)")
    p.add_argument("--micro", default=None, help="micro benchmark results.json for the prediction")
    p.add_argument("--resume", default=None, help="continue reports/<run> after its last completed block")
    p.add_argument("--demo", action="store_true", help="the `make demo` preset (original vs fixed + A/A, simulator)")
    p.add_argument("--no-report", action="store_true", help="skip statistics and report at the end")
    return p.parse_args(argv)


def new_run(a: argparse.Namespace) -> tuple[Path, dict]:
    from tts_predictor.variants import VARIANTS

    for v in (a.a, a.b):
        if v not in VARIANTS:
            raise SystemExit(f"error: unknown variant {v!r} (known: {', '.join(sorted(VARIANTS))})")
    if a.rounds < 1 or a.aa_rounds < 0:
        raise SystemExit("error: --rounds must be >= 1 and --aa-rounds >= 0")
    if a.request_timeout is not None and not (a.request_timeout > 0 and a.request_timeout != float("inf")):
        raise SystemExit(f"error: --request-timeout must be a positive number of seconds, got {a.request_timeout:g}")
    scen = Path(a.scenario)
    if a.backend == "sim" and not Path(a.sim_config).is_file():
        raise SystemExit(f"error: simulator config {a.sim_config} not found")
    if a.backend == "vllm" and not (ROOT / "docker" / "serve.sh").is_file():
        raise SystemExit("error: BACKEND=vllm needs docker/serve.sh")
    if a.backend == "vllm" and shutil.which("docker") is None:
        raise SystemExit("error: BACKEND=vllm needs Docker (not found); use BACKEND=sim")
    try:
        levels = [int(x) for x in a.levels.split(",")] if a.levels else None
    except ValueError:
        raise SystemExit(f"error: --levels wants comma-separated integers, got {a.levels!r}") from None
    seed = a.seed if a.seed is not None else random.SystemRandom().randrange(2**31)
    name = a.name or f"ab-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    run = Path(a.out) / name
    if run.exists():
        raise SystemExit(f"error: {run} exists (use --resume {run} to continue it)")
    run.mkdir(parents=True)
    phases = {k: v for k, v in (("warmup_s", a.warmup_s), ("measure_s", a.measure_s), ("drain_s", a.drain_s))
              if v is not None}
    try:
        effective_scenario(scen, run / "scenario.yaml", phases, levels, a.scenario_set, a.last_drain_s)
    except (OSError, yaml.YAMLError, ScenarioError, ValueError) as e:
        shutil.rmtree(run)
        raise SystemExit(f"error: scenario {scen}: {e}") from None
    settings = {"a": a.a, "b": a.b, "backend": a.backend, "rounds": a.rounds, "aa_rounds": a.aa_rounds,
                "scenario": str(scen), "sim_config": a.sim_config, "sim_set": a.sim_set, "b_sim_set": a.b_sim_set,
                "phase_overrides": phases, "levels_override": levels, "scenario_set": a.scenario_set, "last_drain_s": a.last_drain_s,
                "ready_timeout_s": a.ready_timeout or (1200.0 if a.backend == "vllm" else 120.0),
                "request_timeout_s": a.request_timeout, "micro": a.micro}
    manifest = {
        "schema": AB_SCHEMA, "run_id": name, "created": utc(), "started": utc(), "ended": None, "status": "planned",
        "variants": {"A": a.a, "B": a.b}, "backend": {"name": a.backend, "simulated": a.backend == "sim"},
        "seeds": {"order": seed, "scenario": load_scenario(str(run / "scenario.yaml")).seed},
        "scenario": {"path": str(scen), "sha256": sha256(scen), "effective_sha256": sha256(run / "scenario.yaml")},
        "sim_config": ({"path": a.sim_config, "sha256": sha256(Path(a.sim_config))} if a.backend == "sim" else None),
        "settings": settings, "plan": make_plan(a.rounds, a.aa_rounds, a.a, a.b, seed), "resume_policy": RESUME_POLICY,
        "command": ["python", "-m", "loadtest.ab", *(sys.argv[1:] if sys.argv else [])],
    }
    env = environment(a.backend, (a.a, a.b))
    manifest["backend"].update(version=env.pop("backend_version"), image_digest=env.pop("image_digest", None))
    manifest["git_revision"] = env.pop("git_revision")
    manifest["host"] = env
    write_json(run / "manifest.json", manifest)
    return run, manifest


def build_report(run: Path, micro: str | None) -> Path | None:
    from ttsreport.report import write_report
    from ttsreport.statistics import write_statistics

    try:
        write_statistics(run, micro_path=micro)
        return write_report(run)
    except (ValueError, OSError) as e:
        print(f"error: report for {run} failed: {e}", file=sys.stderr)
        return None


def _progress_printer():
    tty = sys.stdout.isatty()
    last = [0.0]

    def show(line: str) -> None:
        now = time.monotonic()
        if tty:
            print("\r" + line[:150].ljust(150), end="", flush=True)
        elif now - last[0] >= 10.0:
            print(line, flush=True)
            last[0] = now
    return show


def main(argv=None) -> int:
    a = parse_args(argv)
    os.chdir(ROOT)  # configs and the locustfile are addressed from the repository root
    if a.demo:
        for k, v in DEMO.items():
            setattr(a, k, v)
    if a.resume:
        run = Path(a.resume)
        mpath = run / "manifest.json"
        if not mpath.is_file():
            print(f"error: {mpath} not found: nothing to resume", file=sys.stderr)
            return 2
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
        if manifest.get("schema") != AB_SCHEMA:
            print(f"error: {mpath}: not an A/B run (schema {manifest.get('schema')!r})", file=sys.stderr)
            return 2
        manifest.setdefault("resumed", []).append(utc())
        print(f"resuming {run}")
    else:
        try:
            run, manifest = new_run(a)
        except SystemExit as e:
            print(e, file=sys.stderr)
            return 2
    runner = Runner(run, manifest, _progress_printer())
    print(f"A/B run {run}: {manifest['variants']['A']} (A) vs {manifest['variants']['B']} (B) on "
          f"{manifest['backend']['name']}, {len(manifest['plan'])} blocks of ~{runner.block_s:.0f} s", flush=True)
    status = runner.execute()
    print()
    index = None if a.no_report else build_report(run, manifest["settings"].get("micro"))
    if status == "interrupted":
        print(f"interrupted: partial data kept in {run}; continue with: make ab RESUME={run}", file=sys.stderr)
    if index:
        print(f"report: {index}")
    return 130 if status == "interrupted" else 0


if __name__ == "__main__":
    sys.exit(main())

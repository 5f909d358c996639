"""The A/B run itself: server starts, the windows inside them, reruns, sequential looks, resume and interruption.

For every round of the plan not done yet, each window runs in its planned server start (a start is launched when
the first window that needs it comes, with its control file written first, and stopped after its last window):
its own scenario (levels in its order, count phases where the server has a control file), Locust headless into
blocks/<id>/, telemetry beside it, then the verdict (ttsrecords.records), the arm's evidence check on the start's
server.log and the window's last snapshot, and, for a hot swap, the switch confirmed from the counters.

Statuses: "complete"; "invalid" (the load ran but its data cannot be used: nothing measured or nothing succeeded,
the manipulation check, an unconfirmed switch or the arm's evidence failed; the reason says which); "failed"
(infrastructure: the server did not start or died, Locust crashed or hung); "interrupted" (the runner was stopped).
A failed window reruns its whole round at once in a new attempt (the failed attempt kept under attempts/).
Locust runs with --exit-code-on-error 0, so failed requests are judged from requests.jsonl: they are data.
A window's timing: load_s (its Locust run), settle_s, total_s (its wall time), and ready_s / stop_s of a server
start it launched / ended (so in design fresh, as before, each window carries its start's cost; start.json has them
too). A block.json / start.json is written "interrupted" before its work starts and replaced when it ends, so a killed
runner leaves a folder that says the truth.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from loadtest import experiment as ex
from loadtest import pinning
from loadtest.design import SWAPPED
from loadtest.launch import images
from loadtest.plan import (
    ROOT,
    arms_of,
    control_extra,
    experiment_for,
)
from loadtest.provenance import code_fingerprint, utc
from loadtest.resume import DONE, FAILED_RERUNS_MAX
from loadtest.scenario import load_scenario, window_scenario, window_seconds
from loadtest.server_process import ServerProcess, stop_group
from loadtest.shape import PhaseHold, Schedule, epochs_per_window
from loadtest.starts import Interrupted, Start, Starts
from loadtest.telemetry import Nvml, Telemetry
from loadtest.telemetry import describe as describe_telemetry
from loadtest.window_check import (
    arm_evidence,
    confirm_switch,
    judge,
    locust_exceptions,
    previous_failures,
    spanning,
)
from ttsrecords import outcomes as oc
from ttsrecords import records as rec
from ttsrecords import runsettings as rs
from ttsrecords.manifest import RUNNER_KEYS, ManifestError, read_manifest
from ttsrecords.progress import PROGRESS_FILE, Progress
from ttsrecords.windows import (
    PlannedWindow,
    last_of_start,
    rounds_of,
    windows_to_run,
)

LOCUST_GRACE_S = 90.0  # beyond the scenario's own length before a window counts as hung
LOCUST_STOP_S = 20.0  # Locust flushes its files on SIGINT
LOOK_TIMEOUT_S = 600.0
PROGRESS_EVERY_S = 2.0  # progress.json is replaced at most this often during a window's load


class BrokenStart(RuntimeError):
    """A window in which every request failed: its start is ended, the round reruns in a new one."""


class PreparationFailed(RuntimeError):
    """An image or the model could not be prepared before the first start: nothing can run."""


def locust_cmd(bdir: Path, url: str, variant: str | None, control: Path | None, epoch: int | None,
               request_timeout_s: float | None, control_extra: dict | None = None,
               exp: ex.Experiment | None = None) -> list[str]:
    """Locust headless over the window's own scenario; failed requests never set its exit code (they are data)."""
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "tts.py"), "--headless",
           "--host", url, "--scenario", str(bdir / "scenario.yaml"), "--run-dir", str(bdir),
           "--metrics-url", url + "/metrics", "--csv", str(bdir / "locust"),
           "--only-summary", "--loglevel", "WARNING", "--exit-code-on-error", "0",
           "--keep-going", "--no-report"]  # the runner judges a failing window and builds the run's report itself
    if variant:
        cmd += ["--variant", variant]
    if control is not None:
        cmd += ["--control", str(control), "--control-epoch", str(epoch or 0)]
        extra = control_extra or {}
        if extra.get("sim"):
            cmd += ["--control-sim", json.dumps(extra["sim"], sort_keys=True)]
        if extra.get("host_delay_us"):
            cmd += ["--control-host-delay-us", f"{extra['host_delay_us']:g}"]
    if request_timeout_s:
        cmd += ["--request-timeout", f"{request_timeout_s:g}"]
    if exp is not None:  # the served model name and the request kind of the experiment
        cmd += ["--model", exp.model, "--request", exp.request]
    return cmd


def look_command(run: Path) -> list[str]:
    """The sequential rule after a round: the statistics, as a process (the load side never imports them)."""
    return [sys.executable, "-m", "ttsreport", str(run), "--look"]


def last_look(run: Path) -> dict | None:
    """The last line of looks.jsonl (schema tts-look/1), None when there is none."""
    rows, _ = rec.read_jsonl(run / "looks.jsonl", rec.LOOK_SCHEMA)
    return rows[-1] if rows else None


class Runner:
    def __init__(self, run_dir: Path, manifest: dict, progress=print, exp: ex.Experiment | None = None):
        self.run = run_dir
        try:
            typed = read_manifest(manifest, str(run_dir / "manifest.json"))
        except ManifestError as e:
            raise SystemExit(f"error: {e}") from None
        self.m = {k: v for k, v in manifest.items() if k not in RUNNER_KEYS}  # the planner's: never written here
        self.log = typed.log  # the runner's own record of the run, the only part of the manifest it writes
        self.planned = list(typed.plan)
        self.s = manifest["settings"]
        self.design = manifest["design"]
        self.exp = exp or experiment_for(self.s)
        self.arms = arms_of(self.exp)
        self.stop = False
        self.procs: list[subprocess.Popen] = []
        self.progress = progress
        self.scenario = load_scenario(str(run_dir / "scenario.yaml"))
        self.window_s = window_seconds(self.scenario)
        self.overhead_s = 10.0  # per window: Locust start + shutdown, a switch; refined as windows finish
        self.start_cost_s = 10.0  # per server start: ready + stop; refined as starts finish
        self.starts = Starts(run_dir, self.exp, self.arms, self.s["ready_timeout_s"], self._sleep, self.procs)
        self.nvml: Nvml | None | bool = None  # opened once per run (False: NVML did not initialise)
        self.schedule: Schedule | None = None  # the current window's load schedule (its level and phase by time)
        self.rounds_done = 0  # rounds whose windows are all done, counted when a window begins or ends
        self._progress_t = 0.0

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

    @property
    def plan(self) -> list[PlannedWindow]:
        """The windows this run runs: the plan less what a sequential stop left out."""
        return windows_to_run(self.planned, self.log.plan_not_run)

    def _save(self) -> None:
        rec.write_json(self.run / "manifest.json", {**self.m, **self.log.to_dict()})

    # --- preparation (images, model): before the first start, outside every ready timeout ---------------------

    def prepare(self) -> None:
        cmds = images(self.exp)
        if not cmds or (self.log.preparation or {}).get("ok"):
            return
        steps = []
        with open(self.run / "prepare.log", "ab") as log:
            for c in cmds:
                print(f"preparing (before the first start, untimed): {c.what}", flush=True)
                t0 = time.monotonic()
                proc = subprocess.Popen(c.argv, cwd=ROOT, env={**os.environ, **c.env}, stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
                self.procs.append(proc)
                while proc.poll() is None:
                    if self.stop:
                        stop_group(proc)
                        raise Interrupted
                    time.sleep(0.5)
                steps.append({"what": c.what, "rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1)})
                self.log.preparation = {"ok": False, "steps": steps}
                self._save()
                if proc.returncode != 0:
                    raise PreparationFailed(f"{c.what} failed (exit {proc.returncode}; see prepare.log)")
        self.log.preparation = {"ok": True, "steps": steps}
        self._save()

    def pin_cpus(self) -> None:
        """A GPU server gets one NUMA node (docker/serve.sh, the same loadtest.pinning plan): the runner and every
        Locust process it starts from now on run on the other CPUs. The plan and the governor go in the manifest."""
        try:
            plan = pinning.plan(int(os.environ.get("SERVER_NUMA_NODE") or 0))
        except ValueError as e:
            raise PreparationFailed(str(e)) from None
        self.log.cpu = pinning.describe(plan)
        if self.s.get("backend") == "vllm":
            self.log.cpu["load_generator_affinity"] = pinning.format_cpulist(pinning.pin_load_generator(plan))
        self._save()

    # --- server starts --------------------------------------------------------------------------------------

    def _control_extra(self, w: PlannedWindow) -> dict:
        """What a window's control writes carry beyond variant, observe and epoch (plan.control_extra): its arm's
        positive-control delay, and its simulator settings in designs that share a start between the arms (so a
        switch sets them, and switching back resets them)."""
        return control_extra(self.arms[w.spec], self.design["name"] in SWAPPED)

    def _start_arm(self, w: PlannedWindow) -> str:
        """The arm whose server a window's start runs: arm A's for a start shared by both arms (hot swap)."""
        return "A" if self.design["name"] in SWAPPED else w.spec

    # --- one window ----------------------------------------------------------------------------------------

    def _fresh_folder(self, block_id: str) -> Path:
        """blocks/<id>/, with an earlier attempt moved aside to attempts/<id>.<n>: records are never mixed."""
        bdir = self.run / "blocks" / block_id
        if bdir.exists():
            attempts = self.run / "attempts"
            attempts.mkdir(exist_ok=True)
            n = sum(1 for p in attempts.iterdir() if p.name.startswith(block_id + "."))
            shutil.move(str(bdir), str(attempts / f"{block_id}.{n + 1}"))
        bdir.mkdir(parents=True)
        return bdir

    def run_window(self, i: int, w: PlannedWindow, attempt: int) -> dict:
        failed_before = previous_failures(self.run / "blocks" / w.block_id / "block.json")
        bdir = self._fresh_folder(w.block_id)
        meta = rec.BlockRecord(block_id=w.block_id, round=w.round, kind=w.kind, arm=w.arm,
                               variant=w.variant, start=-1, position=w.position, levels=list(w.levels),
                               attempt=attempt, started=utc(), failed_before=failed_before,
                               code_fingerprint=code_fingerprint())
        if self.m.get("code_fingerprint") and meta.code_fingerprint != self.m["code_fingerprint"]:
            print(f"\n!!! window {w.block_id}: the suite's code changed since this run started (sources "
                  f"{self.m['code_fingerprint']} -> {meta.code_fingerprint}): its windows no longer run one code; "
                  "the report warns", file=sys.stderr, flush=True)
        rec.write_json(bdir / "block.json", meta.to_dict())
        locust = tele = None
        st: Start | None = None
        t0 = time.monotonic()
        self.schedule = None
        self.rounds_done = self._rounds_done()
        self.write_progress("starting", i, w)
        try:
            st = self.starts.ensure(w.start, self._start_arm(w), w.variant, w.spec,
                                    observe=self.scenario.steps[0].count_s <= 0, extra=self._control_extra(w),
                                    meta=meta)
            meta.start, meta.server_url = st.record.start, st.url
            st.record.windows.append(w.block_id)
            st.save()
            count = st.control is not None and self.scenario.steps[0].count_s > 0
            switch = st.control is not None and st.spec != w.spec
            if st.control is not None:
                meta.epoch = st.next_epoch - 1
                st.next_epoch += epochs_per_window(len(w.order))
            settle = self.design.get("settle_s", 0.0) if switch else 0.0
            meta.timing["settle_s"] = settle
            window_scenario(self.scenario, w.order, bdir / "scenario.yaml", count=count, settle_s=settle,
                            block_id=w.block_id)
            self.schedule = Schedule(load_scenario(str(bdir / "scenario.yaml")), count=count)
            tele = Telemetry(bdir / "telemetry.jsonl", st.server.proc.pid, nvml=self.nvml or None,
                             suite_pid=os.getpid() if self.s.get("backend") in ("sim", "vllm-cpu") else None).start()
            with open(bdir / "locust.log", "wb") as log:
                locust = subprocess.Popen(
                    locust_cmd(bdir, st.url, w.variant, st.control, meta.epoch, self.s.get("request_timeout_s"),
                               self._control_extra(w), self.exp),
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
            self.procs.append(locust)
            t_load = time.monotonic()
            holds = PhaseHold.most_s(self.scenario, self.scenario.request_limit_s(self.s.get("request_timeout_s")),
                                     count)
            self._watch_load(i, w, bdir, st.server, locust, t_load, window_seconds(self.scenario, count) + settle,
                             holds)
            meta.timing["load_s"] = round(time.monotonic() - t_load, 2)
            tele.stop()
            tele = None
            meta.requests, why = judge(w.variant, bdir)
            broken = oc.every_request_failed(meta.requests)
            if broken:
                raise BrokenStart(f"{broken}: server start {st.record.start} ended, the round reruns")
            why = self._after_load(w, st, bdir, meta, switch, why)
            meta.status, meta.reason = ("complete", None) if why is None else ("invalid", why)
            if why is not None:
                print(f"\n!!! INVALID WINDOW {w.block_id}: {why}", file=sys.stderr, flush=True)
        except Interrupted:
            meta.status, meta.reason = "interrupted", "SIGINT/SIGTERM during the window"
            stop_group(locust, signal.SIGINT, LOCUST_STOP_S)
            raise
        except (RuntimeError, OSError, ValueError) as e:
            meta.status, meta.reason = "failed", str(e)
            if isinstance(e, BrokenStart) and self.starts.active is not None:
                meta.timing["stop_s"] = self.starts.stop("failed", f"window {w.block_id}: {e}")
            elif st is not None and not st.server.alive():
                meta.timing["stop_s"] = self.starts.stop("failed", f"server died during window {w.block_id} "
                                                                  f"(exit {st.server.proc.returncode}; see server.log)")
        finally:
            if tele is not None:
                tele.stop()
            stop_group(locust, signal.SIGINT, LOCUST_STOP_S)
            if meta.status == "interrupted":
                meta.timing["stop_s"] = self.starts.stop("interrupted", "SIGINT/SIGTERM during a window")
            elif self.starts.active is not None and self.starts.active.planned == w.start and last_of_start(self.plan, w):
                meta.timing["stop_s"] = self.starts.stop()  # this window's start ends here: its stop lands here
            meta.timing = {k: v for k, v in meta.timing.items() if v is not None}
            meta.timing["total_s"] = round(time.monotonic() - t0, 2)
            meta.ended = utc()
            rec.write_json(bdir / "block.json", meta.to_dict())
            start_cost = sum(meta.timing.get(k) or 0.0 for k in ("ready_s", "stop_s"))
            if start_cost and "ready_s" in meta.timing:  # the window that began a start: its ready (+ stop)
                self.start_cost_s = start_cost
            self.overhead_s = max(5.0, time.monotonic() - t0 - self.window_s - start_cost)
            self.rounds_done = self._rounds_done()
        return meta.to_dict()

    def _after_load(self, w: PlannedWindow, st: Start, bdir: Path, meta: rec.BlockRecord, switch: bool,
                    why: str | None) -> str | None:
        """The switch (confirmed from the counters), requests that spanned one, and the arm's evidence check
        (loadtest.window_check judges; the start's record keeps what they found)."""
        counters, _ = rec.read_jsonl(bdir / "counters.jsonl", rec.COUNTERS_SCHEMA)
        requests, _ = rec.read_jsonl(bdir / "requests.jsonl", rec.REQUEST_SCHEMA)
        if st.control is not None:
            if switch:
                sw, unconfirmed = confirm_switch(counters, w.block_id, w.variant)
                if sw is not None:
                    st.record.switches.append(sw)
                why = why or unconfirmed
            # the control file names the window's variant (and its arm's settings) from its first write on
            if any(c.get("kind") == "control" for c in counters):
                st.variant, st.spec = w.variant, w.spec
        meta.requests["spanning"] = spanning(requests, st.record.switches)
        if meta.requests["spanning"]["measure"]:
            why = why or f"{meta.requests['spanning']['measure']} measured requests spanned a switch"
        try:
            log = (st.dir / "server.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            log = ""
        arm = self.arms[w.spec]
        ok, reason = arm_evidence(arm, log, counters, shared_start=self.design["name"] in SWAPPED)
        ev = st.record.evidence or {"ok": True, "reason": None, "windows": {}}
        ev["windows"][w.block_id] = {"ok": ok, "reason": reason}
        ev["ok"] = ev["ok"] and ok
        ev["reason"] = reason if not ok else ev["reason"]
        st.record.evidence = ev
        st.save()
        return why or (None if ok else f"evidence check of arm {w.spec} ({arm.label}) failed: {reason}")

    def _watch_load(self, i: int, w: PlannedWindow, bdir: Path, server: ServerProcess, locust: subprocess.Popen,
                    t_load: float, length_s: float, holds_s: float = 0.0) -> None:
        """Until Locust exits: progress, and RuntimeError when the server dies, Locust hangs, crashes or wrote nothing.
        Hung means past the scenario's length, the most its phase holds can add (loadtest.shape.PhaseHold) and a
        grace."""
        while locust.poll() is None:
            if self.stop:
                raise Interrupted
            if not server.alive():
                raise RuntimeError(f"server died during the load (exit {server.proc.returncode}; see server.log)")
            el = time.monotonic() - t_load
            if el > length_s + holds_s + LOCUST_GRACE_S:
                raise RuntimeError(f"Locust still running {el:.0f} s after start (scenario {length_s:.0f} s, holds at "
                                   f"most {holds_s:.0f} s)")
            self.show(i, w, el, length_s)
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

    # --- progress -----------------------------------------------------------------------------------------

    def _rounds_done(self) -> int:
        return sum(all(m.get("status") in DONE for m in self._metas(ws).values())
                   for ws in rounds_of(list(self.plan)))

    def _left_s(self, i: int, elapsed: float, length_s: float) -> float:
        """The run's estimated seconds left: the rest of this window, then the planned windows after it at the
        window's length plus the per-window overhead measured so far, and the server starts still to come at the
        last start's ready + stop time (a start's minute is not spread over every window)."""
        later = list(self.plan)[i + 1:]
        starts_left = len({x.start for x in later} - {self.plan[i].start})
        return (max(0.0, length_s - elapsed) + len(later) * (self.window_s + self.overhead_s)
                + starts_left * self.start_cost_s)

    def write_progress(self, state: str, i: int | None = None, w: PlannedWindow | None = None,
                       elapsed: float | None = None, length_s: float | None = None) -> Progress:
        """Replace <run>/progress.json (ttsrecords.progress.Progress): what the console line says, for the dashboard."""
        plan = self.plan
        ph = self.schedule.at(elapsed) if self.schedule is not None and elapsed is not None else None
        if i is not None and elapsed is None:
            elapsed, length_s = 0.0, self.window_s + (self.design.get("settle_s") or 0.0)
        p = Progress(
            t=round(time.time(), 3), state=state, status=self.log.status,
            rounds_done=self.rounds_done, rounds_planned=len({x.round for x in plan}), windows_planned=len(plan),
            round=None if w is None else w.round, kind=None if w is None else w.kind,
            window=None if i is None else i + 1, block_id=None if w is None else w.block_id,
            arm=None if w is None else w.arm,
            label=None if w is None else (w.variant or self.arms[w.spec].label),
            level=None if ph is None else ph.concurrency, phase=None if ph is None else ph.phase,
            elapsed_s=None if elapsed is None else round(elapsed, 1),
            length_s=None if length_s is None else round(length_s, 1),
            left_s=None if i is None else round(self._left_s(i, elapsed, length_s), 1))
        rec.write_json(self.run / PROGRESS_FILE, p.to_dict())
        self._progress_t = time.monotonic()
        return p

    def show(self, i: int, w: PlannedWindow, elapsed: float, length_s: float) -> None:
        left = self._left_s(i, elapsed, length_s)
        rounds = len({x.round for x in self.plan})
        self.progress(f"round {w.round + 1}/{rounds} ({w.kind.upper()}) · window {i + 1}/{len(self.plan)} "
                      f"{w.arm}={w.variant or self.arms[w.spec].label} · {elapsed:.0f}/{length_s:.0f} s · "
                      f"~{left / 60:.1f} min left")
        if time.monotonic() - self._progress_t >= PROGRESS_EVERY_S:
            self.write_progress("load", i, w, elapsed, length_s)

    # --- rounds ---------------------------------------------------------------------------------------------

    def _metas(self, windows: list[PlannedWindow]) -> dict[str, dict]:
        return {w.block_id: rec.read_json(self.run / "blocks" / w.block_id / "block.json") or {}
                for w in windows}

    def todo(self, windows: list[PlannedWindow]) -> tuple[list[PlannedWindow], int] | None:
        """What a round still needs, (windows, attempt), or None when it is done or gave up (failed too often).
        A round with a failed window reruns whole in the next attempt; else fresh resumes window by window and
        swap/nested rerun the whole round (its two windows belong in one server start)."""
        metas = self._metas(windows)
        status = {k: v.get("status") for k, v in metas.items()}
        if all(s in DONE for s in status.values()):
            return None
        attempt = max((int(v.get("attempt") or 0) for v in metas.values() if v), default=0)
        if any(s == "failed" for s in status.values()):
            if attempt >= FAILED_RERUNS_MAX:
                return None
            return list(windows), attempt + 1
        if self.design["name"] == "fresh":
            return [w for w in windows if status[w.block_id] not in DONE], attempt
        return list(windows), attempt

    def run_round(self, windows: list[PlannedWindow], todo: list[PlannedWindow], attempt: int) -> None:
        while True:
            failed = None
            for w in windows:
                if w not in todo:
                    continue
                if self.stop:
                    raise Interrupted
                meta = self.run_window(self.plan.index(w), w, attempt)
                print(f"\rwindow {w.block_id}: {meta['status']}" + (f" — {meta['reason']}" if meta["reason"] else "")
                      + (f" (attempt {attempt})" if attempt else "") + " " * 20, flush=True)
                if meta["status"] == "failed" and attempt < FAILED_RERUNS_MAX:
                    failed = meta
                    break
            if failed is None:
                return
            attempt += 1
            todo = list(windows)
            self.log.reruns.append({"round": w.round, "attempt": attempt,
                                                    "because": f"{failed['block_id']}: {failed['reason']}"})
            self._save()
            print(f"round {w.round}: window {failed['block_id']} failed; its round runs again at once "
                  f"(attempt {attempt})", flush=True)

    # --- sequential looks -------------------------------------------------------------------------------------

    def look(self, windows: list[PlannedWindow]) -> bool:
        """After a completed unit (a round; a server start in a nested design): run the sequential look and say
        whether the run stops here. Its log goes under runsettings.LOOK_LOG, beside the settings it reads."""
        if self.log.sequential_looks is None:
            self.log.sequential_looks = {"looks": 0, "look_errors": [], "ignored_stops": []}
        log = self.log.sequential_looks
        self.write_progress("look")
        cmd = look_command(self.run)
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=LOOK_TIMEOUT_S)
            err = None if p.returncode == 0 else ((p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1])
        except (OSError, subprocess.SubprocessError) as e:
            err = f"{type(e).__name__}: {e}"
        try:
            line = None if err else last_look(self.run)
        except ValueError as e:
            line, err = None, str(e)
        if err is None and (line is None or not isinstance(line.get("stop"), bool)):
            err = "looks.jsonl has no line with a boolean 'stop'"
        r = windows[0].round
        plan = self.plan
        if err is not None:
            left = len({x.round for x in plan if x.round > r})
            print(f"warning: sequential look after round {r} failed ({err}); this look cannot stop the run, "
                  + (f"{left} round(s) left: the next look or the last round ends it" if left else
                     "and it was the last round"), file=sys.stderr, flush=True)
            log["look_errors"].append({"round": r, "error": err[:300]})
            self._save()
            return False
        log["looks"] += 1
        if not line["stop"]:
            self._save()
            return False
        ab_done, why = rs.stop_refused(plan, r, rs.sequential_of(self.m)["min_rounds"])
        if why is not None:
            log["ignored_stops"].append({"round": r, "why": why})
            self._save()
            return False
        log["stopped"] = {"after_round": r, "ab_rounds": ab_done, "reason": line.get("reason"), "look": line}
        self.log.plan_not_run = [x for x in plan if x.round > r]
        self._save()
        print(f"sequential: stop after round {r} ({ab_done} A/B rounds): {line.get('reason')}", flush=True)
        return True

    # --- the run --------------------------------------------------------------------------------------------

    def _collect_switches(self) -> list[dict]:
        out = []
        for p in sorted((self.run / "starts").glob("*/start.json")):
            s = rec.read_json(p) or {}
            out += [{"start": s.get("start"), **sw} for sw in s.get("switches") or []]
        return out

    def execute(self) -> str:
        """Run every round not done yet; returns the run status."""
        self.install_signals()
        self.log.status = "running"
        self.nvml = Nvml.open() or False
        self.log.telemetry = describe_telemetry(self.nvml or None, self.s.get("backend", "sim"))
        self._save()
        try:
            self.pin_cpus()
            self.prepare()
            for windows in rounds_of(list(self.plan)):
                if self.stop:
                    raise Interrupted
                need = self.todo(windows)
                if need is None:
                    metas = self._metas(windows)
                    gave_up = [k for k, v in metas.items() if v.get("status") == "failed"]
                    if gave_up:
                        print(f"round {windows[0].round}: failed {FAILED_RERUNS_MAX + 1} times, not run again "
                              f"({', '.join(gave_up)})", flush=True)
                    continue
                self.run_round(windows, *need)
                seq = rs.sequential_of(self.m)
                if seq and rs.look_due(self.plan, windows[0].round, seq) and self.look(windows):
                    break
            self.log.status = "complete"
        except Interrupted:
            self.log.status = "interrupted"
        except PreparationFailed as e:
            self.log.status, self.log.reason = "failed", str(e)
            print(f"error: {e}", file=sys.stderr, flush=True)
        finally:
            self.starts.stop("interrupted" if self.log.status == "interrupted" else "stopped",
                            "SIGINT/SIGTERM" if self.log.status == "interrupted" else None)
            for p in self.procs:
                stop_group(p)
            self.log.switches = self._collect_switches()
            self.log.ended = utc()
            self._save()
            self.rounds_done = self._rounds_done()
            self.write_progress("ended")
        return self.log.status

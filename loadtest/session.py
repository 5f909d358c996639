"""Run-level state of one Locust process (local, master or worker): options, phase, records, counters, merge.

tts.py only wires Locust events to this. Roles:
- local: runs the shape, the users, writes requests.jsonl, counters.jsonl and manifest.json itself.
- master: runs the shape and the scraper, broadcasts each phase to the workers, appends the record lines the
  workers send into one requests.jsonl and, at test stop, waits until every worker has sent its last batch.
- worker: runs users, writes its own workers/<id>.requests.jsonl and ships the same lines to the master.
"""

from __future__ import annotations

import json
import logging
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loadtest.breaker import HEALTH_EVERY_S, HEALTH_TIMEOUT_S, Breaker, utc_clock
from loadtest.client import GeventTransport, Outcome, run_request
from loadtest.locust_cli import DEFAULT_SCENARIO, anchored, one_level
from loadtest.prompts import PayloadCache, PromptSequence, load_corpus, load_voice
from loadtest.provenance import git_revision
from loadtest.scenario import load_scenario
from loadtest.scraper import Scraper
from loadtest.server_info import read_identity, variant_conflict, with_label
from loadtest.server_process import health, wait_healthy
from loadtest.shape import (
    CONFIRM,
    SNAPSHOT,
    WRITE,
    EdgeAction,
    Phase,
    PhaseHold,
    PhaseTracker,
    Schedule,
    count_epoch,
    edge_actions,
)
from tts_predictor.control import MAX_HOST_DELAY_US, write_control
from tts_predictor.domain import MODEL_NAME, TINY_MODEL_PREFIX, VARIANT_NAMES
from ttsrecords.loadrun import LoadManifest, ServerIdentity
from ttsrecords.records import (
    CUT_AT_LEVEL_END,
    RUN_SCHEMA,
    ControlConfirm,
    ControlWrite,
    JsonlWriter,
    RequestRecord,
    dumps,
)
from ttsrecords.scenario import Scenario

log = logging.getLogger("loadtest")
MSG_PHASE = "tts_phase"
MSG_RECORDS = "tts_records"
MSG_FLUSH = "tts_flush"
SHIP_INTERVAL_S = 1.0
# Closed loop: after a request that could not even connect (server dead or restarting), the user waits this long
# before its next try, so a dead server yields a few failure records per second per user, not thousands.
CONNECT_BACKOFF_S = 0.25
FINAL_WAIT_S = 20.0
# How long the count edge waits for the server to show its control write (it applies it at its next step, ~5-400 ms
# under load) before the count_start snapshot; at least this, at most the count phase itself.
CONFIRM_MIN_S = 1.0
# The count phase's look (has the observer seen a call?) starts this long before the phase's scheduled end, so its
# answer is usually there when the end comes and a phase that saw calls is not held at all.
LOOK_AHEAD_S = 2.0
# The first requests of a run: when every one of them failed with the same 4xx status and error, the server refuses
# what we send (wrong model name, bad body); the run stops with that cause instead of sending thousands more.
FAIL_FAST_REQUESTS = 8
FAIL_FAST_EXIT = 3
FAILED_EXIT = 3  # the run stopped because the server stopped answering (loadtest.breaker)
INTERRUPTED_EXIT = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal, as a shell reports it
MODELS_TIMEOUT_S = 10.0
REPORT_TIMEOUT_S = 300.0
# SIGTERM / Ctrl-C: requests in flight get this long to finish and be recorded, then the users are stopped (a normal
# end waits up to the request timeout; an operator who interrupts wants the prompt back).
INTERRUPT_GRACE_S = 5.0


class TTSFailure(Exception):
    """What Locust shows for a failed request: the client's reason."""


def wait_ready(host: str, timeout_s: float, *, clock=time.monotonic, sleep=time.sleep, check=health) -> None:
    """Wait until <host>/health answers 200 (loadtest.server_process.wait_healthy); ValueError with the last reason
    after timeout_s, or for a host that is not an http(s) URL."""
    if urlsplit(host).scheme not in ("http", "https") or not urlsplit(host).hostname:
        raise ValueError(f"--host must be http(s)://host[:port], got {host!r}")
    try:
        wait_healthy(host, timeout_s, clock=clock, sleep=sleep, check=check)
    except TimeoutError as e:
        raise ValueError(f"server {host} {e}; is it running? (--ready-timeout sets the wait)") from None


@dataclass(frozen=True)
class ModelList:
    """What <host>/v1/models answered, read once when a run starts: its entries, or why there are none."""

    host: str
    entries: tuple[dict, ...] = ()
    failure: str | None = None  # the exception's name when the endpoint did not answer with a model list


def read_models(host: str, *, get=None) -> ModelList:
    """<host>/v1/models (a non-200 answer lists nothing). Never raises."""
    import httpx

    try:
        resp = (get or httpx.get)(f"{host}/v1/models", timeout=MODELS_TIMEOUT_S)
        if resp.status_code != 200:
            return ModelList(host)
        data = resp.json()["data"]
        if not all(isinstance(m, dict) for m in data):
            raise TypeError("a model entry is not an object")
        return ModelList(host, tuple(data))
    except Exception as e:  # noqa: BLE001  (any failure means: no list)
        return ModelList(host, failure=type(e).__name__)


def served_model(models: ModelList) -> tuple[str, str]:
    """(model name, why): what the server lists (the suite's MODEL_NAME when listed, else the first), or MODEL_NAME
    when the endpoint does not answer with a model list."""
    where = f"{models.host}/v1/models"
    if models.failure:
        return MODEL_NAME, f"{where} did not answer ({models.failure}); sending {MODEL_NAME}"
    ids = [m["id"] for m in models.entries if isinstance(m.get("id"), str)]
    if MODEL_NAME in ids:
        return MODEL_NAME, f"{where} serves {MODEL_NAME}"
    if ids:
        return ids[0], f"{where} serves {', '.join(ids)}; sending {ids[0]}"
    return MODEL_NAME, f"{where} lists no model; sending {MODEL_NAME}"


def fixed_length_model(models: ModelList) -> str | None:
    """Why the audio-length check is off for this server, or None (on): the real CPU server's tiny random model (its
    /v1/models root is the suite's TINY_MODEL_PREFIX folder) answers 63 codec frames whatever the text, so a length
    band drawn from the text would fail every longer prompt."""
    tiny = [r for r in (str(m.get("root") or "") for m in models.entries) if Path(r).name.startswith(TINY_MODEL_PREFIX)]
    if not tiny:
        return None
    return (f"off: {models.host} serves the suite's tiny random model ({Path(tiny[0]).name}), whose audio length does "
            "not follow the text")


class FailFast:
    """Watches the first FAIL_FAST_REQUESTS outcomes of a run; `add` returns the cause once all of them failed with
    the same 4xx status and error, and None otherwise (decided for good at the first that differs)."""

    def __init__(self, n: int = FAIL_FAST_REQUESTS):
        self.n, self.first, self.count, self.done = n, None, 0, False

    def add(self, ok: bool, status: int | None, error: str | None) -> str | None:
        if self.done:
            return None
        key = (status, error)
        if ok or status is None or not 400 <= status < 500 or (self.first is not None and key != self.first):
            self.done = True
            return None
        self.first = key
        self.count += 1
        if self.count < self.n:
            return None
        self.done = True
        return f"the first {self.n} requests all failed with HTTP {status}: {error}"


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class Session:
    """One per process; created in Locust's init event."""

    def __init__(self, environment, role: str):
        self.env = environment
        self.role = role  # local | master | worker
        self.opts = environment.parsed_options
        self.run: dict[str, Any] | None = None  # what the master broadcasts: run id, dir, scenario, mode, ...
        self.scenario: Scenario | None = None
        self.phase: Phase | None = None
        self._phase_t = time.monotonic()  # when `phase` was set: a drain request's time left to its level's end
        self.tracker: PhaseTracker | None = None
        self.scraper: Scraper | None = None
        self.requests_writer: JsonlWriter | None = None
        self.counters_writer: JsonlWriter | None = None
        self._prompts: PromptSequence | None = None
        self._payloads: PayloadCache | None = None
        self._bounds = None
        self._arrivals = None
        self._pending: list[str] = []
        self._sent = 0
        self._final_sent = False
        self.edges: EdgeRunner | None = None
        self._actor = None  # the greenlet that runs the edge actions in order
        self.workers: dict[str, dict[str, Any]] = {}  # master: node id -> {label, received, sent, final}
        self.started = None
        self.finished = False
        self.inflight = 0  # open loop: requests running in this process
        self.hold: PhaseHold | None = None
        self._looking = None  # the greenlet of the count-phase look in flight
        self._seen: dict[int, bool | None] = {}  # step -> has its count phase seen a predictor call (last look)
        self._flush_sent = False
        self._fail_fast = FailFast()
        self.aborted: str | None = None  # why the run stops early (the shape ends at its next tick)
        self.status: str | None = None  # failed | interrupted once decided; complete when the schedule ran out
        self.stopped: float | None = None  # when the cause was seen
        self.completed = False  # the schedule ran to its end
        self.breaker: Breaker | None = None
        self.server = ServerIdentity()
        self.level_from: str | None = None  # the line that said how -u/-r/-t became the run's level
        self._health = None  # the greenlet that looks at /health
        if role in ("local", "master"):
            self._prepare_run()

    # --- setup ------------------------------------------------------------------------------------------

    def _prepare_run(self) -> None:
        o = self.opts
        scenario = self._scenario(o)  # ScenarioError: caller turns it into a clear exit
        mode = scenario.mode if o.mode in ("", "scenario", None) else o.mode
        seed = scenario.seed if o.seed is None or o.seed < 0 else o.seed
        run_dir = o.run_dir or os.path.join("reports", f"locust-{utc_stamp()}")
        host = (o.host or "").rstrip("/")
        if o.metrics_url == "none":
            targets = []
        elif o.metrics_url:
            targets = [u.strip() for u in o.metrics_url.split(",") if u.strip()]
        else:
            targets = [host + "/metrics"] if host else []
        load_corpus(scenario.prompts)  # fail now, with the file name, rather than in every user
        load_voice(scenario.voice)
        if o.variant and o.variant not in VARIANT_NAMES:
            raise ValueError(f"unknown variant {o.variant!r} (known: {', '.join(VARIANT_NAMES)})")
        if not host:
            raise ValueError("--host is required (the server URL, e.g. http://127.0.0.1:8091)")
        if o.request_timeout < 0 or o.ready_timeout < 0:
            raise ValueError("--request-timeout and --ready-timeout must not be negative")
        control = o.control or None
        if control is not None:
            if not o.variant:
                raise ValueError("--control needs --variant (the variant the count phases write into the file)")
            if not Path(control).parent.is_dir():
                raise ValueError(f"--control {control}: no such folder")
            if o.control_epoch < 0:
                raise ValueError("--control-epoch must not be negative")
        control_sim = None
        if o.control_sim:
            try:
                control_sim = json.loads(o.control_sim)
            except ValueError:
                control_sim = None
            if control is None or not isinstance(control_sim, dict):
                raise ValueError('--control-sim wants a JSON object and --control, e.g. \'{"model.extra_step_pct": 1}\'')
        delay_us = float(o.control_host_delay_us or 0.0)
        if delay_us and (control is None or not 0 < delay_us <= MAX_HOST_DELAY_US):
            raise ValueError(f"--control-host-delay-us wants --control and a value above 0 and at most "
                             f"{MAX_HOST_DELAY_US} (microseconds)")
        if o.ready_timeout:
            wait_ready(host, o.ready_timeout)  # before any file is written: an unreachable server leaves nothing
        variant = self._variant(o, targets, control)  # ValueError: --variant names another variant than the server's
        models = read_models(host)  # once: the model to send and whether answer lengths follow the text
        model = o.model
        if not model:
            model, why = served_model(models)
            log.info("model: %s", why)
        audio_check = fixed_length_model(models)
        if audio_check:
            log.info("audio-length check %s", audio_check)
        if not getattr(o, "keep_going", False):
            self.breaker = Breaker()
        self.run = {
            "run_id": Path(run_dir).name, "run_dir": run_dir, "scenario": scenario.to_dict(), "mode": mode,
            "seed": seed, "variant": variant, "model": model, "request": o.request, "host": host, "metrics_urls": targets,
            "timeout_s": scenario.request_limit_s(o.request_timeout), "control": control,
            "control_epoch": o.control_epoch if control else None, "control_sim": control_sim,
            "control_host_delay_us": delay_us or None, "audio_check": audio_check,
        }
        self.scenario = scenario
        self.tracker = PhaseTracker(Schedule(scenario, count=control is not None))
        self.hold = PhaseHold(self.run["timeout_s"])
        if not getattr(self.env, "stop_timeout", None):
            # A user the shape stops (a lower level follows: the seeded level order goes down as often as up, and
            # the end of the run) finishes the request it is in, bounded by the request timeout, so that request
            # is recorded with the phase it started in. Killed mid-request, it would vanish from the measure window
            # it ran in and bias that window's throughput low (seen: -25 % at c=64 when a lower level followed).
            self.env.stop_timeout = self.run["timeout_s"]

    def _scenario(self, o) -> Scenario:
        """--scenario; else one level from Locust's -u/-r/-t (said in one line); else the default sweep."""
        if o.scenario:
            return load_scenario(o.scenario)
        users, rate, run_time = o.num_users, o.spawn_rate, o.run_time
        if users is None and rate is None and run_time is None:
            return anchored(load_scenario(DEFAULT_SCENARIO))
        scenario, self.level_from = one_level(anchored(load_scenario(DEFAULT_SCENARIO)), users, rate, run_time)
        o.run_time = None  # the shape ends the run (Locust would add a timer of its own after the shape)
        print(self.level_from, file=sys.stderr, flush=True)
        return scenario

    def _variant(self, o, targets: list[str], control: str | None) -> str | None:
        """The variant label of the records: the server's own (its /metrics), --variant only where the server reports
        none or this run switches it (--control). --variant that names another variant than the server: ValueError."""
        if control is not None:  # the count phases write --variant into the control file: the run sets the variant
            self.server = read_identity(targets[0] if targets else None)
            return o.variant
        ident = read_identity(targets[0] if targets else None)
        conflict = variant_conflict(o.variant or None, ident)
        if conflict:
            raise ValueError(conflict)
        self.server, label = with_label(ident, o.variant or None)
        log.info("server: variant %s (%s), %s, backend %s", self.server.variant, self.server.variant_source,
                 self.server.version, self.server.backend)
        return label

    def _adopt(self, run: dict[str, Any]) -> None:
        """Build the per-process request machinery from the run description (workers get it by message)."""
        if self._prompts is not None and self.run and self.run["run_id"] == run["run_id"]:
            return
        self.run = run
        self.scenario = Scenario.from_dict(run["scenario"])
        corpus = load_corpus(self.scenario.prompts)
        voice = load_voice(self.scenario.voice)
        self._bounds = corpus.bounds
        self._prompts = PromptSequence(corpus, self.scenario.mix, run["seed"], self.worker_index)
        self._payloads = PayloadCache(voice, model=run["model"], language=self.scenario.language, mode=run["mode"],
                                      kind=run.get("request", "base"))
        self._arrivals = random.Random(f"tts-arrivals:{run['seed']}:{self.worker_index}")

    @property
    def worker_index(self) -> int:
        return max(0, int(getattr(self.env.runner, "worker_index", 0) or 0)) if self.role == "worker" else 0

    @property
    def worker_label(self) -> str:
        return f"w{self.worker_index}" if self.role == "worker" else "local"

    def _open_writers(self) -> None:
        run_dir = Path(self.run["run_dir"])
        if self.role == "worker":
            if self.requests_writer is None:
                self.requests_writer = JsonlWriter(run_dir / "workers" / f"{self.worker_label}.requests.jsonl")
            return
        if self.requests_writer is None:
            self.requests_writer = JsonlWriter(run_dir / "requests.jsonl")
        if self.counters_writer is None:
            self.counters_writer = JsonlWriter(run_dir / "counters.jsonl")
            self.scraper = Scraper(self.run["metrics_urls"], self.counters_writer.write,
                                   variant_hint=self.run["variant"])
            self.edges = EdgeRunner(self.scraper, self.counters_writer.write, self.run.get("control"),
                                    self.run["variant"], self.scenario, sim=self.run.get("control_sim"),
                                    host_delay_us=self.run.get("control_host_delay_us"))

    # --- shape (local / master) -------------------------------------------------------------------------

    def tick(self, run_time: float) -> tuple[int, float] | None:
        """LoadTestShape.tick: publish phase edges, run their edge actions (control writes, scrapes), return (users,
        spawn rate)."""
        if self.started is None:
            self.started = time.time()
            self._open_writers()
            if self.role == "local":
                self._adopt(self.run)
            self._watch_health()
        ready = self._phase_ready if self.edges is not None and not self.aborted else None
        cur, t = self.tracker.current, run_time - self.hold.held_s
        if ready is not None and cur is not None and cur.phase == "count" and t >= cur.ends - LOOK_AHEAD_S:
            self._look(cur.step)
        phase, transitions = self.tracker.tick(self.hold.schedule_time(run_time, cur, ready))
        base = self.run.get("control_epoch")
        for old, new in transitions:
            held = self.hold.by_phase.get((old.step, old.phase)) if old is not None else None
            if held:
                why = ("the sync observer saw a predictor call" if old.phase == "count" else
                       "the server showed the observer-off write")
                log.warning("step %d concurrency %d: %s phase held %.1f s past its end until %s (at most %g s)",
                            old.step, old.concurrency, old.phase, held, why, self.hold.limit_s)
            self._queue(edge_actions(old, new, base))
        if transitions:
            self.set_phase(phase)
            if self.role == "master" and phase is not None:
                self.env.runner.send_message(MSG_PHASE, {"run": self.run, "phase": phase.to_dict()})
        if phase is None or self.aborted:
            self.completed = self.completed or (phase is None and not self.aborted)
            self.flush_workers()  # headless Locust quits without telling workers to stop first
            return None
        return phase.users, self.scenario.spawn_rate

    def _look(self, step: int) -> None:
        """Ask the server, in the background, whether the count phase of `step` has seen a predictor call (a scrape
        of the real CPU server took up to 15 s: the tick must not wait for it); one look at a time."""
        import gevent

        if self._looking is not None and not self._looking.ready():
            return

        def look() -> None:
            self._seen[step] = self.edges.scraper.count_moved(step)

        self._looking = gevent.spawn(look)

    def _phase_ready(self, phase: Phase) -> bool | None:
        """PhaseHold's question at a due phase end. Count phase: the last finished look's answer (False, not seen
        yet, before one has finished). Warm-up after a count phase: has the server shown the observer-off write
        (False while its confirmation is still waiting; None once it gave up)?"""
        if phase.phase == "count":  # the tick started the look (LOOK_AHEAD_S before this end)
            return self._seen.get(phase.step, False)
        base = self.run.get("control_epoch")
        if base is None or not any(p.phase == "count" and p.step == phase.step for p in self.tracker.schedule.phases):
            return None  # no count phase before this warm-up: no observer-off write to wait for
        return self.edges.shown(count_epoch(base, phase.step, False))

    def _queue(self, actions: list[EdgeAction]) -> None:
        """Run edge actions in one greenlet, in order (a confirm may wait; the users go on meanwhile)."""
        import gevent

        if not actions or self.edges is None:
            return
        self.edges.pending.extend(actions)
        if self._actor is None or self._actor.ready():
            self._actor = gevent.spawn(self.edges.run_pending, gevent.sleep)

    def set_phase(self, phase: Phase | None) -> None:
        self.phase = phase
        self._phase_t = time.monotonic()
        if phase is not None:
            log.info("step %d concurrency %d: %s", phase.step, phase.concurrency, phase.phase)
            if phase.phase == "measure" and self._prompts is not None:  # same prompts in every window's measure
                self._prompts.restart(f"measure:{phase.concurrency}")

    # --- worker side --------------------------------------------------------------------------------------

    def on_phase_message(self, data: dict[str, Any]) -> None:
        self._adopt(data["run"])
        self._open_writers()
        self.set_phase(Phase(**data["phase"]))

    def ship(self, final: bool = False) -> None:
        """Worker -> master: the record lines written since the last call (final: with the total count)."""
        if self.role != "worker" or self.run is None or (final and self._final_sent):
            return
        lines, self._pending = self._pending, []
        self._sent += len(lines)
        if lines or final:
            self.env.runner.send_message(MSG_RECORDS, {"worker": self.worker_label, "lines": lines,
                                                       "final": final, "sent": self._sent})
        self._final_sent = final

    def on_test_start(self) -> None:
        self._final_sent = False
        lag_file = os.environ.get("TTS_LOADGEN_LAG_FILE")
        if lag_file and self.role != "master":
            import gevent

            gevent.spawn(loop_lag_probe, lag_file)

    # --- master side --------------------------------------------------------------------------------------

    def on_records_message(self, node_id: str, data: dict[str, Any]) -> None:
        w = self.workers.setdefault(node_id, {"label": None, "received": 0, "sent": 0, "final": False})
        w["label"] = data["worker"]
        if self.requests_writer is None:
            self._open_writers()
        for line in data["lines"]:
            self.requests_writer.write_line(line)
            rec = json.loads(line)
            self._watch(rec.get("ok"), rec.get("status"), rec.get("error"))
        w["received"] += len(data["lines"])
        w["sent"] = data["sent"]
        w["final"] = w["final"] or data["final"]

    def flush_workers(self) -> None:
        """Master: ask every worker to stop its users and send its last record lines (once per run)."""
        if self.role == "master" and not self._flush_sent:
            self._flush_sent = True
            self.env.runner.send_message(MSG_FLUSH, {"run_id": self.run["run_id"]})

    def expect_workers(self, node_ids) -> None:
        for nid in node_ids:
            self.workers.setdefault(nid, {"label": None, "received": 0, "sent": 0, "final": False})

    def wait_for_workers(self, timeout_s: float = FINAL_WAIT_S) -> None:
        import gevent

        deadline = time.monotonic() + timeout_s
        while any(not w["final"] for w in self.workers.values()) and time.monotonic() < deadline:
            gevent.sleep(0.1)
        for nid, w in self.workers.items():
            if not w["final"] or w["received"] != w["sent"]:
                log.error("worker %s: %d record lines received of %d sent (final=%s)", nid, w["received"], w["sent"],
                          w["final"])

    # --- requests -----------------------------------------------------------------------------------------

    def new_transport(self, host: str | None, connections: int = 1) -> GeventTransport:
        return GeventTransport(host or self.run["host"], timeout_s=self.run["timeout_s"], connections=connections)

    def ready(self) -> bool:
        return self.phase is not None and self._prompts is not None and not self.aborted

    def one_request(self, transport) -> RequestRecord:
        """Draw the next prompt, run it, record it and report it to Locust. Called from user greenlets."""
        ph = self.phase
        prompt = self._prompts.next()
        seq = self._prompts.drawn - 1
        t_start = time.time()
        deadline = self.run["timeout_s"]
        if ph.phase == "drain":  # filler while the measured requests finish: stopped when the level ends
            deadline = min(deadline, max(0.0, ph.ends - ph.started - (time.monotonic() - self._phase_t)))
        out = run_request(transport, self._payloads.body(prompt), self.run["mode"],
                          expected_s=None if self.run.get("audio_check") else self._bounds.range_for(prompt.text),
                          deadline_s=deadline)
        if ph.phase == "drain" and not out.ok and deadline < self.run["timeout_s"] and \
                (out.error or "").startswith("request timeout"):
            out = replace(out, error=CUT_AT_LEVEL_END)
        return self.record(ph, prompt.id, prompt.bucket, t_start, out, seq=seq)

    def record(self, ph: Phase, prompt_id: str, bucket: str, t_start: float, out: Outcome,
               seq: int | None = None) -> RequestRecord:
        rec = RequestRecord(
            run_id=self.run["run_id"], worker=self.worker_label, step=ph.step, concurrency=ph.concurrency,
            phase=ph.phase, mode=self.run["mode"], t_start=t_start, prompt_id=prompt_id, bucket=bucket,
            variant=self.run["variant"], seq=seq, **asdict(out),  # the measured fields, named once in Outcome
        )
        line = dumps(rec.to_dict())
        if self.requests_writer is None:
            self._open_writers()
        self.requests_writer.write_line(line)
        if self.role == "worker":
            self._pending.append(line)
        else:
            self._watch(rec.ok, rec.status, rec.error)
        self._report(rec)
        return rec

    def _watch(self, ok: bool, status: int | None, error: str | None) -> None:
        """Local/master: stop the run, one line and a non-zero exit, when its first requests all failed alike, or when
        the server stopped answering (loadtest.breaker)."""
        cause = self._fail_fast.add(bool(ok), status, error)
        if cause is not None:
            self.fail(f"{cause} (model {self.run['model']!r}, host {self.run['host']})", FAIL_FAST_EXIT)
            return
        if self.breaker is not None:
            cause = self.breaker.add(bool(ok), status, error)
            if cause is not None:
                self.fail(cause, FAILED_EXIT)

    def fail(self, cause: str, code: int) -> None:
        """Stop the run as failed: one line, the shape ends at its next tick, the records so far stay."""
        if self.aborted:
            return
        self.aborted, self.status, self.stopped = cause, "failed", time.time()
        print(f"error: {cause}; stopping the run (every record so far is kept in {self.run['run_dir']})",
              file=sys.stderr, flush=True)
        self.env.process_exit_code = code

    def interrupt(self, signame: str) -> bool:
        """SIGTERM / Ctrl-C during a run: stop as interrupted (in-flight requests finish and are recorded). False when
        no run is going on (the caller lets Locust handle the signal)."""
        if self.started is None or self.finished or self.role == "worker":
            return False
        if not self.aborted:
            self.aborted, self.status, self.stopped = f"interrupted by {signame} at {utc_clock(time.time())}", \
                "interrupted", time.time()
            print(f"{self.aborted}: stopping the run; requests in flight get {INTERRUPT_GRACE_S:g} s to finish and "
                  f"be recorded (in {self.run['run_dir']})", file=sys.stderr, flush=True)
            self.env.stop_timeout = min(self.env.stop_timeout or INTERRUPT_GRACE_S, INTERRUPT_GRACE_S)
        self.env.process_exit_code = INTERRUPTED_EXIT.get(signame, 130)
        return True

    def _watch_health(self) -> None:
        """Local/master: look at <host>/health every HEALTH_EVERY_S while the run goes on (the breaker's third rule).
        A slow answer is no verdict (a busy server may take long); a refused or non-200 one counts."""
        if self.breaker is None or self._health is not None or not self.run.get("host"):
            return
        import gevent

        def loop() -> None:
            while not self.finished and not self.aborted:
                gevent.sleep(HEALTH_EVERY_S)
                ok, why = health(self.run["host"], HEALTH_TIMEOUT_S)
                if not ok and "timeout" in why.lower():
                    continue
                cause = self.breaker.health(ok, why)
                if cause is not None:
                    self.fail(cause, FAILED_EXIT)

        self._health = gevent.spawn(loop)

    def _report(self, rec: RequestRecord) -> None:
        """One entry per request in Locust's table (its end-to-end time); time to first audio, RTF and continuity
        are in the records, the summary printed at the end and the load-run report."""
        if rec.error == CUT_AT_LEVEL_END:
            return  # the load generator stopped it: neither a request that ended nor a failure
        name = f"{rec.mode} c={rec.concurrency}" if rec.phase == "measure" else f"{rec.mode} ({rec.phase})"
        self.env.events.request.fire(request_type="SPEECH", name=name, response_time=(rec.e2e_s or 0.0) * 1000.0,
                                     response_length=rec.bytes, exception=None if rec.ok else TTSFailure(rec.error),
                                     context={"ttfa_s": rec.ttfa_s})

    def tracked_request(self, transport) -> None:
        self.inflight += 1
        try:
            self.one_request(transport)
        finally:
            self.inflight -= 1

    def drop(self, ph: Phase) -> None:
        """Open loop: an arrival the in-flight cap refused is a failure of the step, not a silent skip."""
        reason = f"dropped: {ph.concurrency} requests already in flight in this process"
        self.record(ph, "-", "-", time.time(), Outcome(False, reason, None, None, None, None, None, 0))

    def next_arrival_gap(self) -> float:
        """Open loop: each of the step's users is a Poisson source of rate/users; together a rate-λ process."""
        ph = self.phase
        return self._arrivals.expovariate(ph.rate / max(ph.users, 1))

    # --- end of run ----------------------------------------------------------------------------------------

    def finish(self) -> None:
        """Local/master: wait for scrapes and workers, then write the manifest. Idempotent."""
        import gevent

        if self.finished or self.role == "worker" or self.started is None:
            return
        self.finished = True
        if self._actor is not None:
            gevent.joinall([self._actor], timeout=30)
        if self.role == "master":
            self.flush_workers()
            self.wait_for_workers()
        if self.status is None:
            self.status = "complete" if self.completed else "interrupted"
            if self.status == "interrupted":  # Locust quit before the schedule ended (web UI stop, a quit)
                self.aborted, self.stopped = "stopped before the schedule ended (Locust quit)", time.time()
                self.env.process_exit_code = self.env.process_exit_code or INTERRUPTED_EXIT["SIGINT"]
        manifest = LoadManifest(
            schema=RUN_SCHEMA, **{k: self.run.get(k) for k in ("run_id", "mode", "seed", "variant", "model", "host",
                                                                "timeout_s", "control", "control_epoch",
                                                                "audio_check")},
            metrics_urls=list(self.run.get("metrics_urls") or []), status=self.status,
            reason=self.aborted if self.status != "complete" else None, stopped=self.stopped, server=self.server,
            level_from=self.level_from, role="distributed" if self.role == "master" else "local",
            scenario=self.run["scenario"], started=self.started, ended=time.time(), git_revision=git_revision(),
            locust_version=_locust_version(), argv=list(sys.argv),
            workers=self.workers if self.role == "master" else {"local": {"label": "local"}},
            phase_holds_s=self.hold.record(),
            requests_lines=self.requests_writer.lines if self.requests_writer else 0,
            counters_lines=self.counters_writer.lines if self.counters_writer else 0,
        ).to_dict()
        run_dir = Path(self.run["run_dir"])
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "manifest.json").write_text(dumps(manifest) + "\n")
        for w in (self.requests_writer, self.counters_writer):
            if w is not None:
                w.close()
        log.info("run folder: %s (%d request records)", run_dir, manifest["requests_lines"])
        if not getattr(self.opts, "no_report", False):
            self._load_report(run_dir)

    def _load_report(self, run_dir: Path) -> None:
        """The load-run report, built by `python -m ttsreport <run>` as a process (the load side never imports the
        statistics), and its short summary printed with the report's path; a failure is one line, never a crash."""
        import subprocess

        try:
            p = subprocess.run([sys.executable, "-m", "ttsreport", str(run_dir.resolve()), "--summary"], capture_output=True,
                               text=True, timeout=REPORT_TIMEOUT_S,
                               cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"error: the load-run report of {run_dir} was not built ({type(e).__name__}); "
                  f"make report RUN={run_dir}", file=sys.stderr, flush=True)
            return
        if p.returncode != 0:
            why = (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1]
            print(f"error: the load-run report of {run_dir} was not built: {why}", file=sys.stderr, flush=True)
            return
        print(p.stdout.rstrip("\n"), flush=True)


class EdgeRunner:
    """Carries out the edge actions of loadtest.shape in order: control-file writes (each recorded as a `control`
    line in counters.jsonl), confirmations that the server applied a write, and counter snapshots. Never raises into
    the load: a failed write is logged and leaves the file as it was (the manipulation check will show it)."""

    def __init__(self, scraper: Scraper, write_line, control: str | None, variant: str | None, scenario: Scenario,
                 clock=time.time, sim: dict | None = None, host_delay_us: float | None = None):
        self.scraper = scraper
        self.write_line = write_line
        self.control = control
        self.variant = variant
        # what every write carries beyond variant/observe/epoch: the simulator's hot-swappable settings of this
        # window's arm, and the plugin's positive-control delay of an arm that carries one
        self.extra = {**({"sim": sim} if sim else {}), **({"host_delay_us": host_delay_us} if host_delay_us else {})}
        self.clock = clock
        self.pending: list[EdgeAction] = []
        counts = [s.count_s for s in scenario.steps if s.count_s > 0]
        self.confirm_s = max(CONFIRM_MIN_S, min(counts) if counts else 0.0)
        self.confirmed: dict[int, float | None] = {}  # epoch -> when the server showed it (None: not in time)

    def shown(self, epoch: int) -> bool | None:
        """Has the server shown the write of `epoch`? False while its confirmation is still to come or waiting, True
        once shown, None once the wait gave up (unknown)."""
        if epoch not in self.confirmed:
            return False
        return True if self.confirmed[epoch] is not None else None

    def run_pending(self, sleep=time.sleep) -> None:
        while self.pending:
            self.do(self.pending.pop(0), sleep)

    def do(self, a: EdgeAction, sleep=time.sleep) -> None:
        if a.kind == WRITE:
            if self.control is None:
                return
            try:
                write_control(self.control, self.variant, a.observe, epoch=a.epoch, **self.extra)
            except (OSError, ValueError) as e:
                log.error("control file %s: write failed (%s); the server keeps its setting", self.control, e)
                return
            self.write_line(ControlWrite(step=a.step, concurrency=a.concurrency, phase=a.phase, t=self.clock(),
                                         variant=self.variant, observe=a.observe, epoch=a.epoch).to_dict())
        elif a.kind == CONFIRM and not self.scraper.targets:  # nothing to ask: unknown, and nothing to record
            self.confirmed[a.epoch] = None
        elif a.kind == CONFIRM:
            t0 = self.clock()
            shown = self.scraper.confirm_epoch(a.epoch, self.confirm_s, sleep=sleep)
            t1 = self.clock()
            self.write_line(ControlConfirm(step=a.step, concurrency=a.concurrency, epoch=a.epoch, t=t1,
                                           waited_s=round(t1 - t0, 3), shown=shown is not None).to_dict())
            self.confirmed[a.epoch] = shown
            if shown is None:
                log.warning("control epoch %d not shown by the server within %.1f s", a.epoch, self.confirm_s)
        elif a.kind == SNAPSHOT and self.scraper.targets:
            self.scraper.scrape(a.step, a.concurrency, a.edge)


def loop_lag_probe(path: str, interval_s: float = 0.01) -> None:
    """Benchmark aid: how late a ready greenlet runs (the delay the client adds to any awaited byte).

    Appends one lateness value (seconds) per wake-up; enabled by TTS_LOADGEN_LAG_FILE.
    """
    import gevent

    with open(path, "a", encoding="utf-8") as f:
        while True:
            t = time.perf_counter()
            gevent.sleep(interval_s)
            f.write(f"{time.perf_counter() - t - interval_s:.6f} {time.time():.3f}\n")
            f.flush()


def _locust_version() -> str | None:
    try:
        from locust import __version__

        return __version__
    except Exception:
        return None

"""A closed-loop swap A/B through the suite's own client, for a host without Locust (make gpu-check).

One simulator start with a control file; the windows hot-swap the variant in balanced order (round r: A then B
when r is even, B then A when odd) and every switch is confirmed by the control epoch on /metrics. Each window runs
the scenario's levels in file order: C user threads, each a closed loop of `loadtest.client.run_request` over its own
httpx connection on the deterministic prompt sequence of its index (restarted per level, so both windows of a round
send the same prompts); phases by wall clock: count (the sync observer on: the window's syncs over its observed calls
on /metrics, judged by `ttsrecords.outcomes.manipulation_check`), warm-up, measure; then the users finish the request
they are in. A window's numbers at a level are `ttsreport.blocks.level_stats` over its records (every ok request
weighted by its share inside the measure window), the verdict per level `ttsreport.inference.compare_rounds` over
the rounds: the suite's own definitions, not copies. What it leaves out of `make ab`: Locust, A/A rounds, seeded
level orders, reruns, the report.
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from loadtest.client import HttpxTransport, run_request
from loadtest.prompts import PayloadCache, PromptSequence, load_corpus, load_voice
from loadtest.scenario import load_scenario
from loadtest.scraper import compute_delta, http_get, parse_metrics
from loadtest.server_process import ServerProcess, ServerSpec
from tts_predictor import metrics as pm
from tts_predictor.control import write_control
from tts_predictor.domain import MODEL_NAME
from ttsrecords.measures import METRICS, PRIMARY_METRIC
from ttsrecords.outcomes import manipulation_check
from ttsrecords.paths import ROOT
from ttsrecords.records import GPU_AB_SCHEMA, RequestRecord
from ttsrecords.samples import gauge
from ttsreport.blocks import level_stats
from ttsreport.inference import compare_rounds

SCOPE = "in this server start"  # a swap design: one start, so a claim is about that start (as make demo says)
COMPARED = (PRIMARY_METRIC, "e2e_p50", "ttfa_p50")
KEPT = ("n", "n_ok", "n_error", "window_s", "completed_in_window", "throughput_rps", "audio_throughput", "e2e_p50",
        "e2e_p90", "ttfa_p50", "rtf_p50", "error_rate", "audio_s_mean")
CONFIRM_S = 10.0


@dataclass(frozen=True)
class Plan:
    a: str
    b: str
    rounds: int
    device: str
    scenario: str = "configs/scenarios/gpu-check.yaml"
    sim_config: str = "configs/sim/default.yaml"
    margin_pct: float = 1.0
    confidence: float = 0.95

    def windows(self) -> list[tuple[int, str, str]]:
        """(round, arm, variant) in execution order: AB, BA, AB, ..."""
        out = []
        for r in range(self.rounds):
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            out += [(r + 1, arm, self.a if arm == "A" else self.b) for arm in order]
        return out


class _Server:
    """The simulator with a control file, and the /metrics reads the driver needs."""

    def __init__(self, plan: Plan, log_path: Path, variant: str):
        self._tmp = tempfile.TemporaryDirectory(prefix="gpu-ab-")
        self.control = Path(self._tmp.name) / "control.json"
        self.epoch = 0
        write_control(self.control, variant, observe=False, epoch=self.epoch)
        port_file = Path(self._tmp.name) / "port"
        cmd = [sys.executable, "-m", "ttssim", "--control", str(self.control), "--port", "0", "--port-file", str(port_file),
               "--device", plan.device, "--config", str(ROOT / plan.sim_config)]
        self.proc = ServerProcess(ServerSpec(cmd=cmd, port_file=port_file, stop_wait_s=10.0), log_path)

    def start(self, timeout_s: float) -> str:
        self.proc.start()
        self.url = self.proc.wait_ready(timeout_s)
        return self.url

    def rows(self) -> list:
        return parse_metrics(http_get(self.url + "/metrics", 10.0))[1]

    def switch(self, variant: str, observe: bool) -> int:
        """Write the control file with a new epoch; the server takes it up at its next step (so under load)."""
        self.epoch += 1
        write_control(self.control, variant, observe=observe, epoch=self.epoch)
        return self.epoch

    def confirm(self, epoch: int) -> float:
        """Wait until /metrics shows `epoch` (the server applied the write); returns the wait."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < CONFIRM_S:
            value = gauge(self.rows(), pm.CONTROL_EPOCH)
            if value is not None and value >= epoch:
                return time.monotonic() - t0
            time.sleep(0.05)
        raise RuntimeError(f"the simulator did not show control epoch {epoch} within {CONFIRM_S:g} s")

    def stop(self) -> None:
        self.proc.stop()
        self._tmp.cleanup()


class _Users:
    """C closed-loop users; `phase_at(t)` names the phase a request started in."""

    def __init__(self, url, payloads, corpus, scenario, concurrency, run_id, variant, level, phase_at):
        self.records: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._user, daemon=True,
                                          args=(i, url, payloads, corpus, scenario, concurrency, run_id, variant,
                                                level, phase_at))
                         for i in range(concurrency)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def finish(self, timeout_s: float) -> None:
        """Stop drawing new requests; wait for the ones in flight (each bounded by the scenario's timeout)."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _user(self, i, url, payloads, corpus, scenario, concurrency, run_id, variant, level, phase_at) -> None:
        seq = PromptSequence(corpus, scenario.mix, scenario.seed, worker_index=i)
        seq.restart(f"level{level}")
        transport = HttpxTransport(url, timeout_s=scenario.timeout_s)
        try:
            while not self._stop.is_set():
                prompt = seq.next()
                t_start = time.time()
                out = run_request(transport, payloads.body(prompt), scenario.mode,
                                  expected_s=corpus.bounds.range_for(prompt.text), deadline_s=scenario.timeout_s)
                rec = RequestRecord(
                    run_id=run_id, worker=f"user{i}", step=level, concurrency=concurrency, phase=phase_at(t_start),
                    mode=scenario.mode, ok=out.ok, error=out.error, status=out.status, ttfa_s=out.ttfa_s,
                    e2e_s=out.e2e_s, audio_s=out.audio_s, rtf=out.rtf, bytes=out.bytes, t_start=t_start,
                    prompt_id=prompt.id, bucket=prompt.bucket, variant=variant, seq=seq.drawn - 1,
                    underrun_s=out.underrun_s, continuity_ok=out.continuity_ok, stream_rtf=out.stream_rtf,
                    chunks=out.chunks)
                with self._lock:
                    self.records.append(rec)
        finally:
            transport.close()


def _phase_clock(t0: float, step):
    edges = (("count", t0 + step.count_s), ("warmup", t0 + step.count_s + step.warmup_s),
             ("measure", t0 + step.count_s + step.warmup_s + step.measure_s))

    def phase_at(t: float) -> str:
        for name, end in edges:
            if t < end:
                return name
        return "drain"

    return phase_at


def _sleep_until(t: float) -> None:
    while (left := t - time.time()) > 0:
        time.sleep(min(left, 0.5))


def run_window(server: _Server, scenario, corpus, payloads, run_id: str, variant: str, log=print):
    """One arm through every level of the scenario; returns (records, counter deltas, per-level stats)."""
    records, counters, stats = [], [], {}
    for step in scenario.steps:
        c = step.concurrency
        epoch = server.switch(variant, observe=step.count_s > 0)  # taken up at the first step of this level
        before = server.rows()
        t0 = time.time()
        phase_at = _phase_clock(t0, step)
        users = _Users(server.url, payloads, corpus, scenario, c, run_id, variant, step.index, phase_at)
        users.start()
        try:
            server.confirm(epoch)
            if step.count_s > 0:
                _sleep_until(t0 + step.count_s)
                after = server.rows()
                counters.append({"kind": "delta", "window": "count", "step": step.index, "concurrency": c,
                                 **compute_delta(before, after, duration_s=step.count_s, variant_hint=variant)})
                server.confirm(server.switch(variant, observe=False))
            _sleep_until(t0 + step.count_s + step.warmup_s)
            m0, before = time.time(), server.rows()
            _sleep_until(m0 + step.measure_s)
            m1, after = time.time(), server.rows()
            counters.append({"kind": "delta", "window": "measure", "step": step.index, "concurrency": c,
                             **compute_delta(before, after, duration_s=m1 - m0, variant_hint=variant)})
        finally:  # interrupted or not, the users stop drawing requests and finish the ones in flight
            users.finish(scenario.timeout_s + 5.0)
        level = [r.to_dict() for r in users.records]
        s = level_stats(level, None, edges=(m0, m1), level_requests=level, within=False)
        stats[str(c)] = {k: s.get(k) for k in KEPT} | {"errors": s.get("errors")}
        records += users.records
        log(f"  {run_id} {variant} c={c}: {s['n_ok']}/{s['n']} ok in the measure phase, audio throughput "
            f"{_num(s['audio_throughput'])} audio-s/s, p50 latency {_num(s['e2e_p50'])} s")
    return records, counters, stats


def _num(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def compare(plan: Plan, windows: list[dict], levels: list[int]) -> dict:
    """Per level and metric: compare_rounds over the rounds (B/A), and the verdict line of the primary metric."""
    out = {}
    for c in levels:
        by_round: dict[int, dict[str, dict]] = {}
        for w in windows:
            by_round.setdefault(w["round"], {})[w["arm"]] = w
        rounds = sorted(r for r, arms in by_round.items() if set(arms) == {"A", "B"})
        failed = [None if all((by_round[r][x]["levels"].get(str(c)) or {}).get("n_ok") for x in "AB")
                  else "".join(x for x in "AB" if not (by_round[r][x]["levels"].get(str(c)) or {}).get("n_ok"))
                  for r in rounds]
        invalid = [r for r in rounds if not all(by_round[r][x]["valid"] for x in "AB")]
        per_metric = {}
        for key in COMPARED:
            metric = METRICS[key]
            a = [(by_round[r]["A"]["levels"].get(str(c)) or {}).get(key) for r in rounds]
            b = [(by_round[r]["B"]["levels"].get(str(c)) or {}).get(key) for r in rounds]
            res = compare_rounds(a, b, higher_is_better=metric.better == "higher", margin_pct=plan.margin_pct,
                                 confidence=plan.confidence, label=metric.label, failed=failed, scope=SCOPE)
            per_metric[key] = {k: res[k] for k in ("kind", "word", "text", "ratio", "ci", "n", "rounds_needed")}
            per_metric[key]["a"], per_metric[key]["b"] = a, b
        primary = per_metric[PRIMARY_METRIC]
        verdict = f"c={c}: {primary['text']}"
        if invalid:
            verdict += f" (windows of round(s) {invalid} failed their manipulation check: not a valid comparison)"
        out[str(c)] = {"verdict": verdict, "invalid_rounds": invalid, "metrics": per_metric}
    return out


def run(plan: Plan, out_dir: Path, *, log=print, deadline: float | None = None) -> dict:
    """The whole A/B: start, prime, the windows, the comparison. Writes ab-requests.jsonl and server.log into
    out_dir and returns the ab.json document (the caller writes it). `deadline` (time.time()): windows that would
    end after it are not started (the result says how many ran)."""
    scenario = load_scenario(ROOT / plan.scenario)
    corpus = load_corpus(ROOT / scenario.prompts)
    payloads = PayloadCache(load_voice(ROOT / scenario.voice), model=MODEL_NAME, language=scenario.language,
                            mode=scenario.mode)
    levels = [s.concurrency for s in scenario.steps]
    doc = {"schema": GPU_AB_SCHEMA, "simulated": True, "design": "swap", "scope": SCOPE, "a": plan.a, "b": plan.b,
           "device": plan.device, "scenario": plan.scenario, "sim_config": plan.sim_config,
           "rounds_planned": plan.rounds, "levels": levels, "primary_metric": PRIMARY_METRIC,
           "margin_pct": plan.margin_pct, "confidence": plan.confidence, "windows": [], "comparison": None,
           "not_run": [], "ready_s": None}
    server = _Server(plan, out_dir / "server.log", plan.a)
    req_path = out_dir / "ab-requests.jsonl"
    per_window_s = sum(s.duration_s for s in scenario.steps) + 8.0 * len(scenario.steps)  # + finishing requests
    t0 = time.monotonic()
    try:
        server.start(60.0)
        doc["ready_s"] = round(time.monotonic() - t0, 2)
        log(f"  simulator ready in {doc['ready_s']} s at {server.url} (device {plan.device})")
        _prime(server, payloads, corpus, scenario, plan.a, levels[0])
        with open(req_path, "w", encoding="utf-8") as f:
            for i, (rnd, arm, variant) in enumerate(plan.windows()):
                wid = f"w{i + 1}-r{rnd}-{arm}"
                if deadline is not None and time.time() + per_window_s > deadline:
                    doc["not_run"].append(wid)
                    continue
                records, counters, stats = run_window(server, scenario, corpus, payloads, wid, variant, log)
                for r in records:
                    f.write(json.dumps(r.to_dict()) + "\n")
                check = manipulation_check(variant, counters)
                doc["windows"].append({"id": wid, "round": rnd, "arm": arm, "variant": variant,
                                       "valid": bool(check["ok"]), "manipulation_check": check,
                                       "counters": counters, "levels": stats})
    finally:
        server.stop()
    doc["comparison"] = compare(plan, doc["windows"], levels)
    return doc


def _prime(server: _Server, payloads, corpus, scenario, variant: str, concurrency: int) -> None:
    """As many concurrent untimed requests as the first level (make ab primes a start the same way)."""
    epoch = server.switch(variant, observe=False)
    users = _Users(server.url, payloads, corpus, scenario, concurrency, "prime", variant, -1, lambda t: "warmup")
    users.start()
    try:
        server.confirm(epoch)
    finally:
        users.finish(scenario.timeout_s + 5.0)
    bad = [r for r in users.records if not r.ok]
    if bad or not users.records:
        raise RuntimeError(f"priming failed: {bad[0].error if bad else 'no request finished'}")

"""Observer-free timing (unit tier, fake clock): the schedule's count phases, the control writes at the count and
warm-up edges, the confirmation before the count_start snapshot, and the scraper's count / measure deltas with the
variants that moved, the control epochs and the step clock. The server is a fake that reads the control file through
the real reader (tts_predictor.control) at every step, as the plugin and the simulator do."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from loadtest.scraper import Scraper, compute_delta, parse_metrics, variants_moved
from loadtest.session import EdgeRunner
from loadtest.shape import CONFIRM, SNAPSHOT, WRITE, PhaseHold, PhaseTracker, Schedule, count_epoch, edge_actions
from tts_predictor import metrics as m
from tts_predictor.control import ControlChannel, ControlFile, write_control
from ttsrecords import outcomes as oc
from ttsrecords import records
from ttsrecords.scenario import parse_scenario


def scen(count=2.0, steps=(8, 16)):
    return parse_scenario({"phases": {"count_s": count, "warmup_s": 3, "measure_s": 5, "drain_s": 1},
                           "steps": list(steps)})


class FakeServer:
    """Counts 15 predictor calls per step under the control file's variant, observed while `observe` is on; exports
    the control gauges and the step clock like the plugin."""

    def __init__(self, path, variant):
        write_control(path, variant, observe=False, epoch=0)
        self.reg = CollectorRegistry()
        self.p = m.make_predictor_metrics(self.reg)
        self.p.info.info({"variant": "controlled", "backend": "simulated"})
        self.steps_m = m.make_step_metrics(self.reg)
        self.channel = ControlChannel(ControlFile(path), logging.getLogger("fake"), m.make_control_metrics(self.reg))

    def step(self, n=1, batch=8):
        for _ in range(n):
            self.channel.at_step_boundary()
            s = self.channel.setting
            for call in range(15):
                tokens = 2 * batch if call == 0 else batch
                self.p.calls.labels(s.variant).inc()
                self.p.tokens.labels(s.variant).inc(tokens)
                if s.observe:
                    self.p.observed_calls.labels(s.variant).inc()
                    self.p.observed_tokens.labels(s.variant).inc(tokens)
                    self.p.syncs.labels(s.variant).inc(m.syncs_per_call(s.variant, tokens))
            self.steps_m.interval.labels(s.variant).observe(0.02)
            self.steps_m.batch.labels(s.variant).observe(batch)

    def text(self):
        return generate_latest(self.reg).decode()


class Clock:
    def __init__(self, server, steps_per_s=50, stall=(0.0, 0.0)):
        self.t, self.server, self.rate = 1000.0, server, steps_per_s
        self.stall = (self.t + stall[0], self.t + stall[1])  # run-time span in which the server runs no step

    def __call__(self):
        return self.t

    def sleep(self, dt):  # time passes: the busy server runs steps
        self.t += dt
        stalled = self.stall[0] <= self.t < self.stall[1]
        self.server.step(max(1, int(dt * self.rate)) if self.rate and not stalled else 0)


def run_window(tmp_path, server_variant, window_variant, base=0, sc=None, idle=False, stall=(0.0, 0.0), hold=None,
               fetch=None):
    sc = sc or scen()
    ctl = tmp_path / "control.json"
    srv = FakeServer(ctl, server_variant)
    clock = Clock(srv, steps_per_s=0 if idle else 50, stall=stall)
    lines = []
    scraper = Scraper(["http://fake/metrics"], lines.append, fetch=fetch or (lambda url, timeout: srv.text()),
                      clock=clock)
    edges = EdgeRunner(scraper, lines.append, str(ctl), window_variant, sc, clock=clock)
    tracker = PhaseTracker(Schedule(sc, count=True))
    t0 = clock.t
    while True:  # Locust's shape ticks about once a second
        t = clock.t - t0
        if hold is not None:  # as loadtest.session.Session.tick does (there the count look runs in the background)
            def ready(ph):
                if ph.phase == "count":
                    return scraper.count_moved(ph.step)
                return edges.shown(count_epoch(base, ph.step, False))

            t = hold.schedule_time(t, tracker.current, ready)
        _, transitions = tracker.tick(t)
        for old, new in transitions:
            edges.pending.extend(edge_actions(old, new, base))
        edges.run_pending(sleep=clock.sleep)
        if tracker.current is None:
            break
        clock.sleep(1.0)
    return lines, edges


def test_schedule_has_a_count_phase_per_level_only_with_a_control_file():
    sc = scen()
    with_count = Schedule(sc, count=True)
    assert [(p.step, p.phase, p.started, p.ends) for p in with_count.phases][:4] == [
        (0, "count", 0, 2), (0, "warmup", 2, 5), (0, "measure", 5, 10), (0, "drain", 10, 11)]
    assert with_count.duration_s == 2 * 11
    without = Schedule(sc, count=False)
    assert "count" not in {p.phase for p in without.phases} and without.duration_s == 2 * 9
    assert [p.phase for p in Schedule(scen(count=0)).phases][:3] == ["warmup", "measure", "drain"]


def test_edge_actions_of_a_window_in_order():
    sc = scen()
    tracker = PhaseTracker(Schedule(sc, count=True))
    acts = []
    for t in range(0, 30):
        for old, new in tracker.tick(float(t))[1]:
            acts += edge_actions(old, new, 10)
    got = [(a.kind, a.step, a.edge or a.phase, a.observe, a.epoch) for a in acts]
    assert got == [
        (WRITE, 0, "count", True, 11), (CONFIRM, 0, None, None, 11), (SNAPSHOT, 0, "count_start", None, None),
        (WRITE, 0, "warmup", False, 12), (CONFIRM, 0, None, None, 12),
        (SNAPSHOT, 0, "count_end", None, None),
        (SNAPSHOT, 0, "start", None, None), (SNAPSHOT, 0, "end", None, None),
        (WRITE, 1, "count", True, 13), (CONFIRM, 1, None, None, 13), (SNAPSHOT, 1, "count_start", None, None),
        (WRITE, 1, "warmup", False, 14), (CONFIRM, 1, None, None, 14),
        (SNAPSHOT, 1, "count_end", None, None),
        (SNAPSHOT, 1, "start", None, None), (SNAPSHOT, 1, "end", None, None)]
    assert count_epoch(10, 1, True) == 13 and count_epoch(10, 1, False) == 14
    # no control file: no count phases, only the measure snapshots
    tracker = PhaseTracker(Schedule(sc, count=False))
    acts = [a for t in range(30) for old, new in tracker.tick(float(t))[1] for a in edge_actions(old, new, None)]
    assert [(a.kind, a.edge) for a in acts] == [(SNAPSHOT, "start"), (SNAPSHOT, "end")] * 2


def test_a_window_counts_with_the_observer_and_times_without_it(tmp_path):
    lines, edges = run_window(tmp_path, "fixed", "fixed", base=4)
    writes = [ln for ln in lines if ln["kind"] == "control"]
    assert [(w["phase"], w["observe"], w["epoch"], w["variant"]) for w in writes] == [
        ("count", True, 5, "fixed"), ("warmup", False, 6, "fixed"), ("count", True, 7, "fixed"),
        ("warmup", False, 8, "fixed")]
    assert all(w["schema"] == records.COUNTERS_SCHEMA for w in writes)
    count, measure = oc.deltas(lines, "count"), oc.deltas(lines, "measure")
    assert len(count) == len(measure) == 2
    for c in count:
        assert c["observed_calls"] > 0 and c["observe_start"] is True and c["variants_moved"] == ["fixed"]
        assert c["epoch_start"] == count_epoch(4, c["step"], True)  # confirmed before the snapshot
        # the observer was off (confirmed) before the count_end snapshot: every observed call is in the window
        assert c["epoch_end"] == count_epoch(4, c["step"], False) and c["observe_end"] is False
        assert c["step_interval_count"] == c["steps"] and c["step_batch_sum"] == 8 * c["steps"]
    for d in measure:
        assert d["observed_calls"] == 0 and d["observe_start"] is False and d["observe_end"] is False
        assert d["epoch_start"] == count_epoch(4, d["step"], False) and d["variant"] == "fixed"
    check = oc.manipulation_check("fixed", lines)
    assert check["ok"] and check["source"] == "count" and check["timing_observed_calls"] == 0
    assert all(v is not None for v in edges.confirmed.values())


def test_a_hot_swap_switches_at_the_first_count_phase_and_no_window_mixes_variants(tmp_path):
    lines, _ = run_window(tmp_path, "original", "vectorized", base=20)
    first = [ln for ln in lines if ln["kind"] == "control"][0]
    assert (first["variant"], first["epoch"], first["phase"]) == ("vectorized", 21, "count")
    deltas = [ln for ln in lines if ln["kind"] == "delta"]
    assert all(d["variants_moved"] == ["vectorized"] for d in deltas), [d["variants_moved"] for d in deltas]
    assert oc.manipulation_check("vectorized", lines)["ok"]
    snaps = [ln for ln in lines if ln["kind"] == "snapshot"]
    assert snaps[0]["edge"] == "count_start" and snaps[0]["t"] > first["t"]
    assert snaps[0]["samples"]['tts_predictor_active_variant{variant="vectorized"}'] == 1


def test_an_idle_server_never_confirms_and_the_window_says_so(tmp_path, caplog):
    lines, edges = run_window(tmp_path, "original", "fixed", idle=True)
    assert edges.confirmed and all(v is None for v in edges.confirmed.values())
    assert "not shown by the server" in caplog.text
    assert not oc.manipulation_check("fixed", lines)["ok"]  # nothing ran: nothing verifies the variant


def test_a_count_phase_is_held_open_until_a_stalled_server_makes_a_predictor_call(tmp_path):
    # the server runs no step for the first 20 s (a stalled stream on the real CPU server); the count phase is 2 s
    for sub in "ab":
        (tmp_path / sub).mkdir()
    lost, _ = run_window(tmp_path / "a", "fixed", "fixed", stall=(0.0, 20.0))
    assert not oc.manipulation_check("fixed", lost)["ok"]  # without the hold the first window verifies nothing
    hold = PhaseHold(limit_s=60.0)
    lines, _ = run_window(tmp_path / "b", "fixed", "fixed", stall=(0.0, 20.0), hold=hold)
    count = oc.deltas(lines, "count")
    assert count[0]["observed_calls"] > 0 and count[0]["duration_s"] > 15.0
    assert 17.0 < hold.by_phase[(0, "count")] < 21.0 and (1, "count") not in hold.by_phase  # the second level's count saw calls in time
    assert oc.manipulation_check("fixed", lines)["ok"]
    measure = oc.deltas(lines, "measure")
    assert [round(d["duration_s"]) for d in measure] == [5, 5]  # the later phases keep their lengths


def test_a_count_hold_is_bounded_and_an_unknown_answer_never_holds(tmp_path):
    for sub in "ab":
        (tmp_path / sub).mkdir()
    hold = PhaseHold(limit_s=6.0)
    lines, _ = run_window(tmp_path / "a", "original", "fixed", idle=True, hold=hold)
    counts = {k: v for k, v in hold.by_phase.items() if k[1] == "count"}
    assert set(counts) == {(0, "count"), (1, "count")} and all(6.0 <= v < 7.5 for v in counts.values()), hold.by_phase
    assert not oc.manipulation_check("fixed", lines)["ok"]

    def down(url, timeout):
        raise OSError("connection refused")

    hold = PhaseHold(limit_s=60.0)
    run_window(tmp_path / "b", "fixed", "fixed", stall=(0.0, 20.0), hold=hold, fetch=down)
    assert hold.held_s == 0.0 and hold.by_phase == {}


def test_a_warmup_is_held_until_the_observer_off_write_is_shown_and_the_measure_keeps_its_length():
    sc = scen()  # count 2, warm-up 3, measure 5, drain 1 per level
    tracker, hold = PhaseTracker(Schedule(sc, count=True)), PhaseHold(limit_s=30.0)
    shown_at = 9.0  # run time at which the confirmation of the first observer-off write comes back
    now = 0.0

    def ready(ph):
        return now >= shown_at if (ph.phase, ph.step) == ("warmup", 0) else True

    seen = []
    for tick in range(40):
        now = float(tick)
        phase, _ = tracker.tick(hold.schedule_time(now, tracker.current, ready))
        seen.append((tick, phase.phase if phase else None))
    measure = [t for t, ph in seen if ph == "measure"]
    assert measure[0] == 9  # not at the scheduled 5: the observer was still on
    assert hold.record() == {"0/warmup": pytest.approx(3.0, abs=0.01)}  # the schedule slipped from 5 to 8
    assert measure[:5] == [9, 10, 11, 12, 13] and seen[14][1] == "drain"  # the measure window keeps its 5 s


def test_the_runner_allows_for_the_longest_holds():
    assert PhaseHold.most_s(scen(), 90.0) == 2 * 2 * 90.0  # two levels, count and warm-up, each to the limit
    assert PhaseHold.most_s(scen(), 90.0, count=False) == 0.0


def test_the_count_probe_answers_from_the_window_opening_on(tmp_path):
    ctl = tmp_path / "control.json"
    srv = FakeServer(ctl, "fixed")
    write_control(ctl, "fixed", observe=True, epoch=1)
    srv.step(3)  # observed calls of an earlier window: not this one's
    scraper = Scraper(["http://fake/metrics"], [].append, fetch=lambda url, timeout: srv.text())
    assert scraper.count_moved(0) is False  # not open yet: the edge actions are still on their way
    scraper.scrape(0, 8, "count_start")
    assert scraper.count_moved(0) is False
    srv.step(1)
    assert scraper.count_moved(0) is True
    plain = Scraper(["http://fake/metrics"], [].append, fetch=lambda url, timeout: "x_total 1\n")
    plain.scrape(0, 8, "count_start")
    assert plain.count_moved(0) is None  # no control channel: nothing to wait for


def test_a_failed_control_write_is_logged_not_raised(tmp_path, caplog):
    sc = scen()
    lines = []
    edges = EdgeRunner(Scraper([], lines.append), lines.append, str(tmp_path / "gone" / "control.json"), "fixed", sc)
    edges.pending.extend(edge_actions(None, Schedule(sc).phases[0], 0))
    edges.run_pending()
    assert lines == [] and "write failed" in caplog.text


def test_deltas_name_every_variant_that_moved_and_the_control_gauges():
    before = (f'{m.CALLS}{{variant="original"}} 10\n{m.CALLS}{{variant="fixed"}} 0\n{m.CONTROL_EPOCH} 3\n'
              f"{m.OBSERVE_ENABLED} 1\n")
    after = (f'{m.CALLS}{{variant="original"}} 40\n{m.CALLS}{{variant="fixed"}} 75\n{m.CALLS}{{variant="vectorized"}} 0\n'
             f"{m.CONTROL_EPOCH} 4\n{m.OBSERVE_ENABLED} 0\n")
    a, b = parse_metrics(before)[1], parse_metrics(after)[1]
    assert variants_moved(a, b) == ["fixed", "original"]  # most calls first; a label that stayed at 0 did not move
    d = compute_delta(a, b, duration_s=1.0, variant_hint="x")
    assert d["variant"] == "fixed" and d["variants_moved"] == ("fixed", "original")
    assert (d["epoch_start"], d["epoch_end"], d["observe_start"], d["observe_end"]) == (3, 4, True, False)
    assert d["step_interval_count"] is None  # not exposed: unknown
    still = compute_delta(b, b, duration_s=1.0, variant_hint="x")
    assert still["variant"] is None and still["variants_moved"] == ()
    lines = []
    sc = Scraper(["u"], lines.append, fetch=lambda url, timeout: after)
    sc.scrape(0, 8, "count_start")
    sc.scrape(0, 8, "start")  # a measure window open at the same time is another window
    sc.scrape(0, 8, "count_end")
    sc.scrape(0, 8, "end")
    assert [(x["kind"], x.get("edge") or x.get("window")) for x in lines] == [
        ("snapshot", "count_start"), ("snapshot", "start"), ("snapshot", "count_end"), ("delta", "count"),
        ("snapshot", "end"), ("delta", "measure")]

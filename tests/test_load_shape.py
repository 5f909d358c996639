"""The load schedule: steps, phases and the edges the scraper and the workers are told about."""

from __future__ import annotations

from loadtest.shape import PhaseTracker, Schedule
from ttsrecords.scenario import parse_scenario


def scen(**kw):
    doc = {"phases": {"warmup_s": 2, "measure_s": 5, "drain_s": 1}, "steps": [8, 16]}
    doc.update(kw)
    return parse_scenario(doc)


def test_phases_back_to_back():
    s = Schedule(scen())
    assert s.duration_s == 16
    seen = [(p.step, p.concurrency, p.phase, p.started, p.ends) for p in s.phases]
    assert seen == [(0, 8, "warmup", 0, 2), (0, 8, "measure", 2, 7), (0, 8, "drain", 7, 8),
                    (1, 16, "warmup", 8, 10), (1, 16, "measure", 10, 15), (1, 16, "drain", 15, 16)]
    assert s.at(0).phase == "warmup" and s.at(6.99).phase == "measure" and s.at(15.5).phase == "drain"
    assert s.at(16) is None
    assert all(p.users == p.concurrency for p in s.phases)


def test_zero_length_phase_is_skipped_and_open_loop_users():
    s = Schedule(scen(phases={"warmup_s": 0, "measure_s": 3, "drain_s": 0}))
    assert [p.phase for p in s.phases] == ["measure", "measure"]
    o = Schedule(parse_scenario({"loop": "open", "phases": {"warmup_s": 1, "measure_s": 1, "drain_s": 0},
                                 "steps": [{"concurrency": 100, "rate": 3.0}, {"concurrency": 8, "rate": 1.0}]}))
    assert [p.users for p in o.phases] == [32, 32, 8, 8] and o.phases[0].rate == 3.0


def test_tracker_reports_every_edge_even_when_ticks_skip_phases():
    tr = PhaseTracker(Schedule(scen()))
    p, edges = tr.tick(0.0)
    assert p.phase == "warmup" and edges == [(None, p)]
    assert tr.tick(1.0) == (p, [])
    p2, edges = tr.tick(8.5)  # jumped over measure and drain of step 0
    names = [(a.step if a else None, a.phase if a else None, b.step, b.phase) for a, b in edges]
    assert names == [(0, "warmup", 0, "measure"), (0, "measure", 0, "drain"), (0, "drain", 1, "warmup")]
    last, edges = tr.tick(99)
    assert last is None and edges[-1][1] is None and edges[0][0] == p2

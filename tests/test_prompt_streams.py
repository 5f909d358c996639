"""Every window measures a level on the same prompts: the sequence restarts per level at the measure edge.

Found by the calibration pool (reports/bench/verdicts.md, "Where the spread comes from"): with one sequence per
process, the prompts a level's measure window drew depended on what ran before it in the window (the other levels
in the window's seeded order, the settle after a hot-swap switch), and the short bucket's lengths differ twofold, so
requests/s of one arm differed by 2-8 % between windows for that reason alone.
"""

from __future__ import annotations

from types import SimpleNamespace

from loadtest.prompts import PromptSequence, load_corpus
from loadtest.server_process import ROOT
from loadtest.session import Session
from loadtest.shape import Phase

MIX = {"short": 1, "medium": 2, "long": 1}


def test_a_restarted_stream_draws_the_same_prompts_whatever_came_before():
    c = load_corpus(ROOT / "configs/prompts/en.yaml")
    a, b = PromptSequence(c, MIX, 7), PromptSequence(c, MIX, 7)
    for _ in range(5):
        a.next()
    for _ in range(23):
        b.next()
    a.restart("measure:8")
    b.restart("measure:8")
    assert [a.next().id for _ in range(50)] == [b.next().id for _ in range(50)]
    assert a.drawn == 55 and b.drawn == 73  # seq stays the process-wide count
    other = PromptSequence(c, MIX, 7)
    other.restart("measure:64")
    first = PromptSequence(c, MIX, 7)
    first.restart("measure:8")
    assert [other.next().id for _ in range(50)] != [first.next().id for _ in range(50)]


def test_the_measure_edge_restarts_the_level_stream():
    c = load_corpus(ROOT / "configs/prompts/en.yaml")
    s = Session(SimpleNamespace(parsed_options=None), "worker")
    s._prompts = PromptSequence(c, MIX, 7)
    for _ in range(11):
        s._prompts.next()
    s.set_phase(Phase(0, 8, "warmup", 8, None, 0.0, 5.0))
    s._prompts.next()
    s.set_phase(Phase(0, 8, "measure", 8, None, 5.0, 17.0))
    ref = PromptSequence(c, MIX, 7)
    ref.restart("measure:8")
    assert [s._prompts.next().id for _ in range(30)] == [ref.next().id for _ in range(30)]

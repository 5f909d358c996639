"""The window plan of an A/B run: which arm runs in which window, inside which server start, in which order.

A window is one Locust run of one arm through every level; a round is two windows compared level by level (kind
"ab": arm A and arm B; kind "aa": arm A twice, labelled A and B). Designs:
- fresh: every window in its own server start; a round's arm order is a seeded coin flip (the original design).
- swap: one server start; the arms alternate in balanced seeded ABBA / BAAB pairs of rounds (hot swap through the
  control file; needs arms that differ only in the plugin variant).
- nested: S server starts of W A/B window pairs each (balanced ABBA / BAAB, inside each start when W is even); the
  start is the unit of the confidence interval, the pairs inside it are the repeated measures.
A/A rounds sit at seeded random positions among the A/B rounds (redrawn if they would all come first), so the noise
floor is measured across the run, not only at its start. The level order is drawn per round and run by both windows of
the round: a level's throughput depends on what ran before it in the window (idle server or a higher level's leftover
requests), so two windows compared with each other must meet the same history; across rounds the order is random, so
no level is tied to the time since a start. Pure: the same arguments give the same plan.
"""

from __future__ import annotations

import random

from ttsrecords.records import DESIGNS
from ttsrecords.windows import PlannedWindow

SWAPPED = ("swap", "nested")  # designs that switch arms inside one server start


def aa_positions(rounds: int, aa_rounds: int, rng: random.Random, within: int | None = None) -> list[int]:
    """Where the A/A rounds go among rounds + aa_rounds positions: a seeded sample of the first `within` positions
    (default all), redrawn while it would be exactly the first aa_rounds positions (when anything else is possible)."""
    total = rounds + aa_rounds
    within = total if within is None else max(aa_rounds, min(within, total))
    if aa_rounds <= 0:
        return []
    while True:
        pos = sorted(rng.sample(range(within), aa_rounds))
        if within == aa_rounds or pos != list(range(aa_rounds)):
            return pos


def level_order(levels: list[int], seed: int, round_: int) -> list[int]:
    """A round's levels in a seeded random order: both windows of the round run it, and so does a rerun of either."""
    return random.Random(f"{seed}:levels:r{round_}").sample(list(levels), len(levels))


def _orders(kinds: list[str], design: str, rng: random.Random) -> list[tuple[str, str]]:
    """Arm order of each round. fresh: a coin flip per round. swap/nested: consecutive A/B rounds form ABBA or BAAB
    (seeded per pair), so each arm runs first equally often and at balanced times (nested: W A/B rounds per start,
    so with W even every start is balanced, with W odd the pairs span neighbouring starts); an odd last A/B round and
    every A/A round get a coin flip."""
    coin = [("A", "B") if rng.random() < 0.5 else ("B", "A") for _ in kinds]
    if design not in SWAPPED:
        return coin
    orders: list[tuple[str, str] | None] = [None] * len(kinds)
    idx = [i for i, k in enumerate(kinds) if k == "ab"]
    for j in range(0, len(idx) - 1, 2):
        first = ("A", "B") if rng.random() < 0.5 else ("B", "A")
        orders[idx[j]], orders[idx[j + 1]] = first, first[::-1]
    return [o if o is not None else c for o, c in zip(orders, coin, strict=True)]


def make_plan(rounds: int, aa_rounds: int, a: str | None, b: str | None, seed: int, *, design: str = "fresh",
              window_pairs: int | None = None, levels: list[int] | None = None,
              aa_within: int | None = None) -> list[PlannedWindow]:
    """The windows of a run in execution order.

    rounds: A/B rounds (the maximum of a sequential run); aa_rounds: A/A rounds placed among them (aa_within: only in
    the first that many positions, so a sequential run has them all before its first possible stop). design: fresh,
    swap or nested (window_pairs W A/B pairs per start; A/A rounds join the start of the A/B round after them).
    a, b: the arms' variants (None: an arm without the plugin). levels: the concurrency levels, shuffled per round.

    Each window is a ttsrecords.windows.PlannedWindow (its order into the scenario's steps is added by the planner,
    which knows the scenario).
    """
    if design not in DESIGNS:
        raise ValueError(f"unknown design {design!r} (known: {', '.join(DESIGNS)})")
    if design == "nested" and (window_pairs is None or window_pairs < 1):
        raise ValueError("design nested needs window_pairs >= 1")
    rng = random.Random(seed)
    aa = set(aa_positions(rounds, aa_rounds, rng, aa_within))
    kinds = ["aa" if r in aa else "ab" for r in range(rounds + aa_rounds)]
    groups, ab_seen = [], 0
    for k in kinds:  # nested: the start of a round = how many A/B rounds came before it, W per start
        groups.append(min(ab_seen // window_pairs, max(0, (rounds - 1) // window_pairs)) if design == "nested" else 0)
        ab_seen += k == "ab"
    orders = _orders(kinds, design, rng)
    plan: list[PlannedWindow] = []
    prev: dict[int, str] = {}  # a switch: the start's previous window ran the other arm's settings (variant, or a
    for r, (kind, order, group) in enumerate(zip(kinds, orders, groups, strict=True)):  # known-answer run's
        for position, arm in enumerate(order):  # hot-swapped simulator settings)
            spec = "A" if kind == "aa" else arm
            start = len(plan) if design == "fresh" else group
            plan.append(PlannedWindow(
                block_id=f"{len(plan):03d}-r{r}-{kind}-{arm}", round=r, kind=kind, arm=arm,
                variant=a if spec == "A" else b, spec=spec, start=start, position=position,
                levels=tuple(level_order(levels, seed, r)) if levels else (),
                switch=design in SWAPPED and start in prev and prev[start] != spec))
            prev[start] = spec
    return plan

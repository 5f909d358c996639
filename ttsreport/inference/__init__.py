"""Inference for the A/B verdict: one estimand (the ratio B/A, worked on the log scale), its interval, the decision.

Pure functions of per-round numbers; nothing here reads files. A round (one A and one B measurement, random order)
is the independent unit; requests inside a round never are. With `groups` (server starts holding several rounds) the
start becomes the unit, so the interval carries start-to-start variance. Every rule is explained, with its public
source, in docs/method.md; tools/verdict_synthetic.py measures its error rates on synthetic data with known answers.

One topic per module: `core` (the one comparison, rounds needed, failures), `levels` (Holm over the levels and the
headline), `sequential` (the boundary and the looks), `rates` (failure rates), `variance` (A/A rounds, nested
designs). Callers use this package's names.
"""

from .core import (
                   CLAIMS,
                   KINDS,
                   NO_SPREAD_LOG,
                   POWER,
                   _check_confidence,
                   _check_margin,
                   _interval,
                   _mean_se,
                   claim_allowed,
                   compare_rounds,
                   failure_words,
                   log_ratios,
                   mark_secondary,
                   rounds_needed,
                   verdict_word,
                   withhold_for_failure_gap,
)
from .levels import _headline, decide_levels, holm
from .rates import compare_error_rates, newcombe, target_met, wilson
from .sequential import _t_crit, sequential_boundary, sequential_claim_interval, sequential_look
from .variance import aa_check, order_effect, plan_chance, plan_nested, variance_components

__all__ = [
    "CLAIMS", "KINDS", "NO_SPREAD_LOG", "POWER", "_check_confidence", "_check_margin", "_headline", "_interval",
    "_mean_se", "_t_crit", "aa_check", "claim_allowed", "compare_error_rates", "compare_rounds", "decide_levels", "failure_words",
    "holm", "log_ratios", "mark_secondary", "newcombe", "order_effect", "plan_chance", "plan_nested",
    "rounds_needed", "sequential_boundary", "sequential_claim_interval", "sequential_look", "target_met",
    "variance_components", "verdict_word", "wilson", "withhold_for_failure_gap",
]

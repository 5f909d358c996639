"""The verdict rule: one sentence per level and metric from a CI, the A/A floor and a margin.

Kept apart from the arithmetic so the rule can be read (and tested) on its own. It never says "no difference"
when the CI is wider than the claim, and never claims a difference smaller than the A/A noise floor.
"""

from __future__ import annotations

import math

from scipy import stats as sps


def t_halfwidth(sd: float, n: int, level: float) -> float:
    """Student-t half-width of a mean over n rounds with spread sd."""
    return float(sps.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n))


def rounds_for_halfwidth(sd: float, target: float, level: float, cap: int = 10_000) -> int:
    """Smallest number of rounds whose t half-width at `level` is <= target, given the observed spread."""
    if sd == 0:
        return 2
    if target <= 0:
        return cap
    n = 2
    while n < cap and t_halfwidth(sd, n, level) > target:
        n = n + 1 if n < 64 else int(n * 1.1)
    return min(n, cap)


def _plural(n: int) -> str:
    return f"{n} more round{'s' if n != 1 else ''}"


def decide(better: str, st: dict, floor: float | None, level: float, margin: float, cap: int = 10_000) -> dict:
    """Verdict for per-round relative differences B vs A in % (`st` from statistics.diff_stats).

    better: "higher" or "lower" — which sign of the difference means B is faster.
    Claim: CI excludes 0 and |HL| exceeds the A/A floor. No difference: whole CI inside ±max(margin, floor).
    Otherwise inconclusive, with the rounds needed (same spread, same estimate) for either outcome to be reached.
    """
    sign = 1.0 if better == "higher" else -1.0
    y = max(margin, floor or 0.0)
    n = st["n"]
    if st.get("ci") is None:
        need = max(3 - n, 1)
        return {"kind": "inconclusive", "more_rounds": need, "bound": y,
                "text": f"inconclusive: about {_plural(need)} needed (no spread yet)"}
    lo, hi = st["ci"]
    centre = st["hl"]
    gain, glo, ghi = sign * centre, *sorted((sign * lo, sign * hi))
    beyond_floor = floor is None or abs(centre) > floor
    if (lo > 0 or hi < 0) and beyond_floor:
        word = "faster" if gain > 0 else "slower"
        return {"kind": word, "more_rounds": 0, "bound": y, "estimate": abs(gain),
                "text": f"B {word} by {abs(gain):.1f} % [{glo:+.1f}, {ghi:+.1f}]"}
    if -y <= lo and hi <= y:
        return {"kind": "no_difference", "more_rounds": 0, "bound": y, "text": f"no difference beyond ±{y:.1f} %"}
    # Half-width that would settle it if the estimate stayed where it is: fit inside ±y, or clear zero (and the floor).
    targets = [y - abs(centre)] if abs(centre) < y else []
    if abs(centre) > (floor or 0.0):
        targets.append(abs(centre))
    target = max(targets) if targets else margin / 2
    need = max(rounds_for_halfwidth(st["sd"], target, level, cap) - n, 1)
    note = " (within the A/A noise floor)" if (lo > 0 or hi < 0) else ""
    return {"kind": "inconclusive", "more_rounds": need, "bound": y,
            "text": f"inconclusive{note}: about {_plural(need)} needed"}

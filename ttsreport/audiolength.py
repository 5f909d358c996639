"""Audio seconds per prompt, arm B against arm A: did both arms produce the same audio for the same text?

Throughput in audio seconds per second and latency both depend on how long each answer is. vllm-omni 0.16.0 runs
every request to its talker stage's max_tokens (or the codec end id), later releases honour the request's
max_new_tokens and 0.32.0rc1 caps runaway outputs, so two arms can differ in audio per request for reasons that are
not speed. Per prompt present in both arms, d = ln(mean audio_s of B / mean audio_s of A); the prompts are the units
of a Student t interval. The arms differ when the interval excludes 0 (ratio 1) and the ratio is beyond a tolerance.
Pure: lists of request dicts (ttsrecords.records.RequestRecord.to_dict) in, one dict out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np

from . import inference as inf

TOLERANCE_PCT = 2.0  # a difference in audio per prompt smaller than this is not worth a warning


def prompt_means(requests: Iterable[dict]) -> dict[str, tuple[float, int]]:
    """Mean audio seconds and request count per prompt_id over the successful requests that returned audio."""
    sums: dict[str, list[float]] = {}
    for r in requests:
        a = r.get("audio_s")
        if r.get("ok") and r.get("prompt_id") and isinstance(a, (int, float)) and a > 0 and math.isfinite(a):
            sums.setdefault(str(r["prompt_id"]), []).append(float(a))
    return {p: (sum(v) / len(v), len(v)) for p, v in sums.items()}


def compare_audio(a_requests: Iterable[dict], b_requests: Iterable[dict], *, confidence: float = 0.95,
                  tolerance_pct: float = TOLERANCE_PCT) -> dict:
    """kind "differs" | "matches" | "unknown" (fewer than two prompts in both arms), the ratio B/A of audio seconds
    per prompt (geometric mean over prompts) with its t interval over prompts, counts, and one line of text."""
    inf._check_confidence(confidence)
    if not 0 <= tolerance_pct < 100:
        raise ValueError(f"tolerance_pct = {tolerance_pct!r}: must be in [0, 100)")
    pa, pb = prompt_means(a_requests), prompt_means(b_requests)
    common = sorted(set(pa) & set(pb))
    d = np.array([math.log(pb[p][0] / pa[p][0]) for p in common], dtype=float)
    n, mean, sd, se = inf._mean_se(d)
    out = {"kind": "unknown", "prompts": n, "prompts_a_only": len(set(pa) - set(pb)),
           "prompts_b_only": len(set(pb) - set(pa)), "requests": [sum(c for _, c in pa.values()),
                                                                  sum(c for _, c in pb.values())],
           "mean_audio_s": [_mean([pa[p][0] for p in common]), _mean([pb[p][0] for p in common])],
           "ratio": None, "ci": None, "sd_log": sd, "confidence": confidence, "tolerance_pct": tolerance_pct}
    if se is None:
        out["text"] = (f"audio per prompt not compared: {n} prompt(s) answered in both arms, at least 2 needed")
        return out
    lo, hi = inf._interval(mean, se, n - 1, confidence)
    ratio, ci = math.exp(mean), [math.exp(lo), math.exp(hi)]
    beyond = abs(ratio - 1.0) * 100.0 > tolerance_pct
    differs = (lo > 0 or hi < 0) and beyond
    out.update(kind="differs" if differs else "matches", ratio=ratio, ci=ci)
    where = f"B/A {ratio:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] over {n} prompts ({confidence:.0%} t interval)"
    if differs:
        out["text"] = (f"arm B's audio per prompt is {abs(ratio - 1) * 100:.1f} % {'longer' if ratio > 1 else 'shorter'}"
                       f" than arm A's: {where}, beyond noise and the ±{tolerance_pct:g} % tolerance, so throughput "
                       "in audio-s/s and latency compare different amounts of audio, not only speed")
    else:
        out["text"] = f"audio per prompt matches between the arms: {where}, within noise or ±{tolerance_pct:g} %"
    return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None

"""Judging a window from its records: request outcomes (ok, failed by kind, cut at a level's end), the load's own
verdict, the manipulation check (did the syncs match the variant's signature) and whether the window is valid.

Written by the runner (loadtest.window_check) into block.json and read back by the statistics; plain Python, as
records.py, so the load side never imports numpy or scipy for it.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from tts_predictor import metrics as pm
from ttsrecords.records import CUT_AT_LEVEL_END

# Manipulation check: observed syncs within 2 % of the closed form (exact on the simulator; sampling on a real server).
SYNC_TOLERANCE = 0.02


def is_cut(r: dict[str, Any]) -> bool:
    return not r.get("ok") and r.get("error") == CUT_AT_LEVEL_END


def error_kind(error: str | None) -> str:
    """A request's error reason without its details: 'http 503', 'stream broken', 'no response', ..."""
    head = (error or "unknown error").split(":", 1)[0].strip()
    if re.fullmatch(r"http \d+( error body \(code \d+\))?", head):  # a status, or vllm-omni's 200 with an error body
        return head
    return re.sub(r"\s+(after\s+)?\d.*$", "", head) or head


def error_counts(requests: list[dict[str, Any]]) -> dict[str, int]:
    """Failed requests by error kind, most frequent first (a drain request cut at its level's end is no failure)."""
    return dict(Counter(error_kind(r.get("error")) for r in requests if not r.get("ok") and not is_cut(r)).most_common())


def request_outcomes(requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts of a block's request rows: measure-phase requests and failures by kind, and failures elsewhere."""
    measure = [r for r in requests if r.get("phase") == "measure"]
    other = [r for r in requests if r.get("phase") != "measure"]
    return {"measure": len(measure), "measure_failed": sum(not r.get("ok") for r in measure),
            "measure_errors": error_counts(measure), "other": len(other),
            "other_failed": sum(not r.get("ok") and not is_cut(r) for r in other), "other_errors": error_counts(other),
            "cut": sum(is_cut(r) for r in other)}


def _top(errors: dict[str, int], n: int = 3) -> str:
    items = sorted(errors.items(), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} ({v})" for k, v in items[:n])
    return text + (f", {len(items) - n} other kinds" if len(items) > n else "")


def every_request_failed(outcomes: dict[str, Any]) -> str | None:
    """The reason a window says its server start is broken (every request of it, in any phase, failed), else None.
    Such a start ends and the round reruns in a new one, as when a server dies."""
    o = outcomes
    total, failed = o["measure"] + o["other"], o["measure_failed"] + o["other_failed"]
    if total == 0 or failed < total:
        return None
    errors = dict(o["measure_errors"])
    for k, v in o["other_errors"].items():
        errors[k] = errors.get(k, 0) + v
    return f"every one of its {total} requests failed ({_top(errors)})"


def request_verdict(outcomes: dict[str, Any]) -> str | None:
    """None when the measure phases can be used; else the reason the block is invalid.

    Failed requests are data (the error rate has a verdict of its own, and the statistics show the comparison with
    and without rounds that had failures): a block is invalid only when nothing in its measure phases succeeded.
    """
    o = outcomes
    if not o["measure"]:
        why = "no measure-phase request was recorded"
        if o["other_failed"]:
            why += f" ({o['other_failed']} of {o['other']} other requests failed: {_top(o['other_errors'])})"
        return why
    if o["measure_failed"] >= o["measure"]:
        return f"all {o['measure']} measure-phase requests failed: {_top(o['measure_errors'])}"
    return None


def signature_holds(variant: str, syncs: float, observed_calls: float, observed_tokens: float) -> tuple[bool, float]:
    """Do `syncs` over these observed calls equal the variant's closed form (metrics.expected_syncs) within
    SYNC_TOLERANCE? Returns (holds, expected). The one comparison behind the manipulation check, the arm evidence
    and the preflight."""
    expected = pm.expected_syncs(variant, observed_calls, observed_tokens)
    return abs(syncs - expected) <= SYNC_TOLERANCE * max(expected, 1.0), expected


def deltas(counters: list[dict[str, Any]], window: str = "measure") -> list[dict[str, Any]]:
    """The delta lines of one window kind (version-1 lines, which have no window, are measure windows)."""
    return [c for c in counters if c.get("kind") == "delta" and c.get("window", "measure") == window]


def _moved(d: dict[str, Any]) -> list[str]:
    return list(d.get("variants_moved") or ([d["variant"]] if d.get("variant") else []))


def manipulation_check(variant: str | None, counters: list[dict[str, Any]]) -> dict[str, Any]:
    """Do the block's sync counters show its variant's signature (metrics.expected_syncs)? Missing counters fail.

    With count phases (the observer on, not timed) the signature is checked there, and every timing window must hold
    zero observed calls (the observer's cost never lands in what is compared). Without them (version-1 runs, a
    server without a control channel) the measure windows carry the sample, and `observer_in_timing` says so.
    Any window whose calls moved under another variant, or under two, fails. variant None (an arm without the
    plugin) has no signature to check: ok, applicable False (its evidence comes from the server's log or metrics).
    """
    count, measure = deltas(counters, "count"), deltas(counters, "measure")
    ds = count or measure
    syncs = sum(c.get("syncs") or 0 for c in ds)
    ocalls = sum(c.get("observed_calls") or 0 for c in ds)
    otokens = sum(c.get("observed_tokens") or 0 for c in ds)
    labels = sorted({v for c in count + measure for v in _moved(c)})
    timing_observed = sum(c.get("observed_calls") or 0 for c in measure) if count else None
    res = {"variant": variant, "server_variants": labels, "syncs": syncs, "observed_calls": ocalls,
           "observed_tokens": otokens, "expected_syncs": None, "source": "count" if count else "measure",
           "observer_in_timing": not count, "timing_observed_calls": timing_observed, "applicable": variant is not None,
           "ok": False, "reason": None}
    if variant is None:
        res["ok"] = True
        return res
    mixed = [c for c in count + measure if len(_moved(c)) > 1]
    if mixed:
        c = mixed[0]
        res["reason"] = f"c={c.get('concurrency')}: calls of several variants {_moved(c)} in one {c.get('window', 'measure')} window"
        return res
    if not ds or not ocalls:
        res["reason"] = "no sync counters observed (scrape failed or observer off): variant cannot be verified"
        return res
    if labels and labels != [variant]:
        res["reason"] = f"server reports variant {labels}, block expected {variant!r}"
        return res
    if timing_observed:
        res["reason"] = (f"the sync observer ran inside the timing windows ({timing_observed:g} observed calls): the "
                         "control file's observe switch did not take effect before the measure phase")
        return res
    try:
        holds, exp = signature_holds(variant, syncs, ocalls, otokens)
    except (ValueError, KeyError):
        res["reason"] = f"unknown variant {variant!r}"
        return res
    res["expected_syncs"] = exp
    if holds:
        res["ok"] = True
    else:
        res["reason"] = (f"syncs {syncs:g} != expected {exp:g} for {variant} over {ocalls:g} calls / {otokens:g} tokens "
                         f"({syncs / ocalls:.2f} vs {exp / ocalls:.2f} per call)")
    return res


def load_verdict(variant: str | None, outcomes: dict[str, Any], counters: list[dict[str, Any]]) -> str | None:
    """Right after a block's load: None when its data can be used, else why it is invalid (requests first, then the
    manipulation check)."""
    why = request_verdict(outcomes)
    if why is not None:
        return why
    check = manipulation_check(variant, counters)
    return None if check["ok"] else f"manipulation check failed: {check['reason']}"


def block_validity(block: dict[str, Any], check: dict[str, Any], measured: bool) -> str | None:
    """Whether the statistics may use a stored block: None if so, else why not. The stored status decides first (the
    runner's load_verdict already judged the requests), then the manipulation check, then whether anything was
    measured."""
    status = block.get("status")
    if status != "complete":
        return f"status {status}" + (f": {block.get('reason')}" if block.get("reason") else "")
    if not check["ok"]:
        return f"manipulation check failed: {check['reason']}"
    if not measured:
        return "no measured requests"
    return None

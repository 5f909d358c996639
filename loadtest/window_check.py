"""A finished window, checked from the files it wrote: its request outcomes and load verdict, what its Locust raised,
its hot-swap switch as the counters confirm it, the requests that spanned a switch, its arm's evidence check, and how
often it failed before.
Pure functions of a window's folder and records (the rules themselves are ttsrecords.records'); the runner calls them
after each window's load."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

from loadtest import experiment as ex
from loadtest.evidence import check_evidence
from tts_predictor import metrics as pm
from ttsrecords import outcomes as oc
from ttsrecords import records as rec
from ttsrecords.samples import rows_of, sample_key


def previous_failures(meta_path: Path) -> int:
    """How many attempts of this block failed so far (the one in meta_path included), from its block.json."""
    try:
        old = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    return int(old.get("failed_before") or 0) + (old.get("status") == "failed")


def locust_exceptions(bdir: Path) -> str | None:
    """Exceptions raised inside Locust's users (a bug of the locustfile, not a failed request), from its CSV."""
    path = bdir / "locust_exceptions.csv"
    try:
        with open(path, encoding="utf-8", newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    if not rows:
        return None
    n = sum(int(r.get("Count") or 1) for r in rows)
    first = (rows[0].get("Message") or "").strip().splitlines()[0][:200] if rows[0].get("Message") else "?"
    return f"Locust users raised {n} exception(s), e.g. {first} (see locust_exceptions.csv)"


def judge(variant: str | None, bdir: Path) -> tuple[dict, str | None]:
    """A finished window's request outcomes and, if it is invalid, why (ttsrecords.outcomes decides)."""
    requests, _ = rec.read_jsonl(bdir / "requests.jsonl", rec.REQUEST_SCHEMA)
    counters, _ = rec.read_jsonl(bdir / "counters.jsonl", rec.COUNTERS_SCHEMA)
    outcomes = oc.request_outcomes(requests)
    return outcomes, oc.load_verdict(variant, outcomes, counters)


def last_snapshot_rows(counters: list[dict]) -> list:
    """The (name, labels, value) rows of the window's last good snapshot (the arm's evidence check reads them)."""
    snaps = [c for c in counters if c.get("kind") == "snapshot" and c.get("ok")]
    return rows_of(max(snaps, key=lambda c: c["t"])["samples"]) if snaps else []


def switch_record(counters: list[dict], block_id: str) -> dict | None:
    """The window's hot-swap switch: its first control write (t, variant, epoch) and confirmed_t, the time of the
    first snapshot after it in which the server shows that epoch with that variant active (None: never shown)."""
    writes = [c for c in counters if c.get("kind") == "control"]
    if not writes:
        return None
    w = min(writes, key=lambda c: c["t"])
    active = sample_key(pm.ACTIVE_VARIANT, {"variant": w["variant"]})
    shown = [c["t"] for c in counters if c.get("kind") == "snapshot" and c.get("ok") and c["t"] >= w["t"]
             and (c["samples"].get(pm.CONTROL_EPOCH) or -1) >= w["epoch"] and c["samples"].get(active) == 1]
    return {"t": w["t"], "variant": w["variant"], "epoch": w["epoch"], "confirmed_t": min(shown) if shown else None,
            "block_id": block_id}


def spanning(requests: list[dict], switches: list[dict]) -> dict[str, int]:
    """Requests whose run overlapped a switch (from its write to its confirmation): all, and in a measure phase. Each
    window is its own Locust run and switches at its first count phase, so a measured request never should."""
    def overlaps(r: dict) -> bool:
        end = r["t_start"] + (r.get("e2e_s") or 0.0)
        return any(r["t_start"] < (s.get("confirmed_t") or s["t"]) and end > s["t"] for s in switches)

    hits = [r for r in requests if overlaps(r)]
    return {"total": len(hits), "measure": sum(r.get("phase") == "measure" for r in hits)}


def confirm_switch(counters: list[dict], block_id: str, variant: str | None) -> tuple[dict | None, str | None]:
    """A hot-swap window's switch record and, when the switch cannot be trusted, why (no write, or no snapshot shows
    the server running it)."""
    sw = switch_record(counters, block_id)
    if sw is None:
        return None, f"hot swap to {variant}: no control write was recorded"
    if sw["confirmed_t"] is None:
        return sw, f"hot swap to {variant} (epoch {sw['epoch']}) not confirmed: no snapshot shows the server running it"
    return sw, None


def arm_evidence(arm: ex.Arm, server_log: str, counters: list[dict], *, shared_start: bool) -> tuple[bool, str]:
    """The arm's evidence check on its start's server.log and the window's last snapshot. A start shared by both arms
    (hot swap) holds both arms' cumulative counters, so there the sync signature is left to the manipulation check,
    which judges each window's own delta, and the reason says so."""
    checked = replace(arm, evidence=replace(arm.evidence, sync_signature=None)) if shared_start else arm
    ok, reason = check_evidence(checked, server_log, last_snapshot_rows(counters))
    if ok and checked.evidence != arm.evidence:
        rest = reason.removeprefix("evidence holds: ")
        reason = "evidence holds: " + "; ".join(x for x in (rest, "sync signature checked per window by the "
                                                            "manipulation check (a shared start holds both arms' "
                                                            "counters)") if x)
    return ok, reason

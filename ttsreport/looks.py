"""`python -m ttsreport <run> --look`: the sequential rule after the rounds completed so far, one line appended to
`<run>/looks.jsonl` (schema tts-look/1) for the runner to read (stop or continue).

The look runs the sequential rule (comparison.headline_sequential) on the primary metric at every level, over the
valid A/B rounds so far (per server start in a nested design: the runner looks once per start), with the manifest's
sequential settings and a boundary for the number of units the looks count. The look after the plan's last unit
decides (stop). The rule replays every earlier look, so its answer depends only on the rounds, never on how often it
was asked.
"""

from __future__ import annotations

from pathlib import Path

from ttsrecords import records as rec

from . import rounds as rd
from .analysis import confidence_of, margin_of, plan_done, primary_of, sequential_of
from .blocks import block_summary
from .comparison import compare_metric, headline_sequential
from .runfolder import load_run

LOOKS_FILE = "looks.jsonl"


def look(run_dir: str | Path, *, margin_pct: float | None = None, confidence: float | None = None) -> dict:
    """The look line (not yet written): stop, reason, headline kind and per-level decisions with repeated intervals."""
    run = load_run(run_dir)
    man = run["manifest"]
    if not man:
        raise ValueError(f"{run_dir}: no manifest.json (not an A/B run)")
    margin, _src = margin_of(run, margin_pct)
    confidence, _src = confidence_of(man, confidence)
    seq = sequential_of(man, margin, confidence)
    if seq is None:
        raise ValueError(f"{run_dir}: the manifest has no sequential settings (max_rounds): not a sequential run")
    design = rd.design_of(man)
    unit = rd.DESIGN_UNITS[design]
    primary, _ = primary_of(man)
    summaries = [block_summary(b, run["starts"].get(b["meta"].get("start")), within=False) for b in run["blocks"]]
    pairs = rd.paired_rounds(summaries, "ab")
    levels = sorted({lv for b in summaries if b["valid"] for lv in b["levels"]}, key=int)
    base = {"schema": rec.LOOK_SCHEMA, "round": max(pairs) if pairs else None, "rounds": len(pairs), "unit": unit,
            "metric": primary, "min_rounds": seq["min_rounds"], "max_rounds": seq["max_rounds"],
            "min_units": seq["min_units"], "max_units": seq["max_units"], "alpha": seq["alpha"],
            "margin_pct": seq["margin_pct"]}
    final = plan_done(man, run["blocks"])
    if not levels:
        return {**base, "stop": final, "kind": "inconclusive", "text": "no valid A/B round yet", "levels": {},
                "reason": "last look: no valid A/B round, nothing decided" if final else
                "continue: no valid A/B round yet"}
    # the look names a failed arm or a level without spread as the report does (no speed claim there)
    fixed = {lv: compare_metric(pairs, lv, primary, unit=unit, margin_pct=seq["margin_pct"], confidence=confidence,
                                bootstrap=0, scope=rd.DESIGN_SCOPE[design]) for lv in levels}
    res = headline_sequential(pairs, levels, primary, unit, seq, fixed, rd.DESIGN_SCOPE[design], final=final)
    if unit == "start":
        base["starts"] = res["look"]
    return {**base, "stop": res["stop"], "reason": res["reason"], "kind": res["kind"], "text": res["text"],
            "levels": {lv: {k: r.get(k) for k in ("kind", "n", "ratio", "ci_decision", "ci_decision_what", "ci",
                                                  "ci_equivalence", "p_holm", "equivalent_at", "text")}
                       for lv, r in res["levels"].items()},
            "notes": res["notes"], "rule": res["correction"]}


def append_look(run_dir: str | Path, line: dict) -> Path:
    """Append one look to <run>/looks.jsonl (flushed; earlier looks are never rewritten)."""
    path = Path(run_dir) / LOOKS_FILE
    with rec.JsonlWriter(path) as w:
        w.write(line)
    return path


def decision_ci(row: dict) -> list | None:
    """The interval shown beside a look's word: the one that decided it (`ci_decision`). Looks written before it was
    recorded: the equivalence interval beside "equivalent", the simultaneous one beside "inconclusive", and none
    beside a claim or a failed level (their recorded interval was not the deciding one)."""
    if "ci_decision" in row:
        return row["ci_decision"]
    kind = row.get("kind")
    return row.get("ci_equivalence") if kind == "equivalent" else row.get("ci") if kind == "inconclusive" else None


def one_line(line: dict) -> str:
    """What the command prints: the decision and each level in a few words, with the interval that decided it."""
    levels = "; ".join(f"c={lv} {r['kind']}" + (f" ×{r['ratio']:.3f}" if r.get("ratio") is not None else "")
                       + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if (ci := decision_ci(r)) else "")
                       for lv, r in line["levels"].items())
    what = "STOP" if line["stop"] else "continue"
    return f"look after {line['rounds']} round(s): {what} ({line['reason']}); {levels or line.get('text', '')}"

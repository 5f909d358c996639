"""The report: summary.md and a self-contained offline index.html from the statistics' JSON.

It computes nothing: every number it shows is read from summary.json / comparison.json (unit conversions for display
aside), so what a person sees is exactly what the statistics wrote. Both pages are built from one list of sections
(paragraphs and tables; the HTML adds the figures of ttsreport.plots), so they say the same things.

Order: banners (simulated + fidelity, confounded release comparison, A/A bias, partial run, invalid windows), the
headline (primary metric per level: decision, ratio, interval, Holm), the per-level table (primary, secondary
metrics marked uncorrected, error rate), A/A check, failures, design (variance components, order effect, level
orders), sequential looks, telemetry, streaming continuity, vllm-omni's own metrics, predictions, arms, windows.
"""

from __future__ import annotations

from pathlib import Path

from ttsrecords.measures import METRICS
from ttsrecords.results import Comparison, Summary, read_results
from ttssim import heldout

from .page import DASH, Section, Table, _ci, _p, _r, _shown_ci, _value, _words
from .sections import (
    aa_section,
    arms_section,
    continuity_section,
    design_section,
    failures_section,
    looks_section,
    prediction_section,
    telemetry_section,
    upstream_section,
    windows_section,
)

TABLE_METRICS = ("throughput_rps", "audio_throughput", "e2e_p50", "e2e_p90", "e2e_p99", "ttfa_p50", "rtf_p50",
                 "stream_rtf_p50")


def load(run_dir: str | Path) -> tuple[Summary, Comparison]:
    """The run's statistics, typed (ttsrecords.results); a ResultsError (one line) when they cannot be read."""
    return read_results(run_dir)


def banners(summary: Summary, comparison: Comparison) -> list[tuple[str, str]]:
    """(css class, text) of the loud banners."""
    out = []
    if summary.simulated:
        fid = summary.fidelity or {}
        line = fid.get("line") or (f"fidelity: {fid['reason']}" if fid.get("reason") else "fidelity: not recorded")
        out.append(("sim", "SIMULATED BACKEND — these numbers come from the ttssim simulator (modelled step times + the "
                           f"real variant code on CPU), not from vllm-omni on a GPU. {line}; {heldout.line()}"))
    be = summary.backend or {}
    if isinstance(be, dict) and be.get("name") == "vllm-cpu":
        out.append(("warn", "REAL vllm-omni 0.16.0 SERVER ON CPU — the serving pipeline is real (API server, stage "
                            "processes, connector, plugin); the model is a tiny random Qwen3-TTS and attention runs "
                            "on CPU, so the timings are not a GPU's."))
    conf = (summary.experiment or {}).get("confounded")
    if conf:
        out.append(("confounded", "RELEASE VS RELEASE — everything differs between the arms, not one function: "
                                  f"{conf}. A difference here cannot be attributed to any single change."))
    for w in comparison.aa_warnings or []:
        out.append(("invalid", f"A/A BIAS — {w}. The set-up itself moves the primary metric (order, warm-up or "
                               "drift): treat every verdict with suspicion until it is understood."))
    if summary.partial:
        out.append(("partial", f"PARTIAL RUN — {summary.complete_blocks} of {summary.planned_blocks or '?'} "
                               f"planned windows complete (run status: {summary.run_status}). "
                               "Verdicts use only the complete rounds."))
    head = comparison.headline or {}
    for lv in comparison.levels or []:
        row = (head.get("levels") or {}).get(lv) or {}
        if row.get("kind") == "failed" or (row.get("failed") or {}).get("rounds"):
            res = comparison.per_level[lv]["metrics"][comparison.primary_metric]
            why = "; ".join(n.split(": the arm failed there")[0] for n in res.get("notes") or []
                            if "the arm failed there" in n)
            kept = (f"B {row['kind']} at c={lv} stands from the rounds where both arms worked (the failures can only "
                    "strengthen it)" if row.get("kind") in ("faster", "slower") else
                    f"No speed claim at c={lv} from the remaining rounds")
            out.append(("invalid", f"ARM FAILED at c={lv} — {why}. {kept}: fix the failure and rerun."))
        gone = comparison.per_level[lv].get("not_measured") or []
        if gone:
            rounds = sorted({x["round"] for x in gone})
            out.append(("warn", f"NOT MEASURED at c={lv} in {len(rounds)} of {comparison.rounds['ab']} round(s) — "
                                + "; ".join(f"round {x['round']}: {x['reason']}" for x in gone)
                                + ". Invalid there, not a failure and not a zero: left out of every metric at "
                                  f"c={lv}; rerun under the design's rule (longer measure windows)."))
        gaps = {m: r["failure_gap"] for m, r in comparison.per_level[lv]["metrics"].items()
                if (r.get("failure_gap") or {}).get("allowed")}
        if gaps:
            g = next(iter(gaps.values()))
            favoured = "B" if g["gap_pp"] > 0 else "A"
            withheld = [METRICS[m].label for m, x in gaps.items() if x.get("withheld")]
            out.append(("invalid", f"FAILURE SHARES DIFFER at c={lv} — A failed {100 * g['a_share']:.1f} %, B "
                                   f"{100 * g['b_share']:.1f} % of measure-phase requests (more than "
                                   f"{g['limit_pp']:g} points apart). Metrics over the requests that worked favour "
                                   f"{favoured} there; only the claim the failures can strengthen stands"
                                   + (f" (withheld: {', '.join(withheld)})" if withheld else "")
                                   + ". Fix the failures and rerun."))
    for side, delay_us in (comparison.positive_control or {}).items():
        out.append(("warn", f"POSITIVE CONTROL — arm {side} carried a fixed extra {delay_us:g} us of host time per "
                            "build_attn_metadata call (the plugin's control file, counted in "
                            "tts_predictor_host_delay_calls_total): a known slowdown of that arm. A verdict that does "
                            "not find it says the run lacked the power for an effect of this size."))
    audio = comparison.audio_per_prompt or {}
    if audio.get("kind") == "differs":
        out.append(("invalid", f"AUDIO LENGTH DIFFERS — {audio['text']}." + _length_controls(audio)))
    note = comparison.settings.get("swap_note")
    if note:
        out.append(("warn", f"ONE SERVER START — {note}"))
    for w in summary.warnings or []:
        out.append(("warn", f"NOTE — {w}"))
    for b in summary.invalid_blocks:
        out.append(("invalid", f"INVALID WINDOW {b['block_id']} (round {b['round']}, {b['kind']}, arm {b['arm']}, "
                               f"{b['variant']}) excluded: {b['reason']}"))
    return out


def _length_controls(audio: dict) -> str:
    """What set each arm's output length, as its run manifest recorded it (empty for runs that did not)."""
    lc = audio.get("length_controls") or {}
    parts = [f"{side}: {c.get('text') or c.get('honours')} ({c.get('source')})"
             for side, c in sorted(lc.items()) if c]
    return f" Length control per arm — {'; '.join(parts)}." if parts else ""


def audio_line(comparison: Comparison) -> str | None:
    """The quiet line on audio seconds per prompt (the loud banner, when they differ, is in banners())."""
    audio = comparison.audio_per_prompt
    if not audio:
        return None
    return "Audio per prompt (B vs A): " + audio["text"] + "." + (
        f" Plan-time warning: {audio['length_warning']}." if audio.get("length_warning") else "")


def cards(comparison: Comparison) -> list[dict]:
    """The headline per level: kind, ratio, interval, words, and the multiplicity note."""
    head = comparison.headline
    if not head:
        return []
    out = []
    seq = head.get("rule") == "sequential"
    for lv in comparison.levels:
        row = head["levels"][lv]
        res = comparison.per_level[lv]["metrics"][comparison.primary_metric]
        kind = row.get("kind")
        if "ci_decision" in row:
            ci, ci_what = row.get("ci_decision"), row.get("ci_decision_what")
        else:  # statistics written before the deciding interval was recorded
            ci = row.get("ci_equivalence") if seq and kind == "equivalent" else row.get("ci")
            ci_what = None
        gain = res.get("gain")
        note = (f"sequential rule, Holm p {_p(row.get('p_holm'))}" if seq
                else f"Holm p {_p(row.get('p_holm'))} over {len(comparison.levels)} level(s)")
        if kind == "inconclusive" and row.get("rounds_needed"):
            note += f"; about {row['rounds_needed']} more {res.get('unit', 'round')}(s)"
        if kind in ("failed", "no_spread"):
            note = row.get("text") or res.get("text") or note
        er = comparison.per_level[lv].get("error_rate") or {}
        ci_er = er.get("ci_pp")
        error = (f"error rate: {er.get('kind', DASH)}" + (f", B − A {er['diff_pp']:+.2f} pp [{ci_er[0]:+.2f}, "
                                                            f"{ci_er[1]:+.2f}]" if ci_er else "")
                 + (f" (no claim: {er['no_claim_reason']})" if er.get("no_claim_reason") else ""))
        out.append({"level": lv, "kind": kind, "word": row.get("word") or kind,
                    "ratio": None if kind == "failed" else row.get("ratio"), "ci": ci,
                    "ci_what": ci_what, "words": _words(gain) if kind not in ("failed", "no_spread") else DASH,
                    "note": note, "n": row.get("n"), "unit": res.get("unit"), "error": error,
                    "error_kind": er.get("kind")})
    return out


def _metric_row(summary, lv, m, res, headline_row=None, sequential=False) -> list:
    meta = summary.metrics[m]
    arms = [summary.arms[x].get(lv, {}).get(m) for x in ("A", "B")]
    kind = (headline_row or res)["kind"]
    word = (headline_row or res).get("word") or kind
    ci = _shown_ci(headline_row if headline_row is not None else res)
    if kind in ("failed", "no_spread"):
        ci = None  # no interval decided it
    role = ("primary (sequential)" if sequential else "primary (Holm)") if headline_row is not None \
        else "secondary, uncorrected"
    decision = (word, f"k-{kind}") if res.get("n") or kind == "failed" else DASH  # DASH: no round with both values
    return [(f"c={lv}", "lv") if headline_row is not None else "", (meta["label"], "pm" if headline_row else ""),
            role, _value(arms[0]["mean"] if arms[0] else None, meta["unit"]),
            _value(arms[1]["mean"] if arms[1] else None, meta["unit"]), _r(res.get("ratio")), _ci(ci),
            _words(res.get("gain")) if res.get("ratio") and kind not in ("failed", "no_spread") else DASH, decision,
            f"{res.get('n')} {res.get('unit')}(s)"]


def verdict_table(summary: Summary, comparison: Comparison) -> Table:
    primary = comparison.primary_metric
    head = comparison.headline or {"levels": {}}
    rows = []
    for lv in comparison.levels:
        pl = comparison.per_level[lv]
        rows.append(_metric_row(summary, lv, primary, pl["metrics"][primary], head["levels"].get(lv),
                                head.get("rule") == "sequential"))
        for m in TABLE_METRICS:
            if m != primary and m in pl["metrics"]:
                rows.append(_metric_row(summary, lv, m, pl["metrics"][m]))
        er = pl["error_rate"]
        arms = [summary.arms[x].get(lv, {}).get("error_rate") for x in ("A", "B")]
        ci = er.get("ci_pp")
        rows.append(["", "error rate", "own verdict (rates)", _value(arms[0]["mean"] if arms[0] else None,
                                                                          "share"),
                     _value(arms[1]["mean"] if arms[1] else None, "share"),
                     DASH if er.get("diff_pp") is None else f"{er['diff_pp']:+.2f} pp",
                     DASH if not ci else f"[{ci[0]:+.2f}, {ci[1]:+.2f}] pp", "B − A, percentage points",
                     (er["kind"], f"k-{er['kind']}"), f"{er.get('n')} round(s)"])
    s = comparison.settings
    note = (f"Ratio = geometric mean of B/A over the {s['unit']}s; interval: {100 * s['confidence']:g} % Student t on "
            f"ln(B/A). {s['decision']}. {s['multiplicity']}. Error rate: B − A in percentage points, the hull of a "
            "paired t interval and Newcombe's score interval (a difference is claimed only when both agree).")
    if (comparison.headline or {}).get("rule") == "sequential":
        note += " Primary metric: the sequential rule's repeated interval (the run looked after every round)."
    else:
        note += (" Primary metric: the interval that decided its word (Holm's step for a claim, the 90 % TOST "
                 "interval for equivalence, Bonferroni over the levels when inconclusive).")
    if s.get("failure_rule"):
        note += f" Failed: {s['failure_rule']}. No spread: every unit gave the same ratio: check the set-up."
    return Table(["level", "metric", "role", "A", "B", "B/A", "interval", "in words", "decision", "n"], rows, note)


def skipped_units(comparison: Comparison) -> list[str]:
    """Every round or unit a verdict left out or flagged, with why (the notes of every comparison), one line each."""
    out = []
    for lv in comparison.levels:
        pl = comparison.per_level[lv]
        seen: list[str] = []
        for res in pl["metrics"].values():
            for n in res.get("notes") or []:
                if n not in seen:
                    seen.append(n)
        er = pl.get("error_rate") or {}
        if er.get("n_skipped"):
            seen.append(f"error rate: {er['n_skipped']} round(s) skipped (no request in one arm)")
        out += [f"c={lv}: {n}" for n in seen]
    out += [f"sequential rule: {n}" for n in (comparison.headline or {}).get("notes") or []]
    return out


def sections(summary: Summary, comparison: Comparison) -> list[Section]:
    s = comparison.settings
    head = comparison.headline
    top = Section("verdicts", "Verdicts per level (B vs A)")
    top.parts.append(verdict_table(summary, comparison))
    skipped = skipped_units(comparison)
    if skipped:
        top.parts.append(Table(["skipped or flagged units"], [[x] for x in skipped],
                               "Every unit a verdict left out or flagged, from the statistics' notes."))
    method = Section("method", "How this was decided")
    method.parts.append(f"{s['estimand']}. {s['decision']}; margin ±{s['margin_pct']:g} % "
                        f"(from {s.get('margin_source', 'default')}). {s['multiplicity']}"
                        + (f" (primary metric from {s.get('primary_source')})" if s.get("primary_source") else "")
                        + f". {s['bootstrap']}.")
    if head:
        method.parts.append(f"Rule of the headline: {head.get('correction', '')}.")
    if audio_line(comparison):
        method.parts.append(audio_line(comparison))
    primary = comparison.primary_metric
    rows = []
    for lv in comparison.levels:
        res = comparison.per_level[lv]["metrics"][primary]
        row = (head or {"levels": {}})["levels"].get(lv) or {}
        need = row.get("rounds_needed")
        if row.get("kind") != "inconclusive":
            settle = DASH
        elif (head or {}).get("rule") == "sequential":
            settle = f"the sequential rule looks again after every {res.get('unit')}, up to " \
                     f"{head['settings'].get('max_units', head['settings']['max_rounds'])}"
        else:
            why = row.get("rounds_needed_assumption") or ""
            settle = (f"about {need} more {res.get('unit')}(s), under the sequential rule" if need else
                      "out of reach at this noise" if why.startswith("out of reach at this noise") else
                      "more rounds would not settle it")
        rows.append([f"c={lv}", _ci(res.get("ci")), _ci(res.get("ci_bootstrap")), _ci(row.get("ci_simultaneous")),
                     settle, row.get("rounds_needed_assumption") or DASH])
    seq = (head or {}).get("rule") == "sequential"
    method.parts.append(Table(["level", "t interval (fixed sample)" if seq else "t interval (the verdict's)",
                               "bootstrap (diagnostic)",
                               "simultaneous (Bonferroni, display)", "to settle it", "what that assumes"], rows,
                              f"{summary.metrics[primary]['label']}: the Student t interval decides; the "
                              "percentile bootstrap over the units is shown only as a check of its shape (with few "
                              "units it cannot reach beyond the data, so it is never the verdict)."))
    out = [top, method, aa_section(summary, comparison)]
    for sec in (failures_section(summary, comparison), design_section(summary, comparison),
                looks_section(summary, comparison), telemetry_section(summary, comparison),
                continuity_section(summary, comparison), upstream_section(summary, comparison),
                prediction_section(summary, comparison), arms_section(summary), windows_section(summary)):
        if sec is not None:
            out.append(sec)
    return out


def title(summary: Summary) -> str:
    v = summary.variants
    name = (summary.experiment or {}).get("name")
    return f"TTS A/B: {v.get('B')} (B) vs {v.get('A')} (A)" + (f" — {name}" if name else "") + \
        f" — run {summary.run_id}"


def headline_sentence(summary: Summary, comparison: Comparison) -> str:
    head = comparison.headline
    if not head:
        return "No valid A/B round: nothing to compare yet."
    rule = "sequential rule" if head.get("rule") == "sequential" else "Holm over levels"
    word = head.get("word") or head["kind"]
    return f"Primary metric {summary.metrics[comparison.primary_metric]['label']}: {word} — {head['text']} ({rule})."

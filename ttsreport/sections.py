"""The report's sections after the verdicts: A/A check, failures, design, looks, telemetry, continuity, vllm-omni's
own metrics, predictions, arms and windows, each a pure function of the run's statistics.
"""

from __future__ import annotations

from ttsrecords.results import Comparison, Summary

from .looks import decision_ci
from .page import DASH, Section, Table, _ci, _num, _r, _sd_pct, _shown_ci, _value

TELEMETRY_COLUMNS = (("gpu_util_pct", "GPU util", "%", 1.0), ("sm_clock_mhz", "SM clock", "MHz", 1.0),
                     ("mem_used_mib", "memory used", "MiB", 1.0), ("power_w", "power", "W", 1.0),
                     ("cpu_pct", "server CPU", "%", 1.0), ("rss_mib", "server RSS", "MiB", 1.0),
                     ("host_cpu_pct", "host CPU busy", "%", 1.0))


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

"""The report: summary.md and a self-contained offline index.html from the statistics' JSON.

It computes nothing: every number it shows is read from summary.json / comparison.json (unit conversions for display
aside), so what a person sees is exactly what the statistics wrote. Plots are inline SVG from matplotlib (no CDN,
no scripts), so the page opens from a mail attachment or an air-gapped host.
"""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

from loadtest.records import COMPARISON_SCHEMA, SUMMARY_SCHEMA  # noqa: E402

COLORS = {"A": "#3b6ea8", "B": "#e07b39"}
VERDICT_COLORS = {"faster": "#1f9d55", "slower": "#d64545", "no_difference": "#5b6b7c", "inconclusive": "#c98a06"}
TABLE_METRICS = ("throughput_rps", "audio_throughput", "e2e_p50", "e2e_p90", "e2e_p99", "ttfa_p50", "rtf_p50")

plt.rcParams.update({
    "svg.hashsalt": "ttsreport", "svg.fonttype": "path", "font.size": 9, "axes.spines.top": False,
    "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.25, "axes.titleweight": "bold",
    "axes.titlesize": 10, "legend.frameon": False, "figure.dpi": 96,
})


def load(run_dir: str | Path) -> tuple[dict, dict]:
    run = Path(run_dir)
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    comparison = json.loads((run / "comparison.json").read_text(encoding="utf-8"))
    if summary.get("schema") != SUMMARY_SCHEMA or comparison.get("schema") != COMPARISON_SCHEMA:
        raise ValueError(f"{run}: unknown statistics schema {summary.get('schema')!r} / {comparison.get('schema')!r}")
    return summary, comparison


# ----------------------------------------------------------------------------------------------- plots


def _svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG is inlined into HTML
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)  # a date: same JSON, same page


def _label(summary: dict, arm: str) -> str:
    return f"{arm}: {summary['variants'].get(arm)}"


def _arm_line(ax, summary: dict, metric: str, scale: float = 1.0) -> bool:
    """Mean per level and arm with its band (both from summary.json)."""
    drawn = False
    for arm in ("A", "B"):
        pts = [(int(lv), r[metric]) for lv, r in summary["arms"][arm].items() if r.get(metric)]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1]["mean"] * scale for p in pts], "o-", color=COLORS[arm], label=_label(summary, arm), lw=2)
        ax.fill_between(xs, [p[1]["lo"] * scale for p in pts], [p[1]["hi"] * scale for p in pts],
                        color=COLORS[arm], alpha=0.18, lw=0)
        drawn = True
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(lv) for lv in summary["levels"]], [str(lv) for lv in summary["levels"]])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    return drawn


def plot_levels(summary: dict) -> str:
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.4))
    specs = [("throughput_rps", "Throughput (req/s) ↑", 1.0),
             ("e2e_p50", "p50 end-to-end latency (ms) ↓", 1e3),
             ("ttfa_p50", "p50 time to first audio (ms) ↓", 1e3)]
    for ax, (metric, title, scale) in zip(axes, specs, strict=True):
        if not _arm_line(ax, summary, metric, scale):
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="#888")
        ax.set_ylim(bottom=0)  # a wide band of a few blocks may reach below zero: these quantities cannot
        ax.set_title(title, loc="left")
    axes[0].legend(loc="best")
    fig.text(0.99, -0.02, "bands: 95 % Student-t interval of the per-block values", ha="right", color="#777", fontsize=8)
    return _svg(fig)


def plot_distributions(summary: dict) -> str:
    dist = summary["distributions"]
    levels = [lv for lv in summary["levels"] if lv in dist["A"] or lv in dist["B"]]
    if not levels:
        return ""
    cols = min(len(levels), 6)
    rows = -(-len(levels) // cols)
    cols = max(cols, 4)  # the page scales an SVG to its width: keep the text size of the other plots
    fig, axes = plt.subplots(rows, cols, figsize=(12.5, 2.3 * rows + 0.4), squeeze=False)
    probs = dist["probs"]
    for ax in axes.flat[len(levels):]:
        ax.axis("off")
    for ax, lv in zip(axes.flat, levels, strict=False):
        for arm in ("A", "B"):
            if lv in dist[arm]:
                ax.plot([q * 1e3 for q in dist[arm][lv]], probs, color=COLORS[arm], lw=1.8, label=_label(summary, arm))
        ax.set_title(f"c = {lv}", loc="left")
        ax.set_yticks([0, 50, 100])
        ax.tick_params(labelsize=7)
    axes.flat[0].set_ylabel("percentile")
    axes.flat[0].legend(loc="lower right", fontsize=7)
    fig.supxlabel("end-to-end latency (ms), pooled over valid A/B blocks", fontsize=8)
    fig.tight_layout()
    return _svg(fig)


def plot_syncs(summary: dict) -> str:
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.2))
    specs = [("syncs_per_call", "syncs per build_attn_metadata call"),
             ("syncs_per_step", "syncs per talker step"),
             ("syncs_per_request", "syncs per request")]
    for ax, (metric, title) in zip(axes, specs, strict=True):
        if not _arm_line(ax, summary, metric):
            ax.text(0.5, 0.5, "no counters", transform=ax.transAxes, ha="center", color="#888")
        ax.set_title(title, loc="left")
        ax.set_yscale("symlog", linthresh=1)  # the vectorized variant sits at 0
        ax.set_ylim(bottom=0)
    axes[0].legend(loc="best")
    return _svg(fig)


def plot_prediction(summary: dict, comparison: dict) -> str:
    """Observed CI of the B-vs-A difference per level (e2e p50 and throughput) beside the predicted value."""
    levels = comparison["levels"]
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 3.3))
    specs = [("e2e_p50", "e2e_diff_pct", "p50 latency, B vs A (%)"),
             ("throughput_rps", "throughput_diff_pct", "throughput, B vs A (%)")]
    for ax, (metric, pkey, title) in zip(axes, specs, strict=True):
        xs = list(range(len(levels)))
        for i, lv in enumerate(levels):
            st = comparison["per_level"][lv][metric]
            kind = st["verdict"]["kind"]
            col = VERDICT_COLORS[kind]
            if st["ci"]:
                ax.plot([i, i], st["ci"], color=col, lw=6, alpha=0.35, solid_capstyle="butt")
            if st["hl"] is not None:
                ax.plot(i, st["hl"], "o", color=col, ms=7, label="observed (HL, CI)" if i == 0 else None)
            for v in st["values"]:
                ax.plot(i + 0.18, v, ".", color="#999", ms=4, label="per round" if (i == 0 and v == st["values"][0])
                        else None)
            pred = comparison["prediction"][lv].get(pkey)
            if pred is not None:
                ax.plot(i - 0.18, pred, "D", color="#222", ms=6, mfc="white", label="predicted" if i == 0 else None)
            floor = st.get("aa_floor")
            if floor is not None:
                ax.plot([i - 0.35, i + 0.35], [floor, floor], color="#999", lw=0.8, ls=":")
                ax.plot([i - 0.35, i + 0.35], [-floor, -floor], color="#999", lw=0.8, ls=":")
        ax.axhline(0, color="#444", lw=0.8)
        ax.set_xticks(xs, [f"c={lv}" for lv in levels])
        ax.set_title(title, loc="left")
        ax.grid(axis="x", visible=False)
    handles, labels = axes[0].get_legend_handles_labels()
    axes[0].legend(handles, labels, loc="best", fontsize=7)
    fig.text(0.99, -0.03, f"bars: {100 * comparison['settings']['per_level_confidence']:.1f} % CI per level "
             "(Bonferroni); dotted: ± A/A noise floor", ha="right", color="#777", fontsize=8)
    return _svg(fig)


# ----------------------------------------------------------------------------------------------- text


def _esc(x) -> str:
    return html.escape(str(x))


def _fmt(v, metric: str) -> str:
    if v is None:
        return "–"
    if metric.startswith(("e2e", "ttfa")):
        return f"{v * 1e3:.0f} ms"
    if metric == "error_rate":
        return f"{100 * v:.2f} %"
    return f"{v:.3g}"


def banners(summary: dict, comparison: dict) -> list[tuple[str, str]]:
    """(css class, text) of the loud banners: simulated backend, invalid blocks, partial run."""
    out = []
    if summary["simulated"]:
        out.append(("sim", "SIMULATED BACKEND — these numbers come from the ttssim simulator (modelled step times + the "
                           "real variant code on CPU), not from vllm-omni on a GPU."))
    if summary["partial"]:
        out.append(("partial", f"PARTIAL RUN — {summary['complete_blocks']} of {summary['planned_blocks'] or '?'} "
                               f"planned blocks complete (run status: {summary.get('run_status')}). "
                               "Verdicts use only the complete rounds."))
    for w in summary.get("warnings") or []:
        out.append(("warn", f"SHORT PHASES — {w}"))
    for b in summary["invalid_blocks"]:
        out.append(("invalid", f"INVALID BLOCK {b['block_id']} (round {b['round']}, {b['kind']}, arm {b['arm']}, "
                               f"{b['variant']}) excluded: {b['reason']}"))
    return out


def headline(comparison: dict) -> list[tuple[str, str, str]]:
    """(level, verdict kind, text) for the primary metric, in level order."""
    pm = comparison["primary_metric"]
    return [(lv, comparison["per_level"][lv][pm]["verdict"]["kind"], comparison["per_level"][lv][pm]["verdict"]["text"])
            for lv in comparison["levels"]]


def markdown(summary: dict, comparison: dict) -> str:
    v = summary["variants"]
    lines = [f"# TTS A/B: {v.get('B')} (B) vs {v.get('A')} (A) — run {summary['run_id']}", ""]
    for _, text in banners(summary, comparison):
        lines += [f"> **{text}**", ""]
    r = comparison["rounds"]
    lines += [f"{r['ab']} A/B rounds and {r['aa']} A/A rounds used; CIs: {comparison['settings']['ci_method']}; "
              f"{comparison['settings']['correction']}.", "", "## Verdicts", "",
              "| concurrency | " + " | ".join(summary["metrics"][m]["label"] for m in TABLE_METRICS) + " |",
              "|---|" + "---|" * len(TABLE_METRICS)]
    for lv in comparison["levels"]:
        row = comparison["per_level"][lv]
        lines.append(f"| {lv} | " + " | ".join(row[m]["verdict"]["text"] for m in TABLE_METRICS) + " |")
    lines += ["", "## Per level (means over valid A/B blocks)", "",
              "| c | arm | req/s | audio-s/s | p50 | p90 | p99 | TTFA p50 | RTF p50 | errors | syncs/call | syncs/step |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for lv in summary["levels"]:
        for arm in ("A", "B"):
            a = summary["arms"][arm].get(lv, {})

            def m(k, a=a):
                return _fmt(a[k]["mean"], k) if a.get(k) else "–"
            lines.append(f"| {lv} | {arm} | " + " | ".join(m(k) for k in (
                "throughput_rps", "audio_throughput", "e2e_p50", "e2e_p90", "e2e_p99", "ttfa_p50", "rtf_p50",
                "error_rate", "syncs_per_call", "syncs_per_step")) + " |")
    lines += ["", "## Predicted vs observed (p50 latency, B vs A)", "",
              "| c | saving/call | predicted e2e | observed HL [CI] | source |", "|---|---|---|---|---|"]
    for lv in comparison["levels"]:
        p, st = comparison["prediction"][lv], comparison["per_level"][lv]["e2e_p50"]
        pred = f"{p['e2e_diff_pct']:+.2f} %" if p.get("e2e_diff_pct") is not None else "–"
        spc = f"{p['saving_per_call_s'] * 1e6:.1f} µs" if p.get("saving_per_call_s") is not None else "–"
        obs = (f"{st['hl']:+.2f} % [{st['ci'][0]:+.2f}, {st['ci'][1]:+.2f}]" if st.get("ci") else
               (f"{st['hl']:+.2f} %" if st.get("hl") is not None else "–"))
        lines.append(f"| {lv} | {spc} | {pred} | {obs} | {p['source']} |")
    lines += ["", "## Blocks", "", "| block | round | kind | arm | variant | status | valid | note |",
              "|---|---|---|---|---|---|---|---|"]
    for b in summary["blocks"]:
        lines.append(f"| {b['block_id']} | {b['round']} | {b['kind']} | {b['arm']} | {b['variant']} | {b['status']} "
                     f"| {'yes' if b['valid'] else '**NO**'} | {b['invalid_reason'] or ''} |")
    lines += ["", "## Metric definitions", ""]
    lines += [f"- **{m['label']}** ({k}): {m['definition']}" for k, m in summary["metrics"].items()]
    return "\n".join(lines) + "\n"


CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;margin:0;background:#f4f6f9;
color:#1d2633}
main{max-width:1280px;margin:0 auto;padding:20px 28px 40px}
h1{font-size:22px;margin:6px 0 2px}h2{font-size:16px;margin:0 0 10px}
.sub{color:#5b6b7c;font-size:13px;margin-bottom:14px}
.banner{padding:10px 14px;border-radius:6px;margin:8px 0;font-weight:600;font-size:14px}
.banner.sim{background:#fff3cd;border:2px solid #e0a800;color:#6b4e00}
.banner.partial{background:#e8f0fe;border:2px solid #3b6ea8;color:#1a3d66}
.banner.warn{background:#fff8e6;border:1px dashed #c98a06;color:#6b4e00;font-weight:500}
.banner.invalid{background:#fde2e2;border:2px solid #d64545;color:#7a1616}
.cards{display:flex;gap:12px;flex-wrap:wrap;margin:12px 0 18px}
.card{background:#fff;border-radius:8px;padding:10px 14px;min-width:150px;flex:1;box-shadow:0 1px 3px rgba(0,0,0,.08);
border-top:5px solid #ccc}
.card .lv{font-size:12px;color:#5b6b7c}.card .v{font-size:15px;font-weight:700;margin-top:4px}
section{background:#fff;border-radius:8px;padding:14px 16px;margin:14px 0;box-shadow:0 1px 3px rgba(0,0,0,.08)}
section svg{width:100%;height:auto}
table{border-collapse:collapse;font-size:12.5px;width:100%}
th,td{padding:5px 8px;border-bottom:1px solid #e6e9ee;text-align:left;vertical-align:top}
th{background:#f0f2f5;font-weight:600}
td.v{font-weight:600;border-radius:4px}
.k-faster{color:#1f9d55}.k-slower{color:#d64545}.k-no_difference{color:#5b6b7c}.k-inconclusive{color:#c98a06}
.no{color:#d64545;font-weight:700}
.legend{font-size:12px;color:#5b6b7c;margin-top:6px}
details{margin-top:6px}summary{cursor:pointer;color:#3b6ea8}
"""


def html_page(summary: dict, comparison: dict) -> str:
    v = summary["variants"]
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width,initial-scale=1'>",
             f"<title>TTS A/B {_esc(v.get('B'))} vs {_esc(v.get('A'))} — {_esc(summary['run_id'])}</title>",
             f"<style>{CSS}</style></head><body><main>"]
    for cls, text in banners(summary, comparison):
        parts.append(f"<div class='banner {cls}'>{_esc(text)}</div>")
    be = summary.get("backend") or {}
    be_text = be.get("name", "") if isinstance(be, dict) else be
    r = comparison["rounds"]
    parts.append(f"<h1>Is <span style='color:{COLORS['B']}'>{_esc(v.get('B'))}</span> faster than "
                 f"<span style='color:{COLORS['A']}'>{_esc(v.get('A'))}</span> end to end?</h1>")
    parts.append(f"<div class='sub'>run {_esc(summary['run_id'])} · backend {_esc(be_text)} · "
                 f"{r['ab']} A/B rounds + {r['aa']} A/A rounds (fresh server per block) · git "
                 f"{_esc((summary.get('git_revision') or '')[:10])} · started {_esc(summary.get('started') or '')}</div>")
    parts.append("<div class='cards'>")
    for lv, kind, text in headline(comparison):
        parts.append(f"<div class='card' style='border-top-color:{VERDICT_COLORS[kind]}'><div class='lv'>throughput at "
                     f"concurrency {lv}</div><div class='v k-{kind}'>{_esc(text)}</div></div>")
    parts.append("</div>")
    parts.append(f"<section><h2>Throughput and latency vs concurrency</h2>{plot_levels(summary)}</section>")
    parts.append("<section><h2>Verdicts (B vs A, per level and metric)</h2><table><tr><th>c</th>"
                 + "".join(f"<th>{_esc(summary['metrics'][m]['label'])}</th>" for m in TABLE_METRICS) + "</tr>")
    for lv in comparison["levels"]:
        row = comparison["per_level"][lv]
        cells = []
        for m in TABLE_METRICS:
            st = row[m]
            tip = (f"HL {st['hl']:+.2f} %, CI {st['ci'][0]:+.2f}..{st['ci'][1]:+.2f} %, A/A floor "
                   f"{st['aa_floor'] if st['aa_floor'] is None else round(st['aa_floor'], 2)} %, MDE "
                   f"{st['mde'] if st['mde'] is None else round(st['mde'], 2)} %, n={st['n']}") if st.get("ci") else \
                f"n={st['n']}"
            cells.append(f"<td class='v k-{st['verdict']['kind']}' title='{_esc(tip)}'>{_esc(st['verdict']['text'])}</td>")
        parts.append(f"<tr><td><b>{_esc(lv)}</b></td>{''.join(cells)}</tr>")
    parts.append(f"</table><div class='legend'>{_esc(comparison['settings']['ci_method'])}; "
                 f"{_esc(comparison['settings']['correction'])}; \"no difference\" only when the "
                 f"{_esc(comparison['settings']['no_difference_rule'])}; margin "
                 f"{comparison['settings']['margin_pct']} %. Hover a cell for HL, CI, A/A floor and MDE.</div>")
    parts.append(_detail_table(comparison))
    parts.append("</section>")
    parts.append(f"<section><h2>Predicted vs observed</h2>{plot_prediction(summary, comparison)}"
                 f"{_prediction_table(comparison)}</section>")
    dist = plot_distributions(summary)
    if dist:
        parts.append(f"<section><h2>Latency distributions</h2>{dist}</section>")
    parts.append(f"<section><h2>Manipulation check: GPU syncs (server counters)</h2>{plot_syncs(summary)}"
                 f"{_blocks_table(summary)}</section>")
    parts.append("<section><h2>Metric definitions</h2><table>" + "".join(
        f"<tr><td><b>{_esc(m['label'])}</b></td><td>{_esc(m['definition'])}</td></tr>"
        for m in summary["metrics"].values()) + "</table>")
    if summary.get("notes"):
        parts.append("<details><summary>notes while reading the files</summary><ul>" +
                     "".join(f"<li>{_esc(n)}</li>" for n in summary["notes"]) + "</ul></details>")
    parts.append("</section></main></body></html>\n")
    return "".join(parts)


def _detail_table(comparison: dict) -> str:
    pm = comparison["primary_metric"]
    rows = ["<details><summary>throughput numbers behind the verdicts</summary><table><tr><th>c</th><th>rounds</th>"
            "<th>per-round B vs A (%)</th><th>HL</th><th>CI</th><th>A/A floor</th><th>MDE</th><th>Holm p</th>"
            "<th>rounds for ±margin</th></tr>"]
    for lv in comparison["levels"]:
        st = comparison["per_level"][lv][pm]

        def f(x, nd=2):
            return "–" if x is None else f"{x:+.{nd}f}"
        ci = f"[{st['ci'][0]:+.2f}, {st['ci'][1]:+.2f}]" if st.get("ci") else "–"
        rows.append(f"<tr><td>{_esc(lv)}</td><td>{st['n']}</td><td>{_esc(', '.join(f'{x:+.2f}' for x in st['values']))}"
                    f"</td><td>{f(st['hl'])}</td><td>{ci}</td><td>{f(st['aa_floor'])}</td><td>{f(st['mde'])}</td>"
                    f"<td>{'–' if st.get('p_holm') is None else format(st['p_holm'], '.3g')}</td>"
                    f"<td>{st.get('rounds_for_margin') or '–'}</td></tr>")
    return "".join(rows) + "</table></details>"


def _prediction_table(comparison: dict) -> str:
    rows = ["<table><tr><th>c</th><th>source</th><th>s/call A</th><th>s/call B</th><th>saving/call</th>"
            "<th>frames/request</th><th>predicted e2e saving</th><th>predicted p50 Δ</th><th>observed p50 Δ [CI]</th></tr>"]
    for lv in comparison["levels"]:
        p, st = comparison["prediction"][lv], comparison["per_level"][lv]["e2e_p50"]

        def us(x):
            return "–" if x is None else f"{x * 1e6:.1f} µs"
        obs = f"{st['hl']:+.2f} % [{st['ci'][0]:+.2f}, {st['ci'][1]:+.2f}]" if st.get("ci") else "–"
        rows.append(f"<tr><td>{_esc(lv)}</td><td>{_esc(p['source'])}</td><td>{us(p['seconds_per_call_a'])}</td>"
                    f"<td>{us(p['seconds_per_call_b'])}</td><td>{us(p['saving_per_call_s'])}</td>"
                    f"<td>{'–' if p['frames_per_request'] is None else format(p['frames_per_request'], '.0f')}</td>"
                    f"<td>{'–' if p['e2e_saving_s'] is None else format(p['e2e_saving_s'] * 1e3, '.1f') + ' ms'}</td>"
                    f"<td>{'–' if p['e2e_diff_pct'] is None else format(p['e2e_diff_pct'], '+.2f') + ' %'}</td>"
                    f"<td>{obs}</td></tr>")
    return "".join(rows) + "</table>"


def _blocks_table(summary: dict) -> str:
    rows = ["<details open><summary>blocks (one fresh server start each)</summary><table><tr><th>block</th><th>round</th>"
            "<th>kind</th><th>arm</th><th>variant</th><th>status</th><th>syncs observed / expected</th><th>valid</th>"
            "</tr>"]
    for b in summary["blocks"]:
        m = b["manipulation"]
        exp = "–" if m["expected_syncs"] is None else f"{m['expected_syncs']:.0f}"
        valid = "yes" if b["valid"] else f"<span class='no'>NO</span> — {_esc(b['invalid_reason'])}"
        rows.append(f"<tr><td>{_esc(b['block_id'])}</td><td>{_esc(b['round'])}</td><td>{_esc(b['kind'])}</td>"
                    f"<td>{_esc(b['arm'])}</td><td>{_esc(b['variant'])}</td><td>{_esc(b['status'])}</td>"
                    f"<td>{m['syncs']:.0f} / {exp}</td><td>{valid}</td></tr>")
    return "".join(rows) + "</table></details>"


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

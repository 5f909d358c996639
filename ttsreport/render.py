"""summary.md and the self-contained offline index.html, written from the one list of sections (report.sections).
"""

from __future__ import annotations

import html
from pathlib import Path

from ttsrecords.results import Comparison, Summary

from . import plots
from .page import Table, _ci, _r
from .report import banners, cards, headline_sentence, load, sections, title

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

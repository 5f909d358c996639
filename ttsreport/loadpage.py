"""The load-run page: index.html and summary.md of a plain Locust run, and the few lines printed when it ends.

Computes nothing: it lays out ttsreport.loadrun's numbers. Every value has a unit; a missing one reads "—" (never
"None"), times are UTC, the figures are inline SVG (no scripts, no CDN).
"""

from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ttsrecords.loadrun import NOT_REPORTED

from .loadrun import numbers
from .page import DASH
from .plots import plt, svg
from .render import CSS

STATUS_CLASS = {"complete": "sim", "failed": "invalid", "interrupted": "warn"}


def _e(x) -> str:
    return html.escape(str(x))


def _utc(t: float | None) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if t else DASH


def _n(x, unit: str = "", digits: int = 3) -> str:
    if x is None:
        return DASH
    return f"{x:.{digits}g}{(' ' + unit) if unit else ''}"


def _ms(x) -> str:
    return DASH if x is None else f"{x * 1000:.0f} ms" if x < 1 else f"{x:.3g} s"


def _pct(x) -> str:
    return DASH if x is None else f"{100 * x:.0f} %"


def _dur(s: float | None) -> str:
    if s is None:
        return DASH
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def backend_words(server) -> str:
    """simulated / real on CPU / real GPU, as the server reports it."""
    b, d = server.backend, server.device
    if b == NOT_REPORTED:
        return "backend not reported by the server"
    if b == "simulated":
        return f"SIMULATED (the suite's simulator on {d if d != NOT_REPORTED else 'an unreported device'})"
    if d == NOT_REPORTED:
        return f"real server ({b}; device not reported)"
    return f"real server ({b}) on {'GPU' if d.startswith('cuda') else 'CPU' if d == 'cpu' else d}"


def level_table(nums: dict) -> list[list[str]]:
    rows = []
    for lv in nums["levels"]:
        cont = (f"{lv['n_continuity_ok']}/{lv['n_streamed']} continuous; stalls mean {_ms(lv['underrun_mean_s'])}, "
                f"p90 {_ms(lv['underrun_p90_s'])}") if lv.get("n_streamed") else DASH
        rows.append([f"c={lv['concurrency']}", f"{lv['n_ok'] or 0} ok / {lv['n_error'] or 0} failed",
                     _n(lv["throughput_rps"], "req/s"), _n(lv["audio_throughput"], "audio-s/s"),
                     f"{_ms(lv['e2e_p50'])} / {_ms(lv['e2e_p90'])} / {_ms(lv['e2e_p99'])}",
                     f"{_ms(lv['ttfa_p50'])} / {_ms(lv['ttfa_p90'])} / {_ms(lv['ttfa_p99'])}",
                     f"{_n(lv['stream_rtf_p50'])} / {_n(lv['stream_rtf_p90'])}", cont, _n(lv["mean_batch"]),
                     f"{lv['all_failed']} of {lv['all_phases']}"])
    return rows


LEVEL_HEADERS = ["level", "measured requests", "throughput", "audio throughput", "E2E p50 / p90 / p99",
                 "time to first audio p50 / p90 / p99", "streaming RTF p50 / p90", "continuity",
                 "batch per step", "failed, every phase"]


def sync_rows(nums: dict) -> list[list[str]]:
    rows = []
    for lv in nums["levels"]:
        s = lv.get("sync")
        if not s:
            continue
        calls, syncs = s.get("calls"), s.get("syncs")
        rows.append([f"c={lv['concurrency']}", ", ".join(s["variants"]) or "none moved", _n(calls, digits=6),
                     _n(syncs, digits=6), _n(lv.get("syncs_per_call"))])
    return rows


def telemetry_rows(nums: dict) -> list[list[str]]:
    rows = []
    for lv in nums["levels"]:
        t = lv.get("telemetry")
        if t:
            rows.append([f"c={lv['concurrency']}"] + [_n(t.get(k)) for k in ("gpu_util_pct", "sm_clock_mhz",
                                                                              "mem_used_mib", "power_w", "cpu_pct",
                                                                              "rss_mib")])
    return rows


def figures(nums: dict) -> list[str]:
    lvs = [lv for lv in nums["levels"] if lv.get("audio_throughput") is not None]
    out = []
    if len(lvs) > 1:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
        cs = [lv["concurrency"] for lv in lvs]
        a1.plot(cs, [lv["audio_throughput"] for lv in lvs], "o-", color="#3b6ea8", label="audio-s/s")
        a1.plot(cs, [lv["throughput_rps"] for lv in lvs], "s--", color="#e07b39", label="req/s")
        a1.set_xscale("log", base=2)
        a1.set_xlabel("concurrency (users)")
        a1.set_title("throughput vs concurrency")
        a1.legend()
        k = nums.get("knee") or {}
        if k.get("level"):
            a1.axvline(k["level"], color="#d64545", ls=":", lw=1)
            a1.annotate("knee", (k["level"], a1.get_ylim()[1]), color="#d64545", fontsize=8, va="top")
        a2.plot([lv["audio_throughput"] for lv in lvs], [lv["e2e_p50"] for lv in lvs], "o-", color="#3b6ea8",
                label="E2E p50")
        a2.plot([lv["audio_throughput"] for lv in lvs], [lv["ttfa_p50"] for lv in lvs], "s--", color="#e07b39",
                label="TTFA p50")
        for lv in lvs:
            a2.annotate(f"c={lv['concurrency']}", (lv["audio_throughput"], lv["e2e_p50"]), fontsize=7)
        a2.set_xlabel("audio throughput (audio-s/s)")
        a2.set_ylabel("seconds")
        a2.set_title("latency vs throughput")
        a2.legend()
        out.append(svg(fig))
    with_e2e = [lv for lv in nums["levels"] if lv["e2e_ok"]]
    if with_e2e:
        fig, ax = plt.subplots(figsize=(6, 3.0))
        for lv in with_e2e:
            xs = lv["e2e_ok"]
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=f"c={lv['concurrency']}")
        ax.set_xlabel("end-to-end latency (s), measured requests")
        ax.set_ylabel("share of requests")
        ax.set_title("latency CDF per level")
        ax.legend()
        out.append(svg(fig))
    return out


def headline(nums: dict) -> str:
    man = nums["manifest"]
    status = nums["status"]
    lv = ", ".join(f"c={lv['concurrency']}" for lv in nums["levels"]) or "no level measured"
    base = f"Load run: {lv}; {nums['requests']} requests, {nums['failed']} failed; {status}"
    if man and man.status_source != "recorded":
        base += f" ({man.status_source})"
    if status != "complete" and nums.get("reason"):
        base += f": {nums['reason']}"
    if man and man.level_from:
        base += f". {man.level_from}"
    return base


def server_lines(nums: dict) -> list[str]:
    man = nums["manifest"]
    if man is None:
        return ["the run has no manifest.json yet: server identity unknown"]
    s = man.server
    return [f"variant {s.variant} (records labelled from: {s.variant_source})", f"version {s.version}",
            backend_words(s), f"read from {s.source}"]


def failure_lines(nums: dict) -> list[str]:
    out = []
    for f in nums["failures"]:
        quotes = "; ".join(f"\u201c{q['text']}\u201d \u00d7{q['n']}" for q in f["quotes"])
        phases = ", ".join(f"{k} {v}" for k, v in f["phases"].items())
        out.append(f"{f['kind']}: {f['n']} ({phases}) \u2014 the server's/client's text: {quotes}")
    return out


def markdown(nums: dict, index: Path) -> str:
    man = nums["manifest"]
    lines = [f"# Load run {nums['run_id']}", "", headline(nums), ""]
    if man:
        lines += [f"- started {_utc(man.started)}, took {_dur(nums['duration_s'])}; host {man.host}; model {man.model}"]
    lines += [f"- server: {'; '.join(server_lines(nums))}"]
    if nums.get("knee"):
        lines += [f"- {nums['knee']['words']}"]
    lines += ["", "| " + " | ".join(LEVEL_HEADERS) + " |", "|" + "---|" * len(LEVEL_HEADERS)]
    lines += ["| " + " | ".join(r) + " |" for r in level_table(nums)]
    if nums["failures"]:
        lines += ["", "## Failures", ""] + [f"- {x}" for x in failure_lines(nums)]
    lines += ["", f"Report: {index}", ""]
    return "\n".join(lines)


def page(nums: dict) -> str:
    man = nums["manifest"]
    status = nums["status"]
    p = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
         "<meta name='viewport' content='width=device-width,initial-scale=1'>",
         f"<title>Load run {_e(nums['run_id'])}</title><style>{CSS}</style></head><body><main>"]
    if man and man.server.backend == "simulated":
        p.append("<div class='banner sim'>SIMULATED: the server is the suite's simulator; its timings are a model's "
                 "(docs/simulator.md), not a GPU's</div>")
    if status != "complete":
        p.append(f"<div class='banner {STATUS_CLASS.get(status, 'warn')}' id='status'>Run {_e(status)}"
                 + (f": {_e(nums['reason'])}" if nums.get("reason") else "") + "</div>")
    p.append(f"<h1>Load run {_e(nums['run_id'])}</h1>")
    if man:
        p.append(f"<div class='sub'>started {_e(_utc(man.started))} · took {_e(_dur(nums['duration_s']))} · status "
                 f"{_e(status)} · host {_e(man.host)} · model {_e(man.model)} · mode {_e(man.mode)} · git "
                 f"{_e((man.git_revision or DASH)[:10])} · Locust {_e(man.locust_version or DASH)}</div>")
    p.append(f"<div class='headline'>{_e(headline(nums))}</div>")
    p.append("<section id='server'><h2>The server, as it reports itself</h2><ul>"
             + "".join(f"<li>{_e(x)}</li>" for x in server_lines(nums)) + "</ul></section>")
    p.append("<section id='levels'><h2>Per level (measure phase)</h2><table><tr>"
             + "".join(f"<th>{_e(h)}</th>" for h in LEVEL_HEADERS) + "</tr>"
             + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in level_table(nums))
             + "</table><div class='legend'>Throughput: closed-loop estimate over the measure window "
               "(ttsreport.blocks.level_stats). Streaming RTF = (E2E - TTFA) / audio seconds; continuity: a player "
               "that starts at the first chunk, continuous when its stalls add up to at most 100 ms.</div>")
    if nums.get("knee"):
        p.append(f"<p>{_e(nums['knee']['words'])}</p>")
    for f in figures(nums):
        p.append(f)
    p.append("</section>")
    p.append("<section id='failures'><h2>Failures</h2>")
    if nums["failures"]:
        p.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in failure_lines(nums)) + "</ul>")
    else:
        p.append("<p>No request failed.</p>")
    p.append("</section>")
    srows = sync_rows(nums)
    p.append("<section id='counters'><h2>Predictor counters per level (measure window)</h2>")
    if srows:
        p.append("<table><tr><th>level</th><th>variants whose calls moved</th><th>calls</th><th>syncs observed</th>"
                 "<th>syncs per call</th></tr>" + "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r)
                                                           + "</tr>" for r in srows) + "</table>")
    else:
        p.append("<p>The server exported no predictor counters for a measure window (no /metrics, or the run "
                 "ended before a measure window closed).</p>")
    p.append("</section>")
    trows = telemetry_rows(nums)
    p.append("<section id='telemetry'><h2>Telemetry</h2>")
    if trows:
        p.append("<table><tr><th>level</th><th>GPU util %</th><th>SM clock MHz</th><th>memory MiB</th><th>power W"
                 "</th><th>CPU %</th><th>RSS MiB</th></tr>" + "".join(
                     "<tr>" + "".join(f"<td>{_e(c)}</td>" for c in r) + "</tr>" for r in trows) + "</table>")
    else:
        p.append("<p>No telemetry in this run folder: a plain Locust run does not sample the server's GPU or process "
                 "(the A/B runner does, per window).</p>")
    p.append("</section>")
    if nums["notes"]:
        p.append("<details><summary>notes while reading the files</summary><ul>"
                 + "".join(f"<li>{_e(n)}</li>" for n in nums["notes"]) + "</ul></details>")
    p.append("</main></body></html>\n")
    return "".join(p)


def write_load_report(run_dir: str | Path) -> tuple[Path, dict[str, Any]]:
    """Write index.html and summary.md of a plain Locust run; (index.html, the numbers)."""
    run = Path(run_dir)
    nums = numbers(run)
    index = run / "index.html"
    index.write_text(page(nums), encoding="utf-8")
    (run / "summary.md").write_text(markdown(nums, index), encoding="utf-8")
    return index, nums


def summary_text(nums: dict, index: Path) -> str:
    """The lines printed at the end of a headless run: status, per level the main numbers, the report's path."""
    lines = [headline(nums)]
    man = nums["manifest"]
    if man:
        lines.append(f"server: {man.server.variant} ({man.server.variant_source}), {man.server.version}, "
                     f"{backend_words(man.server)}; took {_dur(nums['duration_s'])}")
    for lv in nums["levels"]:
        lines.append(f"  c={lv['concurrency']}: {lv['n_ok'] or 0} ok / {lv['n_error'] or 0} failed, "
                     f"{_n(lv['throughput_rps'])} req/s, {_n(lv['audio_throughput'])} audio-s/s, E2E p50 "
                     f"{_ms(lv['e2e_p50'])} p99 {_ms(lv['e2e_p99'])}, TTFA p50 {_ms(lv['ttfa_p50'])}, "
                     f"stream RTF p50 {_n(lv['stream_rtf_p50'])}, continuous {_pct(lv['continuity_ok_share'])}")
    if nums.get("knee"):
        lines.append(nums["knee"]["words"])
    for f in failure_lines(nums)[:3]:
        lines.append(f"failures: {f}")
    lines.append(f"report: {index}")
    return "\n".join(lines)

"""The report's figures: inline SVG from matplotlib (no CDN, no scripts), drawn from summary.json and
comparison.json only. Ratios B/A are drawn on a log axis, so ×1.25 and ×0.8 sit at the same distance from 1.
"""

from __future__ import annotations

import io
import math
import re

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402

from ttsrecords.results import Comparison, Summary  # noqa: E402

COLORS = {"A": "#3b6ea8", "B": "#e07b39"}
KIND_COLORS = {"faster": "#1f9d55", "slower": "#d64545", "equivalent": "#5b6b7c", "inconclusive": "#c98a06",
               "mixed": "#8e44ad", "more_failures": "#d64545", "fewer_failures": "#1f9d55", "failed": "#7a1616",
               "no_spread": "#8e44ad"}

plt.rcParams.update({
    "svg.hashsalt": "ttsreport", "svg.fonttype": "path", "font.size": 9, "axes.spines.top": False,
    "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.25, "axes.titleweight": "bold",
    "axes.titlesize": 10, "legend.frameon": False, "figure.dpi": 96,
})


def svg(fig) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # drop the XML prolog and DOCTYPE: the SVG is inlined into HTML
    return re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)  # a date: same JSON, same page


def _label(summary: Summary, arm: str) -> str:
    return f"{arm}: {summary.variants.get(arm)}"


def _arm_line(ax, summary: Summary, metric: str, scale: float = 1.0) -> bool:
    """Mean per level and arm with its band (both from summary.json)."""
    drawn = False
    for arm in ("A", "B"):
        pts = [(int(lv), r[metric]) for lv, r in summary.arms[arm].items() if r.get(metric)]
        if not pts:
            continue
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1]["mean"] * scale for p in pts], "o-", color=COLORS[arm], label=_label(summary, arm), lw=2)
        ax.fill_between(xs, [p[1]["lo"] * scale for p in pts], [p[1]["hi"] * scale for p in pts],
                        color=COLORS[arm], alpha=0.18, lw=0)
        drawn = True
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(lv) for lv in summary.levels], [str(lv) for lv in summary.levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    return drawn


def plot_levels(summary: Summary) -> str:
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 3.4))
    specs = [("throughput_rps", "Throughput (req/s) ↑", 1.0),
             ("e2e_p50", "p50 end-to-end latency (ms) ↓", 1e3),
             ("ttfa_p50", "p50 time to first audio (ms) ↓", 1e3)]
    for ax, (metric, title, scale) in zip(axes, specs, strict=True):
        if not _arm_line(ax, summary, metric, scale):
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", color="#888")
        ax.set_ylim(bottom=0)  # a wide band of a few windows may reach below zero: these quantities cannot
        ax.set_title(title, loc="left")
    axes[0].legend(loc="best")
    fig.text(0.99, -0.07, "bands: 95 % Student-t interval of the per-window values", ha="right", color="#777",
             fontsize=8)
    return svg(fig)


def plot_ratios(summary: Summary, comparison: Comparison) -> str:
    """Per level: the ratio B/A with its interval (colour = decision), the per-round ratios, the equivalence band;
    on the latency panel also the predictions (counters, and the fitted model with its interval)."""
    levels = comparison.levels
    primary = comparison.primary_metric
    other = "e2e_p50" if primary != "e2e_p50" else "throughput_rps"
    head = comparison.headline or {"levels": {}}
    m = comparison.settings["margin_pct"] / 100.0
    fig, axes = plt.subplots(1, 2, figsize=(12.5, 3.5))
    for ax, metric in zip(axes, (primary, other), strict=True):
        xs = list(range(len(levels)))
        margin_band(ax, m)
        for i, lv in enumerate(levels):
            res = comparison.per_level[lv]["metrics"].get(metric) or {}
            row = head["levels"].get(lv) if metric == primary else None
            kind = (row or res).get("kind", "inconclusive")
            ci = (row or {}).get("ci_decision") or (row or {}).get("ci") or res.get("ci")
            interval(ax, i, res.get("ratio"), ci, kind, "observed ratio [interval]" if i == 0 else None)
            dots = [r["ratio"] for r in res.get("rounds") or [] if r.get("ratio")]
            for j, v in enumerate(dots):
                ax.plot(i + 0.16, v, ".", color="#999", ms=4, label="per round" if (i == 0 and j == 0) else None)
            if metric == "e2e_p50":
                p = comparison.per_level[lv].get("prediction") or {}
                if p.get("e2e_ratio"):
                    ax.plot(i - 0.16, p["e2e_ratio"], "D", color="#222", ms=6, mfc="white",
                            label="predicted (counters)" if i == 0 else None)
                mod = p.get("model") or {}
                if mod.get("ratio"):
                    ax.plot([i - 0.3, i - 0.3], mod["ci"], color="#222", lw=2)
                    ax.plot(i - 0.3, mod["ratio"], "s", color="#222", ms=5,
                            label="fitted model [interval]" if i == 0 else None)
        ratio_axis(ax)
        ax.set_xticks(xs, [f"c={lv}" for lv in levels])
        ax.set_xlim(-0.6, len(levels) - 0.4)
        label = summary.metrics[metric]["label"]
        better = "higher" if summary.metrics[metric]["better"] == "higher" else "lower"
        ax.set_title(f"{label}: B/A ({better} is better for B)", loc="left")
        ax.grid(axis="x", visible=False)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=5, fontsize=7)
    fig.text(0.99, -0.1, "bars: the interval behind each decision (left: the headline's); colour: the decision",
             ha="right", color="#777", fontsize=8)
    return svg(fig)


def margin_band(ax, m: float) -> None:
    """The equivalence margin ±m (a fraction) as a grey band around ×1."""
    ax.axhspan(1 / (1 + m), 1 + m, color="#5b6b7c", alpha=0.12, lw=0, label=f"±{100 * m:g} % margin")
    ax.axhline(1.0, color="#444", lw=0.8)


def interval(ax, x: float, ratio: float | None, ci, kind: str, label: str | None = None) -> None:
    """One decision as the report draws it: its interval as a bar, its ratio as a dot, coloured by the decision."""
    col = KIND_COLORS.get(kind, "#888")
    if ci:
        ax.plot([x, x], ci, color=col, lw=6, alpha=0.45, solid_capstyle="butt")
    if ratio:
        ax.plot(x, ratio, "o", color=col, ms=7, label=label)


def ratio_axis(ax) -> None:
    """A log axis of ratios B/A with round ticks (×1.25 and ×0.8 sit at the same distance from ×1)."""
    ax.set_yscale("log")
    ax.minorticks_off()
    ax.set_yticks(*_ratio_ticks(*ax.get_ylim()))


def plot_history(title: str, levels: list[str], runs: list[dict], margin_pct: float | None) -> str:
    """An experiment over its runs: per level, each run's ratio B/A with its interval (as plot_ratios draws one),
    in time order; an arrow from one run to the next where the dashboard's change rule marks a change.
    runs: {"label", "levels": {lv: {"ratio", "ci", "kind", "changed"}}}."""
    cols = max(1, min(len(levels), 4))
    rows = -(-len(levels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(12.5, 3.0 * rows + 0.3), squeeze=False)
    for ax in axes.flat[len(levels):]:
        ax.axis("off")
    xs = list(range(len(runs)))
    for ax, lv in zip(axes.flat, levels, strict=False):
        if margin_pct is not None:
            margin_band(ax, margin_pct / 100.0)
        for i, r in enumerate(runs):
            p = r["levels"].get(lv) or {}
            interval(ax, i, p.get("ratio"), p.get("ci"), p.get("kind", "inconclusive"))
            prev = runs[i - 1]["levels"].get(lv) if i else None
            if p.get("changed") and prev and prev.get("ratio") and p.get("ratio"):
                ax.annotate("", xy=(i, p["ratio"]), xytext=(i - 1, prev["ratio"]),
                            arrowprops={"arrowstyle": "->", "color": "#8e44ad", "lw": 1.6})
                ax.text(i - 0.5, (prev["ratio"] * p["ratio"]) ** 0.5, " changed", color="#8e44ad", fontsize=8)
        ratio_axis(ax)
        ax.set_xticks(xs, [r["label"] for r in runs], rotation=30 if len(runs) > 3 else 0, ha="right"
                      if len(runs) > 3 else "center", fontsize=7)
        ax.set_xlim(-0.6, len(runs) - 0.4)
        ax.grid(axis="x", visible=False)
        ax.set_title(f"c={lv}", loc="left")
    axes.flat[0].set_ylabel("B/A [the card's interval]")
    fig.suptitle(title, x=0.01, ha="left", fontsize=10, fontweight="bold")
    fig.tight_layout()
    return svg(fig)


def _ratio_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Round ratios for a log axis from lo to hi, at least 1/7 of the axis apart (×1 always kept)."""
    cands = (0.25, 0.33, 0.5, 0.67, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0, 1.01, 1.02, 1.05, 1.1, 1.25, 1.5, 2, 3, 4)
    gap = (math.log(hi) - math.log(lo)) / 7
    kept = [1.0] if lo <= 1.0 <= hi else []
    for t in sorted(cands, key=lambda t: abs(math.log(t))):
        if lo <= t <= hi and all(abs(math.log(t) - math.log(k)) >= gap for k in kept):
            kept.append(t)
    kept.sort()
    return kept, [f"×{t:g}" for t in kept]


def plot_distributions(summary: Summary) -> str:
    dist = summary.distributions
    levels = [lv for lv in summary.levels if lv in dist["A"] or lv in dist["B"]]
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
    fig.supxlabel("end-to-end latency (ms), pooled over valid A/B windows", fontsize=8)
    fig.tight_layout()
    return svg(fig)


def plot_syncs(summary: Summary) -> str:
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
    return svg(fig)

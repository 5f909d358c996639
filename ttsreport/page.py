"""The page model both report formats share: sections of paragraphs and tables, and how a cell shows a number.

report.py and sections.py build the sections; render.py writes them as Markdown and HTML.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DASH = "—"  # an empty cell


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


def _shown_ci(row: dict) -> list | None:
    """The interval beside a word: the one that decided it. Statistics written before `ci_decision` was recorded:
    the TOST interval beside "equivalent", else the plain interval."""
    if "ci_decision" in row:
        return row["ci_decision"]
    return row.get("ci_tost") if row.get("kind") == "equivalent" else row.get("ci")

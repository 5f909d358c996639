"""Prometheus samples as the counter snapshots store them: one key per sample, `name{k="v",...}` with sorted labels
(the bare name when it has none), and the sums every reader takes over them.

The scraper writes these keys; the runner, the report, the simulator's fit and preflight read them back. One parser
and one set of sums, so a key means the same thing on every side.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

Row = tuple[str, dict[str, str], float]

_KEY = re.compile(r"^([^{]+)(?:\{(.*)\})?$", re.S)
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _unescape(v: str) -> str:
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), v)


def sample_key(name: str, labels: Mapping[str, str]) -> str:
    """`name{k="v",...}` with sorted labels, or the bare name when there are none (as in the text format)."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(labels[k])}"' for k in sorted(labels)) + "}"


def rows_of(flat: Mapping[str, float | None] | None, prefix: str = "") -> list[Row]:
    """The (name, labels, value) rows of stored samples whose name starts with `prefix` (the inverse of
    sample_key); a sample stored without a value (None) or under a key that is not one is left out."""
    rows = []
    for key, value in (flat or {}).items():
        if not key.startswith(prefix) or value is None:
            continue
        m = _KEY.match(key)
        if m is None:
            continue
        rows.append((m.group(1), {k: _unescape(v) for k, v in _LABEL.findall(m.group(2) or "")}, float(value)))
    return rows


def total(rows: Iterable[Row], name: str) -> float | None:
    """Sum of a sample name over all its label sets; None when the server does not expose it."""
    vals = [v for n, _, v in rows if n == name]
    return float(sum(vals)) if vals else None


def stored_total(flat: Mapping[str, float | None] | None, name: str) -> float | None:
    """total() straight from stored samples, without parsing their labels (the same number)."""
    vals = [v for k, v in (flat or {}).items() if v is not None and (k == name or k.startswith(name + "{"))]
    return float(sum(vals)) if vals else None


def by_label(rows: Iterable[Row], name: str, label: str) -> dict[str, float]:
    """A sample name's values by one label's (non-empty) value, summed over the other labels."""
    out: dict[str, float] = {}
    for n, labels, v in rows:
        if n == name and labels.get(label):
            out[labels[label]] = out.get(labels[label], 0.0) + v
    return out


def gauge(rows: Iterable[Row], name: str) -> float | None:
    """A gauge without labels (the control channel's epoch and observe switch); the largest value if several
    processes expose it; None when not exposed."""
    vals = [v for n, _, v in rows if n == name]
    return max(vals) if vals else None

"""A ratchet on reading run data as dicts: string-key access (`.get("k")`, `x["k"]`) in ttsreport may shrink, never
grow. Run data is read into typed records by ttsrecords.runfolder (the one reader); the statistics still take dicts
and move to the records a module at a time (docs/architecture.md, "Typed reading"). When a change lowers the count,
lower CEILING with it; a change that raises it reads the data as objects instead."""

from __future__ import annotations

import re

from conftest import ROOT

# measured on 2026-12-07 (620 .get + 1137 subscripts) after the window reading moved to ttsrecords.runfolder
CEILING = 1757
GET = re.compile(r"""\.get\(\s*["']""")
SUBSCRIPT = re.compile(r"""\[\s*["'][A-Za-z_]\w*["']\s*\]""")


def raw_access(text: str) -> int:
    return len(GET.findall(text)) + len(SUBSCRIPT.findall(text))


def test_the_counter_counts_both_forms_and_nothing_else():
    assert raw_access('m.get("status") or w["block_id"] + x[0] + y[k] + z.get(k) + d["a-b"]') == 2


def test_string_key_access_in_ttsreport_does_not_grow():
    files = sorted((ROOT / "ttsreport").rglob("*.py"))
    n = sum(raw_access(p.read_text(encoding="utf-8")) for p in files)
    assert n <= CEILING, f"ttsreport reads {n} string keys (ceiling {CEILING}): read run data through ttsrecords"

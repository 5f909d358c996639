"""The report from synthetic statistics: Markdown content, and index.html in real headless Chromium."""

from __future__ import annotations

import html
import json
import re
import shutil

import pytest
import synthetic_runs as sr
from conftest import make_run

from tools import browser
from ttsreport import __main__ as cli
from ttsreport import render

needs_chromium = pytest.mark.skipif(browser.find_chromium() is None, reason="chromium absent: scripts/system-deps.sh")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A version-1-style run with one invalid window, interrupted before its end: every banner must show."""
    run = make_run(tmp_path_factory.mktemp("rep") / "run", rounds=5, slow_b=-0.05, noise=0.005, status="interrupted",
                   levels=(8, 16, 64))
    bad = next(p for p in (run / "blocks").iterdir() if "-r2-ab-B" in p.name)
    lines = [json.loads(x) for x in (bad / "counters.jsonl").read_text().splitlines()]
    for x in lines:
        if x["kind"] == "delta":
            x["syncs"] = 0  # a 'fixed' block without syncs: the server ran something else
    (bad / "counters.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert cli.main([str(run)]) == 0
    return run, bad.name


def test_report_reads_only_statistics_json(built, tmp_path):
    run, _ = built
    copy = tmp_path / "only-json"
    copy.mkdir()
    for name in ("summary.json", "comparison.json"):
        shutil.copy(run / name, copy / name)
    out = render.write_report(copy)  # no raw files next to it: the report computes nothing from them
    assert out.read_text() == (run / "index.html").read_text()


def test_markdown_has_banners_and_verdicts(built):
    run, bad = built
    md = (run / "summary.md").read_text()
    assert "SIMULATED BACKEND" in md and "PARTIAL RUN" in md and f"INVALID WINDOW {bad}" in md
    assert "manipulation check failed" in md
    # B's latency x0.95: audio throughput (the default primary metric) faster at c=16 (Holm), a ratio near 1/0.95
    row = re.search(r"\| c=16 \| audio throughput \| primary \(Holm\) \| [^|]+ \| [^|]+ \| ×(1\.0\d\d) \| \[[^|]+\] \| "
                    r"B 1\.0\dx faster \| faster \|", md)
    assert row and abs(float(row.group(1)) - 1 / 0.95) < 0.01, md
    assert "|  | throughput | secondary, uncorrected |" in md
    assert "| p50 latency | secondary, uncorrected |" in md and "| error rate | own verdict (rates) |" in md
    assert "**Primary metric audio throughput: faster" in md


def test_html_is_self_contained(built):
    html = (run_html := (built[0] / "index.html")).read_text()
    assert "<script" not in html and "http://" not in html.replace("http://www.w3.org", "")
    assert "https://" not in html and run_html.stat().st_size < 2_000_000


@pytest.mark.slow
@needs_chromium
def test_renders_in_headless_chromium_without_console_errors(built):
    run, bad = built
    shot = run / "screenshot.png"
    res = browser.inspect(run / "index.html", shot)
    assert res["problems"] == []
    assert res["svgs"] >= 4 and all(w > 400 for w in res["svgSizes"])
    assert any("SIMULATED BACKEND" in b for b in res["banners"]) and any(bad in b for b in res["banners"])
    assert any("PARTIAL RUN" in b for b in res["banners"])
    assert len(res["cards"]) == 3 and "faster" in res["cards"]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


@pytest.mark.slow
@needs_chromium
def test_browser_check_catches_errors(tmp_path):
    """The harness itself: a broken page must produce problems (else 'no errors' would prove nothing)."""
    page = tmp_path / "bad.html"
    page.write_text('<html><body><img src="missing.png"><script>console.error("boom"); nope();</script></body></html>')
    res = browser.inspect(page, tmp_path / "bad.png")
    text = " ".join(res["problems"])
    assert "boom" in text and "nope" in text and "missing.png" in text


@pytest.fixture(scope="module")
def showcase(tmp_path_factory):
    """A version-2 nested run with every part of the report in use (tests/synthetic_runs.showcase)."""
    run = sr.showcase(tmp_path_factory.mktemp("show") / "run")
    assert cli.main([str(run)]) == 0
    return run


def test_v2_report_has_every_part(showcase):
    md = (showcase / "summary.md").read_text()
    page = (showcase / "index.html").read_text()
    for title in ("A/A check", "Design: units, variance components", "Sequential looks", "Server telemetry",
                  "Streaming continuity", "vllm-omni's own metrics", "Predicted vs observed", "Arms (as the manifest",
                  "Windows and the manipulation check"):
        assert title in md and html.escape(title) in page, title
    assert "RELEASE VS RELEASE" in md and "vllm-omni 0.16.0 + fixed vs 0.30.0" in md
    assert "SIMULATED -- model vs seed run" in md  # the fit's fidelity line in the SIMULATED banner
    assert "primary (sequential)" in md and "(sequential rule)" in md
    assert "between starts (sd)" in md and "within a window (sd)" in md and "order effect" in md
    assert "GPU util" in md and "vllm_omni:e2e_request_latency_s" in md and "B stalls more" in md
    assert "tts-vllm-omni:0.16.0-fixed" in md and "3/3 starts ok" in md
    # the fitted model's prediction at c=8 (the default profile's fit): a few % faster, its interval around it
    fitted = re.search(r"\| c=8 \| [^|]+ \| 50 \| [^|]+ \| counters \| ×(0\.\d+) \[(0\.\d+), (0\.\d+)\] \|", md)
    assert fitted, md
    est, lo, hi = map(float, fitted.groups())
    assert 0.95 < lo < est < hi < 0.99, fitted.group(0)
    assert "<script" not in page and "https://" not in page


@pytest.mark.slow
@needs_chromium
def test_v2_report_renders_without_console_errors(showcase):
    shot = showcase / "screenshot.png"
    res = browser.inspect(showcase / "index.html", shot)
    assert res["problems"] == []
    assert res["svgs"] >= 4 and all(w > 400 for w in res["svgSizes"])
    assert any("RELEASE VS RELEASE" in b for b in res["banners"]) and len(res["cards"]) == 2

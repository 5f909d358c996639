"""vllm_omni:* per-window deltas (ttsreport/omni_metrics.py) on hand-made snapshots with known answers.
The same function over the real 0.30.0 exposition: tests/upstream (make test-upstream)."""

from __future__ import annotations

import pytest

from loadtest.scraper import parse_metrics
from ttsreport.omni_metrics import exposed, quantile, window_delta

L = {"model_name": "m", "stage": "1", "replica": "0"}
TTFP = "vllm_omni:audio_ttfp_s"


def _hist(counts: dict[str, float], total: float, labels=L) -> list:
    rows = [(TTFP + "_bucket", {**labels, "le": le}, c) for le, c in counts.items()]
    return rows + [(TTFP + "_count", labels, counts["+Inf"]), (TTFP + "_sum", labels, total)]


def test_quantile_is_prometheus_linear_interpolation():
    b = {0.1: 0.0, 0.5: 10.0, 1.0: 20.0, float("inf"): 20.0}
    assert quantile(0.5, b) == pytest.approx(0.5)  # rank 10 is the top of (0.1, 0.5]
    assert quantile(0.25, b) == pytest.approx(0.1 + 0.4 * 5 / 10)
    assert quantile(0.75, b) == pytest.approx(0.5 + 0.5 * 5 / 10)
    assert quantile(0.99, {0.1: 0.0, 1.0: 1.0, float("inf"): 4.0}) == 1.0  # in +Inf: the highest finite bound
    assert quantile(0.5, {0.1: 0.0, float("inf"): 0.0}) is None


def test_histogram_window_is_end_minus_start():
    start = _hist({"0.1": 1, "0.5": 3, "1.0": 4, "+Inf": 4}, 1.5)
    end = _hist({"0.1": 1, "0.5": 13, "1.0": 14, "+Inf": 14}, 5.5)  # 10 more, all in (0.1, 0.5]
    (h,) = window_delta(start, end)["histograms"][TTFP]
    assert h["labels"] == L and h["count"] == 10 and h["sum"] == pytest.approx(4.0) and h["mean"] == pytest.approx(0.4)
    assert h["p50"] == pytest.approx(0.1 + 0.4 * 5 / 10)


def test_series_born_inside_the_window_counts_from_zero_and_resets_are_unknown():
    end = _hist({"0.1": 2, "+Inf": 2}, 0.1)
    (h,) = window_delta([], end)["histograms"][TTFP]
    assert h["count"] == 2 and h["p50"] == pytest.approx(0.05)
    (r,) = window_delta(_hist({"0.1": 5, "+Inf": 5}, 0.3), end)["histograms"][TTFP]  # server restarted in between
    assert r["count"] is None and r["sum"] is None and r["p50"] is None
    c = "vllm_omni:requests_success_total"
    lab = {"model_name": "m", "finished_reason": "stop"}
    d = window_delta([(c, lab, 7.0)], [(c, lab, 3.0)])["counters"][c]
    assert d == [{"labels": lab, "delta": None}]


def test_failed_start_scrape_and_missing_families():
    end = _hist({"0.1": 2, "+Inf": 2}, 0.1) + [("vllm_omni:num_requests_running", {"model_name": "m"}, 3.0)]
    d = window_delta(None, end)
    (h,) = d["histograms"][TTFP]
    assert h["labels"] == L and h["count"] is None and h["p50"] is None
    assert d["gauges"]["vllm_omni:num_requests_running"] == [{"labels": {"model_name": "m"}, "value": 3.0}]
    assert d["histograms"]["vllm_omni:audio_rtf"] is None  # not exposed: None, never 0
    assert d["counters"]["vllm_omni:requests_success_total"] is None


def test_parses_the_text_format_with_colons_per_label_set():
    text = """# TYPE vllm_omni:audio_continuity_ok counter
vllm_omni:audio_continuity_ok_total{model_name="m",replica="0",stage="1",threshold_ms="100"} 4.0
vllm_omni:audio_continuity_ok_total{model_name="m",replica="1",stage="1",threshold_ms="100"} 6.0
"""
    end = parse_metrics(text)[1]
    start = parse_metrics(text.replace(" 4.0", " 1.0"))[1]
    d = window_delta(start, end)["counters"]["vllm_omni:audio_continuity_ok_total"]
    assert [(x["labels"]["replica"], x["delta"]) for x in d] == [("0", 3.0), ("1", 0.0)]
    assert exposed(end) == {"vllm_omni:audio_continuity_ok_total"}

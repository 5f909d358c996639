"""Counter scraping: snapshots, per-step deltas from the names in tts_predictor.metrics, failures recorded."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from loadtest.scraper import Scraper, compute_delta, parse_metrics
from tts_predictor import metrics as m
from ttsrecords.records import COUNTERS_SCHEMA
from ttsrecords.samples import sample_key


class Server:
    """A registry with the predictor and engine metrics, advanced like a fixed-variant server at batch B."""

    def __init__(self, variant="fixed"):
        self.reg = CollectorRegistry()
        self.p = m.make_predictor_metrics(self.reg)
        self.p.info.info({"variant": variant, "backend": "simulated"})
        self.variant = variant
        self.steps = Counter(m.STEPS.removesuffix("_total"), "steps", registry=self.reg)
        self.step_s = Histogram(m.STEP_SECONDS, "step s", registry=self.reg)
        self.done = Counter(m.ENGINE_REQUESTS.removesuffix("_total"), "done", ["outcome"], registry=self.reg)

    def run_steps(self, n, batch, finished, sample_every=3):
        v = self.variant
        for _ in range(n):
            self.steps.inc()
            self.step_s.observe(0.02)
            for call in range(15):
                tokens = 2 * batch if call == 0 else batch
                self.p.calls.labels(v).inc()
                self.p.seconds.labels(v).observe(1e-4)
                self.p.tokens.labels(v).inc(tokens)
                self.p.requests.labels(v).inc(batch)
                if call % sample_every == 0:  # a sampled subset runs under the observer
                    self.p.observed_calls.labels(v).inc()
                    self.p.observed_tokens.labels(v).inc(tokens)
                    self.p.syncs.labels(v).inc(m.syncs_per_call(v, tokens))
        self.done.labels("ok").inc(finished)

    def text(self):
        return generate_latest(self.reg).decode()


def test_parse_and_sample_keys():
    flat, rows = parse_metrics('a_total{z="1",b="x\\"y"} 3\nplain 2.5\n')
    assert flat == {'a_total{b="x\\"y",z="1"}': 3.0, "plain": 2.5}
    assert sample_key("n", {}) == "n"


def test_snapshots_and_delta_for_a_fixed_server():
    srv = Server("fixed")
    srv.run_steps(10, batch=4, finished=3)  # before the measure phase: must not count
    lines = []
    t = iter([10.0, 70.0])
    sc = Scraper(["http://s/metrics"], lines.append, fetch=lambda url, timeout: srv.text(), clock=lambda: next(t))
    sc.scrape(2, 32, "start")
    srv.run_steps(100, batch=8, finished=40)
    sc.scrape(2, 32, "end")
    start, end, delta = lines
    assert start["kind"] == "snapshot" and start["edge"] == "start" and start["ok"] and start["schema"] == COUNTERS_SCHEMA
    assert 'tts_predictor_info{backend="simulated",variant="fixed"}' in end["samples"]
    assert end["samples"]['tts_predictor_build_attn_metadata_calls_total{variant="fixed"}'] == 1650
    assert delta["kind"] == "delta" and delta["step"] == 2 and delta["concurrency"] == 32
    assert delta["duration_s"] == 60.0 and delta["variant"] == "fixed"
    assert delta["calls"] == 1500 and delta["steps"] == 100 and delta["requests_finished"] == 40
    assert delta["syncs_per_call"] == 5
    assert delta["syncs_per_step"] == pytest.approx(m.syncs_per_step("fixed", 8))
    assert delta["mean_batch"] == 8 and delta["calls_per_request"] == 1500 / 40
    assert delta["seconds"] == pytest.approx(1500 * 1e-4)
    assert delta["step_seconds"] == pytest.approx(2.0)
    assert delta["tokens"] == 100 * (16 + 14 * 8)
    assert set(delta) >= {"observed_calls", "observed_tokens", "batch_requests", "frames", "seconds_per_request"}
    assert delta["frames"] is None  # not exposed by this server: unknown, not zero


def test_original_variant_matches_the_closed_form():
    srv = Server("original")
    lines = []
    sc = Scraper(["u"], lines.append, fetch=lambda url, timeout: srv.text())
    sc.scrape(0, 8, "start")
    srv.run_steps(20, batch=8, finished=1, sample_every=1)  # syncs per call depend on T: observe every call
    sc.scrape(0, 8, "end")
    d = lines[-1]
    assert d["syncs"] == m.expected_syncs("original", d["observed_calls"], d["observed_tokens"])
    assert d["syncs_per_step"] == pytest.approx(m.syncs_per_step("original", 8))


def test_scrape_failure_is_recorded_not_raised():
    lines = []

    def fetch(url, timeout):
        raise ConnectionError("refused")

    sc = Scraper(["http://down/metrics"], lines.append, fetch=fetch, variant_hint="fixed")
    sc.scrape(0, 8, "start")
    sc.scrape(0, 8, "end")
    assert [ln["ok"] for ln in lines[:2]] == [False, False] and "refused" in lines[0]["error"]
    assert lines[2]["kind"] == "delta" and lines[2]["calls"] is None and lines[2]["variant"] == "fixed"


def test_counter_reset_gives_unknown_not_negative():
    _, a = parse_metrics(f"{m.CALLS} 100\n{m.STEPS} 10\n")
    _, b = parse_metrics(f"{m.CALLS} 5\n{m.STEPS} 12\n")
    d = compute_delta(a, b, duration_s=1.0, variant_hint=None)
    assert d["calls"] is None and d["steps"] == 2


def test_steps_derived_from_calls_when_the_engine_has_no_step_counter():
    _, a = parse_metrics(f"{m.CALLS} 0\n")
    _, b = parse_metrics(f"{m.CALLS} 150\n")
    assert compute_delta(a, b, duration_s=1.0, variant_hint=None)["steps"] == 10

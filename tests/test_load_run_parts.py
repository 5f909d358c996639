"""The parts of a plain Locust run, without processes: the stop rule, the command-line checks, -u/-t as one level,
the server's identity from /metrics text, the typed manifest, and the saturation knee."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import ROOT

from loadtest import breaker as br
from loadtest.locust_cli import check, one_level
from loadtest.scenario import load_scenario
from loadtest.server_info import identity_from_text, variant_conflict, with_label
from ttsrecords.loadrun import NOT_REPORTED, LoadManifestError, read_load_manifest
from ttsreport.loadrun import knee

REFUSED = "connect: ConnectionRefusedError: [Errno 111] Connection refused"


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_refused_connections_trip_the_breaker_and_answers_do_not():
    clock = Clock()
    b = br.Breaker(clock)
    for _ in range(br.CONNECT_FAILURES - 1):
        assert b.add(False, None, REFUSED) is None
        clock.t += 0.1
    assert b.add(True, 200, None) is None  # an answer in between: start again
    for _ in range(br.CONNECT_FAILURES * 3):  # HTTP errors and cut streams are the server answering: data
        assert b.add(False, 503, "http 503: busy") is None
        assert b.add(False, 200, "stream broken after 10 bytes: reset") is None
    for _ in range(br.CONNECT_FAILURES - 1):
        assert b.add(False, None, REFUSED) is None
    cause = b.add(False, None, REFUSED)
    assert cause and "stopped answering" in cause and "Connection refused" in cause and b.when == clock.t
    assert b.add(False, None, REFUSED) is None  # said once


def test_connect_failures_spread_beyond_the_window_do_not_trip():
    clock = Clock()
    b = br.Breaker(clock)
    for _ in range(20):
        assert b.add(False, None, REFUSED) is None
        clock.t += br.WINDOW_S / (br.CONNECT_FAILURES - 1) + 0.01


def test_unanswered_requests_and_health_trip():
    clock = Clock()
    b = br.Breaker(clock)
    for _ in range(br.TIMEOUT_FAILURES):
        got = b.add(False, None, "no response: timed out")
        clock.t += 1
    assert got and "requests unanswered" in got
    h = br.Breaker(clock)
    assert h.health(False, "ConnectError") is None and h.health(True) is None  # a good look resets the count
    got = [h.health(False, "ConnectError: refused") for _ in range(br.HEALTH_FAILURES)]
    assert got[:-1] == [None] * (br.HEALTH_FAILURES - 1) and "/health failed 3 times" in got[-1]


def opts(**kw):
    base = dict(worker=False, host="http://127.0.0.1:8091", num_users=None, spawn_rate=None, run_time=None,
                scenario="", variant="")
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw, needle", [
    ({"host": None}, "--host is required"),
    ({"host": "127.0.0.1:8091"}, "--host must be http"),
    ({"num_users": 4, "scenario": "x.yaml"}, "-u/--users with --scenario"),
    ({"run_time": 30, "spawn_rate": 2.0, "scenario": "x.yaml"}, "-r/--spawn-rate, -t/--run-time with --scenario"),
    ({"num_users": 0}, "at least 1"),
    ({"variant": "fast"}, "unknown variant"),
])
def test_options_refused(kw, needle):
    assert needle in check(opts(**kw))


def test_options_accepted():
    assert check(opts()) is None and check(opts(num_users=4, run_time=30)) is None
    assert check(opts(worker=True, host=None)) is None  # a worker takes everything from its master


def test_u_and_t_are_one_level_of_that_whole_time():
    base = load_scenario(ROOT / "configs" / "scenarios" / "default.yaml")
    scen, line = one_level(base, 4, None, 30)
    (step,) = scen.steps
    assert step.concurrency == 4 and step.warmup_s + step.measure_s + step.drain_s == pytest.approx(30)
    assert step.warmup_s <= base.steps[0].warmup_s and step.measure_s > step.warmup_s
    assert "one level: 4 user(s)" in line and "30 s" in line and scen.spawn_rate == base.spawn_rate
    scen, _ = one_level(base, None, 2.0, None)  # -r alone: one user, the default phases, that spawn rate
    assert scen.steps[0].concurrency == 1 and scen.spawn_rate == 2.0
    assert scen.steps[0].measure_s == base.steps[0].measure_s


METRICS = """# TYPE tts_predictor_info gauge
tts_predictor_info{backend="simulated",device="cpu",server="ttssim 0.1.0",variant="fixed"} 1.0
# TYPE tts_predictor_build_attn_metadata_calls_total counter
tts_predictor_build_attn_metadata_calls_total{variant="fixed"} 12.0
"""
MULTIPROC = """# TYPE tts_predictor_build_attn_metadata_calls_total counter
tts_predictor_build_attn_metadata_calls_total{variant="original"} 3.0
"""


def test_server_identity_and_the_variant_check():
    ident = identity_from_text(METRICS, "http://x/metrics")
    assert (ident.variant, ident.backend, ident.version, ident.device) == ("fixed", "simulated", "ttssim 0.1.0", "cpu")
    assert variant_conflict("fixed", ident) is None and variant_conflict(None, ident) is None
    assert "reports variant fixed" in variant_conflict("original", ident)
    assert with_label(ident, None)[1] == "fixed"
    assert identity_from_text(MULTIPROC, "u").variant == "original"  # no Info in multiprocess mode: the counters
    none = identity_from_text("", "u")
    assert none.variant == NOT_REPORTED and variant_conflict("fixed", none) is None
    ident, label = with_label(none, "fixed")
    assert label == "fixed" and ident.variant_source.startswith("--variant")


def test_load_manifest_round_trip_and_older_files():
    d = {"schema": "tts-run/2", "run_id": "r", "status": "failed", "reason": "the server stopped answering",
         "server": {"variant": "fixed"}, "unknown_key": 1, "ended": 2.0}
    m = read_load_manifest(d)
    assert m.status == "failed" and m.server.variant == "fixed" and m.to_dict()["unknown_key"] == 1
    assert read_load_manifest(m.to_dict()).to_dict() == m.to_dict()
    old = read_load_manifest({"schema": "tts-run/1", "run_id": "o", "ended": 5.0})
    assert old.status == "complete" and old.status_source.startswith("assumed")
    with pytest.raises(LoadManifestError, match="status 'odd'"):
        read_load_manifest({"schema": "tts-run/2", "status": "odd"})
    with pytest.raises(LoadManifestError, match="not a Locust run"):
        read_load_manifest({"schema": "tts-ab/2"})


def test_the_saturation_knee():
    lv = [{"concurrency": c, "audio_throughput": t, "e2e_p50": lat} for c, t, lat in
          ((8, 10.0, 1.0), (16, 19.0, 1.1), (32, 20.0, 2.0), (64, 20.5, 4.0))]
    k = knee(lv)
    assert k["level"] == 16 and "knee at about c=16" in k["words"]
    assert knee(lv[:2])["level"] is None and "still grows" in knee(lv[:2])["words"]
    assert knee(lv[:1]) is None

"""The load generator meets a server it does not know: the model name comes from <host>/v1/models unless --model is
given, and a run whose first requests all fail alike with a 4xx stops within seconds, one line, non-zero exit."""

from __future__ import annotations

import time

import pytest
from conftest import locust, one_error, write_scenario

from loadtest.session import FAIL_FAST_EXIT, FAIL_FAST_REQUESTS, FailFast, fixed_length_model, read_models, served_model
from tools.sim_server import SimServer
from tts_predictor.domain import MODEL_NAME, TINY_MODEL_PREFIX
from ttsrecords.records import read_requests


class _Resp:
    def __init__(self, status_code, doc=None, exc=None):
        self.status_code, self._doc, self._exc = status_code, doc, exc

    def json(self):
        if self._exc:
            raise self._exc
        return self._doc


def _get(resp):
    def get(url, timeout):
        assert url == "http://h:1/v1/models" and timeout > 0
        if isinstance(resp, Exception):
            raise resp
        return resp
    return get


def test_served_model_prefers_the_suites_name_then_the_first_listed():
    both = _Resp(200, {"data": [{"id": "other"}, {"id": MODEL_NAME}]})
    assert served_model(read_models("http://h:1", get=_get(both)))[0] == MODEL_NAME
    one = _Resp(200, {"data": [{"id": "Qwen/Qwen3-TTS-12Hz-1.7B-Base"}]})
    name, why = served_model(read_models("http://h:1", get=_get(one)))
    assert name == "Qwen/Qwen3-TTS-12Hz-1.7B-Base" and "1.7B" in why


@pytest.mark.parametrize("resp", [_Resp(404, {"detail": "no"}), _Resp(200, {"data": []}), _Resp(200, None, ValueError()),
                                  ConnectionError("refused")])
def test_served_model_falls_back_to_the_suites_name(resp):
    assert served_model(read_models("http://h:1", get=_get(resp)))[0] == MODEL_NAME


def test_fail_fast_needs_the_first_n_alike_4xx():
    ff = FailFast(3)
    assert ff.add(False, 404, "model x not found") is None
    assert ff.add(False, 404, "model x not found") is None
    cause = ff.add(False, 404, "model x not found")
    assert cause == "the first 3 requests all failed with HTTP 404: model x not found"
    assert ff.add(False, 404, "model x not found") is None  # said once


@pytest.mark.parametrize("second", [(True, 200, None), (False, 404, "other text"), (False, 400, "model x not found"),
                                    (False, 500, "boom"), (False, None, "connect: refused")])
def test_fail_fast_is_decided_for_good_by_the_first_difference(second):
    ff = FailFast(2)
    assert ff.add(False, 404, "model x not found") is None
    assert ff.add(*second) is None
    assert all(ff.add(False, 404, "model x not found") is None for _ in range(5))


def test_fail_fast_never_fires_on_5xx_or_success():
    for first in [(False, 503, "busy"), (True, 200, None)]:
        ff = FailFast(1)
        assert ff.add(*first) is None


@pytest.mark.slow
def test_locust_without_model_uses_what_the_server_serves(tmp_path):
    scen = write_scenario(tmp_path, steps=(2,), warmup=0.5, measure=2, drain=0.5, name="model", seed=1)
    run_dir = tmp_path / "run"
    with SimServer("fixed", overrides=["model.name=Qwen/Qwen3-TTS-12Hz-1.7B-Base"]) as sim:
        p = locust(["--headless", "--host", sim.url, "--scenario", str(scen), "--run-dir", str(run_dir)], timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = read_requests(run_dir / "requests.jsonl")
    assert recs and all(r.ok for r in recs), [r.error for r in recs if not r.ok][:3]
    assert "serves Qwen/Qwen3-TTS-12Hz-1.7B-Base" in p.stderr


@pytest.mark.slow
def test_locust_stops_within_seconds_when_the_first_requests_all_get_the_same_4xx(tmp_path):
    scen = write_scenario(tmp_path, steps=(4,), warmup=5, measure=60, drain=1, name="wrong", seed=1)
    run_dir = tmp_path / "run"
    with SimServer("fixed") as sim:
        t0 = time.monotonic()
        p = locust(["--headless", "--host", sim.url, "--scenario", str(scen), "--run-dir", str(run_dir),
                    "--model", "no/such-model"], timeout=120)
        took = time.monotonic() - t0
    line = one_error(p, f"the first {FAIL_FAST_REQUESTS} requests all failed with HTTP 4", "no/such-model")
    assert p.returncode == FAIL_FAST_EXIT, line
    assert took < 30, took  # the scenario alone would run 66 s
    recs = read_requests(run_dir / "requests.jsonl")
    assert FAIL_FAST_REQUESTS <= len(recs) <= FAIL_FAST_REQUESTS + 4  # + the other users' requests in flight and not any(r.ok for r in recs)


@pytest.mark.parametrize(("resp", "off"), [
    (_Resp(200, {"data": [{"id": MODEL_NAME, "root": f"/root/.cache/tts-loadtest/{TINY_MODEL_PREFIX}-seed0"}]}), True),
    (_Resp(200, {"data": [{"id": MODEL_NAME, "root": "Qwen/Qwen3-TTS-12Hz-0.6B-Base"}]}), False),
    (_Resp(200, {"data": [{"id": MODEL_NAME}]}), False),  # the simulator lists no root
    (_Resp(404, {"detail": "no"}), False),
    (ConnectionError("refused"), False),
])
def test_the_audio_length_check_is_off_only_for_the_tiny_random_model(resp, off):
    why = fixed_length_model(read_models("http://h:1", get=_get(resp)))
    assert (why is not None) is off
    if off:
        assert why.startswith("off: ") and f"{TINY_MODEL_PREFIX}-seed0" in why

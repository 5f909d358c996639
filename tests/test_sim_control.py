"""The control channel in the simulator, over HTTP against a real server process (docs/control.md)."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tools.sim_server import REPO, SimServer
from tts_predictor import metrics as M
from tts_predictor.control import ENV_CONTROL, write_control

pytestmark = pytest.mark.slow
VARIANTS = ("original", "fixed", "vectorized")


def scrape(sim) -> dict:
    text = httpx.get(sim.url + "/metrics", timeout=5).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def by_variant(values, name) -> dict:
    return {v: values.get((name, (("variant", v),)), 0.0) for v in VARIANTS}


def speak(sim, text="Switch me over, please."):
    r = httpx.post(sim.url + "/v1/audio/speech", json={"input": text}, timeout=30)
    assert r.status_code == 200, r.text


def until(sim, predicate, what, timeout_s=20.0):
    """Send requests (a change is applied at a step boundary, so it needs steps) until the metrics say so."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        values = scrape(sim)
        if predicate(values):
            return values
        speak(sim)
    raise AssertionError(f"timed out waiting for {what}: {sorted(k for k in scrape(sim) if 'control' in k[0])}")


@pytest.fixture
def controlled_sim(tmp_path, monkeypatch):
    path = tmp_path / "control" / "predictor.json"
    path.parent.mkdir()
    write_control(path, "original", True, epoch=1)
    monkeypatch.setenv(ENV_CONTROL, str(path))  # the way the plugin takes it: the environment
    with SimServer("vectorized") as s:  # --variant is overridden by the file
        yield s, path


def test_switches_count_under_both_labels_in_one_process(controlled_sim):
    sim, path = controlled_sim
    v0 = scrape(sim)
    pid = [dict(k[1])["pid"] for k in v0 if k[0] == M.INFO]
    assert pid == [str(sim.proc.pid)]
    assert v0[(M.CONTROL_EPOCH, ())] == 1 and v0[(M.ACTIVE_VARIANT, (("variant", "original"),))] == 1
    speak(sim)
    v1 = scrape(sim)
    assert by_variant(v1, M.CALLS)["original"] > 0 and by_variant(v1, M.CALLS)["fixed"] == 0
    write_control(path, "fixed", True, epoch=2)
    v2 = until(sim, lambda v: v[(M.CONTROL_EPOCH, ())] == 2, "epoch 2")  # the runner's confirmation
    assert v2[(M.ACTIVE_VARIANT, (("variant", "fixed"),))] == 1
    assert v2[(M.ACTIVE_VARIANT, (("variant", "original"),))] == 0
    assert by_variant(v2, M.SWITCHES)["fixed"] == 1
    speak(sim)
    v3 = scrape(sim)
    calls2, calls3 = by_variant(v2, M.CALLS), by_variant(v3, M.CALLS)
    assert calls3["original"] == calls2["original"]  # confirmed: nothing more runs under the old label
    assert calls3["fixed"] > calls2["fixed"] and calls3["fixed"] % 15 == 0  # whole steps: 1 prefill + 14 decodes
    assert calls3["original"] % 15 == 0
    steps = v3[(M.STEPS, ())]
    assert calls3["original"] + calls3["fixed"] == 15 * steps
    # the step clock, same definition as the plugin's: every step's batch under the variant that ran it
    batches = by_variant(v3, M.STEP_BATCH + "_count")
    assert batches["original"] == calls3["original"] / 15 and batches["fixed"] == calls3["fixed"] / 15
    assert sum(by_variant(v3, M.STEP_BATCH + "_sum").values()) == v3[(M.BATCH_SIZE + "_sum", ())]
    intervals = sum(by_variant(v3, M.STEP_INTERVAL + "_count").values())
    assert 0 < intervals < steps
    assert [dict(k[1])["pid"] for k in v3 if k[0] == M.INFO] == pid and sim.proc.poll() is None  # same process


def test_bad_values_are_refused_counted_and_ignored(controlled_sim):
    sim, path = controlled_sim
    write_control(path, "fixed", True, epoch=2)
    until(sim, lambda v: v[(M.CONTROL_EPOCH, ())] == 2, "epoch 2")
    path.write_text('{"variant": "turbo", "observe": true, "epoch": 3}')
    v = until(sim, lambda v: v[(M.CONTROL_ERRORS, (("reason", "variant"),))] == 1, "a refused variant")
    path.write_text("{broken")
    v = until(sim, lambda v: v[(M.CONTROL_ERRORS, (("reason", "json"),))] == 1, "refused JSON")
    assert v[(M.CONTROL_EPOCH, ())] == 2 and v[(M.ACTIVE_VARIANT, (("variant", "fixed"),))] == 1
    before = by_variant(v, M.CALLS)
    speak(sim)
    after = by_variant(scrape(sim), M.CALLS)
    assert after["fixed"] > before["fixed"] and after["original"] == before["original"]  # still serving, still fixed
    assert httpx.get(sim.url + "/health", timeout=5).json() == {"status": "healthy"}
    assert "change refused (variant)" in sim.log() and "change refused (json)" in sim.log()


def test_observe_switch_stops_and_restarts_the_sampled_observer(controlled_sim):
    sim, path = controlled_sim
    speak(sim)
    assert by_variant(scrape(sim), M.OBSERVED_CALLS)["original"] > 0  # fast.yaml samples every step
    write_control(path, "original", False, epoch=2)
    v = until(sim, lambda v: v[(M.CONTROL_EPOCH, ())] == 2, "epoch 2")
    assert v[(M.OBSERVE_ENABLED, ())] == 0
    for _ in range(3):
        speak(sim)
    v2 = scrape(sim)
    assert by_variant(v2, M.OBSERVED_CALLS) == by_variant(v, M.OBSERVED_CALLS)  # no call observed
    assert by_variant(v2, M.CALLS)["original"] > by_variant(v, M.CALLS)["original"]
    write_control(path, "original", True, epoch=3)
    v3 = until(sim, lambda v: v[(M.CONTROL_EPOCH, ())] == 3, "epoch 3")
    speak(sim)
    assert by_variant(scrape(sim), M.OBSERVED_CALLS)["original"] > by_variant(v3, M.OBSERVED_CALLS)["original"]


def test_hot_swappable_known_answer_delay_rides_on_the_control_file(controlled_sim):
    """The control file's "sim" object sets the simulator's known-answer delay at a step boundary, with the epoch:
    two arms that differ only in it share one server start (designs swap and nested)."""
    sim, path = controlled_sim
    speak(sim)
    v0 = scrape(sim)
    assert v0[(M.SIM_INJECTED_SECONDS, ())] == 0
    write_control(path, "original", True, epoch=2, sim={"model.extra_step_ms": 5.0})
    v1 = until(sim, lambda v: v[(M.CONTROL_EPOCH, ())] == 2, "epoch 2")
    speak(sim)
    v2 = scrape(sim)
    steps = v2[(M.STEPS, ())] - v1[(M.STEPS, ())]
    injected = v2[(M.SIM_INJECTED_SECONDS, ())] - v1[(M.SIM_INJECTED_SECONDS, ())]
    assert steps > 0 and injected == pytest.approx(5e-3 * steps, rel=1e-6)  # 5 ms on every step since the switch
    write_control(path, "original", True, epoch=3, sim={"model.extra_step_ms": 0.0})  # back, as arm A's windows do
    v3 = until(sim, lambda v: v[(M.CONTROL_EPOCH, ())] == 3, "epoch 3")
    speak(sim)
    assert scrape(sim)[(M.SIM_INJECTED_SECONDS, ())] == v3[(M.SIM_INJECTED_SECONDS, ())]
    write_control(path, "original", True, epoch=4, sim={"model.base_ms": 9.0})  # not hot-swappable: refused, logged
    until(sim, lambda v: v[(M.CONTROL_EPOCH, ())] == 4, "epoch 4")
    assert "not hot-swappable" in sim.log()


def test_a_missing_control_file_is_a_clear_start_up_error(tmp_path):
    cmd = [sys.executable, "-m", "ttssim", "--port", "0", "--control", str(tmp_path / "nope.json")]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "ttssim: bad control file: control file" in p.stderr and "nope.json" in p.stderr
    p = subprocess.run([sys.executable, "-m", "ttssim", "--port", "0"], cwd=REPO, capture_output=True, text=True,
                       timeout=60, env={k: v for k, v in __import__("os").environ.items() if k != ENV_CONTROL})
    assert p.returncode == 2 and "--variant is required without a control file" in p.stderr

"""The control file reader and channel, the step clock, and the plugin's step-boundary test (main venv, no vLLM)."""

from __future__ import annotations

import functools
import json
import logging
import os

import pytest
import torch
from prometheus_client import CollectorRegistry

from tts_predictor import metrics as M
from tts_predictor.control import (
    ENV_CONTROL,
    ERROR_REASONS,
    ControlChannel,
    ControlError,
    ControlFile,
    ControlRejected,
    ControlSetting,
    parse_control,
    read_control,
    write_control,
)
from tts_predictor.domain import VARIANT_NAMES
from tts_predictor.plugin import is_step_start, source_sha256
from tts_predictor.step_clock import StepClock

log = logging.getLogger("test_control")


# --- the format -----------------------------------------------------------------------------------------------

def test_parse_accepts_the_documented_format_and_ignores_extra_keys():
    s = parse_control('{"variant": "fixed", "observe": false, "epoch": 3, "note": "round 2", "by": {"x": 1}}')
    assert s == ControlSetting("fixed", False, 3)
    assert parse_control(b'{"variant": "vectorized", "observe": true}') == ControlSetting("vectorized", True, None)
    for v in VARIANT_NAMES:
        assert parse_control(json.dumps({"variant": v, "observe": True})).variant == v


def test_host_delay_is_the_positive_control_default_off():
    assert parse_control('{"variant": "fixed", "observe": true}').host_delay_us == 0.0
    s = parse_control('{"variant": "fixed", "observe": true, "host_delay_us": 250, "note": 1}')
    assert s.host_delay_us == 250.0 and s.extra == {"note": 1}
    assert s != parse_control('{"variant": "fixed", "observe": true}')  # a change of the delay alone is a change


@pytest.mark.parametrize(("text", "reason"), [
    ("", "json"),
    ('{"variant": "fixed", "observe": tru', "json"),
    (b"\xff\xfe\x00", "json"),
    ("[1, 2]", "not_object"),
    ('"fixed"', "not_object"),
    ('{"observe": true}', "variant"),
    ('{"variant": "turbo", "observe": true}', "variant"),
    ('{"variant": "Fixed", "observe": true}', "variant"),
    ('{"variant": null, "observe": true}', "variant"),
    ('{"variant": "fixed"}', "observe"),
    ('{"variant": "fixed", "observe": 1}', "observe"),
    ('{"variant": "fixed", "observe": "true"}', "observe"),
    ('{"variant": "fixed", "observe": true, "epoch": -1}', "epoch"),
    ('{"variant": "fixed", "observe": true, "epoch": 1.5}', "epoch"),
    ('{"variant": "fixed", "observe": true, "epoch": true}', "epoch"),
    ('{"variant": "fixed", "observe": true, "epoch": "7"}', "epoch"),
    ('{"variant": "fixed", "observe": true, "host_delay_us": -1}', "host_delay"),
    ('{"variant": "fixed", "observe": true, "host_delay_us": 100001}', "host_delay"),
    ('{"variant": "fixed", "observe": true, "host_delay_us": "50"}', "host_delay"),
    ('{"variant": "fixed", "observe": true, "host_delay_us": true}', "host_delay"),
])
def test_parse_refuses_with_a_reason(text, reason):
    with pytest.raises(ControlError) as e:
        parse_control(text)
    assert e.value.reason == reason and e.value.reason in ERROR_REASONS and str(e.value)


def test_read_control_reports_io_problems_as_unreadable(tmp_path):
    with pytest.raises(ControlError) as e:
        read_control(tmp_path / "missing.json")
    assert e.value.reason == "unreadable" and "missing.json" in str(e.value)
    big = tmp_path / "big.json"
    big.write_text('{"variant": "fixed", "observe": true, "pad": "' + "x" * 70_000 + '"}')
    with pytest.raises(ControlError) as e:
        read_control(big)
    assert e.value.reason == "unreadable" and "larger than" in str(e.value)


def test_write_control_is_atomic_and_validates(tmp_path):
    path = tmp_path / "c.json"
    write_control(path, "fixed", True, epoch=4, note="x")
    assert json.loads(path.read_text()) == {"variant": "fixed", "observe": True, "epoch": 4, "note": "x"}
    ino = path.stat().st_ino
    write_control(path, "original", False)
    assert path.stat().st_ino != ino  # a rename: readers see the old or the new file, never half of one
    assert read_control(path) == ControlSetting("original", False, None)
    with pytest.raises(ControlError):
        write_control(path, "turbo", True)
    assert read_control(path) == ControlSetting("original", False, None)  # unchanged
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]  # no temp file left behind


# --- the polling file -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("content", "reason"), [(None, "unreadable"), ("{", "json"), ('{"variant": "x"}', "variant")])
def test_start_up_problems_raise(tmp_path, content, reason):
    path = tmp_path / "c.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ControlError) as e:
        ControlFile(path)
    assert e.value.reason == reason and str(path) in str(e.value)


def test_poll_returns_changes_once_and_refusals_once_per_change(tmp_path):
    path = tmp_path / "c.json"
    write_control(path, "original", True, epoch=1)
    f = ControlFile(path)
    assert f.current == ControlSetting("original", True, 1)
    assert [f.poll() for _ in range(3)] == [None, None, None]  # nothing changed
    write_control(path, "fixed", True, epoch=2)
    assert f.poll() == ControlSetting("fixed", True, 2) and f.poll() is None
    write_control(path, "fixed", True, epoch=2, note="same setting, new file")
    assert f.poll() is None  # the file changed, the setting did not
    path.write_text("{broken")
    r = f.poll()
    assert isinstance(r, ControlRejected) and r.reason == "json" and "keeping" in r.message
    assert f.poll() is None and f.current == ControlSetting("fixed", True, 2)  # refused once, setting kept
    os.remove(path)
    r = f.poll()
    assert isinstance(r, ControlRejected) and r.reason == "unreadable"
    assert f.poll() is None
    write_control(path, "vectorized", False, epoch=3)
    assert f.poll() == ControlSetting("vectorized", False, 3)


def test_poll_sees_an_in_place_rewrite_of_another_size(tmp_path):
    path = tmp_path / "c.json"
    path.write_text('{"variant": "original", "observe": true}')
    f = ControlFile(path)
    with open(path, "w") as fh:  # not atomic, same inode: the size still differs
        fh.write('{"variant": "vectorized", "observe": true}')
    assert f.poll() == ControlSetting("vectorized", True, None)


def test_poll_checks_the_file_every_nth_call(tmp_path):
    path = tmp_path / "c.json"
    write_control(path, "original", True)
    f = ControlFile(path, check_every=4)
    write_control(path, "fixed", True)
    assert [f.poll() for _ in range(3)] == [None, None, None]
    assert f.poll() == ControlSetting("fixed", True, None)
    with pytest.raises(ValueError):
        ControlFile(path, check_every=0)


# --- the channel ----------------------------------------------------------------------------------------------

def _value(reg, name, labels=None):
    return reg.get_sample_value(name, labels or {})


def test_channel_applies_counts_and_exports(tmp_path, caplog):
    path = tmp_path / "c.json"
    write_control(path, "original", True, epoch=1)
    reg = CollectorRegistry()
    ch = ControlChannel(ControlFile(path), log, M.make_control_metrics(reg))
    assert _value(reg, M.ACTIVE_VARIANT, {"variant": "original"}) == 1
    assert _value(reg, M.ACTIVE_VARIANT, {"variant": "fixed"}) == 0
    assert _value(reg, M.CONTROL_EPOCH) == 1 and _value(reg, M.OBSERVE_ENABLED) == 1
    assert all(_value(reg, M.CONTROL_ERRORS, {"reason": r}) == 0 for r in ERROR_REASONS)  # visible from the start
    assert ch.at_step_boundary() is False and ch.generation == 0

    write_control(path, "fixed", False, epoch=2)
    with caplog.at_level(logging.INFO, logger="test_control"):
        assert ch.at_step_boundary() is True
    assert "now variant 'fixed', observe False, epoch 2 (was 'original', True, 1" in caplog.text
    assert ch.setting == ControlSetting("fixed", False, 2) and ch.generation == 1
    assert _value(reg, M.SWITCHES, {"variant": "fixed"}) == 1
    assert _value(reg, M.ACTIVE_VARIANT, {"variant": "fixed"}) == 1
    assert _value(reg, M.ACTIVE_VARIANT, {"variant": "original"}) == 0
    assert _value(reg, M.CONTROL_EPOCH) == 2 and _value(reg, M.OBSERVE_ENABLED) == 0

    write_control(path, "fixed", True, epoch=3)  # observe and epoch only: not a switch
    assert ch.at_step_boundary() is True
    assert _value(reg, M.SWITCHES, {"variant": "fixed"}) == 1 and ch.switches == 1 and ch.generation == 2

    path.write_text('{"variant": "turbo", "observe": true}')
    with caplog.at_level(logging.WARNING, logger="test_control"):
        assert ch.at_step_boundary() is False
    assert "change refused (variant)" in caplog.text
    assert _value(reg, M.CONTROL_ERRORS, {"reason": "variant"}) == 1 and ch.rejected == 1
    assert ch.setting == ControlSetting("fixed", True, 3) and ch.generation == 2


def test_channel_from_env(tmp_path):
    assert ControlChannel.from_env(log, environ={}) is None
    assert ControlChannel.from_env(log, environ={ENV_CONTROL: "  "}) is None
    with pytest.raises(ControlError):
        ControlChannel.from_env(log, environ={ENV_CONTROL: str(tmp_path / "nope.json")})
    write_control(tmp_path / "c.json", "vectorized", False, epoch=9)
    ch = ControlChannel.from_env(log, environ={ENV_CONTROL: str(tmp_path / "c.json")})
    assert ch.setting == ControlSetting("vectorized", False, 9) and ch.metrics is None
    assert ch.at_step_boundary() is False  # works without metrics (attached later by the plugin)


def test_epoch_absent_exports_zero(tmp_path):
    write_control(tmp_path / "c.json", "fixed", True)
    reg = CollectorRegistry()
    ControlChannel(ControlFile(tmp_path / "c.json"), log, M.make_control_metrics(reg))
    assert _value(reg, M.CONTROL_EPOCH) == 0


# --- the step clock ---------------------------------------------------------------------------------------------

def test_step_clock_known_answer():
    reg = CollectorRegistry()
    clock = StepClock(M.make_step_metrics(reg))
    starts = [(10.00, 4, "original"), (10.05, 4, "original"), (10.12, 5, "fixed"), (10.15, 5, "fixed"),
              (12.00, 2, "fixed"),  # after 1.85 s: idle, not an interval
              (12.02, 2, "vectorized")]
    got = [clock.step_start(t, b, v) for t, b, v in starts]
    assert got[0] is None and got[4] is None
    assert [round(x, 6) for x in got if x is not None] == [0.05, 0.07, 0.03, 0.02]
    h = M.STEP_INTERVAL
    # an interval belongs to the earlier step (the one it measures)
    assert _value(reg, h + "_count", {"variant": "original"}) == 2
    assert _value(reg, h + "_sum", {"variant": "original"}) == pytest.approx(0.12)
    assert _value(reg, h + "_count", {"variant": "fixed"}) == 2
    assert _value(reg, h + "_sum", {"variant": "fixed"}) == pytest.approx(0.05)
    assert _value(reg, h + "_count", {"variant": "vectorized"}) is None
    b = M.STEP_BATCH
    assert _value(reg, b + "_count", {"variant": "fixed"}) == 3 and _value(reg, b + "_sum", {"variant": "fixed"}) == 12
    assert _value(reg, b + "_count", {"variant": "vectorized"}) == 1
    assert clock.steps == 6 and clock.intervals == 4


def test_step_clock_threshold_is_exclusive_and_buckets_cover_it():
    clock = StepClock(None, idle_s=1.0)
    assert clock.step_start(0.0, 1, "fixed") is None
    assert clock.step_start(0.999, 1, "fixed") == pytest.approx(0.999)
    assert clock.step_start(1.999, 1, "fixed") is None  # exactly the threshold: idle
    assert M.STEP_INTERVAL_BUCKETS[-1] == M.STEP_IDLE_S  # every counted interval falls in a finite bucket
    assert list(M.STEP_INTERVAL_BUCKETS) == sorted(M.STEP_INTERVAL_BUCKETS)


def test_extra_keys_ride_along_but_are_no_change_on_their_own():
    s = parse_control('{"variant": "fixed", "observe": false, "epoch": 3, "sim": {"model.extra_step_pct": 1}}')
    assert s.extra == {"sim": {"model.extra_step_pct": 1}}
    assert s == ControlSetting("fixed", False, 3)  # the extras never make a change by themselves: the epoch does


def test_step_clock_idle_ends_a_busy_period_whatever_the_gap():
    """A server that knows it went idle (the simulator) says so: a short idle gap is not a step interval."""
    clock = StepClock(None, idle_s=1.0)
    clock.step_start(0.0, 2, "fixed")
    assert clock.step_start(0.05, 2, "fixed") == pytest.approx(0.05)
    clock.idle()
    assert clock.step_start(0.30, 1, "fixed") is None  # 0.25 s after the last step, but after idleness
    assert clock.step_start(0.34, 1, "fixed") == pytest.approx(0.04)
    assert clock.steps == 4 and clock.intervals == 2


# --- the plugin's boundary and source checks (no vLLM needed) --------------------------------------------------

def _t(values):
    return torch.tensor(values, dtype=torch.int32)


def test_step_start_is_the_prefill_call_only():
    assert is_step_start(3, _t([2, 2, 2]), _t([2, 2, 2]))  # prefill_logits: query 2 over a fresh 2-token sequence
    for past in range(2, 16):  # decode_logits: seq_len = past + 1 >= 3
        assert not is_step_start(3, _t([1, 1, 1]), _t([past + 1] * 3))
    assert not is_step_start(0, _t([]), _t([]))
    assert not is_step_start(2, _t([2, 2]), _t([5, 5]))
    assert not is_step_start(1, _t([2]).to("meta"), _t([2]).to("meta"))  # never reads a non-host tensor


def test_source_hash_is_the_functions_own_code_not_what_wraps_points_to():
    def stock(x):
        return x + 1

    @functools.wraps(stock)
    def wrapper(x):
        return stock(x) * 2

    assert source_sha256(wrapper) != source_sha256(stock)
    with pytest.raises(TypeError):
        source_sha256(functools.partial(stock, 1))


FAKE_STOCK = '''\
from __future__ import annotations

import types


def _build(*, attn_metadata_builders, num_reqs, num_tokens, query_start_loc_gpu, query_start_loc_cpu, seq_lens,
           max_seq_len, block_tables, slot_mappings, kv_cache_config):
    return num_reqs


attn_utils = types.SimpleNamespace(build_attn_metadata=_build)


class _LocalPredictorKVCache:
    def __init__(self, n):
        self.n = n

    def build_attn_metadata(self, *, num_reqs, query_lens, seq_lens):
        return attn_utils.build_attn_metadata(num_reqs=num_reqs, seq_lens=seq_lens.tolist())
'''


def _fake_stock(tmp_path, monkeypatch):
    """A module file standing in for vllm-omni 0.16.0's, its two targets' hashes made the verified ones."""
    import importlib.util

    from tts_predictor import plugin

    path = tmp_path / "fake_stock.py"
    path.write_text(FAKE_STOCK)
    spec = importlib.util.spec_from_file_location("fake_stock", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cls = module._LocalPredictorKVCache
    monkeypatch.setattr(plugin, "TARGET_SOURCE_SHA256", {n: source_sha256(cls.__dict__[n])
                                                         for n in ("build_attn_metadata", "__init__")})
    return plugin, module, cls, path


def test_a_changed_method_under_the_stock_file_and_line_fails_closed(tmp_path, monkeypatch):
    """The source hash reads the stock text at the code's file and line; the code that runs is compared too."""
    plugin, module, cls, path = _fake_stock(tmp_path, monkeypatch)
    plugin.check_target(module, cls, "0.16.0", environ={})  # the stock code passes
    stock = cls.__dict__["build_attn_metadata"]
    line = stock.__code__.co_firstlineno
    # the same signature and line, other code: `.tolist()` dropped (what a patch of the stock method might do)
    changed_src = "\n" * (line - 2) + "class _LocalPredictorKVCache:\n" + \
        "    def build_attn_metadata(self, *, num_reqs, query_lens, seq_lens):\n" + \
        "        return attn_utils.build_attn_metadata(num_reqs=num_reqs, seq_lens=seq_lens)\n"
    ns = {}
    exec(compile(changed_src, str(path), "exec"), module.__dict__, ns)
    changed = ns["_LocalPredictorKVCache"].__dict__["build_attn_metadata"]
    assert changed.__code__.co_firstlineno == line and source_sha256(changed) == source_sha256(stock)
    monkeypatch.setattr(cls, "build_attn_metadata", changed)
    with pytest.raises(plugin.PluginError, match="runs other code than its verified 0.16.0 source"):
        plugin.check_target(module, cls, "0.16.0", environ={})
    assert plugin.runs_its_source(stock) and not plugin.runs_its_source(changed)


def test_skip_source_check_runs_unverified_and_says_so(tmp_path, monkeypatch, caplog):
    plugin, module, cls, path = _fake_stock(tmp_path, monkeypatch)
    monkeypatch.setattr(plugin, "TARGET_SOURCE_SHA256", {"build_attn_metadata": "0" * 64, "__init__": "0" * 64})
    with pytest.raises(plugin.PluginError, match=plugin.ENV_SKIP_SOURCE_CHECK):
        plugin.check_target(module, cls, "0.16.0", environ={})
    with caplog.at_level(logging.WARNING, logger=plugin.LOGGER_NAME):
        plugin.check_target(module, cls, "0.16.0", environ={plugin.ENV_SKIP_SOURCE_CHECK: "1"})
    assert "is NOT verified" in caplog.text

"""The plugin inside the real vllm-omni 0.16.0 code predictor (engine venv only: `make test-engine`).

Each run is its own process (driver.py), as on a server: TTS_PREDICTOR_VARIANT is per process; with
TTS_PREDICTOR_CONTROL one process runs all three arms and switches between them at talker-step boundaries.
What is real and what is stubbed: see driver.py and docs/gpu-host.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("vllm_omni", reason="engine venv only: make test-engine")
pytestmark = pytest.mark.engine

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from driver import STEP_BATCHES  # noqa: E402

VARIANTS = ("original", "fixed", "vectorized")
DEV_VERSION = "0.16.1.dev5+g1234abc"  # what an image built from another commit calls itself
CALLS_PHASE_OK = 87  # driver "calls" phase: calls that return (the 88th raises, as the stock method does)
FORWARD_STEPS = len(STEP_BATCHES) + 2  # + replay + corrupted replay of step 0
from tts_predictor.metrics import STEP_IDLE_S as IDLE_S  # noqa: E402


def _drive(tmp_path, variant, *args, env_extra=None, name=None):
    out = tmp_path / f"out-{name or variant}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TTS_PREDICTOR_", "PROMETHEUS_MULTIPROC"))}
    env.update({"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "INFO"})
    if variant is not None:
        env["TTS_PREDICTOR_VARIANT"] = variant
    env.update(env_extra or {})
    # cwd outside the checkout: the plugin must come from the installed package and its entry point
    proc = subprocess.run([sys.executable, str(HERE / "driver.py"), str(out), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    data = json.loads(out.read_text()) if proc.returncode == 0 else None
    return proc, data


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    res = {}
    for v in VARIANTS:
        tmp = tmp_path_factory.mktemp(v)
        mp = tmp / "prom"
        mp.mkdir()
        # the fixed arm runs under a development version string: the source hash, not the version, decides
        args = ("--fake-omni-version", DEV_VERSION) if v == "fixed" else ()
        proc, data = _drive(tmp, v, *args, env_extra={"TTS_PREDICTOR_SYNC_SAMPLE": "1",
                                                      "PROMETHEUS_MULTIPROC_DIR": str(mp)})
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        res[v] = (proc, data, mp)
    return res


# --- one variant per process (TTS_PREDICTOR_VARIANT) ---------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS)
def test_loaded_through_vllm_entry_point_from_installed_package(runs, variant):
    proc, data, _ = runs[variant]
    log = proc.stdout + proc.stderr  # vLLM's log handler writes to stdout
    assert "tts_predictor_variant=tts_predictor.plugin:register" in data["entry_points"]
    assert "site-packages" in data["plugin_file"], data["plugin_file"]
    assert data["installed_variant"] == variant and data["controlled"] is False
    assert f"variant '{variant}' installed in _LocalPredictorKVCache.build_attn_metadata (pid {data['pid']}" in log
    assert log.count(f"variant '{variant}' installed") == 1  # once per process
    assert f"first build_attn_metadata call in pid {data['pid']} runs variant '{variant}'" in log


def test_a_development_version_with_the_stock_source_is_accepted(runs):
    log = runs["fixed"][0].stdout + runs["fixed"][0].stderr
    assert f"vllm-omni {DEV_VERSION} is not 0.16.0, but _LocalPredictorKVCache and __init__ are the 0.16.0 code" in log
    assert f"vllm-omni {DEV_VERSION}, sync sample" in log  # the installed line names the real version string


@pytest.mark.parametrize("variant", VARIANTS)
def test_method_replaced_and_original_is_the_stock_code(runs, variant):
    _, data, _ = runs[variant]
    assert data["method_mark"] == variant  # every arm carries the same instrumentation wrapper
    # inside the wrapper: the untouched 0.16.0 method for original, our layout method otherwise
    assert data["wrapped_is_stock"] is (variant == "original")


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_backend_is_named(runs, variant):
    proc, data, _ = runs[variant]
    assert data["attention_info"] == [{"backend": "CPU_ATTN", "builder": "CPUAttentionMetadataBuilder", "value": 1.0}]
    assert (f"_LocalPredictorKVCache in pid {data['pid']} uses attention backend CPU_ATTN, metadata builder "
            "CPUAttentionMetadataBuilder") in proc.stdout + proc.stderr


@pytest.mark.parametrize("variant", ("fixed", "vectorized"))
def test_outputs_identical_to_stock(runs, variant):
    ref = runs["original"][1]["calls"]
    got = runs[variant][1]["calls"]
    assert len(ref) == len(got) == 88
    for a, b in zip(ref, got, strict=True):
        assert a == b, (a["kv"], a["num_reqs"], a["query_lens"], a["seq_lens"])
    # the comparison is not vacuous: real metadata reached the builder, and the stock errors/early returns are there
    ok = [c for c in ref if "error" not in c["result"] and c["result"]["builder_saw"]]
    assert len(ok) >= 80
    assert any(len(c["result"]["builder_saw"][0]["block_table_tensor"]["values"][0]) == 4 for c in ok)  # multi-block
    assert ref[-1]["result"] == {"error": "ValueError: num_reqs=9 exceeds local predictor max_batch_size=8"}
    assert ref[-3]["result"]["attn_metadata"] == {} and ref[-2]["result"]["attn_metadata"] == {}


def test_forward_codes_and_logits_identical_across_variants(runs):
    """The real forward() (16 code groups per talker step) gives the same codes and logits under every arm."""
    ref = runs["original"][1]
    for v in ("fixed", "vectorized"):
        assert runs[v][1]["steps"] == ref["steps"]
        assert runs[v][1]["replay"] == ref["replay"] and runs[v][1]["corrupted"] == ref["corrupted"]
    assert [s["batch"] for s in ref["steps"]] == list(STEP_BATCHES)
    assert all(len(row) == 16 for s in ref["steps"] for row in s["codes"])
    assert len({s["logits_sha256"] for s in ref["steps"]}) == len(STEP_BATCHES)  # the steps differ from each other
    # deterministic: step 0 again gives step 0; a layout off by one position gives other logits (the negative control)
    assert ref["replay"] == {k: ref["steps"][0][k] for k in ("codes", "logits_sha256", "logits_head")}
    assert ref["corrupted"]["logits_sha256"] != ref["steps"][0]["logits_sha256"]


def _ok_forward_tokens():
    return sum(16 * b for b in STEP_BATCHES) + 2 * 16 * STEP_BATCHES[0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_counters_moved_and_syncs_show_the_variant(runs, variant):
    _, data, _ = runs[variant]
    m = data["metrics"][variant]
    ok_calls = [c for c in data["calls"] if "error" not in c["result"]]
    tokens = sum(sum(c["query_lens"]) for c in ok_calls) + _ok_forward_tokens()
    assert len(ok_calls) == CALLS_PHASE_OK
    assert m["calls"] == CALLS_PHASE_OK + 15 * FORWARD_STEPS
    assert m["tokens"] == tokens
    assert m["requests"] == sum(c["num_reqs"] for c in ok_calls) + 15 * (sum(STEP_BATCHES) + 2 * STEP_BATCHES[0])
    assert m["observed_calls"] == m["calls"] and m["observed_tokens"] == tokens  # sample = 1: every call observed
    assert m["seconds_count"] == 0  # observed calls are kept out of the time histogram
    others = [v for v in VARIANTS if v != variant]
    assert all(data["metrics"][o]["calls"] == 0 for o in others)  # nothing counted under another label
    # per call, logical observer on the CPU: the design's T+4 / 5 / 0. On the CPU `qsl.to(device)` returns the same
    # tensor; the observer hands out a separate alias for the "uploaded" copy, so vLLM's attn_utils reading the host
    # `query_start_loc_cpu` is not counted as a device read (as on a GPU, where that tensor is the host copy).
    for c, s in zip(ok_calls, [s for s in data["per_call_syncs"] if s["tokens"] is not None], strict=True):
        t = sum(c["query_lens"])
        if t == 0:
            continue  # early return after the prefix sum: no layout, no copies
        assert s["syncs"] == _want_syncs(variant, t), (c, s)


def _want_syncs(variant: str, tokens: int) -> int:
    return {"original": tokens + 4, "fixed": 5, "vectorized": 0}[variant]


def _mp_values(mp, monkeypatch) -> dict:
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(mp))
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    text = generate_latest(get_prometheus_registry()).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


@pytest.mark.parametrize("variant", VARIANTS)
def test_counters_reach_a_multiprocess_registry(runs, variant, monkeypatch):
    """The transport the server uses: worker files in PROMETHEUS_MULTIPROC_DIR, read by vLLM's /metrics registry."""
    _, data, mp = runs[variant]
    assert any(p.name.startswith("counter_") for p in mp.iterdir())
    values = _mp_values(mp, monkeypatch)
    m = data["metrics"][variant]
    lab = (("variant", variant),)
    assert values[("tts_predictor_build_attn_metadata_calls_total", lab)] == m["calls"]
    assert values[("tts_predictor_tokens_total", lab)] == m["tokens"]
    assert values[("tts_predictor_device_syncs_total", lab)] == m["syncs"]
    assert values[("tts_predictor_step_batch_size_count", lab)] == m["step_batch_count"]
    assert values[("tts_predictor_attention_info", (("backend", "CPU_ATTN"),
                                                    ("builder", "CPUAttentionMetadataBuilder")))] == 1
    # without a control file nothing of the control channel is exported
    assert not any(name.startswith(("tts_predictor_control", "tts_predictor_active_variant")) for name, _ in values)


def test_default_sampling_times_unobserved_calls(tmp_path):
    proc, data = _drive(tmp_path, "fixed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = data["metrics"]["fixed"]
    assert m["observed_calls"] == m["calls"] // 32  # every 32nd call observed
    assert m["seconds_count"] == m["calls"] - m["observed_calls"]
    assert m["syncs"] == 5 * m["observed_calls"]


@pytest.mark.parametrize(
    ("variant", "args", "env", "messages"),
    [
        ("turbo", (), {}, ["TTS_PREDICTOR_VARIANT='turbo' is not a known predictor variant"]),
        ("original", ("--fake-omni-version", "0.17.0", "--tamper"), {},
         ["_LocalPredictorKVCache.build_attn_metadata differs from vllm-omni 0.16.0 (installed vllm-omni 0.17.0"]),
        ("vectorized", ("--tamper-wrapped",), {},
         ["tamper-wrapped: inspect.getsource shows the stock source: True",  # the hole this case closes
          "_LocalPredictorKVCache.build_attn_metadata differs from vllm-omni 0.16.0 (installed vllm-omni 0.16.0"]),
        ("fixed", (), {"TTS_PREDICTOR_CONTROL": "/nonexistent/control.json"},
         ["TTS_PREDICTOR_CONTROL: control file /nonexistent/control.json (TTS_PREDICTOR_CONTROL) does not exist"]),
    ],
    ids=["unknown-variant", "changed-source-other-version", "wraps-wrapper", "missing-control-file"],
)
def test_refuses_to_start(tmp_path, variant, args, env, messages):
    proc, _ = _drive(tmp_path, variant, *args, env_extra=env)
    assert proc.returncode != 0
    log = proc.stdout + proc.stderr
    assert "PluginError" in log, log[-3000:]
    for message in messages:
        assert message in log, log[-3000:]


# --- the step clock ---------------------------------------------------------------------------------------------

def _step_starts(trace):
    return [t for t in trace if t["num_reqs"] > 0 and t["q0"] == 2 and t["s0"] == 2]


def check_step_clock(data):
    """STEP_BATCH counts every step start under the label that ran it; STEP_INTERVAL every gap below the idle
    threshold under the earlier step's label, with a sum bracketed by the driver's own clock readings around each
    prefill call (the plugin reads the same perf_counter inside the call): no tolerance on wall time."""
    starts = _step_starts(data["trace"])
    assert starts and all(isinstance(s["label"], str) for s in starts)
    by_label = Counter(s["label"] for s in starts)
    for v in VARIANTS:
        m = data["metrics"][v]
        assert m["step_batch_count"] == by_label[v], v
        assert m["step_batch_sum"] == sum(s["num_reqs"] for s in starts if s["label"] == v), v
        lo_count = hi_count = 0
        lo_sum = hi_sum = 0.0
        for kv in {s["kv"] for s in starts}:
            seq = [s for s in starts if s["kv"] == kv]
            for a, b in zip(seq, seq[1:], strict=False):
                if a["label"] != v:
                    continue
                lo, hi = b["t"][0] - a["t"][1], b["t"][1] - a["t"][0]  # the plugin's gap lies in [lo, hi]
                if hi < IDLE_S:
                    lo_count, hi_count, lo_sum, hi_sum = lo_count + 1, hi_count + 1, lo_sum + lo, hi_sum + hi
                elif lo < IDLE_S:  # too close to the threshold to say from outside: either is right
                    hi_count, hi_sum = hi_count + 1, hi_sum + hi
        assert lo_count <= m["step_interval_count"] <= hi_count, (v, lo_count, hi_count, m)
        assert lo_sum - 1e-9 <= m["step_interval_sum"] <= hi_sum + 1e-9, (v, lo_sum, hi_sum, m)
    return starts


@pytest.mark.parametrize("variant", VARIANTS)
def test_step_clock_counts_the_steps_driven(runs, variant):
    """Real clock: how many gaps fall below the idle threshold depends on the box; the brackets do not."""
    starts = check_step_clock(runs[variant][1])
    forward = [s for s in starts if s["phase"] != "calls"]
    assert [s["num_reqs"] for s in forward] == [*STEP_BATCHES, STEP_BATCHES[0], STEP_BATCHES[0]]


# --- one process, three arms: the control file ---------------------------------------------------------------

INITIAL = {"variant": "original", "observe": True, "epoch": 1}
SCRIPT = [  # before_step k: applied at step k's prefill; mid_step: written between step k's prefill and decodes
    {"before_step": 2, "write": {"variant": "fixed", "observe": True, "epoch": 2}},
    {"before_step": 3, "raw": '{"variant": "fixed", "observe": tru'},  # broken JSON: refused, counted
    {"before_step": 4, "raw": '{"variant": "turbo", "observe": true, "epoch": 9}'},  # unknown variant: refused
    {"before_step": 4, "mid_step": True, "write": {"variant": "vectorized", "observe": False, "epoch": 3}},
    {"before_step": 6, "delete": True},  # the file disappears: refused, counted; keeps serving
    {"before_step": 7, "write": {"variant": "original", "observe": False, "epoch": 4}},
    {"before_step": 8, "advance": 1.5, "write": {"variant": "fixed", "observe": True, "epoch": 5}},  # after idle
    {"before_step": 9, "write": {"variant": "fixed", "observe": True, "epoch": 6, "note": "epoch only"}},
    {"before_step": 10, "write": {"variant": "vectorized", "observe": True, "epoch": 7}},
]
# what each forward step must have run (then the replay and the corrupted replay, still vectorized)
EXPECT_LABELS = ["original", "original", "fixed", "fixed", "fixed", "vectorized", "vectorized", "original", "fixed",
                 "fixed", "vectorized", "vectorized", "vectorized", "vectorized"]
EXPECT_OBSERVE = [True] * 5 + [False] * 3 + [True] * 6


@pytest.fixture(scope="module")
def controlled(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("controlled")
    mp = tmp / "prom"
    mp.mkdir()
    control = tmp / "control" / "predictor.json"
    control.parent.mkdir()
    control.write_text(json.dumps(INITIAL))
    proc, data = _drive(tmp, "vectorized", "--control-script", json.dumps(SCRIPT), "--virtual-clock", name="controlled",
                        env_extra={"TTS_PREDICTOR_CONTROL": str(control), "TTS_PREDICTOR_SYNC_SAMPLE": "1",
                                   "PROMETHEUS_MULTIPROC_DIR": str(mp)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc, data, mp


def _forward_calls(data):
    calls = [t for t in data["trace"] if t["phase"] != "calls"]
    assert len(calls) == 15 * FORWARD_STEPS
    return [calls[i:i + 15] for i in range(0, len(calls), 15)]


def test_control_switches_at_step_boundaries_only(controlled):
    proc, data, _ = controlled
    log = proc.stdout + proc.stderr
    assert data["controlled"] is True and data["method_mark"] == "controlled"
    assert "TTS_PREDICTOR_VARIANT=vectorized is overridden by the control file" in log  # the file decides
    steps = _forward_calls(data)
    for k, calls in enumerate(steps):
        assert [c["step"] for c in calls] == [k] * 15
        assert calls[0]["q0"] == 2 and all(c["q0"] == 1 for c in calls[1:])  # 1 prefill + 14 decodes
        labels = {c["label"] for c in calls}
        assert labels == {EXPECT_LABELS[k]}, (k, [c["label"] for c in calls])  # never a switch inside a step
    assert data["installed_variant"] == "vectorized"
    assert log.count("tts_predictor control: now variant") == 6  # 5 switches and one epoch-only change


def test_control_keeps_outputs_identical(controlled, runs):
    _, data, _ = controlled
    ref = runs["original"][1]
    assert data["steps"] == ref["steps"]  # codes and logits of every step, across five switches
    assert data["replay"] == ref["replay"] and data["corrupted"] == ref["corrupted"]


def test_control_counters_follow_the_variant_that_ran(controlled):
    _, data, _ = controlled
    steps = _forward_calls(data)
    want_calls = Counter()
    for k, _calls in enumerate(steps):
        want_calls[EXPECT_LABELS[k]] += 15
    for v in VARIANTS:
        m = data["metrics"][v]
        assert m["calls"] == want_calls[v], v
        assert m["switches"] == {"original": 1, "fixed": 2, "vectorized": 2}[v], v
        assert m["active"] == (1 if v == "vectorized" else 0)
    # the sync signature per observed call is the arm's own: the right code ran under each label
    for k, calls in enumerate(steps):
        for c in calls:
            assert c["observed"] is EXPECT_OBSERVE[k], (k, c)
            if c["observed"]:
                assert c["syncs"] == _want_syncs(c["label"], c["num_reqs"] * c["q0"]), (k, c)
            else:
                assert c["syncs"] == 0
    assert data["epoch"] == 7 and data["observe_enabled"] == 1


def test_control_bad_values_are_refused_counted_and_ignored(controlled):
    proc, data, _ = controlled
    assert data["control_errors"] == {"unreadable": 1, "json": 1, "not_object": 0, "variant": 1, "observe": 0,
                                      "epoch": 0}
    log = proc.stdout + proc.stderr
    assert "tts_predictor control: change refused (json)" in log
    assert "tts_predictor control: change refused (variant)" in log
    assert "tts_predictor control: change refused (unreadable)" in log
    # steps 3 and 4 kept fixed after the two bad writes, 6 kept vectorized with the file gone: see EXPECT_LABELS,
    # checked call by call in test_control_switches_at_step_boundaries_only


def test_control_step_clock_known_answer(controlled):
    """The controlled run reads a virtual clock (the driver sets the plugin's perf_counter): the intervals the plugin
    reports are exactly the gaps the driver programmed, each under the label of the earlier step, without the one
    after the 1.5 s pause (idle), and every step's batch under the label that ran it."""
    _, data, _ = controlled
    assert data["virtual_clock"] is True
    starts = _step_starts(data["trace"])
    assert [s["label"] for s in starts] == EXPECT_LABELS
    assert [s["num_reqs"] for s in starts] == [*STEP_BATCHES, STEP_BATCHES[0], STEP_BATCHES[0]]
    t = data["virtual_starts"]
    want_count, want_sum = Counter(), Counter()
    for k in range(1, len(t)):
        gap = t[k] - t[k - 1]
        if gap < IDLE_S:
            want_count[EXPECT_LABELS[k - 1]] += 1
            want_sum[EXPECT_LABELS[k - 1]] += gap
    assert sum(want_count.values()) == FORWARD_STEPS - 2  # 13 gaps, one of them idle
    for v in VARIANTS:
        m = data["metrics"][v]
        assert m["step_interval_count"] == want_count[v], v
        assert m["step_interval_sum"] == pytest.approx(want_sum[v], abs=1e-9), v
        assert m["step_batch_count"] == sum(1 for s in starts if s["label"] == v)
        assert m["step_batch_sum"] == sum(s["num_reqs"] for s in starts if s["label"] == v)


def test_control_metrics_reach_a_multiprocess_registry(controlled, monkeypatch):
    _, data, mp = controlled
    values = _mp_values(mp, monkeypatch)
    assert values[("tts_predictor_control_epoch", ())] == 7
    assert values[("tts_predictor_observe_enabled", ())] == 1
    for v in VARIANTS:
        assert values[("tts_predictor_active_variant", (("variant", v),))] == (1 if v == "vectorized" else 0)
        assert values[("tts_predictor_variant_switches_total", (("variant", v),))] == data["metrics"][v]["switches"]
        assert values[("tts_predictor_build_attn_metadata_calls_total", (("variant", v),))] == data["metrics"][v]["calls"]
    assert values[("tts_predictor_control_errors_total", (("reason", "json"),))] == 1
    assert any(p.name.startswith("gauge_livemin_") for p in mp.iterdir())  # the multiprocess mode we chose

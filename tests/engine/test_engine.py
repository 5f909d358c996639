"""The plugin inside the real vllm-omni 0.16.0 code predictor (engine venv only: `make test-engine`).

Each variant runs in its own process (driver.py), as on a server, where TTS_PREDICTOR_VARIANT is per process.
What is real and what is stubbed: see driver.py and docs/gpu-host.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm_omni", reason="engine venv only: make test-engine")
pytestmark = pytest.mark.engine

HERE = Path(__file__).resolve().parent
VARIANTS = ("original", "fixed", "vectorized")


def _drive(tmp_path, variant, *args, env_extra=None):
    out = tmp_path / f"out-{variant}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TTS_PREDICTOR_", "PROMETHEUS_MULTIPROC"))}
    env.update({"TTS_PREDICTOR_VARIANT": variant, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "INFO"})
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
        proc, data = _drive(tmp, v, env_extra={"TTS_PREDICTOR_SYNC_SAMPLE": "1", "PROMETHEUS_MULTIPROC_DIR": str(mp)})
        assert proc.returncode == 0, proc.stderr[-4000:]
        res[v] = (proc, data, mp)
    return res


@pytest.mark.parametrize("variant", VARIANTS)
def test_loaded_through_vllm_entry_point_from_installed_package(runs, variant):
    proc, data, _ = runs[variant]
    log = proc.stdout + proc.stderr  # vLLM's log handler writes to stdout
    assert "tts_predictor_variant=tts_predictor.plugin:register" in data["entry_points"]
    assert "site-packages" in data["plugin_file"], data["plugin_file"]
    assert data["installed_variant"] == variant
    assert f"variant '{variant}' installed in _LocalPredictorKVCache.build_attn_metadata (pid {data['pid']}" in log
    assert log.count(f"variant '{variant}' installed") == 1  # once per process
    assert f"first build_attn_metadata call in pid {data['pid']} runs variant '{variant}'" in log


@pytest.mark.parametrize("variant", VARIANTS)
def test_method_replaced_and_original_is_the_stock_code(runs, variant):
    _, data, _ = runs[variant]
    assert data["method_mark"] == variant  # every arm carries the same instrumentation wrapper
    # inside the wrapper: the untouched 0.16.0 method for original, our layout method otherwise
    assert data["wrapped_is_stock"] is (variant == "original")


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


@pytest.mark.parametrize("variant", VARIANTS)
def test_counters_moved_and_syncs_show_the_variant(runs, variant):
    _, data, _ = runs[variant]
    m = data["metrics"]
    ok_calls = [c for c in data["calls"] if "error" not in c["result"]]
    tokens = sum(sum(c["query_lens"]) for c in ok_calls)
    assert m["calls"] == len(ok_calls) == 87
    assert m["tokens"] == tokens
    assert m["requests"] == sum(c["num_reqs"] for c in ok_calls)
    assert m["observed_calls"] == m["calls"] and m["observed_tokens"] == tokens  # sample = 1: every call observed
    assert m["seconds_count"] == 0  # observed calls are kept out of the time histogram
    # per call, logical observer on the CPU: the design's T+4 / 5 / 0 plus, for original and fixed, one read that
    # only exists here: on the CPU `qsl.to(device)` returns the same tensor, so vLLM's attn_utils
    # `int(query_start_loc_cpu.max())` reads a tensor the observer has seen "uploaded"; on a GPU that tensor is
    # the host copy and the read costs nothing.
    for c, s in zip(ok_calls, [s for s in data["per_call_syncs"] if s["tokens"] is not None], strict=True):
        t = sum(c["query_lens"])
        if t == 0:
            continue  # early return after the prefix sum: no layout, no copies
        want = {"original": t + 4 + 1, "fixed": 5 + 1, "vectorized": 0}[variant]
        assert s["syncs"] == want, (c, s)


@pytest.mark.parametrize("variant", VARIANTS)
def test_counters_reach_a_multiprocess_registry(runs, variant, monkeypatch):
    """The transport the server uses: worker files in PROMETHEUS_MULTIPROC_DIR, read by vLLM's /metrics registry."""
    _, data, mp = runs[variant]
    assert any(p.name.startswith("counter_") for p in mp.iterdir())
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(mp))
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from vllm.v1.metrics.prometheus import get_prometheus_registry

    text = generate_latest(get_prometheus_registry()).decode()
    values = {(s.name, s.labels.get("variant")): s.value
              for fam in text_string_to_metric_families(text) for s in fam.samples}
    assert values[("tts_predictor_build_attn_metadata_calls_total", variant)] == data["metrics"]["calls"]
    assert values[("tts_predictor_tokens_total", variant)] == data["metrics"]["tokens"]
    assert values[("tts_predictor_device_syncs_total", variant)] == data["metrics"]["syncs"]


def test_default_sampling_times_unobserved_calls(tmp_path):
    proc, data = _drive(tmp_path, "fixed")
    assert proc.returncode == 0, proc.stderr[-3000:]
    m = data["metrics"]
    assert m["observed_calls"] == m["calls"] // 32  # every 32nd call observed
    assert m["seconds_count"] == m["calls"] - m["observed_calls"]
    assert m["syncs"] == 6 * m["observed_calls"]


@pytest.mark.parametrize(
    ("variant", "args", "message"),
    [
        ("turbo", (), "TTS_PREDICTOR_VARIANT='turbo' is not a known predictor variant"),
        ("fixed", ("--fake-omni-version", "0.17.0"), "vllm-omni 0.17.0 found, but the predictor variants reproduce"),
        ("original", ("--fake-omni-version", "0.15.1"), "vllm-omni 0.15.1 found"),
        ("vectorized", ("--tamper",), "_LocalPredictorKVCache.build_attn_metadata differs from vllm-omni 0.16.0"),
    ],
)
def test_refuses_to_start(tmp_path, variant, args, message):
    proc, _ = _drive(tmp_path, variant, *args)
    assert proc.returncode != 0
    log = proc.stdout + proc.stderr
    assert "PluginError" in log and message in log, log[-3000:]

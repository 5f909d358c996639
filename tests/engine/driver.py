"""One engine-venv process with the plugin loaded the way vLLM loads it; run by tests/engine/test_engine.py.

`python driver.py OUT.json [--fake-omni-version V] [--tamper]`, with TTS_PREDICTOR_VARIANT (and PROMETHEUS_MULTIPROC_DIR)
in the environment. Real: vLLM's load_general_plugins() and entry-point discovery, vllm-omni 0.16.0's code predictor
(Qwen3TTSTalkerCodePredictorForConditionalGenerationVLLM with tiny random weights) and its _LocalPredictorKVCache,
vLLM's attention-layer registration, KV-cache spec, init_attn_backend/init_kv_cache and attn_utils.build_attn_metadata.
Stubbed: the attention metadata builder's build() (the CPU backend's needs vllm._C, an AVX-512 binary); the stub
records the CommonAttentionMetadata that the real attn_utils built from the variant's layout.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile

import torch

TINY = {  # a tiny Qwen3 body: vLLM's ModelConfig wants a model directory; nothing is downloaded
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
MAX_BATCH = 8
SEED = 1234


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    out_path = sys.argv[1]
    args = sys.argv[2:]
    import vllm_omni

    if "--fake-omni-version" in args:
        vllm_omni.__version__ = args[args.index("--fake-omni-version") + 1]
    if "--tamper" in args:  # a target whose code is not the 0.16.0 code our variants reproduce
        import vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code_predictor_vllm as target

        stock = target._LocalPredictorKVCache.build_attn_metadata

        def build_attn_metadata(self, *, num_reqs, query_lens, seq_lens):
            return stock(self, num_reqs=num_reqs, query_lens=query_lens, seq_lens=seq_lens)

        target._LocalPredictorKVCache.build_attn_metadata = build_attn_metadata

    from importlib.metadata import entry_points

    from vllm.plugins import DEFAULT_PLUGINS_GROUP, load_general_plugins

    eps = [f"{ep.name}={ep.value}" for ep in entry_points(group=DEFAULT_PLUGINS_GROUP)]
    load_general_plugins()  # raises (and so exits non-zero) when the plugin refuses

    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.config.vllm import set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm_omni.model_executor.models.qwen3_tts import qwen3_tts_code_predictor_vllm as target
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import (
        Qwen3TTSTalkerCodePredictorConfig,
        Qwen3TTSTalkerConfig,
    )

    import tts_predictor
    from tts_predictor import plugin

    model_dir = tempfile.mkdtemp(prefix="tiny-qwen3-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(TINY, f)
    vc = VllmConfig(
        model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=256),
        cache_config=CacheConfig(block_size=16),
        scheduler_config=SchedulerConfig(max_num_seqs=MAX_BATCH, max_model_len=256, is_encoder_decoder=False),
    )
    torch.manual_seed(SEED)
    with set_current_vllm_config(vc):
        init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}", backend="gloo")
        initialize_model_parallel(1, 1)
        cfg = Qwen3TTSTalkerCodePredictorConfig(
            vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_code_groups=16,
        )
        pred = target.Qwen3TTSTalkerCodePredictorForConditionalGenerationVLLM(
            vllm_config=vc, config=cfg, talker_config=Qwen3TTSTalkerConfig(hidden_size=64), prefix="code_predictor"
        )
        device = torch.device("cpu")
        pred._maybe_init_kv_cache(device)  # the real per-frame cache: max_seq_len = num_code_groups = 16, 1 block
        # and one whose sequences span several KV blocks (the layout's multi-block path)
        long_kv = target._LocalPredictorKVCache(vllm_config=vc, max_seq_len=64, max_batch_size=MAX_BATCH, device=device)
    caches = {"predictor": pred._kv_cache, "long": long_kv}

    recorded: list = []

    def stub_build(common_prefix_len, common_attn_metadata):
        m = common_attn_metadata  # keep clones: converting here would itself be a host read inside the observer
        recorded.append({k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in (
            ("query_start_loc", m.query_start_loc), ("query_start_loc_cpu", m.query_start_loc_cpu),
            ("seq_lens", m.seq_lens), ("max_seq_len", m.max_seq_len), ("num_reqs", m.num_reqs),
            ("num_actual_tokens", m.num_actual_tokens), ("max_query_len", m.max_query_len),
            ("block_table_tensor", m.block_table_tensor), ("slot_mapping", m.slot_mapping), ("causal", m.causal),
        )})
        return {"stub_metadata": len(recorded) - 1}

    for kv in caches.values():
        for b in kv.attn_metadata_builders:
            b.build = stub_build

    def plain(x):
        if isinstance(x, torch.Tensor):
            return {"dtype": str(x.dtype), "device": x.device.type, "values": x.tolist()}
        if isinstance(x, dict):
            return {str(k): plain(v) for k, v in sorted(x.items())}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    calls = []
    per_call_syncs = []
    syncs_metric = None

    def run(kv_name, num_reqs, q, s):
        nonlocal syncs_metric
        kv = caches[kv_name]
        before = _sample(tts_predictor, "syncs")
        n_rec = len(recorded)
        try:
            md, pos, slots = kv.build_attn_metadata(
                num_reqs=num_reqs, query_lens=torch.tensor(q, dtype=torch.int32),
                seq_lens=torch.tensor(s, dtype=torch.int32))
            res = {"attn_metadata": plain(md), "positions": plain(pos), "slot_mappings": plain(slots),
                   "builder_saw": plain(recorded[n_rec:])}
        except Exception as e:  # the stock contract includes its errors
            res = {"error": f"{type(e).__name__}: {e}"}
        calls.append({"kv": kv_name, "num_reqs": num_reqs, "query_lens": q, "seq_lens": s, "result": res})
        per_call_syncs.append({"tokens": sum(q[:num_reqs]) if "error" not in res else None,
                               "syncs": _sample(tts_predictor, "syncs") - before})

    # the predictor's own call pattern for one talker step (forward(): 1 prefill + 14 decodes) at several batches
    for b in (1, 3, MAX_BATCH):
        run("predictor", b, [2] * b, [2] * b)
        for past in range(2, 16):
            run("predictor", b, [1] * b, [past + 1] * b)
    # random mixed batches on the multi-block cache, fixed seed
    g = torch.Generator().manual_seed(SEED)
    for _ in range(40):
        n = int(torch.randint(1, MAX_BATCH + 1, (1,), generator=g))
        s = torch.randint(1, 65, (n,), generator=g)
        q = torch.minimum(s, torch.randint(0, 5, (n,), generator=g))
        run("long", n, q.tolist(), s.tolist())
    # the stock method's early returns and errors
    run("predictor", 0, [], [])
    run("predictor", 2, [0, 0], [3, 4])
    run("predictor", MAX_BATCH + 1, [1] * (MAX_BATCH + 1), [2] * (MAX_BATCH + 1))

    method = target._LocalPredictorKVCache.__dict__["build_attn_metadata"]
    result = {
        "pid": os.getpid(),
        "entry_points": eps,
        "plugin_file": plugin.__file__,
        "installed_variant": plugin.installed_variant(),
        "method_mark": getattr(method, plugin.MARK, None),
        "wrapped_is_stock": plugin.source_sha256(getattr(method, "__wrapped__", method))
        == plugin.TARGET_SOURCE_SHA256["build_attn_metadata"],
        "calls": calls,
        "per_call_syncs": per_call_syncs,
        "metrics": {k: _sample(tts_predictor, k) for k in
                    ("calls", "tokens", "requests", "syncs", "observed_calls", "observed_tokens", "seconds_count")},
    }
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


def _sample(pkg, what) -> float:
    """This process's own value of one predictor counter (prometheus_client's in-process view)."""
    from prometheus_client import REGISTRY

    from tts_predictor import metrics as names
    from tts_predictor.plugin import installed_variant

    name = {"calls": names.CALLS, "tokens": names.TOKENS, "requests": names.REQUESTS, "syncs": names.SYNCS,
            "observed_calls": names.OBSERVED_CALLS, "observed_tokens": names.OBSERVED_TOKENS,
            "seconds_count": names.SECONDS + "_count"}[what]
    v = REGISTRY.get_sample_value(name, {"variant": installed_variant()})
    return 0.0 if v is None else v


if __name__ == "__main__":
    raise SystemExit(main())

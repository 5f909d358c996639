"""One engine-venv process with the plugin loaded the way vLLM loads it; run by tests/engine/test_engine.py.

`python driver.py OUT.json [--fake-omni-version V] [--tamper | --tamper-wrapped] [--control-script JSON]
[--virtual-clock]`, with
TTS_PREDICTOR_VARIANT or TTS_PREDICTOR_CONTROL (and PROMETHEUS_MULTIPROC_DIR) in the environment.

Real: vLLM's load_general_plugins() and entry-point discovery, vllm-omni 0.16.0's code predictor
(Qwen3TTSTalkerCodePredictorForConditionalGenerationVLLM with tiny seeded random weights) with its
_LocalPredictorKVCache and its own forward() (1 prefill + 14 decodes per talker step, the model's layers, vLLM's
forward context), vLLM's attention-layer registration, KV-cache spec, init_attn_backend/init_kv_cache and
attn_utils.build_attn_metadata.
Stubbed (vLLM's CPU kernels are an AVX-512/AMX binary): the attention metadata builder's build(), replaced by a
recorder of the CommonAttentionMetadata that the real attn_utils built from the variant's layout, and the attention
kernel, replaced by `reference_attention` (plain torch, written here) which writes K/V at that metadata's
slot_mapping and reads them back through its block_table, seq_lens and query_start_loc: a wrong layout changes the
logits (the driver's negative control shows it does).

Phases: "calls" drives build_attn_metadata directly (the predictor's call pattern, seeded mixed batches on a
multi-block cache, early returns and errors; static variant only); "forward" runs talker steps through the real
forward() at the batches of STEP_BATCHES, optionally writing the control file before (or in the middle of) steps as
the control script says.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import socket
import sys
import tempfile
import textwrap
import time

import torch

TINY = {  # a tiny Qwen3 body: vLLM's ModelConfig wants a model directory; nothing is downloaded
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
MAX_BATCH = 8
SEED = 1234
HIDDEN = 64
STEP_BATCHES = (1, 3, 8, 8, 2, 5, 8, 1, 4, 8, 3, 6)  # talker steps of the forward phase
VIRTUAL_T0 = 1000.0


def virtual_gap(k: int) -> float:
    """--virtual-clock: how far the plugin's clock moves before forward step k (varied, all below the idle gap)."""
    return 0.01 * (1 + k % 5)
VARIANTS = ("original", "fixed", "vectorized")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tamper(kind: str) -> None:
    """Replace the stock method before the plugin checks it (the plugin must refuse both)."""
    import vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_code_predictor_vllm as target

    stock = target._LocalPredictorKVCache.build_attn_metadata
    if kind == "plain":  # a target whose code is not the 0.16.0 code our variants reproduce

        def build_attn_metadata(self, *, num_reqs, query_lens, seq_lens):
            return stock(self, num_reqs=num_reqs, query_lens=query_lens, seq_lens=seq_lens)

    else:  # changed code that inspect.getsource() would show as the stock source (it follows __wrapped__)

        @functools.wraps(stock)
        def build_attn_metadata(self, *, num_reqs, query_lens, seq_lens):
            out = stock(self, num_reqs=num_reqs, query_lens=query_lens, seq_lens=seq_lens)
            return out[0], out[1] + 0, out[2]

        seen = hashlib.sha256(textwrap.dedent(inspect.getsource(build_attn_metadata)).encode()).hexdigest()
        print(f"tamper-wrapped: inspect.getsource shows the stock source: {seen == _stock_sha()}", flush=True)
    target._LocalPredictorKVCache.build_attn_metadata = build_attn_metadata


def _stock_sha() -> str:
    from tts_predictor.plugin import TARGET_SOURCE_SHA256

    return TARGET_SOURCE_SHA256["build_attn_metadata"]


def reference_attention(mds):
    """A plain-torch attention impl.forward over the metadata the builder stub recorded (test-only kernel)."""

    def forward(layer, query, key, value, kv_cache, attn_metadata, output=None, **_):
        md = mds[attn_metadata["stub_metadata"]]
        bs = kv_cache.shape[3]  # CPU backend layout: (2, num_blocks, num_kv_heads, block_size, head_size)
        slots = md.slot_mapping.long()
        kv_cache[0][slots // bs, :, slots % bs, :] = key.to(kv_cache.dtype)
        kv_cache[1][slots // bs, :, slots % bs, :] = value.to(kv_cache.dtype)
        qsl = md.query_start_loc_cpu.tolist()
        heads, kv_heads = query.shape[1], key.shape[1]
        for i in range(md.num_reqs):
            q = query[qsl[i]:qsl[i + 1]].float()
            ql, s = q.shape[0], int(md.seq_lens[i])
            pos = torch.arange(s)
            blk = md.block_table_tensor[i, pos // bs].long()
            k = kv_cache[0][blk, :, pos % bs, :].float().repeat_interleave(heads // kv_heads, dim=1)
            v = kv_cache[1][blk, :, pos % bs, :].float().repeat_interleave(heads // kv_heads, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q, k) * layer.impl.scale
            qpos = torch.arange(s - ql, s)
            scores = scores.masked_fill(pos[None, None, :] > qpos[None, :, None], float("-inf"))
            out = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), v)
            output[qsl[i]:qsl[i + 1]] = out.to(output.dtype)
        return output

    return forward


VIRTUAL = {"t": VIRTUAL_T0}


def _write_raw(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _control_action(ev: dict) -> None:
    from tts_predictor.control import write_control

    path = os.environ["TTS_PREDICTOR_CONTROL"]
    if "advance" in ev:  # the virtual clock: a pause the plugin sees, without waiting for it
        VIRTUAL["t"] += ev["advance"]
    if "write" in ev:
        write_control(path, **ev["write"])
    if "raw" in ev:
        _write_raw(path, ev["raw"])
    if ev.get("delete"):
        os.remove(path)


def main() -> int:
    out_path = sys.argv[1]
    args = sys.argv[2:]
    import vllm_omni

    if "--fake-omni-version" in args:
        vllm_omni.__version__ = args[args.index("--fake-omni-version") + 1]
    if "--tamper" in args:
        _tamper("plain")
    if "--tamper-wrapped" in args:
        _tamper("wrapped")
    script = json.loads(args[args.index("--control-script") + 1]) if "--control-script" in args else []

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

    from tts_predictor import plugin

    controlled = plugin.installed_control() is not None
    virtual = "--virtual-clock" in args
    if virtual:  # the plugin's clock (step clock, call seconds) reads VIRTUAL: step intervals with a known answer
        from types import SimpleNamespace

        plugin.time = SimpleNamespace(perf_counter=lambda: VIRTUAL["t"])
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
            vocab_size=64, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_code_groups=16,
        )
        pred = target.Qwen3TTSTalkerCodePredictorForConditionalGenerationVLLM(
            vllm_config=vc, config=cfg, talker_config=Qwen3TTSTalkerConfig(hidden_size=HIDDEN), prefix="code_predictor"
        )
        device = torch.device("cpu")
        pred._maybe_init_kv_cache(device)  # the real per-frame cache: max_seq_len = num_code_groups = 16, 1 block
        # and one whose sequences span several KV blocks (the layout's multi-block path)
        long_kv = target._LocalPredictorKVCache(vllm_config=vc, max_seq_len=64, max_batch_size=MAX_BATCH, device=device)
    caches = {"predictor": pred._kv_cache, "long": long_kv}
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():  # vLLM layers allocate with torch.empty: give them seeded values
        for _, p in sorted(pred.named_parameters()):
            p.copy_((torch.randn(p.shape, generator=g) * 0.1).to(p.dtype))
    for m in pred.modules():  # CPU linear layers get their GEMM at weight processing; plain torch here
        if hasattr(m, "weight") and type(m).__name__.endswith("Linear") and not hasattr(m, "cpu_linear"):
            m.cpu_linear = torch.nn.functional.linear

    recorded: list = []
    mds: list = []

    def stub_build(common_prefix_len, common_attn_metadata):
        m = common_attn_metadata  # keep clones: converting here would itself be a host read inside the observer
        mds.append(m)
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
    for layer in vc.compilation_config.static_forward_context.values():
        layer.impl.forward = reference_attention(mds)

    # every call goes through this instance-level hook (then the plugin's class-level method): which counter label
    # moved, whether the observer ran, and when it started, per call
    trace: list = []
    hook_state = {"step": -1, "phase": "calls", "mid_step": {}}
    cls_method = target._LocalPredictorKVCache.build_attn_metadata

    def make_hook(name, kv):
        def hook(*, num_reqs, query_lens, seq_lens):
            if hook_state["phase"] == "warmup":  # the arm itself, outside the plugin's wrapper: nothing counted
                rt = plugin._installed["runtime"]
                return rt.impls[plugin.installed_variant()](kv, num_reqs=num_reqs, query_lens=query_lens,
                                                            seq_lens=seq_lens)
            ql = query_lens.tolist()
            sl = seq_lens.tolist()
            if hook_state["phase"] == "forward" and sl and sl[0] == 3 and ql[0] == 1:  # first decode of a step
                ev = hook_state["mid_step"].pop(hook_state["step"], None)
                if ev is not None:
                    _control_action(ev)
            before = {v: _sample("calls", v) for v in VARIANTS}
            obs_before = sum(_sample("observed_calls", v) for v in VARIANTS)
            syncs_before = sum(_sample("syncs", v) for v in VARIANTS)
            t0 = time.perf_counter()
            try:
                return cls_method(kv, num_reqs=num_reqs, query_lens=query_lens, seq_lens=seq_lens)
            finally:
                t1 = time.perf_counter()
                moved = [v for v in VARIANTS if _sample("calls", v) != before[v]]
                trace.append({"kv": name, "phase": hook_state["phase"], "step": hook_state["step"],
                              "num_reqs": int(num_reqs), "q0": ql[0] if ql else None, "s0": sl[0] if sl else None,
                              "label": moved[0] if len(moved) == 1 else moved, "t": [t0, t1],
                              "observed": sum(_sample("observed_calls", v) for v in VARIANTS) != obs_before,
                              "syncs": sum(_sample("syncs", v) for v in VARIANTS) - syncs_before})

        return hook

    for name, kv in caches.items():
        kv.build_attn_metadata = make_hook(name, kv)

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

    def run(kv_name, num_reqs, q, s):
        kv = caches[kv_name]
        before = {v: _sample("syncs", v) for v in VARIANTS}
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
                               "syncs": sum(_sample("syncs", v) - before[v] for v in VARIANTS)})

    if not controlled:
        # the predictor's own call pattern for one talker step (forward(): 1 prefill + 14 decodes) at several batches
        for b in (1, 3, MAX_BATCH):
            run("predictor", b, [2] * b, [2] * b)
            for past in range(2, 16):
                run("predictor", b, [1] * b, [past + 1] * b)
        # random mixed batches on the multi-block cache, fixed seed
        gq = torch.Generator().manual_seed(SEED)
        for _ in range(40):
            n = int(torch.randint(1, MAX_BATCH + 1, (1,), generator=gq))
            s = torch.randint(1, 65, (n,), generator=gq)
            q = torch.minimum(s, torch.randint(0, 5, (n,), generator=gq))
            run("long", n, q.tolist(), s.tolist())
        # the stock method's early returns and errors
        run("predictor", 0, [], [])
        run("predictor", 2, [0, 0], [3, 4])
        run("predictor", MAX_BATCH + 1, [1] * (MAX_BATCH + 1), [2] * (MAX_BATCH + 1))

    # --- forward phase: talker steps through the real forward() -------------------------------------------------
    logits: list = []
    for head in pred.lm_head:
        head.register_forward_hook(lambda mod, inp, out: logits.append(out.detach().float().clone()))
    emb_g = torch.Generator().manual_seed(SEED + 1)
    step_inputs = []
    for b in STEP_BATCHES:
        step_inputs.append((torch.randint(0, 64, (b, 1), generator=emb_g),
                            (torch.randn(b, 1, HIDDEN, generator=emb_g) * 0.5).to(torch.bfloat16),
                            (torch.randn(b, 1, HIDDEN, generator=emb_g) * 0.5).to(torch.bfloat16)))
    before_steps = {v: _sample("calls", v) for v in VARIANTS}

    def talker_step(inputs):
        del logits[:]
        codes = pred.forward(*inputs, do_sample=False)
        lg = torch.cat([x.reshape(-1) for x in logits])
        return {"codes": codes.tolist(), "logits_sha256": hashlib.sha256(lg.numpy().tobytes()).hexdigest(),
                "logits_head": [round(float(x), 6) for x in lg[:4]]}

    # torch builds its CPU kernels for each new shape on first use (a second or more on a busy box): warm them
    # outside the plugin, so that the timed steps below are steps, not kernel builds
    hook_state["phase"] = "warmup"
    for b in sorted(set(STEP_BATCHES)):
        talker_step(step_inputs[STEP_BATCHES.index(b)])
    steps = []
    hook_state["phase"] = "forward"
    virtual_starts = []
    for k, inputs in enumerate(step_inputs):
        VIRTUAL["t"] += virtual_gap(k)
        for ev in script:
            if ev["before_step"] == k:
                if ev.get("mid_step"):
                    hook_state["mid_step"][k] = ev
                else:
                    _control_action(ev)
        hook_state["step"] = k
        virtual_starts.append(VIRTUAL["t"])
        steps.append({"step": k, "batch": int(inputs[0].shape[0]), **talker_step(inputs)})
    forward_calls = {v: _sample("calls", v) - before_steps[v] for v in VARIANTS}
    # determinism and the negative control: step 0 again gives step 0's outputs; with the positions the layout
    # returned shifted by one (a layout bug), the same step gives other logits
    hook_state["phase"], hook_state["step"] = "replay", len(step_inputs)
    VIRTUAL["t"] += virtual_gap(hook_state["step"])
    virtual_starts.append(VIRTUAL["t"])
    replay = talker_step(step_inputs[0])
    current = plugin.installed_variant()
    rt = plugin._installed["runtime"]
    good = rt.impls[current]

    def off_by_one(self, **kw):
        md, pos, slots = good(self, **kw)
        return md, pos + 1, slots

    rt.impls[current] = off_by_one
    hook_state["step"] += 1
    VIRTUAL["t"] += virtual_gap(hook_state["step"])
    virtual_starts.append(VIRTUAL["t"])
    corrupted = talker_step(step_inputs[0])
    rt.impls[current] = good

    method = target._LocalPredictorKVCache.__dict__["build_attn_metadata"]
    result = {
        "pid": os.getpid(),
        "entry_points": eps,
        "plugin_file": plugin.__file__,
        "installed_variant": plugin.installed_variant(),
        "controlled": controlled,
        "method_mark": getattr(method, plugin.MARK, None),
        "wrapped_is_stock": plugin.source_sha256(getattr(method, "__wrapped__", method))
        == plugin.TARGET_SOURCE_SHA256["build_attn_metadata"],
        "calls": calls,
        "per_call_syncs": per_call_syncs,
        "trace": trace,
        "steps": steps,
        "forward_calls": forward_calls,
        "replay": replay,
        "virtual_clock": virtual,
        "virtual_starts": virtual_starts,
        "corrupted": corrupted,
        "metrics": {v: {k: _sample(k, v) for k in (
            "calls", "tokens", "requests", "syncs", "observed_calls", "observed_tokens", "seconds_count",
            "step_batch_count", "step_batch_sum", "step_interval_count", "step_interval_sum", "switches",
            "active")} for v in VARIANTS},
        "control_errors": {r: _value("tts_predictor_control_errors_total", {"reason": r}) for r in (
            "unreadable", "json", "not_object", "variant", "observe", "epoch")},
        "epoch": _value("tts_predictor_control_epoch", {}),
        "observe_enabled": _value("tts_predictor_observe_enabled", {}),
        "attention_info": _attention_info(),
    }
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


def _value(name: str, labels: dict) -> float | None:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels)


def _sample(what: str, variant: str) -> float:
    """This process's own value of one plugin metric for `variant`, read from that one metric (cheap enough to read
    around every call; the whole registry would cost a millisecond per read)."""
    from tts_predictor import metrics as n
    from tts_predictor import plugin

    pm, shared = plugin._METRICS, plugin._SHARED
    if pm is None or shared is None:
        return 0.0
    ch = plugin.installed_control()
    cm = ch.metrics if ch is not None else None
    source = {"calls": (pm.calls, n.CALLS), "tokens": (pm.tokens, n.TOKENS), "requests": (pm.requests, n.REQUESTS),
              "syncs": (pm.syncs, n.SYNCS), "observed_calls": (pm.observed_calls, n.OBSERVED_CALLS),
              "observed_tokens": (pm.observed_tokens, n.OBSERVED_TOKENS),
              "seconds_count": (pm.seconds, n.SECONDS + "_count"),
              "step_batch_count": (shared["step"].batch, n.STEP_BATCH + "_count"),
              "step_batch_sum": (shared["step"].batch, n.STEP_BATCH + "_sum"),
              "step_interval_count": (shared["step"].interval, n.STEP_INTERVAL + "_count"),
              "step_interval_sum": (shared["step"].interval, n.STEP_INTERVAL + "_sum"),
              "switches": (cm and cm.switches, n.SWITCHES), "active": (cm and cm.active, n.ACTIVE_VARIANT)}[what]
    metric, name = source
    if metric is None:
        return 0.0
    for fam in metric.collect():
        for s in fam.samples:
            if s.name == name and s.labels.get("variant") == variant:
                return s.value
    return 0.0


def _attention_info() -> list:
    from prometheus_client import REGISTRY

    from tts_predictor import metrics as n

    return [dict(s.labels, value=s.value) for fam in REGISTRY.collect() for s in fam.samples
            if s.name == n.ATTENTION_INFO]


if __name__ == "__main__":
    raise SystemExit(main())

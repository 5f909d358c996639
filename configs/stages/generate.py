"""Write the sweep's vllm-omni 0.16.0 stage configs: qwen3_tts_b{8,16,...,256}.yaml, and qwen3_tts_b256_uni.yaml.

The stock `qwen3_tts.yaml` runs both stages with max_batch_size 1 (the talker's max_batch_size becomes the scheduler's
max_num_seqs and the code predictor's local KV-cache batch), so at concurrency C > 1 requests queue and the predictor
variants barely differ. These configs keep every engine setting of the stock file (read from the 0.16.0 wheel: the
two stages, their architectures, schedulers, connectors and sampling defaults) and change only what must follow the
sweep. Regenerate with `python configs/stages/generate.py` (pyyaml); tests/test_docker_files.py checks the files.

Besides max_batch_size, two settings differ from the stock file, each for a reason docs/gpu-host.md restates:
- talker `attention_backend: FLASH_ATTN`: vLLM 0.16.0 tries FlashInfer first on compute capability 10.x (B200/GB200,
  vllm/platforms/cuda.py `_get_backend_priorities`) and FlashInfer's metadata builder reads `seq_lens_cpu`, one
  more device sync per call, so the vectorized variant's zero-sync signature would fail there. FLASH_ATTN is vLLM's
  first choice on every other CUDA GPU (8.x, 9.x), so pinning it changes nothing there. vLLM 0.16.0 has no
  VLLM_ATTENTION_BACKEND variable any more; the engine argument `attention_backend` is the way
  (vllm/engine/arg_utils.py), and vllm-omni passes a stage's engine_args to the engine as they are.
- code2wav `max_num_batched_tokens`: one code2wav chunk is a header token (the number of left-context frames) and
  16 code groups x (25 frames + 25 frames of left context) = 801 tokens (0.16.0
  stage_input_processors/qwen3_tts.py, talker2code2wav_async_chunk: `[ctx_frames] + flat codes`), so the stock 8192
  holds about 10 chunks per step. A talker batch of B requests can have B chunks due in one step (a closed loop
  starts them together), so the budget follows the batch: max(8192, B x 801), rounded up to a multiple of 16. vllm-omni 0.30.0's own qwen3_tts.yaml gives code2wav 65536 tokens at max_num_seqs 64 for the
  same reason (its comment: the codec prefill exceeds the old default).

qwen3_tts_b256_uni.yaml is qwen3_tts_b256.yaml with `distributed_executor_backend: uni` in both stages (stock: mp),
for configs/experiments/executor-016-fixed-mp-vs-uni.yaml: with mp each stage's worker is a process of its own that
the engine core hands every step through a shared-memory queue; uni runs the worker inside the engine core (vllm-omni
#2603/#2604, #3221 measured the single-GPU gain; docs/real-cpu-server.md, "Executor", says why it matters on a CPU).
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere: the repo's packages
from tts_predictor.domain import CHUNK_FRAMES  # noqa: E402

SWEEP = (8, 16, 32, 64, 128, 256)  # powers of two: the talker's CUDA-graph capture sizes align with them
EXECUTOR_FILES = {256: ("uni",)}  # batch -> executors besides the stock mp, each its own file qwen3_tts_b{b}_{executor}
STOCK_EXECUTOR = "mp"
CODE_GROUPS = 16  # Qwen3-TTS-12Hz: 16 codebooks per codec frame
CODEC_LEFT_CONTEXT_FRAMES = 25  # connector extra of the stock 0.16.0 config (below)
CHUNK_HEADER_TOKENS = 1  # the chunk's ctx_frames header ahead of its flat codes (talker2code2wav_async_chunk)
STOCK_CODE2WAV_TOKENS = 8192
ATTENTION_BACKEND = "FLASH_ATTN"


def code2wav_tokens(batch: int) -> int:
    """Token budget of one code2wav step: every request of a full talker batch can hand over one chunk at once."""
    per_chunk = CHUNK_HEADER_TOKENS + CODE_GROUPS * (CHUNK_FRAMES + CODEC_LEFT_CONTEXT_FRAMES)
    need = max(STOCK_CODE2WAV_TOKENS, batch * per_chunk)
    return -(-need // CODE_GROUPS) * CODE_GROUPS
HERE = Path(__file__).resolve().parent
OMNI = "vllm_omni"


def talker(batch: int, executor: str = STOCK_EXECUTOR) -> dict:
    return {
        "stage_id": 0,
        "stage_type": "llm",
        "runtime": {"devices": "0", "max_batch_size": batch},
        "engine_args": {
            "model_stage": "qwen3_tts",
            "model_arch": "Qwen3TTSTalkerForConditionalGeneration",
            "hf_overrides": {"architectures": ["Qwen3TTSTalkerForConditionalGeneration"]},
            "worker_type": "ar",
            "scheduler_cls": f"{OMNI}.core.sched.omni_ar_scheduler.OmniARScheduler",
            "enforce_eager": False,
            "attention_backend": ATTENTION_BACKEND,  # pinned: see the module docstring
            "trust_remote_code": True,
            "async_scheduling": False,
            "enable_prefix_caching": False,
            "engine_output_type": "latent",
            "gpu_memory_utilization": 0.3,
            "distributed_executor_backend": executor,
            # vLLM needs max_num_batched_tokens >= max_num_seqs; 512 (stock) covers every batch of the sweep
            "max_num_batched_tokens": max(512, batch),
            "max_model_len": 4096,
            "custom_process_next_stage_input_func":
                f"{OMNI}.model_executor.stage_input_processors.qwen3_tts.talker2code2wav_async_chunk",
        },
        "output_connectors": {"to_stage_1": "connector_of_shared_memory"},
        "default_sampling_params": {
            "temperature": 0.9, "top_k": 50, "max_tokens": 4096, "seed": 42, "detokenize": False,
            "repetition_penalty": 1.05, "stop_token_ids": [2150],
        },
    }


def code2wav(batch: int, executor: str = STOCK_EXECUTOR) -> dict:
    return {
        "stage_id": 1,
        "stage_type": "llm",
        "runtime": {"devices": "0", "max_batch_size": batch},
        "engine_args": {
            "model_stage": "code2wav",
            "model_arch": "Qwen3TTSCode2Wav",
            "hf_overrides": {"architectures": ["Qwen3TTSCode2Wav"]},
            "worker_type": "generation",
            "scheduler_cls": f"{OMNI}.core.sched.omni_generation_scheduler.OmniGenerationScheduler",
            "enforce_eager": True,
            "trust_remote_code": True,
            "async_scheduling": False,
            "enable_prefix_caching": False,
            "engine_output_type": "audio",
            "gpu_memory_utilization": 0.2,
            "distributed_executor_backend": executor,
            "max_num_batched_tokens": code2wav_tokens(batch),  # stock 8192; follows the batch (module docstring)
            "max_model_len": 32768,
        },
        "engine_input_source": [0],
        "final_output": True,
        "final_output_type": "audio",
        "input_connectors": {"from_stage_0": "connector_of_shared_memory"},
        "tts_args": {"max_instructions_length": 500},
        "default_sampling_params": {
            "temperature": 0.0, "top_p": 1.0, "top_k": -1, "max_tokens": 65536, "seed": 42, "detokenize": True,
            "repetition_penalty": 1.0,
        },
    }


def config(batch: int, executor: str = STOCK_EXECUTOR) -> dict:
    return {
        "async_chunk": True,
        "stage_args": [talker(batch, executor), code2wav(batch, executor)],
        "runtime": {
            "enabled": True,
            "defaults": {"window_size": -1, "max_inflight": 1},
            "connectors": {
                "connector_of_shared_memory": {
                    "name": "SharedMemoryConnector",
                    "extra": {
                        "shm_threshold_bytes": 65536,
                        "codec_streaming": True,
                        "connector_get_sleep_s": 0.01,
                        "connector_get_max_wait_first_chunk": 3000,
                        "connector_get_max_wait": 300,
                        "codec_chunk_frames": CHUNK_FRAMES,
                        "codec_left_context_frames": CODEC_LEFT_CONTEXT_FRAMES,
                    },
                }
            },
            "edges": [{"from": 0, "to": 1, "window_size": -1}],
        },
    }


HEADER = """\
# vllm-omni 0.16.0 stage config for Qwen3-TTS-12Hz-0.6B-Base, sweep step max_batch_size={b}.
# GENERATED by configs/stages/generate.py - edit that file, not this one.
# Identical to the stock qwen3_tts.yaml of 0.16.0 except: both stages max_batch_size={b} (stock 1), so the talker
# batches up to {b} requests (scheduler max_num_seqs={b}) and the code predictor's local KV cache holds {b} rows;
# talker attention_backend {backend} (stock: vLLM's choice, FlashInfer first on Blackwell); code2wav
# max_num_batched_tokens {tokens} (stock 8192 = ~10 chunks of 801 tokens: a header + 800 codes; here one chunk per request of the batch).
# Serve with concurrency <= {b}: above it requests queue in the scheduler and the batch stays at {b}.
"""
EXECUTOR_HEADER = """\
# Both stages distributed_executor_backend {executor} (stock mp): the worker runs inside each stage's engine core.
"""


def render(batch: int, executor: str = STOCK_EXECUTOR) -> str:
    head = HEADER.format(b=batch, backend=ATTENTION_BACKEND, tokens=code2wav_tokens(batch))
    if executor != STOCK_EXECUTOR:
        head += EXECUTOR_HEADER.format(executor=executor)
    return head + yaml.safe_dump(config(batch, executor), sort_keys=False, width=120)


def files() -> dict[str, str]:
    """Every generated file's name and text."""
    out = {f"qwen3_tts_b{b}.yaml": render(b) for b in SWEEP}
    for b, executors in EXECUTOR_FILES.items():
        out.update({f"qwen3_tts_b{b}_{e}.yaml": render(b, e) for e in executors})
    return out


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, text in files().items():
        path = HERE / name
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale stage configs (run python configs/stages/generate.py): {stale}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

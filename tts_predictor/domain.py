"""Facts about the system under test that more than one package needs, defined once (sources: docs/sources.md).

Plain Python, no imports: the load generator, the statistics, the dashboards and the simulator read these without
pulling in torch.
"""

from __future__ import annotations

# The code predictor's build_attn_metadata variants (tts_predictor.variants.VARIANTS has exactly these keys).
VARIANT_NAMES = ("original", "fixed", "vectorized")
# What a server runs when nobody names a variant: the stock 0.16.0 code (plugin, Dockerfile, Makefile, simulator).
DEFAULT_VARIANT = "original"

# Per talker step the code predictor runs 16 codebook groups: 1 prefill (query length 2 per request) and 14 decodes
# (query length 1), each calling build_attn_metadata once [vllm-omni 0.16.0 qwen3_tts_code_predictor_vllm.py].
PREFILL_CALLS_PER_STEP = 1
DECODE_CALLS_PER_STEP = 14
CALLS_PER_STEP = PREFILL_CALLS_PER_STEP + DECODE_CALLS_PER_STEP
PREFILL_QUERY_LEN = 2
DECODE_QUERY_LEN = 1

# Qwen3-TTS-12Hz: 24 kHz PCM16 mono; one codec frame = 1920 samples, so 12.5 frames (talker steps) per audio second.
SAMPLE_RATE_HZ = 24000
SAMPLES_PER_CODEC_FRAME = 1920
CODEC_FRAME_RATE_HZ = SAMPLE_RATE_HZ / SAMPLES_PER_CODEC_FRAME  # 12.5
BYTES_PER_SAMPLE = 2
# vllm-omni 0.16.0 stage config: code2wav decodes codec frames in chunks of 25 (2 s of audio).
CHUNK_FRAMES = 25

MODEL_NAME = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
# The folder name of the real CPU server's tiny random model (cpu_server/serve.py, <cache>/tiny-qwen3-tts-seed<N>):
# /v1/models names it as the model's root, and its answers are 63 codec frames whatever the text, so the load
# generator turns its audio-length check off for it (loadtest.session.fixed_length_model).
TINY_MODEL_PREFIX = "tiny-qwen3-tts"

"""A tiny, randomly initialised Qwen3-TTS 12 Hz Base model folder, built offline from a seed.

`python -m tts_omni_cpu.tiny_model OUT_DIR [--seed 0]` (real-server venv: it needs torch, transformers, tokenizers
and vllm-omni 0.16.0's codec classes). The folder has what vllm-omni 0.16.0 reads for Base voice cloning
(docs/real-cpu-server.md): config.json, model.safetensors with talker, code-predictor and speaker-encoder weights,
a byte-level tokenizer whose prompt framing tokenises like Qwen's, and speech_tokenizer/ made with vllm-omni's own
12 Hz codec classes at the real rates (24 kHz in and out, 1920 samples per 12.5 Hz frame, 16 code groups).
The pipeline is real; the weights are noise, so the audio is noise and practically never ends by itself.
Written into OUT_DIR.tmp and renamed, so a folder that exists is complete; `.seed` records what built it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from tts_predictor.domain import SAMPLE_RATE_HZ as SAMPLE_RATE
from tts_predictor.domain import SAMPLES_PER_CODEC_FRAME as SAMPLES_PER_FRAME

GENERATOR_VERSION = "3"  # bump when the folder's content changes for the same seed
CODE_GROUPS = 16
CODEBOOK = 2048

# the talker's codec vocabulary and special codec ids of the released 12 Hz models (the stock stage file stops on
# 2150, the codec end id)
TALKER_VOCAB = 3072
CODEC = {"codec_pad_id": 2148, "codec_bos_id": 2149, "codec_eos_token_id": 2150, "codec_think_id": 2154,
         "codec_nothink_id": 2155, "codec_think_bos_id": 2156, "codec_think_eos_id": 2157}
LANGUAGES = {"english": 2050, "german": 2053, "spanish": 2054, "chinese": 2055, "japanese": 2058,
             "french": 2061, "korean": 2064, "russian": 2069, "italian": 2070, "portuguese": 2071}

HIDDEN = 64
HEADS, KV_HEADS, HEAD_DIM = 2, 1, 32  # CPU attention takes head sizes 32..256
MROPE_SECTION = [6, 5, 5]  # sums to HEAD_DIM / 2
TALKER_LAYERS, PREDICTOR_LAYERS = 2, 1
INTERMEDIATE = 128

# text tokenizer: 256 byte tokens, the merges that make "assistant" one token, then the special tokens
MERGE_WORD = "assistant"
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"]
TEXT_VOCAB = 320
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _gpt2_bytes() -> list[str]:
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, n = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + n))
            n += 1
    return chars


def build_tokenizer(out: Path) -> dict[str, int]:
    """tokenizer.json + tokenizer_config.json; returns the special token ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(_gpt2_bytes())}
    merges, cur = [], MERGE_WORD[0]
    for ch in MERGE_WORD[1:]:
        merges.append((cur, ch))
        cur += ch
        vocab[cur] = len(vocab)
    first_special = TEXT_VOCAB - 16
    for i in range(len(vocab), first_special):  # placeholders, so the special ids land where config.json says
        vocab[f"<|unused_{i}|>"] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    specials = {s: tok.token_to_id(s) for s in SPECIALS}
    if sorted(specials.values()) != list(range(first_special, first_special + len(SPECIALS))):
        raise SystemExit(f"tiny_model: tokenizer: special ids {specials}")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", unk_token=None, model_max_length=32768)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return specials


def check_tokenizer(out: Path) -> None:
    """The talker cuts its prompt by position: these framings must tokenise to exactly these lengths."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out))
    for text, n in (("<|im_start|>", 1), ("assistant", 1), ("\n", 1), ("<|im_end|>\n<|im_start|>assistant\n", 5)):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) != n:
            raise SystemExit(f"tiny_model: tokenizer: {text!r} is {len(ids)} tokens, want {n}")


def talker_config(specials: dict[str, int]) -> dict:
    predictor = {"vocab_size": CODEBOOK, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
                 "num_hidden_layers": PREDICTOR_LAYERS, "num_attention_heads": HEADS,
                 "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_code_groups": CODE_GROUPS,
                 "max_position_embeddings": 65536, "rope_theta": 1000000, "rms_norm_eps": 1e-6,
                 "hidden_act": "silu", "model_type": "qwen3_tts_talker_code_predictor"}
    talker = {"code_predictor_config": predictor, "vocab_size": TALKER_VOCAB, "hidden_size": HIDDEN,
              "intermediate_size": INTERMEDIATE, "num_hidden_layers": TALKER_LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "num_code_groups": CODE_GROUPS,
              "text_hidden_size": HIDDEN, "text_vocab_size": TEXT_VOCAB, "max_position_embeddings": 32768,
              "rope_theta": 1000000, "rms_norm_eps": 1e-6, "hidden_act": "silu", "position_id_per_seconds": 13,
              "rope_scaling": {"interleaved": True, "mrope_section": MROPE_SECTION, "rope_type": "default",
                               "type": "default"},
              "codec_language_id": LANGUAGES, "spk_id": {}, "spk_is_dialect": {}, "model_type": "qwen3_tts_talker",
              **CODEC}
    speaker = {"mel_dim": 128, "enc_dim": HIDDEN, "enc_channels": [32, 32, 32, 32, 96],
               "enc_kernel_sizes": [5, 3, 3, 3, 1], "enc_dilations": [1, 2, 3, 4, 1], "enc_attention_channels": 16,
               "enc_res2net_scale": 8, "enc_se_channels": 16, "sample_rate": SAMPLE_RATE}
    return {"architectures": ["Qwen3TTSForConditionalGeneration"], "model_type": "qwen3_tts",
            "tokenizer_type": "qwen3_tts_tokenizer_12hz", "tts_model_size": "tiny", "tts_model_type": "base",
            "im_start_token_id": specials["<|im_start|>"], "im_end_token_id": specials["<|im_end|>"],
            "tts_pad_token_id": specials["<tts_pad>"], "tts_bos_token_id": specials["<tts_text_bos>"],
            "tts_eos_token_id": specials["<tts_text_eod>"], "torch_dtype": "bfloat16",
            "talker_config": talker, "speaker_encoder_config": speaker}


def build_generation_config(out: Path) -> None:
    """generation_config.json, as the released checkpoints have: without it vLLM's input processor in the API server
    process falls back to parsing config.json with AutoConfig, which does not know `qwen3_tts` there
    (vllm/transformers_utils/config.py try_get_generation_config), and the server dies at start-up. The values are
    the stock stage file's talker sampling."""
    from transformers import GenerationConfig

    GenerationConfig(do_sample=True, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05,
                     max_new_tokens=4096).save_pretrained(str(out))


def _decoder_layer(prefix: str, hidden: int, inter: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of one Qwen3 decoder layer as the released checkpoints store it (unfused)."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    return {f"{prefix}.self_attn.q_proj.weight": (q, hidden), f"{prefix}.self_attn.k_proj.weight": (kv, hidden),
            f"{prefix}.self_attn.v_proj.weight": (kv, hidden), f"{prefix}.self_attn.o_proj.weight": (hidden, q),
            f"{prefix}.self_attn.q_norm.weight": (HEAD_DIM,), f"{prefix}.self_attn.k_norm.weight": (HEAD_DIM,),
            f"{prefix}.input_layernorm.weight": (hidden,), f"{prefix}.post_attention_layernorm.weight": (hidden,),
            f"{prefix}.mlp.gate_proj.weight": (inter, hidden), f"{prefix}.mlp.up_proj.weight": (inter, hidden),
            f"{prefix}.mlp.down_proj.weight": (hidden, inter)}


def talker_shapes() -> dict[str, tuple[int, ...]]:
    s: dict[str, tuple[int, ...]] = {}
    for i in range(TALKER_LAYERS):
        s.update(_decoder_layer(f"talker.model.layers.{i}", HIDDEN, INTERMEDIATE))
    s["talker.model.norm.weight"] = (HIDDEN,)
    s["talker.model.codec_embedding.weight"] = (TALKER_VOCAB, HIDDEN)
    s["talker.model.text_embedding.weight"] = (TEXT_VOCAB, HIDDEN)
    s["talker.codec_head.weight"] = (TALKER_VOCAB, HIDDEN)
    for n in ("linear_fc1", "linear_fc2"):
        s[f"talker.text_projection.{n}.weight"] = (HIDDEN, HIDDEN)
        s[f"talker.text_projection.{n}.bias"] = (HIDDEN,)
    for i in range(PREDICTOR_LAYERS):
        s.update(_decoder_layer(f"talker.code_predictor.model.layers.{i}", HIDDEN, INTERMEDIATE))
    s["talker.code_predictor.model.norm.weight"] = (HIDDEN,)
    for g in range(CODE_GROUPS - 1):
        s[f"talker.code_predictor.model.codec_embedding.{g}.weight"] = (CODEBOOK, HIDDEN)
        s[f"talker.code_predictor.lm_head.{g}.weight"] = (CODEBOOK, HIDDEN)
    return s


def build_weights(out: Path, cfg: dict, seed: int) -> int:
    """model.safetensors (bf16); returns the parameter count."""
    import torch
    from safetensors.torch import save_file
    from vllm_omni.model_executor.models.qwen3_tts.configuration_qwen3_tts import Qwen3TTSSpeakerEncoderConfig
    from vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_talker import Qwen3TTSSpeakerEncoder

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in talker_shapes().items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shape)
        elif name.endswith(".bias"):
            tensors[name] = torch.zeros(shape)
        else:
            tensors[name] = torch.randn(shape, generator=g) * 0.02
    torch.manual_seed(seed + 1)
    spk = Qwen3TTSSpeakerEncoder(Qwen3TTSSpeakerEncoderConfig(**cfg["speaker_encoder_config"]))
    for name, t in spk.state_dict().items():
        tensors[f"speaker_encoder.{name}"] = t.detach().clone()
    tensors = {k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() for t in tensors.values())


def build_speech_tokenizer(out: Path, seed: int) -> int:
    """speech_tokenizer/: the 12 Hz codec (Mimi encoder + vllm-omni's decoder) at the real rates, tiny widths."""
    import torch
    from transformers import EncodecFeatureExtractor
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Config,
    )
    from vllm_omni.model_executor.models.qwen3_tts.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )

    encoder = {"sampling_rate": SAMPLE_RATE, "frame_rate": 12.5, "hidden_size": 32, "num_filters": 4,
               "num_residual_layers": 1, "upsampling_ratios": [8, 6, 5, 4], "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
               "codebook_size": CODEBOOK, "codebook_dim": 16, "vector_quantization_hidden_dimension": 16,
               "num_quantizers": CODE_GROUPS, "num_semantic_quantizers": 1, "sliding_window": 250,
               "max_position_embeddings": 8000, "use_cache": False, "upsample_groups": 32}
    decoder = {"codebook_size": CODEBOOK, "codebook_dim": 16, "hidden_size": 32, "latent_dim": 32,
               "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 64,
               "num_hidden_layers": 1, "num_quantizers": CODE_GROUPS, "upsample_rates": [8, 5, 4, 3],
               "upsampling_ratios": [2, 2], "decoder_dim": 32, "sliding_window": 72}
    cfg = Qwen3TTSTokenizerV2Config(encoder_config=encoder, decoder_config=decoder,
                                    encoder_valid_num_quantizers=CODE_GROUPS, input_sample_rate=SAMPLE_RATE,
                                    output_sample_rate=SAMPLE_RATE, decode_upsample_rate=SAMPLES_PER_FRAME,
                                    encode_downsample_rate=SAMPLES_PER_FRAME)
    cfg.architectures = ["Qwen3TTSTokenizerV2Model"]
    torch.manual_seed(seed + 2)
    model = Qwen3TTSTokenizerV2Model(cfg)
    _audible(model, seed)
    model.save_pretrained(str(out), safe_serialization=True)
    EncodecFeatureExtractor(feature_size=1, sampling_rate=SAMPLE_RATE, padding_value=0.0,
                            return_attention_mask=True).save_pretrained(str(out))
    return sum(p.numel() for p in model.parameters())


def _audible(model, seed: int, rms: float = 0.1) -> None:
    """Random codebook entries (they start at zero, so every code would decode to silence), then the decoder's last
    convolution scaled so random codes decode to noise at `rms` (a client rightly refuses all-zero PCM16)."""
    import torch

    g = torch.Generator().manual_seed(seed + 4)
    with torch.no_grad():
        for name, p in model.decoder.named_parameters():
            if name.endswith("embedding_sum"):
                p.copy_(torch.randn(p.shape, generator=g))
    codes = torch.randint(0, CODEBOOK, (1, CODE_GROUPS, 25), generator=torch.Generator().manual_seed(seed + 3))
    with torch.no_grad():
        got = float(model.decoder(codes).float().pow(2).mean().sqrt())
        if got <= 0:
            raise SystemExit("tiny_model: speech tokenizer: the decoder's output is exactly zero")
        for p in model.decoder.decoder[-1].parameters():
            p.mul_(rms / got)


def check_speech_tokenizer(out: Path) -> None:
    """Round trip through vllm-omni's own loader: 1 s of audio -> 13 frames of 16 codes -> 13 * 1920 samples."""
    import numpy as np
    from vllm_omni.model_executor.models.qwen3_tts.qwen3_tts_tokenizer import Qwen3TTSTokenizer

    tok = Qwen3TTSTokenizer.from_pretrained(str(out))
    wav = np.sin(np.linspace(0, 440 * 2 * np.pi, SAMPLE_RATE)).astype(np.float32) * 0.1
    codes = tok.encode(wav, sr=SAMPLE_RATE).audio_codes[0]
    frames = -(-SAMPLE_RATE // SAMPLES_PER_FRAME)
    if tuple(codes.shape) != (frames, CODE_GROUPS):
        raise SystemExit(f"tiny_model: speech tokenizer: codes {tuple(codes.shape)}, want ({frames}, {CODE_GROUPS})")
    wavs, sr = tok.decode({"audio_codes": codes})
    if sr != SAMPLE_RATE or len(wavs[0]) != frames * SAMPLES_PER_FRAME:
        raise SystemExit(f"tiny_model: speech tokenizer: decoded {len(wavs[0])} samples at {sr} Hz")
    level = float(np.sqrt(np.mean(np.square(wavs[0]))))
    if not 0.01 < level < 0.9:
        raise SystemExit(f"tiny_model: speech tokenizer: decoded audio at rms {level:.4f}, want audible noise")


def build(out: Path, seed: int) -> dict:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    specials = build_tokenizer(tmp)
    check_tokenizer(tmp)
    cfg = talker_config(specials)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    build_generation_config(tmp)
    n_talker = build_weights(tmp, cfg, seed)
    (tmp / "speech_tokenizer").mkdir()
    n_codec = build_speech_tokenizer(tmp / "speech_tokenizer", seed)
    check_speech_tokenizer(tmp / "speech_tokenizer")
    info = {"generator": GENERATOR_VERSION, "seed": seed, "params_model": n_talker, "params_codec": n_codec}
    (tmp / ".seed").write_text(json.dumps(info) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    return info


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tts_omni_cpu.tiny_model", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    want = {"generator": GENERATOR_VERSION, "seed": args.seed}
    try:
        have = json.loads((args.out / ".seed").read_text())
    except (OSError, ValueError):
        have = {}
    if {k: have.get(k) for k in want} == want:
        print(f"tiny_model: {args.out} is built (seed {args.seed})", file=sys.stderr)
        return 0
    info = build(args.out, args.seed)
    print(f"tiny_model: built {args.out}: {info}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The prediction beside each observed difference: per-call saving x calls per step x steps per request.

The per-call times come from the block counters (host time, plus the simulator's modelled sync stall) or from the
micro benchmark's results.json (the file contract of tools/micro.py); steps per request are codec frames, i.e.
audio seconds x the codec frame rate (tts_predictor.domain).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from loadtest.records import MICRO_SCHEMA
from tts_predictor.domain import CALLS_PER_STEP, CODEC_FRAME_RATE_HZ, DECODE_CALLS_PER_STEP, PREFILL_CALLS_PER_STEP


def read_micro(path: str | Path | None) -> dict[tuple[str, int], float] | None:
    """Mean seconds per build_attn_metadata call by (variant, requests) from `make micro`'s results.json.

    Uses its "rows" (tools/micro.py: scenario, num_reqs, max_seq_len, variant, median_us): a talker step is
    1 prefill + 14 decode calls, so per call = (prefill + 14 x decode) / 15 at the shortest max_seq_len measured;
    decode alone where no prefill row exists. None if the file is absent or has no such rows.
    """
    if not path or not Path(path).exists():
        return None
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if doc.get("schema", MICRO_SCHEMA) != MICRO_SCHEMA:
        raise ValueError(f"{path}: unknown schema {doc.get('schema')!r} (this reader knows {MICRO_SCHEMA!r})")
    rows = doc.get("rows") or []
    rows = [r for r in rows if r.get("scenario") in ("decode", "prefill") and r.get("median_us") is not None]
    if not rows:
        return None
    short = min(r.get("max_seq_len", 16) for r in rows)
    by: dict[tuple[str, int], dict[str, float]] = {}
    for r in rows:
        if r.get("max_seq_len", 16) == short:
            by.setdefault((r["variant"], int(r["num_reqs"])), {})[r["scenario"]] = float(r["median_us"]) * 1e-6
    out = {}
    for key, v in by.items():
        if "decode" in v:
            prefill = v.get("prefill", v["decode"])
            out[key] = (PREFILL_CALLS_PER_STEP * prefill + DECODE_CALLS_PER_STEP * v["decode"]) / CALLS_PER_STEP
    return out or None


def _interp_micro(micro: dict, variant: str, batch: float) -> float | None:
    pts = sorted((n, s) for (v, n), s in micro.items() if v == variant)
    if not pts:
        return None
    xs, ys = zip(*pts, strict=True)
    return float(np.interp(batch, xs, ys))


def prediction(level: str, a_blocks: list[dict], b_blocks: list[dict], variants: dict, micro: dict | None) -> dict:
    """Expected e2e difference at a level: per-call saving x 15 calls/step x steps (= codec frames) per request."""
    def mean_of(blocks, key):
        v = [b["levels"][level][key] for b in blocks if level in b["levels"] and b["levels"][level][key] is not None]
        return float(np.mean(v)) if v else None

    spc_a, spc_b = mean_of(a_blocks, "seconds_per_call"), mean_of(b_blocks, "seconds_per_call")
    source = "counters"
    st_a, st_b = mean_of(a_blocks, "stall_seconds_per_call"), mean_of(b_blocks, "stall_seconds_per_call")
    if spc_a is not None and spc_b is not None and st_a is not None and st_b is not None:
        spc_a, spc_b, source = spc_a + st_a, spc_b + st_b, "counters (host time + simulated sync stall)"
    batch = mean_of(a_blocks, "mean_batch") or float(level)
    if micro:
        ma, mb = _interp_micro(micro, variants.get("A"), batch), _interp_micro(micro, variants.get("B"), batch)
        if ma is not None and mb is not None:
            spc_a, spc_b, source = ma, mb, "micro benchmark"
    audio = mean_of(a_blocks, "audio_s_mean")
    e2e_a = mean_of(a_blocks, "e2e_mean")
    out = {"source": source, "seconds_per_call_a": spc_a, "seconds_per_call_b": spc_b, "mean_batch": batch,
           "frames_per_request": audio * CODEC_FRAME_RATE_HZ if audio else None, "saving_per_call_s": None,
           "e2e_saving_s": None, "e2e_diff_pct": None, "throughput_diff_pct": None}
    if spc_a is None or spc_b is None or not audio or not e2e_a:
        return out
    saving = spc_a - spc_b
    e2e_saving = saving * CALLS_PER_STEP * audio * CODEC_FRAME_RATE_HZ
    out.update(saving_per_call_s=saving, e2e_saving_s=e2e_saving,
               e2e_diff_pct=-100.0 * e2e_saving / e2e_a,  # B vs A, % (negative = B faster)
               throughput_diff_pct=100.0 * (e2e_a / (e2e_a - e2e_saving) - 1.0) if e2e_a > e2e_saving else None)
    return out


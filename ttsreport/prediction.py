"""The predictions beside each observed difference.

1. Per-call saving x calls per step x steps per request: the per-call times come from the window counters (host
   time, plus the simulator's modelled sync stall) or from the micro benchmark's results.json (the file contract of
   tools/micro.py); steps per request are codec frames, i.e. audio seconds x the codec frame rate.
2. For a simulated run, the fitted simulator model's own prediction (ttssim.fit.effect_interval: the virtual engine
   replays the level, pure arithmetic, no server) with an interval from the fit's parameter uncertainty, and the
   fit's one-line fidelity summary (<config>.fit.json beside the simulator config).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tts_predictor.domain import CALLS_PER_STEP, CODEC_FRAME_RATE_HZ, DECODE_CALLS_PER_STEP, PREFILL_CALLS_PER_STEP
from ttsrecords.paths import ROOT
from ttsrecords.records import MICRO_SCHEMA, sim_profile_copy
from ttssim import fit as sim_fit
from ttssim.config import load_config

MODEL_FRAMES = 48  # request lengths (codec frames) of arm A handed to the virtual engine, in the order they ran


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



# ----------------------------------------------------------------------------------------------- the fitted model


def _repo_path(path: str) -> Path:
    p = Path(path)
    return p if p.is_absolute() or p.exists() else ROOT / p


def sim_setup(manifest: dict, run_dir: str | Path | None = None) -> dict | None:
    """The simulator config a simulated run used (arm A's), its overrides and its stored fit; None for a real run.

    Version 1 and the shorthand runs record `sim_config.path` and `settings.sim_set`; an experiment run records each
    arm's `sim_config` and `sim_set` (loadtest.evidence.arm_manifest). The profile and its fit are read from the
    run folder's copy (ttsrecords.records.sim_profile_copy); a folder written before runs carried one falls back to
    this checkout's file, and `from_checkout` says so."""
    arms = ((manifest.get("experiment") or {}).get("arms") or manifest.get("arms") or {})
    arm_a = arms.get("A") if isinstance(arms, dict) else None
    path = sets = None
    if isinstance(arm_a, dict) and arm_a.get("backend") == "sim":
        path, sets = arm_a.get("sim_config"), arm_a.get("sim_set")
    if path is None and isinstance(manifest.get("sim_config"), dict):
        path = manifest["sim_config"].get("path")
    if path is None:
        return None
    sets = list(sets if sets is not None else (manifest.get("settings") or {}).get("sim_set") or [])
    out = {"config": path, "sim_set": sets, "fit": None, "fidelity": None, "reason": None}
    copy = sim_profile_copy(run_dir, path) if run_dir is not None else None
    cfg_path = copy if copy is not None and copy.is_file() else _repo_path(path)
    out["file"], out["from_checkout"] = cfg_path, cfg_path != copy
    if not cfg_path.is_file():
        out["reason"] = f"{path} not found in the run folder or beside this checkout: no model prediction"
        return out
    fit = sim_fit.load_fit(cfg_path)
    if fit is None:
        out["reason"] = (f"{path} has no {sim_fit.FIT_SUFFIX} (an unfitted test profile: its absolute numbers stand for "
                         "no real server)")
        return out
    out["fit"] = fit
    out["fidelity"] = fit.get("fidelity")
    return out


def model_prediction(setup: dict | None, level: str, a_blocks: list[dict], a_requests: list[float],
                     variants: dict) -> dict | None:
    """The fitted model's predicted p50-latency ratio B/A at a level with its interval (from the fit's covariance,
    not from run-to-run noise); None for a real run. `a_requests`: codec frames of arm A's ok measure requests at
    this level in the order they ran (the first MODEL_FRAMES go to the virtual engine)."""
    if setup is None:
        return None
    out = {"source": "fitted simulator model (ttssim.fit.effect_interval, virtual engine)", "config": setup["config"],
           "ratio": None, "ci": None, "pct": None, "reason": setup.get("reason")}
    if setup.get("fit") is None:
        return out
    va, vb = variants.get("A"), variants.get("B")
    if not va or not vb:
        out["reason"] = "an arm has no predictor variant: the model compares variants only"
        return out
    frames = [max(1, round(f)) for f in a_requests[:MODEL_FRAMES]]
    if not frames:
        out["reason"] = "no ok request of arm A at this level"
        return out
    try:
        cfg = load_config(setup.get("file") or _repo_path(setup["config"]), setup.get("sim_set") or [])
        est, lo, hi = sim_fit.effect_interval(sim_fit.fit_from_dict(setup["fit"]), cfg, int(level), frames, va, vb)
    except (ValueError, KeyError) as e:
        out["reason"] = f"model prediction failed: {e}"
        return out
    if not all(math.isfinite(x) for x in (est, lo, hi)):
        out["reason"] = "the model's prediction is not a number at this level"
        return out
    out.update(pct=est, ratio=1.0 + est / 100.0, ci=[1.0 + lo / 100.0, 1.0 + hi / 100.0], frames=len(frames),
               reason=None, note="the virtual engine times each variant's predictor with the H100 function "
                                 "benchmark (ttssim.model), not with this machine's CPU")
    return out

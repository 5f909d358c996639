"""Fidelity benchmark: the simulator against every public number it claims to model.

`python -m tools.fidelity --out reports/bench/fidelity.md [--quick]`

For each public setup (ttssim.public) it starts the real simulator with that setup's profile (configs/sim/), drives
it like the public benchmark did, computes the public benchmark's metrics with the same definitions, and writes a
table: public number, the fitted model's value (ttssim.virtual, no clock), the simulator's measured value, the
residual and the knob it depends on. The client is a small asyncio/httpx version of `vllm bench serve
--backend openai-audio-speech`'s loop (semaphore of c, warm-ups first, request rate inf), written from its
documented behaviour. Timings on a shared machine are noisy: the report records the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import httpx

from tools.bench_sim import ref_audio_uri, scrape
from tools.sim_server import SimServer
from tts_predictor import domain
from tts_predictor import metrics as M
from ttsrecords.paths import ROOT
from ttssim import fit, heldout, public
from ttssim.config import SimConfig, load_config

HEADERS = {"Content-Type": "application/json"}


# --- the vllm bench serve loop -------------------------------------------------------------------------------------
def text_for_frames(frames: int, cfg: SimConfig) -> str:
    """The shortest input the simulator turns into exactly `frames` frames (its length rule: ceil(chars x rate))."""
    a = cfg.audio
    if frames <= a.min_frames:
        return "x"
    n = max(1, int(frames / a.frames_per_char) - 2)
    while math.ceil(n * a.frames_per_char) < frames:
        n += 1
    if math.ceil(n * a.frames_per_char) != frames:
        raise ValueError(f"no input length gives {frames} frames at {a.frames_per_char} frames per character")
    return ("The quick brown fox jumps over the lazy dog. " * (n // 45 + 1))[:n]


@dataclass
class Result:
    ok: bool
    ttfp_s: float
    e2e_s: float
    audio_s: float


async def one(client: httpx.AsyncClient, url: str, body: bytes) -> Result:
    """One streaming request timed like vllm bench's openai-audio-speech client: TTFP at the first non-empty chunk,
    latency at the end of the body, audio seconds from the PCM byte count."""
    t0 = time.perf_counter()
    ttfp, nbytes = 0.0, 0
    try:
        async with client.stream("POST", url + "/v1/audio/speech", content=body, headers=HEADERS) as r:
            if r.status_code != 200:
                await r.aread()
                return Result(False, 0.0, time.perf_counter() - t0, 0.0)
            async for chunk in r.aiter_raw():
                if chunk and not ttfp:
                    ttfp = time.perf_counter() - t0
                nbytes += len(chunk)
    except httpx.HTTPError:
        return Result(False, 0.0, time.perf_counter() - t0, 0.0)
    return Result(True, ttfp, time.perf_counter() - t0, nbytes / domain.BYTES_PER_SAMPLE / domain.SAMPLE_RATE_HZ)


async def bench(url: str, bodies: list[bytes], concurrency: int, warmups: int) -> tuple[list[Result], float, dict,
                                                                                          dict]:
    """Warm-ups (the first body, all finished first), then every body with at most `concurrency` in flight."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as s:
        sem = asyncio.Semaphore(concurrency)

        async def limited(body):
            async with sem:
                return await one(s, url, body)

        if warmups:
            await asyncio.gather(*(limited(bodies[0]) for _ in range(warmups)))
        before = await scrape(s, url)
        t0 = time.perf_counter()
        results = await asyncio.gather(*(limited(b) for b in bodies))
        duration = time.perf_counter() - t0
        after = await scrape(s, url)
    return list(results), duration, before, after


def level_metrics(results: list[Result], duration: float) -> dict[str, float]:
    ok = [r for r in results if r.ok and r.audio_s > 0]
    if not ok:
        return {"errors": len(results)}
    return {
        "ttfp_p50": 1e3 * statistics.median(r.ttfp_s for r in ok),
        "rtf_p50": statistics.median(r.e2e_s / r.audio_s for r in ok),
        "audio_tput": sum(r.audio_s for r in ok) / duration,
        "req_tput": len(ok) / duration,
        "e2e_p50": 1e3 * statistics.median(r.e2e_s for r in ok),
        "errors": len(results) - len(ok),
    }


def clock(before: dict, after: dict, variant: str) -> dict[str, float]:
    """Step clock of the window: mean step interval (ms) and mean batch, from the plugin-compatible metrics."""
    lab = f'{{variant="{variant}"}}'
    n = after.get(M.STEP_INTERVAL + "_count" + lab, 0.0) - before.get(M.STEP_INTERVAL + "_count" + lab, 0.0)
    t = after.get(M.STEP_INTERVAL + "_sum" + lab, 0.0) - before.get(M.STEP_INTERVAL + "_sum" + lab, 0.0)
    bn = after.get(M.STEP_BATCH + "_count" + lab, 0.0) - before.get(M.STEP_BATCH + "_count" + lab, 0.0)
    bs = after.get(M.STEP_BATCH + "_sum" + lab, 0.0) - before.get(M.STEP_BATCH + "_sum" + lab, 0.0)
    late = after.get(M.SIM_LATE_STEPS, 0.0) - before.get(M.SIM_LATE_STEPS, 0.0)
    return {"step_ms": 1e3 * t / n if n else float("nan"), "batch": bs / bn if bn else float("nan"),
            "steps": bn, "late": late}


def bodies_for(frames: list[int], cfg: SimConfig, ref: str) -> list[bytes]:
    return [json.dumps({"input": text_for_frames(f, cfg), "model": cfg.model.name, "task_type": "Base",
                        "ref_audio": ref, "ref_text": "A reference.", "language": "English", "stream": True,
                        "response_format": "pcm"}).encode() for f in frames]


# --- the setups -------------------------------------------------------------------------------------------------
def run_ci(quick: bool, ref: str, log) -> dict:
    profile = "configs/sim/" + public.CI_SETUP.profile
    cfg = load_config(ROOT / profile)
    variant = public.CI_SETUP.variants[0]
    levels = ((1, 5, 2), (8, 16, 8)) if quick else public.CI_SETUP.levels
    out = {}
    for c, n, w in levels:
        frames = [public.CI_FRAMES[i % len(public.CI_FRAMES)] for i in range(n)]
        with SimServer(variant, config=profile) as sim:
            res, dur, before, after = asyncio.run(bench(sim.url, bodies_for(frames, cfg, ref), c, w))
        out[c] = level_metrics(res, dur) | clock(before, after, variant)
        log(f"ci c={c}: {out[c]}")
    # [4855]: the step time at batch 64 (64 short requests at once, all in the talker's batch)
    with SimServer(variant, config=profile) as sim:
        frames = [40] * 64
        res, dur, before, after = asyncio.run(bench(sim.url, bodies_for(frames, cfg, ref), 64, 0))
    out["b64"] = clock(before, after, variant)
    log(f"ci batch 64: {out['b64']}")
    return out


def run_seed(quick: bool, ref: str, log) -> dict:
    profile = "configs/sim/" + public.SEED_SETUP.profile
    cfg = load_config(ROOT / profile)
    stored = fit.load_fit(ROOT / profile)
    frames = list(fit.seed_frames(stored["seed_mean_frames"][0]))
    runs = 1 if quick else public.SEED_SETUP.runs
    out: dict[str, list[dict]] = {v: [] for v in public.SEED_SETUP.variants}
    for i in range(runs):
        order = public.SEED_SETUP.variants if i % 2 == 0 else public.SEED_SETUP.variants[::-1]
        for variant in order:
            with SimServer(variant, config=profile) as sim:
                res, dur, before, after = asyncio.run(bench(sim.url, bodies_for(frames, cfg, ref), 8, 0))
            out[variant].append(level_metrics(res, dur) | clock(before, after, variant))
            log(f"seed run {i} {variant}: {out[variant][-1]}")
    return out


# --- the report -------------------------------------------------------------------------------------------------
def pct(model: float, pub: float) -> str:
    return f"{100 * (model / pub - 1):+.0f} %" if pub and not math.isnan(model) else "—"


def fmt(v: float, metric: str) -> str:
    if isinstance(v, float) and math.isnan(v):
        return "—"
    return f"{v:.3f}" if metric in ("rtf_p50", "req_tput") else f"{v:.1f}" if metric != "ttfp_p50" else f"{v:.0f}"


# Stated tolerance of the simulator against a public number: 30 % for the CI (its own points drift 1-29 % between
# June and July, and the fit weights them at 10 %), 10 % for the seed run (its runs spread 2-7 %).
TOLERANCE = {"ci-1.7b": 30.0, "seed-0.6b-b8": 10.0}
# Why a point is outside its tolerance, where the model cannot reach it (docs/simulator.md, "what it misses").
NOTES = {
    (8, "rtf_p50"): "the one decoder's queue is short at c=8; the CI is slower there than the model's step allows",
    (16, "ttfp_p50"): "the JSON value is June's x 0.95",
    (64, "step_ms"): "#4855 names neither model nor version; the CI profile's step at batch 64",
}


SHORT = {"ttfp_p50": "p50 TTFP", "rtf_p50": "p50 RTF", "audio_tput": "audio throughput", "step_ms": "step time"}
UNITS = {"ttfp_p50": "p50 TTFP ms", "rtf_p50": "p50 RTF", "audio_tput": "audio-s/s", "req_tput": "req/s",
         "e2e_p50": "p50 E2E ms", "step_ms": "ms per talker step"}


def render(args, ci: dict, seed: dict, f: dict, started: str, secs: float, load_before, load_after) -> tuple[str,
                                                                                                           dict]:
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    lines = [
        "# Simulator fidelity: ttssim against every public number it models",
        "",
        f"Generated by `python -m tools.fidelity {' '.join(args.argv)}` on {started} (UTC), git {rev.strip() or '?'}, "
        f"{platform.machine()}, {len(os.sched_getaffinity(0))} CPUs, {secs:.0f} s in all. Load average before "
        f"{' '.join(load_before)}, after {' '.join(load_after)}"
        + (" (busy: other work shared the cores; timings are noisy)." if float(load_before[0]) > 1.5 else "."),
        "",
        "Columns: **public** = the published number (source below the table); **model** = the fitted step-time "
        "model replayed without a clock (ttssim.virtual, the fit's own prediction); **sim** = this run of the real "
        "simulator process (`python -m ttssim`, HTTP, real predictor variant, wall clock); **resid** = sim vs "
        "public. Metric definitions are vllm-omni's benchmark client's (`vllm bench serve --omni --backend "
        "openai-audio-speech`): TTFP = send to first non-empty PCM chunk, RTF = a request's latency over its audio "
        "seconds, audio throughput = summed audio seconds / benchmark duration, medians over requests; warm-ups "
        "max(2, c) excluded. Fit: `python -m ttssim.fit --public --write`; sources and setup in docs/simulator.md.",
        "",
        "## vllm-omni CI: Qwen3-TTS 1.7B-Base on 2x H100 (profile `configs/sim/h100-1.7b-ci.yaml`, variant "
        "`vectorized`)",
        "",
        f"Tolerance: ±{TOLERANCE['ci-1.7b']:.0f} % (the CI's own points drift 1-29 % between June and July).",
        "",
        "| c | metric | public | model | sim | resid (sim) | resid (model) | in tolerance | fitted | source | "
        "depends on | note |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    worst: dict[str, float] = {}
    for p, m in zip(public.CI_POINTS, f["ci_pred"], strict=True):
        if p.metric == "step_ms":
            s = ci.get("b64", {}).get("step_ms", float("nan"))
        else:
            s = ci.get(p.level, {}).get(p.metric, float("nan"))
        if p.fit and not math.isnan(s):
            worst[p.metric] = max(worst.get(p.metric, 0.0), abs(100 * (s / p.value - 1)))
        ok = not math.isnan(s) and abs(100 * (s / p.value - 1)) <= TOLERANCE[p.setup]
        note = "" if ok else NOTES.get((p.level, p.metric), "")
        if not p.fit:
            note = (note + "; " if note else "") + "JSON baseline kept from June (0.95 x June average), not fitted"
        lines.append(f"| {p.level} | {UNITS[p.metric]} | {fmt(p.value, p.metric)} | {fmt(m, p.metric)} | "
                     f"{fmt(s, p.metric)} | {pct(s, p.value)} | {pct(m, p.value)} | "
                     f"{'—' if math.isnan(s) else 'yes' if ok else 'NO'} | {'yes' if p.fit else 'no'} | "
                     f"{p.source} | {public.METRIC_KNOBS[p.metric]} | {note} |")
    lines += ["", "Step clock of the simulator in these runs (tts_predictor_step_interval_seconds / "
              "tts_predictor_step_batch_size, the metrics the vLLM plugin exports):", "",
              "| c | mean step ms | mean batch | steps | late steps | errors |", "|---|---|---|---|---|---|"]
    for c, r in ci.items():
        lines.append(f"| {'64, all sent at once' if c == 'b64' else c} | {r.get('step_ms', float('nan')):.1f} | {r.get('batch', float('nan')):.1f} | "
                     f"{r.get('steps', 0):.0f} | {r.get('late', 0):.0f} | {r.get('errors', 0)} |")
    lines += ["", "Structure: the talker admits up to 64 requests and code2wav is one decoder that takes chunks one at "
              "a time (vllm-omni 0.24.0's high-concurrency deploy profile; docs/simulator.md says why). The same "
              "profile under the suite's own Locust run and prompts, c=1 and c=16: reports/bench/ci-locust.md "
              "(`python -m tools.ci_locust`)."]
    # seed
    lines += ["", "## Seed E2E run: 0.6B-Base, vllm-omni 0.16.0, batch 8, c=8, 24 requests x 3 runs "
              "(profile `configs/sim/h100-0.6b-b8.yaml`)", "",
              f"Tolerance: ±{TOLERANCE['seed-0.6b-b8']:.0f} % (the seed's runs spread 2-7 %).", "",
              "| variant | metric | public | model | sim (runs) | sim mean | resid (sim) | resid (model) | in tolerance |",
              "|---|---|---|---|---|---|---|---|---|"]
    seed_means = {}
    for p, m in zip(public.SEED_POINTS, f["seed_pred"], strict=True):
        if p.metric == "effect_e2e_pct":
            continue
        runs = [r.get(p.metric, float("nan")) for r in seed.get(p.variant, [])]
        mean = statistics.fmean(runs) if runs else float("nan")
        seed_means[(p.variant, p.metric)] = mean
        worst[p.metric] = max(worst.get(p.metric, 0.0), abs(100 * (mean / p.value - 1)))
        lines.append(f"| {p.variant} | {UNITS[p.metric]} | {fmt(p.value, p.metric)} | {fmt(m, p.metric)} | "
                     f"{', '.join(fmt(x, p.metric) for x in runs)} | {fmt(mean, p.metric)} | {pct(mean, p.value)} | "
                     f"{pct(m, p.value)} | "
                     f"{'yes' if abs(100 * (mean / p.value - 1)) <= TOLERANCE[p.setup] else 'NO'} |")
    eff_pub = public.SEED_POINTS[-1].value
    sim_eff = float("nan")
    if ("original", "e2e_p50") in seed_means and ("fixed", "e2e_p50") in seed_means:
        sim_eff = 100 * (seed_means[("fixed", "e2e_p50")] / seed_means[("original", "e2e_p50")] - 1)
    stored = fit.load_fit(ROOT / "configs/sim/h100-0.6b-b8.yaml")
    res = fit.fit_from_dict(stored)
    cfg = load_config(ROOT / "configs/sim/h100-0.6b-b8.yaml")
    frames = fit.seed_frames(stored["seed_mean_frames"][0])
    est, lo, hi = fit.effect_interval(res, cfg, 8, frames)
    lines += ["", f"Fixed vs original, p50 E2E at c=8: public **{eff_pub:+.1f} %** (within its noise, about ±4 %); "
              f"model **{est:+.1f} %** [95 % interval from the fit's parameter uncertainty {lo:+.1f} .. {hi:+.1f} %]; "
              f"this simulator run **{sim_eff:+.1f} %** (mean of the runs above; run-to-run noise applies). "
              f"The seed's request lengths are not published: the fit puts them at "
              f"{stored['seed_mean_frames'][0]:.0f} ± {stored['seed_mean_frames'][1]:.0f} frames "
              f"({stored['seed_mean_frames'][0] / domain.CODEC_FRAME_RATE_HZ:.1f} s of audio)."]
    # the mission question on the default profile
    dcfg = load_config(ROOT / "configs/sim/default.yaml")
    dfit = fit.fit_from_dict(fit.load_fit(ROOT / "configs/sim/default.yaml"))
    lines += ["", "## The mission's question on the default profile (`configs/sim/default.yaml`, batch = c)", "",
              "Closed loop, the seed-fitted request lengths, 3c requests; model only (the interval is the fit's "
              "parameter uncertainty, not run-to-run noise).", "",
              "| c | fixed vs original p50 E2E (model) | 95 % interval (fit uncertainty) |", "|---|---|---|"]
    for c in (8, 64):
        e, lo2, hi2 = fit.effect_interval(dfit, dcfg, c, frames, requests=3 * c)
        lines.append(f"| {c} | {e:+.1f} % | {lo2:+.1f} .. {hi2:+.1f} % |")
    summary = {
        "ci": "SIMULATED -- sim vs vllm-omni CI (1.7B-Base, H100, c=1-64): "
              + ", ".join(f"{SHORT[k]} within ±{v:.0f} %" for k, v in worst.items()
                          if k in ("audio_tput", "rtf_p50", "ttfp_p50", "step_ms")),
        "seed": f"SIMULATED -- sim vs seed run (0.6B-Base, 0.16.0, c=8): req/s within "
                f"±{worst.get('req_tput', float('nan')):.0f} %, p50 E2E within ±{worst.get('e2e_p50', float('nan')):.0f} "
                f"%; fixed vs original {sim_eff:+.1f} % (public {eff_pub:+.1f} %, model {est:+.1f} % "
                f"[{lo:+.1f}, {hi:+.1f}])",
    }
    lines += ["", *cpu_section(), ""]
    lines += ["## Fidelity in one line (stored in reports/bench/fidelity.json for the report's banner)", "",
              f"- {summary['ci']}", f"- {summary['seed']}", ""]
    return "\n".join(lines), summary


CPU_METRICS = (("ttfa_p50", "p50 TTFA"), ("ttfa_p90", "p90 TTFA"), ("rtf_p50", "p50 RTF"),
               ("audio_tput", "audio s/s"), ("req_tput", "req/s"), ("mean_batch", "batch/step"))


def cpu_section(path: Path = heldout.PATH) -> list[str]:
    """The simulator against a real server it was not fitted on (the vllm-omni 0.16.0 CPU server): the residuals
    of every level from the committed comparison (tools/sim_vs_real.py writes it; read, not rerun, here)."""
    head = ["## Simulator vs the real server on CPU (held-out levels)", ""]
    try:
        res = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        return head + [f"Not measured: {shown} is missing (`make sim-vs-real`)."]
    fit_levels = ",".join(map(str, res["fit_levels"]))
    held = [r["concurrency"] for r in res["rows"] if r["held_out"]]
    lines = head + [
        f"`{res['config']}` fitted on c = {fit_levels} of a real run (`{res['run']}`: the REAL vllm-omni 0.16.0 "
        "server on this CPU, tiny random model, the suite's Locust), compared with the same run at the levels the "
        f"fit never saw (c = {', '.join(map(str, held))}). Commands: `flock /tmp/tts-real-server.lock bash "
        f"tools/measure_cpu_levels.sh <folder>`, `python -m ttssim.fit {res['run']} --levels {fit_levels} "
        f"--whole-step --noise --ttfa --base configs/sim/cpu-tiny-stage.yaml --out {res['config']}`, `make "
        "sim-vs-real`; the whole table: reports/bench/sim-vs-cpu.md. Residual = sim / real - 1.", "",
        "| c | fit / held out | " + " | ".join(label for _, label in CPU_METRICS) + " |",
        "|---|---|" + "---|" * len(CPU_METRICS)]
    for r in res["rows"]:
        cells = [f"{r['residual_pct'][k]:+.0f} %" for k, _ in CPU_METRICS]
        lines.append(f"| {r['concurrency']} | {'held out' if r['held_out'] else 'fit'} | " + " | ".join(cells) + " |")
    lines += ["", f"Largest held-out residual: {res[heldout.KEY]:.0f} % (target ±15 %)."]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.fidelity", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="reports/bench/fidelity.md")
    p.add_argument("--quick", action="store_true", help="CI levels 1 and 8 with few requests, one seed run")
    args = p.parse_args(argv)
    args.argv = argv if argv is not None else sys.argv[1:]
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    t0 = time.perf_counter()

    def log(msg):
        print(msg, flush=True)

    ref = ref_audio_uri()
    f = fit.public_fits()
    ci = run_ci(args.quick, ref, log)
    seed = run_seed(args.quick, ref, log)
    load_after = Path("/proc/loadavg").read_text().split()[:3]
    md, summary = render(args, ci, seed, f, started, time.perf_counter() - t0, load_before, load_after)
    out = ROOT / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(md, encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps({"summary": summary, "ci": {str(k): v for k, v in ci.items()},
                                                    "seed": seed}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

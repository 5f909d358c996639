"""The simulator against the real vllm-omni CPU server it was not fitted on: per level, the measured run's p50/p90
time to first audio, p50 RTF, audio throughput, requests per second and batch per step, beside what the virtual
engine (ttssim.virtual) predicts with a profile fitted by ttssim.fit on some levels only; residual = sim/real - 1.

`python -m tools.sim_vs_real [--run reports/bench/sim-vs-cpu/real] [--config configs/sim/cpu-tiny.yaml]` writes
reports/bench/sim-vs-cpu.md and reports/bench/sim-vs-cpu.json (the held-out figure the SIMULATED banners quote,
ttssim.heldout). Reads only stored files: no server, no clock.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tts_predictor import domain
from tts_predictor import metrics as M
from ttsrecords.paths import ROOT
from ttsrecords.records import read_requests
from ttsrecords.samples import stored_total
from ttssim import fit, heldout, realfit, virtual
from ttssim.config import load_config

METRICS = ("ttfa_p50", "ttfa_p90", "rtf_p50", "audio_tput", "req_tput", "mean_batch")
LABELS = {"ttfa_p50": "p50 TTFA s", "ttfa_p90": "p90 TTFA s", "rtf_p50": "p50 RTF", "audio_tput": "audio s/s",
          "req_tput": "req/s", "mean_batch": "batch/step"}
TOLERANCE_PCT = 15.0


quantile = realfit.quantile  # nearest rank, the same rule for the measured and the simulated requests


def closed_loop_rate(c: int, e2e_s: list[float]) -> float:
    """Requests per second of a closed loop of c clients without think time: c / mean E2E (Little's law). The same
    formula on both sides; counting a window's requests over their span would mix the window's edges (the real
    run's in-flight drain, the virtual run's empty start) into the rate."""
    return c * len(e2e_s) / sum(e2e_s)


def _batch(run: Path) -> dict[int, float]:
    """Mean batch per talker step in each level's measure window, from the step clock's counter snapshots."""
    edges: dict[int, dict[str, dict]] = {}
    for line in (run / "counters.jsonl").read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        if r.get("kind") == "snapshot" and r.get("ok", True) and r.get("edge") in ("start", "end"):
            edges.setdefault(r["concurrency"], {})[r["edge"]] = r["samples"]
    out = {}
    for c, e in edges.items():
        if "start" in e and "end" in e:
            d = {k: (stored_total(e["end"], M.STEP_BATCH + k) or 0.0) - (stored_total(e["start"], M.STEP_BATCH + k) or 0.0)
                 for k in ("_sum", "_count")}
            out[c] = d["_sum"] / d["_count"] if d["_count"] else float("nan")
    return out


def real_levels(run: Path) -> dict[int, dict]:
    """Measured metrics per level: the ok requests started in the measure phase."""
    recs = [r for r in read_requests(run / "requests.jsonl") if r.ok and r.phase == "measure"]
    batch = _batch(run)
    out = {}
    for c in sorted({r.concurrency for r in recs}):
        rs = [r for r in recs if r.concurrency == c]
        req = closed_loop_rate(c, [r.e2e_s for r in rs])
        out[c] = {"n": len(rs), "frames": [max(1, round(r.audio_s * domain.CODEC_FRAME_RATE_HZ)) for r in rs],
                  "ttfa_p50": quantile([r.ttfa_s for r in rs], 0.5), "ttfa_p90": quantile([r.ttfa_s for r in rs], 0.9),
                  "rtf_p50": quantile([r.rtf for r in rs], 0.5), "audio_tput": req * sum(r.audio_s for r in rs) / len(rs),
                  "req_tput": req, "mean_batch": batch.get(c, float("nan"))}
    return out


def sim_level(cfg, c: int, n: int, frames: list[int]) -> dict:
    """The virtual engine's closed loop at c over the measured lengths (virtual.closed_loop: n requests, or, for a
    profile with host noise, enough requests and seeds that the quantiles are the model's)."""
    runs = virtual.closed_loop(cfg, c, frames, n, "fixed", realfit.no_host_time)
    out = [o for r in runs for o in r.outcomes]
    fps = domain.CODEC_FRAME_RATE_HZ
    audio = [o.frames / fps for o in out]
    req = closed_loop_rate(c, [o.e2e_s for o in out])
    steps = sum(r.steps for r in runs)
    return {"ttfa_p50": quantile([o.ttfa_s for o in out], 0.5),
            "ttfa_p90": quantile([o.ttfa_s for o in out], 0.9),
            "rtf_p50": quantile([o.e2e_s / a for o, a in zip(out, audio, strict=True)], 0.5),
            "audio_tput": req * sum(audio) / len(audio), "req_tput": req,
            "mean_batch": sum(r.batch_sum for r in runs) / steps if steps else float("nan")}


def compare(run: Path, config: Path) -> dict:
    stored = fit.load_fit(config) or {}
    fit_levels = stored.get("levels") or []
    cfg = load_config(config)
    rows = []
    for c, real in real_levels(run).items():
        sim = sim_level(cfg, c, real["n"], real["frames"])
        rows.append({"concurrency": c, "held_out": c not in fit_levels, "requests": real["n"],
                     "real": {k: real[k] for k in METRICS}, "sim": sim,
                     "residual_pct": {k: 100.0 * (sim[k] / real[k] - 1.0) for k in METRICS}})
    held = [abs(v) for r in rows if r["held_out"] for v in r["residual_pct"].values()]
    return {"run": str(run.relative_to(ROOT)), "config": str(config.relative_to(ROOT)), "fit_levels": fit_levels,
            "fit": {k: stored[k] for k in ("names", "values", "sd")},
            "rows": rows, heldout.KEY: round(max(held), 1) if held else None, "tolerance_pct": TOLERANCE_PCT}


def markdown(res: dict, host_load: str) -> str:
    lines = ["# Simulator vs the real server on CPU", "",
             "SIMULATED numbers (the virtual engine of ttssim with a profile fitted on some levels) beside the REAL "
             "vllm-omni 0.16.0 server on this CPU (tiny random Qwen3-TTS, `BACKEND=vllm-cpu`, variant fixed, "
             "streaming, 63 codec frames = 5.04 s of audio per request), measured by the suite's Locust load "
             "generator. Residual = sim/real - 1.", "",
             "Commands (in this order):", "",
             "```",
             "flock /tmp/tts-real-server.lock bash tools/measure_cpu_levels.sh reports/sim-vs-cpu-raw  "
             "# then copy run/ to " + res["run"],
             "python -m ttssim.fit " + res["run"] + " --levels " + ",".join(map(str, res["fit_levels"]))
             + " --whole-step --noise --ttfa --base configs/sim/cpu-tiny-stage.yaml --out " + res["config"],
             "python -m tools.sim_vs_real   # or: make sim-vs-real",
             "```", "",
             f"Fit levels: c = {', '.join(map(str, res['fit_levels']))}. Held-out levels: c = "
             + ", ".join(str(r["concurrency"]) for r in res["rows"] if r["held_out"]) + ". Host load during the "
             f"measurement (`uptime`, the box is shared): {host_load}.", "",
             "| c | fit/held out | requests | " + " | ".join(f"{LABELS[k]} real / sim / resid" for k in METRICS) + " |",
             "|---|---|---|" + "---|" * len(METRICS)]
    for r in res["rows"]:
        cells = [f"{r['real'][k]:.3g} / {r['sim'][k]:.3g} / {r['residual_pct'][k]:+.0f} %" for k in METRICS]
        lines.append(f"| {r['concurrency']} | {'held out' if r['held_out'] else 'fit'} | {r['requests']} | "
                     + " | ".join(cells) + " |")
    worst = res[heldout.KEY]
    miss = [(r["concurrency"], LABELS[k], v) for r in res["rows"] if r["held_out"]
            for k, v in r["residual_pct"].items() if abs(v) > res["tolerance_pct"]]
    lines += ["", f"Largest held-out residual: {worst:.0f} % (target ±{res['tolerance_pct']:.0f} %)."]
    if miss:
        lines.append("Misses: " + "; ".join(f"c={c} {lab} {v:+.0f} %" for c, lab, v in miss) + ".")
    else:
        lines.append("Every held-out point is within the target.")
    f = dict(zip(res["fit"]["names"], zip(res["fit"]["values"], res["fit"]["sd"], strict=True), strict=True))
    sd, hold, c2w = f["step_noise_sd"], f["step_noise_hold_s"], f["code2wav_chunk_ms"]
    lines += ["", "## What the model assumes, and what a miss would need", "",
              "- The profile is the engine's step model (step = base_ms + per_request_ms x batch, FIFO admission up to "
              "the stage file's max_batch_size 4, one codec frame per running request per step, a 25-frame first "
              "chunk) with the predictor's measured time kept inside the step (`--whole-step`): on this box the "
              "talker, code2wav and the API server share 2 cores, and that sharing shows up as the per-request "
              "slope of the step (code2wav decodes every running request's chunks on the same cores). No separate "
              "CPU-sharing term was needed at these levels.",
              f"- Host noise (`--noise`, ttssim.model.StepNoise): the real p90 time to first audio is 14-29 % above "
              f"its p50 and the real end-to-end latency spreads as much, while a noiseless closed loop gives every "
              f"request at a level the same steps (p90 on p50: the previous page's worst miss, -18 % at c=2). A "
              f"mean-1 lognormal factor on the modelled step, held for a stretch of engine time, stands for the "
              f"slow and fast stretches of a shared host; fitted to ln(p90/p50) of TTFA and E2E at the fit levels "
              f"(each over its bootstrap sd): log sd {sd[0]:.3f} +- {sd[1]:.3f}, held {hold[0]:g} s (chosen from "
              f"{', '.join(f'{h:g}' for h in realfit.NOISE_HOLDS_S)} s: a spread that a request's own 63 steps would "
              f"average away needs a hold of about a request's length or more). The simulated quantiles pool "
              f"{len(virtual.NOISE_SEEDS)} seeds x {virtual.NOISE_REQUESTS} requests, so they are the model's; the "
              f"real ones come from 15-54 requests a level and carry their own sampling error (at c=1 the p90 is the "
              f"14th of 15 requests).",
              f"- `code2wav_chunk_ms` (`--ttfa`) is not identified here: {c2w[0]:.0f} +- {c2w[1]:.0f} ms (the first "
              f"audio is 25 talker steps after the request, and c=1 and c=4 pull the p50 apart); a value of 0 or "
              f"151.5 ms (the public profiles' value when this was fitted) moves no held-out residual past 12 %. The "
              f"profile has no code2wav decoder queue (`code2wav_decode_first_ms` / `code2wav_decode_ms` 0): at "
              f"these levels the CPU's code2wav shows up in the step's per-request slope instead.",
              "- Throughput (req/s, audio s/s) is c / mean E2E on both sides (Little's law for a closed loop without "
              "think time), so a window's edges do not enter the rate.",
              "- The measurement ran on a shared box (host load in the header): the c=8 step was about 5 % slower "
              "than the c=4 fit predicts at the same batch, which is where the simulated c=8 throughput's excess "
              "comes from."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.sim_vs_real", description=__doc__.splitlines()[0])
    p.add_argument("--run", default="reports/bench/sim-vs-cpu/real", help="the real server's run folder")
    p.add_argument("--config", default="configs/sim/cpu-tiny.yaml", help="the fitted profile (its .fit.json has levels)")
    p.add_argument("--out", default="reports/bench/sim-vs-cpu.md")
    p.add_argument("--json", default=str(heldout.PATH.relative_to(ROOT)), help="the figures, for the banners")
    args = p.parse_args(argv)
    run, config = (ROOT / args.run).resolve(), (ROOT / args.config).resolve()
    try:
        if not (run / "requests.jsonl").is_file():
            raise ValueError(f"{args.run}: no requests.jsonl")
        res = compare(run, config)
        loads = [f.read_text().split("load average:")[1].strip() for f in sorted(run.glob("host-load-*.txt"))]
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"tools.sim_vs_real: {e}", file=sys.stderr)
        return 2
    text = markdown(res, " -> ".join(reversed(loads)) if loads else "not recorded")
    out = ROOT / args.out
    out.write_text(text, encoding="utf-8")
    heldout.write(res, ROOT / args.json)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

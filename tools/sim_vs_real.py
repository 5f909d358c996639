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
import math
import sys
from pathlib import Path

from tts_predictor import domain
from tts_predictor import metrics as M
from ttsrecords.records import read_requests
from ttsrecords.samples import stored_total
from ttssim import fit, heldout, virtual
from ttssim.config import load_config

REPO = Path(__file__).resolve().parent.parent
METRICS = ("ttfa_p50", "ttfa_p90", "rtf_p50", "audio_tput", "req_tput", "mean_batch")
LABELS = {"ttfa_p50": "p50 TTFA s", "ttfa_p90": "p90 TTFA s", "rtf_p50": "p50 RTF", "audio_tput": "audio s/s",
          "req_tput": "req/s", "mean_batch": "batch/step"}
TOLERANCE_PCT = 15.0


def quantile(values, q: float) -> float:
    """Nearest-rank quantile (the same rule for the measured and the simulated requests)."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))] if v else float("nan")


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
    """The virtual engine's closed loop at c: c warm-up requests, then n measured ones with the measured lengths."""
    r = virtual.run(cfg, virtual.Workload(c, n, tuple(frames), c), "fixed", fit.no_host_time)
    fps = domain.CODEC_FRAME_RATE_HZ
    audio = [o.frames / fps for o in r.outcomes]
    req = closed_loop_rate(c, [o.e2e_s for o in r.outcomes])
    return {"ttfa_p50": quantile([o.ttfa_s for o in r.outcomes], 0.5),
            "ttfa_p90": quantile([o.ttfa_s for o in r.outcomes], 0.9),
            "rtf_p50": quantile([o.e2e_s / a for o, a in zip(r.outcomes, audio, strict=True)], 0.5),
            "audio_tput": req * sum(audio) / len(audio), "req_tput": req,
            "mean_batch": r.batch_sum / r.steps if r.steps else float("nan")}


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
    return {"run": str(run.relative_to(REPO)), "config": str(config.relative_to(REPO)), "fit_levels": fit_levels,
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
             + " --whole-step --ttfa --base configs/sim/cpu-tiny-stage.yaml --out " + res["config"],
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
    lines += ["", "## What the model assumes, and what a miss would need", "",
              "- The profile is the engine's step model (step = base_ms + per_request_ms x batch, FIFO admission up to "
              "the stage file's max_batch_size 4, one codec frame per running request per step, a 25-frame first "
              "chunk) with the predictor's measured time kept inside the step (`--whole-step`): on this box the "
              "talker, code2wav and the API server share 2 cores, and that sharing shows up as the per-request "
              "slope of the step (code2wav decodes every running request's chunks on the same cores), so "
              "`code2wav_chunk_ms` fits to about 0 (the first audio is 25 talker steps after the request, nothing "
              "measurable after them). No separate CPU-sharing term was needed at these levels.",
              "- Throughput (req/s, audio s/s) is c / mean E2E on both sides (Little's law for a closed loop without "
              "think time), so a window's edges do not enter the rate.",
              "- The simulated closed loop is deterministic: every request at a level sees the same steps, so its "
              "p90 TTFA sits on its p50. The real p90 is 14-29 % above the p50 (host load, the phase of the "
              "arrival against the step, Python scheduling on busy cores); matching the p90 would need a "
              "step-time noise term fitted to the step clock's spread, which the model does not have.",
              "- The measurement ran on a shared box (host load in the header): the c=8 step was about 5 % slower "
              "than the c=4 fit predicts at the same batch, which is where the simulated c=8 throughput's excess "
              "comes from."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.sim_vs_real", description=__doc__.splitlines()[0])
    p.add_argument("--run", default="reports/bench/sim-vs-cpu/real", help="the real server's run folder")
    p.add_argument("--config", default="configs/sim/cpu-tiny.yaml", help="the fitted profile (its .fit.json has levels)")
    p.add_argument("--out", default="reports/bench/sim-vs-cpu.md")
    p.add_argument("--json", default=str(heldout.PATH.relative_to(REPO)), help="the figures, for the banners")
    args = p.parse_args(argv)
    run, config = (REPO / args.run).resolve(), (REPO / args.config).resolve()
    try:
        if not (run / "requests.jsonl").is_file():
            raise ValueError(f"{args.run}: no requests.jsonl")
        res = compare(run, config)
        loads = [f.read_text().split("load average:")[1].strip() for f in sorted(run.glob("host-load-*.txt"))]
    except (OSError, ValueError, KeyError, IndexError) as e:
        print(f"tools.sim_vs_real: {e}", file=sys.stderr)
        return 2
    text = markdown(res, " -> ".join(reversed(loads)) if loads else "not recorded")
    out = REPO / args.out
    out.write_text(text, encoding="utf-8")
    heldout.write(res, REPO / args.json)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the control channel and the step clock cost a server, next to the predictor calls they sit beside.

`python -m tools.control_bench [--rounds 15] [--out reports/bench/control.md]` (main venv, CPU). Times, in
interleaved rounds (medians over rounds, like tools.micro):

- ControlFile.poll() when nothing changed (one os.stat) and when the file changed (stat + read + JSON + checks);
- ControlChannel.at_step_boundary() (the poll the plugin and the simulator make once per talker step);
- the plugin's per-call step-boundary test (tts_predictor.plugin.is_step_start) on a decode and a prefill call;
- StepClock.step_start with real prometheus_client histograms (once per step);
- one host-side build_attn_metadata layout of each variant (tts_predictor.variants, what the plugin's arms compute
  on the host before vLLM's attn_utils) at 8 and 64 requests, decode (query 1) and prefill (query 2) calls.

The table then puts the per-step overhead (1 boundary poll + 1 clock tick + 15 boundary tests) beside one talker
step's predictor calls (1 prefill + 14 decodes) of each variant.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry

from tts_predictor import metrics as M
from tts_predictor.control import ControlChannel, ControlFile, write_control
from tts_predictor.domain import CALLS_PER_STEP, DECODE_CALLS_PER_STEP, VARIANT_NAMES
from tts_predictor.plugin import is_step_start
from tts_predictor.step_clock import StepClock
from tts_predictor.variants import VARIANTS

BLOCK_SIZE = 16
SIZES = (8, 64)


def _per_call_us(fn, iterations: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(iterations):
        fn()
    return (time.perf_counter_ns() - t0) / iterations / 1000.0


def build_items(tmp: Path) -> dict:
    """name -> (callable, iterations per measurement)."""
    items = {}
    path = tmp / "control.json"
    write_control(path, "original", True, epoch=1)
    quiet = ControlFile(path)
    items["poll, no change"] = (quiet.poll, 2000)

    changing_path = tmp / "changing.json"
    write_control(changing_path, "original", True, epoch=0)
    changing = ControlFile(changing_path)
    epoch = [0]
    others = [tmp / f"next-{i}.json" for i in range(2)]

    def poll_after_change():  # a rename prepared outside the timed poll would be fairer; the write is ~the same order
        epoch[0] += 1
        write_control(others[epoch[0] % 2], VARIANT_NAMES[epoch[0] % 3], True, epoch=epoch[0])
        os.replace(others[epoch[0] % 2], changing_path)
        t0 = time.perf_counter_ns()
        assert changing.poll() is not None
        return time.perf_counter_ns() - t0

    items["poll, file changed"] = (poll_after_change, 200)

    channel = ControlChannel(ControlFile(path), logging.getLogger("control_bench"),
                             M.make_control_metrics(CollectorRegistry()))
    items["at_step_boundary, no change"] = (channel.at_step_boundary, 2000)

    decode_q, decode_s = torch.ones(64, dtype=torch.int32), torch.full((64,), 9, dtype=torch.int32)
    prefill = torch.full((64,), 2, dtype=torch.int32)
    items["is_step_start, decode call"] = (lambda: is_step_start(64, decode_q, decode_s), 5000)
    items["is_step_start, prefill call"] = (lambda: is_step_start(64, prefill, prefill), 5000)

    clock = StepClock(M.make_step_metrics(CollectorRegistry()))
    items["StepClock.step_start"] = (lambda: clock.step_start(time.perf_counter(), 64, "fixed"), 2000)

    device = torch.device("cpu")
    rng = random.Random(7)
    for n in SIZES:
        table = torch.arange(n, dtype=torch.int32).reshape(n, 1)
        shapes = {"decode": (torch.ones(n, dtype=torch.int32),
                             torch.tensor([rng.randint(3, 16) for _ in range(n)], dtype=torch.int32)),
                  "prefill": (torch.full((n,), 2, dtype=torch.int32), torch.full((n,), 2, dtype=torch.int32))}
        for shape, (q, s) in shapes.items():
            for v in VARIANT_NAMES:
                fn = VARIANTS[v]
                items[f"{v} layout, {shape}, {n} requests"] = (
                    (lambda fn=fn, q=q, s=s, table=table: fn(q, s, table, block_size=BLOCK_SIZE, device=device)),
                    200 if n == 64 else 500)
    return items


def measure(rounds: int) -> dict[str, list[float]]:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="control-bench-") as tmp:
        items = build_items(Path(tmp))
        for fn, _ in items.values():  # warm up
            fn()
        results: dict[str, list[float]] = {name: [] for name in items}
        order = list(items)
        rng = random.Random(1)
        for _ in range(rounds):
            rng.shuffle(order)
            for name in order:
                fn, iterations = items[name]
                if name == "poll, file changed":  # times itself (the write is not part of the poll)
                    results[name].append(statistics.mean(fn() for _ in range(iterations)) / 1000.0)
                else:
                    results[name].append(_per_call_us(fn, iterations))
    return results


def render(results: dict[str, list[float]], rounds: int, command: str) -> str:
    med = {k: statistics.median(v) for k, v in results.items()}

    def iqr(k):
        q = statistics.quantiles(results[k], n=4)
        return q[2] - q[0]

    lines = [
        "# Control channel and step clock: cost per call and per talker step (CPU)",
        "",
        f"Command: `{command}` ({rounds} interleaved rounds, median and IQR over rounds; "
        f"{datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; Python {platform.python_version()}, "
        f"torch {torch.__version__}, {platform.machine()}, load average {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} CPUs: a shared, busy box, so absolute numbers are loose; the ratios are the point).",
        "",
        "| what | µs per call (median) | IQR |",
        "|---|---:|---:|",
    ]
    for k in results:
        lines.append(f"| {k} | {med[k]:.2f} | {iqr(k):.2f} |")
    overhead = (med["at_step_boundary, no change"] + med["StepClock.step_start"]
                + med["is_step_start, prefill call"] + DECODE_CALLS_PER_STEP * med["is_step_start, decode call"])
    lines += [
        "",
        f"Per talker step the server adds: 1 boundary poll ({med['at_step_boundary, no change']:.2f} µs) + 1 step-"
        f"clock tick ({med['StepClock.step_start']:.2f} µs) + {CALLS_PER_STEP} boundary tests (prefill "
        f"{med['is_step_start, prefill call']:.2f} µs, decodes {med['is_step_start, decode call']:.2f} µs each) = "
        f"**{overhead:.1f} µs per step**. A file change costs one read and parse "
        f"({med['poll, file changed']:.1f} µs), once.",
        "",
        "| variant | requests | predictor per step (1 prefill + 14 decodes), µs | control + clock overhead |",
        "|---|---:|---:|---:|",
    ]
    for n in SIZES:
        for v in VARIANT_NAMES:
            step = med[f"{v} layout, prefill, {n} requests"] + DECODE_CALLS_PER_STEP * med[
                f"{v} layout, decode, {n} requests"]
            lines.append(f"| {v} | {n} | {step:.0f} | {overhead:.1f} µs = {100 * overhead / step:.2f} % |")
    lines += [
        "",
        "The layouts are the host-side part of build_attn_metadata only (vLLM's attn_utils and the metadata "
        "builder come on top in the real server, and a talker step also runs the talker's forward: milliseconds), "
        "so the percentages are upper bounds of what the control channel and the step clock can cost. The poll is "
        "made once per step (at the prefill), never on the 14 decode calls; a change is picked up at the next step.",
        "",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.control_bench", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", default="reports/bench/control.md")
    args = p.parse_args(argv)
    if args.rounds < 4:
        print("control_bench: --rounds must be >= 4 (IQR needs them)", file=sys.stderr)
        return 2
    results = measure(args.rounds)
    command = "python -m tools.control_bench" + ("" if args.rounds == 15 else f" --rounds {args.rounds}")
    text = render(results, args.rounds, command)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

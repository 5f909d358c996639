"""Micro benchmark of the three build_attn_metadata layouts: µs per call and syncs per call.

Interleaved rounds (every round times every variant of every case, in a shuffled order) and medians over
rounds, so slow drift of a noisy machine hits all variants alike. `python -m tools.micro [--quick]
[--device cuda]` writes reports/micro/<UTC>/results.json and results.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from tts_predictor.sync_observer import SyncObserver
from tts_predictor.variants import VARIANTS
from ttsrecords.records import MICRO_SCHEMA

BLOCK_SIZE = 16
SIZES = (1, 4, 8, 16, 32, 64, 128, 256)
SCALING_MAX_SEQ = (16, 256, 2048, 8192)
SCALING_REQS = 64


@dataclass(frozen=True)
class Case:
    scenario: str  # decode | prefill | mixed | blocks
    num_reqs: int
    max_seq_len: int
    query_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]

    @property
    def blocks_per_seq(self) -> int:
        return -(-self.max_seq_len // BLOCK_SIZE)

    @property
    def tokens(self) -> int:
        return sum(self.query_lens)


def build_cases(rng: random.Random) -> list[Case]:
    """The case grid of the issue: three batch kinds x sizes, plus block-table scaling at 64 requests."""
    cases = []
    for n in SIZES:
        # decode / prefill as in the code predictor (16-token sequence: 1 prefill of 2 tokens, then 1 token a call)
        cases.append(Case("decode", n, 16, (1,) * n, tuple(rng.randint(2, 16) for _ in range(n))))
        cases.append(Case("prefill", n, 16, (2,) * n, (2,) * n))
        q = tuple(rng.randint(1, 4) for _ in range(n))
        cases.append(Case("mixed", n, 32, q, tuple(qi + rng.randint(8, 20) for qi in q)))  # mean seq ~16
    for max_seq in SCALING_MAX_SEQ:
        n = SCALING_REQS
        cases.append(Case("blocks", n, max_seq, (1,) * n, tuple(rng.randint(1, max_seq) for _ in range(n))))
    return cases


@dataclass(frozen=True)
class Row:
    scenario: str
    num_reqs: int
    blocks_per_seq: int
    max_seq_len: int
    tokens: int
    variant: str
    median_us: float
    iqr_us: float
    rounds: int
    syncs_per_call: int


def _inputs(case: Case, device: torch.device):
    ql = torch.tensor(case.query_lens, dtype=torch.int32)
    sl = torch.tensor(case.seq_lens, dtype=torch.int32)
    table = torch.arange(case.num_reqs * case.blocks_per_seq, dtype=torch.int32, device=device)
    return ql, sl, table.reshape(case.num_reqs, case.blocks_per_seq)


def _time_per_call(f, args, device: torch.device, calls: int, events: bool = False) -> float:
    """Seconds per call over `calls` back-to-back calls. On a GPU with `events`, timed by CUDA events on the device's
    stream (the stream is idle, so they mark when the host reached them: the calls' host time, waits included)."""
    ql, sl, table = args
    cuda = device.type == "cuda"
    if cuda and events:
        stream = torch.cuda.current_stream(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record(stream)
        for _ in range(calls):
            f(ql, sl, table, block_size=BLOCK_SIZE, device=device)
        end.record(stream)
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / calls
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(calls):
        f(ql, sl, table, block_size=BLOCK_SIZE, device=device)
    if cuda:
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / calls


def run(device: str = "cpu", rounds: int = 15, sample_s: float = 0.004, seed: int = 0, progress=None,
        cases: list[Case] | None = None, events: bool = False) -> dict:
    """`cases` (default: the full grid of build_cases); `events`: CUDA-event timing on a GPU (perf_counter else)."""
    dev = torch.device(device)
    events = events and dev.type == "cuda"
    rng = random.Random(seed)
    cases = build_cases(rng) if cases is None else list(cases)
    inputs = [_inputs(c, dev) for c in cases]
    observer = SyncObserver(dev)
    syncs, calls = {}, {}
    for i, args in enumerate(inputs):
        for name, f in VARIANTS.items():
            f(*args, block_size=BLOCK_SIZE, device=dev)  # warm-up (allocations, pinned pool)
            ql, sl, table = args
            with observer.observe(device_tensors=[table]) as count:
                f(ql, sl, table, block_size=BLOCK_SIZE, device=observer.device)
            syncs[i, name] = count.syncs
            once = _time_per_call(f, args, dev, 1)
            calls[i, name] = max(1, min(2000, int(sample_s / max(once, 1e-7))))
    samples: dict[tuple[int, str], list[float]] = {k: [] for k in calls}
    order = [(i, name) for i in range(len(cases)) for name in VARIANTS]
    t_start = time.perf_counter()
    for r in range(rounds):
        rng.shuffle(order)
        for i, name in order:
            samples[i, name].append(_time_per_call(VARIANTS[name], inputs[i], dev, calls[i, name], events))
        if progress:
            progress(r + 1, rounds, time.perf_counter() - t_start)
    rows = []
    for i, case in enumerate(cases):
        for name in VARIANTS:
            xs = sorted(samples[i, name])
            q1, q3 = xs[len(xs) // 4], xs[(3 * len(xs)) // 4]
            rows.append(Row(case.scenario, case.num_reqs, case.blocks_per_seq, case.max_seq_len, case.tokens, name,
                            round(statistics.median(xs) * 1e6, 2), round((q3 - q1) * 1e6, 2), rounds,
                            syncs[i, name]))
    return {
        "schema": MICRO_SCHEMA,
        "device": _device_name(dev),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": _machine(),
        "block_size": BLOCK_SIZE,
        "rounds": rounds,
        "sample_s": sample_s,
        "timer": "cuda-events" if events else "perf_counter",
        "seed": seed,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rows": [asdict(r) for r in rows],
    }


def observer_overhead(device: str = "cpu", sizes=(8, 64), calls: int = 30) -> list[dict]:
    """µs per call of each variant with and without the sync observer around it (decode batches)."""
    dev = torch.device(device)
    observer = SyncObserver(dev)
    out = []
    for n in sizes:
        case = Case("decode", n, 16, (1,) * n, (9,) * n)
        ql, sl, table = _inputs(case, dev)
        for name, f in VARIANTS.items():
            plain, observed = [], []
            for _ in range(5):
                plain.append(_time_per_call(f, (ql, sl, table), dev, calls))
                t0 = time.perf_counter()
                for _ in range(calls):
                    with observer.observe(device_tensors=[table]):
                        f(ql, sl, table, block_size=BLOCK_SIZE, device=observer.device)
                observed.append((time.perf_counter() - t0) / calls)
            p, o = statistics.median(plain) * 1e6, statistics.median(observed) * 1e6
            out.append({"variant": name, "num_reqs": n, "plain_us": round(p, 1), "observed_us": round(o, 1),
                        "overhead_us": round(o - p, 1), "method": observer.method})
    return out


def _device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(dev)}"
    return "cpu"


def _machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(), "os": platform.platform()}


def table_markdown(result: dict) -> str:
    """One line per case: µs per call of each variant, the two ratios, syncs per call."""
    by_case: dict[tuple, dict[str, dict]] = {}
    for r in result["rows"]:
        by_case.setdefault((r["scenario"], r["num_reqs"], r["max_seq_len"]), {})[r["variant"]] = r
    lines = [
        f"Device: {result['device']} ({result['machine']['cpu']}, {result['machine']['cores']} cores), "
        f"torch {result['torch']}, block size {result['block_size']}, {result['rounds']} interleaved rounds, medians.",
        "",
        "| scenario | reqs | max_seq | blocks/seq | tokens | original µs | fixed µs | vectorized µs "
        "| orig/fixed | fixed/vec | syncs o/f/v |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (scenario, n, max_seq), v in by_case.items():
        o, f, z = v["original"], v["fixed"], v["vectorized"]
        lines.append(
            f"| {scenario} | {n} | {max_seq} | {o['blocks_per_seq']} | {o['tokens']} | {o['median_us']:.1f} "
            f"| {f['median_us']:.1f} | {z['median_us']:.1f} | {o['median_us'] / f['median_us']:.2f}x "
            f"| {f['median_us'] / z['median_us']:.2f}x | {o['syncs_per_call']}/{f['syncs_per_call']}/"
            f"{z['syncs_per_call']} |"
        )
    if result.get("observer_overhead"):
        lines += ["", f"Sync observer overhead ({result['observer_overhead'][0]['method']} method), decode batches:", "",
                  "| variant | reqs | plain µs | observed µs | overhead µs |", "|---|---:|---:|---:|---:|"]
        lines += [f"| {o['variant']} | {o['num_reqs']} | {o['plain_us']} | {o['observed_us']} | {o['overhead_us']} |"
                  for o in result["observer_overhead"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.micro", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--quick", action="store_true", help="a few rounds, short samples: under a minute on 2 cores")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 15, quick 4)")
    p.add_argument("--out", default="reports/micro", help="parent folder of the timestamped result folder")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no CUDA device", file=sys.stderr)
        return 2
    rounds = a.rounds if a.rounds is not None else (4 if a.quick else 15)
    if rounds < 1:
        print("error: --rounds must be >= 1", file=sys.stderr)
        return 2
    sample_s = 0.0015 if a.quick else 0.004

    def progress(r, total, elapsed):
        print(f"\rround {r}/{total}  {elapsed:.0f}s elapsed, ~{elapsed / r * (total - r):.0f}s left", end="",
              file=sys.stderr, flush=True)

    result = run(a.device, rounds=rounds, sample_s=sample_s, seed=a.seed, progress=progress)
    print(file=sys.stderr)
    result["observer_overhead"] = observer_overhead(a.device, calls=5 if a.quick else 30)
    folder = Path(a.out) / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    md = table_markdown(result)
    (folder / "results.md").write_text(md)
    print(md)
    print(f"wrote {folder}/results.json and results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())

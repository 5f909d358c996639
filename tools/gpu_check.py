"""`make gpu-check [DEVICE=cpu|cuda]`: what the suite can prove on a bare GPU machine without network, in one run.

Steps, each with a time budget (a step past its budget is stopped and FAILs; the next one still runs):
  env          GPU, driver, torch, CUDA, Python and package versions (torch; nvidia-smi where it exists)
  equivalence  the three variants give the reference layout (values, dtypes, devices) on the device, seeded batches
  syncs        syncs per call and per talker step at 1, 8, 64, 128, 256 requests, counted by the sync observer's
               logical method and, on CUDA, by torch.cuda.set_sync_debug_mode (the observer's "cuda" method),
               against the closed form (original T+4, fixed 5, vectorized 0: tts_predictor.metrics)
  micro        tools.micro on PR #1614's batch sizes (CUDA events on a GPU) beside PR #1614's H100 table
  ab           a short swap A/B on the simulator, original vs fixed at c=8 and c=64, the variant on the device
               (tools/closed_loop.py: the suite's client, no Locust)
Writes at most 8 files into --out (default reports/gpu/<UTC>/): check.json (every step, budget, versions),
summary.md, variants.json, micro.json, ab.json, ab-requests.jsonl, server.log. Exit 0 when every step passed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

from loadtest.provenance import code_fingerprint, git_revision
from tools import closed_loop, micro
from tts_predictor.layout import reference_layout
from tts_predictor.metrics import syncs_per_call, syncs_per_step
from tts_predictor.sync_observer import SyncObserver
from tts_predictor.variants import VARIANTS
from ttsrecords.paths import ROOT
from ttsrecords.records import GPU_CHECK_SCHEMA
from ttssim.model import H100_CALL_US, call_shapes

# seconds per step: together under 8 minutes (the check's promise, docs/gpu-host.md); the A/B plans its windows to
# end inside its budget, the others are far inside theirs (measured: reports/bench/gpu-check.md)
BUDGETS = {"env": 20, "equivalence": 60, "syncs": 60, "micro": 90, "ab": 250}
SYNC_SIZES = (1, 8, 64, 128, 256)
PR_SIZES = tuple(n for n, _ in H100_CALL_US["original"])  # PR #1614's H100 table (docs/sources.md [H100])
MICRO_SIZES = tuple(sorted(set(PR_SIZES) | {64, 256}))
PACKAGES = ("torch", "numpy", "scipy", "aiohttp", "httpx", "prometheus-client", "pyyaml", "soundfile", "cffi",
            "triton", "nvidia-ml-py")
FILES = ("check.json", "summary.md", "variants.json", "micro.json", "ab.json", "ab-requests.jsonl", "server.log")


class StepTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise StepTimeout()


def run_step(name: str, budget_s: float, fn) -> dict:
    """fn() -> (passed, detail, data). A step over its budget is interrupted (SIGALRM) and fails; so does one that
    raises. Either way the check goes on with the next step."""
    t0 = time.monotonic()
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, budget_s)
    data = None
    try:
        passed, detail, data = fn()
        status = "pass" if passed else "fail"
    except StepTimeout:
        status, detail = "fail", f"stopped: over its budget of {budget_s:g} s"
    except Exception as e:  # noqa: BLE001 - a broken step is a FAIL with its reason, not the end of the check
        status = "fail"
        detail = f"{type(e).__name__}: {e}".strip()[:400]
        traceback.print_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    elapsed = time.monotonic() - t0
    print(f"[{status.upper():4}] {name} ({elapsed:.1f} s of {budget_s:g} s): {detail}", flush=True)
    return {"name": name, "status": status, "budget_s": budget_s, "elapsed_s": round(elapsed, 2), "detail": detail,
            "data": data}


# --- env ----------------------------------------------------------------------------------------------------------

def _nvidia_smi() -> dict:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"available": False, "note": "nvidia-smi not on PATH"}
    q = "name,driver_version,memory.total,pci.bus_id"  # fields every driver knows (compute capability: from torch)
    try:
        out = subprocess.run([exe, f"--query-gpu={q}", "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=15)
        ver = subprocess.run([exe], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"available": False, "note": f"nvidia-smi failed: {e}"}
    gpus = [dict(zip(q.split(","), (x.strip() for x in line.split(",")), strict=False))
            for line in out.stdout.splitlines() if line.strip()]
    cuda_line = next((ln for ln in ver.stdout.splitlines() if "CUDA Version" in ln), "")
    return {"available": out.returncode == 0, "gpus": gpus, "header": " ".join(cuda_line.replace("|", " ").split())}


def environment(device: torch.device) -> dict:
    versions = {}
    for p in PACKAGES:
        try:
            versions[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            versions[p] = None
    env = {
        "device": str(device), "python": platform.python_version(), "machine": micro._machine(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "cuda_available": torch.cuda.is_available(),
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None, "packages": versions,
        "git_revision": git_revision(), "code_fingerprint": code_fingerprint(), "gpu": None, "nvidia_smi": None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = {"name": props.name, "capability": f"{props.major}.{props.minor}",
                      "memory_gib": round(props.total_memory / 2**30, 1), "count": torch.cuda.device_count(),
                      "sm_count": props.multi_processor_count}
        env["nvidia_smi"] = _nvidia_smi()
    return env


def step_env(device: torch.device, env: dict):
    if device.type == "cuda":
        smi = env["nvidia_smi"] or {}
        driver = ", ".join(g.get("driver_version", "?") for g in smi.get("gpus", [])) or "unknown (no nvidia-smi)"
        return True, (f"{env['gpu']['name']} (sm {env['gpu']['capability']}, {env['gpu']['memory_gib']} GiB), "
                      f"driver {driver}, torch {env['torch']}, CUDA {env['torch_cuda']}"), None
    return True, f"CPU only ({env['machine']['cpu']}), torch {env['torch']}: the GPU-only checks are skipped", None


# --- equivalence ----------------------------------------------------------------------------------------------------

def _cases(rng: random.Random, count: int) -> list[tuple[list[int], list[int], int, int, int]]:
    """(query, seq, block_size, blocks_per_seq, spare rows): the simulator's own calls at the sync sizes, then
    seeded decode / prefill / mixed batches over block sizes and sequence lengths."""
    out = [([q] * n, [s] * n, 16, 1, 0) for n in SYNC_SIZES for q, s in call_shapes(16)[:2]]
    while len(out) < count:
        block_size = rng.choice((1, 7, 16, 16, 32))
        max_seq = rng.choice((16, 17, 64, 256))
        bps = -(-max_seq // block_size)
        n = rng.choice((0, 1, 2, 8, 33, 64, 128, 256)) if bps <= 64 else rng.randint(0, 16)
        kind = rng.choice(("decode", "prefill", "mixed"))
        lo, hi = {"decode": (1, 1), "prefill": (2, min(64, max_seq)), "mixed": (0, min(64, max_seq))}[kind]
        query = [rng.randint(lo, hi) for _ in range(n)]
        out.append((query, [rng.randint(q, max_seq) for q in query], block_size, bps, rng.randint(0, 3)))
    return out


def _layout_errors(layout, ref: dict, dev: torch.device) -> list[str]:
    errs = []
    if layout.num_tokens != ref["num_tokens"] or layout.max_seq_len != ref["max_seq_len"]:
        errs.append("num_tokens/max_seq_len")
    host = layout.query_start_loc
    if host.device.type != "cpu" or host.dtype != torch.int32 or host.tolist() != ref["query_start_loc"]:
        errs.append("query_start_loc (host)")
    for name, key, dtype in (("query_start_loc_device", "query_start_loc", torch.int32),
                             ("seq_lens_device", "seq_lens", torch.int32), ("block_table", "block_table", torch.int32),
                             ("positions", "positions", torch.int64), ("slot_mapping", "slot_mapping", torch.int64)):
        t = getattr(layout, name)
        if t.device.type != dev.type or t.dtype != dtype:
            errs.append(f"{name}: {t.dtype} on {t.device}")
        elif t.cpu().tolist() != ref[key]:
            errs.append(f"{name}: values")
    return errs


def step_equivalence(dev: torch.device, cases: int = 160, seed: int = 1614):
    rng = random.Random(seed)
    mismatches, checked = [], 0
    for i, (query, seq, block_size, bps, spare) in enumerate(_cases(rng, cases)):
        ids = torch.randperm((len(query) + spare) * bps, generator=torch.Generator().manual_seed(i)).to(torch.int32)
        table = ids.reshape(len(query) + spare, bps).to(dev)
        ql, sl = torch.tensor(query, dtype=torch.int32), torch.tensor(seq, dtype=torch.int32)
        ref = reference_layout(ql, sl, table, block_size=block_size)
        for name, f in VARIANTS.items():
            errs = _layout_errors(f(ql, sl, table, block_size=block_size, device=dev), ref, dev)
            checked += 1
            if errs:
                mismatches.append({"case": i, "variant": name, "num_reqs": len(query), "block_size": block_size,
                                   "blocks_per_seq": bps, "errors": errs})
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    data = {"cases": cases, "seed": seed, "comparisons": checked, "mismatches": mismatches[:20],
            "mismatch_count": len(mismatches)}
    detail = (f"{cases} batches x {len(VARIANTS)} variants on {dev}: "
              + ("every layout equals the reference" if not mismatches else f"{len(mismatches)} mismatches"))
    return not mismatches, detail, data


# --- syncs ----------------------------------------------------------------------------------------------------------

def _count(observer: SyncObserver, f, calls, table) -> int:
    with observer.observe(device_tensors=[table]) as count:
        for ql, sl in calls:
            f(ql, sl, table, block_size=16, device=observer.device)
    return count.syncs


def step_syncs(dev: torch.device):
    """Per call (a decode and a prefill batch) and per talker step (the 15 calls of call_shapes) at every size."""
    methods = ["logical"] + (["cuda"] if dev.type == "cuda" else [])
    observers = {m: SyncObserver(dev, method=m) for m in methods}
    table = torch.arange(max(SYNC_SIZES), dtype=torch.int32).reshape(-1, 1).to(dev)
    rows, bad = [], 0
    for n in SYNC_SIZES:
        shapes = {"decode": [(1, 9)], "prefill": [(2, 2)], "step": call_shapes(16)}
        for what, shape in shapes.items():
            calls = [(torch.full((n,), q, dtype=torch.int32), torch.full((n,), s, dtype=torch.int32)) for q, s in shape]
            for name, f in VARIANTS.items():
                for ql, sl in calls:  # warm-up: the pinned pool, allocator and lazy CUDA state outside the count
                    f(ql, sl, table, block_size=16, device=dev)
                tokens = sum(q for q, _ in shape) * n
                expected = syncs_per_step(name, n) if what == "step" else syncs_per_call(name, tokens)
                row = {"num_reqs": n, "what": what, "variant": name, "tokens": tokens, "expected": expected}
                for m, obs in observers.items():
                    row[m] = _count(obs, f, calls, table)
                row["ok"] = all(row[m] == expected for m in methods)
                bad += not row["ok"]
                rows.append(row)
    data = {"methods": methods, "rows": rows,
            "cuda_note": None if "cuda" in methods else "no CUDA device: torch.cuda.set_sync_debug_mode not run"}
    detail = (f"{len(rows)} counts ({', '.join(methods)}) at {'/'.join(map(str, SYNC_SIZES))} requests: "
              + ("all equal the closed form (T+4 / 5 / 0 per call)" if not bad else f"{bad} differ from the closed form"))
    return not bad, detail, data


# --- micro ----------------------------------------------------------------------------------------------------------

def step_micro(dev: torch.device, rounds: int, sample_s: float):
    rng = random.Random(0)
    cases = [micro.Case("decode", n, 16, (1,) * n, tuple(rng.randint(2, 16) for _ in range(n))) for n in MICRO_SIZES]
    result = micro.run(str(dev), rounds=rounds, sample_s=sample_s, cases=cases, events=True)
    by = {(r["num_reqs"], r["variant"]): r for r in result["rows"]}
    pr = {v: dict(H100_CALL_US[v]) for v in H100_CALL_US}
    beside = []
    for n in PR_SIZES:
        o, f, z = (by[n, v]["median_us"] for v in ("original", "fixed", "vectorized"))
        beside.append({"num_reqs": n, "original_us": o, "fixed_us": f, "vectorized_us": z, "ratio": round(o / f, 3),
                       "pr1614_original_us": pr["original"][n], "pr1614_fixed_us": pr["fixed"][n],
                       "pr1614_ratio": round(pr["original"][n] / pr["fixed"][n], 3)})
    result["pr1614"] = {"source": "vllm-omni PR #1614's description: H100, µs per call, 50-iteration median "
                                  "(docs/sources.md [H100]; ttssim.model.H100_CALL_US)", "rows": beside}
    wrong = [r for r in result["rows"] if r["syncs_per_call"] != syncs_per_call(r["variant"], r["tokens"])]
    r8 = next(b for b in beside if b["num_reqs"] == 8)
    detail = (f"{len(result['rows'])} timings ({result['timer']}, {rounds} rounds); original/fixed at 8 requests "
              f"{r8['original_us']:.1f}/{r8['fixed_us']:.1f} µs (PR #1614 H100: 253.3/111.1)")
    if wrong:
        detail += f"; {len(wrong)} rows with syncs off the closed form"
    return not wrong, detail, result


# --- ab -------------------------------------------------------------------------------------------------------------

def step_ab(dev: torch.device, out: Path, rounds: int, budget_s: float):
    plan = closed_loop.Plan("original", "fixed", rounds, str(dev))
    doc = closed_loop.run(plan, out, log=lambda s: print(s, flush=True), deadline=time.time() + budget_s - 15.0)
    (out / "ab.json").write_text(json.dumps(doc, indent=1) + "\n")
    invalid = [w["id"] for w in doc["windows"] if not w["valid"]]
    lines = [lvl["verdict"] for lvl in doc["comparison"].values()]
    passed = not invalid and not doc["not_run"] and len(lines) == len(doc["levels"])
    detail = "; ".join(lines)
    if invalid:
        detail += f"; invalid windows {invalid}"
    if doc["not_run"]:
        detail += f"; not run (budget): {doc['not_run']}"
    return passed, detail, {"verdicts": lines, "windows": len(doc["windows"]), "invalid": invalid}


# --- files ----------------------------------------------------------------------------------------------------------

def summary_markdown(check: dict, variants: dict, micro_result: dict | None, ab: dict | None) -> str:
    env = check["env"]
    gpu = env.get("gpu") or {}
    smi = (env.get("nvidia_smi") or {}).get("gpus") or [{}]
    lines = [f"# make gpu-check on {check['device']}: {'PASSED' if check['passed'] else 'FAILED'}", "",
             f"{check['created']}, {check['elapsed_s']:.0f} s in all. Command: `{check['command']}`.", "",
             f"- device: {gpu.get('name') or 'CPU (' + env['machine']['cpu'] + ')'}"
             + (f", compute capability {gpu['capability']}, {gpu['memory_gib']} GiB" if gpu else ""),
             f"- driver: {smi[0].get('driver_version') or 'n/a'}; torch {env['torch']}, CUDA {env['torch_cuda']}, "
             f"cuDNN {env['cudnn']}; Python {env['python']}",
             f"- git revision {env['git_revision']}, source fingerprint {env['code_fingerprint'][:16]}", "",
             "| step | status | seconds | budget s | detail |", "|---|---|---:|---:|---|"]
    lines += [f"| {s['name']} | {s['status'].upper()} | {s['elapsed_s']:.1f} | {s['budget_s']:g} | "
              f"{s['detail'].replace('|', '/')} |" for s in check["steps"]]
    syncs = variants.get("syncs")
    if syncs:
        methods = syncs["methods"]
        lines += ["", "## Syncs per call and per talker step (measured vs closed form)", "",
                  "| requests | what | variant | tokens | closed form | " + " | ".join(methods) + " |",
                  "|---:|---|---|---:|---:|" + "---:|" * len(methods)]
        lines += [f"| {r['num_reqs']} | {r['what']} | {r['variant']} | {r['tokens']} | {r['expected']} | "
                  + " | ".join(str(r[m]) for m in methods) + " |" for r in syncs["rows"]]
        if syncs.get("cuda_note"):
            lines += ["", f"({syncs['cuda_note']}.)"]
    if micro_result:
        lines += ["", "## Micro benchmark beside PR #1614 (decode batches, µs per call, medians)", "",
                  f"Timer: {micro_result['timer']}. PR #1614: {micro_result['pr1614']['source']}.", "",
                  "| requests | original | fixed | vectorized | orig/fixed | PR #1614 original | PR #1614 fixed "
                  "| PR orig/fixed |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {b['num_reqs']} | {b['original_us']:.1f} | {b['fixed_us']:.1f} | {b['vectorized_us']:.1f} | "
                  f"{b['ratio']:.2f}x | {b['pr1614_original_us']} | {b['pr1614_fixed_us']} | {b['pr1614_ratio']:.2f}x |"
                  for b in micro_result["pr1614"]["rows"]]
        lines += ["", micro.table_markdown(micro_result).rstrip()]
    if ab:
        lines += ["", f"## SIMULATED A/B: {ab['a']} (A) vs {ab['b']} (B), swap design, the variant on {ab['device']}",
                  "", f"{len(ab['windows'])} windows of {2 * ab['rounds_planned']} planned "
                  f"({ab['scenario']}, {ab['sim_config']}); primary metric {ab['primary_metric']}; claims are "
                  f"about this server start. Windows valid (manipulation check): "
                  f"{sum(w['valid'] for w in ab['windows'])}/{len(ab['windows'])}.", ""]
        lines += [f"- verdict {lvl['verdict']}" for lvl in ab["comparison"].values()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda[:N] (default) or cpu")
    p.add_argument("--out", default=None, help="output folder (default reports/gpu/<UTC>)")
    p.add_argument("--ab-rounds", type=int, default=3, help="A/B rounds (2 windows each; default 3)")
    p.add_argument("--micro-rounds", type=int, default=None, help="interleaved micro rounds (default 51 cuda, 21 cpu)")
    a = p.parse_args(argv)
    if not (a.device == "cpu" or a.device.startswith("cuda")):
        print(f"error: --device must be cpu or cuda[:N], got {a.device!r}", file=sys.stderr)
        return 2
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("error: --device cuda asked for, but torch sees no CUDA device (DEVICE=cpu runs the CPU check)",
              file=sys.stderr)
        return 2
    if a.ab_rounds < 1 or (a.micro_rounds is not None and a.micro_rounds < 1):
        print("error: --ab-rounds and --micro-rounds must be >= 1", file=sys.stderr)
        return 2
    # the shell's timeout sends SIGTERM: unwind (the A/B's finally stops its simulator) instead of dying in place
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    dev = torch.device(a.device)
    if dev.index is not None:  # cuda:N; plain "cuda" is the current device (set_device refuses a device without index)
        torch.cuda.set_device(dev)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    out = Path(a.out) if a.out else ROOT / "reports" / "gpu" / stamp
    if out.exists() and any(out.iterdir()):
        print(f"error: {out} exists and is not empty (nothing overwritten)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    torch.set_num_threads(1)  # tiny tensors, as in the simulator; more threads only add noise to the timings
    env = environment(dev)
    cuda = dev.type == "cuda"
    steps = [run_step("env", BUDGETS["env"], lambda: step_env(dev, env)),
             run_step("equivalence", BUDGETS["equivalence"], lambda: step_equivalence(dev)),
             run_step("syncs", BUDGETS["syncs"], lambda: step_syncs(dev)),
             run_step("micro", BUDGETS["micro"], lambda: step_micro(
                 dev, a.micro_rounds or (51 if cuda else 21), 0.004 if cuda else 0.002)),
             run_step("ab", BUDGETS["ab"], lambda: step_ab(dev, out, a.ab_rounds, BUDGETS["ab"]))]
    by = {s["name"]: s for s in steps}
    variants = {"equivalence": by["equivalence"].pop("data"), "syncs": by["syncs"].pop("data")}
    micro_result = by["micro"].pop("data")
    ab_path = out / "ab.json"
    ab = json.loads(ab_path.read_text()) if ab_path.exists() else None
    for s in steps:
        s.pop("data", None)
    check = {"schema": GPU_CHECK_SCHEMA, "created": stamp, "device": str(dev),
             "command": " ".join(["python -m tools.gpu_check", *(argv if argv is not None else sys.argv[1:])]),
             "budgets_s": BUDGETS, "env": env, "steps": steps, "passed": all(s["status"] == "pass" for s in steps),
             "elapsed_s": round(time.monotonic() - t0, 1)}
    (out / "variants.json").write_text(json.dumps(variants, indent=1) + "\n")
    if micro_result:
        (out / "micro.json").write_text(json.dumps(micro_result, indent=1) + "\n")
    check["files"] = sorted({f.name for f in out.iterdir()} | {"check.json", "summary.md"})
    (out / "summary.md").write_text(summary_markdown(check, variants, micro_result, ab))
    (out / "check.json").write_text(json.dumps(check, indent=1) + "\n")
    print(f"{'PASSED' if check['passed'] else 'FAILED'} in {check['elapsed_s']:.0f} s; results in {out}")
    return 0 if check["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())

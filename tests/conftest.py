"""Shared test helpers and the two test tiers.

Tiers: a test that starts a process (a server, Locust, a command line), needs a binary outside Python (Chromium,
promtool, prometheus, hadolint, docker, bash scripts), waits on a real clock or computes for more than a few seconds
is marked `@pytest.mark.slow` (or a whole module with `pytestmark`); everything else is the unit tier, which
`make test-fast` runs (`pytest -m "not slow"`). The unit tier is enforced here: a test without the mark that starts
a subprocess fails and says so.
`make test` runs both tiers.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadtest.plan import make_plan
from loadtest.server_process import ROOT, free_port  # noqa: F401  (re-exported for the tests)
from tools.locust_run import LOCUST, WatchedRun, complete_lines, intact_lines, write_scenario  # noqa: F401
from tts_predictor import metrics as pm
from tts_predictor.domain import CALLS_PER_STEP, CODEC_FRAME_RATE_HZ
from ttsrecords import records
from ttsrecords.results import read_results
from ttsrecords.windows import plan_to_list

# Processes the standard library or a library may start on its own in the unit tier: platform.processor() runs
# `uname -p`, matplotlib asks fontconfig once to build its font cache.
ALLOWED_IN_UNIT_TIER = {"uname", "fc-list", "fc-match"}


@pytest.fixture(autouse=True)
def _unit_tier_starts_no_process(request, monkeypatch):
    if request.node.get_closest_marker("slow") is not None:
        return
    real_init = subprocess.Popen.__init__

    def refuse(self, args, *a, **kw):
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        if Path(str(argv[0])).name in ALLOWED_IN_UNIT_TIER:
            return real_init(self, args, *a, **kw)
        raise AssertionError(f"a unit-tier test started a process {argv[:4]!r}: mark it @pytest.mark.slow "
                             "(tests/conftest.py explains the tiers)")

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


def cpu_serve(monkeypatch, missing: tuple[str, ...] = ()):
    """cpu_server/serve.py loaded as a module (it is a script: no package imports it), with `missing` as the CPU
    flags its AVX-512 check finds absent (none: it goes on on any CPU)."""
    spec = importlib.util.spec_from_file_location("cpu_serve_under_test", ROOT / "cpu_server/serve.py")
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, mod)  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "missing_flags", lambda _flags: list(missing))
    return mod


def run(cmd: list[str], timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    """A command from the repository root, output captured as text."""
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def locust(args: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """`locust -f loadtest/tts.py <args>` from the repository root, output captured."""
    return subprocess.run([*LOCUST, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)


def one_error(p: subprocess.CompletedProcess, *needles: str, prefix: str = "error:") -> str:
    """Exactly one line of stderr says what is wrong (argparse adds its usage lines above it), no traceback."""
    assert p.returncode != 0, p.stdout[-1000:] + p.stderr[-1000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    lines = [line for line in p.stderr.splitlines() if prefix in line]
    assert len(lines) == 1, p.stderr[-3000:]
    for n in needles:
        assert n.lower() in lines[0].lower(), lines[0]
    return lines[0]


class FakeServer:
    """tools/fakeserver.py (fixed, known latency) on a port of its own choosing: `with FakeServer(...) as s: s.url`."""

    def __init__(self, *args: str, tmp: Path):
        from loadtest.server_process import ServerProcess, ServerSpec

        port_file = tmp / "fakeserver.port"
        cmd = [sys.executable, "-m", "tools.fakeserver", "--port", "0", "--port-file", str(port_file), *args]
        self.server = ServerProcess(ServerSpec(cmd=cmd, port_file=port_file, stop_wait_s=10.0), tmp / "fakeserver.log")

    def __enter__(self) -> FakeServer:
        self.server.start()
        self.url = self.server.wait_ready(60)
        return self

    def __exit__(self, *exc) -> None:
        self.server.stop()


def tree_text(folder: Path) -> str:
    """All bytes under a folder, decoded leniently (to search for leaked secrets)."""
    parts = []
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            parts.append(p.name + "\n" + p.read_bytes().decode("utf-8", "replace"))
    return "\n".join(parts)


def without_docker_path() -> str:
    """A PATH with no `docker` executable on it (Docker absent), keeping python and bash."""
    keep = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if d and not os.path.exists(os.path.join(d, "docker")):
            keep.append(d)
    path = os.pathsep.join(keep)
    assert shutil.which("docker", path=path) is None
    return path


# --- synthetic run folders with known answers (the statistics and the report) -----------------------------------


def make_block(run: Path, block_id: str, rnd: int, kind: str, arm: str, variant: str, *, levels=(8, 64), slow=0.0,
               noise=0.01, rng=None, status="complete", window=20.0, simulated=True):
    """Write one block folder: closed-loop requests per level whose mean latency is scaled by (1+slow)(1+noise)."""
    rng = rng or np.random.default_rng(0)
    d = run / "blocks" / block_id
    d.mkdir(parents=True)
    (d / "block.json").write_text(json.dumps({"schema": records.BLOCK_SCHEMA, "block_id": block_id, "round": rnd, "kind": kind,
                                              "arm": arm, "variant": variant, "status": status, "reason": None,
                                              "started": 0, "ended": 1}))
    reqs, ctrs = [], []
    t0 = 1_000.0
    for i, c in enumerate(levels):
        factor = (1 + slow) * (1 + noise * rng.standard_normal())
        step = 0.02 * (1 + c / 64) * factor
        audio = 4.0
        e2e_mean = audio * CODEC_FRAME_RATE_HZ * step
        n = 0
        for _user in range(c):  # closed loop: each user sends the next request when the last one ends
            t = t0 - 5.0 + float(rng.uniform(0, e2e_mean))
            while t < t0 + window + 2.0:
                e2e = e2e_mean * float(rng.lognormal(0, 0.05))
                phase = "warmup" if t < t0 else "measure" if t < t0 + window else "drain"
                n += phase == "measure"
                reqs.append({"schema": records.REQUEST_SCHEMA, "run_id": "x", "worker": 0, "step": i, "concurrency": c,
                             "phase": phase, "mode": "stream", "ok": True, "error": None, "status": 200,
                             "ttfa_s": 25 * step, "e2e_s": e2e, "audio_s": audio, "rtf": e2e / audio, "bytes": 192000,
                             "t_start": t, "prompt_id": "p", "bucket": "short", "variant": variant})
                t += e2e
        steps = int(window / step)
        calls = steps * CALLS_PER_STEP
        tokens = steps * 16 * c
        syncs = pm.expected_syncs(variant, calls, tokens)
        spc = {"original": 3e-4, "fixed": 1e-4}.get(variant, 5e-5) * (1 + c / 64)
        for edge, t in (("start", t0), ("end", t0 + window)):
            ctrs.append({"schema": records.COUNTERS_SCHEMA, "kind": "snapshot", "step": i, "concurrency": c, "edge": edge,
                         "t": t, "target": "x", "ok": True, "error": None,
                         "samples": {f'tts_predictor_info{{backend="{"simulated" if simulated else "vllm"}",'
                                     f'variant="{variant}"}}': 1.0}})
        ctrs.append({"schema": records.COUNTERS_SCHEMA, "kind": "delta", "step": i, "concurrency": c, "target": "x",
                     "duration_s": window, "variant": variant, "calls": calls, "seconds": calls * spc, "syncs": syncs,
                     "observed_calls": calls, "observed_tokens": tokens, "tokens": tokens, "batch_requests": calls * c,
                     "steps": steps, "step_seconds": window, "frames": steps * c, "requests_finished": n,
                     "syncs_per_call": syncs / calls, "syncs_per_step": syncs / steps, "calls_per_request": calls / n,
                     "seconds_per_request": None, "mean_batch": float(c)})
        t0 += window + 20
    with open(d / "requests.jsonl", "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")
    with open(d / "counters.jsonl", "w") as f:
        for r in ctrs:
            f.write(json.dumps(r) + "\n")
    return d


def make_run(run: Path, *, rounds=5, aa_rounds=1, slow_b=0.0, noise=0.01, seed=1, levels=(8, 64), a="original",
             b="fixed", status="complete", simulated=True):
    """A whole A/B run folder: A/A rounds, then A/B rounds in seeded random order. B's latency scaled by 1+slow_b."""
    rng = np.random.default_rng(seed)
    run.mkdir(parents=True, exist_ok=True)
    plan = make_plan(rounds, aa_rounds, a, b, seed)  # the runner's own plan: A/A first, seeded arm order
    for blk in plan:
        make_block(run, blk.block_id, blk.round, blk.kind, blk.arm, blk.variant, levels=levels,
                   noise=noise, rng=rng, slow=slow_b if (blk.kind == "ab" and blk.arm == "B") else 0.0,
                   simulated=simulated)
    (run / "manifest.json").write_text(json.dumps({
        "schema": records.AB_SCHEMA, "run_id": run.name, "variants": {"A": a, "B": b},
        "backend": {"name": "sim" if simulated else "vllm"}, "plan": plan_to_list(plan), "status": status, "seeds": {"order": seed}}))
    return run


def listening_addresses(port: int) -> set[str]:
    """Local addresses in LISTEN state on `port`, from /proc/net/tcp{,6} (hex: 0100007F = 127.0.0.1)."""
    found = set()
    for name in ("tcp", "tcp6"):
        try:
            lines = open(f"/proc/net/{name}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            addr, p = local.split(":")
            if state == "0A" and int(p, 16) == port:
                found.add(addr)
    return found


@pytest.fixture
def new_run(tmp_path, monkeypatch):
    """plan.new_run as `make ab` calls it (no git/docker/nvidia-smi probes), on the fast simulator profile."""
    from loadtest import ab, plan, provenance

    monkeypatch.setattr(provenance, "_run_quiet", lambda cmd, timeout=5.0: None)

    def make(*args):
        a = ab.parse_args(["--out", str(tmp_path), "--name", f"r{len(list(tmp_path.iterdir()))}", "--sim-config",
                           "configs/sim/fast.yaml", "--levels", "4,8", "--count-s", "1", "--seed", "5", *args])
        return plan.new_run(a)
    return make


def example_results(summary: dict | None = None, comparison: dict | None = None):
    """reports/example's statistics, typed, with some top-level fields replaced: a report part on a known run."""
    s, c = read_results(ROOT / "reports" / "example")
    return dataclasses.replace(s, **(summary or {})), dataclasses.replace(c, **(comparison or {}))

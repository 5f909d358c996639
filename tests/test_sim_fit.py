"""The fit (ttssim.fit) and the virtual engine (ttssim.virtual): known answers, recovery of known parameters from
synthetic data made by the simulator's own rules, the run-fit CLI and the prediction interval."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from tts_predictor import metrics as M
from ttssim import fit, public, realfit, virtual
from ttssim.config import load_config
from ttssim.model import gpu_host_variant_step_s


def cfg_with(**model):
    base = load_config(None, ["audio.initial_chunk_frames=1"])
    return dataclasses.replace(base, model=dataclasses.replace(base.model, **model))


def test_lone_request_known_answer():
    """One request of 30 frames: 30 steps (the first with its prefill); first chunk after 1 frame, the last at 30."""
    cfg = cfg_with(base_ms=10.0, per_request_ms=1.0, prefill_ms=5.0, code2wav_chunk_ms=20.0)
    step = lambda admitted: 0.010 + 0.001 + 0.005 * admitted + gpu_host_variant_step_s("fixed", 1)  # noqa: E731
    r = virtual.run(cfg, virtual.Workload(1, 1, (30,)), "fixed")
    assert r.outcomes[0].ttfa_s == pytest.approx(step(1) + 0.020)
    assert r.outcomes[0].e2e_s == pytest.approx(step(1) + 29 * step(0) + 0.020)


def test_batch_limit_queues_and_caps_throughput():
    """c=8 against a batch limit of 4 with equal requests: two waves, the second waits for the first."""
    cfg = cfg_with(base_ms=10.0, per_request_ms=0.0, prefill_ms=0.0, code2wav_chunk_ms=0.0, max_batch_size=4)
    r = virtual.run(cfg, virtual.Workload(8, 8, (20,)), "vectorized")
    step = 0.010 + gpu_host_variant_step_s("vectorized", 4)
    e2e = sorted(o.e2e_s for o in r.outcomes)
    assert e2e[:4] == pytest.approx([20 * step] * 4) and e2e[4:] == pytest.approx([40 * step] * 4)
    assert max(o.ttfa_s for o in r.outcomes) == pytest.approx(21 * step)  # the second wave's first frame
    assert r.batch_sum / r.steps == pytest.approx(4.0)


def test_warmups_finish_before_the_measured_phase():
    cfg = cfg_with(base_ms=10.0, per_request_ms=0.0, prefill_ms=0.0, code2wav_chunk_ms=0.0)
    r = virtual.run(cfg, virtual.Workload(2, 4, (10,), warmups=2), "vectorized")
    assert len(r.outcomes) == 4
    step = 0.010 + gpu_host_variant_step_s("vectorized", 2)
    assert r.duration_s == pytest.approx(2 * 10 * step)  # two measured rounds of 10 steps, none of the warm-up


def test_public_fit_recovers_known_parameters():
    """'Public' points made by the virtual engine at known parameters; the fit, started elsewhere, finds them."""
    base = load_config(None, [f"model.max_batch_size={fit.CI_TALKER_MAX_SEQS}", "model.prefill_ms=10",
                              "model.code2wav_chunk_ms=0", "audio.initial_chunk_frames=1"])
    truth = (12.0, 1.5, 120.0, 15.0)  # base, per request, first-chunk and later-chunk decode of the one decoder
    cfg = fit.with_params(base, fit.CI_PARAMS, truth)
    pts = [p for p in public.CI_POINTS if p.fit]
    made = fit.predict_points(cfg, public.CI_SETUP, public.CI_FRAMES, pts)
    synthetic = [dataclasses.replace(p, value=m) for p, m in zip(pts, made, strict=True)]
    res, _ = fit.fit_ci(base, x0=(6.0, 0.7, 60.0, 30.0), points=synthetic)
    assert res.values[:3] == pytest.approx(truth[:3], rel=0.02)
    # the later-chunk decode shows only where the decoder is the busy stage (c=64): it is found less tightly
    assert res.values[3] == pytest.approx(truth[3], rel=0.06)
    assert res.chi2 < 0.05


def write_synthetic_run(root: Path, truth: dict, levels=(1, 4, 8, 16), variants=("original", "fixed")) -> None:
    """A run folder in the A/B runner's layout (blocks/*/counters.jsonl start/end snapshots, requests.jsonl), its
    step clock made by the virtual engine at `truth`: what a real GPU server's plugin would have exported."""
    cfg = cfg_with(max_batch_size=16, code2wav_chunk_ms=0.0, **truth)
    for bi, variant in enumerate(variants):
        block = root / "blocks" / f"{bi:03d}-r0-ab-{variant}"
        block.mkdir(parents=True)
        counters, requests = [], []
        totals = {}
        for step_i, c in enumerate(levels):
            frames = tuple(20 + 7 * ((i * 5) % 9) + 3 * c for i in range(12))
            r = virtual.run(cfg, virtual.Workload(c, 3 * c, frames), variant, keep_steps=True)
            start = dict(totals)
            for batch, admitted, dur in r.step_log:
                totals[f'{M.STEP_INTERVAL}_sum{{variant="{variant}"}}'] = totals.get(
                    f'{M.STEP_INTERVAL}_sum{{variant="{variant}"}}', 0.0) + dur
                totals[f'{M.STEP_INTERVAL}_count{{variant="{variant}"}}'] = totals.get(
                    f'{M.STEP_INTERVAL}_count{{variant="{variant}"}}', 0.0) + 1
                totals[M.STEP_BATCH + "_sum"] = totals.get(M.STEP_BATCH + "_sum", 0.0) + batch
                totals[M.STEP_BATCH + "_count"] = totals.get(M.STEP_BATCH + "_count", 0.0) + 1
                totals[f'{M.SECONDS}_sum{{variant="{variant}"}}'] = totals.get(
                    f'{M.SECONDS}_sum{{variant="{variant}"}}', 0.0) + gpu_host_variant_step_s(variant, batch)
                for _ in range(admitted):
                    requests.append({"schema": "tts-request/1", "step": step_i, "concurrency": c, "phase": "measure",
                                     "variant": variant, "ok": True})
            for edge, samples in (("start", start), ("end", dict(totals))):
                counters.append({"schema": "tts-counters/1", "kind": "snapshot", "step": step_i, "concurrency": c,
                                 "edge": edge, "ok": True, "samples": samples})
        (block / "counters.jsonl").write_text("".join(json.dumps(x) + "\n" for x in counters))
        (block / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in requests))


def test_run_fit_recovers_known_step_parameters(tmp_path):
    truth = {"base_ms": 7.0, "per_request_ms": 0.6, "prefill_ms": 4.0}
    write_synthetic_run(tmp_path, truth)
    res = realfit.fit_windows(realfit.read_windows(tmp_path))
    got = dict(zip(res.names, res.values, strict=True))
    assert got == pytest.approx(truth, rel=1e-6, abs=1e-9)


@pytest.mark.slow  # the CLI as a process
def test_run_fit_cli_writes_a_loadable_config(tmp_path):
    truth = {"base_ms": 9.0, "per_request_ms": 1.2, "prefill_ms": 6.0}
    write_synthetic_run(tmp_path / "run", truth)
    out = tmp_path / "fitted.yaml"
    p = subprocess.run([sys.executable, "-m", "ttssim.fit", str(tmp_path / "run"), "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    cfg = load_config(out)
    assert (cfg.model.base_ms, cfg.model.per_request_ms, cfg.model.prefill_ms) == pytest.approx((9.0, 1.2, 6.0))
    stored = json.loads(Path(str(out) + ".fit.json").read_text())
    assert stored["names"] == ["base_ms", "per_request_ms", "prefill_ms"] and len(stored["cov"]) == 3


@pytest.mark.slow  # the CLI as a process
@pytest.mark.parametrize("make", ["missing", "empty", "no_clock"])
def test_run_fit_cli_refuses_bad_input_in_one_line(tmp_path, make):
    run = tmp_path / "run"
    if make != "missing":
        (run / "blocks" / "000").mkdir(parents=True)
    if make == "no_clock":
        snap = {"kind": "snapshot", "step": 0, "concurrency": 8, "ok": True, "samples": {M.STEPS: 1.0}}
        (run / "blocks" / "000" / "counters.jsonl").write_text(
            json.dumps(snap | {"edge": "start"}) + "\n" + json.dumps(snap | {"edge": "end"}) + "\n")
    p = subprocess.run([sys.executable, "-m", "ttssim.fit", str(run)], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("ttssim.fit: ")


def test_effect_interval_carries_the_fit_uncertainty():
    cfg = load_config(ROOT / "configs/sim/h100-0.6b-b8.yaml")
    stored = fit.load_fit(ROOT / "configs/sim/h100-0.6b-b8.yaml")
    res = fit.fit_from_dict(stored)
    frames = fit.seed_frames(stored["seed_mean_frames"][0])
    est, lo, hi = fit.effect_interval(res, cfg, 8, frames)
    assert lo < est < hi < 0  # fixed is predicted faster, and the interval says by how much
    tight = dataclasses.replace(res, cov=(np.asarray(res.cov) / 100).tolist())
    est2, lo2, hi2 = fit.effect_interval(tight, cfg, 8, frames)
    assert est2 == pytest.approx(est) and (hi2 - lo2) == pytest.approx((hi - lo) / 10, rel=0.05)


def test_stored_profiles_reproduce_their_fit():
    """The committed profiles are what `python -m ttssim.fit --public` fits today (no hand edits, no drift)."""
    f = fit.public_fits()
    for name, key in (("h100-1.7b-ci.yaml", "ci"), ("h100-0.6b-b8.yaml", "seed")):
        stored = fit.load_fit(ROOT / "configs/sim" / name)
        if key == "ci":
            assert stored["values"] == pytest.approx(f["ci"].values, rel=1e-6)
        else:
            assert stored["values"][0] == pytest.approx(f["seed"].values[0], rel=1e-6)
        assert stored["fidelity"].startswith("SIMULATED -- model vs ")


@pytest.mark.slow
def test_run_fit_recovers_known_parameters_from_the_real_simulator(tmp_path):
    """The real simulator process (known step parameters, its step clock on /metrics) driven at three levels; the
    run fit recovers the parameters. Tolerances leave room for the event loop's lateness on a busy machine."""
    import asyncio

    import httpx

    from loadtest.scraper import samples
    from tools.sim_server import SimServer

    truth = {"base_ms": 20.0, "per_request_ms": 2.0, "prefill_ms": 6.0}
    sets = [f"model.{k}={v}" for k, v in truth.items()] + ["model.max_batch_size=16", "model.code2wav_chunk_ms=1"]
    counters, requests = [], []

    async def level(url: str, step_i: int, c: int, n: int, chars: int) -> None:
        async with httpx.AsyncClient(timeout=60.0, limits=httpx.Limits(max_connections=None)) as s:
            start = samples((await s.get(url + "/metrics")).text)
            sem = asyncio.Semaphore(c)

            async def one():
                async with sem:
                    r = await s.post(url + "/v1/audio/speech", json={"input": "x" * chars})
                    assert r.status_code == 200
                    requests.append({"step": step_i, "concurrency": c, "phase": "measure", "variant": "vectorized"})

            await asyncio.gather(*(one() for _ in range(n)))
            end = samples((await s.get(url + "/metrics")).text)
        for edge, snap in (("start", start), ("end", end)):
            counters.append({"kind": "snapshot", "step": step_i, "concurrency": c, "edge": edge, "ok": True,
                             "samples": snap})

    with SimServer("vectorized", config="configs/sim/fast.yaml", overrides=sets) as sim:
        for i, (c, n, chars) in enumerate(((1, 3, 40), (4, 12, 30), (12, 36, 25))):
            asyncio.run(level(sim.url, i, c, n, chars))
    block = tmp_path / "blocks" / "000-r0-ab-A"
    block.mkdir(parents=True)
    (block / "counters.jsonl").write_text("".join(json.dumps(x) + "\n" for x in counters))
    (block / "requests.jsonl").write_text("".join(json.dumps(x) + "\n" for x in requests))
    res = realfit.fit_windows(realfit.read_windows(tmp_path))
    got = dict(zip(res.names, res.values, strict=True))
    print("recovered from the real simulator:", got)
    assert got["base_ms"] == pytest.approx(truth["base_ms"], rel=0.15)
    assert got["per_request_ms"] == pytest.approx(truth["per_request_ms"], rel=0.25)


@pytest.mark.slow
def test_fidelity_benchmark_quick_mode_writes_every_public_point(tmp_path):
    out = tmp_path / "fidelity.md"
    p = subprocess.run([sys.executable, "-m", "tools.fidelity", "--quick", "--out", str(out)], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    md = out.read_text()
    for point in public.ALL_POINTS:
        if point.metric != "effect_e2e_pct":
            assert f"| {point.level} |" in md or f"| {point.variant} |" in md
    summary = json.loads(out.with_suffix(".json").read_text())["summary"]
    assert summary["ci"].startswith("SIMULATED") and summary["seed"].startswith("SIMULATED")
    assert "Fixed vs original, p50 E2E at c=8: public **-3.5 %**" in md

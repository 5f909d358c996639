"""Synthetic version-2 A/B run folders with known answers, written with the record contract's own dataclasses.

Until the runner writes real version-2 runs, these are what the statistics and the report are tested on: manifest
(tts-ab/2: experiment and arms, design with its sequential settings, settings, the pre-registered analysis), the effective scenario, server starts
(start.json with switches and evidence) and windows (block.json with level order, start, position, attempt;
requests with continuity fields; counters with count and measure windows, control writes and snapshots that may
carry vllm_omni series; telemetry samples). Every window runs a closed loop of c users per level whose latency the
caller sets, so throughput = c / latency exactly when there is no per-request noise: the known answers.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from tts_predictor import metrics as pm
from tts_predictor.domain import CALLS_PER_STEP
from ttsrecords import outcomes as oc
from ttsrecords import records as rec
from ttsrecords import runsettings as rs

T0 = 1_800_000_000.0
AUDIO_S = 4.0  # every request asks for 4 s of audio = 50 codec frames
AUDIO_NOISE = 0.05  # sd of ln(audio seconds) of one answer around its prompt's length (write_run's prompt_audio)
PHASE_S = {"count": 1.0, "warmup": 1.0, "measure": 6.0, "drain": 1.5}
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, math.inf)


@dataclass
class Window:
    """One window to write: its place in the design and, per level, its mean latency (s) and failed requests."""

    round: int
    kind: str  # "ab" | "aa"
    arm: str  # "A" | "B"
    variant: str | None
    start: int
    position: int
    latency: dict[int, float]
    failures: dict[int, int] = field(default_factory=dict)  # level -> failed measure-phase requests
    underrun_s: float = 0.0  # total stall of every ok streamed request
    stalled_share: float = 0.0  # share of ok streamed requests with 0.25 s more stall (over the 100 ms threshold)
    status: str = "complete"
    reason: str | None = None
    audio_factor: float = 1.0  # this window's audio seconds per prompt x this (with write_run's prompt_audio)


def _requests(w: Window, level: int, t0: float, rng: np.random.Generator, noise: float, run_id: str,
              step: int, prompt_audio: tuple[float, ...] | None = None,
              ) -> tuple[list[rec.RequestRecord], dict[str, tuple[float, float]]]:
    """A closed loop of `level` users over count, warmup, measure and drain; returns the records and phase edges.
    prompt_audio: the audio seconds of prompts p0, p1, ... (cycled over the requests, x the window's audio_factor,
    x lognormal noise of sd AUDIO_NOISE: sampling makes every answer's length differ); None: prompt "p", AUDIO_S."""
    edges, t = {}, t0
    for ph in rec.PHASES:
        edges[ph] = (t, t + PHASE_S[ph])
        t += PHASE_S[ph]
    end = edges["drain"][1]
    mean = w.latency[level]
    out = []
    fail_left = w.failures.get(level, 0)
    for _user in range(level):
        t = t0 + float(rng.uniform(0, mean))
        while True:
            e2e = mean * (float(rng.lognormal(0.0, noise)) if noise else 1.0)
            phase = next(ph for ph in rec.PHASES if edges[ph][0] <= t < edges[ph][1]) if t < end else None
            if phase is None or t + e2e > end:
                break
            if phase == "measure" and fail_left:
                fail_left -= 1
                out.append(rec.RequestRecord(run_id, "local", step, level, phase, "stream", False, "http 503: busy", 503,
                                             None, 0.01, None, None, 0, t, "p", "short", w.variant, len(out)))
                t += 0.01
                continue
            ttfa = 0.3 * mean
            stalled = bool(rng.random() < w.stalled_share)
            under = w.underrun_s + (0.25 if stalled else 0.0)
            prompt, audio = "p", AUDIO_S
            if prompt_audio:
                k = len(out) % len(prompt_audio)
                prompt = f"p{k}"
                audio = prompt_audio[k] * w.audio_factor * float(rng.lognormal(0.0, AUDIO_NOISE))
            out.append(rec.RequestRecord(run_id, "local", step, level, phase, "stream", True, None, 200, ttfa, e2e,
                                         audio, e2e / audio, 192_000, t, prompt, "short", w.variant, len(out),
                                         underrun_s=under, continuity_ok=under <= rec.UNDERRUN_THRESHOLD_S,
                                         stream_rtf=(e2e - ttfa) / audio, chunks=5))
            t += e2e
    return out, edges


def _omni_samples(done: list[rec.RequestRecord], upto: float) -> dict[str, float]:
    """vllm_omni series as a 0.30.0 server would expose them at time `upto`: cumulative over finished requests."""
    fin = [r for r in done if r.ok and r.t_start + r.e2e_s <= upto]
    lab = 'model_name="m"'
    out = {f"vllm_omni:e2e_request_latency_s_count{{{lab}}}": float(len(fin)),
           f"vllm_omni:e2e_request_latency_s_sum{{{lab}}}": float(sum(r.e2e_s for r in fin)),
           f'vllm_omni:requests_success_total{{finished_reason="stop",{lab}}}': float(len(fin))}
    for le in BUCKETS:
        key = "+Inf" if math.isinf(le) else f"{le}"
        out[f'vllm_omni:e2e_request_latency_s_bucket{{le="{key}",{lab}}}'] = float(sum(r.e2e_s <= le for r in fin))
    for stage, share in (("0", 0.8), ("1", 0.2)):
        sl = f'{lab},replica="0",stage="{stage}",stage_type="llm"'
        out[f"vllm_omni:stage_gen_time_s_count{{{sl}}}"] = float(len(fin))
        out[f"vllm_omni:stage_gen_time_s_sum{{{sl}}}"] = float(sum(share * r.e2e_s for r in fin))
    return out


def _counters(w: Window, level: int, step: int, edges: dict, reqs: list[rec.RequestRecord], simulated: bool,
              omni: bool, epoch: int) -> list[dict]:
    """Control writes, snapshots and deltas of one level (count window with the observer on, measure window off)."""
    out: list[dict] = []
    has_control = w.variant is not None
    target = "http://127.0.0.1:1/metrics"

    def snap(edge: str, t: float) -> dict:
        samples = {f'tts_predictor_info{{backend="{"simulated" if simulated else "vllm-omni"}",'
                   f'variant="{w.variant}"}}': 1.0} if has_control else {}
        if omni:
            samples.update(_omni_samples(reqs, t))
        return rec.CounterSnapshot(step, level, edge, t, target, True, None, samples).to_dict()

    steps = int(PHASE_S["measure"] / 0.02)
    calls = steps * CALLS_PER_STEP
    tokens = steps * 16 * level
    spc = {"original": 3e-5, "fixed": 2e-5}.get(w.variant or "", 1e-5)  # a saving of 7.5 ms per 50-frame request
    if has_control:
        out.append(rec.ControlWrite(step, level, "count", edges["count"][0], w.variant, True, epoch).to_dict())
        out.append(snap("count_start", edges["count"][0]))
        out.append(snap("count_end", edges["count"][1]))
        ocalls, otok = calls // 6, tokens // 6
        out.append(rec.CounterDelta(step, level, target, PHASE_S["count"], w.variant, ocalls, ocalls * spc,
                                    pm.expected_syncs(w.variant, ocalls, otok), ocalls, otok, otok, ocalls * level,
                                    steps // 6, PHASE_S["count"], (steps // 6) * level, None, None, None, None, None,
                                    float(level), window="count", variants_moved=(w.variant,)).to_dict())
        out.append(rec.ControlWrite(step, level, "warmup", edges["warmup"][0], w.variant, False, epoch + 1).to_dict())
    out.append(snap("start", edges["measure"][0]))
    out.append(snap("end", edges["measure"][1]))
    n_meas = sum(r.phase == "measure" and r.ok for r in reqs)
    out.append(rec.CounterDelta(step, level, target, PHASE_S["measure"], w.variant, calls, calls * spc,
                                0.0 if has_control else None, 0.0 if has_control else None, 0.0 if has_control else None,
                                tokens, calls * level, steps, PHASE_S["measure"], steps * level, n_meas, None, None,
                                calls / max(n_meas, 1), None, float(level), window="measure",
                                variants_moved=(w.variant,) if has_control else ()).to_dict())
    return out


def _telemetry(t0: float, t1: float, source: str, rng: np.random.Generator, busy: float) -> list[dict]:
    out, t = [], t0
    while t < t1:
        if source == "nvml":
            s = rec.TelemetrySample(t, "nvml", gpu=0, gpu_util_pct=min(100.0, 60 + 30 * busy + rng.normal(0, 2)),
                                    sm_clock_mhz=1980.0, mem_used_mib=30_000.0 + 100 * busy, power_w=300 + 100 * busy)
        else:
            s = rec.TelemetrySample(t, "process", cpu_pct=80 + 40 * busy + float(rng.normal(0, 3)), rss_mib=512.0)
        out.append(s.to_dict())
        t += 0.5
    return out


def write_run(run: Path, windows: list[Window], *, levels=(2, 8), design: str = "fresh", noise: float = 0.05,
              seed: int = 1, simulated: bool = True, telemetry: str | None = "process", omni: bool = False,
              manifest: dict | None = None, scenario: dict | None = None, sim_config: str | None = None,
              switches: bool | None = None, sequential: tuple[int | None, int] | None = None,
              analysis: dict | None = None, planned_rounds: int | None = None,
              prompt_audio: tuple[float, ...] | None = None) -> Path:
    """Write a version-2 run folder from window specs (in run order). `manifest` entries are merged over the
    defaults; `switches` (default: design swap/nested) records a variant switch at each window's start.
    `sequential` (min_rounds, max_rounds) and `analysis` (runsettings.analysis keywords) go where the planner puts
    them, through the planner's own functions (ttsrecords.runsettings). `planned_rounds`: a run still in progress,
    whose plan holds that many rounds (its later rounds not run yet). `prompt_audio`: see _requests."""
    rng = np.random.default_rng(seed)
    order = random.Random(seed)
    run.mkdir(parents=True, exist_ok=True)
    switches = design in ("swap", "nested") if switches is None else switches
    starts: dict[int, rec.StartRecord] = {}
    t = T0
    plan = []
    for i, w in enumerate(windows):
        block_id = f"{i:03d}-r{w.round}-{w.kind}-{w.arm}"
        plan.append({"block_id": block_id, "round": w.round, "kind": w.kind, "arm": w.arm, "variant": w.variant,
                     "start": w.start, "position": w.position})
        d = run / "blocks" / block_id
        d.mkdir(parents=True)
        lv_order = list(levels)
        order.shuffle(lv_order)
        st = starts.setdefault(w.start, rec.StartRecord(w.start, "A" if design != "fresh" else w.arm, "stopped",
                                                        None, "2026-01-01T00:00:00Z", 12.0, "x", 2.0,
                                                        evidence={"ok": True, "reason": None}))
        st.windows.append(block_id)
        if switches:
            st.switches.append({"t": t + 0.02, "variant": w.variant, "epoch": 10 * i, "confirmed_t": t + 0.06})
        reqs, ctrs, tel = [], [], []
        w_start = t
        for step, lv in enumerate(lv_order):
            r, edges = _requests(w, lv, t, rng, noise, block_id, step, prompt_audio)
            reqs += r
            ctrs += _counters(w, lv, step, edges, r, simulated, omni, 10 * i + 2 * step)
            if telemetry:
                tel += _telemetry(t, edges["drain"][1], telemetry, rng, lv / max(levels))
            t = edges["drain"][1] + 0.5
        req_rows = [r.to_dict() for r in reqs]
        outcomes = oc.request_outcomes(req_rows)
        block = rec.BlockRecord(block_id, w.round, w.kind, w.arm, w.variant, start=w.start, position=w.position,
                                levels=lv_order, epoch=10 * i, attempt=0, status=w.status, reason=w.reason,
                                started="2026-01-01T00:00:00Z", ended="2026-01-01T00:01:00Z",
                                server_url="http://127.0.0.1:1", timing={"load_s": t - w_start},
                                requests=outcomes)
        rec.write_json(d / "block.json", block.to_dict())
        for name, rows in (("requests.jsonl", req_rows), ("counters.jsonl", ctrs),
                           ("telemetry.jsonl", tel)):
            if rows:
                with rec.JsonlWriter(d / name) as f:
                    for row in rows:
                        f.write(row)
        (d / "scenario.yaml").write_text(yaml.safe_dump({"steps": [{"concurrency": c} for c in lv_order]}))
        t += 2.0
    for s in starts.values():
        (run / "starts" / str(s.start)).mkdir(parents=True, exist_ok=True)
        rec.write_json(run / "starts" / str(s.start) / "start.json", s.to_dict())
    variants = {"A": next((w.variant for w in windows if w.arm == "A"), None),
                "B": next((w.variant for w in windows if w.arm == "B" and w.kind == "ab"), None)}
    man = {"schema": rec.AB_SCHEMA, "run_id": run.name, "status": "complete", "variants": variants,
           "backend": {"name": "sim" if simulated else "vllm", "simulated": simulated}, "design": {"name": design},
           "experiment": {"name": "synthetic", "idea": "known answers", "primary_metric": "throughput_rps",
                          "confounded": None,
                          "arms": {a: {"arm": a, "label": f"arm {a}", "backend": "sim" if simulated else "vllm",
                                       "variant": variants[a], "sim_config": sim_config, "sim_set": [],
                                       "evidence": "sync counters"} for a in ("A", "B")}},
           "settings": {}, "plan": plan, "started": "2026-01-01T00:00:00Z", "ended": "2026-01-01T01:00:00Z"}
    if sim_config:
        man["sim_config"] = {"path": sim_config}
    for k, v in (manifest or {}).items():
        man[k] = v
    last = max(w.round for w in windows)
    for r in range(last + 1, planned_rounds or 0):
        man["status"] = "running"
        man["plan"] += [{"block_id": f"{len(man['plan']) + k:03d}-r{r}-ab-{arm}", "round": r, "kind": "ab",
                         "arm": arm, "variant": variants[arm], "start": len(man["plan"]) + k, "position": k}
                        for k, arm in enumerate("AB")]
    ab_rounds = [w for w in windows if w.kind == "ab" and w.arm == "A"]
    per_start = max((sum(x.start == w.start for x in ab_rounds) for w in ab_rounds), default=1)
    rs.record(man, sequential=None if sequential is None else rs.sequential(
        sequential[0], sequential[1], design=design, window_pairs=per_start if design == "nested" else None),
        analysis=None if analysis is None else rs.analysis(**analysis))
    rec.write_json(run / "manifest.json", man)
    (run / "scenario.yaml").write_text(yaml.safe_dump({"steps": [{"concurrency": c} for c in levels],
                                                      **(scenario or {})}))
    return run


def fresh(run: Path, *, rounds: int = 5, aa_rounds: int = 1, b_factor: float = 1.0, latency: float = 0.2,
          aa_factor: float = 1.0, failures: Callable[[int, str], dict] | None = None, seed: int = 1,
          levels=(2, 8), a: str = "original", b: str = "fixed", b_audio_factor: float = 1.0, **kw) -> Path:
    """A fresh-design run: each window its own start; A/A rounds interleaved at seeded positions; arm order per round
    seeded. B's latency is `b_factor` x A's (throughput ratio 1/b_factor); aa_factor scales the second A/A window
    (a bias); failures(ab_index, arm) -> {level: failed requests}, ab_index counting the A/B rounds from 0.
    b_audio_factor: B's audio seconds per prompt x this in the A/B rounds (with prompt_audio=...)."""
    rng = random.Random(seed)
    kinds = ["ab"] * rounds
    for _ in range(aa_rounds):
        kinds.insert(rng.randrange(1, len(kinds) + 1), "aa")
    wins, start, ab_index = [], 0, -1
    for r, kind in enumerate(kinds):
        ab_index += kind == "ab"
        arms = ["A", "B"] if rng.random() < 0.5 else ["B", "A"]
        for pos, arm in enumerate(arms):
            factor = (b_factor if kind == "ab" else aa_factor) if arm == "B" else 1.0
            variant = a if (kind == "aa" or arm == "A") else b
            wins.append(Window(r, kind, arm, variant, start, pos, {c: latency * factor for c in levels},
                               failures=(failures(ab_index, arm) if failures and kind == "ab" else {}),
                               audio_factor=b_audio_factor if (kind == "ab" and arm == "B") else 1.0))
            start += 1
    return write_run(run, wins, levels=levels, design="fresh", seed=seed, **kw)


def nested(run: Path, *, starts: int, pairs: int, d: Callable[[int, int], float], latency: float = 0.2,
           seed: int = 2, levels=(4,), carry_over: float = 0.0, **kw) -> Path:
    """A nested run: `starts` server starts of `pairs` window pairs each, pair order alternating AB/BA inside a
    start (first order alternating over starts). d(start, pair) is the designed ln(throughput B/A) of that pair;
    carry_over adds to d of every pair run A then B (an order effect)."""
    wins, r = [], 0
    for s in range(starts):
        for p in range(pairs):
            ab_first = (s + p) % 2 == 0
            dd = d(s, p) + (carry_over if ab_first else 0.0)
            lat = {"A": {c: latency for c in levels}, "B": {c: latency * math.exp(-dd) for c in levels}}
            arms = ("A", "B") if ab_first else ("B", "A")
            for pos, arm in enumerate(arms):
                wins.append(Window(r, "ab", arm, "original" if arm == "A" else "fixed", s, pos, lat[arm]))
            r += 1
    return write_run(run, wins, levels=levels, design="nested", seed=seed, **kw)


def designed_effects(values: int, var: float, centred: bool = True) -> list[float]:
    """`values` numbers with mean 0 and sample variance (ddof 1) exactly `var` (alternating +-, scaled)."""
    base = np.array([(-1.0) ** i for i in range(values)])
    base = base - base.mean()
    return list(base * math.sqrt(var / base.var(ddof=1)))


def load_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def showcase(run: Path, *, seed: int = 5, telemetry: str = "nvml", looks: bool = True) -> Path:
    """A nested run with every report part in use: 3 starts x 3 window pairs and an A/A pair per start, B 4 %
    faster with a stall share, one B window with failed requests, GPU telemetry, vllm_omni series, a fitted simulator
    config (model prediction), a confounded release comparison, sequential settings and two looks."""
    rng = random.Random(seed)
    wins, r = [], 0
    for s in range(3):
        kinds = ["ab", "ab", "ab"]
        kinds.insert(rng.randrange(0, 4), "aa")
        for kind in kinds:
            arms = ["A", "B"] if rng.random() < 0.5 else ["B", "A"]
            start_eff = 0.01 * (s - 1)
            for pos, arm in enumerate(arms):
                f = math.exp(-0.04 - start_eff) if (arm == "B" and kind == "ab") else 1.0
                wins.append(Window(r, kind, arm, "fixed" if (arm == "B" and kind == "ab") else "original", s, pos,
                                   {c: 0.2 * f * (1 + c / 32) for c in (2, 8)},
                                   failures={8: 4} if (s == 1 and kind == "ab" and arm == "B"
                                                       and not any(x.failures for x in wins)) else {},
                                   stalled_share=0.3 if (arm == "B" and kind == "ab") else 0.05))
            r += 1
    write_run(run, wins, design="nested", seed=seed, telemetry=telemetry, omni=True,
              sim_config="configs/sim/default.yaml",
              sequential=(3, 9),
              manifest={"experiment": {"name": "showcase", "idea": "every part of the report",
                                       "primary_metric": "throughput_rps",
                                       "confounded": "vllm-omni 0.16.0 + fixed vs 0.30.0 (synthetic)",
                                       "arms": {"A": {"arm": "A", "label": "0.16.0 original", "backend": "sim",
                                                      "vllm_omni": "0.16.0", "image": "tts-vllm-omni:0.16.0-original",
                                                      "plugin": "installed, variant original", "variant": "original",
                                                      "sim_config": "configs/sim/default.yaml", "sim_set": []},
                                                "B": {"arm": "B", "label": "0.16.0 fixed", "backend": "sim",
                                                      "vllm_omni": "0.16.0", "image": "tts-vllm-omni:0.16.0-fixed",
                                                      "plugin": "installed, variant fixed", "variant": "fixed",
                                                      "sim_config": "configs/sim/default.yaml", "sim_set": []}}}},
              scenario={"margin_pct": 2.0})
    if looks:
        from ttsreport.looks import append_look, look

        append_look(run, look(run))
        append_look(run, look(run))
    return run

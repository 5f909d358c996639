"""Fit the simulator's step model to a real run (`python -m ttssim.fit reports/<run> --out configs/sim/fitted.yaml`).

The step clock (tts_predictor_step_interval_seconds, tts_predictor_step_batch_size) gives mean step time and batch per
window; minus the predictor's own measured time, what is left is regressed on (1, batch, admissions per step) by
ordinary least squares. When asked, the host noise (to the measured spread of whole requests) and code2wav's chunk
delay (to the measured p50 time to first audio) are fitted on top, each against the virtual engine's closed loop.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tts_predictor import domain
from tts_predictor import metrics as M
from ttsrecords.samples import stored_total

from . import model as sim_model
from . import virtual
from .config import FIT_SUFFIX, SimConfig
from .fit import FitResult, least_squares, with_params


@dataclass
class Window:
    """One (block, level) window of a run: what the step clock saw."""

    variant: str
    concurrency: int
    steps: float
    interval_s: float  # summed step intervals
    batch_sum: float
    predictor_s: float  # measured host time of build_attn_metadata in the window
    stall_s: float  # simulator only: modelled sync stall slept
    injected_s: float  # simulator only
    admissions: float


def read_windows(run: Path) -> list[Window]:
    """Windows from reports/<run>/blocks/*/counters.jsonl (start/end snapshots) and requests.jsonl."""
    files = sorted(run.glob("blocks/*/counters.jsonl")) or sorted(run.glob("counters.jsonl"))
    if not files:
        raise ValueError(f"{run}: no counters.jsonl (expected blocks/*/counters.jsonl)")
    out = []
    for f in files:
        snaps: dict[int, dict[str, dict]] = {}
        conc: dict[int, int] = {}
        for line in f.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "snapshot" and rec.get("ok", True) and rec.get("edge") in ("start", "end"):
                snaps.setdefault(rec["step"], {})[rec["edge"]] = rec["samples"]
                conc[rec["step"]] = int(rec.get("concurrency") or 0)
        reqs = f.parent / "requests.jsonl"
        admitted: dict[int, int] = {}
        variant_of_block = None
        if reqs.is_file():
            for line in reqs.read_text(encoding="utf-8").splitlines():
                r = json.loads(line)
                variant_of_block = r.get("variant", variant_of_block)
                if r.get("phase", "measure") == "measure":
                    admitted[r["step"]] = admitted.get(r["step"], 0) + 1
        for step, pair in sorted(snaps.items()):
            if "start" not in pair or "end" not in pair:
                continue
            a, b = pair["start"], pair["end"]
            d = {name: (stored_total(b, name) or 0.0) - (stored_total(a, name) or 0.0) for name in (
                M.STEP_INTERVAL + "_sum", M.STEP_INTERVAL + "_count", M.STEP_BATCH + "_sum", M.STEP_BATCH + "_count",
                M.SECONDS + "_sum", M.SIM_STALL_SECONDS, M.SIM_INJECTED_SECONDS, M.SIM_PREFILLS)}
            if d[M.STEP_INTERVAL + "_count"] <= 0:
                continue
            variant = next((k.split('variant="')[1].split('"')[0] for k in b if k.startswith(M.STEP_INTERVAL + "_sum{")
                            and 'variant="' in k), variant_of_block or "?")
            adm = d[M.SIM_PREFILLS] if any(k.startswith(M.SIM_PREFILLS) for k in b) else admitted.get(step, 0)
            out.append(Window(variant, conc.get(step, 0), d[M.STEP_INTERVAL + "_count"], d[M.STEP_INTERVAL + "_sum"],
                              d[M.STEP_BATCH + "_sum"], d[M.SECONDS + "_sum"], d[M.SIM_STALL_SECONDS],
                              d[M.SIM_INJECTED_SECONDS], adm))
    if not out:
        raise ValueError(f"{run}: no window with {M.STEP_INTERVAL} samples (a run from before the step clock?)")
    return out


def whole_step(windows: Sequence[Window]) -> list[Window]:
    """The windows with the predictor's measured time left inside the rest of the step: for a profile whose
    variant host time is not modelled apart (the CPU server's, predicted with no_host_time)."""
    return [dataclasses.replace(w, predictor_s=0.0) for w in windows]


def no_host_time(variant: str, batch: int) -> float:
    """Variant host time of a whole-step profile: already inside base_ms and per_request_ms."""
    return 0.0


def measured_ok(run: Path, concurrency: int) -> list[dict]:
    """A run's measured ok requests with a TTFA at one level (its blocks' request files, or its own)."""
    recs = [json.loads(line) for f in (sorted(run.glob("blocks/*/requests.jsonl")) or [run / "requests.jsonl"])
            for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in recs if r.get("ok") and r.get("phase") == "measure" and r.get("concurrency") == concurrency
            and r.get("ttfa_s") is not None]


def measured_ttfa_p50(run: Path, concurrency: int) -> tuple[float, list[int]]:
    """(p50 time to first audio in s, frames of each request) of a run's measured ok requests at one level."""
    ok = measured_ok(run, concurrency)
    if not ok:
        raise ValueError(f"{run}: no measured ok request with a TTFA at c={concurrency}")
    frames = [max(1, round(r["audio_s"] * domain.CODEC_FRAME_RATE_HZ)) for r in ok]
    return virtual.median([r["ttfa_s"] for r in ok]), frames


def fit_code2wav(cfg: SimConfig, run: Path, levels: Sequence[int], variant: str = "fixed",
                 variant_step_s: Callable[[str, int], float] = no_host_time) -> FitResult:
    """code2wav_chunk_ms from the measured p50 TTFA at `levels` (step parameters and host noise already in cfg): the
    virtual engine's closed loop at each level (virtual.closed_loop), residual ln(model/measured)."""
    targets = [(c, *measured_ttfa_p50(run, c)) for c in levels]

    def fun(x):
        c2 = with_params(cfg, ["code2wav_chunk_ms"], x)
        out = []
        for c, ttfa, frames in targets:
            runs = virtual.closed_loop(c2, c, frames, max(len(frames), 3 * c), variant, variant_step_s)
            out.append(math.log(virtual.median([o.ttfa_s for r in runs for o in r.outcomes]) / ttfa))
        return np.array(out)

    return least_squares(fun, [max(cfg.model.code2wav_chunk_ms, 1.0)], ["code2wav_chunk_ms"])


# the host noise (ttssim.model.StepNoise) is fitted to the spread of whole requests: p90 over p50 of time to first
# audio and of end-to-end latency at each fit level, against the virtual engine's closed loop (virtual.closed_loop:
# enough requests and seeds that its quantiles are the model's); the hold is chosen from NOISE_HOLDS_S (a spread that
# a request's own steps average away needs a hold of about a request's length or more)
NOISE_HOLDS_S = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
NOISE_MAX_SD = 1.0


def measured_spread(run: Path, concurrency: int) -> tuple[tuple[float, float], tuple[float, float], list[int]]:
    """((ln p90/p50 of TTFA, its bootstrap sd), (the same of E2E), frames of each request) of a run's measured ok
    requests at one level."""
    ok = measured_ok(run, concurrency)
    if len(ok) < 10:
        raise ValueError(f"{run}: {len(ok)} measured ok requests at c={concurrency}: too few for a spread (10)")
    frames = [max(1, round(r["audio_s"] * domain.CODEC_FRAME_RATE_HZ)) for r in ok]
    return (with_sd([r["ttfa_s"] for r in ok]), with_sd([r["e2e_s"] for r in ok]), frames)


def with_sd(values: Sequence[float], draws: int = 400) -> tuple[float, float]:
    """spread(values) and its bootstrap sd (seeded): how well a level's few requests pin their own p90 down."""
    rng = np.random.default_rng(0)
    v = np.asarray(values, dtype=float)
    boot = [spread(rng.choice(v, size=len(v))) for _ in range(draws)]
    return spread(values), max(float(np.std(boot)), 1e-3)


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile: the rule of every measured-vs-simulated comparison of a run's requests."""
    v = sorted(values)
    return v[min(len(v) - 1, max(0, math.ceil(q * len(v)) - 1))] if v else float("nan")


def spread(values: Sequence[float]) -> float:
    """ln(p90 / p50)."""
    return math.log(quantile(values, 0.9) / quantile(values, 0.5))


def fit_noise(cfg: SimConfig, run: Path, levels: Sequence[int], variant: str = "fixed",
              variant_step_s: Callable[[str, int], float] = no_host_time,
              holds: Sequence[float] = NOISE_HOLDS_S) -> FitResult:
    """step_noise_sd (least squares) for each hold in `holds`, and the hold with the smallest chi2 (its sd 0
    in the covariance: chosen, not estimated); residuals: the simulated minus the measured ln(p90/p50) of TTFA and
    of E2E at each fit level, each over its bootstrap sd."""
    targets = [(c, *measured_spread(run, c)) for c in levels]

    def fun_for(hold: float):
        def fun(x):
            # beyond NOISE_MAX_SD a step can shrink to nothing: no host is that noisy
            c2 = with_params(cfg, ["step_noise_sd", "step_noise_hold_s"], [min(x[0], NOISE_MAX_SD), hold])
            out = []
            for c, ttfa, e2e, frames in targets:
                got = [o for r in virtual.closed_loop(c2, c, frames, len(frames), variant, variant_step_s)
                       for o in r.outcomes]
                out += [(spread([o.ttfa_s for o in got]) - ttfa[0]) / ttfa[1],
                        (spread([o.e2e_s for o in got]) - e2e[0]) / e2e[1]]
            return np.array(out)
        return fun

    best = None
    for hold in holds:
        f = least_squares(fun_for(hold), [0.15], ["step_noise_sd"], iters=12)
        if best is None or f.chi2 < best[1].chi2:
            best = (hold, f)
    hold, f = best
    return FitResult(["step_noise_sd", "step_noise_hold_s"], [f.values[0], hold],
                     [[f.cov[0][0], 0.0], [0.0, 0.0]], f.chi2, f.dof, f.scale)


def merged(a: FitResult, b: FitResult) -> FitResult:
    """Two fits of disjoint parameters side by side (taken as independent)."""
    n = len(a.names) + len(b.names)
    cov = [[0.0] * n for _ in range(n)]
    for off, f in ((0, a), (len(a.names), b)):
        for i, row in enumerate(f.cov):
            for j, v in enumerate(row):
                cov[off + i][off + j] = v
    return FitResult(a.names + b.names, a.values + b.values, cov, a.chi2 + b.chi2, a.dof + b.dof,
                     max(a.scale, b.scale))


def fit_windows(windows: Sequence[Window]) -> FitResult:
    """OLS of the rest of a step (interval minus predictor time, stall and injected delay) on (1, batch,
    admissions per step), each window weighted by its step count; covariance from the residual variance."""
    rows, y, w = [], [], []
    for win in windows:
        n = win.steps
        rest = (win.interval_s - win.predictor_s - win.stall_s - win.injected_s) / n
        rows.append([1.0, win.batch_sum / n, win.admissions / n])
        y.append(rest * 1e3)
        w.append(n)
    X, Y, W = np.array(rows), np.array(y), np.array(w)
    keep = [j for j in range(3) if np.ptp(X[:, j]) > 1e-9 or j == 0][:len(windows)]  # no more unknowns than windows
    names = [("base_ms", "per_request_ms", "prefill_ms")[j] for j in keep]
    X = X[:, keep]
    sw = np.sqrt(W / W.mean())
    beta, *_ = np.linalg.lstsq(X * sw[:, None], Y * sw, rcond=None)
    res = (Y - X @ beta) * sw
    dof = max(len(Y) - len(beta), 1)
    s2 = float(res @ res) / dof
    cov = np.linalg.pinv((X * sw[:, None]).T @ (X * sw[:, None])) * s2
    return FitResult(names, [float(b) for b in beta], cov.tolist(), float(res @ res), dof, math.sqrt(s2))


def write_config(path: Path, base: SimConfig, fit: FitResult, header: str) -> None:
    """A config YAML with the fitted model values (the rest from `base`) and the fit beside it."""
    import yaml

    cfg = with_params(base, fit.names, fit.values)
    d = cfg.as_dict()
    body = {"model": {k: round(v, 4) if isinstance(v, float) else v for k, v in d["model"].items()},
            "audio": d["audio"]}
    text = "\n".join("# " + line for line in header.splitlines()) + "\n" + yaml.safe_dump(body, sort_keys=False)
    path.write_text(text, encoding="utf-8")
    Path(str(path) + FIT_SUFFIX).write_text(json.dumps(fit.as_dict(), indent=1) + "\n", encoding="utf-8")


def fit_run(run: Path, base: SimConfig, levels: Sequence[int] = (), whole: bool = False, noise: bool = False,
            ttfa: bool = False) -> tuple[FitResult, list[Window]]:
    """The step model fitted to a run's windows (those at `levels` when given; `whole`: the predictor's time left in
    the step), with the host noise (`noise`) and code2wav_chunk_ms (`ttfa`) on top, the rest of the model from
    `base`: the fit and the windows it saw."""
    if not run.is_dir():
        raise ValueError(f"{run}: not a directory")
    windows = read_windows(run)
    if levels:
        windows = [w for w in windows if w.concurrency in levels]
        if not windows:
            raise ValueError(f"{run}: no window at the levels {list(levels)}")
    if whole:
        windows = whole_step(windows)
    fit = fit_windows(windows)
    fit_levels = list(levels) or sorted({w.concurrency for w in windows})
    host = no_host_time if whole else sim_model.gpu_host_variant_step_s
    if noise:
        fit = merged(fit, fit_noise(with_params(base, fit.names, fit.values), run, fit_levels, variant_step_s=host))
    if ttfa:
        fit = merged(fit, fit_code2wav(with_params(base, fit.names, fit.values), run, fit_levels,
                                       variant_step_s=host))
    return fit, windows

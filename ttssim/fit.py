"""Fit the simulator's step-time model: to the public numbers (`python -m ttssim.fit --public`) or to a real A/B
run's counters and requests (`python -m ttssim.fit reports/<run> --out configs/sim/fitted.yaml`).

Public fit: weighted least squares (Levenberg-Marquardt on log parameters, residuals ln(model/public)/sigma) of the
virtual engine (ttssim.virtual) against ttssim.public, with the parameter covariance from the Jacobian. Run fit: the
step clock (tts_predictor_step_interval_seconds, tts_predictor_step_batch_size) gives mean step time and batch per
window; minus the predictor's own measured time, what is left is regressed on (1, batch, admissions per step) by
ordinary least squares. Results go beside the config as <config>.fit.json: parameters, covariance, residuals and
a one-line fidelity summary; `effect_interval` turns the covariance into a prediction interval for a level.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tts_predictor import domain
from tts_predictor import metrics as M
from ttsrecords.paths import ROOT
from ttsrecords.samples import stored_total

from . import model as sim_model
from . import public, virtual
from .config import FIT_SUFFIX, SimConfig, load_config


# --- predictions of the public metrics ------------------------------------------------------------------------
def level_metrics(cfg: SimConfig, load: virtual.Workload, variant: str,
                  variant_step_s: Callable[[str, int], float] = sim_model.gpu_host_variant_step_s,
                  ) -> dict[str, float]:
    """vllm bench serve's metrics for one level, from the virtual engine (units as in ttssim.public)."""
    r = virtual.run(cfg, load, variant, variant_step_s)
    fps = domain.CODEC_FRAME_RATE_HZ
    audio = [o.frames / fps for o in r.outcomes]
    return {
        "ttfp_p50": 1e3 * virtual.median([o.ttfa_s for o in r.outcomes]),
        "rtf_p50": virtual.median([o.e2e_s / a for o, a in zip(r.outcomes, audio, strict=True)]),
        "audio_tput": sum(audio) / r.duration_s if r.duration_s else float("nan"),
        "req_tput": len(r.outcomes) / r.duration_s if r.duration_s else float("nan"),
        "e2e_p50": 1e3 * virtual.median([o.e2e_s for o in r.outcomes]),
        "mean_batch": r.batch_sum / r.steps if r.steps else 0.0,
    }


def step_ms(cfg: SimConfig, batch: int, variant: str) -> float:
    """Modelled talker step at a steady batch (no admissions), ms."""

    return 1e3 * sim_model.step_target_s(cfg.model, batch, 0, sim_model.gpu_host_variant_step_s(variant, batch), 0,
                                         "cuda")


def predict_points(cfg: SimConfig, setup: public.Setup, frames: Sequence[int],
                   points: Sequence[public.Point]) -> list[float]:
    """Model value for each point of one setup."""
    cache: dict[tuple[int, str], dict[str, float]] = {}

    def at(level: int, variant: str) -> dict[str, float]:
        key = (level, variant)
        if key not in cache:
            n, w = next((n, w) for c, n, w in setup.levels if c == level)
            cache[key] = level_metrics(cfg, virtual.Workload(level, n, tuple(frames), w), variant)
        return cache[key]

    out = []
    for p in points:
        if p.metric == "step_ms":
            out.append(step_ms(cfg, p.level, setup.variants[0]))
        elif p.metric == "effect_e2e_pct":
            a, b = at(p.level, "original")["e2e_p50"], at(p.level, p.variant)["e2e_p50"]
            out.append(100.0 * (b / a - 1.0))
        else:
            out.append(at(p.level, p.variant if p.variant in setup.variants else setup.variants[0])[p.metric])
    return out


def residual(p: public.Point, model: float) -> float:
    """Weighted residual: ln(model/public)/sigma, or (model-public)/sigma for the effect (percentage points)."""
    if p.metric == "effect_e2e_pct":
        return (model - p.value) / p.sigma
    return math.log(model / p.value) / p.sigma


# --- least squares ----------------------------------------------------------------------------------------------
@dataclass
class FitResult:
    names: list[str]
    values: list[float]
    cov: list[list[float]]  # of the values (not of their logs)
    chi2: float
    dof: int
    scale: float  # sqrt(chi2/dof) when > 1: the covariance is inflated by it squared

    def sd(self) -> list[float]:
        return [math.sqrt(max(self.cov[i][i], 0.0)) for i in range(len(self.names))]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"sd": self.sd()}


def least_squares(fun: Callable[[np.ndarray], np.ndarray], x0: Sequence[float], names: Sequence[str],
                  iters: int = 40, rel_step: float = 0.02) -> FitResult:
    """Levenberg-Marquardt on u = ln(x) (keeps parameters positive); central differences of `rel_step` in u (the
    virtual engine is piecewise: steps and chunks are whole, so an infinitesimal step would see flat spots)."""
    u = np.log(np.asarray(x0, dtype=float))
    lam = 1e-2

    def jac(u):
        cols = []
        for j in range(len(u)):
            e = np.zeros_like(u)
            e[j] = rel_step
            cols.append((fun(np.exp(u + e)) - fun(np.exp(u - e))) / (2 * rel_step))
        return np.stack(cols, axis=1)

    r = fun(np.exp(u))
    cost = float(r @ r)
    for _ in range(iters):
        J = jac(u)
        A, g = J.T @ J, J.T @ r
        improved = False
        for _ in range(12):
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-9), -g)
            u_new = u + step
            r_new = fun(np.exp(u_new))
            c_new = float(r_new @ r_new)
            if c_new < cost:
                u, r, lam, improved = u_new, r_new, max(lam / 3, 1e-6), True
                gain, cost = cost - c_new, c_new
                break
            lam *= 4
        if not improved or gain < 1e-6 * max(cost, 1e-12):
            break
    J = jac(u)
    dof = max(len(r) - len(u), 1)
    scale = max(1.0, math.sqrt(cost / dof))
    cov_u = np.linalg.pinv(J.T @ J) * scale**2
    x = np.exp(u)
    cov_x = cov_u * np.outer(x, x)  # delta method: dx = x du
    return FitResult(list(names), [float(v) for v in x], cov_x.tolist(), cost, dof, scale)


def with_params(cfg: SimConfig, names: Sequence[str], values: Sequence[float]) -> SimConfig:
    model = {n: float(v) for n, v in zip(names, values, strict=True) if hasattr(cfg.model, n)}
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model))


# --- the public fits --------------------------------------------------------------------------------------------
# The CI's structure (docs/simulator.md): the talker admits up to 64 requests and code2wav is one decoder that takes
# chunks one at a time (the 0.24.0 high-concurrency deploy profile); its first-chunk and later-chunk decode times are
# fitted, the plain code2wav delay is 0 (collinear with the first-chunk decode on an idle decoder). prefill_ms only
# meets them in TTFP: it is set in the profile.
CI_PARAMS = ("base_ms", "per_request_ms", "code2wav_decode_first_ms", "code2wav_decode_ms")
CI_TALKER_MAX_SEQS = 64  # talker max_num_seqs of the high-concurrency deploy profile [0.24]
SEED_PARAMS = ("base_ms", "frames")


def fit_ci(cfg: SimConfig, x0: Sequence[float] = (10.0, 1.0, 120.0, 20.0),
           points: Sequence[public.Point] = public.CI_POINTS) -> tuple[FitResult, list]:
    """The CI setup's step and code2wav parameters from its points (default: the public ones)."""
    pts = [p for p in points if p.fit]

    def fun(x):
        c = with_params(cfg, CI_PARAMS, x)
        return np.array([residual(p, m) for p, m in zip(pts, predict_points(c, public.CI_SETUP, public.CI_FRAMES,
                                                                             pts), strict=True)])

    return least_squares(fun, x0, CI_PARAMS), pts


def fit_seed(cfg: SimConfig, x0: Sequence[float] = (30.0, 80.0)) -> FitResult:
    """0.16.0 at batch 8: base_ms of the talker step and the requests' mean length (frames; not published)."""
    pts = [p for p in public.SEED_POINTS if p.fit]

    def fun(x):
        c = with_params(cfg, SEED_PARAMS[:1], x[:1])
        frames = seed_frames(x[1])
        return np.array([residual(p, m) for p, m in zip(pts, predict_points(c, public.SEED_SETUP, frames, pts),
                                                        strict=True)])

    return least_squares(fun, x0, SEED_PARAMS)


def seed_frames(mean: float) -> tuple[int, ...]:
    """24 request lengths around `mean` frames (+-30 %, evenly, shuffled): the seed's prompts are not published."""
    return tuple(max(1, round(mean * (0.7 + 0.6 * (7 * i % 24) / 23))) for i in range(24))


# --- prediction intervals -----------------------------------------------------------------------------------------
def interval(fit: FitResult, f: Callable[[Sequence[float]], float], z: float = 1.96,
             rel_step: float = 0.02) -> tuple[float, float, float]:
    """(estimate, low, high) of f(parameters) by the delta method: var = g' C g, g by central differences."""
    x = np.asarray(fit.values)
    g = np.zeros_like(x)
    for j in range(len(x)):
        h = rel_step * x[j]
        up, dn = x.copy(), x.copy()
        up[j] += h
        dn[j] -= h
        g[j] = (f(up) - f(dn)) / (2 * h)
    est = f(x)
    sd = math.sqrt(max(float(g @ np.asarray(fit.cov) @ g), 0.0))
    return est, est - z * sd, est + z * sd


# The p50 of a closed loop over a fixed set of request lengths moves in jumps as the parameters move (requests change
# places around the median): the effect's gradient is a secant over +-10 % of each parameter (about one sd of the
# public fits), not a tangent that a jump inside +-2 % can blow up (seen: -7.6 .. +2.1 % where the secant says
# -3.4 .. -2.1 %).
EFFECT_SECANT = 0.10


def effect_interval(fit: FitResult, cfg: SimConfig, concurrency: int, frames: Sequence[int], a: str = "original",
                    b: str = "fixed", requests: int | None = None, z: float = 1.96) -> tuple[float, float, float]:
    """Predicted % difference of p50 E2E latency, b vs a, at one closed-loop level, with its interval from the
    fit's parameter uncertainty (not from run-to-run noise). Pure: the virtual engine, no clock."""
    n = requests or max(3 * concurrency, 24)

    def f(x):
        c = with_params(cfg, fit.names, x)
        load = virtual.Workload(concurrency, n, tuple(frames), 0)
        ea = level_metrics(c, load, a)["e2e_p50"]
        eb = level_metrics(c, load, b)["e2e_p50"]
        return 100.0 * (eb / ea - 1.0)

    return interval(fit, f, z, rel_step=EFFECT_SECANT)


def load_fit(config_path: str | Path) -> dict | None:
    """The fit stored beside a config (<config>.fit.json), or None."""
    p = Path(str(config_path) + FIT_SUFFIX) if not str(config_path).endswith(FIT_SUFFIX) else Path(config_path)
    if not p.is_file():
        return None
    return json.loads(p.read_text(encoding="utf-8"))


def fit_from_dict(d: dict) -> FitResult:
    return FitResult(d["names"], d["values"], d["cov"], d["chi2"], d["dof"], d["scale"])


# --- fit from a real run -------------------------------------------------------------------------------------
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


def _delta(a: dict, b: dict, key: str) -> float:
    return float(b.get(key, 0.0)) - float(a.get(key, 0.0))


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m ttssim.fit", description=__doc__.splitlines()[0])
    p.add_argument("run", nargs="?", help="reports/<run> of a real A/B run (its counters must carry the step clock)")
    p.add_argument("--public", action="store_true", help="fit the public numbers instead and print the result")
    p.add_argument("--write", action="store_true", help="with --public: regenerate configs/sim profiles + .fit.json")
    p.add_argument("--base", default="configs/sim/default.yaml", help="config whose other values the output keeps")
    p.add_argument("--out", default=None, help="write the fitted config here (and <out>.fit.json)")
    p.add_argument("--levels", default="", help="comma-separated concurrencies to fit on (default: every level)")
    p.add_argument("--whole-step", action="store_true",
                   help="keep the predictor's measured time inside the step (a profile run with no host time model)")
    p.add_argument("--noise", action="store_true",
                   help="also fit the host noise (step_noise_sd, step_noise_hold_s) to the measured spread of "
                        "time to first audio and end-to-end latency (p90 over p50) at the fit levels")
    p.add_argument("--ttfa", action="store_true",
                   help="also fit code2wav_chunk_ms to the measured p50 time to first audio at the fit levels")
    args = p.parse_args(argv)
    try:
        if args.public:
            f = public_fits()
            for key in ("ci", "seed"):
                r = f[key]
                print(key, ", ".join(f"{n} = {v:.4g} +- {s:.2g}" for n, v, s in zip(r.names, r.values, r.sd(),
                                                                                 strict=True)),
                      f"(chi2 {r.chi2:.1f} on {r.dof} dof)")
            if args.write:
                for path in write_profiles(f):
                    print(f"wrote {path.relative_to(ROOT)} (+{FIT_SUFFIX})")
            return 0
        if not args.run:
            p.error("give reports/<run> or --public")
        base = load_config(ROOT / args.base if not Path(args.base).is_absolute() else args.base)
        run = Path(args.run)
        if not run.is_dir():
            raise ValueError(f"{run}: not a directory")
        windows = read_windows(run)
        levels = [int(x) for x in args.levels.split(",") if x.strip()] if args.levels else []
        if levels:
            windows = [w for w in windows if w.concurrency in levels]
            if not windows:
                raise ValueError(f"{run}: no window at the levels {levels}")
        if args.whole_step:
            windows = whole_step(windows)
        fit = fit_windows(windows)
        fit_levels = levels or sorted({w.concurrency for w in windows})
        host = no_host_time if args.whole_step else sim_model.gpu_host_variant_step_s
        if args.noise:
            fit = merged(fit, fit_noise(with_params(base, fit.names, fit.values), run, fit_levels,
                                        variant_step_s=host))
        if args.ttfa:
            fit = merged(fit, fit_code2wav(with_params(base, fit.names, fit.values), run, fit_levels,
                                           variant_step_s=host))
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"ttssim.fit: {e}", file=sys.stderr)
        return 2
    for n, v, s in zip(fit.names, fit.values, fit.sd(), strict=True):
        print(f"{n} = {v:.4g} +- {s:.2g}")
    print(f"{len(windows)} windows, residual sd {fit.scale:.3g} ms/step")
    if args.out:
        cmd = " ".join(["python -m ttssim.fit", *(argv if argv is not None else sys.argv[1:])])
        write_config(Path(args.out), base, fit, f"Fitted by `{cmd}` from its step clock "
                     f"({len(windows)} windows).\nOther values from {args.base}.")
        if levels:  # which levels the fit saw: a comparison holds the others out
            side = Path(str(args.out) + FIT_SUFFIX)
            side.write_text(json.dumps(json.loads(side.read_text(encoding="utf-8")) | {"levels": levels}, indent=1)
                            + "\n", encoding="utf-8")
        print(f"wrote {args.out} and {args.out}{FIT_SUFFIX}")
    return 0



# --- the profiles in configs/sim, regenerated from the public fit ---------------------------------------------
PROFILE_DIR = ROOT / "configs" / "sim"
PREFILL_MS = 10.0  # per admitted Base request; not separable from code2wav in the public data (set, not fitted)


def fidelity_line(points: Sequence[public.Point], preds: Sequence[float], what: str) -> str:
    """'metric within ±x %' per metric over the fitted points: the one line a report shows under SIMULATED."""
    worst: dict[str, float] = {}
    for p, m in zip(points, preds, strict=True):
        if p.fit and p.metric != "effect_e2e_pct":
            worst[p.metric] = max(worst.get(p.metric, 0.0), abs(100.0 * (m / p.value - 1.0)))
    names = {"audio_tput": "audio throughput", "ttfp_p50": "p50 TTFP", "rtf_p50": "p50 RTF", "req_tput": "req/s",
             "e2e_p50": "p50 E2E", "step_ms": "step time"}
    parts = [f"{names.get(k, k)} within ±{v:.0f} %" for k, v in worst.items()]
    return f"{what}: " + ", ".join(parts)


def public_fits() -> dict:
    """Fit both public setups; returns everything the profiles and the fidelity benchmark need."""
    ci_base = load_config(None, [f"model.max_batch_size={CI_TALKER_MAX_SEQS}", "model.max_waiting=1024",
                                 "model.max_prefills_per_step=16", f"model.prefill_ms={PREFILL_MS}",
                                 "model.code2wav_chunk_ms=0", "audio.initial_chunk_frames=1"])
    ci, ci_pts = fit_ci(ci_base)
    ci_cfg = with_params(ci_base, ci.names, ci.values)
    all_ci = list(public.CI_POINTS)
    ci_pred = predict_points(ci_cfg, public.CI_SETUP, public.CI_FRAMES, all_ci)
    seed_base = load_config(None, ["model.max_batch_size=8", f"model.prefill_ms={PREFILL_MS}",
                                   f"model.per_request_ms={ci.values[1]:.4f}",
                                   f"model.code2wav_chunk_ms={ci.values[2]:.4f}"])
    seed = fit_seed(seed_base)
    seed_cfg = with_params(seed_base, ["base_ms"], seed.values[:1])
    seed_pred = predict_points(seed_cfg, public.SEED_SETUP, seed_frames(seed.values[1]), public.SEED_POINTS)
    return {"ci": ci, "ci_cfg": ci_cfg, "ci_pred": ci_pred, "seed": seed, "seed_cfg": seed_cfg,
            "seed_pred": seed_pred}


def _combined(seed: FitResult, ci: FitResult) -> FitResult:
    """base_ms from the seed fit, per_request_ms from the CI fit (taken as independent): the 0.6B profiles."""
    names = ["base_ms", "per_request_ms"]
    values = [seed.values[0], ci.values[1]]
    cov = [[seed.cov[0][0], 0.0], [0.0, ci.cov[1][1]]]
    return FitResult(names, values, cov, seed.chi2, seed.dof, seed.scale)


def write_profiles(f: dict) -> list[Path]:
    """Regenerate default.yaml, h100-1.7b-ci.yaml and h100-0.6b-b8.yaml (+ .fit.json) from `public_fits()`."""
    ci, seed = f["ci"], f["seed"]
    ci_sd, seed_sd = ci.sd(), seed.sd()
    ci_line = fidelity_line(public.CI_POINTS, f["ci_pred"], "model vs vllm-omni CI (1.7B-Base, H100, c=1-64)")
    eff_m = f["seed_pred"][-1]
    seed_line = (fidelity_line(public.SEED_POINTS, f["seed_pred"], "model vs seed run (0.6B-Base, 0.16.0, batch 8, "
                                                                     "c=8)")
                 + f", fixed vs original p50 E2E {eff_m:+.1f} % (public {public.SEED_POINTS[-1].value:+.1f} %)")
    base = round(seed.values[0], 2)
    per = round(ci.values[1], 3)
    c2w = round(ci.values[2], 1)
    prefill = f"""  prefill_ms: {PREFILL_MS}           # per admitted request; set (TTFP cannot split it from code2wav) [docs/simulator.md]
"""
    plain_c2w = f"""  code2wav_chunk_ms: {c2w}      # the CI fit's first-chunk decode on an idle decoder, +- {ci_sd[2]:.0f} ms (ref-context chunk)
  code2wav_per_request_ms: 0.0  # no support in the public data (fit -> 0)
"""
    ci_c2w = f"""  code2wav_chunk_ms: 0.0       # no delay outside the decoder queue (collinear with the first-chunk decode)
  code2wav_per_request_ms: 0.0
  code2wav_decode_first_ms: {c2w}  # one decoder, a chunk at a time [0.24]: first chunk, fit to [CI], +- {ci_sd[2]:.0f} ms
  code2wav_decode_ms: {round(ci.values[3], 1)}     # every later chunk, fit to [CI], +- {ci_sd[3]:.0f} ms
"""
    rest = """  stall_us_per_sync: 15.0      # CPU only: [H100] minus [CPU] micro per sync (13.5-18 us), docs/simulator.md
  extra_step_ms: 0.0           # injected known delay per step (known-answer tests of the statistics)
  extra_step_pct: 0.0          # injected relative delay per step, % of the step
  block_size: 16               # KV block size on CUDA [0.16]
  max_seq_len: 16              # code predictor sequence: 16 codebook groups -> blocks_per_seq 1
"""
    common = prefill + plain_c2w + rest
    audio_016 = """audio:
  chunk_frames: 25             # codec_chunk_frames [0.16]
  initial_chunk_frames: 25     # 0.16.0 has no initial_codec_chunk_frames: the first chunk is a full one [0.16]
  # ~150 words/min x ~6 characters/word = 15 characters/s of speech; at 12.5 frames/s: 0.833 frames/char
  frames_per_char: 0.833
  min_frames: 13               # one second at least (13 frames = 1.04 s)
  default_max_new_tokens: 2048 # [0.16]
  max_input_chars: 4096        # longer input -> 400 (the real server fails on max_model_len 4096 [0.16])
  max_ref_audio_s: 60          # decoded reference audio longer than this -> 400 (bounded work per request)
"""
    head = """# Generated by `python -m ttssim.fit --public --write` (ttssim/fit.py): do not edit by hand, rerun the fit.
# Every number is a MODEL of the public measurements listed in docs/simulator.md; the predictor variant itself runs
# for real. Sources: [CI] vllm-omni tests/dfx/perf/tests/test_tts.json + PRs #4289/#4521/#5231 (7-day averages);
# [SEED] vllm-omni PR #1614 E2E run; [4855] vllm-omni issue #4855; [H100]/[CPU] seed function benchmarks (PR #1614);
# [0.16] vllm-omni 0.16.0 wheel (stage_configs/qwen3_tts.yaml, serving_speech.py); [0.22] 0.22.0/0.24.0 wheels
# (deploy/qwen3_tts.yaml); [0.24] 0.24.0 wheel (deploy/qwen3_tts_high_concurrency.yaml).
# Step = base_ms + per_request_ms x batch + prefill_ms x admitted + variant host time (+ stall_us_per_sync x syncs
# on CPU). Fit uncertainty (1 sd) beside each fitted number; covariance in
# <this file>.fit.json.
"""
    default = head + f"""# PROFILE default: the mission's setup -- Qwen3-TTS-12Hz-0.6B-Base on vllm-omni 0.16.0 with a batch limit that
# follows the concurrency (configs/stages/qwen3_tts_bN.yaml); step model of the seed run [SEED].
# Fidelity: {seed_line}.
model:
  name: Qwen/Qwen3-TTS-12Hz-0.6B-Base
  max_batch_size: 256          # scheduler max_num_seqs; 0.16.0 ships 1 (qwen3_tts.yaml), a sweep needs it to follow c
  max_waiting: 1024            # waiting for a batch slot (beyond what the next step admits); more -> 503 at once
  max_prefills_per_step: 16    # new requests joining one step (stands in for max_num_batched_tokens 512 [0.16])
  base_ms: {base}            # fit to [SEED] (req/s, p50 E2E, fixed-vs-original), +- {seed_sd[0]:.1f} ms
  per_request_ms: {per}        # from the CI fit (slope of step time in batch), +- {ci_sd[1]:.2f} ms
{common}  startup_s: 0.0               # modelled start-up (port binds after it); configs/sim/h100-startup.yaml sets one
{audio_016}
server:
  max_body_bytes: 33554432     # 32 MiB request body (a 60 s 48 kHz stereo WAV as base64 fits); larger -> 413
  ref_audio_fetch_timeout_s: 15   # http(s) ref_audio: same timeout as vllm-omni
  ref_audio_max_bytes: 52428800   # and the same 50 MB cap
  voices: []                   # the Base (voice-cloning) model has no named speakers
  sync_sample_every_steps: 10  # every Nth step one extra call (cycling through the 15) runs under the sync observer
  sync_sample_calls: one       # one | all (all 15 calls of the sampled step; exact per-step counts, costly)

faults:                        # all off; see ttssim/faults.py
  kill_after_steps: null       # SIGKILL itself in the middle of step N (after call 8 of 15)
  hang_after_requests: null    # after N speech requests, every endpoint accepts and never answers
  error_burst: null            # {{after: N, length: M, status: 500, every: 0}}: speech requests N+1..N+M get 5xx
  cut_stream_every: 0          # every k-th streaming request: connection dropped right after its first chunk
  malformed_audio_every: 0     # every k-th speech request: WAV with a broken header / PCM with an odd byte count
  slow_readiness_s: 0          # extra delay before the port binds, on top of model.startup_s (a slow model load)
"""
    seed_profile = head + f"""# PROFILE h100-0.6b-b8: the seed E2E run [SEED] -- 0.6B-Base, vllm-omni 0.16.0, max_batch_size 8, c=8.
# Fidelity: {seed_line}.
# The seed's request lengths are not published: the fit puts them at {seed.values[1]:.0f} +- {seed_sd[1]:.0f} frames
# ({seed.values[1] / domain.CODEC_FRAME_RATE_HZ:.1f} s of audio) on average.
model:
  name: Qwen/Qwen3-TTS-12Hz-0.6B-Base
  max_batch_size: 8            # the seed's stage config (qwen3_tts_b8.yaml)
  max_waiting: 1024
  max_prefills_per_step: 16
  base_ms: {base}            # fit to [SEED], +- {seed_sd[0]:.1f} ms
  per_request_ms: {per}        # from the CI fit, +- {ci_sd[1]:.2f} ms
{common}audio:
  chunk_frames: 25             # [0.16]
  initial_chunk_frames: 25     # [0.16]: no initial chunk
  frames_per_char: 0.833
  min_frames: 13
"""
    ci_profile = head + f"""# PROFILE h100-1.7b-ci: the vllm-omni CI's Qwen3-TTS benchmark [CI] -- 1.7B-Base on 2x H100 (code2wav on the
# second GPU), vllm-omni main of June-July 2026. Structure of the high-concurrency deploy profile [0.24] (talker on
# GPU 0 with max_num_seqs 64, code2wav on GPU 1 decoding one chunk at a time): the public numbers fit it and not the
# default profile's 10-request FIFO (docs/simulator.md). The CI code no longer has build_attn_metadata (#1617): run
# this profile with --variant vectorized (near-constant predictor host cost).
# Fidelity: {ci_line}.
model:
  name: Qwen/Qwen3-TTS-12Hz-1.7B-Base
  max_batch_size: {CI_TALKER_MAX_SEQS}           # talker max_num_seqs 64 [0.24 qwen3_tts_high_concurrency.yaml]
  max_waiting: 1024
  max_prefills_per_step: 16
  base_ms: {round(ci.values[0], 2)}            # fit to [CI] + [4855], +- {ci_sd[0]:.1f} ms
  per_request_ms: {per}        # fit to [CI] + [4855], +- {ci_sd[1]:.2f} ms
{prefill}{ci_c2w}{rest}audio:
  chunk_frames: 25             # codec_chunk_frames 25 [0.22]
  initial_chunk_frames: 1      # initial_codec_chunk_frames 1: first packet after one frame [0.22]
  frames_per_char: 0.833
  min_frames: 13
"""
    out = []
    ci_fit = dataclasses.replace(ci)
    for name, text, fr, line in (("default.yaml", default, _combined(seed, ci), seed_line),
                                 ("h100-0.6b-b8.yaml", seed_profile, _combined(seed, ci), seed_line),
                                 ("h100-1.7b-ci.yaml", ci_profile, ci_fit, ci_line)):
        path = PROFILE_DIR / name
        path.write_text(text, encoding="utf-8")
        extra = {"fidelity": "SIMULATED -- " + line, "source": "python -m ttssim.fit --public --write"}
        if name != "h100-1.7b-ci.yaml":
            extra["seed_mean_frames"] = [seed.values[1], seed_sd[1]]
        Path(str(path) + FIT_SUFFIX).write_text(json.dumps(fr.as_dict() | extra, indent=1) + "\n", encoding="utf-8")
        out.append(path)
    return out


if __name__ == "__main__":
    raise SystemExit(main())

"""Fit the simulator's step-time model to the public numbers, and predict from a fit.

Public fit: weighted least squares (Levenberg-Marquardt on log parameters, residuals ln(model/public)/sigma) of the
virtual engine (ttssim.virtual) against ttssim.public, with the parameter covariance from the Jacobian. A fit goes
beside its config as <config>.fit.json: parameters, covariance, residuals and a one-line fidelity summary;
`effect_interval` turns the covariance into a prediction interval for a level.

The command: `python -m ttssim.fit --public` (with --write, the profiles in configs/sim are regenerated:
ttssim.profiles) or `python -m ttssim.fit reports/<run> --out configs/sim/fitted.yaml` (the fit to a real A/B run's
counters and requests: ttssim.realfit).
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
from ttsrecords.paths import ROOT

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
PREFILL_MS = 10.0  # per admitted Base request; not separable from code2wav in the public data (set, not fitted)
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


# --- the command -----------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    from . import profiles, realfit  # both build on this module: imported when the command runs

    p = argparse.ArgumentParser(prog="python -m ttssim.fit",
                                description="Fit the simulator's step-time model: to the public numbers (--public) "
                                            "or to a real A/B run's counters and requests.")
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
                for path in profiles.write_profiles(f):
                    print(f"wrote {path.relative_to(ROOT)} (+{FIT_SUFFIX})")
            return 0
        if not args.run:
            p.error("give reports/<run> or --public")
        base = load_config(ROOT / args.base if not Path(args.base).is_absolute() else args.base)
        levels = [int(x) for x in args.levels.split(",") if x.strip()] if args.levels else []
        fit, windows = realfit.fit_run(Path(args.run), base, levels, args.whole_step, args.noise, args.ttfa)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as e:
        print(f"ttssim.fit: {e}", file=sys.stderr)
        return 2
    for n, v, s in zip(fit.names, fit.values, fit.sd(), strict=True):
        print(f"{n} = {v:.4g} +- {s:.2g}")
    print(f"{len(windows)} windows, residual sd {fit.scale:.3g} ms/step")
    if args.out:
        cmd = " ".join(["python -m ttssim.fit", *(argv if argv is not None else sys.argv[1:])])
        realfit.write_config(Path(args.out), base, fit, f"Fitted by `{cmd}` from its step clock "
                             f"({len(windows)} windows).\nOther values from {args.base}.")
        if levels:  # which levels the fit saw: a comparison holds the others out
            side = Path(str(args.out) + FIT_SUFFIX)
            side.write_text(json.dumps(json.loads(side.read_text(encoding="utf-8")) | {"levels": levels}, indent=1)
                            + "\n", encoding="utf-8")
        print(f"wrote {args.out} and {args.out}{FIT_SUFFIX}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The simulator's host noise (ttssim.model.StepNoise): a mean-1 factor on the modelled step, held for a stretch of
engine time; off by default, so every profile without it runs exactly as before; fitted (ttssim.fit --noise) to a
spread it was given."""

from __future__ import annotations

import dataclasses
import json
import math
import statistics

import pytest

from ttssim import fit, realfit, virtual
from ttssim import model as sim_model
from ttssim.config import ModelConfig, SimConfig, load_config


def noisy(sd: float, hold: float) -> ModelConfig:
    return dataclasses.replace(ModelConfig(), step_noise_sd=sd, step_noise_hold_s=hold)


def test_no_noise_is_exactly_one_and_the_step_is_unchanged():
    n = sim_model.StepNoise(ModelConfig())
    assert {n.factor(t / 10) for t in range(100)} == {1.0}
    m = ModelConfig()
    assert sim_model.step_target_s(m, 8, 1, 0.002, 30, "cpu") == sim_model.step_target_s(m, 8, 1, 0.002, 30, "cpu",
                                                                                         1.0)


def test_factor_has_mean_one_and_the_asked_log_sd():
    n = sim_model.StepNoise(noisy(0.3, 0.0), seed=3)
    f = [n.factor(float(t)) for t in range(20000)]
    assert statistics.fmean(f) == pytest.approx(1.0, abs=0.01)
    assert statistics.stdev(math.log(x) for x in f) == pytest.approx(0.3, rel=0.03)


def test_factor_holds_for_its_stretch_of_engine_time_and_is_seeded():
    n = sim_model.StepNoise(noisy(0.3, 2.0), seed=1)
    a = [n.factor(t * 0.25) for t in range(40)]  # 10 s of engine time, 4 steps a second
    stretches = [a[i:i + 8] for i in range(0, 40, 8)]  # [0, 2), [2, 4), ...
    assert all(len(set(s)) == 1 for s in stretches) and len({s[0] for s in stretches}) == 5
    m = sim_model.StepNoise(noisy(0.3, 2.0), seed=1)
    assert [m.factor(t * 0.25) for t in range(40)] == a
    assert [sim_model.StepNoise(noisy(0.3, 2.0), seed=2).factor(t * 0.25) for t in range(40)] != a


def test_noise_scales_only_the_modelled_rest_of_the_step():
    m = ModelConfig()
    rest = sim_model.modelled_rest_s(m, 4, 1)
    assert sim_model.step_target_s(m, 4, 1, 0.01, 0, "cuda", 1.5) == pytest.approx(1.5 * rest + 0.01)


def test_virtual_engine_spreads_requests_with_noise_and_not_without():
    base = load_config(None)
    cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, max_batch_size=4, max_prefills_per_step=4))
    quiet = virtual.closed_loop(cfg, 1, [63], 30, "fixed")
    assert len(quiet) == 1 and len({round(o.e2e_s, 9) for o in quiet[0].outcomes}) == 1
    loud = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, step_noise_sd=0.2, step_noise_hold_s=4.0))
    runs = virtual.closed_loop(loud, 1, [63], 30, "fixed")
    assert len(runs) == len(virtual.NOISE_SEEDS) and all(len(r.outcomes) == virtual.NOISE_REQUESTS for r in runs)
    e2e = [o.e2e_s for r in runs for o in r.outcomes]
    assert realfit.spread(e2e) > 0.1
    assert runs == virtual.closed_loop(loud, 1, [63], 30, "fixed")  # seeded: the same replay every time


def test_quantile_is_nearest_rank():
    assert [realfit.quantile(list(range(1, 11)), q) for q in (0.1, 0.5, 0.9, 1.0)] == [1, 5, 9, 10]
    assert realfit.spread([1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0, 4.0, 4.0]) == pytest.approx(math.log(2.0))


def _requests_folder(tmp_path, cfg: SimConfig, levels, n: int, seed: int):
    """A run folder whose requests come from the virtual engine under a known noise (one seed, as one real run)."""
    lines = []
    for c in levels:
        r = virtual.run(cfg, virtual.Workload(c, n, (63,), c), "fixed", realfit.no_host_time, seed=seed)
        lines += [json.dumps({"ok": True, "phase": "measure", "concurrency": c, "ttfa_s": o.ttfa_s, "e2e_s": o.e2e_s,
                              "audio_s": o.frames / 12.5}) for o in r.outcomes]
    (tmp_path / "requests.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


@pytest.mark.slow  # least-squares fits of the virtual engine
@pytest.mark.parametrize("seed", [11, 12])
def test_noise_fit_recovers_a_known_noise(tmp_path, seed):
    """Known answer: requests made under log sd 0.25 held 4 s (other seeds than the fit's) at c=1 and 4, 200 a
    level. Told the hold, the fit gets the sd back within 0.05. Choosing the hold too, it trades hold for sd (a
    longer hold with a smaller sd spreads whole requests alike; measured: 8 s with 0.19 and 0.24 for these seeds),
    so what is asserted there is the spread the fitted model predicts: within 0.05 of the true model's at each
    level, the true model's quantiles pooled like the fit's."""
    base = load_config(None)
    cfg = dataclasses.replace(base, model=dataclasses.replace(
        base.model, max_batch_size=4, max_prefills_per_step=4, base_ms=60.0, per_request_ms=6.0,
        step_noise_sd=0.25, step_noise_hold_s=4.0))
    run = _requests_folder(tmp_path, cfg, (1, 4), 200, seed=seed)
    quiet = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, step_noise_sd=0.0, step_noise_hold_s=0.0))
    told = realfit.fit_noise(quiet, run, [1, 4], holds=(4.0,))
    assert told.names == ["step_noise_sd", "step_noise_hold_s"] and told.values[1] == 4.0
    assert told.values[0] == pytest.approx(0.25, abs=0.05)
    free = realfit.fit_noise(quiet, run, [1, 4])
    fitted = fit.with_params(quiet, free.names, free.values)
    def predicted(model, c):
        return realfit.spread([o.e2e_s for r in virtual.closed_loop(model, c, [63], 200, "fixed", realfit.no_host_time)
                               for o in r.outcomes])

    for c in (1, 4):
        assert predicted(fitted, c) == pytest.approx(predicted(cfg, c), abs=0.05), c


def test_noise_fit_refuses_a_level_with_too_few_requests(tmp_path):
    (tmp_path / "requests.jsonl").write_text(json.dumps({"ok": True, "phase": "measure", "concurrency": 1,
                                                         "ttfa_s": 1.0, "e2e_s": 2.0, "audio_s": 5.04}) + "\n")
    with pytest.raises(ValueError, match="1 measured ok requests at c=1: too few"):
        realfit.fit_noise(load_config(None), tmp_path, [1])

"""Does a window hold its requests? The scenario's phase lengths against the request lengths its arms will have.

The primary work rates are measured over the requests that START in a level's measure phase, by Little's law
(ttsreport.blocks.closed_loop_rates; docs/method.md, section 4). That needs, per level:
- enough of them: measure_s >= MEASURE_LIFETIMES x the level's mean request latency (about that many requests per
  user; fewer and a window's prompt draw decides its number);
- each of them to finish under its own level's load: the level's drain >= its longest request, less the load shape's
  tick that ends a phase up to PHASE_TICK_S late (a request that
  outlives its level runs partly under the next level's batch; with the seeded level order that is a different level
  in every round, which is bias and noise in the pair). The drain goes with the level in every window
  (loadtest.scenario.window_scenario);
- a warm-up of at least WARMUP_LIFETIMES mean latencies, so the users' requests no longer start in step.
Latencies are predicted by replaying each arm's simulator stand-in (its profile and overrides) in virtual time over
the scenario's own prompt stream (ttssim.virtual): exact for the simulator, the stand-in's estimate for a real server.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from loadtest.prompts import PromptSequence, load_corpus
from ttsrecords.paths import ROOT
from ttsrecords.scenario import Scenario
from ttssim import virtual
from ttssim.audio import Voice
from ttssim.config import load_config

MEASURE_LIFETIMES = 2.0
WARMUP_LIFETIMES = 1.0
PHASE_TICK_S = 1.0  # a phase ends at the load shape's first tick after its nominal end (loadtest.shape): up to 1 s on
PREDICTION_REQUESTS = 600  # requests replayed per level and arm (after a warm-up of c): the longest prompt shows up


@dataclass(frozen=True)
class LevelLatency:
    """Predicted latencies of one level for the slowest arm: mean and longest request, seconds."""

    concurrency: int
    mean_s: float
    longest_s: float


def prompt_frames(prompts: str | Path, mix: dict[str, float], seed: int, n: int, config: str | Path,
                  overrides: tuple[str, ...] = ()) -> tuple[int, ...]:
    """The first n prompts of the load generator's own stream (PromptSequence: corpus, mix, seed), as the codec
    frames the simulator profile gives each text."""
    voice = Voice(load_config(config, list(overrides)).audio)
    seq = PromptSequence(load_corpus(prompts), mix, seed, 0)
    return tuple(voice.num_frames(seq.next().text, 4096) for _ in range(n))


@functools.lru_cache(maxsize=256)
def closed_loop_latencies(config: str, overrides: tuple[str, ...], concurrency: int, prompts: str,
                          mix: tuple[tuple[str, float], ...], seed: int, variant: str = "fixed",
                          requests: int = PREDICTION_REQUESTS) -> tuple[np.ndarray, np.ndarray]:
    """(latency s, audio s) of `requests` closed-loop requests at `concurrency` in virtual time (ttssim.virtual)."""
    cfg = load_config(config, list(overrides))
    frames = prompt_frames(prompts, dict(mix), seed, requests, config, overrides)
    runs = virtual.closed_loop(cfg, concurrency, frames, requests, variant=variant)
    e2e = np.array([o.e2e_s for r in runs for o in r.outcomes])
    audio = np.array([o.frames for r in runs for o in r.outcomes]) * cfg.audio.samples_per_frame / cfg.audio.sample_rate
    return e2e, audio


def predict(scenario: Scenario, stand_ins: list[tuple[str, tuple[str, ...], str]]) -> list[LevelLatency]:
    """Per level of a closed-loop scenario, the slowest stand-in's (profile, overrides, variant) mean and longest
    latency."""
    mix = tuple(sorted((k, float(v)) for k, v in scenario.mix.items() if v > 0))
    prompts = str(Path(scenario.prompts) if Path(scenario.prompts).is_absolute() else ROOT / scenario.prompts)
    out = []
    for step in scenario.steps:
        lat = [closed_loop_latencies(str(cfg), tuple(sets), step.concurrency, prompts, mix, scenario.seed, variant)[0]
               for cfg, sets, variant in stand_ins]
        out.append(LevelLatency(step.concurrency, max(float(x.mean()) for x in lat), max(float(x.max()) for x in lat)))
    return out


def problems(scenario: Scenario, latencies: list[LevelLatency]) -> list[str]:
    """What in the scenario's phases is too short for the predicted requests (empty: the windows hold them)."""
    if scenario.loop != "closed":
        return []
    out = []
    by_c = {x.concurrency: x for x in latencies}
    for step in scenario.steps:
        lat = by_c[step.concurrency]
        if step.measure_s < MEASURE_LIFETIMES * lat.mean_s:
            out.append(f"c={step.concurrency}: measure {step.measure_s:g} s < {MEASURE_LIFETIMES:g} x its mean "
                       f"request latency {lat.mean_s:.1f} s (set measure_s >= {math.ceil(MEASURE_LIFETIMES * lat.mean_s):g})")
        if step.warmup_s < WARMUP_LIFETIMES * lat.mean_s:
            out.append(f"c={step.concurrency}: warm-up {step.warmup_s:g} s < its mean request latency "
                       f"{lat.mean_s:.1f} s (set warmup_s >= {math.ceil(WARMUP_LIFETIMES * lat.mean_s):g})")
        if step.drain_s + PHASE_TICK_S < lat.longest_s:
            out.append(f"c={step.concurrency}: drain {step.drain_s:g} s < its longest request {lat.longest_s:.1f} s: "
                       f"a measured request would outlive its level (set drain_s >= {math.ceil(lat.longest_s - PHASE_TICK_S):g})")
    return out

"""The metric table: what the statistics compute per block and level, and which direction is better.

One definition that the experiment files (primary_metric), the statistics and the report all read; it lives with the
load side (plain Python, no numpy) so that validating an experiment never imports the statistics.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One row of the metric table: the single definition every other module refers to."""

    key: str
    label: str
    unit: str
    better: str  # "higher" | "lower": which direction is "B faster"
    definition: str
    verdict: bool = True  # relative differences make sense (not for a rate that is usually 0)
    # computed over the ok requests only: an arm that fails (times out) its slowest requests looks faster in it, so a
    # difference in failure share between the arms withholds the claim the failures could have made (docs/method.md 7)
    over_ok: bool = False


# The definitions of every metric: per block and concurrency level, measure phase only.
METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("throughput_rps", "throughput", "req/s", "higher",
           "closed loop: c x (ok share) / (mean latency) of the requests that started in the measure phase, means "
           "per prompt bucket weighed by the scenario's mix (Little's law: the same work in both arms, no window "
           "edge); open loop: ok requests per second inside the measure window, each counted for the share of its "
           "lifetime inside it"),
    Metric("audio_throughput", "audio throughput", "audio-s/s", "higher",
           "closed loop: c x (mean audio seconds) / (mean latency) over the same requests and mix weights (a "
           "failed request: its time, no audio); open loop: audio seconds per second, each ok request's audio_s "
           "weighted by its lifetime share inside the window"),
    Metric("e2e_p50", "p50 latency", "s", "lower", "median end-to-end latency of ok measure requests", over_ok=True),
    Metric("e2e_p90", "p90 latency", "s", "lower", "90th percentile end-to-end latency (numpy linear interpolation)",
           over_ok=True),
    Metric("e2e_p99", "p99 latency", "s", "lower", "99th percentile end-to-end latency (numpy linear interpolation)",
           over_ok=True),
    Metric("ttfa_p50", "p50 time to first audio", "s", "lower",
           "median time to the first non-empty audio chunk (streaming requests; null when none streamed)", over_ok=True),
    Metric("rtf_p50", "p50 real-time factor", "", "lower", "median of e2e_s / audio_s per ok request", over_ok=True),
    Metric("error_rate", "error rate", "", "lower", "failed / all requests of the measure phase", verdict=False),
    # streaming continuity (request records version 2; null for version-1 runs): a player that starts at the first
    # chunk and plays in real time; underrun_s is its total stall, continuous when at most records.UNDERRUN_THRESHOLD_S
    Metric("stream_rtf_p50", "p50 streaming RTF", "", "lower",
           "median of (e2e_s - ttfa_s) / audio_s over ok streamed measure requests: generation speed once audio flows",
           over_ok=True),
    Metric("underrun_mean_s", "mean underrun", "s", "lower",
           "mean total playback stall (underrun_s) per ok streamed measure request", verdict=False, over_ok=True),
    Metric("underrun_p90_s", "p90 underrun", "s", "lower",
           "90th percentile of underrun_s over ok streamed measure requests", verdict=False, over_ok=True),
    Metric("continuity_ok_share", "continuity ok", "", "higher",
           "share of ok streamed measure requests whose total stall is at most the threshold (100 ms, as vllm-omni's "
           "benchmark)", verdict=False, over_ok=True),
)}
VERDICT_METRICS = tuple(k for k, m in METRICS.items() if m.verdict)
# The default primary metric (an experiment file names its own): audio seconds per second, the TTS server's work rate
# (docs/method.md, section 4: its estimator and its known-answer bench, reports/bench/estimator.md).
PRIMARY_METRIC = "audio_throughput"

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


# The definitions of every metric: per block and concurrency level, measure phase only.
METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("throughput_rps", "throughput", "req/s", "higher",
           "ok requests per second inside the measure window (between the scraper's start and end snapshots), each "
           "request counted for the share of its lifetime inside the window; without snapshots: ok requests started "
           "in the measure phase / counters' duration_s"),
    Metric("audio_throughput", "audio throughput", "audio-s/s", "higher",
           "audio seconds per second, each ok request's audio_s weighted by the same lifetime share"),
    Metric("e2e_p50", "p50 latency", "s", "lower", "median end-to-end latency of ok measure requests"),
    Metric("e2e_p90", "p90 latency", "s", "lower", "90th percentile end-to-end latency (numpy linear interpolation)"),
    Metric("e2e_p99", "p99 latency", "s", "lower", "99th percentile end-to-end latency (numpy linear interpolation)"),
    Metric("ttfa_p50", "p50 time to first audio", "s", "lower",
           "median time to the first non-empty audio chunk (streaming requests; null when none streamed)"),
    Metric("rtf_p50", "p50 real-time factor", "", "lower", "median of e2e_s / audio_s per ok request"),
    Metric("error_rate", "error rate", "", "lower", "failed / all requests of the measure phase", verdict=False),
    # streaming continuity (request records version 2; null for version-1 runs): a player that starts at the first
    # chunk and plays in real time; underrun_s is its total stall, continuous when at most records.UNDERRUN_THRESHOLD_S
    Metric("stream_rtf_p50", "p50 streaming RTF", "", "lower",
           "median of (e2e_s - ttfa_s) / audio_s over ok streamed measure requests: generation speed once audio flows"),
    Metric("underrun_mean_s", "mean underrun", "s", "lower",
           "mean total playback stall (underrun_s) per ok streamed measure request", verdict=False),
    Metric("underrun_p90_s", "p90 underrun", "s", "lower",
           "90th percentile of underrun_s over ok streamed measure requests", verdict=False),
    Metric("continuity_ok_share", "continuity ok", "", "higher",
           "share of ok streamed measure requests whose total stall is at most the threshold (100 ms, as vllm-omni's "
           "benchmark)", verdict=False),
)}
VERDICT_METRICS = tuple(k for k, m in METRICS.items() if m.verdict)
# The default primary metric (an experiment file names its own): audio seconds per second, the TTS server's work rate.
# Requests per second counts a 1.4 s and a 3 s request alike, so when one arm gets further through the prompt
# sequence in a window its rate moves with the prompt mix; audio throughput weighs each request by its audio. On the
# simulator's demo windows ln(B/A) per round spread 4-5x less for it at c=8 (docs/method.md, section 4).
PRIMARY_METRIC = "audio_throughput"

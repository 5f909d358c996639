"""Source of the three provisioned Grafana dashboards (one per question). `python docker/grafana/dashboards.py`
writes docker/grafana/dashboards/*.json; tests/test_docker_stack.py checks the files are current and that every
panel query returns data from a Prometheus scraping the simulator. Queries work on both backends where the metric
exists on both (the tts_predictor_* counters come from the plugin on vLLM and from the simulator alike); `or`
falls back to the simulator's tts_engine_* series where vllm-omni 0.16.0 has no such metric.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: run from any cwd

from tts_predictor.domain import CALLS_PER_STEP, CODEC_FRAME_RATE_HZ  # noqa: E402
from tts_predictor.metrics import CALLS, OBSERVED_CALLS, OBSERVED_TOKENS, REQUESTS, SECONDS, SYNCS  # noqa: E402

DS = {"type": "prometheus", "uid": "tts-prometheus"}
OUT = Path(__file__).resolve().parent / "dashboards"
W = "[1m]"
OBS, OBS_TOK, SECS, REQS = OBSERVED_CALLS, OBSERVED_TOKENS, SECONDS, REQUESTS
K, HZ = CALLS_PER_STEP, f"{CODEC_FRAME_RATE_HZ:g}"

DASHBOARDS = {
    "tts-sync": ("Predictor sync counters per variant", [
        ("GPU syncs per build_attn_metadata call (original T+4, fixed 5, vectorized 0)",
         f"sum by (variant) (rate({SYNCS}{W})) / sum by (variant) (rate({OBS}{W}))", "none"),
        ("Observed query tokens per observed call (T)",
         f"sum by (variant) (rate({OBS_TOK}{W})) / sum by (variant) (rate({OBS}{W}))", "none"),
        ("build_attn_metadata calls per second", f"sum by (variant) (rate({CALLS}{W}))", "ops"),
        ("Mean host time per call", f"sum by (variant) (rate({SECS}_sum{W})) / sum by (variant) (rate({SECS}_count{W}))",
         "s"),
        ("p99 host time per call", f"histogram_quantile(0.99, sum by (le, variant) (rate({SECS}_bucket{W})))", "s"),
    ]),
    "tts-throughput": ("Throughput and latency", [
        (f"Audio seconds produced per second (frames: batch requests / {K} calls per step / {HZ} Hz)",
         f"sum(rate({REQS}{W})) / {K} / {HZ}", "none"),
        ("Speech requests per second by status (vLLM: HTTP handler; simulator: its request counter)",
         f'sum by (status) (rate(http_requests_total{{handler="/v1/audio/speech"}}{W}))'
         f" or sum by (status) (rate(tts_sim_http_requests_total{W}))", "reqps"),
        ("Finished requests per second by outcome (simulator engine)", f"sum by (outcome) (rate(tts_engine_requests_total{W}))",
         "reqps"),
        ("Request latency p50 / p95 (vLLM: HTTP duration; simulator: modelled time to first audio)",
         f'histogram_quantile(0.5, sum by (le) (rate(http_request_duration_seconds_bucket{{handler="/v1/audio/speech"}}{W})))'
         f" or histogram_quantile(0.5, sum by (le) (rate(tts_sim_ttfa_model_seconds_bucket{W})))", "s"),
    ]),
    "tts-engine": ("Engine batch and step time", [
        ("Mean requests per predictor call (= talker batch)", f"sum(rate({REQS}{W})) / sum(rate({CALLS}{W}))", "none"),
        (f"Talker steps per second (simulator: counted; vLLM: calls / {K})",
         f"sum(rate(tts_engine_steps_total{W})) or sum(rate({CALLS}{W})) / {K}", "ops"),
        ("Step time p50 (simulator histogram; vLLM: wall seconds per step when busy)",
         f"histogram_quantile(0.5, sum by (le) (rate(tts_engine_step_seconds_bucket{W})))"
         f" or {K} / sum(rate({CALLS}{W}))", "s"),
        ("Running requests in the batch (simulator)", "sum(tts_engine_running_requests)", "none"),
        ("Requests waiting for a batch slot (simulator)", "sum(tts_engine_waiting_requests)", "none"),
    ]),
}


def dashboard(uid: str, title: str, panels: list) -> dict:
    out = []
    for i, (ptitle, expr, unit) in enumerate(panels):
        out.append({
            "id": i + 1, "type": "timeseries", "title": ptitle, "datasource": DS,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [{"refId": "A", "datasource": DS, "expr": expr, "legendFormat": "__auto"}],
        })
    return {"uid": uid, "title": title, "schemaVersion": 39, "version": 1, "editable": False, "refresh": "10s",
            "time": {"from": "now-30m", "to": "now"}, "tags": ["tts"], "panels": out}


def render() -> dict[str, str]:
    return {f"{uid}.json": json.dumps(dashboard(uid, t, p), indent=2) + "\n" for uid, (t, p) in DASHBOARDS.items()}


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    for name, text in render().items():
        if "--check" in sys.argv:
            if not (OUT / name).exists() or (OUT / name).read_text() != text:
                raise SystemExit(f"stale dashboard {name}: run python docker/grafana/dashboards.py")
        else:
            (OUT / name).write_text(text)

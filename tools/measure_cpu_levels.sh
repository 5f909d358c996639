#!/usr/bin/env bash
# The real vllm-omni CPU server (BACKEND=vllm-cpu, VARIANT=fixed) measured by the suite's own Locust load generator
# at the levels of configs/scenarios/cpu-levels.yaml; raw run folder in $1. Run it under the real-server lock:
#   flock /tmp/tts-real-server.lock bash tools/measure_cpu_levels.sh reports/sim-vs-cpu-raw [PORT]
# tools/sim_vs_real.py summarises the folder (the summary, not the raw records, is committed).
set -euo pipefail
out=${1:?run folder}; port=${2:-8097}
cd "$(dirname "$0")/.."
mkdir -p "$out"
uptime > "$out/host-load-before.txt"
.venv/bin/python cpu_server/serve.py --variant fixed --port "$port" > "$out/server.log" 2>&1 &
srv=$!
trap 'kill -TERM $srv 2>/dev/null; wait $srv 2>/dev/null || true' EXIT
.venv/bin/locust -f loadtest/tts.py --headless --host "http://127.0.0.1:$port" \
  --scenario configs/scenarios/cpu-levels.yaml --variant fixed --ready-timeout 600 \
  --run-dir "$out/run" --only-summary > "$out/locust.log" 2>&1
uptime > "$out/host-load-after.txt"

#!/bin/sh
# Start every container with an empty prometheus multiprocess directory (stale files from another run would be
# summed into /metrics), then run the command (by default `vllm serve ...`).
set -eu
dir="${PROMETHEUS_MULTIPROC_DIR:-/tmp/tts-prometheus-multiproc}"
rm -rf "$dir"
mkdir -p "$dir"
echo "tts-entrypoint: TTS_PREDICTOR_VARIANT=${TTS_PREDICTOR_VARIANT:-unset} PROMETHEUS_MULTIPROC_DIR=$dir" >&2
exec "$@"

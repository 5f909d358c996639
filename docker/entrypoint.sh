#!/bin/sh
# Start every container with an empty prometheus multiprocess directory when the image uses one (the 0.16.0 plugin
# image: stale files from another run would be summed into /metrics), then run the command (`vllm serve ...`).
# The upstream images leave PROMETHEUS_MULTIPROC_DIR unset: vLLM then sets up its own metrics transport as shipped.
set -eu
if [ -n "${PROMETHEUS_MULTIPROC_DIR:-}" ]; then
  rm -rf "$PROMETHEUS_MULTIPROC_DIR"
  mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
fi
echo "tts-entrypoint: uid $(id -u), TTS_PREDICTOR_VARIANT=${TTS_PREDICTOR_VARIANT:-unset (no plugin)}, PROMETHEUS_MULTIPROC_DIR=${PROMETHEUS_MULTIPROC_DIR:-unset}" >&2
exec "$@"

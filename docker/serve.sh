#!/usr/bin/env bash
# `make serve BACKEND=vllm VARIANT=original|fixed|vectorized [DRY_RUN=1]`: the real vllm-omni 0.16.0 server in Docker.
# Environment: VARIANT (fixed), PORT (8091), HOST (127.0.0.1; loopback only), STAGES (qwen3_tts_b64.yaml, a file in
# configs/stages/), MODEL (Qwen/Qwen3-TTS-12Hz-0.6B-Base), HF_CACHE (~/.cache/huggingface, mounted as the HF cache),
# HF_TOKEN (passed to the container at run time only, never baked into the image), HEALTH_TIMEOUT_S (1200),
# IMAGE (tts-vllm-omni:0.16.0-$VARIANT). DEVICE is accepted and ignored (the container sees all GPUs).
# Builds the image, starts a fresh container, waits for /health, then follows its log in the foreground; SIGINT or
# SIGTERM (the A/B runner's stop) removes the container. --dry-run (or DRY_RUN=1): print the exact commands, run none.
set -euo pipefail
cd "$(dirname "$0")/.."

VARIANT=${VARIANT:-fixed}
PORT=${PORT:-8091}
HOST=${HOST:-127.0.0.1}
STAGES=${STAGES:-qwen3_tts_b64.yaml}
MODEL=${MODEL:-Qwen/Qwen3-TTS-12Hz-0.6B-Base}
HF_CACHE=${HF_CACHE:-$HOME/.cache/huggingface}
HEALTH_TIMEOUT_S=${HEALTH_TIMEOUT_S:-1200}
IMAGE=${IMAGE:-tts-vllm-omni:0.16.0-$VARIANT}
NAME=tts-vllm-omni-$VARIANT-$PORT
DRY=${DRY_RUN:-}
for a in "$@"; do
  case $a in
    --dry-run) DRY=1 ;;
    *) echo "error: unknown argument $a (only --dry-run)" >&2; exit 2 ;;
  esac
done

die() { echo "error: $*" >&2; exit 1; }
case $VARIANT in original|fixed|vectorized) ;; *) die "VARIANT=$VARIANT is not one of original, fixed, vectorized" ;; esac
[[ $PORT =~ ^[0-9]+$ ]] && (( PORT >= 1 && PORT <= 65535 )) || die "PORT=$PORT is not a port number"
[[ $HOST =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "HOST=$HOST: the server is bound to loopback only (127.x.x.x)"
[ -f "configs/stages/$STAGES" ] || die "STAGES=$STAGES: no such file in configs/stages/"

build=(docker build -f docker/Dockerfile --build-arg "VARIANT=$VARIANT" -t "$IMAGE" .)
remove=(docker rm -f "$NAME")
run=(docker run -d --name "$NAME" --gpus all --ipc=host
     -p "$HOST:$PORT:8091"
     -v "$HF_CACHE:/home/tts/.cache/huggingface"
     -e HF_TOKEN -e "TTS_PREDICTOR_VARIANT=$VARIANT"
     "$IMAGE"
     vllm serve "$MODEL" --omni --stage-configs-path "/opt/tts-loadtest/stages/$STAGES" --host 0.0.0.0 --port 8091)
health="http://$HOST:$PORT/health"

if [ -n "$DRY" ]; then
  echo "# docker/serve.sh dry run: VARIANT=$VARIANT STAGES=$STAGES; HF_TOKEN is read from your environment at run time"
  echo "mkdir -p $(printf '%q' "$HF_CACHE")"
  printf '%q ' "${build[@]}"; echo
  printf '%q ' "${remove[@]}"; echo " 2>/dev/null || true"
  printf '%q ' "${run[@]}"; echo
  echo "# then poll $health every 5 s for up to ${HEALTH_TIMEOUT_S} s, and follow: docker logs -f $NAME"
  exit 0
fi

command -v docker >/dev/null 2>&1 || die "docker not found on PATH: BACKEND=vllm needs Docker with the NVIDIA runtime (or use BACKEND=sim)"
docker info >/dev/null 2>&1 || die "the Docker engine is not reachable (\`docker info\` failed): start it, or use BACKEND=sim"
docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia \
  || die "Docker lists no NVIDIA runtime: install the NVIDIA Container Toolkit on a GPU host (or use BACKEND=sim)"
command -v curl >/dev/null 2>&1 || die "curl not found (needed for the health wait)"
[ -n "${HF_TOKEN:-}" ] || echo "note: HF_TOKEN is not set; fine if the model is public or already in $HF_CACHE" >&2

mkdir -p "$HF_CACHE"
"${build[@]}"
"${remove[@]}" >/dev/null 2>&1 || true
cleanup() { docker rm -f "$NAME" >/dev/null 2>&1 || true; }
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 130' INT
trap cleanup EXIT
"${run[@]}" >/dev/null
echo "serve.sh: container $NAME ($IMAGE) started; waiting for $health (up to ${HEALTH_TIMEOUT_S} s)" >&2
deadline=$(( $(date +%s) + HEALTH_TIMEOUT_S ))
until curl -fsS -o /dev/null "$health"; do
  if [ "$(docker inspect -f '{{.State.Running}}' "$NAME" 2>/dev/null)" != true ]; then
    docker logs --tail 80 "$NAME" >&2 || true
    die "container $NAME exited before $health answered"
  fi
  if (( $(date +%s) > deadline )); then
    docker logs --tail 80 "$NAME" >&2 || true
    die "$health did not answer within ${HEALTH_TIMEOUT_S} s"
  fi
  sleep 5
done
echo "serve.sh: ready at http://$HOST:$PORT (variant $VARIANT); metrics at http://$HOST:$PORT/metrics" >&2
docker logs -f "$NAME" &
wait $!

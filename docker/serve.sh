#!/usr/bin/env bash
# The real vllm-omni server in Docker, one arm at a time: `make serve BACKEND=vllm [DRY_RUN=1]`, the A/B runner's
# vllm backend and loadtest/experiment.py all come through here, so every docker command is written only in this file.
#
# Usage: bash docker/serve.sh [--dry-run | --pull-only | --build-only | --fetch-model] [--env KEY=VALUE]... [-- ARGS]
#   (no mode)      build the image, start a fresh container, wait for /health, follow its log; SIGTERM/SIGINT stop
#                  it gracefully (docker stop -t STOP_GRACE_S, then docker rm; never rm -f of a running server: with
#                  --ipc=host vLLM's shared-memory segments would be left in the host's /dev/shm)
#   --dry-run      print every command of the modes below, in order, and run none (also DRY_RUN=1)
#   --pull-only    docker pull the upstream base image         } the runner calls these before block 1, outside
#   --build-only   docker build our image on it                } every ready timeout
#   --fetch-model  download MODEL at MODEL_REVISION into HF_CACHE }
#   --env K=V      one more environment variable for the server container (repeatable)
#   -- ARGS        appended to `vllm serve` (an experiment arm's extra server args)
# Environment (defaults in brackets):
#   VLLM_OMNI [0.16.0]  one of SUPPORTED below. 0.16.0 runs docker/Dockerfile (our tts_predictor plugin inside);
#                       later versions run docker/Dockerfile.upstream (no plugin: _LocalPredictorKVCache is gone)
#   VARIANT [original]  0.16.0 only: the plugin's variant (tts_predictor.domain.DEFAULT_VARIANT)
#   STAGES [qwen3_tts_b64.yaml]  0.16.0 only: a file of configs/stages/ (--stage-configs-path)
#   DEPLOY [qwen3_tts.yaml]      >= 0.30.0 only: a deploy file of the package or of configs/stages/deploy/$VLLM_OMNI/
#   MODEL [Qwen/Qwen3-TTS-12Hz-0.6B-Base], MODEL_REVISION (required for a real run: the 40-hex commit of the model
#                       repository; the server loads that snapshot folder, offline, so every arm and day loads the
#                       same weights; docs/gpu-host.md says how to look it up)
#   HF_CACHE [~/.cache/huggingface]  host folder mounted as the container's HF cache; created by you, used by the
#                       container as you (--user $(id -u):$(id -g)), so it is always writable
#   HF_TOKEN            passed to --fetch-model only (never to the server, never into an image or a file)
#   CONTROL_DIR         0.16.0 only: host folder holding the control file (tts_predictor/control.py), mounted
#                       read-only; sets TTS_PREDICTOR_CONTROL. The folder, not the file, is mounted: the writer
#                       replaces the file by a rename, which a single-file bind mount would never show.
#   CONTROL_FILE [control.json]  the file's name inside CONTROL_DIR (must exist: the plugin refuses to start without)
#   PORT [8091], HOST [127.0.0.1; loopback only], GPUS [all], HEALTH_TIMEOUT_S [1200], STOP_GRACE_S [30]
#   BASE_IMAGE [vllm/vllm-omni:v$VLLM_OMNI], IMAGE [tts-vllm-omni:$VLLM_OMNI-$VARIANT or tts-vllm-omni:$VLLM_OMNI]
#   NAME [tts-vllm-omni-<image tag>-$PORT], DEVICE (accepted and ignored: the container sees GPUS)
set -euo pipefail
cd "$(dirname "$0")/.."

SUPPORTED=(0.16.0 0.30.0 0.32.0rc1)
PLUGIN_VERSION=0.16.0  # the only release with _LocalPredictorKVCache, i.e. something for the plugin to patch
CONTAINER_HF=/home/tts/.cache/huggingface
CONTAINER_CONTROL=/run/tts-control

VLLM_OMNI=${VLLM_OMNI:-0.16.0}
VARIANT=${VARIANT:-original}
PORT=${PORT:-8091}
HOST=${HOST:-127.0.0.1}
GPUS=${GPUS:-all}
STAGES=${STAGES:-qwen3_tts_b64.yaml}
DEPLOY=${DEPLOY:-qwen3_tts.yaml}
MODEL=${MODEL:-Qwen/Qwen3-TTS-12Hz-0.6B-Base}
MODEL_REVISION=${MODEL_REVISION:-}
HF_CACHE=${HF_CACHE:-$HOME/.cache/huggingface}
CONTROL_DIR=${CONTROL_DIR:-}
CONTROL_FILE=${CONTROL_FILE:-control.json}
HEALTH_TIMEOUT_S=${HEALTH_TIMEOUT_S:-1200}
STOP_GRACE_S=${STOP_GRACE_S:-30}
BASE_IMAGE=${BASE_IMAGE:-vllm/vllm-omni:v$VLLM_OMNI}
mode=serve
DRY=${DRY_RUN:-}
extra_env=()
extra_args=()

die() { echo "error: $*" >&2; exit 1; }
while (( $# )); do
  case $1 in
    --dry-run) DRY=1 ;;
    --pull-only) mode=pull ;;
    --build-only) mode=build ;;
    --fetch-model) mode=fetch ;;
    --env)
      (( $# >= 2 )) || die "--env wants KEY=VALUE"
      [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env $2: not KEY=VALUE"
      extra_env+=(-e "$2"); shift ;;
    --) shift; extra_args=("$@"); break ;;
    *) die "unknown argument $1 (--dry-run, --pull-only, --build-only, --fetch-model, --env K=V, -- ARGS)" ;;
  esac
  shift
done

supported=0
for v in "${SUPPORTED[@]}"; do [ "$v" = "$VLLM_OMNI" ] && supported=1; done
(( supported )) || die "VLLM_OMNI=$VLLM_OMNI is not one of ${SUPPORTED[*]}"
[[ $PORT =~ ^[0-9]+$ ]] && (( PORT >= 1 && PORT <= 65535 )) || die "PORT=$PORT is not a port number"
[[ $HOST =~ ^127\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "HOST=$HOST: the server is bound to loopback only (127.x.x.x)"
[[ $STOP_GRACE_S =~ ^[0-9]+$ ]] || die "STOP_GRACE_S=$STOP_GRACE_S is not a whole number of seconds"
[[ $HEALTH_TIMEOUT_S =~ ^[0-9]+$ ]] || die "HEALTH_TIMEOUT_S=$HEALTH_TIMEOUT_S is not a whole number of seconds"
if [ -n "$MODEL_REVISION" ]; then
  [[ $MODEL_REVISION =~ ^[0-9a-f]{40}$ ]] \
    || die "MODEL_REVISION=$MODEL_REVISION: want the full 40-hex commit of $MODEL (a branch or tag moves)"
fi

if [ "$VLLM_OMNI" = "$PLUGIN_VERSION" ]; then
  case $VARIANT in original|fixed|vectorized) ;; *) die "VARIANT=$VARIANT is not one of original, fixed, vectorized" ;; esac
  [ -f "configs/stages/$STAGES" ] || die "STAGES=$STAGES: no such file in configs/stages/"
  dockerfile=docker/Dockerfile
  IMAGE=${IMAGE:-tts-vllm-omni:$VLLM_OMNI-$VARIANT}
  build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "VARIANT=$VARIANT")
  config_args=(--stage-configs-path "/opt/tts-loadtest/stages/$STAGES")
  what="vllm-omni $VLLM_OMNI + tts_predictor plugin, variant $VARIANT, stages $STAGES"
else
  [ -z "$CONTROL_DIR" ] || die "CONTROL_DIR is for the tts_predictor plugin, which only vllm-omni $PLUGIN_VERSION has"
  [[ $DEPLOY =~ ^[A-Za-z0-9_.-]+\.yaml$ ]] || die "DEPLOY=$DEPLOY: want a file name (a deploy file of the package or of configs/stages/deploy/$VLLM_OMNI/)"
  dockerfile=docker/Dockerfile.upstream
  IMAGE=${IMAGE:-tts-vllm-omni:$VLLM_OMNI}
  build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "VLLM_OMNI_VERSION=$VLLM_OMNI")
  # a bare name is looked up in the package's deploy folder, where the image put ours next to the stock files
  config_args=(--deploy-config "$DEPLOY" --log-stats)
  what="vllm-omni $VLLM_OMNI (stock, no plugin: VARIANT is ignored), deploy $DEPLOY"
fi
NAME=${NAME:-tts-vllm-omni-${IMAGE##*:}-$PORT}
[[ $NAME =~ ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$ ]] || die "NAME=$NAME is not a valid container name"
if [ -n "$CONTROL_DIR" ]; then
  [ -d "$CONTROL_DIR" ] || die "CONTROL_DIR=$CONTROL_DIR: no such folder"
  CONTROL_DIR=$(cd "$CONTROL_DIR" && pwd)
  [[ $CONTROL_FILE =~ ^[A-Za-z0-9_.-]+$ ]] || die "CONTROL_FILE=$CONTROL_FILE: want a plain file name"
  [ -f "$CONTROL_DIR/$CONTROL_FILE" ] || die "CONTROL_DIR=$CONTROL_DIR has no $CONTROL_FILE (the plugin would refuse to start)"
fi

uid=$(id -u)
gid=$(id -g)
revision=${MODEL_REVISION:-'<MODEL_REVISION>'}
snapshot="$CONTAINER_HF/hub/models--${MODEL//\//--}/snapshots/$revision"

pull=(docker pull "$BASE_IMAGE")
build=(docker build -f "$dockerfile" "${build_args[@]}" -t "$IMAGE" .)
fetch=(docker run --rm --user "$uid:$gid" -v "$HF_CACHE:$CONTAINER_HF" -e HF_TOKEN --entrypoint python3 "$IMAGE"
       -c "from huggingface_hub import snapshot_download as d; print(d('$MODEL', revision='$revision'))")
control=()
if [ -n "$CONTROL_DIR" ]; then
  control=(-v "$CONTROL_DIR:$CONTAINER_CONTROL:ro" -e "TTS_PREDICTOR_CONTROL=$CONTAINER_CONTROL/$CONTROL_FILE")
fi
variant_env=()
[ "$VLLM_OMNI" = "$PLUGIN_VERSION" ] && variant_env=(-e "TTS_PREDICTOR_VARIANT=$VARIANT")
run=(docker run -d --name "$NAME" --user "$uid:$gid" --gpus "$GPUS" --ipc=host
     -p "$HOST:$PORT:8091"
     -v "$HF_CACHE:$CONTAINER_HF"
     "${control[@]}"
     -e HF_HUB_OFFLINE=1 "${variant_env[@]}" "${extra_env[@]}"
     "$IMAGE"
     vllm serve "$snapshot" --omni "${config_args[@]}"
     --served-model-name "$MODEL" --revision "$revision" --tokenizer-revision "$revision"
     --host 0.0.0.0 --port 8091 "${extra_args[@]}")
stop=(docker stop -t "$STOP_GRACE_S" "$NAME")
remove=(docker rm "$NAME")
health="http://$HOST:$PORT/health"

show() { printf '%q ' "$@"; echo; }
if [ -n "$DRY" ]; then
  echo "# docker/serve.sh dry run ($mode): $what"
  if [ -n "$MODEL_REVISION" ]; then
    echo "# model $MODEL pinned at revision $MODEL_REVISION (served offline from that snapshot folder)"
  else
    echo "# MODEL_REVISION is not set: a real run refuses to start; pin the 40-hex commit (docs/gpu-host.md)"
  fi
  grep -q "assert v == " "$dockerfile" || die "$dockerfile has no version assert"
  echo "# image build asserts vllm-omni == $VLLM_OMNI (the first RUN of $dockerfile: assert v == ...)"
  echo "# HF cache: $HF_CACHE, created by you (uid $uid); the container runs as --user $uid:$gid and can write it"
  if [ -n "$CONTROL_DIR" ]; then
    echo "# control channel: $CONTROL_DIR mounted read-only at $CONTAINER_CONTROL ($CONTROL_FILE)"
  elif [ "$VLLM_OMNI" = "$PLUGIN_VERSION" ]; then
    echo "# control channel: off (CONTROL_DIR unset); CONTROL_DIR=DIR adds to docker run:" \
         "-v DIR:$CONTAINER_CONTROL:ro -e TTS_PREDICTOR_CONTROL=$CONTAINER_CONTROL/$CONTROL_FILE"
  fi
  case $mode in
    pull) show "${pull[@]}" ;;
    build) show "${build[@]}" ;;
    fetch) echo "mkdir -p $(printf '%q' "$HF_CACHE")"; show "${fetch[@]}" ;;
    serve)
      echo "mkdir -p $(printf '%q' "$HF_CACHE")"
      show "${pull[@]}"
      show "${build[@]}"
      show "${fetch[@]}"
      echo "# a container of this name left by an earlier run is stopped and removed the same graceful way:"
      echo "$(show "${stop[@]}") 2>/dev/null; $(show "${remove[@]}") 2>/dev/null"
      show "${run[@]}"
      echo "# health: poll $health every 5 s for up to ${HEALTH_TIMEOUT_S} s, then follow: docker logs -f $NAME"
      echo "# on SIGTERM/SIGINT/exit, graceful stop (SIGTERM to vLLM, SIGKILL only after ${STOP_GRACE_S} s), then removal:"
      show "${stop[@]}"
      show "${remove[@]}"
      ;;
  esac
  exit 0
fi

command -v docker >/dev/null 2>&1 || die "docker not found on PATH: BACKEND=vllm needs Docker with the NVIDIA runtime (or use BACKEND=sim)"
docker info >/dev/null 2>&1 || die "the Docker engine is not reachable (\`docker info\` failed): start it, or use BACKEND=sim"
case $mode in
  pull) exec "${pull[@]}" ;;
  build) exec "${build[@]}" ;;
  fetch)
    [ -n "$MODEL_REVISION" ] || die "MODEL_REVISION is not set: pin the 40-hex commit of $MODEL (docs/gpu-host.md)"
    mkdir -p "$HF_CACHE"
    exec "${fetch[@]}" ;;
esac

[ -n "$MODEL_REVISION" ] || die "MODEL_REVISION is not set: pin the 40-hex commit of $MODEL (docs/gpu-host.md)"
docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia \
  || die "Docker lists no NVIDIA runtime: install the NVIDIA Container Toolkit on a GPU host (or use BACKEND=sim)"
command -v curl >/dev/null 2>&1 || die "curl not found (needed for the health wait)"
mkdir -p "$HF_CACHE"
[ -d "$HF_CACHE/hub/models--${MODEL//\//--}/snapshots/$MODEL_REVISION" ] \
  || die "$MODEL at $MODEL_REVISION is not in $HF_CACHE: run bash docker/serve.sh --fetch-model first"
docker image inspect "$IMAGE" >/dev/null 2>&1 || "${build[@]}"

# Graceful stop in its own session: the A/B runner kills serve.sh's whole process group if it waits too long, and
# the stop must still finish (a half-stopped vLLM leaks shared memory into the host's /dev/shm).
graceful_stop() {
  setsid bash -c "$(printf '%q ' "${stop[@]}") >/dev/null 2>&1; $(printf '%q ' "${remove[@]}") >/dev/null 2>&1" &
  wait $! || true
}
if docker container inspect "$NAME" >/dev/null 2>&1; then
  echo "serve.sh: stopping the container $NAME left by an earlier run" >&2
  graceful_stop
fi
trap 'graceful_stop; exit 143' TERM
trap 'graceful_stop; exit 130' INT
trap graceful_stop EXIT
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
echo "serve.sh: ready at http://$HOST:$PORT ($what); metrics at http://$HOST:$PORT/metrics" >&2
docker logs -f "$NAME" &
wait $!

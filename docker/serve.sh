#!/usr/bin/env bash
# The real vllm-omni server in Docker, one arm at a time: `make serve BACKEND=vllm [DRY_RUN=1]`, the A/B runner's
# vllm backend and loadtest/launch.py all come through here, so every docker command is written only in this file.
#
# Usage: bash docker/serve.sh [--dry-run | --pull-only | --build-only | --fetch-model | --probe-gpu] [--env KEY=VALUE]...
#                              [-- ARGS]
#   (no mode)      build the image (again when the plugin source changed), start a fresh container, wait for /health,
#                  follow its log; SIGTERM/SIGINT stop it gracefully (docker stop -t STOP_GRACE_S, then docker rm;
#                  never rm -f of a running server: vLLM's shared-memory segments would be left behind)
#   --dry-run      print every command of the modes below, in order, and run none (also DRY_RUN=1)
#   --pull-only    docker pull the upstream base image         } the runner calls these before block 1, outside
#   --build-only   docker build our image on it                } every ready timeout
#   --fetch-model  download MODEL at MODEL_REVISION into HF_CACHE }
#   --probe-gpu    `docker run --gpus GPUS ... nvidia-smi -L` in a local image (IMAGE, else BASE_IMAGE): exit 0 when
#                  a container gets the GPU(s), whatever `docker info` lists as runtimes (--gpus needs none)
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
#   STAGE_INIT_TIMEOUT_S, INIT_TIMEOUT_S [HEALTH_TIMEOUT_S]  vllm-omni's own start-up limits (--stage-init-timeout,
#                       --init-timeout; its defaults 300/600 s are shorter than ours, and on a timeout it only warns
#                       and serves anyway), at least HEALTH_TIMEOUT_S
#   COMPILE_CACHE [~/.cache/tts-loadtest/compile]  host folder of the persistent compile caches (vLLM, Inductor,
#                       Triton), one sub-folder per host, release, build-file hash and base image id, so a start
#                       after the first is warm
#   SHM_SIZE [16g]      the container's own /dev/shm (vLLM's stages exchange data through shared memory; a private
#                       one dies with the container, where --ipc=host would leave leaked segments on the host)
#   SERVER_CPUS, SERVER_MEMS  --cpuset-cpus / --cpuset-mems of the server [one NUMA node: python3 -m
#                       loadtest.pinning server, SERVER_NUMA_NODE default 0]; SERVER_CPUS=none: unpinned
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
STAGE_INIT_TIMEOUT_S=${STAGE_INIT_TIMEOUT_S:-$HEALTH_TIMEOUT_S}
INIT_TIMEOUT_S=${INIT_TIMEOUT_S:-$HEALTH_TIMEOUT_S}
COMPILE_CACHE=${COMPILE_CACHE:-$HOME/.cache/tts-loadtest/compile}
SHM_SIZE=${SHM_SIZE:-16g}
SERVER_CPUS=${SERVER_CPUS:-}
SERVER_MEMS=${SERVER_MEMS:-}
CONTAINER_COMPILE=/home/tts/.cache/tts-compile
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
    --probe-gpu) mode=probe ;;
    --env)
      (( $# >= 2 )) || die "--env wants KEY=VALUE"
      [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_]*= ]] || die "--env $2: not KEY=VALUE"
      extra_env+=(-e "$2"); shift ;;
    --) shift; extra_args=("$@"); break ;;
    *) die "unknown argument $1 (--dry-run, --pull-only, --build-only, --fetch-model, --probe-gpu, --env K=V, -- ARGS)" ;;
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
for limit in STAGE_INIT_TIMEOUT_S INIT_TIMEOUT_S; do
  [[ ${!limit} =~ ^[0-9]+$ ]] || die "$limit=${!limit} is not a whole number of seconds"
  (( ${!limit} >= HEALTH_TIMEOUT_S )) || die "$limit=${!limit} is below HEALTH_TIMEOUT_S=$HEALTH_TIMEOUT_S:" \
    "vllm-omni would give up on a stage (and serve without it) while we still wait"
done
[[ $SHM_SIZE =~ ^[0-9]+[bkmg]?$ ]] || die "SHM_SIZE=$SHM_SIZE: want a size like 16g"
if [ -z "$SERVER_CPUS" ]; then
  read -r SERVER_CPUS plan_mems < <(python3 -m loadtest.pinning server) \
    || die "python3 -m loadtest.pinning server failed (set SERVER_CPUS and SERVER_MEMS, or SERVER_CPUS=none)"
  SERVER_MEMS=${SERVER_MEMS:-${plan_mems:-}}
fi
if [ "$SERVER_CPUS" = none ]; then
  SERVER_CPUS=
  SERVER_MEMS=
fi
[[ -z $SERVER_CPUS || $SERVER_CPUS =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] || die "SERVER_CPUS=$SERVER_CPUS: want a cpulist like 0-31"
[[ -z $SERVER_MEMS || $SERVER_MEMS =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] || die "SERVER_MEMS=$SERVER_MEMS: want NUMA nodes like 0"
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
  context=(docker/Dockerfile docker/entrypoint.sh pyproject.toml README.md tts_predictor configs/stages)
  what="vllm-omni $VLLM_OMNI + tts_predictor plugin, variant $VARIANT, stages $STAGES"
else
  [ -z "$CONTROL_DIR" ] || die "CONTROL_DIR is for the tts_predictor plugin, which only vllm-omni $PLUGIN_VERSION has"
  [[ $DEPLOY =~ ^[A-Za-z0-9_.-]+\.yaml$ ]] || die "DEPLOY=$DEPLOY: want a file name (a deploy file of the package or of configs/stages/deploy/$VLLM_OMNI/)"
  dockerfile=docker/Dockerfile.upstream
  IMAGE=${IMAGE:-tts-vllm-omni:$VLLM_OMNI}
  build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "VLLM_OMNI_VERSION=$VLLM_OMNI")
  # a bare name is looked up in the package's deploy folder, where the image put ours next to the stock files
  config_args=(--deploy-config "$DEPLOY" --log-stats)
  context=(docker/Dockerfile.upstream docker/entrypoint.sh configs/stages/deploy)
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

# The files the image is built from, hashed into a label: an image built from other plugin code is rebuilt, not run.
SOURCE_LABEL=tts-loadtest.source-sha256
source_hash=$(find "${context[@]}" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z \
              | xargs -0 sha256sum | sha256sum | cut -c1-16)
# one compile-cache folder per host, release, build files and base image: a cache written by other code or on another
# host is never reused, while the variant images of one release (they differ in a default variant only, and a hot-swap
# server runs every variant on one compile) share theirs, so a start of either is warm after the first
cache_key="$(hostname -s 2>/dev/null || echo host)/vllm-omni-$VLLM_OMNI-src$source_hash"

pull=(docker pull "$BASE_IMAGE")
build=(docker build -f "$dockerfile" "${build_args[@]}" --label "$SOURCE_LABEL=$source_hash" -t "$IMAGE" .)
probe=(docker run --rm --gpus "$GPUS" --entrypoint nvidia-smi "$IMAGE" -L)
fetch=(docker run --rm --user "$uid:$gid" -v "$HF_CACHE:$CONTAINER_HF" -e HF_TOKEN --entrypoint python3 "$IMAGE"
       -c "from huggingface_hub import snapshot_download as d; print(d('$MODEL', revision='$revision'))")
control=()
if [ -n "$CONTROL_DIR" ]; then
  control=(-v "$CONTROL_DIR:$CONTAINER_CONTROL:ro" -e "TTS_PREDICTOR_CONTROL=$CONTAINER_CONTROL/$CONTROL_FILE")
fi
variant_env=()
[ "$VLLM_OMNI" = "$PLUGIN_VERSION" ] && variant_env=(-e "TTS_PREDICTOR_VARIANT=$VARIANT")
cpuset=()
[ -n "$SERVER_CPUS" ] && cpuset+=(--cpuset-cpus "$SERVER_CPUS")
[ -n "$SERVER_CPUS" ] && [ -n "$SERVER_MEMS" ] && cpuset+=(--cpuset-mems "$SERVER_MEMS")
# set by run_args once the image id is known (the dry run shows <image-id>)
compile_dir="$COMPILE_CACHE/$cache_key-base<base-image-id>"
run_args() {
  run=(docker run -d --name "$NAME" --user "$uid:$gid" --gpus "$GPUS" --shm-size "$SHM_SIZE" "${cpuset[@]}"
       -p "$HOST:$PORT:8091"
       -v "$HF_CACHE:$CONTAINER_HF"
       -v "$compile_dir:$CONTAINER_COMPILE"
       -e "VLLM_CACHE_ROOT=$CONTAINER_COMPILE/vllm" -e "TORCHINDUCTOR_CACHE_DIR=$CONTAINER_COMPILE/inductor"
       -e "TRITON_CACHE_DIR=$CONTAINER_COMPILE/triton"
       "${control[@]}"
       -e HF_HUB_OFFLINE=1 "${variant_env[@]}" "${extra_env[@]}"
       "$IMAGE"
       vllm serve "$snapshot" --omni "${config_args[@]}"
       --served-model-name "$MODEL" --revision "$revision" --tokenizer-revision "$revision"
       --stage-init-timeout "$STAGE_INIT_TIMEOUT_S" --init-timeout "$INIT_TIMEOUT_S"
       --host 0.0.0.0 --port 8091 "${extra_args[@]}")
}
run_args
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
  echo "# image label $SOURCE_LABEL=$source_hash (its build files); an existing image without it is rebuilt first"
  echo "# compile cache: $compile_dir (vLLM, Inductor, Triton; cold when empty, warm after a first start, e.g." \
       "the one of make preflight PREPARE=1)"
  echo "# start-up limits: vllm-omni --stage-init-timeout $STAGE_INIT_TIMEOUT_S --init-timeout $INIT_TIMEOUT_S" \
       "(>= HEALTH_TIMEOUT_S $HEALTH_TIMEOUT_S)"
  if [ -n "$SERVER_CPUS" ]; then
    pinned="server CPUs $SERVER_CPUS, NUMA memory ${SERVER_MEMS:-any} (loadtest.pinning; the A/B runner's Locust runs on the others)"
  else
    pinned="server CPUs unpinned (SERVER_CPUS=none)"
  fi
  echo "# resources: --shm-size $SHM_SIZE (a private /dev/shm, no --ipc=host); $pinned"
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
    probe) show "${probe[@]}" ;;
    serve)
      echo "mkdir -p $(printf '%q' "$HF_CACHE") $(printf '%q' "$compile_dir")"
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
# `docker run --gpus` needs no runtime entry in `docker info` (the toolkit's hook does it), so a container that
# gets the GPU decides; the image is one already here (never pulled for this).
probe_gpu() {
  local img
  for img in "$IMAGE" "$BASE_IMAGE"; do
    if docker image inspect "$img" >/dev/null 2>&1; then
      probe[${#probe[@]}-2]=$img
      "${probe[@]}"
      return
    fi
  done
  echo "serve.sh: no local image to probe the GPU with ($IMAGE, $BASE_IMAGE): pull or build first" >&2
  return 3
}
source_label() { docker image inspect --format "{{ index .Config.Labels \"$SOURCE_LABEL\" }}" "$IMAGE" 2>/dev/null || true; }
case $mode in
  pull) exec "${pull[@]}" ;;
  build) exec "${build[@]}" ;;
  probe) probe_gpu; exit ;;
  fetch)
    [ -n "$MODEL_REVISION" ] || die "MODEL_REVISION is not set: pin the 40-hex commit of $MODEL (docs/gpu-host.md)"
    mkdir -p "$HF_CACHE"
    exec "${fetch[@]}" ;;
esac

[ -n "$MODEL_REVISION" ] || die "MODEL_REVISION is not set: pin the 40-hex commit of $MODEL (docs/gpu-host.md)"
command -v curl >/dev/null 2>&1 || die "curl not found (needed for the health wait)"
mkdir -p "$HF_CACHE"
[ -d "$HF_CACHE/hub/models--${MODEL//\//--}/snapshots/$MODEL_REVISION" ] \
  || die "$MODEL at $MODEL_REVISION is not in $HF_CACHE: run bash docker/serve.sh --fetch-model first"
have=$(source_label)
if [ "$have" != "$source_hash" ]; then
  echo "serve.sh: building $IMAGE (its $SOURCE_LABEL is '${have:-absent}', this checkout's build files hash to $source_hash)" >&2
  "${build[@]}"
fi
probe_out=$(probe_gpu 2>&1) || die "no GPU inside a container (\`$(printf '%q ' "${probe[@]}")\`): ${probe_out##*$'\n'}"
base_id=$(docker image inspect --format '{{.Id}}' "$BASE_IMAGE" 2>/dev/null || echo unknown)
base_id=${base_id#sha256:}
compile_dir="$COMPILE_CACHE/$cache_key-base${base_id:0:12}"
run_args
mkdir -p "$compile_dir"
if [ -n "$(ls -A "$compile_dir" 2>/dev/null)" ]; then cache_state=warm; else cache_state=cold; fi
echo "serve.sh: compile cache $cache_state: $compile_dir" >&2

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

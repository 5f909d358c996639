#!/usr/bin/env bash
# make test-upstream: what can be checked against the real vllm-omni releases without a GPU (docs/versions.md).
# Builds (once, cached by the hash of its inputs) a venv with vllm-omni 0.30.0, vLLM 0.30.0's CPU wheel and torch
# 2.13.0 CPU (tests/upstream/requirements.txt, --no-deps, pinned), downloads the wheels of wheels.txt (0.16.0,
# 0.32.0rc1) and unpacks them for reading, then runs tests/upstream with that venv's pytest.
# UPSTREAM_VENV_CACHE: where the venv and wheels live (default ~/.cache/tts-loadtest).
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
REQ=tests/upstream/requirements.txt
WHEELS=tests/upstream/wheels.txt
# shellcheck source=scripts/cached-venv.sh
source scripts/cached-venv.sh
CACHE=${UPSTREAM_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tts-loadtest}
venv=$(cached_venv upstream-venv "$REQ" "$WHEELS")
wheels="$CACHE/upstream-wheels-$(cat "$REQ" "$WHEELS" | sha256sum | cut -c1-16)"
if [ ! -f "$wheels/.complete" ]; then
  rm -rf "$wheels"
  mkdir -p "$wheels/dl"
  grep -v '^#' "$WHEELS" | while read -r spec; do
    [ -n "$spec" ] || continue
    "$venv/bin/python" -m pip download -q --no-deps --pre "$spec" -d "$wheels/dl"
  done
  for w in "$wheels"/dl/*.whl; do
    name=$(basename "$w" | cut -d- -f1,2)  # vllm_omni-0.16.0
    "$venv/bin/python" -m zipfile -e "$w" "$wheels/$name"
  done
  rm -rf "$wheels/dl"
  touch "$wheels/.complete"
fi
t1=$(date +%s)
set +e
# VLLM_PLUGINS="": our checkout (on PYTHONPATH, with its egg-info) declares the tts_predictor plugin, which vLLM
# would load while building its parser; the plugin refuses any vllm-omni but 0.16.0, as it should.
UPSTREAM_WHEELS="$wheels" PYTHONPATH="$PWD" VLLM_LOGGING_LEVEL=WARNING VLLM_PLUGINS="" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider -o addopts= --timeout 600 \
  -o "markers=upstream: runs inside the vllm-omni 0.30.0 venv (make test-upstream)" --rootdir=tests/upstream --confcutdir=tests/upstream \
  -c /dev/null tests/upstream
rc=$?
set -e
t2=$(date +%s)
echo "test-upstream: venv+wheels $((t1 - t0)) s, tests $((t2 - t1)) s, total $((t2 - t0)) s"
exit $rc

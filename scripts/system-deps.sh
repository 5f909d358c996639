#!/usr/bin/env bash
# Debian packages the tests use for real: Prometheus (promtool + server), headless Chromium, espeak-ng.
# Installs only what is missing; idempotent. Needs root (as on CI and the dev machines).
set -euo pipefail
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" != 0 ]; then
  echo "error: missing system packages: ${need[*]} (install them with apt-get as root)" >&2
  exit 1
fi
echo "installing system packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null

#!/usr/bin/env bash
# Installs every Debian package attn needs to build, test and benchmark (a no-op when present).
set -euo pipefail
pkgs=(cmake ninja-build g++ git python3 python3-venv python3-dev
      libfmt-dev libcli11-dev nlohmann-json3-dev libomp-dev libopenblas-dev
      libgtest-dev libgmock-dev libbenchmark-dev libicu-dev libpng-dev
      libopenmpi-dev openmpi-bin
      clang)  # clang-14: scripts/fuzz.sh (libFuzzer, ThreadSanitizer)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

#!/usr/bin/env bash
# Command 2 of the README: build the release and asan (ASan + UBSan) presets and run the whole
# test suite under both. Extra arguments go to ctest (e.g. -R attention).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
jobs=$(nproc)
for preset in release asan; do
  echo "=== $preset: build"
  cmake --preset "$preset" >/dev/null
  cmake --build "build/$preset" -j"$jobs"
  echo "=== $preset: test"
  ctest --preset "$preset" -j"$jobs" "$@"
done

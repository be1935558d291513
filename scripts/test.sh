#!/usr/bin/env bash
# Command 2 of the README: build the release and asan (ASan + UBSan) presets and run the whole
# test suite under both, the fuzzers and the ThreadSanitizer test (scripts/fuzz.sh), then the
# Python package's tests (pytest, in the venv of
# scripts/python-env.sh). Extra arguments go to ctest (e.g. -R attention).
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
echo "=== fuzzing (libFuzzer) and ThreadSanitizer: scripts/fuzz.sh"
bash scripts/fuzz.sh
echo "=== python: pip install ./ and pytest"
py=$(bash scripts/python-env.sh)
"$py" -m pytest -q python/tests

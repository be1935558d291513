#!/usr/bin/env bash
# Command 2 of the README: build the release and asan (ASan + UBSan) presets and run the whole
# test suite under both, the fuzzers and the ThreadSanitizer test (scripts/fuzz.sh), then the
# Python package's tests (pytest, in the venv of
# scripts/python-env.sh). Extra arguments go to ctest (e.g. -R attention).
set -euo pipefail
cd "$(dirname "$0")/.."
# Two test processes share the 2 cores (ctest -j): OpenMP threads that spin at every barrier
# (libgomp's default, active) steal the other process's cores, and tests of many small parallel
# calls crawl — on an Emerald Rapids VM the release suite took 495 s with spinning threads, 93 s
# passive (the test presets set it too, for ctest run by hand).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
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

#!/usr/bin/env bash
# scripts/cuda-bundle.sh — gathers what the GPU check needs into .cuda-bundle/ (ignored by git), for
# the device machine that a session may be lent (docs/CUDA.md, "Running it on a GPU"): the cuda test
# and bench binaries, libattn and the shared libraries a bare CUDA image may lack (fmt, libgomp).
# Run it here, after a build with ATTN_CUDA=ON; then, on the device machine, with .cuda-bundle carried:
#   bash scripts/cuda-device-check.sh
#
#   bash scripts/cuda-bundle.sh [BUILD_DIR]        (default build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
grep -q '^ATTN_CUDA:BOOL=ON' "$build/CMakeCache.txt" || {
  echo "cuda-bundle: $build was configured without ATTN_CUDA (needs nvcc)" >&2
  exit 2
}
ninja -C "$build" cuda_attention_test attn_cuda_bench
rm -rf .cuda-bundle && mkdir -p .cuda-bundle/lib
cp "$build/tests/cuda_attention_test" "$build/bench/attn_cuda_bench" .cuda-bundle/
cp -L "$build/src/libattn.so.0" .cuda-bundle/lib/
for lib in $(ldd .cuda-bundle/cuda_attention_test .cuda-bundle/lib/libattn.so.0 | awk '/=> \//{print $3}' | sort -u); do
  case "$(basename "$lib")" in
    libfmt.so.*|libgomp.so.*) cp -L "$lib" .cuda-bundle/lib/ ;;
  esac
done
du -sh .cuda-bundle

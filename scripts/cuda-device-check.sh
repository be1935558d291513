#!/usr/bin/env bash
# scripts/cuda-device-check.sh — the GPU check, run on the device machine in one call (docs/CUDA.md):
# the cuda.device sweep against the float64 reference, compute-sanitizer memcheck and racecheck over
# three of its tests (plain and general kernels), each kernel's time under ncu, then attn_cuda_bench
# beside torch SDPA (flash, cuDNN, efficient) on the same GPU. Logs go to $OUT (or
# ./cuda-check-out). Needs .cuda-bundle from scripts/cuda-bundle.sh.
#
#   bash scripts/cuda-device-check.sh [quick|bench|profile]
#     quick: the tests alone; bench: no sanitizers; profile: the tests, then ncu's sections for each
#     plain kernel
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-cuda-check-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.cuda-bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
b=.cuda-bundle
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
status=0
echo "== cuda.device"
timeout 300 "$b/cuda_attention_test" --device 2>&1 | tee "$out/test.log" || status=1
[ "${1:-}" = quick ] && exit $status
if [ "${1:-}" = profile ]; then
  # One launch of each plain kernel at the bench's shape, ncu's main sections (speed of light,
  # stall reasons, pipes, memory), for finding what bounds them.
  for k in forward_wide dq_wide dkdv; do
    timeout 120 ncu --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats -k "regex:$k" -c 1 \
      "$b/attn_cuda_bench" --reps 1 --warmup 0 >"$out/ncu-$k.txt" 2>&1 || status=1
    grep -E "Duration|Throughput|Pipe|Stall|Warp Cycles|Issued|Eligible|Occupancy|Registers|Shared Memory|Bank|L2 Hit|L1/TEX Hit|Busy" \
      "$out/ncu-$k.txt" | head -n 60
  done
  exit $status
fi
if [ "${1:-}" != bench ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool"
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$b/cuda_attention_test" --device \
      --gtest_filter='CudaDevice.ShapesAndDtypesMatchTheReference:CudaDevice.DeviceTensorApiEqualsTheHostPathBitwise:CudaDevice.FullyMaskedRowsGiveZerosAndNoGradient' \
      2>&1 | tail -n 25 | tee "$out/sanitizer-$tool.log" || status=1
  done
fi
if command -v ncu >/dev/null; then
  echo "== each kernel's time (ncu, clocks locked to base: shares, not speeds)"
  timeout 120 ncu --metrics gpu__time_duration.sum -k 'regex:forward|dq|dkdv|delta' "$b/attn_cuda_bench" --reps 1 --warmup 0 \
    2>&1 | grep -E '^  [a-z_]+.*\(|gpu__time_duration' | sed -E 's/\(attn::detail::cuda::dev_problem.*//' | tee "$out/ncu.txt"
fi
echo "== timings (same GPU, same call)"
for shape in "--d 128" "--d 128 --causal" "--d 64"; do
  "$b/attn_cuda_bench" $shape 2>&1 | tee -a "$out/bench.jsonl"
  python3 bench/cuda_peers.py $shape 2>&1 | tee -a "$out/bench.jsonl"
done
exit $status

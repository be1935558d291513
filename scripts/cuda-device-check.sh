#!/usr/bin/env bash
# scripts/cuda-device-check.sh — the GPU check, run on the device machine in one call (docs/CUDA.md):
# the cuda.device sweep against the float64 reference, compute-sanitizer memcheck and racecheck over
# three of its tests (plain and general kernels), the sweep again with the forward split wherever it
# can be, each kernel's time under ncu, then attn_cuda_bench beside torch SDPA (flash, cuDNN,
# efficient) on the same GPU, decode shapes (split-KV) included. Logs go to $OUT (or
# ./cuda-check-out). Needs .cuda-bundle from scripts/cuda-bundle.sh.
#
#   bash scripts/cuda-device-check.sh [quick|bench|profile|decode]
#     quick: the tests alone; bench: no sanitizers; profile: the tests, then ncu's sections for each
#     plain kernel; decode: the tests, then the decode shapes' kernel times and timings alone
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
echo "== cuda.device, the forward split wherever it can be (ATTN_CUDA_SPLITS=3)"
ATTN_CUDA_SPLITS=3 timeout 300 "$b/cuda_attention_test" --device 2>&1 | tee "$out/test-splits.log" | tail -n 3 || status=1
grep -q "PASSED" "$out/test-splits.log" && ! grep -q "FAILED" "$out/test-splits.log" || { grep -E "Failure|FAILED|Expected|Which is|actual" "$out/test-splits.log" | head -n 40; status=1; }
[ "${1:-}" = quick ] && exit $status
if [ "${1:-}" = decode ]; then  # the tests above, then decode's kernels and timings alone
  decode_only=1
fi
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
if [ "${1:-}" != bench ] && [ -z "${decode_only:-}" ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer --tool $tool"
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 "$b/cuda_attention_test" --device \
      --gtest_filter='CudaDevice.ShapesAndDtypesMatchTheReference:CudaDevice.DeviceTensorApiEqualsTheHostPathBitwise:CudaDevice.FullyMaskedRowsGiveZerosAndNoGradient:CudaDevice.SplitKvDecodeMatchesTheReferenceAndTheUnsplitKernel' \
      2>&1 | tail -n 25 | tee "$out/sanitizer-$tool.log" || status=1
  done
fi
if command -v ncu >/dev/null; then
  echo "== each kernel's time (ncu, clocks locked to base: shares, not speeds)"
  if [ -z "${decode_only:-}" ]; then
    timeout 120 ncu --metrics gpu__time_duration.sum -k 'regex:forward|dq|dkdv|delta' "$b/attn_cuda_bench" --reps 1 --warmup 0 \
      2>&1 | grep -E '^  [a-z_]+.*\(|gpu__time_duration' | sed -E 's/\(attn::detail::cuda::dev_problem.*//' | tee "$out/ncu.txt"
  fi
  timeout 60 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum -k 'regex:forward|combine' "$b/attn_cuda_bench" \
    --batch 1 --heads 32 --kv-heads 8 --nq 1 --nk 32768 --forward-only --reps 1 --warmup 0 \
    2>&1 | grep -E '^  [a-z_]+.*\(|gpu__time_duration|dram__bytes' | sed -E 's/\(attn::detail::cuda::dev_problem.*//' | tee -a "$out/ncu.txt"
fi
echo "== timings (same GPU, same call)"
if [ -z "${decode_only:-}" ]; then
  for shape in "--d 128" "--d 128 --causal" "--d 64"; do
    "$b/attn_cuda_bench" $shape 2>&1 | tee -a "$out/bench.jsonl"
    python3 bench/cuda_peers.py $shape 2>&1 | tee -a "$out/bench.jsonl"
  done
fi
echo "== decode (Nq = 1): split-KV, the same kernel unsplit (ATTN_CUDA_SPLITS=1), torch"
for shape in "--batch 1 --heads 32 --kv-heads 8 --nq 1 --nk 32768" "--batch 8 --heads 32 --kv-heads 8 --nq 1 --nk 8192" \
             "--batch 1 --heads 16 --kv-heads 16 --nq 1 --nk 131072"; do
  "$b/attn_cuda_bench" $shape --forward-only --reps 50 2>&1 | tee -a "$out/bench.jsonl"
  ATTN_CUDA_SPLITS=1 "$b/attn_cuda_bench" $shape --forward-only --reps 50 2>&1 | tee -a "$out/bench.jsonl"
  python3 bench/cuda_peers.py $shape --forward-only --reps 50 2>&1 | tee -a "$out/bench.jsonl"
done
exit $status

#!/bin/sh
# bench/family_fused_compare.sh — the fused family path, the core softmax kernel, the tiled path
# (bench/family_fused_bench.cc) and the PyTorch eager peers (bench/family_fused_peers.py) at one
# shape, the two programs alternating (`rounds` times) in one script, 2 threads,
# OMP_WAIT_POLICY=passive.
#   bench/family_fused_compare.sh BUILD_DIR PYTHON [B H N D reps tiled rounds]
# On a shared machine wrap it: flock /tmp/attn-bench.lock bench/family_fused_compare.sh ...
set -e
build=$1 py=$2
B=${3:-1} H=${4:-8} N=${5:-2048} D=${6:-64} reps=${7:-5} tiled=${8:-1} rounds=${9:-2}
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2
here=$(dirname "$0")
lscpu | grep -m1 'Model name' || true
for round in $(seq "$rounds"); do
  echo "--- round $round"
  "$build/bench/attn_family_fused_bench" "$B" "$H" "$N" "$D" 2 "$reps" "$tiled"
  "$py" "$here/family_fused_peers.py" "$B" "$H" "$N" "$D" 2 "$reps"
  tiled=0  # the float64 tiled path once is enough (seconds per call)
done

#!/usr/bin/env bash
# bench/run_grid.sh — the standard grid for attn and its peers in one run: a CSV and a PNG chart.
#
#   bench/setup_venv.sh                       # once: the peers' venv (torch, ggml-python, matplotlib)
#   bench/run_grid.sh [OUTDIR] [attn bench options...]
#   bench/run_grid.sh bench/out --threads 1,2 --reps 7
#
# Writes OUTDIR/grid.csv, OUTDIR/grid.txt (the printed table) and OUTDIR/grid.png.
# Without the venv the torch and ggml columns are missing and no chart is drawn.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/out}"
shift || true
attn="${ATTN:-$here/../build/release/tools/attn/attn}"
venv="${ATTN_BENCH_VENV:-$HOME/.cache/attn-bench-venv}"
mkdir -p "$out"
args=(bench --grid standard --csv "$out/grid.csv" --peer-script "$here/peers.py")
[[ -x "$venv/bin/python" ]] && args+=(--python "$venv/bin/python")
"$attn" "${args[@]}" "$@" | tee "$out/grid.txt"
if [[ -x "$venv/bin/python" ]]; then
  "$venv/bin/python" "$here/plot.py" "$out/grid.csv" "$out/grid.png"
fi

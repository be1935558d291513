#!/usr/bin/env bash
# Fuzzing and ThreadSanitizer (issue 14), run by scripts/test.sh. Builds fuzz/ with clang-14
# twice — libFuzzer + ASan + UBSan (npy_fuzz, api_fuzz, family_fuzz, cli_fuzz, serving_fuzz), and ThreadSanitizer
# (tsan_concurrency, OpenMP pragmas off) — only the library part they need, then runs each
# fuzzer for ATTN_FUZZ_SECONDS (default 15; it was 60 for two harnesses: 60 s of fuzzing less
# pays for the larger builds — the family, positional and serving ops and `attn run` in the
# fuzz build, linear and one nn layer under TSan) on a copy of its corpus in fuzz/corpus/<name>,
# then the TSan test.
# Any finding (crash, sanitizer report, trap) fails the script. Prints executions per harness.
#   scripts/fuzz.sh                  build, fuzz 15 s each, TSan
#   ATTN_FUZZ_SECONDS=600 scripts/fuzz.sh
#   ATTN_FUZZ_SEED=N scripts/fuzz.sh   libFuzzer's seed (default 1: CI walks the same sequence of
#                                      inputs on every run, so a finding is a change, not luck)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${ATTN_FUZZ_SECONDS:-15}
jobs=$(nproc)
for mode in fuzz tsan; do
  echo "=== fuzz/$mode: build (clang-14)"
  cmake -S fuzz -B "build/fuzz-$mode" -G Ninja -DCMAKE_CXX_COMPILER=clang++-14 -DATTN_FUZZ_MODE=$mode >/dev/null
  cmake --build "build/fuzz-$mode" -j"$jobs"
done
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export ASAN_OPTIONS=allocator_may_return_null=1:detect_leaks=1
for h in npy_fuzz api_fuzz family_fuzz cli_fuzz serving_fuzz; do
  name=${h%_fuzz}
  work=$(mktemp -d)
  cp fuzz/corpus/"$name"/* "$work"/
  echo "=== $h: ${secs} s"
  log=build/fuzz-fuzz/$h.log
  extra=()
  [ "$h" = cli_fuzz ] && extra=(-close_fd_mask=3)  # the tool's own messages, one per call
  if ! build/fuzz-fuzz/$h "${extra[@]}" -max_total_time="$secs" -seed="${ATTN_FUZZ_SEED:-1}" -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1 \
         -artifact_prefix=build/fuzz-fuzz/$h- "$work" >"$log" 2>&1; then
    tail -n 40 "$log"
    echo "$h: FINDING (artifact in build/fuzz-fuzz/)"
    exit 1
  fi
  echo "$h: $(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$') executions, no finding"
  rm -rf "$work"
done
echo "=== tsan_concurrency"
TSAN_OPTIONS=halt_on_error=1 build/fuzz-tsan/tsan_concurrency

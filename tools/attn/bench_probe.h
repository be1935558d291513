// tools/attn/bench_probe.h — short measurements of what the machine can do, so that `attn bench`
// can print each result as a fraction of it: the FMA peak per dtype and the DRAM read bandwidth.
// Probes are compiled for several ISAs with target attributes and picked by cpuid at run time,
// so the binary runs on any x86-64 (and, with the portable fallback, elsewhere).
#pragma once

#include <cstddef>
#include <string>

#include "attn/tensor.h"

namespace attn::cli::bench {

struct probe_result {
  double value = 0;  // GFLOP/s or GB/s (1e9), the best of a few short runs
  std::string isa;   // which code ran: "avx512f", "avx512_bf16", "avx2+fma", "portable"
};

// Peak multiply-add rate of `threads` threads for a dtype: f32 and f16 (computed in f32) with
// fused multiply-adds on enough independent accumulators to cover the FMA latency; bf16 with
// the AVX512_BF16 dot product (vdpbf16ps, 4 flops per f32 lane) when the CPU has it, else the
// f32 peak (bf16 is then converted and computed in f32).
probe_result probe_fma_peak(dtype t, int threads);

// Read bandwidth from memory with `threads` threads over a buffer of `bytes` (much larger than
// the last-level cache), vector loads, best of a few passes. Throws attn::error when `bytes`
// leaves a thread less than 4 KiB.
probe_result probe_dram_read(int threads, std::size_t bytes);

// What the hardware prefetchers follow: two streams of `bytes` in all (K and V, split among
// `threads` threads) read a 4 KiB block of each at a time — by one load instruction in a loop,
// by a load instruction per line (the loop unrolled, as register-blocked kernels compile), and
// the unrolled form with a software prefetch (prefetcht1) 16 KiB ahead of each line. GB/s, best
// of a few passes; throws attn::error when `bytes` leaves a thread less than a block of each
// stream. (attn bench --prefetch-probe; docs/PERFORMANCE.md, "The probes".)
struct prefetch_probe_result {
  double rolled = 0, unrolled = 0, unrolled_prefetch = 0;
  std::string isa;
};
prefetch_probe_result probe_prefetchers(int threads, std::size_t bytes);

// A --threads value as the benchmarks run it: 0 is every hardware thread (at least 1); below 0
// throws attn::error naming the option.
int resolve_threads(int t);

// "AMD EPYC 9B45" from /proc/cpuinfo, or "unknown CPU".
std::string cpu_model_name();

bool cpu_has_avx512f();

}  // namespace attn::cli::bench

// tools/attn/bench_probe.cc — FMA-peak and DRAM-bandwidth probes for `attn bench`.
//
// Each probe exists once per ISA, compiled with a target attribute (never with -march), and
// the choice among them is made in exactly one place per probe, from cpuid. Threads are plain
// std::threads released together by a barrier: the time of a run is from the barrier to the
// last thread's end, the best of a few runs is kept (a probe measures what the machine can do;
// the benchmarks themselves report medians).
#include "bench_probe.h"

#include <fmt/format.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#ifdef __linux__
#include <sys/mman.h>
#endif

#include "attn/attention.h"
#include "attn/error.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's reduce/cast intrinsics start from _mm512_undefined_*, which -Wuninitialized flags
// inside the header: a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define ATTN_BENCH_X86 1
#endif

namespace attn::cli::bench {
namespace {

using clock_type = std::chrono::steady_clock;

// Runs body(tid) on `threads` threads after a common barrier; returns the seconds from the
// release to the end of the slowest thread.
double timed_parallel(int threads, const std::function<void(int)>& body) {
  threads = std::max(1, threads);
  std::barrier start(threads + 1);
  std::vector<std::thread> pool;
  pool.reserve(threads);
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
    });
  const auto t0 = clock_type::now();
  start.arrive_and_wait();
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

// The kernels return a value that depends on every accumulator so the loop cannot be removed.
// kAcc independent chains cover latency x pipes (4 x 2 on current cores) with room to spare.
constexpr int kAcc = 16;

double fma_portable(std::int64_t iters) {
  float a[kAcc];
  for (int j = 0; j < kAcc; ++j) a[j] = float(j);
  for (std::int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kAcc; ++j) a[j] = a[j] * 0.999999f + 1e-6f;
  double s = 0;
  for (float x : a) s += x;
  return s;
}
constexpr int kPortableFlopsPerIter = kAcc * 2;

#ifdef ATTN_BENCH_X86
__attribute__((target("avx2,fma"))) double fma_avx2(std::int64_t iters) {
  __m256 a[kAcc];
  for (int j = 0; j < kAcc; ++j) a[j] = _mm256_set1_ps(float(j));
  const __m256 x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-6f);
  for (std::int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kAcc; ++j) a[j] = _mm256_fmadd_ps(a[j], x, y);
  __m256 s = a[0];
  for (int j = 1; j < kAcc; ++j) s = _mm256_add_ps(s, a[j]);
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[7];
}

__attribute__((target("avx512f"))) double fma_avx512(std::int64_t iters) {
  __m512 a[kAcc];
  for (int j = 0; j < kAcc; ++j) a[j] = _mm512_set1_ps(float(j));
  const __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-6f);
  for (std::int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kAcc; ++j) a[j] = _mm512_fmadd_ps(a[j], x, y);
  __m512 s = a[0];
  for (int j = 1; j < kAcc; ++j) s = _mm512_add_ps(s, a[j]);
  return _mm512_reduce_add_ps(s);
}

// vdpbf16ps: per f32 lane, acc += a0*b0 + a1*b1 — 4 flops per lane, 64 per instruction.
__attribute__((target("avx512f,avx512bf16"))) double dpbf16_avx512(std::int64_t iters) {
  __m512 a[kAcc];
  for (int j = 0; j < kAcc; ++j) a[j] = _mm512_setzero_ps();
  const __m512bh x = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-3f), _mm512_set1_ps(2e-3f));
  const __m512bh y = _mm512_cvtne2ps_pbh(_mm512_set1_ps(3e-3f), _mm512_set1_ps(1e-3f));
  for (std::int64_t i = 0; i < iters; ++i)
    for (int j = 0; j < kAcc; ++j) a[j] = _mm512_dpbf16_ps(a[j], x, y);
  __m512 s = a[0];
  for (int j = 1; j < kAcc; ++j) s = _mm512_add_ps(s, a[j]);
  return _mm512_reduce_add_ps(s);
}

// tdpbf16ps on four 16 × 16 accumulator tiles from fixed operand tiles (bf16 operands in L1,
// loaded once): 16·16·32·2 flops per instruction — the AMX level's bf16 products (src/cpu/amx.h).
// The tile state is the thread's: configured here, released at the end.
__attribute__((target("amx-tile,amx-bf16"))) double dpbf16_amx(std::int64_t iters) {
  alignas(64) unsigned char cfg[64] = {};
  cfg[0] = 1;
  for (int t = 0; t < 8; ++t) cfg[16 + 2 * t] = 64, cfg[48 + t] = 16;
  _tile_loadconfig(cfg);
  alignas(64) static const std::uint16_t ops[16 * 32] = {};  // zeros: no denormals, no overflow
  alignas(64) float out[16 * 16];
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, ops, 64);
  _tile_loadd(5, ops, 64);
  _tile_loadd(6, ops, 64);
  _tile_loadd(7, ops, 64);
  for (std::int64_t i = 0; i < iters; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, out, 64);
  _tile_release();
  return double(out[0]);
}

__attribute__((target("avx512f"))) std::uint64_t read_avx512(const std::byte* p, std::size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i + 256 <= bytes; i += 256) {
    a0 = _mm512_xor_si512(a0, _mm512_load_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_load_si512(p + i + 64));
    a2 = _mm512_xor_si512(a2, _mm512_load_si512(p + i + 128));
    a3 = _mm512_xor_si512(a3, _mm512_load_si512(p + i + 192));
  }
  return std::uint64_t(_mm512_reduce_add_epi64(_mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3))));
}

__attribute__((target("avx2"))) std::uint64_t read_avx2(const std::byte* p, std::size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i + 128 <= bytes; i += 128) {
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 64)));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 96)));
  }
  const __m256i s = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return std::uint64_t(_mm256_extract_epi64(s, 0) ^ _mm256_extract_epi64(s, 3));
}
#endif

std::uint64_t read_portable(const std::byte* p, std::size_t bytes) {
  const auto* w = reinterpret_cast<const std::uint64_t*>(p);
  std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (std::size_t i = 0; i + 4 <= bytes / 8; i += 4) a0 ^= w[i], a1 ^= w[i + 1], a2 ^= w[i + 2], a3 ^= w[i + 3];
  return a0 ^ a1 ^ a2 ^ a3;
}

struct fma_kernel {
  double (*run)(std::int64_t);
  double flops_per_iter;
  const char* isa;
};

// Whether the cpu backend runs the amx level (its kernels' name in a bf16 prefill's path): then
// its bf16 products are AMX tiles, and so is the bf16 probe. (The library has asked the OS for
// the tile state by then.)
bool cpu_backend_uses_amx() {
  const Tensor q = Tensor::zeros({1, 1, 64, 64}, dtype::bf16);
  return explain_backend(q, q, q, {}, false, {.use_backend = backend::cpu}).find("amx kernels") != std::string::npos;
}

// The one ISA choice for the FMA probe.
fma_kernel pick_fma_kernel(dtype t) {
#ifdef ATTN_BENCH_X86
  __builtin_cpu_init();
  if (t == dtype::bf16 && cpu_backend_uses_amx()) return {dpbf16_amx, 4 * 16.0 * 16 * 32 * 2, "amx_bf16"};
  if (t == dtype::bf16 && __builtin_cpu_supports("avx512bf16")) return {dpbf16_avx512, kAcc * 16.0 * 4, "avx512_bf16"};
  if (__builtin_cpu_supports("avx512f")) return {fma_avx512, kAcc * 16.0 * 2, "avx512f"};
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return {fma_avx2, kAcc * 8.0 * 2, "avx2+fma"};
#endif
  return {fma_portable, double(kPortableFlopsPerIter), "portable"};
}

struct read_kernel {
  std::uint64_t (*run)(const std::byte*, std::size_t);
  const char* isa;
};

// The one ISA choice for the bandwidth probe.
read_kernel pick_read_kernel() {
#ifdef ATTN_BENCH_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return {read_avx512, "avx512f"};
  if (__builtin_cpu_supports("avx2")) return {read_avx2, "avx2"};
#endif
  return {read_portable, "portable"};
}

volatile double g_sink_f;
volatile std::uint64_t g_sink_u;

}  // namespace

bool cpu_has_avx512f() {
#ifdef ATTN_BENCH_X86
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

probe_result probe_fma_peak(dtype t, int threads) {
  const fma_kernel k = pick_fma_kernel(t);
  // Size one run at about 10 ms from a 2 ms calibration run (which also wakes the cores up),
  // then keep the best of at least 10 runs and 0.4 s: on a busy machine the best run is one
  // where every thread had its core to itself.
  std::int64_t iters = 1 << 16;
  for (;;) {
    const double s = timed_parallel(1, [&](int) { g_sink_f = k.run(iters); });
    if (s > 2e-3 || iters > (std::int64_t(1) << 34)) {
      iters = std::max<std::int64_t>(iters, std::int64_t(double(iters) * 0.01 / std::max(s, 1e-9)));
      break;
    }
    iters *= 4;
  }
  double best = 0, spent = 0;
  for (int run = 0; run < 10 || (run < 200 && spent < 0.4); ++run) {
    const double s = timed_parallel(threads, [&](int) { g_sink_f = k.run(iters); });
    best = std::max(best, double(iters) * k.flops_per_iter * threads / s / 1e9);
    spent += s;
  }
  return {best, k.isa};
}

namespace {

// `threads` parts of `part` bytes each, in transparent huge pages where the kernel gives them
// (as attn's tensors of this size are, Tensor::empty: the probes read memory mapped as the
// kernels' operands are), each first touched by the thread that reads it (its pages land on
// that thread's memory node) with lines of 1.0f and zeros (no subnormal floats for probes that
// compute on what they read). Null when the allocation fails.
std::unique_ptr<std::byte, decltype(&std::free)> touched_parts(int threads, std::size_t part) {
  constexpr std::size_t kHuge = std::size_t(2) << 20;
  const std::size_t size = (part * std::size_t(threads) + kHuge - 1) / kHuge * kHuge;
  std::unique_ptr<std::byte, decltype(&std::free)> buf(static_cast<std::byte*>(std::aligned_alloc(kHuge, size)), &std::free);
  if (!buf) return buf;
#ifdef __linux__
  madvise(buf.get(), size, MADV_HUGEPAGE);
#endif
  std::byte* raw = buf.get();
  timed_parallel(threads, [&](int t) {
    std::byte* p = raw + part * std::size_t(t);
    const float one = 1.0f;
    for (std::size_t i = 0; i < part; i += 64) {
      std::memset(p + i, 0, 64);
      std::memcpy(p + i, &one, 4);
    }
  });
  return buf;
}

}  // namespace

probe_result probe_dram_read(int threads, std::size_t bytes) {
  const read_kernel k = pick_read_kernel();
  threads = std::max(1, threads);
  const std::size_t chunk = (bytes / std::size_t(threads)) / 4096 * 4096;
  if (chunk == 0)
    throw error(fmt::format("attn bench: the DRAM probe's buffer of {} bytes leaves {} threads less than 4 KiB each", bytes, threads));
  const auto buf = touched_parts(threads, chunk);
  if (!buf) return {0, k.isa};
  const std::byte* raw = buf.get();
  // At least 6 passes, then more up to about 0.6 s: on a busy machine the best pass is the one
  // that ran undisturbed.
  double best = 0, spent = 0;
  for (int pass = 0; pass < 6 || (pass < 40 && spent < 0.6); ++pass) {
    const double s = timed_parallel(threads, [&](int t) { g_sink_u = k.run(raw + chunk * std::size_t(t), chunk); });
    best = std::max(best, double(chunk) * threads / s / 1e9);
    spent += s;
  }
  return {best, k.isa};
}

namespace {

// Two streams (as decode reads K and V) a 4 KiB block of each at a time, with a chain of two
// dependent multiply-adds on every line (arithmetic that keeps the out-of-order window from
// running far ahead, as a kernel's does): the block's 64 lines read by one load instruction in
// a loop (Rolled), or by a load instruction of their own (the loop unrolled, as
// register-blocked kernels compile), with a prefetcht1 kPrefetchAhead ahead of each line or
// not. Cores whose prefetchers follow each load instruction's stride read the rolled form at
// about the DRAM probe's rate and the unrolled one at a fraction of it.
constexpr std::size_t kProbeBlock = 4096, kPrefetchAhead = 16384;
typedef float line_vec __attribute__((vector_size(64)));

template <bool Rolled, bool Prefetch>
__attribute__((always_inline)) inline std::uint64_t read_blocks(const std::byte* k, const std::byte* v, std::size_t bytes) {
  line_vec a = {}, b = {};
  const auto block = [](const std::byte* p, line_vec& acc) __attribute__((always_inline)) {
    const line_vec c = line_vec{} + 0.999f;
    const auto line = [&](std::size_t l) __attribute__((always_inline)) {
      // line l of the block in the order decode reads 4 rows of 256 bytes: a unit of each row
      // in turn (a 4 x 4 transpose of the lines of every KiB)
      const std::size_t i = (l & ~std::size_t(15)) * 64 + ((l & 3) * 4 + (l >> 2 & 3)) * 64;
      if constexpr (Prefetch) __builtin_prefetch(p + i + kPrefetchAhead, 0, 2);
      line_vec x;
      std::memcpy(&x, p + i, 64);
      acc = (acc * c + x) * c + x;
    };
    if constexpr (Rolled) {
#pragma GCC unroll 1
      for (std::size_t l = 0; l < kProbeBlock / 64; ++l) line(l);
    } else {
#pragma GCC unroll 64
      for (std::size_t l = 0; l < kProbeBlock / 64; ++l) line(l);
    }
  };
  for (std::size_t o = 0; o + kProbeBlock <= bytes; o += kProbeBlock) block(k + o, a), block(v + o, b);
  a += b;
  std::uint32_t u;
  std::memcpy(&u, &a, 4);
  return u;
}
using blocks_fn = std::uint64_t (*)(const std::byte*, const std::byte*, std::size_t);
std::uint64_t blocks_rolled(const std::byte* k, const std::byte* v, std::size_t n) { return read_blocks<true, false>(k, v, n); }
std::uint64_t blocks_unrolled(const std::byte* k, const std::byte* v, std::size_t n) { return read_blocks<false, false>(k, v, n); }
std::uint64_t blocks_unrolled_pf(const std::byte* k, const std::byte* v, std::size_t n) { return read_blocks<false, true>(k, v, n); }
#ifdef ATTN_BENCH_X86
__attribute__((target("avx512f"))) std::uint64_t blocks_rolled_avx512(const std::byte* k, const std::byte* v, std::size_t n) {
  return read_blocks<true, false>(k, v, n);
}
__attribute__((target("avx512f"))) std::uint64_t blocks_unrolled_avx512(const std::byte* k, const std::byte* v, std::size_t n) {
  return read_blocks<false, false>(k, v, n);
}
__attribute__((target("avx512f"))) std::uint64_t blocks_unrolled_pf_avx512(const std::byte* k, const std::byte* v, std::size_t n) {
  return read_blocks<false, true>(k, v, n);
}
#endif

}  // namespace

prefetch_probe_result probe_prefetchers(int threads, std::size_t bytes) {
  threads = std::max(1, threads);
  blocks_fn fns[3] = {blocks_rolled, blocks_unrolled, blocks_unrolled_pf};
  prefetch_probe_result r;
  r.isa = "portable";
#ifdef ATTN_BENCH_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) {
    fns[0] = blocks_rolled_avx512, fns[1] = blocks_unrolled_avx512, fns[2] = blocks_unrolled_pf_avx512;
    r.isa = "avx512f";
  }
#endif
  // per thread: a K stream and a V stream of `chunk` bytes each
  const std::size_t chunk = bytes / std::size_t(2 * threads) / kProbeBlock * kProbeBlock;
  if (chunk == 0)
    throw error(fmt::format("attn bench: the prefetch probe's buffer of {} bytes leaves {} threads less than two blocks of {} bytes each",
                            bytes, threads, kProbeBlock));
  const auto buf = touched_parts(threads, 2 * chunk);
  if (!buf) return r;
  const std::byte* raw = buf.get();
  double* out[3] = {&r.rolled, &r.unrolled, &r.unrolled_prefetch};
  for (int f = 0; f < 3; ++f) {
    double best = 0, spent = 0;
    for (int pass = 0; pass < 4 || (pass < 40 && spent < 0.3); ++pass) {
      const double s = timed_parallel(threads, [&](int t) {
        const std::byte* p = raw + 2 * chunk * std::size_t(t);
        g_sink_u = fns[f](p, p + chunk, chunk);
      });
      best = std::max(best, double(2 * chunk) * threads / s / 1e9);
      spent += s;
    }
    *out[f] = best;
  }
  return r;
}

int resolve_threads(int t) {
  if (t < 0) throw error(fmt::format("attn bench: --threads {} must be >= 0 (0: all)", t));
  return t ? t : int(std::max(1u, std::thread::hardware_concurrency()));
}

std::string cpu_model_name() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown CPU";
}

}  // namespace attn::cli::bench

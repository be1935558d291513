// src/core/common.h — small pieces every layer of the library shares, defined once:
// the error helper of the fronts, -inf, and the view of a q/k/v-like tensor as [B, H, N, X].
#pragma once

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attn/error.h"
#include "core/problem.h"

namespace attn::detail {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Throws attn::error "<op>: <what>".
[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw error(fmt::format("{}: {}", op, what));
}

// The thread count a call runs with, decided here for every op: 0 means all available
// (omp_get_max_threads); a request above 4 × the processors is clamped to that (results do not
// depend on the thread count, and OpenMP cannot start 100000 threads); negative is an error.
// Σ_{x < n} term(x) in float64, in eight partial sums (lane x % 8) added pairwise at the end: a
// fixed order whatever the strides, so that a loop over unit-stride rows, which the compiler
// vectorises, gives the bits of a strided one.
template <class Term>
double sum8(std::int64_t n, Term term) {
  double acc[8] = {};
  std::int64_t x = 0;
  for (; x + 8 <= n; x += 8)
    for (int l = 0; l < 8; ++l) acc[l] += term(x + l);
  for (; x < n; ++x) acc[x % 8] += term(x);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// An index tensor (int64 or int32; any strides) of the given rank, 1 or 2, as a C-order vector
// of int64; `want` describes the expected shape for the message ("[B + 1]"). Every index input
// of the library that a caller builds once per step — cu_seqlens, block_table, seq_lens,
// nonpad_kv_seqlen, cache lengths — is read here: FlashAttention, vLLM and PyTorch hold int32.
std::vector<std::int64_t> read_index(const char* op, const char* name, const TensorView& t, int rank, const char* want);

// Working memory of `bytes` bytes, 64-byte aligned, or null when the system has none: blocks of
// 8 MiB or more are 2 MiB aligned, on transparent huge pages where the kernel gives them, and come
// from the cache of freed Tensor buffers (attn/tensor.h, release_cached_buffers) when one of the
// same rounded size is kept — a fresh block costs a page fault and the kernel's zeroing per 4 KiB
// on first touch. Give it back with free_working(p, bytes), the same bytes. (src/core/tensor.cc)
void* alloc_working(std::size_t bytes);
void free_working(void* p, std::size_t bytes);

inline int thread_count(const char* op, const execution& exec) {
  if (exec.num_threads < 0) fail(op, fmt::format("num_threads = {} must be >= 0 (0: all)", exec.num_threads));
  const int cap = 4 * std::max(1, omp_get_num_procs());
  return exec.num_threads ? std::min(exec.num_threads, cap) : std::max(1, std::min(omp_get_max_threads(), cap));
}

// A q/k/v-like tensor seen as [B, H, N, X] (no copy): 4-D as is, 3-D [B, N, H*X] split into
// `heads` heads of X = size(2) / heads features.
inline strided4 as_bhnx(const TensorView& t, std::int64_t heads) {
  strided4 s;
  s.data = t.data();
  s.type = t.type();
  if (t.rank() == 4) {
    s.sb = t.stride(0), s.sh = t.stride(1), s.sn = t.stride(2), s.sx = t.stride(3);
  } else {
    const std::int64_t x = heads ? t.size(2) / heads : 0;
    s.sb = t.stride(0), s.sh = x * t.stride(2), s.sn = t.stride(1), s.sx = t.stride(2);
  }
  return s;
}

}  // namespace attn::detail

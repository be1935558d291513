// src/cpu/buffers.h — the 64-byte aligned float buffers every cpu driver (cpu_backend.cc, the
// family's fused.cc) works in, with allocation failure reported as attn::error naming the op.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "core/common.h"

namespace attn::detail::cpu {

// Gives a buffer back to the working memory it came from (core/common.h, free_working: blocks of
// 8 MiB or more are kept for the next call of the same size).
struct free_deleter {
  std::size_t bytes = 0;
  void operator()(float* p) const { free_working(p, bytes); }
};
using fbuf = std::unique_ptr<float[], free_deleter>;

// n floats, 64-byte aligned; attn::error "<op>: cannot allocate N bytes …" when the memory is not
// there. From alloc_working: a packed K/V, a transposed V, gathered pages of tens of MiB reuse
// the pages of the last call of their size instead of faulting fresh ones (docs/PERFORMANCE.md,
// "Working memory kept between calls").
inline fbuf alloc_floats(std::int64_t n, const char* op) {
  const std::size_t bytes = (std::size_t(std::max<std::int64_t>(n, 1)) * 4 + 63) / 64 * 64;
  fbuf r(static_cast<float*>(alloc_working(bytes)), free_deleter{bytes});
  if (!r) fail(op, fmt::format("cannot allocate {} bytes of working memory", bytes));
  return r;
}

// std::allocator with 64-byte alignment: a vector's data starts on a cache line, so that rows
// whose byte stride is a multiple of 64 start on cache lines too. An AMX tile row of 64 bytes
// that straddles two lines costs twice the loads: malloc's 16-byte alignment made the tile
// products about 3× slower (tileloadd from L1 and L2, measured on a Xeon with AMX).
template <class T>
struct aligned64 {
  using value_type = T;
  aligned64() = default;
  template <class U>
  aligned64(const aligned64<U>&) noexcept {}
  static std::size_t bytes(std::size_t n) { return (std::max<std::size_t>(n, 1) * sizeof(T) + 63) / 64 * 64; }
  T* allocate(std::size_t n) {
    if (void* p = alloc_working(bytes(n))) return static_cast<T*>(p);
    throw std::bad_alloc();
  }
  void deallocate(T* p, std::size_t n) noexcept { free_working(p, bytes(n)); }
  // words(n) leaves its n words unset (default-initialised), as new T[n] would: the packs write
  // every word they hold, and a zero fill first was one more pass over fresh pages. words(n, 0u)
  // fills as usual.
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
  template <class U>
  bool operator==(const aligned64<U>&) const noexcept { return true; }
};

// 32-bit words of packed bf16 pairs (bf16_words.h), cache-line aligned.
using words = std::vector<std::uint32_t, aligned64<std::uint32_t>>;

}  // namespace attn::detail::cpu

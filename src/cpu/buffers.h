// src/cpu/buffers.h — the 64-byte aligned float buffers every cpu driver (cpu_backend.cc, the
// family's fused.cc) works in, with allocation failure reported as attn::error naming the op.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include <fmt/format.h>

#include "core/common.h"

namespace attn::detail::cpu {

struct free_deleter {
  void operator()(float* p) const { std::free(p); }
};
using fbuf = std::unique_ptr<float[], free_deleter>;

// n floats, 64-byte aligned; attn::error "<op>: cannot allocate N bytes …" when the memory is not there.
inline fbuf alloc_floats(std::int64_t n, const char* op) {
  const std::size_t bytes = (std::size_t(std::max<std::int64_t>(n, 1)) * 4 + 63) / 64 * 64;
  fbuf r(static_cast<float*>(std::aligned_alloc(64, bytes)));
  if (!r) fail(op, fmt::format("cannot allocate {} bytes of working memory", bytes));
  return r;
}

}  // namespace attn::detail::cpu

// src/core/common.h — small pieces every layer of the library shares, defined once:
// the error helper of the fronts, -inf, and the view of a q/k/v-like tensor as [B, H, N, X].
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <limits>
#include <string>

#include "attn/error.h"
#include "core/problem.h"

namespace attn::detail {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Throws attn::error "<op>: <what>".
[[noreturn]] inline void fail(const char* op, const std::string& what) {
  throw error(fmt::format("{}: {}", op, what));
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

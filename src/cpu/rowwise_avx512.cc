// src/cpu/rowwise_avx512.cc — the row-wise kernels (rowwise.h) for the avx512 level (16 floats per
// vector); flags in sources.cmake, code in rowwise_body.h.
namespace attn::detail::cpu {
namespace {
constexpr int W = 16;
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/rowwise_body.h"

namespace attn::detail::cpu {
const rowwise_table& rowwise_avx512() {
  static constexpr rowwise_table table = make_rowwise("avx512");
  return table;
}
}  // namespace attn::detail::cpu

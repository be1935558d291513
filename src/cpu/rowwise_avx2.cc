// src/cpu/rowwise_avx2.cc — the row-wise kernels (rowwise.h) for the avx2 level (8 floats per
// vector); flags in sources.cmake, code in rowwise_body.h.
namespace attn::detail::cpu {
namespace {
constexpr int W = 8;
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/rowwise_body.h"

namespace attn::detail::cpu {
const rowwise_table& rowwise_avx2() {
  static constexpr rowwise_table table = make_rowwise("avx2");
  return table;
}
}  // namespace attn::detail::cpu

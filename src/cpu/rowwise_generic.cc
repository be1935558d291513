// src/cpu/rowwise_generic.cc — the row-wise kernels (rowwise.h) for the generic level (4 floats per
// vector); flags in sources.cmake, code in rowwise_body.h.
namespace attn::detail::cpu {
namespace {
constexpr int W = 4;
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/rowwise_body.h"

namespace attn::detail::cpu {
const rowwise_table& rowwise_generic() {
  static constexpr rowwise_table table = make_rowwise("generic");
  return table;
}
}  // namespace attn::detail::cpu

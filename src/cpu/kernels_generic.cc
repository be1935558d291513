// src/cpu/kernels_generic.cc — the fused kernels for the generic level (4 floats per vector; flags in
// sources.cmake). All code is in kernel_body.h.
namespace attn::detail::cpu {
namespace {
constexpr int W = 4;  // floats per vector
constexpr int C = 2;  // vectors per tile row
constexpr int R = 6;  // tile rows: R·C accumulators
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/kernel_body.h"

namespace attn::detail::cpu {
const kernel_table& kernels_generic() {
  static constexpr kernel_table table = make_table("generic");
  return table;
}
}  // namespace attn::detail::cpu

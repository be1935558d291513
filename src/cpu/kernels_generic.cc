// src/cpu/kernels_generic.cc — the cpu kernels for the generic level (4 floats per vector); flags in sources.cmake,
// code in kernel_body.h. No bf16 dot product: bf16 inputs are widened to f32.
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
  static constexpr kernel_table table = make_table<no_bf16_dot>("generic");
  return table;
}
}  // namespace attn::detail::cpu

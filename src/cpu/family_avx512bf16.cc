// src/cpu/family_avx512bf16.cc — the fused family kernels (family_kernels.h) for the avx512bf16
// level: the avx512 kernels plus forward_bf16, the forward of dot scores whose products take
// bf16 pairs with vdpbf16ps (simd_avx512bf16.h). Flags in sources.cmake, code in family_body.h.
namespace attn::detail::cpu {
namespace {
constexpr int W = 16;  // floats per vector
constexpr int C = 4;  // vectors per lane group: L = C·W query rows per lane block
constexpr int R = 6;  // tile rows
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/simd_avx512bf16.h"
#include "cpu/family_body.h"

namespace attn::detail::cpu {
const family_table& family_avx512bf16() {
  static constexpr family_table table = make_family_table<avx512bf16_dot>("avx512bf16");
  return table;
}
}  // namespace attn::detail::cpu

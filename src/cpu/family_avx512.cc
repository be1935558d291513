// src/cpu/family_avx512.cc — the fused family kernels (family_kernels.h) for the avx512 level
// (16 floats per vector); flags in sources.cmake, code in family_body.h.
namespace attn::detail::cpu {
namespace {
constexpr int W = 16;  // floats per vector
constexpr int C = 4;  // vectors per lane group: L = C·W query rows per lane block
constexpr int R = 6;  // tile rows
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/family_body.h"

namespace attn::detail::cpu {
const family_table& family_avx512() {
  static constexpr family_table table = make_family_table("avx512");
  return table;
}
}  // namespace attn::detail::cpu

// src/cpu/family_generic.cc — the fused family kernels (family_kernels.h) for the generic level
// (4 floats per vector); flags in sources.cmake, code in family_body.h.
namespace attn::detail::cpu {
namespace {
constexpr int W = 4;  // floats per vector
constexpr int C = 2;  // vectors per lane group: L = C·W query rows per lane block
constexpr int R = 6;  // tile rows
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/family_body.h"

namespace attn::detail::cpu {
const family_table& family_generic() {
  static constexpr family_table table = make_family_table("generic");
  return table;
}
}  // namespace attn::detail::cpu

// src/cpu/simd_avx512bf16.h — the bf16 dot product of the avx512bf16 level, the only
// intrinsic of the cpu kernels: vdpbf16ps multiplies the two bf16 of each 32-bit word of a by
// those of b and adds both products to the fp32 lane of acc (32 products per instruction, no
// conversion of the operands). Included by kernels_avx512bf16.cc alone, after simd.h.
#pragma once

#include <immintrin.h>

#include "cpu/simd.h"

namespace attn::detail::cpu {
namespace {

static_assert(W == 16, "vdpbf16ps works on 512-bit vectors");

struct avx512bf16_dot {
  static constexpr bool available = true;
  static vf dot_pairs(vf acc, vu a, vu b) { return (vf)_mm512_dpbf16_ps((__m512)acc, (__m512bh)a, (__m512bh)b); }
};

}  // namespace
}  // namespace attn::detail::cpu

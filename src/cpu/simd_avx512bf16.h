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
  // lo ‖ hi (2W floats) → W words of bf16 pairs, word w = (x[2w], x[2w + 1]), rounded to nearest
  // even (vcvtne2ps2bf16; exact for floats bf16 holds, as widened int8 values).
  static vu pack_pairs(vf lo, vf hi) { return (vu)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo); }
  // n·W int8 values → n vectors of f32 in memory order (vpmovsxbd: GCC scalarises the portable
  // conversion of a 16-byte vector to 16 ints).
  template <int n>
  static void widen_int8(const std::int8_t* p, vf* out) {
    for (int i = 0; i < n; ++i)
      // (the maskz form: GCC 12's unmasked one reads an undefined vector and warns)
      out[i] = __builtin_convertvector(
          (vi)_mm512_maskz_cvtepi8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i * W))), vf);
  }
};

}  // namespace
}  // namespace attn::detail::cpu

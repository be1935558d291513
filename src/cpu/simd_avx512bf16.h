// src/cpu/simd_avx512bf16.h — the dot products of the avx512bf16 level, the only intrinsics of
// the cpu kernels: vdpbf16ps multiplies the two bf16 of each 32-bit word of a by those of b and
// adds both products to the fp32 lane of acc (32 products per instruction, no conversion of the
// operands); vpdpwssd (AVX512_VNNI, which every CPU with AVX512_BF16 has) does the same for
// pairs of int16 into int32 lanes — the int8 KV decode (decode.h, int16_pair_operands).
// Included by kernels_avx512bf16.cc and family_avx512bf16.cc, after simd.h.
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
  // The 4 words at p in each 128-bit quarter (vbroadcasti32x4 from memory; decode_scores_chunked).
  // (Zero-masked with every lane set: _mm512_broadcast_i32x4's undefined pass-through made GCC 12
  // warn "may be used uninitialized"; a generic vector shuffle compiled to three instructions.)
  static vu bcast_quarters(const std::uint32_t* p) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return (vu)_mm512_maskz_broadcast_i32x4(__mmask16(0xffff), x);
  }
  static vu pack_pairs(vf lo, vf hi) { return (vu)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo); }
  // Lanes of two rows → W words (bf16(lo[x]), bf16(hi[x])), rounded to nearest even: the pairs
  // of P and dS along the reduction axis (tile.h). vcvtne2ps2bf16 puts lo's 16 bf16 below hi's;
  // vpermw interleaves them.
  static vu row_pairs(vf lo, vf hi) {
    const __m512i both = (__m512i)_mm512_cvtne2ps_pbh((__m512)hi, (__m512)lo);
    const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return (vu)_mm512_permutexvar_epi16(idx, both);
  }
  // n·W int8 values → n vectors of f32 in memory order (vpmovsxbd: GCC scalarises the portable
  // conversion of a 16-byte vector to 16 ints).
  template <int n>
  static void widen_int8(const std::int8_t* p, vf* out) {
    for (int i = 0; i < n; ++i)
      // (the maskz form: GCC 12's unmasked one reads an undefined vector and warns)
      out[i] = __builtin_convertvector(
          (vi)_mm512_maskz_cvtepi8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i * W))), vf);
  }

  // int16 pairs (decode of an int8 cache): acc + a.lo·b.lo + a.hi·b.hi in each int32 lane
  // (vpdpwssd; no saturation, exact while the sums fit in 31 bits).
  static constexpr bool int16 = true;
  static vi dot_int16(vi acc, vu a, vu b) {
    return (vi)_mm512_dpwssd_epi32((__m512i)acc, (__m512i)a, (__m512i)b);
  }
  // Four unsigned bytes of a by four signed bytes of b, summed into each int32 lane (vpdpbusd; no
  // saturation): the q·k of blocked int8 keys (decode.h, decode_scores_blocked).
  static vi dot_u8s8(vi acc, vu a, vu b) {
    return (vi)_mm512_dpbusd_epi32((__m512i)acc, (__m512i)a, (__m512i)b);
  }
  // The same with b the four bytes at p in every lane, broadcast by the instruction itself (an
  // embedded {1to16} operand: GCC 12 loads the broadcast into a register first, an extra
  // instruction per product).
  static vi dot_u8s8_bcast(vi acc, vu a, const std::uint32_t* p) {
    __m512i r = (__m512i)acc;
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(r) : "v"((__m512i)a), "m"(*p));
    return (vi)r;
  }
  // The same with b the word at p in every lane, an embedded {1to16} operand (no broadcast
  // instruction; GCC 12 does not fold the broadcast itself).
  static vi dot_int16_bcast(vi acc, vu a, const std::uint32_t* p) {
    __m512i r = (__m512i)acc;
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(r) : "v"((__m512i)a), "m"(*p));
    return (vi)r;
  }
  // 2W int8 values → W words of int16 pairs in memory order (vpmovsxbw): word w = (p[2w], p[2w + 1]).
  static vu widen_int8_words(const std::int8_t* p) {
    return (vu)_mm512_maskz_cvtepi8_epi16(~__mmask32(0), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // W floats → W/2 words of int16 pairs of adjacent lanes at out (word k = lanes 2k, 2k + 1):
  // rounded to nearest even (vcvtps2dq with the rounding in the instruction), then narrowed with
  // signed saturation to [-32768, 32767] (vpmovsdw) — the int16 weights of decode's P·V
  // (decode.h, quantise_weights), where the portable form takes an add, a subtract, a conversion,
  // two clamps and three shuffles.
  static void round_to_words_i16(vf x, std::uint32_t* out) {
    // (the maskz forms: GCC 12's unmasked ones read an undefined vector and warn)
    const __m512i i = _mm512_maskz_cvt_roundps_epi32(0xffff, (__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_maskz_cvtsepi32_epi16(0xffff, i));
  }
  // Words of rows a and b (int16 each, memory order) → pairs (a[d], b[d]) of the d in the low
  // (lo) and high (hi) four of every eight (vpunpcklwd / vpunpckhwd, within 128-bit lanes):
  // lane j of lo holds d = 8·(j / 4) + j % 4, of hi d + 4 (int16_pv_position).
  static vu interleave_lo(vu a, vu b) { return (vu)_mm512_unpacklo_epi16((__m512i)a, (__m512i)b); }
  static vu interleave_hi(vu a, vu b) { return (vu)_mm512_unpackhi_epi16((__m512i)a, (__m512i)b); }
  // The same for bytes (vpunpck[lh]bw): pairs (a[d], b[d]) of the low (lo) and high (hi) eight of
  // every sixteen bytes — with the word form after it, four int8 V rows become quads of bytes
  // (decode.h, decode_pv_u8).
  static vu interleave_bytes_lo(vu a, vu b) { return (vu)_mm512_unpacklo_epi8((__m512i)a, (__m512i)b); }
  static vu interleave_bytes_hi(vu a, vu b) { return (vu)_mm512_unpackhi_epi8((__m512i)a, (__m512i)b); }
  // W floats → W int32, rounded to nearest even by the conversion itself (vcvtps2dq {rn-sae}):
  // one rounding of x as given, which the compiler cannot fuse with the product that made x
  // (the portable round_nearest adds and subtracts 1.5·2^23, and -ffp-contract=fast may fuse
  // that add with a product: then the exact product is rounded, and builds differ) — decode's
  // 8-bit q (decode.h, quantise_q_bytes).
  static vi round_to_int(vf x) {
    return (vi)_mm512_maskz_cvt_roundps_epi32(0xffff, (__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // W floats in [0, 255.5) → W unsigned bytes at out, rounded to nearest even (vcvtps2dq with the
  // rounding in the instruction) and saturated to 255 (vpmovusdb): the 8-bit weights of decode's
  // P·V (decode.h, quantise_weights8).
  static void round_to_bytes_u8(vf x, std::uint8_t* out) {
    const __m512i i = _mm512_maskz_cvt_roundps_epi32(0xffff, (__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_maskz_cvtusepi32_epi8(0xffff, i));
  }
};

}  // namespace
}  // namespace attn::detail::cpu

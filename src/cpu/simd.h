// src/cpu/simd.h — the portable SIMD layer of the cpu kernels: GCC vector types of W lanes,
// loads and stores, exp and tanh, lane shuffles, and the readers that turn stored elements
// (f32, bf16) into f32 vectors. No intrinsics: every ISA compiles this file with its own flags
// and W. The one instruction that has no portable spelling (vdpbf16ps) is in
// simd_avx512bf16.h; the reciprocal estimate of vrecip is a GCC builtin behind its ISA's macro.
//
// Included by kernels_<isa>.cc after it has defined, in attn::detail::cpu::(anonymous),
//   constexpr int W (floats per vector), C (vectors per tile row), R (tile rows).
#pragma once

#include <cstdint>
#include <utility>

namespace attn::detail::cpu {
namespace {

typedef float vf __attribute__((vector_size(W * 4)));
typedef std::int32_t vi __attribute__((vector_size(W * 4)));
typedef std::uint32_t vu __attribute__((vector_size(W * 4)));  // W words of two bf16

inline vf load(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline vi loadi(const std::int32_t* p) {
  vi v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline vu loadu(const std::uint32_t* p) {
  vu v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
inline void storeu(std::uint32_t* p, vu v) { __builtin_memcpy(p, &v, sizeof v); }
inline vf splat(float s) { return s - vf{}; }  // x - 0 folds away; x + 0 would not (-0)
inline vi splati(std::int32_t s) { return s - vi{}; }
inline vu splatu(std::uint32_t s) { return s - vu{}; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vi iota() {
  vi r;
  for (int i = 0; i < W; ++i) r[i] = i;
  return r;
}
// The lanes holding ±inf or NaN (an all-ones exponent).
inline vi not_finite(vf x) { return ((vi)x & splati(0x7f800000)) == splati(0x7f800000); }
inline std::int64_t imin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
inline std::int64_t imax(std::int64_t a, std::int64_t b) { return a > b ? a : b; }
constexpr float kInf = __builtin_inff();

// ---- math ----

// c[0] + f·(c[1] + f·(c[2] + …)) by Horner's rule, one multiply-add per coefficient.
inline vf horner(vf, float c) { return splat(c); }
template <class... Cs>
inline vf horner(vf f, float c, Cs... cs) {
  return horner(f, cs...) * f + splat(c);
}

// x rounded to the nearest integer, ties to even, for |x| < 2^22: x + 1.5·2^23 lies in
// [2^23, 2^24), where a float's last bit is the unit, so the addition rounds x to an integer and
// the subtraction is exact. Where x is a product (x·c), -ffp-contract makes the first one an FMA.
inline vf round_nearest(vf x) {
  const vf magic = splat(12582912.0f);
  return (x + magic) - magic;
}

// e^x: n = round(x·log2 e), r = x - n·ln 2 (two-part ln 2), e^r by its Taylor-like minimax
// polynomial (Cephes expf), times 2^n built in the exponent bits. ≈ 2 ulp; exactly 0 below
// -87.3, so masked keys (-inf) weigh exactly nothing. NaN stays NaN (the clamps are written so
// that a NaN compares false and passes through): a NaN score makes its row NaN, as in the
// reference, and the front then recomputes that row there (attention.cc).
inline vf vexp(vf x) {
  const vf lo = vmax(splat(-87.3f), x);                  // a compare and a blend; NaN stays NaN
  const vf xc = splat(88.0f) < lo ? splat(88.0f) : lo;   // likewise
  const vf n = round_nearest(xc * splat(1.44269504088896341f));
  vf r = xc - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  vf y = horner(r, 5.0000001201e-1f, 1.6666665459e-1f, 4.1665795894e-2f, 8.3334519073e-3f, 1.3981999507e-3f,
                1.9875691500e-4f);
  y = y * (r * r) + r + splat(1.0f);
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  const vf p = y * (vf)e;
  return x < splat(-87.3f) ? vf{} : p;
}

// log2 e: the prefill softmax takes its weights as 2^{(s - m)·log2 e}, the factor folded into
// the one multiply-add that forms the exponent (FlashAttention's softmax_scale_log2).
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2 = 0.693147180559945309f;  // 1 / log2 e

// 2^f for f ∈ [-1/2, 1/2]: the polynomial of vexp2 — degree 6 (2.6e-9), or degree 4 (2.9e-6
// relative, measured in float32 over the interval; a Lawson fit with c0 = 1) for weights that are
// rounded to bfloat16 next (8 significant bits: a relative step of 3.9e-3, so the rounding of
// fewer than 1 weight in 1000 moves, by one bf16 ulp).
template <int Degree = 6>
inline vf exp2_reduced(vf f) {
  static_assert(Degree == 6 || Degree == 4);
  if constexpr (Degree == 4)
    return horner(f, 1.0f, 6.9312417507e-01f, 2.4024099112e-01f, 5.5906426162e-02f, 9.5828529447e-03f);
  else
    return horner(f, 1.0f, 6.9314721497e-1f, 2.4022652783e-1f, 5.5503105510e-2f, 9.6176929747e-3f, 1.3406643906e-3f,
                  1.5594677595e-4f);
}

// 2^u: n = round(u), f = u - n ∈ [-1/2, 1/2] (exact), 2^f by a degree-6 polynomial with
// c0 = 1 (minimax for the relative error: 2.6e-9 before rounding, so ≈ 1-2 ulp in all; 2^0 is
// exactly 1), times 2^n. About half the instructions of vexp: no two-part reduction by ln 2,
// and on AVX-512 the rounding and the scaling by 2^n are one instruction each (vrndscaleps,
// vscalefps). Exactly 0 for u below -125 at every level, so masked keys (-inf) weigh exactly
// nothing and no result is a denormal (from u ≈ -126 down, 2^u would be one: on Intel each
// denormal result or underflow costs a microcode assist — scores spread over ±100, as general ×
// softmax gives at D 128, kept the bf16 forward in softmax_block 83 % of its time, 14× the plain
// forward's); NaN stays NaN (the clamps compare false).
template <int Degree = 6>
inline vf vexp2(vf u) {
#if defined(__AVX512F__)
  if constexpr (sizeof(vf) == 64) {
    // vmaxps(-125, u) is -125 > u ? -125 : u (a NaN u is kept: the comparison is false), one
    // instruction where the ternary compiled to a compare and a blend; the lanes below -125
    // (not NaN: not-less-than is true for unordered) are zeroed by the scaling's mask, not
    // computed.
    const vf uc = __builtin_ia32_maxps512_mask(splat(-125.0f), u, u, 0xffff, 4);
    const vf n = __builtin_ia32_rndscaleps_mask(uc, 0x08, uc, 0xffff, 4);  // nearest, quiet
    const vf y = exp2_reduced<Degree>(uc - n);
    const unsigned short live = __builtin_ia32_cmpps512_mask(u, splat(-125.0f), 0x05, 0xffff, 4);  // _CMP_NLT_UQ
    return __builtin_ia32_scalefps512_mask(y, n, vf{}, live, 4);
  }
#endif
  const vf lo = vmax(splat(-125.0f), u);                     // compare + blend; NaN stays NaN
  const vf uc = splat(127.0f) < lo ? splat(127.0f) : lo;     // likewise
  const vf n = round_nearest(uc);
  const vf y = exp2_reduced<Degree>(uc - n);
  const vf p = (vf)((vi)y + (__builtin_convertvector(n, vi) << 23));
  return u < splat(-125.0f) ? vf{} : p;
}

// Whether any lane of m is non-zero: one vptestmd (AVX-512) or vptest (AVX) — a loop over the
// lanes compiles to an extract and an or per lane, and the sparse distributions' scans test every
// key vector. A template, so that the branch of the other width is discarded, not checked.
template <class V>
inline bool any_lane_of(V m) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) return __builtin_ia32_ptestmd512(m, m, 0xffff) != 0;
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) {
    typedef long long q4 __attribute__((vector_size(32)));
    return !__builtin_ia32_ptestz256((q4)m, (q4)m);
  }
#endif
  for (int x = 0; x < W; ++x)
    if (m[x]) return true;
  return false;
}
inline bool any_lane(vi m) { return any_lane_of(m); }
// any_lane(a > b) (any_ge: a >= b) as one compare into a mask register and a test of it
// (AVX-512): from the vector compare, GCC writes the mask back into a vector to test it (two more
// instructions in the sparse distributions' per-key scans). False where either is NaN, as a > b.
inline bool any_gt(vf a, vf b) {
#if defined(__AVX512F__)
  if constexpr (sizeof(vf) == 64) return __builtin_ia32_cmpps512_mask(a, b, 0x1e, 0xffff, 4) != 0;  // _CMP_GT_OQ
#endif
  return any_lane(a > b);
}
inline bool any_ge(vf a, vf b) {
#if defined(__AVX512F__)
  if constexpr (sizeof(vf) == 64) return __builtin_ia32_cmpps512_mask(a, b, 0x1d, 0xffff, 4) != 0;  // _CMP_GE_OQ
#endif
  return any_lane(a >= b);
}
inline bool all_lanes(vi m) {
  for (int x = 0; x < W; ++x)
    if (!m[x]) return false;
  return true;
}

// 1/d for d >= 1 or NaN: on AVX-512 the reciprocal estimate (vrcp14ps, 2^-14) and one Newton
// step (relative error then below 2^-22), elsewhere a division. Not vrcpps on AVX2: its 12-bit
// estimate is the vendor's own table, so the same binary gave Intel and AMD results apart in
// the last bits — enough to move a key across a sparsemax threshold (the ASan build's
// MaskHiddenBlocksSkippedWithTheSameBits, additive × sparsemax, failed at the avx2 level on an
// Intel Xeon after passing on AMD; with the division it passes there). GCC has no portable
// spelling of the estimate, so its builtin is named here behind its ISA's macro.
// Refine false: the estimate alone (2^-14), for a value rounded to bfloat16 next (2^-9).
template <bool Refine = true, class V>  // a template, so that the branch of the other width is discarded
inline V vrecip(V d) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) {
    const V r = __builtin_ia32_rcp14ps512_mask(d, V{}, 0xffff);
    if constexpr (!Refine) return r;
    return r * (2.0f - d * r);
  }
#endif
  return 1.0f / d;
}

// tanh(x) = sign(x)·(1 - 2 / (e^{2|x|} + 1)), e^{2|x|} = 2^{2|x|·log2 e} by vexp2 and the
// reciprocal by vrecip (no division on AVX-512; with vexp and a division, activated_general's
// tanh × softmax, the core op's softcap 1, ran 3.5 % slower at B1 H8 N2048 D64 bf16 on a Zen 4,
// forward 34.4 against 33.2 ms). |x| is capped at 10 first, past which tanh is 1
// in float32 (1 - 4.1e-9), so that e stays finite for the reciprocal's Newton step; a NaN passes
// the cap (the comparison is false) and gives NaN. Absolute error ≈ 2.4e-7 (the reciprocal's
// 2^-22 near x = 0, where 2/(e + 1) ≈ 1).
inline vf vtanh(vf x) {
  const vi sign = (vi)x & splati(std::int32_t(0x80000000u));
  const vf ax = (vf)((vi)x & splati(0x7fffffff));
  const vf a = splat(10.0f) < ax ? splat(10.0f) : ax;
  const vf t = splat(1.0f) - splat(2.0f) * vrecip(vexp2(a * splat(2.0f * kLog2e)) + splat(1.0f));
  return (vf)((vi)t | sign);
}

// σ(x) = 1 / (1 + 2^{−x·log2 e}) by vexp2 and vrecip (no division on AVX-512, where the f32
// sigmoid's weights of the family kernels took vexp and a division). The exponent is capped at 126
// so that 1 + 2^u stays finite for the reciprocal's Newton step (σ is then 2^-126 ≈ 1.2e-38 where
// it is smaller — the division gave 0 or a flushed denormal there); σ(+inf) = 1, a NaN stays NaN.
// Relative error ≈ 2^-22 (the reciprocal's; vexp2's 2.6e-9 below it).
inline vf vsigmoid(vf x) {
  const vf u = x * splat(-kLog2e);
  return vrecip(splat(1.0f) + vexp2(splat(126.0f) < u ? splat(126.0f) : u));
}

// ---- bf16 ----

// bf16 → f32 is a 16-bit shift.
inline float bf16_scalar(const std::uint16_t* p) {
  const std::uint32_t u = std::uint32_t(*p) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
// Finite floats → bf16 bits (round to nearest even), one per 32-bit lane.
inline vu bf16_bits(vf p) {
  const vu u = (vu)p;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// Finite floats rounded to the nearest bf16 (even on ties), as floats: what the words of
// store_lane_pairs and pack_rows hold of them.
inline vf round_to_bf16(vf p) { return (vf)(bf16_bits(p) << 16); }

// W floats → W/2 words of bf16 pairs of adjacent lanes (word w = bf16(v[2w]) | bf16(v[2w + 1])
// << 16, nearest even) stored at out.
inline void store_lane_pairs(std::uint32_t* out, vf v) {
  typedef std::uint64_t vq __attribute__((vector_size(W * 4)));
  typedef std::uint32_t vh __attribute__((vector_size(W * 2)));
  const vq b = (vq)bf16_bits(v);
  const vh w = __builtin_convertvector(b | b >> 16, vh);
  __builtin_memcpy(out, &w, sizeof w);
}

// Two vectors of floats that bf16 holds exactly (small integers: widened int8) → words of bf16
// pairs: low half a's lane, high half b's (truncation is exact for them).
inline vu pair_words(vf a, vf b) { return ((vu)a >> 16) | ((vu)b & splatu(0xffff0000u)); }

// How a stored element type becomes f32 vectors, a "unit" of U vectors at a time:
//   float: W floats → one vector, in memory order;
//   bf16:  2W bf16 read as W 32-bit words → two vectors, the even elements (word << 16) then
//          the odd ones (word & 0xffff0000): exact, no shuffles. A vector of d that is read
//          this way is kept in that "native" order, a permutation of d within each unit.
template <class T>
struct storage {
  static constexpr int U = 1;  // vectors per unit
  static void get(const float* p, vf* out) { out[0] = load(p); }
  static constexpr std::int64_t native(std::int64_t d) { return d; }
  static float scalar(const float* p) { return *p; }
};
template <>
struct storage<std::uint16_t> {
  static constexpr int U = 2;
  static void get(const std::uint16_t* p, vf* out) {
    vi w;
    __builtin_memcpy(&w, p, sizeof w);
    out[0] = (vf)(w << 16);
    out[1] = (vf)(w & splati(std::int32_t(0xffff0000u)));
  }
  static constexpr std::int64_t native(std::int64_t d) {
    const std::int64_t u = d / (2 * W), e = d % (2 * W);
    return u * 2 * W + (e & 1) * W + e / 2;
  }
  static float scalar(const std::uint16_t* p) { return bf16_scalar(p); }
};
// int8 (quantised K/V): 4W values read as W 32-bit words → four vectors, byte k of every word
// sign-extended by a shift pair ((w << 24 - 8k) >> 24) and converted: no byte shuffles (GCC
// does not widen a vector of 8-bit lanes without them). Like bf16, a vector of d read this way
// is kept in that native order. The row's scale is applied by the caller, outside the dot.
template <>
struct storage<std::int8_t> {
  static constexpr int U = 4;
  static void get(const std::int8_t* p, vf* out) {
    vi w;
    __builtin_memcpy(&w, p, sizeof w);
    out[0] = __builtin_convertvector((w << 24) >> 24, vf);
    out[1] = __builtin_convertvector((w << 16) >> 24, vf);
    out[2] = __builtin_convertvector((w << 8) >> 24, vf);
    out[3] = __builtin_convertvector(w >> 24, vf);
  }
  static constexpr std::int64_t native(std::int64_t d) {
    const std::int64_t u = d / (4 * W), e = d % (4 * W);
    return u * 4 * W + (e & 3) * W + e / 4;
  }
  static float scalar(const std::int8_t* p) { return float(*p); }
};

// ---- lane shuffles ----

// fold(a, b) over groups of 2h lanes: first h lanes = a's group folded in half, next h = b's.
constexpr int fold_index(int x, int h, int second) {
  const int g = x / (2 * h) * (2 * h), o = x % (2 * h);
  return (o < h ? g + o : W + g + o - h) + second * h;
}
// Lanes of (a, b) by constant indices X (0..2W): GCC's __builtin_shuffle, or clang's
// __builtin_shufflevector (the fuzz and ThreadSanitizer builds, fuzz/, use clang).
template <int... X>
inline vf shuffle2(vf a, vf b) {
#ifdef __clang__
  return __builtin_shufflevector(a, b, X...);
#else
  return __builtin_shuffle(a, b, vi{X...});
#endif
}
template <int H, int... X>
inline vf fold_impl(vf a, vf b, std::integer_sequence<int, X...>) {
  return shuffle2<fold_index(X, H, 0)...>(a, b) + shuffle2<fold_index(X, H, 1)...>(a, b);
}
template <int H>
inline vf fold(vf a, vf b) {
  return fold_impl<H>(a, b, std::make_integer_sequence<int, W>{});
}
template <int H, int... X>
inline vf xor_lanes(vf v, std::integer_sequence<int, X...>) {
  return shuffle2<(X ^ H)...>(v, v);
}

// v[0..W) → v[0], whose lane x is the sum of v[x]'s lanes (a transpose-add tree; the rest of v
// is overwritten).
template <int N = W>
inline void transpose_add(vf* v) {
  if constexpr (N > 1) {
#pragma GCC unroll 16
    for (int i = 0; i < N / 2; ++i) v[i] = fold<N / 2>(v[i], v[i + N / 2]);
    transpose_add<N / 2>(v);
  }
}

// v[0..W) as a W × W matrix, transposed in place (v[i][x] becomes v[x][i]): log2 W stages of
// W two-source shuffles; stage s pairs rows i and i + s (i & s == 0) and swaps the s-lane
// blocks between them.
template <int S, int... X>
inline void transpose_stage(vf* v, std::integer_sequence<int, X...>) {
#pragma GCC unroll 16
  for (int i = 0; i < W; ++i)
    if ((i & S) == 0) {
      const vf a = v[i], b = v[i + S];
      v[i] = shuffle2<((X & S) == 0 ? X : W + X - S)...>(a, b);
      v[i + S] = shuffle2<((X & S) == 0 ? X + S : W + X)...>(a, b);
    }
}
template <int S = W / 2>
inline void transpose(vf* v) {
  if constexpr (S >= 1) {
    transpose_stage<S>(v, std::make_integer_sequence<int, W>{});
    transpose<S / 2>(v);
  }
}

// The same over int32 lanes carried in float vectors (the int16 pair dots of decode.h): the
// shuffles move bits, the adds are integer adds.
template <int H, int... X>
inline vf fold_int_impl(vf a, vf b, std::integer_sequence<int, X...>) {
  return (vf)((vi)shuffle2<fold_index(X, H, 0)...>(a, b) + (vi)shuffle2<fold_index(X, H, 1)...>(a, b));
}
template <int N = W>
inline void transpose_add_int(vf* v) {
  if constexpr (N > 1) {
#pragma GCC unroll 16
    for (int i = 0; i < N / 2; ++i) v[i] = fold_int_impl<N / 2>(v[i], v[i + N / 2], std::make_integer_sequence<int, W>{});
    transpose_add_int<N / 2>(v);
  }
}

// Lane-wise sum within groups of 2H lanes (then H/2, ...): every lane gets its group's sum
// (NaN and ±inf propagate, unlike a max).
template <int H>
inline vf group_sum(vf v) {
  if constexpr (H == 0) {
    return v;
  } else {
    return group_sum<H / 2>(v + xor_lanes<H>(v, std::make_integer_sequence<int, W>{}));
  }
}

// Lane-wise max within groups of 2H lanes (then H/2, ...): every lane gets its group's max.
template <int H>
inline vf group_max(vf v) {
  if constexpr (H == 0) {
    return v;
  } else {
    return group_max<H / 2>(vmax(v, xor_lanes<H>(v, std::make_integer_sequence<int, W>{})));
  }
}

// ---- the bf16 dot product of an ISA ----

// kernels_<isa>.cc names its bf16 dot product when it builds its table (make_table<Dot>):
// no_bf16_dot where the ISA has none (bf16 inputs are then widened to f32), or a type with
//   static constexpr bool available = true;
//   static vf dot_pairs(vf acc, vu a, vu b);   // acc + a.lo·b.lo + a.hi·b.hi per 32-bit lane
// (simd_avx512bf16.h).
struct no_bf16_dot {
  static constexpr bool available = false;
  static constexpr bool int16 = false;  // no int16 pair dot product either (decode.h)
};

}  // namespace
}  // namespace attn::detail::cpu

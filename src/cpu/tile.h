// src/cpu/tile.h — the matrix products of the cpu kernels: one register tile and the GEMM
// around it, with the operand type a parameter (the way flash-attn's kernel traits make bf16 a
// change of parameters):
//   out[r][x..x+W) (+)= Σ_k dot(a[r·ars + k·aks], b[k·bks + x..x+W))     (a broadcast, b vector)
// k runs over the words of the reduction axis. An operand type says what a word is, how two
// words multiply into an fp32 accumulator, and how fp32 rows (P, dS) become B operands:
//   f32_operands            a word is one float; dot = a·b (an FMA).
//   bf16_pair_operands<Dot> a word is two bf16 adjacent on the reduction axis (low half
//                           first); dot = a.lo·b.lo + a.hi·b.hi, by the ISA's Dot
//                           (simd_avx512bf16.h); fp32 rows are rounded to bf16 in pairs.
// Only our own padded buffers are ever read as vectors (b); user rows are read as scalars (a).
#pragma once

#include <cstdint>

#include "cpu/simd.h"

namespace attn::detail::cpu {
namespace {

struct f32_operands {
  using word = float;
  using vword = vf;
  static constexpr int kPack = 1;  // elements of the reduction axis per word
  static constexpr bool kInt = false;  // int32 accumulators (int16_pair_operands) or fp32
  static vword broadcast(word a) { return splat(a); }
  static vword load_words(const word* p) { return load(p); }
  static vf madd(vf acc, vword a, vword b) { return acc + a * b; }
  // Rows [rows][n] of fp32 values as B operand words [rows / kPack][n]: these rows themselves.
  static const word* pack_rows(const float* s, std::int64_t, std::int64_t, word*) { return s; }
  // Decode reads key rows of storage T in units of storage<T>::U vectors, widened to f32.
  template <class T>
  static constexpr int key_vectors = storage<T>::U;
  template <class T>
  static void load_keys(const T* p, vword* out) {
    storage<T>::get(p, out);
  }
};

// What the operand types of two 16-bit values per 32-bit word share.
template <class Dot>
struct pair_word_operands {
  using dot = Dot;
  using word = std::uint32_t;
  using vword = vu;
  static constexpr int kPack = 2;
  static vword broadcast(word a) { return splatu(a); }
  static vword load_words(const word* p) { return loadu(p); }
};

template <class Dot>
struct bf16_pair_operands : pair_word_operands<Dot> {
  static_assert(Dot::available, "bf16 pair operands need the ISA's bf16 dot product");
  using word = std::uint32_t;
  using vword = vu;
  static constexpr bool kInt = false;
  static vf madd(vf acc, vword a, vword b) { return Dot::dot_pairs(acc, a, b); }
  // Lanes x of two fp32 rows → words bf16(hi[x]) << 16 | bf16(lo[x]), rounded to nearest even
  // (Dot::row_pairs: vcvtne2ps2bf16 and a permute on avx512bf16).
  static vword pair_rows(vf lo, vf hi) { return Dot::row_pairs(lo, hi); }
  // Rows 2r', 2r'+1 of s [rows][n] (n a multiple of W) → out[r'][x] = pair_rows(s[2r'][x],
  // s[2r'+1][x]); a missing last row is zero.
  static const word* pack_rows(const float* s, std::int64_t rows, std::int64_t n, word* out) {
    for (std::int64_t r = 0; 2 * r < rows; ++r) {
      const float* r0 = s + 2 * r * n;
      const float* r1 = 2 * r + 1 < rows ? r0 + n : nullptr;
      for (std::int64_t x = 0; x < n; x += W) storeu(out + r * n + x, pair_rows(load(r0 + x), r1 ? load(r1 + x) : vf{}));
    }
    return out;
  }
  // Decode reads bf16 key rows as they are: W words (2W elements) per unit. int8 rows (4W
  // elements per unit) are widened in memory order and packed by the ISA into two vectors of
  // words (Dot::pack_pairs), exactly (|k| <= 127 is a bf16): word w pairs elements 2w, 2w + 1
  // in both cases.
  template <class T>
  static constexpr int key_vectors = sizeof(T) == 2 ? 1 : 2;
  template <class T>
  static void load_keys(const T* p, vword* out) {
    static_assert(sizeof(T) <= 2, "bf16 pairs read bf16 or int8 rows");
    if constexpr (sizeof(T) == 2) {
      out[0] = loadu(reinterpret_cast<const std::uint32_t*>(p));
    } else {
      vf f[4];
      Dot::template widen_int8<4>(p, f);
      out[0] = Dot::pack_pairs(f[0], f[1]), out[1] = Dot::pack_pairs(f[2], f[3]);
    }
  }
};

// Decode of an int8 cache with q quantised to int16 (decode.h): a word is two int16 adjacent
// on the reduction axis; dot = a.lo·b.lo + a.hi·b.hi into int32 lanes (Dot::dot_int16), the
// accumulators carried as the bits of float vectors until decode.h converts their sums. int8
// key rows are widened to int16 words in memory order (exact).
template <class Dot>
struct int16_pair_operands : pair_word_operands<Dot> {
  static_assert(Dot::int16, "int16 pair operands need the ISA's int16 dot product");
  using vword = vu;
  static constexpr bool kInt = true;
  static vf madd(vf acc, vword a, vword b) { return (vf)Dot::dot_int16((vi)acc, a, b); }
  template <class T>
  static constexpr int key_vectors = 2;
  template <class T>
  static void load_keys(const T* p, vword* out) {
    static_assert(sizeof(T) == 1, "int16 pairs read int8 rows");
    out[0] = Dot::widen_int8_words(p), out[1] = Dot::widen_int8_words(p + 2 * W);
  }
};

// The register tile: RR × CC accumulator vectors. They start at zero and an accumulating tile
// adds out when it stores: the FMA chains start at once instead of waiting for out's loads
// (which, for dq and O, come from L2 or beyond), and the loads overlap the next tile's work —
// 4-5 % on a 64-step accumulating tile in L1, more where out is further away.
// Pf (A rows along k, aks = 1): every 64 bytes of k, the same place of the next tile's RR rows
// is prefetched into L1 — a whole tile (RR·CC·K multiply-adds) ahead of its use. Operands
// streamed from L3 (the forward's K and Vᵀ at Nk 4096, D 128: 4 MiB a head) otherwise arrive
// late: the tiles ran at 68 % of the FMA peak from L3 against 80 % from L2, 79 % prefetched.
template <class Ops, int RR, int CC, bool Pf = false>
void tile(std::int64_t K, const typename Ops::word* a, std::int64_t ars, std::int64_t aks,
          const typename Ops::word* b, std::int64_t bks, float* o, std::int64_t ors, bool accumulate) {
  vf acc[RR][CC];
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) acc[r][c] = vf{};
  [[maybe_unused]] const typename Ops::word* next = a + RR * ars;
  constexpr std::int64_t kLine = 64 / sizeof(typename Ops::word);
  for (std::int64_t k = 0; k < K; ++k) {
    if constexpr (Pf)
      if (k % kLine == 0)
#pragma GCC unroll 8
        for (int r = 0; r < RR; ++r) __builtin_prefetch(next + r * ars + k, 0, 3);
    typename Ops::vword bv[CC];
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) bv[c] = Ops::load_words(b + k * bks + c * W);
    const typename Ops::word* ak = a + k * aks;
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) {
      const typename Ops::vword ar = Ops::broadcast(ak[r * ars]);
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) acc[r][c] = Ops::madd(acc[r][c], ar, bv[c]);
    }
  }
  if (accumulate) {
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) store(o + r * ors + c * W, load(o + r * ors + c * W) + acc[r][c]);
  } else {
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r)
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) store(o + r * ors + c * W, acc[r][c]);
  }
}

// The tile of cc (runtime, ≤ CC) columns of vectors, as a compile-time shape.
template <class Ops, int RR, int CC = C, bool Pf = false>
void tile_c(int cc, std::int64_t K, const typename Ops::word* a, std::int64_t ars, std::int64_t aks,
            const typename Ops::word* b, std::int64_t bks, float* o, std::int64_t ors, bool acc) {
  if constexpr (CC == 1) {
    tile<Ops, RR, 1, Pf>(K, a, ars, aks, b, bks, o, ors, acc);
  } else {
    if (cc == CC) return tile<Ops, RR, CC, Pf>(K, a, ars, aks, b, bks, o, ors, acc);
    tile_c<Ops, RR, CC - 1, Pf>(cc, K, a, ars, aks, b, bks, o, ors, acc);
  }
}

// The tile of rr (≤ RR) rows and cc columns.
template <class Ops, int RR = R, bool Pf = false>
void tile_rc(int rr, int cc, std::int64_t K, const typename Ops::word* a, std::int64_t ars, std::int64_t aks,
             const typename Ops::word* b, std::int64_t bks, float* o, std::int64_t ors, bool acc) {
  if constexpr (RR == 1) {
    tile_c<Ops, 1, C, Pf>(cc, K, a, ars, aks, b, bks, o, ors, acc);
  } else {
    if (rr == RR) return tile_c<Ops, RR, C, Pf>(cc, K, a, ars, aks, b, bks, o, ors, acc);
    tile_rc<Ops, RR - 1, Pf>(rr, cc, K, a, ars, aks, b, bks, o, ors, acc);
  }
}

// out [M][N] (row stride ors; N a multiple of W) (+)= A·B over K words, with
// A(r, k) = a[r·ars + k·aks] and B(k, x) = b[k·bks + x]. Pf: prefetch A's rows a tile ahead
// (tile; aks = 1).
template <class Ops, bool Pf = false>
void gemm(std::int64_t M, std::int64_t N, std::int64_t K, const typename Ops::word* a, std::int64_t ars,
          std::int64_t aks, const typename Ops::word* b, std::int64_t bks, float* o, std::int64_t ors,
          bool accumulate) {
  for (std::int64_t n0 = 0; n0 < N; n0 += C * W) {
    const int cc = int(imin(C, (N - n0) / W));
    for (std::int64_t m0 = 0; m0 < M; m0 += R) {
      const int rr = int(imin(R, M - m0));
      tile_rc<Ops, R, Pf>(rr, cc, K, a + m0 * ars, ars, aks, b + n0, bks, o + m0 * ors + n0, ors, accumulate);
    }
  }
}

}  // namespace
}  // namespace attn::detail::cpu

// src/cpu/decode.h — the forward for a (b, hkv) with at most W query rows (decode: Nq·G
// small, many keys; memory-bound). D sits in the SIMD lanes for the q·k dots and keys in the
// lanes for the softmax, so that each K/V row is read once, as it is stored, for all the rows
// of the group — f32 or bf16, no copy.
//
// Rows are taken RG at a time (RG = 4; 1 or 2 when the (b, hkv) has only that many rows), keys
// in blocks of W, each block read once (from memory; then from L1 for every row group), software
// pipelined by one block (the q·k of block j + 1 runs between the softmax and the P·V of block j):
//   dots: KG = W / RG keys × RG rows at a time into W accumulator vectors with D in the lanes,
//     each K vector loaded once for the RG rows; transpose_add folds the W accumulators into one
//     score vector whose lane r·KG + x is row r · key x ("mixed layout"), RG vectors per block;
//     bf16 rows in groups of 4 with D <= 128 instead put the 4 rows in the quarters of each q
//     vector and broadcast each key's 8 values of d to them (decode_scores_chunked);
//   softmax in the mixed layout, in base 2 (scores times log2 e): a per-lane running max (equal
//     over a row's KG lanes), one 2^x per score and per-lane partial sums of p — no scalar work
//     per key; masks only on blocks that reach past a row's key range;
//   P·V: RG rows × CB output vectors accumulate in registers over the W keys of the block, each
//     V vector loaded once per row group; with bf16 pair operands (below) p is rounded to bf16
//     and two V rows go into each bf16 dot (decode_pv_pairs), half the products of f32.
// K/V rows are read through storage<T> (simd.h): bf16 as 32-bit words, even and odd elements
// apart, so q and o are kept in that "native" order — a permutation of d applied to q once and
// undone on o once. int8 rows (a quantised cache) are widened to f32 in the dots; their
// per-row scales multiply the block's scores (after the dots) and p (before P·V), so the
// inner loops are those of f32 rows.
// Paged rows (lane_block::pages): a block of W keys that lies in one page is read in place
// like a dense block; one that straddles pages (a page size that is not a multiple of W, or a
// key range that starts inside a page) goes through the padded copy, row by row. The q·k dots take an operand type of tile.h: f32_operands multiply the
// widened vectors; bf16_pair_operands (an ISA with a bf16 dot product, q exactly bf16:
// lane_block::q_bf16) take the K words as they are, with q packed into words in memory order.
// A short last block, or a head size that does not fill whole units, goes through a
// zero-padded copy of the block. The rows a block ahead are prefetched, one line per line read
// (into L2; the hardware prefetcher alone reaches about half the bandwidth here).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/scores.h"
#include "cpu/simd.h"
#include "cpu/tile.h"

namespace attn::detail::cpu {
namespace {

// Software prefetch of the K/V rows kDecodePrefetchBytes ahead of the block being read, one line
// per line read, into L2 (prefetcht1): the fill buffers of L1 stay free for the block's own
// loads. Measured on Zen 4 (Hq 32 / Hkv 8, D 128, Nk 16384, bf16, 2 threads): 8 KiB into L1
// 4.0–4.4 ms, 16 KiB into L2 3.2–4.0 ms, in the same runs; on a Xeon 4–64 KiB alike. On Zen 5
// (docs/SERVING.md, 29 Nov 2026) the nearer the better: 4 KiB (one block of bf16 rows of 128)
// against 16 KiB, dense bf16 at Nk 131072 9.8 against 10.9 ms, int8 rows 6.4 against 7.0.
constexpr std::int64_t kDecodePrefetchBytes = 4096;
inline void prefetch_l2(const void* p) { __builtin_prefetch(p, 0, 2); }
// The same line of the next block into L1 (nd: bytes from a row of this block to the same row
// of the next; 0 where there is no next block in one run, or the level does not ask for it:
// then nothing, rather than a prefetch of the line being read).
inline void prefetch_next(const void* p, std::ptrdiff_t nd) {
  if (nd != 0) __builtin_prefetch(static_cast<const char*>(p) + nd, 0, 3);
}

// Scratch of the decode forward (floats, within lane_scratch_floats): per row group g,
// per-lane vectors; per row, q and o.
struct decode_layout {
  std::int64_t nr, ng, nrp, D, Dv, Dp, Dvp;
  float *qr, *orow, *mvec, *lacc, *qsc, *qpost, *pb, *alpha, *wsc, *bias, *biasm, *kpad, *vpad, *snext;
  std::int32_t *pos, *lo, *hi, *qcorr;
  float* slope;
  decode_layout(const lane_block& lb, int RG, int unit) : nr(lb.nl), D(lb.D), Dv(lb.Dv) {
    ng = (nr + RG - 1) / RG, nrp = ng * RG;
    Dp = (D + unit - 1) / unit * unit, Dvp = (Dv + unit - 1) / unit * unit;
    float* f = lb.scratch;
    qr = f, f += nrp * Dp;        // [nrp][Dp] q rows (f32 native order, or bf16 pair words)
    orow = f, f += nrp * Dvp;     // [nrp][Dvp] unnormalised outputs, native order
    mvec = f, f += ng * W;        // [ng][W] running max (mixed layout)
    lacc = f, f += ng * W;        // [ng][W] partial sums of p
    pos = reinterpret_cast<std::int32_t*>(f), f += ng * W;  // [ng][W] row constants, mixed layout
    lo = reinterpret_cast<std::int32_t*>(f), f += ng * W;
    hi = reinterpret_cast<std::int32_t*>(f), f += ng * W;
    slope = f, f += ng * W;
    qsc = f, f += ng * W;         // [ng][W] scales of int16 q rows (int16_pair_operands), mixed layout
    qpost = f, f += ng * W;       // [ng][W] 2^-64 for the rows whose q was below 2^-100, else 1
    qcorr = reinterpret_cast<std::int32_t*>(f), f += nrp;  // [nrp] 128·Σ q16 of a row (blocked keys)
    pb = f, f += RG * W;          // [RG][W] p of the current block and row group
    alpha = f, f += W;            // [RG] rescale factors
    wsc = f, f += W;              // [RG] scales of the int16 weights of the block (decode_pv_int16)
    bias = f, f += lb.L * W;      // [L][W] mask of the block
    biasm = f, f += nrp * W;      // [ng][RG][W] the same, mixed layout
    kpad = f, f += W * Dp;        // [W][Dp] a padded copy of the block (f32 or bf16)
    vpad = f, f += W * Dvp;
    snext = f, f += nrp * W;      // [ng][RG][W] scores of the block step() finishes next (mixed layout)
  }
};

// Scores of keys kb[0, W) (row stride ks, storage T) for the RG rows q[r·qs ..] (words of Ops),
// in the mixed layout. A unit is storage<T>::U·W elements of d: Ops::key_vectors<T> vectors of
// words of K and of q.
template <int RG, class Ops, class T>
inline void decode_scores(const typename Ops::word* q, std::int64_t qs, std::int64_t nu, const T* kb, std::int64_t ks,
                          vf* s, const T* kpf, std::ptrdiff_t nd) {
  constexpr int KG = W / RG, KV = Ops::template key_vectors<T>, E = storage<T>::U * W;
  // Not unrolled: each load of K below is then one instruction whose address steps by KG rows
  // from one group to the next, and on through the next block of a dense head (constant
  // stride), which the cores' per-instruction stride prefetchers follow; unrolled, every line
  // had a load of its own, seen once a block, and only the software prefetch fetched ahead.
  // Zen 5, Hq 4 / Hkv 1, D 128, bf16 K/V, Nk 262144 from DRAM, 1 thread, alternating libraries:
  // 5.09-5.84 -> 4.16-5.34 ms; in cache 1-2 % slower; int8 token-major pages of 16 (whose
  // stride runs into a page's end after 4 groups) 0-6 % slower at 2 threads (docs/SERVING.md).
#pragma GCC unroll 1
  for (int kg = 0; kg < RG; ++kg) {
    vf acc[W];
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) acc[i] = vf{};
    const T* kp = kb + kg * KG * ks;
    const T* pp = kpf + kg * KG * ks;
    for (std::int64_t u = 0; u < nu; ++u) {
      typename Ops::vword qv[RG][KV];
#pragma GCC unroll 4
      for (int r = 0; r < RG; ++r)
#pragma GCC unroll 2
        for (int e = 0; e < KV; ++e) qv[r][e] = Ops::load_words(q + r * qs + (u * KV + e) * W);
#pragma GCC unroll 16
      for (int x = 0; x < KG; ++x) {
        typename Ops::vword kv[KV];
        Ops::template load_keys<T>(kp + x * ks + u * E, kv);
        prefetch_l2(pp + x * ks + u * E);
        prefetch_next(kp + x * ks + u * E, nd);
#pragma GCC unroll 2
        for (int e = 0; e < KV; ++e)
#pragma GCC unroll 4
          for (int r = 0; r < RG; ++r) acc[r * KG + x] = Ops::madd(acc[r * KG + x], kv[e], qv[r][e]);
      }
    }
    if constexpr (Ops::kInt) {  // int32 sums of int16 products: added as integers, converted once
      transpose_add_int(acc);
      s[kg] = __builtin_convertvector((vi)acc[0], vf);
    } else {
      transpose_add(acc);
      s[kg] = acc[0];
    }
  }
}

// W = 16, RG = 4, bf16 rows on the ISA's bf16 dot, D ≤ 128 (NU ≤ 4 units of 32 elements):
// q·k with the four rows side by side in the 128-bit quarters of a vector rather than in
// accumulators of their own. qa holds q chunked ([NU·4][16] words: quarter r of vector c = row
// r's words 4c … 4c + 3, decode_run::chunk_q); each key's 4 words at c are broadcast to the four
// quarters (vbroadcasti32x4 from memory), so one bf16 dot advances all four rows, and a key's
// accumulator ends with row r's four partial sums in quarter r. A group of 4 keys then folds
// into the mixed layout (lane r·4 + x = row r · key x) in-quarter: two stages of two-source
// shuffles, 9 instructions where transpose_add over 16 accumulators takes 45. The same number of
// dots and K bytes read; q stays in registers across the block.
template <int NU, class Dot>
inline void decode_scores_chunked(const std::uint32_t* qa, const std::uint16_t* kb, std::int64_t ks, vf* s,
                                  const std::uint16_t* kpf, std::ptrdiff_t nd) {
  static_assert(NU > 0 && W == 16, "four rows in the quarters of a 16-lane vector");
  constexpr int NC = NU * 4;  // chunks of 4 words (8 elements of d)
  constexpr int NA = NC >= 12 ? 3 : 2;
  vu qv[NC];
#pragma GCC unroll 16
  for (int c = 0; c < NC; ++c) qv[c] = loadu(qa + c * W);
  // Lane i = 4r + j: stage 1 pairs keys (a, b) as [a_s, b_s, a_s+1, b_s+1] of quarter r (s = 0
  // or 2, added), stage 2 takes halves of two such pairs.
  constexpr auto lo1 = [](int i) { return (i % 2 ? W : 0) + i / 4 * 4 + i % 4 / 2; };
  constexpr auto lo2 = [](int i) { return (i % 4 < 2 ? 0 : W - 2) + i; };
#pragma GCC unroll 1
  for (int kg = 0; kg < 4; ++kg) {
    vf acc[4][NA];
#pragma GCC unroll 4
    for (int x = 0; x < 4; ++x)
#pragma GCC unroll 4
      for (int i = 0; i < NA; ++i) acc[x][i] = vf{};
    const std::uint16_t* kp = kb + kg * 4 * ks;
    const std::uint16_t* pp = kpf + kg * 4 * ks;
#pragma GCC unroll 4
    for (int x = 0; x < 4; ++x) {
      const std::uint32_t* kw = reinterpret_cast<const std::uint32_t*>(kp + x * ks);
#pragma GCC unroll 16
      for (int c = 0; c < NC; ++c) {
        acc[x][c % NA] = Dot::dot_pairs(acc[x][c % NA], Dot::bcast_quarters(kw + c * 4), qv[c]);
        if (c % 4 == 0) prefetch_l2(pp + x * ks + c * 8), prefetch_next(kp + x * ks + c * 8, nd);
      }
    }
    vf a[4];
#pragma GCC unroll 4
    for (int x = 0; x < 4; ++x) {
      a[x] = acc[x][0];
#pragma GCC unroll 4
      for (int i = 1; i < NA; ++i) a[x] += acc[x][i];
    }
    const auto stage1 = [&](vf p, vf q) {
      return shuffle2<lo1(0), lo1(1), lo1(2), lo1(3), lo1(4), lo1(5), lo1(6), lo1(7), lo1(8), lo1(9), lo1(10), lo1(11),
                      lo1(12), lo1(13), lo1(14), lo1(15)>(p, q) +
             shuffle2<lo1(0) + 2, lo1(1) + 2, lo1(2) + 2, lo1(3) + 2, lo1(4) + 2, lo1(5) + 2, lo1(6) + 2, lo1(7) + 2,
                      lo1(8) + 2, lo1(9) + 2, lo1(10) + 2, lo1(11) + 2, lo1(12) + 2, lo1(13) + 2, lo1(14) + 2,
                      lo1(15) + 2>(p, q);
    };
    const vf t01 = stage1(a[0], a[1]), t23 = stage1(a[2], a[3]);
    s[kg] = shuffle2<lo2(0), lo2(1), lo2(2), lo2(3), lo2(4), lo2(5), lo2(6), lo2(7), lo2(8), lo2(9), lo2(10), lo2(11),
                     lo2(12), lo2(13), lo2(14), lo2(15)>(t01, t23) +
            shuffle2<lo2(0) + 2, lo2(1) + 2, lo2(2) + 2, lo2(3) + 2, lo2(4) + 2, lo2(5) + 2, lo2(6) + 2, lo2(7) + 2,
                     lo2(8) + 2, lo2(9) + 2, lo2(10) + 2, lo2(11) + 2, lo2(12) + 2, lo2(13) + 2, lo2(14) + 2,
                     lo2(15) + 2>(t01, t23);
  }
}

// Lane r·KG + x of the result = s[kg·KG + x] (the mixed layout of per-key values of a block).
template <int KG, int kg, int... X>
inline vf spread_impl(vf s, std::integer_sequence<int, X...>) {
  return shuffle2<(kg * KG + X % KG)...>(s, s);
}
template <int KG, int kg>
inline vf spread(vf s) {
  return spread_impl<KG, kg>(s, std::make_integer_sequence<int, W>{});
}
template <int RG, int... G>
inline void spread_all(vf s, vf* out, std::integer_sequence<int, G...>) {
  ((out[G] = spread<W / RG, G>(s)), ...);
}

// Per-row score vectors (lane x = key x) → the mixed layout: lane r·KG + x of s[kg] = sr[r][kg·KG + x].
template <int RG>
inline void rows_to_mixed(const vf* sr, vf* s) {
  constexpr int KG = W / RG;
  if constexpr (RG == 1) {
    s[0] = sr[0];
  } else if constexpr (RG == 2) {
    [&]<int... X>(std::integer_sequence<int, X...>) {
      s[0] = shuffle2<(X < KG ? X : W + X - KG)...>(sr[0], sr[1]);
      s[1] = shuffle2<(X < KG ? KG + X : W + X)...>(sr[0], sr[1]);
    }(std::make_integer_sequence<int, W>{});
  } else {
    static_assert(RG == 4 && W == 16, "four rows of four keys: a 4 x 4 transpose of 128-bit lanes");
    // chunk c of a vector: lanes [4c, 4c + 4). t0 = (a.0 b.0 a.1 b.1), t1 = (a.2 b.2 a.3 b.3).
    const auto lo = [](vf a, vf b) { return shuffle2<0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23>(a, b); };
    const auto hi = [](vf a, vf b) { return shuffle2<8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31>(a, b); };
    const auto even = [](vf a, vf b) { return shuffle2<0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23>(a, b); };
    const auto odd = [](vf a, vf b) { return shuffle2<8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31>(a, b); };
    const vf t0 = lo(sr[0], sr[1]), t1 = hi(sr[0], sr[1]), t2 = lo(sr[2], sr[3]), t3 = hi(sr[2], sr[3]);
    s[0] = even(t0, t2), s[1] = odd(t0, t2), s[2] = even(t1, t3), s[3] = odd(t1, t3);
  }
}

// Scores of a block of W = 16 keys stored blocked (lane_block::kblocked: [Dp/4][16 keys][4]
// bytes at kb) for the RG rows of a group, in the mixed layout. Each 64-byte line holds one quad
// of d of all 16 keys, so the scores come out with keys in the lanes: no transpose-add. The keys
// are made unsigned (k + 128: an xor) for vpdpbusd (unsigned × signed bytes, four products per
// lane); q is 14-bit (|q16| <= 2^14) as two signed bytes, q16 = 256·qh + ql (qh, ql dwords of
// four bytes: rows qs dwords apart, the ql of a row Dp/4 dwords after its qh). Then
//   q16·k = 256·Σ ku·qh + Σ ku·ql − 128·Σ q16  (corr[r] = 128·Σ q16),
// exact in int32: every step is modular and |q16·k| <= 512·2^14·127 < 2^31.
template <int RG, class Dot>
inline void decode_scores_blocked(const std::uint32_t* q, std::int64_t qs, const std::int32_t* corr, std::int64_t nq4,
                                  const std::int8_t* kb, vf* s, const std::int8_t* kpf, std::ptrdiff_t nd) {
  constexpr int NA = 4 / RG;  // accumulator sets: at least eight chains in flight
  vi ah[NA][RG], al[NA][RG];
#pragma GCC unroll 4
  for (int a = 0; a < NA; ++a)
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) ah[a][r] = vi{}, al[a][r] = vi{};
  const vu flip = splatu(0x80808080u);
  const std::int64_t hoff = nq4;  // dwords from a row's qh to its ql
  for (std::int64_t c = 0; c < nq4; c += NA) {
#pragma GCC unroll 4
    for (int a = 0; a < NA; ++a) {
      const vu ku = loadu(reinterpret_cast<const std::uint32_t*>(kb + (c + a) * 64)) ^ flip;
      prefetch_l2(kpf + (c + a) * 64);
      prefetch_next(kb + (c + a) * 64, nd);
#pragma GCC unroll 4
      for (int r = 0; r < RG; ++r) {
        ah[a][r] = Dot::dot_u8s8_bcast(ah[a][r], ku, q + r * qs + c + a);
        al[a][r] = Dot::dot_u8s8_bcast(al[a][r], ku, q + r * qs + hoff + c + a);
      }
    }
  }
  vf sr[RG];
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r) {
    vi h = ah[0][r], l = al[0][r];
#pragma GCC unroll 4
    for (int a = 1; a < NA; ++a) h += ah[a][r], l += al[a][r];
    const vu t = ((vu)h << 8) + (vu)l - (vu)splati(corr[r]);  // modular: the exact sum fits
    sr[r] = __builtin_convertvector((vi)t, vf);
  }
  rows_to_mixed<RG>(sr, s);
}

// The same with q in 8 bits (lane_block::int8_bytes: int8_query::int8): q8 one signed byte per
// element (|q8| <= 127, a float scale per row), four to a dword, rows qs dwords apart. One
// vpdpbusd per four d, half the products of the 14-bit q above:
//   q8·k = Σ ku·q8 − 128·Σ q8  (corr[r] = 128·Σ q8), exact in int32.
template <int RG, class Dot>
inline void decode_scores_blocked8(const std::uint32_t* q, std::int64_t qs, const std::int32_t* corr, std::int64_t nq4,
                                   const std::int8_t* kb, vf* s, const std::int8_t* kpf, std::ptrdiff_t nd) {
  constexpr int NA = 8 / RG;  // accumulator sets: eight chains in flight
  vi ah[NA][RG];
#pragma GCC unroll 8
  for (int a = 0; a < NA; ++a)
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) ah[a][r] = vi{};
  const vu flip = splatu(0x80808080u);
  for (std::int64_t c = 0; c < nq4; c += NA) {
#pragma GCC unroll 8
    for (int a = 0; a < NA; ++a) {
      const vu ku = loadu(reinterpret_cast<const std::uint32_t*>(kb + (c + a) * 64)) ^ flip;
      prefetch_l2(kpf + (c + a) * 64);
      prefetch_next(kb + (c + a) * 64, nd);
#pragma GCC unroll 4
      for (int r = 0; r < RG; ++r) ah[a][r] = Dot::dot_u8s8_bcast(ah[a][r], ku, q + r * qs + c + a);
    }
  }
  vf sr[RG];
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r) {
    vi h = ah[0][r];
#pragma GCC unroll 8
    for (int a = 1; a < NA; ++a) h += ah[a][r];
    sr[r] = __builtin_convertvector(h - splati(corr[r]), vf);
  }
  rows_to_mixed<RG>(sr, s);
}

// Online softmax of one row group over one block (mixed layout): s → p in s, α in alpha.
// Scores and the running max are kept in base 2 (s·log2 e, FlashAttention's softmax_scale_log2):
// p = 2^(s − m) by vexp2, about half the instructions of vexp; decode_run converts m at its ends.
// ranged: some key of the block lies outside a row's [lo, hi) (or past the block's nb keys):
// only then are the scores masked. α is computed only where some row's max moved (else 1).
// Inlined into the blocked-keys step only (decode_softmax_inlined): s then stays in registers
// (Hq 4 / Hkv 1, D 128, Nk 16384, 1 thread, fastest of 1500: 261 -> 256.5 us); for int8 rows the
// out-of-line call (decode_softmax, as GCC chose it) measured 2 % faster, for bf16 the same.
template <int RG>
__attribute__((always_inline)) inline void decode_softmax_inlined(const decode_layout& st, const score_consts& sc,
                                                                  std::int64_t g, vf* s, std::int64_t j0,
                                                                  std::int64_t nb, bool ranged) {
  constexpr int KG = W / RG;
  const vf m_old = load(st.mvec + g * W);
  vf mx = m_old;
  if (sc.plain && !ranged) {
#pragma GCC unroll 4
    for (int kg = 0; kg < RG; ++kg) s[kg] *= sc.scale_log2, mx = vmax(mx, s[kg]);
  } else {
    const vi pos = loadi(st.pos + g * W), lo = loadi(st.lo + g * W), hi0 = loadi(st.hi + g * W);
    const vi hi = hi0 < splati(std::int32_t(j0 + nb)) ? hi0 : splati(std::int32_t(j0 + nb));
    const vf slope = load(st.slope + g * W);
    const vi keyoff = iota() & splati(KG - 1);
    vf t;
#pragma GCC unroll 4
    for (int kg = 0; kg < RG; ++kg) {
      s[kg] = transform(s[kg], sc, &t, sc.bias ? load(st.biasm + (g * RG + kg) * W) : vf{},
                        splati(std::int32_t(j0 + kg * KG)) + keyoff, pos, lo, hi, slope, true) *
              splat(kLog2e);
      mx = vmax(mx, s[kg]);
    }
  }
  mx = group_max<KG / 2>(mx);
  const vf mu = mx == splat(-kInf) ? vf{} : mx;  // a row with nothing yet keeps p = 0
  const bool moved = any_lane(mx != m_old);  // NaN != NaN: moved
  const vf a = moved ? vexp2(m_old - mu) : splat(1.0f);
  vf sum = load(st.lacc + g * W) * a;
#pragma GCC unroll 4
  for (int kg = 0; kg < RG; ++kg) {
    s[kg] = vexp2(s[kg] - mu);
    sum += s[kg];
  }
  store(st.lacc + g * W, sum);
  store(st.mvec + g * W, mx);
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r) st.alpha[r] = a[r * KG];
}
template <int RG>
__attribute__((noinline)) void decode_softmax(const decode_layout& st, const score_consts& sc, std::int64_t g, vf* s,
                                              std::int64_t j0, std::int64_t nb, bool ranged) {
  decode_softmax_inlined<RG>(st, sc, g, s, j0, nb, ranged);
}

// The P·V accumulators of RG rows × CB output vectors from o (row stride Dvp), each row times α_r,
// and back.
template <int RG, int CB>
inline void pv_begin(vf (&acc)[RG][CB], const float* o, std::int64_t Dvp, const float* alpha, std::int64_t c0) {
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r) {
    const vf a = splat(alpha[r]);
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) acc[r][c] = load(o + r * Dvp + (c0 + c) * W) * a;
  }
}
template <int RG, int CB>
inline void pv_end(const vf (&acc)[RG][CB], float* o, std::int64_t Dvp, std::int64_t c0) {
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) store(o + r * Dvp + (c0 + c) * W, acc[r][c]);
}

// O[r][c0·W, (c0 + CB)·W) = α_r O + Σ_x p[r][x] v_x for the RG rows at o (row stride Dvp).
template <int RG, int CB, class T>
inline void decode_pv(float* o, std::int64_t Dvp, const float* pb, const float* alpha, const T* vb, std::int64_t vs,
                      std::int64_t c0, const T* vpf, std::ptrdiff_t nd) {
  constexpr int KG = W / RG, U = storage<T>::U;
  static_assert(CB % U == 0);
  vf acc[RG][CB];
  pv_begin(acc, o, Dvp, alpha, c0);
  const T* vp = vb + c0 * W;
  const T* pp = vpf + c0 * W;
#pragma GCC unroll 16
  for (int x = 0; x < W; ++x, vp += vs, pp += vs) {
    vf vv[CB];
#pragma GCC unroll 8
    for (int u = 0; u < CB / U; ++u)
      storage<T>::get(vp + u * U * W, vv + u * U), prefetch_l2(pp + u * U * W), prefetch_next(vp + u * U * W, nd);
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) {
      const vf px = splat(pb[x / KG * W + r * KG + x % KG]);
#pragma GCC unroll 8
      for (int c = 0; c < CB; ++c) acc[r][c] += px * vv[c];
    }
  }
  pv_end(acc, o, Dvp, c0);
}
// The same with bf16 products (bf16 q, K and V on an ISA with a bf16 dot product): p is rounded
// to bf16 (nearest even) in pairs of keys, as the prefill kernels round P, and each pair of V
// rows (x, x + 1) becomes two vectors of words (v_x[d], v_{x+1}[d]) — the even d, then the odd
// d: the native order of storage<uint16_t>, with no shuffle — that one bf16 dot per vector
// multiplies by the row's broadcast pair (p_x, p_{x+1}). pw: [RG·W/2] words, word k =
// bf16(pb[2k]) | bf16(pb[2k + 1]) << 16 (pairs are adjacent lanes of the mixed layout).
template <int RG, int CB, class Ops, class T>
__attribute__((noinline)) void decode_pv_pairs(float* o, std::int64_t Dvp, const std::uint32_t* pw, const float* alpha,
                                               const T* vb, std::int64_t vs, std::int64_t c0, const T* vpf,
                                               std::ptrdiff_t nd) {
  constexpr int KG = W / RG, U = storage<T>::U;
  static_assert(CB % U == 0 && KG % 2 == 0);
  vf acc[RG][CB];
  pv_begin(acc, o, Dvp, alpha, c0);
  const T* vp = vb + c0 * W;
  const T* pp = vpf + c0 * W;
  const vu lo16 = splatu(0xffffu), hi16 = splatu(0xffff0000u);
#pragma GCC unroll 8
  for (int x = 0; x < W; x += 2, vp += 2 * vs, pp += 2 * vs) {
    vu vv[CB];
#pragma GCC unroll 4
    for (int u = 0; u < CB / U; ++u) {
      if constexpr (U == 2) {  // bf16: the words of rows x and x + 1, even d then odd d
        const vu a = loadu(reinterpret_cast<const std::uint32_t*>(vp + u * 2 * W));
        const vu b = loadu(reinterpret_cast<const std::uint32_t*>(vp + vs + u * 2 * W));
        vv[2 * u] = (a & lo16) | (b << 16);
        vv[2 * u + 1] = (a >> 16) | (b & hi16);
      } else {  // int8: both rows widened (exact) in memory order, each vector of d paired across the rows
        vf a[U], b[U];
        Ops::dot::template widen_int8<U>(vp + u * U * W, a);
        Ops::dot::template widen_int8<U>(vp + vs + u * U * W, b);
#pragma GCC unroll 4
        for (int e = 0; e < U; ++e) vv[U * u + e] = pair_words(a[e], b[e]);
      }
      prefetch_l2(pp + u * U * W);
      prefetch_l2(pp + vs + u * U * W);
      prefetch_next(vp + u * U * W, nd);
      prefetch_next(vp + vs + u * U * W, nd);
    }
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) {
      const vu px = splatu(pw[(x / KG * W + r * KG + x % KG) / 2]);
#pragma GCC unroll 8
      for (int c = 0; c < CB; ++c) acc[r][c] = Ops::madd(acc[r][c], px, vv[c]);
    }
  }
  pv_end(acc, o, Dvp, c0);
}

// O[r][c0·W, (c0 + CB)·W) = α_r O + wsc[r] · sums[r] for the int32 sums of a block's P·V
// (decode_pv_int16, decode_pv_u8); alpha null, or α_r = 1 (the running max kept): O + wsc·sums,
// one multiply-add.
template <int RG, int CB>
inline void int_sums_to_o(const vi (&acc)[RG][CB], float* o, std::int64_t Dvp, const float* alpha, const float* wsc,
                          std::int64_t c0) {
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r) {
    const vf ws = splat(wsc[r]);
    if (alpha && alpha[r] != 1.0f) {
      const vf a = splat(alpha[r]);
#pragma GCC unroll 8
      for (int c = 0; c < CB; ++c) {
        float* oc = o + r * Dvp + (c0 + c) * W;
        store(oc, load(oc) * a + ws * __builtin_convertvector(acc[r][c], vf));
      }
    } else {
#pragma GCC unroll 8
      for (int c = 0; c < CB; ++c) {
        float* oc = o + r * Dvp + (c0 + c) * W;
        store(oc, load(oc) + ws * __builtin_convertvector(acc[r][c], vf));
      }
    }
  }
}

// int8 V rows with int16 weights (int16_pair_operands): w = p·scale_v of the block, quantised
// per row to int16 with a power-of-two scale wsc[r] (decode_run::quantise_weights), and each
// pair of V rows (x, x + 1) widened to int16 and interleaved into words (v_x[d], v_{x+1}[d]) —
// the d of a 32-value unit in the order of int16_pv_position — so that one vpdpwssd per vector
// multiplies by the row's broadcast pair (w_x, w_{x+1}). The int32 sums of the block are exact;
// O = α O + wsc · sums, once per block.
template <int RG, int CB, class Dot>
__attribute__((noinline)) void decode_pv_int16(float* o, std::int64_t Dvp, const std::uint32_t* pw, const float* alpha,
                                               const float* wsc, const std::int8_t* vb, std::int64_t vs, std::int64_t c0,
                                               const std::int8_t* vpf, std::ptrdiff_t nd) {
  constexpr int KG = W / RG;
  static_assert(CB % 2 == 0 && KG % 2 == 0);
  vi acc[RG][CB];
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) acc[r][c] = vi{};
  const std::int8_t* vp = vb + c0 * W;
  const std::int8_t* pp = vpf + c0 * W;
#pragma GCC unroll 8
  for (int x = 0; x < W; x += 2, vp += 2 * vs, pp += 2 * vs) {
    vu vv[CB];
#pragma GCC unroll 4
    for (int u = 0; u < CB / 2; ++u) {  // a unit: 2W values of d, two vectors of pairs
      const vu a = Dot::widen_int8_words(vp + u * 2 * W), b = Dot::widen_int8_words(vp + vs + u * 2 * W);
      vv[2 * u] = Dot::interleave_lo(a, b);
      vv[2 * u + 1] = Dot::interleave_hi(a, b);
      if (u % 2 == 0) {  // one line per 4W bytes
        prefetch_l2(pp + u * 2 * W), prefetch_l2(pp + vs + u * 2 * W);
        prefetch_next(vp + u * 2 * W, nd), prefetch_next(vp + vs + u * 2 * W, nd);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) {
      const std::uint32_t* px = pw + (x / KG * W + r * KG + x % KG) / 2;  // broadcast by each product
#pragma GCC unroll 8
      for (int c = 0; c < CB; ++c) acc[r][c] = Dot::dot_int16_bcast(acc[r][c], vv[c], px);
    }
  }
  int_sums_to_o<RG, CB>(acc, o, Dvp, alpha, wsc, c0);
}
// int8 V rows with 8-bit weights (lane_block::int8_bytes): w = p·scale_v of the block quantised
// per row to unsigned bytes with a float scale wsc[r] (decode_run::quantise_weights8), and each
// quad of V rows (x … x + 3) turned into quads of bytes (v_x[d], …, v_{x+3}[d]) by two stages of
// unpacks — the d of a 64-value unit in the order of u8_pv_position — so that one vpdpbusd per
// vector multiplies by the row's broadcast quad of weights (unsigned × signed bytes): half the
// products of decode_pv_int16 and no widening. The int32 sums of the block are exact (16 keys ·
// 255 · 128 < 2^31); O = α O + wsc · sums, once per block (alpha null: α = 1).
template <int RG, int CB, class Dot>
__attribute__((noinline)) void decode_pv_u8(float* o, std::int64_t Dvp, const std::uint8_t* pw, const float* alpha,
                                            const float* wsc, const std::int8_t* vb, std::int64_t vs, std::int64_t c0,
                                            const std::int8_t* vpf, std::ptrdiff_t nd) {
  constexpr int KG = W / RG;
  static_assert(W == 16 && CB % 4 == 0 && KG % 4 == 0);
  vi acc[RG][CB];
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) acc[r][c] = vi{};
  const std::int8_t* vp = vb + c0 * W;
  const std::int8_t* pp = vpf + c0 * W;
#pragma GCC unroll 4
  for (int x = 0; x < W; x += 4, vp += 4 * vs, pp += 4 * vs) {
    vu vv[CB];
#pragma GCC unroll 2
    for (int u = 0; u < CB / 4; ++u) {  // a unit: 4W values of d (a line of each row), four vectors of quads
      vu r[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) {
        r[i] = loadu(reinterpret_cast<const std::uint32_t*>(vp + i * vs + u * 4 * W));
        prefetch_l2(pp + i * vs + u * 4 * W);
        prefetch_next(vp + i * vs + u * 4 * W, nd);
      }
      const vu lo01 = Dot::interleave_bytes_lo(r[0], r[1]), hi01 = Dot::interleave_bytes_hi(r[0], r[1]);
      const vu lo23 = Dot::interleave_bytes_lo(r[2], r[3]), hi23 = Dot::interleave_bytes_hi(r[2], r[3]);
      vv[4 * u] = Dot::interleave_lo(lo01, lo23), vv[4 * u + 1] = Dot::interleave_hi(lo01, lo23);
      vv[4 * u + 2] = Dot::interleave_lo(hi01, hi23), vv[4 * u + 3] = Dot::interleave_hi(hi01, hi23);
    }
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) {
      std::uint32_t quad;  // row r's weights of keys x … x + 3 (lanes r·KG + x % KG of vector x / KG)
      __builtin_memcpy(&quad, pw + x / KG * W + r * KG + x % KG, 4);
      const vu wq = splatu(quad);
#pragma GCC unroll 8
      for (int c = 0; c < CB; ++c) acc[r][c] = Dot::dot_u8s8(acc[r][c], wq, vv[c]);
    }
  }
  int_sums_to_o<RG, CB>(acc, o, Dvp, alpha, wsc, c0);
}
// Where d of a V row lands in the accumulators of decode_pv_u8: in each unit of 4W values, lane
// 4l + i of vector k holds d = 16l + 4k + i (the unpacks work within 128-bit lanes).
constexpr std::int64_t u8_pv_position(std::int64_t d) {
  const std::int64_t u = d / (4 * W), e = d % (4 * W), l = e / 16, k = e % 16 / 4, i = e % 4;
  return u * 4 * W + k * W + 4 * l + i;
}

// Where d of a V row lands in the accumulators of decode_pv_int16: in each unit of 2W values,
// vector 0 holds the low four of every eight d, vector 1 the high four (vpunpck[lh]wd).
constexpr std::int64_t int16_pv_position(std::int64_t d) {
  const std::int64_t u = d / (2 * W), e = d % (2 * W), i = e / 8, t = e % 8;
  return u * 2 * W + (t / 4) * W + 4 * i + t % 4;
}
// W int32 lanes (-32768 <= v <= 32767) → W/2 words of int16 pairs of adjacent lanes at out.
inline void store_lane_pairs_i16(std::uint32_t* out, vi v) {
  typedef std::uint64_t vq __attribute__((vector_size(W * 4)));
  typedef std::uint32_t vh __attribute__((vector_size(W * 2)));
  const vq b = (vq)(v & splati(0xffff));
  const vh w = __builtin_convertvector(b | b >> 16, vh);
  __builtin_memcpy(out, &w, sizeof w);
}

template <int RG, int CB, class T>
inline void decode_pv_tail(int nv, float* o, std::int64_t Dvp, const float* pb, const float* alpha, const T* vb,
                           std::int64_t vs, std::int64_t c0, const T* vpf, std::ptrdiff_t nd) {
  if constexpr (CB > 0) {
    if constexpr (CB % storage<T>::U == 0)
      if (nv == CB) return decode_pv<RG, CB>(o, Dvp, pb, alpha, vb, vs, c0, vpf, nd);
    decode_pv_tail<RG, CB - 1>(nv, o, Dvp, pb, alpha, vb, vs, c0, vpf, nd);
  }
}

// The decode forward of one lane block, a block of W keys at a time: the constructor sets up
// the state (q in the kernel's order, m, l, o), step() reads the next block, finish() writes
// m, l and oᵀ. decode_rows runs one lane block to its end; decode_heads interleaves the lane
// blocks of several heads block by block (the rows of one key block of every head are read
// together: contiguous in a token-major cache or a page of all heads).
// Ops: the operand type of the q·k dots; T: the storage of the K/V rows read.
// KB: keys stored blocked (lane_block::kblocked), read by decode_scores_blocked (int16_pair_operands, W = 16).
// B8: the weights in 8 bits (lane_block::int8_bytes, decode_pv_u8), and with KB q too (decode_scores_blocked8).
template <int RG, class Ops, class T, bool KB = false, bool B8 = false>
struct decode_run {
  static constexpr int KG = W / RG, U = storage<T>::U, P = Ops::kPack;
  static constexpr int CB = RG == 4 ? 4 : 8;  // P·V output vectors per row in registers
  static constexpr bool q8 = __is_same(T, std::int8_t);
  static constexpr bool i16 = Ops::kInt;  // int8 rows, q and w quantised to int16 (decode_pv_int16)
  // The order of d in the P·V accumulators: storage<T>'s native order, memory order where int8
  // rows are paired for bf16 products (decode_pv_pairs), or decode_pv_int16's.
  static constexpr bool pv_memory_order = q8 && P == 2 && KG % 2 == 0;
  // q·k of bf16 rows by decode_scores_chunked (q chunked, chunk_q) where D fits: see there.
  static constexpr bool kChunkable = W == 16 && RG == 4 && P == 2 && !Ops::kInt && !KB && __is_same(T, std::uint16_t);
  static_assert(!B8 || i16, "8-bit weights replace the int16 ones");
  static constexpr std::int64_t pv_position(std::int64_t d) {
    if constexpr (B8) return u8_pv_position(d);
    else if constexpr (i16) return int16_pv_position(d);
    else if constexpr (pv_memory_order) return d;
    else return storage<T>::native(d);
  }

  const lane_block& lb;
  const forward_io& io;
  bool copy_all;
  decode_layout st;
  score_consts sc;
  lane_range kr;
  std::int64_t L, nr, Dp, Dvp;
  const typename Ops::word* qwords;
  std::int64_t qs;  // words per q row
  // The stored rows: f32, bf16 (also read as f32 through the padded copy when T is float) or int8.
  bool b16;
  std::int64_t esize;
  const char* kbase;
  const char* vbase;
  const std::int64_t* pages;
  std::int64_t psz;
  int pshift;
  bool whole_blocks;  // a block that starts at a multiple of W lies in one page
  std::int64_t nu, nv, pf_keys;
  bool chunked = false;  // kChunkable and nu <= 4: q chunked, scores by decode_scores_chunked
  bool q_tiny = false;   // i16: a row's largest |q| below 2^-100 (its scores take st.qpost too)
  std::int64_t next;  // the first key of the next block
  bool primed = false;  // the scores of the block at next are in st.snext
  std::int64_t lo_max = 0, hi_min = 0;  // over the rows: a block in [lo_max, hi_min) needs no mask
  // The next block into L1 as this one is read (prefetch_next): one head at a time only, and only
  // where the level asks for it (near_prefetch_in_decode). With heads interleaved, a head's next
  // block is `heads` blocks away (32-64 KiB: past L1), and pages of 16 are not yet in L2 when it
  // would be fetched: 10 % slower there, measured.
  bool near_prefetch;

  // heads: the lane blocks interleaved with this one (the prefetch distance, in bytes of all of
  // them, stays kDecodePrefetchBytes); near: the next block into L1 as well (one head only).
  decode_run(const lane_block& lb_, const forward_io& io_, bool copy_all_, int heads, bool near)
      : lb(lb_), io(io_), copy_all(copy_all_), st(lb_, RG, U * W), sc(lb_.sp), kr(lb_), L(lb_.L), nr(st.nr), Dp(st.Dp),
        Dvp(st.Dvp) {
    if constexpr (B8 && KB) quantise_q_bytes();  // decode's lane blocks are lanes_small = W rows
    else if constexpr (i16) quantise_q_rows();
    else q_rows();
    for (std::int64_t g = 0; g < st.nrp; ++g) {
      const bool valid = g < nr;
      for (std::int64_t d = 0; d < Dvp; ++d) st.orow[g * Dvp + d] = 0.0f;
      const std::int64_t x0 = g / RG * W + g % RG * KG;  // the row's lanes in the mixed layout
      for (int x = 0; x < KG; ++x) {
        st.mvec[x0 + x] = valid ? io.m[g] * kLog2e : -kInf;  // base 2 (decode_softmax)
        st.lacc[x0 + x] = valid && x == 0 ? io.l[g] : 0.0f;
        st.pos[x0 + x] = valid ? lb.pos[g] : 0;
        st.lo[x0 + x] = valid ? lb.lo[g] : 0;
        st.hi[x0 + x] = valid ? lb.hi[g] : 0;
        st.slope[x0 + x] = valid && lb.sp.alibi ? lb.slope[g] : 0.0f;
      }
    }
    lo_max = lb.lo[0], hi_min = lb.hi[0];
    for (std::int64_t g = 1; g < nr; ++g) lo_max = imax(lo_max, lb.lo[g]), hi_min = imin(hi_min, lb.hi[g]);
    qwords = reinterpret_cast<const typename Ops::word*>(st.qr);
    qs = Dp / P;
    b16 = lb.k16 != nullptr;
    esize = q8 ? 1 : b16 ? 2 : 4;
    kbase = q8 ? reinterpret_cast<const char*>(lb.k8)
               : b16 ? reinterpret_cast<const char*>(lb.k16) : reinterpret_cast<const char*>(lb.k);
    vbase = q8 ? reinterpret_cast<const char*>(lb.v8)
               : b16 ? reinterpret_cast<const char*>(lb.v16) : reinterpret_cast<const char*>(lb.v);
    // A power-of-two page size (the usual case) shifts and masks instead of dividing.
    pages = lb.pages;
    psz = pages ? lb.page_size : 1;
    pshift = (psz & (psz - 1)) == 0 ? __builtin_ctzll(std::uint64_t(psz)) : -1;
    whole_blocks = psz % W == 0;
    nu = Dp / (U * W), nv = Dvp / W;
    const std::int64_t row_bytes = imax(1, imax(lb.D, lb.Dv) * std::int64_t(sizeof(T)));
    pf_keys = imax(W, kDecodePrefetchBytes / heads / row_bytes) / W * W;
    next = kr.kmin;
    near_prefetch = near && heads == 1;
    if constexpr (kChunkable) {
      chunked = nu <= 4;
      if (chunked) chunk_q();
    }
  }

  // Each row group's q words [RG][qs] → [qs / 4][RG][4] (decode_scores_chunked's qa), in place.
  void chunk_q() {
    std::uint32_t tmp[RG * 64];  // chunked: D <= 128, so qs <= 64 words
    for (std::int64_t g = 0; g < st.ng; ++g) {
      auto* qw = reinterpret_cast<std::uint32_t*>(st.qr) + g * RG * qs;
      std::copy(qw, qw + RG * qs, tmp);
      for (std::int64_t c = 0; c < qs / 4; ++c)
        for (int r = 0; r < RG; ++r)
          for (int w = 0; w < 4; ++w) qw[(c * RG + r) * 4 + w] = tmp[r * qs + c * 4 + w];
    }
  }

  // Float operands: q's rows from qᵀ (decode's lane blocks are lanes_small = W rows, so qᵀ's row
  // d is one vector of the rows), as words of bf16 pairs in memory order (P = 2; q is exactly
  // bf16, so truncation is exact) or f32 in storage<T>'s native order; zero past nr. W × W blocks
  // are turned in registers: vector i of a block holds, lane g, row g's element (P = 1) or word
  // (P = 2) i of the block's W, so the transpose leaves row g's W of them in vector g. P = 1:
  // block (u, k) takes the elements d = u·U·W + i·U + k, which storage<T>::native puts at
  // (u·U + k)·W + i; P = 2: block c the words 16c + i, word w = (bits of d = 2w) | (bits of
  // 2w + 1) << 16. (An element-wise loop took most of a fifth of a decode call at Hq 32 / Hkv 8,
  // D 128, Nk 64, one thread: docs/SERVING.md.)
  void q_rows() {
    const vi live = iota() < splati(std::int32_t(nr));  // rows past nr are zero
    const auto col = [&](std::int64_t d) { return d < lb.D ? (vf)((vi)load(lb.qt + d * W) & live) : vf{}; };
    vf v[W];
    if constexpr (P == 2) {
      auto* qw = reinterpret_cast<std::uint32_t*>(st.qr);
      for (std::int64_t c = 0; c < Dp / (2 * W); ++c) {
#pragma GCC unroll 16
        for (int i = 0; i < W; ++i) v[i] = (vf)pair_words(col(2 * (c * W + i)), col(2 * (c * W + i) + 1));
        transpose(v);
        for (std::int64_t g = 0; g < st.nrp; ++g) storeu(qw + g * (Dp / 2) + c * W, (vu)v[g]);
      }
    } else {
      for (std::int64_t u = 0; u < Dp / (U * W); ++u)
        for (int k = 0; k < U; ++k) {
#pragma GCC unroll 16
          for (int i = 0; i < W; ++i) v[i] = col(u * U * W + i * U + k);
          transpose(v);
          for (std::int64_t g = 0; g < st.nrp; ++g) store(st.qr + g * Dp + (u * U + k) * W, v[g]);
        }
    }
  }

  // i16: q as integers, every row of the lane block at once (decode runs lane blocks of W rows:
  // qᵀ's row d is one vector of the rows). Per row a power-of-two scale f with |q·f| <= 2^bits
  // for the row's largest |q| in [2^(e-1), 2^e): f = 2^(bits - e), q·f rounded half to even and
  // clamped to ±(2^bits − 1) (int16 pairs in memory order, bits 15) or for blocked keys (KB) to
  // ±2^14 as two signed bytes per element (decode_scores_blocked) with the row's 128·Σ q16 in
  // qcorr. The row's scale 2^(e - bits) goes to st.qsc. A row whose largest |q| is below 2^-100
  // (f would pass float's range, or that |q| is subnormal) is first multiplied by 2^64: the same
  // exact products, in two steps; its scale is then kept as 2^(e + 64 - bits) in st.qsc, a
  // normal float, and 2^-64 in st.qpost, applied to the score after the key's scale: no factor
  // is subnormal, so that the kernels' flushed denormals (cpu/denormals.h) lose nothing (scores
  // below 2^-126 become 0). Under DAZ a subnormal largest |q| reads as 0: the row is a zero row.
  // Per row (a lane each) of the lane block: live (rows past nr are not), the largest |q| times
  // pre — 2^64 where it is below 2^-100 (tiny; zero rows and dead lanes have zero), else 1.
  struct q_rows_largest {
    vi live;
    vf pre, mp;
    vi zero, tiny;
  };
  q_rows_largest largest_q() const {
    const vi live = iota() < splati(std::int32_t(nr));
    // the largest |q| of each row as the bits of the floats (non-negative floats order as their
    // bits, and q is finite here: int8_as_int16): vpmaxsd, one cycle a step, where vmaxps's
    // compare and blend made a chain of several
    vi mb = vi{};
    for (std::int64_t d = 0; d < lb.D; ++d) {
      const vi a = (vi)load(lb.qt + d * W) & splati(0x7fffffff);
      mb = mb > a ? mb : a;
    }
    const vf mx = (vf)(live & mb);
    const vi small = (vi)mx < splati(27 << 23);  // zero rows and dead lanes too
    const vf pre = small ? splat(0x1p64f) : splat(1.0f);
    const vf mp = mx * pre;
    const vi zero = (vi)mp == 0;
    return {live, pre, mp, zero, small & ~zero};
  }

  // Each row's scale and post factor (lanes of scale, post) into the mixed layout of st.qsc and
  // st.qpost, and 128·Σ q of each row into st.qcorr where sum is given (the byte q·k products).
  void store_q_scales(vf scale, vf post, const vi* sum) const {
    for (std::int64_t g = 0; g < st.nrp; ++g) {
      if (sum) st.qcorr[g] = std::int32_t(128 * std::int64_t((*sum)[g]));
      for (int x = 0; x < KG; ++x) {
        st.qsc[g / RG * W + g % RG * KG + x] = scale[g];
        st.qpost[g / RG * W + g % RG * KG + x] = post[g];
      }
    }
  }

  void quantise_q_rows() {
    constexpr int bits = KB ? 14 : 15;
    // mp = mx·pre in [2^(E-127), 2^(E-126)) with E >= 27 its exponent field: e = E - 126
    const auto [live, pre, mp, zero, tiny] = largest_q();
    const vi E = ((vi)mp >> 23) & splati(0xff);
    const vf f = (vf)(zero ? splati(0) : (splati(bits + 253) - E) << 23);
    const vf scale = (vf)(zero ? splati(0) : (E + splati(1 - bits)) << 23);  // a normal float
    const vf post = tiny ? splat(0x1p-64f) : splat(1.0f);
    q_tiny = any_lane(tiny);
    const vf lo = splat(-float(1 << bits) + (KB ? 0 : 1)), hi = splat(float(1 << bits) - (KB ? 0 : 1));
    vi sum = vi{};
    for (std::int64_t d = 0; d < Dp; ++d) {
      const vf v = d < lb.D ? (load(lb.qt + d * W) * pre) * f : vf{};  // exact: pre and f are powers of two
      vf x = round_nearest(v);
      x = x < lo ? lo : x;
      x = x > hi ? hi : x;
      const vi q16 = live & __builtin_convertvector(x, vi);
      if constexpr (KB) {
        const vi ql = ((q16 + 128) & splati(255)) - 128, qh = (q16 - ql) >> 8;  // qh in [-64, 64]
        sum += q16;
        for (std::int64_t g = 0; g < st.nrp; ++g) {
          auto* qb = reinterpret_cast<std::int8_t*>(st.qr) + g * (Dp / 2) * 4;
          qb[d] = std::int8_t(qh[g]), qb[Dp + d] = std::int8_t(ql[g]);
        }
      } else {
        for (std::int64_t g = 0; g < st.nrp; ++g)
          reinterpret_cast<std::int16_t*>(st.qr)[g * Dp + d] = std::int16_t(q16[g]);
      }
    }
    store_q_scales(scale, post, KB ? &sum : nullptr);
  }

  // B8: q in 8 bits, every row of the lane block at once: per row f = 127 / (its largest |q|),
  // q8 = fl(q·f) rounded half to even (|q8| <= 127), one signed byte per element (q8 of row g at
  // byte g·2·Dp + d: the rows qs dwords apart, as decode_scores_blocked8 reads them), 128·Σ q8 in
  // qcorr and the largest |q| / 127 in st.qsc. A float scale rather than a power of two: the
  // largest element keeps all of its 7 bits. Rows whose largest |q| is below 2^-100 are first
  // multiplied by 2^64 and take 2^-64 in st.qpost, as in quantise_q_rows.
  void quantise_q_bytes() {
    const auto [live, pre, mp, zero, tiny] = largest_q();
    const vf f = zero ? vf{} : splat(127.0f) / (zero ? splat(1.0f) : mp);
    const vf scale = zero ? vf{} : mp / splat(127.0f);
    const vf post = tiny ? splat(0x1p-64f) : splat(1.0f);
    q_tiny = any_lane(tiny);
    vi sum = vi{};
    for (std::int64_t d = 0; d < Dp; ++d) {
      // q·f rounded to float, then to the nearest integer (even on a tie) by the conversion:
      // round_nearest here would let the compiler fuse its add with the product (one rounding
      // of the exact product), and the bits would depend on the build. pre: exact (a power of two).
      const vf v = d < lb.D ? (load(lb.qt + d * W) * pre) * f : vf{};
      vi x = Ops::dot::round_to_int(v);
      x = x < splati(-127) ? splati(-127) : x;
      x = x > splati(127) ? splati(127) : x;
      const vi q8 = live & x;
      sum += q8;
      for (std::int64_t g = 0; g < st.nrp; ++g) reinterpret_cast<std::int8_t*>(st.qr)[g * 2 * Dp + d] = std::int8_t(q8[g]);
    }
    store_q_scales(scale, post, &sum);
  }

  float elem_f32(const char* base, std::int64_t i) const {
    return b16 ? bf16_scalar(reinterpret_cast<const std::uint16_t*>(base) + i) : reinterpret_cast<const float*>(base)[i];
  }
  // Element offset of row j (row stride sn, page stride ps): dense, or through the block table.
  __attribute__((always_inline)) std::int64_t row_off(std::int64_t j, std::int64_t sn, std::int64_t ps) const {
    if (!pages) return j * sn;
    if (pshift >= 0) return pages[j >> pshift] * ps + (j & (psz - 1)) * sn;
    return pages[j / psz] * ps + j % psz * sn;
  }

  std::int64_t page_of(std::int64_t j) const { return pshift >= 0 ? j >> pshift : j / psz; }

  bool done() const { return next >= kr.kmax; }

  // Blocked keys: element offset of the block of 16 keys holding key j, and of key j's element d.
  __attribute__((always_inline)) std::int64_t kblock_off(std::int64_t j) const {
    if (!pages) return (j >> 4) * lb.ksn;
    if (pshift >= 0) return pages[j >> pshift] * lb.kps + ((j & (psz - 1)) >> 4) * lb.ksn;
    return pages[j / psz] * lb.kps + (j % psz >> 4) * lb.ksn;
  }
  std::int64_t kblocked_off(std::int64_t j, std::int64_t d) const {
    return kblock_off(j) + (d >> 2) * 64 + (j & 15) * 4 + (d & 3);
  }

  // w = p·scale_v of the row group (mixed layout) → int16 pairs in pw and per row a
  // power-of-two scale in st.wsc: |w·f| < 2^15, rounded to nearest even and saturated to int16,
  // f = 2^(14−E) for the row's largest |w| in [2^E, 2^(E+1)) (|w| < 2^-112: f = 2^126, such weights round to 0
  // beside any larger one of the cache's scale). A row with a non-finite w gets a NaN scale, so
  // its output is NaN as in the float paths (the front recomputes such rows).
  void quantise_weights(const vf* w, std::uint32_t* pw) const {
    vf mx = vf{}, z = vf{};
#pragma GCC unroll 4
    for (int kg = 0; kg < RG; ++kg) {
      mx = vmax(mx, (vf)((vi)w[kg] & splati(0x7fffffff)));
      z += w[kg] * 0.0f;  // NaN where w is NaN or ±inf
    }
    mx = group_max<KG / 2>(mx);
    z = group_sum<KG / 2>(z);
    vi E = ((vi)mx >> 23) & splati(0xff);
    E = E < splati(15) ? splati(15) : E;
    const vf f = (vf)((splati(268) - E) << 23), deq = (vf)((E - splati(14)) << 23) + z;
#pragma GCC unroll 4
    for (int kg = 0; kg < RG; ++kg) {
      if constexpr (requires { Ops::dot::round_to_words_i16(vf{}, pw); }) {
        Ops::dot::round_to_words_i16(w[kg] * f, pw + kg * W / 2);  // the same integers, two instructions
      } else {
        vi iw = __builtin_convertvector(round_nearest(w[kg] * f), vi);
        iw = iw < splati(-32768) ? splati(-32768) : iw;
        iw = iw > splati(32767) ? splati(32767) : iw;
        store_lane_pairs_i16(pw + kg * W / 2, iw);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) st.wsc[r] = deq[r * KG];
  }

  // B8: w = p·scale_v of the row group (mixed layout) → unsigned bytes in pw (lane order) and
  // per row the scale st.wsc = m / 255 for the row's largest w, m (at least 2^-112): u8 =
  // round(w·255 / m), at most 1/510 of m from w·255 / m. Negative weights (a negative value
  // scale, written by hand) go to pwn the same way, with the scale negated in wscn: the block's
  // P·V then runs a second time on them; the result says whether any row has one. A row with a
  // non-finite w gets a NaN scale, as in quantise_weights.
  bool quantise_weights8(const vf* w, std::uint8_t* pw, std::uint8_t* pwn, float* wscn) const {
    vf mx = vf{}, mn = vf{}, z = vf{};
#pragma GCC unroll 4
    for (int kg = 0; kg < RG; ++kg) {
      mx = vmax(mx, w[kg]);
      mn = vmax(mn, -w[kg]);
      z += w[kg] * 0.0f;  // NaN where w is NaN or ±inf
    }
    mx = group_max<KG / 2>(mx);
    mn = group_max<KG / 2>(mn);
    z = group_sum<KG / 2>(z);
    const bool neg = any_lane((vi)(mn > vf{}));
    const vf lim = splat(0x1p-112f);
    const vf mc = vmax(mx, lim), f = splat(255.0f) / mc, deq = mc / splat(255.0f) + z;
#pragma GCC unroll 4
    for (int kg = 0; kg < RG; ++kg) Ops::dot::round_to_bytes_u8(vmax(w[kg], vf{}) * f, pw + kg * W);
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) st.wsc[r] = deq[r * KG];
    if (neg) {
      const vf nc = vmax(mn, lim), fn = splat(255.0f) / nc, deqn = z - nc / splat(255.0f);
#pragma GCC unroll 4
      for (int kg = 0; kg < RG; ++kg) Ops::dot::round_to_bytes_u8(vmax(-w[kg], vf{}) * fn, pwn + kg * W);
#pragma GCC unroll 4
      for (int r = 0; r < RG; ++r) wscn[r] = deqn[r * KG];
    }
    return neg;
  }

  // W rows of a block as the products read them (keys or values): the first row and the row
  // stride, the rows to prefetch into L2 (pf_keys ahead) and the distance to the next block's
  // rows (near prefetch; 0 for none).
  struct block_rows {
    const T* rows;
    std::int64_t stride;
    const T* pf;
    std::ptrdiff_t nd;
  };
  struct key_block : block_rows {
    vf ksm[RG];  // int8: the keys' scales in the mixed layout
  };
  // Whether the W rows from key j are one strided run (in one page).
  bool one_run(std::int64_t j) const { return !pages || (whole_blocks && j % W == 0) || j % psz + W <= psz; }
  // The int8 scales of keys [j, j + W) (nb of them real, the rest 0) from sc0 (row stride ss,
  // page stride sps), spread into the mixed layout.
  void block_scales(const float* sc0, std::int64_t ss, std::int64_t sps, std::int64_t j, std::int64_t nb, vf* out) const {
    alignas(64) float buf[W];
    vf v;
    // The scales pf_keys ahead into L2 where they lie in another page (the rows are prefetched
    // there too; the hardware prefetchers do not follow a block table, and a page's scales are
    // too few lines for them to start on: every block's scales would wait on DRAM). Within a page
    // they leave it to the hardware (dense: 1 % slower with it, measured).
    if (pages) {
      const std::int64_t jp = j + pf_keys;
      if (jp + W <= kr.kmax && one_run(jp) && page_of(jp) != page_of(j)) {
        const float* sp = sc0 + row_off(jp, ss, sps);
        for (std::int64_t e = 0; e <= (W - 1) * ss; e += 16) prefetch_l2(sp + e);  // the lines of its W scales
      }
    }
    if (nb == W && one_run(j)) {  // the block's scales are one strided run too: one vector where contiguous
      const float* sq = sc0 + row_off(j, ss, sps);
      if (ss == 1) {
        v = load(sq);
      } else {
#pragma GCC unroll 16
        for (int x = 0; x < W; ++x) buf[x] = sq[x * ss];
        v = load(buf);
      }
    } else {
      for (std::int64_t x = 0; x < W; ++x) buf[x] = x < nb ? sc0[row_off(j + x, ss, sps)] : 0.0f;
      v = load(buf);
    }
    spread_all<RG>(v, out, std::make_integer_sequence<int, RG>{});
  }

  // The rows of the block at j0 of one side (base; row stride sn; width elements a row in the
  // padded copy pad): in place at off(j0) where the block is one strided run and `aligned`, else
  // (a short last block, an odd shape, a page boundary, copy_all) copied by copy(pad, nb). The
  // software prefetch reads the rows pf_keys ahead, one line per line read (spread through the
  // block: issued in a burst, they stall), or the block itself; the near prefetch the next block,
  // line by line into L1 as this one is read, where it is whole and one run.
  template <class Off, class Copy>
  __attribute__((always_inline)) block_rows rows_at(std::int64_t j0, bool aligned, const char* base, std::int64_t sn,
                                                    std::int64_t width, const Off& off, T* pad, const Copy& copy) const {
    const std::int64_t nb = imin(W, kr.kmax - j0);
    if (copy_all || nb < W || !one_run(j0) || !aligned) {
      copy(pad, nb);
      return {pad, width, pad, 0};
    }
    const std::int64_t o0 = off(j0), jp = j0 + pf_keys, jn = j0 + W;
    const T* rows = reinterpret_cast<const T*>(base + o0 * esize);
    const T* pf = jp + W <= kr.kmax && one_run(jp) ? reinterpret_cast<const T*>(base + off(jp) * esize) : rows;
    const bool nx = near_prefetch && jn + W <= kr.kmax && one_run(jn);
    return {rows, sn, pf, nx ? (off(jn) - o0) * esize : 0};
  }
  // The zero-padded copy of the W rows from j0 (nb of them real) of a row layout, [W][width].
  void copy_rows(T* pad, const char* base, std::int64_t sn, std::int64_t ps, std::int64_t width, std::int64_t n,
                 std::int64_t j0, std::int64_t nb) const {
    for (std::int64_t x = 0; x < W; ++x) {
      const char* r0 = base + row_off(j0 + imin(x, nb - 1), sn, ps) * esize;
      for (std::int64_t d = 0; d < width; ++d) {
        if constexpr (__is_same(T, float)) pad[x * width + d] = x < nb && d < n ? elem_f32(r0, d) : 0.0f;
        else pad[x * width + d] = x < nb && d < n ? reinterpret_cast<const T*>(r0)[d] : T(0);
      }
    }
  }

  void key_side(std::int64_t j0, key_block& b) const {
    // blocked keys: read in place where the block is one of the layout's blocks of 16 (KB: W = 16;
    // the blocks pf_keys and W ahead then are too)
    const bool aligned = !lb.kblocked || (KB && j0 % 16 == 0);
    const auto koff = [&](std::int64_t j) { return KB ? kblock_off(j) : row_off(j, lb.ksn, lb.kps); };
    const auto copy = [&](T* kp, std::int64_t nb) __attribute__((noinline)) {
      if constexpr (q8) {
        if (lb.kblocked) {  // blocked keys: copied blocked (KB) or as rows (every other path)
          for (std::int64_t x = 0; x < W; ++x)
            for (std::int64_t d = 0; d < Dp; ++d) {
              const T e = x < nb && d < lb.D ? reinterpret_cast<const T*>(kbase)[kblocked_off(j0 + x, d)] : T(0);
              kp[KB ? (d >> 2) * 64 + x * 4 + (d & 3) : x * Dp + d] = e;
            }
          return;
        }
      }
      copy_rows(kp, kbase, lb.ksn, lb.kps, Dp, lb.D, j0, nb);
    };
    static_cast<block_rows&>(b) = rows_at(j0, aligned, kbase, lb.ksn, Dp, koff, reinterpret_cast<T*>(st.kpad), copy);
    if constexpr (q8) block_scales(lb.kscale, lb.kss, lb.ksps, j0, imin(W, kr.kmax - j0), b.ksm);
  }

  void score_chunked(std::int64_t g, const key_block& b, vf* s, bool first) const {
    if constexpr (kChunkable) {
      const auto* qa = reinterpret_cast<const std::uint32_t*>(qwords + g * RG * qs);
      const auto* pf = first ? b.pf : b.rows;
      const std::ptrdiff_t nd = first ? b.nd : 0;
      if (nu == 4) decode_scores_chunked<4, typename Ops::dot>(qa, b.rows, b.stride, s, pf, nd);
      else if (nu == 3) decode_scores_chunked<3, typename Ops::dot>(qa, b.rows, b.stride, s, pf, nd);
      else if (nu == 2) decode_scores_chunked<2, typename Ops::dot>(qa, b.rows, b.stride, s, pf, nd);
      else decode_scores_chunked<1, typename Ops::dot>(qa, b.rows, b.stride, s, pf, nd);
    }
  }

  // The scores of row group g over the key block b, scaled (int8), into st.snext.
  void score(std::int64_t g, const key_block& b) {
    vf s[RG];
    const bool first = g == 0;  // later row groups read the block from L1
    if constexpr (B8 && KB)
      decode_scores_blocked8<RG, typename Ops::dot>(qwords + g * RG * qs, qs, st.qcorr + g * RG, Dp / 4, b.rows, s,
                                                    first ? b.pf : b.rows, first ? b.nd : 0);
    else if constexpr (KB)
      decode_scores_blocked<RG, typename Ops::dot>(qwords + g * RG * qs, qs, st.qcorr + g * RG, Dp / 4, b.rows, s,
                                                   first ? b.pf : b.rows, first ? b.nd : 0);
    else if (kChunkable && chunked)
      score_chunked(g, b, s, first);
    else
      decode_scores<RG, Ops>(qwords + g * RG * qs, qs, nu, b.rows, b.stride, s, first ? b.pf : b.rows, first ? b.nd : 0);
    if constexpr (i16) {
      const vf qsm = load(st.qsc + g * W);
#pragma GCC unroll 4
      for (int kg = 0; kg < RG; ++kg) s[kg] = s[kg] * qsm * b.ksm[kg];
      if (q_tiny) {  // the rows below 2^-100: their 2^-64 last (quantise_q_rows)
        const vf post = load(st.qpost + g * W);
#pragma GCC unroll 4
        for (int kg = 0; kg < RG; ++kg) s[kg] *= post;
      }
    } else if constexpr (q8) {
#pragma GCC unroll 4
      for (int kg = 0; kg < RG; ++kg) s[kg] *= b.ksm[kg];
    }
#pragma GCC unroll 4
    for (int kg = 0; kg < RG; ++kg) store(st.snext + (g * RG + kg) * W, s[kg]);
  }

  // Finishes the block whose scores are in snext and computes the next block's scores, software
  // pipelined: per row group, the softmax (and the int16 weights) of this block, then the q·k
  // dots of the next block — independent of them, so that the core overlaps the softmax's chain
  // of latencies with the dots — then this block's P·V. The first call scores its block first.
  void step() {
    if (!primed) {
      key_block b;
      key_side(next, b);
      for (std::int64_t g = 0; g < st.ng; ++g) score(g, b);
      primed = true;
    }
    // int8: the scales of the block's values, as vectors in the mixed layout.
    alignas(64) std::uint32_t pw[RG * W / 2];  // bf16 / int16 P·V: p in pairs
    alignas(64) std::uint8_t pw8[B8 ? RG * W : 1], pw8n[B8 ? RG * W : 1];  // B8: the weights' bytes
    float wscn[RG];
    vf vsm[RG];
    const std::int64_t j0 = next;
    next += W;
    const std::int64_t nb = imin(W, kr.kmax - j0);
    // the values: rows in place or the padded copy, as the keys
    const auto voff = [&](std::int64_t j) { return row_off(j, lb.vsn, lb.vps); };
    const auto vcopy = [&](T* vp, std::int64_t n) __attribute__((noinline)) {
      copy_rows(vp, vbase, lb.vsn, lb.vps, Dvp, lb.Dv, j0, n);
    };
    const auto [vb, vs, vpf, vd] = rows_at(j0, true, vbase, lb.vsn, Dvp, voff, reinterpret_cast<T*>(st.vpad), vcopy);
    if constexpr (q8) block_scales(lb.vscale, lb.vss, lb.vsps, j0, nb, vsm);
    // This block's score constants: a mask block of zeros (a boolean mask's block where every
    // row attends to every key — all but a few blocks of a tree of draft tokens) is no mask.
    score_consts scb = sc;
    if (sc.bias) {
      if (lb.sp.bias(lb.sp.bias_ctx, j0, nb, st.bias, W, 1) == mask_tile_kind::zeros) {
        scb.drop_bias();
      } else {
        for (std::int64_t g = 0; g < st.nrp; ++g)
          for (std::int64_t x = 0; x < W; ++x)
            st.biasm[g / RG * RG * W + x / KG * W + g % RG * KG + x % KG] = g < L && x < nb ? st.bias[g * W + x] : 0.0f;
      }
    }
    const bool more = !done();
    key_block kn;
    if (more) key_side(next, kn);
    else static_cast<block_rows&>(kn) = {nullptr, 0, nullptr, 0};  // not read: score() runs only with more
    for (std::int64_t g = 0; g < st.ng; ++g) {
      const bool first = g == 0;  // later row groups read the block from L1
      vf s[RG];
#pragma GCC unroll 4
      for (int kg = 0; kg < RG; ++kg) s[kg] = load(st.snext + (g * RG + kg) * W);
      const bool ranged = nb < W || j0 < lo_max || j0 + W > hi_min;
      if constexpr (KB) decode_softmax_inlined<RG>(st, scb, g, s, j0, nb, ranged);
      else decode_softmax<RG>(st, scb, g, s, j0, nb, ranged);
      if constexpr (q8)  // p·scale_v weighs the int8 value rows; l sums p itself
#pragma GCC unroll 4
        for (int kg = 0; kg < RG; ++kg) s[kg] *= vsm[kg];
      [[maybe_unused]] bool neg = false;
      if constexpr (B8) {
        neg = quantise_weights8(s, pw8, pw8n, wscn);
      } else if constexpr (i16) {
        quantise_weights(s, pw);
      } else if constexpr (P == 2 && KG % 2 == 0) {
#pragma GCC unroll 4
        for (int kg = 0; kg < RG; ++kg) store_lane_pairs(pw + kg * W / 2, s[kg]);
      } else {
#pragma GCC unroll 4
        for (int kg = 0; kg < RG; ++kg) store(st.pb + kg * W, s[kg]);
      }
      if (more) score(g, kn);
      float* o = st.orow + g * RG * Dvp;
      std::int64_t c0 = 0;
      const T* vq0 = first ? vpf : vb;
      const std::ptrdiff_t vn = first ? vd : 0;
      if constexpr (B8) {  // nv is a multiple of 4 (Dv of whole units), CB is 4 or 8
        using D8 = typename Ops::dot;
        for (; c0 + CB <= nv; c0 += CB) decode_pv_u8<RG, CB, D8>(o, Dvp, pw8, st.alpha, st.wsc, vb, vs, c0, vq0, vn);
        if (nv - c0 == 4) decode_pv_u8<RG, 4, D8>(o, Dvp, pw8, st.alpha, st.wsc, vb, vs, c0, vq0, vn);
        if (neg) {  // the negative weights: the rows again (from L1), α already applied
          for (c0 = 0; c0 + CB <= nv; c0 += CB) decode_pv_u8<RG, CB, D8>(o, Dvp, pw8n, nullptr, wscn, vb, vs, c0, vb, 0);
          if (nv - c0 == 4) decode_pv_u8<RG, 4, D8>(o, Dvp, pw8n, nullptr, wscn, vb, vs, c0, vb, 0);
        }
      } else if constexpr (i16) {  // nv is a multiple of 4 (Dv of whole units), CB is 4 or 8
        for (; c0 + CB <= nv; c0 += CB) decode_pv_int16<RG, CB, typename Ops::dot>(o, Dvp, pw, st.alpha, st.wsc, vb, vs, c0, vq0, vn);
        if (nv - c0 == 4) decode_pv_int16<RG, 4, typename Ops::dot>(o, Dvp, pw, st.alpha, st.wsc, vb, vs, c0, vq0, vn);
      } else if constexpr (P == 2 && KG % 2 == 0) {  // bf16 P·V: p in pairs of keys (nv is even: Dv is a multiple of 2W)
        for (; c0 + CB <= nv; c0 += CB) decode_pv_pairs<RG, CB, Ops>(o, Dvp, pw, st.alpha, vb, vs, c0, vq0, vn);
        if constexpr (U == 2) {  // nv is a multiple of U
          if (nv - c0 == 2) decode_pv_pairs<RG, 2, Ops>(o, Dvp, pw, st.alpha, vb, vs, c0, vq0, vn);
          if (nv - c0 == 6) decode_pv_pairs<RG, 6, Ops>(o, Dvp, pw, st.alpha, vb, vs, c0, vq0, vn);
        }
        if (nv - c0 == 4) decode_pv_pairs<RG, 4, Ops>(o, Dvp, pw, st.alpha, vb, vs, c0, vq0, vn);
      } else {
        for (; c0 + CB <= nv; c0 += CB) decode_pv<RG, CB>(o, Dvp, st.pb, st.alpha, vb, vs, c0, vq0, vn);
        if (c0 < nv) decode_pv_tail<RG, CB - 1>(int(nv - c0), o, Dvp, st.pb, st.alpha, vb, vs, c0, vq0, vn);
      }
    }
  }

  // Where the accumulators' order keeps every d of a unit of 2W values within its two vectors
  // (memory order, bf16's native order, decode_pv_int16's), output vector k ∈ {0, 1} of a unit
  // is one two-source shuffle of them.
  static constexpr bool pv_units_of_two = pv_position(2 * W - 1) < 2 * W && (U <= 2 || i16 || pv_memory_order);
  template <int K, int... J>
  static vf pv_in_order(vf v0, vf v1, std::integer_sequence<int, J...>) {
    return shuffle2<int(pv_position(K * W + J))...>(v0, v1);
  }

  // m and l of every row, and oᵀ [Dv][L]: each row's accumulators put in the order of d (a
  // shuffle per vector) and W rows of W values turned by a register transpose (L = W); or, where
  // the caller asks for rows (io.rows), row g at io.ot + g·Dv, in the order of d.
  void finish() const {
    for (std::int64_t g = 0; g < nr; ++g) {
      const std::int64_t x0 = g / RG * W + g % RG * KG;
      float l = 0.0f;
      for (int x = 0; x < KG; ++x) l += st.lacc[x0 + x];
      io.l[g] = l;
      io.m[g] = st.mvec[x0] * kLn2;
    }
    if (io.rows) {
      for (std::int64_t g = 0; g < nr; ++g) {
        const float* o = st.orow + g * Dvp;
        float* row = io.ot + g * lb.Dv;
        std::int64_t d0 = 0;
        if constexpr (pv_units_of_two)
          for (; d0 + 2 * W <= lb.Dv; d0 += 2 * W) {
            const vf v0 = load(o + d0), v1 = load(o + d0 + W);
            store(row + d0, pv_in_order<0>(v0, v1, std::make_integer_sequence<int, W>{}));
            store(row + d0 + W, pv_in_order<1>(v0, v1, std::make_integer_sequence<int, W>{}));
          }
        for (; d0 < lb.Dv; ++d0) row[d0] = o[pv_position(d0)];
      }
      return;
    }
    if constexpr (pv_units_of_two) {
      if (L == W) {
        for (std::int64_t d0 = 0; d0 < lb.Dv; d0 += W) {
          const std::int64_t u0 = d0 / (2 * W) * (2 * W);
          const bool second = d0 - u0 == W;
          vf blk[W];
#pragma GCC unroll 16
          for (int g = 0; g < W; ++g) {
            if (g >= nr) {
              blk[g] = vf{};
            } else if (pv_position(W) == W && pv_position(1) == 1) {  // memory order: the vector itself
              blk[g] = load(st.orow + g * Dvp + d0);
            } else {
              const vf v0 = load(st.orow + g * Dvp + u0), v1 = load(st.orow + g * Dvp + u0 + W);
              blk[g] = second ? pv_in_order<1>(v0, v1, std::make_integer_sequence<int, W>{})
                              : pv_in_order<0>(v0, v1, std::make_integer_sequence<int, W>{});
            }
          }
          transpose(blk);
          for (std::int64_t j = 0; j < imin(W, lb.Dv - d0); ++j) store(io.ot + (d0 + j) * L, blk[j]);
        }
        return;
      }
    }
    for (std::int64_t g = 0; g < nr; ++g)
      for (std::int64_t d = 0; d < lb.Dv; ++d) io.ot[d * L + g] = st.orow[g * Dvp + pv_position(d)];
  }
};

// The lane blocks lbs[0, n) (every one of the same shape and storage) to their ends: one at a
// time (n = 1), or interleaved block by block. near: decode_run's.
template <int RG, class Ops, class T, bool KB = false, bool B8 = false>
void decode_rows(const lane_block* lbs, const forward_io* ios, int n, bool copy_all, bool near) {
  if (n == 1) {
    decode_run<RG, Ops, T, KB, B8> r(lbs[0], ios[0], copy_all, 1, near);
    while (!r.done()) r.step();
    return r.finish();
  }
  std::vector<decode_run<RG, Ops, T, KB, B8>> rs;
  rs.reserve(std::size_t(n));
  for (int h = 0; h < n; ++h) rs.emplace_back(lbs[h], ios[h], copy_all, n, near);
  for (bool more = true; more;) {
    more = false;
    for (auto& r : rs)
      if (!r.done()) r.step(), more = more || !r.done();
  }
  for (const auto& r : rs) r.finish();
}

// Whether the int8 rows of lbs[0, n) take int16 q and weights (int16_pair_operands): what the
// driver can tell from the shape (int8_decode_int16, kernels.h), and q finite (a NaN or ±inf in
// q keeps the float path, which propagates it).
template <class Dot>
bool int8_as_int16(const lane_block* lbs, int n) {
  if constexpr (!Dot::int16) {
    return false;
  } else {
    if (!int8_decode_int16(Dot::int16, lbs[0].int8_rounding, W, lbs[0].D, lbs[0].Dv)) return false;
    for (int h = 0; h < n; ++h) {
      const lane_block& lb = lbs[h];
      // qᵀ [D][L] a vector of rows at a time: z turns NaN where q is NaN or ±inf (the lanes
      // past nl, not rows, are left out)
      for (std::int64_t x = 0; x < lb.nl; x += W) {
        vf z = vf{};
        for (std::int64_t d = 0; d < lb.D; ++d) z += load(lb.qt + d * lb.L + x) * 0.0f;
        if (any_lane((iota() < splati(std::int32_t(lb.nl - x))) & (vi)(z != z))) return false;
      }
    }
    return true;
  }
}

// Whether decode multiplies bf16 rows by the ISA's bf16 dot product (bf16 pairs) — where it has
// one, unless Dot says bf16_decode = false (the amx level: its vdpbf16ps runs at half the f32
// FMA rate, and decode takes the rows widened to f32).
template <class Dot>
constexpr bool bf16_pairs_in_decode() {
  if constexpr (requires { Dot::bf16_decode; }) return Dot::available && Dot::bf16_decode;
  else return Dot::available;
}

// Whether decode prefetches the next block of K/V rows into L1 as it reads one (prefetch_next,
// beside the L2 prefetch kDecodePrefetchBytes ahead): only where Dot says decode_near_prefetch
// (the amx level). Measured, Hq 32 / Hkv 8, D 128, Nk 131072, dense bf16, 2 threads: on the AMX
// Xeon (rows widened to f32) 25.5 → 23.6 ms; on Zen 4 (bf16 pairs) it went the other way, 8
// alternating rounds each, medians 19.9 ms without against 21.7 ms with.
template <class Dot>
constexpr bool near_prefetch_in_decode() {
  if constexpr (requires { Dot::decode_near_prefetch; }) return Dot::decode_near_prefetch;
  else return false;
}

// Dot: the ISA's bf16 dot product (no_bf16_dot where there is none).
template <int RG, class Dot>
void decode_group(const lane_block* lbs, const forward_io* ios, int n) {
  const lane_block& lb = lbs[0];
  constexpr bool near = near_prefetch_in_decode<Dot>();
  if (lb.k8) {
    const bool units = lb.D % (4 * W) == 0 && lb.Dv % (4 * W) == 0;
    // Blocked keys are read in place by the blocked q·k (W = 16: the layout's blocks); every other
    // path reads them through the padded copy, as rows.
    if constexpr (Dot::int16 && (W / RG) % 2 == 0)  // keys in pairs within a row's lanes
      if (int8_as_int16<Dot>(lbs, n)) {
        if constexpr (W == 16) {
          if (lb.kblocked)
            return lb.int8_bytes
                       ? decode_rows<RG, int16_pair_operands<Dot>, std::int8_t, true, true>(lbs, ios, n, false, near)
                       : decode_rows<RG, int16_pair_operands<Dot>, std::int8_t, true>(lbs, ios, n, false, near);
          if (lb.int8_bytes)  // rows: q·k on int16 pairs, P·V on 8-bit weights
            return decode_rows<RG, int16_pair_operands<Dot>, std::int8_t, false, true>(lbs, ios, n, false, near);
        }
        return decode_rows<RG, int16_pair_operands<Dot>, std::int8_t>(lbs, ios, n, lb.kblocked, near);
      }
    if constexpr (bf16_pairs_in_decode<Dot>())  // (not where vdpbf16ps is slower than widening: Intel)
      if (lb.q_bf16 && lb.int8_rounding && units)
        return decode_rows<RG, bf16_pair_operands<Dot>, std::int8_t>(lbs, ios, n, lb.kblocked, near);
    return decode_rows<RG, f32_operands, std::int8_t>(lbs, ios, n, !units || lb.kblocked, near);
  }
  const bool b16 = lb.k16 != nullptr;
  if (b16 && lb.D % (2 * W) == 0 && lb.Dv % (2 * W) == 0) {
    if constexpr (bf16_pairs_in_decode<Dot>())
      if (lb.q_bf16) return decode_rows<RG, bf16_pair_operands<Dot>, std::uint16_t>(lbs, ios, n, false, near);
    return decode_rows<RG, f32_operands, std::uint16_t>(lbs, ios, n, false, near);
  }
  decode_rows<RG, f32_operands, float>(lbs, ios, n, b16 || lb.D % W != 0 || lb.Dv % W != 0, near);
}

// n lane blocks of one shape (rows, storage, head size): decode_rows.
template <class Dot>
void decode_forward(const lane_block* lbs, const forward_io* ios, int n) {
  if (lbs[0].nl >= 3) return decode_group<4, Dot>(lbs, ios, n);
  if (lbs[0].nl == 2) return decode_group<2, Dot>(lbs, ios, n);
  decode_group<1, Dot>(lbs, ios, n);
}

}  // namespace
}  // namespace attn::detail::cpu

// src/cpu/amx.h — bf16 prefill on AMX tiles, the forward and the backward (the amx level of isa.cc: a CPU with
// AMX-TILE and AMX-BF16 whose OS grants the tile state to the process). The lane-layout forward
// of prefill.h with its two products on tiles instead of vdpbf16ps register tiles: blocks of
// kAmxKeyBlock keys, the same mask fill, block skipping and online softmax
// (softmax_block, which rounds P to bf16 in key pairs), only the products differ —
//   Sᵀ [keys][L]  = K · Qᵀ   A: key rows as words (bf16 pairs along d), B: the lane words of q
//   Oᵀ [Dv][L]   += Vᵀ · P   A: Vᵀ as words (pairs of keys along each d), B: P in key pairs
// by tdpbf16ps: C[16][16] f32 += A[16 rows][16 words] · B[16 words][16 columns], 512 bf16
// products summed per element per instruction (the products are exact, the sums f32; the tile
// unit flushes bf16 denormals to zero, which no attention score or weight notices).
//
// Shapes the tiles take (the driver's plan_forward asks for nothing else): D a multiple of 32
// (whole tiles of 16 words along d), Dv a multiple of 16, L = 64 lanes. Blocks of keys are
// computed 32 at a time: the driver pads the packed keys and values with 32 zero keys past Nk, and
// the P rows past a short block are zeroed here, so that a padded key weighs exactly 0 (a
// non-finite V past the lanes' key range reaches a row as NaN, which the front recomputes, as it
// does for the vdpbf16ps kernels' pair key).
//
// Included by kernels_avx512bf16.cc after kernel_body.h (its flags add -mamx-tile -mamx-bf16; the
// tile products themselves are amx_gemm.h's, which the family's AMX forward shares).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/amx_gemm.h"
#include "cpu/kernels.h"
#include "cpu/prefill.h"

namespace attn::detail::cpu {
namespace {

// Keys per block of the AMX forward: twice the vdpbf16ps kernels' (each block loads and stores Oᵀ
// once on the tiles). Measured again once the packs were cache-line aligned, B1 H8 N4096 D128:
// 1 thread 92.6 ms against 97.6 with 128 keys and 92.7 with 512; 2 threads 47.5, 49.3, 46.6.
// (Running the softmax of block b in slices between the tile steps of block b+1's Sᵀ, so that
// the vector units work while the tiles multiply, was slower: 93-107 ms against 87-90; the two
// S blocks, K and P do not fit L1, and the softmax's loads queue behind the tile loads.)
// S, the mask tile and P of a block fit the lane scratch.
inline constexpr std::int64_t kAmxKeyBlock = 256;

// The forward of one lane block (lb.L = C·W lanes) from bf16_operands with in.vt set: keys
// in.k [Nk + pad][ldk], Vᵀ in.vt [Dv][ldvt] words. Scratch (forward_bf16's): S and the mask tile
// [kAmxKeyBlock][L], α [L], P in key pairs [kAmxKeyBlock / 2][L].
template <class Dot>
void forward_amx(const lane_block& lb, const bf16_operands& in, const forward_io& io) {
  using Ops = bf16_pair_operands<Dot>;
  constexpr std::int64_t L = C * W;
  static_assert(L % 32 == 0 && kAmxKeyBlock % 32 == 0);
  constexpr std::int64_t KB = kAmxKeyBlock;
  static_assert(2 * KB * L + L + KB / 2 * L <= lane_scratch_floats(L, 0, 0) + bf16_scratch_floats(L),
                "the lane scratch holds S, the mask tile, α and P of a key block");
  float* S = lb.scratch;
  float* bias = S + KB * L;
  float* alpha = bias + KB * L;
  auto* packed = reinterpret_cast<std::uint32_t*>(alpha + L);
  const auto* kw = reinterpret_cast<const std::uint32_t*>(in.k);
  const std::int64_t ldk = in.ldk / 2;
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  // Keys below `split` are inside every lane's range but for lo (the first lane's hi, causal or a
  // right window, rounded down to 32): a block ends there, so that only the blocks from there
  // on take the transform's per-lane range (a causal diagonal: 64 + 31 keys, not up to 256).
  const std::int64_t split = imin(kr.kmax, kr.hmin) / 32 * 32;
  amx_configure();
  bool speculate = true;  // softmax_block's
  // Blocks start on a multiple of 32 keys, so that each row of a Vᵀ tile starts on a cache line
  // (the keys before kmin are outside every lane's range: the transform excludes them).
  for (std::int64_t j0 = kr.kmin / 32 * 32, j1; j0 < kr.kmax; j0 = j1) {
    j1 = imin(j0 + KB, kr.kmax);
    if (j0 < split && split < j1) j1 = split;
    const std::int64_t nb = round_up<2>(j1 - j0), nt = round_up<32>(nb);
    const mask_tile_kind mk = sc.bias ? lb.sp.bias(lb.sp.bias_ctx, j0, nb, bias, 1, L) : mask_tile_kind::zeros;
    if (mk == mask_tile_kind::excluded && lb.sp.skip_excluded) continue;
    amx_gemm(nt, L, lb.D / 2, kw + j0 * ldk, ldk, in.qp, L, S, L, false);
    const std::uint32_t* pw = softmax_block<Ops, C>(lb, io, sc, S, bias, mk, alpha, j0, nb, packed, speculate);
    for (std::int64_t i = nb / 2 * L; i < nt / 2 * L; i += W) storeu(packed + i, vu{});
    amx_gemm(lb.Dv, L, nt / 2, in.vt + j0 / 2, in.ldvt, pw, L, io.ot, L, true);
  }
  _tile_release();
}

// The backward's dq pass (prefill.h, dq_lanes) with its three products on the tiles: Sᵀ = K·Qᵀ,
// dPᵀ = V·dOᵀ, dqᵀ += Kᵀ·dS. in: key and value rows padded with 32 zero keys (as the forward's),
// the lane words of q and dout, and Kᵀ in key pairs (kt [D][ldkt]). Scratch as dq_bf16's.
template <class Dot>
void dq_amx(const lane_block& lb, const bf16_dq_operands& in, const dq_io& io) {
  using Ops = bf16_pair_operands<Dot>;
  constexpr std::int64_t L = C * W;
  float* S = lb.scratch;
  float* bias = S + kLaneKeyBlock * L;
  float* dP = bias + kLaneKeyBlock * L;
  std::uint32_t* packed = lane_packed(lb);
  for (std::int64_t i = 0; i < lb.D * L; ++i) io.dqt[i] = 0.0f;
  const auto* kw = reinterpret_cast<const std::uint32_t*>(in.k);
  const auto* vw = reinterpret_cast<const std::uint32_t*>(in.v);
  const std::int64_t ldk = lb.D / 2, ldv = lb.Dv / 2;
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  amx_configure();
  for (std::int64_t j0 = kr.kmin / 32 * 32; j0 < kr.kmax; j0 += kLaneKeyBlock) {  // as forward_amx's
    const std::int64_t nb = round_up<2>(imin(kLaneKeyBlock, kr.kmax - j0)), nt = round_up<32>(nb);
    const mask_tile_kind mk = sc.bias ? lb.sp.bias(lb.sp.bias_ctx, j0, nb, bias, 1, L) : mask_tile_kind::zeros;
    if (mk == mask_tile_kind::excluded && lb.sp.skip_excluded) continue;  // no row sees the block: ds = 0
    amx_gemm(nt, L, ldk, kw + j0 * ldk, ldk, in.qp, L, S, L, false);
    amx_gemm(nt, L, ldv, vw + j0 * ldv, ldv, in.dop, L, dP, L, false);
    dq_scores<C>(lb, io, sc, S, bias, mk, dP, j0, nb);
    Ops::pack_rows(S, nb, L, packed);
    for (std::int64_t i = nb / 2 * L; i < nt / 2 * L; i += W) storeu(packed + i, vu{});
    amx_gemm(lb.D, L, nt / 2, in.kt + j0 / 2, in.ldkt, packed, L, io.dqt, L, true);
  }
  _tile_release();
}

// C [M][N] (+)= A · B for any M: whole 16-row blocks on the tiles, the rest on the register
// tile's bf16 pairs (tile.h) — for a C whose rows past M belong to someone else (dq).
template <class Dot>
void amx_gemm_rows(std::int64_t M, std::int64_t N, std::int64_t K, const std::uint32_t* a, std::int64_t lda,
                   const std::uint32_t* b, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  const std::int64_t m16 = M / 16 * 16;
  if (m16) amx_gemm(m16, N, K, a, lda, b, ldb, c, ldc, accumulate);
  if (M > m16)
    gemm<bf16_pair_operands<Dot>>(M - m16, N, K, a + m16 * lda, lda, 1, b, ldb, c + m16 * ldc, ldc, accumulate);
}

// The backward's row-layout pass (prefill.h, dkdv_rows) with its products on the tiles: S = Q Kᵀ,
// dP = dO Vᵀ, dVᵀ += dOᵀ P, dKᵀ += Qᵀ dS, and in the fused schedule dQ += dS K. The driver gives what
// the tiles need (bf16_dkdv_operands): pr.ldk a multiple of 32 (the key block's columns past nb
// zero), q and dout rows readable 16 rows at a time (their packs padded with zero rows), Qᵀ and
// dOᵀ in pairs of rows (qt, dot: [D|Dv][ldt] words from the pair's first row) readable to
// round_up(nq, 32) rows, and krw [ld/2][ldq] (the dq product; ldq a multiple of 32).
// Scratch: S, dP, bias [16·⌈nq/16⌉][ld], then P and dS in row pairs [16][ld] each.
template <class Dot>
void dkdv_amx(const dkdv_pair& pr, const bf16_dkdv_operands& in) {
  using Ops = bf16_pair_operands<Dot>;
  const std::int64_t ld = pr.ldk, nq = pr.nq, nq16 = round_up<16>(nq), npw = round_up<32>(nq) / 2;
  float* S = pr.scratch;
  float* dP = S + nq16 * ld;
  float* bias = dP + nq16 * ld;
  auto* pw = reinterpret_cast<std::uint32_t*>(bias + nq16 * ld);
  std::uint32_t* dsw = pw + npw * ld;
  const score_consts sc(pr.sp);
  mask_tile_kind mk = mask_tile_kind::zeros;
  if (sc.bias) {
    mk = pr.sp.bias(pr.sp.bias_ctx, pr.j0, pr.nb, bias, ld, 1);
    if (mk == mask_tile_kind::excluded && pr.sp.skip_excluded) {  // no row sees the block: ds = 0
      if (pr.ds_out)
        for (std::int64_t i = 0; i < nq * ld; ++i) pr.ds_out[i] = 0.0f;
      return;
    }
    for (std::int64_t r = 0; r < nq; ++r)
      for (std::int64_t x = pr.nb; x < ld; ++x) bias[r * ld + x] = 0.0f;
  }
  amx_configure();
  const auto* q = reinterpret_cast<const std::uint32_t*>(in.q);
  const auto* dout = reinterpret_cast<const std::uint32_t*>(in.dout);
  amx_gemm(nq16, ld, pr.D / 2, q, pr.D / 2, in.ktp, ld, S, ld, false);
  amx_gemm(nq16, ld, pr.Dv / 2, dout, pr.Dv / 2, in.vtp, ld, dP, ld, false);
  dkdv_scores(pr, sc, S, dP, bias, mk);
  Ops::pack_rows(S, nq, ld, pw);
  Ops::pack_rows(dP, nq, ld, dsw);
  for (std::int64_t i = (nq + 1) / 2 * ld; i < npw * ld; i += W) storeu(pw + i, vu{}), storeu(dsw + i, vu{});
  amx_gemm(pr.Dv, ld, npw, in.dot, in.ldt, pw, ld, pr.dvt, ld, true);
  amx_gemm(pr.D, ld, npw, in.qt, in.ldt, dsw, ld, pr.dkt, ld, true);
  if (pr.dq) {  // dS in key pairs [nq][ld/2] (in bias's room, free now) · K by key pairs
    auto* dsk = reinterpret_cast<std::uint32_t*>(bias);
    for (std::int64_t i = 0; i < nq * ld; i += W) store_lane_pairs(dsk + i / 2, load(dP + i));
    amx_gemm_rows<Dot>(nq, pr.ldq, ld / 2, dsk, ld / 2, pr.krw, pr.ldq, pr.dq, pr.dqs, true);
  }
  _tile_release();
}

}  // namespace
}  // namespace attn::detail::cpu

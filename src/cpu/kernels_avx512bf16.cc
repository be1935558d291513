// src/cpu/kernels_avx512bf16.cc — the avx512 kernels plus a bf16 forward whose two matrix
// products use AVX512_BF16 dot products (vdpbf16ps: 32 bf16 products summed in pairs into 16
// fp32 accumulators). Scores, softmax and the output accumulate in fp32; the probabilities are
// rounded to bf16 (nearest even) for the P·V product, as FlashAttention does on GPUs.
#include <immintrin.h>

#define ATTN_CPU_DPBF16 1  // the decode kernel's q·k dots use vdpbf16ps (kernel_body.h)

namespace attn::detail::cpu {
namespace {
constexpr int W = 16;  // floats per vector
constexpr int C = 4;   // vectors per tile row
constexpr int R = 6;   // tile rows: R·C accumulators
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/kernel_body.h"

namespace attn::detail::cpu {
namespace {

// out[r][x..x+16) (+)= Σ_k dot2(a32[r·ars + k·aks], b32[k·bks + x..x+16)), a32/b32 = bf16 pairs.
template <int RR, int CC>
void tile_dp(std::int64_t K, const std::uint32_t* a, std::int64_t ars, std::int64_t aks, const std::uint32_t* b,
             std::int64_t bks, float* o, std::int64_t ors, bool accumulate) {
  __m512 acc[RR][CC];
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) acc[r][c] = accumulate ? _mm512_loadu_ps(o + r * ors + c * W) : _mm512_setzero_ps();
  for (std::int64_t k = 0; k < K; ++k) {
    __m512bh bv[CC];
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) bv[c] = (__m512bh)_mm512_loadu_si512(b + k * bks + c * W);
    const std::uint32_t* ak = a + k * aks;
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) {
      const __m512bh ar = (__m512bh)_mm512_set1_epi32(int(ak[r * ars]));
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], ar, bv[c]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) _mm512_storeu_ps(o + r * ors + c * W, acc[r][c]);
}

template <int RR, int CC = C>
void tile_dp_c(int cc, std::int64_t K, const std::uint32_t* a, std::int64_t ars, std::int64_t aks,
               const std::uint32_t* b, std::int64_t bks, float* o, std::int64_t ors, bool acc) {
  if constexpr (CC == 1) {
    tile_dp<RR, 1>(K, a, ars, aks, b, bks, o, ors, acc);
  } else {
    if (cc == CC) return tile_dp<RR, CC>(K, a, ars, aks, b, bks, o, ors, acc);
    tile_dp_c<RR, CC - 1>(cc, K, a, ars, aks, b, bks, o, ors, acc);
  }
}

template <int RR = R>
void tile_dp_rc(int rr, int cc, std::int64_t K, const std::uint32_t* a, std::int64_t ars, std::int64_t aks,
                const std::uint32_t* b, std::int64_t bks, float* o, std::int64_t ors, bool acc) {
  if constexpr (RR == 1) {
    tile_dp_c<1>(cc, K, a, ars, aks, b, bks, o, ors, acc);
  } else {
    if (rr == RR) return tile_dp_c<RR>(cc, K, a, ars, aks, b, bks, o, ors, acc);
    tile_dp_rc<RR - 1>(rr, cc, K, a, ars, aks, b, bks, o, ors, acc);
  }
}

// out [M][N] (+)= A·B over K pairs; A(r, k) = a[r·ars + k·aks], B(k, x) = b[k·bks + x] (32-bit words).
void gemm_dp(std::int64_t M, std::int64_t N, std::int64_t K, const std::uint32_t* a, std::int64_t ars,
             std::int64_t aks, const std::uint32_t* b, std::int64_t bks, float* o, std::int64_t ors, bool accumulate) {
  for (std::int64_t n0 = 0; n0 < N; n0 += C * W) {
    const int cc = int(imin(C, (N - n0) / W));
    for (std::int64_t m0 = 0; m0 < M; m0 += R) {
      const int rr = int(imin(R, M - m0));
      tile_dp_rc(rr, cc, K, a + m0 * ars, ars, aks, b + n0, bks, o + m0 * ors + n0, ors, accumulate);
    }
  }
}

// Finite floats → bf16 bits (round to nearest even), one per 32-bit lane.
typedef std::uint32_t vu __attribute__((vector_size(W * 4)));
inline vu bf16_bits(vf p) {
  const vu u = (vu)p;
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
// Rows r0, r1 of a tile (n floats each, a multiple of W) → n words bf16(r1) << 16 | bf16(r0).
inline void pack_pairs(const float* r0, const float* r1, std::int64_t n, std::uint32_t* out) {
  for (std::int64_t x = 0; x < n; x += W) {
    const vu w = (bf16_bits(r1 ? load(r1 + x) : vf{}) << 16) | bf16_bits(load(r0 + x));
    __builtin_memcpy(out + x, &w, sizeof w);
  }
}

void forward_bf16(const lane_block& lb, const bf16_operands& op, const forward_io& io) {
  constexpr int CC = C;
  const std::int64_t L = CC * W;
  float* S = lb.scratch;
  float* bias = S + kLaneKeyBlock * L;
  float* alpha = bias + kLaneKeyBlock * L;
  std::uint32_t* pp = reinterpret_cast<std::uint32_t*>(lb.scratch + lane_scratch_floats(L, lb.D, lb.Dv));
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  const std::int64_t ldk2 = op.ldk / 2, D2 = lb.D / 2;
  const std::uint32_t* k32 = reinterpret_cast<const std::uint32_t*>(op.k);
  for (std::int64_t j0 = kr.kmin & ~std::int64_t(1); j0 < kr.kmax; j0 += kLaneKeyBlock) {
    const std::int64_t nb = imin(kLaneKeyBlock, kr.kmax - j0), np = (nb + 1) / 2;
    gemm_dp(2 * np, L, D2, k32 + j0 * ldk2, ldk2, 1, op.qp, L, S, L, false);
    softmax_block<CC>(lb, io, sc, S, bias, alpha, j0, 2 * np);
    for (std::int64_t jp = 0; jp < np; ++jp) pack_pairs(S + 2 * jp * L, S + (2 * jp + 1) * L, L, pp + jp * L);
    gemm_dp(lb.Dv, L, np, op.vp + j0 / 2 * lb.Dv, 1, lb.Dv, pp, L, io.ot, L, true);
  }
}

// dq, lane layout: Sᵀ = K·qᵀ and dPᵀ = V·doutᵀ as bf16 dots over d; dS rounded to bf16 in key
// pairs for dqᵀ += Kᵀ dS.
void dq_bf16(const lane_block& lb, const bf16_dq_operands& op, const dq_io& io) {
  constexpr int CC = C;
  const std::int64_t L = CC * W;
  float* S = lb.scratch;
  float* bias = S + kLaneKeyBlock * L;
  float* dP = bias + kLaneKeyBlock * L;
  std::uint32_t* dsp = reinterpret_cast<std::uint32_t*>(lb.scratch + lane_scratch_floats(L, lb.D, lb.Dv));
  for (std::int64_t i = 0; i < lb.D * L; ++i) io.dqt[i] = 0.0f;
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  const std::int64_t D2 = lb.D / 2, Dv2 = lb.Dv / 2;
  const auto* k32 = reinterpret_cast<const std::uint32_t*>(op.k);
  const auto* v32 = reinterpret_cast<const std::uint32_t*>(op.v);
  for (std::int64_t j0 = kr.kmin & ~std::int64_t(1); j0 < kr.kmax; j0 += kLaneKeyBlock) {
    const std::int64_t np = (imin(kLaneKeyBlock, kr.kmax - j0) + 1) / 2;
    gemm_dp(2 * np, L, D2, k32 + j0 * D2, D2, 1, op.qp, L, S, L, false);
    gemm_dp(2 * np, L, Dv2, v32 + j0 * Dv2, Dv2, 1, op.dop, L, dP, L, false);
    dq_scores<CC>(lb, io, sc, S, bias, dP, j0, 2 * np);
    for (std::int64_t jp = 0; jp < np; ++jp) pack_pairs(S + 2 * jp * L, S + (2 * jp + 1) * L, L, dsp + jp * L);
    gemm_dp(lb.D, L, np, op.kpairs + j0 / 2 * lb.D, 1, lb.D, dsp, L, io.dqt, L, true);
  }
}

// dk, dv, row layout: S = Q Kᵀ and dP = dO Vᵀ as bf16 dots over d; P and dS rounded to bf16
// in query-row pairs for dVᵀ += dOᵀ P and dKᵀ += Qᵀ dS.
void dkdv_bf16(const dkdv_pair& a, const bf16_dkdv_operands& op) {
  const std::int64_t ld = a.ldk, nq = a.nq, nq2 = (nq + 1) / 2;
  float* S = a.scratch;
  float* dP = S + nq * ld;
  float* bias = dP + nq * ld;
  auto* pp = reinterpret_cast<std::uint32_t*>(bias + nq * ld);
  std::uint32_t* dsp = pp + nq2 * ld;
  const score_consts sc(a.sp);
  gemm_dp(nq, ld, a.D / 2, reinterpret_cast<const std::uint32_t*>(op.q), a.D / 2, 1, op.ktp, ld, S, ld, false);
  gemm_dp(nq, ld, a.Dv / 2, reinterpret_cast<const std::uint32_t*>(op.dout), a.Dv / 2, 1, op.vtp, ld, dP, ld, false);
  dkdv_scores(a, sc, S, dP, bias);
  for (std::int64_t r = 0; r < nq2; ++r) {
    const bool two = 2 * r + 1 < nq;
    pack_pairs(S + 2 * r * ld, two ? S + (2 * r + 1) * ld : nullptr, ld, pp + r * ld);
    pack_pairs(dP + 2 * r * ld, two ? dP + (2 * r + 1) * ld : nullptr, ld, dsp + r * ld);
  }
  gemm_dp(a.Dv, ld, nq2, op.dopairs, 1, a.Dv, pp, ld, a.dvt, ld, true);
  gemm_dp(a.D, ld, nq2, op.qpairs, 1, a.D, dsp, ld, a.dkt, ld, true);
}

}  // namespace

const kernel_table& kernels_avx512bf16() {
  static constexpr kernel_table table = [] {
    kernel_table t = make_table("avx512bf16");
    t.forward_bf16 = forward_bf16, t.dq_bf16 = dq_bf16, t.dkdv_bf16 = dkdv_bf16;
    return t;
  }();
  return table;
}

}  // namespace attn::detail::cpu

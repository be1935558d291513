// src/cpu/prefill.h — the forward and its two backward passes in the tile layouts of kernels.h,
// written once for every operand type of tile.h (Ops: f32, or bf16 pairs on an ISA with a bf16
// dot product). With bf16 pairs the reduction axis of each product is walked two elements a
// word: key blocks start on an even key and hold an even number of keys (the packed K/V have a
// zero key past the end), and P, dS are rounded to bf16 for the products that consume them.
//
// Lane layout (forward, dq): query rows are SIMD lanes, scores are kept transposed,
// Sᵀ[key][lane], the softmax state (m, l) is one vector per lane group.
// Row layout (dk, dv): one query row per tile row, keys in SIMD lanes.
#pragma once

#include <cstdint>

#include "cpu/kernels.h"
#include "cpu/scores.h"
#include "cpu/simd.h"
#include "cpu/tile.h"

namespace attn::detail::cpu {
namespace {

// What the lane-layout passes multiply, in words of Ops (P = Ops::kPack elements of the
// reduction axis per word).
template <class Ops>
struct lane_operands {
  using word = typename Ops::word;
  const word* qt = nullptr;           // [D/P][L] q of the lanes
  const word* doutt = nullptr;        // [Dv/P][L] dout of the lanes (dq)
  const word* k = nullptr;            // key j, word d' at k[j·k_rs + d'] (S = K qᵀ)
  std::int64_t k_rs = 0;
  const word* v = nullptr;            // value j, word d' at v[j·v_rs + d'] (dP = V doutᵀ, dq)
  std::int64_t v_rs = 0;
  const word* k_steps = nullptr;      // keys by reduction step: column d of step j' at k_steps[j'·k_ss + d] (dqᵀ += Kᵀ dS)
  std::int64_t k_ss = 0;
  const word* v_steps = nullptr;      // values by reduction step (Oᵀ += Vᵀ P): word d of step j'
  std::int64_t v_ss = 0;              // at v_steps[j'·v_ss + d·v_es]
  std::int64_t v_es = 1;
};

// Round n up to a multiple of P.
template <int P>
constexpr std::int64_t round_up(std::int64_t n) {
  return (n + P - 1) / P * P;
}

// ---- forward, lane layout ----
//   Sᵀ[j][lane] = k_j · qᵀ_lane         (q pre-scaled, or scale in score_params)
//   m' = max(m, max_j s), p = e^{s - m'}, l = l·e^{m - m'} + Σ p, Oᵀ = Oᵀ·e^{m - m'} + Vᵀ P
// with two economies of FlashAttention-4: m moves only where a block's max exceeds it by more
// than kMaxSlack (else the weights of the block are e^{s - m} ≤ e^{kMaxSlack}, which fp32 holds
// with room: l ≤ Nk·e^8), so after the first blocks Oᵀ and l are almost never rescaled; and
// p = 2^{s·log2 e - m·log2 e} by one multiply-add and vexp2. out = Oᵀ/l and lse = m + log l
// hold for any m the block sums were taken against.
constexpr float kMaxSlack = 8.0f;

// The lanes' key ranges [lo, hi) over a block of plain scores that some lane's range cuts (a
// causal diagonal, a window's edge): the scores stay as the products wrote them and the passes
// read each through keep() — s inside the lane's range, -inf outside (weight exactly 0) — where
// the general path rewrote the block through transform() and took two passes.
template <int CC>
struct lane_bounds {
  vi lo[CC], hi[CC];
  std::int64_t j0;  // the block's first key
  lane_bounds(const lane_block& lb, std::int64_t j0_) : j0(j0_) {
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) lo[c] = loadi(lb.lo + c * W), hi[c] = loadi(lb.hi + c * W);
  }
  // Score s of key j0 + jj in vector c of the lanes.
  vf keep(vf s, std::int64_t jj, int c) const {
    const vi j = splati(std::int32_t(j0 + jj));
    return ((j >= lo[c]) & (j < hi[c])) ? s : splat(-kInf);
  }
};
// (Ranged: s through lane_bounds::keep; else as it is.)
template <bool Ranged, int CC>
inline vf kept(const lane_bounds<CC>* kb, vf s, std::int64_t jj, int c) {
  if constexpr (Ranged) return kb->keep(s, jj, c);
  else return s;
}

// The weights 2^{S·zs - mz} of a block's keys in pairs (nb is even: keys jj, jj + 1 of the lanes
// → one vector of words), summed into sum; with Max, the block's max of S into mx as well (the
// one-pass form); Ranged, each score through kb->keep first. The weights are rounded to bf16 for
// the product, so 2^x takes vexp2's degree-4 polynomial (simd.h).
template <class Ops, int CC, bool Max, bool Ranged = false>
inline void pair_weights(const float* S, std::int64_t nb, vf zs, const vf* mz, vf* mx, vf* sum,
                         typename Ops::word* packed, const lane_bounds<CC>* kb = nullptr) {
  const std::int64_t L = CC * W;
  for (std::int64_t jj = 0; jj < nb; jj += 2)
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) {
      const vf s0 = kept<Ranged>(kb, load(S + jj * L + c * W), jj, c);
      const vf s1 = kept<Ranged>(kb, load(S + (jj + 1) * L + c * W), jj + 1, c);
      if constexpr (Max) mx[c] = vmax(vmax(mx[c], s0), s1);
      const vf p0 = vexp2<4>(s0 * zs - mz[c]), p1 = vexp2<4>(s1 * zs - mz[c]);
      sum[c] += p0;
      sum[c] += p1;
      storeu(packed + jj / 2 * L + c * W, Ops::pair_rows(p0, p1));
    }
}

// The online-softmax step of keys [j0, j0 + nb) on the scores S (and the mask tile `bias`, of
// kind mk, when sc.bias), then Oᵀ *= α where some lane's max moved. Writes P as Ops words (f32:
// into S; bf16 pairs: into `packed`, keys 2j', 2j'+1 of a lane in one word) and returns them.
// speculate (bf16 pairs; the caller's, across its blocks): whether to try the one-pass form
// below; cleared when a lane's max moved, set again by a block where none did.
template <class Ops, int CC>
const typename Ops::word* softmax_block(const lane_block& lb, const forward_io& io, const score_consts& sc_in, float* S,
                                        const float* bias, mask_tile_kind mk, float* alpha, std::int64_t j0,
                                        std::int64_t nb, typename Ops::word* packed, bool& speculate) {
  const std::int64_t L = CC * W;
  score_consts sc = sc_in;
  if (mk == mask_tile_kind::zeros) sc.drop_bias();  // a mask block of 0s
  float scale = lb.sp.scale;
  if (sc.softcap && !sc.bias && !sc.alibi) {
    // A softcap alone: S becomes the scores cap·tanh(scale·S/cap) in one pass, and the block goes
    // on as plain scores at scale 1 (the one-pass form, lane_bounds for the ranges) — the same
    // weights as the general path's, which rewrote S through transform() and then took the max
    // and the weights in two passes more.
    for (std::int64_t i = 0; i < nb * L; i += W) store(S + i, softcapped(load(S + i), sc));
    sc.softcap = false, sc.plain = true, scale = 1.0f;
    sc.scale = splat(1.0f), sc.scale_log2 = splat(kLog2e);
  }
  const bool ranged = block_ranged(lb, j0, j0 + nb);
  // Plain scores (the common case): the max of scale·S is scale·max(S) (scale > 0, rounding is
  // monotonic), and scale goes into the exponent's multiply-add — the backward's recomputation
  // of P (weight_log2) takes the same form; S is read, not rewritten. A block some lane's key
  // range cuts reads its scores through lane_bounds (-inf outside the range).
  const bool plain = sc.plain && scale > 0.0f;
  const lane_bounds<CC> kb(lb, j0);
  const vf zs = plain ? sc.scale_log2 : splat(kLog2e);
  // Key by key, the CC vectors of a key's row side by side: S is walked in memory order, and the
  // CC maxima and sums are independent chains.
  vf mx[CC], mz[CC], sum[CC];
  if constexpr (Ops::kPack == 2) {
    // One pass where every lane has a running max already: the weights against it, the block's
    // max alongside; kept unless some lane's max moves (by more than the slack), which after the
    // first blocks is rare — then the block is redone below from S, which this pass only reads.
    // Where nothing moves the two ways give the same bits: the same max, the same m·log2 e in
    // the exponent, α = e⁰ = 1 exactly. Scores spread wide (general's q' = Wᵀq with a W of
    // unit entries: ±100 at D 128) move some lane's max in block after block, and each such
    // block paid this pass and the redo: after a move the next block goes straight to the two
    // passes (the max, then the weights), so the choice changes time, not bits.
    bool finite = plain && speculate;
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) {
      const vf m_old = load(io.m + c * W);
      finite = finite && !any_lane(m_old == splat(-kInf));
      mz[c] = m_old * splat(kLog2e), mx[c] = splat(-kInf), sum[c] = vf{};
    }
    if (finite) {
      if (ranged) pair_weights<Ops, CC, true, true>(S, nb, zs, mz, mx, sum, packed, &kb);
      else pair_weights<Ops, CC, true>(S, nb, zs, mz, mx, sum, packed);
      bool moved = false;
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) moved = moved || any_lane(mx[c] * sc.scale > load(io.m + c * W) + splat(kMaxSlack));
      if (!moved) {
#pragma GCC unroll 4
        for (int c = 0; c < CC; ++c) store(io.l + c * W, load(io.l + c * W) + sum[c]);
        return packed;
      }
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) mx[c] = splat(-kInf), sum[c] = vf{};
  if (plain) {
    const auto block_max = [&]<bool Ranged>() {
      for (std::int64_t jj = 0; jj < nb; ++jj)
#pragma GCC unroll 4
        for (int c = 0; c < CC; ++c) mx[c] = vmax(mx[c], kept<Ranged>(&kb, load(S + jj * L + c * W), jj, c));
    };
    if (ranged) block_max.template operator()<true>();
    else block_max.template operator()<false>();
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) mx[c] *= sc.scale;
  } else {
    for (std::int64_t jj = 0; jj < nb; ++jj) {
      const vi j = splati(std::int32_t(j0 + jj));
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) {
        float* sj = S + jj * L + c * W;
        vf t;
        const vf s = transform(load(sj), sc, &t, sc.bias ? load(bias + jj * L + c * W) : vf{}, j,
                               loadi(lb.pos + c * W), loadi(lb.lo + c * W), loadi(lb.hi + c * W),
                               sc.alibi ? load(lb.slope + c * W) : vf{}, ranged);
        store(sj, s);
        mx[c] = vmax(mx[c], s);
      }
    }
  }
  bool moved = false;
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) {
    // -inf + slack is -inf: the first finite max is taken; a NaN max leaves m (the NaN reaches
    // l through p).
    const vf m_old = load(io.m + c * W);
    const vf m_new = mx[c] > m_old + splat(kMaxSlack) ? mx[c] : m_old;
    moved = moved || any_lane(m_new != m_old);
    const vf mu = m_new == splat(-kInf) ? vf{} : m_new;  // a row with nothing yet keeps p = 0
    store(alpha + c * W, vexp(m_old - mu));              // 1 exactly where m stays
    store(io.m + c * W, m_new);
    mz[c] = mu * splat(kLog2e);
  }
  speculate = !moved;
  const bool keep = plain && ranged;  // (else S holds -inf outside the ranges, or no lane is cut)
  if constexpr (Ops::kPack == 1) {
    const auto weights = [&]<bool Ranged>() {
      for (std::int64_t jj = 0; jj < nb; ++jj)
#pragma GCC unroll 4
        for (int c = 0; c < CC; ++c) {
          float* sj = S + jj * L + c * W;
          const vf p = vexp2(kept<Ranged>(&kb, load(sj), jj, c) * zs - mz[c]);
          store(sj, p);
          sum[c] += p;
        }
    };
    if (keep) weights.template operator()<true>();
    else weights.template operator()<false>();
  } else if (keep) {
    pair_weights<Ops, CC, false, true>(S, nb, zs, mz, mx, sum, packed, &kb);
  } else {
    pair_weights<Ops, CC, false>(S, nb, zs, mz, mx, sum, packed);
  }
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) store(io.l + c * W, load(io.l + c * W) * load(alpha + c * W) + sum[c]);
  if (moved)
    for (std::int64_t d = 0; d < lb.Dv; ++d)
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) store(io.ot + d * L + c * W, load(io.ot + d * L + c * W) * load(alpha + c * W));
  if constexpr (Ops::kPack == 1) return S;
  else return packed;
}

// Scratch (lb.scratch): S, bias [kLaneKeyBlock][L], α [L]; `packed`: P as operand words
// [kLaneKeyBlock/P][L] (bf16 pairs only).
template <class Ops, int CC>
void forward_lanes(const lane_block& lb, const lane_operands<Ops>& op, const forward_io& io,
                   typename Ops::word* packed) {
  constexpr int P = Ops::kPack;
  const std::int64_t L = CC * W;
  float* S = lb.scratch;
  float* bias = S + kLaneKeyBlock * L;
  float* alpha = bias + kLaneKeyBlock * L;
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  bool speculate = true;
  for (std::int64_t j0 = kr.kmin / P * P; j0 < kr.kmax; j0 += kLaneKeyBlock) {
    const std::int64_t nb = round_up<P>(imin(kLaneKeyBlock, kr.kmax - j0));
    // The mask first: a block no row sees (all -inf) is skipped, products and all.
    const mask_tile_kind mk = sc.bias ? lb.sp.bias(lb.sp.bias_ctx, j0, nb, bias, 1, L) : mask_tile_kind::zeros;
    if (mk == mask_tile_kind::excluded && lb.sp.skip_excluded) continue;
    gemm<Ops, true>(nb, L, lb.D / P, op.k + j0 * op.k_rs, op.k_rs, 1, op.qt, L, S, L, false);
    const typename Ops::word* pw = softmax_block<Ops, CC>(lb, io, sc, S, bias, mk, alpha, j0, nb, packed, speculate);
    const typename Ops::word* v = op.v_steps + j0 / P * op.v_ss;
    if (op.v_ss == 1) gemm<Ops, true>(lb.Dv, L, nb / P, v, op.v_es, 1, pw, L, io.ot, L, true);
    else gemm<Ops>(lb.Dv, L, nb / P, v, op.v_es, op.v_ss, pw, L, io.ot, L, true);
  }
}

// ---- the forward's [Nq, Nk] intermediate (qk_io), lane layout ----
//   Sᵀ[j][lane] = k_j · qᵀ_lane, then the transform up to the stage asked for; written row-major
// into io.out. Scratch: S, bias [kLaneKeyBlock][L].
template <int CC>
void qk_lanes(const lane_block& lb, const qk_io& io) {
  const std::int64_t L = CC * W;
  float* S = lb.scratch;
  float* bias = S + kLaneKeyBlock * L;
  const score_consts sc(lb.sp);
  for (std::int64_t j0 = lb.klo; j0 < lb.khi; j0 += kLaneKeyBlock) {
    const std::int64_t nb = imin(kLaneKeyBlock, lb.khi - j0);
    gemm<f32_operands>(nb, L, lb.D, lb.k + j0 * lb.ksn, lb.ksn, 1, lb.qt, L, S, L, false);
    if (sc.bias) (void)lb.sp.bias(lb.sp.bias_ctx, j0, nb, bias, 1, L);
#pragma GCC unroll 1
    for (int c = 0; c < CC; ++c) {
      const vi lo = loadi(lb.lo + c * W), hi = loadi(lb.hi + c * W), pos = loadi(lb.pos + c * W);
      const vf slope = sc.alibi ? load(lb.slope + c * W) : vf{};
      const vf lse = io.stage == qk_stage::probabilities ? load(io.lse + c * W) : vf{};
      if (io.stage == qk_stage::row_stats) {
        vf m = load(io.m + c * W), l = load(io.l + c * W), t;
        for (std::int64_t jj = 0; jj < nb; ++jj) {
          const vf s = transform(load(S + jj * L + c * W), sc, &t, sc.bias ? load(bias + jj * L + c * W) : vf{},
                                 splati(std::int32_t(j0 + jj)), pos, lo, hi, slope, true);
          const vf mn = vmax(m, s), mu = mn == splat(-kInf) ? vf{} : mn;
          l = l * vexp(m - mu) + vexp(s - mu);
          m = mn;
        }
        store(io.m + c * W, m), store(io.l + c * W, l);
        continue;
      }
      for (std::int64_t jj = 0; jj < nb; ++jj) {
        const vf qk = load(S + jj * L + c * W);
        vf t{};
        const vf s = transform(qk, sc, &t, sc.bias ? load(bias + jj * L + c * W) : vf{},
                               splati(std::int32_t(j0 + jj)), pos, lo, hi, slope, true);
        vf r = s;
        switch (io.stage) {
          case qk_stage::scaled: r = qk * sc.scale; break;
          case qk_stage::softcapped: r = sc.softcap ? sc.cap * t : qk * sc.scale; break;
          case qk_stage::biased: break;
          case qk_stage::probabilities: r = vexp(s - lse); break;
          case qk_stage::row_stats: break;
        }
        for (int x = 0; x < W && c * W + x < lb.nl; ++x) io.out[(c * W + x) * io.ld + j0 + jj - lb.klo] = r[x];
      }
    }
  }
}

// ---- backward dq, lane layout (recompute from lse) ----
//   p = e^{s - lse}, dp = dout·v_j, ds = p (dp - Δ) (· (1 - t²) with softcap), dqᵀ += Kᵀ dS
// (the forward's p = e^{s - m'} with the final m and l folded into lse; Oᵀ += Vᵀ P gives
// dP = V doutᵀ).

// From the raw scores S and dP of keys [j0, j0 + nb), writes dS into S.
template <int CC>
void dq_scores(const lane_block& lb, const dq_io& io, const score_consts& sc_in, float* S, const float* bias,
               mask_tile_kind mk, const float* dP, std::int64_t j0, std::int64_t nb) {
  const std::int64_t L = CC * W;
  score_consts sc = sc_in;
  if (mk == mask_tile_kind::zeros) sc.drop_bias();
  const bool ranged = block_ranged(lb, j0, j0 + nb);
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) {
    const vi lo = loadi(lb.lo + c * W), hi = loadi(lb.hi + c * W), pos = loadi(lb.pos + c * W);
    const vf slope = sc.alibi ? load(lb.slope + c * W) : vf{};
    const vf lz = load(io.lse + c * W) * splat(kLog2e), delta = load(io.delta + c * W);
    for (std::int64_t jj = 0; jj < nb; ++jj) {
      float* sj = S + jj * L + c * W;
      vf t{};
      const vf p = vexp2(weight_log2(load(sj), sc, &t, sc.bias ? load(bias + jj * L + c * W) : vf{},
                                     splati(std::int32_t(j0 + jj)), pos, lo, hi, slope, ranged, lz));
      vf ds = p * (load(dP + jj * L + c * W) - delta);
      if (sc.softcap) ds *= splat(1.0f) - t * t;
      store(sj, ds);
    }
  }
}

// Scratch (lb.scratch): S, bias, dP [kLaneKeyBlock][L]; `packed`: dS as operand words.
template <class Ops, int CC>
void dq_lanes(const lane_block& lb, const lane_operands<Ops>& op, const dq_io& io, typename Ops::word* packed) {
  constexpr int P = Ops::kPack;
  const std::int64_t L = CC * W;
  float* S = lb.scratch;
  float* bias = S + kLaneKeyBlock * L;
  float* dP = bias + kLaneKeyBlock * L;
  for (std::int64_t i = 0; i < lb.D * L; ++i) io.dqt[i] = 0.0f;
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  for (std::int64_t j0 = kr.kmin / P * P; j0 < kr.kmax; j0 += kLaneKeyBlock) {
    const std::int64_t nb = round_up<P>(imin(kLaneKeyBlock, kr.kmax - j0));
    const mask_tile_kind mk = sc.bias ? lb.sp.bias(lb.sp.bias_ctx, j0, nb, bias, 1, L) : mask_tile_kind::zeros;
    if (mk == mask_tile_kind::excluded && lb.sp.skip_excluded) continue;  // no row sees the block: ds = 0
    gemm<Ops, true>(nb, L, lb.D / P, op.k + j0 * op.k_rs, op.k_rs, 1, op.qt, L, S, L, false);
    gemm<Ops, true>(nb, L, lb.Dv / P, op.v + j0 * op.v_rs, op.v_rs, 1, op.doutt, L, dP, L, false);
    dq_scores<CC>(lb, io, sc, S, bias, mk, dP, j0, nb);
    const typename Ops::word* dsw = Ops::pack_rows(S, nb, L, packed);
    gemm<Ops>(lb.D, L, nb / P, op.k_steps + j0 / P * op.k_ss, 1, op.k_ss, dsw, L, io.dqt, L, true);
  }
}

// ---- backward dk, dv (and dq when fused), row layout: one query block against one key block ----
//   S = Q Kᵀ, dP = dO Vᵀ, P = e^{s' - lse} (s' the transformed score), dS = P (dP - Δ),
//   dVᵀ += dOᵀ P,  dKᵀ += Qᵀ dS,  fused: dQ += dS K (scaled by the caller)

// What the row-layout pass multiplies, in words of Ops.
template <class Ops>
struct row_operands {
  using word = typename Ops::word;
  const word* q = nullptr;            // query row r, word d' at q[r·q_rs + d']
  std::int64_t q_rs = 0;
  const word* dout = nullptr;         // dout rows, likewise
  std::int64_t dout_rs = 0;
  const word* q_steps = nullptr;      // query rows by reduction step: column d of step r' at q_steps[r'·q_ss + d]
  std::int64_t q_ss = 0;
  const word* dout_steps = nullptr;   // dout rows by reduction step
  std::int64_t dout_ss = 0;
  const word* kt = nullptr;           // [D/P][ldk] the key block, transposed, zero-padded
  const word* vt = nullptr;           // [Dv/P][ldk]
};

// From the raw S and dP of the pair, writes P into S and dS into dP; adds the ALiBi gradient.
void dkdv_scores(const dkdv_pair& pr, const score_consts& sc_in, float* S, float* dP, const float* bias,
                 mask_tile_kind mk) {
  const std::int64_t ld = pr.ldk, nq = pr.nq;
  score_consts sc = sc_in;
  if (mk == mask_tile_kind::zeros) sc.drop_bias();  // a mask block of 0s
  const vf slope = splat(pr.slope);
  vf dalibi{};
  for (std::int64_t r = 0; r < nq; ++r) {
    const std::int64_t h_r = imin(pr.hi[r], pr.j0 + pr.nb);
    const vi lo = splati(pr.lo[r]), hi = splati(std::int32_t(h_r)), pos = splati(pr.pos[r]);
    const vf lz = splat(pr.lse[r] * kLog2e), delta = splat(pr.delta[r]);
    // Ranged: the row's key range (or the block's end, nb < ld) cuts the block, so [lo, hi) is
    // applied; a row that sees all ld keys skips the comparisons (the same weights).
    const auto row = [&]<bool Ranged>() {
      for (std::int64_t x = 0; x < ld; x += W) {
        const vi j = iota() + std::int32_t(pr.j0 + x);
        vf t{};
        const vf p = vexp2(weight_log2(load(S + r * ld + x), sc, &t, sc.bias ? load(bias + r * ld + x) : vf{}, j, pos,
                                       lo, hi, slope, Ranged, lz));
        vf ds = p * (load(dP + r * ld + x) - delta);
        if (sc.alibi) dalibi -= ds * key_distance(pos, j);
        if (pr.ds_out) store(pr.ds_out + r * ld + x, ds);
        if (sc.softcap) ds *= splat(1.0f) - t * t;
        store(S + r * ld + x, p);
        store(dP + r * ld + x, ds);
      }
    };
    if (pr.lo[r] > pr.j0 || h_r < pr.j0 + ld) row.template operator()<true>();
    else row.template operator()<false>();
  }
  if (sc.alibi) {
    double sum = 0.0;
    for (int x = 0; x < W; ++x) sum += double(dalibi[x]);
    *pr.dalibi += sum;
  }
}

// Scratch (pr.scratch): S, dP, bias [nq][ldk], then P and dS as operand words
// [nq/P rounded up][ldk] each (bf16 pairs only).
template <class Ops>
void dkdv_rows(const dkdv_pair& pr, const row_operands<Ops>& op) {
  constexpr int P = Ops::kPack;
  const std::int64_t ld = pr.ldk, nq = pr.nq, nqs = round_up<P>(nq) / P;
  float* S = pr.scratch;
  float* dP = S + nq * ld;
  float* bias = dP + nq * ld;
  auto* packed = reinterpret_cast<typename Ops::word*>(bias + nq * ld);
  const score_consts sc(pr.sp);
  mask_tile_kind mk = mask_tile_kind::zeros;
  if (sc.bias) {
    mk = pr.sp.bias(pr.sp.bias_ctx, pr.j0, pr.nb, bias, ld, 1);
    if (mk == mask_tile_kind::excluded && pr.sp.skip_excluded) {  // no row sees the block: ds = 0, nothing to add
      if (pr.ds_out)
        for (std::int64_t i = 0; i < nq * ld; ++i) pr.ds_out[i] = 0.0f;
      return;
    }
    for (std::int64_t r = 0; r < nq; ++r)
      for (std::int64_t x = pr.nb; x < ld; ++x) bias[r * ld + x] = 0.0f;
  }
  gemm<Ops, true>(nq, ld, pr.D / P, op.q, op.q_rs, 1, op.kt, ld, S, ld, false);
  gemm<Ops, true>(nq, ld, pr.Dv / P, op.dout, op.dout_rs, 1, op.vt, ld, dP, ld, false);
  dkdv_scores(pr, sc, S, dP, bias, mk);
  const typename Ops::word* pw = Ops::pack_rows(S, nq, ld, packed);
  const typename Ops::word* dsw = Ops::pack_rows(dP, nq, ld, packed + nqs * ld);
  gemm<Ops>(pr.Dv, ld, nqs, op.dout_steps, 1, op.dout_ss, pw, ld, pr.dvt, ld, true);
  gemm<Ops>(pr.D, ld, nqs, op.q_steps, 1, op.q_ss, dsw, ld, pr.dkt, ld, true);
  if (pr.dq) {
    if constexpr (P == 2) {  // dS in key pairs [nq][ld/2] (in bias's room, free now) · K by key pairs
      auto* dsk = reinterpret_cast<std::uint32_t*>(bias);
      for (std::int64_t i = 0; i < nq * ld; i += W) store_lane_pairs(dsk + i / 2, load(dP + i));
      gemm<Ops>(nq, pr.ldq, ld / 2, dsk, ld / 2, 1, pr.krw, pr.ldq, pr.dq, pr.dqs, true);
    } else {
      gemm<f32_operands>(nq, pr.ldq, pr.nb, dP, ld, 1, pr.krows, pr.krs, pr.dq, pr.dqs, true);
    }
  }
}

}  // namespace
}  // namespace attn::detail::cpu

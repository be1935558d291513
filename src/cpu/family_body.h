// src/cpu/family_body.h — the fused family kernels of family_kernels.h for one ISA.
// family_<isa>.cc defines W (floats per vector), C (vectors per lane group) and R (tile rows)
// in attn::detail::cpu::(anonymous), then includes this file; everything here is in an
// anonymous namespace (see kernels.h on why; for the same reason the top-k selection below is
// written here rather than taken from <algorithm>).
//
// Row statistics, found on the stored scores of a lane block (query rows in lanes, so every
// step is a vector operation over W rows at once):
//   softmax    m = max s, lse = m + log Σ e^{s - m}
//   sparsemax  τ solves Σ max(s - τ, 0) = 1. Michelot's iteration from τ₀ = max - 1 (a lower
//              bound): with S = {s > τ}, τ ← (Σ_S s - 1)/|S|. Each step either keeps S (then τ
//              is exact: the closed form on the true support, as the reference computes it) or
//              drops at least one key, so it ends after at most |S₀| steps (a few in practice).
//   entmax15   on x = s/2, τ solves Σ max(x - τ, 0)² = 1. Newton from τ₀ = max x - 1 (f is
//              convex and decreasing, so the iterates rise monotonically to the root); at each
//              step the closed form on S = {x > τ} (τ_c = mean - √((1 - Σ(x - mean)²)/|S|)) is
//              taken as exact as soon as it keeps S (τ ≤ τ_c < min_S x). 60 steps at most; a
//              tie exactly at the threshold keeps the last Newton iterate.
//   hardmax    the first arg max (a running max and index per lane)
//   topk       the k-th best score t: for k <= 16 the k best of every lane kept as k sorted
//              vectors (a compare-exchange chain, skipped for a score below the k-th); above, a
//              scalar selection per row. Then the first keys tied at t up to k, and the lse over
//              the kept keys
// Both threshold searches visit, after the first pass, only the keys some lane still holds above
// τ (τ only rises). Sums run in key order within a row, so no result depends on the thread that
// ran it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cpu/family_kernels.h"
#include "cpu/simd.h"
#include "cpu/tile.h"

namespace attn::detail::cpu {
namespace {

using fam_ops = f32_operands;
constexpr std::int64_t kVectorTopk = 16;  // top-k with k up to this: vector selection; above: scalar

inline vf vmin(vf a, vf b) { return a < b ? a : b; }
inline vf vselect(vi m, vf a, vf b) { return m ? a : b; }
// acc + v in the lanes of m, acc in the others: one merge-masked add on AVX-512, where
// acc += vselect(m, v, 0) compiled to a zeroing move and an add. The same bits (acc is never -0).
inline vf add_if(vi m, vf acc, vf v) { return m ? acc + v : acc; }
// √x per lane (x >= 0 or NaN): one vsqrtps on x86 (correctly rounded, the bits of sqrtf). A loop
// of __builtin_sqrtf compiled to scalar vsqrtss, each with errno's check: the triangle kernel's
// transform took as long as its scores (B1 H8 N2048 D64 f32 forward, a third of the samples).
// (A template, so that the branches of the other widths are discarded, not checked.)
template <class V>
inline V vsqrt(V x) {
#if defined(__AVX512F__)
  if constexpr (sizeof(V) == 64) return __builtin_ia32_sqrtps512_mask(x, x, 0xffff, 4);
#endif
#if defined(__AVX__)
  if constexpr (sizeof(V) == 32) return __builtin_ia32_sqrtps256(x);
#endif
#if defined(__SSE__)
  if constexpr (sizeof(V) == 16) return __builtin_ia32_sqrtps(x);
#endif
  V r = x;
  for (int l = 0; l < W; ++l) r[l] = __builtin_sqrtf(x[l]);
  return r;
}

// act(z) and *g = act'(z); h: the bandwidth of box and triangle (z a squared distance).
inline vf fam_act(family_act a, vf z, vf* g, float h) {
  switch (a) {
    case family_act::identity: *g = splat(1.0f); return z;
    case family_act::tanh: {
      const vf t = vtanh(z);
      *g = splat(1.0f) - t * t;
      return t;
    }
    case family_act::relu: {
      const vi pos = z > vf{};
      *g = vselect(pos, splat(1.0f), vf{});
      return vselect(pos, z, vf{});
    }
    case family_act::sigmoid: {
      const vf s = vsigmoid(z);
      *g = s * (splat(1.0f) - s);
      return s;
    }
    case family_act::box:  // piecewise constant: gradient 0 almost everywhere
      *g = vf{};
      return vselect(z <= splat(h * h), splat(1.0f), vf{});
    case family_act::triangle: {  // 1 - ρ/h inside the support; ∂/∂z = -1/(2hρ) (0 at the peak)
      const vf rho = vsqrt(vmax(z, vf{}));
      const vi in = rho < splat(h);
      *g = vselect(in & (rho > vf{}), splat(-0.5f / h) / vmax(rho, splat(1e-30f)), vf{});
      return vselect(in, splat(1.0f) - rho * splat(1.0f / h), vf{});
    }
  }
  *g = splat(1.0f);
  return z;
}

// ∂e/∂h of the triangle kernel from its ∂e/∂z = g = -1/(2hρ): ρ/h² = -1/(2h³g); 0 where g = 0
// (outside the support, and the peak, whose subgradient is 0).
inline vf triangle_dh(vf g, float h) {
  return vselect(g != vf{}, splat(-0.5f / (h * h * h)) / vselect(g != vf{}, g, splat(1.0f)), vf{});
}

// The statistics of W rows (lanes, or one row splat over W key lanes). sparsemax and entmax15
// keep τ relative to a shift (lse holds the row max; entmax15: max/2): α = max((s - shift) - τ,
// 0). s - shift is exact on the support, so α has the error of τ near 1, not of max + τ (a row
// of scores near -2304 has ulp 2.4e-4 there: α = 1/6 came out 0.16679).
// e^x as 2^{x·log2 e} (vexp2: about half vexp's instructions; exactly 0 for x = -inf, NaN stays
// NaN): the weights and sums of softmax, top-k and the straight-through hardmax, one per (pair,
// feature) — for multi-dimensional additive the most frequent operation of all.
inline vf exp_nat(vf x) { return vexp2(x * splat(kLog2e)); }

struct fam_stat {
  vf t, lse, r;
  vi cut;
};

inline vi fam_kept(vf s, vi j, const fam_stat& st) { return (s > st.t) | ((s == st.t) & (j <= st.cut)); }

// α of the scores s (keys j). The distribution is a template parameter of every kernel, so
// these switches fold away.
template <family_dist Dist>
inline vf fam_alpha(const family_params& fp, vf s, vi j, const fam_stat& st) {
  switch (Dist) {
    case family_dist::softmax: return exp_nat(s - st.t);  // s = -inf or t = +inf: exactly 0
    case family_dist::sigmoid:
      return vselect(s == splat(-kInf), vf{}, vsigmoid(s + splat(fp.sigmoid_bias)));
    case family_dist::sparsemax: return vmax((s - st.lse) - st.t, vf{});
    case family_dist::entmax15: {
      const vf u = vmax((s * splat(0.5f) - st.lse) - st.t, vf{});
      return u * u;
    }
    case family_dist::hardmax:
    case family_dist::hardmax_st: return vselect(fam_kept(s, j, st), splat(1.0f), vf{});
    case family_dist::topk: return vselect(fam_kept(s, j, st), exp_nat(s - st.lse), vf{});
    case family_dist::identity: return vselect(s == splat(-kInf), vf{}, s);
    case family_dist::kernel: return vselect(s == splat(-kInf), vf{}, s * st.t);
  }
  return vf{};
}

// u of r = Σ u dα / Σ u (0 where the distribution has no r).
template <family_dist Dist>
inline vf fam_u(vf s, vf a, const fam_stat& st) {
  switch (Dist) {
    case family_dist::softmax:
    case family_dist::topk:
    case family_dist::kernel: return a;
    case family_dist::sparsemax: return vselect(a > vf{}, splat(1.0f), vf{});
    case family_dist::entmax15: return vmax((s * splat(0.5f) - st.lse) - st.t, vf{});
    case family_dist::hardmax_st: return exp_nat(s - st.lse);  // the softmax's p
    default: return vf{};
  }
}

// de = w (dα - r).
template <family_dist Dist>
inline vf fam_de(vf s, vf a, vf dp, const fam_stat& st) {
  switch (Dist) {
    case family_dist::softmax:
    case family_dist::topk: return a * (dp - st.r);
    case family_dist::sigmoid: return a * (splat(1.0f) - a) * dp;
    case family_dist::sparsemax: return vselect(a > vf{}, dp - st.r, vf{});
    case family_dist::entmax15: return vmax((s * splat(0.5f) - st.lse) - st.t, vf{}) * (dp - st.r);
    case family_dist::hardmax: return vf{};
    case family_dist::hardmax_st: return exp_nat(s - st.lse) * (dp - st.r);
    case family_dist::identity: return vselect(s == splat(-kInf), vf{}, dp);
    case family_dist::kernel: return vselect(s == splat(-kInf), vf{}, (dp - st.r) * st.t);
  }
  return vf{};
}

// ---- lane layout ----

// Scratch of a lane block (keys: the keys it may hold, family_lane_scratch_floats).
struct lane_scratch {
  float *S, *dP, *G, *mask, *buf;
  lane_scratch(const family_lanes& lb, std::int64_t keys) {
    S = lb.scratch;
    dP = S + keys * lb.L;
    G = dP + keys * lb.L;
    mask = G + keys * lb.L;
    buf = mask + kLaneKeyBlock * lb.L;
  }
};

// Keys [kmin, kmax) that some lane of the block may see.
inline void fam_range(const family_lanes& lb, std::int64_t& kmin, std::int64_t& kmax) {
  kmin = INT64_MAX, kmax = 0;
  for (std::int64_t x = 0; x < lb.nl; ++x)
    if (lb.lo[x] < lb.hi[x]) kmin = imin(kmin, lb.lo[x]), kmax = imax(kmax, lb.hi[x]);
}

// The span of the key blocks lane_mask did not skip: the keep-the-scores distributions find
// their statistics and weights over it alone (every key outside is -inf in every lane, where the
// statistics add exact zeros, so they come out the same).
struct live_keys {
  std::int64_t lo, hi;
  live_keys(std::int64_t kmin, std::int64_t kmax) : lo(kmax), hi(kmin) {}
  void add(std::int64_t j0, std::int64_t nb, bool skipped) {
    if (!skipped) lo = imin(lo, j0), hi = imax(hi, j0 + nb);
  }
  bool none() const { return lo >= hi; }
};

// ---- elementwise scores: z = Σ_x term(qp_x, kp_x), one term per (pair, feature) ----
//   additive (Bahdanau)  term = w_x tanh(a + b)   ∂/∂a = ∂/∂b = w_x (1 - t²), ∂/∂w_x = t
//   distance             term = (a - b)²          ∂/∂a = 2 (a - b) = -∂/∂b   (box, triangle)
// O(Nq·Nk·P) terms, vectorised across the lanes (query rows, or keys in the row layout), each
// recomputed where the backward needs it rather than stored (an [Nq, Nk, P] tensor is what the
// eager formula materialises). A term policy has term(x, a, b) and grad(x, a, b, &dw) = ∂/∂a
// without its per-feature factor scale(x) (dw: ∂/∂w_x, where the score has weights), and kb,
// the sign of ∂/∂b against ∂/∂a.

// tanh(a + b) of the kernels' operands: a and b themselves, or (Exp, family_params::additive_exp)
// e^{2a} and e^{2b}: 1 - 2 / (1 + e^{2a} e^{2b}), exact to the rounding of the product (≈ 1e-7
// absolute, as e^{2(a + b)} itself).
template <bool Exp>
inline vf add_tanh(vf a, vf b) {
  if constexpr (Exp) return splat(1.0f) - splat(2.0f) * vrecip(a * b + splat(1.0f));
  else return vtanh(a + b);
}

template <bool Exp>
struct additive_terms {
  static constexpr bool weighted = true;
  static constexpr float kb = 1.0f;
  const float* w;
  vf term(std::int64_t x, vf a, vf b) const { return splat(w[x]) * add_tanh<Exp>(a, b); }
  vf grad(std::int64_t, vf a, vf b, vf* dw) const {
    const vf t = add_tanh<Exp>(a, b);
    *dw = t;
    return splat(1.0f) - t * t;
  }
  float scale(std::int64_t x) const { return w[x]; }
};
struct distance_terms {
  static constexpr bool weighted = false;
  static constexpr float kb = -1.0f;
  vf term(std::int64_t, vf a, vf b) const { return (a - b) * (a - b); }
  vf grad(std::int64_t, vf a, vf b, vf*) const { return a - b; }
  float scale(std::int64_t) const { return 2.0f; }
};

// Calls f(terms) with the policy of the call's elementwise score.
template <class F>
void with_terms(const family_params& fp, F&& f) {
  if (fp.score == family_score::distance) return f(distance_terms{});
  if (fp.additive_exp) return f(additive_terms<true>{fp.w_v});
  f(additive_terms<false>{fp.w_v});
}

// Lane layout: S[jj][L] = z of key j0 + jj for the lanes' queries qt [P][L]. Two keys × CC
// vectors of lanes at a time: 2·CC independent sums (one sum alone waits on its adds' latency),
// each over x in order, as one at a time would.
template <int CC, class T>
void elem_lane_scores(const family_lanes& lb, const T& tm, std::int64_t j0, std::int64_t nb, float* S) {
  const std::int64_t L = CC * W;
  std::int64_t jj = 0;
  for (; jj + 2 <= nb; jj += 2) {
    const float* k0 = lb.k + (j0 + jj) * lb.ksn;
    const float* k1 = k0 + lb.ksn;
    vf a0[CC], a1[CC];
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) a0[c] = a1[c] = vf{};
    for (std::int64_t x = 0; x < lb.P; ++x) {
      const vf b0 = splat(k0[x]), b1 = splat(k1[x]);
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) {
        const vf a = load(lb.qt + x * L + c * W);
        a0[c] += tm.term(x, a, b0);
        a1[c] += tm.term(x, a, b1);
      }
    }
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) store(S + jj * L + c * W, a0[c]), store(S + (jj + 1) * L + c * W, a1[c]);
  }
  for (; jj < nb; ++jj) {
    const float* kj = lb.k + (j0 + jj) * lb.ksn;
    vf acc[CC];
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) acc[c] = vf{};
    for (std::int64_t x = 0; x < lb.P; ++x) {
      const vf b = splat(kj[x]);
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) acc[c] += tm.term(x, load(lb.qt + x * L + c * W), b);
    }
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) store(S + jj * L + c * W, acc[c]);
  }
}

// Lane layout, backward: with dz [nb][L] of keys j0.., dqt[x][L] += scale(x) Σ_j dz ∂/∂a and
// (weighted) dw[x] += Σ_j Σ_lanes dz ∂/∂w_x. Keys whose dz is zero in every lane (masked,
// outside the support) are skipped; buf holds nb indices.
template <int CC, class T>
void elem_lane_grad(const family_lanes& lb, const T& tm, std::int64_t j0, std::int64_t nb, const float* dz, float* dqt,
                    double* dw, float* buf) {
  const std::int64_t L = CC * W;
  std::int32_t* live = reinterpret_cast<std::int32_t*>(buf);
  std::int64_t nlive = 0;
  for (std::int64_t jj = 0; jj < nb; ++jj) {
    bool any = false;
    for (int c = 0; c < CC; ++c) any |= any_lane(load(dz + jj * L + c * W) != vf{});
    if (any) live[nlive++] = std::int32_t(jj);
  }
  for (std::int64_t x = 0; x < lb.P; ++x) {
    vf dwx{};
    vf qx[CC], g[CC], h[CC];  // CC independent sums over the live keys, each in key order
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) qx[c] = load(lb.qt + x * L + c * W), g[c] = h[c] = vf{};
    for (std::int64_t e = 0; e < nlive; ++e) {
      const std::int64_t jj = live[e];
      const vf kx = splat(lb.k[(j0 + jj) * lb.ksn + x]);
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) {
        vf gw{};
        const vf d = load(dz + jj * L + c * W), ga = tm.grad(x, qx[c], kx, &gw);
        g[c] += d * ga;
        if constexpr (T::weighted) h[c] += d * gw;
      }
    }
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) {
      store(dqt + x * L + c * W, load(dqt + x * L + c * W) + splat(tm.scale(x)) * g[c]);
      dwx += h[c];
    }
    if constexpr (T::weighted) {
      double sum = 0.0;
      for (int l = 0; l < W; ++l) sum += double(dwx[l]);
      dw[x] += sum;
    }
  }
}

// Row layout: S[r][y] = z of query row r (q + r·qsn) and key y of kt [P][ld].
template <class T>
void elem_row_scores(const family_rows& pr, const T& tm, float* S) {
  const std::int64_t ld = pr.ldk;
  for (std::int64_t r = 0; r < pr.nq; ++r) {
    const float* qr = pr.q + r * pr.qsn;
    std::int64_t y = 0;
    for (; y + 4 * W <= ld; y += 4 * W) {  // four vectors of keys: four independent sums, each over x in order
      vf acc[4] = {};
      for (std::int64_t x = 0; x < pr.P; ++x) {
        const vf a = splat(qr[x]);
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) acc[c] += tm.term(x, a, load(pr.kt + x * ld + y + c * W));
      }
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) store(S + r * ld + y + c * W, acc[c]);
    }
    for (; y < ld; y += W) {
      vf acc{};
      for (std::int64_t x = 0; x < pr.P; ++x) acc += tm.term(x, splat(qr[x]), load(pr.kt + x * ld + y));
      store(S + r * ld + y, acc);
    }
  }
}

// Row layout, backward: dkt[x][y] += kb · scale(x) Σ_r dz[r][y] ∂/∂a. Rows whose dz is zero for
// every key of the block are skipped. Single pass (pr.dq, additive): also dq[r][x] += scale(x)
// Σ_y dz[r][y] ∂/∂a — each live row's sum over the key vectors kept as a vector (qacc), its lanes
// added by a transpose-add of W rows at a time — and pr.dw_v[x] += Σ_r,y dz ∂/∂w_x. scratch:
// nq·W floats (64-byte aligned), then nq indices.
template <class T>
void elem_row_grad(const family_rows& pr, const T& tm, const float* dz, float* scratch) {
  const std::int64_t ld = pr.ldk;
  const bool with_dq = pr.dq != nullptr;
  float* qacc = scratch;
  std::int32_t* live = reinterpret_cast<std::int32_t*>(scratch + pr.nq * W);
  std::int64_t nlive = 0;
  for (std::int64_t r = 0; r < pr.nq; ++r) {
    bool any = false;
    for (std::int64_t y = 0; y < ld; y += W) any |= any_lane(load(dz + r * ld + y) != vf{});
    if (any) live[nlive++] = std::int32_t(r);
  }
  for (std::int64_t x = 0; x < pr.P; ++x) {
    const vf fx = splat(T::kb * tm.scale(x));
    if (with_dq)
      for (std::int64_t e = 0; e < nlive; ++e) store(qacc + e * W, vf{});
    vf dwx{};
    std::int64_t y = 0;
    for (; y + 4 * W <= ld; y += 4 * W) {  // four vectors of keys: four independent sums over the live rows, in order
      vf kx[4], g[4];
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) kx[c] = load(pr.kt + x * ld + y + c * W), g[c] = vf{};
      for (std::int64_t e = 0; e < nlive; ++e) {
        const std::int64_t r = live[e];
        const vf a = splat(pr.q[r * pr.qsn + x]);
        vf p[4], gw[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const vf d = load(dz + r * ld + y + c * W);
          p[c] = d * tm.grad(x, a, kx[c], &gw[c]);
          g[c] += p[c];
          if (with_dq) dwx += d * gw[c];
        }
        if (with_dq) store(qacc + e * W, load(qacc + e * W) + ((p[0] + p[1]) + (p[2] + p[3])));
      }
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) store(pr.dkt + x * ld + y + c * W, load(pr.dkt + x * ld + y + c * W) + fx * g[c]);
    }
    for (; y < ld; y += W) {
      const vf kx = load(pr.kt + x * ld + y);
      vf g{};
      for (std::int64_t e = 0; e < nlive; ++e) {
        const std::int64_t r = live[e];
        const vf d = load(dz + r * ld + y);
        vf gw;
        const vf p = d * tm.grad(x, splat(pr.q[r * pr.qsn + x]), kx, &gw);
        g += p;
        if (with_dq) dwx += d * gw, store(qacc + e * W, load(qacc + e * W) + p);
      }
      store(pr.dkt + x * ld + y, load(pr.dkt + x * ld + y) + fx * g);
    }
    if (!with_dq) continue;
    if constexpr (T::weighted) {
      double sw = 0.0;
      for (int l = 0; l < W; ++l) sw += double(dwx[l]);
      pr.dw_v[x] += sw;
    }
    const float sx = tm.scale(x);
    for (std::int64_t e0 = 0; e0 < nlive; e0 += W) {  // W live rows' sums at a time
      vf rows[W];
#pragma GCC unroll 16
      for (int t = 0; t < W; ++t) rows[t] = e0 + t < nlive ? load(qacc + (e0 + t) * W) : vf{};
      transpose_add(rows);
      for (std::int64_t t = 0; t < imin(W, nlive - e0); ++t) pr.dq[live[e0 + t] * pr.dqs + x] += sx * rows[0][t];
    }
  }
}

// ---- distance scores: the gradients as products ----
// z = ‖q − k‖² (distance_terms) has dq = 2 Σ_j dz_j (q − k_j) = 2(q Σ_j dz_j − Σ_j dz_j k_j) and
// dk = 2(k Σ_r dz_r − Σ_r dz_r q_r): a product on the register tile and a sum of dz, where
// elem_lane_grad / elem_row_grad take a difference, a product and two sums per (pair, feature).
// The products' float32 rounding errs by about u·(‖q‖ + ‖k‖)·Σ|dz|, the differences' by
// u·‖q − k‖·Σ|dz|; only pairs with dz ≠ 0 count (the triangle kernel's: 0 < ρ = ‖q − k‖ < h), and
// for them ‖k‖ ≤ ‖q‖ + ρ. So a block takes the products where each such pair has ρ ≥ ‖q‖/8 — an
// error at most 1 + 2‖q‖/ρ ≤ 17 times the differences' — and every dz is finite; elsewhere (keys
// close to their queries at a large norm: the products would cancel) the differences, as before.
// Only with q and k finite (qk_finite): the differences skip rows and keys whose dz are all 0,
// where the products add 0·q and 0·k — the same zeros only for finite q and k.
inline bool distance_products(const family_params& fp) {
  return fp.score == family_score::distance && fp.act == family_act::triangle && fp.qk_finite;
}

// Lane layout: dqt [P][L] += 2(q Σ_j dz − Kᵀ dz) for the keys j0 + [0, nb) where the block allows
// it (above), judged on the act′ G = −1/(2hρ) of each pair (0 outside the support): ρ ≥ ‖q‖/8 ⟺
// h²·G²·‖q‖² ≤ 16. dz [nb][L] is scaled by −2 in place. False (nothing done): the differences.
template <int CC>
bool distance_lane_products(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* dz, const float* G,
                            float* dqt) {
  const std::int64_t L = CC * W;
  const float h = lb.fp.h;
  vf qn[CC], sum[CC];  // h²‖q‖² of the lanes (‖q‖²: the call's, fused.cc find_norms)
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) qn[c] = load(lb.qn2 + c * W) * splat(h * h), sum[c] = vf{};
  vi bad{};
  for (std::int64_t jj = 0; jj < nb; ++jj)
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) {
      const vf d = load(dz + jj * L + c * W), g = load(G + jj * L + c * W);
      bad |= ~(g * g * qn[c] <= splat(16.0f)) | not_finite(d);  // (a NaN compares false: bad)
      sum[c] += d;
    }
  if (any_lane(bad)) return false;
  for (std::int64_t i = 0; i < nb * L; i += W) store(dz + i, load(dz + i) * splat(-2.0f));
  gemm<fam_ops>(lb.P, L, nb, lb.k + j0 * lb.ksn, 1, lb.ksn, dz, L, dqt, L, true);  // dqᵀ += Kᵀ (−2 dz)
  for (std::int64_t x = 0; x < lb.P; ++x)
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) {
      float* o = dqt + x * L + c * W;
      store(o, load(o) + load(lb.qt + x * L + c * W) * (splat(2.0f) * sum[c]));
    }
  return true;
}

// Row layout, before row_weights turns the scores z [nq][ldk] into α: whether some pair may have
// dz ≠ 0 (0 < z < 2h², a margin over ρ < h) with 64·z < ‖q‖² — dk then from the differences.
inline bool distance_rows_close(const family_rows& pr, const float* S) {
  const std::int64_t ld = pr.ldk;
  const vf h2 = splat(2.0f * pr.fp.h * pr.fp.h);
  vi close{};
  for (std::int64_t r = 0; r < pr.nq; ++r) {
    const vf t = splat(pr.qn2[r]);  // ‖q‖² (the call's: fused.cc, find_norms)
    for (std::int64_t y = 0; y < ld; y += W) {
      const vf z = load(S + r * ld + y);
      close |= (z > vf{}) & (z < h2) & ~(splat(64.0f) * z >= t);
    }
  }
  return any_lane(close);
}

// Row layout: dkt [P][ldk] += 2(k Σ_r dz − Qᵀ dz) from dz [nq][ldk] (scaled by −2 in place) and,
// single pass (pr.dq), dq [nq][Pp] += 2(q Σ_y dz − dz K) on the key rows kr; room: the scratch's
// last nq·ldk + 64 floats (the column sums [ldk], the row sums [nq]; on words, then dz's words).
// False where some dz is not finite (nothing done: the differences).
// On bf16 pair products (Ops, the row pass's words: Qᵀ dz on the query row pairs qn, dz K on the
// key pairs krw), dz is rounded to bf16 first and the sums are of the rounded dz', so the two
// terms are 2 Σ dz' (q − k) as the differences would form it: the rounding errs by 2^-9 of each
// term, as the dot scores' dz do on words, rather than 2^-9 of |dz|·‖k‖ against a small ‖q − k‖.
template <class Ops>
bool distance_row_products(const family_rows& pr, float* dz, float* room) {
  constexpr bool pairs = Ops::kPack == 2;
  const std::int64_t ld = pr.ldk, nq = pr.nq;
  float* sums = room;
  float* rows = sums + ld;
  vi bad{};
  for (std::int64_t i = 0; i < nq * ld; i += W) bad |= not_finite(load(dz + i));
  if (any_lane(bad)) return false;
  for (std::int64_t y = 0; y < ld; y += W) store(sums + y, vf{});
  for (std::int64_t r = 0; r < nq; ++r) {
    vf row{};
    for (std::int64_t y = 0; y < ld; y += W) {
      vf d = load(dz + r * ld + y);
      if constexpr (pairs) d = round_to_bf16(d), store(dz + r * ld + y, d);
      store(sums + y, load(sums + y) + d);
      row += d;
    }
    float t = 0.0f;
    for (int x = 0; x < W; ++x) t += row[x];
    rows[r] = t;
  }
  // the sums' terms first (on words the room then takes dz's words)
  for (std::int64_t x = 0; x < pr.P; ++x)
    for (std::int64_t y = 0; y < ld; y += W) {
      float* o = pr.dkt + x * ld + y;
      store(o, load(o) + load(pr.kt + x * ld + y) * (splat(2.0f) * load(sums + y)));
    }
  for (std::int64_t r = 0; pr.dq && r < nq; ++r) {
    const float f = 2.0f * rows[r];
    for (std::int64_t x = 0; x < pr.P; ++x) pr.dq[r * pr.dqs + x] += f * pr.q[r * pr.qsn + x];
  }
  for (std::int64_t i = 0; i < nq * ld; i += W) store(dz + i, load(dz + i) * splat(-2.0f));
  if constexpr (pairs) {
    auto* words = reinterpret_cast<typename Ops::word*>(room);
    const std::int64_t nqp = (nq + 1) / 2;
    gemm<Ops>(pr.P, ld, nqp, pr.qn, 1, pr.P, Ops::pack_rows(dz, nq, ld, words), ld, pr.dkt, ld, true);  // dKᵀ += Qᵀ (−2 dz')
    if (!pr.dq) return true;
    for (std::int64_t i = 0; i < nq * ld; i += W) store_lane_pairs(words + i / 2, load(dz + i));
    gemm<Ops>(nq, pr.Pp, ld / 2, words, ld / 2, 1, pr.krw, pr.Pp, pr.dq, pr.dqs, true);  // dq += (−2 dz') K
  } else {
    gemm<fam_ops>(pr.P, ld, nq, pr.q, 1, pr.qsn, dz, ld, pr.dkt, ld, true);  // dKᵀ += Qᵀ (−2 dz)
    if (pr.dq) gemm<fam_ops>(nq, pr.Pp, ld, dz, ld, 1, pr.kr, pr.Pp, pr.dq, pr.dqs, true);  // dq += (−2 dz) K
  }
  return true;
}

inline bool elementwise(const family_params& fp) { return fp.score != family_score::dot; }

// ---- box scores from products: only the side of h² matters ----
// The box kernel reads z = ‖q − k‖² only through 1{z ≤ h²}. Its scores come from the products of
// the register tile, z' = ‖q‖² + ‖k‖² − 2 q·k in f32, which errs by at most (2P + 4)·u·T (T =
// ‖q‖² + ‖k‖², u = 2^-24); the differences' own f32 sum errs by at most (P + 3)·u·‖q − k‖² ≤
// 2(P + 3)·u·T. Where |z' − h²| exceeds the sum of both (with margin: (4P + 20)·u·T), z' and the
// differences lie on the same side of h², so the kernel gives the differences' K; a vector of
// lanes with any pair closer to h² (or a NaN or ±inf) is recomputed by differences. One product
// per term instead of a difference and a product, on the tile rather than a sum per pair.
inline bool box_by_products(const family_params& fp) {
  return fp.score == family_score::distance && fp.act == family_act::box && fp.bias == 0.0f;
}
inline vf box_tolerance(std::int64_t P) { return splat(float(4 * P + 20) * 0x1p-24f); }
inline vi box_uncertain(vf z, vf T, vf h2, vf tol) {
  const vf d = z - h2;
  const vf ad = (vf)((vi)d & splati(0x7fffffff));
  return ~(ad > tol * T);  // NaN or ±inf: uncertain
}
// The triangle kernel reads z itself (1 − √z/h, and act′ = −1/(2h√z)): on bf16 words its scores
// come from the products where those err by at most 2^-12 of z — (4P + 20)·u·T·2^11 ≤ z', the
// margin over (2P + 4)·u·T as for box — so α errs by at most 2^-13·ρ/h and act′ by 2^-13 of
// itself, a sixteenth of the bf16 rounding α and dz take for their products; elsewhere (keys close
// to their queries at a large norm, NaN, ±inf) the differences. (With f32 inputs the bound would
// admit few pairs, T ≈ z there: the f32 path keeps the differences.)
inline vi triangle_uncertain(vf z, vf T, vf tol) { return ~(splat(2048.0f) * tol * T <= z); }
inline vi distance_uncertain(family_act act, vf z, vf T, vf h2, vf tol) {
  return act == family_act::box ? box_uncertain(z, T, h2, tol) : triangle_uncertain(z, T, tol);
}

// Whether any lane of m is set: an or-tree of lane shuffles (no scalar test per lane).
template <int H>
inline vi or_lanes(vi m) {
  if constexpr (H == 0) return m;
  else return or_lanes<H / 2>(m | (vi)xor_lanes<H>((vf)m, std::make_integer_sequence<int, W>{}));
}
inline bool any_set(vi m) { return or_lanes<W / 2>(m)[0] != 0; }
// Σ_x a[x]·b[x] over n contiguous floats (vectors, their lanes summed, then the tail).
inline float row_dot(const float* a, const float* b, std::int64_t n) {
  vf acc{};
  std::int64_t x = 0;
  for (; x + W <= n; x += W) acc += load(a + x) * load(b + x);
  float s = 0.0f;
  for (int l = 0; l < W; ++l) s += acc[l];
  for (; x < n; ++x) s += a[x] * b[x];
  return s;
}

// Lane layout: S[jj][L] = q·k (the products, however taken) → z = ‖q − k‖² as elem_lane_scores
// <distance_terms> would give it — box: up to the side of h²; triangle: within 2^-12 of z
// (distance_uncertain) — from the f32 rows lb.qt and lb.k. Keys from kend on (which
// no lane sees: the bf16 products' pair of the last key, past Nk) are not read; their S is left.
template <int CC>
void distance_lane_finish(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* S, std::int64_t kend) {
  const std::int64_t L = CC * W;
  nb = imax(0, imin(nb, kend - j0));
  vf qn[CC];  // ‖q‖² of the lanes and ‖k‖² of the keys: the call's (fused.cc, find_norms)
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) qn[c] = load(lb.qn2 + c * W);
  const float* kn2 = lb.kn2 + j0;
  const vf h2 = splat(lb.fp.h * lb.fp.h), tol = box_tolerance(lb.P);
  const family_act act = lb.fp.act;
  // z' of the whole block, then (rarely) the differences of the vectors some pair of which is
  // uncertain
  vi any{};
  for (std::int64_t jj = 0; jj < nb; ++jj) {
    const vf kn = splat(kn2[jj]);
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) {
      float* sj = S + jj * L + c * W;
      const vf z = qn[c] + kn - splat(2.0f) * load(sj);
      any |= distance_uncertain(act, z, qn[c] + kn, h2, tol);
      store(sj, z);
    }
  }
  if (!any_set(any)) return;
  const distance_terms tm;
  for (std::int64_t jj = 0; jj < nb; ++jj) {
    const float* kj = lb.k + (j0 + jj) * lb.ksn;
    const vf kn = splat(kn2[jj]);
    for (int c = 0; c < CC; ++c) {
      if (!any_set(distance_uncertain(act, load(S + jj * L + c * W), qn[c] + kn, h2, tol))) continue;
      vf acc{};
      for (std::int64_t x = 0; x < lb.P; ++x) acc += tm.term(x, load(lb.qt + x * L + c * W), splat(kj[x]));
      store(S + jj * L + c * W, acc);
    }
  }
}

template <int CC>
void box_lane_scores(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* S) {
  const std::int64_t L = CC * W;
  gemm<fam_ops, true>(nb, L, lb.P, lb.k + j0 * lb.ksn, lb.ksn, 1, lb.qt, L, S, L, false);
  distance_lane_finish<CC>(lb, j0, nb, S, j0 + nb);
}

// Row layout: S[r][y] = q·k (the products, however taken) → z as elem_row_scores<distance_terms>
// would give it (box: up to the side of h²; triangle: within 2^-12 of z), from the f32 rows pr.q
// and the f32 key block pr.kt.
inline void distance_row_finish(const family_rows& pr, float* S) {
  const std::int64_t ld = pr.ldk;
  // ‖k‖² of the block's keys (ld <= kRowKeyBlock rounded up to W), 0 past nb as the zero keys'
  // there, and ‖q‖² of the rows: the call's (fused.cc, find_norms)
  alignas(64) float kn[kRowKeyBlock + 64];
  for (std::int64_t y = 0; y < ld; ++y) kn[y] = y < pr.nb ? pr.kn2[y] : 0.0f;
  const vf h2 = splat(pr.fp.h * pr.fp.h), tol = box_tolerance(pr.P);
  const family_act act = pr.fp.act;
  vi any{};
  for (std::int64_t r = 0; r < pr.nq; ++r) {
    const vf qn = splat(pr.qn2[r]);
    for (std::int64_t y = 0; y < ld; y += W) {
      float* sr = S + r * ld + y;
      const vf T = qn + load(kn + y);
      const vf z = T - splat(2.0f) * load(sr);
      any |= distance_uncertain(act, z, T, h2, tol);
      store(sr, z);
    }
  }
  if (!any_set(any)) return;
  const distance_terms tm;
  for (std::int64_t r = 0; r < pr.nq; ++r) {
    const float* qr = pr.q + r * pr.qsn;
    const vf qn = splat(pr.qn2[r]);
    for (std::int64_t y = 0; y < ld; y += W) {
      const vf T = qn + load(kn + y);
      if (!any_set(distance_uncertain(act, load(S + r * ld + y), T, h2, tol))) continue;
      vf acc{};
      for (std::int64_t x = 0; x < pr.P; ++x) acc += tm.term(x, splat(qr[x]), load(pr.kt + x * ld + y));
      store(S + r * ld + y, acc);
    }
  }
}

inline void box_row_scores(const family_rows& pr, float* S) {
  gemm<fam_ops, true>(pr.nq, pr.ldk, pr.P, pr.q, pr.qsn, 1, pr.kt, pr.ldk, S, pr.ldk, false);
  distance_row_finish(pr, S);
}

template <int CC>
void lane_transform(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* S, float* G, const float* mask);

// The mask tile of keys [j0, j0 + nb) into `mask` ([nb][L]). True where the block may be
// skipped (family_params::zero_skip, the tile -inf for every row): S [nb][L] is then -inf, what
// its scores would have been, and G (when not null) 0.
template <int CC>
bool lane_mask(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* S, float* G, float* mask) {
  const std::int64_t L = CC * W;
  const family_params& fp = lb.fp;
  if (!fp.mask) return false;
  if (fp.mask(fp.mask_ctx, j0, nb, mask, 1, L) != mask_tile_kind::excluded || !fp.zero_skip) return false;
  for (std::int64_t i = 0; i < nb * L; i += W) store(S + i, splat(-kInf));
  if (G)
    for (std::int64_t i = 0; i < nb * L; i += W) store(G + i, vf{});
  return true;
}

// S[jj][x] (row stride L) = s of key j0 + jj for lane x; G likewise act'(z) (when not null).
// True where the mask hides the block from every lane and it was skipped (lane_mask).
template <int CC>
bool lane_scores(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* S, float* G, float* mask) {
  const std::int64_t L = CC * W;
  if (lane_mask<CC>(lb, j0, nb, S, G, mask)) return true;
  if (box_by_products(lb.fp)) box_lane_scores<CC>(lb, j0, nb, S);
  else if (elementwise(lb.fp)) with_terms(lb.fp, [&](const auto& tm) { elem_lane_scores<CC>(lb, tm, j0, nb, S); });
  else gemm<fam_ops, true>(nb, L, lb.P, lb.k + j0 * lb.ksn, lb.ksn, 1, lb.qt, L, S, L, false);
  lane_transform<CC>(lb, j0, nb, S, G, mask);
  return false;
}

// Whether lane_transform leaves the scores of keys [j0, j0 + nb) as they are: the identity
// activation without bias or mask, every lane's range holding the whole block, no act′ asked.
template <int CC>
bool lane_transform_is_identity(const family_lanes& lb, std::int64_t j0, std::int64_t nb, const float* G) {
  const family_params& fp = lb.fp;
  const bool plain = fp.act == family_act::identity && fp.bias == 0.0f;
  bool ranged = lb.nl < CC * W;
  for (std::int64_t x = 0; x < lb.nl; ++x) ranged |= lb.lo[x] > j0 || lb.hi[x] < j0 + nb;
  return plain && !fp.mask && !ranged && !G;
}

// z = zscale · S, then lane_transform; with pending (see lane_scores_pairs) the product is left
// to the caller where the transform would leave the scores as they are.
template <int CC>
void lane_scale_transform(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* S, const float* mask,
                          float* pending) {
  if (pending && lb.zscale != 1.0f && lane_transform_is_identity<CC>(lb, j0, nb, nullptr)) {
    *pending = lb.zscale;
    return;
  }
  if (lb.zscale != 1.0f)
    for (std::int64_t i = 0; i < nb * lb.L; i += W) store(S + i, load(S + i) * splat(lb.zscale));
  lane_transform<CC>(lb, j0, nb, S, nullptr, mask);
}

// The end of the keys some lane sees: the largest hi of the lanes whose range is not empty (an
// empty range's hi may lie past Nk). The bf16 forward's blocks are whole key pairs, and the pair
// past Nk must not be read from the f32 key rows.
inline std::int64_t seen_keys_end(const family_lanes& lb) {
  std::int64_t kend = 0;
  for (std::int64_t x = 0; x < lb.nl; ++x)
    if (lb.lo[x] < lb.hi[x]) kend = imax(kend, std::int64_t(lb.hi[x]));
  return kend;
}

// The same for dot scores on bf16 pair operands (j0 and nb even): z = zscale · (q·k). pending
// (the streaming distributions' α, which reads each score once): where the transform leaves the
// scores as they are, S keeps q·k and *pending = zscale, the product left to α (one pass over
// the scores the fewer); else *pending = 1.
template <class Ops, int CC>
bool lane_scores_pairs(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* S, float* mask,
                       float* pending = nullptr) {
  const std::int64_t L = CC * W;
  if (pending) *pending = 1.0f;
  if (lane_mask<CC>(lb, j0, nb, S, nullptr, mask)) return true;
  gemm<Ops, true>(nb, L, lb.P / 2, lb.kw + j0 * lb.kwsn, lb.kwsn, 1, lb.qtw, L, S, L, false);
  if (lb.fp.score == family_score::distance) {  // box, triangle (fused.cc, box_bf16_products): q·k from the
    // words, the rest from the f32 rows (lb.qt, lb.k); zscale is 1; keys no lane sees are not read
    distance_lane_finish<CC>(lb, j0, nb, S, seen_keys_end(lb));
    lane_transform<CC>(lb, j0, nb, S, nullptr, mask);
    return false;
  }
  lane_scale_transform<CC>(lb, j0, nb, S, mask, pending);
  return false;
}

// Scores S (raw z) of keys [j0, j0 + nb) → s = act(z + bias) + mask (the tile lane_mask filled),
// -inf outside each lane's key range; G = act'(z) when not null.
template <int CC>
void lane_transform(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* S, float* G, const float* mask) {
  const std::int64_t L = CC * W;
  const family_params& fp = lb.fp;
  const bool plain = fp.act == family_act::identity && fp.bias == 0.0f;
  if (lane_transform_is_identity<CC>(lb, j0, nb, G)) return;
  const vf bias = splat(fp.bias);
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) {
    const vi lo = loadi(lb.lo + c * W), hi = loadi(lb.hi + c * W);
    for (std::int64_t jj = 0; jj < nb; ++jj) {
      float* sj = S + jj * L + c * W;
      vf g = splat(1.0f), s = load(sj);
      if (!plain) s = fam_act(fp.act, s + bias, &g, fp.h);
      if (fp.mask) s += load(mask + jj * L + c * W);
      const vi j = splati(std::int32_t(j0 + jj));
      store(sj, vselect((j >= lo) & (j < hi), s, splat(-kInf)));
      if (G) store(G + jj * L + c * W, g);
    }
  }
}

// The k-th largest (1-based) of a[0, n), 1 <= k <= n; reorders a (Hoare selection).
inline float kth_largest(float* a, std::int64_t n, std::int64_t k) {
  std::int64_t lo = 0, hi = n - 1;
  const std::int64_t want = k - 1;
  while (lo < hi) {
    const float pivot = a[lo + (hi - lo) / 2];
    std::int64_t i = lo, j = hi;
    while (i <= j) {
      while (a[i] > pivot) ++i;
      while (a[j] < pivot) --j;
      if (i <= j) {
        const float tmp = a[i];
        a[i] = a[j], a[j] = tmp;
        ++i, --j;
      }
    }
    if (want <= j) hi = j;
    else if (want >= i) lo = i;
    else return a[want];
  }
  return a[want];
}

// Visits the keys idx[0, nidx) two at a time — visit(a, jj) adds key jj into set a (0 or 1) of
// the caller's sums (two chains of adds, each half as long) and says whether some lane keeps it
// — and compacts the kept keys to the front in place, without a branch (which keys stay is data,
// not a pattern the predictor learns). Returns their count.
template <class Visit>
std::int64_t visit_pairs(std::int32_t* idx, std::int64_t nidx, Visit&& visit) {
  std::int64_t kept = 0, e = 0;
  for (; e + 1 < nidx; e += 2) {
    const std::int32_t j0 = idx[e], j1 = idx[e + 1];
    const bool k0 = visit(0, j0), k1 = visit(1, j1);
    idx[kept] = j0, kept += k0;
    idx[kept] = j1, kept += k1;
  }
  if (e < nidx) {
    const std::int32_t j0 = idx[e];
    idx[kept] = j0, kept += visit(0, j0);
  }
  return kept;
}

// The first pass of sparsemax's and entmax15's threshold search over every key x(jj) of a lane
// vector: the sums over the keys above each of four cuts at once — cnt, Σx and, with Squares,
// Σx² into s2[0, 4) (s2 unused without) — from which the caller takes its starting τ (a lower
// bound of every lane's, so the iterations that follow start near it: on the benchmark's scores,
// 2–3 iterations where 7–9 started from the first cut alone, each over the keys some lane still
// holds), and idx compacted to the keys some lane holds above cuts[0]. Returns their count.
// (Not inlined: inlined into lane_stats, it crashed GCC 12.2's SLP vectoriser.)
template <bool Squares, class X>
[[gnu::noinline]] std::int64_t cut_sums(std::int64_t n, X&& x_of, const float (&cuts)[4], vf (&cnt)[4], vf (&s1)[4],
                                        vf* s2, std::int32_t* idx) {
  std::int64_t kept = 0;
  vf c[4] = {}, t1[4] = {}, t2[4] = {};  // (in registers: the outputs, references, were kept in memory)
  const vf cut[4] = {splat(cuts[0]), splat(cuts[1]), splat(cuts[2]), splat(cuts[3])};
  for (std::int64_t jj = 0; jj < n; ++jj) {
    const vf x = x_of(jj), xx = x * x, one = splat(1.0f);
#pragma GCC unroll 4
    for (int a = 0; a < 4; ++a) {
      const vi in = x > cut[a];
      c[a] = add_if(in, c[a], one);
      t1[a] = add_if(in, t1[a], x);
      if constexpr (Squares) t2[a] = add_if(in, t2[a], xx);
    }
    idx[kept] = std::int32_t(jj), kept += any_gt(x, cut[0]);
  }
  for (int a = 0; a < 4; ++a) {
    cnt[a] = c[a], s1[a] = t1[a];
    if constexpr (Squares) s2[a] = t2[a];
  }
  return kept;
}

// The elements of v above t (per lane), stored one after another from dst; their count. dst has
// room for W floats: on AVX-512 the elements are packed in a register (vcompressps to memory is
// microcoded: 8 % of an entmax15 forward went to the instruction after it) and the whole vector
// stored, zeros in the lanes past the count.
inline std::int64_t store_above(float* dst, vf v, vf t) {
#if defined(__AVX512F__)
  if constexpr (sizeof(vf) == 64) {
    const unsigned short m = __builtin_ia32_cmpps512_mask(v, t, 0x1e, 0xffff, 4);  // _CMP_GT_OQ
    store(dst, __builtin_ia32_compresssf512_mask(v, vf{}, m));
    return __builtin_popcount(m);
  }
#endif
  std::int64_t k = 0;
  for (int i = 0; i < W; ++i)
    if (v[i] > t[i]) dst[k++] = v[i];
  return k;
}

// Lane by lane after cut_sums: the keys idx[0, nidx) with x(jj) above the lane's start tau,
// W at a time transposed in registers into the lane's list (lists + x·ld, len[x] of them).
template <class X>
void lane_lists(const std::int32_t* idx, std::int64_t nidx, X&& x_of, vf tau, float* lists, std::int64_t ld,
                std::int64_t* len) {
  for (int x = 0; x < W; ++x) len[x] = 0;
  std::int64_t e = 0;
  for (; e + W <= nidx; e += W) {
    vf v[W];
#pragma GCC unroll 16
    for (int k = 0; k < W; ++k) v[k] = x_of(idx[e + k]);
    transpose(v);
#pragma GCC unroll 16
    for (int x = 0; x < W; ++x) len[x] += store_above(lists + x * ld + len[x], v[x], splat(tau[x]));
  }
  for (; e < nidx; ++e) {
    const vf v = x_of(idx[e]);
    for (int x = 0; x < W; ++x)
      if (v[x] > tau[x]) lists[x * ld + len[x]++] = v[x];
  }
}

// One lane's threshold search over its list l[0, len) (room for W more): each pass sums cnt, Σx,
// Σx² and the least x over the keys above τ, keeps only those, and hands the sums to
// step(cnt, s1, s2, mn, tau, done), which returns the next τ; at most `passes` passes.
template <class Step>
float lane_search(float* l, std::int64_t len, float tau, int passes, Step&& step) {
  for (int it = 0; it < passes; ++it) {
    for (int i = 0; i < W; ++i) l[len + i] = -kInf;  // (whole vectors: -inf is above no τ)
    vf cnt{}, s1{}, s2{}, mn = splat(kInf);
    const vf tv = splat(tau);
    std::int64_t kept = 0;
    for (std::int64_t i = 0; i < len; i += W) {
      const vf x = load(l + i);
      const vi in = x > tv;
      cnt = add_if(in, cnt, splat(1.0f));
      s1 = add_if(in, s1, x);
      s2 = add_if(in, s2, x * x);
      mn = vselect(in, vmin(mn, x), mn);
      kept += store_above(l + kept, x, tv);  // (W floats from kept <= i: all read already)
    }
    len = kept;
    float c = 0.0f, a = 0.0f, b = 0.0f, m = kInf;
    for (int i = 0; i < W; ++i) c += cnt[i], a += s1[i], b += s2[i], m = m < mn[i] ? m : mn[i];
    bool done = false;
    tau = step(c, a, b, m, tau, done);
    if (done) break;
  }
  return tau;
}

// Top-k whose k best stay in registers (topk_lanes, k a constant): it takes the max from them and
// hands over the kept keys; above kVectorTopk, the scalar search over every lane's scores.
template <family_dist Dist>
inline bool topk_in_registers(const family_params& fp) {
  return Dist == family_dist::topk && fp.topk <= kVectorTopk;
}

// Kept keys by lane: cnt[x] of them at idx[x·kmax ..] (none asked where cnt is null).
struct lane_kept {
  std::int32_t* cnt = nullptr;
  std::int32_t* idx = nullptr;
  std::int64_t kmax = 0;
};

// Top-k (K <= kVectorTopk) of the lanes of one vector, scores S[jj·L] of keys kbase + jj: the k
// best of each lane as K sorted vectors (an insertion of each score that beats the K-th), then
// one pass for the ties kept at the K-th score (cut: the last one kept) and the sum of
// e^{s - m0} over the kept keys (m: the max, the best; m0 = m, or 0 where m = -inf); with kept
// given (kept.cnt zeroed), each lane x's kept keys in key order into kept.idx[x·kmax ..]. Its
// own function, K a constant: the best vectors and the sums stay in registers (indexed by a
// run-time k they lived on the stack, each step a store and a reload).
template <int K>
[[gnu::noinline]] void topk_lanes(const float* S, std::int64_t L, std::int64_t n, std::int64_t kbase, vf& m, vf& th,
                                  vi& cut, vf& sum_out, const lane_kept& kept) {
  vf best[K];
#pragma GCC unroll 16
  for (int i = 0; i < K; ++i) best[i] = splat(-kInf);
  for (std::int64_t jj = 0; jj < n; ++jj) {
    vf s = load(S + jj * L);
    if (!any_gt(s, best[K - 1])) continue;
    // Into the sorted best[0] >= ... >= best[K-1]: best[i] becomes max(best[i], min(best[i-1], s))
    // (s itself where it falls between them), all from the old values — two instructions deep,
    // where a chain of compare-exchanges down the list was 2K deep.
#pragma GCC unroll 16
    for (int i = K - 1; i > 0; --i) best[i] = vmax(best[i], vmin(best[i - 1], s));
    best[0] = vmax(best[0], s);
  }
  // The max is the best; the keys above the K-th score are all among the K best (a multiset of
  // the scores): count them there rather than in a pass over every key.
  m = best[0];
  const vf m0 = vselect(m == splat(-kInf), vf{}, m);
  const vf t = best[K - 1];
  vf gt{};
#pragma GCC unroll 16
  for (int i = 0; i < K - 1; ++i) gt += vselect(best[i] > t, splat(1.0f), vf{});
  const vf need = splat(float(K)) - gt;
  // The sum over the kept keys in key order, an exp only for the keys some lane keeps. (Summed
  // from the best vectors, in their order, it was 15 % faster, but the backward that finds the
  // kept keys again then missed the forward's bits: FamilyFused.SparseRowsKeepTheirKeys under
  // ASan.)
  vf sum{};
  vf ties{};
  vi c = splati(-1);
  for (std::int64_t jj = 0; jj < n; ++jj) {
    const vf s = load(S + jj * L);
    if (!any_ge(s, t)) continue;  // (no lane keeps it nor ties: most vectors stop here)
    const vi eq = (s == t) & (s > splat(-kInf));
    ties = add_if(eq, ties, splat(1.0f));
    const vi take = eq & (ties <= need), keep = (s > t) | take;
    c = take ? splati(std::int32_t(kbase + jj)) : c;
    if (!any_lane(keep)) continue;
    sum += vselect(keep, exp_nat(s - m0), vf{});
    if (kept.cnt)
      for (int x = 0; x < W; ++x)
        if (keep[x] && kept.cnt[x] < kept.kmax) kept.idx[x * kept.kmax + kept.cnt[x]++] = std::int32_t(kbase + jj);
  }
  th = t, cut = c, sum_out = sum;
}

// Statistics of every lane from the stored scores S [n][L] of keys [kbase, kbase + n), into
// lb.st (r not touched).
// With kept given (top-k, k a constant), each lane's kept keys too (lanes c·W + x at cnt + c·W,
// idx + (c·W)·kmax).
template <family_dist Dist, int CC>
void lane_stats(const family_lanes& lb, const float* S, std::int64_t n, std::int64_t kbase, float* buf,
                const lane_kept& kept = {}) {
  const std::int64_t L = CC * W;
  const family_params& fp = lb.fp;
  // sparsemax, entmax15: the keys some lane still holds above τ (τ only rises, so each pass
  // visits only the keys the previous one kept).
  std::int32_t* idx = reinterpret_cast<std::int32_t*>(buf);
  constexpr bool kArg = Dist == family_dist::hardmax || Dist == family_dist::hardmax_st;
  // top-k with k a constant takes the max from its k best (topk_lanes): no pass of its own.
  const bool vector_topk = topk_in_registers<Dist>(fp);
#pragma GCC unroll 1
  for (int c = 0; c < CC; ++c) {
    vf m = splat(-kInf);
    vi arg = splati(-1);
    // The max and its first key in four chains, merged after (one chain of vmaxps, a key at its
    // latency, was most of top-k's statistics). The key (arg) only for hardmax: it is dead code
    // for the others once their merge takes the max alone.
    if (!vector_topk) {
      vf mp[4] = {splat(-kInf), splat(-kInf), splat(-kInf), splat(-kInf)};
      vi ap[4] = {splati(-1), splati(-1), splati(-1), splati(-1)};
      std::int64_t j4 = 0;
      for (; j4 + 4 <= n; j4 += 4)
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
          const vf s = load(S + (j4 + p) * L + c * W);
          const vi gt = s > mp[p];
          mp[p] = vselect(gt, s, mp[p]);
          ap[p] = gt ? splati(std::int32_t(kbase + j4 + p)) : ap[p];
        }
      for (; j4 < n; ++j4) {  // (the last keys, after every other in chain 0)
        const vf s = load(S + j4 * L + c * W);
        const vi gt = s > mp[0];
        mp[0] = vselect(gt, s, mp[0]);
        ap[0] = gt ? splati(std::int32_t(kbase + j4)) : ap[0];
      }
      m = mp[0], arg = ap[0];
      for (int p = 1; p < 4; ++p) {  // the larger, or the first key of equal ones
        if constexpr (kArg) {
          const vi take = (mp[p] > m) | ((mp[p] == m) & (ap[p] >= 0) & ((ap[p] < arg) | (arg < 0)));
          m = vselect(take, mp[p], m);
          arg = take ? ap[p] : arg;
        } else {
          m = vselect(mp[p] > m, mp[p], m);
        }
      }
    }
    const vi empty = m == splat(-kInf);
    const vf m0 = vselect(empty, vf{}, m);
    vf t = splat(kInf), lse = splat(kInf);
    vi cut = splati(-1);
    switch (Dist) {
      case family_dist::softmax: {
        vf sum{};
        for (std::int64_t jj = 0; jj < n; ++jj) sum += exp_nat(load(S + jj * L + c * W) - m0);
        for (int x = 0; x < W; ++x)
          if (!empty[x]) t[x] = m[x] + __builtin_logf(sum[x]);
        break;
      }
      case family_dist::sparsemax: {
        // τ (relative to m) is at least (Σ_A x - 1) / |A| for any set A of keys (the largest
        // over A is τ): the four cuts' sets start it (cut_sums), then each pass takes A = the
        // keys above τ, until none of them falls below the new τ.
        static constexpr float kCuts[4] = {-1.0f, -0.75f, -0.5f, -0.25f};
        vf cnt4[4], s14[4];
        std::int64_t nidx = cut_sums<false>(n, [=](std::int64_t jj) { return load(S + jj * L + c * W) - m0; }, kCuts,
                                            cnt4, s14, nullptr, idx);
        vf tau = splat(-1.0f);
        for (int a = 0; a < 4; ++a)
          tau = vmax(tau, vselect(cnt4[a] > vf{}, (s14[a] - splat(1.0f)) / vmax(cnt4[a], splat(1.0f)), splat(-1.0f)));
        vi done = empty;
        for (std::int64_t it = 0; it <= n && !all_lanes(done); ++it) {
          // Two keys a step into two sets of sums (visit_pairs), summed after. (Lane by lane, as
          // entmax15's, took 4 % more: from the cuts' start 2–3 passes are left here.)
          vf cnt_[2] = {}, s1_[2] = {}, mn_[2] = {splat(kInf), splat(kInf)};
          const auto visit = [&](int a, std::int32_t jj) {
            const vf x = load(S + jj * L + c * W) - m0;
            const vi in = x > tau;
            cnt_[a] = add_if(in, cnt_[a], splat(1.0f));
            s1_[a] = add_if(in, s1_[a], x);
            mn_[a] = vselect(in, vmin(mn_[a], x), mn_[a]);
            return any_gt(x, tau);
          };
          nidx = visit_pairs(idx, nidx, visit);
          const vf cnt = cnt_[0] + cnt_[1], s1 = s1_[0] + s1_[1], mn = vmin(mn_[0], mn_[1]);
          const vf tc = (s1 - splat(1.0f)) / vmax(cnt, splat(1.0f));
          tau = vselect(done, tau, tc);
          done |= tc < mn;
        }
        t = vselect(empty, splat(kInf), tau);
        lse = m0;
        break;
      }
      case family_dist::entmax15: {
        // τ (on x = s/2 - max/2) solves f(τ) = Σ_{x > τ} (x - τ)² - 1 = 0, f decreasing: the
        // largest of the four cuts with f >= 0 starts it (cut_sums), Newton's steps from below
        // (f convex) or the closed form over the keys above τ once it holds them all.
        const vf h = splat(0.5f), mh = m0 * h;
        static constexpr float kCuts[4] = {-1.0f, -0.5f, -0.25f, -0.125f};
        vf cnt4[4], s14[4], s24[4];
        std::int64_t nidx = cut_sums<true>(n, [=](std::int64_t jj) { return load(S + jj * L + c * W) * h - mh; }, kCuts,
                                           cnt4, s14, s24, idx);
        // From each cut with f >= 0, a Newton step (63/64 of it, against rounding) stays below the
        // root (f convex: its tangent lies below it), and the largest starts the lists: on the
        // benchmark's scores they held about a third of the keys from the cut alone.
        vf tau = splat(-1.0f);
        for (int a = 0; a < 4; ++a) {  // f(cut) = Σx² - 2·cut·Σx + cut²·cnt - 1 over the keys above it
          const float ta = kCuts[a];
          const vf fa = s24[a] - splat(2.0f * ta) * s14[a] + cnt4[a] * splat(ta * ta) - splat(1.0f);
          const vf dfa = splat(2.0f) * (s14[a] - cnt4[a] * splat(ta));  // -f'(cut) > 0 where a key is above
          const vf step = vselect(dfa > vf{}, fa / vmax(dfa, splat(1e-30f)) * splat(63.0f / 64.0f), vf{});
          tau = vselect(fa >= vf{}, vmax(tau, splat(ta) + step), tau);
        }
        // Then lane by lane over the keys above its τ (lane_lists), each pass over the lane's own
        // survivors: a pass over the keys some lane of W still held visited most keys each time
        // (B1 H8 N2048 D64 bf16 forward 21.9 ms, 29.2 before, same run).
        const std::int64_t ld = (n + W - 1) / W * W + W;
        float* lists = buf + (n + 15) / 16 * 16;
        std::int64_t len[W];
        lane_lists(idx, nidx, [=](std::int64_t jj) { return load(S + jj * L + c * W) * h - mh; }, tau, lists, ld, len);
        for (int x = 0; x < W; ++x)
          if (!empty[x])
            tau[x] = lane_search(lists + x * ld, len[x], tau[x], 60,
                                       [](float cnt, float s1, float s2, float mn, float tau, bool& done) {
                                         const float nc = cnt > 1.0f ? cnt : 1.0f, mean = s1 / nc;
                                         const float ss = s2 - s1 * mean;
                                         const float r = (1.0f - ss) / nc;
                                         const float tc = mean - __builtin_sqrtf(r > 0.0f ? r : 0.0f);
                                         const bool exact = tc >= tau && tc < mn;
                                         const float f = s2 - 2.0f * tau * s1 + cnt * tau * tau - 1.0f;
                                         const float df = 2.0f * (s1 - cnt * tau);
                                         const float next = exact ? tc : tau + f / (df > 1e-30f ? df : 1e-30f);
                                         const bool stuck = next <= tau;
                                         done = exact || stuck;
                                         return stuck && !exact ? tau : next;
                                       });
        t = vselect(empty, splat(kInf), tau);
        lse = mh;
        break;
      }
      case family_dist::hardmax_st: {
        vf sum{};
        for (std::int64_t jj = 0; jj < n; ++jj) sum += exp_nat(load(S + jj * L + c * W) - m0);
        for (int x = 0; x < W; ++x)
          if (!empty[x]) lse[x] = m[x] + __builtin_logf(sum[x]);
      }
        [[fallthrough]];
      case family_dist::hardmax:
        t = vselect(empty, splat(kInf), m);
        cut = arg;
        break;
      case family_dist::topk:
        if (topk_in_registers<Dist>(fp)) {
          vf mk, th, sum;
          [&]<int... K>(std::integer_sequence<int, K...>) {  // k as a constant (topk_lanes)
            const lane_kept kc = kept.cnt ? lane_kept{kept.cnt + c * W, kept.idx + c * W * kept.kmax, kept.kmax} : kept;
            (void)((fp.topk == K + 1 && (topk_lanes<K + 1>(S + c * W, L, n, kbase, mk, th, cut, sum, kc), true)) || ...);
          }(std::make_integer_sequence<int, int(kVectorTopk)>{});
          const vi none = mk == splat(-kInf);
          t = vselect(none, splat(kInf), th);
          for (int x = 0; x < W; ++x)
            if (!none[x]) lse[x] = mk[x] + __builtin_logf(sum[x]);
          break;
        }
        for (int x = 0; x < W; ++x) {
          if (empty[x]) continue;
          const std::int64_t lane = c * W + x;
          std::int64_t cnt = 0;
          for (std::int64_t jj = 0; jj < n; ++jj) {
            const float s = S[jj * L + lane];
            if (s != -kInf) buf[cnt++] = s;
          }
          const std::int64_t kk = imin(fp.topk, cnt);
          const float th = kth_largest(buf, cnt, kk);
          std::int64_t need = kk;
          for (std::int64_t jj = 0; jj < n; ++jj) need -= S[jj * L + lane] > th;
          float sum = 0.0f;
          for (std::int64_t jj = 0; jj < n; ++jj) {
            const float s = S[jj * L + lane];
            if (s > th) sum += __builtin_expf(s - m[x]);
            else if (s == th && need > 0) sum += __builtin_expf(s - m[x]), --need, cut[x] = std::int32_t(kbase + jj);
          }
          t[x] = th, lse[x] = m[x] + __builtin_logf(sum);
        }
        break;
      case family_dist::kernel: {
        vf sum{};
        for (std::int64_t jj = 0; jj < n; ++jj) {
          const vf s = load(S + jj * L + c * W);
          sum += vselect(s == splat(-kInf), vf{}, s);
        }
        lse = sum;
        t = vselect(sum > vf{}, splat(1.0f) / vmax(sum, splat(1e-30f)), vf{});
        break;
      }
      case family_dist::sigmoid:
      case family_dist::identity: break;
    }
    store(lb.st.t + c * W, t);
    store(lb.st.lse + c * W, lse);
    __builtin_memcpy(lb.st.cut + c * W, &cut, sizeof cut);
  }
}

template <int CC>
fam_stat load_stat(const family_lanes& lb, int c) {
  fam_stat st;
  st.t = load(lb.st.t + c * W), st.lse = load(lb.st.lse + c * W), st.r = load(lb.st.r + c * W);
  st.cut = loadi(lb.st.cut + c * W);
  return st;
}

// S [nb][L] of keys j0.. → α in place. Returns whether any α is nonzero (or NaN): the bits OR-ed,
// the sign's left out at the end (a ±0 product adds nothing to a sum that starts at +0),
// zero_skip's test.
template <family_dist Dist, int CC>
bool lane_alpha(const family_lanes& lb, float* S, std::int64_t j0, std::int64_t nb) {
  const std::int64_t L = CC * W;
  vi nz{};
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) {
    const fam_stat st = load_stat<CC>(lb, c);
    for (std::int64_t jj = 0; jj < nb; ++jj) {
      float* sj = S + jj * L + c * W;
      const vf a = fam_alpha<Dist>(lb.fp, load(sj), splati(std::int32_t(j0 + jj)), st);
      nz |= (vi)a;
      store(sj, a);
    }
  }
  return any_lane(nz & splati(0x7fffffff));
}

// α for the bf16 products, which round it to bf16 (2^-9): the sigmoid 1 / (1 + 2^{-(s + b)·log2 e})
// by vexp2's degree-4 polynomial and the reciprocal estimate alone (vrcp14ps, 2^-14: the bf16
// rounding of 1 α in 300 moves by one ulp, measured for s uniform in [-6, 6], where after a
// Newton step 1 in 10^5 did; the step cost 3 % of the sigmoid forward), where fam_alpha's exp and division cost
// about as much as the products (s = -inf gives exactly 0, a NaN stays NaN); every other
// distribution as fam_alpha.
// scale: a factor of s not yet applied (lane_alpha_pairs), folded into the exponent's multiply-add.
template <family_dist Dist>
inline vf fam_alpha_rounded(const family_params& fp, vf s, vi j, const fam_stat& st, float scale) {
  if constexpr (Dist == family_dist::sigmoid) {
    const vf e = vexp2<4>(s * splat(-kLog2e * scale) + splat(fp.sigmoid_bias * -kLog2e));
    return vselect(s == splat(-kInf), vf{}, vrecip<false>(splat(1.0f) + e));
  } else {
    if (scale != 1.0f) s *= splat(scale);
    return fam_alpha<Dist>(fp, s, j, st);
  }
}

// S [nb][L] (nb even) of keys j0.. → α (fam_alpha_rounded) in key pairs out [nb/2][L] of Ops's
// words, in one pass where lane_alpha and pack_rows took two. Returns whether any α is nonzero
// (asked only where the caller skips a block of zeros, family_params::zero_skip; else true).
// scale: a factor of the scores not yet applied (zscale, where lane_scores_pairs left it to α).
template <class Ops, family_dist Dist, int CC>
bool lane_alpha_pairs(const family_lanes& lb, const float* S, std::int64_t j0, std::int64_t nb,
                      typename Ops::word* out, float scale = 1.0f) {
  const std::int64_t L = CC * W;
  const family_params fp = lb.fp;  // a copy: the stores below might alias lb.fp for the compiler
  const bool tell = fp.zero_skip;   // (the callers skip a block of zeros only then)
  vi nz{};
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) {
    const fam_stat st = load_stat<CC>(lb, c);
    for (std::int64_t jj = 0; jj < nb; jj += 2) {
      const vi j = splati(std::int32_t(j0 + jj));
      const vf s0 = load(S + jj * L + c * W), s1 = load(S + (jj + 1) * L + c * W);
      const vf a0 = fam_alpha_rounded<Dist>(fp, s0, j, st, scale);
      const vf a1 = fam_alpha_rounded<Dist>(fp, s1, j + splati(1), st, scale);
      if (tell) nz |= (vi)a0 | (vi)a1;  // the bits (as lane_alpha): two ORs per pair
      storeu(out + jj / 2 * L + c * W, Ops::pair_rows(a0, a1));
    }
  }
  return !tell || any_lane(nz & splati(0x7fffffff));
}

template <int CC>
void set_empty_stats(const family_lanes& lb) {
  for (std::int64_t x = 0; x < CC * W; ++x) lb.st.t[x] = kInf, lb.st.lse[x] = kInf, lb.st.cut[x] = -1, lb.st.r[x] = 0.0f;
}

// ---- forward, lane layout ----
// Ops: f32 (fam_ops), or bf16 pairs for dot scores of bf16 inputs (family_lanes::qtw, kw, vw):
// the key range then starts on an even key and ends on one past an odd key (the zero key), the
// keys no lane sees getting s = -inf and α = 0 like any key outside a lane's range, and α is
// rounded to bf16 in pairs of keys for Oᵀ += Vᵀ A, as the core op's prefill rounds P.
template <class Ops, family_dist Dist, int CC>
void fam_forward(const family_lanes& lb, float* ot) {
  constexpr bool pairs = Ops::kPack == 2;
  const std::int64_t L = CC * W;
  for (std::int64_t i = 0; i < lb.Dv * L; ++i) ot[i] = 0.0f;
  set_empty_stats<CC>(lb);
  std::int64_t kmin, kmax;
  fam_range(lb, kmin, kmax);
  if (kmin >= kmax) return;
  if constexpr (pairs) kmin = kmin / 2 * 2, kmax = (kmax + 1) / 2 * 2;
  constexpr bool keep = family_keeps_scores(Dist);
  const lane_scratch sc(lb, keep ? kmax - kmin + kLaneKeyBlock : kLaneKeyBlock);
  float pending = 1.0f;  // (the streaming distributions: zscale left to α, lane_scores_pairs)
  const auto scores = [&](std::int64_t j0, std::int64_t nb, float* S) {
    if constexpr (pairs) return lane_scores_pairs<Ops, CC>(lb, j0, nb, S, sc.mask, keep ? nullptr : &pending);
    else return lane_scores<CC>(lb, j0, nb, S, nullptr, sc.mask);
  };
  std::int64_t k0 = kmin, k1 = kmax;  // the keys the next loops visit
  if (keep) {
    live_keys live(kmin, kmax);
    for (std::int64_t j0 = kmin; j0 < kmax; j0 += kLaneKeyBlock) {
      const std::int64_t nb = imin(kLaneKeyBlock, kmax - j0);
      live.add(j0, nb, scores(j0, nb, sc.S + (j0 - kmin) * L));
    }
    if (live.none()) return;  // every block hidden: empty rows
    k0 = live.lo, k1 = live.hi;
    lane_stats<Dist, CC>(lb, sc.S + (k0 - kmin) * L, k1 - k0, k0, sc.buf);
  }
  for (std::int64_t j0 = k0; j0 < k1; j0 += kLaneKeyBlock) {
    const std::int64_t nb = imin(kLaneKeyBlock, k1 - j0);
    float* S = keep ? sc.S + (j0 - kmin) * L : sc.S;
    if (!keep && scores(j0, nb, S)) continue;  // hidden by the mask: α = 0 (lb.alpha comes zeroed)
    if constexpr (pairs) {  // dP's room (unused by the forward) holds α as words [nb/2][L]
      auto* aw = reinterpret_cast<typename Ops::word*>(sc.dP);
      if (!lane_alpha_pairs<Ops, Dist, CC>(lb, S, j0, nb, aw, pending) && lb.fp.zero_skip) continue;
      gemm<Ops>(lb.Dv, L, nb / 2, lb.vw + j0 / 2 * lb.vwss, 1, lb.vwss, aw, L, ot, L, true);  // Oᵀ += Vᵀ A
    } else {
      const bool nonzero = lane_alpha<Dist, CC>(lb, S, j0, nb);
      if (lb.alpha)
        for (std::int64_t x = 0; x < lb.nl; ++x)
          for (std::int64_t jj = 0; jj < nb; ++jj) lb.alpha[x * lb.alpha_ld + j0 + jj] = S[jj * L + x];
      if (lb.fp.zero_skip && !nonzero) continue;  // Oᵀ += Vᵀ 0: nothing
      gemm<fam_ops>(lb.Dv, L, nb, lb.v + j0 * lb.vsn, 1, lb.vsn, S, L, ot, L, true);  // Oᵀ += Vᵀ A
    }
  }
}

// r = Σ u dP / Σ u of every lane (0 where Σ u = 0) into lb.st.r, from the scores S and dP
// [n][L] of keys kbase…, with the lanes' statistics found.
template <family_dist Dist, int CC>
void lane_r(const family_lanes& lb, const float* S, const float* dP, std::int64_t n, std::int64_t kbase) {
  const std::int64_t L = CC * W;
#pragma GCC unroll 1
  for (int c = 0; c < CC; ++c) {
    const fam_stat st = load_stat<CC>(lb, c);
    vf num{}, den{};
    for (std::int64_t jj = 0; jj < n; ++jj) {
      const vf s = load(S + jj * L + c * W);
      const vf u = fam_u<Dist>(s, fam_alpha<Dist>(lb.fp, s, splati(std::int32_t(kbase + jj)), st), st);
      num += u * load(dP + jj * L + c * W), den += u;
    }
    store(lb.st.r + c * W, vselect(den > vf{}, num / vmax(den, splat(1e-30f)), vf{}));
  }
}

// S [nb][L] of keys j0… ← dz = de·act′ (G: act′(z), null for 1), de from dP and the lanes'
// statistics; Σ dz, Σ de (and Σ de ∂e/∂h for the triangle kernel, where sum_dh is given) added.
// Returns whether any dz is nonzero (or NaN), as lane_alpha.
template <family_dist Dist, int CC>
bool lane_dz(const family_lanes& lb, float* S, const float* dP, const float* G, std::int64_t j0, std::int64_t nb,
             vf& sum_dz, vf& sum_de, vf* sum_dh) {
  const std::int64_t L = CC * W;
  const bool tri = sum_dh && lb.fp.act == family_act::triangle;
  vi nz{};
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) {
    const fam_stat st = load_stat<CC>(lb, c);
    for (std::int64_t jj = 0; jj < nb; ++jj) {
      const std::int64_t e = jj * L + c * W;
      const vf s = load(S + e), a = fam_alpha<Dist>(lb.fp, s, splati(std::int32_t(j0 + jj)), st);
      const vf de = fam_de<Dist>(s, a, load(dP + e), st);
      const vf g = G ? load(G + e) : splat(1.0f), dz = de * g;
      sum_de += de, sum_dz += dz;
      if (tri) *sum_dh += de * triangle_dh(g, lb.fp.h);
      nz |= (vi)dz;
      store(S + e, dz);
    }
  }
  return any_lane(nz & splati(0x7fffffff));
}

// ---- backward dq, lane layout ----
//   dP = V doutᵀ; r = Σ u dP / Σ u; dS = w (dP - r) act'; dqᵀ += Kᵀ dS
// Ops: f32, or bf16 pairs for dot scores of bf16 inputs (family_lanes::qtw, kw, vrw, kpw and
// io.douttw; act the identity): key ranges widened to whole pairs as in the forward, dS rounded
// to bf16 for dqᵀ += Kᵀ dS.
// The pass itself, with its two products given: scores_dp(j0, nb, S, dP, G, mask, no_dz) forms
// the scores of keys [j0, j0 + nb) (act′ into G where need_g) and, unless no_dz, dP — true where
// the mask hid the block (lane_mask; dP is then 0: α = 0 meets it in r's sums); dq_product(j0, nb,
// dS, G, sc) adds Kᵀ dS into io.dqt (G: the block's act′ where need_g, else null; sc: the
// scratch — without act′, G's room is free for packed words). The AMX pass (amx level) gives its
// tile products.
template <class Ops, family_dist Dist, int CC, class ScoresDp, class DqProduct>
void fam_dq_with(const family_lanes& lb, const family_dq_io& io, ScoresDp&& scores_dp, DqProduct&& dq_product) {
  constexpr bool pairs = Ops::kPack == 2;
  const std::int64_t L = CC * W;
  for (std::int64_t i = 0; i < lb.P * L; ++i) io.dqt[i] = 0.0f;
  set_empty_stats<CC>(lb);
  std::int64_t kmin, kmax;
  fam_range(lb, kmin, kmax);
  if (kmin >= kmax) return;
  if constexpr (pairs) kmin = kmin / 2 * 2, kmax = (kmax + 1) / 2 * 2;
  const family_params& fp = lb.fp;
  constexpr bool keep = family_keeps_scores(Dist);
  const lane_scratch sc(lb, keep ? kmax - kmin + kLaneKeyBlock : kLaneKeyBlock);
  const bool need_g = !pairs && fp.act != family_act::identity;
  // No gradient reaches the scores through the one-hot (hardmax) or the box indicator: the pass
  // only finds the row statistics (sigmoid still sums de for dsigmoid_bias).
  const bool no_dz = Dist == family_dist::hardmax || (fp.act == family_act::box && Dist != family_dist::sigmoid);
  const auto scores = [&](std::int64_t j0, std::int64_t nb, float* S, float* dP, float* G) {
    return scores_dp(j0, nb, S, dP, need_g ? G : nullptr, sc.mask, no_dz);
  };
  std::int64_t k0 = kmin, k1 = kmax;  // the keys the next loops visit
  if (keep) {
    live_keys live(kmin, kmax);
    for (std::int64_t j0 = kmin; j0 < kmax; j0 += kLaneKeyBlock) {
      const std::int64_t o = (j0 - kmin) * L, nb = imin(kLaneKeyBlock, kmax - j0);
      live.add(j0, nb, scores(j0, nb, sc.S + o, sc.dP + o, sc.G + o));
    }
    if (live.none()) return;  // every block hidden: empty rows, dq = 0
    k0 = live.lo, k1 = live.hi;
    lane_stats<Dist, CC>(lb, sc.S + (k0 - kmin) * L, k1 - k0, k0, sc.buf);
    // r = Σ u dP / Σ u (no dP: r = 0)
    if (no_dz) return;
    lane_r<Dist, CC>(lb, sc.S + (k0 - kmin) * L, sc.dP + (k0 - kmin) * L, k1 - k0, k0);
  }
  if (no_dz) return;
  for (std::int64_t j0 = k0; j0 < k1; j0 += kLaneKeyBlock) {
    const std::int64_t nb = imin(kLaneKeyBlock, k1 - j0), o = keep ? (j0 - kmin) * L : 0;
    float *S = sc.S + o, *dP = sc.dP + o, *G = sc.G + o;
    if (!keep && scores(j0, nb, S, dP, G)) continue;  // hidden by the mask: dz = 0
    vf sum_dz{}, sum_de{}, sum_dh{};
    const bool nonzero = lane_dz<Dist, CC>(lb, S, dP, need_g ? G : nullptr, j0, nb, sum_dz, sum_de, &sum_dh);
    double a = 0.0, b = 0.0, dh = 0.0;
    for (int x = 0; x < W; ++x) a += double(sum_dz[x]), b += double(sum_de[x]), dh += double(sum_dh[x]);
    io.sums[0] += a, io.sums[1] += b, io.sums[2] += dh;
    if (fp.zero_skip && !nonzero) continue;  // dqᵀ += Kᵀ 0 (and dw_v += 0): nothing
    dq_product(j0, nb, S, need_g ? G : nullptr, sc);
  }
}

template <class Ops, family_dist Dist, int CC>
void fam_dq(const family_lanes& lb, const family_dq_io& io) {
  constexpr bool pairs = Ops::kPack == 2;
  const std::int64_t L = CC * W;
  const auto scores_dp = [&](std::int64_t j0, std::int64_t nb, float* S, float* dP, float* G, float* mask, bool no_dz) {
    bool skipped;
    if constexpr (pairs) skipped = lane_scores_pairs<Ops, CC>(lb, j0, nb, S, mask);
    else skipped = lane_scores<CC>(lb, j0, nb, S, G, mask);
    if (no_dz) return skipped;
    if (skipped)
      for (std::int64_t i = 0; i < nb * L; i += W) store(dP + i, vf{});
    else if constexpr (pairs)
      gemm<Ops, true>(nb, L, lb.Dv / 2, lb.vrw + j0 * lb.vrwsn, lb.vrwsn, 1, io.douttw, L, dP, L, false);
    else
      gemm<fam_ops, true>(nb, L, lb.Dv, lb.v + j0 * lb.vsn, lb.vsn, 1, io.doutt, L, dP, L, false);
    return skipped;
  };
  const auto dq_product = [&](std::int64_t j0, std::int64_t nb, float* S, const float* G, const lane_scratch& sc) {
    if constexpr (pairs) {  // dqᵀ += Kᵀ dS, dS as words [nb/2][L] in G's room (no act′ here)
      const auto* dsw = Ops::pack_rows(S, nb, L, reinterpret_cast<typename Ops::word*>(sc.G));
      gemm<Ops>(lb.P, L, nb / 2, lb.kpw + j0 / 2 * lb.kpwss, 1, lb.kpwss, dsw, L, io.dqt, L, true);
    } else if (elementwise(lb.fp)) {
      if (!(distance_products(lb.fp) && distance_lane_products<CC>(lb, j0, nb, S, G, io.dqt)))
        with_terms(lb.fp, [&](const auto& tm) { elem_lane_grad<CC>(lb, tm, j0, nb, S, io.dqt, io.dw_v, sc.buf); });
    } else {
      gemm<fam_ops>(lb.P, L, nb, lb.k + j0 * lb.ksn, 1, lb.ksn, S, L, io.dqt, L, true);  // dqᵀ += Kᵀ dS
    }
  };
  fam_dq_with<Ops, Dist, CC>(lb, io, scores_dp, dq_product);
}

// ---- backward dk, dv, row layout ----
//   S = Q Kᵀ, dP = dO Vᵀ; α, dz from the saved row statistics; dVᵀ += dOᵀ α, dKᵀ += Qᵀ dz
// Ops: f32 (fam_ops), or bf16 pairs for dot scores of bf16 inputs (family_rows::qw …): every
// product on bf16 pairs, α and dz rounded to bf16 for the products that take them.
// The row layout's weights and score gradients, rows [0, nq) of S (the raw scores z) and dP
// ([nq][ldk]): S ← α of s = act(z + bias) + mask, -inf outside each row's key range; unless
// no_dz, dP ← dz = de·act′(z), with Σ dz and Σ de added into sum_dz, sum_de (and, given sum_dh,
// the triangle kernel's Σ de·∂e/∂h).
// Whether a row block has any nonzero (or NaN) α, dz (row_weights; as lane_alpha).
struct weights_set {
  bool alpha, dz;
};
template <family_dist Dist>
weights_set row_weights(const family_rows& pr, float* S, float* dP, const float* mask, bool no_dz, vf& sum_dz,
                        vf& sum_de, vf* sum_dh = nullptr) {
  const std::int64_t ld = pr.ldk;
  const family_params& fp = pr.fp;
  const bool plain = fp.act == family_act::identity && fp.bias == 0.0f;
  const bool tri = sum_dh && fp.act == family_act::triangle;
  const vf bias = splat(fp.bias);
  vi nza{}, nzd{};
  for (std::int64_t r = 0; r < pr.nq; ++r) {
    const vi lo = splati(pr.lo[r]), hi = splati(std::int32_t(imin(pr.hi[r], pr.j0 + pr.nb)));
    fam_stat st;
    st.t = splat(pr.st.t[r]), st.lse = splat(pr.st.lse[r]), st.r = splat(pr.st.r[r]), st.cut = splati(pr.st.cut[r]);
    for (std::int64_t x = 0; x < ld; x += W) {
      const vi j = iota() + std::int32_t(pr.j0 + x);
      vf g = splat(1.0f), s = load(S + r * ld + x);
      if (!plain) s = fam_act(fp.act, s + bias, &g, fp.h);
      if (fp.mask) s += load(mask + r * ld + x);
      s = vselect((j >= lo) & (j < hi), s, splat(-kInf));
      const vf a = fam_alpha<Dist>(fp, s, j, st);
      nza |= (vi)a;
      store(S + r * ld + x, a);
      if (no_dz) continue;
      const vf de = fam_de<Dist>(s, a, load(dP + r * ld + x), st), dz = de * g;
      nzd |= (vi)dz;
      store(dP + r * ld + x, dz);
      sum_de += de, sum_dz += dz;
      if (tri) *sum_dh += de * triangle_dh(g, fp.h);
    }
  }
  return {any_lane(nza & splati(0x7fffffff)), any_lane(nzd & splati(0x7fffffff))};
}

template <class Ops, family_dist Dist>
void fam_dkdv(const family_rows& pr) {
  constexpr bool pairs = Ops::kPack == 2;
  const std::int64_t ld = pr.ldk, nq = pr.nq, nqp = (nq + 1) / 2;
  const family_params& fp = pr.fp;
  float* S = pr.scratch;
  float* dP = S + nq * ld;
  float* mask = dP + nq * ld;
  auto* packed = reinterpret_cast<typename Ops::word*>(mask + nq * ld);  // bf16: α, then dz, as words [nqp][ld]
  // hardmax (zero gradient) and box: dv alone (no gradient reaches the scores; sigmoid's single
  // pass still sums de)
  const bool no_dz = Dist == family_dist::hardmax || (fp.act == family_act::box && Dist != family_dist::sigmoid);
  if (fp.mask) {
    // A block the mask hides from every row adds nothing to dv, dk, dq or the sums (zero_skip).
    if (fp.mask(fp.mask_ctx, pr.j0, pr.nb, mask, ld, 1) == mask_tile_kind::excluded && fp.zero_skip) return;
    for (std::int64_t r = 0; r < nq; ++r)
      for (std::int64_t x = pr.nb; x < ld; ++x) mask[r * ld + x] = 0.0f;
  }
  if constexpr (pairs) {
    gemm<Ops, true>(nq, ld, pr.P / 2, pr.qw, pr.qwsn, 1, pr.ktw, ld, S, ld, false);
    if (elementwise(fp)) distance_row_finish(pr, S);  // (box, triangle on words: zscale is 1)
    if (pr.zscale != 1.0f)
      for (std::int64_t i = 0; i < nq * ld; i += W) store(S + i, load(S + i) * splat(pr.zscale));
    if (!no_dz) gemm<Ops, true>(nq, ld, pr.Dv / 2, pr.dow, pr.dwsn, 1, pr.vtw, ld, dP, ld, false);
  } else {
    if (box_by_products(fp)) box_row_scores(pr, S);
    else if (elementwise(fp)) with_terms(fp, [&](const auto& tm) { elem_row_scores(pr, tm, S); });
    else gemm<fam_ops, true>(nq, ld, pr.P, pr.q, pr.qsn, 1, pr.kt, ld, S, ld, false);
    if (!no_dz) gemm<fam_ops, true>(nq, ld, pr.Dv, pr.dout, pr.dsn, 1, pr.vt, ld, dP, ld, false);
  }
  // (triangle: whether its dk (and dq) may come from products, judged on z before it becomes α)
  const bool dz_products = !no_dz && distance_products(fp) && !distance_rows_close(pr, S);
  vf sum_dz{}, sum_de{}, sum_dh{};
  const weights_set set = row_weights<Dist>(pr, S, dP, mask, no_dz, sum_dz, sum_de, pr.dq ? &sum_dh : nullptr);
  // A block whose α (dz) are all 0 adds nothing to dv (dq, dk): its products are skipped
  // (zero_skip: every input finite). Σ de is still summed.
  if (!fp.zero_skip || set.alpha) {
    if constexpr (pairs) {
      gemm<Ops>(pr.Dv, ld, nqp, pr.don, 1, pr.Dv, Ops::pack_rows(S, nq, ld, packed), ld, pr.dvt, ld, true);  // dVᵀ += dOᵀ α
    } else {
      gemm<fam_ops>(pr.Dv, ld, nq, pr.dout, 1, pr.dsn, S, ld, pr.dvt, ld, true);  // dVᵀ += dOᵀ α
    }
  }
  if (no_dz) return;
  const bool dz_zero = fp.zero_skip && !elementwise(fp) && !set.dz;
  if (pr.dq) {
    if (!dz_zero) {
      if (elementwise(fp)) {
        // (elementwise scores: dq with dk, below)
      } else if constexpr (pairs) {  // dz as words of key pairs [nq][ld/2] in the packed room, then dq += dz K
        for (std::int64_t i = 0; i < nq * ld; i += W) store_lane_pairs(packed + i / 2, load(dP + i));
        gemm<Ops>(nq, pr.Pp, ld / 2, packed, ld / 2, 1, pr.krw, pr.Pp, pr.dq, pr.dqs, true);
      } else {
        gemm<fam_ops>(nq, pr.Pp, ld, dP, ld, 1, pr.kr, pr.Pp, pr.dq, pr.dqs, true);  // dq += dz K
      }
    }
    double a = 0.0, b = 0.0, c = 0.0;
    for (int x = 0; x < W; ++x) a += double(sum_dz[x]), b += double(sum_de[x]), c += double(sum_dh[x]);
    pr.sums[0] += a, pr.sums[1] += b, pr.sums[2] += c;
  }
  if (dz_zero) return;
  if (elementwise(fp)) {  // (the differences where the products may not serve: on the f32 rows)
    if (!(dz_products && distance_row_products<Ops>(pr, dP, mask + nq * ld)))
      with_terms(fp, [&](const auto& tm) { elem_row_grad(pr, tm, dP, mask + nq * ld); });
  } else if constexpr (pairs) {  // q unscaled: dKᵀ += Qᵀ (zscale·dz)
    if (pr.zscale != 1.0f)
      for (std::int64_t i = 0; i < nq * ld; i += W) store(dP + i, load(dP + i) * splat(pr.zscale));
    gemm<Ops>(pr.P, ld, nqp, pr.qn, 1, pr.P, Ops::pack_rows(dP, nq, ld, packed), ld, pr.dkt, ld, true);
  } else {
    gemm<fam_ops>(pr.P, ld, nq, pr.q, 1, pr.qsn, dP, ld, pr.dkt, ld, true);  // dKᵀ += Qᵀ dz
  }
}

// ---- hardmax and top-k: the kept keys of every lane (for the sparse backward) ----
// Ops: f32 (fam_ops), or bf16 pairs for dot scores of bf16 inputs (family_lanes::qtw, kw), the
// key range widened to whole pairs as the forward's (the keys no lane sees get s = -inf: never kept).
// Scores: bool(j0, nb, S, G, mask) as lane_scores — the scores of keys [j0, j0 + nb) into S (and
// act′ into G when given), true where the mask hid the block — for another product (AMX tiles).
template <class Ops, family_dist Dist, int CC, class Scores>
void fam_kept_keys_with(const family_lanes& lb, const family_kept& out, Scores&& scores) {
  constexpr bool pairs = Ops::kPack == 2;
  const std::int64_t L = CC * W;
  set_empty_stats<CC>(lb);
  for (std::int64_t x = 0; x < L; ++x) out.cnt[x] = 0;
  std::int64_t kmin, kmax;
  fam_range(lb, kmin, kmax);
  if (kmin >= kmax) return;
  if constexpr (pairs) kmin = kmin / 2 * 2, kmax = (kmax + 1) / 2 * 2;
  const family_params& fp = lb.fp;
  const lane_scratch sc(lb, kmax - kmin + kLaneKeyBlock);
  const bool need_g = !pairs && fp.act != family_act::identity;
  live_keys live(kmin, kmax);
  for (std::int64_t j0 = kmin; j0 < kmax; j0 += kLaneKeyBlock) {
    const std::int64_t o = (j0 - kmin) * L, nb = imin(kLaneKeyBlock, kmax - j0);
    live.add(j0, nb, scores(j0, nb, sc.S + o, need_g ? sc.G + o : nullptr, sc.mask));
  }
  if (live.none()) return;  // every block hidden: nothing kept
  const std::int64_t k0 = live.lo, k1 = live.hi;
  // top-k with k a constant: the search hands over each lane's kept keys (no scan for them after).
  const bool listed = topk_in_registers<Dist>(fp);
  lane_stats<Dist, CC>(lb, sc.S + (k0 - kmin) * L, k1 - k0, k0, sc.buf,
                       listed ? lane_kept{out.cnt, out.idx, out.kmax} : lane_kept{});
  if (listed) {  // α = fam_alpha's e^{s - lse} of each kept key, lane by lane
    for (std::int64_t x = 0; x < L; ++x) {
      if (x >= lb.nl) {
        out.cnt[x] = 0;
        continue;
      }
      for (std::int32_t e = 0; e < out.cnt[x]; ++e) {
        const std::int64_t i = x * out.kmax + e, jj = out.idx[i] - kmin;
        out.alpha[i] = exp_nat(splat(sc.S[jj * L + x]) - splat(lb.st.lse[x]))[0];
        out.g[i] = need_g ? sc.G[jj * L + x] : 1.0f;
      }
    }
    return;
  }
  if constexpr (Dist == family_dist::hardmax) {  // the one key kept is each lane's first arg max (cut)
    for (std::int64_t x = 0; x < lb.nl && out.kmax > 0; ++x) {
      const std::int32_t j = lb.st.cut[x];
      if (j < 0) continue;
      out.cnt[x] = 1, out.idx[x * out.kmax] = j, out.alpha[x * out.kmax] = 1.0f;
      out.g[x * out.kmax] = need_g ? sc.G[(j - kmin) * L + x] : 1.0f;
    }
    return;
  }
  for (int c = 0; c < CC; ++c) {
    const fam_stat st = load_stat<CC>(lb, c);
    for (std::int64_t jj = k0 - kmin; jj < k1 - kmin; ++jj) {
      const vf s = load(sc.S + jj * L + c * W);
      if (!any_ge(s, st.t)) continue;  // (every kept key is at or above t: most vectors stop here)
      const vi j = splati(std::int32_t(kmin + jj));
      const vi in = fam_kept(s, j, st) & (s > splat(-kInf));
      if (!any_lane(in)) continue;
      const vf a = fam_alpha<Dist>(fp, s, j, st);
      for (int x = 0; x < W; ++x) {
        const std::int64_t lane = c * W + x;
        if (!in[x] || lane >= lb.nl || out.cnt[lane] >= out.kmax) continue;
        const std::int64_t e = lane * out.kmax + out.cnt[lane]++;
        out.idx[e] = std::int32_t(kmin + jj), out.alpha[e] = a[x];
        out.g[e] = need_g ? sc.G[jj * L + lane] : 1.0f;
      }
    }
  }
}

template <class Ops, family_dist Dist, int CC>
void fam_kept_keys(const family_lanes& lb, const family_kept& out) {
  fam_kept_keys_with<Ops, Dist, CC>(lb, out, [&](std::int64_t j0, std::int64_t nb, float* S, float* G, float* mask) {
    if constexpr (Ops::kPack == 2) return lane_scores_pairs<Ops, CC>(lb, j0, nb, S, mask);
    else return lane_scores<CC>(lb, j0, nb, S, G, mask);
  });
}

// Calls f(std::integral_constant<family_dist, d>{}): each kernel is compiled once per distribution.
template <class F>
void with_dist(family_dist d, F&& f) {
  switch (d) {
    case family_dist::softmax: return f(std::integral_constant<family_dist, family_dist::softmax>{});
    case family_dist::sigmoid: return f(std::integral_constant<family_dist, family_dist::sigmoid>{});
    case family_dist::sparsemax: return f(std::integral_constant<family_dist, family_dist::sparsemax>{});
    case family_dist::entmax15: return f(std::integral_constant<family_dist, family_dist::entmax15>{});
    case family_dist::hardmax: return f(std::integral_constant<family_dist, family_dist::hardmax>{});
    case family_dist::topk: return f(std::integral_constant<family_dist, family_dist::topk>{});
    case family_dist::identity: return f(std::integral_constant<family_dist, family_dist::identity>{});
    case family_dist::hardmax_st: return f(std::integral_constant<family_dist, family_dist::hardmax_st>{});
    case family_dist::kernel: return f(std::integral_constant<family_dist, family_dist::kernel>{});
  }
}

void fam_forward_entry(const family_lanes& lb, float* ot) {
  with_dist(lb.fp.dist, [&](auto d) { fam_forward<fam_ops, decltype(d)::value, C>(lb, ot); });
}
template <class Dot>
void fam_forward_bf16_entry(const family_lanes& lb, float* ot) {
  with_dist(lb.fp.dist, [&](auto d) { fam_forward<bf16_pair_operands<Dot>, decltype(d)::value, C>(lb, ot); });
}
void fam_dq_entry(const family_lanes& lb, const family_dq_io& io) {
  with_dist(lb.fp.dist, [&](auto d) { fam_dq<fam_ops, decltype(d)::value, C>(lb, io); });
}
template <class Dot>
void fam_dq_bf16_entry(const family_lanes& lb, const family_dq_io& io) {
  with_dist(lb.fp.dist, [&](auto d) { fam_dq<bf16_pair_operands<Dot>, decltype(d)::value, C>(lb, io); });
}
void fam_dkdv_entry(const family_rows& pr) {
  with_dist(pr.fp.dist, [&](auto d) { fam_dkdv<fam_ops, decltype(d)::value>(pr); });
}
template <class Dot>
void fam_dkdv_bf16_entry(const family_rows& pr) {
  with_dist(pr.fp.dist, [&](auto d) { fam_dkdv<bf16_pair_operands<Dot>, decltype(d)::value>(pr); });
}

template <class Ops>
void fam_kept_entry(const family_lanes& lb, const family_kept& out) {
  if (lb.fp.dist == family_dist::hardmax) fam_kept_keys<Ops, family_dist::hardmax, C>(lb, out);
  else fam_kept_keys<Ops, family_dist::topk, C>(lb, out);
}

// y[x] += a·b[x] over n floats.
inline void kept_axpy(float* y, float a, const float* b, std::int64_t n) {
  const vf av = splat(a);
  std::int64_t x = 0;
  for (; x + W <= n; x += W) store(y + x, load(y + x) + av * load(b + x));
  for (; x < n; ++x) y[x] += a * b[x];
}

void fam_kept_grad_entry(const family_kept_grad& u) {
  const std::int64_t K = u.K, P = u.P, Dv = u.Dv;
  float da[kFamilySparseMax];
  double sdz = 0.0;
  for (std::int64_t r = 0; r < u.rows; ++r) {
    const std::int64_t n = u.cnt[r];
    const std::int32_t* js = u.idx + r * K;
    const float* al = u.alpha + r * K;
    const float* o = u.dout + r * Dv;
    const float* qr = u.q + r * P;
    float* dq = u.dq + r * P;
    for (std::int64_t d = 0; d < P; ++d) dq[d] = 0.0f;
    float num = 0.0f, den = 0.0f;
    for (std::int64_t e = 0; e < n && !u.zero_grad; ++e) {
      da[e] = row_dot(o, u.v + std::int64_t(js[e]) * Dv, Dv);
      num += al[e] * da[e], den += al[e];
    }
    const float rr = den > 0.0f ? num / den : 0.0f;
    for (std::int64_t e = 0; e < n; ++e) {
      const std::int64_t j = js[e];
      kept_axpy(u.dv + j * Dv, al[e], o, Dv);
      if (u.zero_grad) continue;
      const float de = al[e] * (da[e] - rr), gz = u.g[r * K + e], dz = de * gz;
      sdz += double(dz);
      const float* kj = u.k + j * P;
      float* dkj = u.dk + j * P;
      if (u.kind == family_kept_grad::dot) {
        kept_axpy(dq, dz, kj, P);
        kept_axpy(dkj, dz, qr, P);
      } else if (u.kind == family_kept_grad::additive) {
        const vf dzv = splat(dz), one = splat(1.0f);
        std::int64_t a = 0;
        for (; a + W <= P; a += W) {
          const vf t = vtanh(load(qr + a) + load(kj + a));
          const vf g = dzv * load(u.w_v + a) * (one - t * t);
          store(dq + a, load(dq + a) + g), store(dkj + a, load(dkj + a) + g), store(u.dw + a, load(u.dw + a) + dzv * t);
        }
        for (; a < P; ++a) {
          const float t = vtanh(splat(qr[a] + kj[a]))[0], g = dz * u.w_v[a] * (1.0f - t * t);  // the vectors' tanh
          dq[a] += g, dkj[a] += g, u.dw[a] += dz * t;
        }
      } else {
        if (u.triangle) *u.dh += double(de * triangle_dh(splat(gz), float(u.h))[0]);
        const vf dz2 = splat(2.0f * dz);
        std::int64_t d = 0;
        for (; d + W <= P; d += W) {
          const vf g = dz2 * (load(qr + d) - load(kj + d));
          store(dq + d, load(dq + d) + g), store(dkj + d, load(dkj + d) - g);
        }
        for (; d < P; ++d) {
          const float g = 2.0f * dz * (qr[d] - kj[d]);
          dq[d] += g, dkj[d] -= g;
        }
      }
    }
  }
  *u.sum_dz += sdz;
}

}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/family_md_body.h"
#include "cpu/family_linear_body.h"

namespace attn::detail::cpu {
namespace {

// family_kept_out: W values of y a step, each as two vectors of float64 (the products α·v are
// exact in float64, so an FMA gives the bits of a product and an add: the same at every level).
void fam_kept_out_entry(const family_kept_out& a) {
  typedef float hf __attribute__((vector_size(sizeof(vf) / 2)));
  typedef double vd __attribute__((vector_size(sizeof(vf))));
  typedef std::uint16_t vh __attribute__((vector_size(sizeof(vf) / 2)));
  constexpr int H = W / 2;
  std::int64_t y = 0;
  for (; y + W <= a.Dv; y += W) {
    vd lo{}, hi{};
    for (std::int64_t e = 0; e < a.cnt; ++e) {
      const std::int64_t j = a.idx[e];
      vf v;
      if (a.vw) {
        vh w;
        __builtin_memcpy(&w, a.vw + j * a.vstep + y, sizeof w);
        v = (vf)(__builtin_convertvector(w, vu) << 16);
      } else {
        v = load(a.v + j * a.vstep + y);
      }
      hf l, h;
      __builtin_memcpy(&l, &v, sizeof l);
      __builtin_memcpy(&h, reinterpret_cast<const char*>(&v) + sizeof l, sizeof h);
      const vd al = double(a.alpha[e]) - vd{};
      lo += al * __builtin_convertvector(l, vd);
      hi += al * __builtin_convertvector(h, vd);
    }
    const hf l = __builtin_convertvector(lo, hf), h = __builtin_convertvector(hi, hf);
    __builtin_memcpy(a.out + y, &l, sizeof l);
    __builtin_memcpy(a.out + y + H, &h, sizeof h);
  }
  for (; y < a.Dv; ++y) {
    double acc = 0.0;
    for (std::int64_t e = 0; e < a.cnt; ++e) {
      const std::int64_t j = a.idx[e];
      const float v = a.vw ? bf16_scalar(a.vw + j * a.vstep + y) : a.v[j * a.vstep + y];
      acc += double(a.alpha[e]) * double(v);
    }
    a.out[y] = float(acc);
  }
}

// Dot: the ISA's bf16 dot product (simd.h: no_bf16_dot where there is none; then no forward_bf16).
template <class Dot = no_bf16_dot>
constexpr family_table make_family_table(const char* name) {
  void (*forward_bf16)(const family_lanes&, float*) = nullptr;
  void (*dkdv_bf16)(const family_rows&) = nullptr;
  void (*dq_bf16)(const family_lanes&, const family_dq_io&) = nullptr;
  void (*kept_bf16)(const family_lanes&, const family_kept&) = nullptr;
  if constexpr (Dot::available)
    forward_bf16 = fam_forward_bf16_entry<Dot>, dkdv_bf16 = fam_dkdv_bf16_entry<Dot>, dq_bf16 = fam_dq_bf16_entry<Dot>,
    kept_bf16 = fam_kept_entry<bf16_pair_operands<Dot>>;
  return {name,
          W,
          C * W,
          fam_forward_entry,
          fam_dq_entry,
          fam_dkdv_entry,
          fam_kept_entry<fam_ops>,
          md_forward_entry,
          md_dq_entry,
          md_dkdv_entry,
          forward_bf16,
          dkdv_bf16,
          dq_bf16,
          kept_bf16,
          fam_kept_grad_entry,
          lin_forward_entry,
          lin_backward_entry,
          fam_kept_out_entry};
}

}  // namespace
}  // namespace attn::detail::cpu

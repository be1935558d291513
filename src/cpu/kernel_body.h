// src/cpu/kernel_body.h — the fused attention kernels, written once with GCC vector types and
// compiled once per ISA: kernels_<isa>.cc defines, in attn::detail::cpu::(anonymous),
//   constexpr int W  (floats per vector), C (vectors per tile row), R (tile rows)
// then includes this file, whose code it owns privately (anonymous namespace: no symbol can be
// merged with another ISA's copy). See kernels.h for the layouts and the micro-kernel.
//
// Numerics: fp32 throughout; exp is a degree-6 polynomial on a 2^n range reduction
// (≈ 2 ulp, exactly 0 below -87.3 so masked keys weigh exactly nothing); tanh (softcap) goes
// through the same exp. Every reduction runs in a fixed order inside one block, so a result
// never depends on which thread computed it.
#include <cstdint>

#include "cpu/kernels.h"

namespace attn::detail::cpu {
namespace {

typedef float vf __attribute__((vector_size(W * 4)));
typedef std::int32_t vi __attribute__((vector_size(W * 4)));

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
inline void store(float* p, vf v) { __builtin_memcpy(p, &v, sizeof v); }
inline vf splat(float s) { return vf{} + s; }
inline vi splati(std::int32_t s) { return vi{} + s; }
inline vf vmax(vf a, vf b) { return a > b ? a : b; }
inline vi iota() {
  vi r;
  for (int i = 0; i < W; ++i) r[i] = i;
  return r;
}
inline std::int64_t imin(std::int64_t a, std::int64_t b) { return a < b ? a : b; }
inline std::int64_t imax(std::int64_t a, std::int64_t b) { return a > b ? a : b; }
constexpr float kInf = __builtin_inff();

// e^x: n = round(x·log2 e), r = x - n·ln 2 (two-part ln 2), e^r by its Taylor-like minimax
// polynomial (Cephes expf), times 2^n built in the exponent bits.
inline vf vexp(vf x) {
  const vf xc = vmax(x, splat(-87.3f)) < splat(88.0f) ? vmax(x, splat(-87.3f)) : splat(88.0f);
  const vf magic = splat(12582912.0f);  // 1.5·2^23: adding it rounds to an integer
  const vf t = xc * splat(1.44269504088896341f) + magic;
  const vf n = t - magic;
  vf r = xc - n * splat(0.693359375f);
  r = r - n * splat(-2.12194440e-4f);
  vf y = splat(1.9875691500e-4f);
  y = y * r + splat(1.3981999507e-3f);
  y = y * r + splat(8.3334519073e-3f);
  y = y * r + splat(4.1665795894e-2f);
  y = y * r + splat(1.6666665459e-1f);
  y = y * r + splat(5.0000001201e-1f);
  y = y * (r * r) + r + splat(1.0f);
  const vi e = (__builtin_convertvector(n, vi) + 127) << 23;
  const vf p = y * (vf)e;
  return x < splat(-87.3f) ? vf{} : p;
}

// tanh(x) = sign(x)·(1 - 2 / (e^{2|x|} + 1))
inline vf vtanh(vf x) {
  const vi sign = (vi)x & splati(std::int32_t(0x80000000u));
  const vf ax = (vf)((vi)x & splati(0x7fffffff));
  const vf t = splat(1.0f) - splat(2.0f) / (vexp(ax + ax) + splat(1.0f));
  return (vf)((vi)t | sign);
}

// ---- the micro-kernel: out[r][x] (+)= Σ_k a[r·ars + k·aks] · b[k·bks + x], RR × CC vectors ----
template <int RR, int CC>
void tile(std::int64_t K, const float* a, std::int64_t ars, std::int64_t aks, const float* b, std::int64_t bks,
          float* o, std::int64_t ors, bool accumulate) {
  vf acc[RR][CC];
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) acc[r][c] = accumulate ? load(o + r * ors + c * W) : vf{};
  for (std::int64_t k = 0; k < K; ++k) {
    vf bv[CC];
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) bv[c] = load(b + k * bks + c * W);
    const float* ak = a + k * aks;
#pragma GCC unroll 8
    for (int r = 0; r < RR; ++r) {
      const vf ar = splat(ak[r * ars]);
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) acc[r][c] += ar * bv[c];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RR; ++r)
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) store(o + r * ors + c * W, acc[r][c]);
}

template <int RR, int CC = C>
void tile_c(int cc, std::int64_t K, const float* a, std::int64_t ars, std::int64_t aks, const float* b,
            std::int64_t bks, float* o, std::int64_t ors, bool acc) {
  if constexpr (CC == 1) {
    tile<RR, 1>(K, a, ars, aks, b, bks, o, ors, acc);
  } else {
    if (cc == CC) return tile<RR, CC>(K, a, ars, aks, b, bks, o, ors, acc);
    tile_c<RR, CC - 1>(cc, K, a, ars, aks, b, bks, o, ors, acc);
  }
}

template <int RR = R>
void tile_rc(int rr, int cc, std::int64_t K, const float* a, std::int64_t ars, std::int64_t aks, const float* b,
             std::int64_t bks, float* o, std::int64_t ors, bool acc) {
  if constexpr (RR == 1) {
    tile_c<1>(cc, K, a, ars, aks, b, bks, o, ors, acc);
  } else {
    if (rr == RR) return tile_c<RR>(cc, K, a, ars, aks, b, bks, o, ors, acc);
    tile_rc<RR - 1>(rr, cc, K, a, ars, aks, b, bks, o, ors, acc);
  }
}

// out [M][N] (row stride ors; N a multiple of W) (+)= A·B with A(r, k) = a[r·ars + k·aks] and
// B(k, x) = b[k·bks + x].
void gemm(std::int64_t M, std::int64_t N, std::int64_t K, const float* a, std::int64_t ars, std::int64_t aks,
          const float* b, std::int64_t bks, float* o, std::int64_t ors, bool accumulate) {
  for (std::int64_t n0 = 0; n0 < N; n0 += C * W) {
    const int cc = int(imin(C, (N - n0) / W));
    for (std::int64_t m0 = 0; m0 < M; m0 += R) {
      const int rr = int(imin(R, M - m0));
      tile_rc(rr, cc, K, a + m0 * ars, ars, aks, b + n0, bks, o + m0 * ors + n0, ors, accumulate);
    }
  }
}

// ---- scores ----
struct score_consts {
  vf scale, cap, inv_cap;
  bool softcap, bias, alibi;
  explicit score_consts(const score_params& sp)
      : scale(splat(sp.scale)),
        cap(splat(sp.softcap)),
        inv_cap(splat(sp.softcap > 0 ? 1.0f / sp.softcap : 0.0f)),
        softcap(sp.softcap > 0),
        bias(sp.bias != nullptr),
        alibi(sp.alibi) {}
};

// x = scale·dot → softcap (t = tanh, for the backward) → + mask + ALiBi → -inf outside [lo, hi).
inline vf transform(vf dot, const score_consts& c, vf* t, vf bias, vi j, vi pos, vi lo, vi hi, vf slope,
                    bool ranged) {
  vf s = dot * c.scale;
  if (c.softcap) {
    const vf th = vtanh(s * c.inv_cap);
    *t = th;
    s = c.cap * th;
  }
  if (c.bias) s += bias;
  if (c.alibi) {
    vi d = pos - j;
    d = d < 0 ? -d : d;
    s -= slope * __builtin_convertvector(d, vf);
  }
  if (ranged) s = (j >= lo) & (j < hi) ? s : splat(-kInf);
  return s;
}

// Keys [kmin, kmax) that some valid lane of the block may see; `ranged` for [j0, j1) says
// whether a lane excludes part of it.
struct lane_range {
  std::int64_t kmin, kmax;
  explicit lane_range(const lane_block& lb) : kmin(lb.khi), kmax(lb.klo) {
    for (std::int64_t x = 0; x < lb.nl; ++x)
      if (lb.lo[x] < lb.hi[x]) kmin = imin(kmin, lb.lo[x]), kmax = imax(kmax, lb.hi[x]);
    kmin = imax(kmin, lb.klo), kmax = imin(kmax, lb.khi);
  }
};
inline bool block_ranged(const lane_block& lb, std::int64_t j0, std::int64_t j1) {
  for (std::int64_t x = 0; x < lb.nl; ++x)
    if (lb.lo[x] > j0 || lb.hi[x] < j1) return true;
  return false;
}

// ---- forward, lane layout ----
//   Sᵀ[j][lane] = k_j · qᵀ_lane         (q pre-scaled)
//   m' = max(m, max_j s), p = e^{s - m'}, l = l·e^{m - m'} + Σ p, Oᵀ = Oᵀ·e^{m - m'} + Vᵀ P
template <int CC>
void forward_impl(const lane_block& lb, const forward_io& io) {
  const std::int64_t L = CC * W;
  float* S = lb.scratch;                 // [Nkb][L]
  float* bias = S + kLaneKeyBlock * L;   // [Nkb][L]
  float* alpha = bias + kLaneKeyBlock * L;
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  for (std::int64_t j0 = kr.kmin; j0 < kr.kmax; j0 += kLaneKeyBlock) {
    const std::int64_t nb = imin(kLaneKeyBlock, kr.kmax - j0);
    gemm(nb, L, lb.D, lb.k + j0 * lb.ksn, lb.ksn, 1, lb.qt, L, S, L, false);
    if (sc.bias) lb.sp.bias(lb.sp.bias_ctx, j0, nb, bias, 1, L);
    const bool ranged = block_ranged(lb, j0, j0 + nb);
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) {
      const vi lo = loadi(lb.lo + c * W), hi = loadi(lb.hi + c * W), pos = loadi(lb.pos + c * W);
      const vf slope = sc.alibi ? load(lb.slope + c * W) : vf{};
      const vf m_old = load(io.m + c * W);
      vf mx = m_old, t;
      for (std::int64_t jj = 0; jj < nb; ++jj) {
        float* sp = S + jj * L + c * W;
        const vf s = transform(load(sp), sc, &t, sc.bias ? load(bias + jj * L + c * W) : vf{},
                               splati(std::int32_t(j0 + jj)), pos, lo, hi, slope, ranged);
        store(sp, s);
        mx = vmax(mx, s);
      }
      const vf mu = mx == splat(-kInf) ? vf{} : mx;  // a row with nothing yet keeps p = 0
      const vf a = vexp(m_old - mu);
      vf sum{};
      for (std::int64_t jj = 0; jj < nb; ++jj) {
        float* sp = S + jj * L + c * W;
        const vf p = vexp(load(sp) - mu);
        store(sp, p);
        sum += p;
      }
      store(io.l + c * W, load(io.l + c * W) * a + sum);
      store(io.m + c * W, mx);
      store(alpha + c * W, a);
    }
    for (std::int64_t d = 0; d < lb.Dv; ++d)
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) store(io.ot + d * L + c * W, load(io.ot + d * L + c * W) * load(alpha + c * W));
    gemm(lb.Dv, L, nb, lb.v + j0 * lb.vsn, 1, lb.vsn, S, L, io.ot, L, true);
  }
}

// ---- backward dq, lane layout (recompute from lse) ----
//   p = e^{s - lse}, dp = dout·v_j, ds = p (dp - Δ) (· (1 - t²) with softcap), dqᵀ += Kᵀ dS
template <int CC>
void dq_impl(const lane_block& lb, const dq_io& io) {
  const std::int64_t L = CC * W;
  float* S = lb.scratch;
  float* bias = S + kLaneKeyBlock * L;
  float* dP = bias + kLaneKeyBlock * L;
  for (std::int64_t i = 0; i < lb.D * L; ++i) io.dqt[i] = 0.0f;
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  for (std::int64_t j0 = kr.kmin; j0 < kr.kmax; j0 += kLaneKeyBlock) {
    const std::int64_t nb = imin(kLaneKeyBlock, kr.kmax - j0);
    gemm(nb, L, lb.D, lb.k + j0 * lb.ksn, lb.ksn, 1, lb.qt, L, S, L, false);
    gemm(nb, L, lb.Dv, lb.v + j0 * lb.vsn, lb.vsn, 1, io.dot, L, dP, L, false);
    if (sc.bias) lb.sp.bias(lb.sp.bias_ctx, j0, nb, bias, 1, L);
    const bool ranged = block_ranged(lb, j0, j0 + nb);
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) {
      const vi lo = loadi(lb.lo + c * W), hi = loadi(lb.hi + c * W), pos = loadi(lb.pos + c * W);
      const vf slope = sc.alibi ? load(lb.slope + c * W) : vf{};
      const vf lse = load(io.lse + c * W), delta = load(io.delta + c * W);
      for (std::int64_t jj = 0; jj < nb; ++jj) {
        float* sp = S + jj * L + c * W;
        vf t{};
        const vf s = transform(load(sp), sc, &t, sc.bias ? load(bias + jj * L + c * W) : vf{},
                               splati(std::int32_t(j0 + jj)), pos, lo, hi, slope, ranged);
        const vf p = vexp(s - lse);
        vf ds = p * (load(dP + jj * L + c * W) - delta);
        if (sc.softcap) ds *= splat(1.0f) - t * t;
        store(sp, ds);
      }
    }
    gemm(lb.D, L, nb, lb.k + j0 * lb.ksn, 1, lb.ksn, S, L, io.dqt, L, true);
  }
}

// ---- backward dk, dv, row layout: one query block against one key block ----
//   S = Q Kᵀ, dP = dO Vᵀ, P = e^{scale·S… - lse}, dS = P (dP - Δ),  dVᵀ += dOᵀ P,  dKᵀ += Qᵀ dS
void dkdv_impl(const dkdv_pair& a) {
  const std::int64_t ld = a.ldk, nq = a.nq;
  float* S = a.scratch;
  float* dP = S + nq * ld;
  float* bias = dP + nq * ld;
  const score_consts sc(a.sp);
  gemm(nq, ld, a.D, a.q, a.qsn, 1, a.kt, ld, S, ld, false);
  gemm(nq, ld, a.Dv, a.dout, a.dsn, 1, a.vt, ld, dP, ld, false);
  if (sc.bias) {
    a.sp.bias(a.sp.bias_ctx, a.j0, a.nb, bias, ld, 1);
    for (std::int64_t r = 0; r < nq; ++r)
      for (std::int64_t x = a.nb; x < ld; ++x) bias[r * ld + x] = 0.0f;
  }
  const vf slope = splat(a.slope);
  vf dalibi{};
  for (std::int64_t r = 0; r < nq; ++r) {
    const vi lo = splati(a.lo[r]), hi = splati(std::int32_t(imin(a.hi[r], a.j0 + a.nb))), pos = splati(a.pos[r]);
    const vf lse = splat(a.lse[r]), delta = splat(a.delta[r]);
    for (std::int64_t x = 0; x < ld; x += W) {
      const vi j = iota() + std::int32_t(a.j0 + x);
      vf t{};
      const vf s = transform(load(S + r * ld + x), sc, &t, sc.bias ? load(bias + r * ld + x) : vf{}, j, pos, lo,
                             hi, slope, true);
      const vf p = vexp(s - lse);
      vf ds = p * (load(dP + r * ld + x) - delta);
      if (sc.alibi) {
        vi d = pos - j;
        d = d < 0 ? -d : d;
        dalibi -= ds * __builtin_convertvector(d, vf);
      }
      if (sc.softcap) ds *= splat(1.0f) - t * t;
      store(S + r * ld + x, p);
      store(dP + r * ld + x, ds);
    }
  }
  gemm(a.Dv, ld, nq, a.dout, 1, a.dsn, S, ld, a.dvt, ld, true);
  gemm(a.D, ld, nq, a.q, 1, a.qsn, dP, ld, a.dkt, ld, true);
  if (sc.alibi) {
    double sum = 0.0;
    for (int x = 0; x < W; ++x) sum += double(dalibi[x]);
    *a.dalibi += sum;
  }
}

void forward_entry(const lane_block& lb, const forward_io& io) {
  if (lb.L == C * W) return forward_impl<C>(lb, io);
  forward_impl<1>(lb, io);
}
void dq_entry(const lane_block& lb, const dq_io& io) {
  if (lb.L == C * W) return dq_impl<C>(lb, io);
  dq_impl<1>(lb, io);
}

constexpr kernel_table make_table(const char* name) {
  return kernel_table{name, W, C * W, W, forward_entry, dq_entry, dkdv_impl};
}

}  // namespace
}  // namespace attn::detail::cpu

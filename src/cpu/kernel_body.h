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
#include <utility>

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
// W floats from f32 or bf16 storage (bf16 → f32 is a 16-bit shift).
typedef std::uint16_t vh __attribute__((vector_size(W * 2)));
inline vf load_row(const float* p) { return load(p); }
inline vf load_row(const std::uint16_t* p) {
  vh h;
  __builtin_memcpy(&h, p, sizeof h);
  return (vf)(__builtin_convertvector(h, vi) << 16);
}
inline float scalar_row(const float* p) { return *p; }
inline float scalar_row(const std::uint16_t* p) {
  const std::uint32_t u = std::uint32_t(*p) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline vf splat(float s) { return s - vf{}; }  // x - 0 folds away; x + 0 would not (-0)
inline vi splati(std::int32_t s) { return s - vi{}; }
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

// The online-softmax step of keys [j0, j0 + nb) on the scores S (in place → p), then Oᵀ *= α.
template <int CC>
void softmax_block(const lane_block& lb, const forward_io& io, const score_consts& sc, float* S, float* bias,
                   float* alpha, std::int64_t j0, std::int64_t nb) {
  const std::int64_t L = CC * W;
  if (sc.bias) lb.sp.bias(lb.sp.bias_ctx, j0, nb, bias, 1, L);
  const bool ranged = block_ranged(lb, j0, j0 + nb);
  const bool identity = !ranged && !sc.softcap && !sc.bias && !sc.alibi && lb.sp.scale == 1.0f;
#pragma GCC unroll 4
  for (int c = 0; c < CC; ++c) {
    const vi lo = loadi(lb.lo + c * W), hi = loadi(lb.hi + c * W), pos = loadi(lb.pos + c * W);
    const vf slope = sc.alibi ? load(lb.slope + c * W) : vf{};
    const vf m_old = load(io.m + c * W);
    vf mx = m_old, t;
    if (identity) {  // plain scores (the common case): only the max
      for (std::int64_t jj = 0; jj < nb; ++jj) mx = vmax(mx, load(S + jj * L + c * W));
    } else {
      for (std::int64_t jj = 0; jj < nb; ++jj) {
        float* sp = S + jj * L + c * W;
        const vf s = transform(load(sp), sc, &t, sc.bias ? load(bias + jj * L + c * W) : vf{},
                               splati(std::int32_t(j0 + jj)), pos, lo, hi, slope, ranged);
        store(sp, s);
        mx = vmax(mx, s);
      }
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
}

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
    softmax_block<CC>(lb, io, sc, S, bias, alpha, j0, nb);
    gemm(lb.Dv, L, nb, lb.v + j0 * lb.vsn, 1, lb.vsn, S, L, io.ot, L, true);
  }
}

// ---- backward dq, lane layout (recompute from lse) ----
//   p = e^{s - lse}, dp = dout·v_j, ds = p (dp - Δ) (· (1 - t²) with softcap), dqᵀ += Kᵀ dS

// From the raw scores S and dP of keys [j0, j0 + nb), writes dS into S.
template <int CC>
void dq_scores(const lane_block& lb, const dq_io& io, const score_consts& sc, float* S, float* bias, const float* dP,
               std::int64_t j0, std::int64_t nb) {
  const std::int64_t L = CC * W;
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
}

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
    dq_scores<CC>(lb, io, sc, S, bias, dP, j0, nb);
    gemm(lb.D, L, nb, lb.k + j0 * lb.ksn, 1, lb.ksn, S, L, io.dqt, L, true);
  }
}

// ---- backward dk, dv, row layout: one query block against one key block ----
//   S = Q Kᵀ, dP = dO Vᵀ, P = e^{scale·s' - lse} (s' the transformed score), dS = P (dP - Δ),
//   dVᵀ += dOᵀ P,  dKᵀ += Qᵀ dS

// From the raw S and dP of the pair, writes P into S and dS into dP; adds the ALiBi gradient.
void dkdv_scores(const dkdv_pair& a, const score_consts& sc, float* S, float* dP, float* bias) {
  const std::int64_t ld = a.ldk, nq = a.nq;
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
  if (sc.alibi) {
    double sum = 0.0;
    for (int x = 0; x < W; ++x) sum += double(dalibi[x]);
    *a.dalibi += sum;
  }
}

void dkdv_impl(const dkdv_pair& a) {
  const std::int64_t ld = a.ldk, nq = a.nq;
  float* S = a.scratch;
  float* dP = S + nq * ld;
  float* bias = dP + nq * ld;
  const score_consts sc(a.sp);
  gemm(nq, ld, a.D, a.q, a.qsn, 1, a.kt, ld, S, ld, false);
  gemm(nq, ld, a.Dv, a.dout, a.dsn, 1, a.vt, ld, dP, ld, false);
  dkdv_scores(a, sc, S, dP, bias);
  gemm(a.Dv, ld, nq, a.dout, 1, a.dsn, S, ld, a.dvt, ld, true);
  gemm(a.D, ld, nq, a.q, 1, a.qsn, dP, ld, a.dkt, ld, true);
}

// ---- decode, rows ≤ W (Nq·G small): D in SIMD lanes for the dots, W keys in lanes for the softmax ----
// Per row g and key block j0..j0+W:  s = Σ_d q_g k_j  (W dot products folded into one vector),
// then the online softmax with a scalar running max per row, and O_g += Σ_j p_j v_j.

// fold(a, b) over groups of 2h lanes: first h lanes = a's group folded in half, next h = b's.
constexpr int fold_index(int x, int h, int second) {
  const int g = x / (2 * h) * (2 * h), o = x % (2 * h);
  return (o < h ? g + o : W + g + o - h) + second * h;
}
template <int H, int S, int... X>
constexpr vi fold_mask(std::integer_sequence<int, X...>) {
  return vi{fold_index(X, H, S)...};
}
template <int H>
inline vf fold(vf a, vf b) {
  constexpr vi m1 = fold_mask<H, 0>(std::make_integer_sequence<int, W>{});
  constexpr vi m2 = fold_mask<H, 1>(std::make_integer_sequence<int, W>{});
  return __builtin_shuffle(a, b, m1) + __builtin_shuffle(a, b, m2);
}
template <int H, int... X>
constexpr vi xor_mask(std::integer_sequence<int, X...>) {
  return vi{(X ^ H)...};
}
// v[0..W) → one vector whose lane x is the sum of v[x]'s lanes.
template <int N = W>
inline void reduce_step(vf* v) {
  if constexpr (N > 1) {
#pragma GCC unroll 16
    for (int i = 0; i < N / 2; ++i) v[i] = fold<N / 2>(v[i], v[i + N / 2]);
    reduce_step<N / 2>(v);
  }
}

// Per-row state of the decode kernel, kept in scratch.
struct decode_state {
  std::int64_t L, nr, D, Dv, Dp, Dvp;
  float *qr, *orow, *lvec, *pb, *dots, *alpha, *bias, *kpad, *vpad;
  decode_state(const lane_block& lb, const forward_io& io)
      : L(lb.L), nr(lb.nl), D(lb.D), Dv(lb.Dv), Dp((D + W - 1) / W * W), Dvp((Dv + W - 1) / W * W) {
    qr = lb.scratch;          // [nr][Dp] q rows (pre-scaled)
    orow = qr + L * Dp;       // [nr][Dvp] unnormalised outputs
    lvec = orow + L * Dvp;    // [nr][W] per-lane partial sums of p
    pb = lvec + L * W;        // [nr][W] p of the current key block
    dots = pb + L * W;        // [nr][W] q·k of the current key block
    alpha = dots + L * W;     // [nr] rescale factors of the current key block
    bias = alpha + L;         // [nr][W]
    kpad = bias + L * W;      // [W][Dp] a short last key block, zero-padded
    vpad = kpad + W * Dp;     // [W][Dvp]
    for (std::int64_t g = 0; g < nr; ++g) {
      for (std::int64_t d = 0; d < Dp; ++d) qr[g * Dp + d] = d < D ? lb.qt[d * L + g] : 0.0f;
      for (std::int64_t d = 0; d < Dvp; ++d) orow[g * Dvp + d] = 0.0f;
      for (int x = 0; x < W; ++x) lvec[g * W + x] = x == 0 ? io.l[g] : 0.0f;
    }
  }
};

template <int H = W / 2>
inline vf hmax_step(vf v) {
  if constexpr (H == 0) {
    return v;
  } else {
    constexpr vi m = xor_mask<H>(std::make_integer_sequence<int, W>{});
    return hmax_step<H / 2>(vmax(v, __builtin_shuffle(v, m)));
  }
}

// Online-softmax update of row g from the raw dots of keys j0 + [0, W); leaves p in st.pb[g]
// and the rescale factor of the row's running output in st.alpha[g].
inline void decode_softmax(const lane_block& lb, const forward_io& io, const decode_state& st, const score_consts& sc,
                           std::int64_t g, vf dot, std::int64_t j0, std::int64_t nb) {
  vf t;
  const vf s = transform(dot, sc, &t, sc.bias ? load(st.bias + g * W) : vf{}, iota() + std::int32_t(j0),
                         splati(lb.pos[g]), splati(lb.lo[g]), splati(std::int32_t(imin(lb.hi[g], j0 + nb))),
                         splat(sc.alibi ? lb.slope[g] : 0.0f), true);
  const vf mxv = vmax(hmax_step(s), splat(io.m[g]));  // every lane holds the new max
  const vf mu = mxv == splat(-kInf) ? vf{} : mxv;
  const vf a = vexp(splat(io.m[g]) - mu);
  const vf p = vexp(s - mu);
  store(st.lvec + g * W, load(st.lvec + g * W) * a + p);
  io.m[g] = mxv[0];
  store(st.pb + g * W, p);
  st.alpha[g] = a[0];
}

// NC = D / W = Dv / W vectors. Three passes over the rows so that the rows' independent work
// overlaps (one row alone is a chain of dependent latencies): the dots of every row (q in
// registers, W dots folded at once), the softmax of every row, then P·V two rows at a time
// (each V vector read once for both, 2·NC independent accumulator chains).
template <int NC, class TK, class TV>
void decode_block(const lane_block& lb, const forward_io& io, const decode_state& st, const score_consts& sc,
                  std::int64_t j0, std::int64_t nb, const TK* kb, std::int64_t ks, const TV* vb, std::int64_t vs) {
  for (std::int64_t g = 0; g < st.nr; ++g) {
    vf qv[NC];
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) qv[c] = load(st.qr + g * st.Dp + c * W);
    vf acc[W];
    const TK* kp = kb;
#pragma GCC unroll 16
    for (int x = 0; x < W; ++x, kp += ks) {
      vf a = load_row(kp) * qv[0];
#pragma GCC unroll 8
      for (int c = 1; c < NC; ++c) a += load_row(kp + c * W) * qv[c];
      acc[x] = a;
    }
    reduce_step(acc);
    store(st.dots + g * W, acc[0]);
  }
  for (std::int64_t g = 0; g < st.nr; ++g) decode_softmax(lb, io, st, sc, g, load(st.dots + g * W), j0, nb);
  for (std::int64_t g = 0; g < st.nr; g += 2) {
    const std::int64_t g1 = g + 1 < st.nr ? g + 1 : g;  // an odd last row pairs with itself
    float* o0 = st.orow + g * st.Dvp;
    float* o1 = st.orow + g1 * st.Dvp;
    vf ov0[NC], ov1[NC];
    const float a0 = st.alpha[g], a1 = st.alpha[g1];
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) ov0[c] = load(o0 + c * W) * a0, ov1[c] = load(o1 + c * W) * a1;
    const TV* vp = vb;
    const float *p0 = st.pb + g * W, *p1 = st.pb + g1 * W;
#pragma GCC unroll 16
    for (int x = 0; x < W; ++x, vp += vs) {
      const vf px0 = splat(p0[x]), px1 = splat(p1[x]);
#pragma GCC unroll 8
      for (int c = 0; c < NC; ++c) {
        const vf vv = load_row(vp + c * W);
        ov0[c] += px0 * vv;
        ov1[c] += px1 * vv;
      }
    }
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) store(o1 + c * W, ov1[c]), store(o0 + c * W, ov0[c]);
  }
}

// Any D, Dv: vectors over the padded rows, scalar tails.
void decode_block_any(const lane_block& lb, const forward_io& io, const decode_state& st, const score_consts& sc,
                      std::int64_t j0, std::int64_t nb, const float* kb, std::int64_t ks, const float* vb,
                      std::int64_t vs) {
  const std::int64_t Df = st.D / W * W, Dvf = st.Dv / W * W;
  for (std::int64_t g = 0; g < st.nr; ++g) {
    const float* q = st.qr + g * st.Dp;
    vf acc[W];
    for (int x = 0; x < W; ++x) {
      const float* kp = kb + x * ks;
      vf a{};
      for (std::int64_t d = 0; d < Df; d += W) a += load(kp + d) * load(q + d);
      acc[x] = a;
    }
    reduce_step(acc);
    vf dot = acc[0];
    for (int x = 0; x < W; ++x)
      for (std::int64_t d = Df; d < st.D; ++d) dot[x] += q[d] * kb[x * ks + d];
    decode_softmax(lb, io, st, sc, g, dot, j0, nb);
    const float a = st.alpha[g];
    const float* pb = st.pb + g * W;
    float* o = st.orow + g * st.Dvp;
    for (std::int64_t d = 0; d < Dvf; d += W) {
      vf oa = load(o + d) * a;
      for (int x = 0; x < W; ++x) oa += splat(pb[x]) * load(vb + x * vs + d);
      store(o + d, oa);
    }
    for (std::int64_t d = Dvf; d < st.Dv; ++d) {
      float oa = o[d] * a;
      for (int x = 0; x < W; ++x) oa += pb[x] * vb[x * vs + d];
      o[d] = oa;
    }
  }
}

template <int NC = 8, class TK, class TV>
void decode_dispatch(int nc, const lane_block& lb, const forward_io& io, const decode_state& st, const score_consts& sc,
                     std::int64_t j0, std::int64_t nb, const TK* kb, std::int64_t ks, const TV* vb, std::int64_t vs) {
  if constexpr (NC == 0) {
    if constexpr (sizeof(TK) == 4 && sizeof(TV) == 4) decode_block_any(lb, io, st, sc, j0, nb, kb, ks, vb, vs);
  } else {
    if (nc == NC) return decode_block<NC>(lb, io, st, sc, j0, nb, kb, ks, vb, vs);
    decode_dispatch<NC - 1>(nc, lb, io, st, sc, j0, nb, kb, ks, vb, vs);
  }
}

void decode_impl(const lane_block& lb, const forward_io& io) {
  const decode_state st(lb, io);  // (its pointers are const; the floats they point to are not)
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  // The specialised kernel when D == Dv is a multiple of W up to 8 vectors; 0 = any shape.
  const int nc = st.D == st.Dv && st.D % W == 0 && st.D / W <= 8 ? int(st.D / W) : 0;
  const bool b16 = lb.k16 != nullptr;
  const std::int64_t esize = b16 ? 2 : 4;
  const char* kbase = b16 ? reinterpret_cast<const char*>(lb.k16) : reinterpret_cast<const char*>(lb.k);
  const char* vbase = b16 ? reinterpret_cast<const char*>(lb.v16) : reinterpret_cast<const char*>(lb.v);
  for (std::int64_t j0 = kr.kmin; j0 < kr.kmax; j0 += W) {
    const std::int64_t nb = imin(W, kr.kmax - j0);
    const char* kb = kbase + j0 * lb.ksn * esize;
    const char* vb = vbase + j0 * lb.vsn * esize;
    if (sc.bias) {
      lb.sp.bias(lb.sp.bias_ctx, j0, nb, st.bias, W, 1);
      for (std::int64_t g = 0; g < st.nr; ++g)
        for (std::int64_t x = nb; x < W; ++x) st.bias[g * W + x] = 0.0f;
    }
    if (nb < W || (b16 && nc == 0)) {  // short last block, or bf16 of a general shape: f32 copy, zero-padded
      for (std::int64_t x = 0; x < W; ++x) {
        const auto kat = [&](std::int64_t d) {
          return b16 ? scalar_row(reinterpret_cast<const std::uint16_t*>(kb) + x * lb.ksn + d)
                     : reinterpret_cast<const float*>(kb)[x * lb.ksn + d];
        };
        const auto vat = [&](std::int64_t d) {
          return b16 ? scalar_row(reinterpret_cast<const std::uint16_t*>(vb) + x * lb.vsn + d)
                     : reinterpret_cast<const float*>(vb)[x * lb.vsn + d];
        };
        for (std::int64_t d = 0; d < st.Dp; ++d) st.kpad[x * st.Dp + d] = x < nb && d < st.D ? kat(d) : 0.0f;
        for (std::int64_t d = 0; d < st.Dvp; ++d) st.vpad[x * st.Dvp + d] = x < nb && d < st.Dv ? vat(d) : 0.0f;
      }
      decode_dispatch(nc, lb, io, st, sc, j0, nb, static_cast<const float*>(st.kpad), st.Dp,
                      static_cast<const float*>(st.vpad), st.Dvp);
      continue;
    }
    if (b16) {  // keys converted once per block for all rows; values as they are (each read once)
      for (std::int64_t x = 0; x < W; ++x)
        for (std::int64_t d = 0; d < st.D; d += W)
          store(st.kpad + x * st.Dp + d, load_row(reinterpret_cast<const std::uint16_t*>(kb) + x * lb.ksn + d));
      decode_dispatch(nc, lb, io, st, sc, j0, nb, static_cast<const float*>(st.kpad), st.Dp,
                      reinterpret_cast<const std::uint16_t*>(vb), lb.vsn);
    } else {
      decode_dispatch(nc, lb, io, st, sc, j0, nb, reinterpret_cast<const float*>(kb), lb.ksn,
                      reinterpret_cast<const float*>(vb), lb.vsn);
    }
  }
  for (std::int64_t g = 0; g < st.nr; ++g) {
    float l = 0.0f;
    for (int x = 0; x < W; ++x) l += st.lvec[g * W + x];
    io.l[g] = l;
    for (std::int64_t d = 0; d < st.Dv; ++d) io.ot[d * st.L + g] = st.orow[g * st.Dvp + d];
  }
}

void forward_entry(const lane_block& lb, const forward_io& io) {
  if (lb.L == C * W) return forward_impl<C>(lb, io);
  decode_impl(lb, io);
}
void dq_entry(const lane_block& lb, const dq_io& io) {
  if (lb.L == C * W) return dq_impl<C>(lb, io);
  dq_impl<1>(lb, io);
}

constexpr kernel_table make_table(const char* name) {
  return kernel_table{name, W, C * W, W, forward_entry, dq_entry, dkdv_impl, nullptr, nullptr, nullptr};
}

}  // namespace
}  // namespace attn::detail::cpu

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

// ---- decode, rows ≤ W (Nq·G small): D in SIMD lanes for the dots, keys in lanes for the softmax ----

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

// Rows are taken RG at a time (RG = 4; 1 or 2 when the (b, hkv) has only that many rows), keys
// in blocks of W, each block read once (from memory; then from L1 for every row group):
//   dots: KG = W / RG keys × RG rows at a time into W accumulator vectors with D in the lanes,
//     each K vector loaded once for the RG rows; reduce_step folds the W accumulators into one
//     score vector whose lane r·KG + x is row r · key x ("mixed layout"), RG vectors per block;
//   softmax in the mixed layout: a per-lane running max (equal over a row's KG lanes), one exp
//     per score and per-lane partial sums of p — no scalar work per key;
//   P·V: RG rows × CB output vectors accumulate in registers over the W keys of the block, each
//     V vector loaded once per row group.
// bf16 K/V are read as 32-bit words: even element = word << 16, odd = word & 0xffff0000 (exact,
// no shuffles), so q and o are kept in that "native" order (per 2W elements: the W even ones,
// then the W odd ones) — a permutation of d applied to q once and undone on o once. On the
// avx512bf16 level, with q exactly bf16 (lane_block::q_bf16), the dots take K words as they are
// (vdpbf16ps, decode_scores_dp). A short last block, or a head size that does not fill whole
// vectors (bf16: whole word vectors), goes through a zero-padded copy of the block. The rows a
// block ahead are prefetched, one line per line read (the hardware prefetcher alone reaches
// about half the bandwidth here).

// W floats (one unit) from f32, or 2W floats (even, odd elements) from 2W bf16.
template <class T>
struct elem {
  static constexpr int U = 1;  // vectors per unit
  static void get(const float* p, vf* out) { out[0] = load(p); }
  static std::int64_t native(std::int64_t d) { return d; }
};
template <>
struct elem<std::uint16_t> {
  static constexpr int U = 2;
  static void get(const std::uint16_t* p, vf* out) {
    vi w;
    __builtin_memcpy(&w, p, sizeof w);
    out[0] = (vf)(w << 16);
    out[1] = (vf)(w & splati(std::int32_t(0xffff0000u)));
  }
  static std::int64_t native(std::int64_t d) {
    const std::int64_t u = d / (2 * W), e = d % (2 * W);
    return u * 2 * W + (e & 1) * W + e / 2;
  }
};

// Lane-wise max within groups of 2H lanes (then H/2, ...): every lane gets its group's max.
template <int H>
inline vf group_max(vf v) {
  if constexpr (H == 0) {
    return v;
  } else {
    constexpr vi m = xor_mask<H>(std::make_integer_sequence<int, W>{});
    return group_max<H / 2>(vmax(v, __builtin_shuffle(v, m)));
  }
}

// Scratch of the decode kernel (floats): per row group g, per-lane vectors; per row, q and o.
struct decode_layout {
  std::int64_t nr, ng, nrp, D, Dv, Dp, Dvp;
  float *qr, *orow, *mvec, *lacc, *pb, *alpha, *bias, *biasm, *kpad, *vpad;
  std::int32_t *pos, *lo, *hi;
  float* slope;
  decode_layout(const lane_block& lb, int RG, int unit) : nr(lb.nl), D(lb.D), Dv(lb.Dv) {
    ng = (nr + RG - 1) / RG, nrp = ng * RG;
    Dp = (D + unit - 1) / unit * unit, Dvp = (Dv + unit - 1) / unit * unit;
    float* f = lb.scratch;
    qr = f, f += nrp * Dp;        // [nrp][Dp] q rows, pre-scaled, native order
    orow = f, f += nrp * Dvp;     // [nrp][Dvp] unnormalised outputs, native order
    mvec = f, f += ng * W;        // [ng][W] running max (mixed layout)
    lacc = f, f += ng * W;        // [ng][W] partial sums of p
    pos = reinterpret_cast<std::int32_t*>(f), f += ng * W;  // [ng][W] row constants, mixed layout
    lo = reinterpret_cast<std::int32_t*>(f), f += ng * W;
    hi = reinterpret_cast<std::int32_t*>(f), f += ng * W;
    slope = f, f += ng * W;
    pb = f, f += RG * W;          // [RG][W] p of the current block and row group
    alpha = f, f += W;            // [RG] rescale factors
    bias = f, f += lb.L * W;      // [L][W] mask of the block
    biasm = f, f += nrp * W;      // [ng][RG][W] the same, mixed layout
    kpad = f, f += W * Dp;        // [W][Dp] a padded copy of the block (f32 or bf16)
    vpad = f, f += W * Dvp;
  }
  static std::int64_t floats(std::int64_t L, std::int64_t D, std::int64_t Dv, int RG, int unit) {
    const std::int64_t ng = (L + RG - 1) / RG, Dp = (D + unit - 1) / unit * unit, Dvp = (Dv + unit - 1) / unit * unit;
    return ng * RG * (Dp + Dvp) + 6 * ng * W + RG * W + W + L * W + ng * RG * W + W * (Dp + Dvp);
  }
};

// Scores of keys kb[0, W) (row stride ks) for the RG rows q[r·Dp ..], in the mixed layout.
template <int RG, class T>
inline void decode_scores(const float* q, std::int64_t Dp, std::int64_t nu, const T* kb, std::int64_t ks, vf* s,
                          const T* kpf) {
  constexpr int KG = W / RG, U = elem<T>::U;
#pragma GCC unroll 4
  for (int kg = 0; kg < RG; ++kg) {
    vf acc[W];
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) acc[i] = vf{};
    const T* kp = kb + kg * KG * ks;
    const T* pp = kpf + kg * KG * ks;
    for (std::int64_t u = 0; u < nu; ++u) {
      vf qv[RG][U];
#pragma GCC unroll 4
      for (int r = 0; r < RG; ++r)
#pragma GCC unroll 2
        for (int e = 0; e < U; ++e) qv[r][e] = load(q + r * Dp + (u * U + e) * W);
#pragma GCC unroll 16
      for (int x = 0; x < KG; ++x) {
        vf kv[U];
        elem<T>::get(kp + x * ks + u * U * W, kv);
        __builtin_prefetch(pp + x * ks + u * U * W);
#pragma GCC unroll 2
        for (int e = 0; e < U; ++e)
#pragma GCC unroll 4
          for (int r = 0; r < RG; ++r) acc[r * KG + x] += kv[e] * qv[r][e];
      }
    }
    reduce_step(acc);
    s[kg] = acc[0];
  }
}

#ifdef ATTN_CPU_DPBF16
// The same scores from bf16 q words (q exactly bf16, unscaled: pairs of d in one 32-bit word, as
// in memory) with vdpbf16ps: one instruction per 32 products, no conversion of K.
template <int RG>
inline void decode_scores_dp(const std::uint32_t* q, std::int64_t qw, std::int64_t nu, const std::uint16_t* kb,
                             std::int64_t ks, vf* s, const std::uint16_t* kpf) {
  constexpr int KG = W / RG;
#pragma GCC unroll 4
  for (int kg = 0; kg < RG; ++kg) {
    __m512 acc[W];
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) acc[i] = _mm512_setzero_ps();
    const std::uint16_t* kp = kb + kg * KG * ks;
    const std::uint16_t* pp = kpf + kg * KG * ks;
    for (std::int64_t u = 0; u < nu; ++u) {
      __m512bh qv[RG];
#pragma GCC unroll 4
      for (int r = 0; r < RG; ++r) qv[r] = (__m512bh)_mm512_loadu_si512(q + r * qw + u * W);
#pragma GCC unroll 16
      for (int x = 0; x < KG; ++x) {
        const __m512bh kv = (__m512bh)_mm512_loadu_si512(kp + x * ks + u * 2 * W);
        __builtin_prefetch(pp + x * ks + u * 2 * W);
#pragma GCC unroll 4
        for (int r = 0; r < RG; ++r) acc[r * KG + x] = _mm512_dpbf16_ps(acc[r * KG + x], kv, qv[r]);
      }
    }
    vf a[W];
#pragma GCC unroll 16
    for (int i = 0; i < W; ++i) a[i] = (vf)acc[i];
    reduce_step(a);
    s[kg] = a[0];
  }
}
constexpr bool kDecodeDp = true;
#else
constexpr bool kDecodeDp = false;
#endif

// Online softmax of one row group over one block (mixed layout): s → p in pb, α in alpha.
template <int RG>
inline void decode_softmax(const decode_layout& st, const score_consts& sc, std::int64_t g, vf* s, std::int64_t j0,
                           std::int64_t nb) {
  constexpr int KG = W / RG;
  const vi pos = loadi(st.pos + g * W), lo = loadi(st.lo + g * W), hi0 = loadi(st.hi + g * W);
  const vi hi = hi0 < splati(std::int32_t(j0 + nb)) ? hi0 : splati(std::int32_t(j0 + nb));
  const vf slope = load(st.slope + g * W);
  const vi keyoff = iota() & splati(KG - 1);
  const vf m_old = load(st.mvec + g * W);
  vf mx = m_old, t;
#pragma GCC unroll 4
  for (int kg = 0; kg < RG; ++kg) {
    s[kg] = transform(s[kg], sc, &t, sc.bias ? load(st.biasm + (g * RG + kg) * W) : vf{},
                      splati(std::int32_t(j0 + kg * KG)) + keyoff, pos, lo, hi, slope, true);
    mx = vmax(mx, s[kg]);
  }
  mx = group_max<KG / 2>(mx);
  const vf mu = mx == splat(-kInf) ? vf{} : mx;  // a row with nothing yet keeps p = 0
  const vf a = vexp(m_old - mu);
  vf sum = load(st.lacc + g * W) * a;
#pragma GCC unroll 4
  for (int kg = 0; kg < RG; ++kg) {
    const vf p = vexp(s[kg] - mu);
    store(st.pb + kg * W, p);
    sum += p;
  }
  store(st.lacc + g * W, sum);
  store(st.mvec + g * W, mx);
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r) st.alpha[r] = a[r * KG];
}

// O[r][c0·W, (c0 + CB)·W) = α_r O + Σ_x p[r][x] v_x for the RG rows at o (row stride Dvp).
template <int RG, int CB, class T>
inline void decode_pv(float* o, std::int64_t Dvp, const float* pb, const float* alpha, const T* vb, std::int64_t vs,
                      std::int64_t c0, const T* vpf) {
  constexpr int KG = W / RG, U = elem<T>::U;
  static_assert(CB % U == 0);
  vf acc[RG][CB];
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r) {
    const vf a = splat(alpha[r]);
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) acc[r][c] = load(o + r * Dvp + (c0 + c) * W) * a;
  }
  const T* vp = vb + c0 * W;
  const T* pp = vpf + c0 * W;
#pragma GCC unroll 16
  for (int x = 0; x < W; ++x, vp += vs, pp += vs) {
    vf vv[CB];
#pragma GCC unroll 8
    for (int u = 0; u < CB / U; ++u) elem<T>::get(vp + u * U * W, vv + u * U), __builtin_prefetch(pp + u * U * W);
#pragma GCC unroll 4
    for (int r = 0; r < RG; ++r) {
      const vf px = splat(pb[x / KG * W + r * KG + x % KG]);
#pragma GCC unroll 8
      for (int c = 0; c < CB; ++c) acc[r][c] += px * vv[c];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RG; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < CB; ++c) store(o + r * Dvp + (c0 + c) * W, acc[r][c]);
}
template <int RG, int CB, class T>
inline void decode_pv_tail(int nv, float* o, std::int64_t Dvp, const float* pb, const float* alpha, const T* vb,
                           std::int64_t vs, std::int64_t c0, const T* vpf) {
  if constexpr (CB > 0) {
    if constexpr (CB % elem<T>::U == 0)
      if (nv == CB) return decode_pv<RG, CB>(o, Dvp, pb, alpha, vb, vs, c0, vpf);
    decode_pv_tail<RG, CB - 1>(nv, o, Dvp, pb, alpha, vb, vs, c0, vpf);
  }
}

// Bytes of K and V prefetched ahead of the block being read (per stream).
// Bytes of each of K and V prefetched ahead of the block being read (at least one block): far
// enough to cover the memory latency, near enough to stay in L1 (measured: 4–16 KiB are alike).
constexpr std::int64_t kDecodePrefetchBytes = 8192;

// DP: bf16 rows with q exactly bf16 (lane_block::q_bf16) on an ISA with vdpbf16ps.
template <int RG, class T, bool DP = false>
void decode_rows(const lane_block& lb, const forward_io& io, bool copy_all) {
  constexpr int KG = W / RG, U = elem<T>::U;
  constexpr int CB = RG == 4 ? 4 : 8;  // P·V output vectors per row in registers
  const decode_layout st(lb, RG, U * W);
  const score_consts sc(lb.sp);
  const lane_range kr(lb);
  const std::int64_t L = lb.L, nr = st.nr, Dp = st.Dp, Dvp = st.Dvp;
  for (std::int64_t g = 0; g < st.nrp; ++g) {
    const bool valid = g < nr;
    if constexpr (DP) {  // words of bf16 pairs (the values are exactly bf16: truncation is exact)
      auto* qw = reinterpret_cast<std::uint32_t*>(st.qr) + g * (Dp / 2);
      const auto bits = [&](std::int64_t d) {
        std::uint32_t u = 0;
        if (valid) __builtin_memcpy(&u, lb.qt + d * L + g, 4);
        return u >> 16;
      };
      for (std::int64_t d = 0; d < Dp; d += 2) qw[d / 2] = bits(d) | bits(d + 1) << 16;
    } else {
      for (std::int64_t d = 0; d < Dp; ++d)
        st.qr[g * Dp + elem<T>::native(d)] = valid && d < lb.D ? lb.qt[d * L + g] : 0.0f;
    }
    for (std::int64_t d = 0; d < Dvp; ++d) st.orow[g * Dvp + d] = 0.0f;
    const std::int64_t x0 = g / RG * W + g % RG * KG;  // the row's lanes in the mixed layout
    for (int x = 0; x < KG; ++x) {
      st.mvec[x0 + x] = valid ? io.m[g] : -kInf;
      st.lacc[x0 + x] = valid && x == 0 ? io.l[g] : 0.0f;
      st.pos[x0 + x] = valid ? lb.pos[g] : 0;
      st.lo[x0 + x] = valid ? lb.lo[g] : 0;
      st.hi[x0 + x] = valid ? lb.hi[g] : 0;
      st.slope[x0 + x] = valid && lb.sp.alibi ? lb.slope[g] : 0.0f;
    }
  }
  const bool b16 = lb.k16 != nullptr;
  const std::int64_t esize = b16 ? 2 : 4;
  const char* kbase = b16 ? reinterpret_cast<const char*>(lb.k16) : reinterpret_cast<const char*>(lb.k);
  const char* vbase = b16 ? reinterpret_cast<const char*>(lb.v16) : reinterpret_cast<const char*>(lb.v);
  const auto elem_f32 = [&](const char* base, std::int64_t i) {
    return b16 ? scalar_row(reinterpret_cast<const std::uint16_t*>(base) + i) : reinterpret_cast<const float*>(base)[i];
  };
  const std::int64_t nu = Dp / (U * W), nv = Dvp / W;
  const std::int64_t row_bytes = imax(1, imax(lb.D, lb.Dv) * std::int64_t(sizeof(T)));
  const std::int64_t pf_keys = imax(W, kDecodePrefetchBytes / row_bytes);
  vf s[RG];
  for (std::int64_t j0 = kr.kmin; j0 < kr.kmax; j0 += W) {
    const std::int64_t nb = imin(W, kr.kmax - j0);
    const T* kb = reinterpret_cast<const T*>(kbase + j0 * lb.ksn * esize);
    const T* vb = reinterpret_cast<const T*>(vbase + j0 * lb.vsn * esize);
    std::int64_t ks = lb.ksn, vs = lb.vsn;
    // Software prefetch of the rows pf_keys ahead, one line per line read (spread through the
    // block: issued in a burst, they stall); the current block itself when there are none.
    const bool pf = j0 + pf_keys + W <= kr.kmax;
    const T* kpf = pf ? reinterpret_cast<const T*>(kbase + (j0 + pf_keys) * lb.ksn * esize) : kb;
    const T* vpf = pf ? reinterpret_cast<const T*>(vbase + (j0 + pf_keys) * lb.vsn * esize) : vb;
    if (copy_all || nb < W) {  // a short last block or an odd shape: a zero-padded copy
      T* kp = reinterpret_cast<T*>(st.kpad);
      T* vp = reinterpret_cast<T*>(st.vpad);
      const char* kb0 = kbase + j0 * lb.ksn * esize;
      const char* vb0 = vbase + j0 * lb.vsn * esize;
      for (std::int64_t x = 0; x < W; ++x) {
        for (std::int64_t d = 0; d < Dp; ++d) {
          if constexpr (U == 1) kp[x * Dp + d] = x < nb && d < lb.D ? elem_f32(kb0, x * lb.ksn + d) : 0.0f;
          else kp[x * Dp + d] = x < nb ? reinterpret_cast<const std::uint16_t*>(kb0)[x * lb.ksn + d] : 0;
        }
        for (std::int64_t d = 0; d < Dvp; ++d) {
          if constexpr (U == 1) vp[x * Dvp + d] = x < nb && d < lb.Dv ? elem_f32(vb0, x * lb.vsn + d) : 0.0f;
          else vp[x * Dvp + d] = x < nb ? reinterpret_cast<const std::uint16_t*>(vb0)[x * lb.vsn + d] : 0;
        }
      }
      kb = kp, vb = vp, ks = Dp, vs = Dvp, kpf = kp, vpf = vp;
    }
    if (sc.bias) {
      lb.sp.bias(lb.sp.bias_ctx, j0, nb, st.bias, W, 1);
      for (std::int64_t g = 0; g < st.nrp; ++g)
        for (std::int64_t x = 0; x < W; ++x)
          st.biasm[g / RG * RG * W + x / KG * W + g % RG * KG + x % KG] = g < L && x < nb ? st.bias[g * W + x] : 0.0f;
    }
    for (std::int64_t g = 0; g < st.ng; ++g) {
      const bool first = g == 0;  // later row groups read the block from L1
      if constexpr (DP) {
#ifdef ATTN_CPU_DPBF16
        decode_scores_dp<RG>(reinterpret_cast<const std::uint32_t*>(st.qr) + g * RG * (Dp / 2), Dp / 2, nu, kb, ks, s,
                             first ? kpf : kb);
#endif
      } else {
        decode_scores<RG>(st.qr + g * RG * Dp, Dp, nu, kb, ks, s, first ? kpf : kb);
      }
      decode_softmax<RG>(st, sc, g, s, j0, nb);
      float* o = st.orow + g * RG * Dvp;
      std::int64_t c0 = 0;
      for (; c0 + CB <= nv; c0 += CB) decode_pv<RG, CB>(o, Dvp, st.pb, st.alpha, vb, vs, c0, first ? vpf : vb);
      if (c0 < nv) decode_pv_tail<RG, CB - 1>(int(nv - c0), o, Dvp, st.pb, st.alpha, vb, vs, c0, first ? vpf : vb);
    }
  }
  for (std::int64_t g = 0; g < nr; ++g) {
    const std::int64_t x0 = g / RG * W + g % RG * KG;
    float l = 0.0f;
    for (int x = 0; x < KG; ++x) l += st.lacc[x0 + x];
    io.l[g] = l;
    io.m[g] = st.mvec[x0];
    for (std::int64_t d = 0; d < lb.Dv; ++d) io.ot[d * L + g] = st.orow[g * Dvp + elem<T>::native(d)];
  }
}

template <int RG>
void decode_rg(const lane_block& lb, const forward_io& io) {
  const bool b16 = lb.k16 != nullptr;
  if (b16 && lb.D % (2 * W) == 0 && lb.Dv % (2 * W) == 0) {
    if (kDecodeDp && lb.q_bf16) return decode_rows<RG, std::uint16_t, kDecodeDp>(lb, io, false);
    return decode_rows<RG, std::uint16_t>(lb, io, false);
  }
  decode_rows<RG, float>(lb, io, b16 || lb.D % W != 0 || lb.Dv % W != 0);
}

void decode_impl(const lane_block& lb, const forward_io& io) {
  if (lb.nl >= 3) return decode_rg<4>(lb, io);
  if (lb.nl == 2) return decode_rg<2>(lb, io);
  decode_rg<1>(lb, io);
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

// src/cpu/family_linear_body.h — linear attention's f32 kernels (family_kernels.h: family_linear;
// the driver, the float64 path and the reference are src/family/linear.cc), compiled per ISA
// inside family_body.h. One query head at a time:
//   forward   S = Σ_{j < hi_i} b_j v_jᵀ [D, Dvp], z = Σ b_j; num_i = Sᵀ a_i, den_i = a_i·z
//   backward  a forward sweep (dnum_i, dden_i and dφq_i = S dnum_i + z dden_i), then a sweep over
//             the keys from the last: G = Σ_{i: hi_i > j} a_i dnum_iᵀ, g = Σ a_i dden_i;
//             dφk_j += G v_j + g, dv_j += Gᵀ b_j
// Rows of Dv floats are padded to Dvp (a multiple of W) with zeros, so the products over Dv run
// on whole vectors; the sums over D run per d. Keys (and queries, in the backward's second sweep)
// join S (G) four at a time, each row of S loaded once per four. Every sum runs in one fixed
// order: the result does not depend on the thread that computes it.
#pragma once

#include <cstdint>

#include "cpu/family_kernels.h"
#include "cpu/simd.h"

namespace attn::detail::cpu {
namespace {

inline float lin_hsum(vf v) {
  float s = 0.0f;
#pragma GCC unroll 16
  for (int x = 0; x < W; ++x) s += v[x];
  return s;
}

// S[d] += Σ_{r ∈ [r0, r1)} X[r][d] · Y[r] (Y rows of nv vectors, stride ldy), z[d] += Σ X[r][d]·w_r
// (w_r = 1 where w is null).
inline void lin_rank_update(float* S, float* z, std::int64_t D, std::int64_t nv, const float* X, std::int64_t ldx,
                            const float* Y, std::int64_t ldy, const float* w, std::int64_t r0, std::int64_t r1) {
  const std::int64_t ldS = nv * W;
  std::int64_t r = r0;
  for (; r + 4 <= r1; r += 4) {
    const float *x0 = X + r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
    const float *y0 = Y + r * ldy, *y1 = y0 + ldy, *y2 = y1 + ldy, *y3 = y2 + ldy;
    const float w0 = w ? w[r] : 1.0f, w1 = w ? w[r + 1] : 1.0f, w2 = w ? w[r + 2] : 1.0f, w3 = w ? w[r + 3] : 1.0f;
    for (std::int64_t d = 0; d < D; ++d) {
      const float c0 = x0[d], c1 = x1[d], c2 = x2[d], c3 = x3[d];
      const vf s0 = splat(c0), s1 = splat(c1), s2 = splat(c2), s3 = splat(c3);
      float* Sd = S + d * ldS;
      for (std::int64_t u = 0; u < nv; ++u) {
        vf acc = load(Sd + u * W);
        acc += s0 * load(y0 + u * W);
        acc += s1 * load(y1 + u * W);
        acc += s2 * load(y2 + u * W);
        acc += s3 * load(y3 + u * W);
        store(Sd + u * W, acc);
      }
      z[d] += c0 * w0 + c1 * w1 + c2 * w2 + c3 * w3;
    }
  }
  for (; r < r1; ++r) {
    const float* xr = X + r * ldx;
    const float* yr = Y + r * ldy;
    const float wr = w ? w[r] : 1.0f;
    for (std::int64_t d = 0; d < D; ++d) {
      const vf s = splat(xr[d]);
      float* Sd = S + d * ldS;
      for (std::int64_t u = 0; u < nv; ++u) store(Sd + u * W, load(Sd + u * W) + s * load(yr + u * W));
      z[d] += xr[d] * wr;
    }
  }
}

// out[r] (+)= Σ_d A[r][d] · S[d] for rows r ∈ [r0, r1) (rows of nv vectors, stride ldo): up to
// 4 rows × 4 vectors of accumulators per pass over d; `add` accumulates into out.
template <int RB, int UB>
inline void lin_apply_block(const float* S, std::int64_t ldS, std::int64_t D, const float* A, std::int64_t lda,
                            float* out, std::int64_t ldo, std::int64_t u0, bool add) {
  vf acc[RB][UB];
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < UB; ++u) acc[r][u] = vf{};
  for (std::int64_t d = 0; d < D; ++d) {
    vf s[UB];
#pragma GCC unroll 4
    for (int u = 0; u < UB; ++u) s[u] = load(S + d * ldS + (u0 + u) * W);
#pragma GCC unroll 4
    for (int r = 0; r < RB; ++r) {
      const vf c = splat(A[r * lda + d]);
#pragma GCC unroll 4
      for (int u = 0; u < UB; ++u) acc[r][u] += c * s[u];
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 4
    for (int u = 0; u < UB; ++u) {
      float* o = out + r * ldo + (u0 + u) * W;
      store(o, add ? acc[r][u] + load(o) : acc[r][u]);
    }
}
template <int RB>
inline void lin_apply_rows(const float* S, std::int64_t ldS, std::int64_t D, std::int64_t nv, const float* A,
                           std::int64_t lda, float* out, std::int64_t ldo, bool add) {
  std::int64_t u = 0;
  for (; u + 4 <= nv; u += 4) lin_apply_block<RB, 4>(S, ldS, D, A, lda, out, ldo, u, add);
  for (; u < nv; ++u) lin_apply_block<RB, 1>(S, ldS, D, A, lda, out, ldo, u, add);
}
inline void lin_apply(const float* S, std::int64_t D, std::int64_t nv, const float* A, std::int64_t lda, float* out,
                      std::int64_t ldo, std::int64_t r0, std::int64_t r1, bool add) {
  const std::int64_t ldS = nv * W;
  std::int64_t r = r0;
  for (; r + 4 <= r1; r += 4) lin_apply_rows<4>(S, ldS, D, nv, A + r * lda, lda, out + r * ldo, ldo, add);
  for (; r < r1; ++r) lin_apply_rows<1>(S, ldS, D, nv, A + r * lda, lda, out + r * ldo, ldo, add);
}

// out[d] (+)= S[d]·y + z[d]·c for d < D (y: nv vectors).
inline void lin_dots(const float* S, const float* z, std::int64_t D, std::int64_t nv, const float* y, float c,
                     float* out, bool add) {
  const std::int64_t ldS = nv * W;
  for (std::int64_t d = 0; d < D; ++d) {
    vf acc{};
    for (std::int64_t u = 0; u < nv; ++u) acc += load(S + d * ldS + u * W) * load(y + u * W);
    const float v = lin_hsum(acc) + z[d] * c;
    out[d] = add ? out[d] + v : v;
  }
}

// The queries [i0, i1) that see the same keys: up to four at a time share each pass over S.
inline std::int64_t lin_same_keys(const family_linear& a, std::int64_t i0) {
  std::int64_t i1 = i0 + 1;
  while (i1 < a.Nq && i1 < i0 + 4 && a.hi[i1] == a.hi[i0]) ++i1;
  return i1;
}

void lin_forward_entry(const family_linear& a, float* out) {
  const std::int64_t D = a.D, nv = a.Dvp / W;
  for (std::int64_t x = 0; x < D * a.Dvp; ++x) a.S[x] = 0.0f;
  for (std::int64_t d = 0; d < D; ++d) a.z[d] = 0.0f;
  std::int64_t cur = 0;
  for (std::int64_t i = 0; i < a.Nq;) {
    const std::int64_t i1 = lin_same_keys(a, i);
    lin_rank_update(a.S, a.z, D, nv, a.K, D, a.V, a.Dvp, nullptr, cur, a.hi[i]);
    cur = a.hi[i];
    lin_apply(a.S, D, nv, a.Q, D, out, a.Dvp, i, i1, false);
    for (std::int64_t r = i; r < i1; ++r) {
      float* o = out + r * a.Dvp;
      if (!a.normalize) {
        const vf sc = splat(a.scale);
        for (std::int64_t u = 0; u < nv; ++u) store(o + u * W, load(o + u * W) * sc);
        continue;
      }
      float den = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) den += a.Q[r * D + d] * a.z[d];
      const vf inv = splat(den != 0.0f ? 1.0f / den : 0.0f);
      for (std::int64_t u = 0; u < nv; ++u) store(o + u * W, den != 0.0f ? load(o + u * W) * inv : vf{});
    }
    i = i1;
  }
}

void lin_backward_entry(const family_linear& a, const float* dO, const family_linear_grads& g) {
  const std::int64_t D = a.D, Dvp = a.Dvp, nv = Dvp / W;
  float* gn = g.dnum;
  for (std::int64_t x = 0; x < D * Dvp; ++x) a.S[x] = 0.0f;
  for (std::int64_t d = 0; d < D; ++d) a.z[d] = 0.0f;
  // Forward sweep: S_i, z_i; dnum_i, dden_i; dφq_i = S_i dnum_i + z_i dden_i.
  std::int64_t cur = 0;
  for (std::int64_t i = 0; i < a.Nq; ++i) {
    lin_rank_update(a.S, a.z, D, nv, a.K, D, a.V, Dvp, nullptr, cur, a.hi[i]);
    cur = a.hi[i];
    const float* gi = dO + i * Dvp;
    float* gni = gn + i * Dvp;
    g.dden[i] = 0.0f;
    if (!a.normalize) {
      const vf sc = splat(a.scale);
      for (std::int64_t u = 0; u < nv; ++u) store(gni + u * W, load(gi + u * W) * sc);
    } else {
      lin_apply(a.S, D, nv, a.Q + i * D, D, g.num, Dvp, 0, 1, false);
      float den = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) den += a.Q[i * D + d] * a.z[d];
      if (den != 0.0f) {
        const vf inv = splat(1.0f / den);
        vf go{};
        for (std::int64_t u = 0; u < nv; ++u) {
          const vf gu = load(gi + u * W) * inv;
          store(gni + u * W, gu);
          go += gu * load(g.num + u * W);
        }
        g.dden[i] = -lin_hsum(go) / den;  // -Σ g·num / den²
      } else {
        for (std::int64_t u = 0; u < nv; ++u) store(gni + u * W, vf{});
      }
    }
    lin_dots(a.S, a.z, D, nv, gni, g.dden[i], g.dq + i * D, false);
  }
  // Backward sweep over the keys: G, g gather the queries that see key j (a suffix of the queries).
  float* G = a.S;
  float* gz = a.z;
  for (std::int64_t x = 0; x < D * Dvp; ++x) G[x] = 0.0f;
  for (std::int64_t d = 0; d < D; ++d) gz[d] = 0.0f;
  std::int64_t qi = a.Nq;  // queries [qi, Nq) have joined G
  for (std::int64_t j = a.Nk - 1; j >= 0;) {
    std::int64_t q0 = qi;
    while (q0 > 0 && a.hi[q0 - 1] > j) --q0;
    lin_rank_update(G, gz, D, nv, a.Q, D, gn, Dvp, g.dden, q0, qi);
    qi = q0;
    // Keys [j0, j] see the same queries: down to the key before the next query's last.
    const std::int64_t j0 = qi > 0 ? imax(imin(a.hi[qi - 1], j), 0) : 0;
    if (qi < a.Nq) {  // else no query sees these keys
      for (std::int64_t jj = j0; jj <= j; ++jj) lin_dots(G, gz, D, nv, a.V + jj * Dvp, 1.0f, g.dK + jj * D, true);
      lin_apply(G, D, nv, a.K, D, g.dV, Dvp, j0, j + 1, true);
    }
    j = j0 - 1;
  }
}

}  // namespace
}  // namespace attn::detail::cpu

// src/cpu/family_md_body.h — the fused kernels of multi-dimensional additive attention
// (family_kernels.h: family_table::md_*) for one ISA; included by family_body.h, whose helpers
// (lane_stats, fam_alpha, fam_u, fam_de, add_tanh) it uses. P = A prepared features, F = Dv:
//
//   t_ij   = tanh(qp_i + kp_j)                         [A]   (exp form: add_tanh<true>)
//   e_ij   = W_v t_ij                                  [Dv]  W_v [Dv, A], a GEMM per pair block
//   α_ij[c] = distribution over j of s_i·[c]            one distribution per value feature c
//   out_i[c] = Σ_j α_ij[c] v_j[c]
// Backward: dα_ij[c] = dout_i[c] v_j[c]; r_i[c] = Σ_j u dα / Σ u; de_ij[c] = w (dα - r);
//   dt = W_vᵀ de_ij; dpre = dt ⊙ (1 - t²); dqp_i += Σ_j dpre, dkp_j += Σ_i dpre;
//   dW_v += Σ de_ij t_ijᵀ; dv_j[c] += Σ_i α_ij[c] dout_i[c].
//
// The tanh of a pair is computed once for all Dv features (the eager formula materialises
// [Nq, Nk, A] and [Nq, Nk, Dv]; here a pair's t and e live in registers and a tile). Row
// statistics are per (row, feature): the lane kernels keep them as [Dv][L] (feature-major),
// the row kernel reads them as [row][Dv]. Distributions that keep scores (all but sigmoid and
// identity) hold the scores of the lane block's keys for a chunk of Fc features at a time
// (family_lanes::Fc, chosen by the driver to bound the scratch); a chunk's statistics are found
// on them exactly as for one feature (lane_stats).
#pragma once

#include <cstdlib>

namespace attn::detail::cpu {
namespace {

// Scratch of a multi-dimensional lane block (family_md_lane_scratch_floats).
struct md_lane_scratch {
  float *T, *S, *E, *de, *dT, *TT, *dW, *mask, *buf;
  std::int64_t fs;  // floats from one feature's scores to the next in S
  md_lane_scratch(const family_lanes& lb, std::int64_t keys) {
    const std::int64_t L = lb.L, A = lb.P, Dv = lb.Dv, Ap = md_pad(A, W);
    fs = keys * L;
    T = lb.scratch;
    S = T + A * kMdKeys * L;
    E = S + lb.Fc * fs;
    de = E + Dv * L;
    dT = de + Dv * L;
    TT = dT + A * L;
    dW = TT + L * Ap;
    mask = dW + Dv * Ap;
    buf = mask + kLaneKeyBlock * L;
  }
};

// The view of one feature c of a lane block: its statistics.
inline family_lanes md_feature(const family_lanes& lb, std::int64_t c) {
  family_lanes f = lb;
  const std::int64_t o = c * lb.L;
  f.st = {lb.st.t + o, lb.st.lse + o, lb.st.cut + o, lb.st.r + o};
  return f;
}

// ATTN_FAMILY_MD_ONLINE=0: softmax keeps every score of a feature chunk and finds its statistics
// first (the two-phase form every other distribution takes), for comparisons and tests.
inline bool md_two_phase() {
  const char* e = std::getenv("ATTN_FAMILY_MD_ONLINE");
  return e && e[0] == '0';
}

template <int CC>
void md_empty_stats(const family_lanes& lb) {
  for (std::int64_t c = 0; c < lb.Dv; ++c) set_empty_stats<CC>(md_feature(lb, c));
}

// t = tanh(qp + kp_j) of every lane into T [A][L].
template <bool Exp, int CC>
inline void md_lane_tanh(const family_lanes& lb, std::int64_t j, float* T) {
  const std::int64_t L = CC * W;
  const float* kj = lb.k + j * lb.ksn;
  for (std::int64_t a = 0; a < lb.P; ++a) {
    const vf kb = splat(kj[a]);
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) store(T + a * L + c * W, add_tanh<Exp>(load(lb.qt + a * L + c * W), kb));
  }
}

// Scores of keys [j0, j0 + nb) (nb <= kMdKeys) for features [c0, c0 + fc): S[c][jj·L + x]
// (feature stride fs) = W_v t + mask, -inf outside each lane's key range — one GEMM over the nb
// keys, so each feature's row of the output is nb·L contiguous floats. T [A][nb·L] receives t;
// mask holds the keys' rows of the mask tile (or null).
template <bool Exp, int CC>
void md_lane_keys(const family_lanes& lb, std::int64_t j0, std::int64_t nb, std::int64_t c0, std::int64_t fc, float* S,
                  std::int64_t fs, float* T, const float* mask) {
  const std::int64_t L = CC * W, A = lb.P, N = nb * L;
  for (std::int64_t a = 0; a < A; ++a) {
    vf q[CC];
    for (int c = 0; c < CC; ++c) q[c] = load(lb.qt + a * L + c * W);
    for (std::int64_t jj = 0; jj < nb; ++jj) {
      const vf kb = splat(lb.k[(j0 + jj) * lb.ksn + a]);
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) store(T + a * N + jj * L + c * W, add_tanh<Exp>(q[c], kb));
    }
  }
  gemm<fam_ops>(fc, N, A, lb.fp.w_v + c0 * A, A, 1, T, N, S, fs, false);
  for (std::int64_t jj = 0; jj < nb; ++jj) {
    const vi jv = splati(std::int32_t(j0 + jj));
#pragma GCC unroll 4
    for (int c = 0; c < CC; ++c) {
      const vi in = (jv >= loadi(lb.lo + c * W)) & (jv < loadi(lb.hi + c * W));
      const vf m = mask ? load(mask + jj * L + c * W) : vf{};
      for (std::int64_t f = 0; f < fc; ++f) {
        float* s = S + f * fs + jj * L + c * W;
        store(s, vselect(in, load(s) + m, splat(-kInf)));
      }
    }
  }
}

// Scores of keys [j0, j0 + nb) (nb <= kLaneKeyBlock) for features [c0, c0 + fc) into S (key
// j0 at S, feature stride sc.fs), kMdKeys keys per product, the block's mask tile filled once.
// True where the mask hides the block from every lane and it was skipped (family_params::
// zero_skip): S is then -inf, what every score would have been.
template <bool Exp, int CC>
bool md_lane_block(const family_lanes& lb, const md_lane_scratch& sc, std::int64_t j0, std::int64_t nb, std::int64_t c0,
                   std::int64_t fc, float* S) {
  const family_params& fp = lb.fp;
  const std::int64_t L = CC * W;
  if (fp.mask && fp.mask(fp.mask_ctx, j0, nb, sc.mask, 1, L) == mask_tile_kind::excluded && fp.zero_skip) {
    for (std::int64_t f = 0; f < fc; ++f)
      for (std::int64_t i = 0; i < nb * L; i += W) store(S + f * sc.fs + i, splat(-kInf));
    return true;
  }
  for (std::int64_t jj = 0; jj < nb; jj += kMdKeys)
    md_lane_keys<Exp, CC>(lb, j0 + jj, imin(kMdKeys, nb - jj), c0, fc, S + jj * L, sc.fs, sc.T,
                          fp.mask ? sc.mask + jj * L : nullptr);
  return false;
}

// Softmax online, as the core op's prefill (no scores kept): keys in groups of kMdKeys, the scores
// of every feature of a group at once (S [Dv][ks][L], from L2), and per (feature, lane) a running
// max m that moves only when a group's max passes it by more than kMdSlack (FlashAttention-4's
// economy: the weights are then at most e^8, and o, l are rescaled only where m moved), l = Σ
// e^{s - m} and o = Σ e^{s - m} v. out = o / l and t = m + log l hold for any m the sums were taken
// against. m and l live in E and de (unused by the forward). S [Dv][ks][L] must fit where the
// two-phase form keeps [Fc][n][L] (md_forward checks).
constexpr float kMdSlack = 8.0f;
template <int CC, bool Exp>
void md_forward_online(const family_lanes& lb, const md_lane_scratch& sc0, std::int64_t kmin, std::int64_t kmax,
                       std::int64_t ks, float* ot) {
  const std::int64_t L = CC * W, Dv = lb.Dv;
  md_lane_scratch sc = sc0;
  sc.fs = ks * L;
  float* m = sc.E;
  float* l = sc.de;
  for (std::int64_t i = 0; i < Dv * L; ++i) m[i] = -kInf, l[i] = 0.0f;
  for (std::int64_t j0 = kmin; j0 < kmax; j0 += ks) {
    const std::int64_t nb = imin(ks, kmax - j0);
    // A hidden group leaves m, l and o as they are (its max is -inf, its weights 0).
    if (md_lane_block<Exp, CC>(lb, sc, j0, nb, 0, Dv, sc.S)) continue;
    for (std::int64_t f = 0; f < Dv; ++f) {
      const float* Sf = sc.S + f * sc.fs;
      const float* v = lb.v + f;
#pragma GCC unroll 4
      for (int c = 0; c < CC; ++c) {
        vf mx = splat(-kInf);
        for (std::int64_t jj = 0; jj < nb; ++jj) mx = vmax(mx, load(Sf + jj * L + c * W));
        float* mp = m + f * L + c * W;
        float* lp = l + f * L + c * W;
        float* op = ot + f * L + c * W;
        const vf m_old = load(mp);
        // -inf + slack is -inf: the first finite max is taken; a NaN max leaves m (the NaN reaches l through p)
        const vf m_new = mx > m_old + splat(kMdSlack) ? mx : m_old;
        const vf mu = m_new == splat(-kInf) ? vf{} : m_new;  // a lane with nothing yet keeps p = 0
        const vf a = exp_nat(m_old - mu);
        vf o = load(op) * a, sum{};
        for (std::int64_t jj = 0; jj < nb; ++jj) {
          const vf p = exp_nat(load(Sf + jj * L + c * W) - mu);
          sum += p;
          o += p * splat(v[(j0 + jj) * lb.vsn]);
        }
        store(op, o);
        store(lp, load(lp) * a + sum);
        store(mp, m_new);
      }
    }
  }
  for (std::int64_t f = 0; f < Dv; ++f)
    for (std::int64_t x = 0; x < L; ++x) {
      const std::int64_t e = f * L + x;
      const float lsum = l[e];
      ot[e] = lsum == 0.0f ? 0.0f : ot[e] / lsum;  // no key (or none with weight): 0; NaN stays NaN
      if (m[e] != -kInf || lsum != 0.0f) lb.st.t[e] = m[e] + __builtin_logf(lsum);  // else empty: t = +inf
    }
}

// ---- forward, lane layout: ot [Dv][L] ----
template <family_dist Dist, int CC, bool Exp>
void md_forward(const family_lanes& lb, float* ot) {
  const std::int64_t L = CC * W, Dv = lb.Dv;
  for (std::int64_t i = 0; i < Dv * L; ++i) ot[i] = 0.0f;
  md_empty_stats<CC>(lb);
  std::int64_t kmin, kmax;
  fam_range(lb, kmin, kmax);
  if (kmin >= kmax) return;
  constexpr bool keep = family_keeps_scores(Dist);
  const std::int64_t n = kmax - kmin;
  // keep: S [Fc][n][L], every key of a feature chunk; streaming: S [Dv][kLaneKeyBlock][L]
  const md_lane_scratch sc(lb, keep ? n : kLaneKeyBlock);
  const std::int64_t Fc = keep ? lb.Fc : Dv;
  const family_params& fp = lb.fp;
  if constexpr (Dist == family_dist::softmax) {
    const std::int64_t ks = imin(kMdKeys, n);
    if (!lb.alpha && Dv * ks <= lb.Fc * n && !md_two_phase())
      return md_forward_online<CC, Exp>(lb, sc, kmin, kmax, ks, ot);
  }
  for (std::int64_t c0 = 0; c0 < Dv; c0 += Fc) {
    const std::int64_t fc = imin(Fc, Dv - c0);
    if (keep) {
      for (std::int64_t j0 = kmin; j0 < kmax; j0 += kLaneKeyBlock)
        md_lane_block<Exp, CC>(lb, sc, j0, imin(kLaneKeyBlock, kmax - j0), c0, fc, sc.S + (j0 - kmin) * L);
      for (std::int64_t f = 0; f < fc; ++f) lane_stats<Dist, CC>(md_feature(lb, c0 + f), sc.S + f * sc.fs, n, kmin, sc.buf);
    }
    for (std::int64_t j0 = kmin; j0 < kmax; j0 += kLaneKeyBlock) {
      const std::int64_t nb = imin(kLaneKeyBlock, kmax - j0);
      float* S = keep ? sc.S + (j0 - kmin) * L : sc.S;
      if (!keep && md_lane_block<Exp, CC>(lb, sc, j0, nb, c0, fc, S)) continue;  // α = 0 (lb.alpha comes zeroed)
      for (std::int64_t f = 0; f < fc; ++f) {
        const family_lanes lf = md_feature(lb, c0 + f);
        const float* v = lb.v + c0 + f;
#pragma GCC unroll 4
        for (int c = 0; c < CC; ++c) {
          const fam_stat st = load_stat<CC>(lf, c);
          vf o = load(ot + (c0 + f) * L + c * W);
          for (std::int64_t jj = 0; jj < nb; ++jj) {
            const vf a = fam_alpha<Dist>(fp, load(S + f * sc.fs + jj * L + c * W), splati(std::int32_t(j0 + jj)), st);
            o += a * splat(v[(j0 + jj) * lb.vsn]);
            if (lb.alpha)
              for (int x = 0; x < W && c * W + x < lb.nl; ++x)
                lb.alpha[(c * W + x) * lb.alpha_ld + (j0 + jj) * Dv + c0 + f] = a[x];
          }
          store(ot + (c0 + f) * L + c * W, o);
        }
      }
    }
  }
}

// ---- backward dq, lane layout: dqt [A][L] = Σ_j dpre; the statistics and r of every (lane,
// feature); io.dw_v [Dv][A] += Σ de tᵀ; io.sums[0], [1] += Σ de ----
template <family_dist Dist, int CC, bool Exp>
void md_dq(const family_lanes& lb, const family_dq_io& io) {
  const std::int64_t L = CC * W, A = lb.P, Dv = lb.Dv, Ap = md_pad(A, W);
  for (std::int64_t i = 0; i < A * L; ++i) io.dqt[i] = 0.0f;
  md_empty_stats<CC>(lb);
  std::int64_t kmin, kmax;
  fam_range(lb, kmin, kmax);
  if (kmin >= kmax) return;
  constexpr bool keep = family_keeps_scores(Dist);
  constexpr bool no_dz = Dist == family_dist::hardmax;  // one-hot: no gradient reaches the scores
  const std::int64_t n = kmax - kmin;
  const md_lane_scratch sc(lb, keep ? n : 0);
  const family_params& fp = lb.fp;
  // Pass 1 (distributions with statistics): per feature chunk, the scores of every key, the
  // statistics, and r = Σ u dα / Σ u with dα = dout[c] v_j[c].
  const bool whole = keep && lb.Fc >= Dv;  // S keeps every feature: pass 2 reads e from it
  live_keys live(kmin, kmax);  // whole: the blocks pass 2 visits (the others' de are 0)
  if (keep)
    for (std::int64_t c0 = 0; c0 < Dv; c0 += lb.Fc) {
      const std::int64_t fc = imin(lb.Fc, Dv - c0);
      for (std::int64_t j0 = kmin; j0 < kmax; j0 += kLaneKeyBlock) {
        const std::int64_t nb = imin(kLaneKeyBlock, kmax - j0);
        live.add(j0, nb, md_lane_block<Exp, CC>(lb, sc, j0, nb, c0, fc, sc.S + (j0 - kmin) * L));
      }
      for (std::int64_t f = 0; f < fc; ++f) {
        const family_lanes lf = md_feature(lb, c0 + f);
        const float* Sf = sc.S + f * sc.fs;
        lane_stats<Dist, CC>(lf, Sf, n, kmin, sc.buf);
        if (no_dz) continue;
        const float* v = lb.v + c0 + f;
        for (int c = 0; c < CC; ++c) {
          const fam_stat st = load_stat<CC>(lf, c);
          const vf dout = load(io.doutt + (c0 + f) * L + c * W);
          vf num{}, den{};
          for (std::int64_t jj = 0; jj < n; ++jj) {
            const vf s = load(Sf + jj * L + c * W);
            const vf u = fam_u<Dist>(s, fam_alpha<Dist>(fp, s, splati(std::int32_t(kmin + jj)), st), st);
            num += u * dout * splat(v[(kmin + jj) * lb.vsn]), den += u;
          }
          store(lf.st.r + c * W, vselect(den > vf{}, num / vmax(den, splat(1e-30f)), vf{}));
        }
      }
    }
  if (no_dz) return;
  // Pass 2, key by key: de of every feature, dt = W_vᵀ de, dqp += dt ⊙ (1 - t²), dW_v += de tᵀ.
  for (std::int64_t i = 0; i < Dv * Ap; ++i) sc.dW[i] = 0.0f;
  for (std::int64_t i = 0; i < L * Ap; ++i) sc.TT[i] = 0.0f;
  vf sum_de{};
  const std::int64_t k0 = whole ? live.lo : kmin, k1 = whole ? live.hi : kmax;
  for (std::int64_t j0 = k0; j0 < k1; j0 += kLaneKeyBlock) {
    const std::int64_t nb = imin(kLaneKeyBlock, k1 - j0);
    // A block the mask hides from every lane: de = 0 for every key and feature (zero_skip).
    if (fp.mask && !whole && fp.mask(fp.mask_ctx, j0, nb, sc.mask, 1, L) == mask_tile_kind::excluded && fp.zero_skip)
      continue;
    for (std::int64_t jj = 0; jj < nb; ++jj) {
      const std::int64_t j = j0 + jj;
      const float* E;
      std::int64_t es;
      if (whole) {
        md_lane_tanh<Exp, CC>(lb, j, sc.T);
        E = sc.S + (j - kmin) * L, es = sc.fs;
      } else {
        md_lane_keys<Exp, CC>(lb, j, 1, 0, Dv, sc.E, L, sc.T, fp.mask ? sc.mask + jj * L : nullptr);
        E = sc.E, es = L;
      }
      const float* v = lb.v + j * lb.vsn;
      bool any = false;
      for (std::int64_t f = 0; f < Dv; ++f) {
        const family_lanes lf = md_feature(lb, f);
#pragma GCC unroll 4
        for (int c = 0; c < CC; ++c) {
          const fam_stat st = load_stat<CC>(lf, c);
          const vf s = load(E + f * es + c * W), a = fam_alpha<Dist>(fp, s, splati(std::int32_t(j)), st);
          const vf de = fam_de<Dist>(s, a, load(io.doutt + f * L + c * W) * splat(v[f]), st);
          store(sc.de + f * L + c * W, de);
          sum_de += de;
          any |= any_lane(de != vf{});
        }
      }
      if (!any) continue;
      gemm<fam_ops>(A, L, Dv, fp.w_v, 1, A, sc.de, L, sc.dT, L, false);  // dt = W_vᵀ de
      for (std::int64_t a = 0; a < A; ++a)
#pragma GCC unroll 4
        for (int c = 0; c < CC; ++c) {
          const vf t = load(sc.T + a * L + c * W);
          float* dq = io.dqt + a * L + c * W;
          store(dq, load(dq) + load(sc.dT + a * L + c * W) * (splat(1.0f) - t * t));
        }
      for (std::int64_t a = 0; a < A; ++a)
        for (std::int64_t x = 0; x < L; ++x) sc.TT[x * Ap + a] = sc.T[a * L + x];
      gemm<fam_ops>(Dv, Ap, L, sc.de, L, 1, sc.TT, Ap, sc.dW, Ap, true);  // dW_v += de tᵀ
    }
  }
  double sde = 0.0;
  for (int x = 0; x < W; ++x) sde += double(sum_de[x]);
  io.sums[0] += sde, io.sums[1] += sde;
  for (std::int64_t f = 0; f < Dv; ++f)
    for (std::int64_t a = 0; a < A; ++a) io.dw_v[f * A + a] += double(sc.dW[f * Ap + a]);
}

// dW [f0 + r][a] += Σ_y de[f0 + r][y] T[a][y] over n columns (a multiple of W) for RF features:
// RF × 6 accumulator vectors per sweep (the lane sums of each pair of rows, both operands read
// along their rows), their vectors stored in part [RF][Ap][W], then added up W features of A at
// a time by a transpose-add. Ap: a multiple of W, ≥ A.
template <int RF, int CA>
inline void md_dw_sweep(const float* de, const float* T, std::int64_t n, std::int64_t a0, float* part,
                        std::int64_t Ap) {
  vf acc[RF][CA];
#pragma GCC unroll 8
  for (int r = 0; r < RF; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < CA; ++c) acc[r][c] = vf{};
  for (std::int64_t y = 0; y < n; y += W) {
    vf t[CA];
#pragma GCC unroll 8
    for (int c = 0; c < CA; ++c) t[c] = load(T + (a0 + c) * n + y);
#pragma GCC unroll 8
    for (int r = 0; r < RF; ++r) {
      const vf d = load(de + r * n + y);
#pragma GCC unroll 8
      for (int c = 0; c < CA; ++c) acc[r][c] += d * t[c];
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < RF; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < CA; ++c) store(part + (r * Ap + a0 + c) * W, acc[r][c]);
}

template <int RF>
void md_dw_rows(const float* de, const float* T, std::int64_t n, std::int64_t A, float* part, float* dW,
                std::int64_t Ap) {
  std::int64_t a0 = 0;
  for (; a0 + 6 <= A; a0 += 6) md_dw_sweep<RF, 6>(de, T, n, a0, part, Ap);
  for (; a0 < A; ++a0) md_dw_sweep<RF, 1>(de, T, n, a0, part, Ap);
  for (int r = 0; r < RF; ++r)
    for (std::int64_t b0 = 0; b0 < A; b0 += W) {
      vf rows[W];
#pragma GCC unroll 16
      for (int t = 0; t < W; ++t) rows[t] = b0 + t < A ? load(part + (r * Ap + b0 + t) * W) : vf{};
      transpose_add(rows);
      store(dW + r * Ap + b0, load(dW + r * Ap + b0) + rows[0]);
    }
}

// dW [Dv][Ap] += de [Dv][n] Tᵀ (T [A][n]); part: 4·Ap·W floats.
inline void md_dw(const float* de, const float* T, std::int64_t n, std::int64_t A, std::int64_t Dv, float* part,
                  float* dW, std::int64_t Ap) {
  std::int64_t f0 = 0;
  for (; f0 + 4 <= Dv; f0 += 4) md_dw_rows<4>(de + f0 * n, T, n, A, part, dW + f0 * Ap, Ap);
  for (; f0 < Dv; ++f0) md_dw_rows<1>(de + f0 * n, T, n, A, part, dW + f0 * Ap, Ap);
}

// ---- backward dk, dv, row layout (keys in lanes): dkt [A][ld] += Σ_i dpre, dvt [Dv][ld] +=
// Σ_i α[c] dout_i[c]; statistics [row][Dv]. Query rows go in groups of kMdRows, so that the two
// products (e = W_v t, dt = W_vᵀ de) run over kMdRows·ld columns at once. Single pass (pr.dq:
// softmax from the forward's statistics, sigmoid and identity from none): also dq [r][a] +=
// Σ_y dpre — each row's sum over the key vectors, added W features at a time by a transpose-add —
// pr.dw_v [Dv][A] += Σ de tᵀ (a third product, md_dw) and sums[0], sums[1] += Σ de, so that each
// pair's t, e and dt are formed once for every gradient. ----
template <family_dist Dist, bool Exp>
void md_dkdv(const family_rows& pr) {
  const std::int64_t ld = pr.ldk, nq = pr.nq, A = pr.P, Dv = pr.Dv, N = kMdRows * ld, Ap = md_pad(A, 16);
  const family_params& fp = pr.fp;
  float* T = pr.scratch;
  float* E = T + A * N;
  float* de = E + Dv * N;
  float* dT = de + Dv * N;
  float* mask = dT + A * N;
  float* dW = mask + nq * ld;
  float* part = dW + Dv * Ap;
  constexpr bool no_dz = Dist == family_dist::hardmax;
  const bool with_dq = pr.dq != nullptr && !no_dz;
  if (with_dq)
    for (std::int64_t i = 0; i < Dv * Ap; ++i) dW[i] = 0.0f;
  vf sum_de{};
  if (fp.mask) {
    // A block the mask hides from every row adds nothing to dv, dk, dq, dw_v or the sums (zero_skip).
    if (fp.mask(fp.mask_ctx, pr.j0, pr.nb, mask, ld, 1) == mask_tile_kind::excluded && fp.zero_skip) return;
    for (std::int64_t r = 0; r < nq; ++r)
      for (std::int64_t x = pr.nb; x < ld; ++x) mask[r * ld + x] = 0.0f;
  }
  std::int64_t rows_of[kMdRows];
  for (std::int64_t r0 = 0; r0 < nq;) {
    // The next rows that see a key of this block.
    std::int64_t g = 0;
    for (; r0 < nq && g < kMdRows; ++r0)
      if (pr.lo[r0] < imin(pr.hi[r0], pr.j0 + pr.nb)) rows_of[g++] = r0;
    if (g == 0) break;
    const std::int64_t n = g * ld;
    for (std::int64_t a = 0; a < A; ++a)
      for (std::int64_t e = 0; e < g; ++e) {
        const vf qa = splat(pr.q[rows_of[e] * pr.qsn + a]);
        for (std::int64_t y = 0; y < ld; y += W) store(T + a * n + e * ld + y, add_tanh<Exp>(qa, load(pr.kt + a * ld + y)));
      }
    gemm<fam_ops>(Dv, n, A, fp.w_v, A, 1, T, n, E, n, false);  // e = W_v t
    bool any = false;
    for (std::int64_t e = 0; e < g; ++e) {
      const std::int64_t r = rows_of[e];
      const vi lo = splati(pr.lo[r]), hi = splati(std::int32_t(imin(pr.hi[r], pr.j0 + pr.nb)));
      for (std::int64_t f = 0; f < Dv; ++f) {
        const std::int64_t o = r * Dv + f;
        fam_stat st;
        st.t = splat(pr.st.t[o]), st.lse = splat(pr.st.lse[o]), st.r = splat(pr.st.r[o]), st.cut = splati(pr.st.cut[o]);
        const vf dout = splat(pr.dout[r * pr.dsn + f]);
        for (std::int64_t y = 0; y < ld; y += W) {
          const vi j = iota() + std::int32_t(pr.j0 + y);
          vf s = load(E + f * n + e * ld + y);
          if (fp.mask) s += load(mask + r * ld + y);
          s = vselect((j >= lo) & (j < hi), s, splat(-kInf));
          const vf a = fam_alpha<Dist>(fp, s, j, st);
          store(pr.dvt + f * ld + y, load(pr.dvt + f * ld + y) + a * dout);
          if (no_dz) continue;
          const vf d = fam_de<Dist>(s, a, dout * load(pr.vt + f * ld + y), st);
          store(de + f * n + e * ld + y, d);
          if (with_dq) sum_de += d;
          any |= any_lane(d != vf{});
        }
      }
    }
    if (!any) continue;
    gemm<fam_ops>(A, n, Dv, fp.w_v, 1, A, de, n, dT, n, false);  // dt = W_vᵀ de
    for (std::int64_t a = 0; a < A; ++a)
      for (std::int64_t y = 0; y < ld; y += W) {
        vf acc = load(pr.dkt + a * ld + y);
        for (std::int64_t e = 0; e < g; ++e) {
          const vf t = load(T + a * n + e * ld + y);
          const vf p = load(dT + a * n + e * ld + y) * (splat(1.0f) - t * t);
          if (with_dq) store(dT + a * n + e * ld + y, p);  // dpre, for dq below
          acc += p;
        }
        store(pr.dkt + a * ld + y, acc);
      }
    if (!with_dq) continue;
    for (std::int64_t e = 0; e < g; ++e)
      for (std::int64_t a0 = 0; a0 < A; a0 += W) {
        vf rows[W];
#pragma GCC unroll 16
        for (int t = 0; t < W; ++t) {
          vf s{};
          if (a0 + t < A)
            for (std::int64_t y = 0; y < ld; y += W) s += load(dT + (a0 + t) * n + e * ld + y);
          rows[t] = s;
        }
        transpose_add(rows);
        float* dq = pr.dq + rows_of[e] * pr.dqs + a0;
        for (std::int64_t t = 0; t < imin(W, A - a0); ++t) dq[t] += rows[0][t];
      }
    md_dw(de, T, n, A, Dv, part, dW, Ap);
  }
  if (!with_dq) return;
  double sde = 0.0;
  for (int x = 0; x < W; ++x) sde += double(sum_de[x]);
  pr.sums[0] += sde, pr.sums[1] += sde;
  for (std::int64_t f = 0; f < Dv; ++f)
    for (std::int64_t a = 0; a < A; ++a) pr.dw_v[f * A + a] += double(dW[f * Ap + a]);
}

template <class F>
void with_md(const family_params& fp, F&& f) {
  with_dist(fp.dist, [&](auto d) {
    if (fp.additive_exp) f(d, std::true_type{});
    else f(d, std::false_type{});
  });
}

void md_forward_entry(const family_lanes& lb, float* ot) {
  with_md(lb.fp, [&](auto d, auto e) { md_forward<decltype(d)::value, C, decltype(e)::value>(lb, ot); });
}
void md_dq_entry(const family_lanes& lb, const family_dq_io& io) {
  with_md(lb.fp, [&](auto d, auto e) { md_dq<decltype(d)::value, C, decltype(e)::value>(lb, io); });
}
void md_dkdv_entry(const family_rows& pr) {
  with_md(pr.fp, [&](auto d, auto e) { md_dkdv<decltype(d)::value, decltype(e)::value>(pr); });
}

}  // namespace
}  // namespace attn::detail::cpu

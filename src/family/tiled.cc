// src/family/tiled.cc — the tiled float64 path of attention_family: each query row streams over
// blocks of kBlock keys and never holds an Nq × Nk matrix.
//
// Every distribution is written as three things computed over the keys of one row:
//   pass A  statistics: log-sum-exp (softmax, straight-through hardmax), Σ K (kernel), the
//           arg max (hardmax), the k best (topk), the threshold τ (sparsemax, entmax15 — these
//           keep the row's scores, O(Nk · F) per thread)
//   α_jf    the weight of key j for feature f, from e_jf and the statistics
//   de_jf   = w_jf (dα_jf - r_f),  r_f = Σ_j u_jf dα_jf / Σ_j u_jf     (the closed-form backward)
// with (u, w) per distribution:
//   softmax, topk     u = w = α                 (de = α (dα - Σ α dα))
//   sparsemax         u = w = 1{α > 0}          (de = 1_S (dα - mean_S dα))
//   entmax15          u = w = √α                (Peters et al. 2019, eq. 10)
//   kernel            u = α, w = 1/Σ K          (α = K/Σ K)
//   sigmoid           u = 0, w = α (1 - α)
//   identity          u = 0, w = 1 on the keys that are not masked (α = s)
//   hardmax           w = 0; straight-through: u = w = softmax(e)
// Forward: pass A, then α and out_i = Σ_j α_j v_j. Backward: pass A, pass B (dv and r_f),
// pass C (de, then the score kernel's backward). Hardmax and topk visit only the keys they
// selected after pass A.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "family/family_impl.h"

namespace attn::detail::family {
namespace {

constexpr std::int64_t kBlock = 64;

// Per-thread scratch for one row at a time.
struct row_state {
  std::vector<double> e, alpha, dalpha, de;  // [kBlock, F]
  std::vector<double> lse, S, tau, r, c;     // [F]
  std::vector<std::int64_t> arg;             // [F] hardmax: first arg max, -1 when none
  std::vector<double> arg_score;             // [F] hardmax: its score
  std::vector<std::vector<std::pair<double, std::int64_t>>> top;  // [F] topk: (score, key)
  std::vector<std::vector<std::int64_t>> top_keys;                // [F] sorted keys of `top`
  std::vector<std::int64_t> support;         // union of selected keys (hardmax, topk)
  std::vector<std::vector<double>> row;      // [F][keys] sparsemax, entmax15
  std::vector<double> best, sum;             // [F] online log-sum-exp

  explicit row_state(const fproblem& fp) {
    const std::size_t F = std::size_t(fp.F), n = std::size_t(kBlock) * F;
    e.resize(n), alpha.resize(n), dalpha.resize(n), de.resize(n);
    lse.resize(F), S.resize(F), tau.resize(F), r.resize(F), c.resize(F), arg.resize(F), arg_score.resize(F);
    top.resize(F), top_keys.resize(F), row.resize(F), best.resize(F), sum.resize(F);
  }
};

// Key a is better than key b for topk: larger score, then smaller index.
bool better(const std::pair<double, std::int64_t>& a, const std::pair<double, std::int64_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// Sparsemax threshold of the finite scores z (reordered): Σ_j max(z_j - τ, 0) = 1.
double sparsemax_tau(std::vector<double>& z) {
  std::sort(z.begin(), z.end(), std::greater<>());
  double cs = 0.0, tau = 0.0;
  for (std::size_t k = 0; k < z.size(); ++k) {
    cs += z[k];
    const double t = (cs - 1.0) / double(k + 1);
    if (z[k] > t) tau = t;  // support condition 1 + k z_k > Σ_{<=k} z
    else break;
  }
  return tau;
}

// 1.5-entmax threshold on x = e/2: Σ_j max(x_j - τ, 0)² = 1 (sort-based, exact).
double entmax15_tau(std::vector<double>& z) {
  std::sort(z.begin(), z.end(), std::greater<>());
  const double mx = z[0];
  double s1 = 0.0, s2 = 0.0, tau_star = 0.0;
  for (std::size_t k = 0; k < z.size(); ++k) {
    const double x = (z[k] - mx) / 2.0, rho = double(k + 1);
    s1 += x, s2 += x * x;
    const double mean = s1 / rho, ss = rho * (s2 / rho - mean * mean);
    const double delta = std::max(0.0, (1.0 - ss) / rho);
    const double tau = mean - std::sqrt(delta);
    if (tau <= x) tau_star = tau;  // support grows while τ_k <= x_k
    else break;
  }
  return tau_star + mx / 2.0;
}

class row_engine {
 public:
  row_engine(const fproblem& fp) : fp_(fp), st_(fp) {}

  // Pass A.
  void stats(const row_ctx& r) {
    const std::int64_t F = fp_.F;
    std::fill(st_.lse.begin(), st_.lse.end(), kNegInf);
    std::fill(st_.S.begin(), st_.S.end(), 0.0);
    std::fill(st_.arg.begin(), st_.arg.end(), -1);
    std::fill(st_.arg_score.begin(), st_.arg_score.end(), kNegInf);
    for (auto& t : st_.top) t.clear();
    for (auto& t : st_.row) t.clear();
    std::vector<double>& best = st_.best;
    std::vector<double>& sum = st_.sum;
    std::fill(best.begin(), best.end(), kNegInf);
    std::fill(sum.begin(), sum.end(), 0.0);
    const distribution_kind d = fp_.dist;
    const bool want_lse = d == distribution_kind::softmax ||
                          (d == distribution_kind::hardmax && fp_.hardmax_grad == hardmax_gradient::straight_through);
    if (d == distribution_kind::sigmoid || d == distribution_kind::identity) return;
    for (std::int64_t j0 = r.lo; j0 < r.hi; j0 += kBlock) {
      const std::int64_t j1 = std::min(r.hi, j0 + kBlock);
      eval_scores(fp_, r, j0, j1, st_.e.data());
      for (std::int64_t j = j0; j < j1; ++j) {
        for (std::int64_t f = 0; f < F; ++f) {
          const double e = st_.e[std::size_t((j - j0) * F + f)];
          if (e == kNegInf) continue;
          const std::size_t fi = std::size_t(f);
          if (want_lse) {  // online log-sum-exp
            if (e > best[fi]) sum[fi] = sum[fi] * std::exp(best[fi] - e) + 1.0, best[fi] = e;
            else sum[fi] += std::exp(e - best[fi]);
          }
          switch (d) {
            case distribution_kind::hardmax:
              if (e > st_.arg_score[fi]) st_.arg[fi] = j, st_.arg_score[fi] = e;  // first on ties
              break;
            case distribution_kind::topk: {
              auto& t = st_.top[fi];
              const std::pair<double, std::int64_t> cand{e, j};
              if (std::int64_t(t.size()) < fp_.topk) {
                t.push_back(cand), std::push_heap(t.begin(), t.end(), better);
              } else if (better(cand, t.front())) {
                std::pop_heap(t.begin(), t.end(), better), t.back() = cand, std::push_heap(t.begin(), t.end(), better);
              }
              break;
            }
            case distribution_kind::kernel: st_.S[fi] += e; break;
            case distribution_kind::sparsemax:
            case distribution_kind::entmax15: st_.row[fi].push_back(e); break;
            default: break;
          }
        }
      }
    }
    for (std::int64_t f = 0; f < F; ++f) {
      const std::size_t fi = std::size_t(f);
      if (want_lse && best[fi] != kNegInf) st_.lse[fi] = best[fi] + std::log(sum[fi]);
      if (d == distribution_kind::topk) {
        double m = kNegInf, s = 0.0;
        st_.top_keys[fi].clear();
        for (auto& [e, j] : st_.top[fi]) m = std::max(m, e), st_.top_keys[fi].push_back(j);
        for (auto& [e, j] : st_.top[fi]) s += std::exp(e - m);
        st_.lse[fi] = st_.top[fi].empty() ? kNegInf : m + std::log(s);
        std::sort(st_.top_keys[fi].begin(), st_.top_keys[fi].end());
      }
      if (d == distribution_kind::sparsemax || d == distribution_kind::entmax15) {
        auto& z = st_.row[fi];
        st_.tau[fi] = z.empty() ? std::numeric_limits<double>::infinity()
                                : d == distribution_kind::sparsemax ? sparsemax_tau(z) : entmax15_tau(z);
      }
    }
    st_.support.clear();
    if (d == distribution_kind::hardmax)
      for (auto j : st_.arg) if (j >= 0) st_.support.push_back(j);
    if (d == distribution_kind::topk)
      for (auto& t : st_.top_keys) st_.support.insert(st_.support.end(), t.begin(), t.end());
    std::sort(st_.support.begin(), st_.support.end());
    st_.support.erase(std::unique(st_.support.begin(), st_.support.end()), st_.support.end());
  }

  // α of key j for feature f, given its masked score e.
  double alpha(double e, std::int64_t j, std::int64_t f) const {
    if (e == kNegInf) return 0.0;
    const std::size_t fi = std::size_t(f);
    switch (fp_.dist) {
      case distribution_kind::softmax: return std::exp(e - st_.lse[fi]);
      case distribution_kind::sigmoid: return 1.0 / (1.0 + std::exp(-(e + fp_.sigmoid_bias)));
      case distribution_kind::sparsemax: return std::max(e - st_.tau[fi], 0.0);
      case distribution_kind::entmax15: { const double t = std::max(e / 2.0 - st_.tau[fi], 0.0); return t * t; }
      case distribution_kind::hardmax: return j == st_.arg[fi] ? 1.0 : 0.0;
      case distribution_kind::topk:
        return std::binary_search(st_.top_keys[fi].begin(), st_.top_keys[fi].end(), j) ? std::exp(e - st_.lse[fi])
                                                                                         : 0.0;
      case distribution_kind::kernel: return st_.S[fi] > 0.0 ? e / st_.S[fi] : 0.0;
      case distribution_kind::identity: return e;
    }
    return 0.0;
  }

  // (u, w) of the closed-form backward (see the file comment).
  void weights(double e, double a, std::int64_t f, double& u, double& w) const {
    switch (fp_.dist) {
      case distribution_kind::softmax:
      case distribution_kind::topk: u = w = a; return;
      case distribution_kind::sparsemax: u = w = a > 0.0 ? 1.0 : 0.0; return;
      case distribution_kind::entmax15: u = w = std::sqrt(a); return;
      case distribution_kind::kernel: u = a, w = (e != kNegInf && st_.S[std::size_t(f)] > 0.0) ? 1.0 / st_.S[std::size_t(f)] : 0.0; return;
      case distribution_kind::sigmoid: u = 0.0, w = a * (1.0 - a); return;
      case distribution_kind::identity: u = 0.0, w = e == kNegInf ? 0.0 : 1.0; return;
      case distribution_kind::hardmax:
        if (fp_.hardmax_grad == hardmax_gradient::zero || e == kNegInf) u = w = 0.0;
        else u = w = std::exp(e - st_.lse[std::size_t(f)]);
        return;
    }
  }

  // Calls fn(j0, j1) over key blocks: all of [lo, hi), or only the selected keys when `sparse`.
  template <class Fn>
  void for_keys(const row_ctx& r, bool sparse, Fn&& fn) {
    if (sparse) {
      for (std::int64_t j : st_.support) fn(j, j + 1);
    } else {
      for (std::int64_t j0 = r.lo; j0 < r.hi; j0 += kBlock) fn(j0, std::min(r.hi, j0 + kBlock));
    }
  }

  bool sparse_alpha() const { return fp_.dist == distribution_kind::hardmax || fp_.dist == distribution_kind::topk; }
  bool sparse_grad() const {
    return fp_.dist == distribution_kind::topk ||
           (fp_.dist == distribution_kind::hardmax && fp_.hardmax_grad == hardmax_gradient::zero);
  }

  // α for keys [j0, j1) into st_.alpha (st_.e must hold their scores).
  void block_alpha(std::int64_t j0, std::int64_t j1) {
    for (std::int64_t j = j0; j < j1; ++j)
      for (std::int64_t f = 0; f < fp_.F; ++f) {
        const std::size_t o = std::size_t((j - j0) * fp_.F + f);
        st_.alpha[o] = alpha(st_.e[o], j, f);
      }
  }

  // out_i = Σ_j α_j v_j (feature x uses α[.., f(x)]).
  void forward(const row_ctx& r, double* out) {
    const std::int64_t F = fp_.F, Dv = fp_.Dv;
    std::fill(out, out + Dv, 0.0);
    stats(r);
    for_keys(r, sparse_alpha(), [&](std::int64_t j0, std::int64_t j1) {
      eval_scores(fp_, r, j0, j1, st_.e.data());
      block_alpha(j0, j1);
      for (std::int64_t j = j0; j < j1; ++j) {
        const double* a = st_.alpha.data() + (j - j0) * F;
        const double* vj = r.v + j * Dv;
        for (std::int64_t x = 0; x < Dv; ++x) out[x] += a[F == 1 ? 0 : x] * vj[x];
      }
    });
  }

  void backward(const row_ctx& r, const double* dout, double* dqp, grad_acc& acc) {
    const std::int64_t F = fp_.F, Dv = fp_.Dv;
    stats(r);
    std::fill(st_.r.begin(), st_.r.end(), 0.0);
    std::fill(st_.c.begin(), st_.c.end(), 0.0);
    double* dv = acc.dV.data() + (r.b * fp_.Hkv + r.hk) * fp_.Nk * Dv;
    // dα_jf = Σ_{x: f(x) = f} dout[x] v_j[x]
    auto block_dalpha = [&](std::int64_t j0, std::int64_t j1) {
      for (std::int64_t j = j0; j < j1; ++j) {
        const double* vj = r.v + j * Dv;
        double* da = st_.dalpha.data() + (j - j0) * F;
        if (F == 1) {
          double s = 0.0;
          for (std::int64_t x = 0; x < Dv; ++x) s += dout[x] * vj[x];
          da[0] = s;
        } else {
          for (std::int64_t x = 0; x < Dv; ++x) da[x] = dout[x] * vj[x];
        }
      }
    };
    // Pass B: dv_j += α_j dout, and r_f = Σ u dα / Σ u.
    const bool sparse = sparse_grad();
    for_keys(r, sparse, [&](std::int64_t j0, std::int64_t j1) {
      eval_scores(fp_, r, j0, j1, st_.e.data());
      block_alpha(j0, j1);
      block_dalpha(j0, j1);
      for (std::int64_t j = j0; j < j1; ++j) {
        const double* a = st_.alpha.data() + (j - j0) * F;
        for (std::int64_t x = 0; x < Dv; ++x) dv[j * Dv + x] += a[F == 1 ? 0 : x] * dout[x];
      }
      for (std::int64_t o = 0; o < (j1 - j0) * F; ++o) {
        double u = 0.0, w = 0.0;
        weights(st_.e[std::size_t(o)], st_.alpha[std::size_t(o)], o % F, u, w);
        st_.r[std::size_t(o % F)] += u * st_.dalpha[std::size_t(o)];
        st_.c[std::size_t(o % F)] += u;
      }
    });
    if (fp_.dist == distribution_kind::hardmax && fp_.hardmax_grad == hardmax_gradient::zero) return;
    for (std::int64_t f = 0; f < F; ++f)
      st_.r[std::size_t(f)] = st_.c[std::size_t(f)] > 0.0 ? st_.r[std::size_t(f)] / st_.c[std::size_t(f)] : 0.0;
    // Pass C: de = w (dα - r), then the score kernel's backward.
    for_keys(r, sparse, [&](std::int64_t j0, std::int64_t j1) {
      eval_scores(fp_, r, j0, j1, st_.e.data());
      block_alpha(j0, j1);
      block_dalpha(j0, j1);
      for (std::int64_t o = 0; o < (j1 - j0) * F; ++o) {
        double u = 0.0, w = 0.0;
        weights(st_.e[std::size_t(o)], st_.alpha[std::size_t(o)], o % F, u, w);
        st_.de[std::size_t(o)] = w == 0.0 ? 0.0 : w * (st_.dalpha[std::size_t(o)] - st_.r[std::size_t(o % F)]);
        if (fp_.dist == distribution_kind::sigmoid) acc.dsigmoid_bias += st_.de[std::size_t(o)];
      }
      backprop_scores(fp_, r, j0, j1, st_.de.data(), dqp, acc);
    });
  }

 private:
  const fproblem& fp_;
  row_state st_;
};

}  // namespace

void tiled_forward(const fproblem& fp, std::vector<double>& out) {
  out.assign(std::size_t(fp.B * fp.Hq * fp.Nq * fp.Dv), 0.0);
  const std::int64_t rows = fp.B * fp.Hq * fp.Nq;
#pragma omp parallel num_threads(fp.p.num_threads)
  {
    row_engine eng(fp);
#pragma omp for schedule(dynamic, 8)
    for (std::int64_t rI = 0; rI < rows; ++rI) {
      const std::int64_t i = rI % fp.Nq, h = (rI / fp.Nq) % fp.Hq, b = rI / (fp.Nq * fp.Hq);
      eng.forward(make_row(fp, b, h, i), out.data() + rI * fp.Dv);
    }
  }
}

void tiled_backward(const fproblem& fp, const std::vector<double>& dout, std::vector<double>& dQp, grad_acc& acc) {
  dQp.assign(std::size_t(fp.B * fp.Hq * fp.Nq * fp.Pq), 0.0);
  acc.init(fp);
  const std::int64_t rows = fp.B * fp.Hq * fp.Nq;
  const int nt = std::max(1, std::min<int>(fp.p.num_threads, int(std::max<std::int64_t>(rows, 1))));
  std::vector<grad_acc> part(static_cast<std::size_t>(nt));
#pragma omp parallel num_threads(nt)
  {
    grad_acc& mine = part[std::size_t(omp_get_thread_num())];
    mine.init(fp);
    row_engine eng(fp);
#pragma omp for schedule(dynamic, 8)
    for (std::int64_t rI = 0; rI < rows; ++rI) {
      const std::int64_t i = rI % fp.Nq, h = (rI / fp.Nq) % fp.Hq, b = rI / (fp.Nq * fp.Hq);
      eng.backward(make_row(fp, b, h, i), dout.data() + rI * fp.Dv, dQp.data() + rI * fp.Pq, mine);
    }
  }
  for (const grad_acc& g : part) acc.add(g);
}

}  // namespace attn::detail::family

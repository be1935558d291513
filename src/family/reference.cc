// src/family/reference.cc — the float64 reference of attention_family: one query row at a
// time, every score of the row materialised, each distribution computed the plain way and by a
// different algorithm from the tiled path where one exists:
//   sparsemax, entmax15  bisection for the support, then the threshold in closed form
//   topk                 a full stable sort of the row
//   softmax              exp(s - max) / Σ, no online rescaling
// It is the oracle of the tests and of `attention_family_weights`.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "family/family_impl.h"

namespace attn::detail::family {
namespace {

// The threshold τ with Σ_j g(z_j - τ) = 1 over the finite z, g = max(·, 0) (sparsemax) or
// max(·, 0)² (entmax15 on z = s/2). Bisection finds the support; τ is then solved exactly on it.
double threshold(const std::vector<double>& z, bool squared) {
  const double mx = *std::max_element(z.begin(), z.end());
  auto mass = [&](double t) {
    double m = 0.0;
    for (double x : z) {
      const double d = std::max(x - t, 0.0);
      m += squared ? d * d : d;
    }
    return m;
  };
  double lo = mx - 1.0, hi = mx;  // mass(lo) >= 1 >= mass(hi) = 0
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (mass(mid) >= 1.0 ? lo : hi) = mid;
  }
  double n = 0.0, s1 = 0.0, s2 = 0.0;
  for (double x : z)
    if (x > lo) n += 1.0, s1 += x, s2 += x * x;
  if (!squared) return (s1 - 1.0) / n;
  // n τ² - 2 s1 τ + s2 - 1 = 0, the root below every z in the support
  return (s1 - std::sqrt(std::max(0.0, s1 * s1 - n * (s2 - 1.0)))) / n;
}

// α of one feature of one row (s: masked scores, -inf = excluded), into a.
void distribution_row(const fproblem& fp, const std::vector<double>& s, std::vector<double>& a) {
  const std::size_t n = s.size();
  a.assign(n, 0.0);
  std::vector<double> fin;
  for (double x : s)
    if (x != kNegInf) fin.push_back(x);
  if (fp.dist == distribution_kind::sigmoid) {
    for (std::size_t j = 0; j < n; ++j)
      if (s[j] != kNegInf) a[j] = 1.0 / (1.0 + std::exp(-(s[j] + fp.sigmoid_bias)));
    return;
  }
  if (fp.dist == distribution_kind::identity) {  // α = s, no normalisation
    for (std::size_t j = 0; j < n; ++j)
      if (s[j] != kNegInf) a[j] = s[j];
    return;
  }
  if (fin.empty()) return;  // fully masked row
  const double mx = *std::max_element(fin.begin(), fin.end());
  switch (fp.dist) {
    case distribution_kind::softmax: {
      double sum = 0.0;
      for (double x : fin) sum += std::exp(x - mx);
      for (std::size_t j = 0; j < n; ++j) if (s[j] != kNegInf) a[j] = std::exp(s[j] - mx) / sum;
      return;
    }
    case distribution_kind::sparsemax: {
      const double tau = threshold(fin, false);
      for (std::size_t j = 0; j < n; ++j) if (s[j] != kNegInf) a[j] = std::max(s[j] - tau, 0.0);
      return;
    }
    case distribution_kind::entmax15: {
      std::vector<double> half(fin);
      for (double& x : half) x /= 2.0;
      const double tau = threshold(half, true);
      for (std::size_t j = 0; j < n; ++j)
        if (s[j] != kNegInf) { const double d = std::max(s[j] / 2.0 - tau, 0.0); a[j] = d * d; }
      return;
    }
    case distribution_kind::hardmax: {
      for (std::size_t j = 0; j < n; ++j)
        if (s[j] == mx) { a[j] = 1.0; return; }
      return;
    }
    case distribution_kind::topk: {
      std::vector<std::size_t> idx(n);
      std::iota(idx.begin(), idx.end(), 0);
      std::stable_sort(idx.begin(), idx.end(), [&](std::size_t x, std::size_t y) { return s[x] > s[y]; });
      const std::size_t k = std::min<std::size_t>(std::size_t(fp.topk), fin.size());
      double sum = 0.0;
      for (std::size_t t = 0; t < k; ++t) sum += std::exp(s[idx[t]] - mx);
      for (std::size_t t = 0; t < k; ++t) a[idx[t]] = std::exp(s[idx[t]] - mx) / sum;
      return;
    }
    case distribution_kind::kernel: {
      double sum = 0.0;
      for (double x : fin) sum += x;
      if (sum > 0.0)
        for (std::size_t j = 0; j < n; ++j) if (s[j] != kNegInf) a[j] = s[j] / sum;
      return;
    }
    default: return;
  }
}

// de = J_αᵀ dα for one feature of one row (the Jacobians written out per distribution).
void distribution_row_backward(const fproblem& fp, const std::vector<double>& s, const std::vector<double>& a,
                               const std::vector<double>& da, std::vector<double>& de) {
  const std::size_t n = s.size();
  de.assign(n, 0.0);
  auto dot = [&](const std::vector<double>& w) {
    double r = 0.0;
    for (std::size_t j = 0; j < n; ++j) r += w[j] * da[j];
    return r;
  };
  switch (fp.dist) {
    case distribution_kind::softmax:
    case distribution_kind::topk: {  // ∂α_j/∂s_l = α_j (δ_jl - α_l) on the kept set
      const double r = dot(a);
      for (std::size_t j = 0; j < n; ++j) de[j] = a[j] * (da[j] - r);
      return;
    }
    case distribution_kind::sigmoid:
      for (std::size_t j = 0; j < n; ++j) de[j] = da[j] * a[j] * (1.0 - a[j]);
      return;
    case distribution_kind::identity:  // J = I on the keys left
      for (std::size_t j = 0; j < n; ++j) de[j] = s[j] != kNegInf ? da[j] : 0.0;
      return;
    case distribution_kind::sparsemax: {  // J = diag(1_S) - 1_S 1_Sᵀ / |S|
      double cnt = 0.0, sum = 0.0;
      for (std::size_t j = 0; j < n; ++j) if (a[j] > 0.0) cnt += 1.0, sum += da[j];
      for (std::size_t j = 0; j < n; ++j) if (a[j] > 0.0) de[j] = da[j] - sum / cnt;
      return;
    }
    case distribution_kind::entmax15: {  // J = diag(g) - g gᵀ / Σ g, g = √α
      double gs = 0.0, gd = 0.0;
      for (std::size_t j = 0; j < n; ++j) { const double g = std::sqrt(a[j]); gs += g, gd += g * da[j]; }
      if (gs > 0.0)
        for (std::size_t j = 0; j < n; ++j) de[j] = std::sqrt(a[j]) * (da[j] - gd / gs);
      return;
    }
    case distribution_kind::hardmax: {
      if (fp.hardmax_grad == hardmax_gradient::zero) return;
      fproblem soft = fp;  // straight-through: the softmax Jacobian at the same scores
      soft.dist = distribution_kind::softmax;
      std::vector<double> p;
      distribution_row(soft, s, p);
      distribution_row_backward(soft, s, p, da, de);
      return;
    }
    case distribution_kind::kernel: {  // α = K / ΣK: ∂α_j/∂K_l = (δ_jl - α_j) / ΣK
      double sum = 0.0;
      for (std::size_t j = 0; j < n; ++j) if (s[j] != kNegInf) sum += s[j];
      if (sum <= 0.0) return;
      const double r = dot(a);
      for (std::size_t j = 0; j < n; ++j) if (s[j] != kNegInf) de[j] = (da[j] - r) / sum;
      return;
    }
  }
}

// The masked scores of row r, [Nk, F], and the weights α, [Nk, F].
void row_weights(const fproblem& fp, const row_ctx& r, std::vector<double>& e, std::vector<double>& alpha,
                 std::vector<std::vector<double>>& s_f, std::vector<std::vector<double>>& a_f) {
  const std::int64_t Nk = fp.Nk, F = fp.F;
  e.assign(std::size_t(Nk * F), kNegInf);
  if (r.hi > r.lo) eval_scores(fp, r, r.lo, r.hi, e.data() + r.lo * F);
  alpha.assign(std::size_t(Nk * F), 0.0);
  s_f.assign(std::size_t(F), std::vector<double>(std::size_t(Nk)));
  a_f.assign(std::size_t(F), {});
  for (std::int64_t f = 0; f < F; ++f) {
    for (std::int64_t j = 0; j < Nk; ++j) s_f[std::size_t(f)][std::size_t(j)] = e[std::size_t(j * F + f)];
    distribution_row(fp, s_f[std::size_t(f)], a_f[std::size_t(f)]);
    for (std::int64_t j = 0; j < Nk; ++j) alpha[std::size_t(j * F + f)] = a_f[std::size_t(f)][std::size_t(j)];
  }
}

}  // namespace

void reference_forward(const fproblem& fp, std::vector<double>& out, std::vector<double>* weights) {
  const std::int64_t F = fp.F, Dv = fp.Dv, Nk = fp.Nk;
  out.assign(std::size_t(fp.B * fp.Hq * fp.Nq * Dv), 0.0);
  if (weights) weights->assign(std::size_t(fp.B * fp.Hq * fp.Nq * Nk * F), 0.0);
  std::vector<double> e, alpha;
  std::vector<std::vector<double>> s_f, a_f;
  for (std::int64_t b = 0; b < fp.B; ++b)
    for (std::int64_t h = 0; h < fp.Hq; ++h)
      for (std::int64_t i = 0; i < fp.Nq; ++i) {
        const row_ctx r = make_row(fp, b, h, i);
        row_weights(fp, r, e, alpha, s_f, a_f);
        const std::int64_t row = (b * fp.Hq + h) * fp.Nq + i;
        for (std::int64_t j = 0; j < Nk; ++j)
          for (std::int64_t x = 0; x < Dv; ++x)
            out[std::size_t(row * Dv + x)] += alpha[std::size_t(j * F + (F == 1 ? 0 : x))] * r.v[j * Dv + x];
        if (weights) std::copy(alpha.begin(), alpha.end(), weights->begin() + row * Nk * F);
      }
}

// Per row: dα_jf = Σ_{x: f(x)=f} dout_x v_jx,  dv_j += α_j dout,  de = J_αᵀ dα,  then the kernel.
void reference_backward(const fproblem& fp, const std::vector<double>& dout, std::vector<double>& dQp,
                        grad_acc& acc) {
  const std::int64_t F = fp.F, Dv = fp.Dv, Nk = fp.Nk;
  dQp.assign(std::size_t(fp.B * fp.Hq * fp.Nq * fp.Pq), 0.0);
  acc.init(fp);
  std::vector<double> e, alpha, de(std::size_t(Nk * F)), de_f;
  std::vector<std::vector<double>> s_f, a_f;
  for (std::int64_t b = 0; b < fp.B; ++b)
    for (std::int64_t h = 0; h < fp.Hq; ++h)
      for (std::int64_t i = 0; i < fp.Nq; ++i) {
        const row_ctx r = make_row(fp, b, h, i);
        const std::int64_t row = (b * fp.Hq + h) * fp.Nq + i;
        const double* dO = dout.data() + row * Dv;
        row_weights(fp, r, e, alpha, s_f, a_f);
        double* dv = acc.dV.data() + (b * fp.Hkv + r.hk) * Nk * Dv;
        for (std::int64_t j = 0; j < Nk; ++j)
          for (std::int64_t x = 0; x < Dv; ++x) dv[j * Dv + x] += alpha[std::size_t(j * F + (F == 1 ? 0 : x))] * dO[x];
        for (std::int64_t f = 0; f < F; ++f) {
          std::vector<double> da(std::size_t(Nk), 0.0);
          for (std::int64_t j = 0; j < Nk; ++j)
            for (std::int64_t x = 0; x < Dv; ++x)
              if (F == 1 || x == f) da[std::size_t(j)] += dO[x] * r.v[j * Dv + x];
          distribution_row_backward(fp, s_f[std::size_t(f)], a_f[std::size_t(f)], da, de_f);
          for (std::int64_t j = 0; j < Nk; ++j) {
            de[std::size_t(j * F + f)] = de_f[std::size_t(j)];
            if (fp.dist == distribution_kind::sigmoid) acc.dsigmoid_bias += de_f[std::size_t(j)];
          }
        }
        if (r.hi > r.lo)
          backprop_scores(fp, r, r.lo, r.hi, de.data() + r.lo * F, dQp.data() + row * fp.Pq, acc);
      }
}

}  // namespace attn::detail::family

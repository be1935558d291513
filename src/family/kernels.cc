// src/family/kernels.cc — score kernels on prepared vectors (see family_impl.h), forward and
// backward, for a block of keys of one query row. Shared by the tiled path and the reference;
// the finite-difference tests check them through both.
#include <cmath>

#include "family/family_impl.h"

namespace attn::detail::family {
namespace {

double dot(const double* a, const double* b, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t x = 0; x < n; ++x) s += a[x] * b[x];
  return s;
}

double dist2(const double* a, const double* b, std::int64_t n) {
  double s = 0.0;
  for (std::int64_t x = 0; x < n; ++x) s += (a[x] - b[x]) * (a[x] - b[x]);
  return s;
}

}  // namespace

// e is [j1 - j0, F].
void eval_scores(const fproblem& fp, const row_ctx& r, std::int64_t j0, std::int64_t j1, double* e) {
  const std::int64_t F = fp.F, P = fp.Pq;
  for (std::int64_t j = j0; j < j1; ++j) {
    double* ej = e + (j - j0) * F;
    const double* kj = r.kp + j * fp.Pk;
    switch (fp.kernel) {
      case kernel_kind::dot: ej[0] = activate(fp.act, dot(r.qp, kj, P) + fp.bias); break;
      case kernel_kind::additive: {
        for (std::int64_t f = 0; f < F; ++f) ej[f] = 0.0;
        for (std::int64_t a = 0; a < P; ++a) {
          const double t = std::tanh(r.qp[a] + kj[a]);
          for (std::int64_t f = 0; f < F; ++f) ej[f] += fp.w_v[std::size_t(f * P + a)] * t;
        }
        break;
      }
      case kernel_kind::location: ej[0] = dot(fp.W_a.data() + j * P, r.qp, P); break;
      case kernel_kind::box: ej[0] = dist2(r.qp, kj, P) <= fp.h * fp.h ? 1.0 : 0.0; break;
      case kernel_kind::triangle: ej[0] = std::max(0.0, 1.0 - std::sqrt(dist2(r.qp, kj, P)) / fp.h); break;
    }
    if (fp.p.has_bias()) {
      const double m = fp.p.bias(r.b, r.h, r.i, j);
      for (std::int64_t f = 0; f < F; ++f) ej[f] += m;  // -inf for an excluded key
    }
  }
}

// Backward of eval_scores (the mask is a constant). de is [j1 - j0, F]; zeros are skipped.
void backprop_scores(const fproblem& fp, const row_ctx& r, std::int64_t j0, std::int64_t j1, const double* de,
                     double* dqp, grad_acc& acc) {
  const std::int64_t F = fp.F, P = fp.Pq;
  for (std::int64_t j = j0; j < j1; ++j) {
    const double* dej = de + (j - j0) * F;
    bool any = false;
    for (std::int64_t f = 0; f < F; ++f) any |= dej[f] != 0.0;
    if (!any) continue;
    const double* kj = r.kp + j * fp.Pk;
    double* dkj = acc.dKp.data() + ((r.b * fp.Hkv + r.hk) * fp.Nk + j) * fp.Pk;
    switch (fp.kernel) {
      case kernel_kind::dot: {
        // e = act(z), z = qp·kp + bias
        const double dz = dej[0] * activate_grad(fp.act, dot(r.qp, kj, P) + fp.bias);
        for (std::int64_t x = 0; x < P; ++x) dqp[x] += dz * kj[x], dkj[x] += dz * r.qp[x];
        acc.dbias += dz;
        break;
      }
      case kernel_kind::additive: {
        // e_f = Σ_a w_v[f, a] t_a,  t_a = tanh(qp_a + kp_a)
        for (std::int64_t a = 0; a < P; ++a) {
          const double t = std::tanh(r.qp[a] + kj[a]);
          double dt = 0.0;
          for (std::int64_t f = 0; f < F; ++f) {
            dt += dej[f] * fp.w_v[std::size_t(f * P + a)];
            acc.dw_v[std::size_t(f * P + a)] += dej[f] * t;
          }
          const double dz = dt * (1.0 - t * t);
          dqp[a] += dz, dkj[a] += dz;
        }
        break;
      }
      case kernel_kind::location: {
        // e_j = W_a[j]·qp
        const double* w = fp.W_a.data() + j * P;
        double* dw = acc.dW_a.data() + j * P;
        for (std::int64_t x = 0; x < P; ++x) dqp[x] += dej[0] * w[x], dw[x] += dej[0] * r.qp[x];
        break;
      }
      case kernel_kind::box: break;  // piecewise constant: zero almost everywhere
      case kernel_kind::triangle: {
        // e = 1 - ρ/h inside the support (ρ = ‖qp - kp‖ < h); ∂e/∂qp = -(qp - kp)/(ρh), ∂e/∂h = ρ/h²
        const double rho = std::sqrt(dist2(r.qp, kj, P));
        if (rho >= fp.h) break;
        acc.dh += dej[0] * rho / (fp.h * fp.h);
        if (rho == 0.0) break;  // the peak: subgradient 0
        const double c = dej[0] / (rho * fp.h);
        for (std::int64_t x = 0; x < P; ++x) {
          const double g = c * (r.qp[x] - kj[x]);
          dqp[x] -= g, dkj[x] += g;
        }
        break;
      }
    }
  }
}

}  // namespace attn::detail::family

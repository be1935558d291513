// src/family/scores/additive.cc — Bahdanau (concat) attention:
//   e = w_vᵀ tanh(W_q q + W_k k + b)       W_q [A, D], W_k [A, Dk], b [A] (optional), w_v [A]
//   multi-dimensional when w_v is [Dv, A]: e_ij[f] = w_v[f]·tanh(..), one distribution per value
//   feature f (F = Dv).
// Preparation: qp = W_q q, kp = W_k k + b, once per vector (O(N·A·D), not per pair); the
// additive kernel evaluates w_v·tanh(qp + kp) and accumulates dw_v itself.
#include <fmt/format.h>

#include <vector>

#include "core/common.h"
#include "family/scores/score.h"

namespace attn::detail::family {
namespace {

void check(const score_call& c, score_state& s) {
  const score_spec& sc = *c.spec;
  if (!sc.W_q) fail(c.op, "score additive needs W_q of shape [A, D]");
  const std::int64_t A = sc.W_q->rank() == 2 ? sc.W_q->size(0) : -1;
  if (A < 1)
    fail(c.op, fmt::format("W_q has shape {}, expected [A, D] = [A, {}] with A >= 1", shape_str(sc.W_q->shape()), c.D));
  s.W_q = get_param(c, "W_q", sc.W_q, {{A, c.D}});
  s.W_k = get_param(c, "W_k", sc.W_k, {{A, c.Dk}});
  s.b = get_param(c, "b", sc.b, {{A}}, /*required=*/false);
  s.w_v = get_param(c, "w_v", sc.w_v, {{A}, {c.Dv, A}});
}

// y = M x for M [R, C] in C order.
void matvec(const std::vector<double>& M, std::int64_t R, std::int64_t C, const double* x, double* y) {
  for (std::int64_t r = 0; r < R; ++r) {
    double sum = 0.0;
    for (std::int64_t col = 0; col < C; ++col) sum += M[std::size_t(r * C + col)] * x[col];
    y[r] = sum;
  }
}

// qp = W_q q, kp = W_k k + b
void prepare(const score_call& c, const score_state& s, const f64_qkv& in, fproblem& fp) {
  const std::int64_t A = s.W_q.view->size(0), D = c.D, Dk = c.Dk;
  fp.kernel = kernel_kind::additive;
  fp.F = s.w_v.view->rank() == 2 ? c.Dv : 1;
  fp.w_v = s.w_v.values;
  fp.Pq = fp.Pk = A;
  fp.Qp.resize(std::size_t(c.rows_q() * A));
  fp.Kp.resize(std::size_t(c.rows_k() * A));
  for (std::int64_t r = 0; r < c.rows_q(); ++r) matvec(s.W_q.values, A, D, in.q.data() + r * D, fp.Qp.data() + r * A);
  for (std::int64_t r = 0; r < c.rows_k(); ++r) {
    matvec(s.W_k.values, A, Dk, in.k.data() + r * Dk, fp.Kp.data() + r * A);
    if (s.b.view)
      for (std::int64_t a = 0; a < A; ++a) fp.Kp[std::size_t(r * A + a)] += s.b.values[std::size_t(a)];
  }
}

// dq = W_qᵀ dqp, dW_q = Σ dqp qᵀ;  dk = W_kᵀ dkp, dW_k = Σ dkp kᵀ, db = Σ dkp;  dw_v from the kernel.
void backward(const score_call& c, const score_state& s, const f64_qkv& in, const fproblem&,
              const std::vector<double>& dQp, const grad_acc& acc, std::vector<double>& dq, std::vector<double>& dk,
              family_grads& g) {
  const std::int64_t A = s.W_q.view->size(0), D = c.D, Dk = c.Dk;
  std::vector<double> dWq(std::size_t(A * D), 0.0), dWk(std::size_t(A * Dk), 0.0), db(std::size_t(A), 0.0);
  for (std::int64_t r = 0; r < c.rows_q(); ++r)
    for (std::int64_t a = 0; a < A; ++a) {
      const double ga = dQp[std::size_t(r * A + a)];
      if (ga == 0.0) continue;
      for (std::int64_t d = 0; d < D; ++d) {
        dq[std::size_t(r * D + d)] += s.W_q.values[std::size_t(a * D + d)] * ga;
        dWq[std::size_t(a * D + d)] += ga * in.q[std::size_t(r * D + d)];
      }
    }
  for (std::int64_t r = 0; r < c.rows_k(); ++r)
    for (std::int64_t a = 0; a < A; ++a) {
      const double ga = acc.dKp[std::size_t(r * A + a)];
      if (ga == 0.0) continue;
      db[std::size_t(a)] += ga;
      for (std::int64_t d = 0; d < Dk; ++d) {
        dk[std::size_t(r * Dk + d)] += s.W_k.values[std::size_t(a * Dk + d)] * ga;
        dWk[std::size_t(a * Dk + d)] += ga * in.k[std::size_t(r * Dk + d)];
      }
    }
  g.dW_q = param_grad(s.W_q, dWq);
  g.dW_k = param_grad(s.W_k, dWk);
  g.db = param_grad(s.b, db);
  g.dw_v = param_grad(s.w_v, acc.dw_v);
}

}  // namespace

const score_def kAdditiveScore = {
    .params = "W_q W_k b w_v", .same_head_size = false, .check = check, .prepare = prepare, .backward = backward};

}  // namespace attn::detail::family

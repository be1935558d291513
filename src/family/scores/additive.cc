// src/family/scores/additive.cc — Bahdanau (concat) attention:
//   e = w_vᵀ tanh(W_q q + W_k k + b)       W_q [A, D], W_k [A, Dk], b [A] (optional), w_v [A]
//   multi-dimensional when w_v is [Dv, A]: e_ij[f] = w_v[f]·tanh(..), one distribution per value
//   feature f (F = Dv).
// Preparation: qp = W_q q, kp = W_k k + b, once per vector (O(N·A·D), not per pair); the
// additive kernel evaluates w_v·tanh(qp + kp) and accumulates dw_v itself.
#include <fmt/format.h>

#include <optional>
#include <vector>

#include "attn/linear.h"
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

// A contiguous float64 buffer [rows, X] as a view (for attn::linear).
TensorView rows_view(const std::vector<double>& x, std::int64_t rows, std::int64_t X) {
  return TensorView(const_cast<double*>(x.data()), dtype::f64, {rows, X});
}
std::vector<double> values(const Tensor& t) {
  const double* p = static_cast<const double*>(t.data());
  return std::vector<double>(p, p + t.numel());
}

// qp = W_q q, kp = W_k k + b: two float64 GEMMs over the rows (attn::linear).
void prepare(const score_call& c, const score_state& s, const f64_qkv& in, fproblem& fp) {
  const std::int64_t A = s.W_q.view->size(0), D = c.D, Dk = c.Dk;
  fp.kernel = kernel_kind::additive;
  fp.F = s.w_v.view->rank() == 2 ? c.Dv : 1;
  fp.w_v = s.w_v.values;
  fp.Pq = fp.Pk = A;
  const TensorView Wq = rows_view(s.W_q.values, A, D), Wk = rows_view(s.W_k.values, A, Dk);
  fp.Qp = values(linear(rows_view(in.q, c.rows_q(), D), Wq));
  const std::optional<TensorView> b =
      s.b.view ? std::optional<TensorView>(TensorView(const_cast<double*>(s.b.values.data()), dtype::f64, {A}))
               : std::nullopt;
  fp.Kp = values(linear(rows_view(in.k, c.rows_k(), Dk), Wk, b));
}

// dq = W_qᵀ dqp, dW_q = Σ dqp qᵀ;  dk = W_kᵀ dkp, dW_k = Σ dkp kᵀ, db = Σ dkp;  dw_v from the kernel.
void backward(const score_call& c, const score_state& s, const f64_qkv& in, const fproblem&,
              const std::vector<double>& dQp, const grad_acc& acc, std::vector<double>& dq, std::vector<double>& dk,
              family_grads& g) {
  const std::int64_t A = s.W_q.view->size(0), D = c.D, Dk = c.Dk;
  const linear_grads gq = linear_backward(rows_view(in.q, c.rows_q(), D), rows_view(s.W_q.values, A, D),
                                          rows_view(dQp, c.rows_q(), A));
  const linear_grads gk = linear_backward(rows_view(in.k, c.rows_k(), Dk), rows_view(s.W_k.values, A, Dk),
                                          rows_view(acc.dKp, c.rows_k(), A), {.dx = true, .dW = true, .db = true});
  dq = values(gq.dx);
  dk = values(gk.dx);
  g.dW_q = param_grad(s.W_q, values(gq.dW));
  g.dW_k = param_grad(s.W_k, values(gk.dW));
  g.db = param_grad(s.b, values(gk.db));
  g.dw_v = param_grad(s.w_v, acc.dw_v);
}

}  // namespace

const score_def kAdditiveScore = {
    .params = "W_q W_k b w_v", .same_head_size = false, .check = check, .prepare = prepare, .backward = backward};

}  // namespace attn::detail::family

// src/family/scores/location.cc — Luong's location-based score: e_i = W_a q_i ∈ R^Nk, W_a
// [Nk, D]; the keys are not read (dk = 0). The location kernel evaluates W_a[j]·qp with qp = q
// and accumulates dW_a itself.
//
// Core route (softmax): e_ij = q_i·W_a[j] is a dot score whose key j is W_a[j] for every batch and
// head, so attn::attention runs it on K = W_a copied into each (b, kv head) (scale 1); dW_a is
// the sum of attention_backward's dk over batches and heads.
#include <cstring>

#include "core/common.h"
#include "family/scores/score.h"

namespace attn::detail::family {
namespace {

void check(const score_call& c, score_state& s) { s.W_a = get_param(c, "W_a", c.spec->W_a, {{c.Nk, c.D}}); }

void prepare(const score_call& c, const score_state& s, const f64_qkv& in, fproblem& fp) {
  fp.kernel = kernel_kind::location;
  fp.W_a = s.W_a.values;
  fp.Pq = c.D, fp.Pk = 0;
  fp.Qp = in.q;
}

void backward(const score_call&, const score_state& s, const f64_qkv&, const fproblem&, const std::vector<double>& dQp,
              const grad_acc& acc, std::vector<double>& dq, std::vector<double>&, family_grads& g) {
  dq = dQp;  // dk stays 0
  g.dW_a = param_grad(s.W_a, acc.dW_a);
}

core_qkv core_prepare(const score_call& c, const score_state& s, const TensorView& q, const TensorView&,
                      const TensorView& v) {
  const dtype t = core_dtype(c.type);
  Tensor kp = empty_bhnx(c.B, c.Hkv, c.Nk, c.D, c.rank, t);
  const strided4 ks = as_bhnx(kp, c.Hkv);
  for_rows(c.B, c.Hkv, c.Nk, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t) {
    store_row(ks, b, h, n, c.D, s.W_a.values.data() + n * c.D);
  });
  return {with_dtype(q, t), kp, with_dtype(v, t), 1.0};
}

void core_backward(const score_call& c, const score_state& s, const TensorView&, const TensorView&, const core_qkv&,
                   const attention_grads& cg, family_grads& g) {
  g.dq = to_dtype(cg.dq, c.type);
  g.dk = empty_bhnx(c.B, c.Hkv, c.Nk, c.Dk, c.rank, c.type);  // the keys are not read
  std::memset(g.dk.data(), 0, std::size_t(g.dk.numel()) * dtype_size(c.type));
  std::vector<double> dW(std::size_t(c.Nk * c.D), 0.0), row(std::size_t(c.D), 0.0);
  const strided4 dk = as_bhnx(cg.dk, c.Hkv);
  for_rows(c.B, c.Hkv, c.Nk, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t) {
    load_row(dk, b, h, n, c.D, row.data());
    for (std::int64_t d = 0; d < c.D; ++d) dW[std::size_t(n * c.D + d)] += row[std::size_t(d)];
  });
  g.dW_a = param_grad(s.W_a, dW);
}

}  // namespace

const score_def kLocationScore = {.params = "W_a", .same_head_size = false, .check = check, .prepare = prepare,
                                  .backward = backward, .core_prepare = core_prepare, .core_backward = core_backward};

}  // namespace attn::detail::family

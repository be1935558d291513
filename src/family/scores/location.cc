// src/family/scores/location.cc — Luong's location-based score: e_i = W_a q_i ∈ R^Nk, W_a
// [Nk, D]; the keys are not read (dk = 0). The location kernel evaluates W_a[j]·qp with qp = q
// and accumulates dW_a itself.
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

}  // namespace

const score_def kLocationScore = {
    .params = "W_a", .same_head_size = false, .check = check, .prepare = prepare, .backward = backward};

}  // namespace attn::detail::family

// src/family/scores/dot.cc — dot (e = q·k) and scaled_dot (e = scale · q·k, scale = 1/√D by
// default).
//
// Core route: attn::attention itself on the user's q, k, v (scale in attention_options, dtype
// and layout kept: no copy, so bf16 input reaches the bf16 kernels). Tiled route: qp = scale·q,
// kp = k.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/common.h"
#include "family/scores/score.h"

namespace attn::detail::family {
namespace {

void check_dot(const score_call&, score_state& s) { s.scale = 1.0; }

void check_scaled_dot(const score_call& c, score_state& s) {
  const score_spec& sc = *c.spec;
  s.scale = sc.scale ? *sc.scale : 1.0 / std::sqrt(double(std::max<std::int64_t>(c.D, 1)));
  if (!std::isfinite(s.scale)) fail(c.op, fmt::format("scale = {} is not finite", s.scale));
}

// qp = scale·q, kp = k
void prepare(const score_call& c, const score_state& s, const f64_qkv& in, fproblem& fp) {
  fp.Pq = fp.Pk = c.D;
  fp.Qp = in.q;
  for (double& x : fp.Qp) x *= s.scale;
  fp.Kp = in.k;
}

// dq = scale·dqp, dk = dkp
void backward(const score_call&, const score_state& s, const f64_qkv&, const fproblem&, const std::vector<double>& dQp,
              const grad_acc& acc, std::vector<double>& dq, std::vector<double>& dk, family_grads&) {
  for (std::size_t x = 0; x < dq.size(); ++x) dq[x] = s.scale * dQp[x];
  dk = acc.dKp;
}

core_qkv core_prepare(const score_call&, const score_state& s, const TensorView& q, const TensorView& k,
                      const TensorView& v) {
  return {q, k, v, s.scale};
}

// attention_backward already differentiates the scaled product, in the layouts and dtype of q.
void core_backward(const score_call&, const score_state&, const TensorView&, const TensorView&, const core_qkv&,
                   const attention_grads& cg, family_grads& g) {
  g.dq = cg.dq;
  g.dk = cg.dk;
}

}  // namespace

const score_def kDotScore = {.fused_direct = true,
                             .check = check_dot, .prepare = prepare, .backward = backward,
                             .core_prepare = core_prepare, .core_backward = core_backward};
const score_def kScaledDotScore = {.fused_direct = true,
                                   .check = check_scaled_dot, .prepare = prepare, .backward = backward,
                                   .core_prepare = core_prepare, .core_backward = core_backward};

}  // namespace attn::detail::family

// src/family/scores/box_triangle.cc — the compact Nadaraya–Watson kernels, h > 0:
//   box       e = 1{‖q-k‖ <= h}
//   triangle  e = max(0, 1 - ‖q-k‖/h)
// The kernels read q and k as they are (qp = q, kp = k: on the fused path the user's own views,
// score_def::fused_direct); with distribution kernel the score is
// the weight itself (α = K / Σ K), so only bool masks apply. The kernels' gradients (box: 0
// almost everywhere; triangle: through ‖q-k‖ and h) arrive in dQp, dKp and acc.dh.
#include <fmt/format.h>

#include <cmath>

#include "core/common.h"
#include "family/scores/score.h"

namespace attn::detail::family {
namespace {

void check(const score_call& c, score_state& s) {
  s.h = c.spec->bandwidth;
  if (!(s.h > 0.0) || !std::isfinite(s.h)) fail(c.op, fmt::format("bandwidth h = {} must be finite and > 0", s.h));
}

void direct_prepare(const score_call& c, const score_state& s, fproblem& fp) {
  fp.kernel = c.spec->kind == score_kind::box ? kernel_kind::box : kernel_kind::triangle;
  fp.h = s.h;
  fp.Pq = fp.Pk = c.D;
}

void prepare(const score_call& c, const score_state& s, const f64_qkv& in, fproblem& fp) {
  direct_prepare(c, s, fp);
  fp.Qp = in.q, fp.Kp = in.k;
}

void backward(const score_call&, const score_state&, const f64_qkv&, const fproblem&, const std::vector<double>& dQp,
              const grad_acc& acc, std::vector<double>& dq, std::vector<double>& dk, family_grads& g) {
  dq = dQp;
  dk = acc.dKp;
  g.dbandwidth = acc.dh;
}

}  // namespace

const score_def kBoxScore = {.kernel = kernel_role::weights, .fused_direct = true, .direct_prepare = direct_prepare,
                             .check = check, .prepare = prepare, .backward = backward};
const score_def kTriangleScore = {.kernel = kernel_role::weights, .fused_direct = true, .direct_prepare = direct_prepare,
                                  .check = check, .prepare = prepare, .backward = backward};

}  // namespace attn::detail::family

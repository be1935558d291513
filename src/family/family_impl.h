// src/family/family_impl.h — the validated, prepared description of one attention_family call,
// shared by the front (front.cc), the tiled kernels (tiled.cc) and the reference (reference.cc).
//
// Each score (scores/<score>.cc) turns itself into a "kernel" on prepared vectors, so the
// kernels never see the user's parameters in their raw form:
//   Qp [B, Hq, Nq, Pq]   the query side, e.g. W_q q for additive, q/(‖q‖τ) for cosine
//   Kp [B, Hkv, Nk, Pk]  the key side,   e.g. W_k k + b for additive, k/‖k‖ for cosine
//   V  [B, Hkv, Nk, Dv]
// and its chain rule back through that preparation runs once, after the kernels have produced
// dQp and dKp (score_def::backward, scores/score.h). All buffers are contiguous float64.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "attn/family.h"
#include "core/common.h"
#include "core/problem.h"

namespace attn::detail::family {

// What the kernels evaluate on prepared vectors (qp, kp), per key j:
enum class kernel_kind {
  dot,       // e = act(qp·kp + bias)                      dot, scaled, general*, cosine, gaussian
  additive,  // e_f = Σ_a w_v[f, a] tanh(qp_a + kp_a)     F = 1 or Dv
  location,  // e = Σ_d W_a[j, d] qp_d                    keys unused
  box,       // e = 1{‖qp - kp‖ <= h}
  triangle,  // e = max(0, 1 - ‖qp - kp‖/h)
};

enum class act_kind { identity, tanh, relu, sigmoid };

struct fproblem {
  problem p;  // masks, causal frontier, window, padding and threads (its q/k/v are not used)
  problem_storage store;  // what p points into (a shifted float mask)
  std::int64_t B = 0, Hq = 0, Hkv = 0, Nq = 0, Nk = 0, Dv = 0;
  std::int64_t Pq = 0, Pk = 0, F = 1;
  std::vector<double> Qp, Kp, V;

  kernel_kind kernel = kernel_kind::dot;
  act_kind act = act_kind::identity;
  double bias = 0.0;          // dot kernel
  std::vector<double> w_v;    // additive [F, Pq]
  std::vector<double> W_a;    // location [Nk, Pq]
  double h = 1.0;             // box, triangle

  distribution_kind dist = distribution_kind::softmax;  // kernel+gaussian arrives as softmax
  double sigmoid_bias = 0.0;
  std::int64_t topk = 1;
  hardmax_gradient hardmax_grad = hardmax_gradient::zero;

  std::int64_t group() const { return Hq / Hkv; }
  const double* qp(std::int64_t b, std::int64_t h, std::int64_t i) const {
    return Qp.data() + ((b * Hq + h) * Nq + i) * Pq;
  }
  const double* kp(std::int64_t b, std::int64_t hk) const { return Kp.data() + (b * Hkv + hk) * Nk * Pk; }
  const double* v(std::int64_t b, std::int64_t hk) const { return V.data() + (b * Hkv + hk) * Nk * Dv; }
};

// Gradients one thread accumulates (reduced by the caller). dKp, dV are [B, Hkv, Nk, Pk|Dv].
struct grad_acc {
  std::vector<double> dKp, dV, dw_v, dW_a;
  double dbias = 0.0, dh = 0.0, dsigmoid_bias = 0.0;

  void init(const fproblem& fp) {
    dKp.assign(std::size_t(fp.B * fp.Hkv * fp.Nk * fp.Pk), 0.0);
    dV.assign(std::size_t(fp.B * fp.Hkv * fp.Nk * fp.Dv), 0.0);
    dw_v.assign(fp.w_v.size(), 0.0);
    dW_a.assign(fp.W_a.size(), 0.0);
  }
  void add(const grad_acc& o) {
    for (std::size_t i = 0; i < dKp.size(); ++i) dKp[i] += o.dKp[i];
    for (std::size_t i = 0; i < dV.size(); ++i) dV[i] += o.dV[i];
    for (std::size_t i = 0; i < dw_v.size(); ++i) dw_v[i] += o.dw_v[i];
    for (std::size_t i = 0; i < dW_a.size(); ++i) dW_a[i] += o.dW_a[i];
    dbias += o.dbias, dh += o.dh, dsigmoid_bias += o.dsigmoid_bias;
  }
};

// One query row: where its prepared vectors live and which keys [lo, hi) it may see.
struct row_ctx {
  std::int64_t b, h, hk, i, lo, hi;
  const double* qp;
  const double* kp;  // key 0 of head hk
  const double* v;   // key 0 of head hk
};

inline row_ctx make_row(const fproblem& fp, std::int64_t b, std::int64_t h, std::int64_t i) {
  const std::int64_t hk = h / fp.group();
  const auto [lo, hi] = fp.p.key_range(b, i);
  return {b, h, hk, i, lo, hi, fp.qp(b, h, i), fp.kp(b, hk), fp.v(b, hk)};
}

// ---- kernels (kernels.cc) ----
// Scores of keys [j0, j1) of a row, e[(j - j0) * F + f], with the mask applied (+ additive
// mask; -inf for excluded keys).
void eval_scores(const fproblem& fp, const row_ctx& r, std::int64_t j0, std::int64_t j1, double* e);
// Backward of eval_scores: given de for keys [j0, j1), adds into dqp (the row's dQp) and acc.
void backprop_scores(const fproblem& fp, const row_ctx& r, std::int64_t j0, std::int64_t j1, const double* de,
                     double* dqp, grad_acc& acc);

// ---- implementations (tiled.cc, reference.cc): write out [B, Hq, Nq, Dv] / gradients ----
void tiled_forward(const fproblem& fp, std::vector<double>& out);
void tiled_backward(const fproblem& fp, const std::vector<double>& dout, std::vector<double>& dQp, grad_acc& acc);
void reference_forward(const fproblem& fp, std::vector<double>& out, std::vector<double>* weights);
void reference_backward(const fproblem& fp, const std::vector<double>& dout, std::vector<double>& dQp,
                        grad_acc& acc);

// ---- fused f32 path (fused.cc; kernels in src/cpu/family_kernels.h) ----
// Why the fused kernels cannot run this prepared problem with inputs of `type` (empty: they can).
// Linear attention with an unnormalised output times `scale` (linear.cc; linear_attention is
// scale 1): the family's identity distribution over dot and scaled_dot scores runs on it, by
// associativity (Σ_j (q_i·k_j) v_j = q_iᵀ Σ_j k_j v_jᵀ). op names the caller in messages.
linear_attention_result linear_scaled(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                                      const linear_attention_options& options, double scale, const execution& exec);
linear_attention_grads linear_scaled_backward(const char* op, const TensorView& q, const TensorView& k,
                                              const TensorView& v, const TensorView& dout,
                                              const linear_attention_options& options, double scale,
                                              const execution& exec);

std::string fused_why_not(const fproblem& fp, dtype type);
// Where the fused path reads its inputs: the float64 preparation fp.Qp, fp.Kp, fp.V, or — for a
// score whose preparation is only a scale (score_def::fused_direct: dot, scaled_dot) — the
// user's q, k, v themselves, converted to f32 once (Qp = scale·q, Kp = k), with no float64 copy.
struct fused_source {
  bool direct = false;
  strided4 q, k, v;    // [B, H, N, X] views of the user's tensors (direct only)
  double scale = 1.0;  // Qp = scale·q (direct only)
};
// Where the fused backward writes [B, H, N, X] rows of any float dtype: the float64 buffers dQp,
// dKp, dV of the score's chain rule (rows_of), or, direct, the tensors of the result, with
// dq = dq_scale · dQp (the chain rule of Qp = scale·q).
struct fused_grad_sink {
  strided4 dq, dk, dv;
  double dq_scale = 1.0;
};
// Whether the fused forward keeps row statistics the backward can start from: softmax (its lse)
// and the kernel normalisation (its Σ e), one score per pair (not multi-dimensional), whose
// r = Σ α dα / Σ α is dout·out — for the others (sparsemax's support mean, entmax15's √α
// weighting, …) r needs every key.
bool fused_keeps_stats(const fproblem& fp);
// The keys each hardmax (zero gradient) or top-k row keeps (fused.cc, sparse_rows): up to K per
// row, idx and α [B·Hq·Nq][K] in key order (−1 and 0 past the row's cnt), g = the score's act′.
struct kept_rows {
  std::int64_t K = 0;
  std::vector<std::int32_t> cnt, idx;
  std::vector<float> alpha, g;
};
// The forward's statistics, given back to the backward: log_norm [B·Hq·Nq] the log of each row's
// normaliser (log Σ e^s, log Σ e; -inf for a row with none), out [B, Hq, Nq, Dv] the result; kept
// the kept keys (K = 0: none).
struct fused_saved {
  const float* log_norm = nullptr;
  strided4 out;
  kept_rows kept;
};
// Whether the backward can start from a forward's kept keys without their g: the zero gradient of
// hardmax needs none, and g = 1 for the identity activation.
bool kept_reusable(const fproblem& fp);
// As tiled_forward / tiled_backward, in f32 on the fused kernels, writing every element of `out`
// [B, Hq, Nq, Dv] and of the sink's views; return the ISA level's name. The backward adds the
// scalar parameter gradients (dbias, dsigmoid_bias) to acc. The forward also writes log_norm
// [B·Hq·Nq] where it is not null and fused_keeps_stats, and the kept keys into `kept` where it is
// not null and the rows were sparse (hardmax, top-k; K = 0 otherwise). The backward starts from
// `saved` where it is not null: box scores (a zero score gradient) skip the dq pass, dot-product
// scores take the single pass, sparse rows skip the pass that finds their keys (kept_reusable);
// the others recompute as without it.
const char* fused_forward(const fproblem& fp, const fused_source& src, const strided4& out, float* log_norm = nullptr,
                          kept_rows* kept = nullptr);
const char* fused_backward(const fproblem& fp, const fused_source& src, const strided4& dout,
                           const fused_grad_sink& sink, grad_acc& acc, const fused_saved* saved = nullptr);
// The weights α [B, Hq, Nq, Nk] into w from the fused forward kernels (recomputed lane block by
// lane block, O(L·Nk) scratch per thread beside w itself).
const char* fused_weights(const fproblem& fp, const fused_source& src, const strided4& w);

// Activation and its derivative written in terms of z.
inline double activate(act_kind a, double z) {
  switch (a) {
    case act_kind::identity: return z;
    case act_kind::tanh: return std::tanh(z);
    case act_kind::relu: return z > 0.0 ? z : 0.0;
    case act_kind::sigmoid: return 1.0 / (1.0 + std::exp(-z));
  }
  return z;
}
inline double activate_grad(act_kind a, double z) {
  switch (a) {
    case act_kind::identity: return 1.0;
    case act_kind::tanh: { const double t = std::tanh(z); return 1.0 - t * t; }
    case act_kind::relu: return z > 0.0 ? 1.0 : 0.0;
    case act_kind::sigmoid: { const double s = 1.0 / (1.0 + std::exp(-z)); return s * (1.0 - s); }
  }
  return 1.0;
}

}  // namespace attn::detail::family

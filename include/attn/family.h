// attn/family.h — the attention family: score × distribution × masks, forward and backward.
//
// Attention is score → distribution → weighted sum. For query row i of batch b and head h
// (shape legend of attention.h: B, Hq, Hkv, Nq, Nk, D, Dv; Dk is the key size, which may
// differ from D for the general, additive and location scores):
//   e_ij  = score(q_i, k_j)                   ∈ R^F, F = 1 (or Dv: multi-dimensional)
//   s_ij  = e_ij + mask_ij, or -inf where a key is excluded (bool mask, causal, window, padding)
//   α_i·f = distribution(s_i·f)                one distribution per feature f
//   out_i[x] = Σ_j α_ij[f(x)] v_j[x]            f(x) = 0 when F = 1, x when F = Dv
// Masks, heads/GQA, 3-D and 4-D layouts, causal alignment and windows mean exactly what they
// mean for attn::attention. A row with no key left gives out = 0 and zero gradients, never NaN.
//
// Scores (learned parameters are shared by every batch and head; each gets a gradient):
//   dot               q·k
//   scaled_dot        scale · q·k                           scale defaults to 1/sqrt(D)
//   general           qᵀ W k                                W [D, Dk]
//   biased_general    kᵀ (Wᵀ q + b)                         b [Dk] (Galassi et al. 2020: one bias
//                                                            per key dimension, so bᵀk matters)
//   activated_general act(qᵀ W k + b)                       b [] or [1]; act: tanh | relu | sigmoid
//   additive          w_vᵀ tanh(W_q q + W_k k + b)          W_q [A, D], W_k [A, Dk], b [A], w_v [A]
//                     multi-dimensional when w_v is [Dv, A]: e_ij ∈ R^Dv, one weight per value feature
//   cosine            q·k / (‖q‖ ‖k‖ τ)                     0 when q or k is the zero vector
//   location          e_ij = (W_a q_i)_j (ignores the keys)  W_a [Nk, D]
//   gaussian          -‖q-k‖² / (2h²)   (the log of the Gaussian kernel; softmax of it is the
//                                        Nadaraya–Watson weight exp(-‖q-k‖²/2h²) / Σ ...);
//                     -‖q-k‖² / h with gaussian = gaussian_form::width (seed 002's form)
//   box               1{‖q-k‖ <= h}
//   triangle          max(0, 1 - ‖q-k‖/h)
// Distributions:
//   softmax           exp(s_j) / Σ exp(s)
//   sigmoid           σ(s_j + b_σ)                          b_σ defaults to -log(Nk)
//   sparsemax         argmin_{p ∈ simplex} ‖p - s‖²        (exact, sort-based; exact zeros)
//   entmax15          1.5-entmax: [s_j/2 - τ]₊², Σ = 1      (exact, sort-based; exact zeros)
//   hardmax           one-hot at the first arg max          gradient: see hardmax_gradient
//   topk              softmax over the k largest s_j (first index wins ties), exactly 0 elsewhere
//   kernel            K_ij / Σ_j K_ij for box and triangle (no key in reach: zeros);
//                     softmax of the gaussian score (same thing, computed stably)
//   identity          α_j = s_j: no distribution, y_i = Σ_j s_ij v_j (unnormalised weighting)
//
// Linear attention (Katharopoulos et al. 2020), φ(q)ᵀφ(k) with a feature map φ, is its own
// function, linear_attention below: it never forms the scores at all (O(N·D·Dv)).
//
// Memory: no call allocates Nq × Nk. Every pair streams over blocks of keys with O(block · F)
// scratch per thread, except sparsemax and entmax15, which keep one row of scores per query in
// flight (O(Nk · F) per thread). dot, scaled_dot, general (W folded into q), cosine (vectors
// normalised first) and gaussian (‖q‖² + ‖k‖² - 2q·k as a dot product of augmented vectors)
// with softmax run on attn::attention, and so on its fastest backend.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "attn/attention.h"
#include "attn/tensor.h"

namespace attn {

enum class score_kind {
  dot, scaled_dot, general, biased_general, activated_general, additive, cosine, location,
  gaussian, box, triangle,
};
enum class score_activation { tanh, relu, sigmoid };

enum class distribution_kind { softmax, sigmoid, sparsemax, entmax15, hardmax, topk, kernel, identity };

// The two parameterisations of the gaussian score (both e = -c ‖q-k‖², the log of the kernel).
enum class gaussian_form {
  sigma,  // c = 1/(2h²): exp(-‖q-k‖²/(2h²)), h the standard deviation (the default)
  width,  // c = 1/h:     exp(-‖q-k‖²/h), the form of seed 002's tutorial
};

// Gradient of hardmax with respect to the scores.
enum class hardmax_gradient {
  zero,              // the true derivative (hardmax is piecewise constant): no gradient reaches
                     // q, k or the score parameters; v_{j*} still gets dout
  straight_through,  // forward one-hot, backward the softmax Jacobian at the same scores
};

struct score_spec {
  score_kind kind = score_kind::scaled_dot;
  std::optional<double> scale;                           // scaled_dot; default 1/sqrt(D)
  score_activation activation = score_activation::tanh;  // activated_general
  double temperature = 1.0;                              // cosine τ > 0
  double bandwidth = 1.0;                                // gaussian, box, triangle: h > 0
  gaussian_form gaussian = gaussian_form::sigma;         // gaussian: which h
  std::optional<TensorArg> W;    // general family: [D, Dk]
  std::optional<TensorArg> b;    // biased_general: [Dk]; activated_general: [] or [1]; additive: [A]
  std::optional<TensorArg> W_q;  // additive: [A, D]
  std::optional<TensorArg> W_k;  // additive: [A, Dk]
  std::optional<TensorArg> w_v;  // additive: [A], or [Dv, A] for multi-dimensional attention
  std::optional<TensorArg> W_a;  // location: [Nk, D]
};

struct distribution_spec {
  distribution_kind kind = distribution_kind::softmax;
  std::optional<double> sigmoid_bias;  // sigmoid: default -log(Nk)
  std::int64_t k = 1;                  // topk: k >= 1 (rows with fewer keys keep them all)
  hardmax_gradient hardmax_grad = hardmax_gradient::zero;
};

// The score, the distribution, and the masks of attn::attention (masking_options, attention.h:
// the same fields, meaning exactly the same). Float masks are added to the scores and get no
// gradient; the kernel distribution of box and triangle takes bool masks only. after_past
// equals top_left here (no past). How it runs (path, threads) is the `execution` argument.
struct family_options : masking_options {
  score_spec score;
  distribution_spec distribution;
};

struct family_result {
  Tensor out;        // layout and dtype of q, Dv features
  // The row statistics the backward can start from, where the path kept them: the log of each
  // row's normaliser, [B, Hq, Nq] — log Σ_j e^{s_ij} with softmax on the core route (float32;
  // float64 for float64 inputs) and on the fused path (float32), log Σ_j e_ij with the kernel
  // distribution of box and triangle on the fused path; -inf for a row with no key. Multi-
  // dimensional additive scores with softmax on the fused path: one per (row, value feature),
  // [B, Hq, Nq, Dv]. Empty where the distribution has no such statistic (sigmoid, sparsemax,
  // entmax15, hardmax, top-k, identity; any but softmax when multi-dimensional) and on the tiled
  // and reference paths. Give the result back to attention_family_backward.
  Tensor lse;
  // The keys each row kept, where the rows are sparse on the fused path (hardmax with the zero
  // gradient; top-k with k <= 32) and every V is finite: kept_index [B, Hq, Nq, K] (int64, K = 1
  // for hardmax, k for top-k) in key order, -1 past the row's count (a row sees fewer than k
  // keys, or none); kept_weight [B, Hq, Nq, K] their α (float32, 0 past the count). The output
  // is Σ kept_weight · v over them. Empty otherwise. The backward starts from them.
  Tensor kept_index, kept_weight;
  std::string path;  // "core (cpu)", "fused (avx2)", "tiled", "reference"
};

struct family_grads {
  Tensor dq, dk, dv;           // shapes, layouts of q, k, v; dtype of q
  Tensor dW, db, dW_q, dW_k, dw_v, dW_a;  // each in the shape and dtype of its parameter, when given
  double dtemperature = 0.0;   // cosine
  double dbandwidth = 0.0;     // gaussian, triangle (box: 0 almost everywhere)
  double dsigmoid_bias = 0.0;  // sigmoid
  std::string path;
};

// Forward. q, k, v: f32, f16, bf16 or f64 (all the same dtype); the tiled kernels compute in
// float64, attn::attention in its own precision.
//
//   attn::family_options o;
//   o.score.kind = attn::score_kind::cosine;
//   o.score.temperature = 0.1;
//   o.distribution.kind = attn::distribution_kind::sparsemax;
//   auto r = attn::attention_family(q, k, v, o);   // r.out: [B, Hq, Nq, Dv]
family_result attention_family(const TensorView& q, const TensorView& k, const TensorView& v,
                               const family_options& options, const execution& exec = {});

// Backward: gradients of Σ dout · out with respect to q, k, v and every learned parameter.
// It recomputes the forward statistics from the inputs (no saved state), one extra pass over
// the keys.
family_grads attention_family_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& dout, const family_options& options,
                                       const execution& exec = {});

// The same from the forward's result (what attention_family returned for these q, k, v,
// options and execution, as attention_backward takes out and lse): where it carries the row
// statistics (family_result::lse) the backward starts from them and out — on the core route no
// second forward; on the fused path box scores (no score gradient) skip the dq pass, and
// dot-product and additive scores (multi-dimensional too) take the one-pass backward —
// elsewhere it is the call above. A result of
// another shape is refused by message.
//
//   auto r = attn::attention_family(q, k, v, o);
//   auto g = attn::attention_family_backward(q, k, v, dout, r, o);
family_grads attention_family_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& dout, const family_result& forward,
                                       const family_options& options, const execution& exec = {});

// The attention weights α, float64 [B, Hq, Nq, Nk] (or [B, Hq, Nq, Nk, Dv] when
// multi-dimensional). Where attention_family would take the fused path (float32/16 or bfloat16
// inputs, a dot-product score, a streaming distribution; or exec.path = fused, refused with its
// reason where it does not run) they come from the fused kernels — f32 values, recomputed lane
// block by lane block, multithreaded, so the weights of long sequences can be drawn; otherwise
// (float64 inputs, other scores, exec.path tiled/core/reference) from the float64 reference.
// For inspection and tests: it is Nq × Nk by nature.
Tensor attention_family_weights(const TensorView& q, const TensorView& k, const TensorView& v,
                                const family_options& options, const execution& exec = {});

// ---- named helpers: attention_family with one score / distribution filled in ----

// Bahdanau attention, softmax unless `o.distribution` says otherwise.
//   auto r = attn::additive_attention(q, k, v, Wq, Wk, b, wv);
family_result additive_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& W_q, const TensorView& W_k, const TensorView& b,
                                 const TensorView& w_v, family_options o = {},
                             const execution& exec = {});
// Luong general attention qᵀ W k.
family_result general_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& W, family_options o = {},
                             const execution& exec = {});
// Cosine-similarity attention with temperature τ.
family_result cosine_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                               double temperature, family_options o = {},
                             const execution& exec = {});
// Luong location-based attention: α_i = distribution(W_a q_i).
family_result location_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const TensorView& W_a, family_options o = {},
                             const execution& exec = {});
// Nadaraya–Watson kernel regression: kernel ∈ {gaussian, box, triangle}, bandwidth h;
// out_i = Σ_j K(q_i, k_j) v_j / Σ_j K(q_i, k_j).
//   auto r = attn::nadaraya_watson(x_query, x_train, y_train, attn::score_kind::gaussian, 0.5);
family_result nadaraya_watson(const TensorView& q, const TensorView& k, const TensorView& v, score_kind kernel,
                              double bandwidth, family_options o = {},
                             const execution& exec = {});
// Scaled-dot scores with another distribution (score left as given in `o`).
family_result sigmoid_attention(const TensorView& q, const TensorView& k, const TensorView& v, family_options o = {},
                             const execution& exec = {});
family_result sparsemax_attention(const TensorView& q, const TensorView& k, const TensorView& v, family_options o = {},
                             const execution& exec = {});
family_result entmax15_attention(const TensorView& q, const TensorView& k, const TensorView& v, family_options o = {},
                             const execution& exec = {});
family_result hard_attention(const TensorView& q, const TensorView& k, const TensorView& v, family_options o = {},
                             const execution& exec = {});
family_result topk_attention(const TensorView& q, const TensorView& k, const TensorView& v, std::int64_t k_top,
                             family_options o = {},
                             const execution& exec = {});

// ---- linear attention (Katharopoulos et al. 2020) ----
//
// out_i = Σ_j φ(q_i)ᵀφ(k_j) v_j / Σ_j φ(q_i)ᵀφ(k_j)   (normalize; without it, the numerator alone)
// over the keys j that query i may see, computed as φ(q_i)ᵀ S / φ(q_i)ᵀ z with S = Σ_j φ(k_j) v_jᵀ
// [D, Dv] and z = Σ_j φ(k_j) [D]: O(Nq·D·Dv + Nk·D·Dv) per head, no Nq × Nk weights. Causal runs
// S and z as prefix sums over the keys. Feature maps (elementwise):
//   elu_plus_one  φ(x) = elu(x) + 1 = x + 1 for x > 0, exp(x) otherwise  (> 0: the denominator is
//                 positive whenever a key is left)
//   relu          φ(x) = max(x, 0)                                       (φ'(0) = 0)
//   identity      φ(x) = x: without normalize, out_i = Σ_j (q_i·k_j) v_j — the family's identity
//                 distribution over dot scores (attention_family takes this route for it);
//                 with normalize the denominator q_i·Σ_j k_j may be any sign, or 0
// A row whose denominator is 0 (no key left, or relu features with no overlap) gives out = 0 and
// zero gradients. Masks: is_causal with alignment top_left or bottom_right (after_past = top_left)
// and nonpad_kv_seqlen (padding) — the ones that keep every row's keys a prefix [0, hi_i) with
// hi_i growing with i. attn_mask and sliding windows are refused (they would need the weights
// this algorithm never forms). GQA, 3-D and 4-D layouts as for attn::attention; q and k share D.
// It is a function of its own, not a score × distribution: the family's kernels visit every
// (query, key) pair, which is what linear attention exists to avoid (docs/FAMILY.md).
enum class feature_map { elu_plus_one, relu, identity };

struct linear_attention_options : masking_options {
  feature_map phi = feature_map::elu_plus_one;
  bool normalize = true;
};

struct linear_attention_result {
  Tensor out;        // layout and dtype of q, Dv features
  std::string path;  // "linear (f32)", "linear (f64)", "reference"
};

struct linear_attention_grads {
  Tensor dq, dk, dv;  // shapes, layouts of q, k, v; dtype of q
  std::string path;
};

// Forward. q, k, v: f32, f16, bf16 or f64 (all the same dtype). The fast path computes in float32
// (float64 for float64 input); execution::path = reference runs the float64 reference, which
// materialises every row's weights (the test oracle); path core is refused.
//
//   attn::linear_attention_options o;
//   o.phi = attn::feature_map::elu_plus_one;
//   o.is_causal = true;
//   auto r = attn::linear_attention(q, k, v, o);   // r.out: [B, Hq, Nq, Dv]
linear_attention_result linear_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                         const linear_attention_options& options = {}, const execution& exec = {});

// Backward: gradients of Σ dout · out with respect to q, k, v (recomputes the forward sums; for
// causal, a forward sweep gives dq and a backward sweep over suffix sums gives dk and dv).
linear_attention_grads linear_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                                 const TensorView& dout, const linear_attention_options& options = {},
                                                 const execution& exec = {});

// "scaled_dot", "softmax", "tanh", "straight_through", and back (throws attn::error
// naming the list of valid names). Used by `attn run`.
std::string to_string(score_kind s);
std::string to_string(distribution_kind d);
std::string to_string(score_activation a);
std::string to_string(hardmax_gradient g);
std::string to_string(gaussian_form f);
std::string to_string(feature_map f);
score_kind parse_score_kind(const std::string& s);
distribution_kind parse_distribution_kind(const std::string& s);
score_activation parse_score_activation(const std::string& s);
hardmax_gradient parse_hardmax_gradient(const std::string& s);
gaussian_form parse_gaussian_form(const std::string& s);
feature_map parse_feature_map(const std::string& s);

}  // namespace attn

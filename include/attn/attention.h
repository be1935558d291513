// attn/attention.h — scaled-dot-product attention with the semantics of the ONNX `Attention`
// operator (opsets 23/24) and PyTorch's `scaled_dot_product_attention`, forward and backward.
//
// Shape legend (used everywhere in attn):
//   B batch · Hq query heads · Hkv key/value heads (Hq % Hkv == 0) · Nq query length ·
//   Nk key length · D query/key head size · Dv value head size
//
// Layouts (any element strides, including transposed and broadcast views):
//   4-D  q [B, Hq, Nq, D]     k [B, Hkv, Nk, D]     v [B, Hkv, Nk, Dv]    out [B, Hq, Nq, Dv]
//   3-D  q [B, Nq, Hq*D]      k [B, Nk, Hkv*D]      v [B, Nk, Hkv*Dv]     out [B, Nq, Hq*Dv]
//        (3-D needs q_num_heads and kv_num_heads; the output takes the layout of q)
// Query head h reads key/value head h / (Hq / Hkv) (grouped-query; Hkv == 1 is multi-query).
//
// Per query row i of batch b and head h, with j over keys:
//   x_ij = scale · q_i·k_j                         scale defaults to 1/sqrt(D)
//   x_ij = softcap · tanh(x_ij / softcap)          when softcap > 0
//   s_ij = x_ij + mask_ij + alibi_ij               mask: float additive, or bool (false = -inf)
//   p_ij = exp(s_ij) / (Σ_j exp(s_ij) + exp(sink_h))        (the sink term only with sinks)
//   out_i = Σ_j p_ij v_j,   lse_i = log(Σ_j exp(s_ij) + exp(sink_h))
// Keys are excluded (s = -inf) by a false bool mask, by the causal frontier, by the sliding
// window and by nonpad_kv_seqlen. A row with no key left (fully masked) gives out = 0,
// lse = -inf, probabilities 0 and zero gradients — never NaN.
//
// Causal frontier and window: query row i sits at key position pos_i (see causal_alignment);
// key j is kept when  pos_i - window_left <= j <= pos_i + window_right  (a negative window
// side is unbounded) and, if is_causal, j <= pos_i.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/tensor.h"

namespace attn {

// Where query row i sits among the keys, for the causal frontier, windows and ALiBi.
enum class causal_alignment {
  top_left,      // pos_i = i                          (PyTorch is_causal)
  bottom_right,  // pos_i = Nk_b - Nq + i              (FlashAttention; Nk_b = valid keys of batch b)
  after_past,    // pos_i = P + i, P = past length     (ONNX with past_key; top_left without a past)
};

// Which intermediate [B, Hq, Nq, Nk] tensor to return (ONNX qk_matmul_output_mode).
enum class qk_output {
  none,
  scaled,         // scale · QKᵀ, before softcap
  softcapped,     // after softcap (== scaled without softcap)   ONNX modes 0 and 1
  biased,         // after the mask and ALiBi bias are added     ONNX mode 2
  probabilities,  // after softmax                               ONNX mode 3
};

// Which implementation runs. `automatic` picks the first eligible fast backend and falls back
// to the float64 reference; `explain_backend` says why a backend was not eligible.
// The environment variable ATTN_BACKEND (e.g. ATTN_BACKEND=reference) overrides `automatic`.
enum class backend { automatic, reference, cpu };

struct attention_options {
  std::optional<double> scale;  // default 1/sqrt(D)
  bool is_causal = false;
  causal_alignment alignment = causal_alignment::top_left;
  std::int64_t window_left = -1;   // keys before pos_i that stay visible; < 0: unbounded
  std::int64_t window_right = -1;  // keys after pos_i that stay visible; < 0: unbounded
  double softcap = 0.0;            // <= 0: off

  // bool (true = attend) or float (added to the scores), broadcast to [B, Hq, Nq, Nk] by
  // NumPy rules. A last dim shorter than Nk is padded with false / -inf (as ONNX does).
  std::optional<TensorView> attn_mask;
  // int64 [B]: keys j >= nonpad_kv_seqlen[b] are excluded (ONNX opset 24).
  std::optional<TensorView> nonpad_kv_seqlen;
  // [Hq] or [B, Hq]: bias -slope_h · |pos_i - j| added to the scores (ALiBi).
  std::optional<TensorView> alibi_slopes;
  // [Hq]: a per-head logit that joins the softmax denominator and carries no value.
  std::optional<TensorView> sinks;
  // KV cache: [B, Hkv, P, D] and [B, Hkv, P, Dv], concatenated in front of k and v; the
  // result then holds present_key / present_value ([B, Hkv, P + Nk, D|Dv], 4-D always).
  std::optional<TensorView> past_key;
  std::optional<TensorView> past_value;

  std::int64_t q_num_heads = 0;   // required for 3-D inputs; checked against 4-D ones
  std::int64_t kv_num_heads = 0;  // required for 3-D inputs; checked against 4-D ones

  qk_output return_qk = qk_output::none;
  backend use_backend = backend::automatic;
  int num_threads = 0;  // 0: all available
};

struct attention_result {
  Tensor out;            // layout of q, dtype of q
  Tensor lse;            // [B, Hq, Nq], float32 (float64 for float64 inputs); -inf on fully masked rows
  Tensor qk;             // [B, Hq, Nq, Nk] when return_qk != none, dtype of q
  Tensor present_key;    // with past_key: [B, Hkv, P + Nk, D]
  Tensor present_value;  // with past_value: [B, Hkv, P + Nk, Dv]
  std::string backend;   // name of the backend that ran
};

// Forward pass. q, k, v: f32, f16, bf16 or f64 (all the same dtype). f16/bf16 compute in f32
// (the reference computes in f64 and rounds once).
//
//   attn::attention_options opt;
//   opt.is_causal = true;
//   auto r = attn::attention(q, k, v, opt);   // r.out: [B, Hq, Nq, Dv], r.lse: [B, Hq, Nq]
attention_result attention(const TensorView& q, const TensorView& k, const TensorView& v,
                           const attention_options& options = {});

struct attention_grads {
  Tensor dq, dk, dv;   // shapes and layouts of q, k, v; dtype of q
  Tensor dattn_mask;   // float masks: gradient in the mask's own shape (broadcast dims summed)
  Tensor dalibi_slopes;  // shape of alibi_slopes
  Tensor dsinks;         // [Hq]
  std::string backend;
};

// Backward pass from the saved log-sum-exp. `out` and `lse` are what attention() returned for
// the same inputs and options; `dout` has the shape of out. k and v are the full key set
// (with a KV cache, pass present_key / present_value and leave past_* unset).
attention_grads attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& dout,
                                   const TensorView& lse, const attention_options& options = {});

// Which backend `attention` (or `attention_backward` when `backward`) would run, and for each
// backend tried before it, why it was not eligible:  "cpu: qk output needs the reference; ...".
std::string explain_backend(const TensorView& q, const TensorView& k, const TensorView& v,
                            const attention_options& options = {}, bool backward = false);

// The names of every backend compiled in, in the order `automatic` tries them.
std::vector<std::string> backends();

}  // namespace attn

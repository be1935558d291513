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
// side, or one of 2^62 or more such as INT64_MAX, is unbounded) and, if is_causal, j <= pos_i.
//
// Special values — one answer on every backend (cpu and reference give the same NaN/inf
// pattern and the same values within the dtype's tolerance; the family's core path and the
// positional ops that call attention inherit it):
//   - A key whose score s_ij is -inf (bool mask false, -inf float mask, or excluded by the
//     frontier, window or nonpad_kv_seqlen) is excluded: weight 0, its value never read.
//   - NaN or +inf among a row's kept scores (NaN or inf in q or k, +inf in a float mask):
//     softmax is undefined, so that row's out and lse are NaN, and so are its gradients.
//   - NaN or inf in v, or in dout, propagate as IEEE arithmetic does through the kept keys.
//   - Overflow: the fast backends compute in float32 (f16/bf16 inputs widened exactly); a row
//     they leave non-finite, or with every kept score overflowed to -inf, is computed again in
//     float64 by the reference, so logits beyond float range (q, k ~ 1e19) get the float64
//     answer everywhere; likewise a backward with a non-finite gradient, and a backward with
//     some |lse| > 1024 (float32 s - lse would cost p its precision) or with q·k terms past
//     1024 (scale·max|q_i|·max|k_j| > 1024, Euclidean norms of rows: terms that large may cancel
//     into a small score that float32 resolves no better), run on the reference, the latter two
//     with the lse computed again from float64 scores (the given lse may come from a forward
//     whose scores differ by more than p's range, see the next item).
//   - Finite but huge scores: float32 resolves s to |s|·2^-24, so past |s| ~ 1e3 the cpu's
//     weights of nearly tied keys may differ from float64's (the backward then runs on the
//     reference, see above; the forward does not). The same holds for huge terms that cancel
//     into a small score (a float mask of 1e19 against an ALiBi bias of -1e19): s is resolved
//     to the largest term's magnitude·2^-24 (float64: ·2^-53), and backends may add the terms
//     in different orders.
//   - Float masks are shift-invariant per row: rows beyond ±1024 whose finite values lie
//     within 2^20 of each other are shifted to a maximum of 0 before use, so -1e30 everywhere
//     equals no mask (lse = no-mask lse - 1e30). With lengths per batch entry (nonpad_kv_seqlen,
//     an in-place cache) a row's values are taken over the keys its entry has, so padding
//     columns past them (0 in an HF padding mask) do not hold a row of finfo.min unshifted.
//   - scale and softcap must be 0 or normal float32 magnitudes ([1.2e-38, 3.4e38]); others
//     are refused (float32 would read 1e-46 as 0). Fully masked rows: out 0, lse -inf.
//   - Denormals: the cpu backend's float32 kernels (and the family's fused kernels) run with
//     denormals flushed to zero (x86 FTZ/DAZ, set for the call on each of its threads and put
//     back after): inputs, products and results below 2^-126 (1.2e-38) in magnitude are 0 there,
//     where the reference keeps them — a difference of at most 2^-126 per term, far inside the
//     tolerance. ATTN_CPU_DENORMALS=keep keeps them (at a microcode assist each on Intel cores).
//   - masking_options::check_finite turns any NaN/inf input into an attn::error naming the
//     tensor and index. Precision of the cpu float32 backward against float64:
//     |error| <= 4e-6 · (1 + max|lse|) · G, G = max(max|gradient|, scale·max|dout|·max|v|·
//     max(|q|, |k|)·Dv) (the difference dp - Δ in ds cancels; tests/core/special_values_test.cc);
//     for dv = Pᵀ dout, G also covers Σ_i p_ij |dout_i| (dout rows of ±1e19 that cancel into a
//     small dv are resolved to that sum's magnitude, as out is to Σ_j α_j |v_j|).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attn/execution.h"
#include "attn/tensor.h"

namespace attn {

// Where query row i sits among the keys, for the causal frontier, windows and ALiBi.
enum class causal_alignment {
  top_left,      // pos_i = i                          (PyTorch is_causal)
  bottom_right,  // pos_i = Nk_b - Nq + i              (FlashAttention; Nk_b = valid keys of batch b)
  after_past,    // pos_i = P_b + i, P_b = past length (ONNX with past_key; a KV cache's length of
                 //                                     batch entry b; top_left without a past)
};

// Which intermediate [B, Hq, Nq, Nk] tensor to return (ONNX qk_matmul_output_mode).
enum class qk_output {
  none,
  scaled,         // scale · QKᵀ, before softcap
  softcapped,     // after softcap (== scaled without softcap)   ONNX modes 0 and 1
  biased,         // after the mask and ALiBi bias are added     ONNX mode 2
  probabilities,  // after softmax                               ONNX mode 3
};

// What a query row may see: shared by attn::attention and attn::attention_family, so masks,
// causal alignment, windows, padding and the 3-D head split mean the same in both.
struct masking_options {
  bool is_causal = false;
  causal_alignment alignment = causal_alignment::top_left;
  std::int64_t window_left = -1;   // keys before pos_i that stay visible; < 0: unbounded
  std::int64_t window_right = -1;  // keys after pos_i that stay visible; < 0: unbounded

  // bool (true = attend) or float (added to the scores), broadcast to [B, Hq, Nq, Nk] by
  // NumPy rules. A last dim shorter than Nk is padded with false / -inf (as ONNX does).
  std::optional<TensorArg> attn_mask;
  // int64 (ONNX opset 24) or int32 [B]: keys j >= nonpad_kv_seqlen[b] are excluded.
  std::optional<TensorArg> nonpad_kv_seqlen;

  std::int64_t q_num_heads = 0;   // required for 3-D inputs; checked against 4-D ones
  std::int64_t kv_num_heads = 0;  // required for 3-D inputs; checked against 4-D ones

  // Opt-in: throw attn::error naming the tensor and index of the first NaN or ±inf in q, k, v
  // (and in out, dout, lse for the backward), or of a NaN or +inf in a float attn_mask (-inf
  // there excludes a key). Costs one pass over the inputs; off, special values follow the
  // contract above.
  bool check_finite = false;
};

// The maths of one attention call. How it runs (backend, threads) is `execution`
// (execution.h), a separate argument. Tensor fields are TensorArg: filling one from a
// temporary Tensor keeps that Tensor alive.
struct attention_options : masking_options {
  std::optional<double> scale;  // default 1/sqrt(D)
  double softcap = 0.0;         // <= 0: off
  // [Hq] or [B, Hq]: bias -slope_h · |pos_i - j| added to the scores (ALiBi).
  std::optional<TensorArg> alibi_slopes;
  // [Hq]: a per-head logit that joins the softmax denominator and carries no value.
  std::optional<TensorArg> sinks;

  // ONNX KV cache: [B, Hkv, P, D] and [B, Hkv, P, Dv] in front of k and v; the result then
  // holds present_key / present_value ([B, Hkv, P + Nk, D|Dv], 4-D always), a new tensor as
  // ONNX defines it. To decode without copying the cache, use attention_with_kv_cache.
  std::optional<TensorArg> past_key;
  std::optional<TensorArg> past_value;

  // An intermediate [B, Hq, Nq, Nk] to return (an output request; runs on the reference).
  qk_output return_qk = qk_output::none;

  // attention_backward with a float attn_mask: return its gradient (dattn_mask). False skips it
  // (a padding or causal mask given as floats, a bias that is not trained): no accumulator of the
  // mask's size, and the cpu backend keeps its fused schedule where a mask shared by batch
  // entries or kv heads would have made it take two passes. The forward ignores it.
  bool mask_gradient = true;
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
                           const attention_options& options = {}, const execution& exec = {});

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
                                   const TensorView& lse, const attention_options& options = {},
                                   const execution& exec = {});

// Outputs in the caller's memory (an engine's arena, a framework's caching allocator, a slice of
// a larger buffer): the call allocates none of them, so it pays no page faults of fresh memory
// (measured on a Zen 5: 5 % of a large float32 backward, 3 % of a forward; docs/PERFORMANCE.md).
//   out  the shape attention() returns ([B, Hq, Nq, Dv], or [B, Nq, Hq·Dv] for 3-D q), the dtype
//        of q, any strides; every element is written.
//   lse  optional: [B, Hq, Nq], float32 (float64 for float64 inputs), any strides.
// Neither may overlap itself, the other, q, k, v or attn_mask (attn::error names which; slices of
// one buffer that interleave without sharing an element are accepted).
//
//   attn::attention_into(q, k, v, {.out = o_slice, .lse = lse_buf}, opt);
struct attention_outputs {
  TensorView out = {};
  std::optional<TensorView> lse = std::nullopt;
};

// attention() writing into dst; returns the name of the backend that ran. past_key/past_value
// (whose present is a new tensor) and return_qk are refused: attention() serves those.
std::string attention_into(const TensorView& q, const TensorView& k, const TensorView& v, const attention_outputs& dst,
                           const attention_options& options = {}, const execution& exec = {});

// The gradients of q, k and v in the caller's memory: the shapes of q, k, v, the dtype of q —
// or float32 for a bfloat16 or float16 q, each on its own (on the cpu and reference backends the
// gradients before their rounding, as a mixed-precision trainer keeps them — the values the
// 16-bit ones are rounded from; the CUDA kernels' 16-bit gradients widened) —,
// any strides; every element is written (not added to). None may overlap itself, another, or an
// input (q, k, v, out, dout, lse, attn_mask); dq, dk, dv interleaved in one packed buffer are fine.
struct attention_grad_outputs {
  TensorView dq = {}, dk = {}, dv = {};
};

// attention_backward() writing dq, dk and dv into dst. Returns what attention_backward returns
// besides them (dattn_mask, dalibi_slopes, dsinks, backend); its dq, dk, dv are left empty.
attention_grads attention_backward_into(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                                        const attention_grad_outputs& dst, const attention_options& options = {},
                                        const execution& exec = {});

// In-place KV cache, as FlashAttention's flash_attn_with_kvcache: preallocated buffers with
// room for `capacity` tokens and the number of tokens each batch entry holds.
//   key [B, Hkv, capacity, D]   value [B, Hkv, capacity, Dv]   lengths int64 or int32 [B]
// key/value have the dtype of q and any strides (unit stride on the last dim reads fastest).
struct kv_cache_view {
  TensorArg key, value, lengths;
};

// One decoding (or chunked-prefill) step. For each batch entry b with L_b = lengths[b]:
//   1. k_new / v_new ([B, Hkv, Nnew, D|Dv], or 3-D [B, Nnew, Hkv*D|Dv]) are written into rows
//      [L_b, L_b + Nnew) of the cache — only those rows are written;
//   2. q attends to keys [0, L_b + Nnew) of the cache, read in place (no copy of the cache).
// Query row i sits at key position L_b + i with causal_alignment::after_past (the new tokens
// follow the cache), or L_b + Nnew - Nq + i with bottom_right; top_left keeps pos_i = i.
// `lengths` is not changed: the caller advances it by Nnew (kv_cache below does). Needs
// L_b + Nnew <= capacity. past_key/past_value and nonpad_kv_seqlen are refused (the cache's
// lengths say which keys are valid).
//
//   attn::kv_cache_view c{k_buf, v_buf, lens};        // k_buf [B, Hkv, 4096, D], lens int64 [B]
//   opt.is_causal = true, opt.alignment = attn::causal_alignment::after_past;
//   auto r = attn::attention_with_kv_cache(q, k_step, v_step, c, opt);   // then lens += 1
attention_result attention_with_kv_cache(const TensorView& q, const TensorView& k_new, const TensorView& v_new,
                                         const kv_cache_view& cache, const attention_options& options = {},
                                         const execution& exec = {});

// An owning KV cache: zeroed buffers of a fixed capacity and per-batch lengths that
// attention_with_kv_cache(q, k, v, cache, ...) advances after each step.
//
//   attn::kv_cache cache(B, Hkv, /*capacity=*/4096, D, Dv, attn::dtype::bf16);
//   for (...) r = attn::attention_with_kv_cache(q_t, k_t, v_t, cache, opt);
class kv_cache {
 public:
  kv_cache(std::int64_t B, std::int64_t Hkv, std::int64_t capacity, std::int64_t D, std::int64_t Dv, dtype t);

  const Tensor& key() const { return key_; }          // [B, Hkv, capacity, D]
  const Tensor& value() const { return value_; }      // [B, Hkv, capacity, Dv]
  const Tensor& lengths() const { return lengths_; }  // int64 [B]
  std::int64_t capacity() const { return key_.size(2); }
  kv_cache_view view() const { return {key_, value_, lengths_}; }

  // Adds n to every batch entry's length (throws when that passes the capacity); clear() empties.
  void advance(std::int64_t n);
  void clear();

 private:
  Tensor key_, value_, lengths_;
};

// As above, then advances the cache by Nnew.
attention_result attention_with_kv_cache(const TensorView& q, const TensorView& k_new, const TensorView& v_new,
                                         kv_cache& cache, const attention_options& options = {},
                                         const execution& exec = {});

// Which backend `attention` (or `attention_backward` when `backward`) runs, with the same
// selection the call makes (ATTN_BACKEND included), the path it takes inside that backend, and
// for each backend tried before it why it was not eligible:
//   "cpu: float64 inputs need the reference; runs on reference"    "runs on cpu (prefill, f32)"
// With `backward`, a float attn_mask counts as asking for its gradient (unless
// options.mask_gradient is false).
std::string explain_backend(const TensorView& q, const TensorView& k, const TensorView& v,
                            const attention_options& options = {}, bool backward = false,
                            const execution& exec = {});

}  // namespace attn

// attn/nn/multihead.h — multi-head attention with learned projections (Vaswani et al. 2017),
// forward and backward, on attn::attention (so on its fused kernels).
//
//   q = query W_Qᵀ + b_Q      [B, Nq, Hq·D]      query [B, Nq, E]
//   k = key   W_Kᵀ + b_K      [B, Nk, Hkv·D]     key   [B, Nk, kdim]
//   v = value W_Vᵀ + b_V      [B, Nk, Hkv·Dv]    value [B, Nk, vdim]
//   (optional rotary embedding of q and k, per head, at positions 0..N-1)
//   o = attention(q, k, v)    [B, Nq, Hq·Dv]     head h reads key/value head h / (Hq / Hkv)
//   y = o W_Oᵀ + b_O          [B, Nq, E]
// Hkv = Hq is multi-head, 1 < Hkv < Hq grouped-query, Hkv = 1 multi-query attention.
//
// Masks are attn::masking_options (attention.h): is_causal with an alignment, sliding windows,
// a bool or float attn_mask broadcast to [B, Hq, Nq, Nk] (a graph's adjacency, a key-padding
// mask as [B, 1, 1, Nk]), and nonpad_kv_seqlen (int64 [B]: the valid keys of each sequence).
// q_num_heads / kv_num_heads are filled in by the layer.
//
//   attn::nn::mha_config c{.embed_dim = 256, .num_heads = 8, .num_kv_heads = 2};
//   attn::nn::MultiHeadAttention mha(c, gen);
//   attn::masking_options m;
//   m.is_causal = true;
//   attn::nn::MultiHeadAttention::saved s;
//   attn::Tensor y = mha.forward(x, x, x, m, &s).out;         // self-attention
//   auto g = mha.backward(s, dy);                             // dx = g.dquery + g.dkey + g.dvalue
//
// Incremental decoding: `forward_cached` appends the new tokens' keys and values to an
// attn::kv_cache and attends to everything cached; its outputs equal the full causal forward.
#pragma once

#include <cstdint>

#include "attn/attention.h"
#include "attn/nn/linear.h"
#include "attn/positional.h"

namespace attn::nn {

struct mha_config {
  std::int64_t embed_dim = 0;       // E: the query input's size and the output's
  std::int64_t num_heads = 1;       // Hq
  std::int64_t num_kv_heads = 0;    // Hkv, dividing Hq (0: Hkv = Hq)
  std::int64_t kdim = 0;            // key input size (0: E)
  std::int64_t vdim = 0;            // value input size (0: E)
  std::int64_t head_dim = 0;        // D (0: E / Hq)
  std::int64_t value_head_dim = 0;  // Dv (0: D)
  bool bias = true;                 // b_Q, b_K, b_V, b_O
  bool rotary = false;              // rotate q and k (rotary_options below; num_heads is set by the layer)
  rotary_options rotary_opts{};
  std::optional<double> scale{};    // default 1/sqrt(D)
};

struct MultiHeadAttention {
  Linear q_proj, k_proj, v_proj, out_proj;
  mha_config config;  // with every 0 resolved

  MultiHeadAttention() = default;
  // Projections as PyTorch's nn.MultiheadAttention: Xavier-uniform weights, zero biases.
  MultiHeadAttention(const mha_config& c, rng& gen, dtype t = dtype::f32);

  struct saved {
    Tensor query, key, value;  // the inputs
    Tensor q, k, v;            // projected (and rotated) [B, N, H·D]
    Tensor o, lse;             // attention output [B, Nq, Hq·Dv] and its log-sum-exp
    attention_options opt;     // the masks as the call saw them
  };
  struct result {
    Tensor out;      // [B, Nq, E]
    Tensor weights;  // [B, Hq, Nq, Nk] attention probabilities, when asked for
  };
  struct grads {
    Tensor dquery, dkey, dvalue;  // shapes of the inputs (self-attention: sum all three)
  };

  // need_weights also returns the probabilities [B, H, Nq, Nk] (return_qk: from the same backend
  // as the output, after its forward; an extra O(Nq·Nk) tensor, so for looking, not for speed).
  result forward(const Tensor& query, const Tensor& key, const Tensor& value, const masking_options& mask = {},
                 saved* s = nullptr, bool need_weights = false) const;
  // Accumulates every parameter gradient; returns the gradients of the three inputs.
  grads backward(const saved& s, const Tensor& dy);

  // A cache for `forward_cached`: [B, Hkv, capacity, D] keys and [B, Hkv, capacity, Dv] values.
  kv_cache make_cache(std::int64_t B, std::int64_t capacity) const;
  // Self-attention over new tokens x [B, Nnew, E] at positions L_b .. L_b + Nnew − 1 (L_b the
  // cached length): their keys and values (rotated at those positions) join the cache, which
  // then advances by Nnew; query i attends to cached keys 0 .. L_b + i when mask.is_causal (the
  // alignment is set to after_past), to all of them otherwise. Inference only (no backward).
  Tensor forward_cached(const Tensor& x, kv_cache& cache, masking_options mask = {}) const;

  // Cross-attention against a fixed memory (an encoder's output) during decoding: project the
  // memory once, then attend to it at every step. No rotary on this path.
  struct projected_kv {
    Tensor k, v;  // [B, Nk, Hkv·D], [B, Nk, Hkv·Dv]
  };
  projected_kv project_kv(const Tensor& key, const Tensor& value) const;
  Tensor forward_projected(const Tensor& query, const projected_kv& kv, const masking_options& mask = {}) const;

  void parameters(parameter_list& list, const std::string& prefix = "");
};

}  // namespace attn::nn

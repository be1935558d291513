// attn/nn/transformer.h — Transformer encoder and decoder layers (Vaswani et al. 2017), post-norm
// as in the paper or pre-norm (Xiong et al. 2020), forward and backward, and step-by-step
// decoding through a KV cache.
//
//   FeedForward        FF(x) = fc2(act(fc1(x)))                     x [B, N, E], fc1 E → F, fc2 F → E
//   Residual           post-norm: y = LN(x + drop(f(x)))   pre-norm: y = x + drop(f(LN(x)))
//   Encoder layer      x → Residual(self-attention) → Residual(FF)
//   Decoder layer      x → Residual(causal self-attention) → Residual(cross-attention to the
//                      memory, an encoder's output) → Residual(FF)
// Dropout (p = 0 by default) acts on each sublayer's output; set `training = false` (or
// set_training) for evaluation.
//
//   attn::nn::transformer_config c{.d_model = 128, .num_heads = 4, .d_ff = 512, .pre_norm = true};
//   attn::nn::TransformerEncoderLayer enc(c, gen);
//   attn::nn::TransformerEncoderLayer::saved s;
//   attn::Tensor h = enc.forward(x, mask, &s);
//   attn::Tensor dx = enc.backward(s, dh);
#pragma once

#include <cstdint>
#include <functional>

#include "attn/nn/activation.h"
#include "attn/nn/dropout.h"
#include "attn/nn/multihead.h"
#include "attn/nn/norm.h"

namespace attn::nn {

struct transformer_config {
  std::int64_t d_model = 0;       // E
  std::int64_t num_heads = 1;     // Hq
  std::int64_t num_kv_heads = 0;  // Hkv (0: Hq)
  std::int64_t d_ff = 0;          // F (0: 4E)
  activation act = activation::relu;
  bool pre_norm = false;
  double dropout = 0.0;
  std::uint64_t seed = 0;         // of the dropout masks
  double eps = 1e-5;              // LayerNorm
  bool rotary = false;            // rotary positions in self-attention
};

struct FeedForward {
  Linear fc1, fc2;
  activation act = activation::relu;

  FeedForward() = default;
  FeedForward(std::int64_t E, std::int64_t F, activation a, rng& gen, dtype t = dtype::f32);

  struct saved {
    Tensor x, h;  // input, fc1 output (before the activation)
  };
  Tensor forward(const Tensor& x, saved* s) const;
  Tensor backward(const saved& s, const Tensor& dy);
  void parameters(parameter_list& list, const std::string& prefix = "");
};

// A sublayer f with its LayerNorm, dropout and skip connection.
struct Residual {
  LayerNorm norm;
  Dropout drop;
  bool pre_norm = false;

  struct saved {
    Tensor x;     // the block's input
    Tensor norm_in;  // what the LayerNorm saw: x (pre-norm) or x + drop(f(x)) (post-norm)
    Tensor mask;  // dropout
  };
  using sublayer = std::function<Tensor(const Tensor&)>;
  Tensor forward(const Tensor& x, const sublayer& f, saved* s);
  // f_backward maps d f(u) to d u (and accumulates f's parameter gradients).
  Tensor backward(const saved& s, const Tensor& dy, const sublayer& f_backward);
  void parameters(parameter_list& list, const std::string& prefix = "");
};

struct TransformerEncoderLayer {
  MultiHeadAttention self_attn;
  FeedForward ff;
  Residual attn_block, ff_block;

  TransformerEncoderLayer() = default;
  TransformerEncoderLayer(const transformer_config& c, rng& gen, dtype t = dtype::f32);

  struct saved {
    MultiHeadAttention::saved attn;
    FeedForward::saved ff;
    Residual::saved attn_block, ff_block;
  };
  // x [B, N, E]; mask for the self-attention (key padding, ...).
  Tensor forward(const Tensor& x, const masking_options& mask = {}, saved* s = nullptr);
  Tensor backward(const saved& s, const Tensor& dy);
  void set_training(bool on);
  void parameters(parameter_list& list, const std::string& prefix = "");
};

struct TransformerDecoderLayer {
  MultiHeadAttention self_attn, cross_attn;
  FeedForward ff;
  Residual self_block, cross_block, ff_block;

  TransformerDecoderLayer() = default;
  TransformerDecoderLayer(const transformer_config& c, rng& gen, dtype t = dtype::f32);

  struct saved {
    MultiHeadAttention::saved self, cross;
    FeedForward::saved ff;
    Residual::saved self_block, cross_block, ff_block;
  };
  struct grads {
    Tensor dx, dmemory;
  };
  // x [B, N, E] (self-attention is causal), memory [B, M, E]; memory_mask masks the memory's
  // keys (its padding as nonpad_kv_seqlen).
  Tensor forward(const Tensor& x, const Tensor& memory, const masking_options& memory_mask = {}, saved* s = nullptr);
  grads backward(const saved& s, const Tensor& dy);

  // Decoding: new tokens x [B, n, E] against a self-attention cache (self_attn.make_cache) and
  // the memory projected once (cross_attn.project_kv). Equals the rows of `forward` (eval mode).
  Tensor forward_step(const Tensor& x, kv_cache& cache, const MultiHeadAttention::projected_kv& memory,
                      const masking_options& memory_mask = {});
  void set_training(bool on);
  void parameters(parameter_list& list, const std::string& prefix = "");
};

}  // namespace attn::nn

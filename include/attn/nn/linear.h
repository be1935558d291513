// attn/nn/linear.h — the Linear layer: y = x Wᵀ + b on attn::linear (OpenBLAS or the float64
// reference, see attn/linear.h).
//
//   x [..., in]   weight [out, in]   bias [out] (optional)   y [..., out]
//
//   attn::nn::rng gen(1);
//   attn::nn::Linear proj(512, 1536, gen);            // in 512, out 1536, with bias, float32
//   attn::Tensor y = proj.forward(x);                 // x [B, N, 512] -> y [B, N, 1536]
//   attn::Tensor dx = proj.backward(x, dy);           // dweight += dyᵀ x, dbias += Σ dy
#pragma once

#include <cstdint>

#include "attn/nn/init.h"
#include "attn/nn/parameter.h"
#include "attn/tensor.h"

namespace attn::nn {

struct Linear {
  Tensor weight, bias;    // [out, in], [out] (undefined without bias)
  Tensor dweight, dbias;  // gradients, accumulated by backward

  Linear() = default;
  // PyTorch's initialisation: weight and bias U(-1/sqrt(in), 1/sqrt(in)).
  Linear(std::int64_t in, std::int64_t out, rng& gen, bool with_bias = true, dtype t = dtype::f32);

  std::int64_t in_features() const { return weight.size(1); }
  std::int64_t out_features() const { return weight.size(0); }

  // y = x Wᵀ + b.
  Tensor forward(const Tensor& x) const;
  // From the forward's x and dy [..., out]: dweight += dyᵀ x, dbias += Σ dy; returns dx = dy W
  // (undefined when !need_dx, which saves a GEMM for a first layer).
  Tensor backward(const Tensor& x, const Tensor& dy, bool need_dx = true);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

// One Linear whose output is the outputs of `parts` side by side: weights stacked by rows,
// biases concatenated (all parts have a bias or none do; same in_features and dtype). One GEMM
// over an input instead of one per part — W_Q, W_K, W_V of self-attention. A copy: it does not
// follow later changes of the parts.
//   nn::Linear qkv = nn::stacked({&q_proj, &k_proj, &v_proj});   // y [..., 3E]
Linear stacked(std::initializer_list<const Linear*> parts);

}  // namespace attn::nn

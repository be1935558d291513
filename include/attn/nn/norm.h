// attn/nn/norm.h — normalisation over the last dim, forward and backward.
//
//   LayerNorm (Ba et al. 2016):  y = (x − μ) / sqrt(σ² + eps) · weight + bias
//   RMSNorm (Zhang & Sennrich 2019): y = x / sqrt(mean(x²) + eps) · weight
//   x [..., C]   weight [C] (ones)   bias [C] (zeros)   y [..., C]
// μ and σ² (biased) are taken over the C features of each row. Backward recomputes them from x
// (O(C) a row, beside the GEMMs around it), so it needs only the forward's input.
//
//   attn::nn::LayerNorm ln(512);
//   attn::Tensor y = ln.forward(x);
//   attn::Tensor dx = ln.backward(x, dy);      // dweight += Σ dy ∘ x̂, dbias += Σ dy
#pragma once

#include <cstdint>

#include "attn/nn/parameter.h"
#include "attn/tensor.h"

namespace attn::nn {

struct LayerNorm {
  Tensor weight, bias, dweight, dbias;  // [C]
  double eps = 1e-5;

  LayerNorm() = default;
  explicit LayerNorm(std::int64_t C, dtype t = dtype::f32, double eps = 1e-5);

  Tensor forward(const Tensor& x) const;
  // LayerNorm(x + residual), the post-norm residual step, in one pass over the rows (float32).
  Tensor forward(const Tensor& x, const Tensor& residual) const;
  Tensor backward(const Tensor& x, const Tensor& dy);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

struct RMSNorm {
  Tensor weight, dweight;  // [C]
  double eps = 1e-6;

  RMSNorm() = default;
  explicit RMSNorm(std::int64_t C, dtype t = dtype::f32, double eps = 1e-6);

  Tensor forward(const Tensor& x) const;
  Tensor backward(const Tensor& x, const Tensor& dy);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

}  // namespace attn::nn

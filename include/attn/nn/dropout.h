// attn/nn/dropout.h — inverted dropout (Srivastava et al. 2014), seeded.
//
// Training: each element is kept with probability 1 − p and scaled by 1 / (1 − p), zeroed
// otherwise, so E[y] = x. Evaluation (training = false) or p = 0: the identity. The keep/scale
// factors of one call are returned in `mask` (dtype of x), which the backward multiplies in.
//
//   attn::nn::Dropout drop(0.1, /*seed=*/7);
//   attn::Tensor mask;
//   attn::Tensor y = drop.forward(x, mask);
//   attn::Tensor dx = attn::nn::Dropout::backward(mask, dy);
//   drop.training = false;   // inference: y = x, mask undefined
#pragma once

#include <cstdint>

#include "attn/nn/init.h"
#include "attn/tensor.h"

namespace attn::nn {

struct Dropout {
  double p = 0.0;  // in [0, 1)
  bool training = true;
  rng gen;

  Dropout() = default;
  Dropout(double p, std::uint64_t seed);

  // y = x ∘ mask; mask is left undefined when the call is the identity.
  Tensor forward(const Tensor& x, Tensor& mask);
  // dx = dy ∘ mask (dy itself when mask is undefined).
  static Tensor backward(const Tensor& mask, const Tensor& dy);
};

}  // namespace attn::nn

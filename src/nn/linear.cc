// src/nn/linear.cc — the Linear layer on attn::linear.
#include "attn/nn/linear.h"

#include <cmath>

#include "attn/linear.h"
#include "nn/nn_impl.h"

namespace attn::nn {

Linear::Linear(std::int64_t in, std::int64_t out, rng& gen, bool with_bias, dtype t) {
  if (in < 0 || out < 0) detail::fail("Linear", fmt::format("in = {}, out = {} must be >= 0", in, out));
  if (t != dtype::f32 && t != dtype::f64) detail::fail("Linear", fmt::format("dtype {} must be float32 or float64", dtype_name(t)));
  const double a = 1.0 / std::sqrt(double(std::max<std::int64_t>(in, 1)));
  weight = Tensor::empty({out, in}, t);
  fill_uniform(weight, -a, a, gen);
  dweight = zeros_like(weight);
  if (with_bias) {
    bias = Tensor::empty({out}, t);
    fill_uniform(bias, -a, a, gen);
    dbias = zeros_like(bias);
  }
}

Tensor Linear::forward(const Tensor& x) const {
  if (bias.defined()) return linear(x, weight, bias.view());
  return linear(x, weight);
}

// y = x Wᵀ + b  →  dx = dy W, dW += dyᵀ x, db += Σ dy
Tensor Linear::backward(const Tensor& x, const Tensor& dy, bool need_dx) {
  const linear_grads g = linear_backward(x, weight, dy, {.dx = need_dx, .dW = true, .db = bias.defined()});
  detail::accumulate(dweight, g.dW);
  if (bias.defined()) detail::accumulate(dbias, g.db);
  return g.dx;
}

void Linear::parameters(parameter_list& list, const std::string& prefix) {
  add_parameter(list, prefix, "weight", weight, dweight);
  if (bias.defined()) add_parameter(list, prefix, "bias", bias, dbias);
}

}  // namespace attn::nn

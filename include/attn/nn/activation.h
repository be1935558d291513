// attn/nn/activation.h — elementwise activations and the residual add, forward and backward.
//
//   relu       max(x, 0)                               (derivative 0 at x = 0)
//   gelu       x Φ(x) = x · (1 + erf(x / √2)) / 2        (exact, PyTorch's default)
//   gelu_tanh  x · (1 + tanh(√(2/π) (x + 0.044715 x³))) / 2   (GPT-2's approximation)
//   tanh       tanh(x)
//   sigmoid    1 / (1 + e^−x)
// Every function takes float32 or float64 tensors of any shape and returns a new tensor of the
// same shape and dtype. Backward takes the forward's input x and dy.
//
//   attn::Tensor h = attn::nn::activate(attn::nn::activation::gelu, x);
//   attn::Tensor dx = attn::nn::activate_backward(attn::nn::activation::gelu, x, dh);
#pragma once

#include <string>

#include "attn/tensor.h"

namespace attn::nn {

enum class activation { relu, gelu, gelu_tanh, tanh, sigmoid };

std::string to_string(activation a);

Tensor activate(activation a, const Tensor& x);
Tensor activate_backward(activation a, const Tensor& x, const Tensor& dy);

// The residual connection y = a + b (same shape and dtype). Its backward sends dy unchanged to
// both branches: da = dy, db = dy.
Tensor add(const Tensor& a, const Tensor& b);
// acc += x in place (same shape and dtype): how gradients from several consumers are summed.
void add_into(const Tensor& acc, const Tensor& x);

}  // namespace attn::nn

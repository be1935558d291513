// src/nn/activation.cc — elementwise activations (computed in double per element; the float32
// exact-erf GELU in the SIMD row kernel of src/cpu/rowwise.h) and the residual add.
#include "attn/nn/activation.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "cpu/rowwise.h"
#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

constexpr double kSqrt2OverPi = 0.7978845608028654;  // √(2/π)
constexpr double kInvSqrt2 = 0.7071067811865476;     // 1/√2

double forward_one(activation a, double x) {
  switch (a) {
    case activation::relu: return x > 0 ? x : 0.0;
    case activation::gelu: return 0.5 * x * (1.0 + std::erf(x * kInvSqrt2));
    case activation::gelu_tanh: return 0.5 * x * (1.0 + std::tanh(kSqrt2OverPi * (x + 0.044715 * x * x * x)));
    case activation::tanh: return std::tanh(x);
    case activation::sigmoid: return 1.0 / (1.0 + std::exp(-x));
  }
  return 0.0;
}

// d activation / dx at x.
double derivative(activation a, double x) {
  switch (a) {
    case activation::relu: return x > 0 ? 1.0 : 0.0;
    case activation::gelu: {  // Φ(x) + x φ(x)
      const double cdf = 0.5 * (1.0 + std::erf(x * kInvSqrt2));
      const double pdf = std::exp(-0.5 * x * x) * 0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2;
      return cdf + x * pdf;
    }
    case activation::gelu_tanh: {  // u = √(2/π)(x + 0.044715x³): ½(1 + tanh u) + ½x(1 − tanh²u) u'
      const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x), t = std::tanh(u);
      return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * kSqrt2OverPi * (1.0 + 3 * 0.044715 * x * x);
    }
    case activation::tanh: {
      const double t = std::tanh(x);
      return 1.0 - t * t;
    }
    case activation::sigmoid: {
      const double s = 1.0 / (1.0 + std::exp(-x));
      return s * (1.0 - s);
    }
  }
  return 0.0;
}

void check_pair(const char* op, const char* a_name, const Tensor& a, const char* b_name, const Tensor& b) {
  detail::check_compute_dtype(op, a_name, a);
  detail::check_dtype(op, b_name, b, a.type());
  detail::check_shape(op, b_name, b, a.shape());
}

}  // namespace

std::string to_string(activation a) {
  switch (a) {
    case activation::relu: return "relu";
    case activation::gelu: return "gelu";
    case activation::gelu_tanh: return "gelu_tanh";
    case activation::tanh: return "tanh";
    case activation::sigmoid: return "sigmoid";
  }
  return "?";
}

Tensor activate(activation a, const Tensor& x) {
  detail::check_compute_dtype("activate", "x", x);
  Tensor y = Tensor::empty(x.shape(), x.type());
  if (a == activation::gelu && x.type() == dtype::f32) {
    const auto& k = attn::detail::cpu::select_rowwise();
    const float* xp = detail::ptr<float>(x);
    float* yp = detail::ptr<float>(y);
    constexpr std::int64_t kChunk = 1 << 15;  // elements per task
    const std::int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (chunks > 1)
    for (std::int64_t c = 0; c < chunks; ++c) k.gelu(xp + c * kChunk, yp + c * kChunk, std::min(kChunk, n - c * kChunk));
    return y;
  }
  detail::with_type(x.type(), [&](auto zero) {
    using T = decltype(zero);
    const T* xp = detail::ptr<T>(x);
    T* yp = detail::ptr<T>(y);
    for (std::int64_t i = 0; i < x.numel(); ++i) yp[i] = T(forward_one(a, xp[i]));
  });
  return y;
}

// dx = dy ∘ f'(x)
Tensor activate_backward(activation a, const Tensor& x, const Tensor& dy) {
  check_pair("activate_backward", "x", x, "dy", dy);
  Tensor dx = Tensor::empty(x.shape(), x.type());
  detail::with_type(x.type(), [&](auto zero) {
    using T = decltype(zero);
    const T *xp = detail::ptr<T>(x), *g = detail::ptr<T>(dy);
    T* d = detail::ptr<T>(dx);
    for (std::int64_t i = 0; i < x.numel(); ++i) d[i] = T(g[i] * derivative(a, xp[i]));
  });
  return dx;
}

Tensor add(const Tensor& a, const Tensor& b) {
  check_pair("add", "a", a, "b", b);
  Tensor y = Tensor::copy_of(a);
  detail::accumulate(y, b);
  return y;
}

void add_into(const Tensor& acc, const Tensor& x) {
  check_pair("add_into", "acc", acc, "x", x);
  detail::accumulate(acc, x);
}

}  // namespace attn::nn

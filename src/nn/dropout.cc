// src/nn/dropout.cc — inverted dropout with a seeded generator.
#include "attn/nn/dropout.h"

#include "nn/nn_impl.h"

namespace attn::nn {

Dropout::Dropout(double p_, std::uint64_t seed) : p(p_), gen(seed) {
  if (!(p >= 0.0 && p < 1.0)) detail::fail("Dropout", fmt::format("p = {} must be in [0, 1)", p));
}

Tensor Dropout::forward(const Tensor& x, Tensor& mask) {
  detail::check_compute_dtype("Dropout", "x", x);
  if (!(p >= 0.0 && p < 1.0)) detail::fail("Dropout", fmt::format("p = {} must be in [0, 1)", p));
  mask = Tensor();
  if (!training || p == 0.0) return x;
  mask = Tensor::empty(x.shape(), x.type());
  Tensor y = Tensor::empty(x.shape(), x.type());
  const double keep = 1.0 / (1.0 - p);
  detail::with_type(x.type(), [&](auto zero) {
    using T = decltype(zero);
    const T* xp = detail::ptr<T>(x);
    T *m = detail::ptr<T>(mask), *yp = detail::ptr<T>(y);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      m[i] = gen.uniform() < p ? T(0) : T(keep);
      yp[i] = xp[i] * m[i];
    }
  });
  return y;
}

// y = x ∘ mask  →  dx = dy ∘ mask
Tensor Dropout::backward(const Tensor& mask, const Tensor& dy) {
  if (!mask.defined()) return dy;
  detail::check_compute_dtype("Dropout.backward", "dy", dy);
  detail::check_dtype("Dropout.backward", "mask", mask, dy.type());
  detail::check_shape("Dropout.backward", "mask", mask, dy.shape());
  Tensor dx = Tensor::empty(dy.shape(), dy.type());
  detail::with_type(dy.type(), [&](auto zero) {
    using T = decltype(zero);
    const T *g = detail::ptr<T>(dy), *m = detail::ptr<T>(mask);
    T* d = detail::ptr<T>(dx);
    for (std::int64_t i = 0; i < dy.numel(); ++i) d[i] = g[i] * m[i];
  });
  return dx;
}

}  // namespace attn::nn

// src/nn/norm.cc — LayerNorm and RMSNorm over the last dim; every row sum in double.
#include "attn/nn/norm.h"

#include <cmath>
#include <utility>

#include "attn/nn/activation.h"
#include "cpu/rowwise.h"
#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

// Checks x [..., C] against a [C] weight of the same dtype; returns the number of rows.
std::int64_t rows(const char* op, const Tensor& x, const Tensor& weight) {
  detail::check_compute_dtype(op, "x", x);
  detail::check_dtype(op, "x", x, weight.type());
  detail::check_last_dim(op, "x", x, weight.size(0), "C");
  return weight.size(0) == 0 ? 0 : x.numel() / weight.size(0);
}

void check_dy(const char* op, const Tensor& x, const Tensor& dy) {
  detail::check_dtype(op, "dy", dy, x.type());
  detail::check_shape(op, "dy", dy, x.shape());
}

// μ and 1 / sqrt(σ² + eps) of one row of C values (σ² biased), in double.
template <class T>
std::pair<double, double> moments(const T* x, std::int64_t C, double eps) {
  double mean = 0, var = 0;
  for (std::int64_t c = 0; c < C; ++c) mean += x[c];
  mean /= double(C);
  for (std::int64_t c = 0; c < C; ++c) var += (x[c] - mean) * (x[c] - mean);
  return {mean, 1.0 / std::sqrt(var / double(C) + eps)};
}

Tensor ones(std::int64_t C, dtype t) { return Tensor::full({C}, t, 1.0); }

}  // namespace

LayerNorm::LayerNorm(std::int64_t C, dtype t, double eps_) : eps(eps_) {
  weight = ones(C, t);
  detail::check_compute_dtype("LayerNorm", "weight", weight);
  bias = Tensor::zeros({C}, t);
  dweight = zeros_like(weight);
  dbias = zeros_like(bias);
}

// x̂ = (x − μ) · rstd,  rstd = 1 / sqrt(σ² + eps);  y = x̂ ∘ w + b
// float32 runs the SIMD row kernel (src/cpu/rowwise.h, f32 sums), rows split over threads;
// float64 sums each row in double.
Tensor LayerNorm::forward(const Tensor& x) const { return forward(x, Tensor()); }

Tensor LayerNorm::forward(const Tensor& x, const Tensor& residual) const {
  const std::int64_t M = rows("LayerNorm", x, weight), C = weight.size(0);
  if (residual.defined()) {
    detail::check_dtype("LayerNorm", "residual", residual, x.type());
    detail::check_shape("LayerNorm", "residual", residual, x.shape());
  }
  Tensor y = Tensor::empty(x.shape(), x.type());
  if (x.type() == dtype::f32) {
    const auto& k = attn::detail::cpu::select_rowwise();
    const float *xp = detail::ptr<float>(x), *w = detail::ptr<float>(weight), *b = detail::ptr<float>(bias);
    const float* rp = residual.defined() ? detail::ptr<float>(residual) : nullptr;
    float* yp = detail::ptr<float>(y);
#pragma omp parallel for schedule(static) if (M * C >= (1 << 16))
    for (std::int64_t m = 0; m < M; ++m)
      k.layer_norm(xp + m * C, rp ? rp + m * C : nullptr, w, b, yp + m * C, C, float(eps));
    return y;
  }
  if (residual.defined()) return forward(add(x, residual));
  detail::with_type(x.type(), [&](auto zero) {
    using T = decltype(zero);
    const T *xp = detail::ptr<T>(x), *w = detail::ptr<T>(weight), *b = detail::ptr<T>(bias);
    T* yp = detail::ptr<T>(y);
    for (std::int64_t m = 0; m < M; ++m) {
      const T* xr = xp + m * C;
      const auto [mean, rstd] = moments(xr, C, eps);
      for (std::int64_t c = 0; c < C; ++c) yp[m * C + c] = T((xr[c] - mean) * rstd * w[c] + b[c]);
    }
  });
  return y;
}

// From y = x̂ ∘ w + b (llm.c's layernorm_backward):
//   dbias += dy,  dweight += dy ∘ x̂,  dx̂ = dy ∘ w
//   dx = rstd · (dx̂ − mean(dx̂) − x̂ · mean(dx̂ ∘ x̂))
Tensor LayerNorm::backward(const Tensor& x, const Tensor& dy) {
  const char* op = "LayerNorm.backward";
  const std::int64_t M = rows(op, x, weight), C = weight.size(0);
  check_dy(op, x, dy);
  Tensor dx = Tensor::empty(x.shape(), x.type());
  detail::with_type(x.type(), [&](auto zero) {
    using T = decltype(zero);
    const T *xp = detail::ptr<T>(x), *w = detail::ptr<T>(weight), *g = detail::ptr<T>(dy);
    T *dw = detail::ptr<T>(dweight), *db = detail::ptr<T>(dbias), *dxp = detail::ptr<T>(dx);
    std::vector<double> xhat(std::size_t(C), 0.0);
    for (std::int64_t m = 0; m < M; ++m) {
      const T* xr = xp + m * C;
      const T* gr = g + m * C;
      const auto [mean, rstd] = moments(xr, C, eps);
      double mean_dxhat = 0, mean_dxhat_xhat = 0;
      for (std::int64_t c = 0; c < C; ++c) {
        const double xh = (xr[c] - mean) * rstd, dxh = double(gr[c]) * w[c];
        xhat[std::size_t(c)] = xh;
        mean_dxhat += dxh;
        mean_dxhat_xhat += dxh * xh;
        db[c] += gr[c];
        dw[c] += T(gr[c] * xh);
      }
      mean_dxhat /= double(C);
      mean_dxhat_xhat /= double(C);
      for (std::int64_t c = 0; c < C; ++c) {
        const double xh = xhat[std::size_t(c)], dxh = double(gr[c]) * w[c];
        dxp[m * C + c] = T(rstd * (dxh - mean_dxhat - xh * mean_dxhat_xhat));
      }
    }
  });
  return dx;
}

void LayerNorm::parameters(parameter_list& list, const std::string& prefix) {
  add_parameter(list, prefix, "weight", weight, dweight);
  add_parameter(list, prefix, "bias", bias, dbias);
}

RMSNorm::RMSNorm(std::int64_t C, dtype t, double eps_) : eps(eps_) {
  weight = ones(C, t);
  detail::check_compute_dtype("RMSNorm", "weight", weight);
  dweight = zeros_like(weight);
}

// r = 1 / sqrt(mean(x²) + eps);  y = x · r ∘ w
Tensor RMSNorm::forward(const Tensor& x) const {
  const std::int64_t M = rows("RMSNorm", x, weight), C = weight.size(0);
  Tensor y = Tensor::empty(x.shape(), x.type());
  detail::with_type(x.type(), [&](auto zero) {
    using T = decltype(zero);
    const T *xp = detail::ptr<T>(x), *w = detail::ptr<T>(weight);
    T* yp = detail::ptr<T>(y);
    for (std::int64_t m = 0; m < M; ++m) {
      const T* xr = xp + m * C;
      double ss = 0;
      for (std::int64_t c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
      const double r = 1.0 / std::sqrt(ss / double(C) + eps);
      for (std::int64_t c = 0; c < C; ++c) yp[m * C + c] = T(xr[c] * r * w[c]);
    }
  });
  return y;
}

// From y = x · r ∘ w with r = (mean(x²) + eps)^(−1/2), ∂r/∂x_c = −r³ x_c / C:
//   dweight += dy ∘ x · r,  g = dy ∘ w
//   dx = r · g − x · r³ · mean(g ∘ x)
Tensor RMSNorm::backward(const Tensor& x, const Tensor& dy) {
  const char* op = "RMSNorm.backward";
  const std::int64_t M = rows(op, x, weight), C = weight.size(0);
  check_dy(op, x, dy);
  Tensor dx = Tensor::empty(x.shape(), x.type());
  detail::with_type(x.type(), [&](auto zero) {
    using T = decltype(zero);
    const T *xp = detail::ptr<T>(x), *w = detail::ptr<T>(weight), *g = detail::ptr<T>(dy);
    T *dw = detail::ptr<T>(dweight), *dxp = detail::ptr<T>(dx);
    for (std::int64_t m = 0; m < M; ++m) {
      const T* xr = xp + m * C;
      const T* gr = g + m * C;
      double ss = 0, gx = 0;
      for (std::int64_t c = 0; c < C; ++c) {
        ss += double(xr[c]) * xr[c];
        gx += double(gr[c]) * w[c] * xr[c];
      }
      const double r = 1.0 / std::sqrt(ss / double(C) + eps);
      gx /= double(C);
      for (std::int64_t c = 0; c < C; ++c) {
        dw[c] += T(double(gr[c]) * xr[c] * r);
        dxp[m * C + c] = T(r * double(gr[c]) * w[c] - double(xr[c]) * r * r * r * gx);
      }
    }
  });
  return dx;
}

void RMSNorm::parameters(parameter_list& list, const std::string& prefix) {
  add_parameter(list, prefix, "weight", weight, dweight);
}

}  // namespace attn::nn

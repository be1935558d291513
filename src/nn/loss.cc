// src/nn/loss.cc — cross-entropy and mean squared error, value and gradient together.
#include "attn/nn/loss.h"

#include <cmath>
#include <limits>

#include "nn/nn_impl.h"

namespace attn::nn {

loss_result cross_entropy(const Tensor& logits, const Tensor& targets_in, std::int64_t ignore_index) {
  const char* op = "cross_entropy";
  detail::check_compute_dtype(op, "logits", logits);
  const Tensor targets = detail::int64_indices(op, "targets", targets_in);
  if (logits.rank() < 1) detail::fail(op, fmt::format("logits has shape {}, expected [..., C]", shape_str(logits.shape())));
  Shape rows_shape = logits.shape();
  const std::int64_t C = rows_shape.back();
  rows_shape.pop_back();
  if (targets.shape() != rows_shape)
    detail::fail(op, fmt::format("targets has shape {}, expected {} (logits {} without its last dim)",
                                 shape_str(targets.shape()), shape_str(rows_shape), shape_str(logits.shape())));
  const std::int64_t R = targets.numel();
  const std::int64_t* t = targets.data_as<std::int64_t>();
  loss_result res;
  for (std::int64_t r = 0; r < R; ++r) {
    if (t[r] == ignore_index) continue;
    if (t[r] < 0 || t[r] >= C)
      detail::fail(op, fmt::format("targets[{}] = {} is outside [0, C) = [0, {}) and is not ignore_index = {}", r, t[r],
                                   C, ignore_index));
    ++res.count;
  }
  res.grad = Tensor::zeros(logits.shape(), logits.type());
  if (res.count == 0) return res;
  detail::with_type(logits.type(), [&](auto zero) {
    using T = decltype(zero);
    const T* l = detail::ptr<T>(logits);
    T* g = detail::ptr<T>(res.grad);
    const double inv = 1.0 / double(res.count);
    for (std::int64_t r = 0; r < R; ++r) {
      if (t[r] == ignore_index) continue;
      const T* row = l + r * C;
      double mx = -std::numeric_limits<double>::infinity();
      std::int64_t arg = 0;
      for (std::int64_t c = 0; c < C; ++c)
        if (row[c] > mx) mx = row[c], arg = c;
      double z = 0;
      for (std::int64_t c = 0; c < C; ++c) z += std::exp(row[c] - mx);
      // −log softmax[t] = log Σ exp(l − max) − (l_t − max)
      res.loss += (std::log(z) - (row[t[r]] - mx)) * inv;
      res.correct += arg == t[r];
      for (std::int64_t c = 0; c < C; ++c) g[r * C + c] = T((std::exp(row[c] - mx) / z - (c == t[r])) * inv);
    }
  });
  return res;
}

loss_result mse(const Tensor& pred, const Tensor& target) {
  const char* op = "mse";
  detail::check_compute_dtype(op, "pred", pred);
  detail::check_dtype(op, "target", target, pred.type());
  detail::check_shape(op, "target", target, pred.shape());
  loss_result res;
  res.count = pred.numel();
  res.grad = Tensor::zeros(pred.shape(), pred.type());
  if (res.count == 0) return res;
  detail::with_type(pred.type(), [&](auto zero) {
    using T = decltype(zero);
    const T *p = detail::ptr<T>(pred), *y = detail::ptr<T>(target);
    T* g = detail::ptr<T>(res.grad);
    const double inv = 1.0 / double(res.count);
    for (std::int64_t i = 0; i < res.count; ++i) {
      const double d = double(p[i]) - y[i];
      res.loss += d * d * inv;
      g[i] = T(2 * d * inv);
    }
  });
  return res;
}

}  // namespace attn::nn

// src/nn/linear.cc — the Linear layer on attn::linear.
#include "attn/nn/linear.h"

#include <cmath>
#include <cstring>

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

namespace {

// The tensors rows [r0, r0 + t.size(0)) of `dst` (contiguous, same dtype and trailing shape).
void copy_rows(const Tensor& t, Tensor& dst, std::int64_t r0) {
  const std::int64_t row = t.numel() / std::max<std::int64_t>(t.size(0), 1);
  std::memcpy(static_cast<std::byte*>(dst.data()) + r0 * row * dtype_size(dst.type()), t.data(),
              std::size_t(t.numel()) * dtype_size(t.type()));
}

}  // namespace

Linear stacked(std::initializer_list<const Linear*> parts) {
  const char* op = "stacked";
  if (parts.size() == 0) detail::fail(op, "no parts");
  const Linear& first = **parts.begin();
  std::int64_t out = 0;
  for (const Linear* p : parts) {
    detail::check_dtype(op, "weight", p->weight, first.weight.type());
    if (p->in_features() != first.in_features() || p->bias.defined() != first.bias.defined())
      detail::fail(op, fmt::format("parts have weights {} and {}, {} bias; expected one in_features and all or no biases",
                                   shape_str(first.weight.shape()), shape_str(p->weight.shape()),
                                   p->bias.defined() ? "with" : "without"));
    out += p->out_features();
  }
  Linear r;
  r.weight = Tensor::empty({out, first.in_features()}, first.weight.type());
  r.dweight = zeros_like(r.weight);
  if (first.bias.defined()) r.bias = Tensor::empty({out}, first.weight.type()), r.dbias = zeros_like(r.bias);
  std::int64_t r0 = 0;
  for (const Linear* p : parts) {
    copy_rows(p->weight, r.weight, r0);
    if (r.bias.defined()) copy_rows(p->bias, r.bias, r0);
    r0 += p->out_features();
  }
  return r;
}

}  // namespace attn::nn

// src/nn/nn_impl.h — what every layer of attn::nn shares: errors that name the layer and the
// argument, dtype checks, and the dispatch of element loops on float / double.
#pragma once

#include <fmt/format.h>

#include <string>

#include "attn/tensor.h"
#include "core/common.h"  // fail

namespace attn::nn::detail {

using attn::detail::fail;

// Layers compute in float32 or float64 (the dtype of their parameters).
inline void check_compute_dtype(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) fail(op, fmt::format("{} is not set", name));
  if (t.type() != dtype::f32 && t.type() != dtype::f64)
    fail(op, fmt::format("{} has dtype {}, expected float32 or float64", name, dtype_name(t.type())));
}

inline void check_dtype(const char* op, const char* name, const Tensor& t, dtype want) {
  if (!t.defined()) fail(op, fmt::format("{} is not set", name));
  if (t.type() != want)
    fail(op, fmt::format("{} has dtype {}, expected {}", name, dtype_name(t.type()), dtype_name(want)));
}

inline void check_shape(const char* op, const char* name, const Tensor& t, const Shape& want) {
  if (t.shape() != want)
    fail(op, fmt::format("{} has shape {}, expected {}", name, shape_str(t.shape()), shape_str(want)));
}

// x [..., C]: checks the last dim (and a rank of at least 1).
inline void check_last_dim(const char* op, const char* name, const Tensor& t, std::int64_t C, const char* what) {
  if (t.rank() < 1 || t.size(-1) != C)
    fail(op, fmt::format("{} has shape {}, expected [..., {}] with {} = {}", name, shape_str(t.shape()), what, what, C));
}

// Calls f(T{}) with T = double for float64 tensors and float otherwise.
template <class F>
decltype(auto) with_type(dtype t, F&& f) {
  if (t == dtype::f64) return f(double{});
  return f(float{});
}

template <class T>
T* ptr(const Tensor& t) {
  return t.data_as<T>();
}

// acc += x elementwise (same shape and dtype, float32 or float64).
void accumulate(const Tensor& acc, const Tensor& x);

}  // namespace attn::nn::detail

// src/nn/nn_impl.h — what every layer of attn::nn shares: errors that name the layer and the
// argument, dtype checks, and the dispatch of element loops on float / double.
#pragma once

#include <fmt/format.h>

#include <string>
#include <vector>

#include "attn/attention.h"
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

// An index input (ids, lengths, targets) as int64: int64 as it is, int32 widened (a copy of the
// indices — what PyTorch's nn layers take as well); another dtype is an error naming it.
inline Tensor int64_indices(const char* op, const char* name, const Tensor& t) {
  if (!t.defined()) fail(op, fmt::format("{} is not set", name));
  if (t.type() == dtype::i32) return t.to(dtype::i64);
  if (t.type() != dtype::i64)
    fail(op, fmt::format("{} has dtype {}, expected int64 or int32", name, dtype_name(t.type())));
  return t;
}

// Sequence lengths: int64 or int32 of shape `want`, every value in [0, N]. The message names the
// element: "lengths[1, 2] = 9 is outside [0, W] = [0, 5]" (`range` names N).
inline std::vector<std::int64_t> read_lengths(const char* op, const char* name, const Tensor& lengths,
                                              const Shape& want, std::int64_t N, const char* range) {
  const Tensor l = int64_indices(op, name, lengths);
  check_shape(op, name, l, want);
  std::vector<std::int64_t> len(l.data_as<std::int64_t>(), l.data_as<std::int64_t>() + l.numel());
  for (std::size_t i = 0; i < len.size(); ++i)
    if (len[i] < 0 || len[i] > N) {
      std::string at = std::to_string(want.size() == 2 ? std::int64_t(i) / want[1] : std::int64_t(i));
      if (want.size() == 2) at += ", " + std::to_string(std::int64_t(i) % want[1]);
      fail(op, fmt::format("{}[{}] = {} is outside [0, {}] = [0, {}]", name, at, len[i], range, N));
    }
  return len;
}

// One head, scale 1 (a plain dot product, as the memory network and HAN's context attention
// score), keys j >= lengths_b excluded: attn::attention's options for [B, N, features] inputs.
inline attention_options one_head_unscaled(const Tensor& lengths) {
  attention_options o;
  o.q_num_heads = o.kv_num_heads = 1;
  o.scale = 1.0;
  o.nonpad_kv_seqlen = lengths;
  return o;
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

// src/nn/embedding.cc — the lookup table and its scatter-add gradient.
#include "attn/nn/embedding.h"

#include <cstring>

#include "nn/nn_impl.h"

namespace attn::nn {

Embedding::Embedding(std::int64_t num, std::int64_t dim, rng& gen, dtype t) {
  if (num < 0 || dim < 0) detail::fail("Embedding", fmt::format("num = {}, dim = {} must be >= 0", num, dim));
  weight = Tensor::empty({num, dim}, t);
  detail::check_compute_dtype("Embedding", "weight", weight);
  fill_normal(weight, 0.0, 1.0, gen);
  dweight = zeros_like(weight);
}

namespace {

// Checks ids (int64 — int32 ids are widened first —, every value in range) and returns the
// output shape [..., dim].
Shape checked(const char* op, const Tensor& ids, const Tensor& weight) {
  const std::int64_t num = weight.size(0);
  const std::int64_t* id = ids.data_as<std::int64_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    if (id[i] < 0 || id[i] >= num)
      detail::fail(op, fmt::format("ids[{}] = {} is outside [0, {}) (the rows of weight {})", i, id[i], num,
                                   shape_str(weight.shape())));
  Shape s = ids.shape();
  s.push_back(weight.size(1));
  return s;
}

}  // namespace

Tensor Embedding::forward(const Tensor& ids_in) const {
  const Tensor ids = detail::int64_indices("Embedding", "ids", ids_in);
  const Tensor out = Tensor::empty(checked("Embedding", ids, weight), weight.type());
  const std::int64_t C = weight.size(1);
  const std::size_t row = std::size_t(C) * dtype_size(weight.type());
  const std::int64_t* id = ids.data_as<std::int64_t>();
  for (std::int64_t i = 0; i < ids.numel(); ++i)
    std::memcpy(static_cast<char*>(out.data()) + std::size_t(i) * row,
                static_cast<const char*>(weight.data()) + std::size_t(id[i]) * row, row);
  return out;
}

// out[i, :] = weight[ids[i], :]  →  dweight[ids[i], :] += dy[i, :]
void Embedding::backward(const Tensor& ids_in, const Tensor& dy) {
  const char* op = "Embedding.backward";
  const Tensor ids = detail::int64_indices(op, "ids", ids_in);
  detail::check_shape(op, "dy", dy, checked(op, ids, weight));
  detail::check_dtype(op, "dy", dy, weight.type());
  const std::int64_t C = weight.size(1);
  const std::int64_t* id = ids.data_as<std::int64_t>();
  detail::with_type(weight.type(), [&](auto zero) {
    using T = decltype(zero);
    T* dw = detail::ptr<T>(dweight);
    const T* g = detail::ptr<T>(dy);
    for (std::int64_t i = 0; i < ids.numel(); ++i)
      for (std::int64_t c = 0; c < C; ++c) dw[id[i] * C + c] += g[i * C + c];
  });
}

void Embedding::parameters(parameter_list& list, const std::string& prefix) {
  add_parameter(list, prefix, "weight", weight, dweight);
}

}  // namespace attn::nn

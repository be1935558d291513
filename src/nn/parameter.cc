// src/nn/parameter.cc — named parameter lists, zeroing, and the shared element loops.
#include "attn/nn/parameter.h"

#include <cstring>

#include "nn/nn_impl.h"

namespace attn::nn {

void add_parameter(parameter_list& list, const std::string& prefix, const char* name, Tensor& value, Tensor& grad) {
  list.push_back({prefix + name, &value, &grad});
}

std::string join(const std::string& prefix, const char* name) { return prefix + name + "."; }

void zero_grad(const parameter_list& list) {
  for (const parameter_ref& p : list)
    if (p.grad->numel() > 0) std::memset(p.grad->data(), 0, std::size_t(p.grad->numel()) * dtype_size(p.grad->type()));
}

std::int64_t parameter_count(const parameter_list& list) {
  std::int64_t n = 0;
  for (const parameter_ref& p : list) n += p.value->numel();
  return n;
}

Tensor zeros_like(const Tensor& t) { return Tensor::zeros(t.shape(), t.type()); }

namespace detail {

void accumulate(const Tensor& acc, const Tensor& x) {
  with_type(acc.type(), [&](auto zero) {
    using T = decltype(zero);
    T* a = ptr<T>(acc);
    const T* b = ptr<T>(x);
    for (std::int64_t i = 0; i < acc.numel(); ++i) a[i] += b[i];
  });
}

}  // namespace detail
}  // namespace attn::nn

// attn/nn/parameter.h — how layers expose their learned tensors to optimizers and checkpoints.
//
// Layers keep parameters in plain fields (`weight`, `bias`) next to their gradients (`dweight`,
// `dbias`: same shape and dtype, accumulated by backward). `parameters(list, prefix)` appends
// one named entry per parameter, with dotted names as PyTorch writes them ("enc.fwd.ih.weight").
// The pointers stay valid while the layer lives and is not moved.
//
//   attn::nn::parameter_list ps;
//   model.parameters(ps, "");          // every parameter of the model, named
//   attn::nn::zero_grad(ps);           // before accumulating the next batch
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.h"

namespace attn::nn {

struct parameter_ref {
  std::string name;
  Tensor* value = nullptr;
  Tensor* grad = nullptr;  // same shape and dtype as *value
};
using parameter_list = std::vector<parameter_ref>;

// Appends {prefix + name, value, grad} (prefix "" or ending in '.').
void add_parameter(parameter_list& list, const std::string& prefix, const char* name, Tensor& value, Tensor& grad);

// "enc." + "fwd" -> "enc.fwd."
std::string join(const std::string& prefix, const char* name);

// Sets every gradient to zero.
void zero_grad(const parameter_list& list);

// Number of learned scalars.
std::int64_t parameter_count(const parameter_list& list);

// The gradient buffer of a parameter: zeros of its shape and dtype.
Tensor zeros_like(const Tensor& t);

}  // namespace attn::nn

// attn/nn/checkpoint.h — checkpoints in safetensors, the format of PyTorch and Hugging Face
// (https://github.com/huggingface/safetensors): an 8-byte little-endian header length, a JSON
// header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the tensors' bytes, C order, little-endian.
// dtypes: F32 F64 F16 BF16 I64 BOOL (others are refused with their name).
//
//   attn::nn::parameter_list ps;
//   model.parameters(ps);
//   attn::nn::save_parameters("model.safetensors", ps);     // every parameter by name
//   attn::nn::load_parameters("model.safetensors", ps);     // exact: same names, shapes, dtypes
//
// In Python: safetensors.numpy.load_file("model.safetensors")["enc.fwd.ih.weight"].
// Bad files and mismatches throw attn::error naming the file and the tensor:
//   "load_parameters: model.safetensors: 'out_proj.weight' has shape [8, 4], the model's is [8, 8]".
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "attn/nn/parameter.h"
#include "attn/tensor.h"

namespace attn::nn {

// Writes the tensors in the order given (names unique and non-empty, not "__metadata__").
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

struct safetensors_file {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};
// Reads every tensor of a file (checks the header, every offset and size against the file).
safetensors_file load_safetensors(const std::string& path);

// Every parameter's value under its name.
void save_parameters(const std::string& path, const parameter_list& params,
                     const std::map<std::string, std::string>& metadata = {});
// Copies each file tensor into the parameter of the same name. Throws, changing nothing, when
// the file lacks a parameter, holds a name the list does not have, or a shape or dtype differs.
void load_parameters(const std::string& path, const parameter_list& params);

}  // namespace attn::nn

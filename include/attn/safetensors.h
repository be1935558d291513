// attn/safetensors.h — safetensors files (the format of PyTorch and Hugging Face checkpoints):
// an 8-byte little-endian header length, a JSON header naming each tensor's dtype, shape and
// byte range, then the raw little-endian data.
//
//   auto file = attn::read_safetensors("model.safetensors");
//   const attn::Tensor& w = file.at("encoder.layer.0.attention.self.query.weight");
//   attn::write_safetensors("out.safetensors", {{"w", w}});
//
// dtypes: F32, F16, BF16, F64, I64, BOOL (others: attn::error naming the tensor and dtype).
// A malformed or truncated file — bad header length, invalid JSON, ranges outside the data,
// overlapping or leaving gaps, a size that does not match the shape — throws attn::error
// naming the file and what was wrong; it never crashes.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "attn/tensor.h"

namespace attn {

struct safetensors_file {
  std::vector<std::pair<std::string, Tensor>> tensors;  // in file order
  std::map<std::string, std::string> metadata;          // "__metadata__", when present

  // The tensor named `name`; attn::error naming the file and the name when absent.
  const Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
  std::string path;
};

safetensors_file read_safetensors(const std::string& path);
// Writes the tensors (any strides; stored C-contiguous) in the given order.
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace attn

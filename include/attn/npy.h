// attn/npy.h — NumPy .npy files (format 1.0, 2.0 and 3.0; little-endian; C or Fortran order).
//
//   attn::Tensor q = attn::read_npy("q.npy");
//   attn::write_npy("out.npy", result.out);
//
// dtypes: <f4 <f2 <f8 |b1 <i8 and bfloat16 stored as <V2 is not portable, so bf16 tensors are
// written as float32. A malformed, truncated or unsupported file throws attn::error naming the
// file and what was wrong; it never crashes.
#pragma once

#include <string>

#include "attn/tensor.h"

namespace attn {

Tensor read_npy(const std::string& path);
// Parses an in-memory .npy image; `name` is used in error messages.
Tensor parse_npy(const void* bytes, std::size_t size, const std::string& name = "<memory>");
void write_npy(const std::string& path, const TensorView& t);

}  // namespace attn

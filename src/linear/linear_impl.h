// src/linear/linear_impl.h — the validated linear problem and its two implementations: the
// float64 reference (reference.cc, the test oracle) and the OpenBLAS path (blas.cc). The front
// (linear.cc) checks every user argument, views x as a matrix [M, K], allocates the outputs and
// builds these; neither implementation checks user input again.
#pragma once

#include <cstdint>
#include <string>

#include "attn/tensor.h"

namespace attn::linear_detail {

// A strided matrix [rows, cols] (element strides; 0 = broadcast).
struct matrix {
  void* data = nullptr;
  dtype type = dtype::f32;
  std::int64_t rows = 0, cols = 0, rs = 0, cs = 0;

  std::int64_t offset(std::int64_t r, std::int64_t c) const { return r * rs + c * cs; }
  double load(std::int64_t r, std::int64_t c) const { return load_as_double(data, type, offset(r, c)); }
  void store(std::int64_t r, std::int64_t c, double v) const { store_from_double(data, type, offset(r, c), v); }
};

// A strided vector [n].
struct vector {
  void* data = nullptr;  // null: absent
  dtype type = dtype::f32;
  std::int64_t n = 0, stride = 0;

  double load(std::int64_t i) const { return load_as_double(data, type, i * stride); }
  void store(std::int64_t i, double v) const { store_from_double(data, type, i * stride, v); }
};

// Forward: y [M, N] = x [M, K] · Wᵀ (W [N, K]) + b [N].
// Backward: dx [M, K] = dy [M, N] · W;  dW [N, K] = dyᵀ · x;  db [N] = Σ_m dy.
// Outputs are C-contiguous; an output with data == null is not requested. x, W, b, dy and every
// output share one dtype.
struct problem {
  std::int64_t M = 0, K = 0, N = 0;
  dtype type = dtype::f32;
  matrix x, W, dy;
  vector b;
  matrix y, dx, dW;
  vector db;
  int num_threads = 0;  // >= 1
};

namespace reference {
void forward(const problem& p);
void backward(const problem& p);
}  // namespace reference

namespace blas {
// "" when OpenBLAS is loaded and usable, else why not.
const std::string& why_not();
// What was loaded: "OpenBLAS 0.3.21 ... core SkylakeX (...)".
const std::string& describe();
void forward(const problem& p);
void backward(const problem& p);
}  // namespace blas

}  // namespace attn::linear_detail

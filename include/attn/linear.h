// attn/linear.h — the affine map of every projection layer, forward and backward:
//
//   y = x Wᵀ + b          x [..., in]   W [out, in]   b [out] (optional)   y [..., out]
//
// Shape letters: M = the product of x's leading dims (the rows), K = in, N = out.
// x may have any number of leading dims (0 of them: x is one vector [in]) and any strides
// (transposed, sliced and broadcast views); W and b may be strided too. x, W and b share one
// dtype: f32, f64, f16 or bf16 (f16/bf16 compute in f32 and round once); y and the gradients
// take it and are C-contiguous.
//
// Two implementations:
//   cpu        OpenBLAS cblas_sgemm / cblas_dgemm (f16/bf16 converted to f32 rows first)
//   reference  plain float64 loops, one output element at a time: the test oracle
// execution::use_backend picks one (`cpu` throws when OpenBLAS is missing); `automatic` takes
// cpu when OpenBLAS can be opened and the reference otherwise, unless ATTN_BACKEND names one.
// execution::num_threads sets OpenBLAS's thread count (0: all available).
//
// OpenBLAS is opened at run time (dlopen of libopenblas.so.0, Debian's libopenblas0), not
// linked: OpenBLAS reads OPENBLAS_CORETYPE once, when it loads, and Debian's 0.3.21 does not
// know that AMD Zen 4/5 have AVX-512. When the variable is unset and the CPU has AVX-512F,
// attn sets OPENBLAS_CORETYPE=SkylakeX for the load and restores the environment after it;
// a value in the environment is respected. ATTN_OPENBLAS=<path> names another library file.
// `linear_backend_info()` says which library and core were found, or why none was.
//
// Bad input throws attn::error naming the argument:
//   "linear: W has shape [3, 5], expected [out, in] with in = 4 (the last dim of x [2, 4])".
#pragma once

#include <optional>
#include <string>

#include "attn/execution.h"
#include "attn/tensor.h"

namespace attn {

// Forward.
//
//   attn::Tensor x = attn::Tensor::zeros({8, 128, 512}, attn::dtype::f32);   // [B, N, C]
//   attn::Tensor W = attn::Tensor::zeros({1536, 512}, attn::dtype::f32);     // [3C, C]
//   attn::Tensor qkv = attn::linear(x, W);                                   // [8, 128, 1536]
//   attn::Tensor y = attn::linear(x, W, bias);                               // bias [1536]
//   attn::Tensor r = attn::linear(x, W, bias, {.use_backend = attn::backend::reference});  // the oracle
Tensor linear(const TensorView& x, const TensorView& W, const std::optional<TensorView>& b = std::nullopt,
              const execution& exec = {});

// Which gradients linear_backward computes (each costs one GEMM or one reduction).
struct linear_needs {
  bool dx = true;
  bool dW = true;
  bool db = false;  // the bias gradient; ask for it when the forward had a bias
};

struct linear_grads {
  Tensor dx;  // shape of x          dx = dy W
  Tensor dW;  // [out, in]           dW = dyᵀ x   (summed over every leading index of x)
  Tensor db;  // [out]               db = Σ dy    (same sum)
};

// Backward: dy has the shape of y ([..., out]). Gradients not asked for are left undefined.
//
//   attn::linear_grads g = attn::linear_backward(x, W, dy, {.dx = true, .dW = true, .db = true});
linear_grads linear_backward(const TensorView& x, const TensorView& W, const TensorView& dy, linear_needs needs = {},
                             const execution& exec = {});

// "OpenBLAS 0.3.21 ... core SkylakeX (OPENBLAS_CORETYPE=SkylakeX set by attn)" or why the cpu
// path is not available ("OpenBLAS not found: ...").
std::string linear_backend_info();

}  // namespace attn

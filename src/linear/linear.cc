// src/linear/linear.cc — the front of linear: checks every argument, views x [..., K] as a
// matrix [M, K] (a contiguous copy only when its leading dims cannot be merged into one
// stride), allocates the outputs and runs OpenBLAS or the float64 reference.
// Messages: "op: what, got values".
#include <fmt/format.h>
#include <omp.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "attn/linear.h"
#include "core/common.h"
#include "linear/linear_impl.h"

namespace attn {
namespace linear_detail {
namespace {

using detail::fail;

void check_float(const char* op, const char* name, const TensorView& t) {
  if (!is_floating(t.type()))
    fail(op, fmt::format("{} has dtype {}, expected float32, float16, bfloat16 or float64", name, dtype_name(t.type())));
  if (t.data() == nullptr && t.numel() != 0) fail(op, fmt::format("{} has no data", name));
}

void check_same_dtype(const char* op, const char* name, const TensorView& t, const TensorView& x) {
  if (t.type() != x.type())
    fail(op, fmt::format("{} has dtype {}, x has {}; they must match", name, dtype_name(t.type()), dtype_name(x.type())));
}

matrix as_matrix(const TensorView& t) {
  return {t.data(), t.type(), t.size(0), t.size(1), t.stride(0), t.stride(1)};
}

// x [..., K] as [M, K]: the leading dims merge into one row stride when each one steps over
// the next (dims of size 1 are free); otherwise x is copied. `keep` holds the copy.
matrix rows_of(const TensorView& x, Tensor& keep) {
  const int r = x.rank();  // >= 1
  const std::int64_t K = x.size(-1);
  std::int64_t M = 1;
  for (int i = 0; i + 1 < r; ++i) M *= x.size(i);
  std::int64_t row_stride = K;  // any value serves when M <= 1
  bool mergeable = true;
  std::int64_t inner = -1;  // stride a step of the merged index takes at the innermost non-unit dim so far
  std::int64_t span = 1;    // elements of the merged index covered by the dims inside
  for (int i = r - 2; i >= 0; --i) {
    if (x.size(i) == 1) continue;
    if (inner < 0) {
      inner = x.stride(i);
    } else if (x.stride(i) != inner * span) {
      mergeable = false;
      break;
    }
    span *= x.size(i);
  }
  if (inner >= 0) row_stride = inner;
  if (!mergeable) {
    keep = Tensor::copy_of(x);
    return {keep.data(), x.type(), M, K, K, 1};
  }
  return {x.data(), x.type(), M, K, row_stride, x.stride(-1)};
}

// Output shape: x's shape with the last dim replaced by `cols`.
Shape with_last(const TensorView& x, std::int64_t cols) {
  Shape s = x.shape();
  s.back() = cols;
  return s;
}

matrix contiguous(const Tensor& t, std::int64_t rows, std::int64_t cols) {
  return {t.data(), t.type(), rows, cols, cols, 1};
}

// The path that runs: exec.use_backend, or with `automatic` the one ATTN_BACKEND names, else
// OpenBLAS when it is loaded and the dims fit its 32-bit ints, else the reference.
bool use_blas(const char* op, const problem& p, const execution& exec) {
  backend want = exec.use_backend;
  if (want == backend::automatic) {
    const char* env = std::getenv("ATTN_BACKEND");
    if (env && *env) {
      try {
        want = parse_backend(env);
      } catch (const error&) {
        fail(op, fmt::format("ATTN_BACKEND = '{}' names no backend", env));
      }
    }
  }
  if (want == backend::reference) return false;
  std::string why = blas::why_not();
  if (why.empty() && (p.M > INT_MAX || p.N > INT_MAX || p.K > INT_MAX))
    why = fmt::format("M = {}, N = {}, K = {} do not all fit in a 32-bit BLAS int", p.M, p.N, p.K);
  if (why.empty()) return true;
  if (want == backend::cpu) fail(op, fmt::format("the cpu backend (OpenBLAS) cannot run this call: {}", why));
  return false;
}

// Checks x, W (and dy) and fills dims and input views.
problem build(const char* op, const TensorView& x, const TensorView& W, const execution& exec, Tensor& keep_x) {
  check_float(op, "x", x);
  check_float(op, "W", W);
  check_same_dtype(op, "W", W, x);
  if (x.rank() < 1) fail(op, fmt::format("x has shape {}, expected [..., in] (at least 1 dim)", shape_str(x.shape())));
  if (W.rank() != 2 || W.size(1) != x.size(-1))
    fail(op, fmt::format("W has shape {}, expected [out, in] with in = {} (the last dim of x {})", shape_str(W.shape()),
                         x.size(-1), shape_str(x.shape())));
  problem p;
  p.type = x.type();
  p.x = rows_of(x, keep_x);
  p.M = p.x.rows;
  p.K = p.x.cols;
  p.N = W.size(0);
  p.W = as_matrix(W);
  p.num_threads = detail::thread_count(op, exec);
  return p;
}

}  // namespace
}  // namespace linear_detail

Tensor linear(const TensorView& x, const TensorView& W, const std::optional<TensorView>& b, const execution& exec) {
  using namespace linear_detail;
  const char* op = "linear";
  Tensor keep_x;
  problem p = build(op, x, W, exec, keep_x);
  if (b) {
    check_float(op, "b", *b);
    check_same_dtype(op, "b", *b, x);
    if (b->rank() != 1 || b->size(0) != p.N)
      fail(op, fmt::format("b has shape {}, expected [out] = [{}] (the first dim of W {})", shape_str(b->shape()), p.N,
                           shape_str(W.shape())));
    p.b = {b->data(), b->type(), p.N, b->stride(0)};
  }
  Tensor y = Tensor::empty(with_last(x, p.N), x.type());
  p.y = contiguous(y, p.M, p.N);
  if (use_blas(op, p, exec))
    blas::forward(p);
  else
    reference::forward(p);
  return y;
}

linear_grads linear_backward(const TensorView& x, const TensorView& W, const TensorView& dy, linear_needs needs,
                             const execution& exec) {
  using namespace linear_detail;
  const char* op = "linear_backward";
  Tensor keep_x, keep_dy;
  problem p = build(op, x, W, exec, keep_x);
  check_float(op, "dy", dy);
  check_same_dtype(op, "dy", dy, x);
  if (dy.shape() != with_last(x, p.N))
    fail(op, fmt::format("dy has shape {}, expected {} (the shape of y = x {} · Wᵀ, W {})", shape_str(dy.shape()),
                         shape_str(with_last(x, p.N)), shape_str(x.shape()), shape_str(W.shape())));
  p.dy = rows_of(dy, keep_dy);
  linear_grads g;
  if (needs.dx) {
    g.dx = Tensor::empty(x.shape(), x.type());
    p.dx = contiguous(g.dx, p.M, p.K);
  }
  if (needs.dW) {
    g.dW = Tensor::empty({p.N, p.K}, x.type());
    p.dW = contiguous(g.dW, p.N, p.K);
  }
  if (needs.db) {
    g.db = Tensor::empty({p.N}, x.type());
    p.db = {g.db.data(), g.db.type(), p.N, 1};
  }
  if (use_blas(op, p, exec))
    blas::backward(p);
  else
    reference::backward(p);
  return g;
}

std::string linear_backend_info() {
  using namespace linear_detail;
  return blas::why_not().empty() ? blas::describe() : blas::why_not();
}

}  // namespace attn

// src/family/scores/common.cc — what every score file uses: checked parameters and the
// row access of score.h.
#include <fmt/format.h>

#include <cmath>

#include "core/common.h"
#include "cpu/kernels.h"
#include "family/scores/score.h"

namespace attn::detail::family {

param get_param(const score_call& c, const char* name, const std::optional<TensorArg>& t,
                std::initializer_list<Shape> shapes, bool required) {
  param p;
  std::string want;
  for (const Shape& s : shapes) want += (want.empty() ? "" : " or ") + shape_str(s);
  if (!t) {
    if (required) fail(c.op, fmt::format("score {} needs {} of shape {}", c.name, name, want));
    return p;
  }
  if (!is_floating(t->type()))
    fail(c.op, fmt::format("{} has dtype {}, expected a float dtype", name, dtype_name(t->type())));
  bool ok = false;
  for (const Shape& s : shapes) ok |= t->shape() == s;
  if (!ok)
    fail(c.op, fmt::format("{} has shape {}, expected {} for score {}", name, shape_str(t->shape()), want, c.name));
  p.view = &*t;
  p.values = to_vector(*t);
  for (double x : p.values)
    if (!std::isfinite(x)) fail(c.op, fmt::format("{} holds a non-finite value ({})", name, x));
  return p;
}

Tensor param_grad(const param& p, const std::vector<double>& g) {
  if (!p.view) return {};
  return Tensor::from_values(p.view->shape(), p.view->type(), g);
}

void load_row(const strided4& s, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X, double* out) {
  switch (s.type) {  // the dtypes the preparations read most, without a switch per element
    case dtype::f32: {
      const float* p = s.ptr<float>(b, h, n, 0);
      for (std::int64_t x = 0; x < X; ++x) out[x] = p[x * s.sx];
      break;
    }
    case dtype::f64: {
      const double* p = s.ptr<double>(b, h, n, 0);
      for (std::int64_t x = 0; x < X; ++x) out[x] = p[x * s.sx];
      break;
    }
    case dtype::bf16: {
      const std::uint16_t* p = s.ptr<std::uint16_t>(b, h, n, 0);
      for (std::int64_t x = 0; x < X; ++x) out[x] = bf16_to_f32(p[x * s.sx]);
      break;
    }
    default:
      for (std::int64_t x = 0; x < X; ++x) out[x] = s.load(b, h, n, x);
  }
}

void store_row(const strided4& s, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X, const double* in) {
  switch (s.type) {
    case dtype::f32: {
      float* p = s.ptr<float>(b, h, n, 0);
      for (std::int64_t x = 0; x < X; ++x) p[x * s.sx] = float(in[x]);
      break;
    }
    case dtype::f64: {
      double* p = s.ptr<double>(b, h, n, 0);
      for (std::int64_t x = 0; x < X; ++x) p[x * s.sx] = in[x];
      break;
    }
    case dtype::bf16: {  // as store_from_double: rounded to float, then to bfloat16
      std::uint16_t* p = s.ptr<std::uint16_t>(b, h, n, 0);
      for (std::int64_t x = 0; x < X; ++x) p[x * s.sx] = f32_to_bf16(float(in[x]));
      break;
    }
    default:
      for (std::int64_t x = 0; x < X; ++x) s.store(b, h, n, x, in[x]);
  }
}

std::vector<double> load_bhnx(const TensorView& t, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X) {
  std::vector<double> r(std::size_t(B * H * N * X), 0.0);
  const strided4 s = as_bhnx(t, H);
  for_rows(B, H, N, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t row) {
    load_row(s, b, h, n, X, r.data() + row * X);
  });
  return r;
}

std::int64_t split_row_width(std::int64_t D) {
  const std::int64_t m = cpu::select_kernels().forward_amx ? 32 : 2;
  return (D + 4 + m - 1) / m * m;
}

Tensor empty_bhnx(std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int rank, dtype t) {
  return rank == 4 ? Tensor::empty({B, H, N, X}, t) : Tensor::empty({B, N, H * X}, t);
}

Tensor store_bhnx(const std::vector<double>& x, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                  int rank, dtype t) {
  if (rank == 4) return Tensor::from_values({B, H, N, X}, t, x);
  Tensor r = empty_bhnx(B, H, N, X, rank, t);
  const strided4 s = as_bhnx(r, H);
  for_rows(B, H, N, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t row) {
    store_row(s, b, h, n, X, x.data() + row * X);
  });
  return r;
}

TensorArg with_dtype(const TensorView& t, dtype d) {
  if (t.type() == d) return t;
  return Tensor::copy_of(t, d);
}

Tensor to_dtype(const Tensor& t, dtype d) { return t.type() == d ? t : t.to(d); }

}  // namespace attn::detail::family

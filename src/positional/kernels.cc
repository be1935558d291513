// src/positional/kernels.cc — fast paths of the positional encodings. Plain loops the compiler
// can vectorise, one template per op over the storage type; f16/bf16 compute in f32, angles
// and their sin/cos always in f64 (rounded once to the compute type), so results stay within
// the compute type's rounding of the float64 reference even at positions in the millions.
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "positional/positional_impl.h"

namespace attn::positional_detail::fast {
namespace {

// Storage type T, compute type C and the conversions between them.
struct f32_io {
  using T = float;
  using C = float;
  static C load(T v) { return v; }
  static T store(C v) { return v; }
};
struct f64_io {
  using T = double;
  using C = double;
  static C load(T v) { return v; }
  static T store(C v) { return v; }
};
struct f16_io {
  using T = std::uint16_t;
  using C = float;
  static C load(T v) { return f16_to_f32(v); }
  static T store(C v) { return f32_to_f16(v); }
};
struct bf16_io {
  using T = std::uint16_t;
  using C = float;
  static C load(T v) { return bf16_to_f32(v); }
  static T store(C v) { return f32_to_bf16(v); }
};

// Calls f(io{}) with the io struct of dtype t (a float dtype; the front checked it).
template <class F>
void by_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: f(f32_io{}); break;
    case dtype::f64: f(f64_io{}); break;
    case dtype::f16: f(f16_io{}); break;
    case dtype::bf16: f(bf16_io{}); break;
    default: break;
  }
}

template <class IO>
typename IO::T* at(const strided4& v, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t x) {
  return static_cast<typename IO::T*>(v.data) + v.offset(b, h, n, x);
}

constexpr std::int64_t parallel_threshold = 1 << 15;  // elements; below this one thread is faster

}  // namespace

// ---- rotary --------------------------------------------------------------------------------
// Per row (b, n): the R/2 cos/sin pairs once, then every head. Pair i is (a·i, a·i + off):
// half_split a = 1, off = R/2; interleaved a = 2, off = 1.
void rotary(const rotary_problem& p) {
  by_dtype(p.x.type, [&](auto io) {
    using IO = decltype(io);
    using C = typename IO::C;
    const std::int64_t half = p.R / 2;
    const std::int64_t step = p.layout == rotary_layout::half_split ? 1 : 2;
    const std::int64_t off = p.layout == rotary_layout::half_split ? half : 1;
    std::vector<double> inv_freq(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(p.base, -2.0 * double(i) / double(p.R));
    const std::int64_t rows = p.B * p.N;
    const std::int64_t xs = p.x.sx, os = p.out.sx;
#pragma omp parallel if (rows * p.H * p.D > parallel_threshold)
    {
      std::vector<C> cs(static_cast<std::size_t>(half)), sn(cs.size());
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t b = r / p.N, n = r % p.N;
        const double pos = double(p.pos.at(b, n));
        for (std::int64_t i = 0; i < half; ++i) {
          const double theta = pos * inv_freq[i];
          cs[i] = C(std::cos(theta));
          sn[i] = C(p.inverse ? -std::sin(theta) : std::sin(theta));
        }
        for (std::int64_t h = 0; h < p.H; ++h) {
          const auto* x = at<IO>(p.x, b, h, n, 0);
          auto* o = at<IO>(p.out, b, h, n, 0);
          for (std::int64_t i = 0; i < half; ++i) {
            const std::int64_t ia = i * step, ib = i * step + off;
            const C xa = IO::load(x[ia * xs]), xb = IO::load(x[ib * xs]);
            o[ia * os] = IO::store(xa * cs[i] - xb * sn[i]);
            o[ib * os] = IO::store(xb * cs[i] + xa * sn[i]);
          }
          for (std::int64_t d = p.R; d < p.D; ++d) o[d * os] = x[d * xs];
        }
      }
    }
  });
}

// ---- sinusoidal ----------------------------------------------------------------------------
void sinusoidal(const sinusoidal_problem& p) {
  by_dtype(p.out.type, [&](auto io) {
    using IO = decltype(io);
    using C = typename IO::C;
    const std::int64_t pairs = (p.D + 1) / 2;
    std::vector<double> inv_freq(static_cast<std::size_t>(pairs));
    for (std::int64_t i = 0; i < pairs; ++i) inv_freq[i] = std::pow(p.base, -double(2 * i) / double(p.D));
    const std::int64_t rows = p.B * p.N;
#pragma omp parallel if (rows * p.D > parallel_threshold)
    {
      std::vector<C> pe(static_cast<std::size_t>(p.D));
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t b = r / p.N, n = r % p.N;
        const double pos = double(p.pos.at(b, n));
        for (std::int64_t d = 0; d < p.D; ++d) {
          const double theta = pos * inv_freq[d / 2];
          pe[d] = C(d % 2 == 0 ? std::sin(theta) : std::cos(theta));
        }
        auto* o = at<IO>(p.out, b, 0, n, 0);
        if (p.add) {
          // The add runs in the compute type (x + PE rounded once), like the other fast paths.
          const auto* x = at<IO>(p.x, b, 0, n, 0);
          for (std::int64_t d = 0; d < p.D; ++d) o[d * p.out.sx] = IO::store(IO::load(x[d * p.x.sx]) + pe[d]);
        } else {
          for (std::int64_t d = 0; d < p.D; ++d) o[d * p.out.sx] = IO::store(pe[d]);
        }
      }
    }
  });
}

// ---- learned table -------------------------------------------------------------------------
void learned_forward(const learned_problem& p) {
  by_dtype(p.out.type, [&](auto io) {
    using IO = decltype(io);
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t n = 0; n < p.N; ++n) {
        const auto* t = at<IO>(p.table, 0, 0, p.pos.at(b, n), 0);
        auto* o = at<IO>(p.out, b, 0, n, 0);
        for (std::int64_t d = 0; d < p.D; ++d) o[d * p.out.sx] = t[d * p.table.sx];
      }
  });
}

// Serial: rows with the same position add into the same table row.
void learned_backward(const learned_problem& p) {
  by_dtype(p.dout.type, [&](auto io) {
    using IO = decltype(io);
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t n = 0; n < p.N; ++n) {
        const auto* g = at<IO>(p.dout, b, 0, n, 0);
        double* t = p.dtable + p.pos.at(b, n) * p.D;
        for (std::int64_t d = 0; d < p.D; ++d) t[d] += double(IO::load(g[d * p.dout.sx]));
      }
  });
}

// ---- T5 relative position bias -------------------------------------------------------------
// The bucket depends on (i, j) only through r = j − offset − i: compute it once per diagonal
// (Nq + Nk − 1 of them, index j − i + Nq − 1), then copy / reduce along diagonals.
namespace {
std::vector<std::int64_t> diagonal_buckets(const relative_problem& p) {
  const std::int64_t diags = p.Nq + p.Nk - 1;
  std::vector<std::int64_t> k(std::size_t(diags > 0 ? diags : 0));
  for (std::int64_t t = 0; t < diags; ++t) k[t] = t5_bucket(t - (p.Nq - 1) - p.opt.query_offset, p.opt);
  return k;
}
}  // namespace

void relative_forward(const relative_problem& p) {
  if (p.Nq == 0 || p.Nk == 0) return;
  const std::vector<std::int64_t> k = diagonal_buckets(p);
  by_dtype(p.out.type, [&](auto io) {
    using IO = decltype(io);
#pragma omp parallel for schedule(static) if (p.H * p.Nq * p.Nk > parallel_threshold)
    for (std::int64_t h = 0; h < p.H; ++h) {
      std::vector<typename IO::T> value(k.size());
      for (std::size_t t = 0; t < k.size(); ++t) value[t] = *at<IO>(p.table, 0, 0, k[t], h);
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const auto* v = value.data() + (p.Nq - 1 - i);  // v[j] = value of diagonal j − i
        auto* o = at<IO>(p.out, 0, h, i, 0);
        for (std::int64_t j = 0; j < p.Nk; ++j) o[j * p.out.sx] = v[j];
      }
    }
  });
}

// Parallel over heads: head h owns column h of dtable.
void relative_backward(const relative_problem& p) {
  if (p.Nq == 0 || p.Nk == 0) return;
  const std::vector<std::int64_t> k = diagonal_buckets(p);
  by_dtype(p.dbias.type, [&](auto io) {
    using IO = decltype(io);
#pragma omp parallel for schedule(static) if (p.Bd * p.H * p.Nq * p.Nk > parallel_threshold)
    for (std::int64_t h = 0; h < p.H; ++h) {
      std::vector<double> diag(k.size(), 0.0);
      for (std::int64_t b = 0; b < p.Bd; ++b)
        for (std::int64_t i = 0; i < p.Nq; ++i) {
          double* s = diag.data() + (p.Nq - 1 - i);
          const auto* g = at<IO>(p.dbias, b, h, i, 0);
          for (std::int64_t j = 0; j < p.Nk; ++j) s[j] += double(IO::load(g[j * p.dbias.sx]));
        }
      for (std::size_t t = 0; t < k.size(); ++t) p.dtable[k[t] * p.H + h] += diag[t];
    }
  });
}

}  // namespace attn::positional_detail::fast

// src/positional/reference.cc — float64 references of the positional encodings: one element at
// a time, straight from the formulas in positional.h. The oracle for the fast paths.
#include <cmath>

#include "positional/positional_impl.h"

namespace attn::positional_detail::reference {

// ---- rotary --------------------------------------------------------------------------------
// out[a] = x[a] cos θ − x[b] sin θ,  out[b] = x[b] cos θ + x[a] sin θ,  θ = p · base^(-2i/R)
void rotary(const rotary_problem& p) {
  const std::int64_t half = p.R / 2;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.H; ++h)
      for (std::int64_t n = 0; n < p.N; ++n) {
        const double pos = double(p.pos.at(b, n));
        for (std::int64_t i = 0; i < half; ++i) {
          const std::int64_t ia = p.layout == rotary_layout::half_split ? i : 2 * i;
          const std::int64_t ib = p.layout == rotary_layout::half_split ? i + half : 2 * i + 1;
          const double theta = pos * std::pow(p.base, -2.0 * double(i) / double(p.R));
          const double c = std::cos(theta), s = p.inverse ? -std::sin(theta) : std::sin(theta);
          const double xa = p.x.load(b, h, n, ia), xb = p.x.load(b, h, n, ib);
          p.out.store(b, h, n, ia, xa * c - xb * s);
          p.out.store(b, h, n, ib, xb * c + xa * s);
        }
        for (std::int64_t d = p.R; d < p.D; ++d) p.out.store(b, h, n, d, p.x.load(b, h, n, d));
      }
}

// ---- sinusoidal ----------------------------------------------------------------------------
// PE[p, 2i] = sin(p · base^(-2i/D)),  PE[p, 2i+1] = cos(p · base^(-2i/D))
void sinusoidal(const sinusoidal_problem& p) {
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t n = 0; n < p.N; ++n) {
      const double pos = double(p.pos.at(b, n));
      for (std::int64_t d = 0; d < p.D; ++d) {
        const double theta = pos * std::pow(p.base, -double(d - d % 2) / double(p.D));
        const double pe = d % 2 == 0 ? std::sin(theta) : std::cos(theta);
        p.out.store(b, 0, n, d, (p.add ? p.x.load(b, 0, n, d) : 0.0) + pe);
      }
    }
}

// ---- learned table -------------------------------------------------------------------------
// out[b, n, :] = table[p, :]
void learned_forward(const learned_problem& p) {
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t n = 0; n < p.N; ++n)
      for (std::int64_t d = 0; d < p.D; ++d) p.out.store(b, 0, n, d, p.table.load(0, 0, p.pos.at(b, n), d));
}

// dtable[p, :] += dout[b, n, :]     (backward of: out[b, n, :] = table[p, :])
void learned_backward(const learned_problem& p) {
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t n = 0; n < p.N; ++n)
      for (std::int64_t d = 0; d < p.D; ++d) p.dtable[p.pos.at(b, n) * p.D + d] += p.dout.load(b, 0, n, d);
}

// ---- T5 relative position bias -------------------------------------------------------------
// out[0, h, i, j] = table[bucket(j − (offset + i)), h]
void relative_forward(const relative_problem& p) {
  for (std::int64_t h = 0; h < p.H; ++h)
    for (std::int64_t i = 0; i < p.Nq; ++i)
      for (std::int64_t j = 0; j < p.Nk; ++j) {
        const std::int64_t k = t5_bucket(j - (p.opt.query_offset + i), p.opt);
        p.out.store(0, h, i, j, p.table.load(0, 0, k, h));
      }
}

// dtable[bucket(j − (offset + i)), h] += dbias[b, h, i, j]
void relative_backward(const relative_problem& p) {
  for (std::int64_t b = 0; b < p.Bd; ++b)
    for (std::int64_t h = 0; h < p.H; ++h)
      for (std::int64_t i = 0; i < p.Nq; ++i)
        for (std::int64_t j = 0; j < p.Nk; ++j) {
          const std::int64_t k = t5_bucket(j - (p.opt.query_offset + i), p.opt);
          p.dtable[k * p.H + h] += p.dbias.load(b, h, i, j);
        }
}

}  // namespace attn::positional_detail::reference

// src/family/scores/cosine.cc — cosine similarity: e = q·k / (‖q‖ ‖k‖ τ), 0 when q or k is the
// zero vector.
//
// Both routes normalise first: qp = q/(‖q‖τ), kp = k/‖k‖ (the zero vector stays 0), and e = qp·kp.
// With softmax, attn::attention runs on qp, kp (float32, float64 for float64 input) and the
// user's v (no copy when it already has that dtype).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/common.h"
#include "family/scores/score.h"

namespace attn::detail::family {
namespace {

void check(const score_call& c, score_state& s) {
  s.tau = c.spec->temperature;
  if (!(s.tau > 0.0) || !std::isfinite(s.tau))
    fail(c.op, fmt::format("cosine temperature = {} must be finite and > 0", s.tau));
}

// xp = x / (‖x‖ div) for every row of x [B, H, N, D], rows on `threads` threads.
void normalise(std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t D, const strided4& x, double div,
               const strided4& xp, int threads = 1) {
  std::vector<double> buf(std::size_t(D * threads), 0.0);
  for_rows_parallel(B, H, N, threads, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t, int t) {
    double* r = buf.data() + t * D;
    load_row(x, b, h, n, D, r);
    double nn = 0.0;
    for (std::int64_t e = 0; e < D; ++e) nn += r[e] * r[e];
    nn = std::sqrt(nn);
    const double m = nn > 0.0 ? 1.0 / (nn * div) : 0.0;  // a multiply an element, not a divide
    for (std::int64_t e = 0; e < D; ++e) r[e] *= m;
    store_row(xp, b, h, n, D, r);
  });
}

// xp = x/(‖x‖ div) = x̂/div:  dx = (dx̂ - x̂ (x̂·dx̂)) / ‖x‖ with dx̂ = dxp/div; 0 at the zero vector
// (the score is 0 around it). Writes dx; returns Σ dxp·xp (for dτ: ∂xp/∂div = -xp/div), summed
// row by row in row order whatever the thread count.
double unnormalise(std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t D, const strided4& x,
                   const strided4& dxp, double div, const strided4& dx, int threads = 1) {
  std::vector<double> buf(std::size_t(3 * D * threads), 0.0), dots(std::size_t(B * H * N), 0.0);
  for_rows_parallel(B, H, N, threads, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t row, int t) {
    double* r = buf.data() + 3 * t * D;
    double* g = r + D;
    double* d = g + D;
    load_row(x, b, h, n, D, r);
    load_row(dxp, b, h, n, D, g);
    double nn = 0.0;
    for (std::int64_t e = 0; e < D; ++e) nn += r[e] * r[e];
    nn = std::sqrt(nn);
    std::fill(d, d + D, 0.0);
    double dot = 0.0;
    if (nn > 0.0) {  // (reciprocals once a row: three divides an element cost this pass most of its time)
      const double inv = 1.0 / nn, idiv = 1.0 / div;
      double rg = 0.0;
      for (std::int64_t e = 0; e < D; ++e) rg += r[e] * g[e];
      const double proj = rg * inv * idiv;  // x̂·dx̂
      for (std::int64_t e = 0; e < D; ++e) d[e] = (g[e] * idiv - r[e] * inv * proj) * inv;
      dot = rg * inv * idiv;
    }
    dots[std::size_t(row)] = dot;
    store_row(dx, b, h, n, D, d);
  });
  double dot_xp = 0.0;
  for (double v : dots) dot_xp += v;
  return dot_xp;
}

void prepare(const score_call& c, const score_state& s, const f64_qkv& in, fproblem& fp) {
  fp.Pq = fp.Pk = c.D;
  fp.Qp.resize(in.q.size());
  fp.Kp.resize(in.k.size());
  normalise(c.B, c.Hq, c.Nq, c.D, rows_of(in.q, c.Hq, c.Nq, c.D), s.tau, rows_of(fp.Qp, c.Hq, c.Nq, c.D));
  normalise(c.B, c.Hkv, c.Nk, c.D, rows_of(in.k, c.Hkv, c.Nk, c.D), 1.0, rows_of(fp.Kp, c.Hkv, c.Nk, c.D));
}

// dτ = Σ dqp · ∂qp/∂τ = -Σ dqp·qp / τ
void backward(const score_call& c, const score_state& s, const f64_qkv& in, const fproblem&,
              const std::vector<double>& dQp, const grad_acc& acc, std::vector<double>& dq, std::vector<double>& dk,
              family_grads& g) {
  const double dot_qp = unnormalise(c.B, c.Hq, c.Nq, c.D, rows_of(in.q, c.Hq, c.Nq, c.D),
                                    rows_of(dQp, c.Hq, c.Nq, c.D), s.tau, rows_of(dq, c.Hq, c.Nq, c.D));
  unnormalise(c.B, c.Hkv, c.Nk, c.D, rows_of(in.k, c.Hkv, c.Nk, c.D), rows_of(acc.dKp, c.Hkv, c.Nk, c.D), 1.0,
              rows_of(dk, c.Hkv, c.Nk, c.D));
  g.dtemperature = -dot_qp / s.tau;
}

core_qkv core_prepare(const score_call& c, const score_state& s, const TensorView& q, const TensorView& k,
                      const TensorView& v) {
  const dtype t = core_dtype(c.type);
  Tensor qp = empty_bhnx(c.B, c.Hq, c.Nq, c.D, c.rank, t), kp = empty_bhnx(c.B, c.Hkv, c.Nk, c.D, c.rank, t);
  normalise(c.B, c.Hq, c.Nq, c.D, as_bhnx(q, c.Hq), s.tau, as_bhnx(qp, c.Hq), c.threads);
  normalise(c.B, c.Hkv, c.Nk, c.D, as_bhnx(k, c.Hkv), 1.0, as_bhnx(kp, c.Hkv), c.threads);
  return {qp, kp, with_dtype(v, t), 1.0};
}

void core_backward(const score_call& c, const score_state& s, const TensorView& q, const TensorView& k,
                   const core_qkv&, const attention_grads& cg, family_grads& g) {
  new_dq_dk(c, g);
  const double dot_qp =
      unnormalise(c.B, c.Hq, c.Nq, c.D, as_bhnx(q, c.Hq), as_bhnx(cg.dq, c.Hq), s.tau, as_bhnx(g.dq, c.Hq), c.threads);
  unnormalise(c.B, c.Hkv, c.Nk, c.D, as_bhnx(k, c.Hkv), as_bhnx(cg.dk, c.Hkv), 1.0, as_bhnx(g.dk, c.Hkv), c.threads);
  g.dtemperature = -dot_qp / s.tau;
}

}  // namespace

const score_def kCosineScore = {.check = check, .prepare = prepare, .backward = backward,
                                .core_prepare = core_prepare, .core_backward = core_backward};

}  // namespace attn::detail::family

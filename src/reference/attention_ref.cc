// src/reference/attention_ref.cc — the float64 reference of attn::attention, forward and
// backward. Plain loops, one query row at a time, every score materialised for that row;
// written to be read and trusted, not to be fast. It is the test oracle for every other
// backend and stays selectable (backend::reference, ATTN_BACKEND=reference).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/common.h"
#include "core/problem.h"

namespace attn::detail {
namespace {

// Rows [0, N) of one head of a strided4 as a contiguous float64 [N, X] buffer.
std::vector<double> gather(const strided4& t, std::int64_t b, std::int64_t h, std::int64_t N, std::int64_t X) {
  std::vector<double> r(std::size_t(N * X));
  for (std::int64_t n = 0; n < N; ++n)
    for (std::int64_t x = 0; x < X; ++x) r[std::size_t(n * X + x)] = t.load(b, h, n, x);
  return r;
}

// The scores of one query row. For each key j:
//   x[j]   = scale · q·k_j                    ("scaled")
//   c[j]   = softcap · tanh(x / softcap)      ("softcapped"; == x without softcap)
//   s[j]   = c[j] + bias, or -inf when key j is excluded   ("biased")
struct row_scores {
  std::vector<double> x, c, s;
};

void score_row(const problem& p, std::int64_t b, std::int64_t h, std::int64_t i, const double* q,
               const std::vector<double>& K, row_scores& r) {
  r.x.assign(std::size_t(p.Nk), 0.0);
  r.c.assign(std::size_t(p.Nk), 0.0);
  r.s.assign(std::size_t(p.Nk), kNegInf);
  const auto [lo, hi] = p.key_range(b, i);
  for (std::int64_t j = 0; j < p.Nk; ++j) {
    double dot = 0.0;
    for (std::int64_t d = 0; d < p.D; ++d) dot += q[d] * K[std::size_t(j * p.D + d)];
    const double x = p.scale * dot;
    const double c = p.softcap > 0.0 ? p.softcap * std::tanh(x / p.softcap) : x;
    r.x[std::size_t(j)] = x;
    r.c[std::size_t(j)] = c;
    if (j >= lo && j < hi) r.s[std::size_t(j)] = c + p.bias(b, h, i, j);
  }
}

double sink_of(const problem& p, std::int64_t h) { return p.sinks.empty() ? kNegInf : p.sinks[std::size_t(h)]; }

// The softmax of one row of scores s (-inf: key excluded): fills prob (and *sink_prob, the
// sink's share) and returns lse = log(Σ_j exp(s_j) + exp(sink)), computed around the row
// maximum m. Each probability is exp(s_j - m) / Σ, not exp(s_j - lse): past |m| ≈ 1e15 the
// float64 lse = m + log Σ rounds to m, and exp(s_j - lse) would then give two tied keys
// weight 1 each (ALiBi slopes near 1e19, fuzz/corpus/api/cpu_alibi_huge_slope_*). Special
// values (attention.h): a NaN or +inf among the kept scores has no softmax, so lse and every
// kept probability are NaN; with no key kept, lse = -inf and every probability 0.
double row_softmax(const problem& p, std::int64_t h, const std::vector<double>& s, std::vector<double>& prob,
                   double* sink_prob = nullptr) {
  std::fill(prob.begin(), prob.end(), 0.0);
  if (sink_prob) *sink_prob = 0.0;
  double m = sink_of(p, h);
  bool nan_row = false;
  for (double x : s) {
    if (std::isnan(x) || x == -kNegInf) nan_row = true;
    else m = std::max(m, x);
  }
  if (nan_row) {
    for (std::size_t j = 0; j < s.size(); ++j)
      if (s[j] != kNegInf) prob[j] = std::numeric_limits<double>::quiet_NaN();
    if (sink_prob) *sink_prob = std::numeric_limits<double>::quiet_NaN();
    return std::numeric_limits<double>::quiet_NaN();
  }
  if (m == kNegInf) return kNegInf;  // fully masked row
  const double sink = p.sinks.empty() ? 0.0 : std::exp(sink_of(p, h) - m);
  double sum = sink;
  for (double x : s) sum += std::exp(x - m);
  for (std::size_t j = 0; j < s.size(); ++j)
    if (s[j] != kNegInf) prob[j] = std::exp(s[j] - m) / sum;
  if (sink_prob) *sink_prob = sink / sum;
  return m + std::log(sum);
}

// Row i of head h in batch b (q: its float64 query; K, V: its key/value head as float64 rows):
// out, lse and the requested intermediate.
struct row_buffers {
  row_scores r;
  std::vector<double> prob, acc;
  explicit row_buffers(const problem& p) : prob(std::size_t(p.Nk)), acc(std::size_t(p.Dv)) {}
};

void forward_row(const problem& p, const forward_outputs& o, std::int64_t b, std::int64_t h, std::int64_t i,
                 const double* q, const std::vector<double>& K, const std::vector<double>& V, row_buffers& w) {
  score_row(p, b, h, i, q, K, w.r);
  const double lse = row_softmax(p, h, w.r.s, w.prob);
  std::fill(w.acc.begin(), w.acc.end(), std::isnan(lse) ? lse : 0.0);
  for (std::int64_t j = 0; j < p.Nk && !std::isnan(lse); ++j) {
    if (w.r.s[std::size_t(j)] == kNegInf) continue;  // excluded: its value is never read
    const double pj = w.prob[std::size_t(j)];
    for (std::int64_t d = 0; d < p.Dv; ++d) w.acc[std::size_t(d)] += pj * V[std::size_t(j * p.Dv + d)];
  }
  for (std::int64_t d = 0; d < p.Dv; ++d) o.out.store(b, h, i, d, w.acc[std::size_t(d)]);
  store_from_double(o.lse, o.lse_type, (b * p.Hq + h) * p.Nq + i, lse);
  if (o.qk_mode != qk_output::none) {
    const std::vector<double>& src = o.qk_mode == qk_output::scaled       ? w.r.x
                                     : o.qk_mode == qk_output::softcapped ? w.r.c
                                     : o.qk_mode == qk_output::biased     ? w.r.s
                                                                          : w.prob;
    for (std::int64_t j = 0; j < p.Nk; ++j) o.qk.store(b, h, i, j, src[std::size_t(j)]);
  }
}

void forward(const problem& p, const forward_outputs& o) {
  row_buffers w(p);
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t hk = 0; hk < p.Hkv; ++hk) {
      const std::vector<double> K = gather(p.k, b, hk, p.Nk, p.D);
      const std::vector<double> V = gather(p.v, b, hk, p.Nk, p.Dv);
      for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
        const std::vector<double> Q = gather(p.q, b, h, p.Nq, p.D);
        for (std::int64_t i = 0; i < p.Nq; ++i) forward_row(p, o, b, h, i, Q.data() + i * p.D, K, V, w);
      }
    }
  }
}

// Whether a saved lse is this row's own (float64 own_lse), to the precision of its type: a saved
// float32 lse carries the fast backend's rounding (relative 1e-5 covers long rows), a float64
// one the reference's. A block of a longer row (ring attention) has a smaller own lse.
bool same_lse(double own_lse, double saved_lse, dtype saved_type) {
  const double tol = (saved_type == dtype::f64 ? 1e-12 : 1e-5) * std::max(1.0, std::abs(own_lse));
  return std::abs(own_lse - saved_lse) <= tol;
}

// Backward of one row (dO_i = dout row, Δ_i = Σ_j p_j dp_j = dO_i·O_i):
//   p_j  = exp(s_j - lse) (= exp(s_j - m) / Σ)  dp_j = dO_i·v_j
//   ds_j = p_j (dp_j - Δ_i)                    -> dmask_j, dalibi (-|pos_i - j|)
//   dx_j = ds_j (1 - (c_j/softcap)²)           (softcap' ; 1 without softcap)
//   dq_i += scale dx_j k_j    dk_j += scale dx_j q_i    dv_j += p_j dO_i
//   dsink_h -= exp(sink_h - lse) Δ_i
void backward(const problem& p, const backward_io& io) {
  row_scores r;
  std::vector<double> dq(std::size_t(p.D)), dO(std::size_t(p.Dv)), prob(std::size_t(p.Nk)), dp(std::size_t(p.Nk));
  for (std::int64_t b = 0; b < p.B; ++b) {
    for (std::int64_t hk = 0; hk < p.Hkv; ++hk) {
      const std::vector<double> K = gather(p.k, b, hk, p.Nk, p.D);
      const std::vector<double> V = gather(p.v, b, hk, p.Nk, p.Dv);
      std::vector<double> dK(K.size(), 0.0), dV(V.size(), 0.0);
      for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
        const std::vector<double> Q = gather(p.q, b, h, p.Nq, p.D);
        for (std::int64_t i = 0; i < p.Nq; ++i) {
          std::fill(dq.begin(), dq.end(), 0.0);
          const double* q = Q.data() + i * p.D;
          score_row(p, b, h, i, q, K, r);
          // The row's own float64 lse, recomputed: the saved one (float32 for float32 inputs)
          // would limit the oracle to float32's precision of s - lse. It is used when the saved
          // lse is this row's to the saved type's precision (or overflowed); otherwise these keys
          // are one block of a longer row (ring attention), and the saved lse and out — the whole
          // row's — define p_j and Δ_i.
          double sink_prob = 0.0;
          const double own_lse = row_softmax(p, h, r.s, prob, &sink_prob);
          const double saved_lse = load_as_double(io.lse, io.lse_type, (b * p.Hq + h) * p.Nq + i);
          const bool whole_row = !std::isfinite(saved_lse) || same_lse(own_lse, saved_lse, io.lse_type);
          const double lse = whole_row ? own_lse : saved_lse;
          if (!whole_row) {
            for (std::int64_t j = 0; j < p.Nk; ++j) prob[std::size_t(j)] = std::exp(r.s[std::size_t(j)] - lse);
            sink_prob = std::exp(sink_of(p, h) - lse);
          }
          if (lse != kNegInf) {
            for (std::int64_t d = 0; d < p.Dv; ++d) dO[std::size_t(d)] = io.dout.load(b, h, i, d);
            double delta = 0.0;
            if (!whole_row)
              for (std::int64_t d = 0; d < p.Dv; ++d) delta += dO[std::size_t(d)] * io.out.load(b, h, i, d);
            for (std::int64_t j = 0; j < p.Nk; ++j) {
              if (r.s[std::size_t(j)] == kNegInf) continue;  // excluded key: no gradient
              const double pj = prob[std::size_t(j)];
              double dpj = 0.0;
              for (std::int64_t d = 0; d < p.Dv; ++d) dpj += dO[std::size_t(d)] * V[std::size_t(j * p.Dv + d)];
              dp[std::size_t(j)] = dpj;
              if (whole_row) delta += pj * dpj;
            }
            for (std::int64_t j = 0; j < p.Nk; ++j) {
              const double pj = prob[std::size_t(j)];
              if (r.s[std::size_t(j)] == kNegInf || pj == 0.0) continue;
              const double ds = pj * (dp[std::size_t(j)] - delta);
              if (io.dmask.data) {
                if (io.dmask.type == dtype::f64) static_cast<double*>(io.dmask.data)[io.dmask.offset(b, h, i, j)] += ds;
                else io.dmask.store(b, h, i, j, io.dmask.load(b, h, i, j) + ds);  // one term (f32 dmask)
              }
              if (io.dalibi) io.dalibi[b * p.Hq + h] -= ds * double(std::abs(p.query_pos(b, i) - j));
              double dx = ds;
              if (p.softcap > 0.0) {
                const double t = r.c[std::size_t(j)] / p.softcap;
                dx *= 1.0 - t * t;
              }
              for (std::int64_t d = 0; d < p.D; ++d) {
                dq[std::size_t(d)] += p.scale * dx * K[std::size_t(j * p.D + d)];
                dK[std::size_t(j * p.D + d)] += p.scale * dx * q[d];
              }
              for (std::int64_t d = 0; d < p.Dv; ++d) dV[std::size_t(j * p.Dv + d)] += pj * dO[std::size_t(d)];
            }
            if (io.dsinks) io.dsinks[h] -= sink_prob * delta;
          }
          for (std::int64_t d = 0; d < p.D; ++d) io.dq.store(b, h, i, d, dq[std::size_t(d)]);
        }
      }
      for (std::int64_t j = 0; j < p.Nk; ++j) {
        for (std::int64_t d = 0; d < p.D; ++d) io.dk.store(b, hk, j, d, dK[std::size_t(j * p.D + d)]);
        for (std::int64_t d = 0; d < p.Dv; ++d) io.dv.store(b, hk, j, d, dV[std::size_t(j * p.Dv + d)]);
      }
    }
  }
}

std::string always(const problem&, const backend_request&) { return {}; }
std::string path(const problem&, const backend_request&) { return "float64, one query row at a time"; }

}  // namespace

void reference_forward_rows(const problem& p, const forward_outputs& o, std::span<const std::int64_t> rows) {
  row_buffers w(p);
  std::vector<double> q(std::size_t(p.D));
  for (const std::int64_t row : rows) {
    const std::int64_t i = row % p.Nq, h = row / p.Nq % p.Hq, b = row / p.Nq / p.Hq;
    const std::vector<double> K = gather(p.k, b, h / p.group(), p.Nk, p.D);
    const std::vector<double> V = gather(p.v, b, h / p.group(), p.Nk, p.Dv);
    for (std::int64_t d = 0; d < p.D; ++d) q[std::size_t(d)] = p.q.load(b, h, i, d);
    forward_row(p, o, b, h, i, q.data(), K, V, w);
  }
}

const backend_impl& reference_backend() {
  static const backend_impl impl{backend::reference, always, path, forward, backward};
  return impl;
}

}  // namespace attn::detail

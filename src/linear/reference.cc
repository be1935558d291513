// src/linear/reference.cc — the float64 reference of linear: one output element at a time,
// every sum in double, rounded once to the output dtype. The test oracle of blas.cc.
#include "linear/linear_impl.h"

namespace attn::linear_detail::reference {

// y[m, n] = Σ_k x[m, k] W[n, k] + b[n]
void forward(const problem& p) {
  for (std::int64_t m = 0; m < p.M; ++m)
    for (std::int64_t n = 0; n < p.N; ++n) {
      double s = p.b.data ? p.b.load(n) : 0.0;
      for (std::int64_t k = 0; k < p.K; ++k) s += p.x.load(m, k) * p.W.load(n, k);
      p.y.store(m, n, s);
    }
}

// From y[m, n] = Σ_k x[m, k] W[n, k] + b[n]:
//   dx[m, k] = Σ_n dy[m, n] W[n, k]
//   dW[n, k] = Σ_m dy[m, n] x[m, k]
//   db[n]    = Σ_m dy[m, n]
void backward(const problem& p) {
  if (p.dx.data)
    for (std::int64_t m = 0; m < p.M; ++m)
      for (std::int64_t k = 0; k < p.K; ++k) {
        double s = 0;
        for (std::int64_t n = 0; n < p.N; ++n) s += p.dy.load(m, n) * p.W.load(n, k);
        p.dx.store(m, k, s);
      }
  if (p.dW.data)
    for (std::int64_t n = 0; n < p.N; ++n)
      for (std::int64_t k = 0; k < p.K; ++k) {
        double s = 0;
        for (std::int64_t m = 0; m < p.M; ++m) s += p.dy.load(m, n) * p.x.load(m, k);
        p.dW.store(n, k, s);
      }
  if (p.db.data)
    for (std::int64_t n = 0; n < p.N; ++n) {
      double s = 0;
      for (std::int64_t m = 0; m < p.M; ++m) s += p.dy.load(m, n);
      p.db.store(n, s);
    }
}

}  // namespace attn::linear_detail::reference

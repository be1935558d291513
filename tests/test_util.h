// tests/test_util.h — helpers shared by attn's tests: random tensors, comparisons with
// dtype-aware tolerances, and EXPECT_THROW_MSG (an exception of type attn::error whose
// message contains a substring).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>

#include "attn/attn.h"

namespace attn::testing {

// An environment variable set for a scope (the library reads its ATTN_* switches per call).
struct env_scope {
  std::string name;
  env_scope(const char* n, const char* value) : name(n) { setenv(n, value, 1); }
  ~env_scope() { unsetenv(name.c_str()); }
  env_scope(const env_scope&) = delete;
  env_scope& operator=(const env_scope&) = delete;
};

inline Tensor random_tensor(const Shape& shape, dtype t, std::mt19937& rng, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(std::size_t(TensorView(nullptr, t, shape).numel()));
  for (auto& x : v) x = u(rng);
  return Tensor::from_values(shape, t, v);
}

// An int64 tensor of the given values (sequence starts, block tables, lengths).
inline Tensor index_tensor(Shape shape, const std::vector<std::int64_t>& v) {
  return Tensor::from_values(std::move(shape), dtype::i64, std::vector<double>(v.begin(), v.end()));
}
inline Tensor index_tensor(const std::vector<std::int64_t>& v) { return index_tensor({std::int64_t(v.size())}, v); }

inline Tensor random_bool(const Shape& shape, std::mt19937& rng, double p_true = 0.7) {
  std::bernoulli_distribution u(p_true);
  std::vector<double> v(std::size_t(TensorView(nullptr, dtype::boolean, shape).numel()));
  for (auto& x : v) x = u(rng) ? 1.0 : 0.0;
  return Tensor::from_values(shape, dtype::boolean, v);
}

// Tolerance for comparing a result computed in `t` against a float64 reference.
inline double tolerance_for(dtype t) {
  switch (t) {
    case dtype::f64: return 1e-10;
    case dtype::f32: return 2e-5;
    case dtype::f16: return 2e-3;
    case dtype::bf16: return 1.6e-2;
    default: return 0;
  }
}

// |got - want| <= atol + rtol |want| elementwise (NaN and inf must match exactly).
inline ::testing::AssertionResult all_close(const TensorView& got, const TensorView& want, double atol, double rtol) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape());
  const auto g = to_vector(got), w = to_vector(want);
  double worst = 0;
  std::size_t wi = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) || std::isnan(w[i]) || std::isinf(g[i]) || std::isinf(w[i])) {
      if (!(g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))))
        return ::testing::AssertionFailure() << "at " << i << ": got " << g[i] << ", want " << w[i];
      continue;
    }
    const double ex = std::abs(g[i] - w[i]) - (atol + rtol * std::abs(w[i]));
    if (ex > worst) worst = ex, wi = i;
  }
  if (worst > 0)
    return ::testing::AssertionFailure() << "worst at flat index " << wi << ": got " << g[wi] << ", want " << w[wi]
                                         << " (atol " << atol << ", rtol " << rtol << ")";
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult all_close(const TensorView& got, const TensorView& want, double tol) {
  return all_close(got, want, tol, tol);
}

// Σ y ∘ w over every element: a scalar loss whose gradient with respect to y is w.
inline double weighted_sum(const TensorView& y, const TensorView& w) {
  const auto a = to_vector(y), b = to_vector(w);
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Runs the float64 reference path of every attn function (ATTN_BACKEND=reference) while alive.
struct reference_scope {
  reference_scope() { setenv("ATTN_BACKEND", "reference", 1); }
  ~reference_scope() { unsetenv("ATTN_BACKEND"); }
  reference_scope(const reference_scope&) = delete;
  reference_scope& operator=(const reference_scope&) = delete;
};

// Checks `grad` against central differences of the scalar `loss` over every element of the
// float64 tensor `x`: |(L(x + eps·e_i) − L(x − eps·e_i)) / 2eps − grad_i| <= tol.
template <class Loss>
void expect_matches_finite_differences(const Tensor& x, const Tensor& grad, Loss loss, const char* what,
                                       double tol = 1e-7) {
  ASSERT_EQ(grad.shape(), x.shape());
  const double eps = 1e-6;
  const Tensor g = grad.to(dtype::f64);
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    Tensor xp = Tensor::copy_of(x), xm = Tensor::copy_of(x);
    xp.data_as<double>()[i] += eps;
    xm.data_as<double>()[i] -= eps;
    const double fd = (loss(xp) - loss(xm)) / (2 * eps);
    EXPECT_NEAR(fd, g.data_as<double>()[i], tol) << what << " element " << i;
  }
}

inline bool any_nan(const TensorView& t) {
  for (double x : to_vector(t))
    if (std::isnan(x)) return true;
  return false;
}

// Compares `analytic` with the central differences (f(t + h) - f(t - h)) / 2h of `loss` with
// respect to every element of `t`, a float64 tensor that `loss` reads (t is perturbed in place
// and restored). Tolerance: atol + rtol |fd|.
inline void expect_gradient(const std::string& what, const Tensor& t, const TensorView& analytic,
                            const std::function<double()>& loss, double atol = 1e-6, double rtol = 1e-6) {
  ASSERT_EQ(t.type(), dtype::f64) << what;
  ASSERT_EQ(analytic.shape(), t.shape()) << what;
  const double h = 1e-6;
  double* p = t.data_as<double>();
  const auto a = to_vector(analytic);
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = p[i];
    p[i] = x + h;
    const double lp = loss();
    p[i] = x - h;
    const double lm = loss();
    p[i] = x;
    const double fd = (lp - lm) / (2 * h);
    EXPECT_NEAR(a[std::size_t(i)], fd, atol + rtol * std::abs(fd)) << what << " element " << i;
  }
}

}  // namespace attn::testing

// Expects `stmt` to throw attn::error with a message containing `substr`.
#define EXPECT_THROW_MSG(stmt, substr)                                                              \
  do {                                                                                              \
    try {                                                                                           \
      stmt;                                                                                         \
      ADD_FAILURE() << "expected attn::error containing \"" << (substr) << "\", nothing thrown";    \
    } catch (const attn::error& e_) {                                                               \
      EXPECT_NE(std::string(e_.what()).find(substr), std::string::npos)                             \
          << "message \"" << e_.what() << "\" lacks \"" << (substr) << "\"";                        \
    }                                                                                               \
  } while (0)

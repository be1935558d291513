// src/nn/init.cc — the seeded generator and the weight initialisations.
#include "attn/nn/init.h"

#include <cmath>
#include <numbers>

#include "nn/nn_impl.h"

namespace attn::nn {

double rng::uniform() { return double(engine_() >> 11) * 0x1.0p-53; }

double rng::uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

double rng::normal(double mean, double stddev) {
  if (has_spare_) {
    has_spare_ = false;
    return mean + stddev * spare_;
  }
  double u1 = uniform();
  while (u1 <= 0.0) u1 = uniform();
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2 * std::numbers::pi * u2);
  has_spare_ = true;
  return mean + stddev * r * std::cos(2 * std::numbers::pi * u2);
}

std::int64_t rng::integer(std::int64_t lo, std::int64_t hi) {
  const std::uint64_t span = std::uint64_t(hi - lo) + 1;
  if (span == 0) return std::int64_t(engine_());  // the whole int64 range
  // Rejection keeps every value equally likely.
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  std::uint64_t x;
  do x = engine_();
  while (x >= limit);
  return lo + std::int64_t(x % span);
}

namespace {

std::int64_t receptive(const Tensor& w) {
  std::int64_t r = 1;
  for (int i = 2; i < w.rank(); ++i) r *= w.size(i);
  return r;
}

void check(const char* op, const Tensor& t) {
  if (!t.defined() || !is_floating(t.type()))
    detail::fail(op, fmt::format("the tensor has dtype {}, expected a float dtype", dtype_name(t.type())));
}

template <class F>
void fill(Tensor& t, F&& value) {
  for (std::int64_t i = 0; i < t.numel(); ++i) store_from_double(t.data(), t.type(), i, value());
}

}  // namespace

std::int64_t fan_in(const Tensor& w) { return w.rank() < 2 ? (w.rank() == 1 ? w.size(0) : 1) : w.size(1) * receptive(w); }
std::int64_t fan_out(const Tensor& w) { return w.rank() < 2 ? (w.rank() == 1 ? w.size(0) : 1) : w.size(0) * receptive(w); }

void fill_uniform(Tensor& t, double lo, double hi, rng& gen) {
  check("fill_uniform", t);
  fill(t, [&] { return gen.uniform(lo, hi); });
}

void fill_normal(Tensor& t, double mean, double stddev, rng& gen) {
  check("fill_normal", t);
  fill(t, [&] { return gen.normal(mean, stddev); });
}

void fill_constant(Tensor& t, double value) {
  check("fill_constant", t);
  fill(t, [&] { return value; });
}

void xavier_uniform(Tensor& t, rng& gen, double gain) {
  check("xavier_uniform", t);
  const double a = gain * std::sqrt(6.0 / double(std::max<std::int64_t>(1, fan_in(t) + fan_out(t))));
  fill(t, [&] { return gen.uniform(-a, a); });
}

void kaiming_uniform(Tensor& t, rng& gen, double gain) {
  check("kaiming_uniform", t);
  const double a = gain * std::sqrt(3.0 / double(std::max<std::int64_t>(1, fan_in(t))));
  fill(t, [&] { return gen.uniform(-a, a); });
}

void kaiming_normal(Tensor& t, rng& gen, double gain) {
  check("kaiming_normal", t);
  const double s = gain / std::sqrt(double(std::max<std::int64_t>(1, fan_in(t))));
  fill(t, [&] { return gen.normal(0.0, s); });
}

}  // namespace attn::nn

// attn/nn/init.h — a seeded random generator and the initialisations of the layers.
//
// The generator is a 64-bit Mersenne twister with its own uniform and normal transforms (not
// std::uniform_real_distribution / std::normal_distribution, whose output differs between
// standard libraries), so a seed gives the same weights with every compiler.
//
//   attn::nn::rng gen(42);
//   attn::Tensor W = attn::Tensor::empty({256, 128}, attn::dtype::f32);
//   attn::nn::xavier_uniform(W, gen);     // U(-a, a), a = sqrt(6 / (fan_in + fan_out))
#pragma once

#include <cstdint>
#include <random>

#include "attn/tensor.h"

namespace attn::nn {

class rng {
 public:
  explicit rng(std::uint64_t seed = 0) : engine_(seed) {}
  double uniform();                       // [0, 1), 53 random bits
  double uniform(double lo, double hi);   // [lo, hi)
  double normal(double mean = 0.0, double stddev = 1.0);  // Box–Muller
  std::uint64_t next() { return engine_(); }
  std::int64_t integer(std::int64_t lo, std::int64_t hi);  // [lo, hi], hi >= lo

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};

// fan_in / fan_out of a weight: [out, in] -> in / out; [out, in, ...] multiplies the rest into
// both (PyTorch's convention); a vector [n] has fan_in = fan_out = n.
std::int64_t fan_in(const Tensor& w);
std::int64_t fan_out(const Tensor& w);

// Each fills t (float dtype, any shape) in place.
void fill_uniform(Tensor& t, double lo, double hi, rng& gen);
void fill_normal(Tensor& t, double mean, double stddev, rng& gen);
void fill_constant(Tensor& t, double value);
// Glorot & Bengio 2010: U(-a, a), a = gain · sqrt(6 / (fan_in + fan_out)).
void xavier_uniform(Tensor& t, rng& gen, double gain = 1.0);
// He et al. 2015: U(-a, a), a = gain · sqrt(3 / fan_in), gain = sqrt(2) for ReLU.
void kaiming_uniform(Tensor& t, rng& gen, double gain = 1.4142135623730951);
// N(0, gain / sqrt(fan_in)).
void kaiming_normal(Tensor& t, rng& gen, double gain = 1.4142135623730951);

}  // namespace attn::nn

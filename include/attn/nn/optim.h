// attn/nn/optim.h — optimizers, gradient clipping and a learning-rate schedule over a
// parameter_list (parameter.h). Updates are computed in double; state lives in the optimizer,
// one entry per parameter of the list it was first stepped with (a different list throws).
//
//   SGD (PyTorch's, dampening 0):  g = grad + wd·p;  buf = μ·buf + g (buf₁ = g);
//                                  g = nesterov ? g + μ·buf : buf;  p −= lr·g
//   Adam (Kingma & Ba 2015):       g = grad + wd·p;  m = β₁m + (1−β₁)g;  v = β₂v + (1−β₂)g²;
//                                  p −= lr · m̂ / (√v̂ + ε),  m̂ = m/(1−β₁ᵗ), v̂ = v/(1−β₂ᵗ)
//   AdamW (Loshchilov & Hutter 2019): p −= lr·wd·p first, then Adam with wd = 0
//
//   attn::nn::parameter_list ps;  model.parameters(ps);
//   attn::nn::adam opt{.lr = 3e-4, .weight_decay = 0.01, .decoupled = true};   // AdamW
//   for (step ...) {
//     attn::nn::zero_grad(ps);  ...forward, backward...
//     attn::nn::clip_grad_norm(ps, 1.0);
//     opt.lr = attn::nn::warmup_cosine(step, 100, 5000, 3e-4);
//     opt.step(ps);
//   }
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/nn/parameter.h"

namespace attn::nn {

struct sgd {
  double lr = 1e-2;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;

  void step(const parameter_list& params);

  std::vector<std::string> names{};             // the list the state belongs to
  std::vector<std::vector<double>> velocity{};  // one buffer per parameter (with momentum)
};

struct adam {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = false;  // true: AdamW

  void step(const parameter_list& params);

  std::int64_t t = 0;  // steps taken
  std::vector<std::string> names{};
  std::vector<std::vector<double>> m{}, v{};
};

// Scales every gradient by max_norm / norm when the global L2 norm exceeds max_norm
// (PyTorch's clip_grad_norm_, with its 1e-6 in the denominator); returns the norm before.
double clip_grad_norm(const parameter_list& params, double max_norm);

// grad *= factor for every parameter (e.g. 1 / micro-batches after accumulating several).
void scale_grad(const parameter_list& params, double factor);

// Linear warmup over steps [0, warmup) to base_lr, then a half cosine down to min_lr at step
// `total`, min_lr after it. Steps count from 0.
double warmup_cosine(std::int64_t step, std::int64_t warmup, std::int64_t total, double base_lr, double min_lr = 0.0);

}  // namespace attn::nn

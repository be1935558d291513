// src/nn/optim.cc — SGD, Adam/AdamW, gradient clipping and the warmup + cosine schedule.
#include "attn/nn/optim.h"

#include <cmath>
#include <numbers>

#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

// The state belongs to the list of the first step; later lists must name the same parameters
// in the same order with the same sizes.
using state = std::vector<std::vector<double>>;  // one buffer per parameter

void bind(const char* op, std::vector<std::string>& names, std::initializer_list<state*> states,
          const parameter_list& params) {
  const state& first = **states.begin();
  if (names.empty()) {
    for (const parameter_ref& p : params) {
      detail::check_compute_dtype(op, p.name.c_str(), *p.value);
      names.push_back(p.name);
      for (auto* s : states) s->emplace_back(std::size_t(p.value->numel()), 0.0);
    }
    return;
  }
  if (names.size() != params.size())
    detail::fail(op, fmt::format("the parameter list has {} entries, the optimizer was first stepped with {}",
                                 params.size(), names.size()));
  for (std::size_t i = 0; i < params.size(); ++i)
    if (params[i].name != names[i] || std::size_t(params[i].value->numel()) != first[i].size())
      detail::fail(op, fmt::format("parameter {} is '{}' with {} elements, the optimizer's state is for '{}' with {}",
                                   i, params[i].name, params[i].value->numel(), names[i], first[i].size()));
}

// f(value, grad, i) over every element of p, in double; the result is stored back as the value.
template <class F>
void update(const parameter_ref& p, F&& f) {
  detail::check_compute_dtype("optimizer", p.name.c_str(), *p.value);
  detail::with_type(p.value->type(), [&](auto zero) {
    using T = decltype(zero);
    T* w = detail::ptr<T>(*p.value);
    const T* g = detail::ptr<T>(*p.grad);
    for (std::int64_t i = 0; i < p.value->numel(); ++i) w[i] = T(f(double(w[i]), double(g[i]), std::size_t(i)));
  });
}

}  // namespace

void sgd::step(const parameter_list& params) {
  if (momentum != 0.0) bind("sgd", names, {&velocity}, params);  // without momentum SGD has no state
  for (std::size_t k = 0; k < params.size(); ++k)
    update(params[k], [&](double w, double g, std::size_t i) {
      g += weight_decay * w;
      if (momentum != 0.0) {
        double& buf = velocity[k][i];
        buf = momentum * buf + g;  // buf starts at 0, so the first step gives buf = g
        g = nesterov ? g + momentum * buf : buf;
      }
      return w - lr * g;
    });
}

void adam::step(const parameter_list& params) {
  bind(decoupled ? "adamw" : "adam", names, {&m, &v}, params);
  ++t;
  const double c1 = 1.0 - std::pow(beta1, double(t)), c2 = 1.0 - std::pow(beta2, double(t));
  for (std::size_t k = 0; k < params.size(); ++k)
    update(params[k], [&](double w, double g, std::size_t i) {
      if (decoupled)
        w -= lr * weight_decay * w;
      else
        g += weight_decay * w;
      double& mi = m[k][i];
      double& vi = v[k][i];
      mi = beta1 * mi + (1 - beta1) * g;
      vi = beta2 * vi + (1 - beta2) * g * g;
      return w - lr * (mi / c1) / (std::sqrt(vi / c2) + eps);
    });
}

double clip_grad_norm(const parameter_list& params, double max_norm) {
  double ss = 0;
  for (const parameter_ref& p : params)
    for (double g : p.grad->to_vector()) ss += g * g;
  const double norm = std::sqrt(ss);
  if (norm > max_norm) scale_grad(params, max_norm / (norm + 1e-6));
  return norm;
}

void scale_grad(const parameter_list& params, double factor) {
  for (const parameter_ref& p : params)
    detail::with_type(p.grad->type(), [&](auto zero) {
      using T = decltype(zero);
      T* g = detail::ptr<T>(*p.grad);
      for (std::int64_t i = 0; i < p.grad->numel(); ++i) g[i] = T(g[i] * factor);
    });
}

double warmup_cosine(std::int64_t step, std::int64_t warmup, std::int64_t total, double base_lr, double min_lr) {
  if (step < warmup) return base_lr * double(step + 1) / double(warmup);
  if (step >= total) return min_lr;
  const double progress = double(step - warmup) / double(std::max<std::int64_t>(1, total - warmup));
  return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
}

}  // namespace attn::nn

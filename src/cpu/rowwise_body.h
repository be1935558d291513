// src/cpu/rowwise_body.h — the row-wise kernels of rowwise.h for one ISA. rowwise_<isa>.cc
// defines W (floats per vector) in attn::detail::cpu::(anonymous), then includes this file;
// everything here is in an anonymous namespace (see kernels.h on why).
#pragma once

#include <cstdint>

#include "cpu/rowwise.h"
#include "cpu/simd.h"

namespace attn::detail::cpu {
namespace {

// ½x(1 + erf(x/√2)) on W lanes; see rowwise.h for the erfc form.
inline vf vgelu(vf x) {
  const vf z = (vf)((vi)x & splati(0x7fffffff)) * splat(0.70710678118654752f);
  const vf t = splat(1.0f) / (splat(0.3275911f) * z + splat(1.0f));
  vf p = splat(1.061405429f);
  p = p * t + splat(-1.453152027f);
  p = p * t + splat(1.421413741f);
  p = p * t + splat(-0.284496736f);
  p = p * t + splat(0.254829592f);
  const vf erfc = p * t * vexp(-(z * z));
  const vf one_plus_erf = x < splat(0.0f) ? erfc : splat(2.0f) - erfc;
  return splat(0.5f) * x * one_plus_erf;
}

void gelu_rows(const float* x, float* y, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + W <= n; i += W) store(y + i, vgelu(load(x + i)));
  if (i < n) {  // the tail through a padded vector
    float buf[W] = {};
    for (std::int64_t j = i; j < n; ++j) buf[j - i] = x[j];
    store(buf, vgelu(load(buf)));
    for (std::int64_t j = i; j < n; ++j) y[j] = buf[j - i];
  }
}

inline float lane_sum(vf v) {
  float s = 0.0f;
  for (int l = 0; l < W; ++l) s += v[l];
  return s;
}

void layer_norm_row(const float* x, const float* r, const float* w, const float* b, float* y, std::int64_t C,
                    float eps) {
  // Pass 1: y = x + r (when r), and the sum.
  vf acc = vf{};
  float tail = 0.0f;
  std::int64_t c = 0;
  const float* s = x;
  if (r) {
    for (; c + W <= C; c += W) {
      const vf v = load(x + c) + load(r + c);
      store(y + c, v);
      acc += v;
    }
    for (; c < C; ++c) y[c] = x[c] + r[c], tail += y[c];
    s = y;
  } else {
    for (; c + W <= C; c += W) acc += load(x + c);
    for (; c < C; ++c) tail += x[c];
  }
  const float mean = (lane_sum(acc) + tail) / float(C);
  // Pass 2: Σ (s - μ)².
  acc = vf{}, tail = 0.0f;
  const vf m = splat(mean);
  for (c = 0; c + W <= C; c += W) {
    const vf d = load(s + c) - m;
    acc += d * d;
  }
  for (; c < C; ++c) tail += (s[c] - mean) * (s[c] - mean);
  const float rstd = 1.0f / __builtin_sqrtf((lane_sum(acc) + tail) / float(C) + eps);
  // Pass 3: y = (s - μ) · rstd · w + b.
  const vf rs = splat(rstd);
  for (c = 0; c + W <= C; c += W) store(y + c, (load(s + c) - m) * rs * load(w + c) + load(b + c));
  for (; c < C; ++c) y[c] = (s[c] - mean) * rstd * w[c] + b[c];
}

constexpr rowwise_table make_rowwise(const char* name) { return {name, gelu_rows, layer_norm_row}; }

}  // namespace
}  // namespace attn::detail::cpu

// src/cpu/rowwise.h — the plain interface of the row-wise f32 kernels that surround the GEMMs
// and attention in a transformer layer: the exact-erf GELU and LayerNorm (with an optional
// residual added first). No SIMD types here; rowwise_body.h holds the code, compiled once per
// ISA (rowwise_<isa>.cc), and isa.cc picks the table (select_rowwise).
//
// Numerics (f32 throughout, as PyTorch's CPU kernels):
//   gelu(x) = ½x(1 + erf(x/√2)), with 1 + erf(-z) written as erfc(z) so negative x loses no
//     digits; erfc(z) = t·P(t)·e^{-z²}, t = 1/(1 + p z) (Abramowitz & Stegun 7.1.26, absolute
//     error ≤ 1.5e-7 in erf).
//   layer_norm: two passes over the row (mean, then Σ (x - μ)²), f32 sums in W lanes added in
//     a fixed order, so the result never depends on the thread that ran the row.
#pragma once

#include <cstdint>

namespace attn::detail::cpu {

struct rowwise_table {
  const char* name;  // "generic", "avx2", "avx512"
  // y[i] = gelu(x[i]) for i < n (y may equal x).
  void (*gelu)(const float* x, float* y, std::int64_t n);
  // y = LayerNorm(x + r) · w + b over one row of C values (r may be null: no residual; y may
  // equal x or r). Biased variance; rstd = 1 / sqrt(σ² + eps).
  void (*layer_norm)(const float* x, const float* r, const float* w, const float* b, float* y, std::int64_t C,
                     float eps);
};

const rowwise_table& rowwise_generic();
const rowwise_table& rowwise_avx2();
const rowwise_table& rowwise_avx512();

// The table for this CPU (isa.cc; ATTN_CPU_ISA caps it as it caps the attention kernels).
const rowwise_table& select_rowwise();

}  // namespace attn::detail::cpu

// src/family/scores/gaussian.cc — e = -c ‖q-k‖², the log of a Gaussian kernel (softmax of it is
// the Nadaraya–Watson weight; distribution kernel means exactly that), in one of two forms
// (score_spec::gaussian):
//   sigma  c = 1/(2h²)   exp(-‖q-k‖²/(2h²)), h the standard deviation (the default)
//   width  c = 1/h       exp(-‖q-k‖²/h), the form of seed 002's tutorial
//
// Written as one dot product of augmented vectors [.., D + 2]:
//   -c‖q-k‖² = [2c q, 1, -c‖q‖²] · [k, -c‖k‖², 1]
// The -c‖q‖² term is constant along a row; it is kept only where the distribution is not
// shift-invariant (sigmoid, identity), 0 otherwise. With softmax, attn::attention runs on the
// augmented vectors (float32, float64 for float64 input) and the user's v (no copy when it
// already has that dtype). A bfloat16 forward runs in bfloat16 instead (core_prepare_bf16), its
// constant column split in three bfloat16 parts so that no score moves by more than float32's
// rounding.
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "core/common.h"
#include "family/scores/score.h"

namespace attn::detail::family {
namespace {

void check(const score_call& c, score_state& s) {
  s.h = c.spec->bandwidth;
  if (!(s.h > 0.0) || !std::isfinite(s.h)) fail(c.op, fmt::format("bandwidth h = {} must be finite and > 0", s.h));
  s.q_term = !c.shift_invariant;
  const int f = int(c.spec->gaussian);
  if (f < 0 || f > int(gaussian_form::width)) fail(c.op, fmt::format("gaussian form {} is not a gaussian_form", f));
}

// c of the form, and dc/dh.
double coef(const score_call& c, const score_state& s) {
  return c.spec->gaussian == gaussian_form::width ? 1.0 / s.h : 1.0 / (2.0 * s.h * s.h);
}
double dcoef_dh(const score_call& c, const score_state& s) {
  return c.spec->gaussian == gaussian_form::width ? -1.0 / (s.h * s.h) : -1.0 / (s.h * s.h * s.h);
}

// qp = [2c q, 1, q_term ? -c‖q‖² : 0] for every row of q; kp = [k, -c‖k‖², 1].
void augment(const score_call& c, const score_state& s, const strided4& q, const strided4& k, const strided4& qp,
             const strided4& kp) {
  const std::int64_t D = c.D;
  const double cf = coef(c, s);
  std::vector<double> r(std::size_t(D + 2), 0.0);
  for_rows(c.B, c.Hq, c.Nq, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t) {
    load_row(q, b, h, n, D, r.data());
    double n2 = 0.0;
    for (std::int64_t d = 0; d < D; ++d) n2 += r[std::size_t(d)] * r[std::size_t(d)], r[std::size_t(d)] *= 2.0 * cf;
    r[std::size_t(D)] = 1.0;
    r[std::size_t(D + 1)] = s.q_term ? -cf * n2 : 0.0;
    store_row(qp, b, h, n, D + 2, r.data());
  });
  for_rows(c.B, c.Hkv, c.Nk, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t) {
    load_row(k, b, h, n, D, r.data());
    double n2 = 0.0;
    for (std::int64_t d = 0; d < D; ++d) n2 += r[std::size_t(d)] * r[std::size_t(d)];
    r[std::size_t(D)] = -cf * n2;
    r[std::size_t(D + 1)] = 1.0;
    store_row(kp, b, h, n, D + 2, r.data());
  });
}

// The keys' side of both chains below: dk = dkp[:D] - f·dkp[D]·k for each key row (its gradient
// width elements a row in dkp); returns -Σ dkp[D]·‖k‖², the keys' part of dc.
double keys_back(const score_call& c, const strided4& k, const strided4& dkp, std::int64_t width, double f,
                 const strided4& dk) {
  const std::int64_t D = c.D;
  std::vector<double> x(std::size_t(D), 0.0), gx(std::size_t(width), 0.0), dx(std::size_t(D), 0.0);
  double dc = 0.0;
  for_rows(c.B, c.Hkv, c.Nk, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t) {
    load_row(k, b, h, n, D, x.data());
    load_row(dkp, b, h, n, width, gx.data());
    double n2 = 0.0;
    for (std::int64_t d = 0; d < D; ++d) {
      const std::size_t i = std::size_t(d);
      n2 += x[i] * x[i];
      dx[i] = gx[i] - f * gx[std::size_t(D)] * x[i];
    }
    dc -= gx[std::size_t(D)] * n2;
    store_row(dk, b, h, n, D, dx.data());
  });
  return dc;
}

// Through the augmentation:  dq = 2c dqp[:D] - q_term · 2c dqp[D+1] q,
//                            dk = dkp[:D] - 2c dkp[D] k,
//   dc = Σ dqp[:D]·2q - q_term · Σ dqp[D+1] ‖q‖² - Σ dkp[D] ‖k‖²,  dh = dc · dc/dh.
// Writes dq, dk; returns dh.
double unaugment(const score_call& c, const score_state& s, const strided4& q, const strided4& k,
                 const strided4& dqp, const strided4& dkp, const strided4& dq, const strided4& dk) {
  const std::int64_t D = c.D;
  const double cf = coef(c, s);
  std::vector<double> x(std::size_t(D), 0.0), gx(std::size_t(D + 2), 0.0), dx(std::size_t(D), 0.0);
  double dc = 0.0;
  for_rows(c.B, c.Hq, c.Nq, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t) {
    load_row(q, b, h, n, D, x.data());
    load_row(dqp, b, h, n, D + 2, gx.data());
    double n2 = 0.0;
    for (std::int64_t d = 0; d < D; ++d) {
      const std::size_t i = std::size_t(d);
      n2 += x[i] * x[i];
      dx[i] = 2.0 * cf * gx[i] + (s.q_term ? -2.0 * cf * gx[std::size_t(D + 1)] * x[i] : 0.0);
      dc += gx[i] * 2.0 * x[i];
    }
    if (s.q_term) dc -= gx[std::size_t(D + 1)] * n2;
    store_row(dq, b, h, n, D, dx.data());
  });
  dc += keys_back(c, k, dkp, D + 2, 2.0 * cf, dk);
  return dc * dcoef_dh(c, s);
}

// The chain rule of the bfloat16 route (core_prepare_bf16, softmax: no q term), from the core op's
// float32 dq'', dk'' at scale 2c, with dS as the core op rounded it to bfloat16 (dS̃):
//   A = dq''[:D] = 2c Σ_j dS̃ k_j,   r = dq''[D+3] = 2c Σ_j dS̃ (the row sums, by the keys' column
//   of ones),   b = dk''[D] = 2c Σ_i dS̃,
//   dq = A - r q = 2c Σ_j dS̃ (k_j - q),   dk = dk''[:D] - b k = 2c Σ_i dS̃ (q_i - k),
//   dc = (Σ_i q·(2A - r q) - Σ_j ‖k‖² b) / 2c = -Σ dS̃ ‖q - k‖².
// Under softmax Σ_j dS = 0, so r q adds nothing to the exact gradient; with the rounded dS̃ it takes
// out the rows' sums, 2^-9 of Σ|dS| each, which without it multiplied q (and ‖q‖² in dc) where the
// gradient is Σ dS (k - q): keys near their queries (k = q + 1/100) gave a dbandwidth 8 % off.
// Writes dq, dk; returns dh.
double unaugment_split(const score_call& c, const score_state& s, const strided4& q, const strided4& k,
                       const strided4& dqs, const strided4& dks, const strided4& dq, const strided4& dk) {
  const std::int64_t D = c.D;
  const double cf = coef(c, s);
  std::vector<double> x(std::size_t(D), 0.0), gx(std::size_t(D + 4), 0.0), dx(std::size_t(D), 0.0);
  double dc = 0.0;
  for_rows(c.B, c.Hq, c.Nq, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t) {
    load_row(q, b, h, n, D, x.data());
    load_row(dqs, b, h, n, D + 4, gx.data());
    const double r = gx[std::size_t(D + 3)];
    for (std::int64_t d = 0; d < D; ++d) {
      const std::size_t i = std::size_t(d);
      dx[i] = gx[i] - r * x[i];
      dc += x[i] * (gx[i] + dx[i]);
    }
    store_row(dq, b, h, n, D, dx.data());
  });
  dc += keys_back(c, k, dks, D + 1, 1.0, dk);
  return dc / (2.0 * cf) * dcoef_dh(c, s);
}

void prepare(const score_call& c, const score_state& s, const f64_qkv& in, fproblem& fp) {
  const std::int64_t P = c.D + 2;
  fp.Pq = fp.Pk = P;
  fp.Qp.resize(std::size_t(c.rows_q() * P));
  fp.Kp.resize(std::size_t(c.rows_k() * P));
  augment(c, s, rows_of(in.q, c.Hq, c.Nq, c.D), rows_of(in.k, c.Hkv, c.Nk, c.D), rows_of(fp.Qp, c.Hq, c.Nq, P),
          rows_of(fp.Kp, c.Hkv, c.Nk, P));
}

void backward(const score_call& c, const score_state& s, const f64_qkv& in, const fproblem&,
              const std::vector<double>& dQp, const grad_acc& acc, std::vector<double>& dq, std::vector<double>& dk,
              family_grads& g) {
  const std::int64_t P = c.D + 2;
  g.dbandwidth = unaugment(c, s, rows_of(in.q, c.Hq, c.Nq, c.D), rows_of(in.k, c.Hkv, c.Nk, c.D),
                           rows_of(dQp, c.Hq, c.Nq, P), rows_of(acc.dKp, c.Hkv, c.Nk, P),
                           rows_of(dq, c.Hq, c.Nq, c.D), rows_of(dk, c.Hkv, c.Nk, c.D));
}

// The bfloat16 forward (softmax: no -c‖q‖² term), on the core op's bf16 products (AMX tiles where
// the CPU has them) rather than float32 ones: 4.5–5× faster at B1 H8 N4096 D128 on a Xeon with AMX:
//   -c‖q-k‖² + c‖q‖² = 2c · ([q, 1, 1, 1, 0, 0…] · [k, t₁, t₂, t₃, 1, 0…]),   t₁ + t₂ + t₃ = -‖k‖²/2
// with 2c the attention's scale. q and k are the user's bf16 values (exact); t = -‖k‖²/2 (exact in
// float64) is split greedily into bf16 parts, t₁ = bf16(t), t₂ = bf16(t - t₁), t₃ = bf16(t - t₁ - t₂),
// whose sum is t within |t|·2^-25 — below the float32 accumulation of the products, so the scores
// are the float32 route's to its own rounding. The rows are padded with zeros to split_row_width
// (a multiple of 32 on AMX tiles, else of 2). The backward runs on the same rows, its dq, dk in
// float32 (f32_grads: the chain rule's dk = dk''[:D] - dk''[D]·k cancels where q ≈ k, and needs
// them before their rounding); what it rounds is dS to bf16, as the core op's own bf16 backward.
core_qkv core_prepare_bf16(const score_call& c, const score_state& s, const TensorView& q, const TensorView& k,
                           const TensorView& v) {
  const std::int64_t D = c.D, P = split_row_width(D);
  Tensor qp = empty_bhnx(c.B, c.Hq, c.Nq, P, c.rank, dtype::bf16), kp = empty_bhnx(c.B, c.Hkv, c.Nk, P, c.rank, dtype::bf16);
  const strided4 qs = as_bhnx(q, c.Hq), ks = as_bhnx(k, c.Hkv), qo = as_bhnx(qp, c.Hq), ko = as_bhnx(kp, c.Hkv);
  std::vector<std::vector<double>> rows(std::size_t(std::max(1, c.threads)), std::vector<double>(std::size_t(P)));
  for_rows_parallel(c.B, c.Hq, c.Nq, c.threads, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t, int t) {
    std::vector<double>& r = rows[std::size_t(t)];
    std::fill(r.begin(), r.end(), 0.0);
    load_row(qs, b, h, n, D, r.data());
    r[std::size_t(D)] = r[std::size_t(D + 1)] = r[std::size_t(D + 2)] = 1.0;
    store_row(qo, b, h, n, P, r.data());
  });
  const auto part = [](double x) { return double(bf16_to_f32(f32_to_bf16(float(x)))); };
  for_rows_parallel(c.B, c.Hkv, c.Nk, c.threads, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t, int t) {
    std::vector<double>& r = rows[std::size_t(t)];
    std::fill(r.begin(), r.end(), 0.0);
    load_row(ks, b, h, n, D, r.data());
    double n2 = 0.0;
    for (std::int64_t d = 0; d < D; ++d) n2 += r[std::size_t(d)] * r[std::size_t(d)];
    double rest = -0.5 * n2;
    for (std::int64_t i = 0; i < 3 && std::isfinite(rest); ++i) {  // (an inf or NaN norm: one part, as the float32 route's)
      const double ti = part(rest);
      r[std::size_t(D + i)] = ti;
      rest = std::isfinite(ti) ? rest - ti : 0.0;
    }
    if (!std::isfinite(n2)) r[std::size_t(D)] = -0.5 * n2;
    r[std::size_t(D + 3)] = 1.0;  // (q's column D + 3 is 0: the scores stay; dq''[D+3] sums the rows of dS)
    store_row(ko, b, h, n, P, r.data());
  });
  return {qp, kp, with_dtype(v, dtype::bf16), 2.0 * coef(c, s), 0.0, /*f32_grads=*/true};
}

core_qkv core_prepare(const score_call& c, const score_state& s, const TensorView& q, const TensorView& k,
                      const TensorView& v) {
  if (c.type == dtype::bf16 && !s.q_term) return core_prepare_bf16(c, s, q, k, v);
  // float32 for 16-bit inputs too: the augmented terms −‖x‖²/(2h²) cancel against q·k in the
  // score, and a bfloat16 rounding of them would move scores by 2^-9 of ‖x‖².
  const dtype t = c.type == dtype::f64 ? dtype::f64 : dtype::f32;
  Tensor qp = empty_bhnx(c.B, c.Hq, c.Nq, c.D + 2, c.rank, t), kp = empty_bhnx(c.B, c.Hkv, c.Nk, c.D + 2, c.rank, t);
  augment(c, s, as_bhnx(q, c.Hq), as_bhnx(k, c.Hkv), as_bhnx(qp, c.Hq), as_bhnx(kp, c.Hkv));
  return {qp, kp, with_dtype(v, t), 1.0};
}

void core_backward(const score_call& c, const score_state& s, const TensorView& q, const TensorView& k,
                   const core_qkv& in, const attention_grads& cg, family_grads& g) {
  new_dq_dk(c, g);
  const auto chain = in.f32_grads ? unaugment_split : unaugment;
  g.dbandwidth = chain(c, s, as_bhnx(q, c.Hq), as_bhnx(k, c.Hkv), as_bhnx(cg.dq, c.Hq), as_bhnx(cg.dk, c.Hkv),
                       as_bhnx(g.dq, c.Hq), as_bhnx(g.dk, c.Hkv));
}

}  // namespace

const score_def kGaussianScore = {.kernel = kernel_role::log, .check = check, .prepare = prepare, .backward = backward,
                                  .core_prepare = core_prepare, .core_backward = core_backward};

}  // namespace attn::detail::family

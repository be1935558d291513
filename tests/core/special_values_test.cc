// tests/core/special_values_test.cc — issue 14, one answer on every backend: NaN, ±inf and
// overflow give the same out, lse and gradients on cpu and reference (the contract of
// "special values" in attention.h); check_finite; the reference backward in float64
// throughout, and the stated bound of the cpu float32 backward against it; huge ALiBi slopes.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <random>

#include "test_util.h"

namespace attn {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

struct both {
  attention_result cpu, ref;
};
both run_both(const TensorView& q, const TensorView& k, const TensorView& v, const attention_options& o = {}) {
  return {attention(q, k, v, o, {.use_backend = backend::cpu}), attention(q, k, v, o, {.use_backend = backend::reference})};
}

// Same NaN / inf pattern and values within the dtype's tolerance.
void expect_same(const both& r, dtype t) {
  EXPECT_TRUE(testing::all_close(r.cpu.out, r.ref.out, testing::tolerance_for(t)));
  EXPECT_TRUE(testing::all_close(r.cpu.lse, r.ref.lse, testing::tolerance_for(t)));
}

bool row_nan(const Tensor& out, std::int64_t b, std::int64_t h, std::int64_t i) {
  for (std::int64_t d = 0; d < out.size(3); ++d)
    if (!std::isnan(out.get({b, h, i, d}))) return false;
  return true;
}

TEST(SpecialValues, NaNInQMakesItsRowNaNOnEveryBackend) {
  std::mt19937 rng(1);
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (std::int64_t nk : {5, 70, 5000}) {  // prefill, decode, split-KV
      for (std::int64_t nq : {1, 3, 40}) {
        Tensor q = testing::random_tensor({1, 2, nq, 16}, t, rng), k = testing::random_tensor({1, 2, nk, 16}, t, rng),
               v = testing::random_tensor({1, 2, nk, 16}, t, rng);
        q.set({0, 1, nq - 1, 3}, kNaN);
        const both r = run_both(q, k, v);
        expect_same(r, t);
        EXPECT_TRUE(row_nan(r.cpu.out, 0, 1, nq - 1) && std::isnan(r.cpu.lse.get({0, 1, nq - 1})));
        EXPECT_FALSE(row_nan(r.cpu.out, 0, 0, 0));
        for (std::int64_t i = 0; i < q.numel(); ++i) store_from_double(q.data(), t, i, kNaN);  // all NaN
        const both all = run_both(q, k, v);
        expect_same(all, t);
        EXPECT_TRUE(row_nan(all.cpu.out, 0, 0, 0));
      }
    }
  }
}

TEST(SpecialValues, InfinitiesInMasksAndInputs) {
  std::mt19937 rng(2);
  const Tensor q = testing::random_tensor({1, 1, 4, 8}, dtype::f32, rng), k = testing::random_tensor({1, 1, 6, 8}, dtype::f32, rng);
  Tensor v = testing::random_tensor({1, 1, 6, 8}, dtype::f32, rng);
  // +inf in a float mask: no softmax for that row -> NaN, on both.
  Tensor m = Tensor::zeros({4, 6}, dtype::f32);
  m.set({2, 3}, kInf);
  m.set({1, 0}, -kInf);
  attention_options o;
  o.attn_mask = m;
  both r = run_both(q, k, v, o);
  expect_same(r, dtype::f32);
  EXPECT_TRUE(row_nan(r.cpu.out, 0, 0, 2));
  EXPECT_FALSE(row_nan(r.cpu.out, 0, 0, 1));
  // NaN and inf in v at a key a bool mask excludes are never read; at a kept key they propagate.
  Tensor bm = Tensor::full({4, 6}, dtype::boolean, 1);
  bm.set({0, 5}, 0), bm.set({1, 5}, 0), bm.set({2, 5}, 0), bm.set({3, 5}, 0);
  v.set({0, 0, 5, 2}, kNaN), v.set({0, 0, 5, 3}, kInf);
  attention_options ob;
  ob.attn_mask = bm;
  r = run_both(q, k, v, ob);
  expect_same(r, dtype::f32);
  EXPECT_TRUE(testing::all_close(r.cpu.out, attention(q, k.view().slice(2, 0, 5), v.view().slice(2, 0, 5)).out, 2e-6));
  r = run_both(q, k, v);
  expect_same(r, dtype::f32);
  EXPECT_TRUE(std::isnan(r.cpu.out.get({0, 0, 0, 2})));
  // inf in q or k (f16 inputs that overflowed): the same answer on both.
  for (dtype t : {dtype::f16, dtype::bf16, dtype::f32}) {
    Tensor qi = q.to(t), ki = k.to(t);
    qi.set({0, 0, 1, 0}, kInf), ki.set({0, 0, 4, 1}, -kInf);
    expect_same(run_both(qi, ki, v.to(t)), t);
  }
}

TEST(SpecialValues, Float32OverflowGivesTheFloat64AnswerOnEveryBackend) {
  std::mt19937 rng(3);
  for (double mag : {1e17, 1e19}) {
    Tensor q = testing::random_tensor({1, 2, 3, 4}, dtype::f32, rng, -mag, mag), k = testing::random_tensor({1, 2, 2, 4}, dtype::f32, rng, -mag, mag);
    const Tensor v = testing::random_tensor({1, 2, 2, 4}, dtype::f32, rng), dout = testing::random_tensor({1, 2, 3, 4}, dtype::f32, rng);
    q.set({0, 0, 0, 0}, 1e19), k.set({0, 0, 0, 0}, 1e19), k.set({0, 0, 1, 0}, 1e19);  // equal overflowing logits
    const both r = run_both(q, k, v);
    EXPECT_TRUE(testing::all_close(r.cpu.out, r.ref.out, 1e-6));
    EXPECT_TRUE(testing::all_close(r.cpu.lse, r.ref.lse, 1e-6));
    EXPECT_FALSE(testing::any_nan(r.cpu.out));
    const attention_grads gc = attention_backward(q, k, v, r.cpu.out, dout, r.cpu.lse, {}, {.use_backend = backend::cpu});
    const attention_grads gr = attention_backward(q, k, v, r.ref.out, dout, r.ref.lse, {}, {.use_backend = backend::reference});
    for (auto [c, f] : {std::pair{&gc.dq, &gr.dq}, {&gc.dk, &gr.dk}, {&gc.dv, &gr.dv}})
      EXPECT_TRUE(testing::all_close(*c, *f, 1e-6));
    EXPECT_FALSE(testing::any_nan(gc.dv));
  }
}

TEST(SpecialValues, ScaleAndSoftcapMustBeNormalFloat32) {
  const Tensor q = Tensor::zeros({1, 1, 2, 4}, dtype::f32);
  attention_options o;
  o.softcap = 1e-46;
  EXPECT_THROW_MSG(attention(q, q, q, o), "attention: softcap = 1e-46 is outside the normal float32 range");
  o.softcap = 1e39;
  EXPECT_THROW_MSG(attention(q, q, q, o), "softcap = 1e+39 is outside");
  o.softcap = 0;
  o.scale = 1e-300;
  EXPECT_THROW_MSG(attention(q, q, q, o), "scale = 1e-300 is outside the normal float32 range");
  o.scale = 0.0;  // uniform weights: allowed
  EXPECT_NO_THROW(attention(q, q, q, o));
}

TEST(SpecialValues, CheckFiniteNamesTensorAndIndex) {
  Tensor q = Tensor::zeros({1, 2, 3, 4}, dtype::f32);
  const Tensor k = Tensor::zeros({1, 2, 3, 4}, dtype::f32);
  attention_options o;
  o.check_finite = true;
  EXPECT_NO_THROW(attention(q, k, k, o));
  q.set({0, 1, 2, 3}, kNaN);
  EXPECT_THROW_MSG(attention(q, k, k, o), "attention: check_finite: q holds nan at index [0, 1, 2, 3]");
  q.set({0, 1, 2, 3}, 0);
  Tensor m = Tensor::full({3, 3}, dtype::f32, -kInf);  // -inf in a mask is allowed
  o.attn_mask = m;
  EXPECT_NO_THROW(attention(q, k, k, o));
  m.set({1, 2}, kInf);
  EXPECT_THROW_MSG(attention(q, k, k, o), "check_finite: attn_mask holds inf at index [1, 2]");
  o.attn_mask.reset();
  const attention_result r = attention(q, k, k, o);
  Tensor dout = Tensor::zeros({1, 2, 3, 4}, dtype::f32);
  dout.set({0, 0, 1, 0}, -kInf);
  EXPECT_THROW_MSG(attention_backward(q, k, k, r.out, dout, r.lse, o), "attention_backward: check_finite: dout holds -inf at index [0, 0, 1, 0]");
}

// Item 4 of the issue: the reference backward is float64 throughout. On float32 inputs it
// equals the float64 reference on the same values (only the final rounding differs), even with
// logits large enough that a float32 lse would cost p its precision.
TEST(SpecialValues, ReferenceBackwardIsFloat64Throughout) {
  std::mt19937 rng(4);
  for (double mag : {1.0, 30.0, 300.0}) {
    const Tensor q = testing::random_tensor({1, 2, 4, 8}, dtype::f32, rng, -mag, mag), k = testing::random_tensor({1, 2, 3, 8}, dtype::f32, rng, -mag, mag);
    const Tensor v = testing::random_tensor({1, 2, 3, 8}, dtype::f32, rng), dout = testing::random_tensor({1, 2, 4, 8}, dtype::f32, rng);
    const execution ref{.use_backend = backend::reference};
    const attention_result r = attention(q, k, v, {}, ref);
    const attention_grads g = attention_backward(q, k, v, r.out, dout, r.lse, {}, ref);
    const Tensor q8 = q.to(dtype::f64), k8 = k.to(dtype::f64), v8 = v.to(dtype::f64), d8 = dout.to(dtype::f64);
    const attention_result r8 = attention(q8, k8, v8, {}, ref);
    const attention_grads g8 = attention_backward(q8, k8, v8, r8.out, d8, r8.lse, {}, ref);
    for (auto [a, b] : {std::pair{&g.dq, &g8.dq}, {&g.dk, &g8.dk}, {&g.dv, &g8.dv}})
      EXPECT_TRUE(testing::all_close(*a, *b, 1e-30, 1.2e-7)) << mag;  // float32 rounding of the result only
  }
}

// The cpu float32 backward against the float64 truth. p = e^{s - lse} is recomputed from a
// float32 score and a float32 lse, each off by up to |s|·2^-24, so p carries a relative error of
// about 2|s|·2^-24 and every gradient an absolute one of about (1 + 2 max|s|)·2^-23 · (gradient
// scale G: the gradients' own, or that of dp - Δ, which cancels in ds = p (dp - Δ)). The bound
// tested: |err| <= 4e-6 · (1 + max|lse|) · G, G = max(1, max|grad|, scale·|dout|·|v|·|q or k|·Dv)
// (inputs here keep |v|, |dout|, |k| <= 1, so the first terms decide). Past |lse| = 1024
// the backward runs on the float64 reference instead (what made the Nk <= 3, large-logit
// cases 0.022 off: with few keys nothing averages the error of one p away).
TEST(SpecialValues, CpuBackwardWithinItsStatedBound) {
  std::mt19937 rng(5);
  for (double mag : {0.5, 4.0, 12.0, 30.0, 100.0}) {
    for (std::int64_t nk : {1, 2, 3, 17, 200}) {
      const Tensor q = testing::random_tensor({1, 2, 5, 16}, dtype::f32, rng, -mag, mag), k = testing::random_tensor({1, 2, nk, 16}, dtype::f32, rng, -1, 1);
      const Tensor v = testing::random_tensor({1, 2, nk, 16}, dtype::f32, rng), dout = testing::random_tensor({1, 2, 5, 16}, dtype::f32, rng);
      const attention_result r = attention(q, k, v, {}, {.use_backend = backend::cpu});
      const attention_grads g = attention_backward(q, k, v, r.out, dout, r.lse, {}, {.use_backend = backend::cpu});
      double lmax = 0;
      for (double x : r.lse.to_vector()) lmax = std::max(lmax, std::abs(x));
      const Tensor q8 = q.to(dtype::f64), k8 = k.to(dtype::f64), v8 = v.to(dtype::f64), d8 = dout.to(dtype::f64);
      const attention_result r8 = attention(q8, k8, v8);
      const attention_grads g8 = attention_backward(q8, k8, v8, r8.out, d8, r8.lse);
      EXPECT_EQ(g.backend, lmax > 1024 ? "reference" : "cpu");
      for (auto [a, b] : {std::pair{&g.dq, &g8.dq}, {&g.dk, &g8.dk}, {&g.dv, &g8.dv}}) {
        double gmax = 1;
        for (double x : b->to_vector()) gmax = std::max(gmax, std::abs(x));
        EXPECT_TRUE(testing::all_close(*a, *b, 4e-6 * (1 + lmax) * gmax, 0)) << "mag " << mag << " nk " << nk;
      }
    }
  }
  // |lse| past 1024: the float64 reference runs the backward.
  const Tensor q = Tensor::full({1, 1, 2, 4}, dtype::f32, 40), k = Tensor::full({1, 1, 3, 4}, dtype::f32, 20);
  const attention_result r = attention(q, k, k);
  EXPECT_EQ(attention_backward(q, k, k, r.out, r.out, r.lse).backend, "reference");
}

// Softmax is shift-invariant: a float mask of -1e30 (or +1e4) everywhere equals no mask on
// every backend, forward and backward; the lse carries the shift.
TEST(SpecialValues, ConstantHugeFloatMaskEqualsNoMask) {
  std::mt19937 rng(6);
  const Tensor q = testing::random_tensor({2, 2, 5, 8}, dtype::f32, rng), k = testing::random_tensor({2, 2, 7, 8}, dtype::f32, rng);
  const Tensor v = testing::random_tensor({2, 2, 7, 8}, dtype::f32, rng), dout = testing::random_tensor({2, 2, 5, 8}, dtype::f32, rng);
  for (double c : {-1e30, 1e4, -3e38}) {
    for (backend be : {backend::cpu, backend::reference}) {
      const execution ex{.use_backend = be};
      const attention_result plain = attention(q, k, v, {}, ex);
      attention_options o;
      o.attn_mask = Tensor::full({5, 7}, dtype::f32, c);
      const attention_result r = attention(q, k, v, o, ex);
      EXPECT_TRUE(testing::all_close(r.out, plain.out, 0)) << c;
      EXPECT_NEAR(r.lse.get({1, 1, 4}), plain.lse.get({1, 1, 4}) + c, std::abs(c) * 1e-7) << c;
      o.attn_mask = Tensor::full({1, 1, 1, 7}, dtype::f32, c);  // broadcast rows
      EXPECT_TRUE(testing::all_close(attention(q, k, v, o, ex).out, plain.out, 0)) << c;
      o.is_causal = true;  // with -inf (causal) beside the constant
      attention_options oc;
      oc.is_causal = true;
      EXPECT_TRUE(testing::all_close(attention(q, k, v, o, ex).out, attention(q, k, v, oc, ex).out, 0)) << c;
      // The backward (a float mask's gradient runs on the reference).
      o.is_causal = false;
      const attention_grads g = attention_backward(q, k, v, r.out, dout, r.lse, o);
      const attention_grads g0 = attention_backward(q, k, v, plain.out, dout, plain.lse);
      EXPECT_TRUE(testing::all_close(g.dq, g0.dq, 1e-5)) << c;
      EXPECT_TRUE(testing::all_close(g.dv, g0.dv, 1e-5)) << c;
    }
  }
}

// Sinks beside a float mask beyond ±1024. Softmax is shift-invariant over the whole row, the
// sink included, so a mask m + c with sinks s + c gives the output of m with s and an lse c
// higher; a shifted mask once made the keys outweigh a sink they lie 1e4 below (the sink was left
// unshifted). Forward and backward (dq, dk, dv, dsinks, dattn_mask) on both backends.
TEST(SpecialValues, SinksBesideAShiftedMask) {
  std::mt19937 rng(41);
  const Tensor q = testing::random_tensor({1, 2, 4, 8}, dtype::f32, rng), k = testing::random_tensor({1, 2, 6, 8}, dtype::f32, rng);
  const Tensor v = testing::random_tensor({1, 2, 6, 8}, dtype::f32, rng), dout = testing::random_tensor({1, 2, 4, 8}, dtype::f32, rng);
  const Tensor m = testing::random_tensor({4, 6}, dtype::f64, rng, -1.0, 1.0);
  const Tensor sinks = Tensor::from_values({2}, dtype::f64, {0.3, 2.5});
  for (backend be : {backend::cpu, backend::reference}) {
    const execution ex{.use_backend = be};
    attention_options o;
    o.attn_mask = m, o.sinks = sinks;
    const attention_result want = attention(q, k, v, o, ex);
    const attention_grads wg = attention_backward(q, k, v, want.out, dout, want.lse, o, ex);
    for (double c : {1e4, -1e4, 3e5, -3e5}) {
      SCOPED_TRACE(fmt::format("backend {}, shift {}", to_string(be), c));
      Tensor mc = Tensor::copy_of(m), sc = Tensor::copy_of(sinks);
      for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t j = 0; j < 6; ++j) mc.set({i, j}, m.get({i, j}) + c);
      for (std::int64_t h = 0; h < 2; ++h) sc.set({h}, sinks.get({h}) + c);
      attention_options oc;
      oc.attn_mask = mc, oc.sinks = sc;
      const attention_result r = attention(q, k, v, oc, ex);
      EXPECT_TRUE(testing::all_close(r.out, want.out, 1e-5, 1e-5));
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t i = 0; i < 4; ++i) EXPECT_NEAR(r.lse.get({0, h, i}), want.lse.get({0, h, i}) + c, std::abs(c) * 1e-7);
      const attention_grads g = attention_backward(q, k, v, r.out, dout, r.lse, oc, ex);
      EXPECT_TRUE(testing::all_close(g.dq, wg.dq, 1e-4, 1e-5));
      EXPECT_TRUE(testing::all_close(g.dk, wg.dk, 1e-4, 1e-5));
      EXPECT_TRUE(testing::all_close(g.dv, wg.dv, 1e-4, 1e-5));
      EXPECT_TRUE(testing::all_close(g.dsinks, wg.dsinks, 1e-4, 1e-5));
      EXPECT_TRUE(testing::all_close(g.dattn_mask, wg.dattn_mask, 1e-4, 1e-5));
    }
  }
}

// With lengths per batch entry (nonpad_kv_seqlen, an in-place cache), a float row's shift is its
// largest value among the keys the entry has: an HF row of finfo.min over an entry's keys with
// 0 in the padding past them is shifted by finfo.min (the padding would otherwise keep it
// unshifted, and float32 q·k would vanish beside finfo.min: every key weighed alike). One mask
// broadcast over B shifts apart per entry (keys [5, 9) at 5000 + x: entry 1's maximum, padding
// for entry 0). Each entry equals attention() on its own keys and mask columns, forward and
// backward, on every backend; the mask's gradient is 0 in the padding.
TEST(SpecialValues, MaskShiftTakenOverEachEntrysKeys) {
  const double lowest = -3.4028234663852886e38;
  std::mt19937 rng(47);
  const std::int64_t B = 2, H = 2, Nq = 3, Nk = 12, D = 8;
  const std::int64_t lens[B] = {5, 9};
  const Tensor q = testing::random_tensor({B, H, Nq, D}, dtype::f32, rng), k = testing::random_tensor({B, H, Nk, D}, dtype::f32, rng);
  const Tensor v = testing::random_tensor({B, H, Nk, D}, dtype::f32, rng), dout = testing::random_tensor({B, H, Nq, D}, dtype::f32, rng);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  Tensor per_entry = Tensor::empty({B, 1, Nq, Nk}, dtype::f32), shared = Tensor::empty({1, 1, Nq, Nk}, dtype::f32);
  for (std::int64_t i = 0; i < Nq; ++i)
    for (std::int64_t j = 0; j < Nk; ++j) {
      for (std::int64_t b = 0; b < B; ++b) per_entry.set({b, 0, i, j}, j < lens[b] ? lowest : 0.0);
      shared.set({0, 0, i, j}, j < 5 ? lowest : j < 9 ? 5000.0 + u(rng) : 0.0);
    }
  const Tensor nonpad = testing::index_tensor({B}, {lens[0], lens[1]});
  for (const Tensor* mask : {&per_entry, &shared})
    for (backend be : {backend::cpu, backend::reference}) {
      SCOPED_TRACE(fmt::format("{} mask, backend {}", mask == &shared ? "shared" : "per-entry", to_string(be)));
      const execution ex{.use_backend = be};
      attention_options o;
      o.attn_mask = *mask, o.nonpad_kv_seqlen = nonpad;
      const attention_result r = attention(q, k, v, o, ex);
      const attention_grads g = attention_backward(q, k, v, r.out, dout, r.lse, o, ex);
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t L = lens[b];
        const auto rows = [&](const TensorView& x, std::int64_t n) { return Tensor::copy_of(x.slice(0, b, b + 1).slice(2, 0, n)); };
        attention_options ob;
        const TensorView mb = mask->size(0) == B ? mask->view().slice(0, b, b + 1) : mask->view();
        ob.attn_mask = Tensor::copy_of(mb.slice(3, 0, L));
        const Tensor qb = rows(q, Nq), kb = rows(k, L), vb = rows(v, L), db = rows(dout, Nq);
        const attention_result w = attention(qb, kb, vb, ob, ex);
        const attention_grads wg = attention_backward(qb, kb, vb, w.out, db, w.lse, ob, ex);
        EXPECT_TRUE(testing::all_close(rows(r.out, Nq), w.out, 1e-5, 1e-5));
        EXPECT_TRUE(testing::all_close(Tensor::copy_of(r.lse.view().slice(0, b, b + 1)), w.lse, 1e-5, 1e-6));
        EXPECT_TRUE(testing::all_close(rows(g.dq, Nq), wg.dq, 1e-4, 1e-5));
        EXPECT_TRUE(testing::all_close(rows(g.dk, L), wg.dk, 1e-4, 1e-5));
        EXPECT_TRUE(testing::all_close(rows(g.dv, L), wg.dv, 1e-4, 1e-5));
      }
      // The plain softmax of q·k for entry 0's rows of finfo.min, not uniform weights.
      attention_options plain;
      const attention_result p0 = attention(Tensor::copy_of(q.view().slice(0, 0, 1)),
                                            Tensor::copy_of(k.view().slice(0, 0, 1).slice(2, 0, 5)),
                                            Tensor::copy_of(v.view().slice(0, 0, 1).slice(2, 0, 5)), plain, ex);
      if (mask == &per_entry) {
        EXPECT_TRUE(testing::all_close(Tensor::copy_of(r.out.view().slice(0, 0, 1)), p0.out, 1e-5, 1e-5));
      }
    }
}

// HF-style masks (0 kept, finfo.min not) with sinks (gpt-oss): a row with no key kept gives
// zeros and lse = the sink, as its bool mask does; every row, forward and backward, equals the
// bool mask's answer.
TEST(SpecialValues, FinfoMinRowsWithSinksAsBoolMask) {
  std::mt19937 rng(43);
  const Tensor q = testing::random_tensor({1, 2, 5, 8}, dtype::f32, rng), k = testing::random_tensor({1, 2, 7, 8}, dtype::f32, rng);
  const Tensor v = testing::random_tensor({1, 2, 7, 8}, dtype::f32, rng), dout = testing::random_tensor({1, 2, 5, 8}, dtype::f32, rng);
  const double lowest = -3.4028234663852886e38;
  Tensor hf = Tensor::zeros({5, 7}, dtype::f32), keep = Tensor::zeros({5, 7}, dtype::boolean);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::int64_t i = 0; i < 5; ++i)
    for (std::int64_t j = 0; j < 7; ++j) {
      const bool kept = i != 0 && (j == i || u(rng) < 0.6);  // row 0: nothing kept
      hf.set({i, j}, kept ? 0.0 : lowest), keep.set({i, j}, kept ? 1.0 : 0.0);
    }
  const Tensor sinks = Tensor::from_values({2}, dtype::f32, {0.5, -1.5});
  for (backend be : {backend::cpu, backend::reference}) {
    SCOPED_TRACE(to_string(be));
    const execution ex{.use_backend = be};
    attention_options ob, of;
    ob.attn_mask = keep, ob.sinks = sinks;
    of.attn_mask = hf, of.sinks = sinks;
    const attention_result want = attention(q, k, v, ob, ex), r = attention(q, k, v, of, ex);
    EXPECT_TRUE(testing::all_close(r.out, want.out, 1e-6, 1e-6));
    EXPECT_TRUE(testing::all_close(r.lse, want.lse, 1e-6, 1e-6));
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_NEAR(r.lse.get({0, h, 0}), sinks.get({h}), 1e-6);
      for (std::int64_t x = 0; x < 8; ++x) EXPECT_EQ(r.out.get({0, h, 0, x}), 0.0);
    }
    const attention_grads wg = attention_backward(q, k, v, want.out, dout, want.lse, ob, ex);
    const attention_grads g = attention_backward(q, k, v, r.out, dout, r.lse, of, ex);
    EXPECT_TRUE(testing::all_close(g.dq, wg.dq, 1e-5, 1e-5));
    EXPECT_TRUE(testing::all_close(g.dk, wg.dk, 1e-5, 1e-5));
    EXPECT_TRUE(testing::all_close(g.dv, wg.dv, 1e-5, 1e-5));
    EXPECT_TRUE(testing::all_close(g.dsinks, wg.dsinks, 1e-5, 1e-5));
  }
}

// A float mask beyond ±1024 is shifted by its row maximum and the shift added back to the lse
// (problem_storage). api_fuzz (fuzz/corpus/api/ref_lse_shifted_mask_*): q·k ≈ -1e19 beside a mask
// of 1e19 leaves an lse of 1.5e17, a small difference of large terms; the lse of the shifted
// scores (≈ -1e19) was rounded to float32 before the shift went back, 3e-6 off. It is now kept in
// float64 until then and rounded once (every backend; the cpu's float32 q·k has its own error).
TEST(SpecialValues, ShiftedMaskLseIsRoundedOnce) {
  const Tensor q = Tensor::from_values({1, 1, 1, 3}, dtype::bf16, {1e19, 1e19, 1e19});
  const Tensor k = Tensor::from_values({1, 1, 2, 3}, dtype::bf16, {0.0, -2.6875, 0.984375, 0.984375, 0.984375, -3.84375});
  const Tensor v = Tensor::from_values({1, 1, 2, 1}, dtype::bf16, {0.984375, -4.0});
  attention_options o;
  o.attn_mask = Tensor::from_values({1, 2}, dtype::f32, {1e19, 1e19});
  const attention_result truth =
      attention(q.to(dtype::f64), k.to(dtype::f64), v.to(dtype::f64), o, {.use_backend = backend::reference});
  const double want = truth.lse.get({0, 0, 0});
  ASSERT_GT(std::abs(want), 1e16);
  // The reference computes in float64: one float32 rounding of the answer.
  EXPECT_NEAR(attention(q, k, v, o, {.use_backend = backend::reference}).lse.get({0, 0, 0}), want, std::abs(want) * 1e-7);
  // The cpu computes q·k in float32: its error scales with the terms (2e19), as attention.h states.
  EXPECT_NEAR(attention(q, k, v, o, {.use_backend = backend::cpu}).lse.get({0, 0, 0}), want, 2e19 * 1e-6);
}

// ALiBi slopes near ±1e19 (fuzz/corpus/api/cpu_alibi_huge_slope_*): the scores are -slope·|i - j|
// to within q·k, which float64 cannot resolve next to 1e19, so the farthest keys (slope < 0) tie
// or the diagonal key (slope > 0) wins outright. Tied keys share the weight equally: a reference
// computing p = e^{s - lse} lost log 2 in lse = 2e19 + log 2 and gave each weight 1. Every
// backend and dtype, the decode path (Nq = 1) too, forward and backward (dv = Σ_i p_ij dout_i).
TEST(SpecialValues, HugeAlibiSlopesTieKeysEquallyOnEveryBackend) {
  std::mt19937 rng(7);
  const std::int64_t Nk = 9, D = 4, Dv = 3;
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::f64}) {
    for (std::int64_t Nq : {1, 6}) {
      const Tensor q = testing::random_tensor({1, 2, Nq, D}, t, rng), k = testing::random_tensor({1, 1, Nk, D}, t, rng);
      const Tensor v = testing::random_tensor({1, 1, Nk, Dv}, t, rng), dout = testing::random_tensor({1, 2, Nq, Dv}, t, rng);
      attention_options o;
      o.window_right = 2;  // query i sees keys [0, i + 2]
      o.alibi_slopes = Tensor::from_values({2}, dtype::f32, {-1e19, 1e19});
      // The expected weights: head 0 the farthest visible keys (0 and i + 2, tied at i = 2),
      // head 1 the key at distance 0.
      Tensor want = Tensor::zeros({1, 2, Nq, Dv}, dtype::f64), dv_want = Tensor::zeros({1, 1, Nk, Dv}, dtype::f64);
      for (std::int64_t i = 0; i < Nq; ++i) {
        const std::int64_t right = std::min(i + 2, Nk - 1), dl = i, dr = right - i;
        const std::vector<std::pair<std::int64_t, std::vector<std::pair<std::int64_t, double>>>> heads = {
            {0, dl > dr ? std::vector<std::pair<std::int64_t, double>>{{0, 1.0}}
                : dl < dr ? std::vector<std::pair<std::int64_t, double>>{{right, 1.0}}
                          : std::vector<std::pair<std::int64_t, double>>{{0, 0.5}, {right, 0.5}}},
            {1, {{i, 1.0}}}};
        for (const auto& [h, keys] : heads)
          for (const auto& [j, w] : keys)
            for (std::int64_t d = 0; d < Dv; ++d) {
              want.set({0, h, i, d}, want.get({0, h, i, d}) + w * v.get({0, 0, j, d}));
              dv_want.set({0, 0, j, d}, dv_want.get({0, 0, j, d}) + w * dout.get({0, h, i, d}));
            }
      }
      for (backend be : {t == dtype::f64 ? backend::automatic : backend::cpu, backend::reference}) {
        const attention_result r = attention(q, k, v, o, {.use_backend = be});
        EXPECT_TRUE(testing::all_close(r.out, want, testing::tolerance_for(t))) << dtype_name(t) << " Nq " << Nq;
        EXPECT_NEAR(r.lse.get({0, 0, 0}), 2e19, 1e13);  // key 2 at distance 2
        const attention_grads g = attention_backward(q, k, v, r.out, dout, r.lse, o, {.use_backend = be});
        EXPECT_TRUE(testing::all_close(g.dv, dv_want, testing::tolerance_for(t))) << dtype_name(t) << " Nq " << Nq;
        EXPECT_FALSE(testing::any_nan(g.dq) || testing::any_nan(g.dk) || testing::any_nan(g.dalibi_slopes));
      }
    }
  }
}

// Huge terms that cancel in q·k (fuzz/corpus/api/wide_lse_cancelling_qk_615eaada): head 1 scores
// its one visible key -1e38 - 2.7e18 + 1e38, which the cpu (float32, its order) resolves to
// -1.5e18 and float64 (its order) to 0. Given the cpu's lse, the backward (|lse| > 1024: the
// reference) recomputed p = e^{0 + 1.5e18} = inf and gave dq = NaN. A backward past 1024 now
// computes the lse again from its own float64 scores: one key, p = 1, dq = dk = 0, dv = dout,
// whichever backend runs it and whichever forward's lse it is given.
TEST(SpecialValues, WideLseFromAnotherForwardGivesTheFloat64Gradients) {
  const double big = 1.0016005571271983e19;
  const Tensor q = Tensor::from_values({1, 2, 1, 3}, dtype::bf16, {big, big, big, -big, -0.267578125, big});
  const Tensor k = Tensor::from_values({1, 1, 3, 3}, dtype::bf16, {big, big, big, big, big, big, 0.984375, 0.984375, 0.98828125});
  const Tensor v = Tensor::from_values({1, 1, 3, 1}, dtype::bf16, {0.984375, -1.8125, 0.984375});
  const Tensor dout = Tensor::from_values({1, 2, 1, 1}, dtype::bf16, {1.0, 0.5});
  attention_options o;
  o.is_causal = true, o.window_left = 2, o.window_right = 2;  // query 0 sees key 0 only
  const attention_result rc = attention(q, k, v, o, {.use_backend = backend::cpu});
  const attention_result rr = attention(q, k, v, o, {.use_backend = backend::reference});
  for (const attention_result* r : {&rc, &rr})
    for (backend be : {backend::cpu, backend::reference}) {
      const std::string what = std::string(r == &rc ? "cpu" : "reference") + " lse " + std::to_string(r->lse.get({0, 1, 0})) +
                               ", backend " + (be == backend::cpu ? "cpu" : "reference");
      const attention_grads g = attention_backward(q, k, v, r->out, dout, r->lse, o, {.use_backend = be});
      EXPECT_EQ(g.backend, "reference") << what;
      EXPECT_TRUE(testing::all_close(g.dq, Tensor::zeros({1, 2, 1, 3}, dtype::f64), 0)) << what;
      EXPECT_TRUE(testing::all_close(g.dk, Tensor::zeros({1, 1, 3, 3}, dtype::f64), 0)) << what;
      EXPECT_TRUE(testing::all_close(g.dv, Tensor::from_values({1, 1, 3, 1}, dtype::f64, {1.5, 0.0, 0.0}), 0)) << what;
    }
}

// q·k terms of 3.6e19 that cancel into a small score (fuzz/corpus/api/bwd_cancelling_qk_a14236cd):
// head 1's one visible key scores 1e19·(-3.59375) + (-1e19)·(-3.59375) + (-3.765625)·(-4) = 15.06,
// times 1/√3 = 8.70, beside a sink of -1.97. float32 loses the 15.06 or not depending on the
// order of addition: the cpu forward (decode kernel) scored 0 and gave lse 0.13, the cpu backward
// (tile kernel) scored 8.70, so p = e^{8.70 - 0.13} = 5245 and dv = 5245·dout (dk overflowed to
// inf with dout = 1e19; the float64 rerun, given the same lse, overflowed too). A backward whose
// q·k terms pass 1024 now runs on the float64 reference with the lse computed again from its own
// scores: the gradients do not depend on which forward's lse it is given, and a weight is <= 1.
TEST(SpecialValues, CancellingQkTermsGiveTheFloat64GradientsWhateverTheLse) {
  const double big = 1.0016005571271983e19;
  const Tensor q = Tensor::from_values({1, 2, 1, 3}, dtype::bf16, {big, big, -3.515625, big, -big, -3.765625});
  const Tensor k = Tensor::from_values({1, 1, 3, 3}, dtype::bf16,
                                       {-3.59375, -3.59375, -4, -4, -4, -3.984375, 0.984375, 0.984375, 1.15625});
  const Tensor v = Tensor::from_values({1, 1, 3, 1}, dtype::bf16, {0.9765625, -1.8125, 0.97265625});
  const Tensor dout = Tensor::from_values({1, 2, 1, 1}, dtype::bf16, {0.0, 1.0});  // head 1 only
  attention_options o;
  o.is_causal = true;  // query 0 sees key 0 only
  o.sinks = Tensor::from_values({2}, dtype::f32, {-2.91640615, -1.96705735});
  const attention_result rc = attention(q, k, v, o, {.use_backend = backend::cpu});
  const attention_result rr = attention(q, k, v, o, {.use_backend = backend::reference});
  // The reference's lse: log(e^{8.70} + e^{-1.97}).
  ASSERT_NEAR(rr.lse.get({0, 1, 0}), 8.69636, 1e-4);
  // Given the reference's lse: the float64 gradients for the cpu's out (Δ = dout·out).
  const attention_grads want = attention_backward(q, k, v, rc.out, dout, rr.lse, o, {.use_backend = backend::reference});
  for (const attention_result* r : {&rc, &rr})
    for (backend be : {backend::automatic, backend::cpu, backend::reference}) {
      const std::string what = std::string("lse ") + std::to_string(r->lse.get({0, 1, 0})) + ", backend " + std::string(to_string(be));
      const attention_grads g = attention_backward(q, k, v, rc.out, dout, r->lse, o, {.use_backend = be});
      EXPECT_EQ(g.backend, "reference") << what;
      EXPECT_LE(std::abs(g.dv.get({0, 0, 0, 0})), 1.0) << what;  // dv_0 = p_0 · dout, p_0 <= 1
      for (auto [a, b] : {std::pair{&g.dq, &want.dq}, {&g.dk, &want.dk}, {&g.dv, &want.dv}})
        EXPECT_TRUE(testing::all_close(*a, *b, 0)) << what;
    }
  // Terms below 1024 stay on the cpu (CpuBackwardWithinItsStatedBound holds its error).
  const Tensor qs = Tensor::full({1, 1, 2, 4}, dtype::f32, 15), ks = Tensor::from_values({1, 1, 2, 4}, dtype::f32, {15, -15, 15, -15, 1, 2, 3, 4});
  const attention_result rs = attention(qs, ks, ks, {}, {.use_backend = backend::cpu});
  EXPECT_EQ(attention_backward(qs, ks, ks, rs.out, rs.out, rs.lse).backend, "cpu");  // 0.5 · 30 · 30 = 450
}

// A returned intermediate is held to the same contract as out: q·k terms of 2e38, 2e38 and -2e38
// sum to 2e38 (a finite float32), but float32 reaches +inf after the first two. That key lies
// past the batch's nonpad length, so the forward never scores it (out and lse are ordinary) and
// only the returned scores show the overflow; the row goes to the float64 reference (before, the
// cpu backend returned +inf there).
TEST(SpecialValues, ReturnedScoresOfAnOverflowingSumAreTheReferences) {
  const Tensor q = Tensor::from_values({1, 1, 1, 3}, dtype::f32, {1e19, 1e19, 1e19});
  const Tensor k = Tensor::from_values({1, 1, 2, 3}, dtype::f32, {0.5, 0.25, 0.125, 2e19, 2e19, -2e19});
  const Tensor v = Tensor::from_values({1, 1, 2, 1}, dtype::f32, {1.0, 2.0});
  const Tensor lens = Tensor::from_values({1}, dtype::i64, {1.0});
  attention_options o;
  o.scale = 1.0;
  o.nonpad_kv_seqlen = lens;
  for (qk_output stage : {qk_output::scaled, qk_output::softcapped, qk_output::biased, qk_output::probabilities}) {
    o.return_qk = stage;
    const attention_result rc = attention(q, k, v, o, {.use_backend = backend::cpu});
    const attention_result rr = attention(q, k, v, o, {.use_backend = backend::reference});
    EXPECT_EQ(rc.backend, "cpu");
    EXPECT_TRUE(testing::all_close(rc.qk, rr.qk, 0)) << int(stage);
    EXPECT_EQ(rc.out.get({0, 0, 0, 0}), 1.0);
  }
  o.return_qk = qk_output::scaled;
  EXPECT_EQ(float(attention(q, k, v, o, {.use_backend = backend::cpu}).qk.get({0, 0, 0, 1})), 2e38f);
}

// Biased scores under a shifted mask (|mask| past 1024: shifted by its row maximum, the shift
// added back after the backend) are kept in float64 until the shift is back: a float mask of 1e19
// beside an ALiBi bias of -1e19 leaves a score of q·k, but the shifted score -1e19 is past
// float16's range, and -inf + 1e19 is -inf (api_fuzz, `fuzz/corpus/api/qk_biased_shift_past_float16`).
TEST(SpecialValues, BiasedScoresOfAShiftedMaskKeepTheirValueInFloat16) {
  const Tensor q = Tensor::from_values({1, 1, 2, 1}, dtype::f16, {1.5, -2.0});
  const Tensor k = Tensor::from_values({1, 1, 1, 1}, dtype::f16, {0.75});
  const Tensor v = Tensor::from_values({1, 1, 1, 1}, dtype::f16, {1.0});
  const Tensor mask = Tensor::from_values({1, 1, 2, 1}, dtype::f32, {0.0, 1e19});
  const Tensor slopes = Tensor::from_values({1}, dtype::f32, {1e19});
  attention_options o;
  o.scale = 1.0;
  o.attn_mask = mask;
  o.alibi_slopes = slopes;  // row 1 sees key 0 at distance 1: ALiBi's bias -1e19
  o.return_qk = qk_output::biased;
  // The float64 truth: -1.5 + 1e19 - 1e19 resolves the score only to 1e19's ulp (2048): 0.
  const Tensor want = attention(q.to(dtype::f64), k.to(dtype::f64), v.to(dtype::f64), o).qk;
  ASSERT_EQ(want.get({0, 0, 1, 0}), 0.0);
  for (backend be : {backend::cpu, backend::reference}) {
    const attention_result r = attention(q, k, v, o, {.use_backend = be});
    EXPECT_EQ(r.qk.type(), dtype::f16);
    EXPECT_EQ(r.qk.get({0, 0, 0, 0}), 1.125) << to_string(be);  // row 0: q·k, no bias
    EXPECT_EQ(r.qk.get({0, 0, 1, 0}), 0.0) << to_string(be);    // was -inf: -1e19 stored in float16
  }
}

}  // namespace
}  // namespace attn

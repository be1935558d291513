// tests/family/family_core_route_test.cc — the core route of attention_family reads the user's
// views as they are: dot and scaled_dot are attn::attention itself (same dtype, bitwise the same
// result, bf16 included), and strided, broadcast and 3-D inputs give what their contiguous 4-D
// copies give; every name table round-trips every enumerator.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "family_util.h"

namespace attn::testing {
namespace {

// Bitwise the core op's result in every dtype: no copy, no conversion on the way (a bf16 input
// that went through float32 would round differently).
TEST(FamilyCoreRoute, DotIsTheCoreOpOnTheUsersViews) {
  std::mt19937 rng(41);
  const std::int64_t B = 2, Hq = 4, Hkv = 2, Nq = 37, Nk = 53, D = 64, Dv = 32;
  for (dtype t : {dtype::bf16, dtype::f32, dtype::f16, dtype::f64})
    for (score_kind s : {score_kind::dot, score_kind::scaled_dot})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + to_string(s) + (causal ? " causal" : ""));
        const Tensor q = random_tensor({B, Hq, Nq, D}, t, rng), k = random_tensor({B, Hkv, Nk, D}, t, rng),
                     v = random_tensor({B, Hkv, Nk, Dv}, t, rng), dout = random_tensor({B, Hq, Nq, Dv}, t, rng);
        family_options fo;
        fo.score.kind = s;
        if (s == score_kind::scaled_dot) fo.score.scale = 0.3;
        fo.is_causal = causal;
        attention_options ao;
        ao.scale = s == score_kind::dot ? 1.0 : 0.3;
        ao.is_causal = causal;

        const family_result fr = attention_family(q, k, v, fo);
        const attention_result ar = attention(q, k, v, ao);
        EXPECT_EQ(fr.path, "core (" + ar.backend + ")");
        EXPECT_TRUE(same_bits(fr.out, ar.out));

        const family_grads fg = attention_family_backward(q, k, v, dout, fo);
        const attention_grads ag = attention_backward(q, k, v, ar.out, dout, ar.lse, ao);
        EXPECT_TRUE(same_bits(fg.dq, ag.dq));
        EXPECT_TRUE(same_bits(fg.dk, ag.dk));
        EXPECT_TRUE(same_bits(fg.dv, ag.dv));
      }
}

// bfloat16 inputs take the core op in bfloat16 (its bf16 products), with the prepared q', k'
// rounded once to bfloat16 and the user's v unconverted: cosine's out is bitwise attn::attention
// on q/(‖q‖τ) and k/‖k‖ computed in float64 and rounded to bfloat16 (what the preparation
// does), forward and backward; general, biased_general, cosine and location stay within bfloat16
// error of the float64 reference on the same inputs, every gradient included; so does gaussian,
// whose forward and backward run in bfloat16 with its −‖k‖²/2 column split in bfloat16 parts
// (below), the backward's dq, dk in float32 for its chain rule (dbandwidth too); and gaussian with
// keys near the queries (k = q + small noise), where that chain rule's dk''[:D] − dk''[D]·k cancels.
TEST(FamilyCoreRoute, BfloatInputsRunTheCoreOpInBfloat) {
  std::mt19937 rng(47);
  for (score_kind s : {score_kind::cosine, score_kind::general, score_kind::biased_general, score_kind::location,
                       score_kind::gaussian})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(to_string(s) + (causal ? " causal" : ""));
      family_case c(s, distribution_kind::softmax, rng, 2, 4, 2, 13, 29, 16, 8);
      c.opt.is_causal = causal;
      const Tensor q = c.q.to(dtype::bf16), k = c.k.to(dtype::bf16), v = c.v.to(dtype::bf16);
      const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::bf16, rng);
      const family_result got = attention_family(q, k, v, c.opt);
      ASSERT_EQ(got.path.rfind("core", 0), 0u);
      EXPECT_EQ(got.out.type(), dtype::bf16);
      const family_grads g = attention_family_backward(q, k, v, dout, got, c.opt);
      const execution ref{.path = family_path::reference};
      const family_result want = attention_family(q.to(dtype::f64), k.to(dtype::f64), v.to(dtype::f64), c.opt, ref);
      const family_grads gw =
          attention_family_backward(q.to(dtype::f64), k.to(dtype::f64), v.to(dtype::f64), dout.to(dtype::f64), c.opt, ref);
      EXPECT_TRUE(all_close(got.out, want.out, 2e-2, 2e-2)) << "out";
      EXPECT_TRUE(all_close(g.dq, gw.dq, 3e-2, 3e-2)) << "dq";
      EXPECT_TRUE(all_close(g.dk, gw.dk, 3e-2, 3e-2)) << "dk";
      EXPECT_TRUE(all_close(g.dv, gw.dv, 3e-2, 3e-2)) << "dv";
      if (g.dW.defined()) {
        EXPECT_TRUE(all_close(g.dW, gw.dW, 5e-2, 3e-2)) << "dW";
      }
      if (g.dW_a.defined()) {
        EXPECT_TRUE(all_close(g.dW_a, gw.dW_a, 5e-2, 3e-2)) << "dW_a";
      }
      if (s == score_kind::gaussian) {
        EXPECT_NEAR(g.dbandwidth, gw.dbandwidth, 2e-2 * (1.0 + std::abs(gw.dbandwidth))) << "dbandwidth";
        // keys near the queries: k = q + noise of 1/100 (Nq = Nk here)
        const family_case n(s, distribution_kind::softmax, rng, 1, 2, 2, 17, 17, 16, 8);
        std::vector<double> kn = n.q.to_vector();
        std::uniform_real_distribution<double> noise(-0.01, 0.01);
        for (double& x : kn) x += noise(rng);
        const Tensor qn = n.q.to(dtype::bf16), kb = Tensor::from_values(n.q.shape(), dtype::bf16, kn),
                     vn = n.v.to(dtype::bf16), dn = random_tensor({1, 2, 17, 8}, dtype::bf16, rng);
        const family_grads gn = attention_family_backward(qn, kb, vn, dn, n.opt);
        const family_grads wn = attention_family_backward(qn.to(dtype::f64), kb.to(dtype::f64), vn.to(dtype::f64),
                                                          dn.to(dtype::f64), n.opt, ref);
        EXPECT_TRUE(all_close(gn.dq, wn.dq, 3e-2, 3e-2)) << "dq, k near q";
        EXPECT_TRUE(all_close(gn.dk, wn.dk, 3e-2, 3e-2)) << "dk, k near q";
        EXPECT_NEAR(gn.dbandwidth, wn.dbandwidth, 1e-2 * (1.0 + std::abs(wn.dbandwidth))) << "dbandwidth, k near q";
      }
      if (s != score_kind::cosine) continue;
      // q' = q/(‖q‖τ), k' = k/‖k‖ in float64, rounded to bfloat16: the core op on them is the route.
      const auto unit = [](const Tensor& x, double div) {
        std::vector<double> a = x.to_vector();
        const std::int64_t D = x.shape().back();
        for (std::size_t r = 0; r < a.size(); r += std::size_t(D)) {
          double nn = 0.0;
          for (std::int64_t e = 0; e < D; ++e) nn += a[r + std::size_t(e)] * a[r + std::size_t(e)];
          nn = std::sqrt(nn);
          for (std::int64_t e = 0; e < D; ++e) a[r + std::size_t(e)] = nn > 0.0 ? a[r + std::size_t(e)] / (nn * div) : 0.0;
        }
        return Tensor::from_values(x.shape(), dtype::bf16, a);
      };
      attention_options ao;
      ao.scale = 1.0, ao.is_causal = causal;
      const attention_result core = attention(unit(q, c.opt.score.temperature), unit(k, 1.0), v, ao);
      EXPECT_TRUE(same_bits(got.out, core.out)) << "cosine out against attn::attention in bf16";
      const attention_grads cg = attention_backward(unit(q, c.opt.score.temperature), unit(k, 1.0), v, core.out, dout, core.lse, ao);
      EXPECT_TRUE(same_bits(g.dv, cg.dv)) << "cosine dv against attn::attention_backward in bf16";
    }
}

// activated_general with tanh runs on the core op (tanh = softcap 1; its b on an augmented
// column, but in a forward with b = 0): out and every gradient (dq, dk, dv, dW, db) agree with the
// float64 reference, b = 0.8 and b = 0, causal or not, GQA, in float64, float32 and bfloat16 (whose
// forward splits b in three bfloat16 parts); relu and sigmoid stay off the core route, and asking
// for it names the score.
TEST(FamilyCoreRoute, ActivatedTanhIsTheCoreOpWithSoftcap) {
  std::mt19937 rng(53);
  for (dtype t : {dtype::f64, dtype::f32, dtype::bf16})
    for (bool with_b : {true, false})
      for (bool causal : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + (with_b ? " b 0.8" : " b 0") + (causal ? " causal" : ""));
        family_case c(score_kind::activated_general, distribution_kind::softmax, rng, 2, 4, 2, 13, 29, 16, 8);
        c.opt.score.activation = score_activation::tanh;
        c.opt.is_causal = causal;
        // Scores well inside tanh's bend, b large enough to move them.
        c.b = Tensor::from_values({1}, dtype::f64, {with_b ? 0.8 : 0.0});
        c.opt.score.b = c.b.view();
        const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t);
        const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, t, rng);
        const family_result got = attention_family(q, k, v, c.opt);
        ASSERT_EQ(got.path.rfind("core", 0), 0u) << got.path;
        EXPECT_EQ(got.out.type(), t);
        const family_grads g = attention_family_backward(q, k, v, dout, got, c.opt);
        const execution ref{.path = family_path::reference};
        const Tensor q64 = q.to(dtype::f64), k64 = k.to(dtype::f64), v64 = v.to(dtype::f64), d64 = dout.to(dtype::f64);
        const family_result want = attention_family(q64, k64, v64, c.opt, ref);
        const family_grads gw = attention_family_backward(q64, k64, v64, d64, c.opt, ref);
        const double tol = t == dtype::f64 ? 1e-10 : t == dtype::f32 ? 2e-5 : 3e-2;
        EXPECT_TRUE(all_close(got.out, want.out, tol, tol)) << "out";
        EXPECT_TRUE(all_close(g.dq, gw.dq, tol, tol)) << "dq";
        EXPECT_TRUE(all_close(g.dk, gw.dk, tol, tol)) << "dk";
        EXPECT_TRUE(all_close(g.dv, gw.dv, tol, tol)) << "dv";
        EXPECT_TRUE(all_close(g.dW, gw.dW, 2 * tol, tol)) << "dW";
        EXPECT_TRUE(all_close(g.db, gw.db, 2 * tol, tol)) << "db";
      }
  for (score_activation a : {score_activation::relu, score_activation::sigmoid}) {
    family_case c(score_kind::activated_general, distribution_kind::softmax, rng);
    c.opt.score.activation = a;
    EXPECT_EQ(attention_family(c.q, c.k, c.v, c.opt).path.rfind("core", 0), std::string::npos);
    c.exec.path = family_path::core;
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "activated_general (tanh)");
  }
}

TEST(FamilyCoreRoute, StridedAndThreeDimensionalInputsMatchContiguous) {
  std::mt19937 rng(43);
  for (dtype t : {dtype::f32, dtype::f64, dtype::bf16})
    for (score_kind s : {score_kind::dot, score_kind::scaled_dot, score_kind::general, score_kind::cosine,
                         score_kind::gaussian, score_kind::location}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + to_string(s));
      family_case c(s, distribution_kind::softmax, rng, 2, 4, 2, 9, 11, 8, 5);
      c.opt.is_causal = true;
      const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t), dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, t, rng);
      const family_result want = attention_family(q, k, v, c.opt);
      const family_grads gwant = attention_family_backward(q, k, v, dout, c.opt);
      ASSERT_EQ(want.path.rfind("core", 0), 0u);
      // The core op's results do not depend on strides (bitwise), nor does the preparation.
      const double tol = 0.0;

      const strided_copy qs(q), ks(k), vs(v), ds(dout);
      ASSERT_FALSE(qs.view.is_contiguous());
      const family_result got = attention_family(qs.view, ks.view, vs.view, c.opt);
      EXPECT_TRUE(all_close(got.out, want.out, tol)) << "strided out";
      const family_grads g = attention_family_backward(qs.view, ks.view, vs.view, ds.view, c.opt);
      EXPECT_TRUE(all_close(g.dq, gwant.dq, tol)) << "strided dq";
      EXPECT_TRUE(all_close(g.dk, gwant.dk, tol)) << "strided dk";
      EXPECT_TRUE(all_close(g.dv, gwant.dv, tol)) << "strided dv";
      EXPECT_EQ(g.dq.shape(), q.shape());

      family_options o3 = c.opt;
      o3.q_num_heads = c.Hq, o3.kv_num_heads = c.Hkv;
      const Tensor q3 = to3(q), k3 = to3(k), v3 = to3(v), d3 = to3(dout);
      const family_result r3 = attention_family(q3, k3, v3, o3);
      EXPECT_EQ(r3.out.shape(), (Shape{c.B, c.Nq, c.Hq * c.Dv}));
      EXPECT_TRUE(all_close(r3.out, to3(want.out), tol)) << "3-D out";
      const family_grads g3 = attention_family_backward(q3, k3, v3, d3, o3);
      EXPECT_TRUE(all_close(g3.dq, to3(gwant.dq), tol)) << "3-D dq";
      EXPECT_TRUE(all_close(g3.dk, to3(gwant.dk), tol)) << "3-D dk";
      EXPECT_TRUE(all_close(g3.dv, to3(gwant.dv), tol)) << "3-D dv";
      ASSERT_EQ(g3.dW.defined(), s == score_kind::general);
      if (s == score_kind::general) {
        EXPECT_TRUE(all_close(g3.dW, gwant.dW, 1e-12)) << "3-D dW";
      }
      ASSERT_EQ(g3.dW_a.defined(), s == score_kind::location);
      if (s == score_kind::location) {
        EXPECT_TRUE(all_close(g3.dW_a, gwant.dW_a, 1e-12)) << "3-D dW_a";
        EXPECT_TRUE(all_close(g.dW_a, gwant.dW_a, 1e-12)) << "strided dW_a";
      }
      EXPECT_NEAR(g3.dtemperature, gwant.dtemperature, 1e-12 * (1 + std::abs(gwant.dtemperature)));
      EXPECT_NEAR(g3.dbandwidth, gwant.dbandwidth, 1e-12 * (1 + std::abs(gwant.dbandwidth)));
    }
}

TEST(FamilyCoreRoute, BroadcastKeysAreReadInPlace) {
  // k and v broadcast over the batch (stride 0): the same as their materialised copies.
  std::mt19937 rng(44);
  const Tensor q = random_tensor({3, 2, 5, 4}, dtype::f32, rng), k1 = random_tensor({1, 2, 6, 4}, dtype::f32, rng),
               v1 = random_tensor({1, 2, 6, 3}, dtype::f32, rng);
  const TensorView kb = k1.view().broadcast_to({3, 2, 6, 4}), vb = v1.view().broadcast_to({3, 2, 6, 3});
  for (score_kind s : {score_kind::scaled_dot, score_kind::cosine}) {
    family_options o;
    o.score.kind = s;
    const family_result got = attention_family(q, kb, vb, o);
    const family_result want = attention_family(q, Tensor::copy_of(kb), Tensor::copy_of(vb), o);
    EXPECT_TRUE(all_close(got.out, want.out, 0.0)) << to_string(s);
  }
}

// gaussian's bfloat16 forward runs the core op in bfloat16 on [q, 1, 1, 1, 0…] and [k, t₁, t₂, t₃,
// 0…], t₁ + t₂ + t₃ = −‖k‖²/2 in bfloat16 parts, with 2c as the scale: its lse is the float32
// route's on the same values to float32 rounding, with keys whose ‖k‖²/2 reaches hundreds (one
// bfloat16 part alone moves a score by about 2^-9 of that, ≈ 0.02 after the scale here), and its
// out within bfloat16 rounding of the float32 route's. Keys with an inf give what the float32
// route gives.
TEST(FamilyCoreRoute, GaussianBfloatForwardKeepsFloat32Scores) {
  std::mt19937 rng(48);
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "");
    family_case c(score_kind::gaussian, distribution_kind::softmax, rng, 1, 4, 2, 37, 53, 40, 8);
    c.opt.is_causal = causal;
    c.opt.score.bandwidth = 4.0;
    std::vector<double> kv = c.k.to_vector();
    for (double& x : kv) x *= 6.0;  // |k| up to 6: ‖k‖²/2 up to ≈ 250
    const Tensor q = c.q.to(dtype::bf16), v = c.v.to(dtype::bf16);
    const Tensor k = Tensor::from_values(c.k.shape(), dtype::bf16, kv);
    const family_result got = attention_family(q, k, v, c.opt);
    const family_result f32 = attention_family(q.to(dtype::f32), k.to(dtype::f32), v.to(dtype::f32), c.opt);
    ASSERT_EQ(got.path.rfind("core", 0), 0u);
    ASSERT_TRUE(got.lse.defined() && f32.lse.defined());
    EXPECT_TRUE(all_close(got.lse, f32.lse, 1e-4, 1e-5)) << "lse against the float32 route";
    EXPECT_TRUE(all_close(got.out, f32.out, 2e-2, 2e-2)) << "out against the float32 route";
    // An inf in a key: its norm is inf, its scores -inf or NaN, as on the float32 route.
    std::vector<double> ki = kv;
    ki[3] = std::numeric_limits<double>::infinity();
    const Tensor kinf = Tensor::from_values(c.k.shape(), dtype::bf16, ki);
    const family_result gi = attention_family(q, kinf, v, c.opt);
    const family_result fi = attention_family(q.to(dtype::f32), kinf.to(dtype::f32), v.to(dtype::f32), c.opt);
    const std::vector<double> go = gi.out.to_vector(), fo = fi.out.to_vector();
    ASSERT_EQ(go.size(), fo.size());
    for (std::size_t e = 0; e < go.size(); ++e) {
      ASSERT_EQ(std::isnan(go[e]), std::isnan(fo[e])) << "element " << e;
      if (!std::isnan(go[e])) {
        ASSERT_NEAR(go[e], fo[e], 2e-2 * (1.0 + std::abs(fo[e]))) << "element " << e;
      }
    }
  }
}

// The backward from the forward's result (family_result::lse on the core route) gives what the
// backward that recomputes the forward gives: bitwise where the core op's out is the result's own
// dtype (f32, f64, and dot/scaled_dot on the user's bf16 views), to bf16 rounding where a bf16
// input went through float32 preparation (its out was rounded to bf16 for the caller). Paths
// without statistics (fused, tiled) ignore the result; a result of another shape is refused.
TEST(FamilyCoreRoute, BackwardFromTheForwardsResult) {
  std::mt19937 rng(45);
  for (dtype t : {dtype::f32, dtype::f64, dtype::bf16})
    for (score_kind s : {score_kind::dot, score_kind::scaled_dot, score_kind::general, score_kind::cosine,
                         score_kind::gaussian, score_kind::location})
      for (bool three_d : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(t)) + " " + to_string(s) + (three_d ? " 3-D" : ""));
        family_case c(s, distribution_kind::softmax, rng, 2, 4, 2, 9, 11, 8, 5);
        c.opt.is_causal = true;
        Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t), dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, t, rng);
        if (three_d) {
          q = to3(q), k = to3(k), v = to3(v), dout = to3(dout);
          c.opt.q_num_heads = c.Hq, c.opt.kv_num_heads = c.Hkv;
        }
        const family_result r = attention_family(q, k, v, c.opt);
        ASSERT_EQ(r.path.rfind("core", 0), 0u);
        ASSERT_TRUE(r.lse.defined());
        EXPECT_EQ(r.lse.shape(), (Shape{c.B, c.Hq, c.Nq}));
        const family_grads want = attention_family_backward(q, k, v, dout, c.opt);
        const family_grads got = attention_family_backward(q, k, v, dout, r, c.opt);
        EXPECT_EQ(got.path, want.path);
        const bool exact = t != dtype::bf16 || s == score_kind::dot || s == score_kind::scaled_dot;
        const double tol = exact ? 0.0 : 2e-2;
        EXPECT_TRUE(all_close(got.dq, want.dq, tol)) << "dq";
        EXPECT_TRUE(all_close(got.dk, want.dk, tol)) << "dk";
        EXPECT_TRUE(all_close(got.dv, want.dv, tol)) << "dv";
        if (s == score_kind::general) {
          EXPECT_TRUE(all_close(got.dW, want.dW, exact ? 0.0 : 1e-2)) << "dW";
        }
        if (s == score_kind::location) {
          EXPECT_TRUE(all_close(got.dW_a, want.dW_a, exact ? 0.0 : 1e-2)) << "dW_a";
        }
        if (exact) {
          EXPECT_EQ(got.dtemperature, want.dtemperature);
          EXPECT_EQ(got.dbandwidth, want.dbandwidth);
        }
      }

  family_case c(score_kind::scaled_dot, distribution_kind::softmax, rng, 1, 2, 1, 5, 6, 4, 4);
  const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
  const Tensor dout = random_tensor({1, 2, 5, 4}, dtype::f32, rng);
  const family_result r = attention_family(q, k, v, c.opt);
  family_result bad = r;
  bad.out = random_tensor({1, 2, 5, 3}, dtype::f32, rng);
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, bad, c.opt),
                   "attention_family_backward: forward.out has shape [1, 2, 5, 3], expected [1, 2, 5, 4]");
  bad = r;
  bad.lse = random_tensor({1, 2, 4}, dtype::f32, rng);
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, bad, c.opt),
                   "attention_family_backward: forward.lse has shape [1, 2, 4], expected [1, 2, 5]");
  // The given statistics are what the backward reads: an lse shifted by 0.5 scales every p by e^-0.5.
  bad = r;
  bad.lse = Tensor::copy_of(r.lse);
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < 5; ++i) bad.lse.set({0, h, i}, r.lse.get({0, h, i}) + 0.5);
  const family_grads shifted = attention_family_backward(q, k, v, dout, bad, c.opt);
  const family_grads fresh = attention_family_backward(q, k, v, dout, c.opt);
  EXPECT_FALSE(all_close(shifted.dv, fresh.dv, 1e-3));
  EXPECT_TRUE(all_close(shifted.dv, fresh.dv, 0.0, 0.4)) << "dv scaled by e^-0.5";
  // A path without statistics: the result is only checked, then the backward recomputes.
  family_options so = c.opt;
  so.distribution.kind = distribution_kind::sigmoid;
  const family_result rs = attention_family(q, k, v, so);
  EXPECT_FALSE(rs.lse.defined());
  const family_grads gs = attention_family_backward(q, k, v, dout, rs, so);
  const family_grads ws = attention_family_backward(q, k, v, dout, so);
  EXPECT_TRUE(all_close(gs.dq, ws.dq, 0.0));
  EXPECT_TRUE(all_close(gs.dk, ws.dk, 0.0));
}

// ---- names ----

template <class E>
void round_trips(E last, std::string (*name)(E), E (*parse)(const std::string&)) {
  for (int i = 0; i <= int(last); ++i) {
    const E e = E(i);
    EXPECT_EQ(parse(name(e)), e) << name(e);
  }
  EXPECT_NE(name(E(int(last) + 1)).find('('), std::string::npos) << "a value outside the enum names its number";
}

TEST(FamilyNames, EveryEnumeratorRoundTrips) {
  // The tables are tied to the enums by static_asserts (src/family/scores/table.cc,
  // src/family/names.cc); this checks the names at run time.
  round_trips(score_kind::triangle, to_string, parse_score_kind);
  round_trips(distribution_kind::identity, to_string, parse_distribution_kind);
  round_trips(gaussian_form::width, to_string, parse_gaussian_form);
  round_trips(feature_map::identity, to_string, parse_feature_map);
  round_trips(score_activation::sigmoid, to_string, parse_score_activation);
  round_trips(hardmax_gradient::straight_through, to_string, parse_hardmax_gradient);
  EXPECT_EQ(to_string(score_kind(99)), "score_kind(99)");
  EXPECT_EQ(all_scores().size(), std::size_t(score_kind::triangle) + 1);
  EXPECT_EQ(all_distributions().size(), std::size_t(distribution_kind::identity) + 1);
  EXPECT_THROW_MSG(parse_feature_map("elu"), "feature map: 'elu' is not one of elu_plus_one, relu");
  EXPECT_THROW_MSG(parse_score_activation("gelu"), "activation: 'gelu' is not one of tanh, relu, sigmoid");
  EXPECT_THROW_MSG(parse_hardmax_gradient("ste"), "hardmax gradient: 'ste' is not one of zero, straight_through");
}

}  // namespace
}  // namespace attn::testing

// tests/family/family_properties_test.cc — what each distribution and score guarantees (rows sum to 1,
// exact zeros, one-hot, invariances, a Nadaraya–Watson example worked by hand, the fully masked
// row contract) and the error messages of bad input.
#include <gtest/gtest.h>

#include "family_util.h"

namespace attn::testing {
namespace {

// α of a case, [B, Hq, Nq, Nk], through the tiled path: v = identity (Nk = Dv) makes out = α.
Tensor tiled_weights(family_case& c) {
  std::vector<double> eye(std::size_t(c.B * c.Hkv * c.Nk * c.Nk), 0.0);
  for (std::int64_t r = 0; r < c.B * c.Hkv; ++r)
    for (std::int64_t j = 0; j < c.Nk; ++j) eye[std::size_t((r * c.Nk + j) * c.Nk + j)] = 1.0;
  const Tensor v = Tensor::from_values({c.B, c.Hkv, c.Nk, c.Nk}, dtype::f64, eye);
  return attention_family(c.q, c.k, v, c.opt, {.path = family_path::tiled}).out;
}

TEST(FamilyProperties, RowsSumToOneAndSparsity) {
  std::mt19937 rng(31);
  for (distribution_kind d : all_distributions()) {
    const score_kind s = d == distribution_kind::kernel ? score_kind::triangle : score_kind::scaled_dot;
    family_case c(s, d, rng, 2, 2, 1, 6, 9, 4, 2);
    if (s == score_kind::scaled_dot) c.opt.score.scale = 4.0;  // spread scores: sparse supports
    else c.opt.score.bandwidth = 2.5;
    const Tensor w = tiled_weights(c);
    const Tensor wr = attention_family_weights(c.q, c.k, c.v, c.opt);
    EXPECT_TRUE(all_close(w, wr, 1e-12)) << to_string(d);
    if (d == distribution_kind::identity) {  // α = s itself: scale · q·k, of any sign
      for (std::int64_t b = 0; b < c.B; ++b)
        for (std::int64_t h = 0; h < c.Hq; ++h)
          for (std::int64_t i = 0; i < c.Nq; ++i)
            for (std::int64_t j = 0; j < c.Nk; ++j) {
              double e = 0.0;
              for (std::int64_t x = 0; x < c.D; ++x) e += c.q.get({b, h, i, x}) * c.k.get({b, 0, j, x});
              EXPECT_NEAR(w.get({b, h, i, j}), 4.0 * e, 1e-12);
            }
      continue;
    }
    std::int64_t zeros = 0;
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.Hq; ++h)
        for (std::int64_t i = 0; i < c.Nq; ++i) {
          double sum = 0.0;
          std::int64_t nnz = 0;
          for (std::int64_t j = 0; j < c.Nk; ++j) {
            const double a = w.get({b, h, i, j});
            EXPECT_GE(a, 0.0);
            sum += a, nnz += a != 0.0, zeros += a == 0.0;
          }
          if (d == distribution_kind::sigmoid) {
            EXPECT_GT(nnz, 0);
          } else {
            EXPECT_NEAR(sum, 1.0, 1e-12) << to_string(d);
          }
          if (d == distribution_kind::hardmax) {
            EXPECT_EQ(nnz, 1);
          }
          if (d == distribution_kind::topk) {
            EXPECT_EQ(nnz, c.opt.distribution.k);
          }
        }
    if (d == distribution_kind::sparsemax || d == distribution_kind::entmax15 || d == distribution_kind::topk) {
      EXPECT_GT(zeros, 0) << to_string(d) << " gave no exact zero";
    }
  }
}

TEST(FamilyProperties, HardmaxAndTopkBreakTiesByFirstIndex) {
  // Keys 1, 3 and 4 are the same vector: equal scores.
  const Tensor q = Tensor::from_values({1, 1, 1, 2}, dtype::f64, {1.0, 0.5});
  const Tensor k = Tensor::from_values({1, 1, 5, 2}, dtype::f64, {0, 0, 1, 1, -1, 0, 1, 1, 1, 1});
  std::vector<double> eye(25, 0.0);
  for (int j = 0; j < 5; ++j) eye[std::size_t(j * 5 + j)] = 1.0;
  const Tensor v = Tensor::from_values({1, 1, 5, 5}, dtype::f64, eye);
  for (family_path p : {family_path::tiled, family_path::reference}) {
    const execution e{.path = p};
    const Tensor h = hard_attention(q, k, v, {}, e).out;
    EXPECT_EQ(h.to_vector(), (std::vector<double>{0, 1, 0, 0, 0}));
    const Tensor t = topk_attention(q, k, v, 2, {}, e).out;
    EXPECT_NEAR(t.get({0, 0, 0, 1}), 0.5, 1e-15);
    EXPECT_NEAR(t.get({0, 0, 0, 3}), 0.5, 1e-15);
    EXPECT_EQ(t.get({0, 0, 0, 4}), 0.0);
  }
}

TEST(FamilyProperties, SigmoidDefaultBiasIsMinusLogNk) {
  std::mt19937 rng(32);
  family_case c(score_kind::dot, distribution_kind::sigmoid, rng, 1, 1, 1, 2, 8, 3, 8);
  const Tensor w = attention_family_weights(c.q, c.k, c.v, c.opt);
  const double e = c.q.get({0, 0, 1, 0}) * c.k.get({0, 0, 5, 0}) + c.q.get({0, 0, 1, 1}) * c.k.get({0, 0, 5, 1}) +
                   c.q.get({0, 0, 1, 2}) * c.k.get({0, 0, 5, 2});
  EXPECT_NEAR(w.get({0, 0, 1, 5}), 1.0 / (1.0 + std::exp(-(e - std::log(8.0)))), 1e-14);
}

TEST(FamilyProperties, CosineIsInvariantToPositiveScaling) {
  std::mt19937 rng(33);
  family_case c(score_kind::cosine, distribution_kind::softmax, rng);
  for (family_path p : {family_path::automatic, family_path::tiled}) {
    c.exec.path = p;
    const Tensor a = attention_family(c.q, c.k, c.v, c.opt, c.exec).out;
    std::vector<double> qs = c.q.to_vector(), ks = c.k.to_vector();
    for (std::size_t x = 0; x < qs.size(); ++x) qs[x] *= 3.7 * double(1 + x / std::size_t(c.D));  // per-row factors
    for (auto& x : ks) x *= 0.02;
    const Tensor b = attention_family(Tensor::from_values(c.q.shape(), dtype::f64, qs),
                                      Tensor::from_values(c.k.shape(), dtype::f64, ks), c.v, c.opt, c.exec).out;
    EXPECT_TRUE(all_close(a, b, 1e-12));
  }
  // A zero query scores 0 against every key: uniform softmax, no NaN, zero gradient for it.
  const Tensor q0 = Tensor::zeros({1, 1, 1, 3}, dtype::f64);
  const Tensor k = random_tensor({1, 1, 4, 3}, dtype::f64, rng), v = random_tensor({1, 1, 4, 2}, dtype::f64, rng);
  const Tensor out = cosine_attention(q0, k, v, 0.5).out;
  for (std::int64_t x = 0; x < 2; ++x) {
    double mean = 0;
    for (std::int64_t j = 0; j < 4; ++j) mean += v.get({0, 0, j, x}) / 4;
    EXPECT_NEAR(out.get({0, 0, 0, x}), mean, 1e-14);
  }
  family_options o;
  o.score.kind = score_kind::cosine;
  const family_grads g = attention_family_backward(q0, k, v, random_tensor({1, 1, 1, 2}, dtype::f64, rng), o);
  EXPECT_FALSE(any_nan(g.dq));
  EXPECT_FALSE(any_nan(g.dk));
}

TEST(FamilyProperties, NadarayaWatsonWorkedByHand) {
  // Training pairs (x, y): (0, 0), (1, 2), (2, 4); query x = 0.5.
  const Tensor xq = Tensor::from_values({1, 1, 1, 1}, dtype::f64, {0.5});
  const Tensor xt = Tensor::from_values({1, 1, 3, 1}, dtype::f64, {0.0, 1.0, 2.0});
  const Tensor yt = Tensor::from_values({1, 1, 3, 1}, dtype::f64, {0.0, 2.0, 4.0});
  // Gaussian, h = 1: K = exp(-d²/2) with d² = 0.25, 0.25, 2.25
  //   = 0.8824969025845955, 0.8824969025845955, 0.32465246735834974
  //   ŷ = (2 · 0.88250 + 4 · 0.32465) / (2 · 0.88250 + 0.32465) = 1.4660872104908909
  for (family_path p : {family_path::automatic, family_path::tiled, family_path::reference}) {
    const execution o{.path = p};
    EXPECT_NEAR(nadaraya_watson(xq, xt, yt, score_kind::gaussian, 1.0, {}, o).out.get({0, 0, 0, 0}), 1.4660872104908909,
                1e-14);
    // Box, h = 0.6: keys 0 and 1 are within 0.5, key 2 is 1.5 away: ŷ = (0 + 2) / 2 = 1.
    EXPECT_EQ(nadaraya_watson(xq, xt, yt, score_kind::box, 0.6, {}, o).out.get({0, 0, 0, 0}), 1.0);
    // Triangle, h = 1: K = 0.5, 0.5, 0: ŷ = 1.
    EXPECT_NEAR(nadaraya_watson(xq, xt, yt, score_kind::triangle, 1.0, {}, o).out.get({0, 0, 0, 0}), 1.0, 1e-15);
    // No training point within h: zeros, not NaN.
    const Tensor far = Tensor::from_values({1, 1, 1, 1}, dtype::f64, {10.0});
    EXPECT_EQ(nadaraya_watson(far, xt, yt, score_kind::box, 0.6, {}, o).out.get({0, 0, 0, 0}), 0.0);
    EXPECT_EQ(nadaraya_watson(far, xt, yt, score_kind::triangle, 1.0, {}, o).out.get({0, 0, 0, 0}), 0.0);
  }
}

TEST(FamilyProperties, FullyMaskedRowGivesZerosNeverNaN) {
  std::mt19937 rng(34);
  for (score_kind s : all_scores())
    for (distribution_kind d : all_distributions()) {
      if (!compatible(s, d)) continue;
      family_case c(s, d, rng, 1, 2, 1, 3, 4, 3, 2);
      c.mask = Tensor::from_values({3, 4}, dtype::boolean, {1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1});
      c.opt.attn_mask = c.mask.view();
      if (d == distribution_kind::hardmax) c.opt.distribution.hardmax_grad = hardmax_gradient::straight_through;
      const Tensor dout = random_tensor({1, 2, 3, 2}, dtype::f64, rng);
      for (family_path p : {family_path::automatic, family_path::tiled, family_path::reference}) {
        c.exec.path = p;
        const family_result r = attention_family(c.q, c.k, c.v, c.opt, c.exec);
        const family_grads g = attention_family_backward(c.q, c.k, c.v, dout, c.opt, c.exec);
        const std::string what = case_name(s, d) + " " + r.path;
        EXPECT_FALSE(any_nan(r.out) || any_nan(g.dq) || any_nan(g.dk) || any_nan(g.dv)) << what;
        for (std::int64_t h = 0; h < 2; ++h)
          for (std::int64_t x = 0; x < 2; ++x) {
            EXPECT_EQ(r.out.get({0, h, 1, x}), 0.0) << what;
            if (s != score_kind::location) {
              EXPECT_EQ(g.dq.get({0, h, 1, x}), 0.0) << what;
            }
          }
      }
    }
}

TEST(FamilyProperties, LocationIgnoresKeys) {
  std::mt19937 rng(35);
  family_case c(score_kind::location, distribution_kind::softmax, rng);
  const Tensor a = attention_family(c.q, c.k, c.v, c.opt, c.exec).out;
  const Tensor other = random_tensor(c.k.shape(), dtype::f64, rng);
  EXPECT_TRUE(all_close(attention_family(c.q, other, c.v, c.opt, c.exec).out, a, 0.0));
  const family_grads g = attention_family_backward(c.q, c.k, c.v, random_tensor(a.shape(), dtype::f64, rng), c.opt, c.exec);
  for (double x : g.dk.to_vector()) EXPECT_EQ(x, 0.0);
}

TEST(FamilyProperties, NamedHelpersMatchTheEntryPoint) {
  std::mt19937 rng(36);
  family_case c(score_kind::additive, distribution_kind::softmax, rng);
  EXPECT_TRUE(all_close(additive_attention(c.q, c.k, c.v, c.W_q, c.W_k, c.b, c.w_v).out,
                        attention_family(c.q, c.k, c.v, c.opt, c.exec).out, 0.0));
  family_case g(score_kind::general, distribution_kind::softmax, rng);
  EXPECT_TRUE(all_close(general_attention(g.q, g.k, g.v, g.W).out, attention_family(g.q, g.k, g.v, g.opt).out, 0.0));
  family_case s(score_kind::scaled_dot, distribution_kind::sparsemax, rng);
  s.opt.score.scale.reset();
  EXPECT_TRUE(all_close(sparsemax_attention(s.q, s.k, s.v).out, attention_family(s.q, s.k, s.v, s.opt).out, 0.0));
  s.opt.distribution.kind = distribution_kind::entmax15;
  EXPECT_TRUE(all_close(entmax15_attention(s.q, s.k, s.v).out, attention_family(s.q, s.k, s.v, s.opt).out, 0.0));
  s.opt.distribution.kind = distribution_kind::sigmoid;
  EXPECT_TRUE(all_close(sigmoid_attention(s.q, s.k, s.v).out, attention_family(s.q, s.k, s.v, s.opt).out, 0.0));
  family_case l(score_kind::location, distribution_kind::softmax, rng);
  EXPECT_TRUE(all_close(location_attention(l.q, l.k, l.v, l.W_a).out, attention_family(l.q, l.k, l.v, l.opt).out, 0.0));
}

// biased_general is kᵀ(Wᵀq + b), b [Dk] (Galassi et al. 2020): the dot score on q' = Wᵀq + b
// formed here by hand, on every path; and b changes the softmax weights (a scalar could not).
TEST(FamilyProperties, BiasedGeneralIsKeyTimesBiasedProjection) {
  std::mt19937 rng(39);
  family_case c(score_kind::biased_general, distribution_kind::softmax, rng, 2, 2, 1, 4, 5, 3, 2);
  ASSERT_EQ(c.b.shape(), (Shape{c.Dk}));
  Tensor qp = Tensor::zeros({c.B, c.Hq, c.Nq, c.Dk}, dtype::f64);
  for (std::int64_t b = 0; b < c.B; ++b)
    for (std::int64_t h = 0; h < c.Hq; ++h)
      for (std::int64_t i = 0; i < c.Nq; ++i)
        for (std::int64_t e = 0; e < c.Dk; ++e) {
          double x = c.b.get({e});
          for (std::int64_t d = 0; d < c.D; ++d) x += c.W.get({d, e}) * c.q.get({b, h, i, d});
          qp.set({b, h, i, e}, x);
        }
  for (distribution_kind d : {distribution_kind::softmax, distribution_kind::sparsemax, distribution_kind::identity}) {
    family_options dot;
    dot.score.kind = score_kind::dot;
    dot.distribution.kind = c.opt.distribution.kind = d;
    const Tensor want = attention_family(qp, c.k, c.v, dot, {.path = family_path::reference}).out;
    for (family_path p : {family_path::automatic, family_path::tiled, family_path::reference})
      EXPECT_TRUE(all_close(attention_family(c.q, c.k, c.v, c.opt, {.path = p}).out, want, 1e-12))
          << to_string(d) << " " << to_string(p);
  }
  c.opt.distribution.kind = distribution_kind::softmax;
  const Tensor with_b = attention_family(c.q, c.k, c.v, c.opt).out;
  Tensor b2 = Tensor::copy_of(c.b);
  b2.set({0}, b2.get({0}) + 1.0);
  c.opt.score.b = b2.view();
  EXPECT_FALSE(all_close(attention_family(c.q, c.k, c.v, c.opt).out, with_b, 1e-6)) << "b has no effect under softmax";
  const Tensor scalar = random_tensor({1}, dtype::f64, rng);
  c.opt.score.b = scalar.view();
  EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt), "b has shape [1], expected [4] for score biased_general");
}

// Seed 004's unnormalised weighting: y_i = Σ_j (q_i·k_j) v_j, worked by hand.
TEST(FamilyProperties, IdentityIsTheUnnormalisedWeightedSum) {
  const Tensor q = Tensor::from_values({1, 1, 1, 2}, dtype::f64, {1.0, 2.0});
  const Tensor k = Tensor::from_values({1, 1, 3, 2}, dtype::f64, {1, 0, 0, 1, -1, -1});
  const Tensor v = Tensor::from_values({1, 1, 3, 1}, dtype::f64, {1.0, 10.0, 100.0});
  family_options o;
  o.score.kind = score_kind::dot;
  o.distribution.kind = distribution_kind::identity;
  for (family_path p : {family_path::automatic, family_path::tiled, family_path::reference}) {
    // s = [1, 2, -3]: 1 + 20 - 300
    EXPECT_EQ(attention_family(q, k, v, o, {.path = p}).out.get({0, 0, 0, 0}), -279.0) << to_string(p);
    const Tensor mask = Tensor::from_values({1, 3}, dtype::boolean, {1, 1, 0});
    family_options m = o;
    m.attn_mask = mask.view();
    EXPECT_EQ(attention_family(q, k, v, m, {.path = p}).out.get({0, 0, 0, 0}), 21.0) << to_string(p);
  }
}

// gaussian_form::width is exp(-‖q-k‖²/h) (seed 002); sigma is exp(-‖q-k‖²/(2h²)): width h equals
// sigma √(h/2). Checked on a worked example and through the sigmoid (not shift-invariant) and
// softmax (core route) distributions, with dbandwidth by central differences.
TEST(FamilyProperties, GaussianWidthForm) {
  const Tensor q = Tensor::from_values({1, 1, 1, 1}, dtype::f64, {0.0});
  const Tensor k = Tensor::from_values({1, 1, 2, 1}, dtype::f64, {1.0, 2.0});
  const Tensor v = Tensor::from_values({1, 1, 2, 1}, dtype::f64, {1.0, 0.0});
  family_options o;
  o.score.kind = score_kind::gaussian;
  o.score.gaussian = gaussian_form::width;
  o.score.bandwidth = 2.0;
  o.distribution.kind = distribution_kind::kernel;
  // K = [e^{-1/2}, e^{-2}]: out = K_0 / (K_0 + K_1)
  const double k0 = std::exp(-0.5), k1 = std::exp(-2.0);
  for (family_path p : {family_path::automatic, family_path::tiled, family_path::reference})
    EXPECT_NEAR(attention_family(q, k, v, o, {.path = p}).out.get({0, 0, 0, 0}), k0 / (k0 + k1), 1e-15);
  std::mt19937 rng(40);
  for (distribution_kind d : {distribution_kind::sigmoid, distribution_kind::softmax, distribution_kind::identity}) {
    family_case c(score_kind::gaussian, d, rng, 1, 2, 1, 3, 4, 3, 2);
    c.opt.score.gaussian = gaussian_form::width;
    c.opt.score.bandwidth = 1.7;
    family_options sig = c.opt;
    sig.score.gaussian = gaussian_form::sigma;
    sig.score.bandwidth = std::sqrt(1.7 / 2.0);
    EXPECT_TRUE(all_close(attention_family(c.q, c.k, c.v, c.opt).out, attention_family(c.q, c.k, c.v, sig).out, 1e-12));
    const Tensor dout = random_tensor({1, 2, 3, 2}, dtype::f64, rng);
    for (family_path p : {family_path::automatic, family_path::tiled}) {
      const execution e{.path = p};
      const family_grads g = attention_family_backward(c.q, c.k, c.v, dout, c.opt, e);
      double& h = c.opt.score.bandwidth;
      const double h0 = h, eps = 1e-6;
      h = h0 + eps;
      const double lp = weighted_sum(attention_family(c.q, c.k, c.v, c.opt, e).out, dout);
      h = h0 - eps;
      const double lm = weighted_sum(attention_family(c.q, c.k, c.v, c.opt, e).out, dout);
      h = h0;
      EXPECT_NEAR(g.dbandwidth, (lp - lm) / (2 * eps), 1e-6) << to_string(d) << " " << g.path;
      auto loss = [&] { return weighted_sum(attention_family(c.q, c.k, c.v, c.opt, e).out, dout); };
      expect_gradient("width dq " + g.path, c.q, g.dq, loss, 1e-6, 1e-5);
      expect_gradient("width dk " + g.path, c.k, g.dk, loss, 1e-6, 1e-5);
    }
  }
  o.score.gaussian = gaussian_form(5);
  EXPECT_THROW_MSG(attention_family(q, k, v, o), "attention_family: gaussian form 5 is not a gaussian_form");
}

TEST(FamilyProperties, NamesRoundTrip) {
  for (score_kind s : all_scores()) EXPECT_EQ(parse_score_kind(to_string(s)), s);
  for (distribution_kind d : all_distributions()) EXPECT_EQ(parse_distribution_kind(to_string(d)), d);
  EXPECT_THROW_MSG(parse_score_kind("bilinear"), "score: 'bilinear' is not one of dot, scaled_dot");
  EXPECT_THROW_MSG(parse_distribution_kind("argmax"), "distribution: 'argmax' is not one of softmax");
}

TEST(FamilyProperties, EmptyShapes) {
  std::mt19937 rng(38);
  for (auto [Nq, Nk, Dv] : {std::tuple<std::int64_t, std::int64_t, std::int64_t>{0, 5, 2}, {3, 0, 2}, {3, 5, 0}})
    for (score_kind s : {score_kind::scaled_dot, score_kind::additive, score_kind::triangle})
      for (distribution_kind d : {distribution_kind::softmax, distribution_kind::sparsemax, distribution_kind::topk}) {
        family_case c(s, d, rng, 1, 2, 1, Nq, Nk, 3, Dv);
        if (s == score_kind::triangle && d == distribution_kind::softmax) c.opt.distribution.kind = distribution_kind::kernel;
        const Tensor dout = Tensor::zeros({1, 2, Nq, Dv}, dtype::f64);
        for (family_path p : {family_path::automatic, family_path::tiled, family_path::reference}) {
          c.exec.path = p;
          const family_result r = attention_family(c.q, c.k, c.v, c.opt, c.exec);
          EXPECT_EQ(r.out.shape(), (Shape{1, 2, Nq, Dv}));
          for (double x : r.out.to_vector()) EXPECT_EQ(x, 0.0);
          const family_grads g = attention_family_backward(c.q, c.k, c.v, dout, c.opt, c.exec);
          EXPECT_EQ(g.dk.shape(), c.k.shape());
        }
      }
}

// ---- bad input ----

TEST(FamilyErrors, NameTheOpArgumentAndValues) {
  std::mt19937 rng(37);
  {
    family_case c(score_kind::dot, distribution_kind::kernel, rng);
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec),
                     "attention_family: distribution kernel needs a gaussian, box or triangle score (got dot)");
  }
  {
    family_case c(score_kind::general, distribution_kind::softmax, rng);
    c.opt.score.W.reset();
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "attention_family: score general needs W of shape [3, 4]");
    const Tensor bad = random_tensor({4, 3}, dtype::f64, rng);
    c.opt.score.W = bad.view();
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "W has shape [4, 3], expected [3, 4] for score general");
    const Tensor nan = Tensor::full({3, 4}, dtype::f64, std::nan(""));
    c.opt.score.W = nan.view();
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "W holds a non-finite value (nan)");
    c.opt.score.W = c.W.view();
    c.opt.score.W_a = c.W.view();
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "score general takes no parameter W_a (it takes: W)");
  }
  {
    family_case c(score_kind::scaled_dot, distribution_kind::topk, rng);
    c.opt.distribution.k = 0;
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "attention_family: topk needs k >= 1 (got k = 0)");
  }
  {
    family_case c(score_kind::cosine, distribution_kind::softmax, rng);
    c.opt.score.temperature = -1;
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "cosine temperature = -1 must be finite and > 0");
  }
  {
    family_case c(score_kind::gaussian, distribution_kind::kernel, rng);
    c.opt.score.bandwidth = 0;
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "bandwidth h = 0 must be finite and > 0");
  }
  {
    family_case c(score_kind::box, distribution_kind::kernel, rng);
    c.mask = Tensor::zeros({c.Nq, c.Nk}, dtype::f32);
    c.opt.attn_mask = c.mask.view();
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec),
                     "distribution kernel with score box takes a bool attn_mask only (got a float32 mask)");
    c.mask = Tensor::zeros({3, c.Nk}, dtype::boolean);
    c.opt.attn_mask = c.mask.view();
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "attention_family: attn_mask [3, 6] does not broadcast");
  }
  {
    family_case c(score_kind::dot, distribution_kind::softmax, rng);
    const Tensor k4 = random_tensor({c.B, c.Hkv, c.Nk, 4}, dtype::f64, rng);
    EXPECT_THROW_MSG(attention_family(c.q, k4, c.v, c.opt, c.exec),
                     "score dot needs q and k of the same head size (q has 3, k has 4)");
    c.exec.path = family_path::core;
    c.opt.distribution.kind = distribution_kind::sparsemax;
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "path core runs only dot, scaled_dot");
    c.exec.path = family_path::automatic;
    const Tensor dout = random_tensor({1, 2, 3}, dtype::f64, rng);
    EXPECT_THROW_MSG(attention_family_backward(c.q, c.k, c.v, dout, c.opt, c.exec),
                     "attention_family_backward: dout has shape [1, 2, 3], expected [2, 2, 4, 3]");
    const Tensor q5 = random_tensor({1, 1, 1, 1, 3}, dtype::f64, rng);
    EXPECT_THROW_MSG(attention_family(q5, c.k, c.v, c.opt, c.exec), "attention_family: q has 5 dims, expected 4");
  }
  {
    family_case c(score_kind::additive, distribution_kind::softmax, rng);
    const Tensor w = random_tensor({2, 5}, dtype::f64, rng);
    c.opt.score.w_v = w.view();
    EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, c.exec), "w_v has shape [2, 5], expected [5] or [3, 5]");
  }
  EXPECT_THROW_MSG(nadaraya_watson(Tensor::zeros({1, 1, 1, 1}, dtype::f64), Tensor::zeros({1, 1, 1, 1}, dtype::f64),
                                   Tensor::zeros({1, 1, 1, 1}, dtype::f64), score_kind::dot, 1.0),
                   "nadaraya_watson: kernel must be gaussian, box or triangle (got dot)");
}

}  // namespace
}  // namespace attn::testing

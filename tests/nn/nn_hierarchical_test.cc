// tests/nn/nn_hierarchical_test.cc — ContextAttention and HierarchicalAttention: the attention
// pooling written out with loops (u = tanh(W h + b), softmax of uᵀu_c over the real elements,
// Σ α h), the network composed by hand from a BiGRU per sentence, every gradient against central
// finite differences (float64), padding at both levels, float32 against float64, errors.
#include <limits>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using vec = std::vector<double>;

// ContextAttention of the rows t < L of h[r] (h [R, N, D] as a tensor, or given rows): the
// pooled vector and the weights, with loops.
struct pooled {
  vec s, alpha;
};
pooled pool(const ContextAttention& att, const std::vector<vec>& h, std::int64_t L) {
  const std::int64_t A = att.context.size(0);
  const std::size_t D = h.empty() ? 0 : h[0].size();
  vec score(h.size(), 0.0), alpha(h.size(), 0.0), s(D, 0.0);
  double mx = -std::numeric_limits<double>::infinity(), z = 0;
  for (std::int64_t t = 0; t < L; ++t) {
    for (std::int64_t a = 0; a < A; ++a) {
      double u = att.proj.bias.get({a});
      for (std::size_t c = 0; c < D; ++c) u += att.proj.weight.get({a, std::int64_t(c)}) * h[std::size_t(t)][c];
      score[std::size_t(t)] += std::tanh(u) * att.context.get({a});
    }
    mx = std::max(mx, score[std::size_t(t)]);
  }
  for (std::int64_t t = 0; t < L; ++t) z += std::exp(score[std::size_t(t)] - mx);
  for (std::int64_t t = 0; t < L; ++t) {
    alpha[std::size_t(t)] = std::exp(score[std::size_t(t)] - mx) / z;
    for (std::size_t c = 0; c < D; ++c) s[c] += alpha[std::size_t(t)] * h[std::size_t(t)][c];
  }
  return {s, alpha};
}

std::vector<vec> rows(const Tensor& t, std::int64_t b) {  // t [B, N, D] → N rows of entry b
  std::vector<vec> out(std::size_t(t.size(1)), vec(std::size_t(t.size(2))));
  for (std::int64_t i = 0; i < t.size(1); ++i)
    for (std::int64_t c = 0; c < t.size(2); ++c) out[std::size_t(i)][std::size_t(c)] = t.get({b, i, c});
  return out;
}

TEST(NnContextAttention, ForwardIsTheFormulaWrittenOut) {
  rng gen(1);
  ContextAttention att(3, 4, gen, dtype::f64);
  std::mt19937 r(2);
  const Tensor h = random_tensor({3, 5, 3}, dtype::f64, r, -2, 2);
  const Tensor len = Tensor::from_values({3}, dtype::i64, {5, 2, 0});
  const auto res = att.forward(h, len, nullptr, true);
  for (std::int64_t b = 0; b < 3; ++b) {
    const pooled p = pool(att, rows(h, b), std::int64_t(len.get({b})));
    for (std::int64_t c = 0; c < 3; ++c) EXPECT_NEAR(res.pooled.get({b, c}), p.s[std::size_t(c)], 1e-12);
    for (std::int64_t t = 0; t < 5; ++t) EXPECT_NEAR(res.weights.get({b, t}), p.alpha[std::size_t(t)], 1e-12);
  }
  EXPECT_NE(res.pooled.get({0, 0}), 0.0);
}

// x [B, S, W, E] with real words, padded words and a padded sentence.
struct doc_case {
  std::mt19937 r{3};
  Tensor x = random_tensor({2, 3, 4, 2}, dtype::f64, r, -1.5, 1.5);
  Tensor word_lengths = Tensor::from_values({2, 3}, dtype::i64, {4, 2, 3,  //
                                                                  1, 3, 4});
  Tensor sentence_lengths = Tensor::from_values({2}, dtype::i64, {3, 2});
};

TEST(NnHierarchicalAttention, ForwardIsTheNetworkWrittenOut) {
  rng gen(4);
  HierarchicalAttention han(2, 3, 2, gen, dtype::f64);
  const doc_case dc;
  const auto res = han.forward(dc.x, dc.word_lengths, dc.sentence_lengths, nullptr, true);
  ASSERT_EQ(res.document.shape(), Shape({2, 4}));
  for (std::int64_t b = 0; b < 2; ++b) {
    const std::int64_t S = std::int64_t(dc.sentence_lengths.get({b}));
    // Word level: each real sentence through the BiGRU alone (only its real words), then pooled.
    Tensor sent = Tensor::zeros({1, 3, 6}, dtype::f64);
    for (std::int64_t i = 0; i < 3; ++i) {
      const std::int64_t L = i < S ? std::int64_t(dc.word_lengths.get({b, i})) : 0;
      if (L == 0) continue;
      Tensor words = Tensor::empty({1, L, 2}, dtype::f64);
      for (std::int64_t t = 0; t < L; ++t)
        for (std::int64_t c = 0; c < 2; ++c) words.set({0, t, c}, dc.x.get({b, i, t, c}));
      const Tensor h = han.word_encoder.forward(words, std::nullopt, nullptr).out;
      const pooled p = pool(han.word_attention, rows(h, 0), L);
      for (std::int64_t c = 0; c < 6; ++c) sent.set({0, i, c}, p.s[std::size_t(c)]);
      for (std::int64_t t = 0; t < 4; ++t)
        EXPECT_NEAR(res.word_weights.get({b, i, t}), t < L ? p.alpha[std::size_t(t)] : 0.0, 1e-12) << b << i << t;
    }
    // Sentence level: the real sentences only.
    Tensor real = Tensor::copy_of(sent.view().slice(1, 0, S));
    const Tensor g = han.sentence_encoder.forward(real, std::nullopt, nullptr).out;
    const pooled d = pool(han.sentence_attention, rows(g, 0), S);
    for (std::int64_t c = 0; c < 4; ++c) EXPECT_NEAR(res.document.get({b, c}), d.s[std::size_t(c)], 1e-12);
    for (std::int64_t i = 0; i < 3; ++i)
      EXPECT_NEAR(res.sentence_weights.get({b, i}), i < S ? d.alpha[std::size_t(i)] : 0.0, 1e-12);
  }
}

TEST(NnHierarchicalAttention, GradientsMatchFiniteDifferences) {
  rng gen(5);
  HierarchicalAttention han(2, 2, 2, gen, dtype::f64);
  doc_case dc;
  const Tensor w = random_tensor({2, 4}, dtype::f64, dc.r);
  auto loss = [&] { return weighted_sum(han.forward(dc.x, dc.word_lengths, dc.sentence_lengths).document, w); };
  HierarchicalAttention::saved s;
  han.forward(dc.x, dc.word_lengths, dc.sentence_lengths, &s);
  const Tensor dx = han.backward(s, w);
  expect_gradient("x", dc.x, dx, loss);
  parameter_list ps;
  han.parameters(ps, "han.");
  ASSERT_EQ(ps.size(), 22u);
  EXPECT_EQ(ps[8].name, "han.word_attention.proj.weight");
  EXPECT_EQ(ps[10].name, "han.word_attention.context");
  for (const parameter_ref& p : ps) expect_gradient(p.name, *p.value, *p.grad, loss);
}

TEST(NnHierarchicalAttention, PaddingChangesNothing) {
  rng gen(6);
  HierarchicalAttention han(2, 3, 2, gen, dtype::f64);
  const doc_case dc;
  const auto a = han.forward(dc.x, dc.word_lengths, dc.sentence_lengths, nullptr, true);
  // New values in every padded word and in the padded sentence (document 1, sentence 2), whose
  // word length also changes.
  Tensor x2 = Tensor::copy_of(dc.x);
  Tensor wl2 = Tensor::copy_of(dc.word_lengths);
  wl2.set({1, 2}, 1.0);
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t i = 0; i < 3; ++i)
      for (std::int64_t t = i < std::int64_t(dc.sentence_lengths.get({b})) ? std::int64_t(dc.word_lengths.get({b, i})) : 0;
           t < 4; ++t)
        for (std::int64_t c = 0; c < 2; ++c) x2.set({b, i, t, c}, 5.0 + double(t));
  const auto b2 = han.forward(x2, wl2, dc.sentence_lengths, nullptr, true);
  EXPECT_TRUE(all_close(b2.document, a.document, 1e-12));
  EXPECT_TRUE(all_close(b2.word_weights, a.word_weights, 1e-12));
  EXPECT_TRUE(all_close(b2.sentence_weights, a.sentence_weights, 1e-12));
  EXPECT_EQ(a.sentence_weights.get({1, 2}), 0.0);
  for (std::int64_t t = 0; t < 4; ++t) EXPECT_EQ(a.word_weights.get({1, 2, t}), 0.0);
  EXPECT_EQ(a.word_weights.get({0, 1, 2}), 0.0);
  // A real word changes it.
  x2.set({0, 1, 1, 0}, 3.0);
  EXPECT_FALSE(all_close(han.forward(x2, wl2, dc.sentence_lengths).document, a.document, 1e-6));
}

TEST(NnHierarchicalAttention, Float32MatchesFloat64) {
  rng gen(7);
  HierarchicalAttention h64(2, 3, 2, gen, dtype::f64), h32(2, 3, 2, gen, dtype::f32);
  parameter_list p64, p32;
  h64.parameters(p64), h32.parameters(p32);
  for (std::size_t i = 0; i < p64.size(); ++i) *p32[i].value = p64[i].value->to(dtype::f32);
  doc_case dc;
  HierarchicalAttention::saved s64, s32;
  const auto a = h64.forward(dc.x, dc.word_lengths, dc.sentence_lengths, &s64);
  const auto b = h32.forward(dc.x.to(dtype::f32), dc.word_lengths, dc.sentence_lengths, &s32);
  EXPECT_TRUE(all_close(b.document, a.document, 1e-5));
  const Tensor w = random_tensor({2, 4}, dtype::f64, dc.r);
  EXPECT_TRUE(all_close(h32.backward(s32, w.to(dtype::f32)), h64.backward(s64, w), 1e-4));
  for (std::size_t i = 0; i < p64.size(); ++i) EXPECT_TRUE(all_close(*p32[i].grad, *p64[i].grad, 1e-4)) << p64[i].name;
}

TEST(NnHierarchicalAttention, Errors) {
  rng gen(8);
  HierarchicalAttention han(2, 3, 2, gen, dtype::f64);
  const doc_case dc;
  EXPECT_THROW_MSG(han.forward(Tensor::zeros({2, 3, 4, 5}, dtype::f64), dc.word_lengths, dc.sentence_lengths),
                   "HierarchicalAttention: x has shape [2, 3, 4, 5], expected [B, S, W, E] with E = 2");
  EXPECT_THROW_MSG(han.forward(dc.x, Tensor::from_values({2, 3}, dtype::i64, {4, 2, 3, 1, 5, 4}), dc.sentence_lengths),
                   "HierarchicalAttention: word_lengths[1, 1] = 5 is outside [0, W] = [0, 4]");
  EXPECT_THROW_MSG(han.forward(dc.x, dc.word_lengths, Tensor::from_values({2}, dtype::i64, {3, 4})),
                   "HierarchicalAttention: sentence_lengths[1] = 4 is outside [0, S] = [0, 3]");
  EXPECT_THROW_MSG(han.forward(dc.x, dc.sentence_lengths, dc.sentence_lengths),
                   "HierarchicalAttention: word_lengths has shape [2], expected [2, 3]");
  EXPECT_THROW_MSG(han.forward(dc.x.to(dtype::f32), dc.word_lengths, dc.sentence_lengths),
                   "HierarchicalAttention: x has dtype float32, expected float64");
  HierarchicalAttention::saved s;
  han.forward(dc.x, dc.word_lengths, dc.sentence_lengths, &s);
  EXPECT_THROW_MSG(han.backward(s, Tensor::zeros({2, 3}, dtype::f64)),
                   "ContextAttention.backward: dpooled has shape [2, 3], expected [2, 4]");
  EXPECT_THROW_MSG(han.backward(HierarchicalAttention::saved{}, Tensor::zeros({2, 4}, dtype::f64)),
                   "HierarchicalAttention.backward: saved is empty");
  EXPECT_THROW_MSG(HierarchicalAttention(0, 3, 2, gen), "HierarchicalAttention: E = 0, Hw = 3, Hs = 2 must be >= 1");
  EXPECT_THROW_MSG(HierarchicalAttention().forward(dc.x, dc.word_lengths, dc.sentence_lengths),
                   "HierarchicalAttention: the layer has no parameters");
  EXPECT_THROW_MSG(ContextAttention().forward(dc.x, dc.sentence_lengths), "ContextAttention: the layer has no parameters");
  ContextAttention att(3, 2, gen, dtype::f64);
  EXPECT_THROW_MSG(att.forward(Tensor::zeros({2, 4, 2}, dtype::f64), dc.sentence_lengths),
                   "ContextAttention: h has shape [2, 4, 2], expected [R, N, D] with D = 3");
  EXPECT_THROW_MSG(att.forward(Tensor::zeros({2, 4, 3}, dtype::f64), Tensor::from_values({2}, dtype::i64, {1, 5})),
                   "ContextAttention: lengths[1] = 5 is outside [0, N] = [0, 4]");
}

}  // namespace
}  // namespace attn::nn

// tests/nn/nn_memory_network_test.cc — MemoryNetwork: the forward against the hops written out
// with loops (bag-of-words memories, softmax over the real sentences, u + o, tied output), the
// per-hop weights, and every gradient against central finite differences (float64).
#include <limits>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

struct story_case {
  Tensor story = Tensor::from_values({2, 4, 3}, dtype::i64, {1, 2, 0, 3, 4, 5, 2, 2, 1, 5, 0, 0,  //
                                                              4, 1, 0, 3, 3, 3, 0, 0, 0, 0, 0, 0});
  Tensor query = Tensor::from_values({2, 2}, dtype::i64, {5, 1, 2, 0});
  Tensor lengths = Tensor::from_values({2}, dtype::i64, {4, 2});
};

// Σ_w table[ids[w]] over nonzero ids, for sentence (b, i) (i < 0: the query).
std::vector<double> bag(const Tensor& ids, const Tensor& table, std::int64_t b, std::int64_t i) {
  std::vector<double> v(std::size_t(table.size(1)), 0.0);
  const std::int64_t W = ids.size(-1);
  for (std::int64_t w = 0; w < W; ++w) {
    const std::int64_t id = std::int64_t(i < 0 ? ids.get({b, w}) : ids.get({b, i, w}));
    if (id == 0) continue;
    for (std::size_t c = 0; c < v.size(); ++c) v[c] += table.get({id, std::int64_t(c)});
  }
  return v;
}

TEST(NnMemoryNetwork, ForwardIsTheHopsWrittenOut) {
  rng gen(1);
  MemoryNetwork net(6, 3, 5, 3, gen, dtype::f64);
  const story_case sc;
  const auto res = net.forward(sc.story, sc.query, sc.lengths, nullptr, true);
  ASSERT_EQ(res.weights.size(), 3u);
  for (std::int64_t b = 0; b < 2; ++b) {
    const std::int64_t L = std::int64_t(sc.lengths.get({b}));
    std::vector<double> u = bag(sc.query, net.E[0].weight, b, -1);
    for (std::int64_t k = 1; k <= 3; ++k) {
      std::vector<double> s(static_cast<std::size_t>(L)), o(3, 0.0);
      double mx = -std::numeric_limits<double>::infinity(), z = 0;
      for (std::int64_t i = 0; i < L; ++i) {
        const auto m = bag(sc.story, net.E[std::size_t(k - 1)].weight, b, i);
        double dot = 0;
        for (std::int64_t c = 0; c < 3; ++c) dot += u[std::size_t(c)] * (m[std::size_t(c)] + net.T[std::size_t(k - 1)].get({i, c}));
        mx = std::max(mx, s[std::size_t(i)] = dot);
      }
      for (double x : s) z += std::exp(x - mx);
      for (std::int64_t i = 0; i < L; ++i) {
        const double p = std::exp(s[std::size_t(i)] - mx) / z;
        EXPECT_NEAR(res.weights[std::size_t(k - 1)].get({b, 0, 0, i}), p, 1e-12);
        const auto c = bag(sc.story, net.E[std::size_t(k)].weight, b, i);
        for (std::int64_t e = 0; e < 3; ++e) o[std::size_t(e)] += p * (c[std::size_t(e)] + net.T[std::size_t(k)].get({i, e}));
      }
      for (std::int64_t e = 0; e < 3; ++e) u[std::size_t(e)] += o[std::size_t(e)];
    }
    for (std::int64_t v = 0; v < 6; ++v) {
      double logit = 0;
      for (std::int64_t e = 0; e < 3; ++e) logit += u[std::size_t(e)] * net.E[3].weight.get({v, e});
      EXPECT_NEAR(res.logits.get({b, v}), logit, 1e-12);
    }
  }
}

TEST(NnMemoryNetwork, GradientsMatchFiniteDifferences) {
  rng gen(2);
  MemoryNetwork net(6, 3, 5, 2, gen, dtype::f64);
  for (Embedding& e : net.E) fill_normal(e.weight, 0.0, 0.5, gen);
  const story_case sc;
  std::mt19937 r(3);
  const Tensor w = random_tensor({2, 6}, dtype::f64, r);
  auto loss = [&] { return weighted_sum(net.forward(sc.story, sc.query, sc.lengths).logits, w); };
  MemoryNetwork::saved s;
  net.forward(sc.story, sc.query, sc.lengths, &s);
  net.backward(s, w);
  parameter_list ps;
  net.parameters(ps, "mem.");
  ASSERT_EQ(ps.size(), 6u);
  EXPECT_EQ(ps[1].name, "mem.T0.weight");
  for (const parameter_ref& p : ps) expect_gradient(p.name, *p.value, *p.grad, loss);
}

TEST(NnMemoryNetwork, Errors) {
  rng gen(4);
  MemoryNetwork net(6, 3, 3, 1, gen);
  const story_case sc;
  EXPECT_THROW_MSG(net.forward(sc.story, sc.query, sc.lengths),
                   "MemoryNetwork: story has shape [2, 4, 3], expected [B, S, W] with S <= 3");
  const Tensor bad = Tensor::from_values({2, 2}, dtype::i64, {1, 9, 0, 0});
  MemoryNetwork wide(6, 3, 5, 1, gen);
  EXPECT_THROW_MSG(wide.forward(sc.story, bad, sc.lengths), "MemoryNetwork: query[1] = 9 is outside [0, V) = [0, 6)");
}

}  // namespace
}  // namespace attn::nn

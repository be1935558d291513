// tests/nn/nn_scored_attention_test.cc — AdditiveAttention and LuongAttention (dot, general,
// concat, location): forwards against the score formulas, softmax and weighted sum written out
// here with loops; gradients against central finite differences (float64).
#include <functional>
#include <limits>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using score_fn = std::function<double(std::int64_t b, std::int64_t i, std::int64_t j)>;

// context[b, i] = Σ_j softmax_j(score(b, i, j)) v[b, j] over keys j < lengths[b].
Tensor naive_context(const Tensor& values, std::int64_t Nq, const std::vector<std::int64_t>& lengths,
                     const score_fn& score) {
  const std::int64_t B = values.size(0), Nk = values.size(1), Dv = values.size(2);
  Tensor out = Tensor::zeros({B, Nq, Dv}, dtype::f64);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < Nq; ++i) {
      const std::int64_t L = lengths.empty() ? Nk : lengths[std::size_t(b)];
      std::vector<double> s(static_cast<std::size_t>(L));
      double mx = -std::numeric_limits<double>::infinity(), z = 0;
      for (std::int64_t j = 0; j < L; ++j) mx = std::max(mx, s[std::size_t(j)] = score(b, i, j));
      for (double x : s) z += std::exp(x - mx);
      for (std::int64_t j = 0; j < L; ++j)
        for (std::int64_t d = 0; d < Dv; ++d)
          out.set({b, i, d}, out.get({b, i, d}) + std::exp(s[std::size_t(j)] - mx) / z * values.get({b, j, d}));
    }
  return out;
}

// w_vᵀ tanh(W_q q + W_k k + b)
double additive_score(const Tensor& Wq, const Tensor& Wk, const Tensor& bias, const Tensor& wv, const Tensor& q,
                      const Tensor& k, std::int64_t b, std::int64_t i, std::int64_t j) {
  double s = 0;
  for (std::int64_t a = 0; a < wv.size(0); ++a) {
    double h = bias.defined() ? bias.get({a}) : 0.0;
    for (std::int64_t d = 0; d < q.size(2); ++d) h += Wq.get({a, d}) * q.get({b, i, d});
    for (std::int64_t d = 0; d < k.size(2); ++d) h += Wk.get({a, d}) * k.get({b, j, d});
    s += wv.get({a}) * std::tanh(h);
  }
  return s;
}

struct inputs {
  Tensor q, k, v;
  inputs(std::int64_t Dq, std::int64_t Dk, std::mt19937& r)
      : q(random_tensor({2, 3, Dq}, dtype::f64, r)), k(random_tensor({2, 4, Dk}, dtype::f64, r)),
        v(random_tensor({2, 4, 3}, dtype::f64, r)) {}
};

TEST(NnScoredAttention, AdditiveForwardAndWeights) {
  std::mt19937 r(1);
  rng gen(2);
  AdditiveAttention att(5, 4, 6, gen, dtype::f64);
  fill_uniform(att.b, -0.5, 0.5, gen);
  const inputs in(5, 4, r);
  masking_options mask;
  mask.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {4, 2});
  const scored_result res = att.forward(in.q, in.k, in.v, mask, true);
  const Tensor want = naive_context(in.v, 3, {4, 2}, [&](std::int64_t b, std::int64_t i, std::int64_t j) {
    return additive_score(att.W_q, att.W_k, att.b, att.w_v, in.q, in.k, b, i, j);
  });
  EXPECT_TRUE(all_close(res.context, want, 1e-12));
  ASSERT_EQ(res.weights.shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(res.weights.get({1, 0, 2, 3}), 0.0);  // a padded key
  double row = 0;
  for (std::int64_t j = 0; j < 4; ++j) row += res.weights.get({0, 0, 1, j});
  EXPECT_NEAR(row, 1.0, 1e-12);
}

void check_gradients(const std::string& what, parameter_list ps, const inputs& in, const masking_options& mask,
                     const std::function<Tensor()>& forward, const std::function<scored_grads(const Tensor&)>& backward,
                     std::mt19937& r) {
  const Tensor w = random_tensor({2, 3, 3}, dtype::f64, r);
  auto loss = [&] { return weighted_sum(forward(), w); };
  zero_grad(ps);
  const scored_grads g = backward(w);
  expect_gradient(what + " dquery", in.q, g.dquery, loss, 1e-6, 1e-5);
  expect_gradient(what + " dkeys", in.k, g.dkeys, loss, 1e-6, 1e-5);
  expect_gradient(what + " dvalues", in.v, g.dvalues, loss, 1e-6, 1e-5);
  for (const parameter_ref& p : ps) expect_gradient(what + " " + p.name, *p.value, *p.grad, loss, 1e-6, 1e-5);
}

TEST(NnScoredAttention, AdditiveGradients) {
  std::mt19937 r(3);
  rng gen(4);
  AdditiveAttention att(3, 2, 4, gen, dtype::f64);
  fill_uniform(att.b, -0.5, 0.5, gen);
  const inputs in(3, 2, r);
  masking_options mask;
  mask.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {3, 4});
  parameter_list ps;
  att.parameters(ps);
  ASSERT_EQ(ps.size(), 4u);
  check_gradients(
      "additive", ps, in, mask, [&] { return att.forward(in.q, in.k, in.v, mask).context; },
      [&](const Tensor& w) { return att.backward(in.q, in.k, in.v, w, mask); }, r);
}

// float32 modules keep the family op's result (lse on the core route and on the fused path): the
// backward from it gives the gradients of the backward that recomputes the forward, for the
// inputs and every parameter; a stale state (another query's) changes them — it is what is read.
TEST(NnScoredAttention, BackwardFromTheForwardResult) {
  std::mt19937 r(11);
  const std::int64_t B = 8, Nq = 5, Nk = 7, Dq = 6, Dk = 6;
  const Tensor q = random_tensor({B, Nq, Dq}, dtype::f32, r), k = random_tensor({B, Nk, Dk}, dtype::f32, r),
               v = random_tensor({B, Nk, 4}, dtype::f32, r), dc = random_tensor({B, Nq, 4}, dtype::f32, r);
  masking_options mask;
  mask.nonpad_kv_seqlen = Tensor::from_values({B}, dtype::i64, {7, 3, 5, 7, 1, 6, 2, 7});
  const auto compare = [&](const std::string& what, parameter_list ps, const auto& fwd, const auto& bwd) {
    SCOPED_TRACE(what);
    const scored_result res = fwd();
    ASSERT_TRUE(res.state.out.defined());
    EXPECT_TRUE(res.state.lse.defined());
    zero_grad(ps);
    const scored_grads g0 = bwd(nullptr);
    std::vector<Tensor> p0;
    for (const parameter_ref& p : ps) p0.push_back(Tensor::copy_of(*p.grad));
    zero_grad(ps);
    const scored_grads g1 = bwd(&res);
    EXPECT_TRUE(all_close(g1.dquery, g0.dquery, 1e-5));
    EXPECT_TRUE(all_close(g1.dkeys, g0.dkeys, 1e-5));
    EXPECT_TRUE(all_close(g1.dvalues, g0.dvalues, 1e-5));
    for (std::size_t i = 0; i < ps.size(); ++i) EXPECT_TRUE(all_close(*ps[i].grad, p0[i], 1e-5)) << ps[i].name;
    scored_result stale = res;
    stale.state.lse = Tensor::copy_of(res.state.lse);
    for (std::int64_t i = 0; i < stale.state.lse.numel(); ++i) static_cast<float*>(stale.state.lse.data())[i] += 0.5f;
    EXPECT_FALSE(all_close(bwd(&stale).dvalues, g0.dvalues, 1e-3));
  };
  rng gen(12);
  AdditiveAttention add(Dq, Dk, 9, gen);
  parameter_list pa;
  add.parameters(pa);
  compare("additive", pa, [&] { return add.forward(q, k, v, mask); },
          [&](const scored_result* f) { return add.backward(q, k, v, dc, mask, f); });
  for (luong_score s : {luong_score::dot, luong_score::general}) {
    LuongAttention lu(s, Dq, Dk, gen);
    parameter_list pl;
    lu.parameters(pl);
    compare("luong " + std::to_string(int(s)), pl, [&] { return lu.forward(q, k, v, mask); },
            [&](const scored_result* f) { return lu.backward(q, k, v, dc, mask, f); });
  }
}

TEST(NnScoredAttention, LuongScoresForwardAndGradients) {
  for (luong_score s : {luong_score::dot, luong_score::general, luong_score::concat, luong_score::location}) {
    std::mt19937 r(5);
    rng gen(6);
    const std::int64_t Dq = 3, Dk = s == luong_score::dot ? 3 : 2;
    LuongAttention att(s, Dq, Dk, gen, dtype::f64, s == luong_score::concat ? 5 : 4);
    const inputs in(Dq, Dk, r);
    const score_fn score = [&](std::int64_t b, std::int64_t i, std::int64_t j) -> double {
      double x = 0;
      switch (s) {
        case luong_score::dot:
          for (std::int64_t d = 0; d < Dq; ++d) x += in.q.get({b, i, d}) * in.k.get({b, j, d});
          return x;
        case luong_score::general:
          for (std::int64_t d = 0; d < Dq; ++d)
            for (std::int64_t e = 0; e < Dk; ++e) x += in.q.get({b, i, d}) * att.W.get({d, e}) * in.k.get({b, j, e});
          return x;
        case luong_score::concat: return additive_score(att.W_q, att.W_k, Tensor(), att.w_v, in.q, in.k, b, i, j);
        case luong_score::location:
          for (std::int64_t d = 0; d < Dq; ++d) x += att.W_a.get({j, d}) * in.q.get({b, i, d});
          return x;
      }
      return x;
    };
    EXPECT_TRUE(all_close(att.forward(in.q, in.k, in.v).context, naive_context(in.v, 3, {}, score), 1e-12))
        << int(s);
    parameter_list ps;
    att.parameters(ps);
    check_gradients(
        "luong " + std::to_string(int(s)), ps, in, {}, [&] { return att.forward(in.q, in.k, in.v).context; },
        [&](const Tensor& w) { return att.backward(in.q, in.k, in.v, w); }, r);
  }
}

TEST(NnScoredAttention, Errors) {
  rng gen(7);
  EXPECT_THROW_MSG(LuongAttention(luong_score::dot, 3, 4, gen), "LuongAttention: the dot score needs Dq = Dk, got 3 and 4");
  EXPECT_THROW_MSG(LuongAttention(luong_score::location, 3, 4, gen),
                   "LuongAttention: the location score needs the key count Nk >= 1, got 0");
  AdditiveAttention att(3, 2, 4, gen);
  const Tensor q = Tensor::zeros({2, 3, 3}, dtype::f32), k = Tensor::zeros({2, 4, 2}, dtype::f32);
  EXPECT_THROW_MSG(att.forward(q, k, Tensor::zeros({2, 5, 3}, dtype::f32)),
                   "AdditiveAttention: values has shape [2, 5, 3], expected Nk = 4 rows as keys [2, 4, 2]");
  EXPECT_THROW_MSG(att.forward(q, Tensor::zeros({3, 4, 2}, dtype::f32), k),
                   "AdditiveAttention: keys has shape [3, 4, 2], expected [B, N, features] with B = 2");
}

}  // namespace
}  // namespace attn::nn

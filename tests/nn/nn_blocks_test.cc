// tests/nn/nn_blocks_test.cc — the building blocks of attn::nn: Linear, Embedding, LayerNorm,
// RMSNorm, activations, residual add, Dropout and initialisation. Forwards against float64
// formulas written out here, backwards against central finite differences (float64 layers).
#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

// ---- Linear ----

TEST(NnLinear, ForwardIsXWtPlusB) {
  rng gen(1);
  Linear lin(5, 3, gen, true, dtype::f64);
  std::mt19937 r(2);
  const Tensor x = random_tensor({2, 4, 5}, dtype::f64, r);
  const Tensor y = lin.forward(x);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 3}));
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t n = 0; n < 4; ++n)
      for (std::int64_t o = 0; o < 3; ++o) {
        double s = lin.bias.get({o});
        for (std::int64_t i = 0; i < 5; ++i) s += x.get({b, n, i}) * lin.weight.get({o, i});
        EXPECT_NEAR(y.get({b, n, o}), s, 1e-12);
      }
}

TEST(NnLinear, StackedIsThePartsSideBySide) {
  rng gen(5);
  Linear a(6, 2, gen), b(6, 3, gen), c(6, 1, gen);
  const Linear abc = stacked({&a, &b, &c});
  std::mt19937 r(6);
  const Tensor x = random_tensor({4, 6}, dtype::f32, r);
  const Tensor y = abc.forward(x);
  ASSERT_EQ(y.shape(), (Shape{4, 6}));
  std::int64_t o = 0;
  for (const Linear* p : {&a, &b, &c}) {
    EXPECT_TRUE(all_close(Tensor::copy_of(y.view().slice(1, o, o + p->out_features())), p->forward(x), 1e-6));
    o += p->out_features();
  }
  Linear nob(6, 2, gen, false), wide(7, 2, gen);
  EXPECT_THROW_MSG(stacked({&a, &nob}), "stacked: parts have weights [2, 6] and [2, 6], without bias");
  EXPECT_THROW_MSG(stacked({&a, &wide}), "stacked: parts have weights [2, 6] and [2, 7]");
}

TEST(NnLinear, InitialisationBoundAndSeed) {
  rng a(7), b(7);
  Linear l1(64, 32, a), l2(64, 32, b);
  EXPECT_TRUE(all_close(l1.weight, l2.weight, 0.0));  // same seed, same weights
  for (double w : l1.weight.to_vector()) EXPECT_LE(std::abs(w), 1.0 / 8.0);
  for (double w : l1.bias.to_vector()) EXPECT_LE(std::abs(w), 1.0 / 8.0);
}

TEST(NnLinear, BackwardMatchesFiniteDifferencesAndAccumulates) {
  rng gen(3);
  for (bool with_bias : {true, false}) {
    Linear lin(4, 3, gen, with_bias, dtype::f64);
    std::mt19937 r(4);
    const Tensor x = random_tensor({2, 3, 4}, dtype::f64, r), w = random_tensor({2, 3, 3}, dtype::f64, r);
    auto loss = [&] { return weighted_sum(lin.forward(x), w); };
    const Tensor dx = lin.backward(x, w);
    expect_gradient("dx", x, dx, loss);
    expect_gradient("dweight", lin.weight, lin.dweight, loss);
    if (with_bias) expect_gradient("dbias", lin.bias, lin.dbias, loss);
    const Tensor once = Tensor::copy_of(lin.dweight);
    EXPECT_FALSE(lin.backward(x, w, /*need_dx=*/false).defined());
    EXPECT_TRUE(all_close(lin.dweight, add(once, once), 1e-12));  // gradients accumulate
    parameter_list ps;
    lin.parameters(ps, "proj.");
    ASSERT_EQ(ps.size(), with_bias ? 2u : 1u);
    EXPECT_EQ(ps[0].name, "proj.weight");
    zero_grad(ps);
    for (double g : lin.dweight.to_vector()) EXPECT_EQ(g, 0.0);
  }
}

// ---- Embedding ----

TEST(NnEmbedding, ForwardLooksUpAndBackwardScatters) {
  rng gen(5);
  Embedding emb(6, 4, gen, dtype::f64);
  const Tensor ids = Tensor::from_values({2, 3}, dtype::i64, {5, 0, 5, 2, 2, 2});
  const Tensor y = emb.forward(ids);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 4}));
  for (std::int64_t i = 0; i < 6; ++i)
    for (std::int64_t c = 0; c < 4; ++c)
      EXPECT_EQ(y.get({i / 3, i % 3, c}), emb.weight.get({std::int64_t(ids.to_vector()[std::size_t(i)]), c}));
  std::mt19937 r(6);
  const Tensor w = random_tensor({2, 3, 4}, dtype::f64, r);
  emb.backward(ids, w);
  expect_gradient("dweight", emb.weight, emb.dweight, [&] { return weighted_sum(emb.forward(ids), w); });
  EXPECT_THROW_MSG(emb.forward(Tensor::from_values({2}, dtype::i64, {1, 6})),
                   "Embedding: ids[1] = 6 is outside [0, 6) (the rows of weight [6, 4])");
  EXPECT_THROW_MSG(emb.forward(Tensor::from_values({1}, dtype::f32, {1})),
                   "Embedding: ids has dtype float32, expected int64");
}

// ---- LayerNorm, RMSNorm ----

TEST(NnNorm, LayerNormForwardAndBackward) {
  std::mt19937 r(7);
  LayerNorm ln(5, dtype::f64);
  ln.weight = random_tensor({5}, dtype::f64, r, 0.5, 1.5);
  ln.bias = random_tensor({5}, dtype::f64, r);
  const Tensor x = random_tensor({3, 2, 5}, dtype::f64, r, -2, 2);
  const Tensor y = ln.forward(x);
  const auto xv = x.to_vector(), yv = y.to_vector();
  for (int row = 0; row < 6; ++row) {
    double mean = 0, var = 0;
    for (int c = 0; c < 5; ++c) mean += xv[std::size_t(row * 5 + c)] / 5;
    for (int c = 0; c < 5; ++c) var += std::pow(xv[std::size_t(row * 5 + c)] - mean, 2) / 5;
    for (int c = 0; c < 5; ++c)
      EXPECT_NEAR(yv[std::size_t(row * 5 + c)],
                  (xv[std::size_t(row * 5 + c)] - mean) / std::sqrt(var + 1e-5) * ln.weight.get({c}) + ln.bias.get({c}),
                  1e-12);
  }
  const Tensor w = random_tensor({3, 2, 5}, dtype::f64, r);
  auto loss = [&] { return weighted_sum(ln.forward(x), w); };
  const Tensor dx = ln.backward(x, w);
  expect_gradient("dx", x, dx, loss);
  expect_gradient("dweight", ln.weight, ln.dweight, loss);
  expect_gradient("dbias", ln.bias, ln.dbias, loss);
  EXPECT_THROW_MSG(ln.forward(random_tensor({2, 4}, dtype::f64, r)), "LayerNorm: x has shape [2, 4], expected [..., C] with C = 5");
  EXPECT_THROW_MSG(ln.forward(random_tensor({2, 5}, dtype::f32, r)), "LayerNorm: x has dtype float32, expected float64");
}

TEST(NnNorm, RMSNormForwardAndBackward) {
  std::mt19937 r(8);
  RMSNorm rn(6, dtype::f64);
  rn.weight = random_tensor({6}, dtype::f64, r, 0.5, 1.5);
  const Tensor x = random_tensor({4, 6}, dtype::f64, r, -2, 2);
  const Tensor y = rn.forward(x);
  for (std::int64_t m = 0; m < 4; ++m) {
    double ss = 0;
    for (std::int64_t c = 0; c < 6; ++c) ss += x.get({m, c}) * x.get({m, c});
    for (std::int64_t c = 0; c < 6; ++c)
      EXPECT_NEAR(y.get({m, c}), x.get({m, c}) / std::sqrt(ss / 6 + 1e-6) * rn.weight.get({c}), 1e-12);
  }
  const Tensor w = random_tensor({4, 6}, dtype::f64, r);
  auto loss = [&] { return weighted_sum(rn.forward(x), w); };
  const Tensor dx = rn.backward(x, w);
  expect_gradient("dx", x, dx, loss);
  expect_gradient("dweight", rn.weight, rn.dweight, loss);
}

// float32 layers agree with float64 ones (the same code at another precision).
TEST(NnNorm, Float32MatchesFloat64) {
  std::mt19937 r(9);
  const Tensor x = random_tensor({3, 16}, dtype::f64, r, -2, 2), dy = random_tensor({3, 16}, dtype::f64, r);
  LayerNorm l64(16, dtype::f64), l32(16, dtype::f32);
  EXPECT_TRUE(all_close(l32.forward(x.to(dtype::f32)), l64.forward(x), 1e-5));
  EXPECT_TRUE(all_close(l32.backward(x.to(dtype::f32), dy.to(dtype::f32)), l64.backward(x, dy), 1e-5));
}

// The float32 LayerNorm (SIMD row kernel, src/cpu/rowwise.h) on every ISA level against the
// float64 layer, at row widths around the vector widths (tails) and with a residual.
TEST(NnNorm, Float32KernelOnEveryIsaWithResidual) {
  std::mt19937 r(11);
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    setenv("ATTN_CPU_ISA", isa, 1);
    for (std::int64_t C : {1, 3, 8, 17, 384}) {
      LayerNorm l64(C, dtype::f64, 1e-12), l32(C, dtype::f32, 1e-12);
      rng g{static_cast<std::uint64_t>(C)};
      fill_uniform(l64.weight, -2, 2, g), fill_uniform(l64.bias, -1, 1, g);
      l32.weight = l64.weight.to(dtype::f32), l32.bias = l64.bias.to(dtype::f32);
      const Tensor x = random_tensor({5, C}, dtype::f64, r, -3, 3), res = random_tensor({5, C}, dtype::f64, r, -3, 3);
      const Tensor want = l64.forward(add(x, res));
      EXPECT_TRUE(all_close(l32.forward(x.to(dtype::f32), res.to(dtype::f32)), want, 2e-5)) << isa << " C " << C;
      EXPECT_TRUE(all_close(l32.forward(x.to(dtype::f32)), l64.forward(x), 2e-5)) << isa << " C " << C;
      EXPECT_TRUE(all_close(l64.forward(x, res), want, 0.0));  // float64: add, then the same layer
    }
  }
  unsetenv("ATTN_CPU_ISA");
  LayerNorm ln(4);
  EXPECT_THROW_MSG(ln.forward(Tensor::zeros({2, 4}, dtype::f32), Tensor::zeros({3, 4}, dtype::f32)),
                   "LayerNorm: residual has shape [3, 4], expected [2, 4]");
}


TEST(NnActivation, KnownValues) {
  const Tensor x = Tensor::from_values({4}, dtype::f64, {-1.0, 0.0, 1.0, 2.0});
  auto at = [&](activation a) { return activate(a, x).to_vector(); };
  EXPECT_EQ(at(activation::relu), (std::vector<double>{0, 0, 1, 2}));
  EXPECT_NEAR(at(activation::gelu)[2], 0.8413447460685429, 1e-15);   // Φ(1)
  EXPECT_NEAR(at(activation::gelu)[0], -0.15865525393145707, 1e-15);
  EXPECT_NEAR(at(activation::gelu_tanh)[2], 0.8411919906082768, 1e-15);
  EXPECT_NEAR(at(activation::tanh)[3], std::tanh(2.0), 1e-15);
  EXPECT_NEAR(at(activation::sigmoid)[1], 0.5, 1e-15);
  EXPECT_NEAR(at(activation::sigmoid)[2], 0.7310585786300049, 1e-15);
}

// The float32 exact-erf GELU (SIMD row kernel) on every ISA level against float64 erf, over
// |x| up to 10 (the tail of erfc, where 1 + erf(x) would cancel), at lengths with tails.
TEST(NnActivation, Float32GeluKernelOnEveryIsa) {
  for (const char* isa : {"generic", "avx2", "avx512"}) {
    setenv("ATTN_CPU_ISA", isa, 1);
    for (std::int64_t n : {1, 7, 8, 17, 20001, 40003}) {
      std::vector<double> xs(static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) xs[std::size_t(i)] = -10.0 + 20.0 * double(i) / double(std::max<std::int64_t>(n - 1, 1));
      const Tensor x = Tensor::from_values({n}, dtype::f64, xs);
      const std::vector<double> got = activate(activation::gelu, x.to(dtype::f32)).to_vector();
      const std::vector<double> xf = x.to(dtype::f32).to_vector();  // the float inputs
      double worst = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const double v = xf[std::size_t(i)], want = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
        worst = std::max(worst, std::abs(got[std::size_t(i)] - want) / std::max(1.0, std::abs(want)));
      }
      EXPECT_LE(worst, 3e-7) << isa << " n " << n;
    }
  }
  unsetenv("ATTN_CPU_ISA");
}

TEST(NnActivation, BackwardMatchesFiniteDifferences) {
  std::mt19937 r(10);
  for (activation a : {activation::relu, activation::gelu, activation::gelu_tanh, activation::tanh, activation::sigmoid}) {
    const Tensor x = random_tensor({3, 7}, dtype::f64, r, -3, 3), w = random_tensor({3, 7}, dtype::f64, r);
    expect_gradient(to_string(a), x, activate_backward(a, x, w), [&] { return weighted_sum(activate(a, x), w); });
  }
  EXPECT_THROW_MSG(activate(activation::relu, Tensor::zeros({2}, dtype::bf16)),
                   "activate: x has dtype bfloat16, expected float32 or float64");
}

TEST(NnResidual, AddAndAccumulate) {
  const Tensor a = Tensor::from_values({3}, dtype::f32, {1, 2, 3}), b = Tensor::from_values({3}, dtype::f32, {10, 20, 30});
  EXPECT_EQ(add(a, b).to_vector(), (std::vector<double>{11, 22, 33}));
  EXPECT_EQ(a.to_vector(), (std::vector<double>{1, 2, 3}));  // inputs untouched
  add_into(a, b);
  EXPECT_EQ(a.to_vector(), (std::vector<double>{11, 22, 33}));
  EXPECT_THROW_MSG(add(a, Tensor::zeros({4}, dtype::f32)), "add: b has shape [4], expected [3]");
}

// ---- Dropout ----

TEST(NnDropout, TrainingScalesKeptAndZeroesTheRest) {
  const Tensor x = Tensor::full({100, 100}, dtype::f64, 2.0);
  Dropout d(0.25, 11);
  Tensor mask;
  const Tensor y = d.forward(x, mask);
  ASSERT_TRUE(mask.defined());
  int zeros = 0;
  for (double v : y.to_vector()) {
    if (v == 0) ++zeros;
    else EXPECT_DOUBLE_EQ(v, 2.0 / 0.75);
  }
  EXPECT_NEAR(zeros / 10000.0, 0.25, 0.02);  // 4.6 standard deviations
  const Tensor dy = Tensor::full({100, 100}, dtype::f64, 1.0);
  EXPECT_TRUE(all_close(Dropout::backward(mask, dy), mask, 0.0));
  // The same seed drops the same elements; the next call draws new ones.
  Dropout again(0.25, 11);
  Tensor mask2;
  EXPECT_TRUE(all_close(again.forward(x, mask2), y, 0.0));
  Tensor mask3;
  again.forward(x, mask3);
  EXPECT_FALSE(all_close(mask3, mask2, 0.0));
}

TEST(NnDropout, EvalAndZeroAreTheIdentity) {
  const Tensor x = Tensor::from_values({3}, dtype::f32, {1, 2, 3});
  Dropout d(0.5, 1);
  d.training = false;
  Tensor mask;
  EXPECT_EQ(d.forward(x, mask).to_vector(), x.to_vector());
  EXPECT_FALSE(mask.defined());
  EXPECT_EQ(Dropout::backward(mask, x).to_vector(), x.to_vector());
  Dropout none(0.0, 1);
  EXPECT_EQ(none.forward(x, mask).to_vector(), x.to_vector());
  EXPECT_THROW_MSG(Dropout(1.0, 1), "Dropout: p = 1 must be in [0, 1)");
}

// ---- initialisation ----

TEST(NnInit, GeneratorIsTheStandardEngine) {
  rng gen(42);
  std::mt19937_64 ref(42);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(gen.next(), ref());
  rng u(1);
  double mean = 0, var = 0;
  const int n = 20000;
  std::vector<double> xs(n);
  for (auto& x : xs) x = u.normal(), mean += x / n;
  for (double x : xs) var += (x - mean) * (x - mean) / n;
  EXPECT_NEAR(mean, 0.0, 0.03);
  EXPECT_NEAR(var, 1.0, 0.04);
  for (int i = 0; i < 1000; ++i) {
    const std::int64_t k = u.integer(-3, 4);
    EXPECT_GE(k, -3);
    EXPECT_LE(k, 4);
  }
}

TEST(NnInit, XavierAndKaimingBounds) {
  rng gen(3);
  Tensor w = Tensor::empty({200, 100}, dtype::f32);
  xavier_uniform(w, gen);
  const double a = std::sqrt(6.0 / 300.0);
  double var = 0;
  for (double x : w.to_vector()) {
    EXPECT_LE(std::abs(x), a);
    var += x * x / 20000.0;
  }
  EXPECT_NEAR(var, a * a / 3, 0.05 * a * a / 3);
  kaiming_normal(w, gen);
  var = 0;
  for (double x : w.to_vector()) var += x * x / 20000.0;
  EXPECT_NEAR(var, 2.0 / 100.0, 0.05 * 2.0 / 100.0);
  kaiming_uniform(w, gen);
  for (double x : w.to_vector()) EXPECT_LE(std::abs(x), std::sqrt(6.0 / 100.0) + 1e-7);
  Tensor ids = Tensor::zeros({2}, dtype::i64);
  EXPECT_THROW_MSG(xavier_uniform(ids, gen), "xavier_uniform: the tensor has dtype int64, expected a float dtype");
}

}  // namespace
}  // namespace attn::nn

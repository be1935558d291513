// tests/nn/nn_train_test.cc — losses (values against formulas written here, gradients against
// central finite differences), SGD / Adam / AdamW against their update rules stepped by hand,
// gradient clipping, the learning-rate schedule, and gradient accumulation over micro-batches.
#include <numbers>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

TEST(NnLoss, CrossEntropyValueGradientAndIgnoreIndex) {
  std::mt19937 r(1);
  const Tensor logits = random_tensor({2, 3, 5}, dtype::f64, r, -3, 3);
  const Tensor targets = Tensor::from_values({2, 3}, dtype::i64, {4, -1, 0, 2, 2, -1});
  const loss_result l = cross_entropy(logits, targets, -1);
  EXPECT_EQ(l.count, 4);
  double want = 0;
  std::int64_t correct = 0;
  const auto t = targets.to_vector();
  for (std::int64_t row = 0; row < 6; ++row) {
    if (t[std::size_t(row)] < 0) continue;
    double z = 0, best = -1e300;
    std::int64_t arg = 0;
    for (std::int64_t c = 0; c < 5; ++c) {
      const double x = logits.get({row / 3, row % 3, c});
      z += std::exp(x);
      if (x > best) best = x, arg = c;
    }
    want += -(logits.get({row / 3, row % 3, std::int64_t(t[std::size_t(row)])}) - std::log(z)) / 4;
    correct += arg == std::int64_t(t[std::size_t(row)]);
  }
  EXPECT_NEAR(l.loss, want, 1e-12);
  EXPECT_EQ(l.correct, correct);
  expect_gradient("dlogits", logits, l.grad, [&] { return cross_entropy(logits, targets, -1).loss; });
  for (std::int64_t c = 0; c < 5; ++c) EXPECT_EQ(l.grad.get({0, 1, c}), 0.0);  // an ignored row

  const loss_result none = cross_entropy(logits, Tensor::full({2, 3}, dtype::i64, -1), -1);
  EXPECT_EQ(none.count, 0);
  EXPECT_EQ(none.loss, 0.0);
  EXPECT_THROW_MSG(cross_entropy(logits, Tensor::full({2, 3}, dtype::i64, 5), -1),
                   "cross_entropy: targets[0] = 5 is outside [0, C) = [0, 5) and is not ignore_index = -1");
  EXPECT_THROW_MSG(cross_entropy(logits, Tensor::zeros({6}, dtype::i64)),
                   "cross_entropy: targets has shape [6], expected [2, 3] (logits [2, 3, 5] without its last dim)");
}

TEST(NnLoss, CrossEntropyIsStableForLargeLogits) {
  const Tensor logits = Tensor::from_values({1, 3}, dtype::f32, {1000, 0, -1000});
  const loss_result l = cross_entropy(logits, Tensor::from_values({1}, dtype::i64, {1}));
  EXPECT_NEAR(l.loss, 1000.0, 1e-3);
  EXPECT_FALSE(testing::any_nan(l.grad));
}

TEST(NnLoss, MeanSquaredError) {
  std::mt19937 r(2);
  const Tensor p = random_tensor({3, 4}, dtype::f64, r), y = random_tensor({3, 4}, dtype::f64, r);
  const loss_result l = mse(p, y);
  double want = 0;
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 4; ++j) want += std::pow(p.get({i, j}) - y.get({i, j}), 2) / 12;
  EXPECT_NEAR(l.loss, want, 1e-14);
  expect_gradient("dpred", p, l.grad, [&] { return mse(p, y).loss; });
  EXPECT_THROW_MSG(mse(p, Tensor::zeros({4, 3}, dtype::f64)), "mse: target has shape [4, 3], expected [3, 4]");
}

// One parameter [2] with a fixed gradient per step, stepped by the optimizer and by hand.
struct scalar_problem {
  Tensor w = Tensor::from_values({2}, dtype::f64, {1.0, -2.0});
  Tensor dw = Tensor::zeros({2}, dtype::f64);
  parameter_list list() { return {{"w", &w, &dw}}; }
  void set_grad(double a, double b) { dw.set({0}, a), dw.set({1}, b); }
};

TEST(NnOptim, SgdMomentumAndNesterovStepByHand) {
  for (bool nesterov : {false, true}) {
    scalar_problem s;
    sgd opt{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = nesterov};
    double w = 1.0, buf = 0.0;
    const double grads[] = {0.5, -0.25, 1.0};
    for (double g0 : grads) {
      s.set_grad(g0, 0.0);
      opt.step(s.list());
      const double g = g0 + 0.01 * w;
      buf = 0.9 * buf + g;
      w -= 0.1 * (nesterov ? g + 0.9 * buf : buf);
      EXPECT_NEAR(s.w.get({0}), w, 1e-15);
    }
  }
  scalar_problem plain;
  sgd opt{.lr = 0.5};
  plain.set_grad(1.0, 2.0);
  opt.step(plain.list());
  EXPECT_EQ(plain.w.to_vector(), (std::vector<double>{0.5, -3.0}));
}

TEST(NnOptim, AdamAndAdamWStepByHand) {
  for (bool decoupled : {false, true}) {
    scalar_problem s;
    adam opt{.lr = 0.01, .weight_decay = 0.1, .decoupled = decoupled};
    double w = 1.0, m = 0, v = 0;
    const double grads[] = {0.3, -0.7, 0.2, 1.5};
    for (int t = 1; t <= 4; ++t) {
      s.set_grad(grads[t - 1], 0.0);
      opt.step(s.list());
      double g = grads[t - 1];
      if (decoupled) w -= 0.01 * 0.1 * w;
      else g += 0.1 * w;
      m = 0.9 * m + 0.1 * g;
      v = 0.999 * v + 0.001 * g * g;
      w -= 0.01 * (m / (1 - std::pow(0.9, t))) / (std::sqrt(v / (1 - std::pow(0.999, t))) + 1e-8);
      EXPECT_NEAR(s.w.get({0}), w, 1e-15) << "decoupled " << decoupled << " step " << t;
    }
  }
}

TEST(NnOptim, StateBelongsToOneParameterList) {
  scalar_problem a;
  adam opt;
  opt.step(a.list());
  Tensor other = Tensor::zeros({3}, dtype::f64), dother = Tensor::zeros({3}, dtype::f64);
  EXPECT_THROW_MSG(opt.step({{"w", &other, &dother}}),
                   "adam: parameter 0 is 'w' with 3 elements, the optimizer's state is for 'w' with 2");
  EXPECT_THROW_MSG(opt.step({}), "adam: the parameter list has 0 entries, the optimizer was first stepped with 1");
}

// Every optimizer drives a least-squares fit (Linear, f32) to its optimum.
TEST(NnOptim, EveryOptimizerFitsALinearMap) {
  std::mt19937 r(3);
  const Tensor x = random_tensor({64, 3}, dtype::f32, r);
  const Tensor w_true = Tensor::from_values({1, 3}, dtype::f32, {0.5, -1.0, 2.0});
  const Tensor y = linear(x, w_true);
  for (int which = 0; which < 4; ++which) {
    rng gen(4);
    Linear lin(3, 1, gen, false);
    parameter_list ps;
    lin.parameters(ps);
    sgd s{.lr = 0.1, .momentum = which == 1 ? 0.9 : 0.0};
    adam a{.lr = 0.05, .weight_decay = which == 3 ? 1e-4 : 0.0, .decoupled = which == 3};
    double last = 0;
    for (int step = 0; step < 400; ++step) {
      zero_grad(ps);
      const loss_result l = mse(lin.forward(x), y);
      lin.backward(x, l.grad, false);
      if (which < 2) s.step(ps);
      else a.step(ps);
      last = l.loss;
    }
    EXPECT_LT(last, 1e-4) << "optimizer " << which;
    EXPECT_TRUE(all_close(lin.weight, w_true, 2e-2)) << "optimizer " << which;
  }
}

TEST(NnOptim, ClipGradNorm) {
  scalar_problem s;
  s.set_grad(3.0, 4.0);
  EXPECT_DOUBLE_EQ(clip_grad_norm(s.list(), 10.0), 5.0);  // below: unchanged
  EXPECT_EQ(s.dw.to_vector(), (std::vector<double>{3.0, 4.0}));
  EXPECT_DOUBLE_EQ(clip_grad_norm(s.list(), 1.0), 5.0);
  EXPECT_NEAR(s.dw.get({0}), 3.0 / (5.0 + 1e-6), 1e-15);
  EXPECT_NEAR(s.dw.get({1}), 4.0 / (5.0 + 1e-6), 1e-15);
  scale_grad(s.list(), 0.0);
  EXPECT_EQ(s.dw.to_vector(), (std::vector<double>{0.0, 0.0}));
}

TEST(NnOptim, WarmupCosineSchedule) {
  EXPECT_DOUBLE_EQ(warmup_cosine(0, 10, 110, 1.0), 0.1);
  EXPECT_DOUBLE_EQ(warmup_cosine(9, 10, 110, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(warmup_cosine(10, 10, 110, 1.0), 1.0);
  EXPECT_NEAR(warmup_cosine(60, 10, 110, 1.0, 0.2), 0.6, 1e-15);  // half way: the mean
  EXPECT_NEAR(warmup_cosine(35, 10, 110, 1.0), 0.5 * (1 + std::cos(std::numbers::pi / 4)), 1e-15);
  EXPECT_DOUBLE_EQ(warmup_cosine(110, 10, 110, 1.0, 0.2), 0.2);
  EXPECT_DOUBLE_EQ(warmup_cosine(500, 10, 110, 1.0, 0.2), 0.2);
}

// Two micro-batches, gradients accumulated and scaled by 1/2, equal one batch of both.
TEST(NnOptim, AccumulatedMicroBatchesEqualTheFullBatch) {
  std::mt19937 r(5);
  const Tensor x = random_tensor({8, 4}, dtype::f64, r), y = random_tensor({8, 2}, dtype::f64, r);
  rng g1(6), g2(6);
  Linear full(4, 2, g1, true, dtype::f64), micro(4, 2, g2, true, dtype::f64);
  full.backward(x, mse(full.forward(x), y).grad);
  parameter_list ps;
  micro.parameters(ps);
  for (std::int64_t h = 0; h < 2; ++h) {
    const Tensor xh = Tensor::copy_of(x.view().slice(0, 4 * h, 4 * h + 4));
    const Tensor yh = Tensor::copy_of(y.view().slice(0, 4 * h, 4 * h + 4));
    micro.backward(xh, mse(micro.forward(xh), yh).grad);
  }
  scale_grad(ps, 0.5);
  EXPECT_TRUE(all_close(micro.dweight, full.dweight, 1e-14));
  EXPECT_TRUE(all_close(micro.dbias, full.dbias, 1e-14));
}

}  // namespace
}  // namespace attn::nn

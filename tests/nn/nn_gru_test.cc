// tests/nn/nn_gru_test.cc — GRUCell against the equations written out per element, and the
// bidirectional encoder against cells run by hand on each unpadded sequence; every gradient
// against central finite differences (float64).
#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

TEST(NnGru, CellForwardIsTheGruEquations) {
  rng gen(1);
  const std::int64_t B = 2, I = 3, H = 4;
  GRUCell cell(I, H, gen, dtype::f64);
  std::mt19937 r(2);
  const Tensor x = random_tensor({B, I}, dtype::f64, r), h = random_tensor({B, H}, dtype::f64, r);
  const Tensor out = cell.forward(x, h, nullptr);
  auto gate = [&](const Linear& l, const Tensor& in, std::int64_t b, std::int64_t row) {
    double s = l.bias.get({row});
    for (std::int64_t i = 0; i < in.size(1); ++i) s += l.weight.get({row, i}) * in.get({b, i});
    return s;
  };
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t j = 0; j < H; ++j) {
      const double rr = sigmoid(gate(cell.ih, x, b, j) + gate(cell.hh, h, b, j));
      const double z = sigmoid(gate(cell.ih, x, b, H + j) + gate(cell.hh, h, b, H + j));
      const double n = std::tanh(gate(cell.ih, x, b, 2 * H + j) + rr * gate(cell.hh, h, b, 2 * H + j));
      EXPECT_NEAR(out.get({b, j}), (1 - z) * n + z * h.get({b, j}), 1e-12);
    }
}

TEST(NnGru, CellBackwardMatchesFiniteDifferences) {
  rng gen(3);
  GRUCell cell(3, 4, gen, dtype::f64);
  std::mt19937 r(4);
  const Tensor x = random_tensor({2, 3}, dtype::f64, r), h = random_tensor({2, 4}, dtype::f64, r);
  const Tensor w = random_tensor({2, 4}, dtype::f64, r);
  auto loss = [&] { return weighted_sum(cell.forward(x, h, nullptr), w); };
  GRUCell::saved s;
  cell.forward(x, h, &s);
  const GRUCell::grads g = cell.backward(x, s, w);
  expect_gradient("dx", x, g.dx, loss);
  expect_gradient("dh", h, g.dh, loss);
  parameter_list ps;
  cell.parameters(ps);
  ASSERT_EQ(ps.size(), 4u);
  EXPECT_EQ(ps[3].name, "hh.bias");
  for (const parameter_ref& p : ps) expect_gradient(p.name, *p.value, *p.grad, loss);
}

TEST(NnGru, EncoderEqualsCellsRunByHand) {
  rng gen(5);
  const std::int64_t B = 3, N = 4, I = 2, H = 3;
  BiGRUEncoder enc(I, H, gen, dtype::f64);
  std::mt19937 r(6);
  const Tensor x = random_tensor({B, N, I}, dtype::f64, r);
  const Tensor lengths = Tensor::from_values({B}, dtype::i64, {4, 2, 0});
  const BiGRUEncoder::result res = enc.forward(x, lengths, nullptr);
  ASSERT_EQ(res.out.shape(), (Shape{B, N, 2 * H}));
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t L = std::int64_t(lengths.to_vector()[std::size_t(b)]);
    auto x_at = [&](std::int64_t t) { return Tensor::copy_of(x.view().slice(0, b, b + 1).slice(1, t, t + 1).reshape({1, I})); };
    Tensor h = Tensor::zeros({1, H}, dtype::f64);
    for (std::int64_t t = 0; t < L; ++t) {
      h = enc.fwd.forward(x_at(t), h, nullptr);
      for (std::int64_t j = 0; j < H; ++j) EXPECT_NEAR(res.out.get({b, t, j}), h.get({0, j}), 1e-12) << b << " " << t;
    }
    for (std::int64_t j = 0; j < H; ++j) EXPECT_NEAR(res.h_fwd.get({b, j}), h.get({0, j}), 1e-12);
    h = Tensor::zeros({1, H}, dtype::f64);
    for (std::int64_t t = L - 1; t >= 0; --t) {
      h = enc.bwd.forward(x_at(t), h, nullptr);
      for (std::int64_t j = 0; j < H; ++j) EXPECT_NEAR(res.out.get({b, t, H + j}), h.get({0, j}), 1e-12);
    }
    for (std::int64_t j = 0; j < H; ++j) EXPECT_NEAR(res.h_bwd.get({b, j}), h.get({0, j}), 1e-12);
    for (std::int64_t t = L; t < N; ++t)
      for (std::int64_t j = 0; j < 2 * H; ++j) EXPECT_EQ(res.out.get({b, t, j}), 0.0) << "padding";
  }
}

TEST(NnGru, EncoderBackwardMatchesFiniteDifferences) {
  rng gen(7);
  const std::int64_t B = 3, N = 3, I = 2, H = 2;
  BiGRUEncoder enc(I, H, gen, dtype::f64);
  std::mt19937 r(8);
  const Tensor x = random_tensor({B, N, I}, dtype::f64, r);
  const Tensor lengths = Tensor::from_values({B}, dtype::i64, {3, 1, 2});
  const Tensor w = random_tensor({B, N, 2 * H}, dtype::f64, r), wf = random_tensor({B, H}, dtype::f64, r),
               wb = random_tensor({B, H}, dtype::f64, r);
  auto loss = [&] {
    const auto res = enc.forward(x, lengths, nullptr);
    return weighted_sum(res.out, w) + weighted_sum(res.h_fwd, wf) + weighted_sum(res.h_bwd, wb);
  };
  BiGRUEncoder::saved s;
  enc.forward(x, lengths, &s);
  const Tensor dx = enc.backward(s, w, wf, wb);
  expect_gradient("dx", x, dx, loss);
  parameter_list ps;
  enc.parameters(ps, "enc.");
  ASSERT_EQ(ps.size(), 8u);
  EXPECT_EQ(ps[0].name, "enc.fwd.ih.weight");
  for (const parameter_ref& p : ps) expect_gradient(p.name, *p.value, *p.grad, loss);
}

TEST(NnGru, Errors) {
  rng gen(9);
  BiGRUEncoder enc(2, 3, gen);
  EXPECT_THROW_MSG(enc.forward(Tensor::zeros({1, 2, 5}, dtype::f32), std::nullopt, nullptr),
                   "BiGRUEncoder: x has shape [1, 2, 5], expected [B, N, I] with I = 2");
  EXPECT_THROW_MSG(enc.forward(Tensor::zeros({1, 2, 2}, dtype::f32), Tensor::from_values({1}, dtype::i64, {3}), nullptr),
                   "BiGRUEncoder: lengths[0] = 3 is outside [0, N] = [0, 2]");
  GRUCell cell(2, 3, gen);
  EXPECT_THROW_MSG(cell.forward(Tensor::zeros({1, 2}, dtype::f32), Tensor::zeros({1, 4}, dtype::f32), nullptr),
                   "GRUCell: h has shape [1, 4], expected [B, H] with H = 3");
}

}  // namespace
}  // namespace attn::nn

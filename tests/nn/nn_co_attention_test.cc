// tests/nn/nn_co_attention_test.cc — CoAttention, every kind × granularity: the forward against
// the formulas written out with loops (means, additive and bilinear scores, softmax over the
// real elements), every gradient against central finite differences (float64), padding,
// float32 against float64, and the error messages.
#include <limits>
#include <tuple>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

using vec = std::vector<double>;

vec row(const Tensor& t, std::int64_t b, std::int64_t i) {
  vec v(std::size_t(t.size(2)), 0.0);
  for (std::size_t c = 0; c < v.size(); ++c) v[c] = t.get({b, i, std::int64_t(c)});
  return v;
}

// softmax over the first L scores, 0 after them (all 0 when L = 0).
vec softmax_first(const vec& s, std::int64_t L) {
  vec p(s.size(), 0.0);
  double mx = -std::numeric_limits<double>::infinity(), z = 0;
  for (std::int64_t j = 0; j < L; ++j) mx = std::max(mx, s[std::size_t(j)]);
  for (std::int64_t j = 0; j < L; ++j) z += std::exp(s[std::size_t(j)] - mx);
  for (std::int64_t j = 0; j < L; ++j) p[std::size_t(j)] = std::exp(s[std::size_t(j)] - mx) / z;
  return p;
}

// w_vᵀ tanh(W_q q + W_k k + b)
double additive(const AdditiveAttention& a, const vec& q, const vec& k) {
  double e = 0;
  for (std::int64_t h = 0; h < a.w_v.size(0); ++h) {
    double z = a.b.get({h});
    for (std::size_t c = 0; c < q.size(); ++c) z += a.W_q.get({h, std::int64_t(c)}) * q[c];
    for (std::size_t c = 0; c < k.size(); ++c) z += a.W_k.get({h, std::int64_t(c)}) * k[c];
    e += a.w_v.get({h}) * std::tanh(z);
  }
  return e;
}

// qᵀ W k
double bilinear(const Tensor& W, const vec& q, const vec& k) {
  double e = 0;
  for (std::size_t r = 0; r < q.size(); ++r)
    for (std::size_t c = 0; c < k.size(); ++c) e += q[r] * W.get({std::int64_t(r), std::int64_t(c)}) * k[c];
  return e;
}

// Σ_j p_j rows_j
vec mix(const vec& p, const std::vector<vec>& rows, std::size_t D) {
  vec o(D, 0.0);
  for (std::size_t j = 0; j < p.size(); ++j)
    for (std::size_t c = 0; c < D; ++c) o[c] += p[j] * rows[j][c];
  return o;
}

struct written_out {
  std::vector<std::vector<vec>> xc, yc, xw, yw;  // [b][row] → vector; coarse: one row
};

written_out reference(const CoAttention& co, const Tensor& x, const Tensor& y, const Tensor& xl, const Tensor& yl) {
  const std::int64_t B = x.size(0), Nx = x.size(1), Ny = y.size(1);
  const std::size_t Dx = std::size_t(x.size(2)), Dy = std::size_t(y.size(2));
  const bool alternating = co.config.kind == co_attention_kind::alternating;
  written_out w;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t Lx = std::int64_t(xl.get({b})), Ly = std::int64_t(yl.get({b}));
    std::vector<vec> xs, ys;
    for (std::int64_t i = 0; i < Nx; ++i) xs.push_back(row(x, b, i));
    for (std::int64_t j = 0; j < Ny; ++j) ys.push_back(row(y, b, j));
    auto mean = [](const std::vector<vec>& rows, std::int64_t L, std::size_t D) {
      vec m(D, 0.0);
      for (std::int64_t i = 0; i < L; ++i)
        for (std::size_t c = 0; c < D; ++c) m[c] += rows[std::size_t(i)][c] / double(L);
      return m;
    };
    if (co.config.granularity == co_attention_granularity::coarse) {
      vec sy(std::size_t(Ny), 0.0), sx(std::size_t(Nx), 0.0);
      const vec xbar = mean(xs, Lx, Dx), ybar = mean(ys, Ly, Dy);
      for (std::int64_t j = 0; j < Ny; ++j) sy[std::size_t(j)] = additive(co.over_y, xbar, ys[std::size_t(j)]);
      const vec py = softmax_first(sy, Ly), yc = mix(py, ys, Dy);
      const vec& qx = alternating ? yc : ybar;
      for (std::int64_t i = 0; i < Nx; ++i) sx[std::size_t(i)] = additive(co.over_x, qx, xs[std::size_t(i)]);
      const vec px = softmax_first(sx, Lx);
      w.xc.push_back(std::vector<vec>{mix(px, xs, Dx)}), w.yc.push_back(std::vector<vec>{yc});
      w.xw.push_back(std::vector<vec>{px}), w.yw.push_back(std::vector<vec>{py});
      continue;
    }
    // x_context_j = Σ_i softmax_i(x_iᵀ W_b y_j) x_i  (both kinds)
    std::vector<vec> xc, xw, yc, yw;
    for (std::int64_t j = 0; j < Ny; ++j) {
      vec s(std::size_t(Nx), 0.0);
      for (std::int64_t i = 0; i < Nx; ++i) s[std::size_t(i)] = bilinear(co.W_b, xs[std::size_t(i)], ys[std::size_t(j)]);
      const vec p = j < Ly ? softmax_first(s, Lx) : vec(std::size_t(Nx), 0.0);
      xw.push_back(p), xc.push_back(mix(p, xs, Dx));
    }
    for (std::int64_t i = 0; i < Nx; ++i) {
      vec s(std::size_t(Ny), 0.0);
      for (std::int64_t j = 0; j < Ny; ++j)
        s[std::size_t(j)] = alternating ? bilinear(co.W_2, xs[std::size_t(i)], xc[std::size_t(j)])
                                        : bilinear(co.W_b, xs[std::size_t(i)], ys[std::size_t(j)]);
      const vec p = i < Lx ? softmax_first(s, Ly) : vec(std::size_t(Ny), 0.0);
      yw.push_back(p), yc.push_back(mix(p, ys, Dy));
    }
    w.xc.push_back(xc), w.yc.push_back(yc), w.xw.push_back(xw), w.yw.push_back(yw);
  }
  return w;
}

// t [B, R, C] (or [B, C] as R = 1) against want[b][r][c].
void expect_rows(const char* what, const Tensor& t, const std::vector<std::vector<vec>>& want, double tol) {
  for (std::size_t b = 0; b < want.size(); ++b)
    for (std::size_t r = 0; r < want[b].size(); ++r)
      for (std::size_t c = 0; c < want[b][r].size(); ++c) {
        const double got = t.rank() == 2 ? t.get({std::int64_t(b), std::int64_t(c)})
                                         : t.get({std::int64_t(b), std::int64_t(r), std::int64_t(c)});
        EXPECT_NEAR(got, want[b][r][c], tol) << what << " at " << b << ", " << r << ", " << c;
      }
}

using variant = std::tuple<co_attention_kind, co_attention_granularity>;

class NnCoAttention : public ::testing::TestWithParam<variant> {
 protected:
  co_attention_config config(std::int64_t Dx = 3, std::int64_t Dy = 2) const {
    return {std::get<0>(GetParam()), std::get<1>(GetParam()), Dx, Dy, 4};
  }
  // B = 3: one entry with padding on both sides, one full, one with an empty y.
  std::mt19937 r{7};
  Tensor x = random_tensor({3, 4, 3}, dtype::f64, r, -1.5, 1.5);
  Tensor y = random_tensor({3, 5, 2}, dtype::f64, r, -1.5, 1.5);
  Tensor xl = Tensor::from_values({3}, dtype::i64, {2, 4, 3});
  Tensor yl = Tensor::from_values({3}, dtype::i64, {3, 5, 0});
};

TEST_P(NnCoAttention, ForwardIsTheFormulasWrittenOut) {
  rng gen(1);
  CoAttention co(config(), gen, dtype::f64);
  const auto res = co.forward(x, y, xl, yl, nullptr, true);
  const written_out w = reference(co, x, y, xl, yl);
  const bool coarse = co.config.granularity == co_attention_granularity::coarse;
  EXPECT_EQ(res.x_context.shape(), coarse ? Shape({3, 3}) : Shape({3, 5, 3}));
  EXPECT_EQ(res.y_context.shape(), coarse ? Shape({3, 2}) : Shape({3, 4, 2}));
  EXPECT_EQ(res.x_weights.shape(), coarse ? Shape({3, 4}) : Shape({3, 5, 4}));
  EXPECT_EQ(res.y_weights.shape(), coarse ? Shape({3, 5}) : Shape({3, 4, 5}));
  expect_rows("x_context", res.x_context, w.xc, 1e-12);
  expect_rows("y_context", res.y_context, w.yc, 1e-12);
  expect_rows("x_weights", res.x_weights, w.xw, 1e-12);
  expect_rows("y_weights", res.y_weights, w.yw, 1e-12);
}

TEST_P(NnCoAttention, GradientsMatchFiniteDifferences) {
  rng gen(2);
  CoAttention co(config(), gen, dtype::f64);
  const auto shapes = co.forward(x, y, xl, yl);
  const Tensor wx = random_tensor(shapes.x_context.shape(), dtype::f64, r);
  const Tensor wy = random_tensor(shapes.y_context.shape(), dtype::f64, r);
  auto loss = [&] {
    const auto o = co.forward(x, y, xl, yl);
    return weighted_sum(o.x_context, wx) + weighted_sum(o.y_context, wy);
  };
  CoAttention::saved s;
  co.forward(x, y, xl, yl, &s);
  const auto g = co.backward(s, wx, wy);
  expect_gradient("x", x, g.dx, loss);
  expect_gradient("y", y, g.dy, loss);
  parameter_list ps;
  co.parameters(ps, "co.");
  ASSERT_FALSE(ps.empty());
  for (const parameter_ref& p : ps) expect_gradient(p.name, *p.value, *p.grad, loss);
  // One output's gradient alone: the other may be left undefined.
  CoAttention::saved s2;
  co.forward(x, y, xl, yl, &s2);
  const auto gx = co.backward(s2, wx, Tensor{});
  expect_gradient("x (x_context only)", x, gx.dx, [&] { return weighted_sum(co.forward(x, y, xl, yl).x_context, wx); });
}

TEST_P(NnCoAttention, PaddingGetsNoWeightAndChangesNothing) {
  rng gen(3);
  CoAttention co(config(), gen, dtype::f64);
  const auto a = co.forward(x, y, xl, yl, nullptr, true);
  // New values in every padded element.
  Tensor x2 = Tensor::copy_of(x), y2 = Tensor::copy_of(y);
  for (std::int64_t b = 0; b < 3; ++b) {
    for (std::int64_t i = std::int64_t(xl.get({b})); i < 4; ++i)
      for (std::int64_t c = 0; c < 3; ++c) x2.set({b, i, c}, 9.0 + double(c));
    for (std::int64_t j = std::int64_t(yl.get({b})); j < 5; ++j)
      for (std::int64_t c = 0; c < 2; ++c) y2.set({b, j, c}, -7.0 - double(c));
  }
  const auto b2 = co.forward(x2, y2, xl, yl, nullptr, true);
  EXPECT_TRUE(all_close(b2.x_context, a.x_context, 1e-12));
  EXPECT_TRUE(all_close(b2.y_context, a.y_context, 1e-12));
  EXPECT_TRUE(all_close(b2.x_weights, a.x_weights, 1e-12));
  // Padded keys have weight 0; real rows sum to 1.
  const Tensor& xw = a.x_weights;
  const std::int64_t rows = xw.rank() == 3 ? xw.size(1) : 1;
  for (std::int64_t b = 0; b < 3; ++b)
    for (std::int64_t q = 0; q < rows; ++q) {
      double sum = 0;
      for (std::int64_t i = 0; i < 4; ++i) {
        const double p = xw.rank() == 3 ? xw.get({b, q, i}) : xw.get({b, i});
        if (i >= std::int64_t(xl.get({b}))) {
          EXPECT_EQ(p, 0.0) << b << ", " << q << ", " << i;
        }
        sum += p;
      }
      const bool real_row = xw.rank() == 2 || q < std::int64_t(yl.get({b}));
      EXPECT_NEAR(sum, real_row ? 1.0 : 0.0, 1e-12) << b << ", " << q;
    }
  // Without lengths every element is real: the same as lengths equal to the sizes.
  const auto full = co.forward(x, y);
  const auto full_l = co.forward(x, y, Tensor::from_values({3}, dtype::i64, {4, 4, 4}),
                                 Tensor::from_values({3}, dtype::i64, {5, 5, 5}));
  EXPECT_TRUE(all_close(full.x_context, full_l.x_context, 0.0));
  EXPECT_FALSE(all_close(full.x_context, a.x_context, 1e-6));
}

TEST_P(NnCoAttention, Float32MatchesFloat64) {
  rng gen(4);
  CoAttention c64(config(), gen, dtype::f64), c32(config(), gen, dtype::f32);
  parameter_list p64, p32;
  c64.parameters(p64), c32.parameters(p32);
  ASSERT_EQ(p64.size(), p32.size());
  for (std::size_t i = 0; i < p64.size(); ++i) *p32[i].value = p64[i].value->to(dtype::f32);
  const auto a = c64.forward(x, y, xl, yl);
  const auto b = c32.forward(x.to(dtype::f32), y.to(dtype::f32), xl, yl);
  EXPECT_TRUE(all_close(b.x_context, a.x_context, 1e-5));
  EXPECT_TRUE(all_close(b.y_context, a.y_context, 1e-5));
  CoAttention::saved s64, s32;
  c64.forward(x, y, xl, yl, &s64), c32.forward(x.to(dtype::f32), y.to(dtype::f32), xl, yl, &s32);
  const Tensor wx = random_tensor(a.x_context.shape(), dtype::f64, r), wy = random_tensor(a.y_context.shape(), dtype::f64, r);
  const auto g64 = c64.backward(s64, wx, wy), g32 = c32.backward(s32, wx.to(dtype::f32), wy.to(dtype::f32));
  EXPECT_TRUE(all_close(g32.dx, g64.dx, 1e-4));
  EXPECT_TRUE(all_close(g32.dy, g64.dy, 1e-4));
  for (std::size_t i = 0; i < p64.size(); ++i) EXPECT_TRUE(all_close(*p32[i].grad, *p64[i].grad, 1e-4)) << p64[i].name;
}

TEST_P(NnCoAttention, Errors) {
  rng gen(5);
  CoAttention co(config(), gen, dtype::f64);
  EXPECT_THROW_MSG(co.forward(y, y), "CoAttention: x has shape [3, 5, 2], expected [B, Nx, Dx] with Dx = 3");
  EXPECT_THROW_MSG(co.forward(x, random_tensor({2, 5, 2}, dtype::f64, r)),
                   "CoAttention: y has shape [2, 5, 2], expected [B, Ny, Dy] with B = 3, Dy = 2");
  EXPECT_THROW_MSG(co.forward(x.to(dtype::f32), y), "CoAttention: x has dtype float32, expected float64");
  EXPECT_THROW_MSG(co.forward(x, y, Tensor::from_values({3}, dtype::i64, {2, 5, 1}), yl),
                   "CoAttention: x_lengths[1] = 5 is outside [0, Nx] = [0, 4]");
  EXPECT_THROW_MSG(co.forward(x, y, xl, Tensor::from_values({3}, dtype::i64, {-1, 0, 0})),
                   "CoAttention: y_lengths[0] = -1 is outside [0, Ny] = [0, 5]");
  EXPECT_THROW_MSG(co.forward(x, y, Tensor::from_values({2}, dtype::i64, {1, 1}), yl),
                   "CoAttention: x_lengths has shape [2], expected [3]");
  CoAttention::saved s;
  const auto res = co.forward(x, y, xl, yl, &s);
  EXPECT_THROW_MSG(co.backward(s, res.y_context, Tensor{}), "CoAttention.backward: dx_context has shape");
  EXPECT_THROW_MSG(co.backward(CoAttention::saved{}, res.x_context, res.y_context), "CoAttention.backward: saved is empty");
  EXPECT_THROW_MSG(CoAttention(config(0, 2), gen), "CoAttention: Dx = 0 and Dy = 2 must be >= 1 and A = 4 >= 0");
  EXPECT_THROW_MSG(CoAttention().forward(x, y), "CoAttention: the layer has no parameters");
}

INSTANTIATE_TEST_SUITE_P(KindsAndGranularities, NnCoAttention,
                         ::testing::Combine(::testing::Values(co_attention_kind::parallel, co_attention_kind::alternating),
                                            ::testing::Values(co_attention_granularity::coarse,
                                                              co_attention_granularity::fine)),
                         [](const auto& info) {
                           return to_string(std::get<0>(info.param)) + "_" + to_string(std::get<1>(info.param));
                         });

// The alternating fine variant differs from the parallel one only in the second direction: its
// x_context is the parallel one's, its y_context is not (W_2 instead of the shared affinity).
TEST(NnCoAttentionKinds, AlternatingReusesTheFirstDirectionOnly) {
  std::mt19937 r(11);
  const Tensor x = random_tensor({2, 3, 3}, dtype::f64, r), y = random_tensor({2, 4, 2}, dtype::f64, r);
  rng g1(6), g2(6);
  CoAttention par({co_attention_kind::parallel, co_attention_granularity::fine, 3, 2}, g1, dtype::f64);
  CoAttention alt({co_attention_kind::alternating, co_attention_granularity::fine, 3, 2}, g2, dtype::f64);
  ASSERT_TRUE(all_close(par.W_b, alt.W_b, 0.0));
  const auto a = par.forward(x, y), b = alt.forward(x, y);
  EXPECT_TRUE(all_close(b.x_context, a.x_context, 1e-12));
  EXPECT_FALSE(all_close(b.y_context, a.y_context, 1e-3));
}

}  // namespace
}  // namespace attn::nn

// tests/positional/positional_rotary_test.cc — rotary embeddings: hand-worked values, the fast path against
// the float64 reference over layouts, strides, dtypes and positions, the properties RoPE is
// for (norms kept, q·k depends on p_q − p_k, the two conventions are permutations of each
// other), the backward against finite differences, and bad input.
#include <cmath>
#include <cstdlib>
#include <random>

#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::reference_scope;
using testing::tolerance_for;

double dot_row(const TensorView& a, const TensorView& b, std::int64_t D) {
  double s = 0;
  for (std::int64_t d = 0; d < D; ++d) s += a.get({0, 0, 0, d}) * b.get({0, 0, 0, d});
  return s;
}

TEST(Rotary, HandWorkedHalfSplitAndInterleaved) {
  // x = [1, 2, 3, 4] at position 1, D = R = 4, base 10000: θ0 = 1, θ1 = 10000^(-1/2) = 0.01.
  const Tensor x = Tensor::from_values({1, 1, 1, 4}, dtype::f64, {1, 2, 3, 4});
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(0.01), s1 = std::sin(0.01);
  const Tensor half = rotary(x, 1);  // pairs (0, 2) at θ0 and (1, 3) at θ1
  const Tensor want_half = Tensor::from_values(
      {1, 1, 1, 4}, dtype::f64, {1 * c0 - 3 * s0, 2 * c1 - 4 * s1, 3 * c0 + 1 * s0, 4 * c1 + 2 * s1});
  EXPECT_TRUE(all_close(half, want_half, 1e-14));
  rotary_options ro;
  ro.layout = rotary_layout::interleaved;  // pairs (0, 1) at θ0 and (2, 3) at θ1
  const Tensor inter = rotary(x, 1, ro);
  const Tensor want_inter = Tensor::from_values(
      {1, 1, 1, 4}, dtype::f64, {1 * c0 - 2 * s0, 2 * c0 + 1 * s0, 3 * c1 - 4 * s1, 4 * c1 + 3 * s1});
  EXPECT_TRUE(all_close(inter, want_inter, 1e-14));
  // Position 0 is the identity; partial rotary passes the tail through.
  EXPECT_TRUE(all_close(rotary(x, 0), x, 0));
  ro.rotary_dim = 2;  // interleaved, one pair (0, 1) at θ = 1 · 10000^0 = 1
  const Tensor part = rotary(x, 1, ro);
  EXPECT_TRUE(all_close(part, Tensor::from_values({1, 1, 1, 4}, dtype::f64, {c0 - 2 * s0, 2 * c0 + s0, 3, 4}), 1e-14));
  ro.base = 100;  // base changes the second frequency only: θ1 = 100^(-1/2) = 0.1
  ro.rotary_dim = 0;
  const Tensor b100 = rotary(x, 1, ro);
  EXPECT_NEAR(b100.get({0, 0, 0, 2}), 3 * std::cos(0.1) - 4 * std::sin(0.1), 1e-14);
}

struct rotary_case {
  Shape shape;  // [B, H, N, D]
  std::int64_t rotary_dim;
  rotary_layout layout;
  int positions_kind;  // 0 offset, 1 ids [N], 2 ids [B, N], 3 ids [1, N]
  bool three_d;
  bool transposed;  // x is a [B, N, H, D] buffer viewed as [B, H, N, D]
};

TEST(Rotary, FastMatchesReferenceAcrossLayoutsStridesDtypesPositions) {
  std::mt19937 rng(1);
  const rotary_case cases[] = {
      {{2, 3, 5, 8}, 0, rotary_layout::half_split, 0, false, false},
      {{2, 3, 5, 8}, 0, rotary_layout::interleaved, 1, false, true},
      {{3, 2, 7, 10}, 6, rotary_layout::half_split, 2, false, true},
      {{3, 2, 7, 10}, 4, rotary_layout::interleaved, 3, true, false},
      {{1, 4, 1, 2}, 2, rotary_layout::half_split, 2, true, false},
      {{2, 1, 9, 16}, 16, rotary_layout::interleaved, 2, true, false},
      {{2, 2, 33, 64}, 32, rotary_layout::half_split, 0, false, true},  // parallel path
  };
  for (const auto& c : cases) {
    const std::int64_t B = c.shape[0], H = c.shape[1], N = c.shape[2], D = c.shape[3];
    std::vector<double> pv;
    Tensor ids;
    positions pos(17);
    if (c.positions_kind > 0) {
      const std::int64_t rows = c.positions_kind == 2 ? B : 1;
      std::uniform_int_distribution<std::int64_t> u(-50, 5000);
      for (std::int64_t i = 0; i < rows * N; ++i) pv.push_back(double(u(rng)));
      ids = Tensor::from_values(c.positions_kind == 1 ? Shape{N} : Shape{rows, N}, dtype::i64, pv);
      pos = positions(ids);
    }
    rotary_options ro;
    ro.rotary_dim = c.rotary_dim;
    ro.layout = c.layout;
    for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16}) {
      SCOPED_TRACE(::testing::Message() << "shape " << shape_str(c.shape) << " R " << c.rotary_dim << " layout "
                                        << int(c.layout) << " positions " << c.positions_kind << " 3-D " << c.three_d
                                        << " transposed " << c.transposed << " dtype " << dtype_name(t));
      const Tensor buf = random_tensor(c.transposed ? Shape{B, N, H, D} : Shape{B, H, N, D}, t, rng);
      TensorView x4 = c.transposed ? buf.view().permute({0, 2, 1, 3}) : buf.view();
      TensorView x = x4;
      Tensor buf3;
      if (c.three_d) {
        buf3 = Tensor::copy_of(x4.permute({0, 2, 1, 3}));  // [B, N, H, D] contiguous
        x = buf3.view().reshape({B, N, H * D});
        ro.num_heads = H;
      } else {
        ro.num_heads = 0;
      }
      const Tensor got = rotary(x, pos, ro);
      ASSERT_EQ(got.shape(), x.shape());
      ASSERT_EQ(got.type(), t);
      Tensor want;
      {
        reference_scope ref;
        want = rotary(Tensor::copy_of(x, dtype::f64), pos, ro);
      }
      EXPECT_TRUE(all_close(got, want, tolerance_for(t)));
      if (c.three_d) {  // 3-D and 4-D layouts agree
        ro.num_heads = 0;
        const Tensor got4 = rotary(x4, pos, ro);
        EXPECT_TRUE(all_close(Tensor::copy_of(got4.view().permute({0, 2, 1, 3})).view().reshape({B, N, H * D}), got, 0));
      }
    }
  }
}

TEST(Rotary, LargePositionsStayAccurateInFloat32) {
  std::mt19937 rng(2);
  const Tensor x = random_tensor({1, 2, 3, 128}, dtype::f32, rng);
  const Tensor ids = Tensor::from_values({3}, dtype::i64, {1e6, 123457, 2e7});
  Tensor want;
  {
    reference_scope ref;
    want = rotary(Tensor::copy_of(x, dtype::f64), ids);
  }
  EXPECT_TRUE(all_close(rotary(x, ids), want, 2e-5));
}

TEST(Rotary, PreservesNormsAndDotsDependOnlyOnRelativePosition) {
  std::mt19937 rng(3);
  for (auto layout : {rotary_layout::half_split, rotary_layout::interleaved})
    for (std::int64_t R : {std::int64_t(0), std::int64_t(6)}) {
      rotary_options ro;
      ro.layout = layout;
      ro.rotary_dim = R;
      const std::int64_t D = 10;
      const Tensor q = random_tensor({1, 1, 1, D}, dtype::f64, rng), k = random_tensor({1, 1, 1, D}, dtype::f64, rng);
      const Tensor q5 = rotary(q, 5, ro);
      EXPECT_NEAR(dot_row(q5, q5, D), dot_row(q, q, D), 1e-12);
      const double d_5_2 = dot_row(rotary(q, 5, ro), rotary(k, 2, ro), D);
      const double d_45_42 = dot_row(rotary(q, 45, ro), rotary(k, 42, ro), D);
      const double d_m3_m6 = dot_row(rotary(q, -3, ro), rotary(k, -6, ro), D);
      EXPECT_NEAR(d_5_2, d_45_42, 1e-12);
      EXPECT_NEAR(d_5_2, d_m3_m6, 1e-12);
      // ... and it does depend on the relative position (a test that can fail).
      EXPECT_GT(std::abs(d_5_2 - dot_row(rotary(q, 5, ro), rotary(k, 3, ro), D)), 1e-6);
    }
}

TEST(Rotary, HalfSplitIsInterleavedUnderAFeaturePermutation) {
  // perm maps the interleaved pair (2i, 2i+1) to the half-split pair (i, i + R/2); tail fixed.
  std::mt19937 rng(4);
  const std::int64_t D = 12, R = 8;
  const Tensor x = random_tensor({2, 3, 4, D}, dtype::f64, rng);
  const Tensor ids = Tensor::from_values({2, 4}, dtype::i64, {0, 3, 9, 100, 7, 1, 2, 5});
  std::vector<std::int64_t> perm(D);  // half-split feature f holds interleaved feature perm[f]
  for (std::int64_t i = 0; i < R / 2; ++i) perm[i] = 2 * i, perm[i + R / 2] = 2 * i + 1;
  for (std::int64_t f = R; f < D; ++f) perm[f] = f;
  const auto permuted = [&](const TensorView& t) {
    Tensor r = Tensor::empty(t.shape(), dtype::f64);
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t h = 0; h < 3; ++h)
        for (std::int64_t n = 0; n < 4; ++n)
          for (std::int64_t f = 0; f < D; ++f) r.set({b, h, n, f}, t.get({b, h, n, perm[f]}));
    return r;
  };
  rotary_options half, inter;
  half.rotary_dim = inter.rotary_dim = R;
  inter.layout = rotary_layout::interleaved;
  EXPECT_TRUE(all_close(rotary(permuted(x), ids, half), permuted(rotary(x, ids, inter)), 1e-13));
  EXPECT_FALSE(all_close(rotary(x, ids, half), rotary(x, ids, inter), 1e-3));
}

TEST(Rotary, BackwardIsInverseAndMatchesFiniteDifferences) {
  std::mt19937 rng(5);
  for (auto layout : {rotary_layout::half_split, rotary_layout::interleaved}) {
    rotary_options ro;
    ro.layout = layout;
    ro.rotary_dim = 4;
    const Tensor x = random_tensor({2, 2, 3, 6}, dtype::f64, rng);
    const Tensor w = random_tensor({2, 2, 3, 6}, dtype::f64, rng);
    const Tensor ids = Tensor::from_values({2, 3}, dtype::i64, {4, 0, 11, 2, 30, 7});
    EXPECT_TRUE(all_close(rotary_backward(rotary(x, ids, ro), ids, ro), x, 1e-14));
    // L(x) = Σ w · rotary(x)  =>  dL/dx = rotary_backward(w)
    const Tensor dx = rotary_backward(w, ids, ro);
    const auto loss = [&](const Tensor& xx) {
      return testing::weighted_sum(rotary(xx, ids, ro), w);
    };
    testing::expect_matches_finite_differences(x, dx, loss, "dx", 1e-8);
    // The fast f32 backward agrees with the reference.
    const Tensor w32 = w.to(dtype::f32);
    EXPECT_TRUE(all_close(rotary_backward(w32, ids, ro), dx, 2e-5));
  }
}

TEST(Rotary, EmptyAndZeroSizes) {
  EXPECT_EQ(rotary(Tensor::zeros({2, 3, 0, 8}, dtype::f32)).shape(), (Shape{2, 3, 0, 8}));
  EXPECT_EQ(rotary(Tensor::zeros({0, 3, 4, 8}, dtype::f16)).shape(), (Shape{0, 3, 4, 8}));
}

TEST(Rotary, BadInputNamesOpArgumentAndValues) {
  const Tensor x = Tensor::zeros({2, 3, 4, 8}, dtype::f32);
  rotary_options ro;
  ro.rotary_dim = 5;
  EXPECT_THROW_MSG(rotary(x, 0, ro), "rotary: rotary_dim = 5 must be even");
  ro.rotary_dim = 10;
  EXPECT_THROW_MSG(rotary(x, 0, ro), "rotary: rotary_dim = 10 is outside [0, D] = [0, 8]");
  ro.rotary_dim = -2;
  EXPECT_THROW_MSG(rotary_backward(x, 0, ro), "rotary_backward: rotary_dim = -2 is outside");
  EXPECT_THROW_MSG(rotary(Tensor::zeros({1, 1, 2, 5}, dtype::f32)), "rotary: rotary_dim defaults to D = 5, which is odd");
  ro = {};
  ro.base = 0;
  EXPECT_THROW_MSG(rotary(x, 0, ro), "rotary: base = 0 must be finite and > 0");
  ro.base = std::nan("");
  EXPECT_THROW_MSG(rotary(x, 0, ro), "rotary: base = nan");
  ro = {};
  EXPECT_THROW_MSG(rotary(Tensor::zeros({2, 4, 24}, dtype::f32)), "rotary: 3-D x [2, 4, 24] needs num_heads (got 0)");
  ro.num_heads = 5;
  EXPECT_THROW_MSG(rotary(Tensor::zeros({2, 4, 24}, dtype::f32), 0, ro), "rotary: x hidden size 24 is not a multiple of num_heads = 5");
  EXPECT_THROW_MSG(rotary(x, 0, ro), "rotary: num_heads = 5 but 4-D x [2, 3, 4, 8] has 3 heads");
  EXPECT_THROW_MSG(rotary_backward(Tensor::zeros({2, 3, 4, 8, 1}, dtype::f32)), "rotary_backward: dy has 5 dims [2, 3, 4, 8, 1], expected 4");
  EXPECT_THROW_MSG(rotary(Tensor::zeros({2, 3, 4, 8}, dtype::i64)), "rotary: x has dtype int64, expected float32");
  EXPECT_THROW_MSG(rotary(x, Tensor::zeros({4}, dtype::f32)), "rotary: positions has dtype float32, expected int64 or int32");
  EXPECT_THROW_MSG(rotary(x, Tensor::zeros({5}, dtype::i64)), "rotary: positions has shape [5], expected [N] = [4] or [B, N] = [B, 4]");
  EXPECT_THROW_MSG(rotary(x, Tensor::zeros({3, 4}, dtype::i64)), "rotary: positions has 3 batches but x [2, 3, 4, 8] has 2");
  const Tensor ids4 = Tensor::zeros({4}, dtype::i64);
  positions both(ids4);
  both.offset = 3;
  EXPECT_THROW_MSG(rotary(x, both), "rotary: positions has both offset = 3 and ids [4]");
}

// Position ids as int32 (what Hugging Face models and PyTorch users often hold): every op that
// takes ids gives bitwise what int64 ids give — [N], [B, N], [1, N] and a strided [B, N] view.
TEST(PositionalInt32, IdsAsInt64) {
  std::mt19937 rng(4);
  const Tensor x = random_tensor({2, 3, 4, 8}, dtype::f32, rng);
  const Tensor x3 = random_tensor({2, 4, 8}, dtype::f32, rng);
  const Tensor table = random_tensor({9, 8}, dtype::f32, rng);
  const Tensor n64 = Tensor::from_values({4}, dtype::i64, {7, 0, 3, 3});
  const Tensor b64 = Tensor::from_values({2, 4}, dtype::i64, {1, 2, 8, 0, 5, 5, 6, 2});
  const Tensor one64 = Tensor::from_values({1, 4}, dtype::i64, {2, 4, 6, 8});
  Tensor wide = Tensor::full({2, 8}, dtype::i32, -1.0);  // b64's values in every other column
  for (std::int64_t i = 0; i < 8; ++i) wide.set({i / 4, 2 * (i % 4)}, b64.to_vector()[std::size_t(i)]);
  const TensorView b32s(wide.data(), dtype::i32, {2, 4}, {8, 2});
  const auto same = [](const Tensor& a, const Tensor& b, const char* what) { EXPECT_TRUE(all_close(a, b, 0)) << what; };
  const Tensor n32 = n64.to(dtype::i32), b32 = b64.to(dtype::i32), one32 = one64.to(dtype::i32);
  for (const auto& [ids64, ids32, name] : {std::tuple{n64, n32.view(), "[N]"}, std::tuple{b64, b32.view(), "[B, N]"},
                                           std::tuple{one64, one32.view(), "[1, N]"},
                                           std::tuple{b64, b32s, "[B, N] strided"}}) {
    SCOPED_TRACE(name);
    same(rotary(x, ids32), rotary(x, ids64), "rotary");
    same(rotary_backward(x, ids32), rotary_backward(x, ids64), "rotary_backward");
    same(add_sinusoidal_encoding(x3, ids32), add_sinusoidal_encoding(x3, ids64), "add_sinusoidal_encoding");
    same(learned_position_encoding(table, 4, ids32), learned_position_encoding(table, 4, ids64), "learned");
    same(learned_position_encoding_backward(x3, 9, ids32), learned_position_encoding_backward(x3, 9, ids64),
         "learned backward");
  }
  EXPECT_THROW_MSG(learned_position_encoding(table, 4, Tensor::from_values({4}, dtype::i32, {0, 9, 1, 1})),
                   "learned_position_encoding:");
}

}  // namespace
}  // namespace attn

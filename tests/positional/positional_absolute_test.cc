// tests/positional/positional_absolute_test.cc — absolute encodings: the sinusoidal formula (plain and
// added to x) and the learned table (gather forward, scatter-add backward), fast paths against
// the float64 reference, positions as offsets and ids, and bad input.
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

TEST(Sinusoidal, MatchesTheFormula) {
  // D = 4, base 10000: columns sin(p), cos(p), sin(p / 100), cos(p / 100).
  const Tensor pe = sinusoidal_encoding(3, 4, 10000, dtype::f64);
  ASSERT_EQ(pe.shape(), (Shape{3, 4}));
  for (std::int64_t p = 0; p < 3; ++p) {
    EXPECT_NEAR(pe.get({p, 0}), std::sin(p), 1e-15);
    EXPECT_NEAR(pe.get({p, 1}), std::cos(p), 1e-15);
    EXPECT_NEAR(pe.get({p, 2}), std::sin(p / 100.0), 1e-15);
    EXPECT_NEAR(pe.get({p, 3}), std::cos(p / 100.0), 1e-15);
  }
  // Odd D ends on a sin column: D = 5, column 4 = sin(p · base^(-4/5)).
  const Tensor odd = sinusoidal_encoding(4, 5, 10000, dtype::f64);
  EXPECT_NEAR(odd.get({3, 4}), std::sin(3 * std::pow(10000.0, -0.8)), 1e-15);
  EXPECT_NEAR(odd.get({3, 3}), std::cos(3 * std::pow(10000.0, -0.4)), 1e-15);
  // Another base.
  EXPECT_NEAR(sinusoidal_encoding(3, 4, 16, dtype::f64).get({2, 2}), std::sin(2 / 4.0), 1e-15);
}

TEST(Sinusoidal, OffsetsIdsAndDtypes) {
  std::mt19937 rng(1);
  const std::int64_t D = 10;
  Tensor full;
  {
    reference_scope ref;
    full = sinusoidal_encoding(40, D, 10000, dtype::f64);
  }
  for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    EXPECT_TRUE(all_close(sinusoidal_encoding(40, D, 10000, t), full, tolerance_for(t)));
    // Offset 5: rows 5..11.
    EXPECT_TRUE(all_close(sinusoidal_encoding(7, D, 10000, t, 5), full.view().slice(0, 5, 12), tolerance_for(t)));
  }
  // ids [B, N] give [B, N, D]; ids [N] give [N, D].
  const Tensor ids = Tensor::from_values({2, 3}, dtype::i64, {0, 7, 39, 3, 3, 1});
  const Tensor pe = sinusoidal_encoding(3, D, 10000, dtype::f32, ids);
  ASSERT_EQ(pe.shape(), (Shape{2, 3, D}));
  for (std::int64_t b = 0; b < 2; ++b)
    for (std::int64_t n = 0; n < 3; ++n)
      for (std::int64_t d = 0; d < D; ++d)
        EXPECT_NEAR(pe.get({b, n, d}), full.get({std::int64_t(ids.get({b, n})), d}), 2e-6);
  const Tensor ids1 = Tensor::from_values({2}, dtype::i64, {9, 2});
  EXPECT_TRUE(all_close(sinusoidal_encoding(2, D, 10000, dtype::f64, ids1).view().slice(0, 1, 2),
                        full.view().slice(0, 2, 3), 1e-15));
}

TEST(Sinusoidal, AddToStridedInputs) {
  std::mt19937 rng(2);
  const std::int64_t B = 3, N = 5, D = 6;
  for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor buf = random_tensor({N, B, D}, t, rng);
    const TensorView x = buf.view().transpose(0, 1);  // [B, N, D], strided
    const Tensor ids = Tensor::from_values({B, N}, dtype::i64, {0, 1, 2, 3, 4, 10, 11, 12, 13, 14, 7, 7, 0, 1, 2});
    const Tensor got = add_sinusoidal_encoding(x, ids);
    ASSERT_EQ(got.shape(), (Shape{B, N, D}));
    const Tensor pe = sinusoidal_encoding(N, D, 10000, dtype::f64, ids);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t d = 0; d < D; ++d)
          EXPECT_NEAR(got.get({b, n, d}), x.get({b, n, d}) + pe.get({b, n, d}), 2 * tolerance_for(t));
    // Offset positions, 2-D x.
    const TensorView x2(x.data(), t, {N, D}, {x.stride(1), x.stride(2)});  // batch 0, strided
    Tensor want;
    {
      reference_scope ref;
      want = add_sinusoidal_encoding(Tensor::copy_of(x2, dtype::f64), 100);
    }
    EXPECT_TRUE(all_close(add_sinusoidal_encoding(x2, 100), want, 2 * tolerance_for(t)));
  }
}

TEST(Sinusoidal, BadInput) {
  EXPECT_THROW_MSG(sinusoidal_encoding(-1, 4), "sinusoidal_encoding: N = -1 and D = 4 must not be negative");
  EXPECT_THROW_MSG(sinusoidal_encoding(3, 4, -2), "sinusoidal_encoding: base = -2 must be finite and > 0");
  EXPECT_THROW_MSG(sinusoidal_encoding(3, 4, 10000, dtype::i64), "sinusoidal_encoding: dtype int64 is not a float dtype");
  EXPECT_THROW_MSG(sinusoidal_encoding(3, 4, 10000, dtype::f32, Tensor::zeros({2}, dtype::i64)),
                   "sinusoidal_encoding: positions has shape [2], expected [N] = [3]");
  EXPECT_THROW_MSG(add_sinusoidal_encoding(Tensor::zeros({4}, dtype::f32)), "add_sinusoidal_encoding: x has 1 dims [4], expected 2 (N, D) or 3 (B, N, D)");
  EXPECT_THROW_MSG(add_sinusoidal_encoding(Tensor::zeros({2, 3, 4}, dtype::f32), Tensor::zeros({4, 3}, dtype::i64)),
                   "add_sinusoidal_encoding: positions has 4 batches but x [2, 3, 4] has 2");
  EXPECT_THROW_MSG(add_sinusoidal_encoding(Tensor::zeros({3, 4}, dtype::f32), Tensor::zeros({2, 3}, dtype::i64)),
                   "add_sinusoidal_encoding: positions has 2 batches but x [3, 4] has none");
  EXPECT_THROW_MSG(add_sinusoidal_encoding(Tensor::zeros({3, 4}, dtype::boolean)), "add_sinusoidal_encoding: x has dtype bool");
}

TEST(Learned, GatherForwardByHand) {
  // table rows r hold [10 r, 10 r + 1].
  const Tensor table = Tensor::from_values({4, 2}, dtype::f32, {0, 1, 10, 11, 20, 21, 30, 31});
  EXPECT_TRUE(all_close(learned_position_encoding(table, 2, 1), Tensor::from_values({2, 2}, dtype::f32, {10, 11, 20, 21}), 0));
  const Tensor ids = Tensor::from_values({2, 3}, dtype::i64, {3, 0, 3, 1, 1, 2});
  EXPECT_TRUE(all_close(learned_position_encoding(table, 3, ids),
                        Tensor::from_values({2, 3, 2}, dtype::f32, {30, 31, 0, 1, 30, 31, 10, 11, 10, 11, 20, 21}), 0));
  // A strided (transposed) table and every dtype.
  std::mt19937 rng(3);
  for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16}) {
    const Tensor tb = random_tensor({5, 7}, t, rng);
    const TensorView tv = tb.view().transpose(0, 1);  // [7 positions, 5]
    const Tensor got = learned_position_encoding(tv, 3, ids);
    Tensor want;
    {
      reference_scope ref;
      want = learned_position_encoding(tv, 3, ids);
    }
    EXPECT_TRUE(all_close(got, want, 0));
    EXPECT_EQ(got.get({0, 0, 4}), tv.get({3, 4}));
  }
}

TEST(Learned, BackwardScatterAddsAndMatchesFiniteDifferences) {
  std::mt19937 rng(4);
  const std::int64_t P = 6, D = 3, B = 2, N = 4;
  const Tensor ids = Tensor::from_values({B, N}, dtype::i64, {1, 1, 5, 0, 5, 2, 1, 0});  // repeats
  const Tensor table = random_tensor({P, D}, dtype::f64, rng);
  const Tensor w = random_tensor({B, N, D}, dtype::f64, rng);
  const Tensor dtable = learned_position_encoding_backward(w, P, ids);
  ASSERT_EQ(dtable.shape(), (Shape{P, D}));
  // By hand: row 1 gets w[0,0] + w[0,1] + w[1,2]; rows 3 and 4 are never looked up.
  for (std::int64_t d = 0; d < D; ++d) {
    EXPECT_NEAR(dtable.get({1, d}), w.get({0, 0, d}) + w.get({0, 1, d}) + w.get({1, 2, d}), 1e-15);
    EXPECT_EQ(dtable.get({3, d}), 0.0);
    EXPECT_EQ(dtable.get({4, d}), 0.0);
  }
  const auto loss = [&](const Tensor& t) {
    return testing::weighted_sum(learned_position_encoding(t, N, ids), w);
  };
  testing::expect_matches_finite_differences(table, dtable, loss, "dtable", 1e-8);
  // Shared positions (offset) sum over the batch; dtypes follow dout.
  for (dtype t : {dtype::f32, dtype::bf16}) {
    const Tensor w_t = w.to(t);
    const Tensor got = learned_position_encoding_backward(w_t, P, 2);
    EXPECT_EQ(got.type(), t);
    Tensor want;
    {
      reference_scope ref;
      want = learned_position_encoding_backward(Tensor::copy_of(w_t, dtype::f64), P, 2);
    }
    EXPECT_NEAR(want.get({2, 1}), w_t.get({0, 0, 1}) + w_t.get({1, 0, 1}), 1e-12);
    EXPECT_TRUE(all_close(got, want, tolerance_for(t)));
  }
}

TEST(Learned, BadInput) {
  const Tensor table = Tensor::zeros({4, 2}, dtype::f32);
  EXPECT_THROW_MSG(learned_position_encoding(table, 3, 2),
                   "learned_position_encoding: positions offset = 2 with N = 3 reaches 4, outside the table's rows [0, 4)");
  EXPECT_THROW_MSG(learned_position_encoding(table, 3, -1), "positions offset = -1 with N = 3 reaches -1");
  EXPECT_THROW_MSG(learned_position_encoding(table, 2, Tensor::from_values({2}, dtype::i64, {0, 4})),
                   "learned_position_encoding: positions[0, 1] = 4 is outside the table's rows [0, 4)");
  EXPECT_THROW_MSG(learned_position_encoding(Tensor::zeros({4}, dtype::f32), 2),
                   "learned_position_encoding: table has 1 dims [4], expected 2 (num_positions, D)");
  EXPECT_THROW_MSG(learned_position_encoding(table, -2), "learned_position_encoding: N = -2 must not be negative");
  EXPECT_THROW_MSG(learned_position_encoding_backward(Tensor::zeros({3, 2}, dtype::f32), 2),
                   "learned_position_encoding_backward: positions offset = 0 with N = 3 reaches 2");
  EXPECT_THROW_MSG(learned_position_encoding_backward(Tensor::zeros({3, 2}, dtype::f32), 4, Tensor::zeros({2, 3}, dtype::i64)),
                   "learned_position_encoding_backward: positions has 2 batches but dout [3, 2] has none");
  EXPECT_THROW_MSG(learned_position_encoding_backward(Tensor::zeros({3, 2}, dtype::i64), 4),
                   "learned_position_encoding_backward: dout has dtype int64");
  EXPECT_THROW_MSG(learned_position_encoding_backward(Tensor::zeros({3, 2}, dtype::f32), -1),
                   "learned_position_encoding_backward: num_positions = -1 must not be negative");
}

}  // namespace
}  // namespace attn

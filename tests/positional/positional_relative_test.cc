// tests/positional/positional_relative_test.cc — the T5 relative position bias: buckets worked by hand for
// small configurations and the bucket edges of T5's defaults, the bias gather and its
// scatter-add backward (fast against reference, finite differences in f64), bad input.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <random>
#include <tuple>

#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::reference_scope;
using testing::tolerance_for;

relative_position_options rp(bool bidirectional, std::int64_t num_buckets, std::int64_t max_distance,
                             std::int64_t query_offset = 0) {
  relative_position_options o;
  o.bidirectional = bidirectional, o.num_buckets = num_buckets, o.max_distance = max_distance;
  o.query_offset = query_offset;
  return o;
}

TEST(RelativeBucket, BidirectionalByHand) {
  // num_buckets 8 -> 4 per direction, max_exact 2, log part 2 + trunc(log(n/2) / log(8) · 2):
  //   n = 2..5 -> 2 (log(2.5)/log 8 · 2 = 0.88), n = 6 -> 3 (1.06), beyond -> clamp 3.
  // r > 0 (key after query) adds 4.
  const auto o = rp(true, 8, 16);
  const std::int64_t want[15] = {3, 3, 2, 2, 2, 2, 1, 0, 5, 6, 6, 6, 6, 7, 7};  // r = -7 .. 7
  for (std::int64_t r = -7; r <= 7; ++r) EXPECT_EQ(relative_position_bucket(r, o), want[r + 7]) << "r = " << r;
  EXPECT_EQ(relative_position_bucket(-1000000, o), 3);
  EXPECT_EQ(relative_position_bucket(1000000, o), 7);
  EXPECT_EQ(relative_position_bucket(INT64_MIN, o), 3);
  EXPECT_EQ(relative_position_bucket(INT64_MAX, o), 7);
}

TEST(RelativeBucket, CausalByHand) {
  // num_buckets 8, max_exact 4, 4 + trunc(log(n/4) / log(5) · 4), n = −r; keys after the query -> 0.
  //   n = 5: 0.55 -> 4   n = 6: 1.01 -> 5   n = 8: 1.72 -> 5   n = 9: 2.01 -> 6
  //   n = 13: 2.93 -> 6  n = 14: 3.11 -> 7  n >= 20: clamp 7
  const auto o = rp(false, 8, 20);
  const std::int64_t want[21] = {0, 1, 2, 3, 4, 4, 5, 5, 5, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7};  // n = 0 .. 20
  for (std::int64_t n = 0; n <= 20; ++n) EXPECT_EQ(relative_position_bucket(-n, o), want[n]) << "n = " << n;
  for (std::int64_t r : {1, 5, 1000}) EXPECT_EQ(relative_position_bucket(r, o), 0);
}

TEST(RelativeBucket, EdgesOfT5Defaults) {
  // First distance n of each logarithmic bucket (T5 / Hugging Face, float32 formula). 16 and 32
  // and 64 sit exactly on an edge (log(n/8)/log(16) · 8 is a whole number).
  const auto bi = rp(true, 32, 128);
  const std::int64_t bi_edges[][2] = {{8, 8}, {9, 12}, {10, 16}, {11, 23}, {12, 32}, {13, 46}, {14, 64}, {15, 91}};
  for (auto [bucket, n] : bi_edges) {
    EXPECT_EQ(relative_position_bucket(-n, bi), bucket) << "n = " << n;
    EXPECT_EQ(relative_position_bucket(-(n - 1), bi), bucket - 1) << "n = " << n - 1;
    EXPECT_EQ(relative_position_bucket(n, bi), 16 + bucket) << "r = +" << n;
  }
  const auto causal = rp(false, 32, 128);
  const std::int64_t causal_edges[][2] = {{17, 19}, {18, 21}, {19, 24}, {20, 27}, {21, 31}, {22, 35}, {23, 40},
                                          {24, 46}, {25, 52}, {26, 59}, {27, 67}, {28, 77}, {29, 87}, {30, 99},
                                          {31, 113}};
  for (auto [bucket, n] : causal_edges) {
    EXPECT_EQ(relative_position_bucket(-n, causal), bucket) << "n = " << n;
    EXPECT_EQ(relative_position_bucket(-(n - 1), causal), bucket - 1) << "n = " << n - 1;
  }
  EXPECT_EQ(relative_position_bucket(-16, causal), 16);
  // Defaults are T5's.
  EXPECT_EQ(relative_position_bucket(-91), 15);
}

TEST(RelativeBucket, TensorOfBucketsWithQueryOffset) {
  const auto o = rp(true, 8, 16, 3);  // query i sits at key 3 + i
  const Tensor k = relative_position_buckets(2, 5, o);
  ASSERT_EQ(k.shape(), (Shape{2, 5}));
  ASSERT_EQ(k.type(), dtype::i64);
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 5; ++j)
      EXPECT_EQ(k.get({i, j}), double(relative_position_bucket(j - 3 - i, o)));
  EXPECT_EQ(k.get({0, 3}), 0.0);  // same position
  EXPECT_EQ(k.get({1, 0}), 2.0);  // r = -4
}

TEST(RelativeBias, ForwardGathersTheTable) {
  std::mt19937 rng(1);
  const std::int64_t H = 3;
  for (auto o : {rp(true, 8, 16), rp(false, 8, 20, 4), rp(true, 32, 128, 2)}) {
    for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16}) {
      const Tensor buf = random_tensor({H, o.num_buckets}, t, rng);
      const TensorView table = buf.view().transpose(0, 1);  // [num_buckets, H], strided
      for (auto [Nq, Nk] : {std::pair<std::int64_t, std::int64_t>{5, 7}, {1, 9}, {40, 33}, {0, 3}}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(t) << " Nq " << Nq << " Nk " << Nk << " buckets "
                                          << o.num_buckets << " offset " << o.query_offset);
        const Tensor bias = relative_position_bias(table, Nq, Nk, o);
        ASSERT_EQ(bias.shape(), (Shape{1, H, Nq, Nk}));
        ASSERT_EQ(bias.type(), t);
        const Tensor k = relative_position_buckets(Nq, Nk, o);
        for (std::int64_t h = 0; h < H; ++h)
          for (std::int64_t i = 0; i < Nq; ++i)
            for (std::int64_t j = 0; j < Nk; ++j)
              ASSERT_EQ(bias.get({0, h, i, j}), table.get({std::int64_t(k.get({i, j})), h}));
        reference_scope ref;
        EXPECT_TRUE(all_close(relative_position_bias(table, Nq, Nk, o), bias, 0));
      }
    }
  }
}

TEST(RelativeBias, BackwardScattersAndMatchesFiniteDifferences) {
  std::mt19937 rng(2);
  const std::int64_t H = 2, Nq = 4, Nk = 6;
  const auto o = rp(true, 8, 16, 1);
  const Tensor table = random_tensor({8, H}, dtype::f64, rng);
  const Tensor w = random_tensor({3, H, Nq, Nk}, dtype::f64, rng);  // dbias with a batch of 3
  const Tensor dtable = relative_position_bias_backward(w, o);
  ASSERT_EQ(dtable.shape(), (Shape{8, H}));
  // L(table) = Σ_b Σ w[b] · bias(table)
  const auto loss = [&](const Tensor& t) {
    const Tensor bias = relative_position_bias(t, Nq, Nk, o);
    double s = 0;
    for (std::int64_t b = 0; b < 3; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t i = 0; i < Nq; ++i)
          for (std::int64_t j = 0; j < Nk; ++j) s += w.get({b, h, i, j}) * bias.get({0, h, i, j});
    return s;
  };
  testing::expect_matches_finite_differences(table, dtable, loss, "dtable", 1e-8);
  // Fast against reference: 3-D and 4-D dbias, strided, every dtype, a parallel-sized case.
  for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16}) {
    for (auto [B, Hh, Mq, Mk] : {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>{1, 2, 5, 7},
                                 {2, 4, 64, 150}}) {
      const auto big = rp(false, 32, 128, 7);
      const Tensor buf = random_tensor({Hh, B, Mk, Mq}, t, rng);
      const TensorView g = buf.view().permute({1, 0, 3, 2});  // [B, H, Nq, Nk], strided
      Tensor want;
      {
        reference_scope ref;
        want = relative_position_bias_backward(g, big);
      }
      const Tensor got = relative_position_bias_backward(g, big);
      EXPECT_EQ(got.type(), t);
      EXPECT_TRUE(all_close(got, want, tolerance_for(t) * std::sqrt(double(B * Mq * Mk))));
      if (B == 1) {
        const Tensor got3 = relative_position_bias_backward(TensorView(g.data(), t, {Hh, Mq, Mk}, {g.stride(1), g.stride(2), g.stride(3)}), big);
        EXPECT_TRUE(all_close(got3, got, 0));
      }
    }
  }
}

TEST(RelativeBias, BadInput) {
  EXPECT_THROW_MSG(relative_position_bucket(3, rp(true, 3, 128)),
                   "relative_position_bucket: num_buckets = 3 is too small; T5 needs max_exact = num_buckets / 4 = 0 >= 1");
  EXPECT_THROW_MSG(relative_position_bucket(3, rp(false, 1, 128)), "num_buckets = 1 is too small");
  EXPECT_THROW_MSG(relative_position_buckets(2, 2, rp(true, 32, 8)),
                   "relative_position_buckets: max_distance = 8 must exceed max_exact = 8 (num_buckets = 32, bidirectional)");
  EXPECT_THROW_MSG(relative_position_buckets(-1, 2), "relative_position_buckets: Nq = -1 and Nk = 2 must not be negative");
  const Tensor table = Tensor::zeros({16, 4}, dtype::f32);
  EXPECT_THROW_MSG(relative_position_bias(table, 3, 3),
                   "relative_position_bias: table has shape [16, 4], expected [num_buckets, H] = [32, H]");
  EXPECT_THROW_MSG(relative_position_bias(Tensor::zeros({32, 4}, dtype::i64), 3, 3), "relative_position_bias: table has dtype int64");
  EXPECT_THROW_MSG(relative_position_bias(Tensor::zeros({32, 4}, dtype::f32), 3, -3), "relative_position_bias: Nq = 3 and Nk = -3");
  EXPECT_THROW_MSG(relative_position_bias_backward(Tensor::zeros({4, 3}, dtype::f32)),
                   "relative_position_bias_backward: dbias has 2 dims [4, 3], expected 4 (B, H, Nq, Nk) or 3 (H, Nq, Nk)");
  EXPECT_THROW_MSG(relative_position_bias_backward(Tensor::zeros({1, 4, 3, 3}, dtype::f32), rp(false, 32, 16)),
                   "relative_position_bias_backward: max_distance = 16 must exceed max_exact = 16");
}

}  // namespace
}  // namespace attn

// tests/core/limits_test.cc — issue 14, crashes and undefined behaviour: sizes that overflow,
// memory that is not there, views of huge logical shapes, absurd thread counts and corrupt .npy
// files give an attn::error naming what was wrong, never a crash, a hang or std::bad_alloc.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>

#include "test_util.h"

namespace attn {
namespace {

constexpr std::int64_t kBig = std::int64_t(1) << 62;

TEST(Limits, EmptyRefusesSizesBeyondInt64) {
  EXPECT_THROW_MSG(Tensor::empty({kBig}, dtype::f32), "has more bytes than int64 holds");
  EXPECT_THROW_MSG(Tensor::empty({kBig, 4}, dtype::f32), "has more elements than int64 holds");
  EXPECT_THROW_MSG(Tensor::zeros({std::int64_t(1) << 32, std::int64_t(1) << 32}, dtype::boolean),
                   "shape [4294967296, 4294967296] has more elements");
  // An empty tensor whose strides would overflow is refused too.
  EXPECT_THROW_MSG(Tensor::empty({4, 0, 3098515204, 912875000, 8}, dtype::f32), "more elements than int64 holds");
}

TEST(Limits, AllocationFailureIsAnErrorNamingTheSize) {
  // 4 TiB: past any test machine's memory, inside int64.
  EXPECT_THROW_MSG(Tensor::empty({std::int64_t(1) << 40}, dtype::f32),
                   "tensor: cannot allocate 4398046511104 bytes for shape [1099511627776] of float32");
}

TEST(Limits, ViewsOfHugeLogicalShapesAreRefused) {
  float x[4] = {1, 2, 3, 4};
  const TensorView row(x, dtype::f32, {1, 1, 1, 4});
  const std::int64_t t31 = std::int64_t(1) << 31;
  EXPECT_THROW_MSG(row.broadcast_to({t31, t31, t31, 4}), "more elements than int64 holds");
  EXPECT_THROW_MSG(TensorView(x, dtype::f32, {t31, t31, 4}, {t31 * t31, 0, 1}), "more element offsets than int64");
  const std::int64_t t20 = std::int64_t(1) << 20;
  EXPECT_THROW_MSG(TensorView(x, dtype::f32, {t20, t20, 4}, {t20 << 23, t20 << 22, 1}), "has offsets beyond int64");
  EXPECT_THROW_MSG(TensorView(x, dtype::f32, {1 << 20, 1 << 20, std::int64_t(1) << 22, 4}, {0, 0, 0, 1}),
                   "more elements than int64 holds");
}

TEST(Limits, AttentionRefusesWorkBeyondTheLimitOnEveryBackend) {
  float x[4] = {1, 2, 3, 4};
  const TensorView row(x, dtype::f32, {1, 1, 1, 4});
  const std::int64_t n = std::int64_t(1) << 20;
  const TensorView q = row.broadcast_to({1, 1, n, 4}), k = row.broadcast_to({n, 1, n, 4});
  const TensorView qb = row.broadcast_to({n, 1, n, 4});
  for (backend be : {backend::cpu, backend::reference}) {
    EXPECT_THROW_MSG(attention(qb, k, k, {}, {.use_backend = be}), "more than 2^56");
    EXPECT_THROW_MSG(explain_backend(qb, k, k), "more than 2^56");
  }
  // Within the work limit but past memory: the output allocation fails with its size.
  EXPECT_THROW_MSG(attention(q.broadcast_to({n, 1, n, 4}), k.slice(2, 0, 1), k.slice(2, 0, 1)), "cannot allocate");
}

TEST(Limits, ThreadCountsAreClampedAndNegativeRefused) {
  std::mt19937 rng(1);
  const Tensor q = testing::random_tensor({1, 2, 9, 8}, dtype::f32, rng), k = testing::random_tensor({1, 2, 11, 8}, dtype::f32, rng);
  const attention_result want = attention(q, k, k, {}, {.num_threads = 1});
  for (int t : {100000, 1 << 30}) {
    const attention_result r = attention(q, k, k, {}, {.num_threads = t});
    EXPECT_TRUE(testing::all_close(r.out, want.out, 0)) << t;
    const attention_grads g = attention_backward(q, k, k, r.out, r.out, r.lse, {}, {.num_threads = t});
    EXPECT_FALSE(testing::any_nan(g.dq));
    EXPECT_EQ(linear(q, k.view().reshape({22, 8}), std::nullopt, {.num_threads = t}).numel(), 9 * 2 * 22);
  }
  EXPECT_THROW_MSG(attention(q, k, k, {}, {.num_threads = -1}), "attention: num_threads = -1 must be >= 0");
}

TEST(Limits, WindowOfInt64MaxIsUnbounded) {
  std::mt19937 rng(2);
  const Tensor q = testing::random_tensor({1, 1, 6, 4}, dtype::f32, rng), k = testing::random_tensor({1, 1, 7, 4}, dtype::f32, rng);
  attention_options causal;
  causal.is_causal = true, causal.alignment = causal_alignment::bottom_right;
  for (backend be : {backend::cpu, backend::reference}) {
    const execution ex{.use_backend = be};
    const Tensor plain = attention(q, k, k, {}, ex).out, causal_only = attention(q, k, k, causal, ex).out;
    for (std::int64_t w : {INT64_MAX, INT64_MAX - 1, std::int64_t(1) << 62}) {
      attention_options o;
      o.window_left = o.window_right = w;
      EXPECT_TRUE(testing::all_close(attention(q, k, k, o, ex).out, plain, 0)) << w;
      attention_options oc = causal;
      oc.window_left = oc.window_right = w;
      EXPECT_TRUE(testing::all_close(attention(q, k, k, oc, ex).out, causal_only, 0)) << w;
    }
  }
}

// A .npy image: header dict, padded, then raw data.
std::string npy_image(const std::string& dict, const std::string& data) {
  std::string header = dict;
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string s = "\x93NUMPY";
  s.push_back(1), s.push_back(0), s.push_back(char(header.size() & 0xff)), s.push_back(char(header.size() >> 8));
  return s + header + data;
}

TEST(Limits, NpyRefusesBoolBytesOtherThanZeroOrOne) {
  const std::string ok = npy_image("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", std::string("\1\0\1", 3));
  EXPECT_EQ(parse_npy(ok.data(), ok.size(), "ok.npy").to_vector(), (std::vector<double>{1, 0, 1}));
  const std::string bad = npy_image("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", std::string("\1\0\2", 3));
  EXPECT_THROW_MSG(parse_npy(bad.data(), bad.size(), "m.npy"), "npy: m.npy: bool element 2 is byte 2, expected 0 or 1");
}

TEST(Limits, NpyRefusesShapesWhoseStridesOverflow) {
  const std::string f = npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': (4, 0, 3098515204, 912875000), }", "");
  EXPECT_THROW_MSG(parse_npy(f.data(), f.size(), "s.npy"), "npy: s.npy: shape [4, 0, 3098515204, 912875000] is too large");
}

TEST(Limits, NpyRefusesMalformedShapeTuples) {
  for (const char* shape : {"(4   000, 3)", "(4 0,)", "(,4)", "(4,,3)", "(4, 3 x)", "(4;3)", "(4, -3)"}) {
    const std::string f = npy_image(std::string("{'descr': '<f4', 'fortran_order': False, 'shape': ") + shape + ", }",
                                    std::string(48, '\0'));
    SCOPED_TRACE(shape);
    EXPECT_THROW_MSG(parse_npy(f.data(), f.size(), "t.npy"), "bad shape");
  }
  for (const char* shape : {"()", "(4,)", "( 4 , 3 )", "(4, 3,)", "(4,3)"}) {
    const std::string f = npy_image(std::string("{'descr': '<f4', 'fortran_order': False, 'shape': ") + shape + ", }",
                                    std::string(48, '\0'));
    EXPECT_NO_THROW(parse_npy(f.data(), f.size(), "t.npy")) << shape;
  }
}

}  // namespace
}  // namespace attn

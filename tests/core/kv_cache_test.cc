// tests/core/kv_cache_test.cc — the in-place KV cache: a step equals attention over the
// concatenated keys, only the new rows of the cache are written, per-batch lengths and every
// alignment, token-by-token decoding equals one causal call, ONNX past/present on top of it,
// and bad arguments by message.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <random>

#include "attn/attn.h"
#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::random_tensor;

// Rows [0, n) of head-major [B, H, N, X] `t` for batch b, as a [1, H, n, X] copy.
Tensor rows(const Tensor& t, std::int64_t b, std::int64_t n) {
  return Tensor::copy_of(t.view().slice(0, b, b + 1).slice(2, 0, n));
}

// Concatenation along the key axis of two [1, H, N, X] tensors.
Tensor concat(const Tensor& a, const Tensor& c) {
  Tensor r = Tensor::empty({1, a.size(1), a.size(2) + c.size(2), a.size(3)}, a.type());
  for (std::int64_t h = 0; h < a.size(1); ++h)
    for (std::int64_t n = 0; n < r.size(2); ++n)
      for (std::int64_t x = 0; x < a.size(3); ++x)
        r.set({0, h, n, x}, n < a.size(2) ? a.get({0, h, n, x}) : c.get({0, h, n - a.size(2), x}));
  return r;
}

class KvCache : public ::testing::TestWithParam<std::tuple<dtype, causal_alignment, backend>> {};

// Per-batch lengths 0, 5 and 11; GQA; 3 new tokens with 2 queries (Nq != Nnew) or 3.
TEST_P(KvCache, StepEqualsAttentionOverTheConcatenation) {
  const auto [type, align, be] = GetParam();
  std::mt19937 rng(7);
  const std::int64_t B = 3, Hq = 4, Hkv = 2, D = 8, Dv = 6, cap = 20;
  const std::vector<std::int64_t> len = {0, 5, 11};
  for (std::int64_t Nq : {2, 3}) {
    const std::int64_t Nnew = 3;
    SCOPED_TRACE(fmt::format("{} Nq {} alignment {}", dtype_name(type), Nq, int(align)));
    const Tensor kc = random_tensor({B, Hkv, cap, D}, type, rng), vc = random_tensor({B, Hkv, cap, Dv}, type, rng);
    const Tensor k_before = Tensor::copy_of(kc), v_before = Tensor::copy_of(vc);
    const Tensor lens = Tensor::from_values({B}, dtype::i64, {0, 5, 11});
    const Tensor q = random_tensor({B, Hq, Nq, D}, type, rng), kn = random_tensor({B, Hkv, Nnew, D}, type, rng),
                 vn = random_tensor({B, Hkv, Nnew, Dv}, type, rng);
    attention_options o;
    o.is_causal = true;
    o.alignment = align;
    const execution ex{.use_backend = be};
    const attention_result r = attention_with_kv_cache(q, kn, vn, {kc, vc, lens}, o, ex);

    for (std::int64_t b = 0; b < B; ++b) {
      // Only rows [len_b, len_b + Nnew) changed, and they hold the new tokens.
      for (std::int64_t h = 0; h < Hkv; ++h)
        for (std::int64_t n = 0; n < cap; ++n)
          for (std::int64_t x = 0; x < D; ++x) {
            const bool fresh = n >= len[b] && n < len[b] + Nnew;
            ASSERT_EQ(kc.get({b, h, n, x}), fresh ? kn.get({b, h, n - len[b], x}) : k_before.get({b, h, n, x}));
          }
      EXPECT_EQ(vc.get({b, 1, len[b] + 2, 5}), vn.get({b, 1, 2, 5}));
      EXPECT_EQ(vc.get({b, 0, len[b] + Nnew, 0}), v_before.get({b, 0, len[b] + Nnew, 0}));
      // The same attention over concat(cache rows, new rows), with the alignment's meaning.
      attention_options c;
      c.is_causal = true;
      c.alignment = align == causal_alignment::after_past ? causal_alignment::top_left : align;
      Tensor qb = Tensor::copy_of(q.view().slice(0, b, b + 1));
      const Tensor kk = concat(rows(k_before, b, len[b]), rows(kn, b, Nnew));
      const Tensor vv = concat(rows(v_before, b, len[b]), rows(vn, b, Nnew));
      attention_result want;
      if (align == causal_alignment::after_past) {  // pos_i = len_b + i: an ONNX past of len_b rows
        c.alignment = causal_alignment::after_past;
        c.past_key = rows(k_before, b, len[b]);
        c.past_value = rows(v_before, b, len[b]);
        want = attention(qb, rows(kn, b, Nnew), rows(vn, b, Nnew), c, {.use_backend = backend::reference});
      } else {
        want = attention(qb, kk, vv, c, {.use_backend = backend::reference});
      }
      const double tol = testing::tolerance_for(type);
      EXPECT_TRUE(all_close(Tensor::copy_of(r.out.view().slice(0, b, b + 1)), want.out, tol, tol)) << "batch " << b;
      EXPECT_TRUE(all_close(Tensor::copy_of(r.lse.view().slice(0, b, b + 1)), want.lse, tol, tol)) << "batch " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Alignments, KvCache,
                         ::testing::Combine(::testing::Values(dtype::f32, dtype::bf16),
                                            ::testing::Values(causal_alignment::after_past,
                                                              causal_alignment::bottom_right,
                                                              causal_alignment::top_left),
                                            ::testing::Values(backend::cpu, backend::reference)));

// Token-by-token decoding through the owning cache equals one causal call over the sequence.
TEST(kv_cache, decoding_step_by_step_equals_one_causal_call) {
  std::mt19937 rng(9);
  const std::int64_t B = 2, Hq = 4, Hkv = 1, N = 37, D = 16;
  const Tensor q = random_tensor({B, Hq, N, D}, dtype::f32, rng), k = random_tensor({B, Hkv, N, D}, dtype::f32, rng),
               v = random_tensor({B, Hkv, N, D}, dtype::f32, rng);
  attention_options o;
  o.is_causal = true;
  const attention_result full = attention(q, k, v, o);
  kv_cache cache(B, Hkv, 64, D, D, dtype::f32);
  o.alignment = causal_alignment::after_past;
  for (std::int64_t t = 0; t < N; ++t) {
    const attention_result r = attention_with_kv_cache(q.view().slice(2, t, t + 1), k.view().slice(2, t, t + 1),
                                                       v.view().slice(2, t, t + 1), cache, o);
    EXPECT_EQ(cache.lengths().get({0}), double(t + 1));
    ASSERT_TRUE(all_close(r.out, Tensor::copy_of(full.out.view().slice(2, t, t + 1)), 2e-6)) << "step " << t;
  }
  cache.clear();
  EXPECT_EQ(cache.lengths().get({1}), 0.0);
  EXPECT_THROW_MSG(cache.advance(65), "kv_cache: advancing length 0 of batch entry 0 by 65 leaves [0, 64]");
}

// 3-D new tokens ([B, Nnew, Hkv*D]) append like 4-D ones.
TEST(kv_cache, three_d_new_tokens) {
  std::mt19937 rng(10);
  const Tensor q = random_tensor({1, 2, 2 * 8}, dtype::f32, rng), kn = random_tensor({1, 2, 8}, dtype::f32, rng),
               vn = random_tensor({1, 2, 8}, dtype::f32, rng);
  kv_cache cache(1, 1, 10, 8, 8, dtype::f32);
  attention_options o;
  o.q_num_heads = 2, o.kv_num_heads = 1;
  const attention_result r = attention_with_kv_cache(q, kn, vn, cache, o);
  EXPECT_EQ(cache.lengths().get({0}), 2.0);
  EXPECT_EQ(cache.key().get({0, 0, 1, 3}), kn.get({0, 1, 3}));
  EXPECT_TRUE(all_close(r.out, attention(q, kn, vn, o).out, 1e-6));
}

TEST(kv_cache, bad_arguments_by_message) {
  std::mt19937 rng(11);
  const Tensor q = random_tensor({2, 2, 1, 4}, dtype::f32, rng), kn = random_tensor({2, 1, 1, 4}, dtype::f32, rng);
  const Tensor kc = Tensor::zeros({2, 1, 8, 4}, dtype::f32), vc = Tensor::zeros({2, 1, 8, 4}, dtype::f32);
  const Tensor lens = Tensor::from_values({2}, dtype::i64, {3, 8});
  const char* op = "attention_with_kv_cache: ";
  EXPECT_THROW_MSG(attention_with_kv_cache(q, kn, kn, {kc, vc, lens}),
                   std::string(op) + "cache lengths[1] = 8 with 1 new tokens does not fit the capacity 8");
  const Tensor lens_f = Tensor::from_values({2}, dtype::f32, {0, 0});
  EXPECT_THROW_MSG(attention_with_kv_cache(q, kn, kn, {kc, vc, lens_f}), "cache lengths has dtype float32, expected int64");
  const Tensor lens3 = Tensor::from_values({3}, dtype::i64, {0, 0, 0});
  EXPECT_THROW_MSG(attention_with_kv_cache(q, kn, kn, {kc, vc, lens3}), "cache lengths has 3 entries, expected B = 2");
  const Tensor ok = Tensor::from_values({2}, dtype::i64, {0, 0});
  const Tensor kc16 = Tensor::zeros({2, 1, 8, 4}, dtype::bf16);
  EXPECT_THROW_MSG(attention_with_kv_cache(q, kn, kn, {kc16, vc, ok}), "cache key/value have dtypes bfloat16/float32");
  const Tensor kc5 = Tensor::zeros({2, 1, 8, 5}, dtype::f32);
  EXPECT_THROW_MSG(attention_with_kv_cache(q, kn, kn, {kc5, vc, ok}), "cache key has shape [2, 1, 8, 5], expected [2, 1, capacity, 4]");
  attention_options o;
  o.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {1, 1});
  EXPECT_THROW_MSG(attention_with_kv_cache(q, kn, kn, {kc, vc, ok}, o), "nonpad_kv_seqlen cannot be combined with a KV cache");
  attention_options p;
  p.past_key = kn, p.past_value = kn;
  EXPECT_THROW_MSG(attention_with_kv_cache(q, kn, kn, {kc, vc, ok}, p), "past_key/past_value and an in-place KV cache");
  EXPECT_THROW_MSG(kv_cache(1, 1, -4, 8, 8, dtype::f32), "kv_cache: sizes B = 1, Hkv = 1, capacity = -4");
}

}  // namespace
}  // namespace attn

// tests/serving/int32_index_test.cc — int32 index tensors (what FlashAttention, vLLM and PyTorch
// hold): cu_seqlens, block_table, seq_lens, nonpad_kv_seqlen and KV cache lengths as int32,
// contiguous or strided, give bitwise the results of the same values in int64; the int32 dtype
// itself (size, name, conversions, .npy and safetensors round trips); other index dtypes are
// refused by message.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <numeric>
#include <random>

#include "attn/attn.h"
#include "test_util.h"

namespace attn {
namespace {

using testing::index_tensor;
using testing::random_tensor;

Tensor int32_tensor(Shape shape, const std::vector<std::int64_t>& v) {
  return Tensor::from_values(std::move(shape), dtype::i32, std::vector<double>(v.begin(), v.end()));
}

// The values of an int64 index tensor as an int32 view with strides: column 1 of an [n, 2]
// buffer (rank 1) or every other column of an [r, 2c] buffer (rank 2). `keep` holds the buffer.
TensorView strided_int32(const Tensor& i64, Tensor& keep) {
  const std::vector<double> v = i64.to_vector();
  if (i64.rank() == 1) {
    const std::int64_t n = i64.size(0);
    keep = Tensor::full({n, 2}, dtype::i32, -7.0);
    for (std::int64_t i = 0; i < n; ++i) keep.set({i, 1}, v[std::size_t(i)]);
    return TensorView(keep.data_as<std::int32_t>() + 1, dtype::i32, {n}, {2});
  }
  const std::int64_t r = i64.size(0), c = i64.size(1);
  keep = Tensor::full({r, 2 * c}, dtype::i32, -7.0);
  for (std::int64_t i = 0; i < r; ++i)
    for (std::int64_t j = 0; j < c; ++j) keep.set({i, 2 * j}, v[std::size_t(i * c + j)]);
  return TensorView(keep.data(), dtype::i32, {r, c}, {2 * c, 2});
}

// The same dtype and values (all_close with no tolerance: NaN where NaN).
void expect_same(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_EQ(a.type(), b.type()) << what;
  EXPECT_TRUE(testing::all_close(a, b, 0)) << what;
}

TEST(Int32Dtype, SizeNameAndConversions) {
  EXPECT_EQ(dtype_size(dtype::i32), 4u);
  EXPECT_EQ(dtype_name(dtype::i32), "int32");
  EXPECT_FALSE(is_floating(dtype::i32));
  const Tensor t = int32_tensor({2, 3}, {0, -1, 2147483647, -2147483648LL, 5, 6});
  EXPECT_EQ(t.get({0, 2}), 2147483647.0);
  EXPECT_EQ(t.get({1, 0}), -2147483648.0);
  const Tensor wide = t.to(dtype::i64);
  EXPECT_EQ(wide.data_as<std::int64_t>()[3], -2147483648LL);
  expect_same(wide.to(dtype::i32), t, "int64 -> int32");
  expect_same(Tensor::copy_of(t.view().transpose(0, 1)).to(dtype::f64),
              Tensor::from_values({3, 2}, dtype::f64, {0, -2147483648.0, -1, 5, 2147483647, 6}), "transposed to float64");
}

TEST(Int32Dtype, NpyAndSafetensorsRoundTrips) {
  const Tensor t = int32_tensor({2, 2}, {1, -2, 300000, -2147483648LL});
  const std::string dir = ::testing::TempDir();
  const std::string npy = dir + "/attn_int32.npy", st = dir + "/attn_int32.safetensors";
  write_npy(npy, t);
  const Tensor n = read_npy(npy);
  EXPECT_EQ(n.type(), dtype::i32);
  expect_same(n, t, "npy");
  write_safetensors(st, {{"idx", t.view()}});
  const safetensors_file f = read_safetensors(st);
  EXPECT_EQ(f.at("idx").type(), dtype::i32);
  expect_same(f.at("idx"), t, "safetensors");
  std::remove(npy.c_str());
  std::remove(st.c_str());
}

TEST(Int32Index, VarlenForwardAndBackwardAsInt64) {
  std::mt19937 rng(5);
  const std::vector<std::int64_t> cq{0, 3, 3, 10, 11}, ck{0, 5, 6, 6, 19};
  const std::int64_t Hq = 4, Hkv = 2, D = 8, Dv = 8;
  const Tensor q = random_tensor({cq.back(), Hq, D}, dtype::f32, rng), k = random_tensor({ck.back(), Hkv, D}, dtype::f32, rng);
  const Tensor v = random_tensor({ck.back(), Hkv, Dv}, dtype::f32, rng), dout = random_tensor({cq.back(), Hq, Dv}, dtype::f32, rng);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const Tensor q64 = index_tensor(cq), k64 = index_tensor(ck);
  const varlen_result want = attention_varlen(q, k, v, q64, k64, 7, 13, o);
  const varlen_grads wg = attention_varlen_backward(q, k, v, want.out, dout, want.lse, q64, k64, 7, 13, o);
  Tensor keep_q, keep_k;
  const TensorView q32s = strided_int32(q64, keep_q), k32s = strided_int32(k64, keep_k);
  const Tensor q32 = int32_tensor({5}, cq), k32 = int32_tensor({5}, ck);
  for (const auto& [cu_q, cu_k, name] : {std::tuple{q32.view(), k32.view(), "contiguous"}, std::tuple{q32s, k32s, "strided"}}) {
    SCOPED_TRACE(name);
    const varlen_result r = attention_varlen(q, k, v, cu_q, cu_k, 7, 13, o);
    expect_same(r.out, want.out, "out");
    expect_same(r.lse, want.lse, "lse");
    const varlen_grads g = attention_varlen_backward(q, k, v, r.out, dout, r.lse, cu_q, cu_k, 7, 13, o);
    expect_same(g.dq, wg.dq, "dq");
    expect_same(g.dk, wg.dk, "dk");
    expect_same(g.dv, wg.dv, "dv");
  }
  EXPECT_THROW_MSG(attention_varlen(q, k, v, int32_tensor({5}, {0, 3, 3, 10, 12}), k32, 7, 13, o),
                   "attention_varlen: cu_seqlens_q[4] = 12 but the packed tensor has 11 tokens");
}

TEST(Int32Index, PagedDecodeAppendAndMixedBatchAsInt64) {
  std::mt19937 rng(9);
  const std::int64_t B = 3, Hq = 4, Hkv = 2, D = 16, ps = 4, max_pages = 5, pages = 12;
  const std::vector<std::int64_t> table{7, 2, 9, 0, 0, 4, 11, 1, 0, 0, 3, 8, 5, 6, 10}, lens{10, 9, 17};
  const Tensor kp = random_tensor({pages, ps, Hkv, D}, dtype::bf16, rng), vp = random_tensor({pages, ps, Hkv, D}, dtype::bf16, rng);
  const Tensor q = random_tensor({B, Hq, 2, D}, dtype::bf16, rng);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const Tensor t64 = index_tensor({B, max_pages}, table), l64 = index_tensor({B}, lens);
  const attention_result want = attention_paged(q, {kp, vp, t64, l64}, o);
  Tensor keep_t, keep_l;
  const TensorView t32s = strided_int32(t64, keep_t), l32s = strided_int32(l64, keep_l);
  const Tensor t32 = int32_tensor({B, max_pages}, table), l32 = int32_tensor({B}, lens);
  for (const auto& [tab, len, name] : {std::tuple{t32.view(), l32.view(), "contiguous"}, std::tuple{t32s, l32s, "strided"}}) {
    SCOPED_TRACE(name);
    const attention_result r = attention_paged(q, {kp, vp, tab, len}, o);
    expect_same(r.out, want.out, "out");
    expect_same(r.lse, want.lse, "lse");
  }
  // A mixed batch (Nq 2, 0, 1) through int32 cu_seqlens and tables.
  const std::vector<std::int64_t> cu{0, 2, 2, 3};
  const Tensor qp = random_tensor({3, Hq, D}, dtype::bf16, rng);
  const varlen_result mv = attention_paged_varlen(qp, index_tensor(cu), 2, {kp, vp, t64, l64}, o);
  const varlen_result m32 = attention_paged_varlen(qp, int32_tensor({4}, cu), 2, {kp, vp, t32, l32}, o);
  expect_same(m32.out, mv.out, "mixed out");
  expect_same(m32.lse, mv.lse, "mixed lse");
  // Appending through int32 tables writes the rows int64 ones do.
  const Tensor kn = random_tensor({B, Hkv, 1, D}, dtype::bf16, rng);
  const Tensor ka = Tensor::copy_of(kp), va = Tensor::copy_of(vp), kb = Tensor::copy_of(kp), vb = Tensor::copy_of(vp);
  const std::vector<std::int64_t> before{3, 8, 16};
  paged_kv_append({ka, va, t64, index_tensor({B}, before)}, kn, kn);
  paged_kv_append({kb, vb, t32s, int32_tensor({B}, before)}, kn, kn);
  expect_same(kb, ka, "appended k pages");
  expect_same(vb, va, "appended v pages");
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, int32_tensor({B, max_pages}, {7, 2, 12, 0, 0, 4, 11, 1, 0, 0, 3, 8, 5, 6, 10}), l32}, o),
                   "attention_paged: block_table[0, 2] = 12 is outside [0, num_pages = 12)");
}

TEST(Int32Index, NonpadAndCacheLengthsAsInt64) {
  std::mt19937 rng(13);
  const Tensor q = random_tensor({2, 2, 3, 8}, dtype::f32, rng), k = random_tensor({2, 2, 6, 8}, dtype::f32, rng);
  attention_options o64, o32;
  o64.nonpad_kv_seqlen = index_tensor({4, 6});
  Tensor keep;
  o32.nonpad_kv_seqlen = strided_int32(index_tensor({4, 6}), keep);
  const attention_result a = attention(q, k, k, o64), b = attention(q, k, k, o32);
  expect_same(b.out, a.out, "nonpad out");
  const attention_grads ga = attention_backward(q, k, k, a.out, a.out, a.lse, o64);
  const attention_grads gb = attention_backward(q, k, k, b.out, b.out, b.lse, o32);
  expect_same(gb.dk, ga.dk, "nonpad dk");
  o32.nonpad_kv_seqlen = int32_tensor({2}, {4, 7});
  EXPECT_THROW_MSG(attention(q, k, k, o32), "nonpad_kv_seqlen[1] = 7 is outside [0, 6]");

  const Tensor kc = random_tensor({2, 2, 8, 8}, dtype::f32, rng), vc = random_tensor({2, 2, 8, 8}, dtype::f32, rng);
  const Tensor kn = random_tensor({2, 2, 1, 8}, dtype::f32, rng);
  const Tensor kc2 = Tensor::copy_of(kc), vc2 = Tensor::copy_of(vc);
  const attention_result c64 = attention_with_kv_cache(q.view().slice(2, 0, 1), kn, kn, {kc, vc, index_tensor({2}, {5, 0})});
  const attention_result c32 = attention_with_kv_cache(q.view().slice(2, 0, 1), kn, kn, {kc2, vc2, int32_tensor({2}, {5, 0})});
  expect_same(c32.out, c64.out, "kv cache out");
  expect_same(kc2, kc, "kv cache keys written");
}

TEST(Int32Index, OtherDtypesRefusedByMessage) {
  const Tensor q = Tensor::zeros({6, 2, 4}, dtype::f32);
  const Tensor cu = int32_tensor({3}, {0, 2, 6});
  EXPECT_THROW_MSG(attention_varlen(q, q, q, cu, Tensor::from_values({3}, dtype::i8, {0, 2, 6}), 8, 8),
                   "attention_varlen: cu_seqlens_k has dtype int8, expected int64 or int32");
  attention_options o;
  o.nonpad_kv_seqlen = Tensor::from_values({1}, dtype::f64, {2});
  EXPECT_THROW_MSG(attention(Tensor::zeros({1, 1, 2, 4}, dtype::f32), Tensor::zeros({1, 1, 3, 4}, dtype::f32),
                             Tensor::zeros({1, 1, 3, 4}, dtype::f32), o),
                   "attention: nonpad_kv_seqlen has dtype float64, expected int64 or int32");
  o.nonpad_kv_seqlen = int32_tensor({2}, {1, 1});
  EXPECT_THROW_MSG(attention(Tensor::zeros({1, 1, 2, 4}, dtype::f32), Tensor::zeros({1, 1, 3, 4}, dtype::f32),
                             Tensor::zeros({1, 1, 3, 4}, dtype::f32), o),
                   "attention: nonpad_kv_seqlen has shape [2], expected [B] = [1]");
  // An int32 tensor where a float is expected is refused, not read as floats.
  EXPECT_THROW_MSG(attention(Tensor::zeros({1, 1, 2, 4}, dtype::i32), Tensor::zeros({1, 1, 3, 4}, dtype::i32),
                             Tensor::zeros({1, 1, 3, 4}, dtype::i32)),
                   "attention: q has dtype int32, expected float32, float16, bfloat16 or float64");
}

}  // namespace
}  // namespace attn

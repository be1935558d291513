// tests/core/tensor_test.cc — dtypes, conversions, views and owning tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "test_util.h"

namespace attn {
namespace {

TEST(Dtype, SizesAndNames) {
  EXPECT_EQ(dtype_size(dtype::f32), 4u);
  EXPECT_EQ(dtype_size(dtype::bf16), 2u);
  EXPECT_EQ(dtype_size(dtype::i64), 8u);
  EXPECT_EQ(dtype_name(dtype::f16), "float16");
  EXPECT_EQ(dtype_name(dtype::boolean), "bool");
  EXPECT_FALSE(is_floating(dtype::i64));
}

TEST(Dtype, HalfRoundTripsEveryValue) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = f16_to_f32(std::uint16_t(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    EXPECT_EQ(f32_to_f16(f), std::uint16_t(h)) << "half bits " << h;
  }
}

TEST(Dtype, HalfRoundsToNearestEven) {
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048)), 1.0f);              // tie -> even
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);  // tie -> even (up)
  EXPECT_EQ(f16_to_f32(f32_to_f16(65519.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(65520.0f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -25))), 0.0f);                    // tie -> 0
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.5f, -25))), std::ldexp(1.0f, -24));
}

TEST(Dtype, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);  // tie -> even
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::infinity()))));
}

TEST(TensorView, ViewsShareMemory) {
  Tensor t = Tensor::from_values({2, 3}, dtype::f32, {0, 1, 2, 3, 4, 5});
  const TensorView tt = t.view().transpose(0, 1);
  EXPECT_EQ(tt.shape(), (Shape{3, 2}));
  EXPECT_EQ(tt.get({2, 1}), 5.0);
  EXPECT_FALSE(tt.is_contiguous());
  tt.set({0, 1}, 42);
  EXPECT_EQ(t.get({1, 0}), 42.0);
  const TensorView s = t.view().slice(1, 1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.get({1, 1}), 5.0);
  const Tensor row = Tensor::from_values({3}, dtype::f64, {7, 8, 9});
  const TensorView b = row.view().broadcast_to({4, 3});
  EXPECT_EQ(b.stride(0), 0);
  EXPECT_EQ(b.get({3, 2}), 9.0);
  const TensorView r = t.view().reshape({3, -1});
  EXPECT_EQ(r.shape(), (Shape{3, 2}));
  EXPECT_EQ(Tensor::copy_of(tt).to_vector(), (std::vector<double>{0, 42, 1, 4, 2, 5}));  // (0, 1) was set above
  EXPECT_EQ(t.view().permute({1, 0}).shape(), (Shape{3, 2}));
}

TEST(TensorView, ConversionsThroughCopy) {
  Tensor t = Tensor::from_values({2}, dtype::f64, {1.5, -2.25});
  EXPECT_EQ(t.to(dtype::bf16).to_vector(), (std::vector<double>{1.5, -2.25}));
  EXPECT_EQ(t.to(dtype::f16).to(dtype::f32).to_vector(), (std::vector<double>{1.5, -2.25}));
  EXPECT_EQ(Tensor::zeros({0, 3}, dtype::f32).numel(), 0);
  EXPECT_EQ(Tensor::zeros({2, 0, 3}, dtype::f32).view().reshape({2, 0, 1, 3}).shape(), (Shape{2, 0, 1, 3}));
  EXPECT_EQ(Tensor::full({2}, dtype::i64, 3).to_vector(), (std::vector<double>{3, 3}));
}

// copy_of between float dtypes converts a row at a time, typed: every element as the
// element-wise path gives it (through double: load_as_double, then store_from_double, which
// rounds to float before a 16-bit type), for every pair of float dtypes, contiguous, strided
// (a transpose and a slice) and broadcast views, with ±0, ±inf, NaN, values that round to ±inf
// in f16 and subnormals among them; rank 0 and empty views too.
TEST(TensorView, FloatConversionsAreElementWise) {
  const std::vector<dtype> floats = {dtype::f32, dtype::f64, dtype::f16, dtype::bf16};
  std::vector<double> vals;
  for (int i = 0; i < 3 * 5 * 7; ++i) vals.push_back(std::sin(0.37 * i) * std::pow(10.0, (i % 11) - 5));
  vals[3] = -0.0, vals[8] = std::numeric_limits<double>::infinity(), vals[9] = -vals[8];
  vals[10] = std::numeric_limits<double>::quiet_NaN(), vals[11] = 70000.0, vals[12] = 1e-41, vals[13] = 1.0 + 0x1p-30;
  const Tensor base = Tensor::from_values({3, 5, 7}, dtype::f64, vals);
  for (dtype from : floats) {
    const Tensor src = Tensor::copy_of(base, from);
    const std::vector<TensorView> views = {src.view(), src.view().transpose(0, 2), src.view().slice(1, 1, 4),
                                           src.view().slice(2, 2, 3).broadcast_to({3, 5, 4}), src.view().slice(0, 0, 0),
                                           src.view().slice(0, 1, 2).slice(1, 2, 3).slice(2, 4, 5).reshape({})};
    for (dtype to : floats)
      for (std::size_t w = 0; w < views.size(); ++w) {
        const TensorView& v = views[w];
        SCOPED_TRACE(std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)) + " view " + std::to_string(w));
        const Tensor got = Tensor::copy_of(v, to);
        ASSERT_EQ(got.shape(), v.shape());
        ASSERT_EQ(got.type(), to);
        const std::vector<double> in = to_vector(v);
        Tensor want = Tensor::empty(v.shape(), to);
        for (std::int64_t i = 0; i < want.numel(); ++i) store_from_double(want.data(), to, i, in[std::size_t(i)]);
        EXPECT_EQ(std::memcmp(got.data(), want.data(), std::size_t(want.numel()) * dtype_size(to)), 0);
      }
  }
}

TEST(TensorView, BadArgumentsThrowClearErrors) {
  Tensor t = Tensor::zeros({2, 3}, dtype::f32);
  EXPECT_THROW_MSG(t.view().transpose(0, 2), "tensor.transpose: dim 2 out of range for rank 2");
  EXPECT_THROW_MSG(t.view().reshape({4, 2}), "tensor.reshape: cannot view [2, 3] as [4, 2]");
  EXPECT_THROW_MSG(t.view().transpose(0, 1).reshape({6}), "is not contiguous");
  EXPECT_THROW_MSG(t.view().broadcast_to({2, 4}), "cannot broadcast [2, 3] to [2, 4]");
  EXPECT_THROW_MSG(t.view().slice(1, 2, 5), "tensor.slice: [2, 5) out of range for dim 1 of size 3");
  EXPECT_THROW_MSG(t.get({2, 0}), "index [2, 0] out of range for shape [2, 3]");
  EXPECT_THROW_MSG(t.view().permute({0, 0}), "tensor.permute: dim 0 repeated");
  EXPECT_THROW_MSG(Tensor::from_values({2}, dtype::f32, {1.0}), "1 values for shape [2] (2 elements)");
  EXPECT_THROW_MSG(TensorView(nullptr, dtype::f32, {2, -1}), "negative size in shape [2, -1]");
  EXPECT_THROW_MSG(TensorView(nullptr, dtype::f32, {2, 2}, {1}), "1 strides for shape [2, 2] of rank 2");
  // An undefined tensor (e.g. the gradient of a parameter not given) has no values to read.
  EXPECT_THROW_MSG(Tensor().to_vector(), "tensor.to_vector: the tensor is undefined");
  EXPECT_TRUE(Tensor::empty({0, 3}, dtype::f32).to_vector().empty());
}

// Buffers of 8 MiB or more go back to a bounded cache when freed and come out again for the next
// tensor of the same size (the same pages: no fault, no zeroing); smaller ones do not; zeros()
// still zeroes a reused buffer; the cache keeps at most 512 MiB, the most recent first, and
// release_cached_buffers() empties it.
TEST(Tensor, LargeBuffersAreReusedFromABoundedCache) {
  release_cached_buffers();
  ASSERT_EQ(cached_buffer_bytes(), 0u);
  const Shape big{3, 1024, 1024};  // 12 MiB of float32: kept as a 12 MiB block
  const void* first = nullptr;
  {
    Tensor t = Tensor::full(big, dtype::f32, 5.0);
    first = t.data();
  }
  EXPECT_EQ(cached_buffer_bytes(), std::size_t(12) << 20);
  {
    Tensor other = Tensor::empty({2, 1024, 1024}, dtype::f32);  // 8 MiB: another size, fresh
    EXPECT_NE(other.data(), first);
    Tensor again = Tensor::zeros(big, dtype::f32);
    EXPECT_EQ(again.data(), first);
    EXPECT_EQ(cached_buffer_bytes(), 0u);
    EXPECT_EQ(again.get({2, 1023, 1023}), 0.0);
  }
  EXPECT_EQ(cached_buffer_bytes(), std::size_t(20) << 20);  // both back
  {
    Tensor small = Tensor::empty({512, 256}, dtype::f32);  // 512 KiB: malloc's, never kept
  }
  EXPECT_EQ(cached_buffer_bytes(), std::size_t(20) << 20);
  {
    Tensor mid = Tensor::empty({1024, 1024}, dtype::f32);  // 4 MiB (1 MiB or more): kept too
  }
  EXPECT_EQ(cached_buffer_bytes(), std::size_t(24) << 20);
  // Freed one by one, each takes the block the one before left: one 32 MiB block kept.
  for (int i = 0; i < 20; ++i) Tensor::empty({8, 1024, 1024}, dtype::f32);
  EXPECT_EQ(cached_buffer_bytes(), std::size_t(56) << 20);
  // 20 of them alive at once, then freed: the cache keeps the 16 freed last (512 MiB), and the
  // 12, 8 and 4 MiB blocks of before are given back first.
  std::vector<Tensor> many;
  for (int i = 0; i < 20; ++i) many.push_back(Tensor::empty({8, 1024, 1024}, dtype::f32));
  const void* last = many.back().data();
  many.clear();
  EXPECT_EQ(cached_buffer_bytes(), std::size_t(512) << 20);
  EXPECT_EQ(Tensor::empty({8, 1024, 1024}, dtype::f32).data(), last);  // the most recent first
  EXPECT_EQ(release_cached_buffers(), std::size_t(512) << 20);
  EXPECT_EQ(cached_buffer_bytes(), 0u);
}

}  // namespace
}  // namespace attn

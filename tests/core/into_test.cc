// tests/core/into_test.cc — attention_into and attention_backward_into: outputs in the caller's
// memory (contiguous, slices of a larger buffer, dq/dk/dv interleaved in one packed buffer; float32
// gradients of 16-bit inputs) hold the same bits as attention() and attention_backward() on every
// backend and dtype, bytes outside
// them are untouched, special values take the same route, and bad destinations are refused by
// message. Also the overlap test (src/core/overlap.h) they rest on.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <limits>

#include "core/overlap.h"
#include "test_util.h"

namespace attn {
namespace {

using testing::random_tensor;

// Every element of a and b (same shape) has the same bits (NaN payloads included: both are read
// as doubles, NaN equal to NaN).
::testing::AssertionResult same_values(const TensorView& got, const TensorView& want) {
  if (got.shape() != want.shape())
    return ::testing::AssertionFailure() << "shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape());
  const auto g = to_vector(got), w = to_vector(want);
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))) || std::signbit(g[i]) != std::signbit(w[i]))
      return ::testing::AssertionFailure() << "at " << i << ": got " << g[i] << ", want " << w[i];
  return ::testing::AssertionSuccess();
}

// A buffer of `shape` filled with a sentinel, to see that what lies outside a destination stays.
Tensor sentinel(const Shape& shape, dtype t, double value = 7.25) {
  Tensor r = Tensor::empty(shape, t);
  for (std::int64_t i = 0; i < r.numel(); ++i) r.view().reshape({r.numel()}).set({i}, value);
  return r;
}

// Whether every element of `buf` outside the slice [lo, hi) of dim `dim` still holds value.
bool untouched_outside(const Tensor& buf, int dim, std::int64_t lo, std::int64_t hi, double value = 7.25) {
  for (std::int64_t s = 0; s < buf.size(dim); ++s) {
    if (s >= lo && s < hi) continue;
    for (double x : to_vector(buf.view().slice(dim, s, s + 1)))
      if (x != value) return false;
  }
  return true;
}

// (automatic: the cpu backend for float32, bfloat16 and float16; float64 runs on the reference)
const backend kBackends[] = {backend::reference, backend::automatic};

TEST(Into, ForwardContiguousMatchesAttention) {
  std::mt19937 rng(1);
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16, dtype::f64})
    for (backend be : kBackends)
      for (bool causal : {false, true}) {
        const Tensor q = random_tensor({2, 4, 37, 16}, t, rng), k = random_tensor({2, 2, 41, 16}, t, rng),
                     v = random_tensor({2, 2, 41, 24}, t, rng);
        attention_options o;
        o.is_causal = causal;
        const execution ex{.use_backend = be};
        const attention_result want = attention(q, k, v, o, ex);
        Tensor out = sentinel({2, 4, 37, 24}, t), lse = sentinel({2, 4, 37}, t == dtype::f64 ? t : dtype::f32);
        const std::string ran = attention_into(q, k, v, {.out = out, .lse = lse.view()}, o, ex);
        EXPECT_EQ(ran, want.backend);
        EXPECT_TRUE(same_values(out, want.out)) << dtype_name(t) << " " << ran << " causal " << causal;
        EXPECT_TRUE(same_values(lse, want.lse)) << dtype_name(t) << " " << ran << " causal " << causal;
      }
}

// out and lse as slices of larger buffers (a head-major [B, N, 2, Hq·Dv] block, an lse padded on
// its last dim): strided destinations, written in place, nothing beside them touched; lse left
// out: out alone.
TEST(Into, ForwardIntoSlicesOfLargerBuffers) {
  std::mt19937 rng(2);
  for (dtype t : {dtype::f32, dtype::bf16})
    for (backend be : kBackends) {
      // 3-D inputs [B, N, H·D] with 3 query heads, 1 kv head (GQA)
      const Tensor q = random_tensor({2, 19, 3 * 8}, t, rng), k = random_tensor({2, 23, 8}, t, rng),
                   v = random_tensor({2, 23, 12}, t, rng);
      attention_options o;
      o.q_num_heads = 3, o.kv_num_heads = 1, o.window_left = 5;
      const execution ex{.use_backend = be};
      const attention_result want = attention(q, k, v, o, ex);
      Tensor big = sentinel({2, 19, 2, 3 * 12}, t), lse_big = sentinel({2, 3, 19 + 5}, dtype::f32);
      const TensorView out_v = TensorView(big.data(), t, {2, 19, 36}, {19 * 72, 72, 1});  // slot 0
      const TensorView lse = lse_big.view().slice(2, 2, 2 + 19);
      attention_into(q, k, v, {.out = out_v, .lse = lse}, o, ex);
      EXPECT_TRUE(same_values(out_v, want.out)) << dtype_name(t);
      EXPECT_TRUE(same_values(lse, want.lse)) << dtype_name(t);
      EXPECT_TRUE(untouched_outside(big, 2, 0, 1));
      EXPECT_TRUE(untouched_outside(lse_big, 2, 2, 2 + 19));
      Tensor alone = sentinel({2, 19, 36}, t);
      attention_into(q, k, v, {.out = alone}, o, ex);
      EXPECT_TRUE(same_values(alone, want.out));
    }
}

// A float mask past ±1024 takes the shifted route (its lse kept in float64 until the shift goes
// back); NaN in q takes the cpu's special-row route to the reference: the same bits either way.
TEST(Into, ForwardSpecialRoutesMatch) {
  std::mt19937 rng(3);
  const Tensor q0 = random_tensor({1, 2, 9, 8}, dtype::f32, rng), k = random_tensor({1, 2, 11, 8}, dtype::f32, rng),
               v = random_tensor({1, 2, 11, 8}, dtype::f32, rng);
  Tensor q = Tensor::copy_of(q0);
  q.view().set({0, 1, 4, 3}, std::numeric_limits<double>::quiet_NaN());
  attention_options shifted;
  shifted.attn_mask = random_tensor({1, 2, 9, 11}, dtype::f32, rng, 1e6, 2e6);
  for (backend be : kBackends)
    for (const auto& [qq, o] : {std::pair{q0, shifted}, std::pair{q, attention_options{}}}) {
      const execution ex{.use_backend = be};
      const attention_result want = attention(qq, k, v, o, ex);
      Tensor out = sentinel({1, 2, 9, 8}, dtype::f32), lse_big = sentinel({1, 2, 9, 2}, dtype::f32);
      const TensorView lse(lse_big.data_as<float>() + 1, dtype::f32, {1, 2, 9}, {36, 18, 2});
      attention_into(qq, k, v, {.out = out, .lse = lse}, o, ex);
      EXPECT_TRUE(same_values(out, want.out));
      EXPECT_TRUE(same_values(lse, want.lse));
      EXPECT_TRUE(untouched_outside(lse_big, 3, 1, 2));
    }
}

// dq, dk, dv interleaved in one packed [B, N, 4, H·D] buffer (slot 3 unused): the bits of
// attention_backward, slot 3 untouched; with ALiBi its slopes' gradient comes back as before.
TEST(Into, BackwardIntoPackedBufferMatchesAttentionBackward) {
  std::mt19937 rng(4);
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f64})
    for (backend be : kBackends)
      for (bool causal : {false, true}) {
        const std::int64_t B = 2, N = 21, H = 4, D = 16;
        const Tensor q = random_tensor({B, N, H * D}, t, rng), k = random_tensor({B, N, H * D}, t, rng),
                     v = random_tensor({B, N, H * D}, t, rng);
        attention_options o;
        o.q_num_heads = H, o.kv_num_heads = H, o.is_causal = causal;
        o.alibi_slopes = random_tensor({H}, dtype::f32, rng, 0.0, 0.5);
        const execution ex{.use_backend = be};
        const attention_result f = attention(q, k, v, o, ex);
        const Tensor dout = random_tensor(f.out.shape(), t, rng);
        const attention_grads want = attention_backward(q, k, v, f.out, dout, f.lse, o, ex);
        Tensor packed = sentinel({B, N, 4, H * D}, t);
        const auto slot = [&](std::int64_t s) {
          return TensorView(static_cast<std::byte*>(packed.data()) + s * H * D * dtype_size(t), t, {B, N, H * D},
                            {N * 4 * H * D, 4 * H * D, 1});
        };
        const attention_grads g =
            attention_backward_into(q, k, v, f.out, dout, f.lse, {.dq = slot(0), .dk = slot(1), .dv = slot(2)}, o, ex);
        const std::string what = fmt::format("{} {} causal {}", dtype_name(t), want.backend, causal);
        EXPECT_EQ(g.backend, want.backend) << what;
        EXPECT_FALSE(g.dq.defined() && g.dq.numel() > 0) << what;
        EXPECT_TRUE(same_values(slot(0), want.dq)) << what;
        EXPECT_TRUE(same_values(slot(1), want.dk)) << what;
        EXPECT_TRUE(same_values(slot(2), want.dv)) << what;
        EXPECT_TRUE(same_values(g.dalibi_slopes, want.dalibi_slopes)) << what;
        EXPECT_TRUE(untouched_outside(packed, 2, 0, 3)) << what;
      }
}

// A non-finite gradient from the cpu backend is computed again by the reference into the same
// destinations: the bits of attention_backward (here dout holds an infinity).
TEST(Into, BackwardRerunOnReferenceWritesTheDestinations) {
  std::mt19937 rng(5);
  const Tensor q = random_tensor({1, 2, 13, 8}, dtype::f32, rng), k = random_tensor({1, 2, 13, 8}, dtype::f32, rng),
               v = random_tensor({1, 2, 13, 8}, dtype::f32, rng);
  const attention_result f = attention(q, k, v);
  Tensor dout = random_tensor(f.out.shape(), dtype::f32, rng);
  dout.view().set({0, 0, 3, 2}, std::numeric_limits<double>::infinity());
  const attention_grads want = attention_backward(q, k, v, f.out, dout, f.lse);
  ASSERT_EQ(want.backend, "reference");  // (the route under test)
  Tensor dq = sentinel(q.shape(), dtype::f32), dk = sentinel(k.shape(), dtype::f32), dv = sentinel(v.shape(), dtype::f32);
  const attention_grads g = attention_backward_into(q, k, v, f.out, dout, f.lse, {.dq = dq, .dk = dk, .dv = dv});
  EXPECT_EQ(g.backend, want.backend);
  EXPECT_TRUE(same_values(dq, want.dq));
  EXPECT_TRUE(same_values(dk, want.dk));
  EXPECT_TRUE(same_values(dv, want.dv));
}

// Float32 destinations for a 16-bit q (each of dq, dk, dv on its own): the gradients before their
// rounding — rounded to q's dtype, the bits attention_backward gives; on the reference, the
// float64 gradients of the same inputs rounded once to float32.
TEST(Into, BackwardIntoFloat32GradientsOf16BitInputs) {
  std::mt19937 rng(8);
  for (dtype t : {dtype::bf16, dtype::f16})
    for (backend be : kBackends)
      for (bool causal : {false, true}) {
        const std::int64_t B = 2, Hq = 4, Hkv = 2, Nq = 19, Nk = 23, D = 16, Dv = 8;
        const Tensor q = random_tensor({B, Hq, Nq, D}, t, rng), k = random_tensor({B, Hkv, Nk, D}, t, rng),
                     v = random_tensor({B, Hkv, Nk, Dv}, t, rng);
        attention_options o;
        o.is_causal = causal;
        const execution ex{.use_backend = be};
        const attention_result f = attention(q, k, v, o, ex);
        const Tensor dout = random_tensor(f.out.shape(), t, rng);
        const attention_grads want = attention_backward(q, k, v, f.out, dout, f.lse, o, ex);
        const std::string what = fmt::format("{} {} causal {}", dtype_name(t), want.backend, causal);
        // all three in float32; then dk alone in q's dtype, dq in a strided slice
        Tensor dq = Tensor::empty(q.shape(), dtype::f32), dk = Tensor::empty(k.shape(), dtype::f32),
               dv = Tensor::empty(v.shape(), dtype::f32);
        const attention_grads g = attention_backward_into(q, k, v, f.out, dout, f.lse, {.dq = dq, .dk = dk, .dv = dv}, o, ex);
        EXPECT_EQ(g.backend, want.backend) << what;
        EXPECT_TRUE(same_values(dq.to(t), want.dq)) << what;
        EXPECT_TRUE(same_values(dk.to(t), want.dk)) << what;
        EXPECT_TRUE(same_values(dv.to(t), want.dv)) << what;
        if (want.backend != "cuda") {  // (whose kernels write 16-bit gradients, widened)
          EXPECT_FALSE(same_values(dq, dq.to(t))) << what << ": dq holds only " << dtype_name(t) << " values";
          EXPECT_FALSE(same_values(dk, dk.to(t))) << what << ": dk holds only " << dtype_name(t) << " values";
        }
        Tensor wide = sentinel({B, Hq, Nq, 2 * D}, dtype::f32), dk16 = Tensor::empty(k.shape(), t);
        const TensorView dq_slice = wide.view().slice(3, D, 2 * D);
        attention_backward_into(q, k, v, f.out, dout, f.lse, {.dq = dq_slice, .dk = dk16, .dv = dv}, o, ex);
        EXPECT_TRUE(same_values(dq_slice, dq)) << what;
        EXPECT_TRUE(same_values(dk16, want.dk)) << what;
        EXPECT_TRUE(untouched_outside(wide, 3, D, 2 * D)) << what;
        if (be == backend::reference) {
          const attention_grads r = attention_backward(q.to(dtype::f64), k.to(dtype::f64), v.to(dtype::f64),
                                                       f.out.to(dtype::f64), dout.to(dtype::f64), f.lse, o, ex);
          EXPECT_TRUE(same_values(dq, r.dq.to(dtype::f32))) << what;
          EXPECT_TRUE(same_values(dk, r.dk.to(dtype::f32))) << what;
          EXPECT_TRUE(same_values(dv, r.dv.to(dtype::f32))) << what;
        }
      }
}

TEST(Into, BadDestinationsAreRefusedByMessage) {
  std::mt19937 rng(6);
  const Tensor q = random_tensor({1, 2, 5, 4}, dtype::f32, rng), k = random_tensor({1, 2, 6, 4}, dtype::f32, rng),
               v = random_tensor({1, 2, 6, 4}, dtype::f32, rng);
  Tensor out = Tensor::empty({1, 2, 5, 4}, dtype::f32), lse = Tensor::empty({1, 2, 5}, dtype::f32);
  EXPECT_THROW_MSG(attention_into(q, k, v, {.out = Tensor::empty({1, 2, 5, 3}, dtype::f32)}),
                   "attention_into: out has shape [1, 2, 5, 3], expected [1, 2, 5, 4]");
  EXPECT_THROW_MSG(attention_into(q, k, v, {.out = Tensor::empty({1, 2, 5, 4}, dtype::bf16)}),
                   "attention_into: out has dtype bfloat16, expected float32");
  EXPECT_THROW_MSG(attention_into(q, k, v, {.out = out, .lse = Tensor::empty({1, 2, 5}, dtype::f64).view()}),
                   "attention_into: lse has dtype float64, expected float32");
  EXPECT_THROW_MSG(attention_into(q, k, v, {.out = TensorView(nullptr, dtype::f32, {1, 2, 5, 4})}),
                   "attention_into: out has no data");
  EXPECT_THROW_MSG(attention_into(q, k, v, {.out = TensorView(out.data(), dtype::f32, {1, 2, 5, 4}, {40, 20, 4, 0})}),
                   "attention_into: out overlaps itself (strides [40, 20, 4, 0])");
  EXPECT_THROW_MSG(attention_into(q, k, v, {.out = q}), "attention_into: out shares memory with input q");
  EXPECT_THROW_MSG(attention_into(q, k, v, {.out = out, .lse = TensorView(out.data(), dtype::f32, {1, 2, 5})}),
                   "attention_into: out and lse share memory");
  attention_options past;
  past.past_key = k, past.past_value = v;
  EXPECT_THROW_MSG(attention_into(q, k, v, {.out = out}, past),
                   "attention_into: past_key/past_value are refused (their present is a new tensor): use attention()");
  attention_options qk;
  qk.return_qk = qk_output::scaled;
  EXPECT_THROW_MSG(attention_into(q, k, v, {.out = out}, qk), "attention_into: return_qk is refused: use attention()");
  // An input checked before the destinations keeps its own message.
  EXPECT_THROW_MSG(attention_into(q, random_tensor({1, 2, 6, 3}, dtype::f32, rng), v, {.out = out}),
                   "attention_into");

  const attention_result f = attention(q, k, v);
  Tensor dq = Tensor::empty(q.shape(), dtype::f32), dk = Tensor::empty(k.shape(), dtype::f32),
         dv = Tensor::empty(v.shape(), dtype::f32);
  EXPECT_THROW_MSG(attention_backward_into(q, k, v, f.out, f.out, f.lse, {.dq = dq, .dk = dq, .dv = dv}),
                   "attention_backward_into: dk has shape [1, 2, 5, 4], expected [1, 2, 6, 4]");
  EXPECT_THROW_MSG(attention_backward_into(q, k, v, f.out, f.out, f.lse, {.dq = dq, .dk = dk, .dv = dk}),
                   "attention_backward_into: dk and dv share memory");
  EXPECT_THROW_MSG(attention_backward_into(q, k, v, f.out, f.out, f.lse, {.dq = f.out, .dk = dk, .dv = dv}),
                   "attention_backward_into: dq shares memory with input out");
  EXPECT_THROW_MSG(attention_backward_into(q, k, v, f.out, f.out, f.lse,
                                           {.dq = dq, .dk = Tensor::empty(k.shape(), dtype::f64), .dv = dv}),
                   "attention_backward_into: dk has dtype float64, expected float32");
  EXPECT_THROW_MSG(attention_backward_into(q, k, v, f.out, f.out, f.lse,
                                           {.dq = dq, .dk = dk, .dv = Tensor::empty(v.shape(), dtype::bf16)}),
                   "attention_backward_into: dv has dtype bfloat16, expected float32");
  const Tensor qb = q.to(dtype::bf16), kb = k.to(dtype::bf16), vb = v.to(dtype::bf16);
  const attention_result fb = attention(qb, kb, vb);
  EXPECT_THROW_MSG(attention_backward_into(qb, kb, vb, fb.out, fb.out, fb.lse,
                                           {.dq = dq, .dk = Tensor::empty(k.shape(), dtype::f64), .dv = dv}),
                   "attention_backward_into: dk has dtype float64, expected bfloat16 or float32 (the dtype of q, or "
                   "float32 for a 16-bit q)");
  EXPECT_THROW_MSG(attention_backward_into(qb, kb, vb, fb.out, fb.out, fb.lse,
                                           {.dq = Tensor::empty(q.shape(), dtype::f16), .dk = dk, .dv = dv}),
                   "attention_backward_into: dq has dtype float16, expected bfloat16 or float32");
}

TEST(Overlap, SelfOverlapFollowsTheStrides) {
  float buf[64] = {};
  EXPECT_FALSE(detail::overlaps_itself(TensorView(buf, dtype::f32, {4, 4})));
  EXPECT_FALSE(detail::overlaps_itself(TensorView(buf, dtype::f32, {4, 4}, {1, 4})));      // transposed
  EXPECT_FALSE(detail::overlaps_itself(TensorView(buf, dtype::f32, {3, 4}, {16, 2})));     // gaps
  EXPECT_FALSE(detail::overlaps_itself(TensorView(buf, dtype::f32, {1, 4}, {0, 1})));      // size-1 dim, stride 0
  EXPECT_TRUE(detail::overlaps_itself(TensorView(buf, dtype::f32, {2, 4}, {0, 1})));       // broadcast
  EXPECT_TRUE(detail::overlaps_itself(TensorView(buf, dtype::f32, {4, 4}, {2, 1})));       // rows overlap
  EXPECT_TRUE(detail::overlaps_itself(TensorView(buf, dtype::f32, {2, 2, 2}, {4, 4, 1})));  // two dims, one stride
}

TEST(Overlap, SlicesOfOneBufferAreExact) {
  float buf[4 * 3 * 5] = {};
  // [4, 3, 5]: the three slices of dim 1 interleave without sharing an element
  const auto slot = [&](std::int64_t s, std::int64_t n = 5) { return TensorView(buf + s * 5, dtype::f32, {4, n}, {15, 1}); };
  EXPECT_FALSE(detail::may_share_memory(slot(0), slot(1)));
  EXPECT_FALSE(detail::may_share_memory(slot(2), slot(0)));
  EXPECT_TRUE(detail::may_share_memory(slot(1), slot(1)));
  EXPECT_TRUE(detail::may_share_memory(slot(0, 6), slot(1)));  // six columns reach the next slot
  EXPECT_TRUE(detail::may_share_memory(TensorView(buf + 1, dtype::f32, {4, 5}, {15, 1}), slot(0)));
  // strides of their own: rows of one against a column of the other
  EXPECT_TRUE(detail::may_share_memory(TensorView(buf, dtype::f32, {4}, {15}), TensorView(buf + 15, dtype::f32, {5})));
  EXPECT_FALSE(detail::may_share_memory(TensorView(buf + 1, dtype::f32, {4}, {15}), TensorView(buf + 16 + 1, dtype::f32, {3})));
  // apart, empty, another dtype over the same bytes, bases not a whole element apart
  EXPECT_FALSE(detail::may_share_memory(TensorView(buf, dtype::f32, {10}), TensorView(buf + 10, dtype::f32, {10})));
  EXPECT_FALSE(detail::may_share_memory(TensorView(buf, dtype::f32, {0}), TensorView(buf, dtype::f32, {10})));
  EXPECT_TRUE(detail::may_share_memory(slot(0), TensorView(buf + 5, dtype::i64, {2, 5})));
  EXPECT_TRUE(detail::may_share_memory(slot(0), TensorView(reinterpret_cast<std::byte*>(buf) + 22, dtype::f32, {2})));
}

}  // namespace
}  // namespace attn

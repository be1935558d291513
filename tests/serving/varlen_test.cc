// tests/serving/varlen_test.cc — attention_varlen equals attn::attention run on each packed
// sequence alone (out, lse, dq, dk, dv, dalibi, dsinks), with lengths 0 and 1, causal with
// bottom-right and top-left alignment, windows, softcap, GQA, ALiBi, sinks, on the cpu backend
// (f32, bf16) and the reference (f64); packed masks (bool and float, shared by the heads or per
// head, and the float mask's gradient) as each sequence's block given to attention(); bad
// cu_seqlens and bad masks by message; HF-style finfo.min rows and the backward's fallbacks to
// the float64 reference per sequence, as attention_backward takes them.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <array>
#include <limits>
#include <random>

#include "attn/attn.h"
#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::index_tensor;
using testing::random_tensor;

std::vector<std::int64_t> cumulative(const std::vector<std::int64_t>& lens) {
  std::vector<std::int64_t> cu{0};
  for (std::int64_t n : lens) cu.push_back(cu.back() + n);
  return cu;
}

// Rows [r0, r0 + n) of token-major [T, H, X] as a contiguous [1, H, n, X].
Tensor seq(const TensorView& t, std::int64_t r0, std::int64_t n) {
  const Tensor c = Tensor::copy_of(t.slice(0, r0, r0 + n).permute({1, 0, 2}));
  return Tensor::copy_of(c.view().reshape({1, t.size(1), n, t.size(2)}));
}

struct varlen_case {
  const char* name;
  std::vector<std::int64_t> lq, lk;
  std::int64_t Hq, Hkv;
  bool causal;
  causal_alignment align;
  std::int64_t wl, wr;
  double softcap;
  bool alibi, sinks;
};

const varlen_case kCases[] = {
    {"plain", {5, 0, 1, 7, 3}, {9, 4, 1, 0, 3}, 2, 2, false, causal_alignment::top_left, -1, -1, 0, false, false},
    {"causal_bottom_right_gqa", {5, 0, 1, 7, 3, 12}, {9, 4, 1, 0, 3, 12}, 4, 2, true, causal_alignment::bottom_right,
     -1, -1, 0, false, false},
    {"causal_top_left", {6, 1, 4}, {6, 3, 9}, 2, 1, true, causal_alignment::top_left, -1, -1, 0, false, false},
    {"window_softcap_mqa", {8, 2, 0, 11}, {10, 2, 5, 11}, 3, 1, true, causal_alignment::bottom_right, 3, 0, 5.0, false,
     false},
    {"alibi_sinks", {4, 1, 6, 0}, {7, 1, 6, 2}, 4, 2, true, causal_alignment::bottom_right, -1, -1, 0, true, true},
};

// Names the case in gtest's output instead of dumping its bytes.
void PrintTo(const varlen_case& c, std::ostream* os) { *os << c.name; }

class Varlen : public ::testing::TestWithParam<std::tuple<varlen_case, dtype>> {};

TEST_P(Varlen, EqualsEachSequenceAlone) {
  const auto& [c, type] = GetParam();
  std::mt19937 rng(11);
  const std::int64_t B = std::int64_t(c.lq.size()), D = 8, Dv = 6;
  const auto cq = cumulative(c.lq), ck = cumulative(c.lk);
  const Tensor q = random_tensor({cq.back(), c.Hq, D}, type, rng);
  const Tensor k = random_tensor({ck.back(), c.Hkv, D}, type, rng);
  const Tensor v = random_tensor({ck.back(), c.Hkv, Dv}, type, rng);
  const Tensor dout = random_tensor({cq.back(), c.Hq, Dv}, type, rng);
  attention_options o;
  o.is_causal = c.causal, o.alignment = c.align, o.window_left = c.wl, o.window_right = c.wr, o.softcap = c.softcap;
  if (c.alibi) o.alibi_slopes = random_tensor({B, c.Hq}, dtype::f64, rng, 0.1, 0.9);
  if (c.sinks) o.sinks = random_tensor({c.Hq}, dtype::f64, rng);
  const Tensor cu_q = index_tensor(cq), cu_k = index_tensor(ck);
  const std::int64_t mq = *std::max_element(c.lq.begin(), c.lq.end());
  const std::int64_t mk = *std::max_element(c.lk.begin(), c.lk.end());

  const varlen_result r = attention_varlen(q, k, v, cu_q, cu_k, mq, mk, o);
  ASSERT_EQ(r.out.shape(), (Shape{cq.back(), c.Hq, Dv}));
  ASSERT_EQ(r.lse.shape(), (Shape{c.Hq, cq.back()}));
  const varlen_grads g = attention_varlen_backward(q, k, v, r.out, dout, r.lse, cu_q, cu_k, mq, mk, o);

  const double tol = testing::tolerance_for(type) * 4;
  Tensor dsinks_sum = Tensor::zeros({c.Hq}, dtype::f64);
  for (std::int64_t b = 0; b < B; ++b) {
    SCOPED_TRACE(fmt::format("{} sequence {} (Nq {}, Nk {})", c.name, b, c.lq[b], c.lk[b]));
    attention_options ob = o;
    if (c.alibi) ob.alibi_slopes = Tensor::copy_of(o.alibi_slopes->slice(0, b, b + 1).reshape({c.Hq}));
    const Tensor qb = seq(q, cq[b], c.lq[b]), kb = seq(k, ck[b], c.lk[b]), vb = seq(v, ck[b], c.lk[b]);
    const attention_result want = attention(qb, kb, vb, ob);
    EXPECT_TRUE(all_close(seq(r.out, cq[b], c.lq[b]), want.out, tol));
    const Tensor lse_b = Tensor::copy_of(Tensor::copy_of(r.lse.view().slice(1, cq[b], cq[b + 1])).view().reshape({1, c.Hq, c.lq[b]}));
    EXPECT_TRUE(all_close(lse_b, want.lse, tol));
    if (c.lq[b] == 0) {  // nothing depends on this sequence's keys
      for (double x : to_vector(seq(g.dk, ck[b], c.lk[b]))) EXPECT_EQ(x, 0.0);
      continue;
    }
    const attention_grads wg = attention_backward(qb, kb, vb, want.out, seq(dout, cq[b], c.lq[b]), want.lse, ob);
    EXPECT_TRUE(all_close(seq(g.dq, cq[b], c.lq[b]), wg.dq, tol));
    EXPECT_TRUE(all_close(seq(g.dk, ck[b], c.lk[b]), wg.dk, tol));
    EXPECT_TRUE(all_close(seq(g.dv, ck[b], c.lk[b]), wg.dv, tol));
    if (c.alibi) {
      EXPECT_TRUE(all_close(Tensor::copy_of(g.dalibi_slopes.view().slice(0, b, b + 1).reshape({c.Hq})),
                            wg.dalibi_slopes.to(dtype::f64), tol));
    }
    if (c.sinks) {
      for (std::int64_t h = 0; h < c.Hq; ++h) dsinks_sum.data_as<double>()[h] += wg.dsinks.get({h});
    }
  }
  if (c.sinks) {
    EXPECT_TRUE(all_close(g.dsinks.to(dtype::f64), dsinks_sum, tol));
  }
  // Sequences with no keys: zero rows and lse -inf (no sinks) — never NaN.
  for (std::int64_t b = 0; b < B; ++b) {
    if (c.lk[b] != 0 || c.sinks) continue;
    for (std::int64_t i = cq[b]; i < cq[b + 1]; ++i) EXPECT_EQ(r.lse.get({0, i}), -INFINITY);
  }
  EXPECT_FALSE(testing::any_nan(r.out));
}

INSTANTIATE_TEST_SUITE_P(Cases, Varlen,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(dtype::f32, dtype::f64, dtype::bf16)),
                         [](const auto& info) {
                           return fmt::format("{}_{}", std::get<0>(info.param).name,
                                              dtype_name(std::get<1>(info.param)));
                         });

// Strided inputs (q a transposed view) and a thread count of 1 give the same result as contiguous.
TEST(VarlenViews, StridedPackedInputs) {
  std::mt19937 rng(3);
  const std::vector<std::int64_t> cq{0, 3, 3, 10};
  const Tensor hq = random_tensor({2, 10, 8}, dtype::f32, rng);  // [Hq, total, D]
  const TensorView q = hq.view().permute({1, 0, 2});
  const Tensor k = random_tensor({10, 1, 8}, dtype::f32, rng), v = random_tensor({10, 1, 8}, dtype::f32, rng);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const auto a = attention_varlen(q, k, v, index_tensor(cq), index_tensor(cq), 7, 7, o, {.num_threads = 1});
  const auto b = attention_varlen(Tensor::copy_of(q), k, v, index_tensor(cq), index_tensor(cq), 7, 7, o);
  EXPECT_TRUE(all_close(a.out, b.out, 0, 0));
  EXPECT_TRUE(all_close(a.lse, b.lse, 0, 0));
}

// A large sequence (all threads inside one call) next to small ones (side by side, one thread
// each): the same bits for any thread count, forward and backward, and the large one as alone.
TEST(VarlenViews, LargeAndSmallSequencesAnyThreadCount) {
  std::mt19937 rng(9);
  const std::vector<std::int64_t> cq{0, 1100, 1103, 1103, 1153};
  const std::int64_t T = cq.back();
  const Tensor q = random_tensor({T, 2, 8}, dtype::f32, rng), k = random_tensor({T, 2, 8}, dtype::f32, rng);
  const Tensor v = random_tensor({T, 2, 8}, dtype::f32, rng), dout = random_tensor({T, 2, 8}, dtype::f32, rng);
  const Tensor cu = index_tensor(cq);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const auto a = attention_varlen(q, k, v, cu, cu, 1100, 1100, o);
  const auto b = attention_varlen(q, k, v, cu, cu, 1100, 1100, o, {.num_threads = 1});
  EXPECT_TRUE(all_close(a.out, b.out, 0, 0));
  EXPECT_TRUE(all_close(a.lse, b.lse, 0, 0));
  const auto ga = attention_varlen_backward(q, k, v, a.out, dout, a.lse, cu, cu, 1100, 1100, o);
  const auto gb = attention_varlen_backward(q, k, v, a.out, dout, a.lse, cu, cu, 1100, 1100, o, {.num_threads = 1});
  EXPECT_TRUE(all_close(ga.dq, gb.dq, 0, 0));
  EXPECT_TRUE(all_close(ga.dk, gb.dk, 0, 0));
  EXPECT_TRUE(all_close(ga.dv, gb.dv, 0, 0));
  const attention_result alone = attention(seq(q, 0, 1100), seq(k, 0, 1100), seq(v, 0, 1100), o);
  EXPECT_TRUE(all_close(seq(a.out, 0, 1100), alone.out, 0, 0));
}

// Packed q, k, v [12, 2, 8] — sequences of 4, 5 and 3 tokens (cu_seqlens kSpecialCu) — with a
// query of sequence 1 and a key of it at ±3e19 (q·k past float32's range; `alternate`: signs
// alternating over d, so that the terms cancel) and a NaN in a value row of sequence 2.
const std::vector<std::int64_t> kSpecialCu{0, 4, 9, 12};
std::array<Tensor, 3> special_batch(std::mt19937& rng, bool alternate, dtype type = dtype::f32) {
  Tensor q = random_tensor({12, 2, 8}, type, rng), k = random_tensor({12, 2, 8}, type, rng);
  Tensor v = random_tensor({12, 2, 8}, type, rng);
  for (std::int64_t d = 0; d < 8; ++d) q.set({5, 1, d}, alternate && d % 2 == 0 ? -3e19 : 3e19), k.set({6, 1, d}, 2e19);
  v.set({10, 0, 3}, std::numeric_limits<double>::quiet_NaN());
  return {q, k, v};
}

// Special values as attn::attention gives them: a query whose q·k overflows float32 (scores of
// ±inf on the cpu backend, finite in float64) and a NaN in a value row are answered per sequence
// as attention() on that sequence alone answers them (the front's check of special rows).
TEST(VarlenViews, SpecialValuesAsAttention) {
  std::mt19937 rng(13);
  const std::vector<std::int64_t>& cq = kSpecialCu;
  const auto [q, k, v] = special_batch(rng, false);
  const Tensor cu = index_tensor(cq);
  attention_options o;
  const auto r = attention_varlen(q, k, v, cu, cu, 5, 5, o, {.num_threads = 2});
  for (std::size_t s = 0; s + 1 < cq.size(); ++s) {
    const std::int64_t r0 = cq[s], n = cq[s + 1] - cq[s];
    const attention_result alone = attention(seq(q, r0, n), seq(k, r0, n), seq(v, r0, n), o);
    EXPECT_TRUE(all_close(seq(r.out, r0, n), alone.out, 1e-6, 1e-6)) << "sequence " << s;
  }
}

// ---- packed masks (FlashInfer's custom_mask layout) ----

// A packed mask over sequences of lq[b] queries and lk[b] keys: [S] (layout 0), [1, S] (1) or
// [Hq, S] (2); bool with about a quarter false, or float in [-2, 2] with about a fifth -inf.
// Row 0 of the first sequence with keys is fully masked (its output rows are zeros).
Tensor packed_mask(const std::vector<std::int64_t>& lq, const std::vector<std::int64_t>& lk, std::int64_t Hq, int layout,
                   bool boolean, std::mt19937& rng) {
  std::int64_t S = 0;
  for (std::size_t b = 0; b < lq.size(); ++b) S += lq[b] * lk[b];
  const std::int64_t H = layout == 2 ? Hq : 1;
  Tensor m = boolean ? Tensor::empty({H, S}, dtype::boolean) : Tensor::empty({H, S}, dtype::f32);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < S; ++i)
      m.set({h, i}, boolean ? double(u(rng) < 0.75) : (u(rng) < 0.2 ? -INFINITY : 4.0 * u(rng) - 2.0));
  std::int64_t off = 0;
  for (std::size_t b = 0; b < lq.size(); ++b) {
    if (lq[b] > 0 && lk[b] > 0) {
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t j = 0; j < lk[b]; ++j) m.set({h, off + j}, boolean ? 0.0 : -INFINITY);
      break;
    }
    off += lq[b] * lk[b];
  }
  if (layout == 0) return Tensor::copy_of(m.view().reshape({S}));
  return m;
}

// Sequence b's block of a packed mask as attention() takes it: [nq, nk] or [H, nq, nk].
Tensor mask_block(const Tensor& m, std::int64_t off, std::int64_t nq, std::int64_t nk) {
  if (m.view().rank() == 1) return Tensor::copy_of(Tensor::copy_of(m.view().slice(0, off, off + nq * nk)).view().reshape({nq, nk}));
  const std::int64_t H = m.view().size(0);
  return Tensor::copy_of(Tensor::copy_of(m.view().slice(1, off, off + nq * nk)).view().reshape({H, nq, nk}));
}

// Packed q, k, v and dout over sequences of lq[b] queries and lk[b] keys.
struct packed_batch {
  std::vector<std::int64_t> lq, lk, cq, ck;
  std::int64_t Hq;
  Tensor q, k, v, dout;
};
packed_batch random_batch(std::vector<std::int64_t> lq, std::vector<std::int64_t> lk, std::int64_t Hq, std::int64_t Hkv,
                          std::int64_t D, std::int64_t Dv, dtype type, std::mt19937& rng) {
  packed_batch x{lq, lk, cumulative(lq), cumulative(lk), Hq, {}, {}, {}, {}};
  x.q = random_tensor({x.cq.back(), Hq, D}, type, rng);
  x.k = random_tensor({x.ck.back(), Hkv, D}, type, rng);
  x.v = random_tensor({x.ck.back(), Hkv, Dv}, type, rng);
  x.dout = random_tensor({x.cq.back(), Hq, Dv}, type, rng);
  return x;
}

// The varlen forward (r) and backward (g) of x under o equal attention() and
// attention_backward() on each sequence with its block of o.attn_mask, within tol: out, lse, dq,
// dk, dv, and a float mask's gradient block by block.
void expect_each_sequence_as_attention(const packed_batch& x, const attention_options& o, const varlen_result& r,
                                       const varlen_grads& g, double tol) {
  const Tensor mask = Tensor::copy_of(*o.attn_mask);
  std::int64_t off = 0;
  for (std::size_t b = 0; b < x.lq.size(); ++b) {
    const std::int64_t nq = x.lq[b], nk = x.lk[b], q0 = x.cq[b], k0 = x.ck[b];
    SCOPED_TRACE(fmt::format("sequence {} (Nq {}, Nk {})", b, nq, nk));
    attention_options ob = o;
    ob.attn_mask = mask_block(mask, off, nq, nk);
    const Tensor qb = seq(x.q, q0, nq), kb = seq(x.k, k0, nk), vb = seq(x.v, k0, nk);
    if (nq > 0) {
      const attention_result want = attention(qb, kb, vb, ob);
      EXPECT_TRUE(all_close(seq(r.out, q0, nq), want.out, tol));
      const Tensor lse_b = Tensor::copy_of(Tensor::copy_of(r.lse.view().slice(1, q0, q0 + nq)).view().reshape({1, x.Hq, nq}));
      EXPECT_TRUE(all_close(lse_b, want.lse, tol));
      const attention_grads wg = attention_backward(qb, kb, vb, want.out, seq(x.dout, q0, nq), want.lse, ob);
      EXPECT_TRUE(all_close(seq(g.dq, q0, nq), wg.dq, tol));
      EXPECT_TRUE(all_close(seq(g.dk, k0, nk), wg.dk, tol));
      EXPECT_TRUE(all_close(seq(g.dv, k0, nk), wg.dv, tol));
      if (mask.type() != dtype::boolean && nk > 0) {
        EXPECT_TRUE(all_close(mask_block(g.dattn_mask, off, nq, nk), wg.dattn_mask, tol));
      }
    }
    off += nq * nk;
  }
}

// attention_varlen and its backward on x, causal bottom-right, under the attn_mask `mask`.
struct varlen_run {
  attention_options o;
  varlen_result r;
  varlen_grads g;
};
varlen_run run_masked(const packed_batch& x, const Tensor& mask, std::int64_t max_len) {
  varlen_run v;
  v.o.is_causal = true, v.o.alignment = causal_alignment::bottom_right;
  v.o.attn_mask = mask;
  const Tensor cu_q = index_tensor(x.cq), cu_k = index_tensor(x.ck);
  v.r = attention_varlen(x.q, x.k, x.v, cu_q, cu_k, max_len, max_len, v.o);
  v.g = attention_varlen_backward(x.q, x.k, x.v, v.r.out, x.dout, v.r.lse, cu_q, cu_k, max_len, max_len, v.o);
  return v;
}

const char* layout_name(int layout) { return layout == 0 ? "S" : layout == 1 ? "1xS" : "HqxS"; }

class VarlenMask : public ::testing::TestWithParam<std::tuple<int, bool, dtype>> {};

// Forward (out, lse) and backward (dq, dk, dv, and a float mask's gradient in the packed shape)
// equal attention() and attention_backward() on each sequence with its block of the mask; GQA,
// causal bottom-right, sequences with no queries, no keys, one of each.
TEST_P(VarlenMask, EqualsEachSequenceWithItsBlock) {
  const auto& [layout, boolean, type] = GetParam();
  std::mt19937 rng(17);
  const packed_batch x = random_batch({5, 0, 1, 7, 3, 12}, {9, 4, 1, 0, 3, 12}, 4, 2, 8, 6, type, rng);
  const std::int64_t Hq = 4, Dv = 6;
  const Tensor mask = packed_mask(x.lq, x.lk, Hq, layout, boolean, rng);
  const auto [o, r, g] = run_masked(x, mask, 12);
  ASSERT_EQ(g.dattn_mask.defined(), !boolean);
  if (!boolean) {
    ASSERT_EQ(g.dattn_mask.shape(), mask.shape());
    ASSERT_EQ(g.dattn_mask.type(), mask.type());
  }
  expect_each_sequence_as_attention(x, o, r, g, testing::tolerance_for(type) * 4);
  // The fully masked row (sequence 0, row 0): zeros and lse -inf, never NaN.
  for (std::int64_t h = 0; h < Hq; ++h) {
    EXPECT_EQ(r.lse.get({h, 0}), -INFINITY);
    for (std::int64_t d = 0; d < Dv; ++d) EXPECT_EQ(r.out.get({0, h, d}), 0.0);
  }
  EXPECT_FALSE(testing::any_nan(r.out));
}

INSTANTIATE_TEST_SUITE_P(Layouts, VarlenMask,
                         ::testing::Combine(::testing::Values(0, 1, 2), ::testing::Bool(),
                                            ::testing::Values(dtype::f32, dtype::f64, dtype::bf16)),
                         [](const auto& info) {
                           return fmt::format("{}_{}_{}", layout_name(std::get<0>(info.param)),
                                              std::get<1>(info.param) ? "bool" : "float",
                                              dtype_name(std::get<2>(info.param)));
                         });

// A packed mask that sets nothing (all true) gives the bits of no mask; with one thread too.
TEST(VarlenMaskViews, AllTrueEqualsNoMask) {
  std::mt19937 rng(19);
  const std::vector<std::int64_t> cq{0, 3, 40, 41};
  const Tensor q = random_tensor({41, 2, 8}, dtype::f32, rng), k = random_tensor({41, 2, 8}, dtype::f32, rng);
  const Tensor cu = index_tensor(cq);
  attention_options o;
  o.is_causal = true;
  const auto plain = attention_varlen(q, k, k, cu, cu, 37, 37, o);
  o.attn_mask = Tensor::full({9 + 37 * 37 + 1}, dtype::boolean, 1.0);
  for (int nt : {1, 2}) {
    const auto masked = attention_varlen(q, k, k, cu, cu, 37, 37, o, {.num_threads = nt});
    EXPECT_TRUE(all_close(masked.out, plain.out, 0, 0));
    EXPECT_TRUE(all_close(masked.lse, plain.lse, 0, 0));
  }
}

// Strided packed masks — every other element of a longer buffer ([S] with stride 2), and [Hq, S]
// as the transpose of an [S, Hq] tensor — give the bits of their contiguous copies, dattn_mask too.
TEST(VarlenMaskViews, StridedMasksAsContiguous) {
  std::mt19937 rng(29);
  const std::vector<std::int64_t> lq{3, 5, 2}, lk{4, 6, 2};
  const auto cq = cumulative(lq), ck = cumulative(lk);
  const std::int64_t S = 3 * 4 + 5 * 6 + 2 * 2, Hq = 2;
  const Tensor q = random_tensor({cq.back(), Hq, 8}, dtype::f32, rng), k = random_tensor({ck.back(), 1, 8}, dtype::f32, rng);
  const Tensor dout = random_tensor({cq.back(), Hq, 8}, dtype::f32, rng);
  const Tensor cu_q = index_tensor(cq), cu_k = index_tensor(ck);
  const Tensor wide = random_tensor({2 * S}, dtype::f32, rng, -2.0, 2.0);
  const Tensor sh = random_tensor({S, Hq}, dtype::f32, rng, -2.0, 2.0);
  const TensorView strided[] = {TensorView(wide.data(), dtype::f32, {S}, {2}), sh.view().permute({1, 0})};
  for (const TensorView& m : strided) {
    SCOPED_TRACE(shape_str(m.shape()));
    attention_options o, oc;
    o.attn_mask = m;
    oc.attn_mask = Tensor::copy_of(m);
    const auto a = attention_varlen(q, k, k, cu_q, cu_k, 5, 6, o), b = attention_varlen(q, k, k, cu_q, cu_k, 5, 6, oc);
    EXPECT_TRUE(all_close(a.out, b.out, 0, 0));
    EXPECT_TRUE(all_close(a.lse, b.lse, 0, 0));
    const auto ga = attention_varlen_backward(q, k, k, a.out, dout, a.lse, cu_q, cu_k, 5, 6, o);
    const auto gb = attention_varlen_backward(q, k, k, b.out, dout, b.lse, cu_q, cu_k, 5, 6, oc);
    EXPECT_TRUE(all_close(ga.dq, gb.dq, 0, 0));
    EXPECT_TRUE(all_close(ga.dk, gb.dk, 0, 0));
    EXPECT_TRUE(all_close(ga.dattn_mask, gb.dattn_mask, 0, 0));
  }
}

// The backward's guards per sequence, as attention_backward applies them: q·k terms past ±1024
// (sequence 1) run on the float64 reference, and non-finite gradients (the NaN of sequence 2) are
// computed again by it (the float mask's gradient zeroed first); the rest stay on the cpu
// backend. Each sequence's gradients equal attention_backward's on it alone, bit for bit, and
// that call names the backend the case expects.
TEST(VarlenViews, SpecialValuesBackwardAsAttention) {
  // float32 with a float mask (its gradient too); bfloat16 without one, so that the NaN is seen
  // only in dq, dk and dv, converted stores the front scans itself, row by row, through each
  // sequence's strided view of the packed gradients
  for (const bool masked : {true, false}) {
    const dtype type = masked ? dtype::f32 : dtype::bf16;
    SCOPED_TRACE(dtype_name(type));
    std::mt19937 rng(31);
    const std::vector<std::int64_t>& cq = kSpecialCu;
    const auto [q, k, v] = special_batch(rng, true, type);
    const Tensor dout = random_tensor({12, 2, 8}, type, rng);
    const Tensor cu = index_tensor(cq);
    const std::int64_t offs[] = {0, 16, 41};  // the blocks of the packed mask (4·4, 5·5, 3·3)
    const Tensor mask = random_tensor({50}, dtype::f32, rng, -1.0, 1.0);
    attention_options o;
    o.is_causal = true;
    if (masked) o.attn_mask = mask;
    for (int nt : {1, 2}) {
      SCOPED_TRACE(fmt::format("{} threads", nt));
      const auto r = attention_varlen(q, k, v, cu, cu, 5, 5, o, {.num_threads = nt});
      const auto g = attention_varlen_backward(q, k, v, r.out, dout, r.lse, cu, cu, 5, 5, o, {.num_threads = nt});
      for (std::size_t s = 0; s + 1 < cq.size(); ++s) {
        SCOPED_TRACE(fmt::format("sequence {}", s));
        const std::int64_t r0 = cq[s], n = cq[s + 1] - cq[s];
        const Tensor qb = seq(q, r0, n), kb = seq(k, r0, n), vb = seq(v, r0, n);
        attention_options ob = o;
        if (masked) ob.attn_mask = mask_block(mask, offs[s], n, n);
        const attention_result a = attention(qb, kb, vb, ob);
        const attention_grads w = attention_backward(qb, kb, vb, a.out, seq(dout, r0, n), a.lse, ob);
        EXPECT_EQ(w.backend, s == 0 ? "cpu" : "reference");
        EXPECT_TRUE(all_close(seq(g.dq, r0, n), w.dq, 0, 0));
        EXPECT_TRUE(all_close(seq(g.dk, r0, n), w.dk, 0, 0));
        EXPECT_TRUE(all_close(seq(g.dv, r0, n), w.dv, 0, 0));
        if (masked) {
          EXPECT_TRUE(all_close(mask_block(g.dattn_mask, offs[s], n, n), w.dattn_mask, 0, 0));
        }
      }
    }
  }
}

// HF-style float masks: 0 where a key is kept, finfo.min where it is not, so that a row with
// no key kept is finfo.min throughout (shifted to 0, the keys weighed by their scores alone:
// softmax is shift-invariant), and rows of a large offset (5000 + x). The core op shifts such rows by their largest finite value
// and adds the shift back to lse; each sequence does so with its block: out, lse, dq, dk, dv and
// dattn_mask equal attention() / attention_backward() on each sequence with its block, bit for bit.
class VarlenWideMask : public ::testing::TestWithParam<std::tuple<int, dtype>> {};
TEST_P(VarlenWideMask, RowsAsAttention) {
  const auto& [layout, type] = GetParam();
  std::mt19937 rng(37);
  const packed_batch x = random_batch({4, 0, 3, 6}, {5, 2, 1, 6}, 2, 1, 8, 4, type, rng);
  const std::vector<std::int64_t>&lq = x.lq, &lk = x.lk;
  const double lowest = -3.4028234663852886e38;  // float32's finfo.min
  Tensor mask = packed_mask(lq, lk, x.Hq, layout, false, rng);
  const std::int64_t H = mask.view().rank() == 2 ? mask.view().size(0) : 1;
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::int64_t off = 0;
  for (std::size_t b = 0; b < lq.size(); ++b) {
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < lq[b]; ++i)
        for (std::int64_t j = 0; j < lk[b]; ++j) {
          // row 1 of each sequence: nothing kept; row 2: an offset of 5000; the others HF 0/finfo.min
          const double val = i == 1 ? lowest : i == 2 ? 5000.0 + u(rng) : (u(rng) < 0.3 ? lowest : 0.0);
          const std::int64_t at = off + i * lk[b] + j;
          if (mask.view().rank() == 2) mask.set({h, at}, val);
          else mask.set({at}, val);
        }
    off += lq[b] * lk[b];
  }
  const auto [o, r, g] = run_masked(x, mask, 6);
  EXPECT_FALSE(testing::any_nan(r.out));
  expect_each_sequence_as_attention(x, o, r, g, 0.0);  // bit for bit
  for (std::size_t b = 0; b < lq.size(); ++b) {  // the finfo.min rows (row 1): their lse carries the shift
    if (lq[b] > 1 && lk[b] > 0) {
      EXPECT_LT(r.lse.get({0, x.cq[b] + 1}), -1e38) << "sequence " << b;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, VarlenWideMask,
                         ::testing::Combine(::testing::Values(0, 1, 2),
                                            ::testing::Values(dtype::f32, dtype::f64, dtype::bf16)),
                         [](const auto& info) {
                           return fmt::format("{}_{}", layout_name(std::get<0>(info.param)),
                                              dtype_name(std::get<1>(info.param)));
                         });

TEST(VarlenErrors, BadPackedMaskByMessage) {
  std::mt19937 rng(23);
  const Tensor q = random_tensor({6, 2, 4}, dtype::f32, rng), k = random_tensor({5, 2, 4}, dtype::f32, rng);
  const Tensor cq = index_tensor({0, 2, 6}), ck = index_tensor({0, 3, 5});  // S = 2·3 + 4·2 = 14
  auto run = [&](const Tensor& m) {
    attention_options o;
    o.attn_mask = m;
    return attention_varlen(q, k, k, cq, ck, 8, 8, o);
  };
  EXPECT_NO_THROW(run(Tensor::zeros({14}, dtype::f32)));
  EXPECT_NO_THROW(run(Tensor::zeros({2, 14}, dtype::boolean)));
  EXPECT_THROW_MSG(run(Tensor::zeros({15}, dtype::f32)),
                   "attention_varlen: attn_mask has shape [15], expected the sequences' masks packed: [S] or "
                   "[1 or Hq, S] with Hq = 2 and S = sum of Nq_b * Nk_b = 14");
  EXPECT_THROW_MSG(run(Tensor::zeros({3, 14}, dtype::f32)), "attn_mask has shape [3, 14], expected");
  EXPECT_THROW_MSG(run(Tensor::zeros({1, 2, 14}, dtype::f32)), "attn_mask has shape [1, 2, 14], expected");
  EXPECT_THROW_MSG(run(Tensor::zeros({14}, dtype::i64)),
                   "attention_varlen: attn_mask has dtype int64, expected bool or a float dtype");
  const auto r = attention_varlen(q, k, k, cq, ck, 8, 8);
  attention_options o;
  o.attn_mask = Tensor::zeros({13}, dtype::f32);
  EXPECT_THROW_MSG(attention_varlen_backward(q, k, k, r.out, r.out, r.lse, cq, ck, 8, 8, o),
                   "attention_varlen_backward: attn_mask has shape [13], expected");
}

TEST(VarlenErrors, BadCuSeqlensByMessage) {
  std::mt19937 rng(5);
  const Tensor q = random_tensor({6, 2, 4}, dtype::f32, rng), k = random_tensor({6, 2, 4}, dtype::f32, rng);
  const Tensor cu = index_tensor({0, 2, 6});
  auto run = [&](const Tensor& cq, const Tensor& ck, std::int64_t mq = 8, std::int64_t mk = 8) {
    return attention_varlen(q, k, k, cq, ck, mq, mk);
  };
  EXPECT_THROW_MSG(run(index_tensor({0, 4, 2, 6}), cu),
                   "attention_varlen: cu_seqlens_q[2] = 2 is less than cu_seqlens_q[1] = 4");
  EXPECT_THROW_MSG(run(cu, index_tensor({0, 2, 5})),
                   "attention_varlen: cu_seqlens_k[2] = 5 but the packed tensor has 6 tokens");
  EXPECT_THROW_MSG(run(index_tensor({1, 2, 6}), cu), "attention_varlen: cu_seqlens_q[0] = 1, expected 0");
  EXPECT_THROW_MSG(run(cu, index_tensor({0, 1, 3, 6})),
                   "cu_seqlens_q has 3 entries and cu_seqlens_k 4; both must be B + 1");
  EXPECT_THROW_MSG(run(cu, Tensor::from_values({3}, dtype::f32, {0, 2, 6})),
                   "attention_varlen: cu_seqlens_k has dtype float32, expected int64");
  EXPECT_THROW_MSG(run(Tensor::zeros({1, 3}, dtype::i64), cu), "cu_seqlens_q has shape [1, 3], expected [B + 1]");
  EXPECT_THROW_MSG(run(cu, cu, 3), "sequence 1 has length 4 (cu_seqlens_q[2] - cu_seqlens_q[1]), more than max_seqlen = 3");
  EXPECT_THROW_MSG(attention_varlen(Tensor::zeros({1, 6, 2, 4}, dtype::f32), Tensor::zeros({1, 6, 2, 4}, dtype::f32),
                                    Tensor::zeros({1, 6, 2, 4}, dtype::f32), cu, cu, 8, 8),
                   "attention_varlen: q has shape [1, 6, 2, 4], expected 3 dims [total_q, Hq, D]");
  attention_options o;
  o.nonpad_kv_seqlen = index_tensor({2, 4});
  EXPECT_THROW_MSG(attention_varlen(q, k, k, cu, cu, 8, 8, o), "attention_varlen: nonpad_kv_seqlen is not accepted");
  const auto r = attention_varlen(q, k, k, cu, cu, 8, 8);
  EXPECT_THROW_MSG(attention_varlen_backward(q, k, k, r.out, r.out, Tensor::zeros({6, 2}, dtype::f32), cu, cu, 8, 8),
                   "attention_varlen_backward: lse has shape [6, 2], expected [Hq, total_q] = [2, 6]");
}

}  // namespace
}  // namespace attn

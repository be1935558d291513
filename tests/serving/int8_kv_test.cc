// tests/serving/int8_kv_test.cc — int8 KV caches (paged, and dense as one page per sequence):
// attention equals the float64 reference run on the dequantised cache, for every ISA level,
// page sizes in and out of step with the SIMD width, GQA, causal alignments, windows, ALiBi,
// sinks, softcap, odd head sizes and thread counts; paged_kv_append quantises within half a
// step; on keys with outlier channels the int8 cache stays within the documented bound of the
// f32 cache (docs/SERVING.md); bad scales and inputs by message.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>

#include "attn/attn.h"
#include "cpu/kernels.h"
#include "cpu_isa.h"
#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::index_tensor;
using testing::random_tensor;

using testing::env_scope;
using testing::isa_scope;
using testing::isas;

// Random int8 pages [P, ps, H, X] (values in [-127, 127]) and positive scales [P, ps, H].
Tensor random_int8(const Shape& s, std::mt19937& rng) {
  std::uniform_int_distribution<int> u(-127, 127);
  Tensor t = Tensor::empty(s, dtype::i8);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<std::int8_t>()[i] = std::int8_t(u(rng));
  return t;
}

// Keys [0, L) of sequence b dequantised from the pages, as float64 [1, H, L, X].
Tensor dequantised(const TensorView& pages, const TensorView& scales, const std::vector<std::int64_t>& table,
                   std::int64_t max_pages, std::int64_t b, std::int64_t L) {
  const std::int64_t ps = pages.size(1), H = pages.size(2), X = pages.size(3);
  Tensor r = Tensor::empty({1, H, L, X}, dtype::f64);
  for (std::int64_t j = 0; j < L; ++j) {
    const std::int64_t pg = table[std::size_t(b * max_pages + j / ps)];
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t x = 0; x < X; ++x)
        r.set({0, h, j, x}, scales.get({pg, j % ps, h}) * pages.get({pg, j % ps, h, x}));
  }
  return r;
}

// max |got − want| over max |want| (both finite).
double relative_error(const TensorView& got, const TensorView& want) {
  const auto g = to_vector(got), w = to_vector(want);
  double e = 0, m = 0;
  for (std::size_t i = 0; i < g.size(); ++i) e = std::max(e, std::fabs(g[i] - w[i])), m = std::max(m, std::fabs(w[i]));
  return m > 0 ? e / m : e;
}

// Whether the cpu decode at the selected ISA level takes the int16 products for int8 pages of
// head sizes D, Dv (paged_kv_view::query = automatic; decode.h also needs q finite).
bool int16_products(std::int64_t D, std::int64_t Dv) {
  const detail::cpu::kernel_table& kt = detail::cpu::select_kernels();
  return detail::cpu::int8_decode_int16(kt.int16_decode, true, kt.W, D, Dv);
}

// q [B, Hq, Nq, D] as the int16 products round it (decode.h, quantise_q_rows; the bound
// include/attn/serving.h documents): each row of fl32(q · scale) — the cpu backend scales a
// float32 q before the kernel — times a power of two f that puts its largest |value| in
// [2^(bits-1), 2^bits), rounded half to even and clamped to ±(2^15 − 1) (bits 15, rows) or ±2^14
// (bits 14, blocked keys), divided by f and by the scale again: float64 rows that the reference
// can take with the same scale.
Tensor as_int16_rounds(const Tensor& q, double scale, int bits) {
  const std::int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const float s32 = float(scale);
  const double lim = bits == 15 ? 32767.0 : 16384.0;
  Tensor r = Tensor::empty({B, H, N, D}, dtype::f64);
  std::vector<float> row(static_cast<std::size_t>(D));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < N; ++i) {
        float m = 0;
        for (std::int64_t x = 0; x < D; ++x) row[std::size_t(x)] = float(q.get({b, h, i, x})) * s32, m = std::max(m, std::fabs(row[std::size_t(x)]));
        int e = 0;
        if (m > 0) std::frexp(m, &e);  // m in [2^(e-1), 2^e)
        const double f = std::ldexp(1.0, bits - e);
        for (std::int64_t x = 0; x < D; ++x) {
          const double v = m > 0 ? std::clamp(std::nearbyint(double(row[std::size_t(x)]) * f), -lim, lim) / f : 0.0;
          r.set({b, h, i, x}, v / scale);
        }
      }
  return r;
}

struct int8_case {
  const char* name;
  std::vector<std::int64_t> lens;
  std::int64_t page_size, Nq, Hq, Hkv, D;
  causal_alignment align;
  std::int64_t wl;
  bool alibi, sinks;
  double softcap;
  bool mask = false;  // a boolean attn_mask [B, 1, Nq, capacity]: a quarter false, row (0, 0, 0) all false
};

const int8_case kCases[] = {
    {"decode_page16", {70, 1, 0, 33}, 16, 1, 4, 2, 16, causal_alignment::bottom_right, -1, false, false, 0},
    {"decode_page5_odd_d", {23, 11}, 5, 1, 6, 2, 12, causal_alignment::bottom_right, -1, false, false, 0},
    {"speculative_page8", {40, 17, 9}, 8, 4, 4, 1, 32, causal_alignment::bottom_right, -1, false, true, 0},
    {"window_alibi_softcap", {50, 29}, 4, 3, 4, 2, 8, causal_alignment::after_past, 7, true, true, 5.0},
    {"prefill_many_rows", {45, 20}, 16, 20, 4, 2, 8, causal_alignment::top_left, -1, false, false, 0},
    {"split_kv_chunks", {4500}, 16, 1, 2, 1, 8, causal_alignment::bottom_right, -1, false, false, 0},
    // Head sizes in whole units of 4W: with bf16 q, the bf16 dot products (int8 rows as exact bf16 pairs)
    {"decode_d128_gqa4", {300, 17, 0, 2100}, 16, 1, 8, 2, 128, causal_alignment::bottom_right, -1, false, false, 0},
    {"speculative_d64", {61, 9}, 8, 3, 4, 1, 64, causal_alignment::bottom_right, 20, true, true, 0},
    // A tree of draft tokens as a boolean mask: whole blocks of 16 keys, and pages of 5 (copied blocks)
    {"mask_speculative_d128", {300, 17, 0, 2100}, 16, 4, 8, 2, 128, causal_alignment::bottom_right, -1, false, true, 0, true},
    {"mask_decode_page5", {23, 11}, 5, 1, 6, 2, 12, causal_alignment::bottom_right, -1, true, false, 0, true},
};

void PrintTo(const int8_case& c, std::ostream* os) { *os << c.name; }

class Int8Paged : public ::testing::TestWithParam<std::tuple<int8_case, dtype>> {};

// The kernel on int8 pages equals the float64 reference on the dequantised keys and values
// (to float32 / bfloat16 rounding), on every ISA level, with any thread count giving the same bits.
TEST_P(Int8Paged, EqualsReferenceOnDequantisedCache) {
  const auto& [c, type] = GetParam();
  std::mt19937 rng(41);
  const std::int64_t B = std::int64_t(c.lens.size()), ps = c.page_size, Dv = c.D;
  std::int64_t max_pages = 0, used = 0;
  for (std::int64_t L : c.lens) max_pages = std::max(max_pages, (L + ps - 1) / ps + 1), used += (L + ps - 1) / ps;
  const std::int64_t num_pages = used + 2;
  std::vector<std::int64_t> order(static_cast<std::size_t>(num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::int64_t> table(std::size_t(B * max_pages), -3);
  std::size_t next = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t p = 0; p * ps < c.lens[std::size_t(b)]; ++p) table[std::size_t(b * max_pages + p)] = order[next++];
  const Tensor kp = random_int8({num_pages, ps, c.Hkv, c.D}, rng), vp = random_int8({num_pages, ps, c.Hkv, Dv}, rng);
  const Tensor ks = random_tensor({num_pages, ps, c.Hkv}, dtype::f32, rng, 0.001, 0.03);
  const Tensor vs = random_tensor({num_pages, ps, c.Hkv}, dtype::f32, rng, 0.001, 0.03);
  const Tensor q = random_tensor({B, c.Hq, c.Nq, c.D}, type, rng, -2, 2);
  const paged_kv_view cache{kp, vp, index_tensor({B, max_pages}, table), index_tensor({B}, c.lens), ks, vs};
  attention_options o;
  o.is_causal = true, o.alignment = c.align, o.window_left = c.wl, o.softcap = c.softcap;
  if (c.alibi) o.alibi_slopes = random_tensor({B, c.Hq}, dtype::f64, rng, 0.1, 0.9);
  if (c.sinks) o.sinks = random_tensor({c.Hq}, dtype::f64, rng);
  Tensor mask;
  if (c.mask) {
    mask = Tensor::empty({B, 1, c.Nq, max_pages * ps}, dtype::boolean);
    std::bernoulli_distribution keep(0.75);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t i = 0; i < c.Nq; ++i)
        for (std::int64_t j = 0; j < max_pages * ps; ++j) mask.set({b, 0, i, j}, (b || i) && keep(rng) ? 1.0 : 0.0);
    o.attn_mask = mask;
  }

  // The reference: float64 on the dequantised cache, q exactly as given — and q as the int16
  // products round it (float32 q, where they run).
  const auto reference = [&](const Tensor& qq) {
    std::vector<attention_result> want;
    for (std::int64_t b = 0; b < B; ++b) {
      attention_options ob = o;
      if (c.alibi) ob.alibi_slopes = Tensor::copy_of(o.alibi_slopes->slice(0, b, b + 1).reshape({c.Hq}));
      ob.alignment = c.align == causal_alignment::top_left ? causal_alignment::top_left : causal_alignment::bottom_right;
      const std::int64_t L = c.lens[std::size_t(b)];
      if (c.mask) ob.attn_mask = Tensor::copy_of(mask.view().slice(0, b, b + 1).slice(3, 0, L));
      want.push_back(attention(Tensor::copy_of(qq.view().slice(0, b, b + 1), dtype::f64),
                               dequantised(kp, ks, table, max_pages, b, L), dequantised(vp, vs, table, max_pages, b, L), ob));
    }
    return want;
  };
  const std::vector<attention_result> want = reference(q);
  const bool floats = type != dtype::bf16;  // float32 or float16 q: rounded by the int16 products
  const bool may_round = floats && c.D % 64 == 0 && c.D == Dv;
  const std::vector<attention_result> want16 = may_round ? reference(as_int16_rounds(q, 1 / std::sqrt(double(c.D)), 15)) : want;
  // float32 / float16 q: every product exact with query = float32 (and wherever the int16 products
  // do not run); with them (automatic), lse as the reference's on q rounded as documented, to
  // float32 rounding (the weights' rounding does not reach lse), and out within 2e-4 of its largest
  // (float16 out: 2e-3, its own rounding).
  paged_kv_view exact = cache;
  exact.query = int8_query::float32;
  for (const std::string& isa : isas()) {
    const isa_scope scope(isa);
    const bool rounded = floats && int16_products(c.D, Dv);
    ASSERT_TRUE(may_round || !rounded);
    for (const bool fast : {true, false}) {
      if (!fast && !floats) continue;
      const paged_kv_view& cv = fast ? cache : exact;
      const attention_result r = attention_paged(q, cv, o, {.num_threads = 2});
      ASSERT_EQ(r.backend, "cpu");
      double e = 0;
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t L = c.lens[std::size_t(b)];
        SCOPED_TRACE(fmt::format("{} {} sequence {} (L {}) isa {}{}", c.name, dtype_name(type), b, L, isa,
                                 fast ? "" : " query float32"));
        const Tensor out = Tensor::copy_of(r.out.view().slice(0, b, b + 1), dtype::f64);
        const Tensor lse = Tensor::copy_of(r.lse.view().slice(0, b, b + 1), dtype::f64);
        const attention_result& w = fast && rounded ? want16[std::size_t(b)] : want[std::size_t(b)];
        if (fast && rounded) {
          if (L > 0) e = std::max(e, relative_error(out, w.out));
        } else {
          EXPECT_TRUE(all_close(out, w.out, type == dtype::bf16 ? 2e-2 : type == dtype::f16 ? 2e-3 : 2e-5));
        }
        EXPECT_TRUE(all_close(lse, w.lse, 2e-5));
      }
      if (fast && rounded) {
        std::printf("%s %s q, int16 products, %s: max error / max |out| %.3g against q rounded\n", c.name,
                    std::string(dtype_name(type)).c_str(), isa.c_str(), e);
        EXPECT_LT(e, type == dtype::f16 ? 2e-3 : 2e-4);  // the weights' rounding (2^-15 of a block's largest, 2100 keys): ~1e-4 here
        const attention_result f = attention_paged(q, exact, o, {.num_threads = 2});
        EXPECT_FALSE(all_close(f.lse, r.lse, 0, 0)) << isa;  // the rounded products ran, and float32 did not
      }
      const attention_result one = attention_paged(q, cv, o, {.num_threads = 1});
      EXPECT_TRUE(all_close(one.out, r.out, 0, 0)) << isa;
    }
  }
}

// Special values as attn::attention gives them: a query whose q·k with an int8 key overflows
// float32 (the kernel's scores ±inf) is answered by the float64 reference on the dequantised keys,
// on every ISA level, and the other rows keep the kernel's answer.
TEST(Int8Paged, OverflowingScoresAsTheReference) {
  std::mt19937 rng(43);
  const std::int64_t ps = 16, Hkv = 2, Hq = 4, D = 16, P = 5, max_pages = 2;
  const Tensor kp = random_int8({P, ps, Hkv, D}, rng), vp = random_int8({P, ps, Hkv, D}, rng);
  Tensor ks = random_tensor({P, ps, Hkv}, dtype::f32, rng, 0.001, 0.03);
  const Tensor vs = random_tensor({P, ps, Hkv}, dtype::f32, rng, 0.001, 0.03);
  ks.set({3, 4, 1}, 2e17);  // page 3, row 4, head 1: |k| up to 2.5e19
  const std::vector<std::int64_t> table{1, 3, 4, 0}, lens{ps + 7, 20};  // sequence 0: key ps + 4
  Tensor q = random_tensor({2, Hq, 1, D}, dtype::f32, rng, -2, 2);
  for (std::int64_t d = 0; d < D; ++d) q.set({0, 2, 0, d}, kp.get({3, 4, 1, d}) >= 0 ? 3e19 : -3e19);  // head 2: kv head 1
  const paged_kv_view cache{kp, vp, index_tensor({2, max_pages}, table), index_tensor({2}, lens), ks, vs};
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  for (const std::string& isa : isas()) {
    const isa_scope scope(isa);
    const attention_result r = attention_paged(q, cache, o, {.num_threads = 2});
    for (std::int64_t b = 0; b < 2; ++b) {
      SCOPED_TRACE(fmt::format("sequence {} isa {}", b, isa));
      const std::int64_t L = lens[std::size_t(b)];
      const attention_result want = attention(Tensor::copy_of(q.view().slice(0, b, b + 1), dtype::f64),
                                              dequantised(kp, ks, table, max_pages, b, L),
                                              dequantised(vp, vs, table, max_pages, b, L), o);
      EXPECT_FALSE(testing::any_nan(want.out));
      EXPECT_TRUE(all_close(Tensor::copy_of(r.out.view().slice(0, b, b + 1), dtype::f64), want.out, 2e-5));
      // (lse as float32 holds it: the overflowing row's 1.7e39 is +inf there, as attention() on float32 gives it)
      EXPECT_TRUE(all_close(Tensor::copy_of(r.lse.view().slice(0, b, b + 1)), Tensor::copy_of(want.lse, dtype::f32), 2e-5));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Int8Paged,
                         ::testing::Combine(::testing::ValuesIn(kCases), ::testing::Values(dtype::f32, dtype::bf16, dtype::f16)),
                         [](const auto& info) {
                           return fmt::format("{}_{}", std::get<0>(info.param).name, dtype_name(std::get<1>(info.param)));
                         });

// paged_kv_view::query reaches every sequence of a mixed batch: attention_paged_varlen (decode
// steps beside chunks, a sequence with nothing new) gives each sequence what attention_paged gives
// it alone with the same query choice, float32 q at a head size the int16 products take — on
// every ISA level; where those products run, the two choices differ by more than the comparison's
// tolerance, so a front that dropped the choice fails.
TEST(Int8Paged, MixedBatchKeepsTheQueryChoice) {
  const std::vector<std::int64_t> nq{1, 3, 0, 2}, lens{40, 70, 5, 33};
  const std::int64_t B = 4, Hq = 4, Hkv = 2, D = 64, ps = 16, max_pages = 5;
  std::mt19937 rng(71);
  std::vector<std::int64_t> table(std::size_t(B * max_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<std::int64_t> cu{0};
  for (std::int64_t n : nq) cu.push_back(cu.back() + n);
  const std::int64_t P = B * max_pages;
  const Tensor kp = random_int8({P, ps, Hkv, D}, rng), vp = random_int8({P, ps, Hkv, D}, rng);
  const Tensor ks = random_tensor({P, ps, Hkv}, dtype::f32, rng, 0.001, 0.03);
  const Tensor vs = random_tensor({P, ps, Hkv}, dtype::f32, rng, 0.001, 0.03);
  const Tensor q = random_tensor({cu.back(), Hq, D}, dtype::f32, rng, -2, 2);
  const Tensor tab = index_tensor({B, max_pages}, table), lt = index_tensor({B}, lens);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const auto reshaped = [](const TensorView& v, Shape s) { return Tensor::copy_of(Tensor::copy_of(v).view().reshape(s)); };
  for (const std::string& isa : isas()) {
    const isa_scope scope(isa);
    std::vector<Tensor> outs;
    for (const int8_query mode : {int8_query::automatic, int8_query::float32}) {
      SCOPED_TRACE(fmt::format("isa {} query {}", isa, to_string(mode)));
      const varlen_result r = attention_paged_varlen(q, index_tensor({B + 1}, cu), 3, {kp, vp, tab, lt, ks, vs, mode}, o);
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t n = nq[std::size_t(b)], c0 = cu[std::size_t(b)];
        if (n == 0) continue;
        const Tensor qb = reshaped(q.view().slice(0, c0, c0 + n).permute({1, 0, 2}), {1, Hq, n, D});
        const std::vector<std::int64_t> row(table.begin() + b * max_pages, table.begin() + (b + 1) * max_pages);
        const attention_result want = attention_paged(
            qb, {kp, vp, index_tensor({1, max_pages}, row), index_tensor({1}, {lens[std::size_t(b)]}), ks, vs, mode}, o);
        EXPECT_TRUE(all_close(reshaped(r.out.view().slice(0, c0, c0 + n).permute({1, 0, 2}), {1, Hq, n, D}), want.out, 2e-6, 0))
            << "sequence " << b;
      }
      outs.push_back(r.out);
    }
    EXPECT_EQ(bool(all_close(outs[0], outs[1], 2e-6, 0)), !int16_products(D, D)) << isa;
  }
}

// A dense int8 cache [B, Hkv, capacity, D] is one head-major page per sequence; the kernel reads
// it in place and agrees with the paged layout of the same values.
TEST(Int8Dense, OnePagePerSequenceEqualsPaged) {
  std::mt19937 rng(43);
  const std::int64_t B = 3, Hkv = 2, Hq = 4, cap = 40, D = 16;
  const Tensor k = random_int8({B, Hkv, cap, D}, rng), v = random_int8({B, Hkv, cap, D}, rng);
  const Tensor ks = random_tensor({B, Hkv, cap}, dtype::f32, rng, 0.001, 0.03);
  const Tensor vs = random_tensor({B, Hkv, cap}, dtype::f32, rng, 0.001, 0.03);
  const std::vector<std::int64_t> lens{40, 17, 1};
  const Tensor q = random_tensor({B, Hq, 2, D}, dtype::f32, rng, -2, 2);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const paged_kv_view dense{k.view().permute({0, 2, 1, 3}), v.view().permute({0, 2, 1, 3}), index_tensor({B, 1}, {0, 1, 2}),
                            index_tensor({B}, lens), ks.view().permute({0, 2, 1}), vs.view().permute({0, 2, 1})};
  const attention_result r = attention_paged(q, dense, o);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t L = lens[std::size_t(b)];
    const Tensor kd = dequantised(dense.k_pages, dense.k_scales, {0, 1, 2}, 1, b, L);
    const Tensor vd = dequantised(dense.v_pages, dense.v_scales, {0, 1, 2}, 1, b, L);
    const attention_result want = attention(Tensor::copy_of(q.view().slice(0, b, b + 1), dtype::f64), kd, vd, o);
    EXPECT_TRUE(all_close(Tensor::copy_of(r.out.view().slice(0, b, b + 1), dtype::f64), want.out, 2e-5)) << b;
  }
  // Appending through the dense view quantises into row lens[b] of each sequence's buffer.
  const Tensor kn = random_tensor({B, Hkv, 1, D}, dtype::f32, rng), vn = random_tensor({B, Hkv, 1, D}, dtype::f32, rng);
  const paged_kv_view grow{dense.k_pages, dense.v_pages, dense.block_table, index_tensor({B}, {39, 17, 1}), dense.k_scales,
                           dense.v_scales};
  paged_kv_append(grow, kn, vn);
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t t = b == 0 ? 39 : b == 1 ? 17 : 1;
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t x = 0; x < D; ++x)
        EXPECT_NEAR(ks.get({b, h, t}) * k.get({b, h, t, x}), kn.get({b, h, 0, x}), ks.get({b, h, t}) / 2 + 1e-7);
  }
}

Tensor random_normal(const Shape& s, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  Tensor t = Tensor::empty(s, dtype::f32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = float(n(rng));
  return t;
}

// Keys like a trained model's: N(0, 1) with two outlier channels (of D) ten times larger;
// values N(0, 1).
Tensor outlier_keys(const Shape& s, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  Tensor t = Tensor::empty(s, dtype::f32);
  const std::int64_t X = s.back();
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = float(n(rng) * (i % X == 5 || i % X == X / 2 + 3 ? 10.0 : 1.0));
  return t;
}

// paged_kv_append quantises each (token, head) row to within half a step of its scale, and on
// real-looking data the int8 cache's output stays within the bound docs/SERVING.md states.
// int8 rows [P, ps, H, D] → blocked keys [P, ps / 16, H, D / 4, 16, 4] (include/attn/serving.h).
Tensor to_blocked(const Tensor& rows) {
  const std::int64_t P = rows.size(0), ps = rows.size(1), H = rows.size(2), D = rows.size(3);
  Tensor b = Tensor::empty({P, ps / 16, H, D / 4, 16, 4}, dtype::i8);
  for (std::int64_t p = 0; p < P; ++p)
    for (std::int64_t t = 0; t < ps; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t x = 0; x < D; ++x) b.set({p, t / 16, h, x / 4, t % 16, x % 4}, rows.get({p, t, h, x}));
  return b;
}

TEST(Int8Append, QuantisesWithinHalfAStepAndBoundsTheError) {
  std::mt19937 rng(47);
  const std::int64_t B = 2, Hkv = 2, Hq = 8, D = 128, ps = 16, T = 300, max_pages = (T + ps - 1) / ps;
  const std::int64_t P = B * max_pages;
  const Tensor k = outlier_keys({B, Hkv, T, D}, rng);
  Tensor v = random_normal({B, Hkv, T, D}, rng);
  for (std::int64_t x = 0; x < D; ++x) v.set({0, 1, 7, x}, 0.0);  // a zero row: scale 0
  std::vector<std::int64_t> table(static_cast<std::size_t>(P));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const Tensor kp = Tensor::zeros({P, ps, Hkv, D}, dtype::i8), vp = Tensor::zeros({P, ps, Hkv, D}, dtype::i8);
  const Tensor ks = Tensor::zeros({P, ps, Hkv}, dtype::f32), vs = Tensor::zeros({P, ps, Hkv}, dtype::f32);
  const Tensor lens = index_tensor({B}, {0, 0});
  const paged_kv_view cache{kp, vp, index_tensor({B, max_pages}, table), lens, ks, vs};
  paged_kv_append(cache, k.view().slice(2, 0, 200), v.view().slice(2, 0, 200));  // two appends
  for (std::int64_t b = 0; b < B; ++b) lens.data_as<std::int64_t>()[b] = 200;
  paged_kv_append(cache, k.view().slice(2, 200, T), v.view().slice(2, 200, T));
  for (std::int64_t b = 0; b < B; ++b) lens.data_as<std::int64_t>()[b] = T;
  double worst_step = 0;
  for (std::int64_t b = 0; b < B; ++b) {
    const Tensor kd = dequantised(kp, ks, table, max_pages, b, T), vd = dequantised(vp, vs, table, max_pages, b, T);
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t t = 0; t < T; ++t) {
        const std::int64_t pg = table[std::size_t(b * max_pages + t / ps)];
        double amax = 0;
        for (std::int64_t x = 0; x < D; ++x) amax = std::max(amax, std::fabs(k.get({b, h, t, x})));
        EXPECT_FLOAT_EQ(float(ks.get({pg, t % ps, h})), float(amax / 127));
        const double s = ks.get({pg, t % ps, h});
        for (std::int64_t x = 0; x < D; ++x)
          worst_step = std::max(worst_step, std::fabs(kd.get({0, h, t, x}) - k.get({b, h, t, x})) / s);
      }
  }
  EXPECT_LE(worst_step, 0.5 + 1e-4);
  EXPECT_EQ(vs.get({table[0], 7, 1}), 0.0);  // the zero row of v (sequence 0, head 1, token 7)
  // Error of the int8 cache against the f32 cache on these keys (decode, 4 queries per sequence).
  const Tensor q = random_normal({B, Hq, 4, D}, rng);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const attention_result r = attention_paged(q, cache, o);
  const attention_result f = attention(q, k, v, o);
  double worst = 0, worst_ref = 0;
  for (std::int64_t i = 0; i < r.out.numel(); ++i)
    worst = std::max(worst, std::fabs(double(r.out.data_as<float>()[i]) - double(f.out.data_as<float>()[i]))),
    worst_ref = std::max(worst_ref, std::fabs(double(f.out.data_as<float>()[i])));
  RecordProperty("max_abs_error", fmt::format("{:.4g}", worst));
  std::printf("int8 KV vs f32 (outlier keys, D %lld, %lld keys): max |out error| %.4g (max |out| %.3g)\n",
              static_cast<long long>(D), static_cast<long long>(T), worst, worst_ref);
  EXPECT_LT(worst, 0.08);  // docs/SERVING.md: measured 0.053 with this seed
  EXPECT_GT(worst, 0.0);   // quantisation changed something: the test can fail
  // The same cache with blocked keys and q and the weights in 8 bits (int8_query::int8): where
  // the byte products run, the error against the f32 cache adds q's and the weights' rounding.
  paged_kv_view bytes{to_blocked(kp), vp, cache.block_table, lens, ks, vs};
  bytes.query = int8_query::int8;
  const attention_result r8 = attention_paged(q, bytes, o);
  double worst8 = 0;
  for (std::int64_t i = 0; i < r8.out.numel(); ++i)
    worst8 = std::max(worst8, std::fabs(double(r8.out.data_as<float>()[i]) - double(f.out.data_as<float>()[i])));
  std::printf("int8 KV with 8-bit q and weights vs f32 (the same keys): max |out error| %.4g\n", worst8);
  EXPECT_LT(worst8, 0.1);  // docs/SERVING.md: measured with this seed
}

// With bf16 q on an ISA with int16 dot products (avx512bf16: AVX512_VNNI), decode reads int8
// rows with q and the weights p·scale_v as int16 (decode.h, int8_as_int16): as close to the
// float64 reference on the dequantised cache as the bf16 products of widened rows
// (ATTN_DECODE_INT8=widen) — the output, bf16, is rounded to bf16 either way — with lse (f32)
// within 2e-5, on row groups of 4, 2 and 1, head sizes of 1 to 4 units, pages that straddle
// blocks, speculative rows and empty sequences; the same bits for any thread count; a NaN or
// ±inf in q or in a scale gives what the float path gives.
struct int16_case {
  const char* name;
  std::vector<std::int64_t> lens;
  std::int64_t page_size, Nq, Hq, Hkv, D;
};

const int16_case kInt16Cases[] = {
    {"gqa4_d128_page16", {300, 1, 0, 2100}, 16, 1, 8, 2, 128},
    {"gqa2_d64_page5", {77, 40}, 5, 1, 4, 2, 64},
    {"mha_d192_page16", {500}, 16, 1, 2, 2, 192},
    {"speculative3_gqa4_d256_page8", {130, 64}, 8, 3, 4, 1, 256},
};

TEST(Int8Int16, AsCloseToTheReferenceAsWidenedRows) {
  for (const int16_case& c : kInt16Cases) {
    std::mt19937 rng(43);
    const std::int64_t B = std::int64_t(c.lens.size()), ps = c.page_size;
    std::int64_t max_pages = 0;
    for (std::int64_t L : c.lens) max_pages = std::max(max_pages, (L + ps - 1) / ps);
    const std::int64_t num_pages = B * max_pages;
    std::vector<std::int64_t> table(static_cast<std::size_t>(num_pages));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    const Tensor kp = random_int8({num_pages, ps, c.Hkv, c.D}, rng), vp = random_int8({num_pages, ps, c.Hkv, c.D}, rng);
    const Tensor ks = random_tensor({num_pages, ps, c.Hkv}, dtype::f32, rng, 0.001, 0.03);
    const Tensor vs = random_tensor({num_pages, ps, c.Hkv}, dtype::f32, rng, 0.001, 0.03);
    Tensor q = random_tensor({B, c.Hq, c.Nq, c.D}, dtype::bf16, rng, -2, 2);
    const paged_kv_view cache{kp, vp, index_tensor({B, max_pages}, table), index_tensor({B}, c.lens), ks, vs};
    attention_options o;
    o.is_causal = true, o.alignment = causal_alignment::bottom_right;
    const auto reference = [&](const Tensor& qq) {
      std::vector<attention_result> want;
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t L = c.lens[std::size_t(b)];
        want.push_back(attention(Tensor::copy_of(qq.view().slice(0, b, b + 1), dtype::f64),
                                 dequantised(kp, ks, table, max_pages, b, L), dequantised(vp, vs, table, max_pages, b, L), o));
      }
      return want;
    };
    const std::vector<attention_result> want = reference(q);
    for (const std::string& isa : isas()) {
      SCOPED_TRACE(fmt::format("{} isa {}", c.name, isa));
      const isa_scope scope(isa);
      const bool int16 = detail::cpu::select_kernels().int16_decode;
      const attention_result r = attention_paged(q, cache, o, {.num_threads = 2});
      attention_result w;
      {
        const env_scope widen("ATTN_DECODE_INT8", "widen");
        w = attention_paged(q, cache, o, {.num_threads = 2});
      }
      double e16 = 0, ew = 0, l16 = 0;
      for (std::int64_t b = 0; b < B; ++b) {
        if (c.lens[std::size_t(b)] == 0) continue;
        const Tensor got = Tensor::copy_of(r.out.view().slice(0, b, b + 1), dtype::f64);
        e16 = std::max(e16, relative_error(got, want[std::size_t(b)].out));
        ew = std::max(ew, relative_error(Tensor::copy_of(w.out.view().slice(0, b, b + 1), dtype::f64), want[std::size_t(b)].out));
        const Tensor lse = Tensor::copy_of(r.lse.view().slice(0, b, b + 1), dtype::f64);
        EXPECT_TRUE(all_close(lse, want[std::size_t(b)].lse, 2e-5));
        l16 = std::max(l16, relative_error(lse, want[std::size_t(b)].lse));
      }
      std::printf("%s %s: max error / max |out|: %.3g (default), %.3g (widened rows); lse %.3g\n", c.name, isa.c_str(),
                  e16, ew, l16);
      EXPECT_LT(ew, 4e-3);  // bf16 output: 2^-9 relative, and p rounded to bf16
      EXPECT_LT(e16, 4e-3);
      if (int16) {
        EXPECT_LT(e16, ew * 1.25);  // int16 weights: 2^-15 of the block's largest, below the output's rounding
        EXPECT_FALSE(all_close(r.out, w.out, 0, 0));  // the int16 path ran
      } else {
        EXPECT_TRUE(all_close(r.out, w.out, 0, 0));  // no int16 path: the default is the widened rows
      }
      const attention_result one = attention_paged(q, cache, o, {.num_threads = 1});
      EXPECT_TRUE(all_close(one.out, r.out, 0, 0));
    }
    // A NaN in one row of q and +inf in another; then a NaN value scale and an inf key scale
    // (of tokens every row sees: the first page of sequence 0): the float path's answer.
    if (c.lens[0] < 2) continue;
    Tensor qn = Tensor::copy_of(q);
    qn.set({0, 1, 0, 5}, NAN);
    qn.set({B - 1, 0, c.Nq - 1, 3}, INFINITY);
    const Tensor vs2 = Tensor::copy_of(vs), ks2 = Tensor::copy_of(ks);
    vs2.set({table[0], 0, 0}, NAN);
    ks2.set({table[0], 1, c.Hkv - 1}, INFINITY);
    const paged_kv_view bad{kp, vp, index_tensor({B, max_pages}, table), index_tensor({B}, c.lens), ks2, vs2};
    for (const std::string& isa : isas()) {
      SCOPED_TRACE(fmt::format("{} non-finite, isa {}", c.name, isa));
      const isa_scope scope(isa);
      for (const bool scales : {false, true}) {
        const paged_kv_view& cv = scales ? bad : cache;
        const Tensor& qq = scales ? q : qn;
        const attention_result r = attention_paged(qq, cv, o, {.num_threads = 2});
        attention_result w;
        {
          const env_scope widen("ATTN_DECODE_INT8", "widen");
          w = attention_paged(qq, cv, o, {.num_threads = 2});
        }
        const auto g = to_vector(r.out), f = to_vector(w.out);
        std::int64_t nonfinite = 0;
        for (std::size_t i = 0; i < g.size(); ++i) {
          EXPECT_EQ(std::isnan(g[i]), std::isnan(f[i])) << "at " << i << (scales ? " (scales)" : " (q)");
          EXPECT_EQ(std::isinf(g[i]), std::isinf(f[i])) << "at " << i;
          nonfinite += !std::isfinite(g[i]);
        }
        EXPECT_GT(nonfinite, 0);
      }
    }
  }
}


// Blocked int8 keys (16 keys side by side per quad of d): the same answer as the rows they hold.
// On an ISA with int16 dot products (head sizes in units of 64; bf16 or float32 q) the kernel
// reads them in place with byte dot products and a 14-bit q — as close to the float64 reference
// on the dequantised cache as the rows' int16 path, and float32 q's lse that reference's on q
// rounded to 14 bits; everywhere else they are copied as rows, and the result is bitwise the
// rows' result. Row groups of 1, 2 and 4, pages of 16, 32 and 256,
// speculative rows with window, ALiBi, sinks and softcap, split-KV, empty and one-key sequences,
// odd head sizes; the same bits for any thread count; NaN / inf in q as the rows give them.
struct blocked_case {
  const char* name;
  std::vector<std::int64_t> lens;
  std::int64_t page_size, Nq, Hq, Hkv, D;
  bool extras;  // window, ALiBi, sinks, softcap
};

const blocked_case kBlockedCases[] = {
    {"gqa4_d128_page16", {300, 1, 0, 2100}, 16, 1, 8, 2, 128, false},
    {"mha_d64_page32", {500, 77}, 32, 1, 2, 2, 64, false},
    {"gqa2_d192_page256", {700}, 256, 1, 4, 2, 192, false},
    {"speculative3_gqa4_d256_page16_extras", {130, 64}, 16, 3, 4, 1, 256, true},
    {"gqa4_d40_page16_rows_path", {90, 33}, 16, 1, 4, 1, 40, false},
};

// q is quantised to int16 per row with a power-of-two factor f that brings the row's largest |q|
// to 2^15 (decode.h, quantise_q_rows); below 2^-100 f is applied in two steps (one alone would
// overflow float: before, such rows saturated), and the score takes q's scale (subnormal there)
// before the key's. With a call scale that brings the tiny rows back to scores of O(1), the
// output must still match the float64 reference on the dequantised cache: rows and blocked keys,
// every ISA level, tiny rows beside ordinary ones. The tiny rows' elements stay normal floats
// (|q| >= 2^-122): a subnormal element reads as 0 in the kernels, which flush denormals
// (cpu/denormals.h), where the reference keeps it.
TEST(Int8Decode, TinyQRowsAreQuantisedExactly) {
  std::mt19937 rng(61);
  const std::int64_t B = 2, Hkv = 2, Hq = 8, D = 64, ps = 16;
  const std::vector<std::int64_t> lens{100, 37};
  const std::int64_t max_pages = 7, num_pages = B * max_pages;
  std::vector<std::int64_t> table(static_cast<std::size_t>(num_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const Tensor kp = random_int8({num_pages, ps, Hkv, D}, rng), vp = random_int8({num_pages, ps, Hkv, D}, rng);
  const Tensor kb = to_blocked(kp);
  const Tensor ks = random_tensor({num_pages, ps, Hkv}, dtype::f32, rng, 0.001, 0.03);
  const Tensor vs = random_tensor({num_pages, ps, Hkv}, dtype::f32, rng, 0.001, 0.03);
  // tiny: q of sequence 0, kv head 0's group times tiny; the call's scale undoes it for every
  // row (the other rows' scores are then small: their weights near uniform)
  for (const double tiny : {1.0, 1e-32, 0x1p-120}) {
    const Tensor q0 = random_tensor({B, Hq, 1, D}, dtype::bf16, rng, -2, 2);
    Tensor q = Tensor::copy_of(q0.view(), dtype::bf16);
    for (std::int64_t h = 0; h < Hq / Hkv; ++h)
      for (std::int64_t d = 0; d < D; ++d) {
        const double x = q0.get({0, h, 0, d});
        q.set({0, h, 0, d}, std::copysign(std::max(std::fabs(x), 0.25), x) * tiny);
      }
    attention_options opt;
    opt.scale = 0.125 / tiny;
    attention_options flat_opt;
    flat_opt.scale = 0.0;
    const Tensor tab = index_tensor({B, max_pages}, table), lens_t = index_tensor({B}, lens);
    const paged_kv_view rows{kp, vp, tab, lens_t, ks, vs}, blocked{kb, vp, tab, lens_t, ks, vs};
    std::vector<attention_result> want;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t L = lens[std::size_t(b)];
      want.push_back(attention(Tensor::copy_of(q.view().slice(0, b, b + 1), dtype::f64), dequantised(kp, ks, table, max_pages, b, L),
                               dequantised(vp, vs, table, max_pages, b, L), opt));
    }
    // the tiny rows' scores are O(1): not the uniform weights of scores near 0
    const Tensor flat = attention(Tensor::copy_of(q.view().slice(0, 0, 1), dtype::f64), dequantised(kp, ks, table, max_pages, 0, 100),
                                  dequantised(vp, vs, table, max_pages, 0, 100), flat_opt).out;
    EXPECT_GT(std::fabs(want[0].out.get({0, 0, 0, 0}) - flat.get({0, 0, 0, 0})), 1e-3);
    for (const std::string& isa : isas()) {
      SCOPED_TRACE(fmt::format("isa {} tiny {}", isa, tiny));
      const isa_scope scope(isa);
      for (const paged_kv_view* c : {&rows, &blocked}) {
        const attention_result r = attention_paged(q, *c, opt, {.num_threads = 2});
        for (std::int64_t b = 0; b < B; ++b) {
          EXPECT_TRUE(all_close(Tensor::copy_of(r.out.view().slice(0, b, b + 1), dtype::f64), want[std::size_t(b)].out, 4e-3));
          EXPECT_TRUE(all_close(Tensor::copy_of(r.lse.view().slice(0, b, b + 1), dtype::f64), want[std::size_t(b)].lse, 2e-5));
        }
      }
    }
  }
}

// A case's cache: a shuffled block table, random int8 pages (keys as rows and blocked) with
// positive scales, drawn from rng in this order; options (causal, bottom-right; window, softcap,
// ALiBi and sinks with extras) drawn after; the float64 reference on the dequantised cache.
struct blocked_cache {
  const blocked_case& c;
  std::int64_t B, max_pages = 0;
  std::vector<std::int64_t> table;
  Tensor kp, vp, kb, ks, vs, tab, lens;
  blocked_cache(const blocked_case& c_, std::mt19937& rng) : c(c_), B(std::int64_t(c_.lens.size())) {
    const std::int64_t ps = c.page_size;
    for (std::int64_t L : c.lens) max_pages = std::max<std::int64_t>(max_pages, (L + ps - 1) / ps);
    const std::int64_t num_pages = B * max_pages + 1;
    table.resize(static_cast<std::size_t>(num_pages));
    std::iota(table.begin(), table.end(), 0);
    std::shuffle(table.begin(), table.end(), rng);
    table.resize(std::size_t(B * max_pages));
    kp = random_int8({num_pages, ps, c.Hkv, c.D}, rng), vp = random_int8({num_pages, ps, c.Hkv, c.D}, rng);
    kb = to_blocked(kp);
    ks = random_tensor({num_pages, ps, c.Hkv}, dtype::f32, rng, 0.001, 0.03);
    vs = random_tensor({num_pages, ps, c.Hkv}, dtype::f32, rng, 0.001, 0.03);
    tab = index_tensor({B, max_pages}, table), lens = index_tensor({B}, c.lens);
  }
  attention_options options(std::mt19937& rng) const {
    attention_options o;
    o.is_causal = true, o.alignment = causal_alignment::bottom_right;
    if (c.extras) {
      o.window_left = 40, o.softcap = 8.0;
      o.alibi_slopes = random_tensor({B, c.Hq}, dtype::f64, rng, 0.01, 0.2);
      o.sinks = random_tensor({c.Hq}, dtype::f64, rng);
    }
    return o;
  }
  std::vector<attention_result> reference(const attention_options& o, const Tensor& q, const Tensor& vscales) const {
    std::vector<attention_result> want;
    for (std::int64_t b = 0; b < B; ++b) {
      attention_options ob = o;
      if (c.extras) ob.alibi_slopes = Tensor::copy_of(o.alibi_slopes->slice(0, b, b + 1).reshape({c.Hq}));
      const std::int64_t L = c.lens[std::size_t(b)];
      want.push_back(attention(Tensor::copy_of(q.view().slice(0, b, b + 1), dtype::f64),
                               dequantised(kp, ks, table, max_pages, b, L), dequantised(vp, vscales, table, max_pages, b, L), ob));
    }
    return want;
  }
};

TEST(Int8Blocked, SameAnswerAsTheRowsTheyHold) {
  for (const blocked_case& c : kBlockedCases)
    for (const dtype type : {dtype::bf16, dtype::f32}) {
      std::mt19937 rng(53);
      const blocked_cache bc(c, rng);
      const std::int64_t B = bc.B;
      const Tensor &kp = bc.kp, &vp = bc.vp, &kb = bc.kb, &ks = bc.ks, &vs = bc.vs, &tab = bc.tab, &lens = bc.lens;
      const std::vector<std::int64_t>& table = bc.table;
      Tensor q = random_tensor({B, c.Hq, c.Nq, c.D}, type, rng, -2, 2);
      for (std::int64_t b = 0; b < B; ++b)  // small elements, which a 14-bit q rounds (and a 15-bit one otherwise)
        for (std::int64_t h = 0; h < c.Hq; ++h)
          for (std::int64_t i = 0; i < c.Nq; ++i) q.set({b, h, i, 1}, 7.1e-4 * double(1 + h + i));
      const paged_kv_view rows{kp, vp, tab, lens, ks, vs}, blocked{kb, vp, tab, lens, ks, vs};
      const attention_options o = bc.options(rng);
      const auto reference = [&](const Tensor& qq) { return bc.reference(o, qq, vs); };
      const std::vector<attention_result> want = reference(q);
      // float32 q on the blocked keys' byte products: rounded to 14 bits
      const std::vector<attention_result> want14 =
          type == dtype::f32 && c.D % 64 == 0 ? reference(as_int16_rounds(q, 1 / std::sqrt(double(c.D)), 14)) : want;
      for (const std::string& isa : isas()) {
        SCOPED_TRACE(fmt::format("{} {} isa {}", c.name, dtype_name(type), isa));
        const isa_scope scope(isa);
        const detail::cpu::kernel_table& kt = detail::cpu::select_kernels();
        const bool int16 = int16_products(c.D, c.D), in_place = kt.W == 16 && int16;
        const attention_result r = attention_paged(q, blocked, o, {.num_threads = 2});
        const attention_result rr = attention_paged(q, rows, o, {.num_threads = 2});
        double e = 0, er = 0;
        for (std::int64_t b = 0; b < B; ++b) {
          if (c.lens[std::size_t(b)] == 0) continue;
          const Tensor got = Tensor::copy_of(r.out.view().slice(0, b, b + 1), dtype::f64);
          e = std::max(e, relative_error(got, want[std::size_t(b)].out));
          er = std::max(er, relative_error(Tensor::copy_of(rr.out.view().slice(0, b, b + 1), dtype::f64), want[std::size_t(b)].out));
          const Tensor lse = Tensor::copy_of(r.lse.view().slice(0, b, b + 1), dtype::f64);
          EXPECT_TRUE(all_close(lse, (type == dtype::f32 && in_place ? want14 : want)[std::size_t(b)].lse, 2e-5));
        }
        std::printf("blocked keys %s %s %s: max error / max |out| %.3g (rows %.3g)%s\n", c.name, std::string(dtype_name(type)).c_str(),
                    isa.c_str(), e, er, in_place ? ", read in place" : "");
        EXPECT_LT(e, type == dtype::bf16 ? 4e-3 : int16 ? 1e-3 : 2e-5);
        if (in_place) {
          EXPECT_LT(e, er * 1.25 + 1e-6);               // 14-bit q: still below the bf16 output's rounding
          EXPECT_FALSE(all_close(r.lse, rr.lse, 0, 0));  // the blocked q·k ran (the bf16 out may round alike)
        } else {
          EXPECT_TRUE(all_close(r.out, rr.out, 0, 0));  // copied as rows: the rows' bits
          EXPECT_TRUE(all_close(r.lse, rr.lse, 0, 0));
        }
        const attention_result one = attention_paged(q, blocked, o, {.num_threads = 1});
        EXPECT_TRUE(all_close(one.out, r.out, 0, 0));
        EXPECT_TRUE(all_close(one.lse, r.lse, 0, 0));
        if (c.lens[0] < 2) continue;
        Tensor qn = Tensor::copy_of(q);  // NaN and +inf in q: the rows' non-finite pattern
        qn.set({0, 1, 0, 5}, NAN);
        qn.set({B - 1, 0, c.Nq - 1, 3}, INFINITY);
        const Tensor vs2 = Tensor::copy_of(vs), ks2 = Tensor::copy_of(ks);  // a NaN value scale, an inf key scale
        vs2.set({table[0], 0, 0}, NAN);
        ks2.set({table[0], 1, c.Hkv - 1}, INFINITY);
        const paged_kv_view rows2{kp, vp, tab, lens, ks2, vs2}, blocked2{kb, vp, tab, lens, ks2, vs2};
        for (const bool scales : {false, true}) {
          const Tensor& qq = scales ? q : qn;
          const auto g = to_vector(attention_paged(qq, scales ? blocked2 : blocked, o).out);
          const auto f = to_vector(attention_paged(qq, scales ? rows2 : rows, o).out);
          std::int64_t nonfinite = 0;
          for (std::size_t i = 0; i < g.size(); ++i) {
            EXPECT_EQ(std::isnan(g[i]), std::isnan(f[i])) << "at " << i << (scales ? " (scales)" : " (q)");
            EXPECT_EQ(std::isinf(g[i]), std::isinf(f[i])) << "at " << i;
            nonfinite += !std::isfinite(g[i]);
          }
          if (!c.extras) {
            EXPECT_GT(nonfinite, 0);  // (the window hides the first page's keys from every row)
          }
        }
      }
    }
}

// q [B, Hq, Nq, D] as int8_query::int8 rounds it on blocked keys (decode.h, quantise_q_bytes):
// each row of fl32(q · scale) times f = fl32(127 / its largest |value|), that float32 product
// rounded half to even (|q8| <= 127; the kernel rounds it by the conversion, so that no build
// fuses the product into the rounding), times the row's scale fl32(largest / 127) and divided by the scale again —
// float64 rows for the reference with the same scale. scale: what the kernel multiplies q by
// (the call's scale for float32 q; 1 for bfloat16 q, whose scores take the scale instead).
Tensor as_int8_rounds(const Tensor& q, double scale) {
  const std::int64_t B = q.size(0), H = q.size(1), N = q.size(2), D = q.size(3);
  const float s32 = float(scale);
  Tensor r = Tensor::empty({B, H, N, D}, dtype::f64);
  std::vector<float> row(static_cast<std::size_t>(D));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < N; ++i) {
        float m = 0;
        for (std::int64_t x = 0; x < D; ++x) row[std::size_t(x)] = float(q.get({b, h, i, x})) * s32, m = std::max(m, std::fabs(row[std::size_t(x)]));
        const float f = m > 0 ? 127.0f / m : 0.0f, back = m / 127.0f;
        for (std::int64_t x = 0; x < D; ++x) {
          const double q8 = std::clamp(std::nearbyint(double(row[std::size_t(x)] * f)), -127.0, 127.0);
          r.set({b, h, i, x}, q8 * double(back) / scale);
        }
      }
  return r;
}

// int8_query::int8 on blocked keys, where the byte products run (W = 16 with VNNI, head sizes
// of whole units of 64): lse equals the float64 reference on q rounded to 8 bits as documented
// (the weights' rounding does not reach lse), and out stays within the weights' 8-bit bound of
// it; on the same keys as rows, lse equals the reference on q as automatic rounds it and out
// stays within the weights' bound; every other path gives automatic's bits. Negative value scales (written by hand) take the
// second pass of P·V; NaN/±inf in q or a scale give the rows' non-finite pattern; 1 and 2
// threads give the same bits.
TEST(Int8Blocked, EightBitQueryAndWeights) {
  for (const blocked_case& c : kBlockedCases)
    for (const dtype type : {dtype::bf16, dtype::f32}) {
      std::mt19937 rng(61);
      const blocked_cache bc(c, rng);
      const std::int64_t B = bc.B;
      const Tensor &kp = bc.kp, &vp = bc.vp, &kb = bc.kb, &ks = bc.ks, &vs = bc.vs, &tab = bc.tab, &lens = bc.lens;
      const std::vector<std::int64_t>& table = bc.table;
      Tensor vneg = Tensor::copy_of(vs);  // a third of the value scales negative
      for (std::int64_t i = 0; i < vneg.numel(); i += 3) vneg.data_as<float>()[i] = -vneg.data_as<float>()[i];
      const Tensor q = random_tensor({B, c.Hq, c.Nq, c.D}, type, rng, -2, 2);
      const attention_options o = bc.options(rng);
      const auto reference = [&](const Tensor& qq, const Tensor& vscales) { return bc.reference(o, qq, vscales); };
      const Tensor q8 = as_int8_rounds(q, type == dtype::f32 ? 1 / std::sqrt(double(c.D)) : 1.0);
      // q as the rows' int16 products round it: 15 bits for float32 q, exact for bfloat16
      const Tensor q15 = type == dtype::f32 ? as_int16_rounds(q, 1 / std::sqrt(double(c.D)), 15) : Tensor::copy_of(q, dtype::f64);
      for (const bool negative : {false, true}) {
        const Tensor& vsc = negative ? vneg : vs;
        const std::vector<attention_result> want8 = reference(q8, vsc), want15 = reference(q15, vsc);
        paged_kv_view bytes{kb, vp, tab, lens, ks, vsc}, automatic{kb, vp, tab, lens, ks, vsc};
        bytes.query = int8_query::int8;
        for (const std::string& isa : isas()) {
          SCOPED_TRACE(fmt::format("{} {} isa {} negative value scales {}", c.name, dtype_name(type), isa, negative));
          const isa_scope scope(isa);
          const detail::cpu::kernel_table& kt = detail::cpu::select_kernels();
          const bool in_place = kt.W == 16 && int16_products(c.D, c.D);
          const attention_result r = attention_paged(q, bytes, o, {.num_threads = 2});
          const attention_result ra = attention_paged(q, automatic, o, {.num_threads = 2});
          if (!in_place) {  // automatic's path, bit for bit (rows too)
            EXPECT_TRUE(all_close(r.out, ra.out, 0, 0));
            EXPECT_TRUE(all_close(r.lse, ra.lse, 0, 0));
            paged_kv_view rows8{kp, vp, tab, lens, ks, vsc};
            rows8.query = int8_query::int8;
            const paged_kv_view rowsa{kp, vp, tab, lens, ks, vsc};
            EXPECT_TRUE(all_close(attention_paged(q, rows8, o).out, attention_paged(q, rowsa, o).out, 0, 0));
            continue;
          }
          double e = 0;
          for (std::int64_t b = 0; b < B; ++b) {
            if (c.lens[std::size_t(b)] == 0) continue;
            e = std::max(e, relative_error(Tensor::copy_of(r.out.view().slice(0, b, b + 1), dtype::f64), want8[std::size_t(b)].out));
            EXPECT_TRUE(all_close(Tensor::copy_of(r.lse.view().slice(0, b, b + 1), dtype::f64), want8[std::size_t(b)].lse, 2e-5)) << "sequence " << b;
          }
          std::printf("8-bit q and weights %s %s %s%s: max error / max |out| %.3g against the reference on q rounded to 8 bits\n",
                      c.name, std::string(dtype_name(type)).c_str(), isa.c_str(), negative ? " (negative value scales)" : "", e);
          EXPECT_LT(e, 1e-2);
          EXPECT_FALSE(all_close(r.lse, ra.lse, 0, 0));  // the 8-bit q·k ran
          // The rows (keys not blocked): q as automatic rounds it (15 bits; bf16 q exactly), the
          // weights in 8 bits — lse as automatic's reference, out within the weights' bound.
          paged_kv_view rows8{kp, vp, tab, lens, ks, vsc};
          const paged_kv_view rowsa{kp, vp, tab, lens, ks, vsc};
          rows8.query = int8_query::int8;
          const attention_result r8 = attention_paged(q, rows8, o, {.num_threads = 2}), r16 = attention_paged(q, rowsa, o, {.num_threads = 2});
          double er = 0;
          for (std::int64_t b = 0; b < B; ++b) {
            if (c.lens[std::size_t(b)] == 0) continue;
            er = std::max(er, relative_error(Tensor::copy_of(r8.out.view().slice(0, b, b + 1), dtype::f64), want15[std::size_t(b)].out));
            EXPECT_TRUE(all_close(Tensor::copy_of(r8.lse.view().slice(0, b, b + 1), dtype::f64), want15[std::size_t(b)].lse, 2e-5))
                << "rows, sequence " << b;
          }
          std::printf("  rows with 8-bit weights: max error / max |out| %.3g against the reference on q as the rows round it\n", er);
          EXPECT_LT(er, 1e-2);
          EXPECT_FALSE(all_close(r8.out, r16.out, 0, 0));  // the 8-bit weights ran
          const attention_result r8one = attention_paged(q, rows8, o, {.num_threads = 1});
          EXPECT_TRUE(all_close(r8one.out, r8.out, 0, 0));
          const attention_result one = attention_paged(q, bytes, o, {.num_threads = 1});
          EXPECT_TRUE(all_close(one.out, r.out, 0, 0));
          EXPECT_TRUE(all_close(one.lse, r.lse, 0, 0));
          if (negative || c.lens[0] < 2) continue;
          Tensor qn = Tensor::copy_of(q);  // NaN and +inf in q; a NaN value scale, an inf key scale: the rows' pattern
          qn.set({0, 1, 0, 5}, NAN);
          qn.set({B - 1, 0, c.Nq - 1, 3}, INFINITY);
          const Tensor vs2 = Tensor::copy_of(vs), ks2 = Tensor::copy_of(ks);
          vs2.set({table[0], 0, 0}, NAN);
          ks2.set({table[0], 1, c.Hkv - 1}, INFINITY);
          paged_kv_view bytes2{kb, vp, tab, lens, ks2, vs2};
          bytes2.query = int8_query::int8;
          const paged_kv_view rows2{kp, vp, tab, lens, ks2, vs2}, rows{kp, vp, tab, lens, ks, vs};
          for (const bool scales : {false, true}) {
            const auto g = to_vector(attention_paged(scales ? q : qn, scales ? bytes2 : bytes, o).out);
            const auto f = to_vector(attention_paged(scales ? q : qn, scales ? rows2 : rows, o).out);
            for (std::size_t i = 0; i < g.size(); ++i) {
              EXPECT_EQ(std::isnan(g[i]), std::isnan(f[i])) << "at " << i << (scales ? " (scales)" : " (q)");
              EXPECT_EQ(std::isinf(g[i]), std::isinf(f[i])) << "at " << i;
            }
          }
        }
      }
    }
}

// Appending to blocked keys writes the bytes appending to rows writes, in the blocked order, and
// the same scales; explain_backend names the blocked read.
TEST(Int8Blocked, AppendWritesTheRowsBytesBlocked) {
  std::mt19937 rng(59);
  const std::int64_t B = 2, Hkv = 2, D = 64, ps = 32, max_pages = 3, P = B * max_pages;
  const Tensor k = outlier_keys({B, Hkv, 70, D}, rng), v = random_normal({B, Hkv, 70, D}, rng);
  std::vector<std::int64_t> table(static_cast<std::size_t>(P));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const Tensor kr = Tensor::zeros({P, ps, Hkv, D}, dtype::i8), kb = Tensor::zeros({P, ps / 16, Hkv, D / 4, 16, 4}, dtype::i8);
  const Tensor vr = Tensor::zeros({P, ps, Hkv, D}, dtype::i8), vb = Tensor::zeros({P, ps, Hkv, D}, dtype::i8);
  const Tensor ksr = Tensor::zeros({P, ps, Hkv}, dtype::f32), ksb = Tensor::zeros({P, ps, Hkv}, dtype::f32);
  const Tensor vsr = Tensor::zeros({P, ps, Hkv}, dtype::f32), vsb = Tensor::zeros({P, ps, Hkv}, dtype::f32);
  const Tensor tab = index_tensor({B, max_pages}, table), lens = index_tensor({B}, {0, 0});
  const paged_kv_view rows{kr, vr, tab, lens, ksr, vsr}, blocked{kb, vb, tab, lens, ksb, vsb};
  for (const auto& [t0, t1] : {std::pair<std::int64_t, std::int64_t>{0, 21}, {21, 22}, {22, 70}}) {
    paged_kv_append(rows, k.view().slice(2, t0, t1), v.view().slice(2, t0, t1));
    paged_kv_append(blocked, k.view().slice(2, t0, t1), v.view().slice(2, t0, t1));
    for (std::int64_t b = 0; b < B; ++b) lens.data_as<std::int64_t>()[b] = t1;
  }
  EXPECT_TRUE(all_close(to_blocked(kr), kb, 0, 0));
  EXPECT_TRUE(all_close(vr, vb, 0, 0));
  EXPECT_TRUE(all_close(ksr, ksb, 0, 0));
  EXPECT_TRUE(all_close(vsr, vsb, 0, 0));
  const Tensor q = random_tensor({B, 2 * Hkv, 1, D}, dtype::bf16, rng);
  const isa_scope scope("avx512bf16");
  if (detail::cpu::select_kernels().int16_decode && detail::cpu::select_kernels().W == 16) {
    const attention_result r = attention_paged(q, blocked, {}), rr = attention_paged(q, rows, {});
    EXPECT_LT(relative_error(r.out, rr.out), 8e-3);
  }
}

TEST(Int8Errors, BadBlockedKeysByMessage) {
  const Tensor vp = Tensor::zeros({4, 16, 1, 8}, dtype::i8), sc = Tensor::zeros({4, 16, 1}, dtype::f32);
  const Tensor table = index_tensor({1, 2}, {0, 3}), lens = index_tensor({1}, {3});
  const Tensor q = Tensor::zeros({1, 2, 1, 8}, dtype::bf16);
  EXPECT_THROW_MSG(attention_paged(q, {Tensor::zeros({4, 1, 1, 2, 16, 4}, dtype::f32), Tensor::zeros({4, 16, 1, 8}, dtype::f32),
                                       table, lens}),
                   "attention_paged: k_pages is 6-D [4, 1, 1, 2, 16, 4] of dtype float32; blocked keys are int8");
  EXPECT_THROW_MSG(attention_paged(q, {Tensor::zeros({4, 2, 1, 4, 8, 4}, dtype::i8), vp, table, lens, sc, sc}),
                   "attention_paged: k_pages [4, 2, 1, 4, 8, 4] (strides [256, 128, 128, 32, 4, 1]): blocked keys end in "
                   "a contiguous [D / 4, 16, 4] (strides 64, 4, 1)");
  EXPECT_THROW_MSG(attention_paged(q, {Tensor::zeros({4, 2, 1, 2, 16, 4}, dtype::i8), vp, table, lens, sc, sc}),
                   "attention_paged: v_pages has shape [4, 16, 1, 8], expected [4, 32, 1, Dv] to match k_pages [4, 2, 1, 2, 16, 4]");
  EXPECT_THROW_MSG(attention_paged(q, {Tensor::zeros({4, 1, 1, 2, 16, 4}, dtype::i8), Tensor::zeros({4, 1, 1, 2, 16, 4}, dtype::i8),
                                       table, lens, sc, sc}),
                   "attention_paged: k_pages [4, 1, 1, 2, 16, 4] and v_pages [4, 1, 1, 2, 16, 4] must be 4-D");
  EXPECT_THROW_MSG(attention_paged(Tensor::zeros({1, 2, 1, 12}, dtype::bf16),
                                   {Tensor::zeros({4, 1, 1, 2, 16, 4}, dtype::i8), vp, table, lens, sc, sc}),
                   "attention_paged: q has head size 12, k_pages 8; they must match");
}

TEST(Int8Errors, BadScalesAndInputsByMessage) {
  const Tensor kp = Tensor::zeros({4, 2, 1, 4}, dtype::i8), vp = Tensor::zeros({4, 2, 1, 4}, dtype::i8);
  const Tensor sc = Tensor::zeros({4, 2, 1}, dtype::f32);
  const Tensor table = index_tensor({1, 2}, {0, 3}), lens = index_tensor({1}, {3});
  const Tensor q = Tensor::zeros({1, 2, 1, 4}, dtype::f32);
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, lens}),
                   "attention_paged: k_scales is float32 []; int8 pages need float32 [num_pages, page_size, Hkv] = [4, 2, 1]");
  // int8_query by name, and a name that is not one
  EXPECT_EQ(parse_int8_query("float32"), int8_query::float32);
  EXPECT_EQ(parse_int8_query(to_string(int8_query::automatic)), int8_query::automatic);
  EXPECT_EQ(parse_int8_query("int8"), int8_query::int8);
  EXPECT_THROW_MSG(parse_int8_query("int16"), "int8_query: 'int16' is not one of automatic, float32, int8");
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, lens, sc, Tensor::zeros({4, 2, 2}, dtype::f32)}),
                   "attention_paged: v_scales is float32 [4, 2, 2]; int8 pages need float32 [num_pages, page_size, Hkv] = [4, 2, 1]");
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, lens, sc, Tensor::zeros({4, 2, 1}, dtype::f64)}),
                   "v_scales is float64 [4, 2, 1]");
  const Tensor fp = Tensor::zeros({4, 2, 1, 4}, dtype::f32);
  EXPECT_THROW_MSG(attention_paged(q, {fp, fp, table, lens, sc, sc}),
                   "attention_paged: k_scales/v_scales are given but the pages are float32, not int8");
  EXPECT_THROW_MSG(attention_paged(Tensor::zeros({1, 2, 1, 4}, dtype::f64), {kp, vp, table, lens, sc, sc}),
                   "attention_paged: q has dtype float64; int8 pages take float32, bfloat16 or float16 q");
  EXPECT_THROW_MSG(attention_paged(q, {kp, fp, table, lens, sc, sc}), "k_pages/v_pages have dtypes int8/float32");
  attention_options o;
  Tensor wide = Tensor::zeros({1, 2, 1, 4}, dtype::f32);
  wide.set({0, 1, 0, 2}, 5000.0);
  o.attn_mask = wide;
  {  // a row past ±1024 is shifted by its maximum (as the core op shifts it): the bits of the shifted mask
    Tensor pre = Tensor::full({1, 2, 1, 4}, dtype::f32, 0.0);
    pre.set({0, 1, 0, 0}, -5000.0), pre.set({0, 1, 0, 1}, -5000.0), pre.set({0, 1, 0, 3}, -5000.0);
    attention_options op;
    op.attn_mask = pre;
    const attention_result a = attention_paged(q, {kp, vp, table, lens, sc, sc}, o);
    const attention_result b = attention_paged(q, {kp, vp, table, lens, sc, sc}, op);
    EXPECT_TRUE(testing::all_close(a.out, b.out, 0, 0));
    EXPECT_EQ(a.lse.get({0, 1, 0}), b.lse.get({0, 1, 0}) + 5000.0);
  }
  o.attn_mask = Tensor::zeros({1, 2, 1, 4}, dtype::i64);
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, lens, sc, sc}, o),
                   "attention_paged: attn_mask has dtype int64, expected bool or a float dtype");
  o.attn_mask = Tensor::zeros({1, 2, 2, 4}, dtype::boolean);
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, lens, sc, sc}, o),
                   "attention_paged: attn_mask [1, 2, 2, 4] does not broadcast to [B, Hq, Nq, Nk] = [1, 2, 1, 4]");
  o.attn_mask = Tensor::zeros({1, 2, 1, 5}, dtype::boolean);
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, lens, sc, sc}, o),
                   "attention_paged: attn_mask [1, 2, 1, 5] has 5 columns but there are 4 keys");
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, lens, sc, sc}, {}, {.use_backend = backend::reference}),
                   "attention_paged: int8 pages are read by the cpu decode kernel alone; here");
  Tensor bad = Tensor::zeros({1, 1, 1, 4}, dtype::f32);
  bad.set({0, 0, 0, 2}, INFINITY);
  const Tensor ok = Tensor::zeros({1, 1, 1, 4}, dtype::f32);
  EXPECT_THROW_MSG(paged_kv_append({kp, vp, table, lens, sc, sc}, ok, bad),
                   "paged_kv_append: v_new[0, 0, 0, 2] = inf cannot be quantised to int8");
  EXPECT_THROW_MSG(paged_kv_append({kp, vp, table, lens, sc, sc}, Tensor::zeros({1, 1, 1, 4}, dtype::i64), ok),
                   "paged_kv_append: k_new/v_new have dtypes int64/float32; int8 pages quantise one float dtype");
}

// Decode that reads several kv heads of a task together (pages whose head runs are short: in
// groups of 2 for f32 D 128, 4 otherwise; a token-major dense cache: all 4) gives the bits of one
// head at a time (ATTN_DECODE_HEADS=1): the same blocks in the same order for each head, for
// every ISA level, float32, bfloat16 and int8 pages, head sizes on and off the SIMD width, GQA 4
// and split-KV.
TEST(DecodeHeads, InterleavedHeadsGiveTheBitsOfOneHeadAtATime) {
  const std::int64_t B = 2, Hkv = 4, Hq = 16, ps = 16;
  const std::vector<std::int64_t> lens{4200, 77};
  const std::int64_t max_pages = (lens[0] + ps - 1) / ps;
  for (const std::string& isa : isas())
    for (const dtype type : {dtype::f32, dtype::bf16, dtype::i8})
      for (const std::int64_t D : {128, 40}) {
        SCOPED_TRACE(fmt::format("{} {} D {}", isa, dtype_name(type), D));
        const isa_scope scope(isa);
        std::mt19937 rng(41);
        std::vector<std::int64_t> order(std::size_t(B * max_pages));
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        const bool q8 = type == dtype::i8;
        const Shape s{B * max_pages, ps, Hkv, D};
        const Tensor kp = q8 ? random_int8(s, rng) : random_tensor(s, type, rng);
        const Tensor vp = q8 ? random_int8(s, rng) : random_tensor(s, type, rng);
        const Tensor ks = q8 ? random_tensor({B * max_pages, ps, Hkv}, dtype::f32, rng, 0.001, 0.03) : Tensor();
        const Tensor vs = q8 ? random_tensor({B * max_pages, ps, Hkv}, dtype::f32, rng, 0.001, 0.03) : Tensor();
        const Tensor q = random_tensor({B, Hq, 2, D}, q8 ? dtype::bf16 : type, rng);
        const paged_kv_view cache{kp, vp, index_tensor({B, max_pages}, order), index_tensor({B}, lens), ks, vs};
        attention_options o;
        o.is_causal = true, o.alignment = causal_alignment::bottom_right;
        const attention_result heads = attention_paged(q, cache, o);
        attention_result one;
        {
          const env_scope off("ATTN_DECODE_HEADS", "1");
          one = attention_paged(q, cache, o);
        }
        EXPECT_TRUE(all_close(heads.out, one.out, 0, 0));
        EXPECT_TRUE(all_close(heads.lse, one.lse, 0, 0));
        if (q8) continue;
        // A token-major dense cache [B, Nk, Hkv, D] (the first sequence's pages in order) read
        // through its [B, Hkv, Nk, D] view, against a head-major copy of the same values.
        const std::int64_t Nk = 3000;
        const Tensor kt = random_tensor({1, Nk, Hkv, D}, type, rng), vt = random_tensor({1, Nk, Hkv, D}, type, rng);
        const TensorView kv = kt.view().permute({0, 2, 1, 3}), vv = vt.view().permute({0, 2, 1, 3});
        const Tensor q1 = random_tensor({1, Hq, 1, D}, type, rng);
        if (type == dtype::bf16) {
          const std::string how = explain_backend(q1, kv, vv);
          // the 4 interleaved heads read together, in two tasks of 2 (one sequence: at least two
          // tasks, cpu_backend.cc kDecodeTasks)
          EXPECT_NE(how.find("2 kv heads per task"), std::string::npos) << how;
        }
        const attention_result a = attention(q1, kv, vv);
        const attention_result b = attention(q1, Tensor::copy_of(kv), Tensor::copy_of(vv));
        EXPECT_TRUE(all_close(a.out, b.out, 0, 0));
        EXPECT_TRUE(all_close(a.lse, b.lse, 0, 0));
      }
}

}  // namespace
}  // namespace attn

// tests/serving/paged_test.cc — attention_paged equals attn::attention on the same keys laid
// out densely, for shuffled, shared and consecutive pages, partially filled last pages, empty
// sequences, decode and chunked prefill, every alignment, windows, ALiBi and sinks;
// paged_kv_append writes exactly its rows; bad block tables by message.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "attn/attn.h"
#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::index_tensor;
using testing::random_tensor;

// Keys [0, L) of sequence b gathered from the pages into a dense [1, H, L, X].
Tensor gather(const Tensor& pages, const std::vector<std::int64_t>& table, std::int64_t max_pages, std::int64_t b,
              std::int64_t L) {
  const std::int64_t ps = pages.size(1), H = pages.size(2), X = pages.size(3);
  Tensor r = Tensor::empty({1, H, L, X}, pages.type());
  for (std::int64_t j = 0; j < L; ++j)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t x = 0; x < X; ++x)
        r.set({0, h, j, x}, pages.get({table[std::size_t(b * max_pages + j / ps)], j % ps, h, x}));
  return r;
}

// A block table [B, max_pages] over num_pages pages in shuffled order, sequence b holding
// ceil(lens[b] / ps) of them (unused entries -1, never read).
std::vector<std::int64_t> shuffled_table(const std::vector<std::int64_t>& lens, std::int64_t ps, std::int64_t max_pages,
                                         std::int64_t num_pages, std::mt19937& rng) {
  std::vector<std::int64_t> order(static_cast<std::size_t>(num_pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<std::int64_t> table(lens.size() * std::size_t(max_pages), -1);
  std::size_t next = 0;
  for (std::size_t b = 0; b < lens.size(); ++b)
    for (std::int64_t p = 0; p * ps < lens[b]; ++p) table[b * std::size_t(max_pages) + std::size_t(p)] = order[next++];
  return table;
}

struct paged_case {
  const char* name;
  std::vector<std::int64_t> lens;
  std::int64_t page_size, Nq;
  bool shuffle;  // else each sequence's pages are consecutive (one view per run)
  bool share;    // sequence 1 reuses sequence 0's first page (a shared prefix)
  causal_alignment align;
  std::int64_t wl;
  bool alibi, sinks;
  // A boolean attn_mask [B, mask_heads, Nq, K] over the key positions (a tree of draft tokens):
  // mask_cols 0 none, -1 K = the table's capacity, else K = mask_cols (shorter: the keys past it
  // are excluded); about a quarter false, and row (0, 0, 0) all false (a fully masked row).
  std::int64_t mask_cols = 0, mask_heads = 1;
  bool float_mask = false;  // float32: a bias in [-2, 2] where kept, -inf elsewhere
};

const paged_case kCases[] = {
    {"decode_shuffled", {13, 1, 0, 32, 7}, 4, 1, true, false, causal_alignment::bottom_right, -1, false, false},
    {"speculative_shared", {13, 9, 16, 21}, 4, 4, true, true, causal_alignment::bottom_right, -1, false, false},
    {"prefill_chunk_consecutive", {40, 17, 33}, 8, 16, false, false, causal_alignment::bottom_right, -1, false, false},
    {"window_alibi_sinks", {30, 5, 12}, 4, 3, true, true, causal_alignment::after_past, 6, true, true},
    {"top_left", {11, 6}, 4, 5, true, false, causal_alignment::top_left, -1, false, false},
    {"fewer_keys_than_queries", {2, 0, 3, 5}, 4, 4, true, false, causal_alignment::bottom_right, -1, false, true},
    {"prefill_many_rows", {100, 37, 0}, 8, 80, true, false, causal_alignment::bottom_right, 20, false, true},
    {"long_chunks", {2600, 700}, 4, 2, false, false, causal_alignment::bottom_right, -1, false, false},
    // pages of 16 (a multiple of every SIMD width): blocks read in place through the table
    {"page16_window_alibi", {70, 33, 16, 0}, 16, 2, true, true, causal_alignment::bottom_right, 21, true, true},
    {"page16_split_kv", {4200, 300}, 16, 1, true, false, causal_alignment::bottom_right, -1, false, false},
    // boolean masks: decode, a speculative step with a short mask, a gathered prefill chunk, pages
    // of 16 with split-KV, every head its own mask
    {"mask_decode", {13, 1, 0, 32, 7}, 4, 1, true, false, causal_alignment::bottom_right, -1, false, false, -1},
    {"mask_speculative_short", {13, 9, 16, 21}, 4, 4, true, true, causal_alignment::bottom_right, -1, false, true, 18, 4},
    {"mask_prefill_gathered", {100, 37, 0}, 8, 80, true, false, causal_alignment::bottom_right, 20, true, false, -1},
    {"mask_page16_split_kv", {4200, 300}, 16, 3, true, false, causal_alignment::bottom_right, -1, false, false, 4100, 4},
    {"float_mask_decode", {13, 1, 0, 32, 7}, 4, 2, true, false, causal_alignment::bottom_right, -1, false, true, -1, 4, true},
    {"float_mask_gathered", {100, 37, 0}, 8, 80, true, false, causal_alignment::bottom_right, 20, true, false, 90, 1, true},
};

// Names the case in gtest's output instead of dumping its bytes.
void PrintTo(const paged_case& c, std::ostream* os) { *os << c.name; }

// A case's batch: pages of random keys and values (sequence 1 sharing sequence 0's first page
// where c.share), q, the table, and the options with ALiBi [B, Hq], sinks and a mask as c says.
struct paged_batch {
  std::int64_t B = 0, Hq = 4, Hkv = 2, D = 8, Dv = 8, max_pages = 0, K = 0;
  std::vector<std::int64_t> table;
  Tensor kp, vp, q, mask;
  attention_options o;

  paged_batch(const paged_case& c, dtype type) {
    std::mt19937 rng(17);
    B = std::int64_t(c.lens.size());
    const std::int64_t ps = c.page_size;
    std::int64_t used = 0;
    for (std::int64_t L : c.lens) max_pages = std::max(max_pages, (L + ps - 1) / ps + 1), used += (L + ps - 1) / ps;
    const std::int64_t num_pages = used + 3;
    std::vector<std::int64_t> order(static_cast<std::size_t>(num_pages));
    std::iota(order.begin(), order.end(), 0);
    if (c.shuffle) std::shuffle(order.begin(), order.end(), rng);
    table.assign(std::size_t(B * max_pages), -7);  // unused entries are never read
    std::size_t next = 0;
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t p = 0; p * ps < c.lens[std::size_t(b)]; ++p)
        table[std::size_t(b * max_pages + p)] = (c.share && b == 1 && p == 0) ? table[0] : order[next++];
    kp = random_tensor({num_pages, ps, Hkv, D}, type, rng);
    vp = random_tensor({num_pages, ps, Hkv, Dv}, type, rng);
    q = random_tensor({B, Hq, c.Nq, D}, type, rng);
    o.is_causal = true, o.alignment = c.align, o.window_left = c.wl;
    if (c.alibi) o.alibi_slopes = random_tensor({B, Hq}, dtype::f64, rng, 0.1, 0.9);  // one row per sequence
    if (c.sinks) o.sinks = random_tensor({Hq}, dtype::f64, rng);
    K = c.mask_cols < 0 ? max_pages * ps : c.mask_cols;
    if (c.mask_cols) {
      mask = Tensor::empty({B, c.mask_heads, c.Nq, K}, c.float_mask ? dtype::f32 : dtype::boolean);
      std::bernoulli_distribution keep(0.75);
      std::uniform_real_distribution<double> bias(-2.0, 2.0);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t h = 0; h < c.mask_heads; ++h)
          for (std::int64_t i = 0; i < c.Nq; ++i)
            for (std::int64_t j = 0; j < K; ++j) {
              const bool kept = (b || h || i) && keep(rng);
              mask.set({b, h, i, j}, c.float_mask ? (kept ? bias(rng) : -INFINITY) : kept ? 1.0 : 0.0);
            }
      o.attn_mask = mask;
    }
  }
  paged_kv_view cache(const paged_case& c) const {
    return {kp, vp, index_tensor({B, max_pages}, table), index_tensor({B}, c.lens)};
  }
  // What attention() on sequence b's keys laid out densely takes: its ALiBi row, the queries as
  // the last Nq tokens (after_past puts them at L - Nq + i), its mask rows over keys [0, L).
  attention_options sequence_options(const paged_case& c, std::int64_t b) const {
    attention_options ob = o;
    if (c.alibi) ob.alibi_slopes = Tensor::copy_of(o.alibi_slopes->slice(0, b, b + 1).reshape({Hq}));
    ob.alignment = c.align == causal_alignment::top_left ? causal_alignment::top_left : causal_alignment::bottom_right;
    if (c.mask_cols)
      ob.attn_mask = Tensor::copy_of(mask.view().slice(0, b, b + 1).slice(3, 0, std::min(K, c.lens[std::size_t(b)])));
    return ob;
  }
  Tensor keys(std::int64_t b, std::int64_t L) const { return gather(kp, table, max_pages, b, L); }
  Tensor values(std::int64_t b, std::int64_t L) const { return gather(vp, table, max_pages, b, L); }
};

class Paged : public ::testing::TestWithParam<std::tuple<paged_case, dtype>> {};

TEST_P(Paged, EqualsDenseAttention) {
  const auto& [c, type] = GetParam();
  const paged_batch t(c, type);
  const std::int64_t B = t.B, Hq = t.Hq, Dv = t.Dv;
  const paged_kv_view cache = t.cache(c);
  const attention_options& o = t.o;

  const attention_result r = attention_paged(t.q, cache, o);
  ASSERT_EQ(r.out.shape(), (Shape{B, Hq, c.Nq, Dv}));
  const double tol = testing::tolerance_for(type) * 4;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t L = c.lens[std::size_t(b)];
    SCOPED_TRACE(fmt::format("{} sequence {} (L {})", c.name, b, L));
    const Tensor qb = Tensor::copy_of(t.q.view().slice(0, b, b + 1));
    const attention_result want = attention(qb, t.keys(b, L), t.values(b, L), t.sequence_options(c, b));
    EXPECT_TRUE(all_close(Tensor::copy_of(r.out.view().slice(0, b, b + 1)), want.out, tol));
    EXPECT_TRUE(all_close(Tensor::copy_of(r.lse.view().slice(0, b, b + 1)), want.lse, tol));
  }
  // One thread gives the same bits (the partition depends on the shapes only).
  const attention_result one = attention_paged(t.q, cache, o, {.num_threads = 1});
  EXPECT_TRUE(all_close(one.out, r.out, 0, 0));
  if (c.mask_cols) {  // a gathered prefill chunk one kv head of one sequence a pass: the mask's rows of each
    const testing::env_scope small("ATTN_PAGED_GATHER_MIB", "0");
    const attention_result apart = attention_paged(t.q, cache, o);
    EXPECT_TRUE(all_close(apart.out, r.out, tol));
    EXPECT_TRUE(all_close(apart.lse, r.lse, tol));
  }
}

// attention_paged_backward equals attention_backward on each sequence's keys laid out densely:
// dq row by row, dk_pages / dv_pages the dense dk, dv carried back through the table (a shared page
// the sum of both sequences'), zero on rows nobody reads; ALiBi [B, Hq] rows, the sinks summed
// over the sequences, a float mask's gradient per sequence (zeros past its length). The same bits
// on one thread.
TEST_P(Paged, BackwardEqualsDenseBackward) {
  const auto& [c, type] = GetParam();
  const paged_batch t(c, type);
  const std::int64_t B = t.B, Hq = t.Hq, Dv = t.Dv;
  const paged_kv_view cache = t.cache(c);
  std::mt19937 rng(29);
  const Tensor dout = random_tensor({B, Hq, c.Nq, Dv}, type, rng);
  const attention_result r = attention_paged(t.q, cache, t.o);
  {  // a call before whose freed buffers the next may reuse: rows nobody reads must still come back 0
    Tensor big = Tensor::copy_of(dout);
    for (std::int64_t i = 0; i < big.numel(); ++i) store_from_double(big.data(), big.type(), i, 1e3);
    (void)attention_paged_backward(t.q, cache, r.out, big, r.lse, t.o);
  }
  const paged_grads g = attention_paged_backward(t.q, cache, r.out, dout, r.lse, t.o);
  ASSERT_EQ(g.dq.shape(), t.q.shape());
  ASSERT_EQ(g.dk_pages.shape(), t.kp.shape());
  ASSERT_EQ(g.dv_pages.shape(), t.vp.shape());
  EXPECT_EQ(g.dk_pages.type(), type);
  const double tol = testing::tolerance_for(type) * 8;
  const Tensor dk_want = Tensor::zeros(t.kp.shape(), dtype::f64), dv_want = Tensor::zeros(t.vp.shape(), dtype::f64);
  Tensor dalibi_want = t.o.alibi_slopes ? Tensor::zeros({B, Hq}, dtype::f64) : Tensor();
  Tensor dsinks_want = t.o.sinks ? Tensor::zeros({Hq}, dtype::f64) : Tensor();
  const std::int64_t ps = c.page_size;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t L = c.lens[std::size_t(b)];
    SCOPED_TRACE(fmt::format("{} sequence {} (L {})", c.name, b, L));
    const attention_options ob = t.sequence_options(c, b);
    const Tensor qb = Tensor::copy_of(t.q.view().slice(0, b, b + 1)), kb = t.keys(b, L), vb = t.values(b, L);
    const Tensor db = Tensor::copy_of(dout.view().slice(0, b, b + 1));
    const attention_result f = attention(qb, kb, vb, ob);
    const attention_grads want = attention_backward(qb, kb, vb, f.out, db, f.lse, ob);
    EXPECT_TRUE(all_close(Tensor::copy_of(g.dq.view().slice(0, b, b + 1)), want.dq, tol));
    for (std::int64_t j = 0; j < L; ++j)
      for (std::int64_t h = 0; h < t.Hkv; ++h)
        for (std::int64_t x = 0; x < t.D; ++x) {
          const std::int64_t page = t.table[std::size_t(b * t.max_pages + j / ps)];
          dk_want.set({page, j % ps, h, x}, dk_want.get({page, j % ps, h, x}) + want.dk.get({0, h, j, x}));
          dv_want.set({page, j % ps, h, x}, dv_want.get({page, j % ps, h, x}) + want.dv.get({0, h, j, x}));
        }
    for (std::int64_t h = 0; h < Hq && L > 0 && c.Nq > 0; ++h) {
      if (dalibi_want.defined()) dalibi_want.set({b, h}, want.dalibi_slopes.get({h}));
      if (dsinks_want.defined()) dsinks_want.set({h}, dsinks_want.get({h}) + want.dsinks.get({h}));
    }
    if (c.float_mask) {
      const Tensor got = Tensor::copy_of(g.dattn_mask.view().slice(0, b, b + 1));
      const std::int64_t kept = std::min(t.K, L);
      EXPECT_TRUE(all_close(Tensor::copy_of(got.view().slice(3, 0, kept)), want.dattn_mask, tol));
      if (kept < t.K) {
        EXPECT_TRUE(all_close(Tensor::copy_of(got.view().slice(3, kept, t.K)),
                              Tensor::zeros({1, c.mask_heads, c.Nq, t.K - kept}, dtype::f32), 0, 0));
      }
    }
  }
  EXPECT_TRUE(all_close(g.dk_pages, dk_want.to(type), tol));
  EXPECT_TRUE(all_close(g.dv_pages, dv_want.to(type), tol));
  if (dalibi_want.defined()) {
    EXPECT_TRUE(all_close(g.dalibi_slopes, dalibi_want, tol));
  }
  if (dsinks_want.defined()) {
    EXPECT_TRUE(all_close(g.dsinks, dsinks_want, tol));
  }
  EXPECT_EQ(g.dattn_mask.defined(), c.float_mask);
  const paged_grads one = attention_paged_backward(t.q, cache, r.out, dout, r.lse, t.o, {.num_threads = 1});
  EXPECT_TRUE(all_close(one.dq, g.dq, 0, 0));
  EXPECT_TRUE(all_close(one.dk_pages, g.dk_pages, 0, 0));
  EXPECT_TRUE(all_close(one.dv_pages, g.dv_pages, 0, 0));
  if (c.float_mask) {
    EXPECT_TRUE(all_close(one.dattn_mask, g.dattn_mask, 0, 0));
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, Paged,
                         ::testing::Combine(::testing::ValuesIn(kCases),
                                            ::testing::Values(dtype::f32, dtype::f64, dtype::bf16)),
                         [](const auto& info) {
                           return fmt::format("{}_{}", std::get<0>(info.param).name,
                                              dtype_name(std::get<1>(info.param)));
                         });

// A prefill chunk over float32 or bfloat16 pages (160 query rows per kv head here: more than
// decode's passes pay for) gathers the pages into rows and runs as dense prefill: the same answer
// as attention() on the dense keys, whatever the gather's budget (every sequence in one pass here;
// ATTN_PAGED_GATHER_MIB=0: one kv head of one sequence a pass) and the thread count, token- and
// head-major pages; rows past a sequence's length in its last page and unused pages hold NaN,
// which nothing may read.
TEST(PagedGather, PrefillChunksAsDenseInAnyPass) {
  for (const dtype type : {dtype::f32, dtype::bf16})
  for (const bool head_major : {false, true}) {
    std::mt19937 rng(41);
    const std::vector<std::int64_t> lens{300, 0, 77, 9};  // 9 < Nq: the first queries see no key
    const std::int64_t B = 4, Hq = 8, Hkv = 2, D = 16, Dv = 24, ps = 16, Nq = 40, max_pages = 20, num_pages = 48;
    const std::vector<std::int64_t> table = shuffled_table(lens, ps, max_pages, num_pages, rng);
    // head-major: storage [num_pages, Hkv, ps, X] seen as [num_pages, ps, Hkv, X]
    const Tensor kbuf = random_tensor(head_major ? Shape{num_pages, Hkv, ps, D} : Shape{num_pages, ps, Hkv, D}, type, rng);
    const Tensor vbuf = random_tensor(head_major ? Shape{num_pages, Hkv, ps, Dv} : Shape{num_pages, ps, Hkv, Dv}, type, rng);
    const TensorView kp = head_major ? kbuf.view().permute({0, 2, 1, 3}) : kbuf.view();
    const TensorView vp = head_major ? vbuf.view().permute({0, 2, 1, 3}) : vbuf.view();
    std::vector<bool> used(num_pages * ps, false);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < lens[std::size_t(b)]; ++j) used[std::size_t(table[std::size_t(b * max_pages + j / ps)] * ps + j % ps)] = true;
    for (std::int64_t r = 0; r < num_pages * ps; ++r)
      if (!used[std::size_t(r)])
        for (std::int64_t h = 0; h < Hkv; ++h) kp.set({r / ps, r % ps, h, 0}, NAN), vp.set({r / ps, r % ps, h, 1}, NAN);
    const Tensor kd = Tensor::copy_of(kp), vd = Tensor::copy_of(vp);  // (token-major, for gather below)
    const Tensor q = random_tensor({B, Hq, Nq, D}, type, rng);
    const paged_kv_view cache{kp, vp, index_tensor({B, max_pages}, table), index_tensor({B}, lens)};
    attention_options o;
    o.is_causal = true, o.alignment = causal_alignment::bottom_right;
    o.alibi_slopes = random_tensor({Hq}, dtype::f64, rng, 0.1, 0.9);
    o.sinks = random_tensor({Hq}, dtype::f64, rng);  // (a pass of some heads takes their sinks)
    const attention_result all = attention_paged(q, cache, o);
    const attention_result one = attention_paged(q, cache, o, {.num_threads = 1});
    EXPECT_TRUE(all_close(one.out, all.out, 0, 0)) << dtype_name(type);
    EXPECT_TRUE(all_close(one.lse, all.lse, 0, 0)) << dtype_name(type);
    const testing::env_scope small("ATTN_PAGED_GATHER_MIB", "0");
    const attention_result apart = attention_paged(q, cache, o);
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t L = lens[std::size_t(b)];
      SCOPED_TRACE(fmt::format("{} {} sequence {} (L {})", dtype_name(type), head_major ? "head-major" : "token-major", b, L));
      const Tensor qb = Tensor::copy_of(q.view().slice(0, b, b + 1));
      const attention_result want = attention(qb, gather(kd, table, max_pages, b, L), gather(vd, table, max_pages, b, L), o);
      for (const attention_result* r : {&all, &apart}) {
        EXPECT_FALSE(testing::any_nan(r->out));
        EXPECT_TRUE(all_close(Tensor::copy_of(r->out.view().slice(0, b, b + 1)), want.out, testing::tolerance_for(type) * 4));
        EXPECT_TRUE(all_close(Tensor::copy_of(r->lse.view().slice(0, b, b + 1)), want.lse, testing::tolerance_for(type) * 4));
      }
    }
  }
}

// Appending writes rows [L_b, L_b + Nnew) through the table and nothing else; decoding token by
// token through the pages equals one causal call on the dense keys.
TEST(PagedAppend, WritesOnlyItsRowsAndDecodesLikeDense) {
  std::mt19937 rng(23);
  const std::int64_t B = 2, Hq = 2, Hkv = 1, D = 4, ps = 3, max_pages = 4, T = 7;
  const Tensor kp = Tensor::zeros({9, ps, Hkv, D}, dtype::f64), vp = Tensor::zeros({9, ps, Hkv, D}, dtype::f64);
  const std::vector<std::int64_t> table{5, 2, 8, 0, 1, 7, 3, 6};
  const Tensor lens = index_tensor({B}, {0, 0});
  const paged_kv_view cache{kp, vp, index_tensor({B, max_pages}, table), lens};
  const Tensor k = random_tensor({B, Hkv, T, D}, dtype::f64, rng), v = random_tensor({B, Hkv, T, D}, dtype::f64, rng);
  const Tensor q = random_tensor({B, Hq, T, D}, dtype::f64, rng);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const attention_result dense = attention(q, k, v, o);
  for (std::int64_t t = 0; t < T; ++t) {
    const Tensor before = Tensor::copy_of(kp);
    paged_kv_append(cache, k.view().slice(2, t, t + 1), v.view().slice(2, t, t + 1));
    std::int64_t changed = 0;
    for (std::int64_t i = 0; i < kp.numel(); ++i) changed += kp.data_as<double>()[i] != before.data_as<double>()[i];
    EXPECT_EQ(changed, B * Hkv * D) << "step " << t;
    for (std::int64_t b = 0; b < B; ++b) lens.data_as<std::int64_t>()[b] += 1;
    const attention_result r = attention_paged(q.view().slice(2, t, t + 1), cache, o);
    EXPECT_TRUE(all_close(r.out, Tensor::copy_of(dense.out.view().slice(2, t, t + 1)), 1e-12)) << "step " << t;
  }
}

// Pages of any strides: a head-major buffer [num_pages, Hkv, page_size, D] passed as the view
// [num_pages, page_size, Hkv, D] gives the same result as token-major pages with the same values.
TEST(PagedViews, HeadMajorPages) {
  std::mt19937 rng(29);
  const std::int64_t P = 6, ps = 4, Hkv = 2, D = 8;
  const Tensor head_major = random_tensor({P, Hkv, ps, D}, dtype::f32, rng);
  const TensorView kv = head_major.view().permute({0, 2, 1, 3});
  const Tensor token_major = Tensor::copy_of(kv);
  const Tensor table = index_tensor({2, 3}, {4, 0, 2, 5, 1, 3}), lens = index_tensor({2}, {10, 7});
  const Tensor q = random_tensor({2, 4, 3, D}, dtype::f32, rng);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const attention_result a = attention_paged(q, {kv, kv, table, lens}, o);
  const attention_result b = attention_paged(q, {token_major, token_major, table, lens}, o);
  EXPECT_TRUE(all_close(a.out, b.out, 1e-6));
  EXPECT_TRUE(all_close(a.lse, b.lse, 1e-6));
}

// A NaN in one page reaches the output as the dense op gives it (whatever the core op's NaN
// contract): a partial result's NaN is never merged away.
TEST(PagedViews, NanInAPageAsDense) {
  for (const bool in_keys : {false, true}) {
    std::mt19937 rng(31);
    const Tensor kp = random_tensor({4, 2, 1, 4}, dtype::f32, rng), vp = random_tensor({4, 2, 1, 4}, dtype::f32, rng);
    (in_keys ? kp : vp).set({2, 1, 0, 3}, NAN);  // page 2, row 1: key position 1 of the sequence below
    const std::vector<std::int64_t> table{2, 0, 3};
    const Tensor q = random_tensor({1, 1, 1, 4}, dtype::f32, rng);
    const attention_result r = attention_paged(q, {kp, vp, index_tensor({1, 3}, table), index_tensor({1}, {6})});
    const attention_result want = attention(q, gather(kp, table, 3, 0, 6), gather(vp, table, 3, 0, 6));
    if (!in_keys) {
      EXPECT_TRUE(testing::any_nan(want.out));
    }
    EXPECT_TRUE(all_close(r.out, want.out, 1e-5)) << (in_keys ? "NaN key" : "NaN value");
    EXPECT_TRUE(all_close(r.lse, want.lse, 1e-5)) << (in_keys ? "NaN key" : "NaN value");
  }
}

// A NaN or inf in the value of a kept key whose weight underflows to 0 (scores 1600 apart)
// reaches the output as the core op's IEEE sum gives it (0 · NaN, 0 · inf = NaN), also where the
// key sits in a run of pages of its own whose partial result merges with weight 0 (float64 and
// float16 pages: the runs path; float32: the decode kernel). serving_fuzz found the merge
// skipping such a partial.
TEST(PagedViews, SpecialValueOfAnUnderflowedKeyAsDense) {
  for (const dtype t : {dtype::f64, dtype::f16, dtype::f32})
    for (const double special : {double(NAN), double(INFINITY)}) {
      SCOPED_TRACE(fmt::format("{}, value {}", dtype_name(t), special));
      Tensor kp = Tensor::zeros({3, 1, 1, 1}, t), vp = Tensor::zeros({3, 1, 1, 1}, t);
      kp.set({0, 0, 0, 0}, 800.0), kp.set({2, 0, 0, 0}, -800.0);  // key 0 on page 0, key 1 on page 2
      vp.set({0, 0, 0, 0}, 2.0), vp.set({2, 0, 0, 0}, special);
      const std::vector<std::int64_t> table{0, 2};  // two runs: pages 0 and 2 are not adjacent
      const Tensor q = Tensor::full({1, 1, 1, 1}, t, 1.0);
      attention_options o;
      o.scale = 1.0;
      const attention_result r = attention_paged(q, {kp, vp, index_tensor({1, 2}, table), index_tensor({1}, {2})}, o);
      const attention_result want = attention(q, gather(kp, table, 2, 0, 2), gather(vp, table, 2, 0, 2), o);
      EXPECT_TRUE(testing::any_nan(want.out));
      EXPECT_TRUE(testing::any_nan(r.out));
      EXPECT_TRUE(all_close(r.lse, want.lse, 1e-6));
    }
}

// Special values as attn::attention gives them: a query whose q·k overflows float32 (scores of
// ±inf in the cpu kernels, finite in float64) is answered as attention() on the sequence's keys
// laid out densely answers it — pages read in place by the decode kernel (pages of 16, unit
// stride), pages in runs (pages of 4, head-major), and a prefill chunk.
TEST(PagedViews, SpecialValuesAsAttention) {
  for (const std::int64_t ps : {16, 4})
    for (const std::int64_t Nq : {1, 3}) {
      SCOPED_TRACE(fmt::format("page size {}, Nq {}", ps, Nq));
      std::mt19937 rng(37);
      const std::int64_t Hkv = 2, D = 8, P = 6;
      // head-major storage [P, Hkv, ps, D] viewed as [P, ps, Hkv, D] for pages of 4 (the run path)
      const Tensor kbuf = random_tensor(ps == 4 ? Shape{P, Hkv, ps, D} : Shape{P, ps, Hkv, D}, dtype::f32, rng);
      const Tensor vbuf = random_tensor(kbuf.shape(), dtype::f32, rng);
      const TensorView kp = ps == 4 ? kbuf.view().permute({0, 2, 1, 3}) : kbuf.view();
      const TensorView vp = ps == 4 ? vbuf.view().permute({0, 2, 1, 3}) : vbuf.view();
      const std::vector<std::int64_t> table{3, 0, 5, 1, 4, 2};  // sequence 0: pages 3 0 5, sequence 1: 1 4 2
      const std::vector<std::int64_t> lens{2 * ps + 1, ps + 3};
      Tensor q = random_tensor({2, 4, Nq, D}, dtype::f32, rng);
      const Tensor kcopy = Tensor::copy_of(kp);
      for (std::int64_t d = 0; d < D; ++d) {
        q.set({1, 3, Nq - 1, d}, 3e19);                       // sequence 1, head 3 (kv head 1)
        kcopy.set({4, 1, 1, d}, 2e19);                         // its key ps + 1 (page 4, row 1)
      }
      const Tensor kb = ps == 4 ? Tensor::copy_of(kcopy.view().permute({0, 2, 1, 3})) : kcopy;  // back to storage
      const TensorView kv = ps == 4 ? kb.view().permute({0, 2, 1, 3}) : kb.view();
      attention_options o;
      o.is_causal = true, o.alignment = causal_alignment::bottom_right;
      const attention_result r =
          attention_paged(q, {kv, vp, index_tensor({2, 3}, table), index_tensor({2}, lens)}, o, {.num_threads = 2});
      for (std::int64_t b = 0; b < 2; ++b) {
        const std::int64_t L = lens[std::size_t(b)];
        const Tensor qb = Tensor::copy_of(q.view().slice(0, b, b + 1));
        const Tensor kd = gather(Tensor::copy_of(kv), table, 3, b, L), vd = gather(Tensor::copy_of(vp), table, 3, b, L);
        const attention_result want = attention(qb, kd, vd, o);
        EXPECT_FALSE(testing::any_nan(want.out)) << "sequence " << b;
        EXPECT_TRUE(all_close(Tensor::copy_of(r.out.view().slice(0, b, b + 1)), want.out, 1e-6)) << "sequence " << b;
        EXPECT_TRUE(all_close(Tensor::copy_of(r.lse.view().slice(0, b, b + 1)), want.lse, 1e-6)) << "sequence " << b;
      }
    }
}

// Float masks beyond ±1024 (HF's finfo.min where a key is not kept, a row that keeps no key, rows
// of a large offset), with and without sinks: decode steps read in the kernel and a prefill
// chunk, f32, bf16 and f64 (the reference, run by runs and merged), equal attention() on each
// sequence's gathered keys with its rows of the mask. Positions past a sequence's length hold
// the row's masked value (the shift is each row's largest value over all its columns).
TEST(PagedWideMask, HfRowsAndOffsetsAsDense) {
  const double lowest = -3.4028234663852886e38;
  for (const dtype type : {dtype::f32, dtype::bf16, dtype::f64})
    for (const std::int64_t Nq : {std::int64_t(2), std::int64_t(40)})
      for (const bool with_sinks : {false, true}) {
        SCOPED_TRACE(fmt::format("{} Nq {} sinks {}", dtype_name(type), Nq, with_sinks));
        std::mt19937 rng(53);
        const std::vector<std::int64_t> lens{45, 13, 0, 61};
        const std::int64_t B = 4, Hq = 4, Hkv = 2, D = 8, ps = 8, max_pages = 9, num_pages = 20;
        const std::vector<std::int64_t> table = shuffled_table(lens, ps, max_pages, num_pages, rng);
        const Tensor kp = random_tensor({num_pages, ps, Hkv, D}, type, rng), vp = random_tensor({num_pages, ps, Hkv, D}, type, rng);
        const Tensor q = random_tensor({B, Hq, Nq, D}, type, rng);
        const std::int64_t K = max_pages * ps;
        Tensor mask = Tensor::empty({B, 1, Nq, K}, dtype::f32);
        std::uniform_real_distribution<double> u(0.0, 1.0);
        for (std::int64_t b = 0; b < B; ++b)
          for (std::int64_t i = 0; i < Nq; ++i)
            for (std::int64_t j = 0; j < K; ++j) {
              const bool offset = i % 3 == 2, kept = i % 3 != 1 && j < lens[std::size_t(b)] && u(rng) < 0.7;
              // row i % 3 == 1: no key kept; == 2: kept keys at 5000 + x, the others -inf; 0 in
              // the columns past the sequence's length (a row's shift is taken over its keys)
              const double x = offset ? (kept ? 5000.0 + u(rng) : -INFINITY) : kept ? 0.0 : lowest;
              mask.set({b, 0, i, j}, j < lens[std::size_t(b)] ? x : 0.0);
            }
        attention_options o;
        o.is_causal = true, o.alignment = causal_alignment::bottom_right;
        o.attn_mask = mask;
        if (with_sinks) o.sinks = random_tensor({Hq}, dtype::f64, rng, -1.0, 1.0);
        const attention_result r =
            attention_paged(q, {kp, vp, index_tensor({B, max_pages}, table), index_tensor({B}, lens)}, o);
        EXPECT_FALSE(testing::any_nan(r.out));
        const double tol = testing::tolerance_for(type) * 4;
        for (std::int64_t b = 0; b < B; ++b) {
          const std::int64_t L = lens[std::size_t(b)];
          SCOPED_TRACE(fmt::format("sequence {} (L {})", b, L));
          attention_options ob = o;
          ob.attn_mask = Tensor::copy_of(mask.view().slice(0, b, b + 1).slice(3, 0, L));
          const attention_result want = attention(Tensor::copy_of(q.view().slice(0, b, b + 1)),
                                                  gather(kp, table, max_pages, b, L), gather(vp, table, max_pages, b, L), ob);
          EXPECT_TRUE(all_close(Tensor::copy_of(r.out.view().slice(0, b, b + 1)), want.out, tol));
          EXPECT_TRUE(all_close(Tensor::copy_of(r.lse.view().slice(0, b, b + 1)), want.lse, tol));
        }
      }
}

TEST(PagedErrors, BadTablesByMessage) {
  const Tensor kp = Tensor::zeros({4, 2, 1, 4}, dtype::f32), vp = Tensor::zeros({4, 2, 1, 4}, dtype::f32);
  const Tensor q = Tensor::zeros({2, 2, 1, 4}, dtype::f32);
  const Tensor table = index_tensor({2, 2}, {0, 3, 1, 9});
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, index_tensor({2}, {4, 3})}),
                   "attention_paged: block_table[1, 1] = 9 is outside [0, num_pages = 4)");
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, index_tensor({2}, {5, 1})}),
                   "attention_paged: seq_lens[0] = 5 is beyond the block table's capacity 4 (max_pages 2 · page_size 2)");
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, index_tensor({2}, {-1, 1})}), "seq_lens[0] = -1");
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, Tensor::zeros({2, 2}, dtype::f32), index_tensor({2}, {1, 1})}),
                   "attention_paged: block_table has dtype float32, expected int64");
  EXPECT_THROW_MSG(attention_paged(q, {kp, vp, table, index_tensor({3}, {1, 1, 1})}),
                   "block_table has shape [2, 2] but seq_lens has B = 3 entries");
  EXPECT_THROW_MSG(attention_paged(Tensor::zeros({2, 2, 1, 5}, dtype::f32), {kp, vp, table, index_tensor({2}, {1, 1})}),
                   "attention_paged: q has head size 5, k_pages 4");
  const Tensor one = Tensor::zeros({2, 1, 1, 4}, dtype::f32);
  EXPECT_THROW_MSG(paged_kv_append({kp, vp, table, index_tensor({2}, {4, 1})}, one, one),
                   "paged_kv_append: seq_lens[0] = 4 with 1 new tokens is beyond the block table's capacity 4");
  EXPECT_THROW_MSG(paged_kv_append({kp, vp, table, index_tensor({2}, {1, 1})}, one, Tensor::zeros({2, 1, 1, 4}, dtype::f64)),
                   "paged_kv_append: k_new/v_new have dtypes float32/float64, expected float32 like the pages");
  EXPECT_THROW_MSG(paged_kv_append({kp, vp, table, index_tensor({2}, {1, 1})}, one, Tensor::zeros({2, 1, 2, 4}, dtype::f32)),
                   "paged_kv_append: v_new has shape [2, 1, 2, 4], expected [2, 1, 1, 4]");
  EXPECT_THROW_MSG(paged_kv_append({kp, vp, table, index_tensor({2}, {1, 2})}, one, one),
                   "paged_kv_append: block_table[1, 1] = 9 is outside [0, num_pages = 4)");
}

// A block table may name one page twice within a sequence (and in another): every reader of a
// token slot adds its gradient there (found by serving_fuzz when the first writer of a slot was
// decided per sequence: the second reading in the same sequence overwrote the first).
TEST(PagedBackward, APageNamedTwiceInOneSequenceSumsBothReadings) {
  std::mt19937 rng(61);
  const std::int64_t ps = 5, Hq = 2, Nq = 4, D = 4, Dv = 9;
  const std::vector<std::int64_t> table{0, 0, 2, 0}, lens{7, 9};  // sequence 0: page 0 twice; 1: pages 2, 0
  const Tensor kp = random_tensor({3, ps, 1, D}, dtype::f32, rng), vp = random_tensor({3, ps, 1, Dv}, dtype::f32, rng);
  const Tensor q = random_tensor({2, Hq, Nq, D}, dtype::f32, rng), dout = random_tensor({2, Hq, Nq, Dv}, dtype::f32, rng);
  const paged_kv_view cache{kp, vp, index_tensor({2, 2}, table), index_tensor({2}, lens)};
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  const attention_result r = attention_paged(q, cache, o);
  const paged_grads g = attention_paged_backward(q, cache, r.out, dout, r.lse, o);
  Tensor want = Tensor::zeros(kp.shape(), dtype::f64);
  for (std::int64_t b = 0; b < 2; ++b) {
    const std::int64_t L = lens[std::size_t(b)];
    const Tensor qb = Tensor::copy_of(q.view().slice(0, b, b + 1)), kb = gather(kp, table, 2, b, L), vb = gather(vp, table, 2, b, L);
    const attention_result f = attention(qb, kb, vb, o);
    const attention_grads gb = attention_backward(qb, kb, vb, f.out, Tensor::copy_of(dout.view().slice(0, b, b + 1)), f.lse, o);
    for (std::int64_t j = 0; j < L; ++j)
      for (std::int64_t x = 0; x < D; ++x) {
        const std::int64_t page = table[std::size_t(b * 2 + j / ps)];
        want.set({page, j % ps, 0, x}, want.get({page, j % ps, 0, x}) + gb.dk.get({0, 0, j, x}));
      }
  }
  EXPECT_TRUE(all_close(g.dk_pages, want.to(dtype::f32), 1e-5));
}

TEST(PagedErrors, BackwardBadInputsByMessage) {
  const Tensor kp = Tensor::zeros({4, 2, 1, 4}, dtype::f32), vp = Tensor::zeros({4, 2, 1, 4}, dtype::f32);
  const Tensor q = Tensor::zeros({2, 2, 1, 4}, dtype::f32), out = Tensor::zeros({2, 2, 1, 4}, dtype::f32);
  const Tensor lse = Tensor::zeros({2, 2, 1}, dtype::f32);
  const paged_kv_view cache{kp, vp, index_tensor({2, 2}, {0, 3, 1, 2}), index_tensor({2}, {4, 3})};
  const char* op = "attention_paged_backward: ";
  EXPECT_THROW_MSG(attention_paged_backward(q, cache, Tensor::zeros({2, 2, 2, 4}, dtype::f32), out, lse),
                   fmt::format("{}out has shape [2, 2, 2, 4], expected [2, 2, 1, 4]", op));
  EXPECT_THROW_MSG(attention_paged_backward(q, cache, out, Tensor::zeros({2, 2, 1, 3}, dtype::f32), lse),
                   fmt::format("{}dout has shape [2, 2, 1, 3], expected [2, 2, 1, 4]", op));
  EXPECT_THROW_MSG(attention_paged_backward(q, cache, out, out, Tensor::zeros({2, 2}, dtype::f32)),
                   fmt::format("{}lse has shape [2, 2], expected [B, Hq, Nq] = [2, 2, 1]", op));
  EXPECT_THROW_MSG(attention_paged_backward(q, cache, out, out, Tensor::zeros({2, 2, 1}, dtype::bf16)),
                   fmt::format("{}lse has dtype bfloat16, expected float32 or float64", op));
  EXPECT_THROW_MSG(attention_paged_backward(q, {kp, vp, cache.block_table, index_tensor({2}, {5, 1})}, out, out, lse),
                   fmt::format("{}seq_lens[0] = 5 is beyond the block table's capacity 4", op));
  attention_options bad_mask;
  bad_mask.attn_mask = Tensor::zeros({3, 1, 1, 4}, dtype::f32);
  EXPECT_THROW_MSG(attention_paged_backward(q, cache, out, out, lse, bad_mask), "attention_paged_backward: attn_mask");
  const Tensor k8 = Tensor::zeros({4, 2, 1, 4}, dtype::i8), s8 = Tensor::zeros({4, 2, 1}, dtype::f32);
  EXPECT_THROW_MSG(attention_paged_backward(q, {k8, k8, cache.block_table, cache.seq_lens, s8, s8}, out, out, lse),
                   fmt::format("{}int8 pages are a quantised cache and have no gradient", op));
}

// A mixed batch — decode steps, prefill chunks, a sequence with nothing new — packed with
// cu_seqlens_q equals attention_paged on each sequence alone with its own Nq (out and lse), with
// causal bottom-right alignment, ALiBi [B, Hq], sinks, GQA and shuffled shared pages, f32 and bf16.
// A mixed batch's block table: sequence b's pages (lens[b] keys, pages of ps) drawn from a shuffled
// order of used + spare pages; cu: the cumulative query counts nq.
struct mixed_batch {
  std::vector<std::int64_t> table, cu{0};
  std::int64_t used = 0;  // pages the sequences read (the pages tensor holds used + spare)
};
mixed_batch shuffled_pages(const std::vector<std::int64_t>& lens, const std::vector<std::int64_t>& nq, std::int64_t ps,
                           std::int64_t max_pages, std::int64_t spare, std::mt19937& rng) {
  mixed_batch r;
  for (std::int64_t L : lens) r.used += (L + ps - 1) / ps;
  std::vector<std::int64_t> order(static_cast<std::size_t>(r.used + spare));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  r.table.assign(lens.size() * std::size_t(max_pages), 0);
  std::size_t next = 0;
  for (std::size_t b = 0; b < lens.size(); ++b) {
    for (std::int64_t p = 0; p * ps < lens[b]; ++p) r.table[b * std::size_t(max_pages) + std::size_t(p)] = order[next++];
    r.cu.push_back(r.cu.back() + nq[b]);
  }
  return r;
}

TEST(PagedVarlen, MixedBatchEqualsEachSequenceAlone) {
  const std::vector<std::int64_t> nq{1, 3, 0, 1, 7, 1}, lens{9, 20, 4, 1, 33, 16};
  const std::int64_t B = 6, Hq = 4, Hkv = 2, D = 8, Dv = 8, ps = 4, max_pages = 10;
  for (const dtype type : {dtype::f32, dtype::bf16}) {
    SCOPED_TRACE(dtype_name(type));
    std::mt19937 rng(37);
    const mixed_batch mb = shuffled_pages(lens, nq, ps, max_pages, 2, rng);
    std::vector<std::int64_t> table = mb.table;
    const std::vector<std::int64_t>& cu = mb.cu;
    const std::int64_t used = mb.used;
    table[std::size_t(3 * max_pages)] = table[0];  // sequence 3 shares sequence 0's first page
    const std::int64_t total = cu.back();
    const Tensor kp = random_tensor({used + 2, ps, Hkv, D}, type, rng), vp = random_tensor({used + 2, ps, Hkv, Dv}, type, rng);
    const Tensor q = random_tensor({total, Hq, D}, type, rng);
    const Tensor tab = index_tensor({B, max_pages}, table), lt = index_tensor({B}, lens);
    attention_options o;
    o.is_causal = true, o.alignment = causal_alignment::bottom_right;
    o.alibi_slopes = random_tensor({B, Hq}, dtype::f64, rng, 0.1, 0.9);
    o.sinks = random_tensor({Hq}, dtype::f64, rng);
    const varlen_result r = attention_paged_varlen(q, index_tensor({B + 1}, cu), 7, {kp, vp, tab, lt}, o);
    const auto reshaped = [](const TensorView& v, Shape s) { return Tensor::copy_of(Tensor::copy_of(v).view().reshape(s)); };
    ASSERT_EQ(r.out.shape(), (Shape{total, Hq, Dv}));
    ASSERT_EQ(r.lse.shape(), (Shape{Hq, total}));
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t n = nq[std::size_t(b)], c0 = cu[std::size_t(b)];
      if (n == 0) continue;
      SCOPED_TRACE(fmt::format("sequence {} (Nq {}, {} keys)", b, n, lens[std::size_t(b)]));
      const Tensor qb = reshaped(q.view().slice(0, c0, c0 + n).permute({1, 0, 2}), {1, Hq, n, D});
      std::vector<std::int64_t> row(table.begin() + b * max_pages, table.begin() + (b + 1) * max_pages);
      attention_options ob = o;
      ob.alibi_slopes = Tensor::copy_of(o.alibi_slopes->slice(0, b, b + 1));
      const attention_result want = attention_paged(
          qb, {kp, vp, index_tensor({1, max_pages}, row), index_tensor({1}, {lens[std::size_t(b)]})}, ob);
      const Tensor got = reshaped(r.out.view().slice(0, c0, c0 + n).permute({1, 0, 2}), {1, Hq, n, Dv});
      const Tensor got_lse = reshaped(r.lse.view().slice(1, c0, c0 + n), {1, Hq, n});
      EXPECT_TRUE(all_close(got, want.out, testing::tolerance_for(type)));
      EXPECT_TRUE(all_close(got_lse, want.lse, testing::tolerance_for(type)));
    }
  }
}

TEST(PagedVarlen, BadInputsByMessage) {
  const Tensor kp = Tensor::zeros({4, 2, 1, 4}, dtype::f32), vp = Tensor::zeros({4, 2, 1, 4}, dtype::f32);
  const Tensor table = index_tensor({2, 2}, {0, 3, 1, 2}), lens = index_tensor({2}, {3, 2});
  const Tensor q = Tensor::zeros({3, 2, 4}, dtype::f32);
  EXPECT_THROW_MSG(attention_paged_varlen(q, index_tensor({3}, {0, 1, 3}), 1, {kp, vp, table, lens}),
                   "attention_paged_varlen: sequence 1 has length 2 (cu_seqlens_q[2] - cu_seqlens_q[1]), more than max_seqlen = 1");
  EXPECT_THROW_MSG(attention_paged_varlen(q, index_tensor({3}, {0, 1, 2}), 4, {kp, vp, table, lens}),
                   "cu_seqlens_q[2] = 2 but the packed tensor has 3 tokens");
  EXPECT_THROW_MSG(attention_paged_varlen(q, index_tensor({2}, {0, 3}), 4, {kp, vp, table, lens}),
                   "cu_seqlens_q has B + 1 = 2 entries but block_table has shape [2, 2] and seq_lens [2]");
  EXPECT_THROW_MSG(attention_paged_varlen(Tensor::zeros({1, 3, 2, 4}, dtype::f32), index_tensor({2}, {0, 1}), 4,
                                          {kp, vp, table, lens}),
                   "attention_paged_varlen: q has shape [1, 3, 2, 4], expected [total_q, Hq, D]");
  EXPECT_THROW_MSG(attention_paged_varlen(q, index_tensor({3}, {0, 1, 3}), 4, {kp, vp, table, index_tensor({2}, {9, 2})}),
                   "attention_paged_varlen: seq_lens[0] = 9 is beyond the block table's capacity 4");
  // The whole cache is checked, under this op's name, before any group runs: a sequence with no
  // queries runs no call of its own (serving_fuzz found both accepted).
  EXPECT_THROW_MSG(attention_paged_varlen(q, index_tensor({3}, {0, 3, 3}), 4, {kp, vp, index_tensor({2, 2}, {0, 3, 7, 2}), lens}),
                   "attention_paged_varlen: block_table[1, 0] = 7 is outside [0, num_pages = 4)");
  EXPECT_THROW_MSG(attention_paged_varlen(Tensor::zeros({0, 2, 4}, dtype::f32), index_tensor({3}, {0, 0, 0}), 0,
                                          {kp, vp, table, index_tensor({2}, {3, 5})}),
                   "attention_paged_varlen: seq_lens[1] = 5 is beyond the block table's capacity 4");
  EXPECT_THROW_MSG(attention_paged_varlen(Tensor::zeros({3, 2, 3}, dtype::f32), index_tensor({3}, {0, 1, 3}), 4, {kp, vp, table, lens}),
                   "attention_paged_varlen: q has head size 3, k_pages 4; they must match");
  EXPECT_THROW_MSG(attention_paged_varlen(Tensor::zeros({3, 2, 4}, dtype::bf16), index_tensor({3}, {0, 1, 3}), 4, {kp, vp, table, lens}),
                   "attention_paged_varlen: q, k, v have dtypes bfloat16, float32, float32; they must be the same");
  // A packed mask: S = 1·3 + 2·2 = 7 (Nk_b = seq_lens[b]).
  attention_options masked;
  masked.attn_mask = Tensor::zeros({1, 1, 2, 4}, dtype::boolean);
  EXPECT_THROW_MSG(attention_paged_varlen(q, index_tensor({3}, {0, 1, 3}), 4, {kp, vp, table, lens}, masked),
                   "attention_paged_varlen: attn_mask has shape [1, 1, 2, 4], expected the sequences' masks packed: "
                   "[S] or [1 or Hq, S] with Hq = 2 and S = sum of Nq_b * Nk_b = 7");
  masked.attn_mask = Tensor::zeros({7}, dtype::i32);
  EXPECT_THROW_MSG(attention_paged_varlen(q, index_tensor({3}, {0, 1, 3}), 4, {kp, vp, table, lens}, masked),
                   "attention_paged_varlen: attn_mask has dtype int32, expected bool or a float dtype");
  // Rows beyond ±1024 are taken (shifted as the core op shifts them): a constant 2000 equals no
  // mask; HF's finfo.min on every key of a row weighs the keys by their scores alone.
  masked.attn_mask = Tensor::full({7}, dtype::f32, 2000.0);
  const varlen_result plain = attention_paged_varlen(q, index_tensor({3}, {0, 1, 3}), 4, {kp, vp, table, lens});
  const varlen_result shifted = attention_paged_varlen(q, index_tensor({3}, {0, 1, 3}), 4, {kp, vp, table, lens}, masked);
  EXPECT_TRUE(all_close(shifted.out, plain.out, 1e-6, 1e-6));
  Tensor second = Tensor::zeros({7}, dtype::f32);
  for (std::int64_t j = 5; j < 7; ++j) second.set({j}, -3e38);  // sequence 1's second row: HF's finfo.min everywhere
  masked.attn_mask = second;
  EXPECT_TRUE(all_close(attention_paged_varlen(q, index_tensor({3}, {0, 1, 3}), 4, {kp, vp, table, lens}, masked).out,
                        plain.out, 1e-6, 1e-6));
  masked.attn_mask = Tensor::zeros({2, 7}, dtype::f32);
  EXPECT_NO_THROW(attention_paged_varlen(q, index_tensor({3}, {0, 1, 3}), 4, {kp, vp, table, lens}, masked));
}

// A packed mask (FlashInfer's custom_mask layout: each sequence's [Nq_b, seq_lens[b]] block,
// back to back) equals attention_paged on each sequence alone with its block as [1, H, Nq_b,
// seq_lens[b]]: bool [S] and float [Hq, S], decode steps and chunks of several lengths.
TEST(PagedVarlen, PackedMaskEqualsEachSequenceWithItsBlock) {
  const std::vector<std::int64_t> nq{1, 3, 0, 1, 7, 1, 3}, lens{9, 20, 4, 1, 33, 16, 5};
  const std::int64_t B = 7, Hq = 4, Hkv = 2, D = 8, Dv = 8, ps = 4, max_pages = 10;
  std::int64_t S = 0;
  for (std::int64_t b = 0; b < B; ++b) S += nq[std::size_t(b)] * lens[std::size_t(b)];
  for (const bool boolean : {true, false}) {
    SCOPED_TRACE(boolean ? "bool [S]" : "float [Hq, S]");
    std::mt19937 rng(41);
    const mixed_batch mb = shuffled_pages(lens, nq, ps, max_pages, 0, rng);
    const std::vector<std::int64_t>&table = mb.table, &cu = mb.cu;
    const std::int64_t used = mb.used;
    const std::int64_t total = cu.back(), H = boolean ? 1 : Hq;
    const Tensor kp = random_tensor({used, ps, Hkv, D}, dtype::f32, rng), vp = random_tensor({used, ps, Hkv, Dv}, dtype::f32, rng);
    const Tensor q = random_tensor({total, Hq, D}, dtype::f32, rng);
    const Tensor tab = index_tensor({B, max_pages}, table), lt = index_tensor({B}, lens);
    Tensor mask = Tensor::empty({H, S}, boolean ? dtype::boolean : dtype::f32);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < S; ++i) mask.set({h, i}, boolean ? double(u(rng) < 0.7) : (u(rng) < 0.2 ? -INFINITY : 4 * u(rng) - 2));
    if (boolean) mask = Tensor::copy_of(mask.view().reshape({S}));
    attention_options o;
    o.is_causal = true, o.alignment = causal_alignment::bottom_right;
    o.attn_mask = mask;
    const varlen_result r = attention_paged_varlen(q, index_tensor({B + 1}, cu), 7, {kp, vp, tab, lt}, o);
    if (!boolean) {  // the same mask as the transpose of an [S, Hq] tensor: the same bits
      const Tensor t = Tensor::copy_of(mask.view().permute({1, 0}));
      attention_options os = o;
      os.attn_mask = t.view().permute({1, 0});
      const varlen_result rs = attention_paged_varlen(q, index_tensor({B + 1}, cu), 7, {kp, vp, tab, lt}, os);
      EXPECT_TRUE(all_close(rs.out, r.out, 0, 0));
    }
    const auto reshaped = [](const TensorView& v, Shape s) { return Tensor::copy_of(Tensor::copy_of(v).view().reshape(s)); };
    std::int64_t off = 0;
    for (std::int64_t b = 0; b < B; ++b) {
      const std::int64_t n = nq[std::size_t(b)], c0 = cu[std::size_t(b)], L = lens[std::size_t(b)];
      if (n == 0) continue;
      SCOPED_TRACE(fmt::format("sequence {} (Nq {}, {} keys)", b, n, L));
      const Tensor qb = reshaped(q.view().slice(0, c0, c0 + n).permute({1, 0, 2}), {1, Hq, n, D});
      std::vector<std::int64_t> row(table.begin() + b * max_pages, table.begin() + (b + 1) * max_pages);
      attention_options ob = o;
      ob.attn_mask = boolean ? reshaped(mask.view().slice(0, off, off + n * L), {1, 1, n, L})
                             : reshaped(mask.view().slice(1, off, off + n * L), {1, H, n, L});
      const attention_result want = attention_paged(qb, {kp, vp, index_tensor({1, max_pages}, row), index_tensor({1}, {L})}, ob);
      const Tensor got = reshaped(r.out.view().slice(0, c0, c0 + n).permute({1, 0, 2}), {1, Hq, n, Dv});
      const Tensor got_lse = reshaped(r.lse.view().slice(1, c0, c0 + n), {1, Hq, n});
      EXPECT_TRUE(all_close(got, want.out, 0, 0));
      EXPECT_TRUE(all_close(got_lse, want.lse, 0, 0));
      off += n * L;
    }
    EXPECT_FALSE(testing::any_nan(r.out));
  }
}

// attention_paged_varlen_backward equals attention_paged_backward on each sequence alone (its
// block table row, its ALiBi row, its mask block): dq packed like q, the pages' gradients summed
// over the sequences (sequence 3 reads sequence 0's first page), dsinks summed, dalibi per row,
// a float packed mask's gradient block by block; f32 and f64, with and without a mask; one
// thread gives the same bits.
TEST(PagedVarlen, BackwardEqualsEachSequenceAlone) {
  const std::vector<std::int64_t> nq{1, 3, 0, 1, 7, 1, 2}, lens{9, 20, 4, 1, 33, 0, 6};
  const std::int64_t B = 7, Hq = 4, Hkv = 2, D = 8, Dv = 8, ps = 4, max_pages = 10;
  std::int64_t S = 0;
  for (std::int64_t b = 0; b < B; ++b) S += nq[std::size_t(b)] * lens[std::size_t(b)];
  for (const dtype type : {dtype::f32, dtype::f64})
    for (const bool masked : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(type), masked ? "float [Hq, S] mask" : "no mask"));
      std::mt19937 rng(43);
      const mixed_batch mb = shuffled_pages(lens, nq, ps, max_pages, 2, rng);
      std::vector<std::int64_t> table = mb.table;
      const std::vector<std::int64_t>& cu = mb.cu;
      table[std::size_t(3 * max_pages)] = table[0];  // sequence 3 shares sequence 0's first page
      const std::int64_t total = cu.back(), P = mb.used + 2;
      const Tensor kp = random_tensor({P, ps, Hkv, D}, type, rng), vp = random_tensor({P, ps, Hkv, Dv}, type, rng);
      const Tensor q = random_tensor({total, Hq, D}, type, rng), dout = random_tensor({total, Hq, Dv}, type, rng);
      const Tensor tab = index_tensor({B, max_pages}, table), lt = index_tensor({B}, lens), tcu = index_tensor({B + 1}, cu);
      attention_options o;
      o.is_causal = true, o.alignment = causal_alignment::bottom_right;
      o.alibi_slopes = random_tensor({B, Hq}, dtype::f64, rng, 0.1, 0.9);
      o.sinks = random_tensor({Hq}, dtype::f64, rng);
      Tensor mask;
      if (masked) {
        mask = random_tensor({Hq, S}, dtype::f32, rng, -2.0, 2.0);
        o.attn_mask = mask;
      }
      const paged_kv_view cache{kp, vp, tab, lt};
      const varlen_result r = attention_paged_varlen(q, tcu, 7, cache, o);
      const paged_grads g = attention_paged_varlen_backward(q, tcu, 7, cache, r.out, dout, r.lse, o);
      ASSERT_EQ(g.dq.shape(), q.shape());
      ASSERT_EQ(g.dk_pages.shape(), kp.shape());
      const auto reshaped = [](const TensorView& v, Shape s) { return Tensor::copy_of(Tensor::copy_of(v).view().reshape(s)); };
      const Tensor dk = Tensor::zeros(kp.shape(), dtype::f64), dv = Tensor::zeros(vp.shape(), dtype::f64);
      const Tensor dsinks = Tensor::zeros({Hq}, dtype::f64);
      const double tol = testing::tolerance_for(type) * 8;
      std::int64_t off = 0;
      for (std::int64_t b = 0; b < B; ++b) {
        const std::int64_t n = nq[std::size_t(b)], c0 = cu[std::size_t(b)], L = lens[std::size_t(b)];
        if (n == 0) continue;
        SCOPED_TRACE(fmt::format("sequence {} (Nq {}, {} keys)", b, n, L));
        const auto rows = [&](const Tensor& x, std::int64_t X) {
          return reshaped(x.view().slice(0, c0, c0 + n).permute({1, 0, 2}), {1, Hq, n, X});
        };
        std::vector<std::int64_t> row(table.begin() + b * max_pages, table.begin() + (b + 1) * max_pages);
        attention_options ob = o;
        ob.alibi_slopes = Tensor::copy_of(o.alibi_slopes->slice(0, b, b + 1));
        if (masked) ob.attn_mask = reshaped(mask.view().slice(1, off, off + n * L), {1, Hq, n, L});
        const paged_kv_view one{kp, vp, index_tensor({1, max_pages}, row), index_tensor({1}, {L})};
        const attention_result f = attention_paged(rows(q, D), one, ob);
        const paged_grads w = attention_paged_backward(rows(q, D), one, f.out, rows(dout, Dv), f.lse, ob);
        EXPECT_TRUE(all_close(rows(g.dq, D), w.dq, tol));
        for (std::int64_t i = 0; i < dk.numel(); ++i) dk.data_as<double>()[i] += w.dk_pages.to(dtype::f64).data_as<double>()[i];
        for (std::int64_t i = 0; i < dv.numel(); ++i) dv.data_as<double>()[i] += w.dv_pages.to(dtype::f64).data_as<double>()[i];
        for (std::int64_t h = 0; h < Hq; ++h) dsinks.set({h}, dsinks.get({h}) + w.dsinks.get({h}));
        EXPECT_TRUE(all_close(Tensor::copy_of(g.dalibi_slopes.view().slice(0, b, b + 1)), w.dalibi_slopes, tol));
        if (masked) {
          EXPECT_TRUE(all_close(reshaped(g.dattn_mask.view().slice(1, off, off + n * L), {1, Hq, n, L}), w.dattn_mask, tol));
        }
        off += n * L;
      }
      EXPECT_TRUE(all_close(g.dk_pages, dk.to(type), tol));
      EXPECT_TRUE(all_close(g.dv_pages, dv.to(type), tol));
      EXPECT_TRUE(all_close(g.dsinks, dsinks, tol));
      EXPECT_EQ(g.dattn_mask.defined(), masked);
      const paged_grads one = attention_paged_varlen_backward(q, tcu, 7, cache, r.out, dout, r.lse, o, {.num_threads = 1});
      EXPECT_TRUE(all_close(one.dq, g.dq, 0, 0));
      EXPECT_TRUE(all_close(one.dk_pages, g.dk_pages, 0, 0));
    }
}

TEST(PagedVarlen, BackwardBadInputsByMessage) {
  const Tensor kp = Tensor::zeros({4, 2, 1, 4}, dtype::f32), vp = Tensor::zeros({4, 2, 1, 4}, dtype::f32);
  const paged_kv_view cache{kp, vp, index_tensor({2, 2}, {0, 3, 1, 2}), index_tensor({2}, {3, 2})};
  const Tensor q = Tensor::zeros({3, 2, 4}, dtype::f32), out = Tensor::zeros({3, 2, 4}, dtype::f32);
  const Tensor cu = index_tensor({3}, {0, 1, 3}), lse = Tensor::zeros({2, 3}, dtype::f32);
  const char* op = "attention_paged_varlen_backward: ";
  EXPECT_THROW_MSG(attention_paged_varlen_backward(q, cu, 2, cache, out, out, Tensor::zeros({3, 2}, dtype::f32)),
                   fmt::format("{}lse has shape [3, 2], expected [Hq, total_q] = [2, 3]", op));
  EXPECT_THROW_MSG(attention_paged_varlen_backward(q, cu, 2, cache, Tensor::zeros({3, 2, 5}, dtype::f32), out, lse),
                   fmt::format("{}out has shape [3, 2, 5], expected [3, 2, 4]", op));
  EXPECT_THROW_MSG(attention_paged_varlen_backward(q, cu, 1, cache, out, out, lse),
                   fmt::format("{}sequence 1 has length 2", op));
  attention_options bad;
  bad.attn_mask = Tensor::zeros({4}, dtype::f32);  // S = 1·3 + 2·2 = 7
  EXPECT_THROW_MSG(attention_paged_varlen_backward(q, cu, 2, cache, out, out, lse, bad), "attention_paged_varlen_backward: attn_mask");
  const Tensor k8 = Tensor::zeros({4, 2, 1, 4}, dtype::i8), s8 = Tensor::zeros({4, 2, 1}, dtype::f32);
  EXPECT_THROW_MSG(attention_paged_varlen_backward(q, cu, 2, {k8, k8, cache.block_table, cache.seq_lens, s8, s8}, out, out, lse),
                   fmt::format("{}int8 pages are a quantised cache and have no gradient", op));
}

}  // namespace
}  // namespace attn

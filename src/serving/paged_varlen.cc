// src/serving/paged_varlen.cc — attention_paged_varlen (include/attn/serving.h): a batch whose
// sequences bring different numbers of new tokens (decode steps beside prefill chunks, as an
// engine's scheduler mixes them), packed as q [total_q, Hq, D] with cu_seqlens_q, against a
// paged KV cache.
//
// The sequences are grouped by their number of queries n; each group is one attention_paged
// call on q [Bg, Hq, n, D] (a view of the packed rows when the group is one sequence, else a
// gathered copy: q is the small operand), the group's rows of the block table and seq_lens, and
// of ALiBi [B, Hq]. So every decode step of the batch (n = 1) runs in one call, in parallel
// across sequences and heads, and the K/V pages are read in place as attention_paged reads them.
// Groups run in increasing n; the outputs and lse are scattered back to the packed rows. A packed
// attn_mask is gathered likewise, per group, into the [Bg, Hm, n, K] mask attention_paged takes.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <tuple>
#include <vector>

#include "attn/serving.h"
#include "core/common.h"
#include "serving/serving.h"

namespace attn {

namespace {

// Element (i0, i1, i2[, i3]) of a view as a byte address.
std::byte* at(const TensorView& t, std::initializer_list<std::int64_t> idx) {
  std::int64_t off = 0;
  int d = 0;
  for (std::int64_t i : idx) off += i * t.stride(d++);
  return static_cast<std::byte*>(t.data()) + off * std::int64_t(dtype_size(t.type()));
}

Tensor index_tensor(const std::vector<std::int64_t>& v, Shape shape) {
  Tensor t = Tensor::empty(std::move(shape), dtype::i64);
  if (!v.empty()) std::memcpy(t.data(), v.data(), v.size() * sizeof(std::int64_t));
  return t;
}

// The packed mask's blocks of a group's sequences (n queries each) as the mask attention_paged
// takes: for one sequence, its block as packed_mask_block gives it ([n, len] or [Hm, n, len],
// broadcast over the batch of one);
// for several, a copy [Bg, Hm, n, longest length] whose keys past a sequence's length are
// excluded (false, or -inf), each block row copied whole where the mask's keys are contiguous.
TensorArg group_mask(const TensorView& m, const std::vector<std::int64_t>& seqs, std::int64_t n,
                     const std::vector<std::int64_t>& lens, const std::vector<std::int64_t>& mask_off) {
  const std::int64_t Bg = std::int64_t(seqs.size()), Hm = m.rank() == 2 ? m.size(0) : 1;
  const std::int64_t ms = m.stride(m.rank() - 1), mh = m.rank() == 2 ? m.stride(0) : 0;
  const std::int64_t es = std::int64_t(dtype_size(m.type()));
  const auto* base = static_cast<const std::byte*>(m.data());
  if (Bg == 1) return detail::packed_mask_block(m, mask_off[std::size_t(seqs[0])], n, lens[std::size_t(seqs[0])]);
  std::int64_t kg = 0;
  for (std::int64_t b : seqs) kg = std::max(kg, lens[std::size_t(b)]);
  Tensor mg = m.type() == dtype::boolean ? Tensor::zeros({Bg, Hm, n, kg}, m.type())
                                         : Tensor::full({Bg, Hm, n, kg}, m.type(), -std::numeric_limits<double>::infinity());
  auto* out = static_cast<std::byte*>(mg.data());
  for (std::int64_t g = 0; g < Bg; ++g) {
    const std::int64_t b = seqs[std::size_t(g)], len = lens[std::size_t(b)];
    for (std::int64_t h = 0; h < Hm; ++h)
      for (std::int64_t i = 0; i < n; ++i) {
        std::byte* dst = out + (((g * Hm + h) * n + i) * kg) * es;
        const std::byte* src = base + (h * mh + (mask_off[std::size_t(b)] + i * len) * ms) * es;
        if (ms == 1) {
          if (len > 0) std::memcpy(dst, src, std::size_t(len * es));
        } else {
          for (std::int64_t j = 0; j < len; ++j) std::memcpy(dst + j * es, src + j * ms * es, std::size_t(es));
        }
      }
  }
  return mg;
}

// What attention_paged_varlen and its backward check before any work: the packed q [total_q,
// Hq, D] and cu_seqlens_q, the cache of the same B sequences — every sequence's pages, table
// entries and length, the dtypes, heads and options (check_paged_call: a sequence with no queries
// joins no group, so the whole batch is checked here) — a packed mask's block offsets (sequence
// b's block [nq[b], lens[b]] from mask_off[b]) and ALiBi's rows.
struct packed_call {
  std::vector<std::int64_t> cu, nq, table, lens, mask_off;
  std::int64_t B = 0, Hq = 0, D = 0;
};
packed_call check_packed_call(const char* op, const TensorView& q, const TensorView& cu_seqlens_q,
                              std::int64_t max_seqlen_q, const paged_kv_view& cache, const attention_options& options,
                              const execution& exec) {
  using namespace detail;
  if (q.rank() != 3) fail(op, fmt::format("q has shape {}, expected [total_q, Hq, D]", shape_str(q.shape())));
  if (!is_floating(q.type())) fail(op, fmt::format("q has dtype {}, expected a float dtype", dtype_name(q.type())));
  if (max_seqlen_q < 0) fail(op, fmt::format("max_seqlen_q = {} must be >= 0", max_seqlen_q));
  packed_call c;
  c.cu = read_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, q.size(0), max_seqlen_q);
  c.B = std::int64_t(c.cu.size()) - 1, c.Hq = q.size(1), c.D = q.size(2);
  c.table = read_index(op, "block_table", cache.block_table, 2, "[B, max_pages]");
  c.lens = read_index(op, "seq_lens", cache.seq_lens, 1, "[B]");
  if (cache.block_table.size(0) != c.B || std::int64_t(c.lens.size()) != c.B)
    fail(op, fmt::format("cu_seqlens_q has B + 1 = {} entries but block_table has shape {} and seq_lens {}", c.B + 1,
                         shape_str(cache.block_table.shape()), shape_str(cache.seq_lens.shape())));
  check_paged_call(op, q.type(), c.B, c.Hq, c.D, cache, options, exec);
  for (std::int64_t b = 0; b < c.B; ++b) c.nq.push_back(c.cu[std::size_t(b + 1)] - c.cu[std::size_t(b)]);
  if (options.attn_mask) c.mask_off = packed_mask_offsets(op, *options.attn_mask, c.nq, c.lens, c.Hq);
  if (options.alibi_slopes && options.alibi_slopes->rank() == 2 && options.alibi_slopes->size(0) != c.B)
    fail(op, fmt::format("alibi_slopes has shape {}, expected [Hq] or [B, Hq] = [{}, {}]",
                         shape_str(options.alibi_slopes->shape()), c.B, c.Hq));
  return c;
}

}  // namespace

varlen_result attention_paged_varlen(const TensorView& q, const TensorView& cu_seqlens_q, std::int64_t max_seqlen_q,
                                     const paged_kv_view& cache, const attention_options& options,
                                     const execution& exec) {
  using namespace detail;
  const char* op = "attention_paged_varlen";
  const packed_call pc = check_packed_call(op, q, cu_seqlens_q, max_seqlen_q, cache, options, exec);
  const std::vector<std::int64_t>&cu = pc.cu, &table = pc.table, &lens = pc.lens, &mask_off = pc.mask_off;
  const std::int64_t B = pc.B, Hq = pc.Hq, D = pc.D;
  const std::int64_t max_pages = cache.block_table.size(1), Dv = cache.v_pages.size(3);
  const bool alibi_rows = options.alibi_slopes && options.alibi_slopes->rank() == 2;

  // Sequences by number of queries (n > 0), in increasing n.
  std::map<std::int64_t, std::vector<std::int64_t>> groups;
  for (std::int64_t b = 0; b < B; ++b)
    if (const std::int64_t n = cu[std::size_t(b + 1)] - cu[std::size_t(b)]; n > 0) groups[n].push_back(b);

  const std::size_t qs = dtype_size(q.type());
  varlen_result r;
  r.out = Tensor::empty({q.size(0), Hq, Dv}, q.type());
  const dtype lse_type = q.type() == dtype::f64 ? dtype::f64 : dtype::f32;
  r.lse = Tensor::full({Hq, q.size(0)}, lse_type, -std::numeric_limits<double>::infinity());
  for (const auto& [n, seqs] : groups) {
    const std::int64_t Bg = std::int64_t(seqs.size());
    Tensor qg;
    TensorView qv;
    if (Bg == 1) {
      qv = token_rows(q, cu[std::size_t(seqs[0])], n);
    } else {
      qg = Tensor::empty({Bg, Hq, n, D}, q.type());
      for (std::int64_t g = 0; g < Bg; ++g)
        for (std::int64_t i = 0; i < n; ++i)
          for (std::int64_t h = 0; h < Hq; ++h)
            for (std::int64_t x = 0; x < D; ++x)
              std::memcpy(at(qg.view(), {g, h, i, x}), at(q, {cu[std::size_t(seqs[std::size_t(g)])] + i, h, x}), qs);
      qv = qg.view();
    }
    std::vector<std::int64_t> tg(static_cast<std::size_t>(Bg * max_pages)), lg(static_cast<std::size_t>(Bg));
    for (std::int64_t g = 0; g < Bg; ++g) {
      const std::int64_t b = seqs[std::size_t(g)];
      std::copy_n(table.begin() + b * max_pages, max_pages, tg.begin() + g * max_pages);
      lg[std::size_t(g)] = lens[std::size_t(b)];
    }
    const Tensor table_g = index_tensor(tg, {Bg, max_pages}), lens_g = index_tensor(lg, {Bg});
    const paged_kv_view cg{cache.k_pages, cache.v_pages, table_g, lens_g, cache.k_scales, cache.v_scales, cache.query};
    attention_options og = options;
    if (alibi_rows) {
      Tensor slopes = Tensor::empty({Bg, Hq}, options.alibi_slopes->type());
      for (std::int64_t g = 0; g < Bg; ++g)
        for (std::int64_t h = 0; h < Hq; ++h)
          std::memcpy(at(slopes.view(), {g, h}), at(*options.alibi_slopes, {seqs[std::size_t(g)], h}),
                      dtype_size(slopes.type()));
      og.alibi_slopes = std::move(slopes);
    }
    if (options.attn_mask) og.attn_mask = group_mask(*options.attn_mask, seqs, n, lens, mask_off);
    const attention_result a = attention_paged(qv, cg, og, exec);
    if (r.backend.empty()) r.backend = a.backend;
    const std::size_t os = dtype_size(a.out.type());
    for (std::int64_t g = 0; g < Bg; ++g) {
      const std::int64_t row0 = cu[std::size_t(seqs[std::size_t(g)])];
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t h = 0; h < Hq; ++h) {
          if (Dv > 0) std::memcpy(at(r.out.view(), {row0 + i, h, 0}), at(a.out.view(), {g, h, i, 0}), std::size_t(Dv) * os);
          r.lse.view().set({h, row0 + i}, a.lse.view().get({g, h, i}));
        }
    }
  }
  if (r.backend.empty()) r.backend = "none (no queries)";
  return r;
}

// ---------------------------------------------------------------------------------------------
// attention_paged_varlen_backward: no grouping by Nq is needed here — each sequence is one item
// of paged_backward_items on its own packed rows (views: q, out, dout, dq; lse copied to [1, Hq,
// n]), its mask block read in place, so a sequence's gradient is attention_paged_backward's.
paged_grads attention_paged_varlen_backward(const TensorView& q, const TensorView& cu_seqlens_q,
                                            std::int64_t max_seqlen_q, const paged_kv_view& cache,
                                            const TensorView& out, const TensorView& dout, const TensorView& lse,
                                            const attention_options& options, const execution& exec) {
  using namespace detail;
  const char* op = "attention_paged_varlen_backward";
  const packed_call pc = check_packed_call(op, q, cu_seqlens_q, max_seqlen_q, cache, options, exec);
  const std::vector<std::int64_t>&cu = pc.cu, &lens = pc.lens, &nq = pc.nq, &mask_off = pc.mask_off;
  const std::int64_t B = pc.B, T = q.size(0), Hq = pc.Hq;
  if (cache.k_pages.type() == dtype::i8)
    fail(op, "int8 pages are a quantised cache and have no gradient; train on float pages (the dequantised cache)");
  const std::int64_t Dv = cache.v_pages.size(3);
  check_saved(op, out, dout, lse, {T, Hq, Dv}, {Hq, T}, "[Hq, total_q]");
  const bool alibi_rows = options.alibi_slopes && options.alibi_slopes->rank() == 2;

  paged_grads g;
  g.dq = Tensor::zeros(q.shape(), q.type());
  const Tensor dalibi = options.alibi_slopes ? Tensor::zeros(options.alibi_slopes->shape(), dtype::f64) : Tensor();
  const Tensor dsinks = options.sinks ? Tensor::zeros({Hq}, dtype::f64) : Tensor();
  const bool dmask_wanted = options.attn_mask && options.attn_mask->type() != dtype::boolean && options.mask_gradient;
  const Tensor dmask = dmask_wanted ? Tensor::zeros(options.attn_mask->shape(), dtype::f64) : Tensor();
  std::vector<Tensor> lse_rows;  // each item's lse [1, Hq, n], contiguous (as backends read it)
  std::vector<paged_backward_item> items;
  std::int64_t rows = 0;  // the largest Hq·n: decode steps side by side when every sequence is one
  for (std::int64_t b = 0; b < B; ++b) {
    const std::int64_t n = nq[std::size_t(b)], L = lens[std::size_t(b)];
    if (n == 0 || L == 0) continue;  // no queries, or no keys (out 0): zero gradients
    Tensor lb = Tensor::empty({1, Hq, n}, lse.type());
    for (std::int64_t h = 0; h < Hq; ++h)
      for (std::int64_t i = 0; i < n; ++i) lb.set({0, h, i}, lse.get({h, cu[std::size_t(b)] + i}));
    lse_rows.push_back(lb);
    attention_options ob = for_sequence(options, b);
    if (ob.alignment != causal_alignment::top_left) ob.alignment = causal_alignment::bottom_right;
    if (options.attn_mask) ob.attn_mask = packed_mask_block(*options.attn_mask, mask_off[std::size_t(b)], n, L);
    const std::int64_t r0 = cu[std::size_t(b)];
    items.push_back({b, token_rows(q, r0, n), token_rows(out, r0, n), token_rows(dout, r0, n), lse_rows.back(),
                     token_rows(g.dq, r0, n), std::move(ob)});
    rows = std::max(rows, Hq * n);
  }
  std::tie(g.dk_pages, g.dv_pages) = paged_backward_items(
      op, cache, items, rows < 256, exec, q.type(), [&](const paged_backward_item& it, const attention_grads& r) {
        const std::int64_t b = it.b;
        if (g.backend.empty()) g.backend = r.backend;
        for (std::int64_t h = 0; h < Hq; ++h) {
          if (dalibi.defined()) dalibi.data_as<double>()[(alibi_rows ? b * Hq : 0) + h] += r.dalibi_slopes.get({h});
          if (dsinks.defined()) dsinks.data_as<double>()[h] += r.dsinks.get({h});
        }
        if (dmask.defined()) {  // sequence b's block of the packed gradient ([S] or [Hm, S])
          const Tensor gb = r.dattn_mask.to(dtype::f64);
          const std::int64_t n = nq[std::size_t(b)] * lens[std::size_t(b)], hm = dmask.rank() == 2 ? dmask.size(0) : 1;
          const double* src = gb.data_as<const double>();
          for (std::int64_t h = 0; h < hm; ++h) {
            double* dst = dmask.data_as<double>() + h * (dmask.numel() / hm) + mask_off[std::size_t(b)];
            for (std::int64_t x = 0; x < n; ++x) dst[x] += src[h * n + x];
          }
        }
      });
  if (g.backend.empty()) g.backend = "none";
  if (dalibi.defined()) g.dalibi_slopes = dalibi.to(options.alibi_slopes->type());
  if (dsinks.defined()) g.dsinks = dsinks.to(options.sinks->type());
  if (dmask.defined()) g.dattn_mask = dmask.to(options.attn_mask->type());
  return g;
}

}  // namespace attn

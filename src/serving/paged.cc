// src/serving/paged.cc — attention over a paged KV cache and appending to it
// (include/attn/serving.h).
//
// attention_paged reads the pages in place. Where the cpu backend runs the call and the pages
// hold float32, bfloat16 or int8 rows with unit x-stride, one problem covers the whole batch:
// the problem carries the block table (problem::page_table) and the cpu decode kernel walks it
// (src/cpu/decode.h), with the backend's own split-KV partition, sinks and merge — no run or
// page costs more than its bytes. (A prefill chunk over float32 or bfloat16 pages — enough rows
// per kv head — is gathered into rows by the backend, a few MiB a pass, and runs on the dense
// prefill kernels: cpu_backend.cc, paged_gather and forward_paged_gathered.) Otherwise (float64
// or float16 pages, strided rows, another backend asked for) a run of table entries that are consecutive pages
// in memory is one strided view [1, Hkv, n, X] (when a page's stride is page_size token rows);
// each run is one core-op problem whose causal frontier, window and ALiBi are shifted to the
// run's first key j0 (after_past alignment with P = pos_0 - j0, which may be negative). The run
// gives out_r and lse_r over its keys; runs merge by log-sum-exp:
//   lse = log(Σ_r exp(lse_r) + exp(sink)),   out = Σ_r exp(lse_r - lse) · out_r
// so the sink joins once. A row no key reaches keeps out = 0 and lse = -inf (lse = sink with
// sinks), as the core op defines it.
//
// Special values as attn::attention gives them: after each core-op call of a run, the front's
// check (check_special_rows) redoes on the float64 reference the rows the float32 kernels left
// non-finite where float64 would not; after the decode kernel read the pages in place, those
// rows (the kernel notes them as it writes them) are redone on the sequence's keys copied dense.
//
// Threads. Decode (Hq·Nq < kPrefillRows rows): a sequence's pages are cut into chunks of about
// kChunkKeys keys; chunks of every sequence run in parallel (one thread per core-op call), each
// merging its runs in order, and the chunks of a sequence merge in order afterwards. Prefill
// chunks (more rows): one task per sequence, run one after another with all threads inside
// each core-op call, so the partial state stays one [Hq·Nq, Dv] per sequence. Either way the
// partition depends on the shapes only, so results do not depend on the thread count.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <functional>
#include <tuple>
#include <utility>

#include "attn/serving.h"
#include "core/common.h"
#include "core/problem.h"
#include "serving/serving.h"

namespace attn {
namespace detail {
namespace {

constexpr std::int64_t kChunkKeys = 2048;
constexpr std::int64_t kPrefillRows = 256;

struct paged_dims {
  std::int64_t B = 0, Hkv = 0, D = 0, Dv = 0, num_pages = 0, page_size = 0, max_pages = 0;
  std::vector<std::int64_t> table, lens;  // table [B, max_pages]
  bool runs = false;  // consecutive pages are one view (page stride == page_size · token stride)
  bool int8 = false;  // int8 pages with f32 scales [num_pages, page_size, Hkv]
  bool kblocked = false;  // int8 k_pages [num_pages, page_size / 16, Hkv, D / 4, 16, 4]

  std::int64_t page(std::int64_t b, std::int64_t p) const { return table[std::size_t(b * max_pages + p)]; }
  // Element offset of token pos of sequence b in pages (or scales) [num_pages, page_size, ...].
  std::int64_t slot(const TensorView& pg, std::int64_t b, std::int64_t pos) const {
    return page(b, pos / page_size) * pg.stride(0) + (pos % page_size) * pg.stride(1);
  }
  // Element offset of (token pos of b, head h, x) in pages of rows, or of blocked int8 keys.
  std::int64_t elem(const TensorView& pg, std::int64_t b, std::int64_t pos, std::int64_t h, std::int64_t x) const {
    if (pg.rank() == 4) return slot(pg, b, pos) + h * pg.stride(2) + x * pg.stride(3);
    const std::int64_t t = pos % page_size;
    return page(b, pos / page_size) * pg.stride(0) + t / 16 * pg.stride(1) + h * pg.stride(2) + x / 4 * 64 +
           t % 16 * 4 + x % 4;
  }
};

// Checks the pages, the block table and the lengths; every position [0, seq_lens[b] + extra)
// must lie in a page of the table that exists.
paged_dims check_pages(const char* op, const paged_kv_view& c, std::int64_t extra) {
  const TensorView& kp = c.k_pages;
  const TensorView& vp = c.v_pages;
  const bool kblocked = kp.rank() == 6;  // blocked int8 keys
  if ((kp.rank() != 4 && !kblocked) || vp.rank() != 4)
    fail(op, fmt::format("k_pages {} and v_pages {} must be 4-D [num_pages, page_size, Hkv, D] (int8 k_pages may be "
                         "6-D blocked keys [num_pages, page_size / 16, Hkv, D / 4, 16, 4])",
                         shape_str(kp.shape()), shape_str(vp.shape())));
  if (!(is_floating(kp.type()) || kp.type() == dtype::i8) || vp.type() != kp.type())
    fail(op, fmt::format("k_pages/v_pages have dtypes {}/{}; expected one float dtype, or int8", dtype_name(kp.type()),
                         dtype_name(vp.type())));
  if (kblocked) {
    if (kp.type() != dtype::i8)
      fail(op, fmt::format("k_pages is 6-D {} of dtype {}; blocked keys are int8", shape_str(kp.shape()),
                           dtype_name(kp.type())));
    if (kp.size(4) != 16 || kp.size(5) != 4 || kp.stride(5) != 1 || kp.stride(4) != 4 || kp.stride(3) != 64)
      fail(op, fmt::format("k_pages {} (strides {}): blocked keys end in a contiguous [D / 4, 16, 4] (strides 64, 4, 1)",
                           shape_str(kp.shape()), shape_str(kp.strides())));
  }
  const std::int64_t kpage = kblocked ? kp.size(1) * 16 : kp.size(1), kD = kblocked ? kp.size(3) * 4 : kp.size(3);
  if (vp.size(0) != kp.size(0) || vp.size(1) != kpage || vp.size(2) != kp.size(2))
    fail(op, fmt::format("v_pages has shape {}, expected [{}, {}, {}, Dv] to match k_pages {}", shape_str(vp.shape()),
                         kp.size(0), kpage, kp.size(2), shape_str(kp.shape())));
  if ((kp.data() == nullptr && kp.numel() != 0) || (vp.data() == nullptr && vp.numel() != 0))
    fail(op, "k_pages/v_pages have no data");
  paged_dims d;
  d.num_pages = kp.size(0), d.page_size = kpage, d.Hkv = kp.size(2), d.D = kD, d.Dv = vp.size(3);
  d.kblocked = kblocked;
  if (d.page_size == 0 || d.Hkv == 0)
    fail(op, fmt::format("k_pages has shape {}; page_size and Hkv must be positive", shape_str(kp.shape())));
  d.lens = read_index(op, "seq_lens", c.seq_lens, 1, "[B]");
  d.B = std::int64_t(d.lens.size());
  d.table = read_index(op, "block_table", c.block_table, 2, "[B, max_pages]");
  if (c.block_table.size(0) != d.B)
    fail(op, fmt::format("block_table has shape {} but seq_lens has B = {} entries", shape_str(c.block_table.shape()),
                         d.B));
  d.max_pages = c.block_table.size(1);
  const std::int64_t cap = d.max_pages * d.page_size;
  for (std::int64_t b = 0; b < d.B; ++b) {
    const std::int64_t L = d.lens[std::size_t(b)];
    if (L < 0 || L + extra > cap)
      fail(op, fmt::format("seq_lens[{}] = {}{} is beyond the block table's capacity {} (max_pages {} · page_size {})",
                           b, L, extra ? fmt::format(" with {} new tokens", extra) : std::string(), cap, d.max_pages,
                           d.page_size));
    for (std::int64_t p = 0; p * d.page_size < L + extra; ++p)
      if (d.page(b, p) < 0 || d.page(b, p) >= d.num_pages)
        fail(op, fmt::format("block_table[{}, {}] = {} is outside [0, num_pages = {})", b, p, d.page(b, p), d.num_pages));
  }
  d.runs = !kblocked && kp.stride(0) == d.page_size * kp.stride(1) && vp.stride(0) == d.page_size * vp.stride(1);
  d.int8 = kp.type() == dtype::i8;
  const bool scales = c.k_scales.data() != nullptr || c.v_scales.data() != nullptr || c.k_scales.rank() != 0 ||
                      c.v_scales.rank() != 0;
  if (!d.int8 && scales) fail(op, fmt::format("k_scales/v_scales are given but the pages are {}, not int8", dtype_name(kp.type())));
  if (d.int8) {
    for (auto [name, s] : {std::pair{"k_scales", &c.k_scales}, {"v_scales", &c.v_scales}}) {
      if (s->type() != dtype::f32 || s->shape() != Shape{d.num_pages, d.page_size, d.Hkv})
        fail(op, fmt::format("{} is {} {}; int8 pages need float32 [num_pages, page_size, Hkv] = [{}, {}, {}]", name,
                             dtype_name(s->type()), shape_str(s->shape()), d.num_pages, d.page_size, d.Hkv));
      if (s->data() == nullptr && s->numel() != 0) fail(op, fmt::format("{} has no data", name));
    }
  }
  return d;
}

// Tokens [0, n) from the start of page `page` of [num_pages, page_size, H, X] pages, as the core
// op's [1, H, n, X] (n may run into the following pages when the layout allows it).
TensorView page_rows(const TensorView& pages, std::int64_t page, std::int64_t n) {
  auto* base = static_cast<std::byte*>(pages.data());
  if (base) base += page * pages.stride(0) * std::int64_t(dtype_size(pages.type()));
  const TensorView tokens(base, pages.type(), {n, pages.size(2), pages.size(3)},
                          {pages.stride(1), pages.stride(2), pages.stride(3)});
  return token_rows(tokens, 0, n);
}

// Partial softmax state of [Hq, Nq] rows: out [Hq·Nq, Dv] normalised by its own lse.
struct partial {
  std::vector<double> out, lse;
  partial(std::int64_t rows, std::int64_t Dv)
      : out(std::size_t(rows * Dv), 0.0), lse(std::size_t(rows), kNegInf) {}

  // Merges (o [rows, Dv], l [rows]) into this state.
  template <class T>
  void merge(std::int64_t rows, std::int64_t Dv, const T* o, const T* l) {
    for (std::int64_t r = 0; r < rows; ++r) {
      const double a = lse[std::size_t(r)], c = double(l[r]);
      const double m = std::isnan(c) ? c : std::max(a, c);  // a NaN partial poisons the row, never vanishes
      if (m == kNegInf) continue;
      const double n = m + std::log(std::exp(a - m) + std::exp(c - m));
      const double wa = std::exp(a - n), wc = std::exp(c - n);
      double* y = out.data() + r * Dv;
      const T* x = o + r * Dv;
      // No shortcut where wc is 0: a kept key whose weight underflows still carries a NaN or
      // inf of its value into the row (0 · NaN), as the core op's IEEE sums do.
      for (std::int64_t i = 0; i < Dv; ++i) y[i] = y[i] * wa + double(x[i]) * wc;
      lse[std::size_t(r)] = n;
    }
  }
};

struct chunk_task {
  std::int64_t b, p0, p1;  // pages [p0, p1) of sequence b
};

// [num_pages, page_size, H, X] pages as the problem's K/V: sb unused, rows through the table.
strided4 page_view(const TensorView& pages) {
  return strided4{pages.data(), pages.type(), 0, pages.stride(2), pages.stride(1), pages.stride(3)};
}

// Keys [0, L) of sequence b as a dense [1, H, L, X] of dtype t (int8 rows times their scales);
// float rows of the pages' own dtype with unit x-stride are copied a row at a time, the heads
// on nt threads.
Tensor dense_rows(const TensorView& pages, const TensorView& scales, const paged_dims& d, std::int64_t b,
                  std::int64_t L, dtype t = dtype::f64, int nt = 1) {
  const std::int64_t H = d.Hkv, X = pages.rank() == 6 ? d.D : pages.size(3);
  Tensor r = Tensor::empty({1, H, L, X}, t);
  const std::size_t es = dtype_size(t);
  const bool rows = !d.int8 && t == pages.type() && pages.rank() == 4 && pages.stride(3) == 1;
#pragma omp parallel for if (nt > 1 && H > 1) num_threads(nt) schedule(static)
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t j = 0; j < L; ++j) {
      if (rows) {
        std::memcpy(static_cast<std::byte*>(r.data()) + std::size_t((h * L + j) * X) * es,
                    static_cast<const std::byte*>(pages.data()) + std::size_t(d.elem(pages, b, j, h, 0)) * es,
                    std::size_t(X) * es);
        continue;
      }
      const double s = d.int8 ? double(static_cast<const float*>(scales.data())[d.slot(scales, b, j) + h * scales.stride(2)]) : 1.0;
      for (std::int64_t x = 0; x < X; ++x)
        store_from_double(r.data(), t, (h * L + j) * X + x,
                          s * load_as_double(pages.data(), pages.type(), d.elem(pages, b, j, h, x)));
    }
  return r;
}

// The front's check of special values (check_special_rows, as attn::attention runs it) after the
// decode kernel read the pages in place: the rows it left non-finite (forward_outputs::found)
// that float64 answers otherwise (an overflowing q·k) are redone by the reference, sequence by
// sequence, on the sequence's keys laid out densely. A noted row that is not special (a fully
// masked row's lse of -inf, every call) costs no copy: the rows are told first (special_rows_of
// reads out, lse and the mask alone), the keys copied only for a sequence with a special row.
void check_paged_special_rows(const TensorView& q, const paged_kv_view& c, const paged_dims& d,
                              const std::vector<problem>& templ, const std::vector<double>& sinks,
                              const attention_options& options, const special_rows& found, const attention_result& r) {
  const std::int64_t Hq = q.size(1), Nq = q.size(2), rows = Hq * Nq;
  std::vector<std::vector<std::int64_t>> per(static_cast<std::size_t>(d.B));
  for (const std::int64_t row : found.rows) per[std::size_t(row / rows)].push_back(row % rows);
  const std::size_t lse_size = dtype_size(r.lse.type());
  for (std::int64_t b = 0; b < d.B; ++b) {
    if (found.complete && per[std::size_t(b)].empty()) continue;
    const std::int64_t L = d.lens[std::size_t(b)];
    problem p = templ[std::size_t(b)];
    p.q = as_bhnx(q.slice(0, b, b + 1), Hq);
    p.k = p.v = strided4{};  // (set below, once a row is special)
    p.Nk = L;
    p.past_len = options.alignment == causal_alignment::top_left ? 0 : L - Nq;  // (alignment after_past)
    p.sinks = sinks;
    special_rows seen{found.complete, std::move(per[std::size_t(b)])};
    forward_outputs fo;
    fo.out = as_bhnx(r.out.view().slice(0, b, b + 1), Hq);
    fo.lse = static_cast<std::byte*>(r.lse.data()) + std::size_t(b * rows) * lse_size;
    fo.lse_type = r.lse.type();
    fo.found = &seen;
    const std::vector<std::int64_t> redo = special_rows_of(p, fo);
    if (redo.empty()) continue;
    const Tensor k = dense_rows(c.k_pages, c.k_scales, d, b, L), v = dense_rows(c.v_pages, c.v_scales, d, b, L);
    p.k = as_bhnx(k, d.Hkv), p.v = as_bhnx(v, d.Hkv);
    reference_forward_rows(p, fo, redo);
  }
}

// The whole batch as one problem that the cpu decode kernel runs on the pages in place
// (problem::page_table); `templ` holds each sequence's validated problem. An empty reason means
// it was run; else the reason the cpu backend gave.
std::string paged_in_kernel(const TensorView& q, const paged_kv_view& c, const paged_dims& d,
                            const std::vector<problem>& templ, const problem& masked, const std::vector<double>& sinks,
                            const attention_options& options, int nt, const attention_result& r) {
  problem p = templ.front();
  p.B = d.B;
  p.mask_view = masked.mask_view;  // (the whole batch's; mask and mask_cols as every sequence's)
  p.q = as_bhnx(q, p.Hq);
  p.Nk = d.max_pages * d.page_size;
  p.k = page_view(c.k_pages), p.v = page_view(c.v_pages);
  if (d.kblocked)  // rows within a block: problem::k_blocked (sn the stride of a block of 16 keys)
    p.k = strided4{c.k_pages.data(), dtype::i8, 0, c.k_pages.stride(2), c.k_pages.stride(1), 1}, p.k_blocked = true;
  p.kv_len = d.lens;
  p.int8_rounding = c.query != int8_query::float32;
  p.int8_bytes = c.query == int8_query::int8;
  p.alignment = options.alignment == causal_alignment::top_left ? causal_alignment::top_left
                                                                 : causal_alignment::bottom_right;
  p.past_len = 0;
  p.alibi.clear();
  if (!templ.front().alibi.empty())
    for (const problem& t : templ) p.alibi.insert(p.alibi.end(), t.alibi.begin(), t.alibi.end());
  p.sinks = sinks;
  p.num_threads = nt;
  p.page_table = d.table.data(), p.max_pages = d.max_pages, p.page_size = d.page_size;
  p.page_stride.k = c.k_pages.stride(0), p.page_stride.v = c.v_pages.stride(0);
  if (d.int8) {
    p.k_scale = strided4{c.k_scales.data(), dtype::f32, 0, c.k_scales.stride(2), c.k_scales.stride(1), 0};
    p.v_scale = strided4{c.v_scales.data(), dtype::f32, 0, c.v_scales.stride(2), c.v_scales.stride(1), 0};
    p.page_stride.k_scale = c.k_scales.stride(0), p.page_stride.v_scale = c.v_scales.stride(0);
  }
  const backend_impl& cpu = cpu_backend();
  std::string why = cpu.why_not(p, {});
  if (!why.empty()) return why;
  special_rows found;
  forward_outputs fo;
  fo.out = as_bhnx(r.out, p.Hq);
  fo.lse = r.lse.data();
  fo.lse_type = r.lse.type();
  fo.found = &found;
  cpu.forward(p, fo);
  check_paged_special_rows(q, c, d, templ, sinks, options, found, r);
  return {};
}

}  // namespace
}  // namespace detail

namespace detail {
namespace {

// What attention_paged checks of a call before any work, for a q of dtype qt and shape
// [B, Hq, ·, Dq]: pages, block table and lengths (check_pages), dtypes, heads, head size, options.
paged_dims check_call(const char* op, dtype qt, std::int64_t B, std::int64_t Hq, std::int64_t Dq,
                      const paged_kv_view& cache, const attention_options& options, const execution& exec) {
  const paged_dims d = check_pages(op, cache, 0);
  if (d.int8) {
    if (qt != dtype::f32 && qt != dtype::bf16 && qt != dtype::f16)
      fail(op, fmt::format("q has dtype {}; int8 pages take float32, bfloat16 or float16 q", dtype_name(qt)));
  } else {
    check_qkv_types(op, TensorView(nullptr, qt, {0, 0, 0, 0}), cache.k_pages, cache.v_pages);  // (q: its dtype)
  }
  if (B != d.B) fail(op, fmt::format("q has B = {} sequences but seq_lens has {}", B, d.B));
  if (Dq != d.D) fail(op, fmt::format("q has head size {}, k_pages {}; they must match", Dq, d.D));
  if (Hq % d.Hkv) fail(op, fmt::format("q has {} heads and the pages {}; Hq must be a multiple of Hkv", Hq, d.Hkv));
  check_serving_options(op, options, B, Hq, d.Hkv, /*mask_ok=*/true);
  if (exec.num_threads < 0) fail(op, fmt::format("num_threads = {} must be >= 0 (0: all)", exec.num_threads));
  return d;
}

// attention_paged's and its backward's q [B, Hq, Nq, D] and the call (check_call).
paged_dims check_paged_q(const char* op, const TensorView& q, const paged_kv_view& cache,
                         const attention_options& options, const execution& exec) {
  if (q.rank() != 4) fail(op, fmt::format("q has shape {}, expected 4 dims [B, Hq, Nq, D]", shape_str(q.shape())));
  if (q.data() == nullptr && q.numel() != 0) fail(op, "q has no data");
  return check_call(op, q.type(), q.size(0), q.size(1), q.size(3), cache, options, exec);
}

}  // namespace

void check_paged_call(const char* op, dtype qt, std::int64_t B, std::int64_t Hq, std::int64_t Dq,
                      const paged_kv_view& cache, const attention_options& options, const execution& exec) {
  (void)check_call(op, qt, B, Hq, Dq, cache, options, exec);
}

}  // namespace detail

attention_result attention_paged(const TensorView& q, const paged_kv_view& cache, const attention_options& options,
                                 const execution& exec) {
  using namespace detail;
  const char* op = "attention_paged";
  const paged_dims d = check_paged_q(op, q, cache, options, exec);
  // int8 pages: the problems below are validated on empty K/V of q's dtype
  const TensorView k0 = d.int8 ? TensorView(nullptr, q.type(), {1, d.Hkv, 0, d.D}) : page_rows(cache.k_pages, 0, 0);
  const TensorView v0 = d.int8 ? TensorView(nullptr, q.type(), {1, d.Hkv, 0, d.Dv}) : page_rows(cache.v_pages, 0, 0);
  const std::int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), Dv = d.Dv;
  const int nt = exec.num_threads ? exec.num_threads : omp_get_max_threads();
  // An attn_mask over each sequence's key positions (a tree of draft tokens; a padding or bias
  // mask): it broadcasts to [B, Hq, Nq, K] with K the block table's capacity (max_pages ·
  // page_size), a shorter last dim excluding the positions past it, as the core op's mask does.
  // A float mask whose rows the core op would shift (largest finite value beyond ±1024: an HF
  // finfo.min row) is shifted alike (set_attn_mask, into `shifted`): every run of a row sees the
  // row's shifted mask, the shift goes back into lse after the merge, and then the sinks join, in
  // float64 (as forward_on joins them: a sink far above a row of finfo.min keeps its value as the
  // row's lse).
  problem masked;  // its mask fields, for the whole batch
  problem_storage shifted;
  std::int64_t mask_esize = 0;
  if (options.attn_mask) {
    const TensorView& m = *options.attn_mask;
    masked.B = B, masked.Hq = Hq, masked.Nq = Nq, masked.Nk = d.max_pages * d.page_size, masked.q.type = q.type();
    masked.kv_len = d.lens;  // (a row's shift over the keys of its sequence)
    set_attn_mask(op, m, masked, shifted, nt);
    if (options.check_finite && masked.mask == mask_kind::additive) check_finite(op, "attn_mask", m, /*minus_inf_ok=*/true);
    mask_esize = std::int64_t(dtype_size(masked.mask_view.type));
  }
  const bool shift = shifted.shift.defined();
  // The shift of row rr = h·Nq + i of sequence b (0 without a shifted mask).
  const auto shift_of = [&](std::int64_t b, std::int64_t rr) {
    return shift ? shifted.mask_shift.load(b, rr / Nq, rr % Nq, 0) : 0.0;
  };
  const dtype part_type = q.type() == dtype::f64 ? dtype::f64 : dtype::f32;
  const std::int64_t rows = Hq * Nq;

  // One validated problem per sequence (the sinks are left to the merge), and its backend.
  std::vector<problem> templ;
  std::vector<const backend_impl*> be;
  for (std::int64_t b = 0; b < B; ++b) {
    attention_options ob = for_sequence(options, b);
    ob.sinks.reset();
    ob.attn_mask.reset();  // (set below: the problem has no keys yet)
    ob.alignment = causal_alignment::top_left;  // the shift is set per run below
    problem_storage store;
    templ.push_back(build_problem(op, q.slice(0, b, b + 1), k0, v0, ob, exec, store));
    templ.back().alignment = causal_alignment::after_past;
    if (masked.mask != mask_kind::none) {  // sequence b's rows of the mask
      problem& t = templ.back();
      t.mask = masked.mask, t.mask_cols = masked.mask_cols, t.mask_view = masked.mask_view;
      t.mask_view.data = static_cast<std::byte*>(masked.mask_view.data) + b * masked.mask_view.sb * mask_esize;
    }
    be.push_back(&pick(op, templ.back(), {}, exec.use_backend));
  }
  std::vector<double> sinks;
  if (options.sinks) {
    problem_storage store;  // the sinks checked as the core op checks them
    attention_options os;
    os.sinks = options.sinks;
    sinks = build_problem(op, q.slice(0, 0, std::min<std::int64_t>(B, 1)), k0, v0, os, exec, store).sinks;
  }

  attention_result r;
  r.out = Tensor::empty({B, Hq, Nq, Dv}, q.type());
  r.lse = Tensor::empty({B, Hq, Nq}, part_type);
  r.backend = be.empty() ? std::string("none") : std::string(be.front()->name());
  if (B == 0) return r;
  const bool on_cpu = std::all_of(be.begin(), be.end(), [](const backend_impl* b) { return b == &cpu_backend(); });
  // A shifted mask: the kernel writes float64 out and lse, the sinks left out (joined below, as
  // the core op's forward_on joins them), and each row's shift goes back before one rounding.
  attention_result k64;
  if (shift) {
    k64.out = Tensor::empty({B, Hq, Nq, Dv}, dtype::f64);
    k64.lse = Tensor::empty({B, Hq, Nq}, dtype::f64);
  }
  const std::string why =
      on_cpu ? paged_in_kernel(q, cache, d, templ, masked, shift ? std::vector<double>{} : sinks, options, nt,
                               shift ? k64 : r)
             : "the cpu backend does not run it";
  if (why.empty()) {
    if (!shift) return r;
    double* l = k64.lse.data_as<double>();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t rr = 0; rr < rows; ++rr) l[b * rows + rr] += shift_of(b, rr);
    if (!sinks.empty()) {  // then the sinks, as forward_on joins them
      problem joined;
      joined.B = B, joined.Hq = Hq, joined.Nq = Nq, joined.Dv = Dv, joined.sinks = sinks;
      forward_outputs fo;
      fo.out = as_bhnx(k64.out, Hq);
      fo.lse = k64.lse.data();
      fo.lse_type = dtype::f64;
      join_sinks(joined, fo);
    }
    r.out = k64.out.to(q.type());
    r.lse = k64.lse.to(part_type);
    return r;
  }
  if (d.int8) fail(op, fmt::format("int8 pages are read by the cpu decode kernel alone; here {}", why));

  const bool prefill = rows >= kPrefillRows;
  const std::int64_t chunk_pages =
      prefill ? std::max<std::int64_t>(1, d.max_pages) : std::max<std::int64_t>(1, kChunkKeys / d.page_size);
  for (problem& p : templ) p.num_threads = prefill ? nt : 1;
  std::vector<chunk_task> tasks;
  std::vector<std::size_t> first_task(std::size_t(B) + 1);
  for (std::int64_t b = 0; b < B; ++b) {
    first_task[std::size_t(b)] = tasks.size();
    const std::int64_t pages = (d.lens[std::size_t(b)] + d.page_size - 1) / d.page_size;
    for (std::int64_t p0 = 0; p0 < pages; p0 += chunk_pages) tasks.push_back({b, p0, std::min(pages, p0 + chunk_pages)});
  }
  first_task[std::size_t(B)] = tasks.size();

  std::vector<partial> parts(tasks.size(), partial(rows, Dv));
#pragma omp parallel for if (!prefill) num_threads(nt) schedule(dynamic, 1)
  for (std::size_t t = 0; t < tasks.size(); ++t) {
    const chunk_task& task = tasks[t];
    const std::int64_t L = d.lens[std::size_t(task.b)];
    const std::int64_t pos0 = options.alignment == causal_alignment::top_left ? 0 : L - Nq;
    problem p = templ[std::size_t(task.b)];
    Tensor o = Tensor::empty({1, Hq, Nq, Dv}, part_type);
    Tensor l = Tensor::empty({rows}, part_type);
    for (std::int64_t p0 = task.p0; p0 < task.p1;) {
      std::int64_t p1 = p0 + 1;
      while (d.runs && p1 < task.p1 && d.page(task.b, p1) == d.page(task.b, p1 - 1) + 1) ++p1;
      const std::int64_t j0 = p0 * d.page_size, n = std::min(L, p1 * d.page_size) - j0;
      p.k = as_bhnx(page_rows(cache.k_pages, d.page(task.b, p0), n), d.Hkv);
      p.v = as_bhnx(page_rows(cache.v_pages, d.page(task.b, p0), n), d.Hkv);
      p.Nk = n;
      p.past_len = pos0 - j0;
      if (p.mask != mask_kind::none) {  // the mask's columns of keys [j0, j0 + n)
        const problem& t = templ[std::size_t(task.b)];
        p.mask_view.data = static_cast<std::byte*>(t.mask_view.data) + j0 * t.mask_view.sx * mask_esize;
        p.mask_cols = std::clamp<std::int64_t>(t.mask_cols - j0, 0, n);
      }
      special_rows found;
      forward_outputs fo;
      fo.out = as_bhnx(o, Hq);
      fo.lse = l.data();
      fo.lse_type = part_type;
      fo.found = &found;
      be[std::size_t(task.b)]->forward(p, fo);
      if (be[std::size_t(task.b)] != &reference_backend()) check_special_rows(p, fo);  // (as attn::attention)
      if (part_type == dtype::f64) parts[t].merge(rows, Dv, o.data_as<const double>(), l.data_as<const double>());
      else parts[t].merge(rows, Dv, o.data_as<const float>(), l.data_as<const float>());
      p0 = p1;
    }
  }

  for (std::int64_t b = 0; b < B; ++b) {
    partial acc(rows, Dv);
    for (std::size_t t = first_task[std::size_t(b)]; t < first_task[std::size_t(b) + 1]; ++t)
      acc.merge(rows, Dv, parts[t].out.data(), parts[t].lse.data());
    // A shifted mask's shift back first, then the sinks (as forward_on joins them: a sink far
    // above a row of finfo.min keeps its own value as the lse).
    for (std::int64_t rr = 0; rr < rows && shift; ++rr) acc.lse[std::size_t(rr)] += shift_of(b, rr);
    if (!sinks.empty()) {  // the sink of head h: a logit with a zero value row, for rows of head h
      std::vector<double> sl(static_cast<std::size_t>(rows)), zero(std::size_t(rows * Dv), 0.0);
      for (std::int64_t rr = 0; rr < rows; ++rr) sl[std::size_t(rr)] = sinks[std::size_t(rr / Nq)];
      acc.merge(rows, Dv, zero.data(), sl.data());
    }
    for (std::int64_t rr = 0; rr < rows; ++rr) {
      store_from_double(r.lse.data(), part_type, b * rows + rr, acc.lse[std::size_t(rr)]);
      for (std::int64_t x = 0; x < Dv; ++x)
        store_from_double(r.out.data(), q.type(), (b * rows + rr) * Dv + x, acc.out[std::size_t(rr * Dv + x)]);
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// attention_paged_backward: each sequence's gradient is attention_backward's on the keys its
// table names, laid out densely (a [1, Hkv, L, X] copy per sequence: the backward reads every key
// row Nq·Hq/Hkv times, the copy once; none where the pages follow each other in memory, and dk,
// dv then written in place where no other reading shares the slots — paged_backward_items),
// with the forward's options for that sequence — causal and
// window positions as attention_paged places them (query i at L - Nq + i unless top_left), its
// ALiBi row, the sinks, and the mask's rows of b over the columns [0, L). dk and dv go back
// through the table: a page that several sequences read receives the sum of their gradients,
// added in sequence order in float32 (float64 for float64 pages) and rounded once to the pages'
// dtype, so the result does not depend on the threads.
namespace detail {
namespace {

// The per-sequence options of attention_paged's call: ALiBi [B, Hq] sliced to row b, causal
// alignment as the paged op defines it, and the mask's batch row b over the keys [0, L).
attention_options paged_sequence_options(const attention_options& o, std::int64_t b, std::int64_t B,
                                         std::int64_t L) {
  attention_options r = for_sequence(o, b);
  if (r.alignment != causal_alignment::top_left) r.alignment = causal_alignment::bottom_right;
  if (o.attn_mask) {
    TensorView m = *o.attn_mask;
    if (m.rank() == 4 && m.size(0) == B) m = m.slice(0, b, b + 1);
    if (m.size(-1) > L) m = m.slice(m.rank() - 1, 0, L);
    r.attn_mask = m;
  }
  return r;
}

// acc[·] += g[·] over g's shape, with acc a contiguous float64 tensor and `at` the view of acc that
// g's elements land on (the same shape); g is of any float dtype, contiguous.
void add_into(const TensorView& at, const Tensor& g) {
  const Tensor g64 = g.to(dtype::f64);
  const double* src = g64.data_as<const double>();
  std::int64_t sh[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
  const int off = 4 - at.rank();
  for (int i = 0; i < at.rank(); ++i) sh[off + i] = at.size(i), st[off + i] = at.stride(i);
  auto* dst = at.data_as<double>();
  for (std::int64_t a = 0; a < sh[0]; ++a)
    for (std::int64_t h = 0; h < sh[1]; ++h)
      for (std::int64_t i = 0; i < sh[2]; ++i)
        for (std::int64_t j = 0; j < sh[3]; ++j) dst[a * st[0] + h * st[1] + i * st[2] + j * st[3]] += *src++;
}

// Adds a sequence's dense gradient [1, H, L, X] (contiguous, dtype of q) into the pages'
// accumulator [num_pages, page_size, H, X] (contiguous, float32 or float64, not zeroed) through
// the table: a token slot's first reader writes its rows, later ones add (`seen`, one flag a
// slot, set here; a table may name one page twice, so later may be in the same sequence), so the
// accumulator costs no pass of zeros; heads on nt threads (each head's rows are its own, so the
// sums do not depend on them).
template <class A>
void scatter_rows(const Tensor& dense, const Tensor& acc, const paged_dims& d, std::int64_t b, int nt,
                  std::vector<char>& seen) {
  const std::int64_t H = dense.size(1), L = dense.size(2), X = dense.size(3);
  const Tensor g = dense.type() == acc.type() ? dense : dense.to(acc.type());
  const A* src = g.data_as<const A>();
  A* dst = acc.data_as<A>();
  std::vector<std::int64_t> slot(static_cast<std::size_t>(L));
  std::vector<char> first(static_cast<std::size_t>(L));
  for (std::int64_t j = 0; j < L; ++j) {
    const std::int64_t s = d.page(b, j / d.page_size) * d.page_size + j % d.page_size;
    slot[std::size_t(j)] = s, first[std::size_t(j)] = !seen[std::size_t(s)], seen[std::size_t(s)] = 1;
  }
#pragma omp parallel for if (nt > 1 && H > 1) num_threads(nt) schedule(static)
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t j = 0; j < L; ++j) {
      A* row = dst + (slot[std::size_t(j)] * H + h) * X;
      const A* from = src + (h * L + j) * X;
      if (first[std::size_t(j)]) {
        std::copy(from, from + X, row);
      } else {
        for (std::int64_t x = 0; x < X; ++x) row[x] += from[x];
      }
    }
}

// Zeroes the rows of the token slots no sequence wrote (scatter_rows' `seen`).
void zero_unseen(const Tensor& acc, const std::vector<char>& seen) {
  const std::size_t row = std::size_t(acc.numel() / std::max<std::int64_t>(1, std::int64_t(seen.size()))) *
                          dtype_size(acc.type());
  for (std::size_t s = 0; s < seen.size(); ++s)
    if (!seen[s]) std::memset(static_cast<std::byte*>(acc.data()) + s * row, 0, row);
}

}  // namespace

std::pair<Tensor, Tensor> paged_backward_items(const char* op, const paged_kv_view& cache,
                                               const std::vector<paged_backward_item>& items, bool decode,
                                               const execution& exec, dtype q_type,
                                               const std::function<void(const paged_backward_item&, const attention_grads&)>& done) {
  const paged_dims d = check_pages(op, cache, 0);
  const int nt = exec.num_threads ? exec.num_threads : omp_get_max_threads();
  const dtype acc_type = q_type == dtype::f64 ? dtype::f64 : dtype::f32;
  const Tensor dk = Tensor::empty({d.num_pages, d.page_size, d.Hkv, d.D}, acc_type);
  const Tensor dv = Tensor::empty({d.num_pages, d.page_size, d.Hkv, d.Dv}, acc_type);
  std::vector<char> seen_k(std::size_t(d.num_pages * d.page_size), 0), seen_v = seen_k;
  // How many readings each token slot has: a sequence whose keys lie in one run of pages that
  // no other reading touches gets its dk, dv written straight into the pages' gradients (float32
  // or float64 q: the accumulator's own dtype), without a copy to scatter.
  std::vector<int> readers(seen_k.size(), 0);
  for (const paged_backward_item& it : items)
    for (std::int64_t j = 0; j < d.lens[std::size_t(it.b)]; ++j)
      ++readers[std::size_t(d.page(it.b, j / d.page_size) * d.page_size + j % d.page_size)];
  // Decode steps (few rows a sequence) run nt sequences side by side on a thread each, prefill
  // chunks one after another on every thread; either way a wave's results are added in order.
  const bool side_by_side = decode && nt > 1;
  const std::size_t wave = side_by_side ? std::size_t(nt) : 1;
  struct sequence_grads {
    Tensor dk, dv;  // undefined where written in place
    attention_grads rest;
  };
  for (std::size_t w0 = 0; w0 < items.size(); w0 += wave) {
    const std::size_t n = std::min(wave, items.size() - w0);
    std::vector<sequence_grads> sg(n);
    std::exception_ptr first;  // an error inside the parallel loop is kept and thrown after it
#pragma omp parallel for if (n > 1) num_threads(int(n)) schedule(static, 1)
    for (std::size_t i = 0; i < n; ++i) {
      try {
        const paged_backward_item& it = items[w0 + i];
        const std::int64_t L = d.lens[std::size_t(it.b)], pages = (L + d.page_size - 1) / d.page_size;
        const int inner = side_by_side ? 1 : nt;
        // Pages that follow each other in memory (a dense cache as one page a sequence) are read
        // in place, as the forward reads a run; others are copied dense.
        bool one_run = d.runs;
        for (std::int64_t p = 1; p < pages && one_run; ++p) one_run = d.page(it.b, p) == d.page(it.b, 0) + p;
        Tensor kc, vc;
        if (!one_run) {
          kc = dense_rows(cache.k_pages, {}, d, it.b, L, cache.k_pages.type(), inner);
          vc = dense_rows(cache.v_pages, {}, d, it.b, L, cache.v_pages.type(), inner);
        }
        const TensorView k = one_run ? page_rows(cache.k_pages, d.page(it.b, 0), L) : kc.view();
        const TensorView v = one_run ? page_rows(cache.v_pages, d.page(it.b, 0), L) : vc.view();
        bool in_place = one_run && acc_type == q_type;
        for (std::int64_t j = 0; j < L && in_place; ++j)
          in_place = readers[std::size_t(d.page(it.b, 0) * d.page_size + j)] == 1;
        TensorView dk_to, dv_to;
        if (in_place) {  // the run's rows of the contiguous [num_pages, page_size, Hkv, X] gradients
          dk_to = page_rows(dk, d.page(it.b, 0), L), dv_to = page_rows(dv, d.page(it.b, 0), L);
        } else {
          sg[i].dk = Tensor::empty({1, d.Hkv, L, d.D}, q_type), sg[i].dv = Tensor::empty({1, d.Hkv, L, d.Dv}, q_type);
          dk_to = sg[i].dk, dv_to = sg[i].dv;
        }
        execution eb = exec;
        eb.num_threads = inner;
        sg[i].rest = attention_backward_into(it.q, k, v, it.out, it.dout, it.lse, {it.dq, dk_to, dv_to}, it.options, eb);
      } catch (...) {
#pragma omp critical(attn_paged_backward_error)
        if (!first) first = std::current_exception();
      }
    }
    if (first) std::rethrow_exception(first);
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t b = items[w0 + i].b;
      if (!sg[i].dk.defined()) {  // written in place: its slots are seen
        for (std::int64_t j = 0; j < d.lens[std::size_t(b)]; ++j)
          seen_k[std::size_t(d.page(b, 0) * d.page_size + j)] = seen_v[std::size_t(d.page(b, 0) * d.page_size + j)] = 1;
      } else if (acc_type == dtype::f64) {
        scatter_rows<double>(sg[i].dk, dk, d, b, nt, seen_k), scatter_rows<double>(sg[i].dv, dv, d, b, nt, seen_v);
      } else {
        scatter_rows<float>(sg[i].dk, dk, d, b, nt, seen_k), scatter_rows<float>(sg[i].dv, dv, d, b, nt, seen_v);
      }
      done(items[w0 + i], sg[i].rest);
    }
  }
  zero_unseen(dk, seen_k), zero_unseen(dv, seen_v);
  return {acc_type == cache.k_pages.type() ? dk : dk.to(cache.k_pages.type()),
          acc_type == cache.v_pages.type() ? dv : dv.to(cache.v_pages.type())};
}

}  // namespace detail

paged_grads attention_paged_backward(const TensorView& q, const paged_kv_view& cache, const TensorView& out,
                                     const TensorView& dout, const TensorView& lse, const attention_options& options,
                                     const execution& exec) {
  using namespace detail;
  const char* op = "attention_paged_backward";
  const paged_dims d = check_paged_q(op, q, cache, options, exec);
  if (d.int8)
    fail(op, "int8 pages are a quantised cache and have no gradient; train on float pages (the dequantised cache)");
  const std::int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), D = d.D, Dv = d.Dv;
  check_saved(op, out, dout, lse, {B, Hq, Nq, Dv}, {B, Hq, Nq}, "[B, Hq, Nq]");
  const int nt = exec.num_threads ? exec.num_threads : omp_get_max_threads();
  if (options.attn_mask) {  // the mask checked as attention_paged takes it: [B, Hq, Nq, K], K the capacity
    problem masked;
    problem_storage unused;
    masked.B = B, masked.Hq = Hq, masked.Nq = Nq, masked.Nk = d.max_pages * d.page_size, masked.q.type = q.type();
    set_attn_mask(op, *options.attn_mask, masked, unused, nt);
  }

  paged_grads g;
  g.dq = Tensor::zeros({B, Hq, Nq, D}, q.type());
  const bool alibi_per_seq = options.alibi_slopes && options.alibi_slopes->rank() == 2;
  const Tensor dalibi = options.alibi_slopes ? Tensor::zeros(options.alibi_slopes->shape(), dtype::f64) : Tensor();
  const Tensor dsinks = options.sinks ? Tensor::zeros({Hq}, dtype::f64) : Tensor();
  const bool dmask_wanted = options.attn_mask && options.attn_mask->type() != dtype::boolean && options.mask_gradient;
  const Tensor dmask = dmask_wanted ? Tensor::zeros(options.attn_mask->shape(), dtype::f64) : Tensor();
  std::vector<paged_backward_item> items;
  for (std::int64_t b = 0; b < B; ++b)
    if (Nq > 0 && d.lens[std::size_t(b)] > 0)
      items.push_back({b, q.slice(0, b, b + 1), out.slice(0, b, b + 1), dout.slice(0, b, b + 1),
                       lse.slice(0, b, b + 1), g.dq.view().slice(0, b, b + 1),
                       paged_sequence_options(options, b, B, d.lens[std::size_t(b)])});
  std::tie(g.dk_pages, g.dv_pages) =
      paged_backward_items(op, cache, items, Hq * Nq < kPrefillRows, exec, q.type(),
                           [&](const paged_backward_item& it, const attention_grads& r) {
                             const std::int64_t b = it.b, L = d.lens[std::size_t(b)];
                             if (g.backend.empty()) g.backend = r.backend;
                             for (std::int64_t h = 0; h < Hq; ++h) {
                               if (dalibi.defined())
                                 dalibi.data_as<double>()[(alibi_per_seq ? b * Hq : 0) + h] += r.dalibi_slopes.get({h});
                               if (dsinks.defined()) dsinks.data_as<double>()[h] += r.dsinks.get({h});
                             }
                             if (dmask.defined()) {  // the mask's batch row b (or the whole broadcast mask), columns [0, L)
                               TensorView at = dmask.view();
                               if (at.rank() == 4 && at.size(0) == B) at = at.slice(0, b, b + 1);
                               if (at.size(-1) > L) at = at.slice(at.rank() - 1, 0, L);
                               add_into(at, r.dattn_mask);
                             }
                           });
  if (g.backend.empty()) g.backend = "none";
  if (dalibi.defined()) g.dalibi_slopes = dalibi.to(options.alibi_slopes->type());
  if (dsinks.defined()) g.dsinks = dsinks.to(options.sinks->type());
  if (dmask.defined()) g.dattn_mask = dmask.to(options.attn_mask->type());
  return g;
}

void paged_kv_append(const paged_kv_view& cache, const TensorView& k_new, const TensorView& v_new) {
  using namespace detail;
  const char* op = "paged_kv_append";
  if (k_new.rank() != 4 || v_new.rank() != 4)
    fail(op, fmt::format("k_new {} and v_new {} must be 4-D [B, Hkv, Nnew, D]", shape_str(k_new.shape()),
                         shape_str(v_new.shape())));
  const paged_dims d = check_pages(op, cache, k_new.size(2));
  const std::int64_t N = k_new.size(2);
  if (d.int8) {
    if (!is_floating(k_new.type()) || v_new.type() != k_new.type())
      fail(op, fmt::format("k_new/v_new have dtypes {}/{}; int8 pages quantise one float dtype", dtype_name(k_new.type()),
                           dtype_name(v_new.type())));
  } else if (k_new.type() != cache.k_pages.type() || v_new.type() != cache.k_pages.type()) {
    fail(op, fmt::format("k_new/v_new have dtypes {}/{}, expected {} like the pages", dtype_name(k_new.type()),
                         dtype_name(v_new.type()), dtype_name(cache.k_pages.type())));
  }
  if (k_new.shape() != Shape{d.B, d.Hkv, N, d.D})
    fail(op, fmt::format("k_new has shape {}, expected [{}, {}, Nnew, {}]", shape_str(k_new.shape()), d.B, d.Hkv, d.D));
  if (v_new.shape() != Shape{d.B, d.Hkv, N, d.Dv})
    fail(op, fmt::format("v_new has shape {}, expected [{}, {}, {}, {}]", shape_str(v_new.shape()), d.B, d.Hkv, N, d.Dv));
  if (d.int8) {
    // Symmetric per (token, head) row: scale = max|x| / 127, x ≈ scale · round(x / scale). Every
    // row is checked before any is written, so a non-finite value leaves the cache as it was.
    std::vector<float> rowbuf;
    for (int pass = 0; pass < 2; ++pass)
      for (auto [name, src, pages, scales] : {std::tuple{"k_new", &k_new, &cache.k_pages, &cache.k_scales},
                                              {"v_new", &v_new, &cache.v_pages, &cache.v_scales}}) {
        const strided4 s = as_bhnx(*src, d.Hkv);
        const TensorView& pg = *pages;
        const std::int64_t X = pages == &cache.k_pages ? d.D : d.Dv;
        rowbuf.resize(std::size_t(X));
        for (std::int64_t b = 0; b < d.B; ++b)
          for (std::int64_t t = 0; t < N; ++t)
            for (std::int64_t h = 0; h < d.Hkv; ++h) {
              float amax = 0.0f;
              for (std::int64_t x = 0; x < X; ++x) {
                const float v = float(s.load(b, h, t, x));
                if (!std::isfinite(v))
                  fail(op, fmt::format("{}[{}, {}, {}, {}] = {} cannot be quantised to int8", name, b, h, t, x, v));
                rowbuf[std::size_t(x)] = v, amax = std::max(amax, std::fabs(v));
              }
              if (pass == 0) continue;
              const std::int64_t pos = d.lens[std::size_t(b)] + t;
              const float scale = amax / 127.0f;
              static_cast<float*>(scales->data())[d.slot(*scales, b, pos) + h * scales->stride(2)] = scale;
              auto* dst = static_cast<std::int8_t*>(pg.data());
              for (std::int64_t x = 0; x < X; ++x)
                dst[d.elem(pg, b, pos, h, x)] = scale > 0.0f ? std::int8_t(std::clamp(std::nearbyint(rowbuf[std::size_t(x)] / scale), -127.0f, 127.0f)) : 0;
            }
      }
    return;
  }
  const std::size_t es = dtype_size(k_new.type());
  for (auto [src, pages] : {std::pair{&k_new, &cache.k_pages}, {&v_new, &cache.v_pages}}) {
    const strided4 s = as_bhnx(*src, d.Hkv);
    const TensorView& pg = *pages;
    const std::int64_t X = pg.size(3);
    for (std::int64_t b = 0; b < d.B; ++b)
      for (std::int64_t t = 0; t < N; ++t) {
        const std::int64_t base = d.slot(pg, b, d.lens[std::size_t(b)] + t);
        for (std::int64_t h = 0; h < d.Hkv; ++h)
          for (std::int64_t x = 0; x < X; ++x)
            std::memcpy(static_cast<std::byte*>(pg.data()) + (base + h * pg.stride(2) + x * pg.stride(3)) * es,
                        static_cast<const std::byte*>(s.data) + s.offset(b, h, t, x) * es, es);
      }
  }
}

}  // namespace attn

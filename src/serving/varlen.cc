// src/serving/varlen.cc — attention_varlen and its backward (include/attn/serving.h): each
// packed sequence runs through the core op's own problem and backend on strided views of the
// caller's [total, H, X] tensors, writing straight into the packed outputs. Work is Σ Nq_b·Nk_b;
// nothing is padded or copied but the small lse rows ([Hq, Nq_b] per sequence, since the
// backends keep lse contiguous as [B, Hq, Nq]).
//
// Threads: large sequences run one after another, each with all of exec's threads inside (the
// cpu backend parallelises over heads, query blocks and key chunks); small ones run side by
// side with one thread each (see run_sequences).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <exception>
#include <limits>

#include "attn/serving.h"
#include "core/common.h"
#include "core/problem.h"
#include "serving/serving.h"

namespace attn {
namespace detail {
namespace {

struct packed_dims {
  std::int64_t B, Hq, Hkv, D, Dv;
  std::vector<std::int64_t> cu_q, cu_k;
  std::vector<std::int64_t> mask_off;  // a packed attn_mask: sequence b's block from mask_off[b]
};

std::int64_t q_len(const packed_dims& d, std::int64_t b) { return d.cu_q[std::size_t(b) + 1] - d.cu_q[std::size_t(b)]; }
std::int64_t k_len(const packed_dims& d, std::int64_t b) { return d.cu_k[std::size_t(b) + 1] - d.cu_k[std::size_t(b)]; }

packed_dims check_packed(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& cu_q, const TensorView& cu_k, std::int64_t max_q, std::int64_t max_k,
                         const attention_options& o) {
  check_qkv_types(op, q, k, v);
  if (q.rank() != 3)
    fail(op, fmt::format("q has shape {}, expected 3 dims [total_q, Hq, D] (packed sequences)", shape_str(q.shape())));
  if (k.size(2) != q.size(2))
    fail(op, fmt::format("k has shape {}, expected [total_k, Hkv, {}] (head size of q {})", shape_str(k.shape()),
                         q.size(2), shape_str(q.shape())));
  if (v.size(0) != k.size(0) || v.size(1) != k.size(1))
    fail(op, fmt::format("v has shape {}, expected [{}, {}, Dv] to match k {}", shape_str(v.shape()), k.size(0),
                         k.size(1), shape_str(k.shape())));
  packed_dims d{0, q.size(1), k.size(1), q.size(2), v.size(2), {}, {}, {}};
  if (d.Hkv == 0 || d.Hq % d.Hkv)
    fail(op, fmt::format("q has {} heads and k/v {}; Hq must be a positive multiple of Hkv", d.Hq, d.Hkv));
  if (max_q < 0 || max_k < 0)
    fail(op, fmt::format("max_seqlen_q = {} and max_seqlen_k = {} must not be negative", max_q, max_k));
  d.cu_q = read_cu_seqlens(op, "cu_seqlens_q", cu_q, q.size(0), max_q);
  d.cu_k = read_cu_seqlens(op, "cu_seqlens_k", cu_k, k.size(0), max_k);
  if (d.cu_q.size() != d.cu_k.size())
    fail(op, fmt::format("cu_seqlens_q has {} entries and cu_seqlens_k {}; both must be B + 1", d.cu_q.size(),
                         d.cu_k.size()));
  d.B = std::int64_t(d.cu_q.size()) - 1;
  check_serving_options(op, o, d.B, d.Hq, d.Hkv, /*mask_ok=*/true);
  if (o.attn_mask) {
    std::vector<std::int64_t> nq, nk;
    for (std::int64_t b = 0; b < d.B; ++b) nq.push_back(q_len(d, b)), nk.push_back(k_len(d, b));
    d.mask_off = packed_mask_offsets(op, *o.attn_mask, nq, nk, d.Hq);
  }
  return d;
}

// Sequence b's rows of a packed [total, H, X] tensor as the core op's [1, H, n, X].
TensorView q_rows(const TensorView& t, const packed_dims& d, std::int64_t b) {
  return token_rows(t, d.cu_q[std::size_t(b)], q_len(d, b));
}
TensorView k_rows(const TensorView& t, const packed_dims& d, std::int64_t b) {
  return token_rows(t, d.cu_k[std::size_t(b)], k_len(d, b));
}

// The core op's problem of sequence b, checked as attn::attention checks it; a packed attn_mask
// gives it its block [Nq_b, Nk_b] (or [Hm, Nq_b, Nk_b]), read in place — or, for a float block
// with rows beyond ±1024 (an HF-style finfo.min row), shifted into store as the core op shifts it.
problem sequence_problem(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                         const packed_dims& d, std::int64_t b, const attention_options& o, const execution& exec,
                         problem_storage& store) {
  attention_options ob = for_sequence(o, b);
  if (o.attn_mask) ob.attn_mask = packed_mask_block(*o.attn_mask, d.mask_off[std::size_t(b)], q_len(d, b), k_len(d, b));
  return build_problem(op, q_rows(q, d, b), k_rows(k, d, b), k_rows(v, d, b), ob, exec, store);
}

// A sequence that has queries, with its checked problem and backend; d_alibi, d_sinks ([Hq])
// collect its parameter gradients in the backward.
struct sequence_run {
  std::int64_t b = 0;
  problem p;
  problem_storage store;  // a shifted mask block (p.mask_view points into it)
  const backend_impl* be = nullptr;
  std::vector<double> d_alibi, d_sinks;
};

// Sequences below this many multiply-adds in q·kᵀ (Hq·Nq·Nk·D) run side by side, one thread
// each: many short sequences otherwise pay one parallel region each for little work.
constexpr double kInnerThreadsWork = double(1 << 24);

// Every sequence is checked (and its backend chosen) before any runs, so a bad argument throws
// before anything is written.
std::vector<sequence_run> plan_sequences(const char* op, const TensorView& q, const TensorView& k,
                                         const TensorView& v, const packed_dims& d, const attention_options& o,
                                         const execution& exec, const backend_request& req) {
  std::vector<sequence_run> runs;
  for (std::int64_t b = 0; b < d.B; ++b) {
    if (d.cu_q[std::size_t(b) + 1] == d.cu_q[std::size_t(b)]) continue;  // no queries: nothing to compute
    sequence_run r;
    r.b = b;
    r.p = sequence_problem(op, q, k, v, d, b, o, exec, r.store);
    r.be = &pick(op, r.p, req, exec.use_backend);
    runs.push_back(std::move(r));
  }
  return runs;
}

// fn(run) for every run: large sequences one after another with all threads inside, then the
// small ones in parallel with one thread each. The backends give the same bits for any thread
// count, so the split changes nothing in the results.
template <class Fn>
void run_sequences(std::vector<sequence_run>& runs, Fn fn) {
  std::vector<sequence_run*> small;
  int nt = 1;
  for (sequence_run& r : runs) {
    nt = r.p.num_threads;
    if (double(r.p.Hq) * double(r.p.Nq) * double(r.p.Nk) * double(r.p.D) >= kInnerThreadsWork) {
      fn(r);
    } else {
      r.p.num_threads = 1;
      small.push_back(&r);
    }
  }
  // An error inside the parallel loop (attn::error, out of memory) must not leave it: the first
  // is kept and thrown after.
  std::exception_ptr first;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1)
  for (std::size_t i = 0; i < small.size(); ++i) {
    try {
      fn(*small[i]);
    } catch (...) {
#pragma omp critical(attn_varlen_error)
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace
}  // namespace detail

varlen_result attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                               std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                               const attention_options& options, const execution& exec) {
  using namespace detail;
  const char* op = "attention_varlen";
  const packed_dims d = check_packed(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options);
  const std::int64_t total_q = q.size(0);
  varlen_result r;
  r.out = Tensor::empty({total_q, d.Hq, d.Dv}, q.type());
  r.lse = Tensor::empty({d.Hq, total_q}, q.type() == dtype::f64 ? dtype::f64 : dtype::f32);
  std::vector<sequence_run> runs = plan_sequences(op, q, k, v, d, options, exec, {});
  run_sequences(runs, [&](const sequence_run& sr) {
    const std::int64_t q0 = d.cu_q[std::size_t(sr.b)], nq = sr.p.Nq;
    const Tensor lse = Tensor::empty({d.Hq, nq}, r.lse.type());
    special_rows found;
    forward_outputs fo;
    fo.out = as_bhnx(q_rows(r.out, d, sr.b), d.Hq);
    fo.lse = lse.data();
    fo.lse_type = lse.type();
    fo.found = &found;
    forward_on(op, sr.p, sr.store, *sr.be, fo);  // (special rows and a shifted mask as attn::attention)
    for (std::int64_t h = 0; h < d.Hq; ++h)
      for (std::int64_t i = 0; i < nq; ++i)
        store_from_double(r.lse.data(), r.lse.type(), h * total_q + q0 + i,
                          load_as_double(lse.data(), lse.type(), h * nq + i));
  });
  if (!runs.empty()) r.backend = std::string(runs.front().be->name());
  return r;
}

varlen_grads attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& out, const TensorView& dout, const TensorView& lse,
                                       const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                                       std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                                       const attention_options& options, const execution& exec) {
  using namespace detail;
  const char* op = "attention_varlen_backward";
  const packed_dims d = check_packed(op, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, options);
  const std::int64_t total_q = q.size(0);
  check_saved(op, out, dout, lse, {total_q, d.Hq, d.Dv}, {d.Hq, total_q}, "[Hq, total_q]");

  varlen_grads g;
  g.dq = Tensor::zeros(q.shape(), q.type());
  g.dk = Tensor::zeros(k.shape(), q.type());
  g.dv = Tensor::zeros(v.shape(), q.type());
  const bool alibi_per_seq = options.alibi_slopes && options.alibi_slopes->rank() == 2;
  Tensor dalibi = options.alibi_slopes ? Tensor::zeros(options.alibi_slopes->shape(), dtype::f64) : Tensor();
  Tensor dsinks = options.sinks ? Tensor::zeros({d.Hq}, dtype::f64) : Tensor();
  // A float packed mask's gradient in its own packed shape: each sequence adds into its block
  // (blocks are disjoint, so sequences side by side never touch the same element).
  const bool dmask_wanted = options.attn_mask && options.attn_mask->type() != dtype::boolean && options.mask_gradient;
  const Tensor dmask = dmask_wanted ? Tensor::zeros(options.attn_mask->shape(), dtype::f64) : Tensor();
  std::vector<sequence_run> runs =
      plan_sequences(op, q, k, v, d, options, exec, {.backward = true, .dmask = dmask_wanted});
  run_sequences(runs, [&](sequence_run& sr) {  // sequences without queries keep zero dk, dv
    const std::int64_t q0 = d.cu_q[std::size_t(sr.b)], nq = sr.p.Nq;
    const Tensor lse_b = Tensor::empty({1, d.Hq, nq}, lse.type());  // contiguous, as backends read it
    for (std::int64_t h = 0; h < d.Hq; ++h)
      for (std::int64_t i = 0; i < nq; ++i) lse_b.set({0, h, i}, lse.get({h, q0 + i}));
    backward_io io;
    io.out = as_bhnx(q_rows(out, d, sr.b), d.Hq);
    io.dout = as_bhnx(q_rows(dout, d, sr.b), d.Hq);
    io.dq = as_bhnx(q_rows(g.dq, d, sr.b), d.Hq);
    io.dk = as_bhnx(k_rows(g.dk, d, sr.b), d.Hkv);
    io.dv = as_bhnx(k_rows(g.dv, d, sr.b), d.Hkv);
    if (dalibi.defined()) sr.d_alibi.assign(std::size_t(d.Hq), 0.0), io.dalibi = sr.d_alibi.data();
    if (dsinks.defined()) sr.d_sinks.assign(std::size_t(d.Hq), 0.0), io.dsinks = sr.d_sinks.data();
    if (dmask.defined()) {  // block b over [1, Hq, Nq_b, Nk_b]: heads on dim 0 of an [Hq, S] mask
      const TensorView acc = dmask.view();
      const std::int64_t sh = acc.rank() == 2 && acc.size(0) == d.Hq && d.Hq > 1 ? acc.stride(0) : 0;
      io.dmask = strided4{dmask.data_as<double>() + d.mask_off[std::size_t(sr.b)], dtype::f64, 0, sh,
                          k_len(d, sr.b), 1};
    }
    // attention_backward's fallbacks, per sequence: a shifted mask's lse recomputed, the float64
    // reference for an lse or q·k terms past ±1024 and for non-finite gradients.
    const std::int64_t off = dmask.defined() ? d.mask_off[std::size_t(sr.b)] : 0, len = nq * k_len(d, sr.b);
    const std::int64_t mrows = dmask.defined() && dmask.rank() == 2 ? dmask.size(0) : 1;
    const auto block = [&](std::int64_t r) { return dmask.data_as<double>() + r * (dmask.numel() / mrows) + off; };
    const backward_guards guards{
        q_rows(g.dq, d, sr.b), k_rows(g.dk, d, sr.b), k_rows(g.dv, d, sr.b),
        [&] {
          std::fill(sr.d_alibi.begin(), sr.d_alibi.end(), 0.0);
          std::fill(sr.d_sinks.begin(), sr.d_sinks.end(), 0.0);
          if (dmask.defined())
            for (std::int64_t r = 0; r < mrows; ++r) std::fill(block(r), block(r) + len, 0.0);
        },
        [&] {
          bool ok = true;
          for (double x : sr.d_alibi) ok &= std::isfinite(x);
          for (double x : sr.d_sinks) ok &= std::isfinite(x);
          if (dmask.defined())
            for (std::int64_t r = 0; r < mrows; ++r)
              for (std::int64_t x = 0; x < len; ++x) ok &= std::isfinite(block(r)[x]);
          return ok;
        }};
    const backend_impl& ran = backward_on(op, sr.p, sr.store, lse_b.view(), io, *sr.be, exec.use_backend, guards);
    sr.be = &ran;
  });
  for (const sequence_run& sr : runs)  // in sequence order: the sums do not depend on the threads
    for (std::int64_t h = 0; h < d.Hq; ++h) {
      if (dalibi.defined()) dalibi.data_as<double>()[(alibi_per_seq ? sr.b * d.Hq : 0) + h] += sr.d_alibi[std::size_t(h)];
      if (dsinks.defined()) dsinks.data_as<double>()[h] += sr.d_sinks[std::size_t(h)];
    }
  if (!runs.empty()) g.backend = std::string(runs.front().be->name());
  if (dalibi.defined()) g.dalibi_slopes = dalibi.to(options.alibi_slopes->type());
  if (dsinks.defined()) g.dsinks = dsinks.to(options.sinks->type());
  if (dmask.defined()) g.dattn_mask = dmask.to(options.attn_mask->type());
  return g;
}

}  // namespace attn

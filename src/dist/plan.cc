// src/dist/plan.cc — the ring's plan: every rank's arguments checked and exchanged before any
// block moves, and the core-op problem of one block with global positions.
#include "dist/plan.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/common.h"

namespace attn::dist::detail {

using attn::detail::fail;
using attn::detail::problem;
using attn::detail::problem_storage;

namespace {

// ---- what every rank tells every other before any block moves ----

// Fixed-size, so one MPI_Allgather of bytes carries it. A rank whose own arguments are bad
// sends `failed` and its message instead of running, so every rank throws the same error.
struct rank_header {
  std::int64_t failed = 0;
  std::int64_t B = 0, Hq = 0, Hkv = 0, n = 0, D = 0, Dv = 0, type = 0;
  char shapes[160] = {};   // "q [..] k [..] v [..]" for messages
  char options[320] = {};  // every option that must agree, as text
  char message[512] = {};
};

void put(char* dst, std::size_t cap, const std::string& s) {
  const std::size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

double sum_of(const std::optional<TensorArg>& t) {
  double s = 0.0;
  if (t)
    for (double x : to_vector(*t)) s += x;
  return s;
}

// The options every rank must share, as text (tensor options by shape and sum).
std::string options_text(const ring_options& o) {
  auto tensor = [](const std::optional<TensorArg>& t) {
    return t ? fmt::format("{} sum {}", shape_str(t->shape()), sum_of(t)) : std::string("none");
  };
  return fmt::format("layout {}, is_causal {}, alignment {}, window ({}, {}), scale {}, softcap {}, alibi_slopes {}, "
                     "sinks {}, nonpad_kv_seqlen {}",
                     to_string(o.layout), o.is_causal, int(o.alignment), o.window_left, o.window_right,
                     o.scale ? fmt::format("{}", *o.scale) : "default", o.softcap, tensor(o.alibi_slopes),
                     tensor(o.sinks), tensor(o.nonpad_kv_seqlen));
}

// The message of an attn::error without its leading "<op>: ".
std::string without_op(const char* op, const std::string& what) {
  const std::string prefix = std::string(op) + ": ";
  return what.rfind(prefix, 0) == 0 ? what.substr(prefix.size()) : what;
}

// Local checks of one rank; throws attn::error. q/k/v 4-D float32/float64 shards of the same
// positions; options the block decomposition cannot honour are refused by name.
void check_local(const char* op, const TensorView& q, const TensorView& k, const TensorView& v, const ring_options& o) {
  if (o.attn_mask) fail(op, "attn_mask is not supported (a dense [.., N, N] mask does not shard; use windows, "
                            "nonpad_kv_seqlen or ALiBi)");
  if (o.past_key || o.past_value) fail(op, "past_key/past_value are not supported (the ring holds the whole sequence)");
  if (o.return_qk != qk_output::none) fail(op, "return_qk is not supported (the [B, Hq, N, N] scores never exist)");
  attn::detail::check_qkv_types(op, q, k, v);
  if (q.rank() != 4)
    fail(op, fmt::format("q has {} dims; ring attention takes 4-D shards q [B, Hq, n, D] (3-D inputs are refused)",
                         q.rank()));
  if (q.type() != dtype::f32 && q.type() != dtype::f64)
    fail(op, fmt::format("q has dtype {}; ring attention supports float32 and float64", dtype_name(q.type())));
  if (k.size(2) != q.size(2))
    fail(op, fmt::format("q holds {} positions and k {} ({} and {}); q and k/v must be sharded alike", q.size(2),
                         k.size(2), shape_str(q.shape()), shape_str(k.shape())));
}

}  // namespace

ring_plan make_plan(const char* op, const private_comm& comm, const TensorView& q, const TensorView& k,
                    const TensorView& v, const ring_options& o, const execution& exec, bool backward,
                    const std::function<void(const problem&)>& more) {
  ring_plan plan;
  plan.op = op, plan.P = comm.size(), plan.rank = comm.rank(), plan.exec = exec;
  plan.block = o;
  plan.block.nonpad_kv_seqlen.reset();
  plan.block.sinks.reset();
  plan.block.alignment = causal_alignment::after_past;
  plan.bottom_right = o.alignment == causal_alignment::bottom_right;

  rank_header mine;
  try {
    check_local(op, q, k, v, o);
    attention_options checked = plan.block;  // the core front checks everything but the global key counts
    checked.sinks = o.sinks;
    problem_storage store;
    const problem p = attn::detail::build_problem(op, q, k, v, checked, exec, store);
    plan.sinks = p.sinks;  // the ring adds them itself, once per row
    if (o.nonpad_kv_seqlen) {
      const TensorView& t = *o.nonpad_kv_seqlen;
      const std::string want = fmt::format("[B] = [{}]", p.B);
      plan.nonpad = attn::detail::read_index(op, "nonpad_kv_seqlen", t, 1, want.c_str());
      if (t.size(0) != p.B) fail(op, fmt::format("nonpad_kv_seqlen has shape {}, expected {}", shape_str(t.shape()), want));
    }
    plan.backend = &attn::detail::pick(op, p, {.backward = backward}, exec.use_backend);
    more(p);
    mine.B = p.B, mine.Hq = p.Hq, mine.Hkv = p.Hkv, mine.n = p.Nq, mine.D = p.D, mine.Dv = p.Dv;
    mine.type = std::int64_t(q.type());
  } catch (const std::exception& e) {  // attn::error, or e.g. bad_alloc: every rank must hear of it
    mine.failed = 1;
    put(mine.message, sizeof mine.message, without_op(op, e.what()));
  }
  put(mine.shapes, sizeof mine.shapes,
      fmt::format("q {} k {} v {}", shape_str(q.shape()), shape_str(k.shape()), shape_str(v.shape())));
  put(mine.options, sizeof mine.options, options_text(o));

  std::vector<rank_header> all(std::size_t(plan.P));
  check_mpi(op, MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all.data(), sizeof mine, MPI_BYTE, comm.get()),
            "Allgather of shapes and options");
  for (int s = 0; s < plan.P; ++s)
    if (all[std::size_t(s)].failed) fail(op, fmt::format("rank {}: {}", s, all[std::size_t(s)].message));
  const rank_header& h0 = all[0];
  for (int s = 1; s < plan.P; ++s) {
    const rank_header& h = all[std::size_t(s)];
    if (h.B != h0.B || h.Hq != h0.Hq || h.Hkv != h0.Hkv || h.D != h0.D || h.Dv != h0.Dv || h.type != h0.type)
      fail(op, fmt::format("ranks disagree on shapes: rank 0 has {} ({}), rank {} has {} ({}); only the sequence "
                           "length may differ",
                           h0.shapes, dtype_name(dtype(h0.type)), s, h.shapes, dtype_name(dtype(h.type))));
    if (std::strcmp(h.options, h0.options) != 0)
      fail(op, fmt::format("ranks disagree on options: rank 0 has {}; rank {} has {}", h0.options, s, h.options));
  }
  plan.B = h0.B, plan.Hq = h0.Hq, plan.Hkv = h0.Hkv, plan.D = h0.D, plan.Dv = h0.Dv, plan.type = dtype(h0.type);
  for (const rank_header& h : all) plan.n.push_back(h.n), plan.N += h.n;
  for (int s = 0; s < plan.P; ++s) {
    plan.segs.push_back(sequence_segments(plan.N, plan.P, s, o.layout));
    std::int64_t want = 0;
    for (const segment& g : plan.segs.back()) want += g.length;
    if (want != plan.n[std::size_t(s)])
      fail(op, fmt::format("rank {} holds {} positions, but the {} layout of N = {} over {} ranks gives it {} "
                           "(shard with attn::dist::shard)",
                           s, plan.n[std::size_t(s)], to_string(o.layout), plan.N, plan.P, want));
  }
  for (std::size_t b = 0; b < plan.nonpad.size(); ++b)
    if (plan.nonpad[b] < 0 || plan.nonpad[b] > plan.N)
      fail(op, fmt::format("nonpad_kv_seqlen[{}] = {} is outside [0, {}] (the global number of keys)", b,
                           plan.nonpad[b], plan.N));
  return plan;
}

problem block_problem(const ring_plan& plan, const TensorView& q, const TensorView& k, const TensorView& v,
                      segment qg, segment kg, problem_storage& store) {
  problem p = attn::detail::build_problem(plan.op, q, k, v, plan.block, plan.exec, store);
  p.past_lens.resize(std::size_t(plan.B));
  for (std::int64_t b = 0; b < plan.B; ++b) {
    const std::int64_t keys = plan.nonpad.empty() ? plan.N : plan.nonpad[std::size_t(b)];
    const std::int64_t origin = plan.bottom_right ? keys - plan.N : 0;  // global query_pos of query 0
    p.past_lens[std::size_t(b)] = origin + qg.begin - kg.begin;
  }
  if (!plan.nonpad.empty()) {
    p.kv_len.resize(std::size_t(plan.B));
    for (std::int64_t b = 0; b < plan.B; ++b)
      p.kv_len[std::size_t(b)] = std::clamp(plan.nonpad[std::size_t(b)] - kg.begin, std::int64_t(0), kg.length);
  }
  return p;
}

std::int64_t unmasked_scores(const problem& p) {
  std::int64_t n = 0;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t i = 0; i < p.Nq; ++i) {
      const auto [lo, hi] = p.key_range(b, i);
      n += hi - lo;
    }
  return n * p.Hq;
}

}  // namespace attn::dist::detail

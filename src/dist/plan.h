// src/dist/plan.h — what the ring's forward and backward share: the plan every rank agrees on
// before any block moves (shapes, options, who holds which positions), and the core-op problem
// of one block with global positions.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "attn/dist.h"
#include "core/problem.h"
#include "dist/mpi_util.h"

namespace attn::dist::detail {

struct ring_plan {
  const char* op = nullptr;
  int P = 1, rank = 0;
  std::int64_t B = 0, Hq = 0, Hkv = 0, N = 0, D = 0, Dv = 0;
  dtype type = dtype::f32;
  std::vector<std::int64_t> n;                // [P] positions per rank
  std::vector<std::vector<segment>> segs;     // [P] global segments per rank, in local order
  attention_options block;                    // the user's maths minus what the ring does itself
  bool bottom_right = false;                  // user alignment (top_left and after_past are alike here)
  std::vector<std::int64_t> nonpad;           // [B] global valid keys, or empty
  std::vector<double> sinks;                  // [Hq], or empty
  execution exec;
  const attn::detail::backend_impl* backend = nullptr;
};

// Checks this rank's arguments, exchanges every rank's shapes, options and check outcome in one
// MPI_Allgather, and builds the plan — or throws the same attn::error on every rank, naming the
// rank. `more` runs extra local checks (the backward's out/dout/lse) before the exchange.
ring_plan make_plan(const char* op, const private_comm& comm, const TensorView& q, const TensorView& k,
                    const TensorView& v, const ring_options& o, const execution& exec, bool backward,
                    const std::function<void(const attn::detail::problem&)>& more);

// The core-op problem of query rows at global segment qg against keys at global segment kg
// (q, k, v already sliced to them). Positions are global: query_pos(b, i) - j is the distance
// between global positions qg.begin + i and kg.begin + j.
attn::detail::problem block_problem(const ring_plan& plan, const TensorView& q, const TensorView& k,
                                    const TensorView& v, segment qg, segment kg, attn::detail::problem_storage& store);

// Unmasked scores of a block (query rows × keys in their key_range × heads); 0: skip it.
std::int64_t unmasked_scores(const attn::detail::problem& p);

}  // namespace attn::dist::detail

// attn/dist.h — ring attention over MPI (context parallelism): the sequence is split across the
// ranks of a communicator, K/V blocks travel around the ring, and each rank's partial results
// merge by log-sum-exp into exactly what one process computes with attn::attention. Library
// attn::dist, built when CMake finds MPI. docs/DISTRIBUTED.md has the cost model.
//
// Shapes (4-D only; n_r is rank r's share of the sequence, Σ_r n_r = N):
//   q [B, Hq, n_r, D]   k [B, Hkv, n_r, D]   v [B, Hkv, n_r, Dv]   out [B, Hq, n_r, Dv]   lse [B, Hq, n_r]
// q and k/v are sharded the same way (self-attention over one sequence of N tokens). Which global
// positions rank r holds is the `sequence_layout`:
//   contiguous  rank r holds chunk r of P chunks                      (N split as numpy.array_split)
//   zigzag      rank r holds chunk r then chunk 2P-1-r of 2P chunks   (equal causal work per rank)
// shard() below cuts a full tensor that way; gather() puts the shards back together.
//
//   attn::dist::ring_options opt;
//   opt.is_causal = true, opt.layout = attn::dist::sequence_layout::zigzag;
//   auto ql = attn::dist::shard(q, P, rank, opt.layout);              // and k, v
//   auto r = attn::dist::ring_attention(MPI_COMM_WORLD, ql, kl, vl, opt);
//   attn::Tensor out = attn::dist::gather(MPI_COMM_WORLD, r.out, opt.layout);  // full on rank 0
//
// Options, as in attention.h, with these limits of the block decomposition:
//   supported   is_causal (any alignment), windows, nonpad_kv_seqlen (global key counts),
//               scale, softcap, alibi_slopes (global positions), sinks (counted once per row),
//               GQA (Hq % Hkv == 0)
//   refused     attn_mask (a dense [.., N, N] mask defeats sharding), past_key/past_value,
//               return_qk, 3-D inputs, dtypes other than float32 and float64
// Every rank must pass the same options and the same B, Hq, Hkv, D, Dv and dtype. All of it is
// exchanged (one allgather) before any block moves, so a mismatch or a bad argument on any rank
// throws attn::error on every rank, naming the rank — never a hang.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attn/attention.h"

namespace attn::dist {

enum class sequence_layout { contiguous, zigzag };

// "contiguous", "zigzag" and back; parse throws attn::error listing the valid names.
std::string_view to_string(sequence_layout l);
sequence_layout parse_sequence_layout(std::string_view name);

struct ring_options : attention_options {
  sequence_layout layout = sequence_layout::contiguous;
};

// A run of consecutive global positions [begin, begin + length) held by a rank.
struct segment {
  std::int64_t begin = 0, length = 0;
};

// The segments rank `rank` of P holds of a sequence of N, in local order (1 for contiguous,
// 2 for zigzag; empty segments are kept so the local order is always the same).
std::vector<segment> sequence_segments(std::int64_t N, int P, int rank, sequence_layout layout);

// Rank `rank`'s shard of `full` along `dim` (2 for [B, H, N, X] and [B, H, N]): a new
// contiguous tensor. gather() is its inverse: every rank passes its shard, `root` gets the
// full tensor (every rank when root < 0), other ranks an undefined Tensor. Collective.
Tensor shard(const TensorView& full, int P, int rank, sequence_layout layout, int dim = 2);
Tensor gather(MPI_Comm comm, const TensorView& local, sequence_layout layout, int root = 0, int dim = 2);

// What one rank did in one ring step: seconds in the local fused kernel, seconds blocked on
// the ring's sends/receives after it (communication not hidden by compute), and the scores
// q·k it computed (unmasked (query, key, head) triples; a block that is fully masked is skipped
// and counts 0).
struct ring_step {
  double compute_s = 0.0, wait_s = 0.0;
  std::int64_t scores = 0;
};
struct ring_stats {
  std::vector<ring_step> steps;  // P entries
  std::int64_t scores() const;
  double compute_s() const;
  double wait_s() const;
};

struct ring_result {
  Tensor out;  // [B, Hq, n_r, Dv], dtype of q
  Tensor lse;  // [B, Hq, n_r], dtype of q; -inf on fully masked rows
  ring_stats stats;
  std::string backend;  // the backend of the local blocks
};

// Forward. Collective over `comm` (every rank calls it with its shard). P steps: at step s rank
// r attends its queries to the K/V block of rank r - s while sending that block to rank r + 1
// and receiving the next one (MPI_Isend/Irecv, overlapped with the local kernel).
ring_result ring_attention(MPI_Comm comm, const TensorView& q, const TensorView& k, const TensorView& v,
                           const ring_options& options = {}, const execution& exec = {});

struct ring_grads {
  Tensor dq, dk, dv;     // [B, Hq|Hkv, n_r, D|Dv], dtype of q
  Tensor dalibi_slopes;  // shape of alibi_slopes (summed over ranks: the same on every rank)
  Tensor dsinks;         // [Hq] (summed over ranks)
  ring_stats stats;
  std::string backend;
};

// Backward from this rank's out and lse (what ring_attention returned) and dout [B, Hq, n_r, Dv].
// K/V circulate as in the forward, and with them the dK/dV accumulators of their owner, which
// return home after one more hop.
ring_grads ring_attention_backward(MPI_Comm comm, const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& dout, const TensorView& lse,
                                   const ring_options& options = {}, const execution& exec = {});

}  // namespace attn::dist

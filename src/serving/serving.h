// src/serving/serving.h — what the varlen and paged fronts share (index tensors are read by
// core/common.h's read_index): the options a per-sequence call cannot take, token-major rows seen as a [1, H, n, X]
// view of the core op, and the backend pick.
#pragma once

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "attn/attention.h"
#include "attn/serving.h"
#include "core/problem.h"

namespace attn::detail {

// Refuses the options that make no sense per sequence (attn_mask unless mask_ok, nonpad_kv_seqlen,
// past_*, return_qk) and checks q_num_heads / kv_num_heads against Hq / Hkv. ALiBi slopes must be
// [Hq] or [B, Hq]. for_sequence returns the options of one sequence with ALiBi [B, Hq] sliced to
// row b.
void check_serving_options(const char* op, const attention_options& o, std::int64_t B, std::int64_t Hq,
                           std::int64_t Hkv, bool mask_ok = false);
attention_options for_sequence(const attention_options& o, std::int64_t b);

// A backward's saved forward and its incoming gradient: out and dout of shape `out_shape` and
// float dtypes, lse of shape `lse_shape` (its layout named in the message) and float32 or
// float64 (attn::error naming op otherwise).
void check_saved(const char* op, const TensorView& out, const TensorView& dout, const TensorView& lse,
                 const Shape& out_shape, const Shape& lse_shape, const char* lse_layout);

// cu_seqlens: int64 or int32 [B + 1], 0 at the front, non-decreasing, `total` at the back, every
// length <= max_seqlen (attn::error naming op and `name` otherwise).
std::vector<std::int64_t> read_cu_seqlens(const char* op, const char* name, const TensorView& t, std::int64_t total,
                                          std::int64_t max_seqlen);

// What attention_paged checks of a call before any work (src/serving/paged.cc), for a q of dtype
// qt and shape [B, Hq, ·, Dq]: the pages, block table and lengths, the dtypes, heads, head size
// and options, each failure an attn::error naming op. attention_paged_varlen checks its whole
// batch so, under its own name, before its calls per Nq (a sequence with no queries has none).
void check_paged_call(const char* op, dtype qt, std::int64_t B, std::int64_t Hq, std::int64_t Dq,
                      const paged_kv_view& cache, const attention_options& options, const execution& exec);

// One sequence of a paged backward: its rows as the core op's [1, Hq, n, ·] views (lse [1, Hq,
// n]), where its dq goes, and its options as the core op takes them on its keys [0, seq_lens[b]).
struct paged_backward_item {
  std::int64_t b = 0;  // the sequence's row of the block table
  TensorView q, out, dout, lse, dq;
  attention_options options;
};
// attention_backward_into for each item on its sequence's keys copied dense from the pages
// (float pages; read in place where its pages follow each other in memory, its dk, dv then
// written in place where no other reading shares its slots), dk and dv carried back through the
// table into the pages' gradients (returned:
// contiguous, the pages' dtype; a token slot read several times gets the sum, in item order, in
// float32 — float64 for float64 — rounded once; rows nobody reads 0). `decode`: items side by
// side on a thread each, else one after another on every thread. done(item, grads) receives each
// item's other gradients (ALiBi, sinks, the mask) in item order. src/serving/paged.cc.
std::pair<Tensor, Tensor> paged_backward_items(const char* op, const paged_kv_view& cache,
                                               const std::vector<paged_backward_item>& items, bool decode,
                                               const execution& exec, dtype q_type,
                                               const std::function<void(const paged_backward_item&, const attention_grads&)>& done);

// Rows [r0, r0 + n) of a token-major [T, H, X] view as the core op's [1, H, n, X] (no copy).
TensorView token_rows(const TensorView& t, std::int64_t r0, std::int64_t n);

// A packed attn_mask (FlashInfer's custom_mask layout) over B sequences of nq[b] queries and
// nk[b] keys: bool or a float dtype, [S] (every head) or [Hm, S] (Hm = 1 or Hq), S = Σ_b
// nq[b]·nk[b]; sequence b's block [nq[b], nk[b]] lies row-major from offset off[b]. Checks the
// mask (attn::error naming op otherwise) and returns off, B + 1 entries (off[B] = S).
std::vector<std::int64_t> packed_mask_offsets(const char* op, const TensorView& m, const std::vector<std::int64_t>& nq,
                                              const std::vector<std::int64_t>& nk, std::int64_t Hq);
// Block b of a packed mask as the core op's mask (no copy): [nq, nk] from a [S] mask, [Hm, nq, nk]
// from an [Hm, S] one.
TensorView packed_mask_block(const TensorView& m, std::int64_t off, std::int64_t nq, std::int64_t nk);
}  // namespace attn::detail

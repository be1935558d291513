// attn/serving.h — attention for inference servers: variable-length packed batches
// (FlashAttention's flash_attn_varlen_func) and a paged KV cache (vLLM's PagedAttention,
// FlashAttention's block_table). Both run every sequence through the fused core op of
// attention.h on strided views of the caller's memory: no padding, no copy of K/V.
//
// Shape legend as in attention.h: B sequences · Hq / Hkv heads · D key size · Dv value size.
//
// Varlen layouts (packed back to back, token-major as FlashAttention):
//   q [total_q, Hq, D]   k [total_k, Hkv, D]   v [total_k, Hkv, Dv]   out [total_q, Hq, Dv]
//   cu_seqlens_q, cu_seqlens_k: int64 or int32 [B + 1], 0 = cu[0] <= cu[1] <= ... <= cu[B] = total
//   sequence b owns query rows [cu_q[b], cu_q[b+1]) and key rows [cu_k[b], cu_k[b+1])
//   lse [Hq, total_q] (FlashAttention's varlen layout), float32 (float64 for float64 inputs)
// Every option of attention_options that is per call applies to each sequence on its own:
// is_causal with its causal_alignment (bottom_right is FlashAttention's: the last query of a
// sequence sits at its last key), windows, softcap, scale, ALiBi ([Hq], or [B, Hq]: one row per
// sequence), sinks, GQA, and an attn_mask packed per sequence (below). Not accepted:
// nonpad_kv_seqlen (the cu_seqlens say which keys are valid), past_key/past_value, return_qk. A
// sequence with no keys gives zero output rows and lse = -inf; a sequence with no queries
// contributes nothing (and zero dk/dv).
//
// Packed masks (FlashInfer's custom_mask layout): attn_mask, bool (true: attend) or float
// (added), holds each sequence's [Nq_b, Nk_b] mask row-major, the sequences back to back:
//   attn_mask [S] (every head) or [1 or Hq, S], S = Σ_b Nq_b·Nk_b, sequence b's block at
//   offset Σ_{c<b} Nq_c·Nk_c (a sequence with no queries or keys has an empty block)
// — a tree of draft tokens per sequence, a padding or document mask, a learned bias. For
// attention_paged_varlen, Nk_b is seq_lens[b]. A float row whose largest finite value lies beyond
// ±1024 (an HF-style row of finfo.min) is shifted by that maximum, as attn::attention shifts it,
// and the shift goes back into lse. The backward returns a float mask's gradient in the packed
// shape (dattn_mask), and takes attention_backward's fallbacks to the float64 reference sequence
// by sequence.
//
// Paged KV cache layouts:
//   k_pages [num_pages, page_size, Hkv, D]   v_pages [num_pages, page_size, Hkv, Dv]
//   block_table int64 or int32 [B, max_pages]: page of sequence b's tokens [p·page_size, (p+1)·page_size)
//   seq_lens int64 or int32 [B]: keys of sequence b (0 <= seq_lens[b] <= max_pages · page_size)
//   q [B, Hq, Nq, D] (the core op's 4-D layout, any strides)   out [B, Hq, Nq, Dv]   lse [B, Hq, Nq]
// Pages may be shared between sequences and appear in any order; entries of block_table past
// a sequence's last page are not read.
//
// Index tensors (cu_seqlens, block_table, seq_lens) are int64 or int32 — FlashAttention's and
// vLLM's int32 ones pass as they are — with any strides; another dtype is an attn::error.
#pragma once

#include <cstdint>
#include <string_view>

#include "attn/attention.h"
#include "attn/execution.h"
#include "attn/tensor.h"

namespace attn {

struct varlen_result {
  Tensor out;  // [total_q, Hq, Dv], dtype of q
  Tensor lse;  // [Hq, total_q]; -inf on rows with no key
  std::string backend;
};

// Forward pass over B packed sequences. max_seqlen_q / max_seqlen_k are upper bounds of the
// sequence lengths (as in FlashAttention); a length above its bound is an attn::error.
//
//   attn::attention_options opt;
//   opt.is_causal = true, opt.alignment = attn::causal_alignment::bottom_right;
//   auto r = attn::attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, opt);  // r.out [total_q, Hq, Dv]
varlen_result attention_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                               std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                               const attention_options& options = {}, const execution& exec = {});

struct varlen_grads {
  Tensor dq, dk, dv;     // [total, H, D|Dv], dtype of q
  Tensor dalibi_slopes;  // shape of alibi_slopes
  Tensor dsinks;         // [Hq]
  Tensor dattn_mask;     // a float packed attn_mask (unless options.mask_gradient is false): its shape
  std::string backend;
};

// Backward pass from the saved lse; `out` and `lse` are what attention_varlen returned for the
// same inputs and options, `dout` has the shape of out.
varlen_grads attention_varlen_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& out, const TensorView& dout, const TensorView& lse,
                                       const TensorView& cu_seqlens_q, const TensorView& cu_seqlens_k,
                                       std::int64_t max_seqlen_q, std::int64_t max_seqlen_k,
                                       const attention_options& options = {}, const execution& exec = {});

// How the cpu decode multiplies q with int8 pages (docs/SERVING.md, "int8 KV cache"):
//   automatic  where the CPU has AVX512_VNNI int16 dot products (and D, Dv are multiples of 64):
//              each row of q rounded to int16 with a power-of-two scale — exact for bfloat16 q; a
//              float32 or float16 element moves by at most 2^-14 of its row's largest |q| — and
//              each block's weights p·scale_v likewise (at most 2^-14 of the block's largest).
//              About 1.6× the rate of float32 products on such CPUs. Elsewhere, bfloat16 q may
//              take bf16 products of the widened rows (weights rounded to bf16) where the CPU's
//              bf16 dot product is fast; every other case is float32.
//   float32    q and the weights stay floats: the int8 rows widened to float32, every product
//              exact (float32 accumulation).
//   int8       as automatic, but where the int16 products run on AVX-512, each block's weights
//              p·scale_v are rounded to unsigned 8 bits (scale: the block's largest / 255, per
//              row), so that P·V takes one byte dot product (vpdpbusd) per four products; and
//              where keys are blocked (below) q is rounded to 8 bits too (a float scale per row,
//              max|q| / 127: llama.cpp rounds q the same way for its q8_0 cache), q·k likewise —
//              half the products of automatic. A weight moves by up to 1/510 of its block's
//              largest, an element of q (blocked keys) by up to 1/254 of its row's largest |q|:
//              about the int8 cache's own rounding of the keys (docs/SERVING.md, "int8 KV cache",
//              for the measured error). Other ISAs read as with automatic.
enum class int8_query { automatic, float32, int8 };
// "automatic", "float32", "int8" and back; parse_int8_query throws attn::error listing the valid names.
std::string_view to_string(int8_query q);
int8_query parse_int8_query(std::string_view name);

// A paged KV cache as the caller holds it (non-owning). int8 pages (a quantised cache, symmetric,
// one scale per (token, head) row: element = scale · int8) come with their float32 scales
// k_scales / v_scales [num_pages, page_size, Hkv]; float pages leave them empty.
// A dense cache [B, Hkv, capacity, X] is the one-page-per-sequence case: pages =
// buffer.permute({0, 2, 1, 3}), page_size = capacity, block_table [B, 1] = b.
// int8 keys may instead be blocked: k_pages 6-D [num_pages, page_size / 16, Hkv, D / 4, 16, 4]
// (page_size and D multiples of 16 and 4; the last three dims contiguous): each 64-byte line holds
// four elements of d of 16 consecutive keys, the layout the AVX512-VNNI decode reads without
// transposing (key t of a page, element x of head h at [t / 16, h, x / 4, t % 16, x % 4]; vLLM
// splits its key cache the same way). Values and scales keep their layout.
struct paged_kv_view {
  TensorArg k_pages, v_pages, block_table, seq_lens;
  TensorArg k_scales{}, v_scales{};  // int8 pages only
  int8_query query = int8_query::automatic;  // int8 pages only
};

// Attention of q against the first seq_lens[b] keys of each sequence, read from the pages in
// place: decode (Nq = 1 … 16, speculative decoding) and chunked prefill. With is_causal and
// bottom_right or after_past alignment, query row i of sequence b sits at key position
// seq_lens[b] - Nq + i (the queries are the last Nq tokens, already appended); top_left keeps
// pos_i = i. Options as for varlen, ALiBi [Hq] or [B, Hq], and an attn_mask (bool, true:
// attend; or float, added) over each sequence's key positions, broadcast to [B, Hq, Nq, K] with K
// the table's capacity max_pages · page_size (a shorter last dim excludes the positions past it,
// as the core op's mask does) — e.g. a tree of draft tokens; a float row whose largest finite
// value lies beyond ±1024 among the sequence's keys [0, seq_lens[b]) is shifted by it as the core
// op shifts it (columns past the length are padding, whatever they hold). Runs of pages that are consecutive
// in memory are read as one view; each run gives a partial softmax that is merged by
// log-sum-exp (sinks join once, at the merge) — except where the cpu backend runs it on float32,
// bfloat16 or int8 pages with unit x-stride: its decode kernel then walks the block table itself.
// int8 pages need that path (q float32, bfloat16 or float16). attention_paged_backward
// differentiates it (float pages).
//
//   attn::paged_kv_view cache{k_pages, v_pages, table, lens};
//   attn::paged_kv_append(cache, k_step, v_step);          // writes the new tokens
//   lens.data_as<std::int64_t>()[b] += 1 ...               // then the caller advances
//   auto r = attn::attention_paged(q, cache, opt);        // r.out [B, Hq, Nq, Dv]
attention_result attention_paged(const TensorView& q, const paged_kv_view& cache,
                                 const attention_options& options = {}, const execution& exec = {});

struct paged_grads {
  Tensor dq;                  // [B, Hq, Nq, D], dtype of q
  Tensor dk_pages, dv_pages;  // [num_pages, page_size, Hkv, D|Dv], contiguous, dtype of the pages
  Tensor dalibi_slopes;       // shape of alibi_slopes
  Tensor dsinks;              // [Hq]
  Tensor dattn_mask;          // a float attn_mask (unless options.mask_gradient is false): its shape
  std::string backend;
};

// Backward of attention_paged from its saved lse: `out` and `lse` are what attention_paged
// returned for the same q, cache and options, `dout` [B, Hq, Nq, Dv]. Each sequence's gradient
// is attention_backward's on its first seq_lens[b] keys (a dense copy of them per sequence unless
// its pages follow each other in memory; its options as attention_paged applies them);
// dk_pages / dv_pages carry them back through the
// block table: rows no sequence reads get 0, and a page that several sequences read (a shared
// prefix) gets the sum, added in sequence order in float32 (float64 for float64 pages) and
// rounded once to the pages' dtype — the same for any thread count. A float attn_mask's
// gradient has zeros at positions past a sequence's length. Float pages only: int8 pages (a
// quantised cache) are refused. Prefix tuning, training through a cache shared by several
// continuations (a shared prompt in RL rollouts), gradients of a draft tree's mask.
//
//   auto r = attn::attention_paged(q, cache, opt);
//   auto g = attn::attention_paged_backward(q, cache, r.out, dout, r.lse, opt);  // g.dk_pages ...
paged_grads attention_paged_backward(const TensorView& q, const paged_kv_view& cache, const TensorView& out,
                                     const TensorView& dout, const TensorView& lse,
                                     const attention_options& options = {}, const execution& exec = {});

// A batch whose sequences bring different numbers of new tokens — decode steps beside prefill
// chunks, as a scheduler mixes them — packed as q [total_q, Hq, D] with cu_seqlens_q (int64
// [B + 1], every length <= max_seqlen_q; a length of 0 is a sequence with nothing to compute),
// against the paged cache of the same B sequences. Each sequence is what attention_paged gives it
// with its own Nq (query i at key position seq_lens[b] - Nq_b + i under bottom_right). Returns
// out [total_q, Hq, Dv] and lse [Hq, total_q] as attention_varlen does. The sequences run grouped
// by Nq: one attention_paged call per distinct Nq (all the decode steps in one).
//
//   auto r = attn::attention_paged_varlen(q_packed, cu_q, max_q, cache, opt);  // r.out [total_q, Hq, Dv]
varlen_result attention_paged_varlen(const TensorView& q, const TensorView& cu_seqlens_q, std::int64_t max_seqlen_q,
                                     const paged_kv_view& cache, const attention_options& options = {},
                                     const execution& exec = {});

// Backward of attention_paged_varlen from its saved out [total_q, Hq, Dv] and lse [Hq, total_q],
// dout [total_q, Hq, Dv], the same cache (float pages) and options. Each sequence's gradient is
// attention_backward's on its keys as attention_paged_backward computes it; dq is packed like q,
// dk_pages / dv_pages are the pages' gradients as there (shared slots summed, unread rows 0), a
// float packed attn_mask's gradient has the packed shape.
//
//   auto r = attn::attention_paged_varlen(q, cu_q, max_q, cache, opt);
//   auto g = attn::attention_paged_varlen_backward(q, cu_q, max_q, cache, r.out, dout, r.lse, opt);
paged_grads attention_paged_varlen_backward(const TensorView& q, const TensorView& cu_seqlens_q,
                                            std::int64_t max_seqlen_q, const paged_kv_view& cache,
                                            const TensorView& out, const TensorView& dout, const TensorView& lse,
                                            const attention_options& options = {}, const execution& exec = {});

// Writes k_new [B, Hkv, Nnew, D] / v_new [B, Hkv, Nnew, Dv] (dtype of the pages; any float dtype
// for int8 pages, which it quantises: scale = max|row| / 127, value = round(x / scale), a zero
// row gets scale 0; a non-finite value is an attn::error and nothing is written) at positions
// [seq_lens[b], seq_lens[b] + Nnew) of each sequence's pages. Only those rows are written;
// seq_lens is not changed (the caller advances it by Nnew). The positions must fit the block
// table: seq_lens[b] + Nnew <= max_pages · page_size.
void paged_kv_append(const paged_kv_view& cache, const TensorView& k_new, const TensorView& v_new);

}  // namespace attn

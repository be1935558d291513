// attn/positional.h — positional information for attention, forward and backward:
// sinusoidal absolute encoding, a learned position table, rotary embeddings (RoPE, half-split
// and interleaved) and the T5 bucketed relative position bias. ALiBi lives in the core op
// (attention_options::alibi_slopes). docs/POSITIONAL.md has the formulas in one table.
//
// Shape legend as in attention.h: B batch · H heads · N sequence length · D head (or model)
// size · Nq/Nk query/key lengths. Every function accepts f32, f16, bf16 and f64 tensors with
// any strides and returns a new C-contiguous tensor; f16/bf16 compute in f32 (angles in f64)
// and round once. Bad input throws attn::error ("rotary: rotary_dim = 5 must be even ...").
// Setting ATTN_BACKEND=reference runs the float64 reference of every function instead.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/tensor.h"

namespace attn {

// Where each row of a sequence sits. Either an offset (row n of every batch is at
// offset + n; a KV cache of P entries gives offset = P for the new rows) or explicit int64 (or
// int32, widened once) ids: [N] shared by the batch, or [B, N] per batch (left padding, packed sequences).
// Converts implicitly from both, so `rotary(q, 16)` and `rotary(q, ids)` read naturally.
struct positions {
  std::int64_t offset = 0;
  std::optional<TensorArg> ids;  // int64 or int32 [N] or [B, N]

  positions() = default;
  positions(std::int64_t start) : offset(start) {}                 // NOLINT: implicit by design
  positions(const TensorView& position_ids) : ids(position_ids) {}  // NOLINT: implicit by design
  positions(const Tensor& position_ids) : ids(position_ids) {}  // NOLINT: implicit by design
};

// ---------------------------------------------------------------------------------------------
// Sinusoidal absolute encoding (Vaswani et al. 2017), interleaved sin/cos:
//   PE[p, 2i]   = sin(p · base^(-2i/D))
//   PE[p, 2i+1] = cos(p · base^(-2i/D))          i = 0 .. ceil(D/2)-1 (odd D ends on a sin)
// Returns [N, D] (offset or ids [N]) or [B, N, D] (ids [B, N]) in dtype `t`. It has no
// parameters, so it has no backward.
//
//   attn::Tensor pe = attn::sinusoidal_encoding(128, 512);          // [128, 512] f32, p = 0..127
//   attn::Tensor next = attn::sinusoidal_encoding(1, 512, 10000, attn::dtype::f32, 128);  // p = 128
Tensor sinusoidal_encoding(std::int64_t N, std::int64_t D, double base = 10000.0, dtype t = dtype::f32,
                           const positions& pos = {});

// x + PE: x is [N, D] or [B, N, D] (rows along dim -2), any float dtype; the result has the
// shape and dtype of x. The backward is the identity (dx = dy).
//
//   attn::Tensor h = attn::add_sinusoidal_encoding(embeddings, /*pos=*/past_len);
Tensor add_sinusoidal_encoding(const TensorView& x, const positions& pos = {}, double base = 10000.0);

// ---------------------------------------------------------------------------------------------
// Learned absolute position table: out[.., n, :] = table[p_n, :].
// table [P, D] (P = number of positions it holds); every p_n must lie in [0, P).
// Returns [N, D] (offset or ids [N]) or [B, N, D] (ids [B, N]), dtype of table.
//
//   attn::Tensor e = attn::learned_position_encoding(table, 64);       // rows 0..63 of table
Tensor learned_position_encoding(const TensorView& table, std::int64_t N, const positions& pos = {});

// Gradient of the table: dtable[p, :] = Σ over rows n (and batches) with p_n = p of dout[.., n, :].
// dout is [N, D] or [B, N, D]; a [N, D] dout with ids [B, N] is not accepted (shapes must agree).
// Returns [num_positions, D] in the dtype of dout (accumulated in f64); rows never looked up are 0.
//
//   attn::Tensor dtable = attn::learned_position_encoding_backward(dout, table.size(0));
Tensor learned_position_encoding_backward(const TensorView& dout, std::int64_t num_positions,
                                          const positions& pos = {});

// ---------------------------------------------------------------------------------------------
// Rotary position embedding (RoPE, Su et al. 2021). The leading R = rotary_dim features of each
// head are rotated in pairs (a, b) by the angle θ_i = p · base^(-2i/R), i = 0 .. R/2-1:
//   out[a] = x[a] cos θ_i − x[b] sin θ_i
//   out[b] = x[b] cos θ_i + x[a] sin θ_i            features R .. D-1 pass through unchanged
// The pairing is the convention:
//   half_split  (GPT-NeoX, LLaMA, Hugging Face rotate_half):  a = i,   b = i + R/2
//   interleaved (GPT-J, the RoFormer paper, Meta's LLaMA ref): a = 2i,  b = 2i + 1
// Rotating q and k makes q·k depend on positions only through p_q − p_k.
enum class rotary_layout { half_split, interleaved };

struct rotary_options {
  std::int64_t rotary_dim = 0;  // R: even, 0 < R <= D; 0 means R = D (partial rotary: R < D)
  double base = 10000.0;        // θ_i = p · base^(-2i/R); > 0 and finite
  rotary_layout layout = rotary_layout::half_split;
  std::int64_t num_heads = 0;   // required for 3-D x [B, N, H*D]; checked against 4-D x
};

// x: [B, H, N, D] or [B, N, H*D] (with num_heads), any strides; positions index N
// (ids [N] or [B, N]). Returns the rotated tensor, same shape and dtype as x.
//
//   attn::rotary_options ro;
//   ro.layout = attn::rotary_layout::interleaved;
//   attn::Tensor qr = attn::rotary(q, past_len, ro);   // q [B, Hq, Nq, D], rows at P + n
//   attn::Tensor kr = attn::rotary(k, past_len, ro);
Tensor rotary(const TensorView& x, const positions& pos = {}, const rotary_options& options = {});

// Backward of rotary: the inverse (transposed) rotation, dx = R(−θ) dy. Same arguments as the
// forward, with dy in place of x.
Tensor rotary_backward(const TensorView& dy, const positions& pos = {}, const rotary_options& options = {});

// ---------------------------------------------------------------------------------------------
// T5 relative position bias (Raffel et al. 2020). The relative position of key j seen from
// query i is r = j − (query_offset + i). T5 buckets r (Mesh TensorFlow / Hugging Face formula):
//   bidirectional: n = |r|, nb = num_buckets / 2, bucket starts at nb when r > 0 (else 0)
//   causal:        n = max(−r, 0), nb = num_buckets       (keys after the query share bucket 0)
//   max_exact = nb / 2
//   n < max_exact:  + n
//   otherwise:      + min(nb − 1, max_exact + trunc(log(n / max_exact) / log(max_distance / max_exact)
//                                                    · (nb − max_exact)))
// The log term is evaluated in float32, as T5 and Hugging Face do, so buckets match theirs.
struct relative_position_options {
  bool bidirectional = true;       // T5 encoder: true; decoder (causal self-attention): false
  std::int64_t num_buckets = 32;   // rows of the table
  std::int64_t max_distance = 128; // distances >= max_distance share the last bucket
  std::int64_t query_offset = 0;   // query i sits at key position query_offset + i (KV cache: P)
};

// The bucket of one relative position r = key − query.
//
//   attn::relative_position_bucket(-3, {.bidirectional = false, .num_buckets = 32}) == 3
std::int64_t relative_position_bucket(std::int64_t relative_position, const relative_position_options& options = {});

// int64 [Nq, Nk]: the bucket of every (query, key) pair.
Tensor relative_position_buckets(std::int64_t Nq, std::int64_t Nk, const relative_position_options& options = {});

// bias[0, h, i, j] = table[bucket(j − (query_offset + i)), h].
// table [num_buckets, H] (Hugging Face's nn.Embedding(num_buckets, H) weight). Returns
// [1, H, Nq, Nk] in the dtype of table — the float attn_mask of attn::attention.
//
//   attn::relative_position_options rp;                 // bidirectional, 32 buckets, 128
//   attn::attention_options opt;
//   opt.attn_mask = attn::relative_position_bias(table, Nq, Nk, rp);   // opt keeps it alive
//   opt.scale = 1.0;                                    // T5 does not scale q·k
Tensor relative_position_bias(const TensorView& table, std::int64_t Nq, std::int64_t Nk,
                              const relative_position_options& options = {});

// Gradient of the table: dtable[bucket(j − (query_offset + i)), h] += dbias[b, h, i, j], summed
// over b. dbias is [B', H, Nq, Nk] (e.g. attention_grads::dattn_mask) or [H, Nq, Nk].
// Returns [num_buckets, H] in the dtype of dbias (accumulated in f64).
Tensor relative_position_bias_backward(const TensorView& dbias, const relative_position_options& options = {});

}  // namespace attn

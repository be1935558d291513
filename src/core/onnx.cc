// src/core/onnx.cc — the ONNX Attention operator (opsets 23/24) mapped onto attn::attention.
// (The runner of conformance case folders is tools/conformance/, outside the library.)
#include "attn/onnx.h"

#include <fmt/format.h>

#include "attn/error.h"

namespace attn::onnx {

attention_options to_options(const inputs& in, const attributes& a) {
  attention_options o;
  o.scale = a.scale;
  o.is_causal = a.is_causal;
  o.softcap = a.softcap;
  o.q_num_heads = a.q_num_heads;
  o.kv_num_heads = a.kv_num_heads;
  // ONNX's causal frontier: after the past when past_key is given; otherwise at the end of the
  // valid keys (nonpad_kv_seqlen) when those are given; otherwise top-left.
  o.alignment = in.past_key ? causal_alignment::after_past
                : in.nonpad_kv_seqlen ? causal_alignment::bottom_right
                                      : causal_alignment::top_left;
  o.attn_mask = in.attn_mask;
  o.past_key = in.past_key;
  o.past_value = in.past_value;
  o.nonpad_kv_seqlen = in.nonpad_kv_seqlen;
  switch (a.qk_matmul_output_mode) {
    case -1: o.return_qk = qk_output::none; break;
    case 0:
    case 1: o.return_qk = qk_output::softcapped; break;  // the reference returns the softcapped scores for both
    case 2: o.return_qk = qk_output::biased; break;
    case 3: o.return_qk = qk_output::probabilities; break;
    default:
      throw error(fmt::format("onnx.Attention: qk_matmul_output_mode = {}, expected 0, 1, 2 or 3", a.qk_matmul_output_mode));
  }
  const int sp = a.softmax_precision;
  if (sp != 0 && sp != 1 && sp != 10 && sp != 11 && sp != 16)
    throw error(fmt::format("onnx.Attention: softmax_precision = {}, expected 1 (float), 10 (float16), 11 (double) or "
                            "16 (bfloat16)", sp));
  return o;
}

outputs run(const inputs& in, const attributes& a, const execution& exec) {
  const attention_options o = to_options(in, a);
  attention_result r = attention(in.Q, in.K, in.V, o, exec);
  outputs out;
  out.Y = r.out;
  out.qk_matmul_output = r.qk;
  if (in.past_key) {
    out.present_key = r.present_key;
    out.present_value = r.present_value;
  } else {  // present = K, V as [B, Hkv, Nk, D]
    auto as4 = [&](const TensorView& t) {
      if (t.rank() == 4) return Tensor::copy_of(t);
      const std::int64_t H = o.kv_num_heads;
      return Tensor::copy_of(t.reshape({t.size(0), t.size(1), H, t.size(2) / H}).permute({0, 2, 1, 3}));
    };
    out.present_key = as4(in.K);
    out.present_value = as4(in.V);
  }
  return out;
}

}  // namespace attn::onnx

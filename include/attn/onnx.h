// attn/onnx.h — the ONNX `Attention` operator (opsets 23/24) on top of attn::attention.
#pragma once

#include <cstdint>
#include <optional>

#include "attn/attention.h"

namespace attn::onnx {

// The operator's attributes; absent ones take the operator's defaults.
struct attributes {
  std::optional<double> scale;
  bool is_causal = false;
  std::int64_t q_num_heads = 0;
  std::int64_t kv_num_heads = 0;
  double softcap = 0.0;
  int qk_matmul_output_mode = -1;  // -1: output not requested; else 0..3
  int softmax_precision = 0;       // accepted (1, 10, 11, 16); attn always computes in >= f32
};

struct inputs {
  TensorArg Q, K, V;
  std::optional<TensorArg> attn_mask, past_key, past_value, nonpad_kv_seqlen;
};

struct outputs {
  Tensor Y, present_key, present_value, qk_matmul_output;
};

// Runs the operator exactly as ONNX defines it: causal frontier after the past (or at the end
// of nonpad_kv_seqlen without a past), GQA by interleaved head repeat, mask padding.
outputs run(const inputs& in, const attributes& attrs, const execution& exec = {});

// Maps ONNX attributes and inputs onto attention_options (views stay borrowed from `in`).
attention_options to_options(const inputs& in, const attributes& attrs);

}  // namespace attn::onnx

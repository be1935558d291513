// attn/nn/loss.h — losses that return their value and their gradient in one call (llm.c's
// fused classifier: the softmax is computed once for both).
//
//   cross_entropy  logits [..., C], targets int64 or int32 [...]:
//                  L = mean over counted rows r of −log softmax(logits_r)[t_r]
//                  rows whose target is ignore_index are not counted and get a zero gradient;
//                  dlogits_r = (softmax(logits_r) − onehot(t_r)) / count
//   mse            L = mean over elements of (pred − target)²,  dpred = 2 (pred − target) / n
// With nothing counted (every target ignored, or no element) L = 0 and the gradient is zero.
//
//   attn::nn::loss_result l = attn::nn::cross_entropy(logits, targets, /*ignore_index=*/0);
//   std::printf("loss %.4f accuracy %.3f\n", l.loss, double(l.correct) / double(l.count));
//   model_backward(l.dlogits);
#pragma once

#include <cstdint>

#include "attn/tensor.h"

namespace attn::nn {

struct loss_result {
  double loss = 0.0;
  Tensor grad;             // d loss / d input (the logits or the prediction), its shape and dtype
  std::int64_t count = 0;  // counted rows (cross_entropy) or elements (mse)
  std::int64_t correct = 0;  // cross_entropy: counted rows whose arg max (first on ties) is the target
};

loss_result cross_entropy(const Tensor& logits, const Tensor& targets, std::int64_t ignore_index = -100);
loss_result mse(const Tensor& pred, const Tensor& target);

}  // namespace attn::nn

// examples/classifier.h — the training loop and the evaluation the classification examples
// (han_documents, co_attention_match) share. A model is a struct with
//   saved                                  what its backward needs
//   run(batch, saved&, need_weights)       the forward up to its attention layer's result
//   logits(saved)                          [n, 2]
//   backward(batch, saved, dlogits)        accumulates every parameter gradient
//   parameters(parameter_list&)
// and a batch has `labels` (int64 [n]); make(gen, n) draws one.
#pragma once

#include <attn/attn.h>

#include <cstdint>
#include <vector>

#include "progress.h"

// Adam, warmup (50 steps) + cosine from 1e-2 to 1e-4, gradient norm clipped at 5, cross-entropy
// on fresh batches; prints the progress line every 100 steps.
template <class Model, class Make>
void train_classifier(Model& m, Make make, attn::nn::rng& data, int steps, std::int64_t batch_size, const char* unit) {
  namespace nn = attn::nn;
  nn::parameter_list ps;
  m.parameters(ps);
  nn::adam opt;
  const progress meter;
  for (int step = 0; step < steps; ++step) {
    const auto b = make(data, batch_size);
    typename Model::saved sv;
    m.run(b, sv, false);
    const nn::loss_result l = nn::cross_entropy(m.logits(sv), b.labels);
    nn::zero_grad(ps);
    m.backward(b, sv, l.grad);
    nn::clip_grad_norm(ps, 5.0);
    opt.lr = nn::warmup_cosine(step, 50, steps, 1e-2, 1e-4);
    opt.step(ps);
    meter.report(step, steps, 100, l, "accuracy", double(batch_size), unit);
  }
}

// Class 1 where its logit is the larger, per row of logits [n, 2].
inline std::vector<std::int64_t> predicted_classes(const attn::Tensor& logits) {
  std::vector<std::int64_t> p(std::size_t(logits.size(0)), 0);
  for (std::int64_t b = 0; b < logits.size(0); ++b) p[std::size_t(b)] = logits.get({b, 1}) > logits.get({b, 0});
  return p;
}

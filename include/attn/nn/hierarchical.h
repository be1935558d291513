// attn/nn/hierarchical.h — the hierarchical attention network (Yang et al. 2016, "HAN"), the
// hierarchical input architecture of the tutorials (literature 003): words → sentence vectors →
// document vector, attention with a learned context vector at both levels.
//
// ContextAttention — attention pooling with a learned context vector u_c (the query is not an
// input but a parameter: "which element is informative"):
//   h [R, N, D], lengths int64 or int32 [R] (elements t >= lengths_r are padding)
//   u_t = tanh(W h_t + b)          W [A, D], b [A]
//   α_t = softmax_t(u_tᵀ u_c)       over t < lengths_r; padding gets α = 0
//   s   = Σ_t α_t h_t               [R, D]; a row with length 0 gives s = 0 (and no gradient)
// The softmax and the sum are attn::attention (query u_c, keys u, values h, scale 1).
//
// HierarchicalAttention:
//   x [B, S, W, E] word vectors (S sentences of W words), word_lengths int64 or int32 [B, S] in [0, W],
//   sentence_lengths int64 or int32 [B] in [0, S]. Sentences s >= sentence_lengths_b are padding: they
//   are treated as empty (word length 0), get sentence weight 0 and do not change the output.
//   h_it = BiGRU_w(x_i·)_t                        [B·S, W, 2Hw]  (padded words excluded)
//   s_i  = ContextAttention_w(h_i·)               [B, S, 2Hw]    (context u_w)
//   g_i  = BiGRU_s(s)_i                           [B, S, 2Hs]    (padded sentences excluded)
//   d    = ContextAttention_s(g)                  [B, 2Hs]       (context u_s)
// The attention sizes are A = 2Hw and 2Hs, as in the paper.
//
//   attn::nn::HierarchicalAttention han(/*E=*/32, /*Hw=*/32, /*Hs=*/32, gen);
//   attn::nn::HierarchicalAttention::saved s;
//   auto r = han.forward(x, word_lengths, sentence_lengths, &s, /*need_weights=*/true);
//   // r.document [B, 64], r.word_weights [B, S, W], r.sentence_weights [B, S]
//   attn::Tensor dx = han.backward(s, ddocument);
#pragma once

#include <cstdint>

#include "attn/nn/gru.h"
#include "attn/nn/linear.h"

namespace attn::nn {

struct ContextAttention {
  Linear proj;               // W [A, D], b [A]
  Tensor context, dcontext;  // u_c [A]

  ContextAttention() = default;
  // proj as nn::Linear; u_c U(-1/sqrt(A), 1/sqrt(A)).
  ContextAttention(std::int64_t D, std::int64_t A, rng& gen, dtype t = dtype::f32);

  struct saved {
    Tensor h, lengths;  // the forward's inputs
    Tensor a;           // [R, N, A] W h + b (before the tanh)
    Tensor u, q;        // [R, N, A] tanh(a); [R, 1, A] u_c for every row
    Tensor out, lse;    // attention output [R, 1, D] and its log-sum-exp [R, 1, 1]
  };
  struct result {
    Tensor pooled;   // [R, D]
    Tensor weights;  // [R, N] (dtype of h) when asked for
  };

  result forward(const Tensor& h, const Tensor& lengths, saved* s = nullptr, bool need_weights = false) const;
  // dpooled [R, D]: accumulates proj's and the context's gradients; returns dh [R, N, D].
  Tensor backward(const saved& s, const Tensor& dpooled);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

struct HierarchicalAttention {
  BiGRUEncoder word_encoder;           // E → 2Hw
  ContextAttention word_attention;     // D = A = 2Hw, context u_w
  BiGRUEncoder sentence_encoder;       // 2Hw → 2Hs
  ContextAttention sentence_attention; // D = A = 2Hs, context u_s

  HierarchicalAttention() = default;
  HierarchicalAttention(std::int64_t E, std::int64_t Hw, std::int64_t Hs, rng& gen, dtype t = dtype::f32);

  struct saved {
    std::int64_t B = 0, S = 0, W = 0;
    BiGRUEncoder::saved words, sentences;
    ContextAttention::saved word_pool, sentence_pool;
  };
  struct result {
    Tensor document;          // [B, 2Hs]
    Tensor word_weights;      // [B, S, W] when asked for (0 on padding)
    Tensor sentence_weights;  // [B, S] when asked for (0 on padding)
  };

  result forward(const Tensor& x, const Tensor& word_lengths, const Tensor& sentence_lengths, saved* s = nullptr,
                 bool need_weights = false) const;
  // ddocument [B, 2Hs]: accumulates every parameter gradient; returns dx [B, S, W, E].
  Tensor backward(const saved& s, const Tensor& ddocument);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

}  // namespace attn::nn

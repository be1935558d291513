// attn/nn/memory_network.h — the end-to-end memory network (Sukhbaatar et al. 2015), the
// multi-hop attention of the tutorials (literature 003), with adjacent weight tying.
//
//   story ids [B, S, W] (S sentences of W word ids, 0 = no word), query ids [B, W],
//   lengths int64 or int32 [B] (sentences 0 .. lengths_b − 1 are real)
//   tables E^0 .. E^K [V, d] and temporal encodings T^0 .. T^K [S, d]
//   u_1     = Σ_w E^0[q_w]                                  (B = A^1 = E^0)
//   hop k = 1 .. K:  m_i = Σ_w E^{k−1}[x_iw] + T^{k−1}_i       (A^k = E^{k−1})
//                    c_i = Σ_w E^k[x_iw] + T^k_i               (C^k = E^k = A^{k+1})
//                    p = softmax_i(u_k · m_i),  o = Σ_i p_i c_i,  u_{k+1} = u_k + o
//   logits  = u_{K+1} (E^K)ᵀ                                [B, V]  (W = C^K)
// Each hop's attention is attn::attention (one head, scale 1, padding sentences excluded).
//
//   attn::nn::MemoryNetwork net(/*V=*/40, /*d=*/32, /*S=*/10, /*hops=*/3, gen);
//   attn::nn::MemoryNetwork::saved s;
//   auto r = net.forward(story, query, lengths, &s);          // r.logits [B, V]
//   net.backward(s, dlogits);
#pragma once

#include <cstdint>
#include <vector>

#include "attn/attention.h"
#include "attn/nn/embedding.h"

namespace attn::nn {

struct MemoryNetwork {
  std::vector<Embedding> E;       // K + 1 tables [V, d]
  std::vector<Tensor> T, dT;      // K + 1 temporal encodings [S, d] and their gradients

  MemoryNetwork() = default;
  // Tables N(0, 0.1²) as in the paper; word 0 is "no word" (its row is never read).
  MemoryNetwork(std::int64_t V, std::int64_t d, std::int64_t S, std::int64_t hops, rng& gen, dtype t = dtype::f32);

  std::int64_t hops() const { return std::int64_t(E.size()) - 1; }

  struct hop_saved {
    Tensor u, m, c;     // [B, 1, d], [B, S, d], [B, S, d]
    Tensor o, lse;      // attention output [B, 1, d] and its log-sum-exp
  };
  struct saved {
    Tensor story, query, lengths;
    std::vector<hop_saved> hops;
    Tensor u_last;  // [B, d]
  };
  struct result {
    Tensor logits;                 // [B, V]
    std::vector<Tensor> weights;   // per hop [B, 1, 1, S] attention over sentences, when asked for
  };

  result forward(const Tensor& story, const Tensor& query, const Tensor& lengths, saved* s = nullptr,
                 bool need_weights = false) const;
  // Accumulates every gradient from dlogits [B, V].
  void backward(const saved& s, const Tensor& dlogits);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

}  // namespace attn::nn

// attn/nn/embedding.h — a lookup table: out[..., :] = weight[ids[...], :].
//
//   ids int64 or int32 [...]   weight [num, dim]   out [..., dim]
//
//   attn::nn::Embedding tok(vocab, 64, gen);          // N(0, 1) rows, as PyTorch
//   attn::Tensor h = tok.forward(ids);                // ids [B, N] -> [B, N, 64]
//   tok.backward(ids, dh);                            // dweight[ids[i]] += dh[i]
#pragma once

#include <cstdint>

#include "attn/nn/init.h"
#include "attn/nn/parameter.h"
#include "attn/tensor.h"

namespace attn::nn {

struct Embedding {
  Tensor weight, dweight;  // [num, dim]

  Embedding() = default;
  Embedding(std::int64_t num, std::int64_t dim, rng& gen, dtype t = dtype::f32);

  std::int64_t num_embeddings() const { return weight.size(0); }
  std::int64_t dim() const { return weight.size(1); }

  // ids: int64 or int32, any shape, every id in [0, num).
  Tensor forward(const Tensor& ids) const;
  // dy [..., dim] (the shape of forward's result): dweight[ids[i], :] += dy[i, :].
  void backward(const Tensor& ids, const Tensor& dy);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

}  // namespace attn::nn

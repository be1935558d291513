// tools/attn/bench_layer.h — `attn bench --layer mha`: attn::nn::MultiHeadAttention forward +
// backward (self-attention, biases, no mask) beside torch.nn.MultiheadAttention (bench/peers.py,
// peer torch_mha) in one run, alternating single calls, the medians reported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attn::cli::bench {

struct layer_args {
  std::int64_t B = 8, N = 512, H = 8, D = 64;  // embed_dim E = H·D
  std::vector<int> threads{2};
  int reps = 5, warmup = 1;
  bool torch = true;               // measure the torch peer
  std::string python, peer_script;  // as for `attn bench`
  std::string openblas_coretype = "auto";  // for the layer's Linear (apply_openblas_coretype)
};

// Prints the machine, then one row per thread count; returns the exit status.
int run_mha_layer(const layer_args& a);

}  // namespace attn::cli::bench

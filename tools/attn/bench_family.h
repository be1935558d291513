// tools/attn/bench_family.h — `attn bench --score S --distribution D` and `--grid family`: the
// attention family (include/attn/family.h) timed beside, in the same run and alternating single
// calls (the medians reported):
//   attn        attention_family on --family-path (automatic: the path attn picks)
//   attn_tiled  the float64 tiled path (only where attn's own path is not already tiled)
//   attn_core   attn::attention itself on the same q, k, v (dot and scaled_dot with softmax:
//               what the family's core route costs on top of the core op)
//   torch_eager the same formula in PyTorch eager (bench/peers.py: SDPA for dot/scaled_dot with
//               softmax, the entmax package for sparsemax/entmax15, additive in query chunks)
// With --ab VAR=A,B attn is timed twice, as attn[A] and attn[B], VAR set before each call, the two
// alternated (the order turned about every other round); a line gives the median B/A ratio.
// Pass "forward" times the forward; "backward" times forward + backward (attn_family then
// attention_family_backward; torch autograd into q, k, v and the parameters). Learned
// parameters are uniform in [-1, 1) (values do not change the work but for top-k's k).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn/tensor.h"

namespace attn::cli::bench {

struct family_bench_args {
  std::int64_t B = 1, Hq = 8, Hkv = 8, Nq = 2048, Nk = 2048, D = 64, Dv = 64;
  bool causal = false;
  dtype type = dtype::f32;
  bool grid = false;                       // --grid family: the pairs below at two shapes
  std::string score, distribution;         // one pair (empty: scaled_dot, softmax)
  std::string activation = "tanh", gaussian_form = "sigma", hardmax_gradient = "zero", family_path = "automatic";
  std::optional<double> scale, sigmoid_bias;
  // unset: box and triangle sqrt(2·D/3), gaussian 1 (family_bandwidth)
  std::optional<double> bandwidth;
  double temperature = 1.0;
  std::int64_t topk = 8, A = 64;           // topk's k; the additive score's hidden size
  bool multi_dim = false;                  // additive: w_v [Dv, A] (one distribution per value feature)
  std::vector<bool> passes{false};         // false: forward; true: forward + backward
  std::vector<int> threads{2};
  int reps = 3, warmup = 1;
  std::int64_t probe_mib = 0;              // --probe-mib: the DRAM read probe's buffer (0: not probed)
  bool torch = true, tiled = true, core = true;  // --peers torch,tiled,core
  std::string python, peer_script;
  std::string ab;  // --ab VAR=A,B: attn twice, the knob at A and at B (bench_ab.h)
};

// The pairs of --grid family: every score once (with softmax; gaussian, box and triangle with
// kernel) and every distribution once (with scaled_dot).
std::vector<std::pair<std::string, std::string>> family_grid_pairs();

// Prints the machine — its name and, per thread count, the FMA peaks of f32 and bf16 and the
// DRAM read probe — and one row per pair, pass, thread count and contender; returns the exit
// status.
int run_family_bench(const family_bench_args& a);

}  // namespace attn::cli::bench

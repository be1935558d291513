// tools/attn/bench_serving.h — `attn bench --varlen` and `attn bench --paged`: the serving ops
// (include/attn/serving.h) timed against the dense core op on the same work, in one run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.h"

namespace attn::cli::bench {

struct serving_args {
  std::int64_t batch = 16, hq = 8, hkv = 8, nq = 1, nk = 16384, d = 64;
  std::int64_t len_min = 64, len_max = 4096;  // --varlen: lengths uniform in [len_min, len_max]
  std::int64_t page_size = 0;                 // --paged
  bool causal = true;
  dtype type = dtype::f32;
  dtype kv_type = dtype::f32;                 // --paged: K/V of the caches (--kv-dtype; default the q dtype)
  std::vector<int> threads{0};
  int reps = 5, warmup = 1;
  bool fastest = false;  // --fastest: the fastest of the --reps calls, not their median
  bool backward = false;  // --paged with --pass backward|both: attention_paged_backward too
  std::int64_t probe_mib = 512;
  std::string ab;  // --ab VAR=A,B: every contender with the knob at A and at B, alternated (bench_ab.h)
};

// Varlen prefill of `batch` sequences (Nq = Nk = a random length, seed 1, bottom-right causal):
// attention_varlen, attn on the batch padded to the longest (nonpad_kv_seqlen), and one
// sequence of the mean length; prints median ms, GFLOP/s of the useful work, and the ratios.
int run_varlen(const serving_args& a);

// Decode (Nq = nq) of `batch` sequences of Nk keys with K/V of kv_type: dense attention (an
// int8 cache: attention_paged on one page per sequence), and attention_paged on shuffled
// pages of page_size, head-major and token-major; prints median ms, GB/s of K+V, tokens/s, the
// share of dense, and the DRAM read probe of the same run; int8 adds a bf16 dense cache. With
// backward (float caches): attention_backward on the dense cache against attention_paged_backward
// on both page layouts, each from its own forward's out and lse.
int run_paged(const serving_args& a);

}  // namespace attn::cli::bench

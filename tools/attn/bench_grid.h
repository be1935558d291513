// tools/attn/bench_grid.h — what `attn bench` times: one workload (shape, mask, dtype), a
// configuration (a workload, a pass, how attn is called), the standard grid of
// docs/PERFORMANCE.md, and the FLOP and byte counts the rates are computed from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.h"

namespace attn::cli::bench {

// The shape, mask and dtype of one benchmarked attention call; 4-D contiguous layouts:
// q [B, Hq, Nq, D], k [B, Hkv, Nk, D], v [B, Hkv, Nk, Dv], out [B, Hq, Nq, Dv]. Causal is
// top-left aligned (PyTorch is_causal). (Not src/core's `problem`, the validated call a backend
// sees: this one is only the benchmark's description of the inputs it builds.)
struct workload {
  std::int64_t B = 1, Hq = 1, Hkv = 1, Nq = 1, Nk = 1, D = 64, Dv = 64;
  bool causal = false;
  dtype type = dtype::f32;
};

// How attn's call is made for a configuration. plain: attention(q, k, v). The two KV-cache
// modes time one decode step that appends Nq new tokens to a cache of Nk - Nq, so that Nk keys
// are attended to: in_place through attention_with_kv_cache (the new rows are written into a
// preallocated cache, the cache is read where it is); onnx_past through attention with
// past_key/past_value (ONNX's past/present: the whole past is copied into a new present).
enum class kv_mode { plain, in_place, onnx_past };

struct config {
  std::string name;  // "prefill", "gqa-prefill", "decode", "custom", "kv-cache", "kv-cache-onnx"
  workload w;
  bool backward = false;
  kv_mode kv = kv_mode::plain;
};

// The standard grid: prefill B=1 (H, N, D) in {(16,512,64), (16,2048,64), (8,2048,128),
// (8,4096,128)} causal and not; GQA prefill Hq=32 Hkv=8 N=1024 D=128 causal and not; decode
// Nq=1 Hq=32 Hkv=8 D=128 Nk in {4096, 16384, 131072} (forward only: decode is inference).
std::vector<config> standard_grid(const std::vector<dtype>& dtypes, const std::vector<bool>& passes);

// Forward 2·B·Hq·Nq·Nk·(D + Dv), halved for causal; backward 2.5× that.
double flops(const config& c);
// Bytes of K and V (B·Hkv·Nk·(D + Dv) elements): what a decode step reads at least.
double kv_bytes(const workload& w);

std::string short_dtype(dtype t);                   // "f32", "bf16", "f16"
dtype parse_bench_dtype(const std::string& s);      // throws attn::error naming --dtype
std::string shape_label(const workload& w);         // "B1 Hq32/8 Nq1 Nk4096 D128"

// Uniform values in [-1, 1) from a fixed seed (the values do not matter for timing, but NaN-free
// and not all equal so that no shortcut is taken).
Tensor random_tensor(Shape shape, dtype t, std::uint64_t seed);

}  // namespace attn::cli::bench

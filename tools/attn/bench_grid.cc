// tools/attn/bench_grid.cc — the configurations `attn bench` times (bench_grid.h).
#include "bench_grid.h"

#include <fmt/format.h>

#include <array>

#include "attn/error.h"

namespace attn::cli::bench {

std::vector<config> standard_grid(const std::vector<dtype>& dtypes, const std::vector<bool>& passes) {
  struct shape {
    const char* name;
    std::int64_t hq, hkv, nq, nk, d;
    bool causal;
  };
  std::vector<shape> shapes;
  for (auto [h, n, d] : {std::array<std::int64_t, 3>{16, 512, 64}, {16, 2048, 64}, {8, 2048, 128}, {8, 4096, 128}})
    for (bool causal : {false, true}) shapes.push_back({"prefill", h, h, n, n, d, causal});
  for (bool causal : {false, true}) shapes.push_back({"gqa-prefill", 32, 8, 1024, 1024, 128, causal});
  for (std::int64_t nk : {4096, 16384, 131072}) shapes.push_back({"decode", 32, 8, 1, nk, 128, false});
  std::vector<config> out;
  for (bool bwd : passes)
    for (dtype t : dtypes)
      for (const shape& s : shapes) {
        if (bwd && s.nq == 1) continue;
        out.push_back({s.name, workload{1, s.hq, s.hkv, s.nq, s.nk, s.d, s.d, s.causal, t}, bwd});
      }
  return out;
}

double flops(const config& c) {
  const workload& w = c.w;
  double f = 2.0 * double(w.B * w.Hq) * double(w.Nq) * double(w.Nk) * double(w.D + w.Dv);
  if (w.causal) f /= 2;
  return c.backward ? 2.5 * f : f;
}

double kv_bytes(const workload& w) {
  return double(w.B * w.Hkv) * double(w.Nk) * double(w.D + w.Dv) * double(dtype_size(w.type));
}

std::string short_dtype(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
    default: return std::string(dtype_name(t));
  }
}

dtype parse_bench_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return dtype::f32;
  if (s == "bf16" || s == "bfloat16") return dtype::bf16;
  if (s == "f16" || s == "float16") return dtype::f16;
  throw error(fmt::format("attn bench: --dtype {} is not one of f32, bf16, f16", s));
}

std::string shape_label(const workload& w) {
  std::string s = fmt::format("B{} Hq{}", w.B, w.Hq);
  if (w.Hkv != w.Hq) s += fmt::format("/{}", w.Hkv);
  s += fmt::format(" Nq{} Nk{} D{}", w.Nq, w.Nk, w.D);
  if (w.Dv != w.D) s += fmt::format("/{}", w.Dv);
  if (w.causal) s += " causal";
  return s;
}

Tensor random_tensor(Shape shape, dtype t, std::uint64_t seed) {
  Tensor f = Tensor::empty(std::move(shape), dtype::f32);
  float* p = f.data_as<float>();
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < f.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = float(double(x >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
  return t == dtype::f32 ? f : f.to(t);
}

}  // namespace attn::cli::bench

// tools/attn/bench_layer.cc — `attn bench --layer mha` (see bench_layer.h).
// FLOPs counted: forward 4 projections 4·2·M·E² (M = B·N) plus attention 4·B·N²·E; backward
// twice the projections' and 2.5× the attention's (as `attn bench` counts attention).
#include "bench_layer.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include "attn/linear.h"
#include "attn/nn/nn.h"
#include "bench_blas.h"
#include "bench_grid.h"
#include "bench_peers.h"
#include "bench_probe.h"

namespace attn::cli::bench {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

Tensor uniform(const Shape& s, nn::rng& gen) {
  Tensor t = Tensor::empty(s, dtype::f32);
  nn::fill_uniform(t, -1.0, 1.0, gen);
  return t;
}

}  // namespace

int run_mha_layer(const layer_args& a) {
  const std::int64_t E = a.H * a.D, M = a.B * a.N;
  const double flops = 3.0 * (4 * 2.0 * double(M) * double(E) * double(E)) +
                       3.5 * (4.0 * double(a.B) * double(a.N) * double(a.N) * double(E));
  fmt::print("# attn bench --layer mha: MultiHeadAttention forward+backward, self-attention, biases, no mask\n");
  fmt::print("# B {} N {} E {} H {} (D {}) float32; {:.1f} GFLOP per call\n", a.B, a.N, E, a.H, a.D, flops / 1e9);
  // Before the layer's first Linear opens OpenBLAS: the core type the OpenBLAS baseline gets too.
  const std::string core = apply_openblas_coretype(a.openblas_coretype);
  fmt::print("# cpu: {}\n# linear: {}\n", cpu_model_name(), linear_backend_info());
  if (!core.empty()) fmt::print("# openblas core type{}\n", core);
  std::unique_ptr<python_peers> py;
  if (a.torch) {
    const std::string python = find_python(a.python), script = find_peer_script(a.peer_script);
    if (python.empty() || script.empty())
      fmt::print("# torch: not measured ({})\n", python.empty() ? "no benchmark venv: pass --python" : "bench/peers.py not found");
    else {
      py = std::make_unique<python_peers>(python, script, "torch_mha");
      if (!py->ok()) fmt::print("# torch: not measured: {}\n", py->why()), py.reset();
      else
        for (const auto& [impl, v] : py->versions()) fmt::print("# {}: {}\n", impl, v);
    }
  }
  nn::rng gen(1);
  nn::MultiHeadAttention mha({.embed_dim = E, .num_heads = a.H}, gen);
  const Tensor x = uniform({a.B, a.N, E}, gen), dy = uniform({a.B, a.N, E}, gen);
  auto call = [&] {
    nn::MultiHeadAttention::saved s;
    mha.forward(x, x, x, {}, &s);
    const nn::MultiHeadAttention::grads g = mha.backward(s, dy);
    nn::add_into(g.dquery, g.dkey), nn::add_into(g.dquery, g.dvalue);  // dx, as autograd sums it
  };
  fmt::print("{:>7} {:>12} {:>10} {:>12} {:>10} {:>8}  {}\n", "threads", "attn ms", "GFLOP/s", "torch ms", "GFLOP/s",
             "speedup", "f32 FMA peak");
  for (int t : a.threads) {
    omp_set_num_threads(t);
    const probe_result peak = probe_fma_peak(dtype::f32, t);
    bool torch_ready = false;
    if (py) {
      config c;
      c.name = "mha";
      c.w = {.B = a.B, .Hq = a.H, .Hkv = a.H, .Nq = a.N, .Nk = a.N, .D = a.D, .Dv = a.D};
      c.backward = true;
      for (const auto& st : py->prepare(c, t, a.warmup)) {
        torch_ready = torch_ready || st.ready;
        if (!st.ready) fmt::print("# {}: {}\n", st.impl, st.detail);
      }
    }
    for (int w = 0; w < a.warmup; ++w) call();
    std::vector<double> mine, theirs;
    for (int r = 0; r < a.reps; ++r) {  // alternate: a change of load falls on both
      const auto t0 = std::chrono::steady_clock::now();
      call();
      mine.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (torch_ready)
        for (const auto& [impl, ms] : py->rep()) theirs.push_back(ms);
    }
    if (py) py->release();
    const double am = median(mine), tm = median(theirs);
    fmt::print("{:>7} {:>12.1f} {:>10.1f} {:>12} {:>10} {:>8}  {:.0f} GFLOP/s ({})\n", t, am, flops / am / 1e6,
               theirs.empty() ? "-" : fmt::format("{:.1f}", tm), theirs.empty() ? "-" : fmt::format("{:.1f}", flops / tm / 1e6),
               theirs.empty() ? "-" : fmt::format("{:.2f}x", tm / am), peak.value, peak.isa);
  }
  return 0;
}

}  // namespace attn::cli::bench

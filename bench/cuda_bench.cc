// bench/cuda_bench.cc — the cuda backend's kernels timed on device tensors (attn/cuda.h), written
// into tensors allocated once (attention_into, attention_backward_into): forward and backward at
// the shapes of issue 16, each the median of --reps calls (a call, then a wait for the device)
// after --warmup, TFLOP/s counted as FlashAttention counts them (forward 4·B·H·Nq·Nk·D, halved
// when causal; backward 2.5× that), the forward's K/V read rate (decode shapes: --nq 1), and
// fwd_loop_ms: calls back to back with one wait at the end (what a decode loop sees).
// Peers on the same GPU: bench/cuda_peers.py (torch SDPA's flash, cuDNN and efficient backends).
//
//   attn_cuda_bench [--batch 4] [--heads 16] [--kv-heads 16] [--n 4096 | --nq N --nk N] [--d 128]
//                   [--dtype bf16|f16] [--causal] [--forward-only] [--reps 20] [--warmup 3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "attn/cuda.h"

namespace {

struct args {
  std::int64_t batch = 4, heads = 16, kv_heads = 16, nq = 4096, nk = 4096, d = 128;
  attn::dtype type = attn::dtype::bf16;
  bool causal = false, forward_only = false;
  int reps = 20, warmup = 3;
};

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw attn::error("attn_cuda_bench: " + k + " needs a value");
      return argv[++i];
    };
    if (k == "--batch") a.batch = std::stoll(next());
    else if (k == "--heads") a.heads = std::stoll(next());
    else if (k == "--kv-heads") a.kv_heads = std::stoll(next());
    else if (k == "--n") a.nq = a.nk = std::stoll(next());
    else if (k == "--nq") a.nq = std::stoll(next());
    else if (k == "--nk") a.nk = std::stoll(next());
    else if (k == "--forward-only") a.forward_only = true;
    else if (k == "--d") a.d = std::stoll(next());
    else if (k == "--dtype") a.type = next() == "f16" ? attn::dtype::f16 : attn::dtype::bf16;
    else if (k == "--causal") a.causal = true;
    else if (k == "--reps") a.reps = std::max(1, std::stoi(next()));
    else if (k == "--warmup") a.warmup = std::max(0, std::stoi(next()));
    else throw attn::error("attn_cuda_bench: unknown argument " + k);
  }
  return a;
}

attn::Tensor random_host(const attn::Shape& s, attn::dtype t, std::mt19937& rng) {
  std::int64_t n = 1;
  for (auto x : s) n *= x;
  std::vector<double> v(static_cast<std::size_t>(n));
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  for (double& x : v) x = u(rng);
  return attn::Tensor::from_values(s, t, v);
}

template <class F>
double median_ms(F&& f, int reps, int warmup) {
  for (int i = 0; i < warmup; ++i) f();
  attn::cuda::synchronize();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    attn::cuda::synchronize();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const args a = parse(argc, argv);
    if (!attn::cuda::available()) {
      std::printf("attn_cuda_bench: %s\n", attn::cuda::unavailable_reason().c_str());
      return 2;
    }
    std::mt19937 rng(1);
    using attn::cuda::DeviceTensor;
    const DeviceTensor q = DeviceTensor::from_host(random_host({a.batch, a.heads, a.nq, a.d}, a.type, rng));
    const DeviceTensor k = DeviceTensor::from_host(random_host({a.batch, a.kv_heads, a.nk, a.d}, a.type, rng));
    const DeviceTensor v = DeviceTensor::from_host(random_host({a.batch, a.kv_heads, a.nk, a.d}, a.type, rng));
    const DeviceTensor dout = DeviceTensor::from_host(random_host({a.batch, a.heads, a.nq, a.d}, a.type, rng));
    attn::attention_options o;
    o.is_causal = a.causal;
    const DeviceTensor out(a.type, {a.batch, a.heads, a.nq, a.d}), lse(attn::dtype::f32, {a.batch, a.heads, a.nq});
    const DeviceTensor dq(a.type, q.shape()), dk(a.type, k.shape()), dv(a.type, v.shape());
    const double fwd_ms = median_ms([&] { attn::cuda::attention_into(q, k, v, out, lse, o); }, a.reps, a.warmup);
    // Back to back, one wait at the end: the rate of a loop that never waits (a decode loop),
    // bounded by the host side of a call when that is longer than its kernels.
    double loop_ms = 0.0;
    {
      const int n = std::max(a.reps, 50);
      attn::cuda::synchronize();
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) attn::cuda::attention_into(q, k, v, out, lse, o);
      attn::cuda::synchronize();
      loop_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
    }
    const double bwd_ms =
        a.forward_only ? 0.0
                       : median_ms([&] { attn::cuda::attention_backward_into(q, k, v, out, lse, dout, dq, dk, dv, o); },
                                   a.reps, a.warmup);
    const double flops =
        4.0 * double(a.batch * a.heads) * double(a.nq) * double(a.nk) * double(a.d) * (a.causal ? 0.5 : 1.0);
    const double kv_bytes = 2.0 * double(a.batch * a.kv_heads) * double(a.nk) * double(a.d) * 2.0;
    const char* splits = std::getenv("ATTN_CUDA_SPLITS");
    std::printf("{\"impl\": \"attn_cuda\", \"device\": \"%s\", \"B\": %lld, \"H\": %lld, \"Hkv\": %lld, \"Nq\": %lld, "
                "\"Nk\": %lld, \"D\": %lld, \"dtype\": \"%s\", \"causal\": %s, \"ATTN_CUDA_SPLITS\": \"%s\", "
                "\"fwd_ms\": %.4f, \"fwd_loop_ms\": %.4f, \"fwd_tflops\": %.1f, \"fwd_kv_gbps\": %.0f, \"bwd_ms\": %.4f, "
                "\"bwd_tflops\": %.1f}\n",
                attn::cuda::device_name().c_str(), (long long)a.batch, (long long)a.heads, (long long)a.kv_heads,
                (long long)a.nq, (long long)a.nk, (long long)a.d, std::string(attn::dtype_name(a.type)).c_str(),
                a.causal ? "true" : "false", splits ? splits : "", fwd_ms, loop_ms, flops / fwd_ms * 1e-9, kv_bytes / fwd_ms * 1e-6,
                bwd_ms, a.forward_only ? 0.0 : 2.5 * flops / bwd_ms * 1e-9);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}

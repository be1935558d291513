// bench/family_fused_bench.cc — the fused family path against the core softmax kernel and the
// float64 tiled path, in one process with the calls alternating (so a loaded machine slows
// them alike). Prints one line per implementation: median ms, GFLOP/s and the ratio to the
// core softmax kernel at the same shape. No assertion on time.
//
//   attn_family_fused_bench [B H N D threads reps tiled(0|1)]     (default 1 8 2048 64 2 5 1)
//
// Work counted: forward 4·B·H·N²·D (q·k and α·v); forward+backward 2.5× more (dq, dk, dv and
// the recomputed scores), FlashAttention's convention.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.h"

using namespace attn;

namespace {

Tensor random(const Shape& s, std::mt19937& rng) {
  std::normal_distribution<double> n(0.0, 1.0);
  std::int64_t count = 1;
  for (auto x : s) count *= x;
  std::vector<double> v(static_cast<std::size_t>(count));
  for (auto& x : v) x = n(rng);
  return Tensor::from_values(s, dtype::f32, v);
}

double ms_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

struct impl {
  std::string name;
  double flops;
  std::function<void()> run;
  std::vector<double> ms;
};

}  // namespace

int main(int argc, char** argv) {
  const std::int64_t B = argc > 1 ? std::atoll(argv[1]) : 1, H = argc > 2 ? std::atoll(argv[2]) : 8,
                     N = argc > 3 ? std::atoll(argv[3]) : 2048, D = argc > 4 ? std::atoll(argv[4]) : 64;
  const int threads = argc > 5 ? std::atoi(argv[5]) : 2, reps = argc > 6 ? std::atoi(argv[6]) : 5;
  const bool tiled = argc > 7 ? std::atoi(argv[7]) != 0 : true;
  std::mt19937 rng(1);
  const Tensor q = random({B, H, N, D}, rng), k = random({B, H, N, D}, rng), v = random({B, H, N, D}, rng);
  const Tensor dout = random({B, H, N, D}, rng);
  const double fwd = 4.0 * double(B * H) * double(N) * double(N) * double(D), both = 3.5 * fwd;
  const execution fused{.path = family_path::fused, .num_threads = threads};
  const execution tile{.path = family_path::tiled, .num_threads = threads};

  std::vector<impl> impls;
  attention_options ao;
  ao.scale = 1.0 / std::sqrt(double(D));
  impls.push_back({"core softmax (attn::attention) fwd", fwd, [&] { (void)attention(q, k, v, ao, {.num_threads = threads}); }, {}});
  impls.push_back({"core softmax (attn::attention) fwd+bwd", both, [&] {
                     const attention_result r = attention(q, k, v, ao, {.num_threads = threads});
                     (void)attention_backward(q, k, v, r.out, dout, r.lse, ao, {.num_threads = threads});
                   }, {}});
  struct pair {
    const char* name;
    distribution_kind d;
  };
  for (pair p : {pair{"sigmoid", distribution_kind::sigmoid}, {"sparsemax", distribution_kind::sparsemax},
                 {"entmax15", distribution_kind::entmax15}, {"hardmax", distribution_kind::hardmax},
                 {"topk8", distribution_kind::topk}, {"softmax", distribution_kind::softmax}}) {
    family_options o;
    o.score.kind = score_kind::scaled_dot;
    o.distribution.kind = p.d;
    o.distribution.k = 8;
    const std::string n = std::string("scaled_dot x ") + p.name;
    impls.push_back({n + " fused fwd", fwd, [=, &q, &k, &v] { (void)attention_family(q, k, v, o, fused); }, {}});
    impls.push_back({n + " fused fwd+bwd", both, [=, &q, &k, &v, &dout] {
                       (void)attention_family(q, k, v, o, fused);
                       (void)attention_family_backward(q, k, v, dout, o, fused);
                     }, {}});
    if (tiled && p.d != distribution_kind::softmax)
      impls.push_back({n + " tiled f64 fwd", fwd, [=, &q, &k, &v] { (void)attention_family(q, k, v, o, tile); }, {}});
  }
  {
    // What the family costs around the kernels at this shape (checks, the float64 preparation,
    // conversions, the output): the fused sigmoid with one key per row.
    family_options o;
    o.score.kind = score_kind::scaled_dot;
    o.distribution.kind = distribution_kind::sigmoid;
    o.is_causal = true, o.window_left = 0;
    impls.push_back({"overhead: fused fwd, 1 key per row", fwd, [=, &q, &k, &v] { (void)attention_family(q, k, v, o, fused); }, {}});
  }
  for (auto& i : impls)  // warm-up (the float64 tiled path takes seconds: measured once, cold)
    if (i.name.find("tiled") == std::string::npos) i.run();
  for (int r = 0; r < reps; ++r)
    for (auto& i : impls)
      if (r == 0 || i.name.find("tiled") == std::string::npos) i.ms.push_back(ms_of(i.run));
  std::printf("B%lld H%lld N%lld D%lld f32, %d threads, %d reps alternating (tiled: 1)\n", (long long)B, (long long)H,
              (long long)N, (long long)D, threads, reps);
  double core_fwd = 0, core_both = 0;
  for (auto& i : impls) {
    std::sort(i.ms.begin(), i.ms.end());
    const double med = i.ms[i.ms.size() / 2], gf = i.flops / med / 1e6;
    const bool is_both = i.name.find("fwd+bwd") != std::string::npos;
    if (i.name.rfind("core", 0) == 0) (is_both ? core_both : core_fwd) = gf;
    const double base = is_both ? core_both : core_fwd;
    std::printf("%-44s %10.2f ms %8.2f GFLOP/s %6.2fx core\n", i.name.c_str(), med, gf, gf / base);
  }
  return 0;
}

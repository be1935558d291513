// fuzz/tsan_concurrency.cc — every public op of the core (attention, attention_backward,
// attention_with_kv_cache on its own cache, kv_cache, explain_backend, Tensor, .npy) called
// concurrently from many threads on shared read-only inputs, under ThreadSanitizer; each
// result must equal the one computed first on one thread, bit for bit. Built by scripts/fuzz.sh
// with -fsanitize=thread and OpenMP pragmas off (fuzz/CMakeLists.txt says why). Exit 0: clean.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "attn/attention.h"
#include "attn/error.h"
#include "attn/npy.h"
#include "attn/tensor.h"

namespace {

using namespace attn;

Tensor ramp(const Shape& s, dtype t, double step) {
  Tensor r = Tensor::empty(s, t);
  for (std::int64_t i = 0; i < r.numel(); ++i) store_from_double(r.data(), t, i, std::sin(double(i) * step));
  return r;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.type() == b.type() &&
         std::memcmp(a.data(), b.data(), std::size_t(a.numel()) * dtype_size(a.type())) == 0;
}

struct outputs {
  Tensor out, lse, dq, dk, dv, cache_out;
  std::string explain;
};

// One round of every op; `tag` keeps the threads' files apart.
outputs round(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, backend be, int tag) {
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  o.attn_mask = ramp({9, 13}, dtype::f32, 0.3);
  const execution ex{.use_backend = be};
  outputs r;
  const attention_result f = attention(q, k, v, o, ex);
  r.out = f.out, r.lse = f.lse;
  attention_options ob;
  ob.is_causal = true;
  const attention_result fb = attention(q, k, v, ob, ex);
  const attention_grads g = attention_backward(q, k, v, fb.out, dout, fb.lse, ob, ex);
  r.dq = g.dq, r.dk = g.dk, r.dv = g.dv;
  kv_cache cache(1, 2, 32, 8, 8, dtype::f32);
  for (int step = 0; step < 3; ++step)
    r.cache_out = attention_with_kv_cache(q.view().slice(2, step, step + 1), k.view().slice(2, step, step + 1),
                                          v.view().slice(2, step, step + 1), cache, ob, ex).out;
  r.explain = explain_backend(q, k, v, o, true, ex);
  const std::string path = "/tmp/attn_tsan_" + std::to_string(getpid()) + "_" + std::to_string(tag) + ".npy";
  write_npy(path, f.out);
  if (!same(read_npy(path), f.out)) r.explain += " (npy round trip differs)";
  std::remove(path.c_str());
  try {
    attention(q, k, Tensor::zeros({1, 3, 13, 8}, dtype::f32), o, ex);
  } catch (const error&) {  // expected: a bad shape is an error on every thread
  }
  return r;
}

}  // namespace

int main() {
  const Tensor q = ramp({1, 4, 9, 8}, dtype::f32, 0.1), k = ramp({1, 2, 13, 8}, dtype::f32, 0.2),
               v = ramp({1, 2, 13, 8}, dtype::f32, 0.05), dout = ramp({1, 4, 9, 8}, dtype::f32, 0.07);
  int bad = 0;
  for (backend be : {backend::cpu, backend::reference}) {
    const outputs want = round(q, k, v, dout, be, 0);
    constexpr int kThreads = 8, kRounds = 4;
    std::atomic<int> mismatches{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; i < kRounds; ++i) {
          const outputs got = round(q, k, v, dout, be, 1 + t * kRounds + i);
          const bool ok = same(got.out, want.out) && same(got.lse, want.lse) && same(got.dq, want.dq) &&
                          same(got.dk, want.dk) && same(got.dv, want.dv) && same(got.cache_out, want.cache_out) &&
                          got.explain == want.explain;
          if (!ok) ++mismatches;
        }
      });
    for (auto& t : ts) t.join();
    std::printf("tsan_concurrency: %s: %d threads x %d rounds, %d results differ from the sequential ones\n",
                std::string(to_string(be)).c_str(), kThreads, kRounds, mismatches.load());
    bad += mismatches.load();
  }
  return bad ? 1 : 0;
}

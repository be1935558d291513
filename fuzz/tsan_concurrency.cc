// fuzz/tsan_concurrency.cc — every public op family called concurrently from many threads on
// shared read-only inputs, under ThreadSanitizer; each result must equal the one computed first
// on one thread, bit for bit:
//   core        attention, attention_backward, attention_with_kv_cache on its own cache,
//               kv_cache, explain_backend, Tensor, .npy, a refused call
//   family      attention_family forward and backward on the core, tiled and fused paths
//   positional  rotary and rotary_backward, the T5 bias and its backward, sinusoidal and learned
//               encodings (ALiBi runs through the core op above)
//   serving     attention_varlen forward and backward, attention_paged (decode and a prefill
//               chunk, which gathers the pages), paged_kv_append on each thread's own pages;
//               a bf16 call whose working memory comes from the shared buffer cache
//   linear      linear and linear_backward (the reference path: OpenBLAS is not built for TSan)
//   attn::nn    MultiHeadAttention forward and backward, each thread its own layer made from
//               the same seed (so the same weights and the same parameter gradients)
// Built by scripts/fuzz.sh with -fsanitize=thread and OpenMP pragmas off (fuzz/CMakeLists.txt
// says why). Exit 0: clean.
#include <stdlib.h>
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
#include "attn/family.h"
#include "attn/linear.h"
#include "attn/nn/multihead.h"
#include "attn/npy.h"
#include "attn/positional.h"
#include "attn/serving.h"
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

// One round of the ops beyond the core, in a fixed order: their results, flattened.
std::vector<Tensor> round_ops(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, backend be) {
  std::vector<Tensor> r;
  const execution ex{.use_backend = be};
  // family: cosine × softmax on the core path, additive × sparsemax on the tiled and fused paths
  family_options fo;
  fo.is_causal = true;
  fo.score.kind = score_kind::cosine;
  fo.score.temperature = 0.5;
  r.push_back(attention_family(q, k, v, fo, {.use_backend = be, .path = family_path::core}).out);
  r.push_back(attention_family_backward(q, k, v, dout, fo, {.use_backend = be, .path = family_path::core}).dq);
  fo.score = {};
  fo.score.kind = score_kind::additive;
  fo.score.W_q = ramp({3, 8}, dtype::f32, 0.4), fo.score.W_k = ramp({3, 8}, dtype::f32, 0.6);
  fo.score.b = ramp({3}, dtype::f32, 0.9), fo.score.w_v = ramp({3}, dtype::f32, 1.1);
  fo.distribution.kind = distribution_kind::sparsemax;
  r.push_back(attention_family(q, k, v, fo, {.path = family_path::tiled}).out);
  const family_grads fg = attention_family_backward(q, k, v, dout, fo, {.path = family_path::tiled});
  for (const Tensor* g : {&fg.dq, &fg.dk, &fg.dv, &fg.dW_q, &fg.dW_k, &fg.db, &fg.dw_v}) r.push_back(*g);
  // the same on the fused kernels (additive's exp form), and top-k's sparse backward there
  r.push_back(attention_family(q, k, v, fo, {.path = family_path::fused}).out);
  const family_grads ff = attention_family_backward(q, k, v, dout, fo, {.path = family_path::fused});
  for (const Tensor* g : {&ff.dq, &ff.dk, &ff.dv, &ff.dW_q, &ff.dW_k, &ff.db, &ff.dw_v}) r.push_back(*g);
  fo.distribution.kind = distribution_kind::topk;
  fo.distribution.k = 2;
  r.push_back(attention_family_backward(q, k, v, dout, fo, {.path = family_path::fused}).dq);
  // positional
  rotary_options ro;
  ro.rotary_dim = 6;
  r.push_back(rotary(q, 5, ro));
  r.push_back(rotary_backward(q, 5, ro));
  relative_position_options rp;
  rp.num_buckets = 8, rp.max_distance = 16;
  const Tensor bias = relative_position_bias(ramp({8, 4}, dtype::f32, 0.3), 9, 13, rp);
  r.push_back(bias);
  r.push_back(relative_position_bias_backward(bias, rp));
  r.push_back(add_sinusoidal_encoding(q.view().reshape({4, 9, 8}), 3));
  r.push_back(learned_position_encoding(ramp({20, 8}, dtype::f32, 0.2), 9, 4));
  r.push_back(learned_position_encoding_backward(ramp({9, 8}, dtype::f32, 0.2), 20, 4));
  // serving: the 13 keys as two packed sequences (5 and 8 keys; 4 and 5 queries)
  const auto packed = [](const Tensor& t) {  // [1, H, N, X] -> token-major [N, H, X]
    const int order[] = {0, 2, 1, 3};
    const Tensor c = Tensor::copy_of(t.view().permute(order));
    return Tensor::copy_of(c.view().reshape({c.size(1), c.size(2), c.size(3)}));
  };
  const Tensor qp = packed(q), kp = packed(k), vp = packed(v), dp = packed(dout);
  const Tensor cq = Tensor::from_values({3}, dtype::i64, {0, 4, 9}), ck = Tensor::from_values({3}, dtype::i64, {0, 5, 13});
  attention_options so;
  so.is_causal = true, so.alignment = causal_alignment::bottom_right;
  const varlen_result vr = attention_varlen(qp, kp, vp, cq, ck, 5, 8, so, ex);
  const varlen_grads vg = attention_varlen_backward(qp, kp, vp, vr.out, dp, vr.lse, cq, ck, 5, 8, so, ex);
  for (const Tensor* t : {&vr.out, &vr.lse, &vg.dq, &vg.dk, &vg.dv}) r.push_back(*t);
  // paged: this thread's own pages of 4 tokens, filled by paged_kv_append, read in reverse order
  Tensor kpg = Tensor::zeros({4, 4, 2, 8}, dtype::f32), vpg = Tensor::zeros({4, 4, 2, 8}, dtype::f32);
  const Tensor table = Tensor::from_values({1, 4}, dtype::i64, {3, 2, 1, 0});
  Tensor lens = Tensor::from_values({1}, dtype::i64, {0});
  const paged_kv_view cache{kpg, vpg, table, lens};
  paged_kv_append(cache, k, v);
  lens.data_as<std::int64_t>()[0] = 13;
  const attention_result pr = attention_paged(q, cache, so, ex);
  r.push_back(pr.out), r.push_back(pr.lse);
  // a prefill chunk of 20 queries (40 rows a kv head): the cpu backend gathers the pages into
  // rows (cpu_backend.cc, paged_gather) and runs them as dense prefill
  const attention_result pc = attention_paged(ramp({1, 4, 20, 8}, dtype::f32, 0.21), cache, so, ex);
  r.push_back(pc.out), r.push_back(pc.lse);
  // working memory of 1 MiB or more (the bf16 K/V packed or widened) from the buffer cache that
  // every thread takes blocks from and gives them back to
  const Tensor kb = ramp({1, 1, 4096, 128}, dtype::bf16, 0.013), vb = ramp({1, 1, 4096, 128}, dtype::bf16, 0.017);
  r.push_back(attention(ramp({1, 1, 40, 128}, dtype::bf16, 0.11), kb, vb, {}, ex).out);
  // linear
  const TensorView x = q.view().reshape({36, 8});
  const Tensor W = ramp({5, 8}, dtype::f32, 0.8), b = ramp({5}, dtype::f32, 0.5);
  const Tensor y = linear(x, W, b.view(), {.use_backend = backend::reference});
  const linear_grads lg = linear_backward(x, W, ramp({36, 5}, dtype::f32, 0.15), {.dx = true, .dW = true, .db = true},
                                          {.use_backend = backend::reference});
  r.push_back(y), r.push_back(lg.dx), r.push_back(lg.dW), r.push_back(lg.db);
  // attn::nn: a layer of this thread's own, the same weights on every thread (one seed)
  nn::rng gen(42);
  nn::MultiHeadAttention mha({.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2}, gen);
  const Tensor xs = ramp({2, 7, 8}, dtype::f32, 0.33);
  masking_options m;
  m.is_causal = true;
  nn::MultiHeadAttention::saved sv;
  r.push_back(mha.forward(xs, xs, xs, m, &sv).out);
  const nn::MultiHeadAttention::grads mg = mha.backward(sv, ramp({2, 7, 8}, dtype::f32, 0.21));
  r.push_back(mg.dquery), r.push_back(mg.dkey), r.push_back(mg.dvalue);
  nn::parameter_list ps;
  mha.parameters(ps);
  for (const auto& p : ps) r.push_back(*p.grad);
  return r;
}

bool same_all(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!same(a[i], b[i])) return false;
  return true;
}

}  // namespace

int main() {
  // OpenBLAS is not built for TSan (its threads' accesses would be invisible): nn's layers take
  // linear's float64 reference path, as they do wherever OpenBLAS cannot be opened.
  setenv("ATTN_OPENBLAS", "/nonexistent/libopenblas.so.0", 1);
  const Tensor q = ramp({1, 4, 9, 8}, dtype::f32, 0.1), k = ramp({1, 2, 13, 8}, dtype::f32, 0.2),
               v = ramp({1, 2, 13, 8}, dtype::f32, 0.05), dout = ramp({1, 4, 9, 8}, dtype::f32, 0.07);
  int bad = 0;
  for (backend be : {backend::cpu, backend::reference}) {
    const outputs want = round(q, k, v, dout, be, 0);
    const std::vector<Tensor> want_ops = round_ops(q, k, v, dout, be);
    constexpr int kThreads = 8, kRounds = 4;
    std::atomic<int> mismatches{0};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
      ts.emplace_back([&, t] {
        for (int i = 0; i < kRounds; ++i) {
          const outputs got = round(q, k, v, dout, be, 1 + t * kRounds + i);
          const bool ok = same(got.out, want.out) && same(got.lse, want.lse) && same(got.dq, want.dq) &&
                          same(got.dk, want.dk) && same(got.dv, want.dv) && same(got.cache_out, want.cache_out) &&
                          got.explain == want.explain && same_all(round_ops(q, k, v, dout, be), want_ops);
          if (!ok) ++mismatches;
        }
      });
    for (auto& t : ts) t.join();
    std::printf("tsan_concurrency: %s: %d threads x %d rounds of the core ops and %zu results of the others, %d rounds "
                "differ from the sequential one\n",
                std::string(to_string(be)).c_str(), kThreads, kRounds, want_ops.size(), mismatches.load());
    bad += mismatches.load();
  }
  return bad ? 1 : 0;
}

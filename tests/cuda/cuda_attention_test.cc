// tests/cuda/cuda_attention_test.cc — the cuda backend against the float64 reference.
//
// Two ctest entries run this binary (tests/CMakeLists.txt):
//   cuda.contract       (no arguments): on any machine — what a build or machine without a usable
//                       device says (every call refused, naming why), the names of the backend;
//   cuda.device         (--device): the kernels on the GPU — forward and backward over sweeps of
//                       shapes, dtypes, GQA ratios and every mask kind against the reference, the
//                       device-tensor API, determinism, bad input. Without a device it prints why
//                       and exits 77, which ctest reports as skipped (never as passed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "attn/cuda.h"
#include "test_util.h"

#include <fmt/format.h>

namespace attn {
namespace {

using namespace attn::testing;

const execution kCuda{.use_backend = backend::cuda};
const execution kRef{.use_backend = backend::reference};

// ---- on every machine ----

TEST(CudaContract, RefusesWithAReasonWhenUnavailable) {
  EXPECT_EQ(to_string(backend::cuda), "cuda");
  EXPECT_EQ(parse_backend("cuda"), backend::cuda);
  std::mt19937 rng(1);
  const Tensor q = random_tensor({1, 2, 3, 64}, dtype::bf16, rng);
  // `automatic` never takes cuda for host tensors.
  EXPECT_NE(attention(q, q, q).backend, "cuda");
  if (cuda::available()) {
    EXPECT_TRUE(cuda::unavailable_reason().empty());
    EXPECT_FALSE(cuda::device_name().empty());
    return;
  }
  const std::string why = cuda::unavailable_reason();
  EXPECT_FALSE(why.empty());
  EXPECT_THROW_MSG(attention(q, q, q, {}, kCuda), "no backend can run this call: cuda: " + why);
  EXPECT_THROW_MSG(cuda::DeviceTensor::from_host(q), why);
  EXPECT_THROW_MSG(cuda::device_name(), why);
  EXPECT_NE(explain_backend(q, q, q, {}, false, kCuda).find(why), std::string::npos);
  // Every entry of attn/cuda.h refuses by its own name, before it looks at its (here empty) tensors.
  const cuda::DeviceTensor none;
  EXPECT_THROW_MSG(cuda::attention(none, none, none), "attn::cuda::attention: " + why);
  EXPECT_THROW_MSG(cuda::attention_into(none, none, none, none, none), "attn::cuda::attention_into: " + why);
  EXPECT_THROW_MSG(cuda::attention_backward(none, none, none, none, none, none),
                   "attn::cuda::attention_backward: " + why);
  EXPECT_THROW_MSG(cuda::attention_backward_into(none, none, none, none, none, none, none, none, none),
                   "attn::cuda::attention_backward_into: " + why);
  EXPECT_THROW_MSG(cuda::synchronize(), why);
  EXPECT_THROW_MSG(cuda::DeviceTensor(dtype::bf16, {1, 2}), why);
}

// ---- on a GPU ----

struct shape_case {
  std::int64_t B, Hq, Hkv, Nq, Nk, D, Dv;
};

// out/lse of the cuda backend against the reference on the same (16-bit) inputs; then the
// gradients of both from the reference's out and lse.
void check_case(const shape_case& s, dtype t, const attention_options& o, std::mt19937& rng, const std::string& what,
                bool backward = true) {
  SCOPED_TRACE(what);
  const Tensor q = random_tensor({s.B, s.Hq, s.Nq, s.D}, t, rng);
  const Tensor k = random_tensor({s.B, s.Hkv, s.Nk, s.D}, t, rng);
  const Tensor v = random_tensor({s.B, s.Hkv, s.Nk, s.Dv}, t, rng);
  const attention_result want = attention(q, k, v, o, kRef);
  const attention_result got = attention(q, k, v, o, kCuda);
  ASSERT_EQ(got.backend, "cuda");
  const double tol = t == dtype::bf16 ? 1.6e-2 : 3e-3;
  EXPECT_TRUE(all_close(got.out, want.out, tol, tol)) << "out";
  EXPECT_TRUE(all_close(got.lse, want.lse, 2e-3, 2e-4)) << "lse";
  if (!backward) return;

  const Tensor dout = random_tensor(want.out.shape(), t, rng);
  const attention_grads gw = attention_backward(q, k, v, want.out, dout, want.lse, o, kRef);
  const attention_grads gg = attention_backward(q, k, v, want.out, dout, want.lse, o, kCuda);
  ASSERT_EQ(gg.backend, "cuda");
  // 16-bit P and dS enter the products: errors scale with the largest gradient.
  auto check_grad = [&](const Tensor& g, const Tensor& w, const char* name) {
    double scale = 1.0;
    for (double x : w.to_vector()) scale = std::max(scale, std::abs(x));
    const double gt = (t == dtype::bf16 ? 3e-2 : 6e-3) * scale;
    EXPECT_TRUE(all_close(g, w, gt, 0.0)) << name << " (largest |grad| " << scale << ")";
  };
  check_grad(gg.dq, gw.dq, "dq");
  check_grad(gg.dk, gw.dk, "dk");
  check_grad(gg.dv, gw.dv, "dv");
  if (gw.dalibi_slopes.defined()) check_grad(gg.dalibi_slopes, gw.dalibi_slopes, "dalibi");
  if (gw.dsinks.defined()) check_grad(gg.dsinks, gw.dsinks, "dsinks");
}

const std::vector<shape_case> kShapes = {
    {1, 1, 1, 1, 1, 64, 64},     {2, 4, 2, 37, 53, 64, 64},    {1, 2, 1, 130, 200, 128, 128},
    {1, 1, 1, 65, 70, 96, 96},   {1, 2, 2, 17, 300, 256, 256}, {1, 8, 1, 5, 129, 32, 32},
    {2, 2, 2, 64, 64, 80, 48},   {1, 3, 3, 200, 77, 128, 64},  {1, 4, 4, 128, 128, 64, 64},
};

TEST(CudaDevice, ShapesAndDtypesMatchTheReference) {
  std::mt19937 rng(11);
  for (dtype t : {dtype::bf16, dtype::f16})
    for (const shape_case& s : kShapes)
      check_case(s, t, {}, rng,
                 fmt::format("{} B{} Hq{} Hkv{} Nq{} Nk{} D{} Dv{}", dtype_name(t), s.B, s.Hq, s.Hkv, s.Nq, s.Nk, s.D, s.Dv));
}

TEST(CudaDevice, EveryMaskKindAndOption) {
  std::mt19937 rng(12);
  const shape_case s{2, 4, 2, 70, 90, 64, 64};
  std::vector<std::pair<std::string, attention_options>> cases, plain;
  auto add_to = [](auto& list, std::string name, auto set) {
    attention_options o;
    set(o);
    list.emplace_back(std::move(name), std::move(o));
  };
  auto add = [&](std::string name, auto set) { add_to(cases, std::move(name), set); };
  auto add_plain = [&](std::string name, auto set) { add_to(plain, std::move(name), set); };
  add("causal top_left", [](attention_options& o) { o.is_causal = true; });
  add("causal bottom_right", [](attention_options& o) { o.is_causal = true, o.alignment = causal_alignment::bottom_right; });
  add("window (5, 3)", [](attention_options& o) { o.window_left = 5, o.window_right = 3; });
  add("causal + window 8 bottom_right", [](attention_options& o) {
    o.is_causal = true, o.window_left = 8, o.alignment = causal_alignment::bottom_right;
  });
  add("bool mask [Nq, Nk]", [&](attention_options& o) { o.attn_mask = random_bool({s.Nq, s.Nk}, rng); });
  add("bool mask [B, Hq, Nq, Nk]", [&](attention_options& o) { o.attn_mask = random_bool({s.B, s.Hq, s.Nq, s.Nk}, rng); });
  add("float mask [B, 1, Nq, Nk]", [&](attention_options& o) {
    o.attn_mask = random_tensor({s.B, 1, s.Nq, s.Nk}, dtype::f32, rng, -3, 3);
  });
  add("short bool mask [Nq, 60]", [&](attention_options& o) { o.attn_mask = random_bool({s.Nq, 60}, rng); });
  add("nonpad_kv_seqlen", [](attention_options& o) { o.nonpad_kv_seqlen = index_tensor({90, 33}); });
  add("nonpad + causal bottom_right", [](attention_options& o) {
    o.nonpad_kv_seqlen = index_tensor({71, 80}), o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  });
  add("softcap 2 + scale 0.3", [](attention_options& o) { o.softcap = 2.0, o.scale = 0.3; });
  add("alibi [Hq]", [](attention_options& o) { o.alibi_slopes = Tensor::from_values({4}, dtype::f32, {0.5, 0.25, 0.125, 0.0625}); });
  add("alibi [B, Hq] + causal", [&](attention_options& o) {
    o.alibi_slopes = random_tensor({s.B, s.Hq}, dtype::f32, rng, 0, 0.3), o.is_causal = true;
  });
  add("sinks", [&](attention_options& o) { o.sinks = random_tensor({s.Hq}, dtype::f32, rng, -1, 2); });
  add("everything", [&](attention_options& o) {
    o.is_causal = true, o.window_left = 20, o.softcap = 5.0, o.sinks = random_tensor({s.Hq}, dtype::f32, rng);
    o.alibi_slopes = random_tensor({s.Hq}, dtype::f32, rng, 0, 0.2), o.attn_mask = random_bool({s.Nq, s.Nk}, rng, 0.9);
    o.nonpad_kv_seqlen = index_tensor({85, 90});
  });
  for (dtype t : {dtype::bf16, dtype::f16})
    for (const auto& [name, o] : cases) {
      // A float mask's gradient is the reference's: forward only on cuda.
      const bool float_mask = o.attn_mask && o.attn_mask->type() == dtype::f32;
      check_case(s, t, o, rng, std::string(dtype_name(t)) + " " + name, !float_mask);
    }
  // D = 128 with the options the plain kernels take (their 128-row and 128-key blocks, ranged and
  // whole): causal both ways, a window, kv lengths, sinks, GQA 2:1.
  const shape_case w{2, 4, 2, 150, 260, 128, 128};
  add_plain("D128 causal top_left", [](attention_options& o) { o.is_causal = true; });
  add_plain("D128 causal bottom_right", [](attention_options& o) {
    o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  });
  add_plain("D128 window (40, 7)", [](attention_options& o) { o.window_left = 40, o.window_right = 7; });
  add_plain("D128 nonpad_kv_seqlen + sinks", [&](attention_options& o) {
    o.nonpad_kv_seqlen = index_tensor({260, 131}), o.sinks = random_tensor({w.Hq}, dtype::f32, rng, -1, 2);
  });
  for (const auto& [name, o] : plain) check_case(w, dtype::bf16, o, rng, name);
}

// Sets ATTN_CUDA_SPLITS for a scope (the forward reads it at each launch), then puts back what was
// there: the GPU check also runs the whole suite with splits forced.
class scoped_splits {
 public:
  explicit scoped_splits(const char* value) {
    if (const char* e = std::getenv("ATTN_CUDA_SPLITS")) old_ = e, had_ = true;
    setenv("ATTN_CUDA_SPLITS", value, 1);
  }
  ~scoped_splits() { had_ ? setenv("ATTN_CUDA_SPLITS", old_.c_str(), 1) : unsetenv("ATTN_CUDA_SPLITS"); }

 private:
  std::string old_;
  bool had_ = false;
};

// Decode shapes (a few query rows, thousands of keys) take split-KV: each query block's keys in
// runs of their own blocks, merged by lse; with one query row and GQA, the group's heads as rows. Against the reference, against the same kernel unsplit
// (ATTN_CUDA_SPLITS=1), bitwise equal from one run to the next; empty splits (a window, kv
// lengths of 0) and the sink joining once included.
TEST(CudaDevice, SplitKvDecodeMatchesTheReferenceAndTheUnsplitKernel) {
  std::mt19937 rng(17);
  const std::vector<shape_case> shapes = {
      {1, 8, 2, 1, 3000, 128, 128}, {2, 4, 4, 5, 1500, 64, 64}, {1, 2, 1, 1, 2100, 256, 256}, {1, 4, 2, 1, 1800, 96, 96}};
  for (const shape_case& s : shapes) {
    std::vector<std::pair<std::string, attention_options>> cases;
    auto add = [&](std::string name, auto set) {
      attention_options o;
      set(o);
      cases.emplace_back(std::move(name), std::move(o));
    };
    add("plain", [](attention_options&) {});
    add("sinks", [&](attention_options& o) { o.sinks = random_tensor({s.Hq}, dtype::f32, rng, -1, 2); });
    add("kv lengths (one 0) + sinks", [&](attention_options& o) {
      std::vector<std::int64_t> len(std::size_t(s.B), s.Nk * 2 / 5);
      len[0] = s.B > 1 ? 0 : s.Nk - 77;
      o.nonpad_kv_seqlen = index_tensor(len);
      o.sinks = random_tensor({s.Hq}, dtype::f32, rng, -1, 2);
    });
    add("causal bottom_right", [](attention_options& o) {
      o.is_causal = true, o.alignment = causal_alignment::bottom_right;
    });
    add("causal bottom_right + window 700", [](attention_options& o) {
      o.is_causal = true, o.alignment = causal_alignment::bottom_right, o.window_left = 700;
    });
    add("softcap + alibi + bool mask", [&](attention_options& o) {
      o.softcap = 4.0, o.alibi_slopes = random_tensor({s.Hq}, dtype::f32, rng, 0, 0.01);
      o.attn_mask = random_bool({s.Nq, s.Nk}, rng, 0.7);
    });
    for (const auto& [name, o] : cases) {
      const std::string what = fmt::format("B{} Hq{} Hkv{} Nq{} Nk{} D{}: {}", s.B, s.Hq, s.Hkv, s.Nq, s.Nk, s.D, name);
      SCOPED_TRACE(what);
      const Tensor q = random_tensor({s.B, s.Hq, s.Nq, s.D}, dtype::bf16, rng);
      const Tensor k = random_tensor({s.B, s.Hkv, s.Nk, s.D}, dtype::bf16, rng);
      const Tensor v = random_tensor({s.B, s.Hkv, s.Nk, s.Dv}, dtype::bf16, rng);
      const std::string how = explain_backend(q, k, v, o, false, kCuda);
      EXPECT_NE(how.find("split-KV"), std::string::npos) << how;
      // One query row of a GQA group with nothing per row but q: the group's heads are the rows.
      const bool swap = s.Nq == 1 && s.Hq > s.Hkv && !o.attn_mask && !o.alibi_slopes && o.window_left < 0;
      EXPECT_EQ(how.find("heads as rows") != std::string::npos, swap) << how;
      const attention_result want = attention(q, k, v, o, kRef), got = attention(q, k, v, o, kCuda);
      EXPECT_TRUE(all_close(got.out, want.out, 1.6e-2, 1.6e-2)) << "out";
      EXPECT_TRUE(all_close(got.lse, want.lse, 2e-3, 2e-4)) << "lse";
      const attention_result again = attention(q, k, v, o, kCuda);
      EXPECT_EQ(again.out.to_vector(), got.out.to_vector()) << "deterministic";
      EXPECT_EQ(again.lse.to_vector(), got.lse.to_vector()) << "deterministic";
      scoped_splits off("1");
      EXPECT_EQ(explain_backend(q, k, v, o, false, kCuda).find("split-KV"), std::string::npos);
      const attention_result whole = attention(q, k, v, o, kCuda);
      EXPECT_TRUE(all_close(got.out, whole.out, 1.6e-2, 1.6e-2)) << "split against unsplit";
      EXPECT_TRUE(all_close(got.lse, whole.lse, 1e-4, 1e-4)) << "split against unsplit";
    }
  }
  // Backward from a split forward's out and lse (the backward kernels do not split).
  check_case({1, 8, 2, 1, 3000, 128, 128}, dtype::bf16, {}, rng, "decode backward");
}

TEST(CudaDevice, FullyMaskedRowsGiveZerosAndNoGradient) {
  std::mt19937 rng(13);
  const shape_case s{1, 2, 2, 9, 40, 64, 64};
  attention_options o;
  Tensor m = random_bool({s.Nq, s.Nk}, rng, 0.8);
  for (std::int64_t j = 0; j < s.Nk; ++j) m.set({3, j}, 0.0), m.set({7, j}, 0.0);
  o.attn_mask = m;
  o.sinks = random_tensor({s.Hq}, dtype::f32, rng);
  check_case(s, dtype::bf16, o, rng, "bool mask with empty rows, sinks");
  const Tensor q = random_tensor({s.B, s.Hq, s.Nq, s.D}, dtype::bf16, rng);
  const Tensor kv = random_tensor({s.B, s.Hkv, s.Nk, s.D}, dtype::bf16, rng);
  const attention_result r = attention(q, kv, kv, o, kCuda);
  for (std::int64_t d = 0; d < s.Dv; ++d) EXPECT_EQ(r.out.get({0, 1, 3, d}), 0.0);
  // A row with no key but a sink: its softmax is the sink's alone, lse = the sink's logit.
  EXPECT_NEAR(r.lse.get({0, 1, 7}), o.sinks->get({1}), 1e-6);
  attention_options no_sink = o;
  no_sink.sinks.reset();
  EXPECT_EQ(attention(q, kv, kv, no_sink, kCuda).lse.get({0, 1, 7}), -std::numeric_limits<double>::infinity());
  // Nk = 0: every row is empty.
  const Tensor k0 = Tensor::zeros({1, 2, 0, 64}, dtype::bf16);
  const attention_result e = attention(q, k0, k0, {}, kCuda);
  EXPECT_TRUE(all_close(e.out, attention(q, k0, k0, {}, kRef).out, 0.0));
}

TEST(CudaDevice, DeviceTensorApiEqualsTheHostPathBitwise) {
  std::mt19937 rng(14);
  const Tensor qh = random_tensor({2, 4, 100, 128}, dtype::bf16, rng);
  const Tensor kh = random_tensor({2, 2, 150, 128}, dtype::bf16, rng);
  const Tensor vh = random_tensor({2, 2, 150, 128}, dtype::bf16, rng);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  o.alibi_slopes = random_tensor({4}, dtype::f32, rng, 0, 0.1);
  const auto q = cuda::DeviceTensor::from_host(qh), k = cuda::DeviceTensor::from_host(kh),
             v = cuda::DeviceTensor::from_host(vh);
  EXPECT_EQ(q.to_host().to_vector(), qh.to_vector());
  const cuda::device_result r = cuda::attention(q, k, v, o);
  const attention_result host = attention(qh, kh, vh, o, kCuda);
  EXPECT_EQ(r.out.to_host().to_vector(), host.out.to_vector());
  EXPECT_EQ(r.lse.to_host().to_vector(), host.lse.to_vector());
  // Deterministic: a second run is bitwise the same, forward and backward.
  EXPECT_EQ(cuda::attention(q, k, v, o).out.to_host().to_vector(), host.out.to_vector());
  const Tensor dh = random_tensor(host.out.shape(), dtype::bf16, rng);
  const auto dout = cuda::DeviceTensor::from_host(dh);
  const cuda::device_grads g1 = cuda::attention_backward(q, k, v, r.out, r.lse, dout, o);
  const cuda::device_grads g2 = cuda::attention_backward(q, k, v, r.out, r.lse, dout, o);
  EXPECT_EQ(g1.dq.to_host().to_vector(), g2.dq.to_host().to_vector());
  EXPECT_EQ(g1.dk.to_host().to_vector(), g2.dk.to_host().to_vector());
  EXPECT_EQ(g1.dv.to_host().to_vector(), g2.dv.to_host().to_vector());
  EXPECT_EQ(g1.dalibi_slopes.to_vector(), g2.dalibi_slopes.to_vector());
  const attention_grads hg = attention_backward(qh, kh, vh, r.out.to_host(), dh, r.lse.to_host(), o, kCuda);
  EXPECT_EQ(g1.dq.to_host().to_vector(), hg.dq.to_vector());
  EXPECT_EQ(g1.dk.to_host().to_vector(), hg.dk.to_vector());
  // 3-D layout [B, N, H·D] on the device.
  attention_options o3;
  o3.q_num_heads = 4, o3.kv_num_heads = 2;
  const Tensor q3 = random_tensor({1, 33, 4 * 64}, dtype::f16, rng), k3 = random_tensor({1, 41, 2 * 64}, dtype::f16, rng);
  const cuda::device_result r3 =
      cuda::attention(cuda::DeviceTensor::from_host(q3), cuda::DeviceTensor::from_host(k3), cuda::DeviceTensor::from_host(k3), o3);
  EXPECT_TRUE(all_close(r3.out.to_host(), attention(q3, k3, k3, o3, kRef).out, 3e-3, 3e-3));
}

TEST(CudaDevice, BadInputIsRefusedByName) {
  std::mt19937 rng(15);
  const Tensor f = random_tensor({1, 1, 4, 64}, dtype::f32, rng);
  EXPECT_THROW_MSG(attention(f, f, f, {}, kCuda), "cuda: float32 inputs (the kernels take float16 and bfloat16)");
  const Tensor big = random_tensor({1, 1, 4, 264}, dtype::bf16, rng);
  EXPECT_THROW_MSG(attention(big, big, big, {}, kCuda), "head sizes D = 264, Dv = 264");
  const Tensor odd = random_tensor({1, 1, 4, 60}, dtype::bf16, rng);
  EXPECT_THROW_MSG(attention(odd, odd, odd, {}, kCuda), "multiples of 8 up to 256");
  const Tensor q = random_tensor({1, 1, 4, 64}, dtype::bf16, rng);
  attention_options o;
  o.return_qk = qk_output::probabilities;
  EXPECT_THROW_MSG(attention(q, q, q, o, kCuda), "cuda: a qk output needs the reference");
  const auto dq = cuda::DeviceTensor::from_host(q);
  EXPECT_THROW_MSG(cuda::attention(dq, dq, dq, o), "return_qk needs the reference");
  attention_options c;
  c.check_finite = true;
  EXPECT_THROW_MSG(cuda::attention(dq, dq, dq, c), "check_finite reads the inputs on the host");
  const auto wrong = cuda::DeviceTensor::from_host(random_tensor({1, 1, 5, 64}, dtype::bf16, rng));
  EXPECT_THROW_MSG(cuda::attention(dq, wrong, dq), "attn::cuda::attention:");
  const cuda::device_result r = cuda::attention(dq, dq, dq);
  EXPECT_THROW_MSG(cuda::attention_backward(dq, dq, dq, r.out, r.out, r.out, {}), "lse is bfloat16 [1, 1, 4, 64]");
  // The _into calls name the tensor given in a wrong dtype or shape, and their own name.
  const cuda::DeviceTensor lse_f16(dtype::f16, {1, 1, 4}), out_short(dtype::bf16, {1, 1, 3, 64});
  EXPECT_THROW_MSG(cuda::attention_into(dq, dq, dq, out_short, r.lse),
                   "attn::cuda::attention_into: out is bfloat16 [1, 1, 3, 64], expected bfloat16 [1, 1, 4, 64]");
  EXPECT_THROW_MSG(cuda::attention_into(dq, dq, dq, r.out, lse_f16), "lse is float16 [1, 1, 4], expected float32 [1, 1, 4]");
  EXPECT_THROW_MSG(cuda::attention_into(dq, wrong, dq, r.out, r.lse), "attn::cuda::attention_into:");
  const cuda::DeviceTensor g(dtype::bf16, {1, 1, 4, 64}), g_f16(dtype::f16, {1, 1, 4, 64});
  EXPECT_THROW_MSG(cuda::attention_backward_into(dq, dq, dq, r.out, r.lse, r.out, g, g_f16, g),
                   "attn::cuda::attention_backward_into: dk is float16 [1, 1, 4, 64], expected bfloat16 [1, 1, 4, 64]");
  EXPECT_THROW_MSG(cuda::attention_backward_into(dq, dq, dq, r.out, r.lse, out_short, g, g, g),
                   "dout is bfloat16 [1, 1, 3, 64]");
  EXPECT_THROW_MSG(cuda::DeviceTensor(dtype::f16, {2, -1}), "negative dimension");
}

TEST(CudaDevice, SpecialValuesGiveTheReferencesAnswer) {
  std::mt19937 rng(16);
  Tensor q = random_tensor({1, 2, 20, 64}, dtype::bf16, rng);
  const Tensor k = random_tensor({1, 2, 30, 64}, dtype::bf16, rng);
  Tensor v = random_tensor({1, 2, 30, 64}, dtype::bf16, rng);
  q.set({0, 0, 4, 7}, std::nan(""));
  q.set({0, 1, 9, 0}, std::numeric_limits<double>::infinity());
  v.set({0, 1, 12, 3}, std::nan(""));
  const attention_result want = attention(q, k, v, {}, kRef), got = attention(q, k, v, {}, kCuda);
  EXPECT_TRUE(all_close(got.out, want.out, 1.6e-2, 1.6e-2));
  EXPECT_TRUE(all_close(got.lse, want.lse, 2e-3, 2e-4));
}

}  // namespace
}  // namespace attn

int main(int argc, char** argv) {
  bool device = false;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--device") == 0) device = true;
  ::testing::InitGoogleTest(&argc, argv);
  if (device) {
    if (!attn::cuda::available()) {
      std::printf("cuda.device: skipped — %s\n", attn::cuda::unavailable_reason().c_str());
      return 77;
    }
    std::printf("cuda.device on %s\n", attn::cuda::device_name().c_str());
  }
  // A --gtest_filter given on the command line (one test under compute-sanitizer, say) is kept.
  if (::testing::GTEST_FLAG(filter) == "*") ::testing::GTEST_FLAG(filter) = device ? "CudaDevice.*" : "CudaContract.*";
  return RUN_ALL_TESTS();
}

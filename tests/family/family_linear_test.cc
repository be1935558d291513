// tests/family/family_linear_test.cc — linear attention (Katharopoulos et al. 2020): the prefix-sum
// path (float64 and float32) against the float64 reference that forms every row's weights, over
// random sweeps (feature maps, normalised or not, causal alignments, padding, GQA, odd sizes, 0
// and 1, 3-D), forward and backward; gradients by central differences; bitwise equality across
// thread counts; refusals by message.
#include <gtest/gtest.h>

#include <random>

#include "test_util.h"

namespace attn::testing {
namespace {

struct lin_case {
  Tensor q, k, v, dout, lens;
  linear_attention_options o;
  std::int64_t B, Hq, Hkv, Nq, Nk, D, Dv;

  lin_case(std::mt19937& rng, std::int64_t B_, std::int64_t Hq_, std::int64_t Hkv_, std::int64_t Nq_, std::int64_t Nk_,
           std::int64_t D_, std::int64_t Dv_)
      : B(B_), Hq(Hq_), Hkv(Hkv_), Nq(Nq_), Nk(Nk_), D(D_), Dv(Dv_) {
    q = random_tensor({B, Hq, Nq, D}, dtype::f64, rng);
    k = random_tensor({B, Hkv, Nk, D}, dtype::f64, rng);
    v = random_tensor({B, Hkv, Nk, Dv}, dtype::f64, rng);
    dout = random_tensor({B, Hq, Nq, Dv}, dtype::f64, rng);
  }
  // Padding: batch 0 keeps `keep` keys.
  void pad(std::int64_t keep) {
    std::vector<double> l(static_cast<std::size_t>(B), static_cast<double>(Nk));
    l[0] = double(keep);
    lens = Tensor::from_values({B}, dtype::i64, l);
    o.nonpad_kv_seqlen = lens.view();
  }
};

const execution kRef{.path = family_path::reference};

TEST(LinearAttention, PrefixSumsMatchTheReference) {
  std::mt19937 rng(41);
  std::uniform_int_distribution<int> n(0, 7), d(1, 5);
  int cases = 0;
  for (feature_map f : {feature_map::elu_plus_one, feature_map::relu, feature_map::identity})
    for (bool norm : {true, false})
      for (int mask = 0; mask < 4; ++mask)  // none; causal top-left; causal bottom-right + padding; padding
        for (int rep = 0; rep < 4; ++rep) {
          if (f == feature_map::identity && norm) continue;  // a denominator of any sign: no f32 bound
          const std::int64_t Hkv = 1 + rep % 2, Hq = Hkv * (1 + rep / 2);
          lin_case c(rng, 1 + rep % 2, Hq, Hkv, rep == 0 ? 1 : n(rng), n(rng), d(rng), d(rng));
          c.o.phi = f, c.o.normalize = norm;
          if (mask == 1 || mask == 2) c.o.is_causal = true;
          if (mask == 2) c.o.alignment = causal_alignment::bottom_right;
          if (mask >= 2) c.pad(c.Nk / 2);
          const std::string what = to_string(f) + (norm ? " normalised" : " unnormalised") + " mask " +
                                   std::to_string(mask) + " " + shape_str(c.q.shape()) + " " + shape_str(c.k.shape());
          const linear_attention_result ref = linear_attention(c.q, c.k, c.v, c.o, kRef);
          const linear_attention_grads gref = linear_attention_backward(c.q, c.k, c.v, c.dout, c.o, kRef);
          ASSERT_EQ(ref.path, "reference");
          const linear_attention_result r = linear_attention(c.q, c.k, c.v, c.o);
          const linear_attention_grads g = linear_attention_backward(c.q, c.k, c.v, c.dout, c.o);
          EXPECT_EQ(r.path, "linear (f64)");
          EXPECT_TRUE(all_close(r.out, ref.out, 1e-10)) << what;
          EXPECT_TRUE(all_close(g.dq, gref.dq, 1e-10)) << what;
          EXPECT_TRUE(all_close(g.dk, gref.dk, 1e-10)) << what;
          EXPECT_TRUE(all_close(g.dv, gref.dv, 1e-10)) << what;
          EXPECT_FALSE(any_nan(r.out) || any_nan(g.dq) || any_nan(g.dk) || any_nan(g.dv)) << what;
          // float32 inputs run the float32 kernel.
          const Tensor q32 = c.q.to(dtype::f32), k32 = c.k.to(dtype::f32), v32 = c.v.to(dtype::f32);
          const linear_attention_result r32 = linear_attention(q32, k32, v32, c.o);
          const linear_attention_grads g32 =
              linear_attention_backward(q32, k32, v32, c.dout.to(dtype::f32), c.o);
          EXPECT_EQ(r32.out.type(), dtype::f32);
          EXPECT_EQ(r32.path.rfind("linear (f32, ", 0), 0u) << r32.path;
          EXPECT_TRUE(all_close(r32.out, ref.out, 2e-5)) << what;
          EXPECT_TRUE(all_close(g32.dq, gref.dq, 1e-4)) << what;
          EXPECT_TRUE(all_close(g32.dk, gref.dk, 1e-4)) << what;
          EXPECT_TRUE(all_close(g32.dv, gref.dv, 1e-4)) << what;
          ++cases;
        }
  EXPECT_EQ(cases, 80);
}

// The reference itself, on a case worked by hand: one query, two keys, D = Dv = 1, relu.
TEST(LinearAttention, WorkedExample) {
  const Tensor q = Tensor::from_values({1, 1, 2, 1}, dtype::f64, {2.0, -1.0});
  const Tensor k = Tensor::from_values({1, 1, 2, 1}, dtype::f64, {1.0, 3.0});
  const Tensor v = Tensor::from_values({1, 1, 2, 1}, dtype::f64, {10.0, 20.0});
  linear_attention_options o;
  o.phi = feature_map::relu;
  for (const execution& e : {execution{}, kRef}) {
    // s = [2, 6]: normalised (2·10 + 6·20) / 8 = 17.5; query 2 has φ(q) = 0: no mass, out 0.
    Tensor out = linear_attention(q, k, v, o, e).out;
    EXPECT_EQ(out.to_vector(), (std::vector<double>{17.5, 0.0}));
    o.normalize = false;
    EXPECT_EQ(linear_attention(q, k, v, o, e).out.to_vector(), (std::vector<double>{140.0, 0.0}));
    o.is_causal = true;  // query 0 sees key 0 only: 2·10
    EXPECT_EQ(linear_attention(q, k, v, o, e).out.to_vector(), (std::vector<double>{20.0, 0.0}));
    o.is_causal = false, o.normalize = true;
  }
  // elu + 1: φ(-1) = e^-1; φ(2) = 3.
  o.phi = feature_map::elu_plus_one;
  const double s0 = std::exp(-1.0) * 2.0, s1 = std::exp(-1.0) * 4.0;
  EXPECT_NEAR(linear_attention(q, k, v, o).out.get({0, 0, 1, 0}), (s0 * 10 + s1 * 20) / (s0 + s1), 1e-12);
}

TEST(LinearAttention, FiniteDifferences) {
  std::mt19937 rng(42);
  for (feature_map f : {feature_map::elu_plus_one, feature_map::relu, feature_map::identity})
    for (bool norm : {true, false})
      for (bool causal : {false, true})
        for (const execution& e : {execution{}, kRef}) {
          lin_case c(rng, 1, 2, 1, 3, 4, 3, 2);
          c.o.phi = f, c.o.normalize = norm, c.o.is_causal = causal;
          if (causal) c.o.alignment = causal_alignment::bottom_right, c.pad(3);
          auto loss = [&] { return weighted_sum(linear_attention(c.q, c.k, c.v, c.o, e).out, c.dout); };
          const linear_attention_grads g = linear_attention_backward(c.q, c.k, c.v, c.dout, c.o, e);
          const std::string what = to_string(f) + (norm ? " normalised" : "") + (causal ? " causal " : " ") + g.path;
          expect_gradient(what + " dq", c.q, g.dq, loss, 1e-6, 1e-5);
          expect_gradient(what + " dk", c.k, g.dk, loss, 1e-6, 1e-5);
          expect_gradient(what + " dv", c.v, g.dv, loss, 1e-6, 1e-5);
        }
}

TEST(LinearAttention, ThreadsLayoutsAndDtypes) {
  std::mt19937 rng(43);
  lin_case c(rng, 2, 4, 2, 9, 11, 5, 3);
  c.o.is_causal = true;
  c.pad(7);
  for (dtype t : {dtype::f32, dtype::f64}) {
    const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t), dout = c.dout.to(t);
    const linear_attention_result one = linear_attention(q, k, v, c.o, {.num_threads = 1});
    const linear_attention_grads g1 = linear_attention_backward(q, k, v, dout, c.o, {.num_threads = 1});
    for (int th : {2, 3, 5}) {
      const execution e{.num_threads = th};
      EXPECT_TRUE(all_close(linear_attention(q, k, v, c.o, e).out, one.out, 0.0)) << th;
      const linear_attention_grads g = linear_attention_backward(q, k, v, dout, c.o, e);
      EXPECT_TRUE(all_close(g.dq, g1.dq, 0.0) && all_close(g.dk, g1.dk, 0.0) && all_close(g.dv, g1.dv, 0.0)) << th;
    }
  }
  // The 3-D layout [B, N, H*X] gives what its 4-D twin gives.
  auto to3 = [](const Tensor& t) {
    const Tensor p = Tensor::copy_of(t.view().permute({0, 2, 1, 3}));
    return Tensor::copy_of(p.view().reshape({t.size(0), t.size(2), t.size(1) * t.size(3)}));
  };
  linear_attention_options o3 = c.o;
  o3.q_num_heads = c.Hq, o3.kv_num_heads = c.Hkv;
  const linear_attention_result four = linear_attention(c.q, c.k, c.v, c.o);
  const linear_attention_grads g4 = linear_attention_backward(c.q, c.k, c.v, c.dout, c.o);
  EXPECT_TRUE(all_close(linear_attention(to3(c.q), to3(c.k), to3(c.v), o3).out, to3(four.out), 0.0));
  const linear_attention_grads g3 = linear_attention_backward(to3(c.q), to3(c.k), to3(c.v), to3(c.dout), o3);
  EXPECT_TRUE(all_close(g3.dq, to3(g4.dq), 0.0) && all_close(g3.dk, to3(g4.dk), 0.0) && all_close(g3.dv, to3(g4.dv), 0.0));
  // bfloat16 and float16 inputs: computed in float32, returned in their dtype.
  const linear_attention_result ref = linear_attention(c.q, c.k, c.v, c.o, kRef);
  for (dtype t : {dtype::bf16, dtype::f16}) {
    const linear_attention_result r = linear_attention(c.q.to(t), c.k.to(t), c.v.to(t), c.o);
    EXPECT_EQ(r.out.type(), t);
    EXPECT_TRUE(all_close(r.out, ref.out, t == dtype::bf16 ? 3e-2 : 3e-3)) << dtype_name(t);
  }
}

TEST(LinearAttention, RefusesWhatItCannotCompute) {
  std::mt19937 rng(44);
  lin_case c(rng, 1, 2, 1, 3, 4, 3, 2);
  const Tensor mask = random_bool({3, 4}, rng);
  linear_attention_options o = c.o;
  o.attn_mask = mask.view();
  EXPECT_THROW_MSG(linear_attention(c.q, c.k, c.v, o), "linear_attention: takes no attn_mask");
  o = c.o, o.window_left = 2;
  EXPECT_THROW_MSG(linear_attention_backward(c.q, c.k, c.v, c.dout, o),
                   "linear_attention_backward: takes no sliding window (got window_left = 2, window_right = -1)");
  EXPECT_THROW_MSG(linear_attention(c.q, c.k, c.v, c.o, {.path = family_path::core}),
                   "linear_attention: path core runs attn::attention");
  o = c.o, o.phi = feature_map(7);
  EXPECT_THROW_MSG(linear_attention(c.q, c.k, c.v, o), "linear_attention: feature map 7 is not a feature_map");
  const Tensor bad = random_tensor({1, 2, 3, 3}, dtype::f64, rng);
  EXPECT_THROW_MSG(linear_attention_backward(c.q, c.k, c.v, bad, c.o),
                   "linear_attention_backward: dout has shape [1, 2, 3, 3], expected [1, 2, 3, 2]");
  const Tensor k5 = random_tensor({1, 1, 4, 5}, dtype::f64, rng);
  EXPECT_THROW_MSG(linear_attention(c.q, k5, c.v), "linear_attention: k has head size 5");
}

// The family's identity distribution over dot and scaled_dot scores takes linear attention with
// φ = identity where the call leaves the path automatic: equal to the family's float64 reference
// and to its pairwise kernels (path fused), forward and every gradient, with causal alignments,
// padding and GQA, in float32, bfloat16 and float64. An attn_mask, a window or a NaN keeps the
// pairwise kernels.
TEST(LinearAttention, FamilyIdentityByAssociativity) {
  std::mt19937 rng(44);
  for (score_kind sk : {score_kind::dot, score_kind::scaled_dot})
    for (dtype t : {dtype::f32, dtype::bf16, dtype::f64})
      for (int mask = 0; mask < 4; ++mask) {  // none; causal top-left; causal bottom-right + padding; padding
        lin_case c(rng, 2, 4, 2, 9, 11, 5, 3);
        family_options o;
        o.score.kind = sk, o.distribution.kind = distribution_kind::identity;
        if (sk == score_kind::scaled_dot && mask % 2) o.score.scale = 0.7;  // else 1/sqrt(D)
        if (mask == 1 || mask == 2) o.is_causal = true;
        if (mask == 2) o.alignment = causal_alignment::bottom_right;
        if (mask >= 2) c.pad(4), o.nonpad_kv_seqlen = c.lens.view();
        const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t), dout = c.dout.to(t);
        const std::string what = to_string(sk) + " " + std::string(dtype_name(t)) + " mask " + std::to_string(mask);
        const family_result r = attention_family(q, k, v, o);
        const family_grads g = attention_family_backward(q, k, v, dout, o);
        EXPECT_NE(r.path.find("identity by associativity"), std::string::npos) << what << ": " << r.path;
        EXPECT_NE(g.path.find("identity by associativity"), std::string::npos) << what << ": " << g.path;
        const family_result ref = attention_family(q, k, v, o, {.path = family_path::reference});
        const family_grads gref = attention_family_backward(q, k, v, dout, o, {.path = family_path::reference});
        const double tol = tolerance_for(t) * 4;
        EXPECT_TRUE(all_close(r.out, ref.out, tol)) << what;
        EXPECT_TRUE(all_close(g.dq, gref.dq, tol)) << what;
        EXPECT_TRUE(all_close(g.dk, gref.dk, tol)) << what;
        EXPECT_TRUE(all_close(g.dv, gref.dv, tol)) << what;
        if (t == dtype::f64) continue;  // the pairwise kernels run f32 and bf16
        const family_result fz = attention_family(q, k, v, o, {.path = family_path::fused});
        EXPECT_EQ(fz.path.rfind("fused", 0), 0u) << fz.path;
        EXPECT_TRUE(all_close(r.out, fz.out, tol)) << what;
      }
  // What keeps the pairwise kernels: a window, an attn_mask, a NaN (where the NaN reaches, the
  // pairwise kernels and the reference agree).
  lin_case c(rng, 1, 2, 1, 5, 6, 4, 3);
  const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32);
  Tensor v = c.v.to(dtype::f32);
  family_options o;
  o.score.kind = score_kind::scaled_dot, o.distribution.kind = distribution_kind::identity;
  o.window_left = 2;
  EXPECT_EQ(attention_family(q, k, v, o).path.rfind("fused", 0), 0u);
  o.window_left = -1;
  const Tensor m = random_bool({1, 1, 5, 6}, rng);
  o.attn_mask = m.view();
  EXPECT_EQ(attention_family(q, k, v, o).path.rfind("fused", 0), 0u);
  o.attn_mask.reset();
  o.is_causal = true;
  v.set({0, 0, 3, 1}, NAN);
  const family_result r = attention_family(q, k, v, o);
  EXPECT_EQ(r.path.rfind("fused", 0), 0u) << r.path;
  EXPECT_TRUE(any_nan(r.out));
  EXPECT_TRUE(all_close(r.out, attention_family(q, k, v, o, {.path = family_path::reference}).out, 1e-5));
}

}  // namespace
}  // namespace attn::testing

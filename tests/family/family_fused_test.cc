// tests/family/family_fused_test.cc — the fused f32 path of attention_family (src/family/fused.cc,
// src/cpu/family_kernels.h) against the float64 reference: every dot-product score × every fused
// distribution, forward and every gradient, over random small problems (odd sizes, Nq/Nk 0 and
// 1, masks, causal alignments, windows, padding, GQA) at every ISA level this CPU runs; the
// same support (exact zeros) as the reference; bitwise identical results for any thread count;
// the choice of path and its refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>

#include "cpu/kernels.h"
#include "cpu_isa.h"
#include "family_util.h"

namespace attn::testing {
namespace {

const std::vector<distribution_kind> kFused = {distribution_kind::softmax,  distribution_kind::sigmoid,
                                               distribution_kind::sparsemax, distribution_kind::entmax15,
                                               distribution_kind::hardmax,  distribution_kind::topk,
                                               distribution_kind::identity};

// Dot-product scores (kernel_kind::dot), with the activations of activated_general, location (a
// dot product with the rows of W_a), and the box and triangle kernels (squared distances).
struct score_case {
  score_kind s;
  score_activation act = score_activation::tanh;
};
const std::vector<score_case> kScores = {{score_kind::dot},
                                         {score_kind::scaled_dot},
                                         {score_kind::general},
                                         {score_kind::biased_general},
                                         {score_kind::activated_general, score_activation::tanh},
                                         {score_kind::activated_general, score_activation::relu},
                                         {score_kind::activated_general, score_activation::sigmoid},
                                         {score_kind::cosine},
                                         {score_kind::gaussian},
                                         {score_kind::location},
                                         {score_kind::box},
                                         {score_kind::triangle}};

struct result {
  family_result fwd;
  family_grads g;
};

result run(const family_case& c, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
           family_path path, int threads = 1) {
  const execution e{.path = path, .num_threads = threads};
  return {attention_family(q, k, v, c.opt, e), attention_family_backward(q, k, v, dout, c.opt, e)};
}

// Masks: none; causal top-left; causal bottom-right with a window on both sides; a bool mask
// with a fully masked row; a float mask with padding (nonpad_kv_seqlen).
void apply_mask(family_case& c, int kind, std::mt19937& rng) {
  switch (kind) {
    case 0: break;
    case 1: c.opt.is_causal = true; break;
    case 2:
      c.opt.is_causal = true, c.opt.alignment = causal_alignment::bottom_right;
      c.opt.window_left = 3, c.opt.window_right = 1;
      break;
    case 3:
      c.mask = random_bool({c.B, 1, c.Nq, c.Nk}, rng, 0.7);
      if (c.Nq > 1)
        for (std::int64_t j = 0; j < c.Nk; ++j) c.mask.set({0, 0, 1, j}, 0.0);  // row 1 of batch 0: no key
      c.opt.attn_mask = c.mask.view();
      break;
    case 4: {
      std::vector<double> lens(std::size_t(c.B), double(c.Nk));
      lens[0] = double(c.Nk / 2);
      c.lens = Tensor::from_values({c.B}, dtype::i64, lens);
      c.mask = random_tensor({c.Nq, c.Nk}, dtype::f64, rng, -1.0, 1.0);
      c.opt.attn_mask = c.mask.view(), c.opt.nonpad_kv_seqlen = c.lens.view();
      break;
    }
  }
}

// Every output and gradient of `got` (input dtype `t`) within tol of `want` (float64).
void expect_close(const result& got, const result& want, double tol, const std::string& what) {
  SCOPED_TRACE(what + " (" + got.fwd.path + ")");
  EXPECT_EQ(got.fwd.path.rfind("fused", 0), 0u);
  EXPECT_EQ(got.g.path.rfind("fused", 0), 0u);
  expect_family_close(got.fwd, got.g, want.fwd, want.g, tol);
}

Tensor f64(const Tensor& t) { return t.to(dtype::f64); }

// The case in float32 on `path` (with a random float32 dout) and the float64 reference on the
// same rounded inputs.
struct compared {
  result got, ref;
};
compared run_vs_reference(const family_case& c, std::mt19937& rng, family_path path, int threads = 1) {
  const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
  const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f32, rng);
  return {run(c, q, k, v, dout, path, threads), run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference)};
}

TEST(FamilyFused, MatchesReferenceEveryIsaScoreDistributionAndMask) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(101);
    for (const score_case& sc : kScores)
      for (distribution_kind d : kFused)
        for (int mask = 0; mask < 5; ++mask) {
          // Odd sizes, 1, and GQA 4:2 or 3:1; Nq·G spans more than one lane block on some.
          const std::int64_t Nq = std::vector<std::int64_t>{1, 5, 9, 13, 23}[std::size_t(mask)];
          const std::int64_t Nk = std::vector<std::int64_t>{1, 7, 17, 6, 133}[std::size_t((mask + int(d)) % 5)];
          const bool three = (mask + int(sc.s)) % 2;
          family_case c(sc.s, d, rng, 2, three ? 3 : 4, three ? 1 : 2, Nq, Nk, 5, 3);
          c.opt.score.activation = sc.act;
          if (d == distribution_kind::sigmoid && mask == 4) c.opt.distribution.sigmoid_bias = -0.5;
          apply_mask(c, mask, rng);
          const auto [got, ref] = run_vs_reference(c, rng, family_path::fused);
          const std::string what = isa + " " + case_name(sc.s, d) + " " + to_string(sc.act) + " mask " +
                                   std::to_string(mask) + " Nq " + std::to_string(Nq) + " Nk " + std::to_string(Nk);
          expect_close(got, ref, 2e-4, what);
          EXPECT_FALSE(any_nan(got.fwd.out)) << what;
        }
  }
}

// Additive (Bahdanau) scores, e = w_vᵀ tanh(W_q q + W_k k + b), on the fused kernels: every
// distribution and mask kind, GQA, odd sizes, more than one lane block and key block, a feature
// size A that is not a multiple of any vector width, with and without b; every gradient (q, k,
// v, W_q, W_k, b, w_v) against the float64 reference.
// Both forms of tanh(a + b): the exp form (1 - 2/(1 + e^{2a} e^{2b}), taken when every |qp|,
// |kp| <= 20) and tanh itself (ATTN_FAMILY_ADDITIVE=tanh, or larger activations).
TEST(FamilyFused, AdditiveMatchesReferenceEveryIsaDistributionAndMask) {
  for (const char* form : {"exp", "tanh"})
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    if (std::string(form) == "tanh") setenv("ATTN_FAMILY_ADDITIVE", "tanh", 1);
    std::mt19937 rng(202);
    for (distribution_kind d : kFused)
      for (int mask = 0; mask < 5; ++mask) {
        const std::int64_t Nq = std::vector<std::int64_t>{1, 6, 70, 13, 23}[std::size_t(mask)];
        const std::int64_t Nk = std::vector<std::int64_t>{1, 7, 17, 140, 133}[std::size_t((mask + int(d)) % 5)];
        const bool gqa = (mask + int(d)) % 2;
        family_case c(score_kind::additive, d, rng, 2, gqa ? 4 : 3, gqa ? 2 : 1, Nq, Nk, 5, 3);
        const std::int64_t A = mask == 2 ? 37 : 5;
        c.W_q = random_tensor({A, c.D}, dtype::f64, rng), c.W_k = random_tensor({A, c.Dk}, dtype::f64, rng);
        c.w_v = random_tensor({A}, dtype::f64, rng, -1.5, 1.5), c.b = random_tensor({A}, dtype::f64, rng);
        c.opt.score.W_q = c.W_q.view(), c.opt.score.W_k = c.W_k.view(), c.opt.score.w_v = c.w_v.view();
        c.opt.score.b = c.b.view();
        if (mask == 1) c.opt.score.b.reset(), c.b = Tensor();
        if (d == distribution_kind::sigmoid && mask == 4) c.opt.distribution.sigmoid_bias = -0.5;
        apply_mask(c, mask, rng);
        const auto [got, ref] = run_vs_reference(c, rng, family_path::automatic);
        const std::string what = isa + " " + form + " additive x " + to_string(d) + " mask " + std::to_string(mask) +
                                 " A " + std::to_string(A) + " Nq " + std::to_string(Nq) + " Nk " + std::to_string(Nk);
        expect_close(got, ref, 2e-4, what);
        EXPECT_TRUE(got.g.dw_v.defined()) << what;
        EXPECT_FALSE(any_nan(got.fwd.out)) << what;
      }
    unsetenv("ATTN_FAMILY_ADDITIVE");
  }
}

// Multi-dimensional additive (w_v [Dv, A]: one score and one distribution per value feature) on
// the fused kernels: every distribution (straight-through hardmax included) and mask kind, GQA,
// odd sizes, more than one lane block, A and Dv not multiples of any vector width, both tanh
// forms; every gradient against the float64 reference. ATTN_FAMILY_MD_CHUNK=2 makes the
// distributions that keep scores find their statistics two features at a time (what the driver
// does when Dv · keys · lanes would not fit its scratch), so that path is walked too.
TEST(FamilyFused, MultiDimensionalAdditiveMatchesReference) {
  std::vector<distribution_kind> dists = kFused;
  for (const char* form : {"exp", "tanh", "chunked"})
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    if (std::string(form) == "tanh") setenv("ATTN_FAMILY_ADDITIVE", "tanh", 1);
    if (std::string(form) == "chunked") setenv("ATTN_FAMILY_MD_CHUNK", "2", 1);
    std::mt19937 rng(404);
    for (distribution_kind d : dists)
      for (int mask = 0; mask < 5; ++mask)
        for (const bool st : {false, true}) {
          if (st && d != distribution_kind::hardmax) continue;
          const std::int64_t Nq = std::vector<std::int64_t>{1, 6, 70, 13, 23}[std::size_t(mask)];
          const std::int64_t Nk = std::vector<std::int64_t>{1, 7, 17, 140, 33}[std::size_t((mask + int(d)) % 5)];
          const bool gqa = (mask + int(d)) % 2;
          const std::int64_t Dv = mask == 3 ? 17 : 3;
          family_case c(score_kind::additive, d, rng, 2, gqa ? 4 : 3, gqa ? 2 : 1, Nq, Nk, 5, Dv, /*multi_dim=*/true);
          const std::int64_t A = mask == 2 ? 37 : 5;
          c.W_q = random_tensor({A, c.D}, dtype::f64, rng), c.W_k = random_tensor({A, c.Dk}, dtype::f64, rng);
          c.w_v = random_tensor({Dv, A}, dtype::f64, rng, -1.5, 1.5), c.b = random_tensor({A}, dtype::f64, rng);
          c.opt.score.W_q = c.W_q.view(), c.opt.score.W_k = c.W_k.view(), c.opt.score.w_v = c.w_v.view();
          c.opt.score.b = c.b.view();
          if (mask == 1) c.opt.score.b.reset(), c.b = Tensor();
          if (st) c.opt.distribution.hardmax_grad = hardmax_gradient::straight_through;
          if (d == distribution_kind::sigmoid && mask == 4) c.opt.distribution.sigmoid_bias = -0.5;
          apply_mask(c, mask, rng);
          const auto [got, ref] = run_vs_reference(c, rng, family_path::automatic, 2);
          const std::string what = isa + " " + form + " multi-dimensional additive x " + to_string(d) +
                                   (st ? " (straight-through)" : "") + " mask " + std::to_string(mask) + " A " +
                                   std::to_string(A) + " Dv " + std::to_string(Dv) + " Nq " + std::to_string(Nq) +
                                   " Nk " + std::to_string(Nk);
          expect_close(got, ref, 2e-4, what);
          EXPECT_EQ(got.g.dw_v.shape(), (Shape{Dv, A})) << what;
          EXPECT_FALSE(any_nan(got.fwd.out)) << what;
          // The weights [B, Hq, Nq, Nk, Dv] from the fused kernels.
          const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
          const Tensor w = attention_family_weights(q, k, v, c.opt, {.path = family_path::fused});
          const Tensor wr = attention_family_weights(q, k, v, c.opt, {.path = family_path::reference});
          ASSERT_EQ(w.shape(), (Shape{c.B, c.Hq, Nq, Nk, Dv})) << what;
          const auto g = w.to_vector(), want = wr.to_vector();
          for (std::size_t x = 0; x < g.size(); ++x) ASSERT_NEAR(g[x], want[x], 2e-5 * (1 + std::abs(want[x]))) << what << " at " << x;
        }
    unsetenv("ATTN_FAMILY_ADDITIVE");
    unsetenv("ATTN_FAMILY_MD_CHUNK");
  }
}

// Activations beyond the exp form's range (|W_q q| up to ~40: tanh saturates, and a + b can
// still be small) take the tanh form by themselves and stay exact; NaN in q reaches out through
// either form (softmax, sigmoid: the threshold searches of the sparse distributions make no
// promise about NaN, as the family's special-value contract says).
TEST(FamilyFused, AdditiveLargeActivationsAndNaN) {
  std::mt19937 rng(303);
  for (distribution_kind d : {distribution_kind::softmax, distribution_kind::sigmoid, distribution_kind::entmax15}) {
    family_case c(score_kind::additive, d, rng, 1, 2, 1, 9, 40, 4, 3);
    c.W_q = random_tensor({5, c.D}, dtype::f64, rng, -12.0, 12.0);
    c.W_k = random_tensor({5, c.Dk}, dtype::f64, rng, -12.0, 12.0);
    c.opt.score.W_q = c.W_q.view(), c.opt.score.W_k = c.W_k.view();
    const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
    const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f32, rng);
    expect_close(run(c, q, k, v, dout, family_path::fused), run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference),
                 2e-4, "large " + to_string(d));
    if (d == distribution_kind::entmax15) continue;
    Tensor qn = Tensor::copy_of(q.view());
    qn.set({0, 1, 4, 2}, std::nan(""));
    const family_result r = attention_family(qn, k, v, c.opt, {.path = family_path::fused});
    for (std::int64_t i = 0; i < c.Nq; ++i)
      EXPECT_EQ(std::isnan(r.out.get({0, 1, i, 0})), i == 4) << to_string(d) << " row " << i;
  }
}

// hardmax and top-k with k <= 32 run a sparse backward (the kept keys of each row, then
// O(k·(P + Dv)) per row); ATTN_FAMILY_BACKWARD=two_pass forces the dense two passes. Both
// against the reference, for dot-like, additive and distance (box, triangle: dh too) scores,
// masks, GQA and k on both sides of 32 — every score's sparse pass on the ISA's f32 kernel.
TEST(FamilyFused, SparseBackwardOfHardmaxAndTopkEqualsTwoPasses) {
  std::mt19937 rng(77);
  for (score_kind s : {score_kind::scaled_dot, score_kind::activated_general, score_kind::additive, score_kind::box,
                       score_kind::triangle})
    for (std::int64_t k : {1, 8, 32, 33})
      for (int mask = 0; mask < 5; ++mask) {
        const distribution_kind d = k == 1 && mask % 2 ? distribution_kind::hardmax : distribution_kind::topk;
        family_case c(s, d, rng, 2, 4, 2, 19, 150, 6, 5);
        c.opt.distribution.k = k;
        apply_mask(c, mask, rng);
        const Tensor q = c.q.to(dtype::f32), kk = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
        const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f32, rng);
        const result ref = run(c, f64(q), f64(kk), f64(v), f64(dout), family_path::reference);
        const std::string what = case_name(s, d) + " k " + std::to_string(k) + " mask " + std::to_string(mask);
        const result sparse = run(c, q, kk, v, dout, family_path::fused, 2);
        expect_close(sparse, ref, 2e-4, what + " sparse");
        setenv("ATTN_FAMILY_BACKWARD", "two_pass", 1);
        const result dense = run(c, q, kk, v, dout, family_path::fused, 2);
        unsetenv("ATTN_FAMILY_BACKWARD");
        expect_close(dense, ref, 2e-4, what + " two passes");
      }
}

// hardmax with the straight-through gradient: forward the one-hot, backward the softmax Jacobian
// at the same scores (dv from the one-hot) — every ISA, dot-like and additive scores, masks, GQA.
TEST(FamilyFused, HardmaxStraightThrough) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(404);
    for (score_kind s : {score_kind::scaled_dot, score_kind::activated_general, score_kind::additive,
                         score_kind::location})
      for (int mask = 0; mask < 5; ++mask) {
        family_case c(s, distribution_kind::hardmax, rng, 2, 4, 2, 13, std::vector<std::int64_t>{1, 9, 140, 17, 133}[std::size_t(mask)], 5, 3);
        c.opt.distribution.hardmax_grad = hardmax_gradient::straight_through;
        apply_mask(c, mask, rng);
        const auto [got, ref] = run_vs_reference(c, rng, family_path::automatic, 2);
        expect_close(got, ref, 2e-4, isa + " " + to_string(s) + " straight-through, mask " + std::to_string(mask));
      }
  }
}

// Nadaraya–Watson with the box and triangle kernels: α = K / Σ K (the `kernel` distribution) on
// squared distances formed as differences, every ISA, bool masks (a row whose keys all fall
// outside the bandwidth, or are masked, gives zeros), padding, GQA; dq, dk, dv and dbandwidth.
TEST(FamilyFused, KernelDistributionOfBoxAndTriangle) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(505);
    for (score_kind s : {score_kind::box, score_kind::triangle})
      for (int mask = 0; mask < 4; ++mask) {
        const std::int64_t Nq = std::vector<std::int64_t>{1, 9, 70, 13}[std::size_t(mask)];
        const std::int64_t Nk = std::vector<std::int64_t>{7, 1, 140, 133}[std::size_t(mask)];
        // (head size 16: box's norms W keys or rows at a time on avx2 and avx512; 4: one by one)
        family_case c(s, distribution_kind::kernel, rng, 2, 4, 2, Nq, Nk, mask >= 2 ? 16 : 4, 3);
        if (mask >= 2) c.opt.score.bandwidth = 5.0;  // (about half the pairs inside at D 16)
        apply_mask(c, mask, rng);
        const auto [got, ref] = run_vs_reference(c, rng, family_path::automatic, 2);
        expect_close(got, ref, 2e-4, isa + " " + case_name(s, distribution_kind::kernel) + " mask " + std::to_string(mask));
      }
  }
}

// Box scores come from the products of the register tile where they lie clearly on one side of
// h², from the differences elsewhere (family_body.h, box_by_products). Queries of norm ≈ 1000 and
// keys at h·(1 ± 0.01) from one of them: the products alone err by up to ≈ 4·D·2^-24·2·10^6 ≈ 8,
// far beyond the margin of 0.03 around h² = 1.44, so without the fallback many pairs would land
// on the wrong side; the kernel gives the reference's K (forward, and dv from the dk/dv pass).
TEST(FamilyFused, BoxNearTheBandwidthWithLargeNorms) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(77);
    std::normal_distribution<double> n01(0.0, 1.0);
    const std::int64_t Nq = 37, Nk = 150, D = 16;
    family_case c(score_kind::box, distribution_kind::kernel, rng, 1, 2, 1, Nq, Nk, D, 3);
    const double h = c.opt.score.bandwidth;
    std::vector<double> center(static_cast<std::size_t>(D));
    double cn = 0;
    for (double& x : center) x = n01(rng), cn += x * x;
    for (double& x : center) x *= 1000.0 / std::sqrt(cn);
    for (std::int64_t hq = 0; hq < 2; ++hq)
      for (std::int64_t i = 0; i < Nq; ++i)
        for (std::int64_t d = 0; d < D; ++d)
          c.q.set({0, hq, i, d}, double(float(center[std::size_t(d)] + 0.3 * n01(rng))));
    for (std::int64_t j = 0; j < Nk; ++j) {
      std::vector<double> u(static_cast<std::size_t>(D));
      double un = 0;
      for (double& x : u) x = n01(rng), un += x * x;
      const double r = h * (j % 2 ? 1.01 : 0.99) / std::sqrt(un);
      for (std::int64_t d = 0; d < D; ++d)  // about h from query j % Nq of head 0
        c.k.set({0, 0, j, d}, double(float(c.q.get({0, 0, j % Nq, d}) + r * u[std::size_t(d)])));
    }
    const auto [got, ref] = run_vs_reference(c, rng, family_path::fused, 2);
    expect_close(got, ref, 2e-4, isa + " box near h");
    // Some pairs are inside the support and some just outside: the test can tell sides apart.
    std::int64_t inside = 0;
    for (std::int64_t j = 0; j < Nk; ++j) {
      double d2 = 0;
      for (std::int64_t d = 0; d < D; ++d) {
        const double e = c.q.get({0, 0, j % Nq, d}) - c.k.get({0, 0, j, d});
        d2 += e * e;
      }
      inside += d2 <= h * h;
    }
    EXPECT_GT(inside, 40);
    EXPECT_LT(inside, 110);
  }
}

// The triangle kernel's dq and dk come from products (2(q Σ dz − Kᵀ dz), family_body.h,
// distance_products) only where every pair inside the support has ρ ≥ ‖q‖/8. Here queries of
// norm ≈ 10⁵ each have keys 0.2h–0.9h away (h = 4): the products would cancel to about
// 2^-24·10⁵·Σ|dz| — an error far past the tolerance next to ρ·Σ|dz| — so these blocks take the
// differences, against the reference, for the kernel and sigmoid distributions, 2 threads: the
// two passes (dq in the lane layout, dk in the row layout), and the single pass from the
// forward's statistics (kernel; 8 (b, hkv) units: dq and dk in the row layout).
TEST(FamilyFused, TriangleGradientsWithKeysCloseAtLargeNorms) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(91);
    std::normal_distribution<double> n01(0.0, 1.0);
    std::uniform_real_distribution<double> frac(0.2, 0.9);
    for (distribution_kind d : {distribution_kind::kernel, distribution_kind::sigmoid}) {
      const std::int64_t B = 2, Hq = 8, Hkv = 4, Nq = 37, Nk = 150, D = 16;
      family_case c(score_kind::triangle, d, rng, B, Hq, Hkv, Nq, Nk, D, 3);
      const double h = 4.0;
      c.opt.score.bandwidth = h;
      std::vector<double> center(static_cast<std::size_t>(D));
      double cn = 0;
      for (double& x : center) x = n01(rng), cn += x * x;
      for (double& x : center) x *= 1e5 / std::sqrt(cn);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t hq = 0; hq < Hq; ++hq)
          for (std::int64_t i = 0; i < Nq; ++i)
            for (std::int64_t x = 0; x < D; ++x)
              c.q.set({b, hq, i, x}, double(float(center[std::size_t(x)] + n01(rng))));
      std::int64_t inside = 0;
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t hkv = 0; hkv < Hkv; ++hkv)
          for (std::int64_t j = 0; j < Nk; ++j) {
            const std::int64_t hq = hkv * (Hq / Hkv), i = j % Nq;
            std::vector<double> u(static_cast<std::size_t>(D));
            double un = 0;
            for (double& x : u) x = n01(rng), un += x * x;
            const double r = h * frac(rng) / std::sqrt(un);
            double d2 = 0;
            for (std::int64_t x = 0; x < D; ++x) {  // inside the support of query i of head hq
              c.k.set({b, hkv, j, x}, double(float(c.q.get({b, hq, i, x}) + r * u[std::size_t(x)])));
              const double e = c.q.get({b, hq, i, x}) - c.k.get({b, hkv, j, x});
              d2 += e * e;
            }
            inside += d2 < h * h;
          }
      EXPECT_EQ(inside, B * Hkv * Nk);
      const std::string what = isa + " " + case_name(score_kind::triangle, d) + " close at large norms";
      const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
      const Tensor dout = random_tensor({B, Hq, Nq, c.Dv}, dtype::f32, rng);
      const result ref = run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference);
      expect_close(run(c, q, k, v, dout, family_path::fused, 2), ref, 2e-4, what + ", two passes");
      if (d != distribution_kind::kernel) continue;
      const execution e{.path = family_path::fused, .num_threads = 2};
      const family_result fwd = attention_family(q, k, v, c.opt, e);
      expect_close(result{fwd, attention_family_backward(q, k, v, dout, fwd, c.opt, e)}, ref, 2e-4,
                   what + ", single pass");
    }
  }
}

TEST(FamilyFused, EmptyShapes) {
  std::mt19937 rng(5);
  for (auto [Nq, Nk] : {std::pair<std::int64_t, std::int64_t>{0, 4}, {3, 0}, {0, 0}})
    for (distribution_kind d : kFused) {
      family_case c(score_kind::scaled_dot, d, rng, 1, 2, 1, Nq, Nk, 4, 3);
      const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
      const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f32, rng);
      expect_close(run(c, q, k, v, dout, family_path::fused),
                   run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference), 1e-6,
                   to_string(d) + " Nq " + std::to_string(Nq) + " Nk " + std::to_string(Nk));
    }
}

// bf16 and f16 inputs are converted to f32 on entry: the result is the reference's on the
// rounded inputs, returned in the input dtype.
TEST(FamilyFused, LowerPrecisionInputs) {
  std::mt19937 rng(8);
  for (dtype t : {dtype::bf16, dtype::f16})
    for (distribution_kind d : {distribution_kind::sigmoid, distribution_kind::entmax15}) {
      family_case c(score_kind::general, d, rng, 1, 2, 2, 9, 11, 4, 3);
      const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t), dout = random_tensor({1, 2, 9, 3}, t, rng);
      const result got = run(c, q, k, v, dout, family_path::automatic);
      EXPECT_EQ(got.fwd.out.type(), t);
      expect_close(got, run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference), tolerance_for(t),
                   std::string(dtype_name(t)) + " " + to_string(d));
    }
}

// The checks of a fused forward on bf16 products (`got`, run with e): within tol of the
// reference on the rounded inputs and of the same call with f32 products (ATTN_FAMILY_BF16=0),
// and the bits of one thread.
void expect_bf16_forward(const family_result& got, const Tensor& q, const Tensor& k, const Tensor& v,
                         const family_options& opt, const execution& e, double tol) {
  const family_result ref = attention_family(f64(q), f64(k), f64(v), opt, {.path = family_path::reference});
  EXPECT_TRUE(all_close(got.out, ref.out, tol)) << got.path;
  EXPECT_TRUE(same_bits(attention_family(q, k, v, opt, {.path = family_path::fused, .num_threads = 1}).out, got.out));
  setenv("ATTN_FAMILY_BF16", "0", 1);
  const family_result f32 = attention_family(q, k, v, opt, e);
  unsetenv("ATTN_FAMILY_BF16");
  EXPECT_EQ(f32.path.find("bf16 products"), std::string::npos);
  EXPECT_TRUE(all_close(got.out, f32.out, tol));
}

// One case of the bf16-products tests: the fused forward on 2 threads, which names its bf16
// products on avx512bf16, checked by expect_bf16_forward; whether it took them.
bool bf16_products_case(const std::string& isa, const Tensor& q, const Tensor& k, const Tensor& v,
                        const family_options& opt) {
  const execution e{.path = family_path::fused, .num_threads = 2};
  const family_result got = attention_family(q, k, v, opt, e);
  if (isa == "avx512bf16") {
    EXPECT_NE(got.path.find("bf16 products"), std::string::npos) << got.path;
  }
  expect_bf16_forward(got, q, k, v, opt, e, tolerance_for(dtype::bf16));
  return got.path.find("bf16 products") != std::string::npos;
}

// bf16 inputs of dot scores (dot, scaled_dot) take bf16 products on an ISA with a bf16 dot
// product (q·k exact, α rounded to bf16 for the product with V): every distribution, every
// mask kind (windows make rows start on odd keys), GQA, key ranges over several key blocks, odd
// Nk, against the reference on the rounded inputs and against the same call with f32 products
// (ATTN_FAMILY_BF16=0); threads give the same bits.
TEST(FamilyFused, Bf16ProductsMatchReference) {
  bool saw_pairs = false;
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(61);
    for (distribution_kind d : kFused)
      for (int mask = 0; mask < 5; ++mask) {
        const std::int64_t Nq = std::vector<std::int64_t>{1, 6, 9, 17, 33}[std::size_t(mask)];
        const std::int64_t Nk = std::vector<std::int64_t>{1, 7, 300, 61, 133}[std::size_t((mask + int(d)) % 5)];
        const bool gqa = mask % 2;
        family_case c(mask % 3 ? score_kind::scaled_dot : score_kind::dot, d, rng, 2, gqa ? 4 : 2, gqa ? 2 : 2, Nq,
                      Nk, mask == 4 ? 64 : 8, 5);
        if (d == distribution_kind::sigmoid && mask == 4) c.opt.distribution.sigmoid_bias = -0.5;
        apply_mask(c, mask, rng);
        const Tensor q = c.q.to(dtype::bf16), k = c.k.to(dtype::bf16), v = c.v.to(dtype::bf16);
        const std::string what = isa + " " + to_string(d) + " mask " + std::to_string(mask) + " Nq " +
                                 std::to_string(Nq) + " Nk " + std::to_string(Nk);
        SCOPED_TRACE(what);
        saw_pairs |= bf16_products_case(isa, q, k, v, c.opt);
      }
  }
  const std::vector<std::string> all = isas();
  if (std::find(all.begin(), all.end(), "avx512bf16") != all.end()) {
    EXPECT_TRUE(saw_pairs);
  }
}

// Box (or triangle) × kernel with queries of norm ≈ 4500 and keys exactly h from some of them: components 0-7
// of q on a grid of 8 in [1040, 2032] (bf16 steps of 8 there), 8-15 in [0.5, 1) (steps of 2^-8);
// key j is query j % Nq with 3, 4 or 5 of its large components moved by ±8 (z = 192, 256 = h²,
// 320). `inside`: the keys with z <= h².
family_case box_on_the_bandwidth(std::mt19937& rng, std::int64_t Dv, std::int64_t& inside,
                                 score_kind score = score_kind::box) {
  const std::int64_t Nq = 37, Nk = 150, D = 16;
  family_case c(score, distribution_kind::kernel, rng, 1, 2, 1, Nq, Nk, D, Dv);
  c.opt.score.bandwidth = 16.0;
  std::uniform_int_distribution<int> grid(130, 254), pick(0, 2);
  for (std::int64_t hq = 0; hq < 2; ++hq)
    for (std::int64_t i = 0; i < Nq; ++i)
      for (std::int64_t x = 0; x < D; ++x) c.q.set({0, hq, i, x}, x < D / 2 ? 8.0 * grid(rng) : grid(rng) / 256.0);
  inside = 0;
  for (std::int64_t j = 0; j < Nk; ++j) {
    const std::int64_t moved = 3 + pick(rng);
    for (std::int64_t x = 0; x < D; ++x)
      c.k.set({0, 0, j, x}, c.q.get({0, 0, j % Nq, x}) + (x < moved ? (j % 2 ? 8.0 : -8.0) : 0.0));
    inside += moved <= 4;
  }
  return c;
}

// bf16 inputs of the box kernel take bf16 products in the forward on an ISA with a bf16 dot
// product (not on the amx level): q·k from the words, ‖q‖², ‖k‖² and the differences near h² from
// the f32 rows, so the weights are the f32 path's (triangle: the words for α·V alone, its
// scores the f32 path's differences); with masks (windows: rows starting on odd keys,
// the pair past Nk), GQA, odd Nk over several key blocks, against the reference on the rounded
// inputs and the f32 products, threads giving the same bits. Then queries of norm ≈ 4500 with keys
// exactly h from some of them (half the components on a grid of 8 near 1500, moved by ±8: z = 192,
// 256 = h², 320; the other half below 1, equal in q and k): the f32 sums of the products pass
// 2^24 and drop the small components' bits, so only the differences tell those sides apart.
TEST(FamilyFused, Bf16BoxProductsMatchReference) {
  bool saw_pairs = false;
  for (const std::string& isa : isas())
    for (score_kind s : {score_kind::box, score_kind::triangle}) {
      isa_scope scope(isa.c_str());
      std::mt19937 rng(67);
      for (distribution_kind d : {distribution_kind::kernel, distribution_kind::softmax, distribution_kind::sigmoid,
                                  distribution_kind::topk})
        for (int mask = 0; mask < 4; ++mask) {
          const std::int64_t Nq = std::vector<std::int64_t>{1, 6, 9, 33}[std::size_t(mask)];
          const std::int64_t Nk = std::vector<std::int64_t>{1, 7, 300, 133}[std::size_t((mask + int(d)) % 4)];
          const bool gqa = mask % 2;
          family_case c(s, d, rng, 2, gqa ? 4 : 2, 2, Nq, Nk, 8, 5);
          c.opt.score.bandwidth = 2.0;
          apply_mask(c, mask, rng);
          const Tensor q = c.q.to(dtype::bf16), k = c.k.to(dtype::bf16), v = c.v.to(dtype::bf16);
          SCOPED_TRACE(isa + " " + to_string(s) + " " + to_string(d) + " mask " + std::to_string(mask) + " Nq " +
                       std::to_string(Nq) + " Nk " + std::to_string(Nk));
          saw_pairs |= bf16_products_case(isa, q, k, v, c.opt);
        }
      std::int64_t inside = 0;
      const family_case c = box_on_the_bandwidth(rng, 3, inside, s);
      EXPECT_GT(inside, 60);
      EXPECT_LT(inside, 140);
      const Tensor q = c.q.to(dtype::bf16), k = c.k.to(dtype::bf16), v = c.v.to(dtype::bf16);
      SCOPED_TRACE(isa + " " + to_string(s) + " on the bandwidth");
      saw_pairs |= bf16_products_case(isa, q, k, v, c.opt);
    }
  const std::vector<std::string> all = isas();
  if (std::find(all.begin(), all.end(), "avx512bf16") != all.end()) {
    EXPECT_TRUE(saw_pairs);
  }
}

// The box backward with the forward's statistics is dv alone (no gradient reaches box scores);
// with bf16 inputs on an ISA with a bf16 dot product (not the amx level) its pass takes q·k from
// the words and the rest from the f32 rows as the forward does (box_row_finish), and αᵀ dout by
// bf16 products: dq and dk exactly 0, dv against the reference on the rounded inputs and the f32
// products (the same keys reached: zeros where they have zeros), 1 and 2 threads bit for bit —
// masks, GQA, odd Nk over several key blocks, and the large norms on the bandwidth.
TEST(FamilyFused, Bf16BoxBackwardMatchesReference) {
  bool saw_pairs = false;
  const auto check = [&](const std::string& isa, const Tensor& q, const Tensor& k, const Tensor& v,
                         const family_options& opt, std::mt19937& rng) {
    const Tensor dout = random_tensor({q.size(0), q.size(1), q.size(2), v.size(3)}, dtype::bf16, rng);
    const execution e{.path = family_path::fused, .num_threads = 2};
    const family_result fwd = attention_family(q, k, v, opt, e);
    const family_grads got = attention_family_backward(q, k, v, dout, fwd, opt, e);
    saw_pairs |= got.path.find("bf16 products") != std::string::npos;
    if (isa == "avx512bf16") {
      EXPECT_NE(got.path.find("bf16 products"), std::string::npos) << got.path;
    }
    for (const Tensor* g : {&got.dq, &got.dk})
      for (double x : g->to_vector()) ASSERT_EQ(x, 0.0) << got.path;
    const family_grads ref =
        attention_family_backward(f64(q), f64(k), f64(v), f64(dout), opt, {.path = family_path::reference});
    EXPECT_TRUE(all_close(got.dv, ref.dv, 2 * tolerance_for(dtype::bf16))) << got.path;
    const family_result fwd1 = attention_family(q, k, v, opt, {.path = family_path::fused, .num_threads = 1});
    const family_grads one =
        attention_family_backward(q, k, v, dout, fwd1, opt, {.path = family_path::fused, .num_threads = 1});
    EXPECT_TRUE(same_bits(one.dv, got.dv));
    setenv("ATTN_FAMILY_BF16", "0", 1);
    const family_result fwd32 = attention_family(q, k, v, opt, e);
    const family_grads f32 = attention_family_backward(q, k, v, dout, fwd32, opt, e);
    unsetenv("ATTN_FAMILY_BF16");
    EXPECT_EQ(f32.path.find("bf16 products"), std::string::npos);
    EXPECT_TRUE(all_close(got.dv, f32.dv, 2 * tolerance_for(dtype::bf16)));
    const std::vector<double> a = got.dv.to_vector(), b = f32.dv.to_vector();
    for (std::size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i] == 0.0, b[i] == 0.0) << "dv " << i << " " << got.path;
  };
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(71);
    for (distribution_kind d : {distribution_kind::kernel, distribution_kind::softmax})
      for (int mask = 0; mask < 4; ++mask) {
        const std::int64_t Nq = std::vector<std::int64_t>{1, 6, 9, 33}[std::size_t(mask)];
        const std::int64_t Nk = std::vector<std::int64_t>{1, 7, 300, 133}[std::size_t((mask + int(d)) % 4)];
        const bool gqa = mask % 2;
        family_case c(score_kind::box, d, rng, 2, gqa ? 4 : 2, 2, Nq, Nk, 8, mask == 2 ? 6 : 10);
        c.opt.score.bandwidth = 2.0;
        apply_mask(c, mask, rng);
        SCOPED_TRACE(isa + " " + to_string(d) + " mask " + std::to_string(mask) + " Nq " + std::to_string(Nq) + " Nk " +
                     std::to_string(Nk));
        check(isa, c.q.to(dtype::bf16), c.k.to(dtype::bf16), c.v.to(dtype::bf16), c.opt, rng);
      }
    std::int64_t inside = 0;
    const family_case c = box_on_the_bandwidth(rng, 4, inside);
    SCOPED_TRACE(isa + " box on the bandwidth");
    check(isa, c.q.to(dtype::bf16), c.k.to(dtype::bf16), c.v.to(dtype::bf16), c.opt, rng);
  }
  const std::vector<std::string> all = isas();
  if (std::find(all.begin(), all.end(), "avx512bf16") != all.end()) {
    EXPECT_TRUE(saw_pairs);
  }
}

// The triangle kernel with bf16 inputs and dout on an ISA with a bf16 dot product (not the amx
// level): the forward's scores z' = ‖q‖² + ‖k‖² − 2 q·k from the words where z' is within 2^-12
// of z (family_body.h, distance_uncertain), and its backward from the forward's statistics (the
// single pass; B·Hkv >= 8) the same, with dP = dO Vᵀ, αᵀ dout and dq, dk as products
// 2(q Σ dz' − Kᵀ dz'), dz' = dz rounded to bf16 (distance_row_products); the differences of the
// f32 rows elsewhere. Against the reference on the rounded inputs (out, dq, dk, dv, dbandwidth)
// and the f32 products (ATTN_FAMILY_BF16=0), 1 and 2 threads bit for bit: every bool mask kind,
// GQA, odd sizes over several key blocks, and queries of norm ≈ 7·10⁷ whose keys differ from them
// in components below 1 alone: z' = 0 there, and dq, dk as products cancel to noise of 2^-24·‖q‖²,
// so those take the differences (either guard taken away fails this case).
TEST(FamilyFused, Bf16TriangleBackwardMatchesReference) {
  bool saw_pairs = false;
  const auto check = [&](const std::string& isa, const family_case& c, std::mt19937& rng) {
    const Tensor q = c.q.to(dtype::bf16), k = c.k.to(dtype::bf16), v = c.v.to(dtype::bf16);
    const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::bf16, rng);
    const execution e{.path = family_path::fused, .num_threads = 2};
    const family_result fwd = attention_family(q, k, v, c.opt, e);
    const family_grads got = attention_family_backward(q, k, v, dout, fwd, c.opt, e);
    saw_pairs |= got.path.find("bf16 products") != std::string::npos;
    if (isa == "avx512bf16") {
      EXPECT_NE(got.path.find("bf16 products"), std::string::npos) << got.path;
    }
    const result ref = run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference);
    expect_close(result{fwd, got}, ref, 2 * tolerance_for(dtype::bf16), isa + " against the reference");
    const family_result fwd1 = attention_family(q, k, v, c.opt, {.path = family_path::fused, .num_threads = 1});
    const family_grads one =
        attention_family_backward(q, k, v, dout, fwd1, c.opt, {.path = family_path::fused, .num_threads = 1});
    EXPECT_TRUE(same_bits(one.dq, got.dq) && same_bits(one.dk, got.dk) && same_bits(one.dv, got.dv));
    EXPECT_EQ(one.dbandwidth, got.dbandwidth);
    setenv("ATTN_FAMILY_BF16", "0", 1);
    const family_result fwd32 = attention_family(q, k, v, c.opt, e);
    const family_grads f32 = attention_family_backward(q, k, v, dout, fwd32, c.opt, e);
    unsetenv("ATTN_FAMILY_BF16");
    EXPECT_EQ(f32.path.find("bf16 products"), std::string::npos);
    for (const auto& [name, a, b] : {std::tuple{"dq", &got.dq, &f32.dq}, {"dk", &got.dk, &f32.dk}, {"dv", &got.dv, &f32.dv}})
      EXPECT_TRUE(all_close(*a, *b, 2 * tolerance_for(dtype::bf16))) << name << " " << got.path;
  };
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(73);
    for (int mask = 0; mask < 4; ++mask) {  // (the kernel weights take bool masks only)
      const std::int64_t Nq = std::vector<std::int64_t>{1, 33, 9, 70}[std::size_t(mask)];
      const std::int64_t Nk = std::vector<std::int64_t>{7, 300, 133, 65}[std::size_t(mask)];
      const bool gqa = mask % 2;
      family_case c(score_kind::triangle, distribution_kind::kernel, rng, 2, gqa ? 8 : 4, 4, Nq, Nk, 16,
                    mask == 2 ? 6 : 10);
      c.opt.score.bandwidth = 3.3;  // (√(2D/3): about half the pairs inside)
      apply_mask(c, mask, rng);
      SCOPED_TRACE(isa + " mask " + std::to_string(mask) + " Nq " + std::to_string(Nq) + " Nk " + std::to_string(Nk));
      check(isa, c, rng);
    }
    // half the components 2^24·(1 + m/128) (on the bf16 grid), the same in every q and k: 0 in
    // every q − k (the other half rounds to bf16 in check), where the products' float32 sums would err by about 2^-24·2^24·Σ|dz|
    // (few keys, and h = 4 against ρ of 1.5–3.5: the weights and gradients far from uniform, so
    // that an α or act′ from z' = 0 would show)
    const std::int64_t Nq = 37, Nk = 13, D = 16;
    family_case c(score_kind::triangle, distribution_kind::kernel, rng, 2, 4, 4, Nq, Nk, D, 6);
    c.opt.score.bandwidth = 4.0;
    std::uniform_int_distribution<int> grid(0, 127);
    std::uniform_real_distribution<double> small(-1.0, 1.0);
    std::vector<double> center(static_cast<std::size_t>(D / 2));
    for (double& x : center) x = 0x1p24 * (1.0 + grid(rng) / 128.0);
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.Hq; ++h)
        for (std::int64_t i = 0; i < Nq; ++i)
          for (std::int64_t x = 0; x < D; ++x) c.q.set({b, h, i, x}, x < D / 2 ? center[std::size_t(x)] : small(rng));
    for (std::int64_t b = 0; b < c.B; ++b)
      for (std::int64_t h = 0; h < c.Hkv; ++h)
        for (std::int64_t j = 0; j < Nk; ++j)
          for (std::int64_t x = 0; x < D; ++x)  // ρ < 2√8 from every query: most inside
            c.k.set({b, h, j, x}, x < D / 2 ? center[std::size_t(x)] : small(rng));
    SCOPED_TRACE(isa + " keys close at large norms");
    check(isa, c, rng);
  }
  const std::vector<std::string> all = isas();
  if (std::find(all.begin(), all.end(), "avx512bf16") != all.end()) {
    EXPECT_TRUE(saw_pairs);
  }
}

// On the amx level the forward of bf16 dot scores runs on AMX tiles (P a multiple of 32, Dv of
// 16): every distribution, every mask kind, GQA, Nk from 1 to past two key blocks (odd, so the
// zero keys and the tiles' padding are read), against the reference on the rounded inputs, the
// same call with f32 products, and 1 against 2 threads bit for bit. Elsewhere the same calls
// take the other levels' paths, checked the same way.
TEST(FamilyFused, Bf16TileForwardMatchesReference) {
  bool saw_tiles = false;
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(67);
    for (distribution_kind d : kFused)
      for (int mask = 0; mask < 5; ++mask) {
        const std::int64_t Nq = std::vector<std::int64_t>{1, 19, 70, 33, 129}[std::size_t(mask)];
        const std::int64_t Nk = std::vector<std::int64_t>{1, 31, 301, 64, 133}[std::size_t((mask + int(d)) % 5)];
        const std::int64_t D = mask % 2 ? 64 : 32, Dv = std::vector<std::int64_t>{16, 48, 32, 64, 16}[std::size_t(mask)];
        const bool gqa = mask % 2;
        family_case c(mask % 3 ? score_kind::scaled_dot : score_kind::dot, d, rng, 2, gqa ? 4 : 2, gqa ? 2 : 2, Nq,
                      Nk, D, Dv);
        if (d == distribution_kind::sigmoid) c.opt.distribution.sigmoid_bias = -0.5;
        apply_mask(c, mask, rng);
        const Tensor q = c.q.to(dtype::bf16), k = c.k.to(dtype::bf16), v = c.v.to(dtype::bf16);
        SCOPED_TRACE(isa + " " + to_string(d) + " mask " + std::to_string(mask) + " Nq " + std::to_string(Nq) + " Nk " +
                     std::to_string(Nk));
        const execution e{.path = family_path::fused, .num_threads = 2};
        const family_result got = attention_family(q, k, v, c.opt, e);
        const bool tiles = got.path.find("AMX tiles") != std::string::npos;
        saw_tiles |= tiles;
        if (isa == "amx") {  // (hardmax and top-k: their kept keys' scores on the tiles)
          EXPECT_TRUE(tiles) << got.path;
        }
        if (isa != "amx") {
          EXPECT_FALSE(tiles) << got.path;
        }
        // identity's weights are not normalised (α = s, sums of O(1) terms that cancel): the bf16
        // rounding of each α adds up over the keys, as √Nk
        const double tol = tolerance_for(dtype::bf16) * (d == distribution_kind::identity ? std::sqrt(double(Nk)) : 1.0);
        expect_bf16_forward(got, q, k, v, c.opt, e, tol);
      }
  }
  const std::vector<std::string> all = isas();
  if (std::find(all.begin(), all.end(), "amx") != all.end()) {
    EXPECT_TRUE(saw_tiles);
  }
}

// On the amx level the row-layout backward pass of bf16 dot scores runs its products on AMX tiles
// (P and Dv multiples of 32): the single pass (sigmoid, identity; softmax from the forward's
// result; B·Hkv >= 8), and the dk/dv pass of the two after the f32 dq pass (sparsemax, entmax15,
// whose r needs every key): every mask kind, GQA, Nq and Nk off the tiles' sizes (1, 9, 17, 65,
// 70, 133, 300), against the reference on the rounded inputs and the f32 products, 1 against 2
// threads bit for bit.
TEST(FamilyFused, Bf16TileBackwardMatchesReference) {
  bool saw_tiles = false;
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(71);
    for (distribution_kind d : {distribution_kind::sigmoid, distribution_kind::identity, distribution_kind::softmax,
                                distribution_kind::sparsemax, distribution_kind::entmax15})
      for (int mask = 0; mask < 5; ++mask) {
        const std::int64_t Nq = std::vector<std::int64_t>{1, 65, 9, 17, 70}[std::size_t(mask)];
        const std::int64_t Nk = std::vector<std::int64_t>{5, 300, 33, 1, 133}[std::size_t((mask + int(d)) % 5)];
        const std::int64_t D = mask % 2 ? 64 : 32, Dv = mask % 3 ? 32 : 64;
        const bool gqa = mask % 2;
        family_case c(mask % 3 ? score_kind::scaled_dot : score_kind::dot, d, rng, 2, gqa ? 8 : 4, 4, Nq, Nk, D, Dv);
        if (d == distribution_kind::sigmoid) c.opt.distribution.sigmoid_bias = -0.5;
        apply_mask(c, mask, rng);
        const Tensor q = c.q.to(dtype::bf16), k = c.k.to(dtype::bf16), v = c.v.to(dtype::bf16);
        const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::bf16, rng);
        SCOPED_TRACE(isa + " " + to_string(d) + " mask " + std::to_string(mask) + " Nq " + std::to_string(Nq) + " Nk " +
                     std::to_string(Nk));
        const auto grads = [&](const execution& e) {
          if (d != distribution_kind::softmax) return attention_family_backward(q, k, v, dout, c.opt, e);
          return attention_family_backward(q, k, v, dout, attention_family(q, k, v, c.opt, e), c.opt, e);
        };
        const execution e{.path = family_path::fused, .num_threads = 2};
        const family_grads got = grads(e);
        const bool tiles = got.path.find("AMX tiles") != std::string::npos;
        saw_tiles |= tiles;
        if (isa == "amx") {
          EXPECT_TRUE(tiles) << got.path;
        } else {
          EXPECT_FALSE(tiles) << got.path;
        }
        // (identity: unnormalised weights, errors that add up over the keys as √Nk)
        const double tol =
            2 * tolerance_for(dtype::bf16) * (d == distribution_kind::identity ? std::sqrt(double(std::max<std::int64_t>(Nk, Nq))) : 1.0);
        const family_grads ref = attention_family_backward(f64(q), f64(k), f64(v), f64(dout), c.opt, {.path = family_path::reference});
        for (const auto& [name, a, b] : {std::tuple{"dq", &got.dq, &ref.dq}, {"dk", &got.dk, &ref.dk}, {"dv", &got.dv, &ref.dv}})
          EXPECT_TRUE(all_close(*a, *b, tol)) << name << " " << got.path;
        const family_grads one = grads({.path = family_path::fused, .num_threads = 1});
        EXPECT_TRUE(same_bits(one.dq, got.dq) && same_bits(one.dk, got.dk) && same_bits(one.dv, got.dv));
        setenv("ATTN_FAMILY_BF16", "0", 1);
        const family_grads f32 = grads(e);
        unsetenv("ATTN_FAMILY_BF16");
        EXPECT_EQ(f32.path.find("bf16 products"), std::string::npos);
        for (const auto& [name, a, b] : {std::tuple{"dq", &got.dq, &f32.dq}, {"dk", &got.dk, &f32.dk}, {"dv", &got.dv, &f32.dv}})
          EXPECT_TRUE(all_close(*a, *b, tol)) << name << " against f32 products";
      }
  }
  const std::vector<std::string> all = isas();
  if (std::find(all.begin(), all.end(), "amx") != all.end()) {
    EXPECT_TRUE(saw_tiles);
  }
}

// The backward of bf16 dot scores takes bf16 products in its row-layout pass: the whole single
// pass (sigmoid, identity; B·Hkv >= 8), the dk/dv pass of the two passes (the other
// distributions, and sigmoid with fewer (b, hkv)); α and dz rounded to bf16 for the products that
// take them. Gradients against the reference on the rounded inputs and against f32 products,
// masks, GQA, odd sizes, threads.
TEST(FamilyFused, Bf16ProductsBackwardMatchReference) {
  bool saw_pairs = false;
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(67);
    for (distribution_kind d : {distribution_kind::sigmoid, distribution_kind::identity, distribution_kind::softmax,
                                distribution_kind::sparsemax, distribution_kind::entmax15})
      for (int mask = 0; mask < 5; ++mask) {
        const std::int64_t Nq = std::vector<std::int64_t>{1, 65, 9, 17, 70}[std::size_t(mask)];
        const std::int64_t Nk = std::vector<std::int64_t>{5, 300, 33, 1, 133}[std::size_t(mask)];
        const bool gqa = mask % 2;
        family_case c(mask % 3 ? score_kind::scaled_dot : score_kind::dot, d, rng, 2, gqa ? 8 : 4, mask == 3 ? 2 : 4,
                      Nq, Nk, mask == 4 ? 64 : 8, mask == 2 ? 6 : 10);
        if (d == distribution_kind::sigmoid && mask == 4) c.opt.distribution.sigmoid_bias = -0.5;
        apply_mask(c, mask, rng);
        const Tensor q = c.q.to(dtype::bf16), k = c.k.to(dtype::bf16), v = c.v.to(dtype::bf16);
        const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::bf16, rng);
        const std::string what = isa + " " + to_string(d) + " mask " + std::to_string(mask) + " Nq " +
                                 std::to_string(Nq) + " Nk " + std::to_string(Nk);
        SCOPED_TRACE(what);
        const execution e{.path = family_path::fused, .num_threads = 2};
        const family_grads got = attention_family_backward(q, k, v, dout, c.opt, e);
        saw_pairs |= got.path.find("bf16 products") != std::string::npos;
        if (isa == "avx512bf16") {
          EXPECT_NE(got.path.find("bf16 products"), std::string::npos) << got.path;
        }
        const family_grads ref = attention_family_backward(f64(q), f64(k), f64(v), f64(dout), c.opt, {.path = family_path::reference});
        for (const auto& [name, a, b] : {std::tuple{"dq", &got.dq, &ref.dq}, {"dk", &got.dk, &ref.dk}, {"dv", &got.dv, &ref.dv}})
          EXPECT_TRUE(all_close(*a, *b, 2 * tolerance_for(dtype::bf16))) << name << " " << got.path;
        const family_grads one = attention_family_backward(q, k, v, dout, c.opt, {.path = family_path::fused, .num_threads = 1});
        EXPECT_TRUE(same_bits(one.dq, got.dq) && same_bits(one.dk, got.dk) && same_bits(one.dv, got.dv));
        setenv("ATTN_FAMILY_BF16", "0", 1);
        const family_grads f32 = attention_family_backward(q, k, v, dout, c.opt, e);
        unsetenv("ATTN_FAMILY_BF16");
        EXPECT_EQ(f32.path.find("bf16 products"), std::string::npos);
        EXPECT_TRUE(all_close(got.dq, f32.dq, 2 * tolerance_for(dtype::bf16)));
        EXPECT_TRUE(all_close(got.dk, f32.dk, 2 * tolerance_for(dtype::bf16)));
        EXPECT_TRUE(all_close(got.dv, f32.dv, 2 * tolerance_for(dtype::bf16)));
      }
  }
  const std::vector<std::string> all = isas();
  if (std::find(all.begin(), all.end(), "avx512bf16") != all.end()) {
    EXPECT_TRUE(saw_pairs);
  }
}

// With v the identity (Dv = Nk), out_i is α_i itself: the fused path's zeros must be exactly
// the reference's on well-separated scores.
TEST(FamilyFused, SameSupportAsReference) {
  std::mt19937 rng(21);
  for (distribution_kind d :
       {distribution_kind::sparsemax, distribution_kind::entmax15, distribution_kind::hardmax, distribution_kind::topk})
    for (std::int64_t Nk : {1, 6, 29, 140}) {
      family_case c(score_kind::scaled_dot, d, rng, 1, 2, 1, 19, Nk, 6, Nk);
      c.opt.score.scale = 2.5;
      c.opt.distribution.k = 4;
      std::vector<double> eye(std::size_t(Nk * Nk), 0.0);
      for (std::int64_t j = 0; j < Nk; ++j) eye[std::size_t(j * Nk + j)] = 1.0;
      const Tensor v = Tensor::from_values({1, 1, Nk, Nk}, dtype::f32, eye);
      const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32);
      const Tensor got = attention_family(q, k, v, c.opt, {.path = family_path::fused}).out;
      const Tensor want = attention_family_weights(f64(q), f64(k), f64(v), c.opt);
      const auto g = got.to_vector(), w = want.to_vector();
      ASSERT_EQ(g.size(), w.size());
      std::size_t zeros = 0;
      for (std::size_t x = 0; x < g.size(); ++x) {
        EXPECT_EQ(g[x] == 0.0, w[x] == 0.0) << to_string(d) << " Nk " << Nk << " at " << x << ": " << g[x] << " vs " << w[x];
        EXPECT_NEAR(g[x], w[x], 2e-5);
        zeros += w[x] == 0.0;
      }
      if (Nk > 6) {
        EXPECT_GT(zeros, 0u) << to_string(d) << ": the case has no zero to check";
      }
    }
}

// sparsemax and entmax15 on scores far from zero (s = -2304 + 3j/16, exact in float32): α depends
// only on the differences, so it must come out as exact as near zero. τ was once kept as max + τ,
// whose float32 rounding (ulp 2.4e-4 at 2304) put 5e-4 on α = 1/6 (family_fuzz, all inputs -4).
TEST(FamilyFused, SparseDistributionsFarFromZero) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    for (distribution_kind d : {distribution_kind::sparsemax, distribution_kind::entmax15})
      for (double step : {0.0, 3.0 / 16}) {
        const std::int64_t Nk = 6;
        family_options o;
        o.score.kind = score_kind::dot;
        o.distribution.kind = d;
        std::vector<double> kv, eye(std::size_t(Nk * Nk), 0.0);
        for (std::int64_t j = 0; j < Nk; ++j) kv.push_back(-48.0 + step * double(j) / 48.0), eye[std::size_t(j * Nk + j)] = 1.0;
        const Tensor q = Tensor::from_values({1, 1, 1, 1}, dtype::f32, {48.0});
        const Tensor k = Tensor::from_values({1, 1, Nk, 1}, dtype::f32, kv);
        const Tensor v = Tensor::from_values({1, 1, Nk, Nk}, dtype::f32, eye);
        const Tensor dout = Tensor::from_values({1, 1, 1, Nk}, dtype::f32, {1.0, -2.0, 0.5, 3.0, -1.0, 0.25});
        const std::string what = isa + " " + std::string(to_string(d)) + " step " + std::to_string(step);
        const auto run_o = [&](const Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& d_, family_path p) {
          const execution e{.path = p, .num_threads = 1};
          return result{attention_family(q_, k_, v_, o, e), attention_family_backward(q_, k_, v_, d_, o, e)};
        };
        const result got = run_o(q, k, v, dout, family_path::fused);
        const result ref = run_o(f64(q), f64(k), f64(v), f64(dout), family_path::reference);
        const auto g = got.fwd.out.to_vector(), w = ref.fwd.out.to_vector();
        double sum = 0;
        for (std::size_t x = 0; x < g.size(); ++x) {
          EXPECT_NEAR(g[x], w[x], 2e-6) << what << " alpha " << x;
          sum += g[x];
        }
        EXPECT_NEAR(sum, 1.0, 2e-6) << what;
        const auto gk = got.g.dk.to_vector(), wk = ref.g.dk.to_vector();
        for (std::size_t x = 0; x < gk.size(); ++x) EXPECT_NEAR(gk[x], wk[x], 2e-4 * (1 + std::abs(wk[x]))) << what << " dk " << x;
      }
  }
}

// Top-k at and above the vector selection's limit (k = 16), and exact ties: rows whose query is
// zero score every key 0, and the first k keys must win (hardmax: the first).
TEST(FamilyFused, TopkLargeKAndTies) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(9);
    for (std::int64_t kk : {1, 16, 17, 40, 200})
      for (int mask : {0, 3}) {
        family_case c(score_kind::scaled_dot, distribution_kind::topk, rng, 1, 2, 1, 7, 133, 4, 133);
        c.opt.distribution.k = kk;
        apply_mask(c, mask, rng);
        for (std::int64_t x = 0; x < c.D; ++x) c.q.set({0, 0, 2, x}, 0.0), c.q.set({0, 1, 4, x}, 0.0);
        std::vector<double> eye(133 * 133, 0.0);
        for (std::int64_t j = 0; j < 133; ++j) eye[std::size_t(j * 133 + j)] = 1.0;
        const Tensor v = Tensor::from_values({1, 1, 133, 133}, dtype::f32, eye);
        const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32);
        const Tensor dout = random_tensor({1, 2, 7, 133}, dtype::f32, rng);
        const std::string what = isa + " k " + std::to_string(kk) + " mask " + std::to_string(mask);
        const result got = run(c, q, k, v, dout, family_path::fused);
        const result ref = run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference);
        expect_close(got, ref, 2e-4, what);
        const auto g = got.fwd.out.to_vector(), w = ref.fwd.out.to_vector();
        for (std::size_t x = 0; x < g.size(); ++x) EXPECT_EQ(g[x] == 0.0, w[x] == 0.0) << what << " at " << x;
      }
  }
}

// dot and scaled_dot read the user's views directly (fused_source::direct): the same bits as the
// float64-prepared route of `general` with W = scale·I (Qp = scale·q rounded once either way, dq
// = scale·dQp), in every dtype; strided and 3-D views give the bits of contiguous 4-D ones.
TEST(FamilyFused, DirectRouteIsThePreparedRouteOnTheUsersViews) {
  std::mt19937 rng(31);
  for (dtype t : {dtype::f32, dtype::bf16, dtype::f16})
    for (distribution_kind d : {distribution_kind::sigmoid, distribution_kind::sparsemax, distribution_kind::topk}) {
      const std::string what = std::string(dtype_name(t)) + " " + to_string(d);
      SCOPED_TRACE(what);
      family_case c(score_kind::scaled_dot, d, rng, 2, 4, 2, 9, 21, 6, 5);
      const double scale = 0.75;
      c.opt.score.scale = scale, c.opt.is_causal = true;
      const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t), dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, t, rng);
      const result got = run(c, q, k, v, dout, family_path::automatic);
      expect_close(got, run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference), tolerance_for(t), what);
      EXPECT_EQ(got.fwd.out.type(), t);
      EXPECT_EQ(got.g.dq.type(), t);

      family_case g = c;
      std::vector<double> w(std::size_t(c.D * c.D), 0.0);
      for (std::int64_t x = 0; x < c.D; ++x) w[std::size_t(x * c.D + x)] = scale;
      g.W = Tensor::from_values({c.D, c.D}, dtype::f64, w);
      g.opt.score.kind = score_kind::general, g.opt.score.scale.reset(), g.opt.score.W = g.W.view();
      const result prepared = run(g, q, k, v, dout, family_path::automatic);
      ASSERT_EQ(prepared.fwd.path.rfind("fused", 0), 0u);
      // bf16 inputs of a dot score take bf16 products where the ISA has them (α rounded to
      // bf16 for the product with V); the prepared route (general) multiplies in f32.
      if (got.fwd.path.find("bf16 products") != std::string::npos)
        EXPECT_TRUE(all_close(got.fwd.out, prepared.fwd.out, tolerance_for(t))) << "out, bf16 products";
      else
        EXPECT_TRUE(same_bits(got.fwd.out, prepared.fwd.out)) << "out";
      EXPECT_TRUE(same_bits(got.g.dq, prepared.g.dq)) << "dq";
      EXPECT_TRUE(same_bits(got.g.dk, prepared.g.dk)) << "dk";
      EXPECT_TRUE(same_bits(got.g.dv, prepared.g.dv)) << "dv";

      const strided_copy qs(q), ks(k), vs(v), ds(dout);
      ASSERT_FALSE(qs.view.is_contiguous());
      const execution e{.path = family_path::fused};
      EXPECT_TRUE(same_bits(attention_family(qs.view, ks.view, vs.view, c.opt, e).out, got.fwd.out)) << "strided out";
      const family_grads gs = attention_family_backward(qs.view, ks.view, vs.view, ds.view, c.opt, e);
      EXPECT_TRUE(same_bits(gs.dq, got.g.dq)) << "strided dq";
      EXPECT_TRUE(same_bits(gs.dk, got.g.dk)) << "strided dk";
      EXPECT_TRUE(same_bits(gs.dv, got.g.dv)) << "strided dv";

      family_options o3 = c.opt;
      o3.q_num_heads = c.Hq, o3.kv_num_heads = c.Hkv;
      const Tensor q3 = to3(q), k3 = to3(k), v3 = to3(v), d3 = to3(dout);
      EXPECT_TRUE(same_bits(attention_family(q3, k3, v3, o3, e).out, to3(got.fwd.out))) << "3-D out";
      const family_grads g3 = attention_family_backward(q3, k3, v3, d3, o3, e);
      EXPECT_TRUE(same_bits(g3.dq, to3(got.g.dq))) << "3-D dq";
      EXPECT_TRUE(same_bits(g3.dk, to3(got.g.dk))) << "3-D dk";
      EXPECT_TRUE(same_bits(g3.dv, to3(got.g.dv))) << "3-D dv";
    }
}

// Sparse rows' outputs (Σ α v over the kept keys, family_kept_out) with V's elements apart (a
// transposed view: the bf16 rows are copied whole first) give the bits of contiguous V, at every
// ISA level, for V rows a whole number of vectors wide and not.
TEST(FamilyFused, SparseRowsReadElementStridedValues) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(404);
    for (dtype t : {dtype::f32, dtype::bf16})
      for (distribution_kind d : {distribution_kind::topk, distribution_kind::hardmax})
        for (std::int64_t Dv : {std::int64_t(5), std::int64_t(32), std::int64_t(37)}) {
          const std::string what = isa + " " + std::string(dtype_name(t)) + " " + to_string(d) + " Dv " + std::to_string(Dv);
          SCOPED_TRACE(what);
          family_case c(score_kind::scaled_dot, d, rng, 2, 4, 2, 7, 19, 8, Dv);
          c.opt.distribution.k = 3;
          const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t);
          // [B, Hkv, Dv, Nk] holding vᵀ, viewed as [B, Hkv, Nk, Dv]: element stride Nk.
          Tensor vt = Tensor::zeros({c.B, c.Hkv, Dv, c.Nk}, t);
          const TensorView vv = vt.view().permute({0, 1, 3, 2});
          for (std::int64_t b = 0; b < c.B; ++b)
            for (std::int64_t h = 0; h < c.Hkv; ++h)
              for (std::int64_t n = 0; n < c.Nk; ++n)
                for (std::int64_t y = 0; y < Dv; ++y) vv.set({b, h, n, y}, v.get({b, h, n, y}));
          const execution e{.path = family_path::fused};
          const family_result dense = attention_family(q, k, v, c.opt, e);
          ASSERT_EQ(dense.path.rfind("fused", 0), 0u);
          EXPECT_TRUE(same_bits(attention_family(q.view(), k.view(), vv, c.opt, e).out, dense.out));
          const family_result want =
              attention_family(f64(q), f64(k), f64(v), c.opt, {.path = family_path::reference});
          EXPECT_TRUE(all_close(dense.out, want.out, tolerance_for(t)));
        }
  }
}

// Sigmoid has no row statistics: with B·Hkv >= 8 the backward is one pass per (b, hkv) that
// accumulates dq from the same dz as dk (ATTN_FAMILY_BACKWARD=two_pass forces the two passes).
// Against the reference and the two passes at every ISA level, every mask kind, GQA, activations
// (dbias) and sigmoid_bias; bitwise identical for any thread count.
TEST(FamilyFused, SinglePassSigmoidBackward) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(77);
    for (distribution_kind d : {distribution_kind::sigmoid, distribution_kind::identity})
    for (const score_case& sc : {score_case{score_kind::scaled_dot}, score_case{score_kind::general},
                                 score_case{score_kind::activated_general, score_activation::tanh}})
      for (int mask = 0; mask < 5; ++mask) {
        const std::int64_t Nq = mask == 2 ? 70 : 19, Nk = std::vector<std::int64_t>{150, 1, 133, 64, 97}[std::size_t(mask)];
        family_case c(sc.s, d, rng, 2, 8, 4, Nq, Nk, 5, 3);
        c.opt.score.activation = sc.act;
        c.opt.distribution.sigmoid_bias = -1.5;
        apply_mask(c, mask, rng);
        const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
        const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f32, rng);
        const std::string what = isa + " " + case_name(sc.s, d) + " mask " + std::to_string(mask);
        const result got = run(c, q, k, v, dout, family_path::fused);
        expect_close(got, run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference), 2e-4, what);
        setenv("ATTN_FAMILY_BACKWARD", "two_pass", 1);
        const result two = run(c, q, k, v, dout, family_path::fused);
        unsetenv("ATTN_FAMILY_BACKWARD");
        expect_family_close(got.fwd, got.g, two.fwd, two.g, 1e-5);
        for (int t : {2, 3}) {
          const result many = run(c, q, k, v, dout, family_path::fused, t);
          EXPECT_TRUE(same_bits(many.g.dq, got.g.dq)) << what << " threads " << t;
          EXPECT_TRUE(same_bits(many.g.dk, got.g.dk)) << what << " threads " << t;
          EXPECT_TRUE(same_bits(many.g.dv, got.g.dv)) << what << " threads " << t;
          EXPECT_EQ(many.g.dsigmoid_bias, got.g.dsigmoid_bias) << what << " threads " << t;
          if (got.g.db.defined()) {
            EXPECT_TRUE(same_bits(many.g.db, got.g.db)) << what << " threads " << t;
          }
        }
      }
  }
}

// The fused backward from the forward's result at 2 and 3 threads gives the bits `want` (one
// thread) holds: dq, dk, dv and, where computed, dw_v, db and dsigmoid_bias.
void expect_same_bits_at_threads(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                 const family_options& o, const family_grads& want) {
  for (int t : {2, 3}) {
    const execution et{.path = family_path::fused, .num_threads = t};
    const family_grads many = attention_family_backward(q, k, v, dout, attention_family(q, k, v, o, et), o, et);
    EXPECT_TRUE(same_bits(many.dq, want.dq)) << "threads " << t;
    EXPECT_TRUE(same_bits(many.dk, want.dk)) << "threads " << t;
    EXPECT_TRUE(same_bits(many.dv, want.dv)) << "threads " << t;
    if (want.dw_v.defined()) {
      EXPECT_TRUE(same_bits(many.dw_v, want.dw_v)) << "threads " << t;
    }
    if (want.db.defined()) {
      EXPECT_TRUE(same_bits(many.db, want.db)) << "threads " << t;
    }
    EXPECT_EQ(many.dsigmoid_bias, want.dsigmoid_bias) << "threads " << t;
  }
}

// Multi-dimensional additive (w_v [Dv, A]) in one backward pass per (b, hkv) — softmax from the
// forward's lse [B, Hq, Nq, Dv] (r = dout[c]·out[c] per feature), sigmoid and identity from no
// statistics — where B·Hkv >= 8: each pair's t, e = W_v t and dt = W_vᵀ de are formed once for
// dq, dk, dv and dw_v. Against the float64 reference and the two passes
// (ATTN_FAMILY_BACKWARD=two_pass) at every ISA level and mask kind, GQA, A and Dv not multiples
// of any vector width (A 37 > 2·16 walks the transpose-adds of several feature blocks), both
// tanh forms; the same bits for any thread count; an lse shifted by 0.5 changes dv.
TEST(FamilyFused, MultiDimensionalBackwardInOnePass) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(505);
    for (distribution_kind d : {distribution_kind::softmax, distribution_kind::sigmoid, distribution_kind::identity})
      for (int mask = 0; mask < 5; ++mask) {
        const std::int64_t Nq = mask == 2 ? 70 : 19, Nk = std::vector<std::int64_t>{150, 1, 133, 64, 97}[std::size_t(mask)];
        const std::int64_t Dv = mask % 2 ? 17 : 3, A = mask == 2 || mask == 3 ? 37 : 5;
        family_case c(score_kind::additive, d, rng, 2, 8, 4, Nq, Nk, 5, Dv, /*multi_dim=*/true);
        c.W_q = random_tensor({A, c.D}, dtype::f64, rng), c.W_k = random_tensor({A, c.Dk}, dtype::f64, rng);
        c.w_v = random_tensor({Dv, A}, dtype::f64, rng, -1.5, 1.5), c.b = random_tensor({A}, dtype::f64, rng);
        c.opt.score.W_q = c.W_q.view(), c.opt.score.W_k = c.W_k.view(), c.opt.score.w_v = c.w_v.view();
        c.opt.score.b = c.b.view();
        if (d == distribution_kind::sigmoid) c.opt.distribution.sigmoid_bias = -0.5;
        apply_mask(c, mask, rng);
        const bool tanh_form = mask % 2 == 1;
        if (tanh_form) setenv("ATTN_FAMILY_ADDITIVE", "tanh", 1);
        struct unset_additive {
          ~unset_additive() { unsetenv("ATTN_FAMILY_ADDITIVE"); }
        } unset_at_end;
        const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
        const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f32, rng);
        const std::string what = isa + " multi-dimensional additive x " + to_string(d) + " mask " +
                                 std::to_string(mask) + " A " + std::to_string(A) + " Dv " + std::to_string(Dv) +
                                 (tanh_form ? " tanh" : "");
        SCOPED_TRACE(what);
        const execution e{.path = family_path::fused};
        const family_result fwd = attention_family(q, k, v, c.opt, e);
        if (d == distribution_kind::softmax) {
          ASSERT_TRUE(fwd.lse.defined());
          EXPECT_EQ(fwd.lse.shape(), (Shape{c.B, c.Hq, c.Nq, Dv}));
        } else {
          EXPECT_FALSE(fwd.lse.defined());
        }
        const result got{fwd, attention_family_backward(q, k, v, dout, fwd, c.opt, e)};
        expect_close(got, run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference), 2e-4, what);
        EXPECT_EQ(got.g.dw_v.shape(), (Shape{Dv, A}));
        setenv("ATTN_FAMILY_BACKWARD", "two_pass", 1);
        const family_grads two = attention_family_backward(q, k, v, dout, fwd, c.opt, e);
        unsetenv("ATTN_FAMILY_BACKWARD");
        expect_family_close(got.fwd, got.g, got.fwd, two, 2e-5);
        expect_same_bits_at_threads(q, k, v, dout, c.opt, got.g);
        if (d != distribution_kind::softmax || mask != 0) continue;
        family_result shifted = fwd;
        shifted.lse = Tensor::copy_of(fwd.lse);
        for (std::int64_t i = 0; i < shifted.lse.numel(); ++i) static_cast<float*>(shifted.lse.data())[i] += 0.5f;
        const family_grads moved = attention_family_backward(q, k, v, dout, shifted, c.opt, e);
        EXPECT_FALSE(all_close(moved.dv, got.g.dv, 1e-3)) << "a shifted lse must change dv";
        family_result wrong = fwd;
        wrong.lse = Tensor::empty({c.B, c.Hq, c.Nq}, dtype::f32);
        EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, wrong, c.opt, e),
                         "attention_family_backward: forward.lse has shape [2, 8, 19], expected [2, 8, 19, 3] (B, Hq, "
                         "Nq, Dv: multi-dimensional)");
      }
  }
}

// The backward from the forward's result on the fused path (family_result::lse): softmax and the
// kernel distribution keep their row statistics; box then runs its dk/dv pass alone (no score
// gradient), dot-product scores the single pass (B·Hkv >= 8), with r = dout·out. Every gradient
// against the float64 reference and against the backward that recomputes the statistics, on
// every mask kind, GQA and ISA; the same bits for any thread count; the other distributions keep
// no statistics; an lse shifted by 0.5 changes the gradients (it is what the backward reads).
TEST(FamilyFused, BackwardFromTheForwardsStatistics) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(91);
    struct pair_case {
      score_case sc;
      distribution_kind d;
    };
    for (const pair_case& pc : {pair_case{{score_kind::scaled_dot}, distribution_kind::softmax},
                                pair_case{{score_kind::activated_general, score_activation::tanh}, distribution_kind::softmax},
                                pair_case{{score_kind::biased_general}, distribution_kind::softmax},
                                pair_case{{score_kind::additive}, distribution_kind::softmax},
                                pair_case{{score_kind::box}, distribution_kind::kernel},
                                pair_case{{score_kind::triangle}, distribution_kind::kernel}})
      for (int mask = 0; mask < 5; ++mask) {
        if (pc.d == distribution_kind::kernel && mask == 4) continue;  // (bool masks only)
        const std::int64_t Nq = mask == 2 ? 70 : 19, Nk = std::vector<std::int64_t>{150, 1, 133, 64, 97}[std::size_t(mask)];
        family_case c(pc.sc.s, pc.d, rng, 2, 8, 4, Nq, Nk, 5, 3);
        c.opt.score.activation = pc.sc.act;
        apply_mask(c, mask, rng);
        const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
        const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f32, rng);
        // additive: tanh(a + b) from e^{2a} e^{2b} (the default) and from tanh itself, alternating
        const bool tanh_form = pc.sc.s == score_kind::additive && mask % 2 == 1;
        if (tanh_form) setenv("ATTN_FAMILY_ADDITIVE", "tanh", 1);
        struct unset_additive {
          ~unset_additive() { unsetenv("ATTN_FAMILY_ADDITIVE"); }
        } unset_at_end;
        const std::string what = isa + " " + case_name(pc.sc.s, pc.d) + " mask " + std::to_string(mask) +
                                 (tanh_form ? " tanh" : "");
        SCOPED_TRACE(what);
        const execution e{.path = family_path::fused};
        const family_result fwd = attention_family(q, k, v, c.opt, e);
        ASSERT_TRUE(fwd.lse.defined());
        EXPECT_EQ(fwd.lse.shape(), (Shape{c.B, c.Hq, c.Nq}));
        const result got{fwd, attention_family_backward(q, k, v, dout, fwd, c.opt, e)};
        expect_close(got, run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference), 2e-4, what);
        const result again{fwd, attention_family_backward(q, k, v, dout, c.opt, e)};
        expect_family_close(got.fwd, got.g, again.fwd, again.g, 1e-5);
        expect_same_bits_at_threads(q, k, v, dout, c.opt, got.g);
        if (mask != 0) continue;
        family_result shifted = fwd;
        shifted.lse = Tensor::copy_of(fwd.lse);
        for (std::int64_t i = 0; i < shifted.lse.numel(); ++i)
          static_cast<float*>(shifted.lse.data())[i] += 0.5f;
        const family_grads moved = attention_family_backward(q, k, v, dout, shifted, c.opt, e);
        EXPECT_FALSE(all_close(moved.dv, got.g.dv, 1e-3)) << "a shifted lse must change dv";
      }
    for (distribution_kind d : {distribution_kind::sigmoid, distribution_kind::sparsemax, distribution_kind::entmax15,
                                distribution_kind::topk}) {
      family_case c(score_kind::scaled_dot, d, rng, 2, 8, 4, 9, 20, 5, 3);
      const family_result r = attention_family(c.q.to(dtype::f32), c.k.to(dtype::f32), c.v.to(dtype::f32), c.opt);
      EXPECT_FALSE(r.lse.defined()) << to_string(d);
    }
  }
}

// Sparse rows (hardmax with the zero gradient, top-k with k <= 32) keep their keys: the forward
// returns kept_index / kept_weight — the reference's support and weights on well-separated scores,
// out = Σ kept_weight · v, the dense forward's out (ATTN_FAMILY_SPARSE=0) within f32 rounding —
// and the backward from them equals the backward that finds the keys again (bitwise) and the
// reference; the same bits for any thread count; a changed weight changes dv (the backward reads
// them); a V with an inf keeps the dense forms and returns no keys; bad keys are refused by message.
TEST(FamilyFused, SparseRowsKeepTheirKeys) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(17);
    struct pair_case {
      score_kind s;
      distribution_kind d;
      std::int64_t k;
      dtype t;
    };
    for (const pair_case& pc : {pair_case{score_kind::scaled_dot, distribution_kind::hardmax, 1, dtype::f32},
                                pair_case{score_kind::dot, distribution_kind::topk, 3, dtype::f32},
                                pair_case{score_kind::cosine, distribution_kind::topk, 8, dtype::f32},
                                pair_case{score_kind::activated_general, distribution_kind::topk, 2, dtype::f32},
                                pair_case{score_kind::scaled_dot, distribution_kind::topk, 5, dtype::bf16},
                                pair_case{score_kind::scaled_dot, distribution_kind::hardmax, 1, dtype::bf16}})
      for (int mask = 0; mask < 5; ++mask) {
        const std::int64_t Nq = mask == 2 ? 37 : 11, Nk = std::vector<std::int64_t>{150, 1, 133, 64, 4}[std::size_t(mask)];
        family_case c(pc.s, pc.d, rng, 2, 4, 2, Nq, Nk, 6, 5);
        c.opt.distribution.k = pc.k;
        apply_mask(c, mask, rng);
        const Tensor q = c.q.to(pc.t), k = c.k.to(pc.t), v = c.v.to(pc.t);
        const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, pc.t, rng);
        const std::string what = isa + " " + case_name(pc.s, pc.d) + " k " + std::to_string(pc.k) + " " +
                                 std::string(dtype_name(pc.t)) + " mask " + std::to_string(mask);
        SCOPED_TRACE(what);
        const execution e{.path = family_path::fused, .num_threads = 2};
        const family_result fwd = attention_family(q, k, v, c.opt, e);
        const Shape ks{c.B, c.Hq, c.Nq, pc.k};
        ASSERT_TRUE(fwd.kept_index.defined());
        ASSERT_EQ(fwd.kept_index.shape(), ks);
        ASSERT_EQ(fwd.kept_weight.shape(), ks);
        EXPECT_EQ(fwd.kept_index.type(), dtype::i64);
        EXPECT_EQ(fwd.kept_weight.type(), dtype::f32);
        // The support and weights of the reference; out = Σ kept_weight · v.
        const auto ix = fwd.kept_index.to_vector(), kw = fwd.kept_weight.to_vector();
        const auto w = attention_family_weights(f64(q), f64(k), f64(v), c.opt, {.path = family_path::reference}).to_vector();
        const auto vv = f64(v).to_vector(), out = fwd.out.to(dtype::f64).to_vector();
        const std::int64_t G = c.Hq / c.Hkv;
        double worst = 0.0;
        for (std::int64_t r = 0; r < c.B * c.Hq * c.Nq; ++r) {
          const std::int64_t b = r / (c.Hq * c.Nq), h = r / c.Nq % c.Hq;
          std::vector<double> o(std::size_t(c.Dv), 0.0);
          std::int64_t e2 = 0;
          for (std::int64_t j = 0; j < c.Nk; ++j) {
            const double wj = w[std::size_t(r * c.Nk + j)];
            if (wj == 0.0) continue;
            ASSERT_LT(e2, pc.k) << "row " << r;
            EXPECT_EQ(ix[std::size_t(r * pc.k + e2)], double(j)) << "row " << r << " entry " << e2;
            EXPECT_NEAR(kw[std::size_t(r * pc.k + e2)], wj, 1e-5) << "row " << r << " entry " << e2;
            ++e2;
          }
          for (std::int64_t e3 = e2; e3 < pc.k; ++e3) {
            EXPECT_EQ(ix[std::size_t(r * pc.k + e3)], -1.0) << "row " << r << " entry " << e3;
            EXPECT_EQ(kw[std::size_t(r * pc.k + e3)], 0.0) << "row " << r << " entry " << e3;
          }
          for (std::int64_t e3 = 0; e3 < e2; ++e3) {
            const std::int64_t j = std::int64_t(ix[std::size_t(r * pc.k + e3)]);
            for (std::int64_t y = 0; y < c.Dv; ++y)
              o[std::size_t(y)] += kw[std::size_t(r * pc.k + e3)] * vv[std::size_t(((b * c.Hkv + h / G) * c.Nk + j) * c.Dv + y)];
          }
          for (std::int64_t y = 0; y < c.Dv; ++y)
            worst = std::max(worst, std::abs(o[std::size_t(y)] - out[std::size_t(r * c.Dv + y)]));
        }
        EXPECT_LT(worst, pc.t == dtype::bf16 ? 2e-2 : 1e-5);
        // The dense forms give the same result.
        setenv("ATTN_FAMILY_SPARSE", "0", 1);
        const family_result dense = attention_family(q, k, v, c.opt, e);
        const family_grads dense_g = attention_family_backward(q, k, v, dout, c.opt, e);
        unsetenv("ATTN_FAMILY_SPARSE");
        EXPECT_FALSE(dense.kept_index.defined());
        EXPECT_TRUE(all_close(fwd.out, dense.out, pc.t == dtype::bf16 ? tolerance_for(dtype::bf16) : 1e-5));
        // The backward from the kept keys: the backward that finds them again, bit for bit, the
        // dense backward and the reference.
        const family_grads got = attention_family_backward(q, k, v, dout, fwd, c.opt, e);
        const family_grads again = attention_family_backward(q, k, v, dout, c.opt, e);
        if (pc.s != score_kind::activated_general) {  // (tanh's act′ is not kept: it finds the keys again)
          EXPECT_TRUE(same_bits(got.dq, again.dq));
          EXPECT_TRUE(same_bits(got.dk, again.dk));
          EXPECT_TRUE(same_bits(got.dv, again.dv));
        }
        const double tol = pc.t == dtype::bf16 ? tolerance_for(dtype::bf16) : 2e-4;
        EXPECT_TRUE(all_close(got.dv, dense_g.dv, tol));
        EXPECT_TRUE(all_close(got.dq, dense_g.dq, tol));
        EXPECT_TRUE(all_close(got.dk, dense_g.dk, tol));
        if (pc.t == dtype::f32)
          expect_close(result{fwd, got}, run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference), 2e-4, what);
        for (int t : {1, 3}) {
          const execution et{.path = family_path::fused, .num_threads = t};
          const family_result f1 = attention_family(q, k, v, c.opt, et);
          EXPECT_TRUE(same_bits(f1.out, fwd.out)) << "threads " << t;
          EXPECT_TRUE(same_bits(f1.kept_weight, fwd.kept_weight)) << "threads " << t;
          const family_grads g1 = attention_family_backward(q, k, v, dout, f1, c.opt, et);
          EXPECT_TRUE(same_bits(g1.dq, got.dq)) << "threads " << t;
          EXPECT_TRUE(same_bits(g1.dk, got.dk)) << "threads " << t;
          EXPECT_TRUE(same_bits(g1.dv, got.dv)) << "threads " << t;
        }
        if (mask == 1 || pc.s == score_kind::activated_general) continue;  // (Nk 1: weights 1 or 0)
        family_result doubled = fwd;
        doubled.kept_weight = Tensor::copy_of(fwd.kept_weight);
        for (std::int64_t i = 0; i < doubled.kept_weight.numel(); ++i) static_cast<float*>(doubled.kept_weight.data())[i] *= 2.0f;
        EXPECT_FALSE(all_close(attention_family_backward(q, k, v, dout, doubled, c.opt, e).dv, got.dv, 1e-3))
            << "doubled weights must change dv";
      }
    // A V with an inf: the dense forms (its α = 0 meets it where no row keeps it), no keys.
    family_case c(score_kind::scaled_dot, distribution_kind::topk, rng, 1, 2, 1, 5, 9, 4, 3);
    c.opt.distribution.k = 2;
    Tensor v = c.v.to(dtype::f32);
    static_cast<float*>(v.data())[3 * 3 + 1] = std::numeric_limits<float>::infinity();
    const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32);
    const family_result r = attention_family(q, k, v, c.opt, {.path = family_path::fused});
    EXPECT_FALSE(r.kept_index.defined());
    const family_result ref = attention_family(f64(q), f64(k), f64(v), c.opt, {.path = family_path::reference});
    const auto a = r.out.to_vector(), want = ref.out.to_vector();
    for (std::size_t i = 0; i < a.size(); ++i)
      if (std::isnan(want[i])) EXPECT_TRUE(std::isnan(a[i])) << i;
      else if (std::isinf(want[i])) EXPECT_EQ(a[i], want[i]) << i;
      else EXPECT_NEAR(a[i], want[i], 1e-5) << i;
  }
}

// Keys given back to the backward are checked: both or neither, the shape and dtypes of the
// call, keys in range rising along each row then -1, and only for the sparse distributions.
TEST(FamilyFused, SparseKeysGivenBackAreChecked) {
  std::mt19937 rng(23);
  family_case c(score_kind::scaled_dot, distribution_kind::topk, rng, 1, 2, 1, 3, 6, 4, 3);
  c.opt.distribution.k = 2;
  const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
  const Tensor dout = random_tensor({1, 2, 3, 3}, dtype::f32, rng);
  const family_result fwd = attention_family(q, k, v, c.opt);
  ASSERT_TRUE(fwd.kept_index.defined());
  family_result one = fwd;
  one.kept_weight = Tensor();
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, one, c.opt), "forward.kept_index is given but forward.kept_weight is empty");
  family_result shape = fwd;
  shape.kept_index = Tensor::zeros({1, 2, 3, 3}, dtype::i64);
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, shape, c.opt), "forward.kept_index has shape [1, 2, 3, 3], expected [1, 2, 3, 2]");
  family_result type = fwd;
  type.kept_index = fwd.kept_weight;
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, type, c.opt), "forward.kept_index has dtype float32, expected int64");
  const auto set = [&](std::vector<double> row0) {
    family_result bad = fwd;
    bad.kept_index = Tensor::copy_of(fwd.kept_index);
    auto* p = static_cast<std::int64_t*>(bad.kept_index.data());
    for (std::size_t e = 0; e < row0.size(); ++e) p[e] = std::int64_t(row0[e]);
    return bad;
  };
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, set({0, 6}), c.opt), "forward.kept_index row 0 entry 1 is 6");
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, set({3, 3}), c.opt), "rising along the row, then -1");
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, set({-1, 2}), c.opt), "forward.kept_index row 0 entry 1 is 2");
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, set({-2, -1}), c.opt), "row 0 entry 0 is -2");
  family_options soft = c.opt;
  soft.distribution.kind = distribution_kind::softmax;
  EXPECT_THROW_MSG(attention_family_backward(q, k, v, dout, fwd, soft), "distribution softmax keeps no key set");
  // A valid row with fewer keys is taken: -1 to the end.
  EXPECT_NO_THROW(attention_family_backward(q, k, v, dout, set({4, -1}), c.opt));
}

// attention_family_weights from the fused kernels: the reference's weights within f32 rounding
// for every fused distribution, mask kind, GQA and ISA level; the same exact zeros on
// well-separated scores; Σ_j α_ij v_j is the fused forward's out; float64 inputs and other
// paths keep the reference (bitwise).
TEST(FamilyFused, WeightsFromTheFusedKernels) {
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    std::mt19937 rng(55);
    for (distribution_kind d : kFused)
      for (int mask = 0; mask < 5; ++mask) {
        const std::int64_t Nq = std::vector<std::int64_t>{1, 9, 23, 13, 5}[std::size_t(mask)];
        const std::int64_t Nk = std::vector<std::int64_t>{7, 133, 17, 1, 70}[std::size_t((mask + int(d)) % 5)];
        family_case c(score_kind::scaled_dot, d, rng, 2, 4, 2, Nq, Nk, 6, 3);
        apply_mask(c, mask, rng);
        const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
        const std::string what = isa + " " + to_string(d) + " mask " + std::to_string(mask);
        const Tensor got = attention_family_weights(q, k, v, c.opt, {.num_threads = 2});
        const Tensor want = attention_family_weights(q, k, v, c.opt, {.path = family_path::reference});
        ASSERT_EQ(got.shape(), (Shape{c.B, c.Hq, Nq, Nk})) << what;
        EXPECT_EQ(got.type(), dtype::f64);
        const auto g = got.to_vector(), w = want.to_vector();
        for (std::size_t x = 0; x < g.size(); ++x) {
          ASSERT_NEAR(g[x], w[x], 2e-5 * (1 + std::abs(w[x]))) << what << " at " << x;
          if (d != distribution_kind::softmax && d != distribution_kind::sigmoid) {
            ASSERT_EQ(g[x] == 0.0, w[x] == 0.0) << what << " at " << x;
          }
        }
        // out = α v, against the fused forward.
        const auto out = attention_family(q, k, v, c.opt, {.path = family_path::fused}).out.to_vector();
        const auto vv = v.to_vector();
        for (std::int64_t b = 0; b < c.B; ++b)
          for (std::int64_t h = 0; h < c.Hq; ++h)
            for (std::int64_t i = 0; i < Nq; ++i)
              for (std::int64_t e = 0; e < c.Dv; ++e) {
                double sum = 0.0;
                for (std::int64_t j = 0; j < Nk; ++j)
                  sum += g[std::size_t(((b * c.Hq + h) * Nq + i) * Nk + j)] *
                         vv[std::size_t(((b * c.Hkv + h / (c.Hq / c.Hkv)) * Nk + j) * c.Dv + e)];
                EXPECT_NEAR(out[std::size_t(((b * c.Hq + h) * Nq + i) * c.Dv + e)], sum, 1e-5 * (1 + std::abs(sum))) << what;
              }
      }
  }
  std::mt19937 rng(56);
  family_case c(score_kind::general, distribution_kind::sparsemax, rng, 1, 2, 1, 9, 11, 4, 3);
  const Tensor ref = attention_family_weights(c.q, c.k, c.v, c.opt);  // float64 inputs: the reference
  EXPECT_TRUE(same_bits(ref, attention_family_weights(c.q, c.k, c.v, c.opt, {.path = family_path::reference})));
  const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
  EXPECT_TRUE(same_bits(attention_family_weights(q, k, v, c.opt, {.path = family_path::tiled}),
                        attention_family_weights(q, k, v, c.opt, {.path = family_path::reference})));
  EXPECT_THROW_MSG(attention_family_weights(c.q, c.k, c.v, c.opt, {.path = family_path::fused}),
                   "attention_family_weights: path fused: float64 inputs");
}

TEST(FamilyFused, BitwiseIdenticalForAnyThreadCount) {
  std::mt19937 rng(3);
  for (int s_i = 0; s_i < 4; ++s_i)
  for (distribution_kind d : kFused) {
    const score_kind s = std::vector<score_kind>{score_kind::activated_general, score_kind::additive,
                                                 score_kind::triangle, score_kind::additive}[std::size_t(s_i)];
    family_case c(s, d, rng, 2, 4, 2, 37, 150, 8, 5, /*multi_dim=*/s_i == 3);
    apply_mask(c, 4, rng);
    const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
    const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f32, rng);
    const result one = run(c, q, k, v, dout, family_path::fused, 1);
    for (int t : {2, 3}) {
      const result many = run(c, q, k, v, dout, family_path::fused, t);
      const std::string what = to_string(d) + " threads " + std::to_string(t);
      EXPECT_EQ(one.fwd.out.to_vector(), many.fwd.out.to_vector()) << what;
      EXPECT_EQ(one.g.dq.to_vector(), many.g.dq.to_vector()) << what;
      EXPECT_EQ(one.g.dk.to_vector(), many.g.dk.to_vector()) << what;
      EXPECT_EQ(one.g.dv.to_vector(), many.g.dv.to_vector()) << what;
      if (s != score_kind::triangle) {
        EXPECT_EQ(one.g.db.to_vector(), many.g.db.to_vector()) << what;
      }
      if (s == score_kind::activated_general) {
        EXPECT_EQ(one.g.dW.to_vector(), many.g.dW.to_vector()) << what;
      }
      EXPECT_EQ(one.g.dbandwidth, many.g.dbandwidth) << what;
      if (s == score_kind::additive) {
        EXPECT_EQ(one.g.dW_q.to_vector(), many.g.dW_q.to_vector()) << what;
        EXPECT_EQ(one.g.dW_k.to_vector(), many.g.dW_k.to_vector()) << what;
        EXPECT_EQ(one.g.dw_v.to_vector(), many.g.dw_v.to_vector()) << what;
      }
    }
  }
}

// Every output and gradient of a and b the same (NaN where the other has NaN).
void expect_same(const result& a, const result& b, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(same_bits(a.fwd.out, b.fwd.out)) << "out";
  for (auto [name, x, y] : {std::tuple{"dq", &a.g.dq, &b.g.dq}, {"dk", &a.g.dk, &b.g.dk}, {"dv", &a.g.dv, &b.g.dv},
                            {"dW", &a.g.dW, &b.g.dW}, {"db", &a.g.db, &b.g.db}, {"dW_q", &a.g.dW_q, &b.g.dW_q},
                            {"dW_k", &a.g.dW_k, &b.g.dW_k}, {"dw_v", &a.g.dw_v, &b.g.dw_v}}) {
    ASSERT_EQ(x->defined(), y->defined()) << name;
    if (x->defined()) {
      EXPECT_TRUE(same_bits(*x, *y)) << name;
    }
  }
  for (auto [name, x, y] : {std::tuple{"dbandwidth", a.g.dbandwidth, b.g.dbandwidth},
                            {"dsigmoid_bias", a.g.dsigmoid_bias, b.g.dsigmoid_bias}})
    EXPECT_TRUE(x == y || (std::isnan(x) && std::isnan(y))) << name << " " << x << " vs " << y;
}

// Key blocks a mask tensor hides from every row — a causal mask passed as a bool [Nq, Nk], key
// padding as a bool [B, 1, 1, Nk] with one batch entry padded past two key blocks — are skipped
// by the fused kernels (their scores, P·V, dP, dq and dk/dv products) where every input is
// finite. Against the float64 reference, and against the same kernels running every block
// (ATTN_FAMILY_MASK_SKIP=0): the same bits, every ISA, the streaming distributions, dot-like,
// additive (multi-dimensional too: its online softmax, sigmoid, sparsemax) and distance scores,
// f32 and bf16 (bf16 products), GQA 2:1, 2 threads. A NaN in a
// hidden key or value, or in dout, keeps every block (NaN + -inf is NaN in the reference): the
// same bits again, NaN included.
TEST(FamilyFused, MaskHiddenBlocksSkippedWithTheSameBits) {
  std::mt19937 rng(909);
  const std::int64_t N = 300;  // three lane key blocks (128), five row key blocks (64)
  Tensor causal = Tensor::zeros({N, N}, dtype::boolean);
  for (std::int64_t i = 0; i < N; ++i)
    for (std::int64_t j = 0; j <= i; ++j) causal.set({i, j}, 1.0);
  Tensor padding = Tensor::zeros({2, 1, 1, N}, dtype::boolean);
  for (std::int64_t j = 0; j < N; ++j) padding.set({0, 0, 0, j}, j < 40 ? 1.0 : 0.0), padding.set({1, 0, 0, j}, 1.0);
  // (score, dtype, multi-dimensional additive)
  const std::vector<std::tuple<score_kind, dtype, bool>> scores = {
      {score_kind::scaled_dot, dtype::f32, false}, {score_kind::scaled_dot, dtype::bf16, false},
      {score_kind::activated_general, dtype::f32, false}, {score_kind::additive, dtype::f32, false},
      {score_kind::additive, dtype::f32, true}, {score_kind::triangle, dtype::f32, false}};
  std::vector<distribution_kind> dists = kFused;
  dists.push_back(distribution_kind::kernel);
  for (const auto& [s, t, md] : scores)
    for (distribution_kind d : dists)
      for (int m = 0; m < 2; ++m) {
        const bool distance = s == score_kind::triangle;
        if (distance != (d == distribution_kind::kernel) && d != distribution_kind::sigmoid) continue;
        if (md && d != distribution_kind::softmax && d != distribution_kind::sigmoid && d != distribution_kind::sparsemax)
          continue;
        family_case c(s, d, rng, 2, 4, 2, N, N, 8, 6, md);
        c.opt.score.activation = score_activation::relu;
        c.opt.distribution.k = 5;
        if (distance) c.opt.score.bandwidth = 3.0;
        c.opt.attn_mask = (m == 0 ? causal : padding).view();
        const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t), dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, t, rng);
        const result ref = run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference);
        for (const std::string& isa : isas()) {
          isa_scope scope(isa.c_str());
          const std::string what = isa + " " + case_name(s, d) + (md ? " multi-dimensional " : " ") +
                                   std::string(dtype_name(t)) + (m == 0 ? " causal" : " padding");
          const result got = run(c, q, k, v, dout, family_path::fused, 2);
          expect_close(got, ref, t == dtype::bf16 ? 2 * tolerance_for(dtype::bf16) : 2e-4, what);
          setenv("ATTN_FAMILY_MASK_SKIP", "0", 1);
          const result every = run(c, q, k, v, dout, family_path::fused, 2);
          unsetenv("ATTN_FAMILY_MASK_SKIP");
          expect_same(got, every, what + ": skipped vs every block");
          if (isa != isas().back()) continue;
          // A NaN the mask hides from the first rows (causal: key N - 1; padding: key N - 1 of
          // batch 0), in k, in v, and in dout of a row: the same bits as every block.
          for (int w = 0; w < 3; ++w) {
            Tensor kn = Tensor::copy_of(k.view()), vn = Tensor::copy_of(v.view()), dn = Tensor::copy_of(dout.view());
            (w == 0 ? kn : w == 1 ? vn : dn).set({0, 1, N - 1, 0}, std::nan(""));
            const result nan_got = run(c, q, kn, vn, dn, family_path::fused, 2);
            setenv("ATTN_FAMILY_MASK_SKIP", "0", 1);
            const result nan_every = run(c, q, kn, vn, dn, family_path::fused, 2);
            unsetenv("ATTN_FAMILY_MASK_SKIP");
            expect_same(nan_got, nan_every, what + " NaN in " + std::string(w == 0 ? "k" : w == 1 ? "v" : "dout"));
          }
        }
      }
}

// Without a mask, the distributions with exact zeros (sparsemax, entmax15, hardmax, top-k, the
// box and triangle kernels) skip the products of key blocks whose weights are all 0 — here the
// keys past 128 score far below every query's support (dot scores: q in [0.5, 1], those keys in
// [-1, -0.5]; distances: those keys 20 away), so every lane block and row block past them is
// zeros. The same bits as running every block (ATTN_FAMILY_MASK_SKIP=0) and the float64
// reference, f32 and bf16, every ISA, 1 and 2 threads; a NaN in v of such a key (a zero weight:
// 0·NaN is NaN in the reference) or in dout keeps every block, NaN and all.
TEST(FamilyFused, ZeroWeightBlocksSkippedWithTheSameBits) {
  std::mt19937 rng(911);
  const std::int64_t N = 300, cut = 128;
  // (score, distribution, hardmax's straight-through gradient: dense dz where α is one-hot;
  // top-k's k: 40 takes the dense products — k <= 32 and zero-gradient hardmax run on their kept
  // keys, with no block products to skip)
  const std::vector<std::tuple<score_kind, distribution_kind, bool, int>> pairs = {
      {score_kind::scaled_dot, distribution_kind::sparsemax, false, 0}, {score_kind::scaled_dot, distribution_kind::entmax15, false, 0},
      {score_kind::dot, distribution_kind::hardmax, false, 0},          {score_kind::dot, distribution_kind::hardmax, true, 0},
      {score_kind::scaled_dot, distribution_kind::topk, false, 5},      {score_kind::scaled_dot, distribution_kind::topk, false, 40},
      {score_kind::box, distribution_kind::kernel, false, 0},           {score_kind::triangle, distribution_kind::kernel, false, 0}};
  for (const auto& [s, d, st, topk] : pairs)
    for (dtype t : {dtype::f32, dtype::bf16}) {
      const bool distance = d == distribution_kind::kernel;
      family_case c(s, d, rng, 1, 4, 2, N, N, 8, 6);
      c.opt.distribution.k = topk > 0 ? topk : 5;
      if (st) c.opt.distribution.hardmax_grad = hardmax_gradient::straight_through;
      if (distance) c.opt.score.bandwidth = 3.0;
      std::uniform_real_distribution<double> half(0.5, 1.0);
      for (std::int64_t h = 0; h < c.Hkv; ++h)
        for (std::int64_t j = 0; j < N; ++j)
          for (std::int64_t x = 0; x < c.Dk; ++x) {
            const double e = half(rng);
            c.k.set({0, h, j, x}, distance ? (j < cut ? 0.3 * (e - 0.75) : 20.0 + e) : (j < cut ? e : -e));
          }
      if (!distance)
        for (std::int64_t h = 0; h < c.Hq; ++h)
          for (std::int64_t i = 0; i < N; ++i)
            for (std::int64_t x = 0; x < c.D; ++x) c.q.set({0, h, i, x}, half(rng));
      else
        for (std::int64_t h = 0; h < c.Hq; ++h)
          for (std::int64_t i = 0; i < N; ++i)
            for (std::int64_t x = 0; x < c.D; ++x) c.q.set({0, h, i, x}, 0.3 * (half(rng) - 0.75));
      const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t), dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, t, rng);
      const result ref = run(c, f64(q), f64(k), f64(v), f64(dout), family_path::reference);
      {  // the premise: no weight past the cut
        const Tensor a = attention_family_weights(f64(q).view(), f64(k).view(), f64(v).view(), c.opt);
        for (std::int64_t h = 0; h < c.Hq; ++h)
          for (std::int64_t i = 0; i < N; ++i)
            for (std::int64_t j = cut; j < N; ++j) ASSERT_EQ(a.get({0, h, i, j}), 0.0) << case_name(s, d);
      }
      for (const std::string& isa : isas()) {
        isa_scope scope(isa.c_str());
        const std::string what = isa + " " + case_name(s, d) + " " + std::string(dtype_name(t));
        for (int threads : {1, 2}) {
          const result got = run(c, q, k, v, dout, family_path::fused, threads);
          // (bf16: dq = Σ dz k with every q·k positive is a difference of large terms, Σ dz = 0, each dz
          // rounded to bf16 for the product: 4× the usual bound)
          expect_close(got, ref, t == dtype::bf16 ? 4 * tolerance_for(dtype::bf16) : 2e-4, what);
          setenv("ATTN_FAMILY_MASK_SKIP", "0", 1);
          const result every = run(c, q, k, v, dout, family_path::fused, threads);
          unsetenv("ATTN_FAMILY_MASK_SKIP");
          expect_same(got, every, what + ": skipped vs every block, threads " + std::to_string(threads));
        }
        if (isa != isas().back()) continue;
        for (int w = 0; w < 2; ++w) {  // NaN in v of a zero-weight key, or in dout of a row
          Tensor vn = Tensor::copy_of(v.view()), dn = Tensor::copy_of(dout.view());
          (w == 0 ? vn : dn).set({0, 1, N - 1, 0}, std::nan(""));
          const result nan_got = run(c, q, k, vn, dn, family_path::fused, 2);
          setenv("ATTN_FAMILY_MASK_SKIP", "0", 1);
          const result nan_every = run(c, q, k, vn, dn, family_path::fused, 2);
          unsetenv("ATTN_FAMILY_MASK_SKIP");
          expect_same(nan_got, nan_every, what + " NaN in " + std::string(w == 0 ? "v" : "dout"));
          if (w == 0) {
            EXPECT_TRUE(std::isnan(nan_got.fwd.out.get({0, 2, 0, 0}))) << what << ": 0 · NaN in the output";
          }
        }
      }
    }
}

TEST(FamilyFused, AutomaticTakesItWhereItRunsAndRefusesWithAReason) {
  std::mt19937 rng(4);
  family_case c(score_kind::scaled_dot, distribution_kind::sigmoid, rng);
  const Tensor q = c.q.to(dtype::f32), k = c.k.to(dtype::f32), v = c.v.to(dtype::f32);
  EXPECT_EQ(attention_family(q, k, v, c.opt).path.rfind("fused (", 0), 0u);
  EXPECT_EQ(attention_family(c.q, c.k, c.v, c.opt).path, "tiled");  // float64 inputs stay exact
  c.opt.distribution.kind = distribution_kind::softmax;
  EXPECT_EQ(attention_family(q, k, v, c.opt).path.rfind("core", 0), 0u);  // the core op first
  EXPECT_EQ(attention_family(q, k, v, c.opt, {.path = family_path::fused}).path.rfind("fused", 0), 0u);
  {
    setenv("ATTN_FAMILY_PATH", "tiled", 1);
    c.opt.distribution.kind = distribution_kind::sigmoid;
    EXPECT_EQ(attention_family(q, k, v, c.opt).path, "tiled");
    unsetenv("ATTN_FAMILY_PATH");
  }
  family_case a(score_kind::additive, distribution_kind::sigmoid, rng);
  const Tensor aq = a.q.to(dtype::f32), ak = a.k.to(dtype::f32), av = a.v.to(dtype::f32);
  EXPECT_EQ(attention_family(aq, ak, av, a.opt).path.rfind("fused (", 0), 0u);
  family_case md(score_kind::additive, distribution_kind::softmax, rng, 1, 2, 1, 4, 6, 3, 3, /*multi_dim=*/true);
  const Tensor mq = md.q.to(dtype::f32), mk = md.k.to(dtype::f32), mv = md.v.to(dtype::f32);
  EXPECT_EQ(attention_family(mq, mk, mv, md.opt).path.rfind("fused (", 0), 0u);
  EXPECT_EQ(attention_family(md.q, md.k, md.v, md.opt).path, "tiled");
  family_case lc(score_kind::box, distribution_kind::kernel, rng);
  const Tensor lq = lc.q.to(dtype::f32), lk = lc.k.to(dtype::f32), lv = lc.v.to(dtype::f32);
  EXPECT_EQ(attention_family(lq, lk, lv, lc.opt).path.rfind("fused (", 0), 0u);
  c.opt.distribution.kind = distribution_kind::hardmax;
  c.opt.distribution.hardmax_grad = hardmax_gradient::straight_through;
  EXPECT_EQ(attention_family(q, k, v, c.opt).path.rfind("fused (", 0), 0u);
  EXPECT_THROW_MSG(attention_family(c.q, c.k, c.v, c.opt, {.path = family_path::fused}),
                   "attention_family: path fused: float64 inputs");
}

}  // namespace
}  // namespace attn::testing

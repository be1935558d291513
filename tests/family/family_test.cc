// tests/family/family_test.cc — every score × distribution: the tiled path and attn::attention route
// against the float64 reference (forward and backward, with masks, GQA and 3-D layouts), and
// every gradient against central finite differences.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "family_util.h"

namespace attn::testing {
namespace {

struct grads_of {
  family_result fwd;
  family_grads g;
};

grads_of run(family_case& c, family_path path, const Tensor& dout) {
  execution e = c.exec;
  e.path = path;
  return {attention_family(c.q, c.k, c.v, c.opt, e), attention_family_backward(c.q, c.k, c.v, dout, c.opt, e)};
}

void expect_same(const grads_of& got, const grads_of& want, double tol, const std::string& what) {
  SCOPED_TRACE(what + " (" + got.fwd.path + " vs " + want.fwd.path + ")");
  expect_family_close(got.fwd, got.g, want.fwd, want.g, tol);
}

// Masks the sweep runs under: none; causal bottom-right with a window; a bool mask (with one
// fully masked row); an additive mask with padding (nonpad_kv_seqlen).
void apply_mask(family_case& c, int kind, std::mt19937& rng) {
  switch (kind) {
    case 0: break;
    case 1:
      c.opt.is_causal = true, c.opt.alignment = causal_alignment::bottom_right, c.opt.window_left = 3;
      break;
    case 2: {
      c.mask = random_bool({c.B, 1, c.Nq, c.Nk}, rng, 0.7);
      for (std::int64_t j = 0; j < c.Nk; ++j) c.mask.set({0, 0, 1, j}, 0.0);  // row 1 of batch 0: no key
      c.opt.attn_mask = c.mask.view();
      break;
    }
    case 3: {
      std::vector<double> lens(std::size_t(c.B), double(c.Nk));
      lens[0] = 3;
      c.lens = Tensor::from_values({c.B}, dtype::i64, lens);
      c.mask = random_tensor({c.Nq, c.Nk}, dtype::f64, rng, -1.0, 1.0);
      c.opt.attn_mask = c.mask.view();
      c.opt.nonpad_kv_seqlen = c.lens.view();
      break;
    }
  }
}

TEST(FamilySweep, TiledAndCoreMatchReference) {
  std::mt19937 rng(7);
  for (score_kind s : all_scores())
    for (distribution_kind d : all_distributions()) {
      if (!compatible(s, d)) continue;
      for (int mask = 0; mask < 4; ++mask) {
        // the kernel weights of box/triangle are not logits: bool masks only
        if (d == distribution_kind::kernel && s != score_kind::gaussian && mask == 3) continue;
        for (hardmax_gradient hg : {hardmax_gradient::zero, hardmax_gradient::straight_through}) {
          if (hg == hardmax_gradient::straight_through && d != distribution_kind::hardmax) continue;
          family_case c(s, d, rng, 2, 4, 2, 5, 7, 3, 3);
          c.opt.distribution.hardmax_grad = hg;
          apply_mask(c, mask, rng);
          const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f64, rng);
          const std::string what = case_name(s, d) + " mask " + std::to_string(mask);
          const grads_of ref = run(c, family_path::reference, dout);
          expect_same(run(c, family_path::tiled, dout), ref, 1e-9, what);
          const grads_of autom = run(c, family_path::automatic, dout);
          if (autom.fwd.path != "tiled") expect_same(autom, ref, 1e-9, what);
          EXPECT_FALSE(any_nan(ref.fwd.out)) << what;
        }
      }
    }
}

TEST(FamilySweep, CoreRouteIsTakenForSoftmaxPairs) {
  std::mt19937 rng(1);
  for (score_kind s : {score_kind::dot, score_kind::scaled_dot, score_kind::general, score_kind::biased_general,
                       score_kind::cosine, score_kind::gaussian}) {
    family_case c(s, distribution_kind::softmax, rng);
    EXPECT_EQ(attention_family(c.q, c.k, c.v, c.opt, c.exec).path.rfind("core", 0), 0u) << to_string(s);
  }
  family_case c(score_kind::gaussian, distribution_kind::kernel, rng);
  EXPECT_EQ(attention_family(c.q, c.k, c.v, c.opt, c.exec).path.rfind("core", 0), 0u);
  family_case a(score_kind::additive, distribution_kind::softmax, rng);
  EXPECT_EQ(attention_family(a.q, a.k, a.v, a.opt).path, "tiled");
}

TEST(FamilySweep, MultiDimensionalAdditive) {
  std::mt19937 rng(3);
  for (distribution_kind d : all_distributions()) {
    if (d == distribution_kind::kernel) continue;
    family_case c(score_kind::additive, d, rng, 2, 2, 1, 4, 6, 3, 4, /*multi_dim=*/true);
    apply_mask(c, 2, rng);
    const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f64, rng);
    expect_same(run(c, family_path::tiled, dout), run(c, family_path::reference, dout), 1e-9,
                "multi-dimensional additive x " + to_string(d));
    // out_i[x] = Σ_j α_ij[x] v_j[x]
    const Tensor w = attention_family_weights(c.q, c.k, c.v, c.opt);
    ASSERT_EQ(w.shape(), (Shape{c.B, c.Hq, c.Nq, c.Nk, c.Dv}));
    const Tensor out = attention_family(c.q, c.k, c.v, c.opt, c.exec).out;
    for (std::int64_t i = 0; i < c.Nq; ++i)
      for (std::int64_t x = 0; x < c.Dv; ++x) {
        double s = 0.0;
        for (std::int64_t j = 0; j < c.Nk; ++j) s += w.get({1, 1, i, j, x}) * c.v.get({1, 0, j, x});
        EXPECT_NEAR(out.get({1, 1, i, x}), s, 1e-12);
      }
  }
}

TEST(FamilySweep, ThreeDimensionalLayoutAndThreads) {
  std::mt19937 rng(5);
  for (distribution_kind d : {distribution_kind::softmax, distribution_kind::entmax15, distribution_kind::topk}) {
    family_case c(score_kind::additive, d, rng, 2, 4, 2, 5, 6, 3, 2);
    const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f64, rng);
    const grads_of four = run(c, family_path::tiled, dout);
    // The same problem in the 3-D layout [B, N, H*X].
    auto to3 = [](const Tensor& t) {
      const Tensor p = Tensor::copy_of(t.view().permute({0, 2, 1, 3}));
      return Tensor::copy_of(p.view().reshape({t.size(0), t.size(2), t.size(1) * t.size(3)}));
    };
    const Tensor q3 = to3(c.q), k3 = to3(c.k), v3 = to3(c.v), d3 = to3(dout);
    family_options o = c.opt;
    o.q_num_heads = c.Hq, o.kv_num_heads = c.Hkv;
    const execution e{.path = family_path::tiled, .num_threads = 3};
    const family_result r = attention_family(q3, k3, v3, o, e);
    const family_grads g = attention_family_backward(q3, k3, v3, d3, o, e);
    EXPECT_TRUE(all_close(r.out, to3(four.fwd.out), 1e-12));
    EXPECT_TRUE(all_close(g.dq, to3(four.g.dq), 1e-12));
    EXPECT_TRUE(all_close(g.dk, to3(four.g.dk), 1e-12));
    EXPECT_TRUE(all_close(g.dv, to3(four.g.dv), 1e-12));
    EXPECT_TRUE(all_close(g.dW_q, four.g.dW_q, 1e-12));
  }
}

TEST(FamilySweep, LowerPrecisionInputs) {
  std::mt19937 rng(11);
  for (score_kind s : {score_kind::scaled_dot, score_kind::additive, score_kind::cosine}) {
    family_case c(s, distribution_kind::softmax, rng);
    const Tensor ref = attention_family(c.q, c.k, c.v, c.opt, c.exec).out;
    for (dtype t : {dtype::f32, dtype::bf16}) {
      family_options o = c.opt;
      const Tensor q = c.q.to(t), k = c.k.to(t), v = c.v.to(t);
      const family_result r = attention_family(q, k, v, o);
      EXPECT_EQ(r.out.type(), t);
      EXPECT_TRUE(all_close(r.out, ref, t == dtype::f32 ? 1e-5 : 3e-2)) << to_string(s) << " " << dtype_name(t);
    }
  }
}

// ---- finite differences ----

// Central differences of L = Σ dout · out with respect to every element of `t` (a tensor the
// options point into), compared with `analytic`.
void check_fd(const std::string& what, Tensor& t, const TensorView& analytic, const std::function<double()>& loss) {
  ASSERT_TRUE(analytic.shape() == t.shape()) << what;
  const double eps = 1e-6;
  std::vector<double> vals = t.to_vector();
  const auto a = to_vector(analytic);
  for (std::size_t n = 0; n < vals.size(); ++n) {
    TensorView flat = t.view().reshape({std::int64_t(vals.size())});
    const double x = vals[n];
    flat.set({std::int64_t(n)}, x + eps);
    const double lp = loss();
    flat.set({std::int64_t(n)}, x - eps);
    const double lm = loss();
    flat.set({std::int64_t(n)}, x);
    const double fd = (lp - lm) / (2 * eps);
    EXPECT_NEAR(a[n], fd, 1e-6 + 1e-5 * std::abs(fd)) << what << " element " << n;
  }
}

void check_fd_scalar(const std::string& what, double& x, double analytic, const std::function<double()>& loss) {
  const double eps = 1e-6, x0 = x;
  x = x0 + eps;
  const double lp = loss();
  x = x0 - eps;
  const double lm = loss();
  x = x0;
  const double fd = (lp - lm) / (2 * eps);
  EXPECT_NEAR(analytic, fd, 1e-6 + 1e-5 * std::abs(fd)) << what;
}

void fd_case(score_kind s, distribution_kind d, family_path path, std::mt19937& rng, int mask = 0) {
  family_case c(s, d, rng, 1, 2, 1, 3, 5, 3, 2);
  apply_mask(c, mask, rng);
  c.exec.path = path;
  if (d == distribution_kind::sigmoid) c.opt.distribution.sigmoid_bias = -0.4;
  const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f64, rng);
  auto loss = [&] { return weighted_sum(attention_family(c.q, c.k, c.v, c.opt, c.exec).out, dout); };
  const family_grads g = attention_family_backward(c.q, c.k, c.v, dout, c.opt, c.exec);
  const std::string what = case_name(s, d) + " (" + g.path + ")";
  check_fd(what + " dq", c.q, g.dq, loss);
  check_fd(what + " dk", c.k, g.dk, loss);
  check_fd(what + " dv", c.v, g.dv, loss);
  const std::map<std::string, const Tensor*> pg = {{"W", &g.dW},   {"b", &g.db},     {"W_q", &g.dW_q},
                                                   {"W_k", &g.dW_k}, {"w_v", &g.dw_v}, {"W_a", &g.dW_a}};
  for (auto [name, t] : c.params()) {
    ASSERT_TRUE(pg.at(name)->defined()) << what << " d" << name;
    check_fd(what + " d" + name, *t, *pg.at(name), loss);
  }
  if (s == score_kind::cosine) check_fd_scalar(what + " dtemperature", c.opt.score.temperature, g.dtemperature, loss);
  if (s == score_kind::gaussian || s == score_kind::triangle)
    check_fd_scalar(what + " dbandwidth", c.opt.score.bandwidth, g.dbandwidth, loss);
  if (d == distribution_kind::sigmoid)
    check_fd_scalar(what + " dsigmoid_bias", *c.opt.distribution.sigmoid_bias, g.dsigmoid_bias, loss);
}

TEST(FamilyGradient, EveryScoreWithSoftmaxAndSigmoid) {
  std::mt19937 rng(21);
  for (score_kind s : all_scores()) {
    if (s == score_kind::box) continue;  // piecewise constant: see BoxHasZeroScoreGradient
    fd_case(s, distribution_kind::softmax, family_path::automatic, rng);
    fd_case(s, distribution_kind::softmax, family_path::tiled, rng, 2);
    fd_case(s, distribution_kind::sigmoid, family_path::tiled, rng, 3);
  }
}

TEST(FamilyGradient, EveryDistribution) {
  std::mt19937 rng(22);
  for (distribution_kind d : all_distributions()) {
    const score_kind s = d == distribution_kind::kernel ? score_kind::triangle : score_kind::scaled_dot;
    for (int mask : {0, 2}) {
      fd_case(s, d, family_path::tiled, rng, mask);
      fd_case(s, d, family_path::reference, rng, mask);
    }
  }
  fd_case(score_kind::gaussian, distribution_kind::kernel, family_path::tiled, rng);
  fd_case(score_kind::additive, distribution_kind::entmax15, family_path::tiled, rng, 1);
  // identity over dot scores by associativity (automatic: linear attention with φ = identity)
  fd_case(score_kind::scaled_dot, distribution_kind::identity, family_path::automatic, rng);
  fd_case(score_kind::dot, distribution_kind::identity, family_path::automatic, rng);
}

TEST(FamilyGradient, MultiDimensional) {
  std::mt19937 rng(23);
  for (distribution_kind d : {distribution_kind::softmax, distribution_kind::sparsemax, distribution_kind::sigmoid}) {
    family_case c(score_kind::additive, d, rng, 1, 1, 1, 3, 4, 2, 3, /*multi_dim=*/true);
    const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f64, rng);
    auto loss = [&] { return weighted_sum(attention_family(c.q, c.k, c.v, c.opt, c.exec).out, dout); };
    const family_grads g = attention_family_backward(c.q, c.k, c.v, dout, c.opt, c.exec);
    check_fd("multi-dim dq", c.q, g.dq, loss);
    check_fd("multi-dim dk", c.k, g.dk, loss);
    check_fd("multi-dim dv", c.v, g.dv, loss);
    check_fd("multi-dim dw_v", c.w_v, g.dw_v, loss);
    check_fd("multi-dim dW_q", c.W_q, g.dW_q, loss);
  }
}

TEST(FamilyGradient, BoxHasZeroScoreGradient) {
  std::mt19937 rng(24);
  family_case c(score_kind::box, distribution_kind::kernel, rng);
  const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f64, rng);
  const family_grads g = attention_family_backward(c.q, c.k, c.v, dout, c.opt, c.exec);
  for (double x : g.dq.to_vector()) EXPECT_EQ(x, 0.0);
  for (double x : g.dk.to_vector()) EXPECT_EQ(x, 0.0);
  auto loss = [&] { return weighted_sum(attention_family(c.q, c.k, c.v, c.opt, c.exec).out, dout); };
  check_fd("box dv", c.v, g.dv, loss);
}

TEST(FamilyGradient, HardmaxStraightThroughIsTheSoftmaxGradient) {
  std::mt19937 rng(25);
  family_case c(score_kind::scaled_dot, distribution_kind::hardmax, rng);
  c.opt.distribution.hardmax_grad = hardmax_gradient::straight_through;
  const Tensor dout = random_tensor({c.B, c.Hq, c.Nq, c.Dv}, dtype::f64, rng);
  const family_grads st = attention_family_backward(c.q, c.k, c.v, dout, c.opt, c.exec);
  // With v = the hardmax's own dv path aside, dq/dk come from the softmax Jacobian applied to
  // dα = dout·v: the same as a softmax backward.
  family_options soft = c.opt;
  soft.distribution.kind = distribution_kind::softmax;
  const family_grads sg = attention_family_backward(c.q, c.k, c.v, dout, soft);
  EXPECT_TRUE(all_close(st.dq, sg.dq, 1e-12));
  EXPECT_TRUE(all_close(st.dk, sg.dk, 1e-12));
  family_options zero = c.opt;
  zero.distribution.hardmax_grad = hardmax_gradient::zero;
  const family_grads zg = attention_family_backward(c.q, c.k, c.v, dout, zero);
  for (double x : zg.dq.to_vector()) EXPECT_EQ(x, 0.0);
  EXPECT_TRUE(all_close(st.dv, zg.dv, 0.0));  // both: dout goes to the chosen key's value
}

}  // namespace
}  // namespace attn::testing

// tests/family/family_util.h — shared set-up for the attention-family tests: random problems with the
// learned parameters each score needs, and Σ dout·out for finite differences.
#pragma once

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "test_util.h"

namespace attn::testing {

inline const std::vector<score_kind>& all_scores() {
  static const std::vector<score_kind> s = {
      score_kind::dot,    score_kind::scaled_dot, score_kind::general,  score_kind::biased_general,
      score_kind::activated_general, score_kind::additive, score_kind::cosine, score_kind::location,
      score_kind::gaussian, score_kind::box, score_kind::triangle};
  return s;
}
inline const std::vector<distribution_kind>& all_distributions() {
  static const std::vector<distribution_kind> d = {
      distribution_kind::softmax, distribution_kind::sigmoid, distribution_kind::sparsemax, distribution_kind::entmax15,
      distribution_kind::hardmax, distribution_kind::topk,    distribution_kind::kernel,  distribution_kind::identity};
  return d;
}
inline bool is_kernel(score_kind s) {
  return s == score_kind::gaussian || s == score_kind::box || s == score_kind::triangle;
}
inline bool compatible(score_kind s, distribution_kind d) { return d != distribution_kind::kernel || is_kernel(s); }
// Scores whose key size may differ from the query's.
inline bool free_dk(score_kind s) {
  return s == score_kind::general || s == score_kind::biased_general || s == score_kind::activated_general ||
         s == score_kind::additive || s == score_kind::location;
}

// One random problem: q, k, v and the parameters of `score`, owned here; `opt` points into them.
struct family_case {
  Tensor q, k, v, W, b, W_q, W_k, w_v, W_a, mask, lens;
  family_options opt;
  execution exec;  // path and threads
  std::int64_t B, Hq, Hkv, Nq, Nk, D, Dk, Dv;

  family_case(score_kind score, distribution_kind dist, std::mt19937& rng, std::int64_t B_ = 2, std::int64_t Hq_ = 2,
              std::int64_t Hkv_ = 1, std::int64_t Nq_ = 4, std::int64_t Nk_ = 6, std::int64_t D_ = 3,
              std::int64_t Dv_ = 3, bool multi_dim = false)
      : B(B_), Hq(Hq_), Hkv(Hkv_), Nq(Nq_), Nk(Nk_), D(D_), Dk(free_dk(score) ? D_ + 1 : D_), Dv(Dv_) {
    const dtype t = dtype::f64;
    q = random_tensor({B, Hq, Nq, D}, t, rng);
    k = random_tensor({B, Hkv, Nk, Dk}, t, rng);
    v = random_tensor({B, Hkv, Nk, Dv}, t, rng);
    opt.score.kind = score;
    opt.distribution.kind = dist;
    const std::int64_t A = 5;
    switch (score) {
      case score_kind::general:
      case score_kind::biased_general:
      case score_kind::activated_general:
        W = random_tensor({D, Dk}, t, rng), opt.score.W = W.view();
        if (score == score_kind::biased_general) b = random_tensor({Dk}, t, rng), opt.score.b = b.view();
        if (score == score_kind::activated_general) b = random_tensor({1}, t, rng), opt.score.b = b.view();
        break;
      case score_kind::additive:
        W_q = random_tensor({A, D}, t, rng), W_k = random_tensor({A, Dk}, t, rng), b = random_tensor({A}, t, rng);
        w_v = multi_dim ? random_tensor({Dv, A}, t, rng) : random_tensor({A}, t, rng);
        opt.score.W_q = W_q.view(), opt.score.W_k = W_k.view(), opt.score.b = b.view(), opt.score.w_v = w_v.view();
        break;
      case score_kind::location: W_a = random_tensor({Nk, D}, t, rng), opt.score.W_a = W_a.view(); break;
      case score_kind::cosine: opt.score.temperature = 0.7; break;
      case score_kind::gaussian: opt.score.bandwidth = 0.9; break;
      case score_kind::box: opt.score.bandwidth = 1.2; break;
      case score_kind::triangle: opt.score.bandwidth = 1.5; break;
      default: break;
    }
    if (dist == distribution_kind::topk) opt.distribution.k = 3;
    if (dist == distribution_kind::sparsemax || dist == distribution_kind::entmax15) {
      // Spread the scores so that the support is a strict subset (exact zeros exercised).
      if (score == score_kind::scaled_dot) opt.score.scale = 3.0;
    }
  }

  // Pointers to every learned tensor present, with names, for gradient checks.
  std::vector<std::pair<std::string, Tensor*>> params() {
    std::vector<std::pair<std::string, Tensor*>> r;
    for (auto [n, t] : {std::pair<const char*, Tensor*>{"W", &W}, {"b", &b}, {"W_q", &W_q}, {"W_k", &W_k},
                        {"w_v", &w_v}, {"W_a", &W_a}})
      if (t->defined() && t->numel() > 0) r.push_back({n, t});
    return r;
  }
};

inline std::string case_name(score_kind s, distribution_kind d) { return to_string(s) + " x " + to_string(d); }

// Every output and gradient of one family call (got) within tol of another's (want).
inline void expect_family_close(const family_result& got, const family_grads& dgot, const family_result& want,
                                const family_grads& dwant, double tol) {
  EXPECT_TRUE(all_close(got.out, want.out, tol)) << "out";
  EXPECT_TRUE(all_close(dgot.dq, dwant.dq, tol)) << "dq";
  EXPECT_TRUE(all_close(dgot.dk, dwant.dk, tol)) << "dk";
  EXPECT_TRUE(all_close(dgot.dv, dwant.dv, tol)) << "dv";
  for (auto [name, a, b] : {std::tuple{"dW", &dgot.dW, &dwant.dW}, {"db", &dgot.db, &dwant.db},
                            {"dW_q", &dgot.dW_q, &dwant.dW_q}, {"dW_k", &dgot.dW_k, &dwant.dW_k},
                            {"dw_v", &dgot.dw_v, &dwant.dw_v}, {"dW_a", &dgot.dW_a, &dwant.dW_a}}) {
    ASSERT_EQ(a->defined(), b->defined()) << name;
    if (a->defined()) {
      EXPECT_TRUE(all_close(*a, *b, tol)) << name;
    }
  }
  EXPECT_NEAR(dgot.dtemperature, dwant.dtemperature, tol * (1 + std::abs(dwant.dtemperature)));
  EXPECT_NEAR(dgot.dbandwidth, dwant.dbandwidth, tol * (1 + std::abs(dwant.dbandwidth)));
  EXPECT_NEAR(dgot.dsigmoid_bias, dwant.dsigmoid_bias, tol * (1 + std::abs(dwant.dsigmoid_bias)));
}

// A [B, H, N, X] tensor seen through a transposed, non-contiguous view (no copy of its own).
struct strided_copy {
  Tensor storage;  // [B, N, H, X + 3]
  TensorView view;
  explicit strided_copy(const Tensor& t) {
    const std::int64_t B = t.size(0), H = t.size(1), N = t.size(2), X = t.size(3);
    storage = Tensor::zeros({B, N, H, X + 3}, t.type());
    view = storage.view().slice(3, 1, X + 1).permute({0, 2, 1, 3});
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t n = 0; n < N; ++n)
          for (std::int64_t x = 0; x < X; ++x) view.set({b, h, n, x}, t.get({b, h, n, x}));
  }
};

// [B, H, N, X] as the 3-D layout [B, N, H·X].
inline Tensor to3(const TensorView& t) {
  const Tensor p = Tensor::copy_of(t.permute({0, 2, 1, 3}));
  return Tensor::copy_of(p.view().reshape({t.size(0), t.size(2), t.size(1) * t.size(3)}));
}

// Bitwise equality of two tensors (same shape and dtype, same bits once widened).
inline ::testing::AssertionResult same_bits(const TensorView& got, const TensorView& want) {
  if (got.type() != want.type())
    return ::testing::AssertionFailure() << "dtype " << dtype_name(got.type()) << " vs " << dtype_name(want.type());
  return all_close(got, want, 0.0);
}

}  // namespace attn::testing

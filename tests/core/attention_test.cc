// tests/core/attention_test.cc — the core op (float64 reference backend) against the ONNX
// conformance cases, against equivalent formulations (every mask kind expressed as an explicit
// mask, GQA as repeated heads, 3-D as permuted 4-D, strided views as copies), gradients by
// central finite differences, the fully-masked-row contract, and error messages.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "conformance.h"
#include "core/common.h"
#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::random_bool;
using testing::random_tensor;
using detail::kNegInf;

// Options whose calls run on the float64 reference: the overloads below pass them on with
// execution{.use_backend = backend::reference} (better matches than attn's own for ref_options).
struct ref_options : attention_options {};
ref_options ref_opts() { return {}; }
attention_result attention(const TensorView& q, const TensorView& k, const TensorView& v, const ref_options& o) {
  return attn::attention(q, k, v, o, {.use_backend = backend::reference});
}
attention_grads attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& dout, const TensorView& lse,
                                   const ref_options& o) {
  return attn::attention_backward(q, k, v, out, dout, lse, o, {.use_backend = backend::reference});
}

// ---------------------------------------------------------------------------------------------
// ONNX conformance cases through the C++ API.

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, Passes) {
  for (backend be : {backend::reference, backend::automatic}) {
    const conformance::case_result r = conformance::run_case(GetParam(), be);
    EXPECT_TRUE(r.passed) << r.name << ": " << r.detail;
  }
}

std::vector<std::string> conformance_cases() {
  try {
    return conformance::find_cases(ATTN_CONFORMANCE_DIR);
  } catch (const error&) {
    return {};
  }
}

INSTANTIATE_TEST_SUITE_P(Onnx, Conformance, ::testing::ValuesIn(conformance_cases()),
                         [](const auto& info) {
                           std::string n = info.param.substr(info.param.find_last_of('/') + 1);
                           for (auto& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(ConformanceSet, AllShippedCasesFound) { EXPECT_EQ(conformance_cases().size(), 38u); }

// ---------------------------------------------------------------------------------------------
// Equivalent formulations. Each option must equal the same attention written another way.

struct qkv {
  Tensor q, k, v;
};

qkv make(std::mt19937& rng, std::int64_t B, std::int64_t Hq, std::int64_t Hkv, std::int64_t Nq, std::int64_t Nk,
         std::int64_t D, std::int64_t Dv, dtype t = dtype::f64) {
  return {random_tensor({B, Hq, Nq, D}, t, rng), random_tensor({B, Hkv, Nk, D}, t, rng),
          random_tensor({B, Hkv, Nk, Dv}, t, rng)};
}

// A [B, Hq, Nq, Nk] bool mask: keep(b, h, i, j).
template <class F>
Tensor bool_mask(std::int64_t B, std::int64_t H, std::int64_t Nq, std::int64_t Nk, F keep) {
  Tensor m = Tensor::zeros({B, H, Nq, Nk}, dtype::boolean);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t i = 0; i < Nq; ++i)
        for (std::int64_t j = 0; j < Nk; ++j) m.set({b, h, i, j}, keep(b, h, i, j) ? 1 : 0);
  return m;
}

void expect_same(const attention_result& a, const attention_result& b, double tol = 1e-12) {
  EXPECT_TRUE(all_close(a.out, b.out, tol));
  EXPECT_TRUE(all_close(a.lse, b.lse, tol));
}

TEST(Attention, CausalAlignmentsEqualExplicitMasks) {
  std::mt19937 rng(1);
  for (auto [Nq, Nk] : {std::pair{5, 5}, {3, 7}, {7, 3}, {1, 9}}) {
    auto [q, k, v] = make(rng, 2, 2, 2, Nq, Nk, 4, 3);
    for (auto al : {causal_alignment::top_left, causal_alignment::bottom_right}) {
      auto o = ref_opts();
      o.is_causal = true;
      o.alignment = al;
      const std::int64_t off = al == causal_alignment::top_left ? 0 : Nk - Nq;
      Tensor m = bool_mask(2, 2, Nq, Nk, [&](auto, auto, auto i, auto j) { return j <= i + off; });
      auto om = ref_opts();
      om.attn_mask = m.view();
      expect_same(attention(q, k, v, o), attention(q, k, v, om));
    }
  }
}

TEST(Attention, WindowEqualsBandMask) {
  std::mt19937 rng(2);
  auto [q, k, v] = make(rng, 1, 3, 1, 6, 9, 5, 5);
  for (auto [wl, wr] : {std::pair{2, 0}, {0, 1}, {3, -1}, {-1, 2}, {1, 1}}) {
    for (auto al : {causal_alignment::top_left, causal_alignment::bottom_right}) {
      auto o = ref_opts();
      o.window_left = wl, o.window_right = wr, o.alignment = al;
      const std::int64_t off = al == causal_alignment::top_left ? 0 : 9 - 6;
      Tensor m = bool_mask(1, 3, 6, 9, [&](auto, auto, auto i, auto j) {
        const std::int64_t p = i + off;
        return (wl < 0 || j >= p - wl) && (wr < 0 || j <= p + wr);
      });
      auto om = ref_opts();
      om.attn_mask = m.view();
      expect_same(attention(q, k, v, o), attention(q, k, v, om));
    }
  }
}

TEST(Attention, NonpadEqualsPaddingMaskAndMovesTheFrontier) {
  std::mt19937 rng(3);
  auto [q, k, v] = make(rng, 3, 2, 1, 4, 8, 3, 2);
  Tensor lens = Tensor::from_values({3}, dtype::i64, {8, 5, 0});
  for (bool causal : {false, true}) {
    auto o = ref_opts();
    o.nonpad_kv_seqlen = lens.view();
    o.is_causal = causal;
    o.alignment = causal_alignment::bottom_right;
    Tensor m = bool_mask(3, 2, 4, 8, [&](auto b, auto, auto i, auto j) {
      const std::int64_t n = std::int64_t(lens.get({b}));
      return j < n && (!causal || j <= i + n - 4);
    });
    auto om = ref_opts();
    om.attn_mask = m.view();
    const auto a = attention(q, k, v, o);
    expect_same(a, attention(q, k, v, om));
    EXPECT_EQ(a.lse.get({2, 0, 0}), kNegInf);  // batch 2 has no keys at all
  }
}

TEST(Attention, AlibiEqualsFloatMask) {
  std::mt19937 rng(4);
  auto [q, k, v] = make(rng, 2, 3, 3, 4, 6, 4, 4);
  Tensor slopes = Tensor::from_values({3}, dtype::f64, {0.5, 0.25, 0.125});
  for (bool causal : {false, true}) {
    auto o = ref_opts();
    o.alibi_slopes = slopes.view();
    o.is_causal = causal;
    o.alignment = causal_alignment::bottom_right;
    Tensor m = Tensor::zeros({1, 3, 4, 6}, dtype::f64);
    for (std::int64_t h = 0; h < 3; ++h)
      for (std::int64_t i = 0; i < 4; ++i)
        for (std::int64_t j = 0; j < 6; ++j) {
          const std::int64_t p = i + 2;
          m.set({0, h, i, j}, (causal && j > p) ? kNegInf : -slopes.get({h}) * double(std::abs(p - j)));
        }
    auto om = ref_opts();
    om.attn_mask = m.view();
    expect_same(attention(q, k, v, o), attention(q, k, v, om));
  }
}

TEST(Attention, SinkJoinsTheDenominatorOnly) {
  std::mt19937 rng(5);
  auto [q, k, v] = make(rng, 1, 2, 2, 3, 4, 4, 4);
  Tensor sinks = Tensor::from_values({2}, dtype::f64, {0.3, -1.2});
  auto o = ref_opts();
  o.sinks = sinks.view();
  const auto with = attention(q, k, v, o);
  const auto without = attention(q, k, v, ref_opts());
  for (std::int64_t h = 0; h < 2; ++h)
    for (std::int64_t i = 0; i < 3; ++i) {
      const double l = without.lse.get({0, h, i}), s = sinks.get({h});
      const double lse = std::log(std::exp(l) + std::exp(s));
      EXPECT_NEAR(with.lse.get({0, h, i}), lse, 1e-12);
      for (std::int64_t d = 0; d < 4; ++d)
        EXPECT_NEAR(with.out.get({0, h, i, d}), without.out.get({0, h, i, d}) * std::exp(l - lse), 1e-12);
    }
}

TEST(Attention, SoftcapAndScaleMatchFormula) {
  std::mt19937 rng(6);
  auto [q, k, v] = make(rng, 1, 1, 1, 2, 3, 4, 2);
  auto o = ref_opts();
  o.softcap = 0.7;
  o.scale = 1.9;
  o.return_qk = qk_output::probabilities;
  const auto r = attention(q, k, v, o);
  for (std::int64_t i = 0; i < 2; ++i) {
    double e[3], z = 0;
    for (std::int64_t j = 0; j < 3; ++j) {
      double dot = 0;
      for (std::int64_t d = 0; d < 4; ++d) dot += q.get({0, 0, i, d}) * k.get({0, 0, j, d});
      e[j] = std::exp(0.7 * std::tanh(1.9 * dot / 0.7));
      z += e[j];
    }
    for (std::int64_t j = 0; j < 3; ++j) EXPECT_NEAR(r.qk.get({0, 0, i, j}), e[j] / z, 1e-14);
    for (std::int64_t d = 0; d < 2; ++d) {
      double want = 0;
      for (std::int64_t j = 0; j < 3; ++j) want += e[j] / z * v.get({0, 0, j, d});
      EXPECT_NEAR(r.out.get({0, 0, i, d}), want, 1e-14);
    }
  }
}

TEST(Attention, GroupedQueryEqualsRepeatedHeads) {
  std::mt19937 rng(7);
  for (std::int64_t Hkv : {1, 2, 3}) {
    const std::int64_t Hq = 6, G = Hq / Hkv;
    auto [q, k, v] = make(rng, 2, Hq, Hkv, 3, 5, 4, 2);
    Tensor k2 = Tensor::empty({2, Hq, 5, 4}, dtype::f64), v2 = Tensor::empty({2, Hq, 5, 2}, dtype::f64);
    for (std::int64_t h = 0; h < Hq; ++h) {
      const auto ks = Tensor::copy_of(k.view().slice(1, h / G, h / G + 1));
      const auto vs = Tensor::copy_of(v.view().slice(1, h / G, h / G + 1));
      for (std::int64_t b = 0; b < 2; ++b)
        for (std::int64_t j = 0; j < 5; ++j) {
          for (std::int64_t d = 0; d < 4; ++d) k2.set({b, h, j, d}, ks.get({b, 0, j, d}));
          for (std::int64_t d = 0; d < 2; ++d) v2.set({b, h, j, d}, vs.get({b, 0, j, d}));
        }
    }
    auto o = ref_opts();
    o.is_causal = true;
    expect_same(attention(q, k, v, o), attention(q, k2, v2, o));
  }
}

TEST(Attention, ThreeDLayoutEqualsFourD) {
  std::mt19937 rng(8);
  const std::int64_t B = 2, Hq = 4, Hkv = 2, Nq = 3, Nk = 5, D = 3, Dv = 5;
  Tensor q3 = random_tensor({B, Nq, Hq * D}, dtype::f64, rng), k3 = random_tensor({B, Nk, Hkv * D}, dtype::f64, rng),
         v3 = random_tensor({B, Nk, Hkv * Dv}, dtype::f64, rng);
  auto o = ref_opts();
  o.q_num_heads = Hq, o.kv_num_heads = Hkv, o.is_causal = true;
  const auto r3 = attention(q3, k3, v3, o);
  ASSERT_EQ(r3.out.shape(), (Shape{B, Nq, Hq * Dv}));
  auto to4 = [](const Tensor& t, std::int64_t H) {
    return t.view().reshape({t.size(0), t.size(1), H, t.size(2) / H}).permute({0, 2, 1, 3});
  };
  const auto r4 = attention(to4(q3, Hq), to4(k3, Hkv), to4(v3, Hkv), o);  // strided 4-D views
  EXPECT_TRUE(all_close(Tensor::copy_of(to4(r3.out, Hq)), r4.out, 1e-14));
  EXPECT_TRUE(all_close(r3.lse, r4.lse, 1e-14));
}

TEST(Attention, StridedAndBroadcastViewsEqualCopies) {
  std::mt19937 rng(9);
  // q as a transposed view of [B, Nq, Hq, D] storage; k broadcast over batch (stride 0).
  Tensor qs = random_tensor({2, 5, 3, 4}, dtype::f32, rng);
  Tensor k1 = random_tensor({1, 3, 6, 4}, dtype::f32, rng);
  Tensor vs = random_tensor({2, 3, 6, 10}, dtype::f32, rng);
  const TensorView q = qs.view().permute({0, 2, 1, 3});
  const TensorView k = k1.view().broadcast_to({2, 3, 6, 4});
  const TensorView v = vs.view().slice(3, 2, 9);  // Dv = 7, row stride 10
  auto o = ref_opts();
  o.is_causal = true;
  const auto a = attention(q, k, v, o);
  const auto b = attention(Tensor::copy_of(q), Tensor::copy_of(k), Tensor::copy_of(v), o);
  EXPECT_TRUE(all_close(a.out, b.out, 0));
  EXPECT_TRUE(all_close(a.lse, b.lse, 0));
}

TEST(Attention, MaskShorterThanKeysIsPadded) {
  std::mt19937 rng(10);
  auto [q, k, v] = make(rng, 1, 2, 2, 3, 6, 4, 4);
  Tensor fm = random_tensor({3, 4}, dtype::f64, rng);
  auto o = ref_opts();
  o.attn_mask = fm.view();
  Tensor full = Tensor::full({3, 6}, dtype::f64, kNegInf);
  for (std::int64_t i = 0; i < 3; ++i)
    for (std::int64_t j = 0; j < 4; ++j) full.set({i, j}, fm.get({i, j}));
  auto o2 = ref_opts();
  o2.attn_mask = full.view();
  expect_same(attention(q, k, v, o), attention(q, k, v, o2));
  Tensor bm = random_bool({2, 1, 4}, rng);  // [Hq, 1, Nk'] broadcast over B and Nq
  o.attn_mask = bm.view();
  Tensor bfull = bool_mask(1, 2, 3, 6, [&](auto, auto h, auto, auto j) { return j < 4 && bm.get({h, 0, j}) != 0; });
  o2.attn_mask = bfull.view();
  expect_same(attention(q, k, v, o), attention(q, k, v, o2));
}

TEST(Attention, KvCacheEqualsConcatenation) {
  std::mt19937 rng(11);
  auto [q, k, v] = make(rng, 2, 4, 2, 3, 3, 4, 5);
  Tensor pk = random_tensor({2, 2, 6, 4}, dtype::f64, rng), pv = random_tensor({2, 2, 6, 5}, dtype::f64, rng);
  auto o = ref_opts();
  o.past_key = pk.view(), o.past_value = pv.view();
  o.is_causal = true, o.alignment = causal_alignment::after_past;
  const auto r = attention(q, k, v, o);
  ASSERT_EQ(r.present_key.shape(), (Shape{2, 2, 9, 4}));
  EXPECT_EQ(r.present_key.get({1, 1, 7, 2}), k.get({1, 1, 1, 2}));
  EXPECT_EQ(r.present_value.get({0, 1, 5, 4}), pv.get({0, 1, 5, 4}));
  auto o2 = ref_opts();
  o2.is_causal = true, o2.alignment = causal_alignment::bottom_right;  // same frontier when Nk_new == Nq
  expect_same(r, attention(q, r.present_key, r.present_value, o2));
}

TEST(Attention, FullyMaskedRowsGiveZerosNeverNaN) {
  std::mt19937 rng(12);
  for (dtype t : {dtype::f64, dtype::f32, dtype::f16, dtype::bf16}) {
    auto [q, k, v] = make(rng, 1, 2, 1, 3, 4, 4, 3, t);
    Tensor m = Tensor::from_values({3, 4}, dtype::f32,
                                   {0, 0, 0, 0, kNegInf, kNegInf, kNegInf, kNegInf, 0, kNegInf, 0, 0});
    auto o = ref_opts();
    o.attn_mask = m.view();
    o.return_qk = qk_output::probabilities;
    const auto r = attention(q, k, v, o);
    EXPECT_FALSE(testing::any_nan(r.out));
    EXPECT_FALSE(testing::any_nan(r.qk));
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(r.lse.get({0, h, 1}), kNegInf);
      for (std::int64_t d = 0; d < 3; ++d) EXPECT_EQ(r.out.get({0, h, 1, d}), 0.0);
      for (std::int64_t j = 0; j < 4; ++j) EXPECT_EQ(r.qk.get({0, h, 1, j}), 0.0);
    }
    Tensor dout = random_tensor(r.out.shape(), t, rng);
    o.return_qk = qk_output::none;
    const auto g = attention_backward(q, k, v, r.out, dout, r.lse, o);
    for (const Tensor* x : {&g.dq, &g.dk, &g.dv}) EXPECT_FALSE(testing::any_nan(*x));
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t d = 0; d < 4; ++d) EXPECT_EQ(g.dq.get({0, h, 1, d}), 0.0);
  }
}

TEST(Attention, EmptyKeySetAndEmptyDims) {
  std::mt19937 rng(13);
  auto [q, k, v] = make(rng, 2, 2, 1, 3, 0, 4, 5);
  const auto r = attention(q, k, v, ref_opts());
  EXPECT_EQ(r.out.shape(), (Shape{2, 2, 3, 5}));
  for (double x : r.out.to_vector()) EXPECT_EQ(x, 0.0);
  for (double x : r.lse.to_vector()) EXPECT_EQ(x, kNegInf);
  auto [q0, k0, v0] = make(rng, 0, 2, 1, 3, 4, 4, 5);
  EXPECT_EQ(attention(q0, k0, v0, ref_opts()).out.numel(), 0);
  auto [q1, k1, v1] = make(rng, 1, 1, 1, 0, 4, 4, 5);
  EXPECT_EQ(attention(q1, k1, v1, ref_opts()).out.numel(), 0);
}

TEST(Attention, LargeLogitsStayFinite) {
  Tensor q = Tensor::from_values({1, 1, 2, 1}, dtype::f32, {1e4, -1e4});
  Tensor k = Tensor::from_values({1, 1, 3, 1}, dtype::f32, {1.0, 0.5, -1.0});
  Tensor v = Tensor::from_values({1, 1, 3, 1}, dtype::f32, {1.0, 2.0, 3.0});
  auto o = ref_opts();
  o.scale = 1.0;
  const auto r = attention(q, k, v, o);
  EXPECT_NEAR(r.out.get({0, 0, 0, 0}), 1.0, 1e-6);
  EXPECT_NEAR(r.out.get({0, 0, 1, 0}), 3.0, 1e-6);
  EXPECT_NEAR(r.lse.get({0, 0, 0}), 1e4, 1e-2);
}

TEST(Attention, LowPrecisionDtypesTrackFloat64) {
  std::mt19937 rng(14);
  auto [q, k, v] = make(rng, 2, 4, 2, 5, 7, 6, 3);
  auto o = ref_opts();
  o.is_causal = true;
  const auto want = attention(q, k, v, o);
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16}) {
    const auto got = attention(q.to(t), k.to(t), v.to(t), o);
    EXPECT_EQ(got.out.type(), t);
    EXPECT_EQ(got.lse.type(), dtype::f32);
    EXPECT_TRUE(all_close(got.out, want.out, 4 * testing::tolerance_for(t))) << dtype_name(t);
  }
}

TEST(Attention, IntermediatesFollowOnnxModes) {
  std::mt19937 rng(15);
  auto [q, k, v] = make(rng, 1, 1, 1, 2, 3, 2, 2);
  Tensor m = Tensor::from_values({2, 3}, dtype::f64, {0.5, kNegInf, 0.0, 0.1, 0.2, 0.3});
  auto o = ref_opts();
  o.attn_mask = m.view();
  o.softcap = 0.5;
  o.return_qk = qk_output::scaled;
  const Tensor x = attention(q, k, v, o).qk;
  o.return_qk = qk_output::softcapped;
  const Tensor c = attention(q, k, v, o).qk;
  o.return_qk = qk_output::biased;
  const Tensor s = attention(q, k, v, o).qk;
  for (std::int64_t i = 0; i < 2; ++i)
    for (std::int64_t j = 0; j < 3; ++j) {
      EXPECT_NEAR(c.get({0, 0, i, j}), 0.5 * std::tanh(x.get({0, 0, i, j}) / 0.5), 1e-14);
      EXPECT_EQ(s.get({0, 0, i, j}), c.get({0, 0, i, j}) + m.get({i, j}));
    }
}

// ---------------------------------------------------------------------------------------------
// Gradients by central finite differences (float64).

struct grad_case {
  const char* name;
  std::int64_t B, Hq, Hkv, Nq, Nk, D, Dv;
  void (*setup)(attention_options&, std::mt19937&, std::vector<Tensor>&);
  bool three_d = false;
};

// L = Σ out ∘ W for a fixed random W; its gradient w.r.t. out is W.
double loss(const TensorView& q, const TensorView& k, const TensorView& v, const attention_options& o, const Tensor& w) {
  const auto r = attention(q, k, v, o);
  const auto a = r.out.to_vector(), b = w.to_vector();
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks d loss / d t against central differences for every element of `t`.
void check_fd(const char* what, const Tensor& t, const Tensor& grad, const std::function<double()>& f) {
  ASSERT_TRUE(grad.defined()) << what;
  ASSERT_EQ(grad.shape(), t.shape()) << what;
  const double h = 1e-6;
  double* p = t.data_as<double>();
  const auto g = grad.to_vector();
  for (std::int64_t i = 0; i < t.numel(); ++i) {
    const double x = p[i];
    if (std::isinf(x)) continue;
    p[i] = x + h;
    const double fp = f();
    p[i] = x - h;
    const double fm = f();
    p[i] = x;
    const double fd = (fp - fm) / (2 * h);
    EXPECT_NEAR(g[std::size_t(i)], fd, 1e-6 + 1e-6 * std::abs(fd)) << what << " element " << i;
  }
}

void PrintTo(const grad_case& c, std::ostream* os) { *os << c.name; }

class Gradients : public ::testing::TestWithParam<grad_case> {};

TEST_P(Gradients, MatchFiniteDifferences) {
  const grad_case& c = GetParam();
  std::mt19937 rng(42);
  Tensor q, k, v;
  if (c.three_d) {
    q = random_tensor({c.B, c.Nq, c.Hq * c.D}, dtype::f64, rng);
    k = random_tensor({c.B, c.Nk, c.Hkv * c.D}, dtype::f64, rng);
    v = random_tensor({c.B, c.Nk, c.Hkv * c.Dv}, dtype::f64, rng);
  } else {
    q = random_tensor({c.B, c.Hq, c.Nq, c.D}, dtype::f64, rng);
    k = random_tensor({c.B, c.Hkv, c.Nk, c.D}, dtype::f64, rng);
    v = random_tensor({c.B, c.Hkv, c.Nk, c.Dv}, dtype::f64, rng);
  }
  auto o = ref_opts();
  o.q_num_heads = c.Hq, o.kv_num_heads = c.Hkv;
  std::vector<Tensor> params;
  if (c.setup) c.setup(o, rng, params);
  const auto r = attention(q, k, v, o);
  const Tensor w = random_tensor(r.out.shape(), dtype::f64, rng);
  const auto g = attention_backward(q, k, v, r.out, w, r.lse, o);
  auto f = [&] { return loss(q, k, v, o, w); };
  check_fd("dq", q, g.dq, f);
  check_fd("dk", k, g.dk, f);
  check_fd("dv", v, g.dv, f);
  if (o.attn_mask && o.attn_mask->type() == dtype::f64) check_fd("dattn_mask", params[0], g.dattn_mask, f);
  if (o.alibi_slopes) check_fd("dalibi_slopes", params.back(), g.dalibi_slopes, f);
  if (o.sinks) check_fd("dsinks", params.back(), g.dsinks, f);
}

void float_mask(attention_options& o, std::mt19937& rng, std::vector<Tensor>& keep) {
  keep.push_back(random_tensor({2, 1, 4}, dtype::f64, rng));  // [Hq, 1, Nk'] padded to Nk
  o.attn_mask = keep.back().view();
}
void causal_br(attention_options& o, std::mt19937&, std::vector<Tensor>&) {
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
}
void causal_tl(attention_options& o, std::mt19937&, std::vector<Tensor>&) { o.is_causal = true; }
void softcap(attention_options& o, std::mt19937&, std::vector<Tensor>&) { o.softcap = 0.8, o.scale = 2.0; }
void window(attention_options& o, std::mt19937&, std::vector<Tensor>&) { o.window_left = 1, o.window_right = 1; }
void alibi(attention_options& o, std::mt19937& rng, std::vector<Tensor>& keep) {
  keep.push_back(random_tensor({2}, dtype::f64, rng, 0.1, 0.9));
  o.alibi_slopes = keep.back().view();
  o.is_causal = true;
}
void alibi_b(attention_options& o, std::mt19937& rng, std::vector<Tensor>& keep) {
  keep.push_back(random_tensor({2, 2}, dtype::f64, rng, 0.1, 0.9));
  o.alibi_slopes = keep.back().view();
}
void sinks(attention_options& o, std::mt19937& rng, std::vector<Tensor>& keep) {
  keep.push_back(random_tensor({2}, dtype::f64, rng));
  o.sinks = keep.back().view();
}
void nonpad(attention_options& o, std::mt19937&, std::vector<Tensor>& keep) {
  keep.push_back(Tensor::from_values({2}, dtype::i64, {5, 2}));
  o.nonpad_kv_seqlen = keep.back().view();
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
}
void everything(attention_options& o, std::mt19937& rng, std::vector<Tensor>& keep) {
  float_mask(o, rng, keep);
  o.softcap = 1.5, o.window_left = 3, o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  keep.push_back(random_tensor({2}, dtype::f64, rng));
  o.sinks = keep.back().view();
}

INSTANTIATE_TEST_SUITE_P(
    Reference, Gradients,
    ::testing::Values(grad_case{"plain", 2, 2, 2, 3, 4, 3, 2, nullptr}, grad_case{"dv_ne_d", 1, 2, 1, 2, 5, 2, 4, nullptr},
                      grad_case{"gqa", 1, 4, 2, 3, 3, 2, 2, causal_tl}, grad_case{"mqa", 1, 3, 1, 2, 4, 3, 2, nullptr},
                      grad_case{"float_mask", 2, 2, 2, 3, 5, 2, 2, float_mask},
                      grad_case{"causal_bottom_right", 1, 2, 2, 3, 5, 3, 2, causal_br},
                      grad_case{"softcap", 1, 2, 2, 3, 4, 3, 3, softcap}, grad_case{"window", 1, 2, 1, 4, 5, 2, 2, window},
                      grad_case{"alibi", 1, 2, 2, 3, 4, 2, 2, alibi}, grad_case{"alibi_per_batch", 2, 2, 1, 2, 3, 2, 2, alibi_b},
                      grad_case{"sinks", 1, 2, 2, 3, 4, 2, 3, sinks}, grad_case{"nonpad", 2, 2, 2, 3, 5, 2, 2, nonpad},
                      grad_case{"three_d", 2, 4, 2, 3, 4, 2, 3, causal_tl, true},
                      grad_case{"everything", 1, 2, 1, 4, 5, 3, 2, everything}),
    [](const auto& info) { return std::string(info.param.name); });

// ---------------------------------------------------------------------------------------------
// Bad input: an attn::error naming the op, the argument and the values.

TEST(AttentionErrors, MessagesNameOpArgumentAndValues) {
  std::mt19937 rng(16);
  auto [q, k, v] = make(rng, 2, 4, 2, 3, 5, 8, 6, dtype::f32);
  Tensor q5 = Tensor::zeros({1, 1, 1, 1, 1}, dtype::f32);
  EXPECT_THROW_MSG(attention(q5, q5, q5), "attention: q has 5 dims, expected 4 (B, Hq, Nq, D) or 3");
  EXPECT_THROW_MSG(attention(q, k, v.to(dtype::f64)), "q, k, v have dtypes float32, float32, float64");
  Tensor qi = Tensor::zeros({2, 4, 3, 8}, dtype::i64);
  EXPECT_THROW_MSG(attention(qi, k, v), "q has dtype int64");
  Tensor k7 = Tensor::zeros({2, 2, 5, 7}, dtype::f32);
  EXPECT_THROW_MSG(attention(q, k7, v), "k has head size 7");
  Tensor k3 = Tensor::zeros({2, 3, 5, 8}, dtype::f32), v3 = Tensor::zeros({2, 3, 5, 6}, dtype::f32);
  EXPECT_THROW_MSG(attention(q, k3, v3), "q has 4 heads and k/v 3; Hq must be a positive multiple of Hkv");
  Tensor vb = Tensor::zeros({2, 2, 4, 6}, dtype::f32);
  EXPECT_THROW_MSG(attention(q, k, vb), "v has shape [2, 2, 4, 6], expected [B, 2, 5, Dv]");
  Tensor kb = Tensor::zeros({3, 2, 5, 8}, dtype::f32), vbb = Tensor::zeros({3, 2, 5, 6}, dtype::f32);
  EXPECT_THROW_MSG(attention(q, kb, vbb), "batch sizes differ: q 2, k 3, v 3");

  attention_options o;
  o.q_num_heads = 3;
  EXPECT_THROW_MSG(attention(q, k, v, o), "q_num_heads = 3 but 4-D q [2, 4, 3, 8] has 4 heads");
  Tensor q3 = Tensor::zeros({2, 3, 32}, dtype::f32), k3d = Tensor::zeros({2, 5, 16}, dtype::f32);
  EXPECT_THROW_MSG(attention(q3, k3d, k3d), "3-D inputs need q_num_heads and kv_num_heads (got 0 and 0)");
  o = {};
  o.q_num_heads = 5, o.kv_num_heads = 2;
  EXPECT_THROW_MSG(attention(q3, k3d, k3d, o), "q hidden size 32 is not a multiple of q_num_heads = 5");

  o = {};
  Tensor m = Tensor::zeros({3, 6}, dtype::boolean);
  o.attn_mask = m.view();
  EXPECT_THROW_MSG(attention(q, k, v, o), "attn_mask [3, 6] has 6 columns but there are 5 keys");
  Tensor m2 = Tensor::zeros({2, 3, 5}, dtype::f32);
  o.attn_mask = m2.view();
  EXPECT_THROW_MSG(attention(q, k, v, o), "attn_mask [2, 3, 5] does not broadcast to [B, Hq, Nq, Nk] = [2, 4, 3, 5]");
  Tensor mi = Tensor::zeros({3, 5}, dtype::i64);
  o.attn_mask = mi.view();
  EXPECT_THROW_MSG(attention(q, k, v, o), "attn_mask has dtype int64, expected bool or a float dtype");

  o = {};
  Tensor lens = Tensor::from_values({2}, dtype::i64, {5, 9});
  o.nonpad_kv_seqlen = lens.view();
  EXPECT_THROW_MSG(attention(q, k, v, o), "nonpad_kv_seqlen[1] = 9 is outside [0, 5]");
  Tensor lensf = Tensor::zeros({2}, dtype::f32);
  o.nonpad_kv_seqlen = lensf.view();
  EXPECT_THROW_MSG(attention(q, k, v, o), "nonpad_kv_seqlen has dtype float32, expected int64");

  o = {};
  o.softcap = -1;
  EXPECT_THROW_MSG(attention(q, k, v, o), "softcap = -1 must be finite and >= 0");
  o = {};
  o.scale = std::numeric_limits<double>::infinity();
  EXPECT_THROW_MSG(attention(q, k, v, o), "scale = inf is not finite");
  o = {};
  Tensor slopes = Tensor::zeros({3}, dtype::f32);
  o.alibi_slopes = slopes.view();
  EXPECT_THROW_MSG(attention(q, k, v, o), "alibi_slopes has shape [3], expected [Hq] = [4] or [B, Hq] = [2, 4]");
  o = {};
  Tensor sk = Tensor::zeros({2}, dtype::f32);
  o.sinks = sk.view();
  EXPECT_THROW_MSG(attention(q, k, v, o), "sinks has shape [2], expected [Hq] = [4]");
  o = {};
  Tensor pk = Tensor::zeros({2, 2, 4, 8}, dtype::f32);
  o.past_key = pk.view();
  EXPECT_THROW_MSG(attention(q, k, v, o), "past_key and past_value must be given together");
  Tensor pv = Tensor::zeros({2, 2, 3, 6}, dtype::f32);
  o.past_value = pv.view();
  EXPECT_THROW_MSG(attention(q, k, v, o), "past_value has shape [2, 2, 3, 6], expected [2, 2, 4, 6]");
  o = {};
  EXPECT_THROW_MSG(attention(q, k, v, o, {.num_threads = -2}), "num_threads = -2 must be >= 0");
  Tensor q0 = Tensor::zeros({1, 1, 1, 0}, dtype::f32);
  EXPECT_THROW_MSG(attention(q0, q0, q0), "head size D is 0");
}

TEST(AttentionErrors, BackwardChecksItsExtraInputs) {
  std::mt19937 rng(17);
  auto [q, k, v] = make(rng, 1, 2, 2, 3, 4, 4, 4, dtype::f32);
  const auto r = attention(q, k, v);
  Tensor bad = Tensor::zeros({1, 2, 3, 5}, dtype::f32);
  EXPECT_THROW_MSG(attention_backward(q, k, v, r.out, bad, r.lse), "attention_backward: dout has shape [1, 2, 3, 5], expected [1, 2, 3, 4]");
  Tensor lse = Tensor::zeros({1, 2, 4}, dtype::f32);
  EXPECT_THROW_MSG(attention_backward(q, k, v, r.out, r.out, lse), "lse has shape [1, 2, 4], expected [1, 2, 3]");
  attention_options o;
  Tensor pk = Tensor::zeros({1, 2, 1, 4}, dtype::f32);
  o.past_key = pk.view(), o.past_value = pk.view();
  EXPECT_THROW_MSG(attention_backward(q, k, v, r.out, r.out, r.lse, o), "pass present_key/present_value as k and v");
}

TEST(AttentionBackends, ReferenceIsAlwaysAvailableAndExplained) {
  const auto names = backends();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names.back(), "reference");
  std::mt19937 rng(18);
  auto [q, k, v] = make(rng, 1, 1, 1, 2, 2, 2, 2, dtype::f64);  // float64: what only the reference runs
  attention_options o;
  o.return_qk = qk_output::probabilities;
  EXPECT_NE(explain_backend(q, k, v, o).find("runs on reference"), std::string::npos);
  EXPECT_EQ(attention(q, k, v, o).backend, "reference");
}

}  // namespace
}  // namespace attn

// tests/core/attention_sweep_test.cc — random sweeps: every option combined at random (odd sizes,
// 0 and 1, D not a multiple of 8, Nq != Nk, GQA ratios, 3-D and strided layouts, every mask
// kind and alignment, windows, kv lengths, softcap, ALiBi, sinks, all dtypes), checked against
// a dense formulation written here from the formula documented in attn/attention.h — not from
// the library's own helpers.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/common.h"
#include "test_util.h"

namespace attn {
namespace {

using detail::kNegInf;

struct config {
  std::int64_t B, Hq, Hkv, Nq, Nk, D, Dv;
  attention_options o;
  std::vector<Tensor> keep;  // option tensors
  bool three_d = false;
};

// Dense [B, Hq, Nq, Dv] output and [B, Hq, Nq] lse from the documented formula.
void dense(const config& c, const Tensor& q, const Tensor& k, const Tensor& v, std::vector<double>& out,
           std::vector<double>& lse) {
  auto Q = [&](auto b, auto h, auto i, auto d) { return c.three_d ? q.get({b, i, h * c.D + d}) : q.get({b, h, i, d}); };
  auto K = [&](auto b, auto h, auto j, auto d) { return c.three_d ? k.get({b, j, h * c.D + d}) : k.get({b, h, j, d}); };
  auto V = [&](auto b, auto h, auto j, auto d) { return c.three_d ? v.get({b, j, h * c.Dv + d}) : v.get({b, h, j, d}); };
  const attention_options& o = c.o;
  const double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(c.D));
  Tensor mask;
  if (o.attn_mask) {  // pad the last dim with false / -inf, then broadcast
    const TensorView& m = *o.attn_mask;
    Shape s = m.shape();
    s.back() = c.Nk;
    mask = Tensor::full(s, m.type(), m.type() == dtype::boolean ? 0.0 : kNegInf);
    Tensor mc = Tensor::copy_of(m);
    const auto src = mc.to_vector();
    const std::int64_t cols = m.shape().back(), rows = m.numel() / std::max<std::int64_t>(cols, 1);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < cols; ++j)
        store_from_double(mask.data(), mask.type(), r * c.Nk + j, src[std::size_t(r * cols + j)]);
  }
  const TensorView mb = mask.defined() ? mask.view().broadcast_to({c.B, c.Hq, c.Nq, c.Nk}) : TensorView();
  out.assign(std::size_t(c.B * c.Hq * c.Nq * c.Dv), 0.0);
  lse.assign(std::size_t(c.B * c.Hq * c.Nq), kNegInf);
  for (std::int64_t b = 0; b < c.B; ++b) {
    const std::int64_t nk = o.nonpad_kv_seqlen ? std::int64_t(o.nonpad_kv_seqlen->get({b})) : c.Nk;
    for (std::int64_t h = 0; h < c.Hq; ++h) {
      const std::int64_t hk = h / (c.Hq / c.Hkv);
      for (std::int64_t i = 0; i < c.Nq; ++i) {
        const std::int64_t pos = o.alignment == causal_alignment::top_left      ? i
                                 : o.alignment == causal_alignment::bottom_right ? nk - c.Nq + i
                                                                                 : (o.past_key ? o.past_key->size(2) : 0) + i;
        std::vector<double> s(std::size_t(c.Nk), kNegInf);
        for (std::int64_t j = 0; j < c.Nk; ++j) {
          if (j >= nk || (o.is_causal && j > pos)) continue;
          if (o.window_left >= 0 && j < pos - o.window_left) continue;
          if (o.window_right >= 0 && j > pos + o.window_right) continue;
          double x = 0;
          for (std::int64_t d = 0; d < c.D; ++d) x += Q(b, h, i, d) * K(b, hk, j, d);
          x *= scale;
          if (o.softcap > 0) x = o.softcap * std::tanh(x / o.softcap);
          if (mb.defined()) {
            const double m = mb.get({b, h, i, j});
            if (mb.type() == dtype::boolean) {
              if (m == 0) continue;
            } else {
              x += m;
            }
          }
          if (o.alibi_slopes) {
            const double slope = o.alibi_slopes->rank() == 1 ? o.alibi_slopes->get({h}) : o.alibi_slopes->get({b, h});
            x -= slope * double(std::abs(pos - j));
          }
          s[std::size_t(j)] = x;
        }
        double m = o.sinks ? o.sinks->get({h}) : kNegInf;
        for (double x : s) m = std::max(m, x);
        if (m == kNegInf) continue;
        double z = o.sinks ? std::exp(o.sinks->get({h}) - m) : 0.0;
        for (double x : s) z += std::exp(x - m);
        const std::size_t row = std::size_t((b * c.Hq + h) * c.Nq + i);
        lse[row] = m + std::log(z);
        for (std::int64_t j = 0; j < c.Nk; ++j) {
          const double p = std::exp(s[std::size_t(j)] - lse[row]);
          for (std::int64_t d = 0; d < c.Dv; ++d) out[row * std::size_t(c.Dv) + std::size_t(d)] += p * V(b, hk, j, d);
        }
      }
    }
  }
}

config random_config(std::mt19937& rng) {
  auto pick = [&](std::initializer_list<std::int64_t> xs) { return *(xs.begin() + rng() % xs.size()); };
  config c;
  c.B = pick({1, 2, 3});
  c.Hkv = pick({1, 2, 3});
  c.Hq = c.Hkv * pick({1, 2, 3});
  c.Nq = pick({0, 1, 2, 5, 7, 13});
  c.Nk = pick({0, 1, 3, 6, 11, 17});
  c.D = pick({1, 3, 8, 9, 17});
  c.Dv = pick({1, 4, 5, 16});
  c.three_d = rng() % 4 == 0;
  attention_options& o = c.o;
  if (c.three_d) o.q_num_heads = c.Hq, o.kv_num_heads = c.Hkv;
  if (rng() % 3 == 0) o.scale = 0.3 + (rng() % 100) / 50.0;
  o.is_causal = rng() % 2;
  o.alignment = rng() % 2 ? causal_alignment::top_left : causal_alignment::bottom_right;
  if (rng() % 4 == 0) o.window_left = std::int64_t(rng() % 4);
  if (rng() % 4 == 0) o.window_right = std::int64_t(rng() % 3);
  if (rng() % 4 == 0) o.softcap = 0.5 + (rng() % 10) / 4.0;
  const int mk = int(rng() % 4);  // 0 none, 1 bool, 2 float, 3 float with -inf
  if (mk) {
    Shape s;
    const std::int64_t full[4] = {c.B, c.Hq, c.Nq, c.Nk};
    const int rank = 1 + int(rng() % 4);
    for (int d = 4 - rank; d < 4; ++d) s.push_back(rng() % 3 == 0 ? 1 : full[d]);
    if (c.Nk > 1 && rng() % 3 == 0) s.back() = c.Nk - 1 - std::int64_t(rng() % std::uint64_t(c.Nk - 1));  // padded
    Tensor m = mk == 1 ? testing::random_bool(s, rng) : testing::random_tensor(s, dtype::f32, rng, -2, 2);
    if (mk == 3)
      for (std::int64_t e = 0; e < m.numel(); ++e)
        if (rng() % 4 == 0) m.data_as<float>()[e] = -INFINITY;
    c.keep.push_back(m);
    o.attn_mask = c.keep.back().view();
  }
  if (rng() % 4 == 0) {
    std::vector<double> l;
    for (std::int64_t b = 0; b < c.B; ++b) l.push_back(double(rng() % std::uint64_t(c.Nk + 1)));
    c.keep.push_back(Tensor::from_values({c.B}, dtype::i64, l));
    o.nonpad_kv_seqlen = c.keep.back().view();
  }
  if (rng() % 5 == 0) {
    c.keep.push_back(rng() % 2 ? testing::random_tensor({c.Hq}, dtype::f32, rng, 0, 1)
                               : testing::random_tensor({c.B, c.Hq}, dtype::f32, rng, 0, 1));
    o.alibi_slopes = c.keep.back().view();
  }
  if (rng() % 5 == 0) {
    c.keep.push_back(testing::random_tensor({c.Hq}, dtype::f32, rng, -1, 1));
    o.sinks = c.keep.back().view();
  }
  return c;
}

TEST(AttentionSweep, ReferenceMatchesDenseFormulaOverRandomConfigs) {
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 1000; ++trial) {
    config c = random_config(rng);
    const dtype t = std::array{dtype::f64, dtype::f32, dtype::f16, dtype::bf16}[rng() % 4];
    const Shape qs = c.three_d ? Shape{c.B, c.Nq, c.Hq * c.D} : Shape{c.B, c.Hq, c.Nq, c.D};
    const Shape ks = c.three_d ? Shape{c.B, c.Nk, c.Hkv * c.D} : Shape{c.B, c.Hkv, c.Nk, c.D};
    const Shape vs = c.three_d ? Shape{c.B, c.Nk, c.Hkv * c.Dv} : Shape{c.B, c.Hkv, c.Nk, c.Dv};
    const Tensor q = testing::random_tensor(qs, t, rng), k = testing::random_tensor(ks, t, rng),
                 v = testing::random_tensor(vs, t, rng);
    std::vector<double> want_out, want_lse;
    dense(c, q, k, v, want_out, want_lse);
    const auto r = attention(q, k, v, c.o, {.use_backend = backend::reference});
    const Tensor out4 = c.three_d ? Tensor::copy_of(r.out.view().reshape({c.B, c.Nq, c.Hq, c.Dv}).permute({0, 2, 1, 3}))
                                  : r.out;
    const double tol = testing::tolerance_for(t);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << " dtype " << dtype_name(t) << " B" << c.B << " Hq" << c.Hq
                                      << " Hkv" << c.Hkv << " Nq" << c.Nq << " Nk" << c.Nk << " D" << c.D << " Dv" << c.Dv);
    ASSERT_TRUE(testing::all_close(out4, Tensor::from_values(out4.shape(), dtype::f64, want_out), tol));
    ASSERT_TRUE(testing::all_close(r.lse, Tensor::from_values(r.lse.shape(), dtype::f64, want_lse), tol));
    ASSERT_FALSE(testing::any_nan(r.out));
  }
}

}  // namespace
}  // namespace attn

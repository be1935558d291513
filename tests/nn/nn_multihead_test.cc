// tests/nn/nn_multihead_test.cc — MultiHeadAttention: the forward against a float64 multi-head
// attention written out here with loops (projections, masks, softmax, output projection), the
// returned weights, gradients against central finite differences, and KV-cache decoding
// against the full causal forward.
#include <limits>

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

// y[b, n, o] = Σ_i x[b, n, i] W[o, i] + bias[o]
std::vector<double> project(const Linear& l, const Tensor& x) {
  const std::int64_t B = x.size(0), N = x.size(1), I = x.size(2), O = l.weight.size(0);
  std::vector<double> y(std::size_t(B * N * O));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t n = 0; n < N; ++n)
      for (std::int64_t o = 0; o < O; ++o) {
        double s = l.bias.defined() ? l.bias.get({o}) : 0.0;
        for (std::int64_t i = 0; i < I; ++i) s += x.get({b, n, i}) * l.weight.get({o, i});
        y[std::size_t((b * N + n) * O + o)] = s;
      }
  return y;
}

struct naive_masks {
  bool causal = false;             // top-left: key j visible to query i when j <= i
  std::int64_t window_left = -1;   // j >= i - window_left
  std::vector<std::int64_t> lengths;  // keys j < lengths[b]
  Tensor keep;                     // bool [B, Nq, Nk] or undefined
};

// The float64 forward of the layer (no rotary): out [B, Nq, E] and probabilities [B, Hq, Nq, Nk].
std::pair<std::vector<double>, std::vector<double>> naive_mha(const MultiHeadAttention& m, const Tensor& query,
                                                              const Tensor& key, const Tensor& value,
                                                              const naive_masks& mk) {
  const mha_config& c = m.config;
  const std::int64_t B = query.size(0), Nq = query.size(1), Nk = key.size(1);
  const std::int64_t Hq = c.num_heads, Hkv = c.num_kv_heads, D = c.head_dim, Dv = c.value_head_dim, E = c.embed_dim;
  const auto q = project(m.q_proj, query), k = project(m.k_proj, key), v = project(m.v_proj, value);
  std::vector<double> o(std::size_t(B * Nq * Hq * Dv), 0.0), p(std::size_t(B * Hq * Nq * Nk), 0.0);
  const double scale = 1.0 / std::sqrt(double(D));
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < Hq; ++h) {
      const std::int64_t g = h / (Hq / Hkv);
      for (std::int64_t i = 0; i < Nq; ++i) {
        std::vector<double> s(std::size_t(Nk), -std::numeric_limits<double>::infinity());
        double mx = -std::numeric_limits<double>::infinity();
        for (std::int64_t j = 0; j < Nk; ++j) {
          if (mk.causal && j > i) continue;
          if (mk.window_left >= 0 && j < i - mk.window_left) continue;
          if (!mk.lengths.empty() && j >= mk.lengths[std::size_t(b)]) continue;
          if (mk.keep.defined() && mk.keep.get({b, i, j}) == 0) continue;
          double dot = 0;
          for (std::int64_t d = 0; d < D; ++d)
            dot += q[std::size_t((b * Nq + i) * Hq * D + h * D + d)] * k[std::size_t((b * Nk + j) * Hkv * D + g * D + d)];
          s[std::size_t(j)] = scale * dot;
          mx = std::max(mx, s[std::size_t(j)]);
        }
        if (std::isinf(mx)) continue;  // fully masked: zeros
        double z = 0;
        for (double x : s) z += std::exp(x - mx);
        for (std::int64_t j = 0; j < Nk; ++j) {
          const double pj = std::exp(s[std::size_t(j)] - mx) / z;
          p[std::size_t(((b * Hq + h) * Nq + i) * Nk + j)] = pj;
          for (std::int64_t d = 0; d < Dv; ++d)
            o[std::size_t((b * Nq + i) * Hq * Dv + h * Dv + d)] += pj * v[std::size_t((b * Nk + j) * Hkv * Dv + g * Dv + d)];
        }
      }
    }
  std::vector<double> out(std::size_t(B * Nq * E));
  for (std::int64_t r = 0; r < B * Nq; ++r)
    for (std::int64_t e = 0; e < E; ++e) {
      double s = m.out_proj.bias.defined() ? m.out_proj.bias.get({e}) : 0.0;
      for (std::int64_t x = 0; x < Hq * Dv; ++x) s += o[std::size_t(r * Hq * Dv + x)] * m.out_proj.weight.get({e, x});
      out[std::size_t(r * E + e)] = s;
    }
  return {out, p};
}

const mha_config kGqa{.embed_dim = 8, .num_heads = 4, .num_kv_heads = 2, .kdim = 6, .vdim = 5, .head_dim = 3,
                      .value_head_dim = 2};

TEST(NnMultiHead, ForwardMatchesLoopsForEveryMaskKind) {
  std::mt19937 r(1);
  const std::int64_t B = 2, Nq = 5, Nk = 5;
  for (mha_config c : {mha_config{.embed_dim = 8, .num_heads = 2}, kGqa,
                       mha_config{.embed_dim = 6, .num_heads = 3, .num_kv_heads = 1, .bias = false}}) {
    rng gen(2);
    const MultiHeadAttention m(c, gen, dtype::f64);
    const Tensor query = random_tensor({B, Nq, m.config.embed_dim}, dtype::f64, r);
    const Tensor key = random_tensor({B, Nk, m.config.kdim}, dtype::f64, r);
    const Tensor value = random_tensor({B, Nk, m.config.vdim}, dtype::f64, r);
    const Tensor keep = testing::random_bool({B, Nq, Nk}, r, 0.6);
    for (int kind = 0; kind < 5; ++kind) {
      masking_options mask;
      naive_masks mk;
      if (kind == 1) mask.is_causal = mk.causal = true;
      if (kind == 2) mask.is_causal = mk.causal = true, mask.window_left = mk.window_left = 1;
      if (kind == 3) {  // key padding as lengths, and as a [B, 1, 1, Nk] bool mask below
        mk.lengths = {3, 5};
        mask.nonpad_kv_seqlen = Tensor::from_values({B}, dtype::i64, {3, 5});
      }
      if (kind == 4) {  // an arbitrary bool mask (a graph's adjacency), one per batch
        mk.keep = keep;
        mask.attn_mask = Tensor::copy_of(keep.view().reshape({B, 1, Nq, Nk}));
      }
      const auto res = m.forward(query, key, value, mask, nullptr, /*need_weights=*/true);
      const auto [want, probs] = naive_mha(m, query, key, value, mk);
      EXPECT_TRUE(all_close(res.out, Tensor::from_values(res.out.shape(), dtype::f64, want), 1e-12))
          << "mask kind " << kind << " Hkv " << m.config.num_kv_heads;
      // Without weights the call runs on the fused backend (f64 goes to the reference; f32 below).
      EXPECT_TRUE(all_close(m.forward(query, key, value, mask).out, res.out, 1e-12)) << "mask kind " << kind;
      EXPECT_TRUE(all_close(res.weights, Tensor::from_values({B, m.config.num_heads, Nq, Nk}, dtype::f64, probs), 1e-12))
          << "mask kind " << kind;
    }
  }
}

// The float32 layer (the fused cpu backend) against the same layer in float64.
TEST(NnMultiHead, Float32MatchesFloat64) {
  std::mt19937 r(13);
  rng gen64(14), gen32(14);
  const MultiHeadAttention m64(kGqa, gen64, dtype::f64), m32(kGqa, gen32, dtype::f32);
  const Tensor query = random_tensor({2, 9, 8}, dtype::f64, r), key = random_tensor({2, 11, 6}, dtype::f64, r),
               value = random_tensor({2, 11, 5}, dtype::f64, r), w = random_tensor({2, 9, 8}, dtype::f64, r);
  masking_options mask;
  mask.is_causal = true;
  mask.alignment = causal_alignment::bottom_right;
  MultiHeadAttention::saved s64, s32;
  const Tensor y64 = m64.forward(query, key, value, mask, &s64).out;
  const Tensor y32 = m32.forward(query.to(dtype::f32), key.to(dtype::f32), value.to(dtype::f32), mask, &s32).out;
  EXPECT_TRUE(all_close(y32, y64, 1e-5));
  MultiHeadAttention a = m64, b = m32;
  const auto g64 = a.backward(s64, w), g32 = b.backward(s32, w.to(dtype::f32));
  EXPECT_TRUE(all_close(g32.dquery, g64.dquery, 1e-5));
  EXPECT_TRUE(all_close(g32.dkey, g64.dkey, 1e-5));
  EXPECT_TRUE(all_close(g32.dvalue, g64.dvalue, 1e-5));
  EXPECT_TRUE(all_close(b.q_proj.dweight, a.q_proj.dweight, 1e-5));
}

TEST(NnMultiHead, KeyPaddingAsBoolMaskEqualsLengths) {
  std::mt19937 r(3);
  rng gen(4);
  const MultiHeadAttention m({.embed_dim = 8, .num_heads = 2}, gen, dtype::f64);
  const Tensor x = random_tensor({2, 4, 8}, dtype::f64, r);
  masking_options by_len, by_mask;
  by_len.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {2, 4});
  by_mask.attn_mask = Tensor::from_values({2, 1, 1, 4}, dtype::boolean, {1, 1, 0, 0, 1, 1, 1, 1});
  EXPECT_TRUE(all_close(m.forward(x, x, x, by_len).out, m.forward(x, x, x, by_mask).out, 1e-12));
}

// L = Σ y ∘ w over the parameters and the three inputs, float64.
void check_gradients(const mha_config& c, const masking_options& mask, std::uint64_t seed) {
  std::mt19937 r{unsigned(seed)};
  rng gen(seed);
  MultiHeadAttention m(c, gen, dtype::f64);
  const std::int64_t B = 2, Nq = 4, Nk = 4;
  const Tensor query = random_tensor({B, Nq, m.config.embed_dim}, dtype::f64, r);
  const Tensor key = random_tensor({B, Nk, m.config.kdim}, dtype::f64, r);
  const Tensor value = random_tensor({B, Nk, m.config.vdim}, dtype::f64, r);
  const Tensor w = random_tensor({B, Nq, m.config.embed_dim}, dtype::f64, r);
  auto loss = [&] { return weighted_sum(m.forward(query, key, value, mask).out, w); };
  MultiHeadAttention::saved s;
  m.forward(query, key, value, mask, &s);
  const auto g = m.backward(s, w);
  expect_gradient("dquery", query, g.dquery, loss);
  expect_gradient("dkey", key, g.dkey, loss);
  expect_gradient("dvalue", value, g.dvalue, loss);
  parameter_list ps;
  m.parameters(ps);
  EXPECT_EQ(ps.size(), c.bias ? 8u : 4u);
  for (const parameter_ref& p : ps) expect_gradient(p.name, *p.value, *p.grad, loss);
}

TEST(NnMultiHead, GradientsMatchFiniteDifferences) {
  masking_options none;
  check_gradients({.embed_dim = 6, .num_heads = 2}, none, 5);
  masking_options causal;
  causal.is_causal = true;
  mha_config rot = kGqa;
  rot.kdim = rot.vdim = 0;
  rot.head_dim = 4;
  rot.rotary = true;
  check_gradients(rot, causal, 6);
  masking_options padded;
  padded.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {1, 3});
  padded.attn_mask = Tensor::from_values({1, 1, 4, 4}, dtype::boolean, {1, 0, 1, 1, 1, 1, 0, 1, 0, 1, 1, 1, 1, 1, 1, 0});
  check_gradients({.embed_dim = 6, .num_heads = 3, .num_kv_heads = 1, .kdim = 4, .vdim = 5, .bias = false}, padded, 7);
}

// Decoding token by token (and in chunks) through the KV cache gives the rows of the full
// causal forward.
TEST(NnMultiHead, KvCacheDecodingEqualsFullRecomputation) {
  for (dtype t : {dtype::f64, dtype::f32})
    for (bool rot : {false, true}) {
      std::mt19937 r(8);
      rng gen(9);
      mha_config c{.embed_dim = 16, .num_heads = 4, .num_kv_heads = 2, .rotary = rot};
      c.rotary_opts.layout = rotary_layout::interleaved;
      const MultiHeadAttention m(c, gen, t);
      const std::int64_t B = 2, N = 7;
      const Tensor x = random_tensor({B, N, 16}, t, r);
      masking_options causal;
      causal.is_causal = true;
      const Tensor full = m.forward(x, x, x, causal).out;
      const double tol = t == dtype::f64 ? 1e-12 : 2e-6;
      for (std::int64_t chunk : {1, 3}) {
        kv_cache cache = m.make_cache(B, 16);
        for (std::int64_t n0 = 0; n0 < N; n0 += chunk) {
          const std::int64_t n1 = std::min(N, n0 + chunk);
          const Tensor step = m.forward_cached(Tensor::copy_of(x.view().slice(1, n0, n1)), cache, causal);
          EXPECT_TRUE(all_close(step, Tensor::copy_of(full.view().slice(1, n0, n1)), tol))
              << dtype_name(t) << " rotary " << rot << " chunk " << chunk << " rows " << n0 << ".." << n1;
        }
        EXPECT_EQ(cache.lengths().to_vector(), (std::vector<double>{double(N), double(N)}));
      }
    }
}

TEST(NnMultiHead, ProjectedMemoryEqualsForward) {
  std::mt19937 r(10);
  rng gen(11);
  const MultiHeadAttention m(kGqa, gen, dtype::f64);
  const Tensor query = random_tensor({2, 3, 8}, dtype::f64, r), key = random_tensor({2, 5, 6}, dtype::f64, r),
               value = random_tensor({2, 5, 5}, dtype::f64, r);
  masking_options mask;
  mask.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {4, 2});
  EXPECT_TRUE(all_close(m.forward_projected(query, m.project_kv(key, value), mask), m.forward(query, key, value, mask).out,
                        1e-12));
}

TEST(NnMultiHead, Errors) {
  rng gen(12);
  EXPECT_THROW_MSG(MultiHeadAttention({.embed_dim = 8, .num_heads = 4, .num_kv_heads = 3}, gen),
                   "MultiHeadAttention: num_kv_heads = 3 must divide num_heads = 4");
  EXPECT_THROW_MSG(MultiHeadAttention({.embed_dim = 10, .num_heads = 3}, gen),
                   "MultiHeadAttention: embed_dim = 10 is not divisible by num_heads = 3 (set head_dim)");
  const MultiHeadAttention m(kGqa, gen);
  const Tensor q = Tensor::zeros({2, 3, 8}, dtype::f32);
  EXPECT_THROW_MSG(m.forward(q, Tensor::zeros({2, 4, 8}, dtype::f32), Tensor::zeros({2, 4, 5}, dtype::f32)),
                   "MultiHeadAttention: key has shape [2, 4, 8], expected [B, N, 6] with B = 2");
  EXPECT_THROW_MSG(m.forward(q, Tensor::zeros({2, 4, 6}, dtype::f32), Tensor::zeros({2, 3, 5}, dtype::f32)),
                   "MultiHeadAttention: value has shape [2, 3, 5], expected [B, N, 5] with B = 2, N = 4");
  EXPECT_THROW_MSG(m.forward(q.to(dtype::f64), q, q), "MultiHeadAttention: query has dtype float64, expected float32");
}

}  // namespace
}  // namespace attn::nn

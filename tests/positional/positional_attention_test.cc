// tests/positional/positional_attention_test.cc — positional encodings composed with attn::attention,
// forward and backward: rotary on q and k (gradients through rotary_backward), and the T5
// bias as the float attn_mask (the table's gradient through dattn_mask), both checked against
// central finite differences in float64.
#include <random>

#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::expect_matches_finite_differences;
using testing::random_tensor;
using testing::weighted_sum;

TEST(PositionalAttention, RotaryQKForwardAndBackward) {
  std::mt19937 rng(1);
  // KV cache shape: 3 new queries at positions 4..6 attend causally to 7 keys at 0..6 (GQA 4:2).
  const std::int64_t B = 2, Hq = 4, Hkv = 2, Nq = 3, Nk = 7, D = 8, Dv = 5, P = Nk - Nq;
  for (auto layout : {rotary_layout::half_split, rotary_layout::interleaved}) {
    SCOPED_TRACE(int(layout));
    rotary_options ro;
    ro.layout = layout;
    ro.rotary_dim = 6;  // partial rotary
    attention_options opt;
    opt.is_causal = true;
    opt.alignment = causal_alignment::bottom_right;
    const Tensor q = random_tensor({B, Hq, Nq, D}, dtype::f64, rng);
    const Tensor k = random_tensor({B, Hkv, Nk, D}, dtype::f64, rng);
    const Tensor v = random_tensor({B, Hkv, Nk, Dv}, dtype::f64, rng);
    const Tensor w = random_tensor({B, Hq, Nq, Dv}, dtype::f64, rng);  // dout

    const auto out_of = [&](const Tensor& qq, const Tensor& kk, std::int64_t shift) {
      return attention(rotary(qq, P + shift, ro), rotary(kk, shift, ro), v, opt).out;
    };
    // Forward: only relative positions matter — shifting every position changes nothing.
    const Tensor out = out_of(q, k, 0);
    EXPECT_TRUE(all_close(out_of(q, k, 1000), out, 1e-12));
    EXPECT_FALSE(all_close(attention(q, k, v, opt).out, out, 1e-3));  // and rotary did something

    // Backward: attention gives d(rotated q), d(rotated k); rotary_backward maps them back.
    const Tensor qr = rotary(q, P, ro), kr = rotary(k, 0, ro);
    const attention_result r = attention(qr, kr, v, opt);
    const attention_grads g = attention_backward(qr, kr, v, r.out, w, r.lse, opt);
    const Tensor dq = rotary_backward(g.dq, P, ro), dk = rotary_backward(g.dk, 0, ro);
    expect_matches_finite_differences(q, dq, [&](const Tensor& qq) { return weighted_sum(out_of(qq, k, 0), w); }, "dq");
    expect_matches_finite_differences(k, dk, [&](const Tensor& kk) { return weighted_sum(out_of(q, kk, 0), w); }, "dk");

    // The float32 fast path of the same composition agrees with float64.
    const Tensor q32 = q.to(dtype::f32), k32 = k.to(dtype::f32), v32 = v.to(dtype::f32);
    const Tensor out32 = attention(rotary(q32, P, ro), rotary(k32, 0, ro), v32, opt).out;
    EXPECT_TRUE(all_close(out32, out, 1e-5));
  }
}

TEST(PositionalAttention, RotaryOn3DLayoutMatches4D) {
  std::mt19937 rng(2);
  const std::int64_t B = 1, H = 2, N = 4, D = 6;
  const Tensor q3 = random_tensor({B, N, H * D}, dtype::f64, rng), k3 = random_tensor({B, N, H * D}, dtype::f64, rng);
  const Tensor v3 = random_tensor({B, N, H * D}, dtype::f64, rng);
  const Tensor ids = Tensor::from_values({B, N}, dtype::i64, {3, 1, 4, 1});
  rotary_options ro;
  ro.num_heads = H;
  ro.layout = rotary_layout::interleaved;
  attention_options opt;
  opt.q_num_heads = opt.kv_num_heads = H;
  const Tensor out3 = attention(rotary(q3, ids, ro), rotary(k3, ids, ro), v3, opt).out;
  const auto to4 = [&](const Tensor& t) { return Tensor::copy_of(t.view().reshape({B, N, H, D}).permute({0, 2, 1, 3})); };
  ro.num_heads = 0;
  const Tensor out4 = attention(rotary(to4(q3), ids, ro), rotary(to4(k3), ids, ro), to4(v3)).out;
  EXPECT_TRUE(all_close(to4(out3), out4, 1e-12));
}

TEST(PositionalAttention, T5BiasForwardAndTableGradient) {
  std::mt19937 rng(3);
  const std::int64_t B = 2, H = 3, Nq = 4, Nk = 6, D = 5;
  relative_position_options encoder;  // bidirectional, small enough that several buckets are used
  encoder.num_buckets = 8, encoder.max_distance = 16;
  relative_position_options decoder = encoder;
  decoder.bidirectional = false;
  decoder.query_offset = Nk - Nq;  // queries are the last Nq of the Nk positions
  for (const auto& rp : {encoder, decoder}) {
    SCOPED_TRACE(rp.bidirectional ? "bidirectional" : "causal");
    attention_options opt;
    opt.scale = 1.0;  // T5 does not scale q·k
    opt.is_causal = !rp.bidirectional;
    opt.alignment = causal_alignment::bottom_right;
    const Tensor q = random_tensor({B, H, Nq, D}, dtype::f64, rng);
    const Tensor k = random_tensor({B, H, Nk, D}, dtype::f64, rng);
    const Tensor v = random_tensor({B, H, Nk, D}, dtype::f64, rng);
    const Tensor w = random_tensor({B, H, Nq, D}, dtype::f64, rng);
    const Tensor table = random_tensor({rp.num_buckets, H}, dtype::f64, rng, -2, 2);

    const auto loss = [&](const Tensor& t) {
      attention_options o = opt;
      const Tensor bias = relative_position_bias(t, Nq, Nk, rp);
      o.attn_mask = bias.view();
      return weighted_sum(attention(q, k, v, o).out, w);
    };
    const Tensor bias = relative_position_bias(table, Nq, Nk, rp);
    opt.attn_mask = bias.view();
    const attention_result r = attention(q, k, v, opt);
    attention_options no_bias = opt;
    no_bias.attn_mask.reset();
    EXPECT_FALSE(all_close(r.out, attention(q, k, v, no_bias).out, 1e-3));  // the bias did something
    const attention_grads g = attention_backward(q, k, v, r.out, w, r.lse, opt);
    ASSERT_EQ(g.dattn_mask.shape(), (Shape{1, H, Nq, Nk}));  // broadcast batch summed by the core op
    const Tensor dtable = relative_position_bias_backward(g.dattn_mask, rp);
    expect_matches_finite_differences(table, dtable, loss, "dtable");
  }
}

}  // namespace
}  // namespace attn

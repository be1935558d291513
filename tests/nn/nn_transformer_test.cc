// tests/nn/nn_transformer_test.cc — FeedForward, Transformer encoder and decoder layers (post- and
// pre-norm): every gradient against central finite differences (float64), the post-norm
// encoder's forward against its sublayers composed by hand, dropout's eval mode, and decoding
// through the KV cache against the full forward.
#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

const transformer_config kSmall{.d_model = 4, .num_heads = 2, .d_ff = 6, .act = activation::gelu};

TEST(NnTransformer, FeedForwardGradients) {
  std::mt19937 r(1);
  rng gen(2);
  FeedForward ff(3, 5, activation::tanh, gen, dtype::f64);
  const Tensor x = random_tensor({2, 2, 3}, dtype::f64, r), w = random_tensor({2, 2, 3}, dtype::f64, r);
  auto loss = [&] { return weighted_sum(ff.forward(x, nullptr), w); };
  FeedForward::saved s;
  ff.forward(x, &s);
  expect_gradient("dx", x, ff.backward(s, w), loss);
  parameter_list ps;
  ff.parameters(ps);
  for (const parameter_ref& p : ps) expect_gradient(p.name, *p.value, *p.grad, loss);
}

TEST(NnTransformer, PostNormEncoderIsItsSublayersComposed) {
  std::mt19937 r(3);
  rng gen(4);
  TransformerEncoderLayer enc(kSmall, gen, dtype::f64);
  const Tensor x = random_tensor({2, 3, 4}, dtype::f64, r);
  const Tensor h = enc.attn_block.norm.forward(add(x, enc.self_attn.forward(x, x, x).out));
  const Tensor want = enc.ff_block.norm.forward(add(h, enc.ff.forward(h, nullptr)));
  EXPECT_TRUE(all_close(enc.forward(x), want, 1e-12));
}

TEST(NnTransformer, EncoderGradients) {
  for (bool pre : {false, true}) {
    std::mt19937 r(5);
    rng gen(6);
    transformer_config c = kSmall;
    c.pre_norm = pre;
    TransformerEncoderLayer enc(c, gen, dtype::f64);
    const Tensor x = random_tensor({2, 3, 4}, dtype::f64, r), w = random_tensor({2, 3, 4}, dtype::f64, r);
    masking_options mask;
    mask.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {3, 2});
    auto loss = [&] { return weighted_sum(enc.forward(x, mask), w); };
    TransformerEncoderLayer::saved s;
    enc.forward(x, mask, &s);
    const std::string what = pre ? "pre-norm " : "post-norm ";
    expect_gradient(what + "dx", x, enc.backward(s, w), loss, 1e-6, 1e-5);
    parameter_list ps;
    enc.parameters(ps, "enc.");
    EXPECT_EQ(ps.size(), 8u + 2u + 4u + 2u);
    for (const parameter_ref& p : ps) expect_gradient(what + p.name, *p.value, *p.grad, loss, 1e-6, 1e-5);
  }
}

TEST(NnTransformer, DecoderGradients) {
  for (bool pre : {false, true}) {
    std::mt19937 r(7);
    rng gen(8);
    transformer_config c = kSmall;
    c.pre_norm = pre;
    TransformerDecoderLayer dec(c, gen, dtype::f64);
    const Tensor x = random_tensor({2, 3, 4}, dtype::f64, r), mem = random_tensor({2, 5, 4}, dtype::f64, r);
    const Tensor w = random_tensor({2, 3, 4}, dtype::f64, r);
    masking_options mem_mask;
    mem_mask.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {5, 3});
    auto loss = [&] { return weighted_sum(dec.forward(x, mem, mem_mask), w); };
    TransformerDecoderLayer::saved s;
    dec.forward(x, mem, mem_mask, &s);
    const TransformerDecoderLayer::grads g = dec.backward(s, w);
    const std::string what = pre ? "pre-norm " : "post-norm ";
    expect_gradient(what + "dx", x, g.dx, loss, 1e-6, 1e-5);
    expect_gradient(what + "dmemory", mem, g.dmemory, loss, 1e-6, 1e-5);
    parameter_list ps;
    dec.parameters(ps, "dec.");
    for (const parameter_ref& p : ps) expect_gradient(what + p.name, *p.value, *p.grad, loss, 1e-6, 1e-5);
  }
}

TEST(NnTransformer, DecodingStepsEqualTheFullForward) {
  for (dtype t : {dtype::f64, dtype::f32}) {
    std::mt19937 r(9);
    rng gen(10);
    transformer_config c{.d_model = 8, .num_heads = 4, .num_kv_heads = 2, .pre_norm = true, .dropout = 0.1,
                         .rotary = true};
    TransformerDecoderLayer dec(c, gen, t);
    dec.set_training(false);
    const Tensor x = random_tensor({2, 5, 8}, t, r), mem = random_tensor({2, 4, 8}, t, r);
    masking_options mem_mask;
    mem_mask.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {4, 1});
    const Tensor full = dec.forward(x, mem, mem_mask);
    kv_cache cache = dec.self_attn.make_cache(2, 8);
    const auto kv = dec.cross_attn.project_kv(mem, mem);
    for (std::int64_t n = 0; n < 5; ++n) {
      const Tensor y = dec.forward_step(Tensor::copy_of(x.view().slice(1, n, n + 1)), cache, kv, mem_mask);
      EXPECT_TRUE(all_close(y, Tensor::copy_of(full.view().slice(1, n, n + 1)), t == dtype::f64 ? 1e-12 : 1e-5))
          << dtype_name(t) << " step " << n;
    }
  }
}

TEST(NnTransformer, DropoutTrainsAndEvalIsDeterministic) {
  std::mt19937 r(11);
  rng g1(12), g2(12);
  transformer_config with = kSmall, without = kSmall;
  with.dropout = 0.5;
  TransformerEncoderLayer a(with, g1, dtype::f64), b(without, g2, dtype::f64);
  const Tensor x = random_tensor({2, 3, 4}, dtype::f64, r);
  EXPECT_FALSE(all_close(a.forward(x), b.forward(x), 1e-3));  // training: elements dropped
  a.set_training(false);
  EXPECT_TRUE(all_close(a.forward(x), b.forward(x), 0.0));  // eval: the same weights, no dropout
}

}  // namespace
}  // namespace attn::nn

// tests/nn/nn_int32_indices_test.cc — every index input of attn::nn (ids, lengths, targets,
// story/query) taken as int32 gives bitwise what int64 gives, forward and backward; another
// dtype is refused by message.
#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

Tensor i32(const Tensor& t) { return t.to(dtype::i32); }

void expect_same(const Tensor& a, const Tensor& b, const char* what) { EXPECT_TRUE(all_close(a, b, 0)) << what; }

TEST(NnInt32Indices, EmbeddingAndCrossEntropy) {
  rng gen(5);
  Embedding a(6, 4, gen, dtype::f64);
  Embedding b = a;
  b.dweight = zeros_like(a.weight);
  const Tensor ids = Tensor::from_values({2, 3}, dtype::i64, {5, 0, 5, 2, 2, 2});
  std::mt19937 r(6);
  const Tensor w = random_tensor({2, 3, 4}, dtype::f64, r);
  expect_same(b.forward(i32(ids)), a.forward(ids), "embedding forward");
  a.backward(ids, w);
  b.backward(i32(ids), w);
  expect_same(b.dweight, a.dweight, "embedding dweight");
  EXPECT_THROW_MSG(a.forward(Tensor::from_values({2}, dtype::i32, {1, 6})),
                   "Embedding: ids[1] = 6 is outside [0, 6) (the rows of weight [6, 4])");
  EXPECT_THROW_MSG(a.forward(Tensor::from_values({1}, dtype::i8, {1})), "Embedding: ids has dtype int8, expected int64 or int32");

  const Tensor logits = random_tensor({2, 3, 5}, dtype::f64, r, -3, 3);
  const Tensor targets = Tensor::from_values({2, 3}, dtype::i64, {4, -1, 0, 2, 2, -1});
  const loss_result l64 = cross_entropy(logits, targets, -1), l32 = cross_entropy(logits, i32(targets), -1);
  EXPECT_EQ(l32.loss, l64.loss);
  EXPECT_EQ(l32.count, l64.count);
  expect_same(l32.grad, l64.grad, "cross_entropy grad");
  EXPECT_THROW_MSG(cross_entropy(logits, Tensor::zeros({2, 3}, dtype::f32)),
                   "cross_entropy: targets has dtype float32, expected int64 or int32");
}

TEST(NnInt32Indices, LengthsOfGruContextAndHierarchicalAttention) {
  rng gen(7);
  std::mt19937 r(8);
  BiGRUEncoder enc(2, 3, gen, dtype::f64);
  const Tensor x = random_tensor({3, 4, 2}, dtype::f64, r);
  const Tensor len = Tensor::from_values({3}, dtype::i64, {4, 2, 0});
  expect_same(enc.forward(x, i32(len), nullptr).out, enc.forward(x, len, nullptr).out, "BiGRU out");

  ContextAttention att(3, 4, gen, dtype::f64);
  const Tensor h = random_tensor({3, 5, 3}, dtype::f64, r, -2, 2);
  const Tensor hl = Tensor::from_values({3}, dtype::i64, {5, 2, 0});
  ContextAttention::saved s64, s32;
  const auto a64 = att.forward(h, hl, &s64, true), a32 = att.forward(h, i32(hl), &s32, true);
  expect_same(a32.pooled, a64.pooled, "context pooled");
  expect_same(a32.weights, a64.weights, "context weights");
  const Tensor dp = random_tensor({3, 3}, dtype::f64, r);
  expect_same(att.backward(s32, dp), att.backward(s64, dp), "context dh");

  HierarchicalAttention han(2, 3, 2, gen, dtype::f64);
  const Tensor dx = random_tensor({2, 3, 4, 2}, dtype::f64, r, -1.5, 1.5);
  const Tensor wl = Tensor::from_values({2, 3}, dtype::i64, {4, 2, 3, 1, 3, 4}), sl = Tensor::from_values({2}, dtype::i64, {3, 2});
  expect_same(han.forward(dx, i32(wl), i32(sl)).document, han.forward(dx, wl, sl).document, "HAN document");
  EXPECT_THROW_MSG(han.forward(dx, wl, Tensor::from_values({2}, dtype::i32, {3, 4})), "sentence_lengths[1] = 4 is outside");
}

TEST(NnInt32Indices, MemoryNetworkAndCoAttention) {
  rng gen(1);
  MemoryNetwork net(6, 3, 5, 2, gen, dtype::f64);
  const Tensor story = Tensor::from_values({2, 4, 3}, dtype::i64, {1, 2, 0, 3, 4, 5, 2, 2, 1, 5, 0, 0,  //
                                                                   4, 1, 0, 3, 3, 3, 0, 0, 0, 0, 0, 0});
  const Tensor query = Tensor::from_values({2, 2}, dtype::i64, {5, 1, 2, 0});
  const Tensor lengths = Tensor::from_values({2}, dtype::i64, {4, 2});
  MemoryNetwork::saved s64, s32;
  const auto m64 = net.forward(story, query, lengths, &s64), m32 = net.forward(i32(story), i32(query), i32(lengths), &s32);
  expect_same(m32.logits, m64.logits, "memory network logits");
  std::mt19937 r(2);
  const Tensor dl = random_tensor({2, 6}, dtype::f64, r);
  net.backward(s64, dl);
  std::vector<Tensor> g64;
  for (const Embedding& e : net.E) g64.push_back(Tensor::copy_of(e.dweight));
  for (Embedding& e : net.E) e.dweight = zeros_like(e.weight);
  net.backward(s32, dl);
  for (std::size_t i = 0; i < g64.size(); ++i) expect_same(net.E[i].dweight, g64[i], "memory network dE");
  EXPECT_THROW_MSG(net.forward(story.to(dtype::f64), query, lengths), "story has dtype float64, expected int64 or int32");

  CoAttention co({co_attention_kind::parallel, co_attention_granularity::fine, 3, 2, 4}, gen, dtype::f64);
  const Tensor x = random_tensor({3, 4, 3}, dtype::f64, r, -1.5, 1.5), y = random_tensor({3, 5, 2}, dtype::f64, r, -1.5, 1.5);
  const Tensor xl = Tensor::from_values({3}, dtype::i64, {2, 4, 3}), yl = Tensor::from_values({3}, dtype::i64, {3, 5, 0});
  const auto c64 = co.forward(x, y, xl, yl, nullptr, true), c32 = co.forward(x, y, i32(xl), i32(yl), nullptr, true);
  expect_same(c32.x_context, c64.x_context, "co-attention x_context");
  expect_same(c32.y_weights, c64.y_weights, "co-attention y_weights");
}

}  // namespace
}  // namespace attn::nn

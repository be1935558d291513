// tests/models/bert_ids_test.cc — bert_model::forward on a small random model: int32 token ids
// give bitwise the int64 result; other id dtypes and shapes are refused by message.
#include <gtest/gtest.h>

#include "attn/attn.h"
#include "attn/models/bert.h"
#include "test_util.h"

namespace attn {
namespace {

TEST(BertIds, Int32IdsAsInt64) {
  models::bert_config c;
  c.vocab_size = 30, c.hidden_size = 16, c.num_hidden_layers = 2, c.num_attention_heads = 4;
  c.intermediate_size = 32, c.max_position_embeddings = 12;
  const models::bert_model m(c);
  const Tensor ids = Tensor::from_values({2, 5}, dtype::i64, {2, 7, 29, 4, 0, 11, 3, 0, 0, 0});
  const std::vector<std::int64_t> lengths{5, 2};
  const Tensor a = m.forward(ids, lengths), b = m.forward(ids.to(dtype::i32), lengths);
  ASSERT_EQ(a.shape(), (Shape{2, 5, 16}));
  EXPECT_EQ(a.to_vector(), b.to_vector());
  EXPECT_NE(a.get({0, 0, 0}), a.get({0, 1, 0}));  // (a model that computes something)
  EXPECT_THROW_MSG(m.forward(ids.to(dtype::f32), lengths), "ids must be int64 or int32 [B, N], got float32 [2, 5]");
  EXPECT_THROW_MSG(m.forward(Tensor::from_values({1, 2}, dtype::i32, {1, 30}), {2}), "ids[1] = 30 is outside [0, 30)");
}

}  // namespace
}  // namespace attn

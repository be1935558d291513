// tests/models/wordpiece_test.cc — the WordPiece tokenizer on a small vocabulary, worked by
// hand: normalisation, punctuation and CJK splits, greedy longest match, [UNK], truncation,
// padding, errors. (python/tests/test_models.py compares with Hugging Face tokenizers on the
// real 30,522-token vocabulary.)
#include <gtest/gtest.h>

#include "attn/models/wordpiece.h"
#include "test_util.h"

namespace attn::models {
namespace {

wordpiece_tokenizer small() {
  return wordpiece_tokenizer({"[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "hello", ",", "!", "cafe",
                              "東", "京", "a", "##b", "ab", "i", "##̇"},
                             wordpiece_config{});
}

TEST(wordpiece, worked_examples) {
  const wordpiece_tokenizer t = small();
  EXPECT_EQ(t.tokenize("UNAFFABLE, hello!"), (std::vector<std::string>{"un", "##aff", "##able", ",", "hello", "!"}));
  EXPECT_EQ(t.encode("Hello"), (std::vector<std::int64_t>{2, 7, 3}));
  EXPECT_EQ(t.normalize("Café\tCAFÉ"), "cafe cafe");            // accents stripped, tab → space
  EXPECT_EQ(t.tokenize("東京"), (std::vector<std::string>{"東", "京"}));  // CJK split per character
  EXPECT_EQ(t.tokenize("abb"), (std::vector<std::string>{"ab", "##b"}));  // longest match first
  EXPECT_EQ(t.tokenize("xyz hello"), (std::vector<std::string>{"[UNK]", "hello"}));  // no split: [UNK]
  EXPECT_EQ(t.tokenize(std::string(101, 'a')), (std::vector<std::string>{"[UNK]"}));  // over 100 characters
  EXPECT_EQ(t.normalize("a\x01\xe2\x80\x8b" "b"), "ab");  // control and format characters dropped
  EXPECT_EQ(t.encode("hello hello hello", 4), (std::vector<std::int64_t>{2, 7, 7, 3}));  // truncated
  EXPECT_EQ(t.encode(""), (std::vector<std::int64_t>{2, 3}));
}

TEST(wordpiece, batch_is_padded_right) {
  const token_batch b = small().encode_batch({"hello", "hello , hello !", ""});
  EXPECT_EQ(b.ids.shape(), (Shape{3, 6}));
  EXPECT_EQ(b.lengths, (std::vector<std::int64_t>{3, 6, 2}));
  EXPECT_EQ(b.ids.get({0, 3}), 0.0);
  EXPECT_EQ(b.mask.get({0, 2}), 1.0);
  EXPECT_EQ(b.mask.get({0, 3}), 0.0);
}

TEST(wordpiece, bad_input_by_message) {
  const wordpiece_tokenizer t = small();
  EXPECT_THROW_MSG(t.encode("ok \xff"), "wordpiece: invalid UTF-8: byte 0xff at offset 3 cannot start a character");
  EXPECT_THROW_MSG(t.encode("\xe6\x9d"), "invalid UTF-8: the character at offset 0 is cut off");
  EXPECT_THROW_MSG(t.encode("\xed\xa0\x80"), "encodes U+D800, which UTF-8 does not allow");
  EXPECT_THROW_MSG(t.encode("\xc0\xaf"), "encodes U+2F, which UTF-8 does not allow");  // overlong '/'
  EXPECT_THROW_MSG(t.encode("x", 1), "max_length = 1 must be 0 (no limit) or >= 2");
  EXPECT_THROW_MSG(wordpiece_tokenizer({"a", "b"}, wordpiece_config{}), "has no special token [UNK]");
  EXPECT_THROW_MSG(wordpiece_tokenizer::from_file("/nonexistent/tokenizer.json"), "cannot open /nonexistent/tokenizer.json");
}

}  // namespace
}  // namespace attn::models

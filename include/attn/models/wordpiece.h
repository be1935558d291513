// attn/models/wordpiece.h — the BERT tokenizer (uncased WordPiece), exactly as Hugging Face's
// `tokenizers` runs a tokenizer.json with BertNormalizer + BertPreTokenizer + WordPiece:
//
//   1. normalise: drop NUL, U+FFFD and control characters (Unicode C*, except \t \n \r); every
//      White_Space character becomes ' '; CJK ideographs get a space on each side; lowercase
//      models also strip accents (NFD, then drop Mn marks) and lowercase each character;
//   2. split on whitespace (dropped) and on punctuation (ASCII punctuation and Unicode P*, each
//      its own word);
//   3. WordPiece: greedy longest match from the vocabulary, continuation pieces prefixed "##";
//      a word with no full split, or longer than 100 characters, becomes [UNK];
//   4. [CLS] pieces [SEP], truncated to max_length ids (the pieces lose their tail).
//
//   auto tok = attn::models::wordpiece_tokenizer::from_file("model/tokenizer.json");
//   std::vector<std::int64_t> ids = tok.encode("Hello, world!");  // 101 7592 1010 2088 999 102
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "attn/tensor.h"

namespace attn::models {

struct wordpiece_config {
  bool lowercase = true;      // BertNormalizer.lowercase
  bool strip_accents = true;  // BertNormalizer.strip_accents (null in the file: = lowercase)
  bool clean_text = true;
  bool handle_chinese_chars = true;
  std::int64_t max_input_chars_per_word = 100;
  std::string unk = "[UNK]", cls = "[CLS]", sep = "[SEP]", pad = "[PAD]", prefix = "##";
};

// Ids and attention mask of a padded batch: int64 [n, L], L = the longest sequence, padded on
// the right with the [PAD] id and mask 0.
struct token_batch {
  Tensor ids, mask;
  std::vector<std::int64_t> lengths;  // valid ids per row
};

class wordpiece_tokenizer {
 public:
  // From a tokenizer.json (normaliser flags, WordPiece vocabulary and special tokens are read
  // from it) or from a vocab.txt (one token per line, id = line number; default config).
  static wordpiece_tokenizer from_file(const std::string& path);
  wordpiece_tokenizer(std::vector<std::string> vocab, wordpiece_config config);

  // [CLS] pieces [SEP] as ids; max_length > 0 truncates to that many ids (at least 2).
  // Invalid UTF-8 throws attn::error naming the byte offset.
  std::vector<std::int64_t> encode(std::string_view utf8, std::int64_t max_length = 0) const;
  // The word pieces of the text, without [CLS]/[SEP] ("hello", ",", "world", "!").
  std::vector<std::string> tokenize(std::string_view utf8) const;
  // encode() of every text, padded to the longest.
  token_batch encode_batch(const std::vector<std::string>& texts, std::int64_t max_length = 0) const;
  // Rows of ids (from encode()) padded with [PAD] to the longest.
  token_batch pad_batch(const std::vector<std::vector<std::int64_t>>& rows) const;

  // The normalised text of step 1 (for tests and debugging).
  std::string normalize(std::string_view utf8) const;

  std::int64_t vocab_size() const { return std::int64_t(vocab_.size()); }
  std::int64_t id(std::string_view token) const;  // -1 when absent
  const std::string& token(std::int64_t id) const { return vocab_.at(std::size_t(id)); }
  const wordpiece_config& config() const { return config_; }

 private:
  void wordpiece(const std::u32string& word, std::vector<std::int64_t>& ids, std::vector<std::string>* pieces) const;
  void pieces_of(std::string_view utf8, std::vector<std::int64_t>& ids, std::vector<std::string>* pieces) const;

  std::vector<std::string> vocab_;
  std::unordered_map<std::string, std::int64_t> index_;
  wordpiece_config config_;
  std::int64_t unk_id_ = -1, cls_id_ = -1, sep_id_ = -1, pad_id_ = 0;
};

}  // namespace attn::models

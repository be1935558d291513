// src/models/wordpiece.cc — the BERT WordPiece tokenizer (see attn/models/wordpiece.h).
// Unicode properties (categories, White_Space, NFD, full lowercase mapping) come from ICU.
#include "attn/models/wordpiece.h"

#include <fmt/format.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/locid.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "attn/error.h"

namespace attn::models {
namespace {

[[noreturn]] void fail(const std::string& what) { throw error("wordpiece: " + what); }

// Strict UTF-8 to code points (no overlong forms, no surrogates, nothing above U+10FFFF).
std::u32string decode_utf8(std::string_view s) {
  std::u32string r;
  r.reserve(s.size());
  std::size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    if (b0 < 0x80) {
      r.push_back(b0);
      ++i;
      continue;
    }
    int n = 0;
    char32_t c = 0, min = 0;
    if ((b0 & 0xE0) == 0xC0) n = 1, c = b0 & 0x1F, min = 0x80;
    else if ((b0 & 0xF0) == 0xE0) n = 2, c = b0 & 0x0F, min = 0x800;
    else if ((b0 & 0xF8) == 0xF0) n = 3, c = b0 & 0x07, min = 0x10000;
    else fail(fmt::format("invalid UTF-8: byte 0x{:02x} at offset {} cannot start a character", b0, i));
    if (i + std::size_t(n) >= s.size())
      fail(fmt::format("invalid UTF-8: the character at offset {} is cut off", i));
    for (int k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + std::size_t(k)]);
      if ((b & 0xC0) != 0x80) fail(fmt::format("invalid UTF-8: byte 0x{:02x} at offset {} is not a continuation", b, i + std::size_t(k)));
      c = (c << 6) | (b & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
      fail(fmt::format("invalid UTF-8: the character at offset {} encodes U+{:X}, which UTF-8 does not allow", i, std::uint32_t(c)));
    r.push_back(c);
    i += std::size_t(n) + 1;
  }
  return r;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(const std::u32string& s, std::size_t begin = 0, std::size_t end = std::u32string::npos) {
  std::string r;
  end = std::min(end, s.size());
  for (std::size_t i = begin; i < end; ++i) append_utf8(r, s[i]);
  return r;
}

bool is_whitespace(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r' || c == ' ') return true;
  if (c < 0x80) return false;
  return u_hasBinaryProperty(UChar32(c), UCHAR_WHITE_SPACE);
}

// Unicode "Other" (Cc, Cf, Cn, Co, Cs), except \t \n \r.
bool is_control(char32_t c) {
  if (c == '\t' || c == '\n' || c == '\r') return false;
  if (c >= 0x20 && c < 0x7F) return false;
  switch (u_charType(UChar32(c))) {
    case U_CONTROL_CHAR:
    case U_FORMAT_CHAR:
    case U_UNASSIGNED:
    case U_PRIVATE_USE_CHAR:
    case U_SURROGATE: return true;
    default: return false;
  }
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126);
  switch (u_charType(UChar32(c))) {
    case U_CONNECTOR_PUNCTUATION:
    case U_DASH_PUNCTUATION:
    case U_START_PUNCTUATION:
    case U_END_PUNCTUATION:
    case U_INITIAL_PUNCTUATION:
    case U_FINAL_PUNCTUATION:
    case U_OTHER_PUNCTUATION: return true;
    default: return false;
  }
}

// The CJK ideograph blocks BERT pads with spaces.
bool is_chinese(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

// NFD, then drop nonspacing marks (Mn).
std::u32string strip_accents(const std::u32string& s) {
  bool ascii = true;
  for (char32_t c : s) ascii &= c < 0x80;
  if (ascii) return s;
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* nfd = icu::Normalizer2::getNFDInstance(st);
  if (U_FAILURE(st)) fail("ICU has no NFD normalizer");
  icu::UnicodeString u;
  for (char32_t c : s) u.append(UChar32(c));
  const icu::UnicodeString d = nfd->normalize(u, st);
  if (U_FAILURE(st)) fail("NFD normalization failed");
  std::u32string r;
  for (std::int32_t i = 0; i < d.length();) {
    const UChar32 c = d.char32At(i);
    i += U16_LENGTH(c);
    if (u_charType(c) != U_NON_SPACING_MARK) r.push_back(char32_t(c));
  }
  return r;
}

// Each character's full lowercase mapping (one character may become several: U+0130 → i̇).
std::u32string lowercase(const std::u32string& s) {
  std::u32string r;
  r.reserve(s.size());
  for (char32_t c : s) {
    if (c < 0x80) {
      r.push_back(c >= 'A' && c <= 'Z' ? c + 32 : c);
      continue;
    }
    icu::UnicodeString u = icu::UnicodeString(static_cast<UChar32>(c));
    u.toLower(icu::Locale::getRoot());
    for (std::int32_t i = 0; i < u.length();) {
      const UChar32 x = u.char32At(i);
      i += U16_LENGTH(x);
      r.push_back(char32_t(x));
    }
  }
  return r;
}

}  // namespace

wordpiece_tokenizer::wordpiece_tokenizer(std::vector<std::string> vocab, wordpiece_config config)
    : vocab_(std::move(vocab)), config_(std::move(config)) {
  index_.reserve(vocab_.size());
  for (std::size_t i = 0; i < vocab_.size(); ++i) index_.emplace(vocab_[i], std::int64_t(i));
  auto need = [&](const std::string& t) {
    const std::int64_t i = id(t);
    if (i < 0) fail(fmt::format("the vocabulary ({} tokens) has no special token {}", vocab_.size(), t));
    return i;
  };
  unk_id_ = need(config_.unk), cls_id_ = need(config_.cls), sep_id_ = need(config_.sep), pad_id_ = need(config_.pad);
  if (config_.max_input_chars_per_word < 1)
    fail(fmt::format("max_input_chars_per_word = {} must be >= 1", config_.max_input_chars_per_word));
}

wordpiece_tokenizer wordpiece_tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(fmt::format("cannot open {}", path));
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  const bool json = path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  wordpiece_config cfg;
  std::vector<std::string> vocab;
  if (!json) {
    std::string line;
    std::istringstream in(text);
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      vocab.push_back(line);
    }
    return wordpiece_tokenizer(std::move(vocab), cfg);
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail(fmt::format("{} is not valid JSON: {}", path, e.what()));
  }
  try {
    const auto& m = j.at("model");
    if (m.value("type", std::string()) != "WordPiece")
      fail(fmt::format("{}: model type is '{}', expected WordPiece", path, m.value("type", std::string())));
    cfg.unk = m.value("unk_token", cfg.unk);
    cfg.prefix = m.value("continuing_subword_prefix", cfg.prefix);
    cfg.max_input_chars_per_word = m.value("max_input_chars_per_word", cfg.max_input_chars_per_word);
    const auto& v = m.at("vocab");
    vocab.resize(v.size());
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::int64_t i = it.value().get<std::int64_t>();
      if (i < 0 || i >= std::int64_t(v.size())) fail(fmt::format("{}: token id {} is outside [0, {})", path, i, v.size()));
      vocab[std::size_t(i)] = it.key();
    }
    if (j.contains("normalizer") && !j["normalizer"].is_null()) {
      const auto& n = j["normalizer"];
      if (n.value("type", std::string()) != "BertNormalizer")
        fail(fmt::format("{}: normalizer '{}' is not supported (BertNormalizer is)", path, n.value("type", std::string())));
      cfg.lowercase = n.value("lowercase", true);
      cfg.clean_text = n.value("clean_text", true);
      cfg.handle_chinese_chars = n.value("handle_chinese_chars", true);
      cfg.strip_accents = n.contains("strip_accents") && !n["strip_accents"].is_null() ? n["strip_accents"].get<bool>()
                                                                                       : cfg.lowercase;
    }
    if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null() &&
        j["pre_tokenizer"].value("type", std::string()) != "BertPreTokenizer")
      fail(fmt::format("{}: pre_tokenizer '{}' is not supported (BertPreTokenizer is)", path,
                       j["pre_tokenizer"].value("type", std::string())));
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("{}: unexpected tokenizer.json layout: {}", path, e.what()));
  }
  return wordpiece_tokenizer(std::move(vocab), cfg);
}

std::int64_t wordpiece_tokenizer::id(std::string_view token) const {
  const auto it = index_.find(std::string(token));
  return it == index_.end() ? -1 : it->second;
}

std::string wordpiece_tokenizer::normalize(std::string_view utf8) const {
  const std::u32string in = decode_utf8(utf8);
  std::u32string s;
  s.reserve(in.size());
  for (char32_t c : in) {
    if (config_.clean_text) {
      if (c == 0 || c == 0xFFFD || is_control(c)) continue;
      if (is_whitespace(c)) c = ' ';
    }
    if (config_.handle_chinese_chars && is_chinese(c)) {
      s.push_back(' ');
      s.push_back(c);
      s.push_back(' ');
    } else {
      s.push_back(c);
    }
  }
  if (config_.strip_accents) s = strip_accents(s);
  if (config_.lowercase) s = lowercase(s);
  return encode_utf8(s);
}

void wordpiece_tokenizer::wordpiece(const std::u32string& word, std::vector<std::int64_t>& ids,
                                    std::vector<std::string>* pieces) const {
  if (std::int64_t(word.size()) > config_.max_input_chars_per_word) {
    ids.push_back(unk_id_);
    if (pieces) pieces->push_back(config_.unk);
    return;
  }
  const std::size_t n0 = ids.size(), p0 = pieces ? pieces->size() : 0;
  std::size_t start = 0;
  while (start < word.size()) {
    std::size_t end = word.size();
    std::int64_t found = -1;
    std::string piece;
    while (start < end) {
      piece = (start > 0 ? config_.prefix : std::string()) + encode_utf8(word, start, end);
      found = id(piece);
      if (found >= 0) break;
      --end;
    }
    if (found < 0) {  // no split: the whole word is unknown
      ids.resize(n0);
      ids.push_back(unk_id_);
      if (pieces) pieces->resize(p0), pieces->push_back(config_.unk);
      return;
    }
    ids.push_back(found);
    if (pieces) pieces->push_back(piece);
    start = end;
  }
}

void wordpiece_tokenizer::pieces_of(std::string_view utf8, std::vector<std::int64_t>& ids,
                                    std::vector<std::string>* pieces) const {
  const std::u32string s = decode_utf8(normalize(utf8));
  std::u32string word;
  auto flush = [&] {
    if (!word.empty()) wordpiece(word, ids, pieces), word.clear();
  };
  for (char32_t c : s) {
    if (is_whitespace(c)) {
      flush();
    } else if (is_punctuation(c)) {
      flush();
      word.push_back(c);
      flush();
    } else {
      word.push_back(c);
    }
  }
  flush();
}

std::vector<std::string> wordpiece_tokenizer::tokenize(std::string_view utf8) const {
  std::vector<std::int64_t> ids;
  std::vector<std::string> pieces;
  pieces_of(utf8, ids, &pieces);
  return pieces;
}

std::vector<std::int64_t> wordpiece_tokenizer::encode(std::string_view utf8, std::int64_t max_length) const {
  if (max_length < 0 || max_length == 1)
    fail(fmt::format("max_length = {} must be 0 (no limit) or >= 2 ([CLS] and [SEP])", max_length));
  std::vector<std::int64_t> ids{cls_id_};
  pieces_of(utf8, ids, nullptr);
  if (max_length > 0 && std::int64_t(ids.size()) + 1 > max_length) ids.resize(std::size_t(max_length - 1));
  ids.push_back(sep_id_);
  return ids;
}

token_batch wordpiece_tokenizer::encode_batch(const std::vector<std::string>& texts, std::int64_t max_length) const {
  std::vector<std::vector<std::int64_t>> all;
  all.reserve(texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {
    try {
      all.push_back(encode(texts[i], max_length));
    } catch (const error& e) {
      fail(fmt::format("text {}: {}", i, e.what()));
    }
  }
  return pad_batch(all);
}

token_batch wordpiece_tokenizer::pad_batch(const std::vector<std::vector<std::int64_t>>& rows) const {
  std::int64_t L = 0;
  for (const auto& row : rows) L = std::max<std::int64_t>(L, std::int64_t(row.size()));
  const auto n = std::int64_t(rows.size());
  token_batch b;
  b.ids = Tensor::full({n, L}, dtype::i64, double(pad_id_));
  b.mask = Tensor::zeros({n, L}, dtype::i64);
  auto* ids = b.ids.data_as<std::int64_t>();
  auto* mask = b.mask.data_as<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    const auto& row = rows[std::size_t(i)];
    for (std::size_t j = 0; j < row.size(); ++j) ids[i * L + std::int64_t(j)] = row[j], mask[i * L + std::int64_t(j)] = 1;
    b.lengths.push_back(std::int64_t(row.size()));
  }
  return b;
}

}  // namespace attn::models

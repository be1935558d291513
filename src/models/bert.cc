// src/models/bert.cc — the BERT encoder and the sentence embedder (see attn/models/bert.h).
#include "attn/models/bert.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "attn/attention.h"
#include "attn/error.h"
#include "attn/nn/activation.h"
#include "attn/safetensors.h"

namespace attn::models {
namespace {

[[noreturn]] void fail(const std::string& what) { throw error("bert: " + what); }

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) fail(fmt::format("cannot open {}", path));
  try {
    return nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    fail(fmt::format("{} is not valid JSON: {}", path, e.what()));
  }
}

// Seconds since `t0`, added to `slot` when profiling; returns the new start.
using clock_type = std::chrono::steady_clock;
clock_type::time_point lap(clock_type::time_point t0, double* slot) {
  const auto t1 = clock_type::now();
  if (slot) *slot += std::chrono::duration<double>(t1 - t0).count();
  return t1;
}

// The valid rows of x [B, N, C] (row t < lengths[b] of batch b), packed: [Σ lengths, C].
Tensor pack_rows(const Tensor& x, const std::vector<std::int64_t>& lengths) {
  const std::int64_t N = x.size(1), C = x.size(2);
  std::int64_t T = 0;
  for (std::int64_t len : lengths) T += len;
  Tensor out = Tensor::empty({T, C}, x.type());
  const std::size_t row = std::size_t(C) * dtype_size(x.type());
  const auto* src = static_cast<const std::byte*>(x.data());
  auto* dst = static_cast<std::byte*>(out.data());
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    std::memcpy(dst, src + b * std::size_t(N) * row, std::size_t(lengths[b]) * row);
    dst += std::size_t(lengths[b]) * row;
  }
  return out;
}

// The inverse of pack_rows: [B, N, C] with the padding rows zero.
Tensor unpack_rows(const Tensor& packed, const std::vector<std::int64_t>& lengths, std::int64_t N) {
  const std::int64_t B = std::int64_t(lengths.size()), C = packed.size(1);
  Tensor out = Tensor::zeros({B, N, C}, packed.type());
  const std::size_t row = std::size_t(C) * dtype_size(packed.type());
  const auto* src = static_cast<const std::byte*>(packed.data());
  auto* dst = static_cast<std::byte*>(out.data());
  for (std::size_t b = 0; b < lengths.size(); ++b) {
    std::memcpy(dst + b * std::size_t(N) * row, src, std::size_t(lengths[b]) * row);
    src += std::size_t(lengths[b]) * row;
  }
  return out;
}

}  // namespace

bert_config bert_config::from_file(const std::string& path) {
  const nlohmann::json j = read_json(path);
  bert_config c;
  try {
    if (j.value("model_type", std::string("bert")) != "bert")
      fail(fmt::format("{}: model_type is '{}', expected bert", path, j.value("model_type", std::string())));
    c.vocab_size = j.at("vocab_size").get<std::int64_t>();
    c.hidden_size = j.at("hidden_size").get<std::int64_t>();
    c.num_hidden_layers = j.at("num_hidden_layers").get<std::int64_t>();
    c.num_attention_heads = j.at("num_attention_heads").get<std::int64_t>();
    c.intermediate_size = j.at("intermediate_size").get<std::int64_t>();
    c.max_position_embeddings = j.at("max_position_embeddings").get<std::int64_t>();
    c.type_vocab_size = j.value("type_vocab_size", std::int64_t(2));
    c.layer_norm_eps = j.value("layer_norm_eps", 1e-12);
    c.hidden_act = j.value("hidden_act", std::string("gelu"));
    if (j.value("position_embedding_type", std::string("absolute")) != "absolute")
      fail(fmt::format("{}: position_embedding_type '{}' is not supported (absolute is)", path,
                       j.value("position_embedding_type", std::string())));
  } catch (const nlohmann::json::exception& e) {
    fail(fmt::format("{}: {}", path, e.what()));
  }
  if (c.hidden_act != "gelu") fail(fmt::format("{}: hidden_act '{}' is not supported (gelu is)", path, c.hidden_act));
  if (c.hidden_size <= 0 || c.num_attention_heads <= 0 || c.hidden_size % c.num_attention_heads)
    fail(fmt::format("{}: hidden_size {} is not a positive multiple of num_attention_heads {}", path, c.hidden_size,
                     c.num_attention_heads));
  if (c.num_hidden_layers < 0 || c.vocab_size <= 0 || c.intermediate_size <= 0 || c.max_position_embeddings <= 0 ||
      c.type_vocab_size <= 0)
    fail(fmt::format("{}: sizes must be positive", path));
  return c;
}

bert_model::bert_model(const bert_config& c) : config_(c) {
  const std::int64_t H = c.hidden_size, I = c.intermediate_size;
  nn::rng gen(0);  // shapes only: load() overwrites every value
  word_ = nn::Embedding(c.vocab_size, H, gen);
  position_ = nn::Embedding(c.max_position_embeddings, H, gen);
  token_type_ = nn::Embedding(c.type_vocab_size, H, gen);
  embedding_norm_ = nn::LayerNorm(H, dtype::f32, c.layer_norm_eps);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    bert_layer L;
    L.query = nn::Linear(H, H, gen), L.key = nn::Linear(H, H, gen), L.value = nn::Linear(H, H, gen);
    L.attention_output = nn::Linear(H, H, gen);
    L.attention_norm = nn::LayerNorm(H, dtype::f32, c.layer_norm_eps);
    L.intermediate = nn::Linear(H, I, gen), L.output = nn::Linear(I, H, gen);
    L.output_norm = nn::LayerNorm(H, dtype::f32, c.layer_norm_eps);
    layers_.push_back(std::move(L));
  }
  pooler_ = nn::Linear(H, H, gen);
  fuse_qkv();
}

void bert_model::fuse_qkv() {
  for (bert_layer& L : layers_) L.qkv = nn::stacked({&L.query, &L.key, &L.value});
}

void bert_model::parameters(nn::parameter_list& list, const std::string& prefix) {
  word_.parameters(list, prefix + "embeddings.word_embeddings.");
  position_.parameters(list, prefix + "embeddings.position_embeddings.");
  token_type_.parameters(list, prefix + "embeddings.token_type_embeddings.");
  embedding_norm_.parameters(list, prefix + "embeddings.LayerNorm.");
  for (std::size_t l = 0; l < layers_.size(); ++l) {
    const std::string p = fmt::format("{}encoder.layer.{}.", prefix, l);
    bert_layer& L = layers_[l];
    L.query.parameters(list, p + "attention.self.query.");
    L.key.parameters(list, p + "attention.self.key.");
    L.value.parameters(list, p + "attention.self.value.");
    L.attention_output.parameters(list, p + "attention.output.dense.");
    L.attention_norm.parameters(list, p + "attention.output.LayerNorm.");
    L.intermediate.parameters(list, p + "intermediate.dense.");
    L.output.parameters(list, p + "output.dense.");
    L.output_norm.parameters(list, p + "output.LayerNorm.");
  }
  pooler_.parameters(list, prefix + "pooler.dense.");
}

bert_model bert_model::load(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail(fmt::format("model folder {} does not exist", dir));
  bert_model m(bert_config::from_file(dir + "/config.json"));
  const safetensors_file f = read_safetensors(dir + "/model.safetensors");
  nn::parameter_list ps;
  m.parameters(ps);
  for (const nn::parameter_ref& p : ps) {
    if (!f.contains(p.name)) fail(fmt::format("{}: no tensor '{}'", f.path, p.name));
    const Tensor& t = f.at(p.name);
    if (t.shape() != p.value->shape())
      fail(fmt::format("{}: tensor '{}' has shape {}, expected {}", f.path, p.name, shape_str(t.shape()),
                       shape_str(p.value->shape())));
    if (!is_floating(t.type())) fail(fmt::format("{}: tensor '{}' has dtype {}", f.path, p.name, dtype_name(t.type())));
    *p.value = t.to(dtype::f32);
  }
  m.fuse_qkv();
  return m;
}

Tensor bert_model::forward(const Tensor& ids, const std::vector<std::int64_t>& lengths, dtype attention_dtype,
                           const execution& exec, embed_profile* prof) const {
  if (ids.rank() != 2 || (ids.type() != dtype::i64 && ids.type() != dtype::i32))
    fail(fmt::format("ids must be int64 or int32 [B, N], got {} {}", dtype_name(ids.type()), shape_str(ids.shape())));
  const std::int64_t B = ids.size(0), N = ids.size(1), H = config_.hidden_size;
  if (std::int64_t(lengths.size()) != B) fail(fmt::format("{} lengths for a batch of {}", lengths.size(), B));
  if (N > config_.max_position_embeddings)
    fail(fmt::format("sequences of {} tokens exceed max_position_embeddings = {}", N, config_.max_position_embeddings));
  for (std::int64_t b = 0; b < B; ++b)
    if (lengths[std::size_t(b)] < 1 || lengths[std::size_t(b)] > N)
      fail(fmt::format("lengths[{}] = {} is outside [1, {}]", b, lengths[std::size_t(b)], N));
  if (attention_dtype != dtype::f32 && attention_dtype != dtype::bf16)
    fail(fmt::format("attention dtype {} is not float32 or bfloat16", dtype_name(attention_dtype)));
  auto t0 = clock_type::now();

  // Embeddings: word + position + token type 0, then LayerNorm.
  Tensor h = word_.forward(ids);
  {
    float* x = h.data_as<float>();
    const float* pos = position_.weight.data_as<float>();
    const float* typ = token_type_.weight.data_as<float>();
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t c = 0; c < H; ++c) x[(b * N + n) * H + c] += pos[n * H + c] + typ[c];
  }
  h = embedding_norm_.forward(h);
  t0 = lap(t0, prof ? &prof->embeddings : nullptr);

  attention_options ao;
  ao.q_num_heads = ao.kv_num_heads = config_.num_attention_heads;
  ao.nonpad_kv_seqlen = Tensor::from_values({B}, dtype::i64, std::vector<double>(lengths.begin(), lengths.end()));
  // Everything but attention runs on the valid tokens only, packed [T, H] (T = Σ lengths): the
  // padding rows of a batch cost no GEMM work. Attention gets them back in [B, N, ·].
  h = pack_rows(h, lengths);
  for (const bert_layer& L : layers_) {
    // One GEMM for q, k, v; attention reads the three column blocks of [B, N, 3H] in place.
    Tensor qkv = unpack_rows(L.qkv.forward(h), lengths, N);
    t0 = lap(t0, prof ? &prof->projections : nullptr);
    if (attention_dtype != dtype::f32) qkv = qkv.to(attention_dtype);
    const TensorView& all = qkv.view();
    Tensor a = attention(all.slice(2, 0, H), all.slice(2, H, 2 * H), all.slice(2, 2 * H, 3 * H), ao, exec).out;
    if (a.type() != dtype::f32) a = a.to(dtype::f32);
    a = pack_rows(a, lengths);
    t0 = lap(t0, prof ? &prof->attention : nullptr);
    a = L.attention_output.forward(a);
    t0 = lap(t0, prof ? &prof->projections : nullptr);
    a = L.attention_norm.forward(a, h);
    t0 = lap(t0, prof ? &prof->norms : nullptr);
    Tensor f = L.intermediate.forward(a);
    t0 = lap(t0, prof ? &prof->ffn : nullptr);
    f = nn::activate(nn::activation::gelu, f);
    t0 = lap(t0, prof ? &prof->gelu : nullptr);
    f = L.output.forward(f);
    t0 = lap(t0, prof ? &prof->ffn : nullptr);
    h = L.output_norm.forward(f, a);
    t0 = lap(t0, prof ? &prof->norms : nullptr);
  }
  return unpack_rows(h, lengths, N);
}

sentence_embedder sentence_embedder::load(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir)) fail(fmt::format("model folder {} does not exist", dir));
  const std::string tj = dir + "/tokenizer.json";
  wordpiece_tokenizer tok = wordpiece_tokenizer::from_file(fs::exists(tj) ? tj : dir + "/vocab.txt");
  std::int64_t max_len = 256;
  if (fs::exists(dir + "/sentence_bert_config.json"))
    max_len = read_json(dir + "/sentence_bert_config.json").value("max_seq_length", max_len);
  bert_model m = bert_model::load(dir);
  max_len = std::min(max_len, m.config().max_position_embeddings);
  return sentence_embedder(std::move(tok), std::move(m), max_len);
}

Tensor sentence_embedder::embed(const std::vector<std::string>& texts, std::int64_t batch, dtype attention_dtype,
                                const execution& exec, embed_profile* prof) const {
  if (batch < 1) fail(fmt::format("batch = {} must be >= 1", batch));
  const std::int64_t n = std::int64_t(texts.size()), H = model_.config().hidden_size;
  Tensor out = Tensor::zeros({n, H}, dtype::f32);
  float* o = out.data_as<float>();
  auto t0 = clock_type::now();
  std::vector<std::vector<std::int64_t>> ids(texts.size());
  for (std::size_t i = 0; i < texts.size(); ++i) {  // name the text that cannot be read
    try {
      ids[i] = tokenizer_.encode(texts[i], max_seq_length_);
    } catch (const error& e) {
      fail(fmt::format("text {} (counting from 0): {}", i, e.what()));
    }
  }
  // Longest first, so each batch is padded to little more than its own texts.
  std::vector<std::size_t> order(texts.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return ids[a].size() > ids[b].size(); });
  lap(t0, prof ? &prof->tokenize : nullptr);
  for (std::int64_t s = 0; s < n; s += batch) {
    const std::int64_t nb = std::min(n, s + batch) - s;
    std::vector<std::vector<std::int64_t>> part;
    for (std::int64_t b = 0; b < nb; ++b) part.push_back(std::move(ids[order[std::size_t(s + b)]]));
    const token_batch tb = tokenizer_.pad_batch(part);
    const Tensor h = model_.forward(tb.ids, tb.lengths, attention_dtype, exec, prof);
    t0 = clock_type::now();
    const std::int64_t N = h.size(1);
    const float* x = h.data_as<float>();
    for (std::int64_t b = 0; b < nb; ++b) {  // mean over valid tokens, then L2
      const std::int64_t len = tb.lengths[std::size_t(b)];
      std::vector<double> acc(std::size_t(H), 0.0);
      for (std::int64_t t = 0; t < len; ++t)
        for (std::int64_t c = 0; c < H; ++c) acc[std::size_t(c)] += x[(b * N + t) * H + c];
      double norm = 0.0;
      for (double& a : acc) a /= double(len), norm += a * a;
      norm = std::max(std::sqrt(norm), 1e-12);  // torch.nn.functional.normalize's eps
      float* row = o + std::int64_t(order[std::size_t(s + b)]) * H;
      for (std::int64_t c = 0; c < H; ++c) row[c] = float(acc[std::size_t(c)] / norm);
    }
    lap(t0, prof ? &prof->pooling : nullptr);
  }
  return out;
}

}  // namespace attn::models

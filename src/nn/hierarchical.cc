// src/nn/hierarchical.cc — ContextAttention (attention pooling with a learned context vector) on
// attn::attention, and the hierarchical attention network built from two BiGRUs and two of them.
#include "attn/nn/hierarchical.h"

#include <cmath>

#include "attn/attention.h"
#include "attn/nn/activation.h"
#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

// The paper's score u_tᵀ u_c has no 1/sqrt(A): one head, scale 1, keys t >= lengths_r excluded.
attention_options pool_options(const Tensor& lengths) { return detail::one_head_unscaled(lengths); }

Tensor reshaped(const Tensor& t, Shape shape) { return Tensor::copy_of(t.view().reshape(std::move(shape))); }

}  // namespace

// ---- ContextAttention ----

ContextAttention::ContextAttention(std::int64_t D, std::int64_t A, rng& gen, dtype t) {
  if (D < 1 || A < 1) detail::fail("ContextAttention", fmt::format("D = {} and A = {} must be >= 1", D, A));
  proj = Linear(D, A, gen, true, t);
  context = Tensor::empty({A}, t);
  fill_uniform(context, -1.0 / std::sqrt(double(A)), 1.0 / std::sqrt(double(A)), gen);
  dcontext = zeros_like(context);
}

ContextAttention::result ContextAttention::forward(const Tensor& h, const Tensor& lengths, saved* s,
                                                   bool need_weights) const {
  const char* op = "ContextAttention";
  if (!context.defined() || context.numel() == 0)
    detail::fail(op, "the layer has no parameters: construct it with sizes D, A");
  const std::int64_t D = proj.in_features(), A = proj.out_features();
  detail::check_dtype(op, "h", h, context.type());
  if (h.rank() != 3 || h.size(2) != D)
    detail::fail(op, fmt::format("h has shape {}, expected [R, N, D] with D = {}", shape_str(h.shape()), D));
  const std::int64_t R = h.size(0), N = h.size(1);
  detail::read_lengths(op, "lengths", lengths, {R}, N, "N");
  // u = tanh(W h + b) [R, N, A];  q = u_c repeated for every row [R, 1, A]
  const Tensor a = proj.forward(h);
  const Tensor u = activate(activation::tanh, a);
  Tensor q = Tensor::empty({R, 1, A}, h.type());
  detail::with_type(h.type(), [&](auto zero) {
    using T = decltype(zero);
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t c = 0; c < A; ++c) detail::ptr<T>(q)[r * A + c] = detail::ptr<T>(context)[c];
  });
  attention_options o = pool_options(lengths);
  if (need_weights) o.return_qk = qk_output::probabilities;
  const attention_result ar = attention(q, u, h, o);  // out [R, 1, D]
  if (s) *s = {h, lengths, a, u, q, ar.out, ar.lse};
  result r;
  r.pooled = reshaped(ar.out, {R, D});
  if (need_weights) r.weights = reshaped(ar.qk, {R, N});
  return r;
}

Tensor ContextAttention::backward(const saved& s, const Tensor& dpooled) {
  if (!s.h.defined() || !s.lse.defined())
    detail::fail("ContextAttention.backward", "saved is empty: pass the record that forward filled");
  const std::int64_t R = s.h.size(0), D = s.h.size(2);
  detail::check_dtype("ContextAttention.backward", "dpooled", dpooled, context.type());
  detail::check_shape("ContextAttention.backward", "dpooled", dpooled, {R, D});
  // s = attention(q = u_c, k = u, v = h)
  const attention_grads g =
      attention_backward(s.q, s.u, s.h, s.out, reshaped(dpooled, {R, 1, D}), s.lse, pool_options(s.lengths));
  // q_r = u_c for every r  →  du_c = Σ_r dq_r
  detail::with_type(context.type(), [&](auto zero) {
    using T = decltype(zero);
    const std::int64_t A = context.numel();
    for (std::int64_t r = 0; r < R; ++r)
      for (std::int64_t c = 0; c < A; ++c) detail::ptr<T>(dcontext)[c] += detail::ptr<T>(g.dq)[r * A + c];
  });
  // u = tanh(a), a = W h + b;  h is also the values: dh = dv + Wᵀ da
  const Tensor da = activate_backward(activation::tanh, s.a, g.dk);
  return add(proj.backward(s.h, da), g.dv);
}

void ContextAttention::parameters(parameter_list& list, const std::string& prefix) {
  proj.parameters(list, join(prefix, "proj"));
  add_parameter(list, prefix, "context", context, dcontext);
}

// ---- HierarchicalAttention ----

HierarchicalAttention::HierarchicalAttention(std::int64_t E, std::int64_t Hw, std::int64_t Hs, rng& gen, dtype t) {
  if (E < 1 || Hw < 1 || Hs < 1)
    detail::fail("HierarchicalAttention", fmt::format("E = {}, Hw = {}, Hs = {} must be >= 1", E, Hw, Hs));
  word_encoder = BiGRUEncoder(E, Hw, gen, t);
  word_attention = ContextAttention(2 * Hw, 2 * Hw, gen, t);
  sentence_encoder = BiGRUEncoder(2 * Hw, Hs, gen, t);
  sentence_attention = ContextAttention(2 * Hs, 2 * Hs, gen, t);
}

HierarchicalAttention::result HierarchicalAttention::forward(const Tensor& x, const Tensor& word_lengths,
                                                             const Tensor& sentence_lengths, saved* s,
                                                             bool need_weights) const {
  const char* op = "HierarchicalAttention";
  if (!word_attention.context.defined() || word_attention.context.numel() == 0)
    detail::fail(op, "the layer has no parameters: construct it with sizes E, Hw, Hs");
  const std::int64_t E = word_encoder.fwd.ih.in_features(), Dw = word_attention.proj.in_features();
  detail::check_dtype(op, "x", x, word_attention.context.type());
  if (x.rank() != 4 || x.size(3) != E)
    detail::fail(op, fmt::format("x has shape {}, expected [B, S, W, E] with E = {}", shape_str(x.shape()), E));
  const std::int64_t B = x.size(0), S = x.size(1), W = x.size(2);
  const auto wl = detail::read_lengths(op, "word_lengths", word_lengths, {B, S}, W, "W");
  const auto sl = detail::read_lengths(op, "sentence_lengths", sentence_lengths, {B}, S, "S");
  // Sentences past a document's length are empty: no word of theirs is read.
  Tensor words_len = Tensor::empty({B * S}, dtype::i64);
  for (std::int64_t i = 0; i < B * S; ++i)
    words_len.data_as<std::int64_t>()[i] = i % S < sl[std::size_t(i / S)] ? wl[std::size_t(i)] : 0;

  saved local;
  saved& sv = s ? *s : local;
  sv.B = B, sv.S = S, sv.W = W;
  // h = BiGRU_w(x) [B·S, W, 2Hw];  sentence vectors [B·S, 2Hw]
  const Tensor h = word_encoder.forward(reshaped(x, {B * S, W, E}), words_len, &sv.words).out;
  const ContextAttention::result sent = word_attention.forward(h, words_len, &sv.word_pool, need_weights);
  // g = BiGRU_s(sentence vectors) [B, S, 2Hs];  document [B, 2Hs]
  const Tensor g = sentence_encoder.forward(reshaped(sent.pooled, {B, S, Dw}), sentence_lengths, &sv.sentences).out;
  const ContextAttention::result doc = sentence_attention.forward(g, sentence_lengths, &sv.sentence_pool, need_weights);
  result r;
  r.document = doc.pooled;
  if (need_weights) r.word_weights = reshaped(sent.weights, {B, S, W}), r.sentence_weights = doc.weights;
  return r;
}

// Each line undoes one line of the forward, last first.
Tensor HierarchicalAttention::backward(const saved& s, const Tensor& ddocument) {
  if (!s.words.x.defined()) detail::fail("HierarchicalAttention.backward", "saved is empty: pass the record that forward filled");
  const std::int64_t E = word_encoder.fwd.ih.in_features(), Dw = word_attention.proj.in_features();
  // document = ContextAttention_s(g);  g = BiGRU_s(sentence vectors)
  const Tensor dg = sentence_attention.backward(s.sentence_pool, ddocument);
  const Tensor dsent = sentence_encoder.backward(s.sentences, dg, Tensor{}, Tensor{});
  // sentence vectors = ContextAttention_w(h);  h = BiGRU_w(x)
  const Tensor dh = word_attention.backward(s.word_pool, reshaped(dsent, {s.B * s.S, Dw}));
  const Tensor dx = word_encoder.backward(s.words, dh, Tensor{}, Tensor{});
  return reshaped(dx, {s.B, s.S, s.W, E});
}

void HierarchicalAttention::parameters(parameter_list& list, const std::string& prefix) {
  word_encoder.parameters(list, join(prefix, "word_encoder"));
  word_attention.parameters(list, join(prefix, "word_attention"));
  sentence_encoder.parameters(list, join(prefix, "sentence_encoder"));
  sentence_attention.parameters(list, join(prefix, "sentence_attention"));
}

}  // namespace attn::nn

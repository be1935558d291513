// src/nn/transformer.cc — feed-forward block, residual blocks, Transformer encoder and decoder
// layers.
#include "attn/nn/transformer.h"

#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

mha_config attention_config(const transformer_config& c) {
  return {.embed_dim = c.d_model, .num_heads = c.num_heads, .num_kv_heads = c.num_kv_heads, .rotary = c.rotary};
}

Residual residual(const transformer_config& c, dtype t, std::uint64_t salt) {
  Residual r;
  r.norm = LayerNorm(c.d_model, t, c.eps);
  r.drop = Dropout(c.dropout, c.seed * 4 + salt);
  r.pre_norm = c.pre_norm;
  return r;
}

std::int64_t d_ff(const transformer_config& c) { return c.d_ff ? c.d_ff : 4 * c.d_model; }

}  // namespace

// ---- FeedForward ----

FeedForward::FeedForward(std::int64_t E, std::int64_t F, activation a, rng& gen, dtype t)
    : fc1(E, F, gen, true, t), fc2(F, E, gen, true, t), act(a) {}

Tensor FeedForward::forward(const Tensor& x, saved* s) const {
  const Tensor h = fc1.forward(x);
  if (s) *s = {x, h};
  return fc2.forward(activate(act, h));
}

// y = fc2(act(h)), h = fc1(x)
Tensor FeedForward::backward(const saved& s, const Tensor& dy) {
  const Tensor da = fc2.backward(activate(act, s.h), dy);
  return fc1.backward(s.x, activate_backward(act, s.h, da));
}

void FeedForward::parameters(parameter_list& list, const std::string& prefix) {
  fc1.parameters(list, join(prefix, "fc1"));
  fc2.parameters(list, join(prefix, "fc2"));
}

// ---- Residual ----

Tensor Residual::forward(const Tensor& x, const sublayer& f, saved* s) {
  Tensor mask;
  if (pre_norm) {  // y = x + drop(f(LN(x)))
    const Tensor y = add(x, drop.forward(f(norm.forward(x)), mask));
    if (s) *s = {x, x, mask};
    return y;
  }
  const Tensor sum = add(x, drop.forward(f(x), mask));  // y = LN(x + drop(f(x)))
  if (s) *s = {x, sum, mask};
  return norm.forward(sum);
}

Tensor Residual::backward(const saved& s, const Tensor& dy, const sublayer& f_backward) {
  if (pre_norm) {  // y = x + drop(f(LN(x)))  →  dx = dy + LN'(x)ᵀ f'ᵀ drop'(dy)
    Tensor dx = norm.backward(s.x, f_backward(Dropout::backward(s.mask, dy)));
    add_into(dx, dy);
    return dx;
  }
  const Tensor dsum = norm.backward(s.norm_in, dy);  // y = LN(sum), sum = x + drop(f(x))
  Tensor dx = f_backward(Dropout::backward(s.mask, dsum));
  add_into(dx, dsum);
  return dx;
}

void Residual::parameters(parameter_list& list, const std::string& prefix) { norm.parameters(list, join(prefix, "norm")); }

// ---- encoder layer ----

TransformerEncoderLayer::TransformerEncoderLayer(const transformer_config& c, rng& gen, dtype t)
    : self_attn(attention_config(c), gen, t),
      ff(c.d_model, d_ff(c), c.act, gen, t),
      attn_block(residual(c, t, 0)),
      ff_block(residual(c, t, 1)) {}

Tensor TransformerEncoderLayer::forward(const Tensor& x, const masking_options& mask, saved* s) {
  const Tensor h = attn_block.forward(
      x, [&](const Tensor& u) { return self_attn.forward(u, u, u, mask, s ? &s->attn : nullptr).out; },
      s ? &s->attn_block : nullptr);
  return ff_block.forward(
      h, [&](const Tensor& u) { return ff.forward(u, s ? &s->ff : nullptr); }, s ? &s->ff_block : nullptr);
}

Tensor TransformerEncoderLayer::backward(const saved& s, const Tensor& dy) {
  const Tensor dh = ff_block.backward(s.ff_block, dy, [&](const Tensor& d) { return ff.backward(s.ff, d); });
  return attn_block.backward(s.attn_block, dh, [&](const Tensor& d) {
    const MultiHeadAttention::grads g = self_attn.backward(s.attn, d);
    Tensor du = add(g.dquery, g.dkey);  // query, key and value are the same tensor u
    add_into(du, g.dvalue);
    return du;
  });
}

void TransformerEncoderLayer::set_training(bool on) { attn_block.drop.training = ff_block.drop.training = on; }

void TransformerEncoderLayer::parameters(parameter_list& list, const std::string& prefix) {
  self_attn.parameters(list, join(prefix, "self_attn"));
  attn_block.parameters(list, join(prefix, "attn_block"));
  ff.parameters(list, join(prefix, "ff"));
  ff_block.parameters(list, join(prefix, "ff_block"));
}

// ---- decoder layer ----

TransformerDecoderLayer::TransformerDecoderLayer(const transformer_config& c, rng& gen, dtype t)
    : self_attn(attention_config(c), gen, t),
      cross_attn([&] {
        mha_config m = attention_config(c);
        m.rotary = false;  // positions of memory and queries are unrelated
        return m;
      }(), gen, t),
      ff(c.d_model, d_ff(c), c.act, gen, t),
      self_block(residual(c, t, 0)),
      cross_block(residual(c, t, 1)),
      ff_block(residual(c, t, 2)) {}

namespace {
masking_options causal() {
  masking_options m;
  m.is_causal = true;
  return m;
}
}  // namespace

Tensor TransformerDecoderLayer::forward(const Tensor& x, const Tensor& memory, const masking_options& memory_mask,
                                        saved* s) {
  const Tensor h1 = self_block.forward(
      x, [&](const Tensor& u) { return self_attn.forward(u, u, u, causal(), s ? &s->self : nullptr).out; },
      s ? &s->self_block : nullptr);
  const Tensor h2 = cross_block.forward(
      h1,
      [&](const Tensor& u) { return cross_attn.forward(u, memory, memory, memory_mask, s ? &s->cross : nullptr).out; },
      s ? &s->cross_block : nullptr);
  return ff_block.forward(
      h2, [&](const Tensor& u) { return ff.forward(u, s ? &s->ff : nullptr); }, s ? &s->ff_block : nullptr);
}

TransformerDecoderLayer::grads TransformerDecoderLayer::backward(const saved& s, const Tensor& dy) {
  grads g;
  const Tensor dh2 = ff_block.backward(s.ff_block, dy, [&](const Tensor& d) { return ff.backward(s.ff, d); });
  const Tensor dh1 = cross_block.backward(s.cross_block, dh2, [&](const Tensor& d) {
    const MultiHeadAttention::grads c = cross_attn.backward(s.cross, d);
    g.dmemory = add(c.dkey, c.dvalue);  // key and value are the memory
    return c.dquery;
  });
  g.dx = self_block.backward(s.self_block, dh1, [&](const Tensor& d) {
    const MultiHeadAttention::grads a = self_attn.backward(s.self, d);
    Tensor du = add(a.dquery, a.dkey);
    add_into(du, a.dvalue);
    return du;
  });
  return g;
}

Tensor TransformerDecoderLayer::forward_step(const Tensor& x, kv_cache& cache,
                                             const MultiHeadAttention::projected_kv& memory,
                                             const masking_options& memory_mask) {
  const Tensor h1 =
      self_block.forward(x, [&](const Tensor& u) { return self_attn.forward_cached(u, cache, causal()); }, nullptr);
  const Tensor h2 = cross_block.forward(
      h1, [&](const Tensor& u) { return cross_attn.forward_projected(u, memory, memory_mask); }, nullptr);
  return ff_block.forward(h2, [&](const Tensor& u) { return ff.forward(u, nullptr); }, nullptr);
}

void TransformerDecoderLayer::set_training(bool on) {
  self_block.drop.training = cross_block.drop.training = ff_block.drop.training = on;
}

void TransformerDecoderLayer::parameters(parameter_list& list, const std::string& prefix) {
  self_attn.parameters(list, join(prefix, "self_attn"));
  self_block.parameters(list, join(prefix, "self_block"));
  cross_attn.parameters(list, join(prefix, "cross_attn"));
  cross_block.parameters(list, join(prefix, "cross_block"));
  ff.parameters(list, join(prefix, "ff"));
  ff_block.parameters(list, join(prefix, "ff_block"));
}

}  // namespace attn::nn

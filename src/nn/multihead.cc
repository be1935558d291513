// src/nn/multihead.cc — MultiHeadAttention: four Linear projections around attn::attention,
// an optional rotary embedding of q and k, and decoding through an attn::kv_cache.
#include "attn/nn/multihead.h"

#include <cmath>

#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

const char* kOp = "MultiHeadAttention";

mha_config resolved(mha_config c) {
  if (c.embed_dim < 1 || c.num_heads < 1)
    detail::fail(kOp, fmt::format("embed_dim = {} and num_heads = {} must be >= 1", c.embed_dim, c.num_heads));
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  if (c.num_kv_heads < 1 || c.num_heads % c.num_kv_heads != 0)
    detail::fail(kOp, fmt::format("num_kv_heads = {} must divide num_heads = {}", c.num_kv_heads, c.num_heads));
  if (c.kdim == 0) c.kdim = c.embed_dim;
  if (c.vdim == 0) c.vdim = c.embed_dim;
  if (c.kdim < 1 || c.vdim < 1) detail::fail(kOp, fmt::format("kdim = {} and vdim = {} must be >= 1", c.kdim, c.vdim));
  if (c.head_dim == 0) {
    if (c.embed_dim % c.num_heads != 0)
      detail::fail(kOp, fmt::format("embed_dim = {} is not divisible by num_heads = {} (set head_dim)", c.embed_dim,
                                    c.num_heads));
    c.head_dim = c.embed_dim / c.num_heads;
  }
  if (c.value_head_dim == 0) c.value_head_dim = c.head_dim;
  if (c.head_dim < 1 || c.value_head_dim < 1)
    detail::fail(kOp, fmt::format("head_dim = {} and value_head_dim = {} must be >= 1", c.head_dim, c.value_head_dim));
  return c;
}

// Checks x [B, N, width] (dtype t) and returns N.
std::int64_t check_input(const char* name, const Tensor& x, std::int64_t width, dtype t, std::int64_t B = -1,
                         std::int64_t N = -1) {
  detail::check_dtype(kOp, name, x, t);
  if (x.rank() != 3 || x.size(2) != width || (B >= 0 && x.size(0) != B) || (N >= 0 && x.size(1) != N))
    detail::fail(kOp, fmt::format("{} has shape {}, expected [B, N, {}]{}", name, shape_str(x.shape()), width,
                                  B >= 0 ? fmt::format(" with B = {}{}", B, N >= 0 ? fmt::format(", N = {}", N) : "")
                                         : ""));
  return x.size(1);
}

// Positions L_b + n of the new tokens, int64 [B, Nnew].
Tensor cache_positions(const kv_cache& cache, std::int64_t Nnew) {
  const std::int64_t B = cache.lengths().size(0);
  Tensor ids = Tensor::empty({B, Nnew}, dtype::i64);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t n = 0; n < Nnew; ++n)
      ids.data_as<std::int64_t>()[b * Nnew + n] = cache.lengths().data_as<std::int64_t>()[b] + n;
  return ids;
}

// The core op's options for this layer's heads, with the caller's masks.
attention_options options_for(const mha_config& c, const masking_options& mask) {
  attention_options opt;
  static_cast<masking_options&>(opt) = mask;
  opt.q_num_heads = c.num_heads;
  opt.kv_num_heads = c.num_kv_heads;
  opt.scale = c.scale;
  opt.mask_gradient = false;  // the layer's grads hold no mask gradient
  return opt;
}

// Rotates q [B, N, Hq·D] and k [B, N, Hkv·D] at `pos` (or back, for the backward).
void rotate(const mha_config& c, Tensor& q, Tensor& k, const positions& pos, bool backward) {
  rotary_options ro = c.rotary_opts;
  ro.num_heads = c.num_heads;
  q = backward ? rotary_backward(q, pos, ro) : rotary(q, pos, ro);
  ro.num_heads = c.num_kv_heads;
  k = backward ? rotary_backward(k, pos, ro) : rotary(k, pos, ro);
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const mha_config& c, rng& gen, dtype t) : config(resolved(c)) {
  const mha_config& r = config;
  q_proj = Linear(r.embed_dim, r.num_heads * r.head_dim, gen, r.bias, t);
  k_proj = Linear(r.kdim, r.num_kv_heads * r.head_dim, gen, r.bias, t);
  v_proj = Linear(r.vdim, r.num_kv_heads * r.value_head_dim, gen, r.bias, t);
  out_proj = Linear(r.num_heads * r.value_head_dim, r.embed_dim, gen, r.bias, t);
  for (Linear* l : {&q_proj, &k_proj, &v_proj, &out_proj}) {
    xavier_uniform(l->weight, gen);
    if (l->bias.defined()) fill_constant(l->bias, 0.0);
  }
  config.rotary_opts.num_heads = 0;  // set per call (q and k have different head counts)
}

MultiHeadAttention::result MultiHeadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                       const masking_options& mask, saved* s, bool need_weights) const {
  const mha_config& c = config;
  const dtype t = q_proj.weight.type();
  check_input("query", query, c.embed_dim, t);
  const std::int64_t B = query.size(0);
  const std::int64_t Nk = check_input("key", key, c.kdim, t, B);
  check_input("value", value, c.vdim, t, B, Nk);

  Tensor q = q_proj.forward(query), k = k_proj.forward(key), v = v_proj.forward(value);
  if (c.rotary) rotate(c, q, k, 0, false);
  attention_options opt = options_for(c, mask);
  if (need_weights) opt.return_qk = qk_output::probabilities;
  attention_result a = attention(q, k, v, opt);
  opt.return_qk = qk_output::none;
  result r;
  r.out = out_proj.forward(a.out);
  r.weights = a.qk;
  if (s) *s = {query, key, value, q, k, v, a.out, a.lse, opt};
  return r;
}

// Each line undoes one line of the forward, last first:
//   y = o W_Oᵀ + b_O           →  do = dy W_O
//   o = attention(q, k, v)     →  dq, dk, dv = attention_backward(...)
//   q, k = rotary(q, k)        →  dq, dk rotated back
//   q, k, v = projections      →  dquery, dkey, dvalue
MultiHeadAttention::grads MultiHeadAttention::backward(const saved& s, const Tensor& dy) {
  const mha_config& c = config;
  detail::check_dtype("MultiHeadAttention.backward", "dy", dy, s.query.type());
  detail::check_shape("MultiHeadAttention.backward", "dy", dy, s.query.shape());
  const Tensor d_o = out_proj.backward(s.o, dy);
  const attention_grads g = attention_backward(s.q, s.k, s.v, s.o, d_o, s.lse, s.opt);
  Tensor dq = g.dq, dk = g.dk;
  if (c.rotary) rotate(c, dq, dk, 0, true);
  grads r;
  r.dquery = q_proj.backward(s.query, dq);
  r.dkey = k_proj.backward(s.key, dk);
  r.dvalue = v_proj.backward(s.value, g.dv);
  return r;
}

kv_cache MultiHeadAttention::make_cache(std::int64_t B, std::int64_t capacity) const {
  return kv_cache(B, config.num_kv_heads, capacity, config.head_dim, config.value_head_dim, q_proj.weight.type());
}

Tensor MultiHeadAttention::forward_cached(const Tensor& x, kv_cache& cache, masking_options mask) const {
  const mha_config& c = config;
  check_input("x", x, c.embed_dim, q_proj.weight.type(), cache.lengths().size(0));
  if (c.kdim != c.embed_dim || c.vdim != c.embed_dim)
    detail::fail(kOp, fmt::format("forward_cached is self-attention: needs kdim = vdim = embed_dim, got {}, {}, {}",
                                  c.kdim, c.vdim, c.embed_dim));
  Tensor q = q_proj.forward(x), k = k_proj.forward(x), v = v_proj.forward(x);
  if (c.rotary) rotate(c, q, k, cache_positions(cache, x.size(1)), false);
  attention_options opt = options_for(c, mask);
  opt.alignment = causal_alignment::after_past;
  return out_proj.forward(attention_with_kv_cache(q, k, v, cache, opt).out);
}

MultiHeadAttention::projected_kv MultiHeadAttention::project_kv(const Tensor& key, const Tensor& value) const {
  const dtype t = q_proj.weight.type();
  const std::int64_t Nk = check_input("key", key, config.kdim, t);
  check_input("value", value, config.vdim, t, key.size(0), Nk);
  return {k_proj.forward(key), v_proj.forward(value)};
}

Tensor MultiHeadAttention::forward_projected(const Tensor& query, const projected_kv& kv,
                                             const masking_options& mask) const {
  const mha_config& c = config;
  check_input("query", query, c.embed_dim, q_proj.weight.type());
  if (c.rotary) detail::fail(kOp, "forward_projected does not apply the rotary embedding; use forward");
  return out_proj.forward(attention(q_proj.forward(query), kv.k, kv.v, options_for(c, mask)).out);
}

void MultiHeadAttention::parameters(parameter_list& list, const std::string& prefix) {
  q_proj.parameters(list, join(prefix, "q_proj"));
  k_proj.parameters(list, join(prefix, "k_proj"));
  v_proj.parameters(list, join(prefix, "v_proj"));
  out_proj.parameters(list, join(prefix, "out_proj"));
}

}  // namespace attn::nn

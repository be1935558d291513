// src/nn/scored_attention.cc — AdditiveAttention and LuongAttention: parameters, and the family
// op (attn::attention_family) for the scores, softmax and weighted sum, one head in 3-D layout.
#include "attn/nn/scored_attention.h"

#include <cmath>

#include "attn/family.h"
#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

// A learned score tensor, where it goes in score_spec, and where its gradient comes back
// (accumulated through the gradient tensor's shared storage).
struct score_param {
  const Tensor* value;
  const Tensor* grad;
  std::optional<TensorArg> score_spec::*slot;
  Tensor family_grads::*from;
};

family_options options_for(const char* op, const Tensor& query, const Tensor& keys, const Tensor& values,
                           const masking_options& mask, score_kind kind, const std::vector<score_param>& params) {
  const dtype t = params.empty() ? query.type() : params.front().value->type();
  detail::check_compute_dtype(op, "query", query);
  for (auto [name, x] : {std::pair{"query", &query}, {"keys", &keys}, {"values", &values}}) {
    detail::check_dtype(op, name, *x, t);
    if (x->rank() != 3 || x->size(0) != query.size(0))
      detail::fail(op, fmt::format("{} has shape {}, expected [B, N, features] with B = {}", name,
                                   shape_str(x->shape()), query.size(0)));
  }
  if (values.size(1) != keys.size(1))
    detail::fail(op, fmt::format("values has shape {}, expected Nk = {} rows as keys {}", shape_str(values.shape()),
                                 keys.size(1), shape_str(keys.shape())));
  family_options o;
  static_cast<masking_options&>(o) = mask;
  o.q_num_heads = o.kv_num_heads = 1;
  o.score.kind = kind;
  for (const score_param& p : params) o.score.*p.slot = *p.value;
  return o;
}

scored_result run(const family_options& o, const Tensor& query, const Tensor& keys, const Tensor& values,
                  bool need_weights) {
  scored_result r;
  r.state = attention_family(query, keys, values, o);
  r.context = r.state.out;
  if (need_weights) r.weights = attention_family_weights(query, keys, values, o);
  return r;
}

scored_grads run_backward(const family_options& o, const Tensor& query, const Tensor& keys, const Tensor& values,
                          const Tensor& dcontext, const std::vector<score_param>& params, const scored_result* forward) {
  const family_grads g = forward && forward->state.out.defined()
                             ? attention_family_backward(query, keys, values, dcontext, forward->state, o)
                             : attention_family_backward(query, keys, values, dcontext, o);
  for (const score_param& p : params) detail::accumulate(*p.grad, g.*p.from);
  return {g.dq, g.dk, g.dv};
}

Tensor uniform(Shape shape, double a, rng& gen, dtype t) {
  Tensor x = Tensor::empty(std::move(shape), t);
  fill_uniform(x, -a, a, gen);
  return x;
}

Tensor xavier(Shape shape, rng& gen, dtype t) {
  Tensor x = Tensor::empty(std::move(shape), t);
  xavier_uniform(x, gen);
  return x;
}

}  // namespace

// ---- AdditiveAttention ----

AdditiveAttention::AdditiveAttention(std::int64_t Dq, std::int64_t Dk, std::int64_t A, rng& gen, dtype t,
                                     bool with_bias) {
  if (Dq < 1 || Dk < 1 || A < 1)
    detail::fail("AdditiveAttention", fmt::format("Dq = {}, Dk = {}, A = {} must be >= 1", Dq, Dk, A));
  W_q = xavier({A, Dq}, gen, t);
  W_k = xavier({A, Dk}, gen, t);
  w_v = uniform({A}, 1.0 / std::sqrt(double(A)), gen, t);
  detail::check_compute_dtype("AdditiveAttention", "W_q", W_q);
  if (with_bias) b = Tensor::zeros({A}, t), db = zeros_like(b);
  dW_q = zeros_like(W_q), dW_k = zeros_like(W_k), dw_v = zeros_like(w_v);
}

namespace {
std::vector<score_param> additive_params(const AdditiveAttention& a) {
  std::vector<score_param> ps = {{&a.W_q, &a.dW_q, &score_spec::W_q, &family_grads::dW_q},
                                 {&a.W_k, &a.dW_k, &score_spec::W_k, &family_grads::dW_k},
                                 {&a.w_v, &a.dw_v, &score_spec::w_v, &family_grads::dw_v}};
  if (a.b.defined()) ps.push_back({&a.b, &a.db, &score_spec::b, &family_grads::db});
  return ps;
}
}  // namespace

scored_result AdditiveAttention::forward(const Tensor& query, const Tensor& keys, const Tensor& values,
                                         const masking_options& mask, bool need_weights) const {
  return run(options_for("AdditiveAttention", query, keys, values, mask, score_kind::additive, additive_params(*this)),
             query, keys, values, need_weights);
}

scored_grads AdditiveAttention::backward(const Tensor& query, const Tensor& keys, const Tensor& values,
                                         const Tensor& dcontext, const masking_options& mask, const scored_result* forward) {
  const auto ps = additive_params(*this);
  return run_backward(options_for("AdditiveAttention", query, keys, values, mask, score_kind::additive, ps), query,
                      keys, values, dcontext, ps, forward);
}

void AdditiveAttention::parameters(parameter_list& list, const std::string& prefix) {
  add_parameter(list, prefix, "W_q", W_q, dW_q);
  add_parameter(list, prefix, "W_k", W_k, dW_k);
  if (b.defined()) add_parameter(list, prefix, "b", b, db);
  add_parameter(list, prefix, "w_v", w_v, dw_v);
}

// ---- LuongAttention ----

LuongAttention::LuongAttention(luong_score s, std::int64_t Dq, std::int64_t Dk, rng& gen, dtype t, std::int64_t size)
    : score(s) {
  const char* op = "LuongAttention";
  if (Dq < 1 || Dk < 1) detail::fail(op, fmt::format("Dq = {} and Dk = {} must be >= 1", Dq, Dk));
  switch (s) {
    case luong_score::dot:
      if (Dq != Dk) detail::fail(op, fmt::format("the dot score needs Dq = Dk, got {} and {}", Dq, Dk));
      break;
    case luong_score::general:
      W = xavier({Dq, Dk}, gen, t), dW = zeros_like(W);
      break;
    case luong_score::concat:
      if (size < 1) detail::fail(op, fmt::format("the concat score needs its size A >= 1, got {}", size));
      W_q = xavier({size, Dq}, gen, t), W_k = xavier({size, Dk}, gen, t);
      w_v = uniform({size}, 1.0 / std::sqrt(double(size)), gen, t);
      dW_q = zeros_like(W_q), dW_k = zeros_like(W_k), dw_v = zeros_like(w_v);
      break;
    case luong_score::location:
      if (size < 1) detail::fail(op, fmt::format("the location score needs the key count Nk >= 1, got {}", size));
      W_a = xavier({size, Dq}, gen, t), dW_a = zeros_like(W_a);
      break;
  }
}

namespace {
score_kind kind_of(luong_score s) {
  switch (s) {
    case luong_score::dot: return score_kind::dot;
    case luong_score::general: return score_kind::general;
    case luong_score::concat: return score_kind::additive;
    case luong_score::location: return score_kind::location;
  }
  return score_kind::dot;
}

std::vector<score_param> luong_params(const LuongAttention& l) {
  switch (l.score) {
    case luong_score::dot: return {};
    case luong_score::general: return {{&l.W, &l.dW, &score_spec::W, &family_grads::dW}};
    case luong_score::concat:
      return {{&l.W_q, &l.dW_q, &score_spec::W_q, &family_grads::dW_q},
              {&l.W_k, &l.dW_k, &score_spec::W_k, &family_grads::dW_k},
              {&l.w_v, &l.dw_v, &score_spec::w_v, &family_grads::dw_v}};
    case luong_score::location: return {{&l.W_a, &l.dW_a, &score_spec::W_a, &family_grads::dW_a}};
  }
  return {};
}
}  // namespace

scored_result LuongAttention::forward(const Tensor& query, const Tensor& keys, const Tensor& values,
                                      const masking_options& mask, bool need_weights) const {
  return run(options_for("LuongAttention", query, keys, values, mask, kind_of(score), luong_params(*this)), query, keys,
             values, need_weights);
}

scored_grads LuongAttention::backward(const Tensor& query, const Tensor& keys, const Tensor& values,
                                      const Tensor& dcontext, const masking_options& mask, const scored_result* forward) {
  const auto ps = luong_params(*this);
  return run_backward(options_for("LuongAttention", query, keys, values, mask, kind_of(score), ps), query, keys,
                      values, dcontext, ps, forward);
}

void LuongAttention::parameters(parameter_list& list, const std::string& prefix) {
  switch (score) {
    case luong_score::dot: break;
    case luong_score::general: add_parameter(list, prefix, "W", W, dW); break;
    case luong_score::concat:
      add_parameter(list, prefix, "W_q", W_q, dW_q);
      add_parameter(list, prefix, "W_k", W_k, dW_k);
      add_parameter(list, prefix, "w_v", w_v, dw_v);
      break;
    case luong_score::location: add_parameter(list, prefix, "W_a", W_a, dW_a); break;
  }
}

}  // namespace attn::nn

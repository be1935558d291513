// attn/nn/scored_attention.h — attention layers with a learned score function, on the family
// op (attn/family.h): Bahdanau's additive attention and Luong's four scores. One head; the
// softmax over keys and the weighted sum of values are the family's.
//
//   query [B, Nq, Dq]   keys [B, Nk, Dk]   values [B, Nk, Dv]   context [B, Nq, Dv]
//   α_ij = softmax_j(score(q_i, k_j) + masks),   context_i = Σ_j α_ij v_j
//
// AdditiveAttention (Bahdanau et al. 2015):  score = w_vᵀ tanh(W_q q + W_k k + b)
// LuongAttention (Luong et al. 2015):
//   dot       qᵀ k                          (Dq = Dk)
//   general   qᵀ W k                        W [Dq, Dk]
//   concat    w_vᵀ tanh(W_q q + W_k k)      the paper's v_aᵀ tanh(W_a [q; k]) with W_a = [W_q W_k]
//   location  (W_a q)_j                     W_a [Nk, Dq]: the keys' contents are not used
// Masks are attn::masking_options (a padded source as nonpad_kv_seqlen, ...). Backward
// recomputes the scores from the inputs (the family's backward keeps no state).
//
//   attn::nn::AdditiveAttention att(/*Dq=*/64, /*Dk=*/128, /*A=*/64, gen);
//   auto r = att.forward(s, enc_out, enc_out, mask, /*need_weights=*/true);   // r.weights [B, 1, Nq, Nk]
//   auto g = att.backward(s, enc_out, enc_out, dcontext, mask);
#pragma once

#include <cstdint>

#include "attn/attention.h"
#include "attn/family.h"
#include "attn/nn/init.h"
#include "attn/nn/parameter.h"

namespace attn::nn {

struct scored_result {
  Tensor context;  // [B, Nq, Dv]
  Tensor weights;  // [B, 1, Nq, Nk] float64, when asked for
  // The family op's result (out = context, and the row statistics it kept): give the
  // scored_result back to backward, which then starts from them instead of recomputing the
  // forward (the core route's lse; additive's single backward pass).
  family_result state;
};
struct scored_grads {
  Tensor dquery, dkeys, dvalues;
};

struct AdditiveAttention {
  Tensor W_q, W_k, b, w_v;      // [A, Dq], [A, Dk], [A] (undefined without bias), [A]
  Tensor dW_q, dW_k, db, dw_v;

  AdditiveAttention() = default;
  // Xavier-uniform W_q, W_k; w_v U(-1/sqrt(A), 1/sqrt(A)); b = 0.
  AdditiveAttention(std::int64_t Dq, std::int64_t Dk, std::int64_t A, rng& gen, dtype t = dtype::f32,
                    bool with_bias = true);

  scored_result forward(const Tensor& query, const Tensor& keys, const Tensor& values, const masking_options& mask = {},
                        bool need_weights = false) const;
  // forward: this module's forward result for the same inputs, or null (the forward is recomputed).
  scored_grads backward(const Tensor& query, const Tensor& keys, const Tensor& values, const Tensor& dcontext,
                        const masking_options& mask = {}, const scored_result* forward = nullptr);
  void parameters(parameter_list& list, const std::string& prefix = "");
};

enum class luong_score { dot, general, concat, location };

struct LuongAttention {
  luong_score score = luong_score::dot;
  Tensor W, dW;                          // general [Dq, Dk]
  Tensor W_q, W_k, w_v, dW_q, dW_k, dw_v;  // concat [A, Dq], [A, Dk], [A]
  Tensor W_a, dW_a;                      // location [Nk, Dq]

  LuongAttention() = default;
  // size: A for concat, Nk for location, unused otherwise.
  LuongAttention(luong_score s, std::int64_t Dq, std::int64_t Dk, rng& gen, dtype t = dtype::f32,
                 std::int64_t size = 0);

  scored_result forward(const Tensor& query, const Tensor& keys, const Tensor& values, const masking_options& mask = {},
                        bool need_weights = false) const;
  // forward: this module's forward result for the same inputs, or null (the forward is recomputed).
  scored_grads backward(const Tensor& query, const Tensor& keys, const Tensor& values, const Tensor& dcontext,
                        const masking_options& mask = {}, const scored_result* forward = nullptr);
  void parameters(parameter_list& list, const std::string& prefix = "");
};

}  // namespace attn::nn

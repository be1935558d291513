// attn/nn/co_attention.h — co-attention between two sequences (literature 003, "multiple inputs:
// co-attention"), in the tutorials' two classifications:
//   granularity  coarse: a compact summary of one side attends over the other, giving one
//                        attended vector per side;
//                fine:   every element of one side attends over every element of the other,
//                        giving one attended vector per element;
//   kind         parallel:    both directions are computed at once from the inputs, the two
//                             sides treated alike;
//                alternating: one direction first, and its result drives the other ("summarise
//                             one side, attend the other with that summary, and back").
//
//   x [B, Nx, Dx]   y [B, Ny, Dy]   x_lengths, y_lengths int64 or int32 [B] (elements past them are padding)
//   x̄, ȳ = the means of the real elements of x and y (0 for an empty sequence)
//
// coarse (additive scores, attn::nn::AdditiveAttention: score = w_vᵀ tanh(W_q q + W_k k + b)):
//   parallel    (Ma et al. 2017)  x_context = Att_x(ȳ; x)          y_context = Att_y(x̄; y)
//   alternating (Lu et al. 2016)  y_context = Att_y(x̄; y), then   x_context = Att_x(y_context; x)
//   Att_x(q; x) = Σ_i softmax_i(score(q, x_i)) x_i over the real i;  x_context [B, Dx],
//   y_context [B, Dy], x_weights [B, Nx], y_weights [B, Ny].
// fine (bilinear scores on attn::attention_family's `general` score):
//   parallel    one affinity matrix L = x W_b yᵀ [B, Nx, Ny] (Lu et al. 2016's C = tanh(Qᵀ W_b V)
//               without the tanh, which would bound the softmax's logits to [−1, 1]; Xiong et
//               al. 2017's L), normalised both ways:
//                 y_context_i = Σ_j softmax_j(L_ij) y_j      [B, Nx, Dy]   y_weights [B, Nx, Ny]
//                 x_context_j = Σ_i softmax_i(L_ij) x_i      [B, Ny, Dx]   x_weights [B, Ny, Nx]
//   alternating first each y_j gathers x, then each x_i attends over y comparing itself with
//               what each y_j gathered:
//                 x_context_j = Σ_i softmax_i(x_iᵀ W_b y_j) x_i             [B, Ny, Dx]
//                 y_context_i = Σ_j softmax_j(x_iᵀ W_2 x_context_j) y_j     [B, Nx, Dy]
// Padding: padded elements get weight 0 and do not change any output; the rows of a fine
// result (and of its weights) that belong to padded elements are 0. An empty side (length 0)
// gives a zero context and zero gradients, never NaN.
//
//   attn::nn::co_attention_config c{attn::nn::co_attention_kind::parallel,
//                                   attn::nn::co_attention_granularity::fine, /*Dx=*/32, /*Dy=*/32};
//   attn::nn::CoAttention co(c, gen);
//   attn::nn::CoAttention::saved s;
//   auto r = co.forward(question, context, q_len, c_len, &s, /*need_weights=*/true);
//   auto g = co.backward(s, dx_context, dy_context);   // g.dx, g.dy; parameter gradients accumulate
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "attn/nn/scored_attention.h"

namespace attn::nn {

enum class co_attention_kind { parallel, alternating };
enum class co_attention_granularity { coarse, fine };

std::string to_string(co_attention_kind k);
std::string to_string(co_attention_granularity g);

struct co_attention_config {
  co_attention_kind kind = co_attention_kind::parallel;
  co_attention_granularity granularity = co_attention_granularity::fine;
  std::int64_t Dx = 0, Dy = 0;  // feature sizes of the two sequences
  std::int64_t A = 0;           // coarse: hidden size of the additive scores (0: max(Dx, Dy))
};

struct CoAttention {
  co_attention_config config;
  AdditiveAttention over_x, over_y;  // coarse: Att_x (Dq = Dy, Dk = Dx), Att_y (Dq = Dx, Dk = Dy)
  Tensor W_b, dW_b;                  // fine: [Dx, Dy]
  Tensor W_2, dW_2;                  // fine alternating: [Dx, Dx]

  CoAttention() = default;
  // Coarse: AdditiveAttention's initialisation; fine: Xavier-uniform W_b, W_2.
  CoAttention(const co_attention_config& c, rng& gen, dtype t = dtype::f32);

  struct saved {
    Tensor x, y, x_lengths, y_lengths;  // the inputs (lengths filled in when absent)
    Tensor x_mean, y_mean;              // coarse: [B, 1, Dx], [B, 1, Dy]
    Tensor first;                       // alternating: the first step's result, the second's input
    // The family op's results the backward starts from (the forward is not recomputed): fine,
    // the general scores of y_context and x_context; coarse, Att_y's and Att_x's.
    family_result y_state, x_state;
  };
  struct result {
    Tensor x_context, y_context;  // coarse [B, Dx], [B, Dy]; fine [B, Ny, Dx], [B, Nx, Dy]
    Tensor x_weights, y_weights;  // float64 when asked for: coarse [B, Nx], [B, Ny]; fine [B, Ny, Nx], [B, Nx, Ny]
  };
  struct grads {
    Tensor dx, dy;
  };

  // Absent lengths: every element is real.
  result forward(const Tensor& x, const Tensor& y, const std::optional<Tensor>& x_lengths = {},
                 const std::optional<Tensor>& y_lengths = {}, saved* s = nullptr, bool need_weights = false) const;
  // dx_context, dy_context in the shapes of the contexts (either may be undefined: no gradient
  // from that output). Accumulates the parameter gradients; returns dx [B, Nx, Dx], dy [B, Ny, Dy].
  grads backward(const saved& s, const Tensor& dx_context, const Tensor& dy_context);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

}  // namespace attn::nn

// attn/nn/gru.h — the gated recurrent unit (Cho et al. 2014) and a bidirectional GRU encoder
// (Bahdanau et al. 2015), forward and backward through time.
//
// GRUCell, gates in PyTorch's order r, z, n (so weights load from torch.nn.GRUCell as they are):
//   gi = x W_ihᵀ + b_ih      gh = h W_hhᵀ + b_hh               [B, 3H], split as (r, z, n)
//   r = σ(gi_r + gh_r)       z = σ(gi_z + gh_z)
//   n = tanh(gi_n + r ∘ gh_n)
//   h' = (1 − z) ∘ n + z ∘ h
// x [B, I], h [B, H]. The input projection gi is separate (`step` takes it) so that a sequence
// projects all its steps in one GEMM.
//
//   attn::nn::GRUCell cell(16, 32, gen);
//   attn::nn::GRUCell::saved s;
//   attn::Tensor h1 = cell.forward(x, h0, &s);
//   attn::nn::GRUCell::grads g = cell.backward(x, s, dh1);   // g.dx, g.dh; parameter grads accumulate
//
// BiGRUEncoder: a forward and a backward GRU over x [B, N, I]; out [B, N, 2H] = [h→_t ; h←_t].
// Optional lengths (int64 or int32 [B]): steps t >= length_b are padding — their output is 0 and the
// state passes them unchanged, so the backward direction starts at the last real step.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "attn/nn/linear.h"
#include "attn/tensor.h"

namespace attn::nn {

struct GRUCell {
  Linear ih;  // W_ih [3H, I], b_ih [3H]
  Linear hh;  // W_hh [3H, H], b_hh [3H]

  GRUCell() = default;
  // PyTorch's initialisation: every weight and bias U(-1/sqrt(H), 1/sqrt(H)).
  GRUCell(std::int64_t input_size, std::int64_t hidden_size, rng& gen, dtype t = dtype::f32);

  std::int64_t hidden_size() const { return hh.in_features(); }

  // What backward needs from one step.
  struct saved {
    Tensor h;           // [B, H] the state the step started from
    Tensor gh, r, z, n;  // [B, 3H] (gh: h W_hhᵀ + b_hh), [B, H] each
  };
  struct step_grads {
    Tensor dgi;  // [B, 3H] gradient of the input projection
    Tensor dh;   // [B, H]  gradient of the state the step started from
  };
  struct grads {
    Tensor dx;  // [B, I]
    Tensor dh;  // [B, H]
  };

  // One step from the input projection gi = ih.forward(x) [B, 3H]; h [B, H]. Fills *s when given.
  Tensor step(const Tensor& gi, const Tensor& h, saved* s) const;
  // Backward of step from dh_next = ∂L/∂h'; accumulates hh's gradients.
  step_grads step_backward(const saved& s, const Tensor& dh_next);

  Tensor forward(const Tensor& x, const Tensor& h, saved* s) const;
  grads backward(const Tensor& x, const saved& s, const Tensor& dh_next);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

struct BiGRUEncoder {
  GRUCell fwd, bwd;

  BiGRUEncoder() = default;
  BiGRUEncoder(std::int64_t input_size, std::int64_t hidden_size, rng& gen, dtype t = dtype::f32);

  struct result {
    Tensor out;    // [B, N, 2H]
    Tensor h_fwd;  // [B, H] the forward GRU's last state (after step length_b − 1)
    Tensor h_bwd;  // [B, H] the backward GRU's last state (after step 0)
  };
  struct saved {
    Tensor x;                      // [B, N, I]
    std::vector<std::int64_t> lengths;  // [B]
    std::vector<GRUCell::saved> f, b;   // per time step t (b: indexed by t too)
  };

  // lengths: int64 or int32 [B], each in [0, N]; absent: every sequence has N steps.
  result forward(const Tensor& x, const std::optional<Tensor>& lengths, saved* s) const;
  // dout [B, N, 2H]; dh_fwd / dh_bwd [B, H] or undefined (no gradient through the final states).
  // Accumulates every parameter gradient; returns dx [B, N, I].
  Tensor backward(const saved& s, const Tensor& dout, const Tensor& dh_fwd, const Tensor& dh_bwd);

  void parameters(parameter_list& list, const std::string& prefix = "");
};

}  // namespace attn::nn

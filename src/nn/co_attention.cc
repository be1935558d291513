// src/nn/co_attention.cc — CoAttention: coarse on two AdditiveAttentions queried by summaries,
// fine on the family op's bilinear `general` score; forward and backward side by side.
#include "attn/nn/co_attention.h"

#include <algorithm>
#include <tuple>

#include "attn/family.h"
#include "attn/nn/activation.h"
#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

const char* kOp = "CoAttention";

Tensor reshaped(const Tensor& t, Shape shape) { return Tensor::copy_of(t.view().reshape(std::move(shape))); }

Tensor transposed(const Tensor& W) { return Tensor::copy_of(W.view().transpose(0, 1)); }

Tensor xavier(Shape shape, rng& gen, dtype t) {
  Tensor x = Tensor::empty(std::move(shape), t);
  xavier_uniform(x, gen);
  return x;
}

// lengths int64 [B] from the caller (int32 widened), or N for every b.
Tensor lengths_or_full(const std::optional<Tensor>& lengths, const char* name, std::int64_t B, std::int64_t N,
                       const char* range) {
  if (!lengths) return Tensor::full({B}, dtype::i64, double(N));
  detail::read_lengths(kOp, name, *lengths, {B}, N, range);
  return detail::int64_indices(kOp, name, *lengths);
}

std::int64_t length(const Tensor& lengths, std::int64_t b) { return lengths.data_as<std::int64_t>()[b]; }

// x [B, N, D] → the mean of rows i < len_b, [B, 1, D] (0 when len_b = 0).
template <class T>
Tensor masked_mean(const Tensor& x, const Tensor& len) {
  const std::int64_t B = x.size(0), N = x.size(1), D = x.size(2);
  Tensor m = Tensor::zeros({B, 1, D}, x.type());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < length(len, b); ++i)
      for (std::int64_t c = 0; c < D; ++c)
        detail::ptr<T>(m)[b * D + c] += detail::ptr<T>(x)[(b * N + i) * D + c] / T(length(len, b));
  return m;
}

// m = mean of rows i < len_b  →  dx_i += dm / len_b for those rows.
template <class T>
void masked_mean_backward(const Tensor& dm, const Tensor& len, const Tensor& dx) {
  const std::int64_t B = dx.size(0), N = dx.size(1), D = dx.size(2);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t i = 0; i < length(len, b); ++i)
      for (std::int64_t c = 0; c < D; ++c)
        detail::ptr<T>(dx)[(b * N + i) * D + c] += detail::ptr<T>(dm)[b * D + c] / T(length(len, b));
}

// Rows i >= len_b of t [B, N, ...] set to 0 in place (fine results of padded elements, and the
// gradients those rows would receive).
void zero_padded_rows(const Tensor& t, const Tensor& len) {
  const std::int64_t B = t.size(0), N = t.size(1), row = t.numel() / std::max<std::int64_t>(B * N, 1);
  detail::with_type(t.type(), [&](auto zero) {
    using T = decltype(zero);
    for (std::int64_t b = 0; b < B; ++b)
      std::fill(detail::ptr<T>(t) + (b * N + length(len, b)) * row, detail::ptr<T>(t) + (b + 1) * N * row, T(0));
  });
}

Tensor padded_rows_zeroed(const Tensor& t, const Tensor& len) {
  Tensor c = Tensor::copy_of(t);
  zero_padded_rows(c, len);
  return c;
}

// An output's gradient, or zeros when the caller sent none.
Tensor given_or_zeros(const Tensor& g, const Shape& shape, dtype t) { return g.defined() ? g : Tensor::zeros(shape, t); }

// ---- fine: Σ_j softmax_j(q_iᵀ W k_j) v_j over j < k_len_b (family `general` score) ----

family_options general_options(const Tensor& W, const Tensor& k_len) {
  family_options o;
  o.q_num_heads = o.kv_num_heads = 1;
  o.score.kind = score_kind::general;
  o.score.W = W;
  o.nonpad_kv_seqlen = k_len;
  return o;
}

// out [B, Nq, Dv] with rows i >= q_len_b zeroed (in the family result, which goes to *state);
// weights [B, Nq, Nk] float64 when asked for.
Tensor general_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W, const Tensor& q_len,
                       const Tensor& k_len, Tensor* weights, family_result* state) {
  const family_options o = general_options(W, k_len);
  *state = attention_family(q, k, v, o);
  Tensor out = state->out;
  zero_padded_rows(out, q_len);
  if (weights) {
    *weights = reshaped(attention_family_weights(q, k, v, o), {q.size(0), q.size(1), k.size(1)});
    zero_padded_rows(*weights, q_len);
  }
  return out;
}

// From the forward's result where it has one (the padded rows of out and dout are zero alike, so
// their Σ dout·out is that of the recomputed forward's, zero).
family_grads general_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& W, const Tensor& q_len,
                              const Tensor& k_len, const Tensor& dout, const family_result& state) {
  const Tensor d = padded_rows_zeroed(dout, q_len);
  if (state.out.defined()) return attention_family_backward(q, k, v, d, state, general_options(W, k_len));
  return attention_family_backward(q, k, v, d, general_options(W, k_len));
}

// ---- coarse: Att(q; keys = values = x) with keys i >= len_b excluded ----

masking_options key_padding(const Tensor& len) {
  masking_options m;
  m.nonpad_kv_seqlen = len;
  return m;
}

}  // namespace

std::string to_string(co_attention_kind k) { return k == co_attention_kind::parallel ? "parallel" : "alternating"; }
std::string to_string(co_attention_granularity g) { return g == co_attention_granularity::coarse ? "coarse" : "fine"; }

CoAttention::CoAttention(const co_attention_config& c, rng& gen, dtype t) : config(c) {
  if (c.Dx < 1 || c.Dy < 1 || c.A < 0)
    detail::fail(kOp, fmt::format("Dx = {} and Dy = {} must be >= 1 and A = {} >= 0", c.Dx, c.Dy, c.A));
  if (t != dtype::f32 && t != dtype::f64)
    detail::fail(kOp, fmt::format("dtype {} is not float32 or float64", dtype_name(t)));
  if (c.granularity == co_attention_granularity::coarse) {
    const std::int64_t A = c.A ? c.A : std::max(c.Dx, c.Dy);
    over_x = AdditiveAttention(c.Dy, c.Dx, A, gen, t);
    over_y = AdditiveAttention(c.Dx, c.Dy, A, gen, t);
    return;
  }
  W_b = xavier({c.Dx, c.Dy}, gen, t), dW_b = zeros_like(W_b);
  if (c.kind == co_attention_kind::alternating) W_2 = xavier({c.Dx, c.Dx}, gen, t), dW_2 = zeros_like(W_2);
}

CoAttention::result CoAttention::forward(const Tensor& x, const Tensor& y, const std::optional<Tensor>& x_lengths,
                                         const std::optional<Tensor>& y_lengths, saved* s, bool need_weights) const {
  const Tensor& param = config.granularity == co_attention_granularity::coarse ? over_x.W_k : W_b;
  if (!param.defined() || param.numel() == 0)
    detail::fail(kOp, "the layer has no parameters: construct it from a co_attention_config");
  const dtype t = param.type();
  detail::check_dtype(kOp, "x", x, t);
  detail::check_dtype(kOp, "y", y, t);
  if (x.rank() != 3 || x.size(2) != config.Dx)
    detail::fail(kOp, fmt::format("x has shape {}, expected [B, Nx, Dx] with Dx = {}", shape_str(x.shape()), config.Dx));
  const std::int64_t B = x.size(0), Nx = x.size(1), Dx = config.Dx, Dy = config.Dy;
  if (y.rank() != 3 || y.size(0) != B || y.size(2) != Dy)
    detail::fail(kOp, fmt::format("y has shape {}, expected [B, Ny, Dy] with B = {}, Dy = {}", shape_str(y.shape()), B, Dy));
  const std::int64_t Ny = y.size(1);
  saved local;
  saved& sv = s ? *s : local;
  sv = {x, y, lengths_or_full(x_lengths, "x_lengths", B, Nx, "Nx"), lengths_or_full(y_lengths, "y_lengths", B, Ny, "Ny"),
        {}, {}, {}, {}, {}};
  const bool alternating = config.kind == co_attention_kind::alternating;
  result r;
  Tensor* xw = need_weights ? &r.x_weights : nullptr;
  Tensor* yw = need_weights ? &r.y_weights : nullptr;

  if (config.granularity == co_attention_granularity::fine) {
    if (!alternating) {
      // y_context_i = Σ_j softmax_j(L_ij) y_j;  x_context_j = Σ_i softmax_i(L_ij) x_i;  L = x W_b yᵀ
      r.y_context = general_forward(x, y, y, W_b, sv.x_lengths, sv.y_lengths, yw, &sv.y_state);
      r.x_context = general_forward(y, x, x, transposed(W_b), sv.y_lengths, sv.x_lengths, xw, &sv.x_state);
    } else {
      // x_context_j = Σ_i softmax_i(x_iᵀ W_b y_j) x_i, then y_context_i = Σ_j softmax_j(x_iᵀ W_2 x_context_j) y_j
      r.x_context = general_forward(y, x, x, transposed(W_b), sv.y_lengths, sv.x_lengths, xw, &sv.x_state);
      sv.first = r.x_context;
      r.y_context = general_forward(x, r.x_context, y, W_2, sv.x_lengths, sv.y_lengths, yw, &sv.y_state);
    }
    return r;
  }

  // coarse: [B, 1, D] queries and contexts, reshaped to [B, D] / [B, N] for the caller
  auto att = [&](const AdditiveAttention& a, const Tensor& q, const Tensor& kv, const Tensor& len, Tensor* w,
                 family_result* state) {
    scored_result sr = a.forward(q, kv, kv, key_padding(len), w != nullptr);
    if (w) *w = reshaped(sr.weights, {B, kv.size(1)});
    *state = sr.state;
    return sr.context;  // [B, 1, D]
  };
  detail::with_type(t, [&](auto zero) {
    using T = decltype(zero);
    sv.x_mean = masked_mean<T>(x, sv.x_lengths);
    if (!alternating) sv.y_mean = masked_mean<T>(y, sv.y_lengths);
  });
  // parallel: y_context = Att_y(x̄; y), x_context = Att_x(ȳ; x);  alternating: x_context = Att_x(y_context; x)
  const Tensor yc = att(over_y, sv.x_mean, y, sv.y_lengths, yw, &sv.y_state);
  if (alternating) sv.first = yc;
  const Tensor xc = att(over_x, alternating ? yc : sv.y_mean, x, sv.x_lengths, xw, &sv.x_state);
  r.x_context = reshaped(xc, {B, Dx});
  r.y_context = reshaped(yc, {B, Dy});
  return r;
}

// Each step undoes one line of the forward, last first.
CoAttention::grads CoAttention::backward(const saved& s, const Tensor& dx_context, const Tensor& dy_context) {
  const char* op = "CoAttention.backward";
  if (!s.x.defined() || !s.y.defined() || !s.x_lengths.defined())
    detail::fail(op, "saved is empty: pass the record that forward filled");
  const bool coarse = config.granularity == co_attention_granularity::coarse;
  const bool alternating = config.kind == co_attention_kind::alternating;
  const std::int64_t B = s.x.size(0), Nx = s.x.size(1), Ny = s.y.size(1), Dx = config.Dx, Dy = config.Dy;
  const Shape xc_shape = coarse ? Shape{B, Dx} : Shape{B, Ny, Dx}, yc_shape = coarse ? Shape{B, Dy} : Shape{B, Nx, Dy};
  for (const auto& [name, g, shape] : {std::tuple{"dx_context", &dx_context, &xc_shape},
                                        std::tuple{"dy_context", &dy_context, &yc_shape}})
    if (g->defined()) {
      detail::check_dtype(op, name, *g, s.x.type());
      detail::check_shape(op, name, *g, *shape);
    }
  grads out{zeros_like(s.x), zeros_like(s.y)};
  auto into = [](const Tensor& acc, const Tensor& g) { detail::accumulate(acc, g); };

  if (!coarse) {
    const Tensor dxc = given_or_zeros(dx_context, xc_shape, s.x.type());
    Tensor dyc = given_or_zeros(dy_context, yc_shape, s.x.type());
    const Tensor W_bt = transposed(W_b);
    if (!alternating) {
      // y_context = general(x, y, y; W_b)
      const family_grads g1 = general_backward(s.x, s.y, s.y, W_b, s.x_lengths, s.y_lengths, dyc, s.y_state);
      into(out.dx, g1.dq), into(out.dy, g1.dk), into(out.dy, g1.dv), into(dW_b, g1.dW);
      // x_context = general(y, x, x; W_bᵀ)
      const family_grads g2 = general_backward(s.y, s.x, s.x, W_bt, s.y_lengths, s.x_lengths, dxc, s.x_state);
      into(out.dy, g2.dq), into(out.dx, g2.dk), into(out.dx, g2.dv), into(dW_b, transposed(g2.dW));
      return out;
    }
    // y_context = general(x, first, y; W_2): first (= x_context) also gets the keys' gradient
    const family_grads g2 = general_backward(s.x, s.first, s.y, W_2, s.x_lengths, s.y_lengths, dyc, s.y_state);
    into(out.dx, g2.dq), into(out.dy, g2.dv), into(dW_2, g2.dW);
    const Tensor dfirst = add(dxc, g2.dk);
    // x_context = general(y, x, x; W_bᵀ)
    const family_grads g1 = general_backward(s.y, s.x, s.x, W_bt, s.y_lengths, s.x_lengths, dfirst, s.x_state);
    into(out.dy, g1.dq), into(out.dx, g1.dk), into(out.dx, g1.dv), into(dW_b, transposed(g1.dW));
    return out;
  }

  Tensor dxc = reshaped(given_or_zeros(dx_context, xc_shape, s.x.type()), {B, 1, Dx});
  Tensor dyc = reshaped(given_or_zeros(dy_context, yc_shape, s.x.type()), {B, 1, Dy});
  // x_context = Att_x(alternating ? y_context : ȳ; x)
  const Tensor& qx = alternating ? s.first : s.y_mean;
  const auto state = [](const family_result& f) {
    scored_result r;
    r.context = f.out, r.state = f;
    return r;
  };
  const scored_result fx = state(s.x_state), fy = state(s.y_state);
  const scored_grads gx = over_x.backward(qx, s.x, s.x, dxc, key_padding(s.x_lengths), &fx);
  into(out.dx, gx.dkeys), into(out.dx, gx.dvalues);
  if (alternating) into(dyc, gx.dquery);
  // y_context = Att_y(x̄; y)
  const scored_grads gy = over_y.backward(s.x_mean, s.y, s.y, dyc, key_padding(s.y_lengths), &fy);
  into(out.dy, gy.dkeys), into(out.dy, gy.dvalues);
  detail::with_type(s.x.type(), [&](auto zero) {
    using T = decltype(zero);
    // x̄ = mean(x), ȳ = mean(y)
    masked_mean_backward<T>(gy.dquery, s.x_lengths, out.dx);
    if (!alternating) masked_mean_backward<T>(gx.dquery, s.y_lengths, out.dy);
  });
  return out;
}

void CoAttention::parameters(parameter_list& list, const std::string& prefix) {
  if (config.granularity == co_attention_granularity::coarse) {
    over_x.parameters(list, join(prefix, "over_x"));
    over_y.parameters(list, join(prefix, "over_y"));
    return;
  }
  add_parameter(list, prefix, "W_b", W_b, dW_b);
  if (W_2.defined()) add_parameter(list, prefix, "W_2", W_2, dW_2);
}

}  // namespace attn::nn

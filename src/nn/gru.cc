// src/nn/gru.cc — GRU cell and bidirectional GRU encoder, forward and backward through time.
#include "attn/nn/gru.h"

#include <cmath>
#include <cstring>

#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

// Rows [b, t, :] of a [B, N, C] tensor as a [B, C] tensor, and back.
Tensor take_step(const Tensor& x, std::int64_t t) {
  const std::int64_t B = x.size(0), N = x.size(1), C = x.size(2);
  Tensor out = Tensor::empty({B, C}, x.type());
  const std::size_t row = std::size_t(C) * dtype_size(x.type());
  for (std::int64_t b = 0; b < B; ++b)
    std::memcpy(static_cast<char*>(out.data()) + std::size_t(b) * row,
                static_cast<const char*>(x.data()) + std::size_t(b * N + t) * row, row);
  return out;
}

// dst[b, t, offset : offset + C] = src[b, :] where keep(b), else 0.
template <class T, class Keep>
void put_step(const Tensor& dst, std::int64_t t, std::int64_t offset, const Tensor& src, Keep keep) {
  const std::int64_t B = dst.size(0), N = dst.size(1), W = dst.size(2), C = src.size(1);
  T* d = detail::ptr<T>(dst);
  const T* s = detail::ptr<T>(src);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t c = 0; c < C; ++c) d[(b * N + t) * W + offset + c] = keep(b) ? s[b * C + c] : T(0);
}

// dout[b, t, offset : offset + C] as [B, C].
template <class T>
Tensor slice_step(const Tensor& x, std::int64_t t, std::int64_t offset, std::int64_t C) {
  const std::int64_t B = x.size(0), N = x.size(1), W = x.size(2);
  Tensor out = Tensor::empty({B, C}, x.type());
  const T* s = detail::ptr<T>(x);
  T* d = detail::ptr<T>(out);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t c = 0; c < C; ++c) d[b * C + c] = s[(b * N + t) * W + offset + c];
  return out;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

GRUCell::GRUCell(std::int64_t input_size, std::int64_t hidden_size, rng& gen, dtype t) {
  if (input_size < 0 || hidden_size < 1)
    detail::fail("GRUCell", fmt::format("input_size = {} must be >= 0 and hidden_size = {} >= 1", input_size, hidden_size));
  ih = Linear(input_size, 3 * hidden_size, gen, true, t);
  hh = Linear(hidden_size, 3 * hidden_size, gen, true, t);
  const double a = 1.0 / std::sqrt(double(hidden_size));
  for (Tensor* w : {&ih.weight, &ih.bias, &hh.weight, &hh.bias}) fill_uniform(*w, -a, a, gen);
}

Tensor GRUCell::step(const Tensor& gi, const Tensor& h, saved* s) const {
  const char* op = "GRUCell";
  const std::int64_t H = hidden_size();
  detail::check_dtype(op, "h", h, hh.weight.type());
  if (h.rank() != 2 || h.size(1) != H)
    detail::fail(op, fmt::format("h has shape {}, expected [B, H] with H = {}", shape_str(h.shape()), H));
  const std::int64_t B = h.size(0);
  detail::check_dtype(op, "gi", gi, h.type());
  detail::check_shape(op, "gi", gi, {B, 3 * H});
  const Tensor gh = hh.forward(h);
  Tensor r = Tensor::empty({B, H}, h.type()), z = Tensor::empty({B, H}, h.type()), n = Tensor::empty({B, H}, h.type());
  Tensor out = Tensor::empty({B, H}, h.type());
  detail::with_type(h.type(), [&](auto zero) {
    using T = decltype(zero);
    const T *gip = detail::ptr<T>(gi), *ghp = detail::ptr<T>(gh), *hp = detail::ptr<T>(h);
    T *rp = detail::ptr<T>(r), *zp = detail::ptr<T>(z), *np = detail::ptr<T>(n), *op_ = detail::ptr<T>(out);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < H; ++j) {
        const T* gir = gip + b * 3 * H;
        const T* ghr = ghp + b * 3 * H;
        const std::int64_t i = b * H + j;
        rp[i] = T(sigmoid(double(gir[j]) + ghr[j]));
        zp[i] = T(sigmoid(double(gir[H + j]) + ghr[H + j]));
        np[i] = T(std::tanh(double(gir[2 * H + j]) + double(rp[i]) * ghr[2 * H + j]));
        op_[i] = T((1.0 - zp[i]) * np[i] + double(zp[i]) * hp[i]);
      }
  });
  if (s) *s = {h, gh, r, z, n};
  return out;
}

// From h' = (1 − z) n + z h, n = tanh(gi_n + r gh_n), r = σ(gi_r + gh_r), z = σ(gi_z + gh_z):
//   dn = dh' (1 − z)          dz = dh' (h − n)          dh = dh' z  (+ the path through gh)
//   dn_pre = dn (1 − n²)      dr = dn_pre gh_n
//   dgi = [dr r(1 − r), dz z(1 − z), dn_pre]      dgh = [dr r(1 − r), dz z(1 − z), dn_pre r]
//   dh += dgh W_hh;  dW_hh += dghᵀ h;  db_hh += Σ dgh
GRUCell::step_grads GRUCell::step_backward(const saved& s, const Tensor& dh_next) {
  const char* op = "GRUCell.backward";
  const std::int64_t B = s.h.size(0), H = hidden_size();
  detail::check_dtype(op, "dh", dh_next, s.h.type());
  detail::check_shape(op, "dh", dh_next, {B, H});
  step_grads g;
  g.dgi = Tensor::empty({B, 3 * H}, s.h.type());
  Tensor dgh = Tensor::empty({B, 3 * H}, s.h.type());
  Tensor dh_direct = Tensor::empty({B, H}, s.h.type());
  detail::with_type(s.h.type(), [&](auto zero) {
    using T = decltype(zero);
    const T *hp = detail::ptr<T>(s.h), *ghp = detail::ptr<T>(s.gh), *rp = detail::ptr<T>(s.r),
            *zp = detail::ptr<T>(s.z), *np = detail::ptr<T>(s.n), *d = detail::ptr<T>(dh_next);
    T *dgi = detail::ptr<T>(g.dgi), *dghp = detail::ptr<T>(dgh), *dd = detail::ptr<T>(dh_direct);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t j = 0; j < H; ++j) {
        const std::int64_t i = b * H + j;
        const double r = rp[i], z = zp[i], n = np[i], gh_n = ghp[b * 3 * H + 2 * H + j];
        const double dn = double(d[i]) * (1.0 - z), dz = double(d[i]) * (double(hp[i]) - n);
        const double dn_pre = dn * (1.0 - n * n), dr_pre = dn_pre * gh_n * r * (1.0 - r), dz_pre = dz * z * (1.0 - z);
        T* gi = dgi + b * 3 * H;
        T* gh = dghp + b * 3 * H;
        gi[j] = gh[j] = T(dr_pre);
        gi[H + j] = gh[H + j] = T(dz_pre);
        gi[2 * H + j] = T(dn_pre);
        gh[2 * H + j] = T(dn_pre * r);
        dd[i] = T(double(d[i]) * z);
      }
  });
  g.dh = hh.backward(s.h, dgh);
  detail::accumulate(g.dh, dh_direct);
  return g;
}

Tensor GRUCell::forward(const Tensor& x, const Tensor& h, saved* s) const { return step(ih.forward(x), h, s); }

GRUCell::grads GRUCell::backward(const Tensor& x, const saved& s, const Tensor& dh_next) {
  step_grads sg = step_backward(s, dh_next);
  return {ih.backward(x, sg.dgi), sg.dh};
}

void GRUCell::parameters(parameter_list& list, const std::string& prefix) {
  ih.parameters(list, join(prefix, "ih"));
  hh.parameters(list, join(prefix, "hh"));
}

// ---------------------------------------------------------------------------------------------

BiGRUEncoder::BiGRUEncoder(std::int64_t input_size, std::int64_t hidden_size, rng& gen, dtype t)
    : fwd(input_size, hidden_size, gen, t), bwd(input_size, hidden_size, gen, t) {}

BiGRUEncoder::result BiGRUEncoder::forward(const Tensor& x, const std::optional<Tensor>& lengths, saved* s) const {
  const char* op = "BiGRUEncoder";
  const std::int64_t H = fwd.hidden_size();
  detail::check_dtype(op, "x", x, fwd.ih.weight.type());
  if (x.rank() != 3 || x.size(2) != fwd.ih.in_features())
    detail::fail(op, fmt::format("x has shape {}, expected [B, N, I] with I = {}", shape_str(x.shape()),
                                 fwd.ih.in_features()));
  const std::int64_t B = x.size(0), N = x.size(1);
  std::vector<std::int64_t> len(std::size_t(B), N);
  if (lengths) {
    const Tensor l = detail::int64_indices(op, "lengths", *lengths);
    detail::check_shape(op, "lengths", l, {B});
    for (std::int64_t b = 0; b < B; ++b) {
      len[std::size_t(b)] = l.data_as<std::int64_t>()[b];
      if (len[std::size_t(b)] < 0 || len[std::size_t(b)] > N)
        detail::fail(op, fmt::format("lengths[{}] = {} is outside [0, N] = [0, {}]", b, len[std::size_t(b)], N));
    }
  }
  result r;
  r.out = Tensor::empty({B, N, 2 * H}, x.type());
  if (s) *s = {x, len, std::vector<GRUCell::saved>(std::size_t(N)), std::vector<GRUCell::saved>(std::size_t(N))};
  const Tensor gi_f = fwd.ih.forward(x), gi_b = bwd.ih.forward(x);  // [B, N, 3H], every step at once
  detail::with_type(x.type(), [&](auto zero) {
    using T = decltype(zero);
    // h ← valid(b) ? h' : h
    auto advance = [&](const GRUCell& cell, const Tensor& gi, std::int64_t t, Tensor& h, GRUCell::saved* cs,
                       std::int64_t offset) {
      const Tensor next = cell.step(take_step(gi, t), h, cs);
      auto valid = [&](std::int64_t b) { return t < len[std::size_t(b)]; };
      const T* np = detail::ptr<T>(next);
      Tensor merged = Tensor::copy_of(h);
      T* mp = detail::ptr<T>(merged);
      for (std::int64_t b = 0; b < B; ++b)
        if (valid(b)) std::copy(np + b * H, np + (b + 1) * H, mp + b * H);
      h = merged;
      put_step<T>(r.out, t, offset, h, valid);
    };
    Tensor h = Tensor::zeros({B, H}, x.type());
    for (std::int64_t t = 0; t < N; ++t) advance(fwd, gi_f, t, h, s ? &s->f[std::size_t(t)] : nullptr, 0);
    r.h_fwd = h;
    h = Tensor::zeros({B, H}, x.type());
    for (std::int64_t t = N - 1; t >= 0; --t) advance(bwd, gi_b, t, h, s ? &s->b[std::size_t(t)] : nullptr, H);
    r.h_bwd = h;
  });
  return r;
}

// Through time, in the reverse of each direction's order. A padding step (t >= length_b) passed
// the state through unchanged and output 0: dh passes it unchanged and the cell gets nothing.
Tensor BiGRUEncoder::backward(const saved& s, const Tensor& dout, const Tensor& dh_fwd, const Tensor& dh_bwd) {
  const char* op = "BiGRUEncoder.backward";
  const std::int64_t B = s.x.size(0), N = s.x.size(1), H = fwd.hidden_size();
  detail::check_dtype(op, "dout", dout, s.x.type());
  detail::check_shape(op, "dout", dout, {B, N, 2 * H});
  for (const Tensor* d : {&dh_fwd, &dh_bwd})
    if (d->defined()) {
      detail::check_dtype(op, "dh", *d, s.x.type());
      detail::check_shape(op, "dh", *d, {B, H});
    }
  Tensor dgi_f = Tensor::zeros({B, N, 3 * H}, s.x.type()), dgi_b = Tensor::zeros({B, N, 3 * H}, s.x.type());
  detail::with_type(s.x.type(), [&](auto zero) {
    using T = decltype(zero);
    auto back = [&](GRUCell& cell, const GRUCell::saved& cs, std::int64_t t, Tensor& dh, const Tensor& dgi,
                    std::int64_t offset) {
      auto valid = [&](std::int64_t b) { return t < s.lengths[std::size_t(b)]; };
      // ∂L/∂h'_t of the valid rows: the carried dh plus this step's output gradient.
      const Tensor dcell = slice_step<T>(dout, t, offset, H);
      T* dc = detail::ptr<T>(dcell);
      const T* dhp = detail::ptr<T>(dh);
      for (std::int64_t b = 0; b < B; ++b)
        for (std::int64_t j = 0; j < H; ++j) dc[b * H + j] = valid(b) ? dc[b * H + j] + dhp[b * H + j] : T(0);
      const GRUCell::step_grads g = cell.step_backward(cs, dcell);
      put_step<T>(dgi, t, 0, g.dgi, valid);
      T* dhw = detail::ptr<T>(dh);
      const T* gh = detail::ptr<T>(g.dh);
      for (std::int64_t b = 0; b < B; ++b)
        if (valid(b)) std::copy(gh + b * H, gh + (b + 1) * H, dhw + b * H);
    };
    Tensor dh = dh_fwd.defined() ? Tensor::copy_of(dh_fwd) : Tensor::zeros({B, H}, s.x.type());
    for (std::int64_t t = N - 1; t >= 0; --t) back(fwd, s.f[std::size_t(t)], t, dh, dgi_f, 0);
    dh = dh_bwd.defined() ? Tensor::copy_of(dh_bwd) : Tensor::zeros({B, H}, s.x.type());
    for (std::int64_t t = 0; t < N; ++t) back(bwd, s.b[std::size_t(t)], t, dh, dgi_b, H);
  });
  Tensor dx = fwd.ih.backward(s.x, dgi_f);
  detail::accumulate(dx, bwd.ih.backward(s.x, dgi_b));
  return dx;
}

void BiGRUEncoder::parameters(parameter_list& list, const std::string& prefix) {
  fwd.parameters(list, join(prefix, "fwd"));
  bwd.parameters(list, join(prefix, "bwd"));
}

}  // namespace attn::nn

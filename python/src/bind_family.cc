// python/src/bind_family.cc — family.h: attention_family forward, backward and weights;
// linear_attention forward and backward.
// Option keys: the masking keys of attention (options.h), score, scale, activation,
// temperature, bandwidth, gaussian_form, W, b, W_q, W_k, w_v, W_a, distribution, sigmoid_bias, top_k,
// hardmax_grad, and backend / path / num_threads.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "arrays.h"
#include "attn/family.h"
#include "bind.h"
#include "options.h"

namespace attn::py {

namespace {

family_options read_family(option_reader& r) {
  family_options o;
  read_masking(r, o);
  o.score.kind = parse_score_kind(r.text("score", "scaled_dot"));
  o.score.scale = r.optional_real("scale");
  o.score.activation = parse_score_activation(r.text("activation", "tanh"));
  o.score.temperature = r.real("temperature", 1.0);
  o.score.bandwidth = r.real("bandwidth", 1.0);
  o.score.gaussian = parse_gaussian_form(r.text("gaussian_form", "sigma"));
  o.score.W = r.tensor("W");
  o.score.b = r.tensor("b");
  o.score.W_q = r.tensor("W_q");
  o.score.W_k = r.tensor("W_k");
  o.score.w_v = r.tensor("w_v");
  o.score.W_a = r.tensor("W_a");
  o.distribution.kind = parse_distribution_kind(r.text("distribution", "softmax"));
  o.distribution.sigmoid_bias = r.optional_real("sigmoid_bias");
  o.distribution.k = r.integer("top_k", 1);
  o.distribution.hardmax_grad = parse_hardmax_gradient(r.text("hardmax_grad", "zero"));
  return o;
}

struct family_call {
  TensorView q, k, v;
  family_options o;
  execution e;
};

family_call read_call(const char* op, nb::handle q, nb::handle k, nb::handle v, nb::dict opts) {
  family_call c{array_arg(q, op, "q"), array_arg(k, op, "k"), array_arg(v, op, "v"), {}, {}};
  option_reader r(op, opts);
  c.o = read_family(r);
  c.e = read_execution(r);
  r.finish();
  return c;
}

nb::tuple family_py(nb::handle q, nb::handle k, nb::handle v, nb::dict opts, int kind_) {
  const family_call c = read_call("attention_family", q, k, v, opts);
  const family_result res = without_gil([&] { return attention_family(c.q, c.k, c.v, c.o, c.e); });
  const kind kk = kind(kind_);
  return nb::make_tuple(to_python(res.out, kk), res.path, to_python(res.lse, kk), to_python(res.kept_index, kk),
                        to_python(res.kept_weight, kk));
}

// out, lse, kept_index, kept_weight: the forward's (family_result), or None for a backward that
// recomputes the forward.
nb::tuple family_backward_py(nb::handle q, nb::handle k, nb::handle v, nb::handle dout, nb::dict opts, int kind_,
                             nb::handle out, nb::handle lse, nb::handle kept_index, nb::handle kept_weight) {
  const char* op = "attention_family_backward";
  const family_call c = read_call(op, q, k, v, opts);
  const TensorView tdo = array_arg(dout, op, "dout");
  const bool saved = !out.is_none();
  family_result fwd;
  if (saved) fwd.out = Tensor::copy_of(array_arg(out, op, "out"));
  if (saved && !lse.is_none()) fwd.lse = Tensor::copy_of(array_arg(lse, op, "lse"));
  if (saved && !kept_index.is_none()) fwd.kept_index = Tensor::copy_of(array_arg(kept_index, op, "kept_index"));
  if (saved && !kept_weight.is_none()) fwd.kept_weight = Tensor::copy_of(array_arg(kept_weight, op, "kept_weight"));
  const family_grads g = without_gil([&] {
    return saved ? attention_family_backward(c.q, c.k, c.v, tdo, fwd, c.o, c.e)
                 : attention_family_backward(c.q, c.k, c.v, tdo, c.o, c.e);
  });
  const kind kk = kind(kind_);
  return nb::make_tuple(to_python(g.dq, kk), to_python(g.dk, kk), to_python(g.dv, kk), to_python(g.dW, kk),
                        to_python(g.db, kk), to_python(g.dW_q, kk), to_python(g.dW_k, kk), to_python(g.dw_v, kk),
                        to_python(g.dW_a, kk), g.dtemperature, g.dbandwidth, g.dsigmoid_bias, g.path);
}

nb::object family_weights_py(nb::handle q, nb::handle k, nb::handle v, nb::dict opts, int kind_) {
  const family_call c = read_call("attention_weights", q, k, v, opts);
  const Tensor w = without_gil([&] { return attention_family_weights(c.q, c.k, c.v, c.o, c.e); });
  return to_python(w, kind(kind_));
}

// linear_attention: the masking keys, feature_map (elu_plus_one | relu | identity), normalize, path, num_threads.
linear_attention_options read_linear(option_reader& r) {
  linear_attention_options o;
  read_masking(r, o);
  o.phi = parse_feature_map(r.text("feature_map", "elu_plus_one"));
  o.normalize = r.flag("normalize", true);
  return o;
}

nb::tuple linear_py(nb::handle q, nb::handle k, nb::handle v, nb::dict opts, int kind_) {
  const char* op = "linear_attention";
  const TensorView tq = array_arg(q, op, "q"), tk = array_arg(k, op, "k"), tv = array_arg(v, op, "v");
  option_reader r(op, opts);
  const linear_attention_options o = read_linear(r);
  const execution e = read_execution(r);
  r.finish();
  const linear_attention_result res = without_gil([&] { return linear_attention(tq, tk, tv, o, e); });
  return nb::make_tuple(to_python(res.out, kind(kind_)), res.path);
}

nb::tuple linear_backward_py(nb::handle q, nb::handle k, nb::handle v, nb::handle dout, nb::dict opts, int kind_) {
  const char* op = "linear_attention_backward";
  const TensorView tq = array_arg(q, op, "q"), tk = array_arg(k, op, "k"), tv = array_arg(v, op, "v"),
                   tdo = array_arg(dout, op, "dout");
  option_reader r(op, opts);
  const linear_attention_options o = read_linear(r);
  const execution e = read_execution(r);
  r.finish();
  const linear_attention_grads g = without_gil([&] { return linear_attention_backward(tq, tk, tv, tdo, o, e); });
  const kind kk = kind(kind_);
  return nb::make_tuple(to_python(g.dq, kk), to_python(g.dk, kk), to_python(g.dv, kk), g.path);
}

}  // namespace

void bind_family(nb::module_& m) {
  m.def("linear_attention", &linear_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("opts"), nb::arg("kind"),
        "-> (out, path)");
  m.def("linear_attention_backward", &linear_backward_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("dout"),
        nb::arg("opts"), nb::arg("kind"), "-> (dq, dk, dv, path)");
  m.def("attention_family", &family_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("opts"), nb::arg("kind"),
        "-> (out, path, lse or None, kept_index or None, kept_weight or None)");
  m.def("attention_family_backward", &family_backward_py, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("dout"), nb::arg("opts"), nb::arg("kind"), nb::arg("out") = nb::none(), nb::arg("lse") = nb::none(),
        nb::arg("kept_index") = nb::none(), nb::arg("kept_weight") = nb::none(),
        "-> (dq, dk, dv, dW, db, dW_q, dW_k, dw_v, dW_a, dtemperature, dbandwidth, dsigmoid_bias, path)");
  m.def("attention_weights", &family_weights_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("opts"),
        nb::arg("kind"), "-> float64 weights [B, Hq, Nq, Nk] (or [..., Dv] multi-dimensional)");
}

}  // namespace attn::py

// python/src/bind_attention.cc — attention.h and execution.h: the core op forward, backward,
// the in-place KV cache step and explain_backend. Each takes its options as one dict
// (options.h) and `kind`, the kind of array to return; the GIL is released while attn runs.
#include <fmt/format.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>

#include "arrays.h"
#include "attn/attention.h"
#include "bind.h"
#include "options.h"

namespace attn::py {

namespace {

// q, k, v and the options of one call, read and checked with the GIL held.
struct attention_call {
  TensorView q, k, v;
  attention_options o;
  execution e;
};

attention_call read_call(const char* op, nb::handle q, nb::handle k, nb::handle v, nb::dict opts,
                         const char* k_name = "k", const char* v_name = "v") {
  attention_call c{array_arg(q, op, "q"), array_arg(k, op, k_name), array_arg(v, op, v_name), {}, {}};
  option_reader r(op, std::move(opts));
  c.o = read_attention(r);
  c.e = read_execution(r);
  r.finish();
  return c;
}

nb::tuple result_tuple(const attention_result& r, kind k) {
  return nb::make_tuple(to_python(r.out, k), to_python(r.lse, k), to_python(r.qk, k), to_python(r.present_key, k),
                        to_python(r.present_value, k), r.backend);
}

nb::tuple attention_py(nb::handle q, nb::handle k, nb::handle v, nb::dict opts, int kind_) {
  const attention_call c = read_call("attention", q, k, v, opts);
  const attention_result res = without_gil([&] { return attention(c.q, c.k, c.v, c.o, c.e); });
  return result_tuple(res, kind(kind_));
}

nb::tuple attention_backward_py(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle dout,
                                nb::handle lse, nb::dict opts, int kind_) {
  const char* op = "attention_backward";
  const attention_call c = read_call(op, q, k, v, opts);
  const TensorView to = array_arg(out, op, "out"), tdo = array_arg(dout, op, "dout"), tl = array_arg(lse, op, "lse");
  const attention_grads g = without_gil([&] { return attention_backward(c.q, c.k, c.v, to, tdo, tl, c.o, c.e); });
  const kind kk = kind(kind_);
  return nb::make_tuple(to_python(g.dq, kk), to_python(g.dk, kk), to_python(g.dv, kk), to_python(g.dattn_mask, kk),
                        to_python(g.dalibi_slopes, kk), to_python(g.dsinks, kk), g.backend);
}

nb::tuple attention_with_kv_cache_py(nb::handle q, nb::handle k_new, nb::handle v_new, nb::handle cache_key,
                                     nb::handle cache_value, nb::handle lengths, nb::dict opts, int kind_) {
  const char* op = "attention_with_kv_cache";
  const attention_call c = read_call(op, q, k_new, v_new, opts, "k_new", "v_new");
  // The cache is written: writable arrays (a read-only NumPy array is refused).
  kv_cache_view cache{writable_arg(cache_key, op, "cache key"), writable_arg(cache_value, op, "cache value"),
                      array_arg(lengths, op, "cache lengths")};
  const attention_result res = without_gil([&] { return attention_with_kv_cache(c.q, c.k, c.v, cache, c.o, c.e); });
  return result_tuple(res, kind(kind_));
}

std::string attention_into_py(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle lse, nb::dict opts) {
  const char* op = "attention_into";
  const attention_call c = read_call(op, q, k, v, opts);
  attention_outputs dst{writable_arg(out, op, "out"), std::nullopt};
  if (!lse.is_none()) dst.lse = writable_arg(lse, op, "lse");
  return without_gil([&] { return attention_into(c.q, c.k, c.v, dst, c.o, c.e); });
}

nb::tuple attention_backward_into_py(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle dout,
                                     nb::handle lse, nb::handle dq, nb::handle dk, nb::handle dv, nb::dict opts,
                                     int kind_) {
  const char* op = "attention_backward_into";
  const attention_call c = read_call(op, q, k, v, opts);
  const TensorView to = array_arg(out, op, "out"), tdo = array_arg(dout, op, "dout"), tl = array_arg(lse, op, "lse");
  const attention_grad_outputs dst{writable_arg(dq, op, "dq"), writable_arg(dk, op, "dk"), writable_arg(dv, op, "dv")};
  const attention_grads g =
      without_gil([&] { return attention_backward_into(c.q, c.k, c.v, to, tdo, tl, dst, c.o, c.e); });
  const kind kk = kind(kind_);
  return nb::make_tuple(to_python(g.dattn_mask, kk), to_python(g.dalibi_slopes, kk), to_python(g.dsinks, kk), g.backend);
}

std::string explain_backend_py(nb::handle q, nb::handle k, nb::handle v, nb::dict opts, bool backward) {
  const attention_call c = read_call("explain_backend", q, k, v, opts);
  return explain_backend(c.q, c.k, c.v, c.o, backward, c.e);
}

}  // namespace

void bind_attention(nb::module_& m) {
  m.def("attention", &attention_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("opts"), nb::arg("kind"),
        "-> (out, lse, qk, present_key, present_value, backend)");
  m.def("attention_backward", &attention_backward_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("dout"), nb::arg("lse"), nb::arg("opts"), nb::arg("kind"),
        "-> (dq, dk, dv, dattn_mask, dalibi_slopes, dsinks, backend)");
  m.def("attention_into", &attention_into_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("lse").none(), nb::arg("opts"), "-> backend");
  m.def("attention_backward_into", &attention_backward_into_py, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("dq"), nb::arg("dk"), nb::arg("dv"), nb::arg("opts"),
        nb::arg("kind"), "-> (dattn_mask, dalibi_slopes, dsinks, backend)");
  m.def("attention_with_kv_cache", &attention_with_kv_cache_py, nb::arg("q"), nb::arg("k_new"), nb::arg("v_new"),
        nb::arg("cache_key"), nb::arg("cache_value"), nb::arg("lengths"), nb::arg("opts"), nb::arg("kind"),
        "-> (out, lse, qk, present_key, present_value, backend)");
  m.def("explain_backend", &explain_backend_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("opts"),
        nb::arg("backward"));
  m.def("backends", &backends);
  m.def("release_cached_buffers", [] { return release_cached_buffers(); },
        "gives attn's cached buffers of 8 MiB or more back to the system; returns their bytes");
  m.def("cached_buffer_bytes", [] { return cached_buffer_bytes(); });
  // Seconds per attn::attention call on these arrays, timed in a C++ loop (no Python in it):
  // the baseline python -m attn.bench subtracts to get the binding's own overhead.
  m.def("time_cpp_call", [](nb::handle q, nb::handle k, nb::handle v, nb::dict opts, int iterations) {
    const attention_call c = read_call("time_cpp_call", q, k, v, opts);
    nb::gil_scoped_release unlocked;
    attention(c.q, c.k, c.v, c.o, c.e);  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) attention(c.q, c.k, c.v, c.o, c.e);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / std::max(1, iterations);
  }, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("opts"), nb::arg("iterations"));
  // What the extension reads for an array: (address, shape, element strides, dtype name). Tests
  // compare it with the array's own pointer and strides to show that inputs are not copied.
  m.def("view_info", [](nb::handle x) {
    const TensorView t = array_arg(x, "view_info", "x");
    return nb::make_tuple(reinterpret_cast<std::uintptr_t>(t.data()), t.shape(), t.strides(),
                          std::string(dtype_name(t.type())));
  }, nb::arg("x"));
}

}  // namespace attn::py

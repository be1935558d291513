// python/src/bind_positional.cc — positional.h: rotary (+ backward), sinusoidal encoding,
// T5 relative position bias (+ backward). Positions are an int offset or an int64 id array.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <fmt/format.h>

#include "arrays.h"
#include "attn/error.h"
#include "attn/positional.h"
#include "bind.h"
#include "options.h"

namespace attn::py {

namespace {

positions read_positions(nb::handle h, const char* op) {
  if (h.is_none()) return {};
  std::int64_t offset = 0;
  if (PyLong_Check(h.ptr()) && nb::try_cast(h, offset)) return positions(offset);
  return positions(array_arg(h, op, "positions"));
}

rotary_options read_rotary(std::int64_t rotary_dim, double base, const std::string& layout, std::int64_t num_heads) {
  rotary_options o;
  o.rotary_dim = rotary_dim;
  o.base = base;
  if (layout == "half_split") o.layout = rotary_layout::half_split;
  else if (layout == "interleaved") o.layout = rotary_layout::interleaved;
  else throw error(fmt::format("rotary: layout '{}' is not one of half_split, interleaved", layout));
  o.num_heads = num_heads;
  return o;
}

nb::object rotary_py(nb::handle x, nb::handle pos, std::int64_t rotary_dim, double base, const std::string& layout,
                     std::int64_t num_heads, bool backward, int kind_) {
  const char* op = backward ? "rotary_backward" : "rotary";
  const TensorView tx = array_arg(x, op, backward ? "dy" : "x");
  const positions p = read_positions(pos, op);
  const rotary_options o = read_rotary(rotary_dim, base, layout, num_heads);
  const Tensor y = without_gil([&] { return backward ? rotary_backward(tx, p, o) : rotary(tx, p, o); });
  return to_python(y, kind(kind_));
}

dtype dtype_named(const std::string& s) {
  if (s == "float32") return dtype::f32;
  if (s == "float64") return dtype::f64;
  if (s == "float16") return dtype::f16;
  if (s == "bfloat16") return dtype::bf16;
  throw error(fmt::format("sinusoidal: dtype '{}' is not one of float32, float64, float16, bfloat16", s));
}

nb::object sinusoidal_py(std::int64_t N, std::int64_t D, double base, const std::string& dt, nb::handle pos,
                         int kind_) {
  const positions p = read_positions(pos, "sinusoidal");
  const dtype t = dtype_named(dt);
  const Tensor y = without_gil([&] { return sinusoidal_encoding(N, D, base, t, p); });
  return to_python(y, kind(kind_));
}

relative_position_options read_rp(bool bidirectional, std::int64_t num_buckets, std::int64_t max_distance,
                                  std::int64_t query_offset) {
  relative_position_options o;
  o.bidirectional = bidirectional;
  o.num_buckets = num_buckets;
  o.max_distance = max_distance;
  o.query_offset = query_offset;
  return o;
}

nb::object t5_bias_py(nb::handle table, std::int64_t Nq, std::int64_t Nk, bool bidirectional, std::int64_t num_buckets,
                      std::int64_t max_distance, std::int64_t query_offset, int kind_) {
  const TensorView tt = array_arg(table, "relative_position_bias", "table");
  const relative_position_options o = read_rp(bidirectional, num_buckets, max_distance, query_offset);
  const Tensor y = without_gil([&] { return relative_position_bias(tt, Nq, Nk, o); });
  return to_python(y, kind(kind_));
}

nb::object t5_bias_backward_py(nb::handle dbias, bool bidirectional, std::int64_t num_buckets,
                               std::int64_t max_distance, std::int64_t query_offset, int kind_) {
  const TensorView td = array_arg(dbias, "relative_position_bias_backward", "dbias");
  const relative_position_options o = read_rp(bidirectional, num_buckets, max_distance, query_offset);
  const Tensor y = without_gil([&] { return relative_position_bias_backward(td, o); });
  return to_python(y, kind(kind_));
}

nb::object t5_buckets_py(std::int64_t Nq, std::int64_t Nk, bool bidirectional, std::int64_t num_buckets,
                         std::int64_t max_distance, std::int64_t query_offset) {
  return to_python(relative_position_buckets(Nq, Nk, read_rp(bidirectional, num_buckets, max_distance, query_offset)),
                   kind::numpy);
}

}  // namespace

void bind_positional(nb::module_& m) {
  m.def("rotary", &rotary_py, nb::arg("x"), nb::arg("positions").none(), nb::arg("rotary_dim"), nb::arg("base"),
        nb::arg("layout"), nb::arg("num_heads"), nb::arg("backward"), nb::arg("kind"));
  m.def("sinusoidal", &sinusoidal_py, nb::arg("N"), nb::arg("D"), nb::arg("base"), nb::arg("dtype"),
        nb::arg("positions").none(), nb::arg("kind"));
  m.def("t5_relative_bias", &t5_bias_py, nb::arg("table"), nb::arg("Nq"), nb::arg("Nk"), nb::arg("bidirectional"),
        nb::arg("num_buckets"), nb::arg("max_distance"), nb::arg("query_offset"), nb::arg("kind"));
  m.def("t5_relative_bias_backward", &t5_bias_backward_py, nb::arg("dbias"), nb::arg("bidirectional"),
        nb::arg("num_buckets"), nb::arg("max_distance"), nb::arg("query_offset"), nb::arg("kind"));
  m.def("t5_relative_buckets", &t5_buckets_py, nb::arg("Nq"), nb::arg("Nk"), nb::arg("bidirectional"),
        nb::arg("num_buckets"), nb::arg("max_distance"), nb::arg("query_offset"));
}

}  // namespace attn::py

// python/src/bind_serving.cc — serving.h: packed variable-length batches (forward, backward) and
// the paged KV cache (attention over a block table, appending tokens). Options come as one dict
// (options.h), read with the core op's reader; serving.h refuses those it does not take.
#include <nanobind/nanobind.h>
#include <fmt/format.h>
#include <nanobind/stl/string.h>

#include "arrays.h"
#include "attn/error.h"
#include "attn/serving.h"
#include "bind.h"
#include "options.h"

namespace attn::py {

namespace {

struct options_pair {
  attention_options o;
  execution e;
};

// int8: where the call reads a paged cache, its int8_query key ("automatic", "float32" or "int8") into
// *int8 (paged_kv_view::query).
options_pair read_options(const char* op, nb::dict opts, int8_query* int8 = nullptr) {
  option_reader r(op, std::move(opts));
  options_pair p{read_attention(r), read_execution(r)};
  if (int8) {
    const std::string name = r.text("int8_query", "automatic");
    try {
      *int8 = parse_int8_query(name);
    } catch (const error& e) {
      throw error(fmt::format("{}: {}", op, e.what()));
    }
  }
  r.finish();
  return p;
}

// The paged cache's arrays; `writable`: the pages (and scales) are written (paged_kv_append), so
// a read-only array is refused rather than written through.
paged_kv_view read_cache(const char* op, nb::handle k_pages, nb::handle v_pages, nb::handle block_table,
                         nb::handle seq_lens, nb::handle k_scales, nb::handle v_scales, bool writable) {
  auto pages = [&](nb::handle h, const char* name) {
    return writable ? writable_arg(h, op, name) : array_arg(h, op, name);
  };
  paged_kv_view c{pages(k_pages, "k_pages"), pages(v_pages, "v_pages"), array_arg(block_table, op, "block_table"),
                  array_arg(seq_lens, op, "seq_lens"), {}, {}};
  if (!k_scales.is_none()) c.k_scales = pages(k_scales, "k_scales");
  if (!v_scales.is_none()) c.v_scales = pages(v_scales, "v_scales");
  return c;
}

nb::tuple attention_varlen_py(nb::handle q, nb::handle k, nb::handle v, nb::handle cu_q, nb::handle cu_k,
                              std::int64_t max_q, std::int64_t max_k, nb::dict opts, int kind_) {
  const char* op = "attention_varlen";
  const TensorView tq = array_arg(q, op, "q"), tk = array_arg(k, op, "k"), tv = array_arg(v, op, "v"),
                   tcq = array_arg(cu_q, op, "cu_seqlens_q"), tck = array_arg(cu_k, op, "cu_seqlens_k");
  const options_pair o = read_options(op, opts);
  const varlen_result r = without_gil([&] { return attention_varlen(tq, tk, tv, tcq, tck, max_q, max_k, o.o, o.e); });
  return nb::make_tuple(to_python(r.out, kind(kind_)), to_python(r.lse, kind(kind_)), r.backend);
}

nb::tuple attention_varlen_backward_py(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle dout,
                                       nb::handle lse, nb::handle cu_q, nb::handle cu_k, std::int64_t max_q,
                                       std::int64_t max_k, nb::dict opts, int kind_) {
  const char* op = "attention_varlen_backward";
  const TensorView tq = array_arg(q, op, "q"), tk = array_arg(k, op, "k"), tv = array_arg(v, op, "v"),
                   to = array_arg(out, op, "out"), tdo = array_arg(dout, op, "dout"), tl = array_arg(lse, op, "lse"),
                   tcq = array_arg(cu_q, op, "cu_seqlens_q"), tck = array_arg(cu_k, op, "cu_seqlens_k");
  const options_pair o = read_options(op, opts);
  const varlen_grads g = without_gil(
      [&] { return attention_varlen_backward(tq, tk, tv, to, tdo, tl, tcq, tck, max_q, max_k, o.o, o.e); });
  const kind kk = kind(kind_);
  return nb::make_tuple(to_python(g.dq, kk), to_python(g.dk, kk), to_python(g.dv, kk),
                        to_python(g.dalibi_slopes, kk), to_python(g.dsinks, kk), g.backend,
                        to_python(g.dattn_mask, kk));
}

nb::tuple attention_paged_py(nb::handle q, nb::handle k_pages, nb::handle v_pages, nb::handle block_table,
                             nb::handle seq_lens, nb::handle k_scales, nb::handle v_scales, nb::dict opts, int kind_) {
  const char* op = "attention_paged";
  const TensorView tq = array_arg(q, op, "q");
  paged_kv_view c = read_cache(op, k_pages, v_pages, block_table, seq_lens, k_scales, v_scales, false);
  const options_pair o = read_options(op, opts, &c.query);
  const attention_result r = without_gil([&] { return attention_paged(tq, c, o.o, o.e); });
  return nb::make_tuple(to_python(r.out, kind(kind_)), to_python(r.lse, kind(kind_)), r.backend);
}

nb::tuple attention_paged_backward_py(nb::handle q, nb::handle k_pages, nb::handle v_pages, nb::handle block_table,
                                      nb::handle seq_lens, nb::handle out, nb::handle dout, nb::handle lse,
                                      nb::dict opts, int kind_) {
  const char* op = "attention_paged_backward";
  const TensorView tq = array_arg(q, op, "q"), to = array_arg(out, op, "out"), tdo = array_arg(dout, op, "dout"),
                   tl = array_arg(lse, op, "lse");
  const paged_kv_view c = read_cache(op, k_pages, v_pages, block_table, seq_lens, nb::none(), nb::none(), false);
  const options_pair o = read_options(op, opts);
  const paged_grads g = without_gil([&] { return attention_paged_backward(tq, c, to, tdo, tl, o.o, o.e); });
  const kind kk = kind(kind_);
  return nb::make_tuple(to_python(g.dq, kk), to_python(g.dk_pages, kk), to_python(g.dv_pages, kk),
                        to_python(g.dalibi_slopes, kk), to_python(g.dsinks, kk), to_python(g.dattn_mask, kk),
                        g.backend);
}

nb::tuple attention_paged_varlen_py(nb::handle q, nb::handle cu_q, std::int64_t max_q, nb::handle k_pages,
                                    nb::handle v_pages, nb::handle block_table, nb::handle seq_lens, nb::handle k_scales,
                                    nb::handle v_scales, nb::dict opts, int kind_) {
  const char* op = "attention_paged_varlen";
  const TensorView tq = array_arg(q, op, "q"), tcq = array_arg(cu_q, op, "cu_seqlens_q");
  paged_kv_view c = read_cache(op, k_pages, v_pages, block_table, seq_lens, k_scales, v_scales, false);
  const options_pair o = read_options(op, opts, &c.query);
  const varlen_result r = without_gil([&] { return attention_paged_varlen(tq, tcq, max_q, c, o.o, o.e); });
  return nb::make_tuple(to_python(r.out, kind(kind_)), to_python(r.lse, kind(kind_)), r.backend);
}

nb::tuple attention_paged_varlen_backward_py(nb::handle q, nb::handle cu_q, std::int64_t max_q, nb::handle k_pages,
                                             nb::handle v_pages, nb::handle block_table, nb::handle seq_lens,
                                             nb::handle out, nb::handle dout, nb::handle lse, nb::dict opts, int kind_) {
  const char* op = "attention_paged_varlen_backward";
  const TensorView tq = array_arg(q, op, "q"), tcq = array_arg(cu_q, op, "cu_seqlens_q"), to = array_arg(out, op, "out"),
                   tdo = array_arg(dout, op, "dout"), tl = array_arg(lse, op, "lse");
  const paged_kv_view c = read_cache(op, k_pages, v_pages, block_table, seq_lens, nb::none(), nb::none(), false);
  const options_pair o = read_options(op, opts);
  const paged_grads g =
      without_gil([&] { return attention_paged_varlen_backward(tq, tcq, max_q, c, to, tdo, tl, o.o, o.e); });
  const kind kk = kind(kind_);
  return nb::make_tuple(to_python(g.dq, kk), to_python(g.dk_pages, kk), to_python(g.dv_pages, kk),
                        to_python(g.dalibi_slopes, kk), to_python(g.dsinks, kk), to_python(g.dattn_mask, kk),
                        g.backend);
}

void paged_kv_append_py(nb::handle k_pages, nb::handle v_pages, nb::handle block_table, nb::handle seq_lens,
                        nb::handle k_scales, nb::handle v_scales, nb::handle k_new, nb::handle v_new) {
  const char* op = "paged_kv_append";
  const paged_kv_view c = read_cache(op, k_pages, v_pages, block_table, seq_lens, k_scales, v_scales, true);
  const TensorView tk = array_arg(k_new, op, "k_new"), tv = array_arg(v_new, op, "v_new");
  without_gil([&] {
    paged_kv_append(c, tk, tv);
    return 0;
  });
}

}  // namespace

void bind_serving(nb::module_& m) {
  m.def("attention_varlen", &attention_varlen_py, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cu_seqlens_q"),
        nb::arg("cu_seqlens_k"), nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("opts"), nb::arg("kind"),
        "-> (out, lse, backend)");
  m.def("attention_varlen_backward", &attention_varlen_backward_py, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k"),
        nb::arg("max_seqlen_q"), nb::arg("max_seqlen_k"), nb::arg("opts"), nb::arg("kind"),
        "-> (dq, dk, dv, dalibi_slopes, dsinks, backend, dattn_mask)");
  m.def("attention_paged", &attention_paged_py, nb::arg("q"), nb::arg("k_pages"), nb::arg("v_pages"),
        nb::arg("block_table"), nb::arg("seq_lens"), nb::arg("k_scales").none(), nb::arg("v_scales").none(),
        nb::arg("opts"), nb::arg("kind"), "-> (out, lse, backend)");
  m.def("attention_paged_backward", &attention_paged_backward_py, nb::arg("q"), nb::arg("k_pages"),
        nb::arg("v_pages"), nb::arg("block_table"), nb::arg("seq_lens"), nb::arg("out"), nb::arg("dout"),
        nb::arg("lse"), nb::arg("opts"), nb::arg("kind"),
        "-> (dq, dk_pages, dv_pages, dalibi_slopes, dsinks, dattn_mask, backend)");
  m.def("attention_paged_varlen", &attention_paged_varlen_py, nb::arg("q"), nb::arg("cu_seqlens_q"),
        nb::arg("max_seqlen_q"), nb::arg("k_pages"), nb::arg("v_pages"), nb::arg("block_table"), nb::arg("seq_lens"),
        nb::arg("k_scales").none(), nb::arg("v_scales").none(), nb::arg("opts"), nb::arg("kind"),
        "-> (out, lse, backend)");
  m.def("attention_paged_varlen_backward", &attention_paged_varlen_backward_py, nb::arg("q"), nb::arg("cu_seqlens_q"),
        nb::arg("max_seqlen_q"), nb::arg("k_pages"), nb::arg("v_pages"), nb::arg("block_table"), nb::arg("seq_lens"),
        nb::arg("out"), nb::arg("dout"), nb::arg("lse"), nb::arg("opts"), nb::arg("kind"),
        "-> (dq, dk_pages, dv_pages, dalibi_slopes, dsinks, dattn_mask, backend)");
  m.def("paged_kv_append", &paged_kv_append_py, nb::arg("k_pages"), nb::arg("v_pages"), nb::arg("block_table"),
        nb::arg("seq_lens"), nb::arg("k_scales").none(), nb::arg("v_scales").none(), nb::arg("k_new"),
        nb::arg("v_new"));
}

}  // namespace attn::py

// python/src/module.cc — `attn._attn`, the extension under the `attn` package. Functions here
// are the raw layer: strings for enums, arrays in and out, every option positional. The
// public API with defaults, docstrings and torch autograd is python/attn.
//
// attn::error becomes ValueError, or TypeError when its message is about a dtype (it contains
// "dtype"), with attn's message unchanged. This rule is documented in docs/PYTHON.md.
#include <nanobind/nanobind.h>

#include <cstring>

#include "attn/error.h"
#include "bind.h"

namespace nb = nanobind;

NB_MODULE(_attn, m) {
  m.doc() = "attn: attention mechanisms (C++ core). Use the `attn` package, not this module.";
  m.attr("__version__") = ATTN_VERSION;

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const attn::error& e) {
      PyErr_SetString(std::strstr(e.what(), "dtype") ? PyExc_TypeError : PyExc_ValueError, e.what());
    }
  });

  attn::py::bind_attention(m);
  attn::py::bind_family(m);
  attn::py::bind_positional(m);
  attn::py::bind_serving(m);
}

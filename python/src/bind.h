// python/src/bind.h — the parts of the `attn._attn` extension, one per public header.
#pragma once

#include <nanobind/nanobind.h>

namespace attn::py {

void bind_attention(nanobind::module_& m);   // attention.h, execution.h
void bind_family(nanobind::module_& m);      // family.h
void bind_positional(nanobind::module_& m);  // positional.h
void bind_serving(nanobind::module_& m);     // serving.h

}  // namespace attn::py

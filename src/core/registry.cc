// src/core/registry.cc — the one place that lists backends, in the order backend::automatic
// tries them. A backend is added here and nowhere else; the reference is always last.
#include "core/problem.h"

namespace attn::detail {

const backend_impl& cpu_backend();  // src/cpu

const std::vector<const backend_impl*>& backend_registry() {
  static const std::vector<const backend_impl*> list = {&cpu_backend(), &reference_backend()};
  return list;
}

}  // namespace attn::detail

// src/core/select.cc — the registry of backends and the one selector that every call and
// explain_backend use. A backend is added to the registry here and nowhere else; the
// reference is always last and always eligible.
#include <cstdlib>
#include <string>

#include "attn/execution.h"
#include "core/names.h"
#include "core/problem.h"

namespace attn {
namespace detail {

namespace {
constexpr std::array kBackendNames = {enum_name{backend::automatic, "automatic"},
                                      enum_name{backend::reference, "reference"}, enum_name{backend::cpu, "cpu"},
                                      enum_name{backend::cuda, "cuda"}};
static_assert(names_cover(kBackendNames, backend::cuda), "a backend enumerator has no name");

constexpr std::array kFamilyPathNames = {enum_name{family_path::automatic, "automatic"},
                                         enum_name{family_path::core, "core"}, enum_name{family_path::tiled, "tiled"},
                                         enum_name{family_path::reference, "reference"},
                                         enum_name{family_path::fused, "fused"}};
static_assert(names_cover(kFamilyPathNames, family_path::fused), "a family_path enumerator has no name");
}  // namespace

const std::vector<const backend_impl*>& backend_registry() {
  static const std::vector<const backend_impl*> list = {&cpu_backend(), &cuda_backend(), &reference_backend()};
  return list;
}

selection select_backend(const problem& p, const backend_request& req, backend want) {
  selection sel;
  if (want == backend::automatic) {
    const char* env = std::getenv("ATTN_BACKEND");
    if (env && *env && std::string_view(env) != "automatic") {
      bool found = false;
      for (const enum_name<backend>& n : kBackendNames)
        if (n.name == env) want = n.value, found = true;
      if (!found) {
        sel.unknown = env;
        return sel;
      }
    }
  }
  for (const backend_impl* b : backend_registry()) {
    if (want != backend::automatic && b->id != want) continue;
    if (want == backend::automatic && b->explicit_only) continue;  // never chosen for the caller
    const std::string why = b->why_not(p, req);
    if (why.empty()) {
      sel.chosen = b;
      return sel;
    }
    sel.reasons += (sel.reasons.empty() ? "" : "; ") + why;
  }
  return sel;
}

}  // namespace detail

std::string_view to_string(backend b) {
  const auto i = static_cast<std::size_t>(b);
  return i < detail::kBackendNames.size() ? detail::kBackendNames[i].name : std::string_view("unknown backend");
}
backend parse_backend(std::string_view name) { return detail::parse_name(detail::kBackendNames, name, "backend"); }

std::string_view to_string(family_path p) {
  const auto i = static_cast<std::size_t>(p);
  return i < detail::kFamilyPathNames.size() ? detail::kFamilyPathNames[i].name : std::string_view("unknown path");
}
family_path parse_family_path(std::string_view name) {
  return detail::parse_name(detail::kFamilyPathNames, name, "family path");
}

std::vector<std::string> backends() {
  std::vector<std::string> r;
  for (const auto* b : detail::backend_registry()) {
#ifndef ATTN_HAS_CUDA
    if (b->id == backend::cuda) continue;  // the stub of a build without CUDA: it can run nothing
#endif
    r.emplace_back(b->name());
  }
  return r;
}

}  // namespace attn

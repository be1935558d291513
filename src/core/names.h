// src/core/names.h — name tables for public enums, tied to the enums at compile time.
//
// A table lists {enumerator, name} in enumerator order; `names_cover(table, last)` is true
// when entry i holds enumerator i and the table ends at `last`, so a static_assert beside each
// table fails to compile when an enumerator is added without its name (as ggml checks
// GGML_OP_COUNT against its name table).
//
//   constexpr std::array kBackendNames = {enum_name{backend::automatic, "automatic"}, ...};
//   static_assert(names_cover(kBackendNames, backend::cpu));
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "attn/error.h"

namespace attn::detail {

template <class E>
struct enum_name {
  E value;
  std::string_view name;
};
// Spelled out for clang 14 (the fuzz build), which lacks C++20's deduction for aggregates.
template <class E>
enum_name(E, const char*) -> enum_name<E>;

template <class E, std::size_t N>
constexpr bool names_cover(const std::array<enum_name<E>, N>& table, E last) {
  for (std::size_t i = 0; i < N; ++i)
    if (static_cast<std::size_t>(table[i].value) != i || table[i].name.empty()) return false;
  return N == static_cast<std::size_t>(last) + 1;
}

// The name of `e`, or "<what>(<number>)" for a value outside the enum.
template <class E, std::size_t N>
std::string name_of(const std::array<enum_name<E>, N>& table, E e, std::string_view what) {
  const auto i = static_cast<std::size_t>(e);
  return i < N ? std::string(table[i].name) : fmt::format("{}({})", what, static_cast<long long>(e));
}

// The enumerator named `s`; throws attn::error "<what>: 'x' is not one of a, b, c".
template <class E, std::size_t N>
E parse_name(const std::array<enum_name<E>, N>& table, std::string_view s, std::string_view what) {
  std::string all;
  for (const enum_name<E>& n : table) {
    if (s == n.name) return n.value;
    all += (all.empty() ? "" : ", ") + std::string(n.name);
  }
  throw error(fmt::format("{}: '{}' is not one of {}", what, s, all));
}

}  // namespace attn::detail

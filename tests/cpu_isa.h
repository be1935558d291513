// tests/cpu_isa.h — walking the cpu backend's ISA levels in a test: the levels this build and
// machine have (generic … amx), and ATTN_CPU_ISA set for a scope (src/cpu/isa.cc reads it on
// every call, so a test can take every path in one process). Where the CPU has the avx512bf16
// level it is walked twice, whatever the CPU's own choice (cpu::bf16_dot_products): as
// "avx512bf16", bf16 products by vdpbf16ps (ATTN_CPU_BF16_DOTS=on), and as "avx512bf16/f32",
// bf16 widened to f32 (ATTN_CPU_BF16_DOTS=off).
#pragma once

#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "test_util.h"

namespace attn::testing {

inline constexpr const char* kIsaBf16Widened = "avx512bf16/f32";

inline std::vector<std::string> isas() {
  int n = 0;
  const char* const* names = detail::cpu::available_isas(&n);
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    out.emplace_back(names[i]);
    if (out.back() == "avx512bf16") out.emplace_back(kIsaBf16Widened);
  }
  return out;
}

// ATTN_CPU_ISA (and ATTN_CPU_BF16_DOTS) for one of isas()'s names.
struct isa_scope {
  env_scope isa, dots;
  explicit isa_scope(const std::string& name)
      : isa("ATTN_CPU_ISA", name == kIsaBf16Widened ? "avx512bf16" : name.c_str()),
        dots("ATTN_CPU_BF16_DOTS", name == kIsaBf16Widened ? "off" : "on") {}
};

}  // namespace attn::testing

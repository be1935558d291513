// tests/cpu_isa.h — walking the cpu backend's ISA levels in a test: the levels this build and
// machine have (generic … amx), and ATTN_CPU_ISA set for a scope (src/cpu/isa.cc reads it on
// every call, so a test can take every path in one process).
#pragma once

#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "test_util.h"

namespace attn::testing {

inline std::vector<std::string> isas() {
  int n = 0;
  const char* const* names = detail::cpu::available_isas(&n);
  return std::vector<std::string>(names, names + n);
}

struct isa_scope : env_scope {
  explicit isa_scope(const std::string& isa) : env_scope("ATTN_CPU_ISA", isa.c_str()) {}
};

}  // namespace attn::testing

// src/cpu/isa.cc — runtime ISA dispatch for the cpu backend: the one place that asks the CPU
// what it supports. Levels, lowest first:
//   generic  baseline x86-64 (SSE2, 4 floats per vector)     runs anywhere
//   avx2     AVX2 + FMA + F16C (8 floats)
//   avx512   AVX-512 F/BW/VL/DQ (16 floats)
//   avx512bf16  the same plus AVX512_BF16 dot products for the bf16 forward (and AVX512_VNNI,
//               which every such CPU has, for the int16 dots of the int8 KV decode)
// ATTN_CPU_ISA=<level> caps the level (read on every call so tests can walk every path); a
// build with ATTN_CPU_MAX_LEVEL below 3 (src/cpu/sources.cmake) has no kernels above it.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "cpu/family_kernels.h"
#include "cpu/kernels.h"
#include "cpu/rowwise.h"

#ifndef ATTN_CPU_MAX_LEVEL
#define ATTN_CPU_MAX_LEVEL 3
#endif

namespace attn::detail::cpu {
namespace {

const char* const kLevels[] = {"generic", "avx2", "avx512", "avx512bf16"};

int detected_level() {
  static const int level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
      return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni") ? 3 : 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
    return 0;
  }();
  return std::min(level, ATTN_CPU_MAX_LEVEL);
}

// The detected level, capped by ATTN_CPU_ISA.
int capped_level() {
  int level = detected_level();
  if (const char* env = std::getenv("ATTN_CPU_ISA"); env && *env) {
    for (int i = 0; i < 4; ++i)
      if (std::strcmp(env, kLevels[i]) == 0 && i < level) level = i;
  }
  return level;
}

}  // namespace

const char* const* available_isas(int* count) {
  *count = detected_level() + 1;
  return kLevels;
}

const kernel_table& select_kernels() {
  switch (capped_level()) {
#if ATTN_CPU_MAX_LEVEL >= 3
    case 3: return kernels_avx512bf16();
#endif
#if ATTN_CPU_MAX_LEVEL >= 2
    case 2: return kernels_avx512();
#endif
#if ATTN_CPU_MAX_LEVEL >= 1
    case 1: return kernels_avx2();
#endif
    default: return kernels_generic();
  }
}

// The row-wise kernels have no bf16 dot product to use: avx512bf16 runs the avx512 ones.
const rowwise_table& select_rowwise() {
  switch (capped_level()) {
#if ATTN_CPU_MAX_LEVEL >= 2
    case 3:
    case 2: return rowwise_avx512();
#endif
#if ATTN_CPU_MAX_LEVEL >= 1
    case 1: return rowwise_avx2();
#endif
    default: return rowwise_generic();
  }
}

const family_table& select_family_kernels() {
  switch (capped_level()) {
#if ATTN_CPU_MAX_LEVEL >= 3
    case 3: return family_avx512bf16();
#endif
#if ATTN_CPU_MAX_LEVEL >= 2
    case 2: return family_avx512();
#endif
#if ATTN_CPU_MAX_LEVEL >= 1
    case 1: return family_avx2();
#endif
    default: return family_generic();
  }
}

}  // namespace attn::detail::cpu

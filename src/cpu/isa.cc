// src/cpu/isa.cc — runtime ISA dispatch for the cpu backend: the one place that asks the CPU
// what it supports. Levels, lowest first:
//   generic  baseline x86-64 (SSE2, 4 floats per vector)     runs anywhere
//   avx2     AVX2 + FMA + F16C (8 floats)
//   avx512   AVX-512 F/BW/VL/DQ (16 floats)
//   avx512bf16  the same plus AVX512_BF16 dot products for the bf16 forward (and AVX512_VNNI,
//               which every such CPU has, for the int16 dots of the int8 KV decode); on Intel
//               CPUs bf16 is widened to f32 instead (bf16_dot_products, kernels.h)
//   amx      the same plus AMX-TILE/AMX-BF16 tiles for the bf16 prefill forward (amx.h), where
//            the OS grants the process the tile state (Linux: arch_prctl ARCH_REQ_XCOMP_PERM)
// ATTN_CPU_ISA=<level> caps the level (read on every call so tests can walk every path); a
// build with ATTN_CPU_MAX_LEVEL below 3 (src/cpu/sources.cmake) has no kernels above it.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "cpu/denormals.h"
#include "cpu/family_kernels.h"
#include "cpu/kernels.h"
#include "cpu/rowwise.h"

#ifndef ATTN_CPU_MAX_LEVEL
#define ATTN_CPU_MAX_LEVEL 3
#endif

namespace attn::detail::cpu {
namespace {

const char* const kLevels[] = {"generic", "avx2", "avx512", "avx512bf16", "amx"};
constexpr int kNumLevels = 5;

// AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22), and the OS's permission to use the
// tile data (asked once for the process; every thread started later may use it).
bool amx_usable() {
#if defined(__linux__) && defined(__x86_64__)
  unsigned a = 7, b = 0, c = 0, d = 0;
  __asm__("cpuid" : "+a"(a), "=b"(b), "+c"(c), "=d"(d));
  if (!((d >> 24) & 1) || !((d >> 22) & 1)) return false;
  constexpr long kReqXcompPerm = 0x1023, kXtileData = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXtileData) == 0;
#else
  return false;
#endif
}

int detected_level() {
  static const int level = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
      if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512vnni")) return 2;
      return amx_usable() ? 4 : 3;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
    return 0;
  }();
  // amx lives in the avx512bf16 unit: a build with that level has both
  return std::min(level, ATTN_CPU_MAX_LEVEL >= 3 ? 4 : ATTN_CPU_MAX_LEVEL);
}

// The detected level, capped by ATTN_CPU_ISA.
int capped_level() {
  int level = detected_level();
  if (const char* env = std::getenv("ATTN_CPU_ISA"); env && *env) {
    for (int i = 0; i < kNumLevels; ++i)
      if (std::strcmp(env, kLevels[i]) == 0 && i < level) level = i;
  }
  return level;
}

}  // namespace

bool bf16_dot_products() {
  if (const char* env = std::getenv("ATTN_CPU_BF16_DOTS"); env && *env) {
    if (std::strcmp(env, "on") == 0) return true;
    if (std::strcmp(env, "off") == 0) return false;
  }
  static const bool intel = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("intel");
  }();
  return !intel;
}

bool flush_denormals() {
  const char* env = std::getenv("ATTN_CPU_DENORMALS");
  return !(env && std::strcmp(env, "keep") == 0);
}

const char* const* available_isas(int* count) {
  *count = detected_level() + 1;
  return kLevels;
}

const kernel_table& select_kernels() {
  switch (capped_level()) {
#if ATTN_CPU_MAX_LEVEL >= 3
    case 4: return kernels_amx();
    case 3: return bf16_dot_products() ? kernels_avx512bf16() : kernels_avx512bf16_f32();
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

// The row-wise kernels have no bf16 dot product to use: avx512bf16 and amx run the avx512 ones.
const rowwise_table& select_rowwise() {
  switch (capped_level()) {
#if ATTN_CPU_MAX_LEVEL >= 2
    case 4:
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
    // The amx level: the bf16 forward of dot scores on tiles; everything else multiplies in f32
    // rather than by vdpbf16ps, which the AMX Xeons run at half their FMA rate (B1 H8 N2048 D64
    // bf16 scaled_dot × sigmoid, 2 threads: 51.4-51.7 ms with vdpbf16ps, 35.8-37.4 in f32).
    case 4: return family_amx();
    case 3: return bf16_dot_products() ? family_avx512bf16() : family_avx512bf16_f32();
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

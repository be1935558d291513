// src/cpu/amx_gemm.h — the AMX tile products both AMX users share: the per-thread tile
// configuration and C (+)= A·B in bf16 pairs (tdpbf16ps). Included only by translation units
// compiled with -mamx-tile -mamx-bf16 (kernels_avx512bf16.cc through amx.h, family_avx512bf16.cc).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace attn::detail::cpu {
namespace {

// Every tile 16 rows of 64 bytes (palette 1). The configuration is per thread: loaded at the
// start of each lane block, released at its end.
inline void amx_configure() {
  alignas(64) unsigned char cfg[64] = {};
  cfg[0] = 1;
  for (int t = 0; t < 8; ++t) {
    cfg[16 + 2 * t] = 64;  // bytes per row (little-endian uint16)
    cfg[48 + t] = 16;      // rows
  }
  _tile_loadconfig(cfg);
}

// C [16·MR][N] (+)= A · B, one strip of MR row tiles (MR = 1 or 2; tiles C 0-3, A 4-5, B 6-7):
// per 32 columns, 2 × MR accumulators over K in steps of 16 words.
template <int MR>
inline void amx_strip(std::int64_t N, std::int64_t K, const std::uint32_t* a, std::int64_t lda, const std::uint32_t* b,
                      std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  const long sa = long(lda) * 4, sb = long(ldb) * 4, sc = long(ldc) * 4;
  for (std::int64_t n = 0; n < N; n += 32) {
    float* c0 = c + n;
    float* c1 = c0 + 16 * ldc;
    if (accumulate) {
      _tile_loadd(0, c0, sc);
      _tile_loadd(1, c0 + 16, sc);
      if constexpr (MR == 2) {
        _tile_loadd(2, c1, sc);
        _tile_loadd(3, c1 + 16, sc);
      }
    } else {
      _tile_zero(0);
      _tile_zero(1);
      if constexpr (MR == 2) {
        _tile_zero(2);
        _tile_zero(3);
      }
    }
    for (std::int64_t k = 0; k < K; k += 16) {
      _tile_loadd(4, a + k, sa);
      _tile_loadd(6, b + k * ldb + n, sb);
      _tile_loadd(7, b + k * ldb + n + 16, sb);
      if constexpr (MR == 2) _tile_loadd(5, a + 16 * lda + k, sa);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if constexpr (MR == 2) {
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, c0, sc);
    _tile_stored(1, c0 + 16, sc);
    if constexpr (MR == 2) {
      _tile_stored(2, c1, sc);
      _tile_stored(3, c1 + 16, sc);
    }
  }
}

// C [M][N] (+)= A · B in bf16 pairs: A word (m, k') at a[m·lda + k'], B word (k', n) at
// b[k'·ldb + n], C (m, n) at c[m·ldc + n] (f32); accumulate: C's values are added to, else
// overwritten. M a multiple of 16, N of 32, K (words) of 16: strips of 32 rows, then one of 16.
inline void amx_gemm(std::int64_t M, std::int64_t N, std::int64_t K, const std::uint32_t* a, std::int64_t lda,
                     const std::uint32_t* b, std::int64_t ldb, float* c, std::int64_t ldc, bool accumulate) {
  std::int64_t m = 0;
  for (; m + 32 <= M; m += 32) amx_strip<2>(N, K, a + m * lda, lda, b, ldb, c + m * ldc, ldc, accumulate);
  if (m < M) amx_strip<1>(N, K, a + m * lda, lda, b, ldb, c + m * ldc, ldc, accumulate);
}

}  // namespace
}  // namespace attn::detail::cpu

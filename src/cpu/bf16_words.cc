// src/cpu/bf16_words.cc — bf16_words.h.
#include "cpu/bf16_words.h"

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "cpu/kernels.h"

namespace attn::detail::cpu {

words bf16_row_words(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                     std::int64_t Np, int nt) {
  const std::int64_t Xw = X / 2;
  words r(std::size_t(B * H * Np * Xw));  // every word written below: rows [0, N), then zero rows to Np
#pragma omp parallel for num_threads(nt) schedule(static)
  for (std::int64_t row = 0; row < B * H * Np; ++row) {
    const std::int64_t n = row % Np, h = row / Np % H, b = row / Np / H;
    std::uint32_t* o = r.data() + row * Xw;
    if (n >= N) {
      std::fill(o, o + Xw, 0u);
      continue;
    }
    const std::uint16_t* p = s.ptr<std::uint16_t>(b, h, n, 0);
    if (s.sx == 1)  // the row's own bytes (little-endian: the first value in the low half)
      std::memcpy(o, p, std::size_t(Xw) * 4);
    else
      for (std::int64_t w = 0; w < Xw; ++w) o[w] = std::uint32_t(p[2 * w * s.sx]) | std::uint32_t(p[(2 * w + 1) * s.sx]) << 16;
  }
  return r;
}

words bf16_pair_words(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                      std::int64_t Npairs, int nt) {
  words r(std::size_t(B * H * Npairs * X), 0u);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (std::int64_t row = 0; row < B * H * Npairs; ++row) {
    const std::int64_t jp = row % Npairs, h = row / Npairs % H, b = row / Npairs / H;
    std::uint32_t* o = r.data() + row * X;
    for (std::int64_t half = 0; half < 2; ++half) {
      const std::int64_t j = 2 * jp + half;
      if (j >= N) break;
      const std::uint16_t* p = s.ptr<std::uint16_t>(b, h, j, 0);
      const int shift = 16 * int(half);
      if (s.sx == 1)  // (a loop the compiler vectorises)
        for (std::int64_t x = 0; x < X; ++x) o[x] |= std::uint32_t(p[x]) << shift;
      else
        for (std::int64_t x = 0; x < X; ++x) o[x] |= std::uint32_t(p[x * s.sx]) << shift;
    }
  }
  return r;
}

words bf16_pair_words_t(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                        std::int64_t Npairs, int nt) {
  words r(std::size_t(B * H * X * Npairs));  // every word written below
  // 16 pairs of rows at a time (8 KiB of 128-value bf16 rows, in L1): each column's 16 words
  // written in order; the pairs past the last block zero.
  constexpr std::int64_t kPairs = 16;
  const std::int64_t blocks = (N + 2 * kPairs - 1) / (2 * kPairs);
  const std::int64_t covered = std::min(Npairs, blocks * kPairs);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (std::int64_t col = 0; col < B * H * X; ++col)
    std::fill(r.data() + col * Npairs + covered, r.data() + (col + 1) * Npairs, 0u);
  // Unit-stride rows and a vector width that divides 16 (every table's): the fast path below.
  const kernel_table& kt = select_kernels();
  const bool fast = (s.sx == 1 || X <= 1) && kPairs % kt.W == 0;
#pragma omp parallel num_threads(nt)
  {
    words pair_rows(fast ? std::size_t(kPairs * X) : 0), cols(fast ? std::size_t(kPairs * X) : 0);
    const std::uint32_t* row_ptrs[kPairs];
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < B * H * blocks; ++t) {
      const std::int64_t jb = t % blocks, bh = t / blocks, h = bh % H, b = bh / H;
      const std::uint16_t* rows[2 * kPairs];
      static const std::uint16_t zero = 0;
      std::int64_t step[2 * kPairs];
      for (std::int64_t i = 0; i < 2 * kPairs; ++i) {
        const std::int64_t j = 2 * kPairs * jb + i;
        rows[i] = j < N ? s.ptr<std::uint16_t>(b, h, j, 0) : &zero;
        step[i] = j < N ? s.sx : 0;
      }
      std::uint32_t* o = r.data() + bh * X * Npairs + kPairs * jb;
      const std::int64_t np = std::min(kPairs, Npairs - kPairs * jb);
      if (fast && np == kPairs) {
        // The 16 pairs interleaved into rows of words (unit stride: vectorised), then turned
        // into columns by the kernels' register transposes (lane_words), each column's 16
        // words copied to its place.
        for (std::int64_t i = 0; i < kPairs; ++i) {
          const std::uint16_t *r0 = rows[2 * i], *r1 = rows[2 * i + 1];
          std::uint32_t* w = pair_rows.data() + i * X;
          const std::int64_t j = 2 * (kPairs * jb + i);  // the pair's first row
          if (j + 1 < N)
            for (std::int64_t x = 0; x < X; ++x) w[x] = std::uint32_t(r0[x]) | std::uint32_t(r1[x]) << 16;
          else if (j < N)
            for (std::int64_t x = 0; x < X; ++x) w[x] = std::uint32_t(r0[x]);
          else
            std::fill(w, w + X, 0u);
          row_ptrs[i] = w;
        }
        kt.lane_words(row_ptrs, kPairs, kPairs, X, cols.data());
        for (std::int64_t x = 0; x < X; ++x) std::memcpy(o + x * Npairs, cols.data() + x * kPairs, kPairs * 4);
        continue;
      }
      for (std::int64_t i = 0; i < np; ++i) {  // pair by pair: its two rows read in order
        const std::uint16_t *r0 = rows[2 * i], *r1 = rows[2 * i + 1];
        const std::int64_t s0 = step[2 * i], s1 = step[2 * i + 1];
        for (std::int64_t x = 0; x < X; ++x) o[x * Npairs + i] = std::uint32_t(r0[x * s0]) | std::uint32_t(r1[x * s1]) << 16;
      }
    }
  }
  return r;
}

bool bf16_all_finite(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int nt) {
  std::int64_t bad = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : bad)
  for (std::int64_t row = 0; row < B * H * N; ++row) {
    const std::int64_t n = row % N, h = row / N % H, b = row / N / H;
    const std::uint16_t* p = s.ptr<std::uint16_t>(b, h, n, 0);
    if (s.sx == 1)  // (vectorised)
      for (std::int64_t x = 0; x < X; ++x) bad += (p[x] & 0x7f80u) == 0x7f80u;
    else
      for (std::int64_t x = 0; x < X; ++x) bad += (p[x * s.sx] & 0x7f80u) == 0x7f80u;
  }
  return bad == 0;
}

bool view_all_finite(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int nt) {
  if (s.type == dtype::bf16) return bf16_all_finite(s, B, H, N, X, nt);
  std::int64_t bad = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : bad)
  for (std::int64_t row = 0; row < B * H * N; ++row) {
    const std::int64_t n = row % N, h = row / N % H, b = row / N / H;
    switch (s.type) {
      case dtype::f32: {
        const float* p = s.ptr<float>(b, h, n, 0);
        for (std::int64_t x = 0; x < X; ++x) bad += !(p[x * s.sx] * 0.0f == 0.0f);  // NaN and ±inf give NaN
        break;
      }
      case dtype::f64: {
        const double* p = s.ptr<double>(b, h, n, 0);
        for (std::int64_t x = 0; x < X; ++x) bad += !(p[x * s.sx] * 0.0 == 0.0);
        break;
      }
      default: {  // float16: exponent bits all ones
        const std::uint16_t* p = s.ptr<std::uint16_t>(b, h, n, 0);
        for (std::int64_t x = 0; x < X; ++x) bad += (p[x * s.sx] & 0x7c00u) == 0x7c00u;
      }
    }
  }
  return bad == 0;
}

}  // namespace attn::detail::cpu

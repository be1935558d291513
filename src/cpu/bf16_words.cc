// src/cpu/bf16_words.cc — bf16_words.h.
#include "cpu/bf16_words.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>

#include "cpu/kernels.h"

namespace attn::detail::cpu {

namespace {

// Row `row` = (b·H + h)·Np + n of bf16_row_words' layout, Xw words at o.
void row_words_row(const strided4& s, std::int64_t H, std::int64_t N, std::int64_t Xw, std::int64_t Np,
                   std::int64_t row, std::uint32_t* o) {
  const std::int64_t n = row % Np, h = row / Np % H, b = row / Np / H;
  if (n >= N) {
    std::fill(o, o + Xw, 0u);
    return;
  }
  const std::uint16_t* p = s.ptr<std::uint16_t>(b, h, n, 0);
  if (s.sx == 1)  // the row's own bytes (little-endian: the first value in the low half)
    std::memcpy(o, p, std::size_t(Xw) * 4);
  else
    for (std::int64_t w = 0; w < Xw; ++w) o[w] = std::uint32_t(p[2 * w * s.sx]) | std::uint32_t(p[(2 * w + 1) * s.sx]) << 16;
}

// Whether either bf16 of a word is an inf or a NaN (its exponent bits all ones).
inline std::uint32_t special_word(std::uint32_t w) {
  return std::uint32_t((w & 0x7f80u) == 0x7f80u) | std::uint32_t((w & 0x7f800000u) == 0x7f800000u);
}

// Row `row` = (b·H + h)·Npairs + j' of bf16_pair_words' layout, X words at o (zero on entry);
// nonzero where a word holds an inf or a NaN (looked at only with check).
std::uint32_t pair_words_row(const strided4& s, std::int64_t H, std::int64_t N, std::int64_t X, std::int64_t Npairs,
                             std::int64_t row, std::uint32_t* o, bool check) {
  const std::int64_t jp = row % Npairs, h = row / Npairs % H, b = row / Npairs / H;
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
  std::uint32_t bad = 0;
  if (check)
    for (std::int64_t x = 0; x < X; ++x) bad |= special_word(o[x]);
  return bad;
}

}  // namespace

void bf16_packs(std::span<const word_pack> packs, int nt) {
  std::vector<std::uint32_t> bad(packs.size(), 0u);
  for (const word_pack& k : packs) {
    const std::size_t n = std::size_t(k.B * k.H * k.np * (k.kind == word_pack::rows ? k.X / 2 : k.X));
    if (k.kind == word_pack::rows) *k.out = words(n);  // every word written below
    else *k.out = words(n, 0u);                        // the pairs are or-ed in
  }
#pragma omp parallel num_threads(nt)
  for (std::size_t i = 0; i < packs.size(); ++i) {  // (every thread meets the same loops)
    const word_pack& k = packs[i];
    const std::int64_t rows = k.B * k.H * k.np;
    std::uint32_t* out = k.out->data();
    std::uint32_t my = 0;
    if (k.kind == word_pack::rows) {
#pragma omp for schedule(static) nowait
      for (std::int64_t row = 0; row < rows; ++row) row_words_row(*k.s, k.H, k.N, k.X / 2, k.np, row, out + row * (k.X / 2));
    } else {
#pragma omp for schedule(static) nowait
      for (std::int64_t row = 0; row < rows; ++row)
        my |= pair_words_row(*k.s, k.H, k.N, k.X, k.np, row, out + row * k.X, k.finite != nullptr);
    }
    if (my) {
#pragma omp atomic
      bad[i] |= my;
    }
  }
  for (std::size_t i = 0; i < packs.size(); ++i)
    if (packs[i].finite) *packs[i].finite = bad[i] == 0;
}

words bf16_row_words(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                     std::int64_t Np, int nt) {
  words r;
  const word_pack k{word_pack::rows, &s, B, H, N, X, Np, &r};
  bf16_packs({&k, 1}, nt);
  return r;
}

word_rows bf16_rows_in_place(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                             std::int64_t pad, std::int64_t align, int nt) {
  const std::int64_t Xw = X / 2, heads = B * H;
  word_rows r;
  r.head.resize(std::size_t(heads)), r.step.resize(std::size_t(heads));
  const auto addr = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
  const auto aligned = [&](std::int64_t elems) { return (elems * 2) % align == 0; };
  const bool fit = s.type == dtype::bf16 && heads * N * X > 0 && s.sx == 1 && X % 2 == 0 && s.sn >= X &&
                   s.sh >= 0 && s.sb >= 0 && addr(s.data) % std::uintptr_t(align) == 0 && aligned(s.sn) &&
                   (H == 1 || aligned(s.sh)) && (B == 1 || aligned(s.sb));
  if (!fit) {
    r.copies = bf16_row_words(s, B, H, N, X, N + pad, nt);
    for (std::int64_t bh = 0; bh < heads; ++bh) r.head[bh] = r.copies.data() + bh * (N + pad) * Xw, r.step[bh] = Xw;
    return r;
  }
  // One past the view's last byte (strides >= 0: its first element is the lowest).
  const std::uintptr_t end = addr(s.ptr<std::uint16_t>(B - 1, H - 1, N - 1, X - 1)) + 2;
  std::vector<std::int64_t> copied;
  for (std::int64_t bh = 0; bh < heads; ++bh) {
    const std::uint16_t* first = s.ptr<std::uint16_t>(bh / H, bh % H, 0, 0);
    if (addr(first) + std::uintptr_t(((N + pad - 1) * s.sn + X) * 2) <= end) {
      r.head[bh] = reinterpret_cast<const std::uint32_t*>(first), r.step[bh] = s.sn / 2;
    } else {
      copied.push_back(bh);
    }
  }
  if (copied.empty()) return r;
  r.copies = words(copied.size() * std::size_t((N + pad) * Xw));
  for (std::size_t c = 0; c < copied.size(); ++c) {
    const std::int64_t bh = copied[c];
    std::uint32_t* o = r.copies.data() + std::int64_t(c) * (N + pad) * Xw;
    for (std::int64_t n = 0; n < N; ++n) std::memcpy(o + n * Xw, s.ptr<std::uint16_t>(bh / H, bh % H, n, 0), std::size_t(X) * 2);
    std::fill(o + N * Xw, o + (N + pad) * Xw, 0u);
    r.head[bh] = o, r.step[bh] = Xw;
  }
  return r;
}

words bf16_pair_words(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                      std::int64_t Npairs, int nt, bool* finite) {
  words r;
  const word_pack k{word_pack::pairs, &s, B, H, N, X, Npairs, &r, finite};
  bf16_packs({&k, 1}, nt);
  return r;
}

words bf16_pair_words_t(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                        std::int64_t Npairs, int nt, bool* finite) {
  words r(std::size_t(B * H * X * Npairs));  // every word written below
  // 16 pairs of rows at a time (8 KiB of 128-value bf16 rows, in L1): each column's 16 words
  // written in order; the pairs past the last block zero.
  constexpr std::int64_t kPairs = 16;
  const std::int64_t blocks = (N + 2 * kPairs - 1) / (2 * kPairs);
  const std::int64_t covered = std::min(Npairs, blocks * kPairs);
  // Unit-stride rows and a vector width that divides 16 (every table's): the fast path below.
  const kernel_table& kt = select_kernels();
  const bool fast = (s.sx == 1 || X <= 1) && kPairs % kt.W == 0;
  std::uint32_t bad = 0;  // (finite: a word with an inf or NaN seen)
#pragma omp parallel num_threads(nt) reduction(| : bad)  // (one region: waking the threads is a futex each)
  {
#pragma omp for schedule(static) nowait  // (the words past `covered`, which the blocks never write)
    for (std::int64_t col = 0; col < B * H * X; ++col)
      std::fill(r.data() + col * Npairs + covered, r.data() + (col + 1) * Npairs, 0u);
    words pair_rows(fast ? std::size_t(kPairs * X) : 0);
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
        // words stored in place.
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
          if (finite)
            for (std::int64_t x = 0; x < X; ++x) bad |= special_word(w[x]);
          row_ptrs[i] = w;
        }
        kt.lane_words(row_ptrs, kPairs, kPairs, X, o, Npairs);
        continue;
      }
      for (std::int64_t i = 0; i < np; ++i) {  // pair by pair: its two rows read in order
        const std::uint16_t *r0 = rows[2 * i], *r1 = rows[2 * i + 1];
        const std::int64_t s0 = step[2 * i], s1 = step[2 * i + 1];
        for (std::int64_t x = 0; x < X; ++x) {
          const std::uint32_t w = std::uint32_t(r0[x * s0]) | std::uint32_t(r1[x * s1]) << 16;
          o[x * Npairs + i] = w;
          bad |= special_word(w);
        }
      }
    }
  }
  if (finite) *finite = bad == 0;
  return r;
}

bool bf16_all_finite(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int nt) {
  // The largest exponent field of each row (an all-ones one: inf or NaN), in 16 bits: vpmaxuw
  // over 32 values a vector, where a count widened to 64 bits took 8 a vector.
  std::uint16_t top = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(max : top)
  for (std::int64_t row = 0; row < B * H * N; ++row) {
    const std::int64_t n = row % N, h = row / N % H, b = row / N / H;
    const std::uint16_t* p = s.ptr<std::uint16_t>(b, h, n, 0);
    std::uint16_t m = 0;
    if (s.sx == 1)  // (vectorised)
      for (std::int64_t x = 0; x < X; ++x) m = std::max<std::uint16_t>(m, p[x] & 0x7f80u);
    else
      for (std::int64_t x = 0; x < X; ++x) m = std::max<std::uint16_t>(m, p[x * s.sx] & 0x7f80u);
    top = std::max(top, m);
  }
  return top != 0x7f80u;
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

// src/cpu/mask_fill.cc — see mask_fill.h.
#include "cpu/mask_fill.h"

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string_view>

#include "core/common.h"

namespace attn::detail {
namespace {

constexpr float kInfF = std::numeric_limits<float>::infinity();

// Row spans of a bool mask: bytes are 0 or 1, scanned eight at a time.
void bool_row_span(const std::uint8_t* s, std::int64_t n, std::int64_t& lo, std::int64_t& hi, std::uint8_t& whole) {
  auto word = [&](std::int64_t j) {
    std::uint64_t w;
    std::memcpy(&w, s + j, 8);
    return w;
  };
  std::int64_t a = 0, e = n;
  while (a + 8 <= n && word(a) == 0) a += 8;
  while (a < n && !s[a]) ++a;
  while (e - 8 >= a && word(e - 8) == 0) e -= 8;
  while (e > a && !s[e - 1]) --e;
  lo = a < n ? a : 0, hi = a < n ? e : 0;
  // A zero byte inside [a, e): a word with a zero byte has (w - 0x01..) & ~w & 0x80.. set.
  constexpr std::uint64_t kOnes = 0x0101010101010101ull, kHigh = 0x8080808080808080ull;
  bool hole = false;
  std::int64_t j = a;
  for (; j + 8 <= e && !hole; j += 8) {
    const std::uint64_t w = word(j);
    hole = ((w - kOnes) & ~w & kHigh) != 0;
  }
  for (; j < e && !hole; ++j) hole = !s[j];
  whole = !hole;
}

void f32_row_span(const float* s, std::int64_t n, std::int64_t& lo, std::int64_t& hi, std::uint8_t& whole) {
  // Sixteen at a time (loops without an early exit, which the compiler vectorises), then one.
  auto all_excluded = [&](std::int64_t j) {
    bool all = true;
    for (int x = 0; x < 16; ++x) all &= s[j + x] == -kInfF;
    return all;
  };
  std::int64_t a = 0, e = n;
  while (a + 16 <= n && all_excluded(a)) a += 16;
  while (a < n && s[a] == -kInfF) ++a;
  while (e - 16 >= a && all_excluded(e - 16)) e -= 16;
  while (e > a && s[e - 1] == -kInfF) --e;
  lo = a < n ? a : 0, hi = a < n ? e : 0;
  bool nonzero = false;  // NaN counts as nonzero
  for (std::int64_t j = a; j < e; ++j) nonzero |= !(s[j] == 0.0f);
  whole = !nonzero;
}

}  // namespace

mask_spans find_mask_spans(const problem& p, int nt) {
  mask_spans r;
  const strided4& m = p.mask_view;
  const bool is_bool = p.mask == mask_kind::boolean;
  if (p.mask == mask_kind::none || m.sx != 1 || !(is_bool || m.type == dtype::f32) || p.mask_cols <= 0) return r;
  // ATTN_MASK_SPANS=0: none (every tile read from the mask; tests compare the two bitwise).
  if (const char* env = std::getenv("ATTN_MASK_SPANS"); env && std::string_view(env) == "0") return r;
  const std::int64_t Bm = m.sb ? p.B : 1, Hm = m.sh ? p.Hq : 1, Nm = m.sn ? p.Nq : 1, rows = Bm * Hm * Nm;
  r.sn = Nm > 1 ? 1 : 0, r.sh = Hm > 1 ? Nm : 0, r.sb = Bm > 1 ? Hm * Nm : 0;
  r.lo.resize(std::size_t(rows)), r.hi.resize(std::size_t(rows)), r.whole.resize(std::size_t(rows));
  const std::int64_t cols = p.mask_cols;
  // One wake of the worker threads costs 50-60 µs on a quiet VM: small masks on this thread.
  const int threads = rows * cols < (std::int64_t(1) << 18) ? 1 : nt;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t x = 0; x < rows; ++x) {
    const std::int64_t b = x / (Hm * Nm), h = x / Nm % Hm, i = x % Nm;
    const std::size_t at = std::size_t(x);
    if (is_bool)
      bool_row_span(static_cast<const std::uint8_t*>(m.data) + m.offset(b, h, i, 0), cols, r.lo[at], r.hi[at], r.whole[at]);
    else
      f32_row_span(static_cast<const float*>(m.data) + m.offset(b, h, i, 0), cols, r.lo[at], r.hi[at], r.whole[at]);
  }
  return r;
}

cpu::mask_tile_kind fill_bias(const void* vctx, std::int64_t j0, std::int64_t nb, float* tile, std::int64_t rs, std::int64_t ks) {
  using namespace cpu;
  const bias_ctx& c = *static_cast<const bias_ctx*>(vctx);
  const strided4& m = c.p->mask_view;
  const std::int64_t cols = c.p->mask_cols;
  // From the spans, without reading the mask: no row keeps a key of the tile, or every row keeps
  // every key with bias 0. The tile is written all the same (kernels that may not skip read it).
  if (c.spans && !c.spans->empty()) {
    const mask_spans& sp = *c.spans;
    const std::int64_t j1 = j0 + nb;
    bool excluded = true, zeros = true;
    for (std::int64_t r = 0; r < c.valid && (excluded || zeros); ++r) {
      const std::size_t x = std::size_t(c.b * sp.sb + c.h[r] * sp.sh + c.i[r] * sp.sn);
      const std::int64_t lo = sp.lo[x], hi = sp.hi[x];
      excluded = excluded && !(lo < j1 && hi > j0);
      zeros = zeros && sp.whole[x] && lo <= j0 && j1 <= hi;
    }
    if (zeros || excluded) {
      // In the order of memory: the lane layout (row stride 1) key by key, else row by row.
      const std::int64_t hidden = zeros ? 0 : c.valid;  // rows written -inf
      if (rs == 1) {
        for (std::int64_t jj = 0; jj < nb; ++jj) {
          float* t = tile + jj * ks;
          std::fill(t, t + hidden, -kInfF);
          std::fill(t + hidden, t + c.total, 0.0f);
        }
      } else {
        for (std::int64_t r = 0; r < c.total; ++r) {
          const float value = r < hidden ? -kInfF : 0.0f;
          float* t = tile + r * rs;
          if (ks == 1) {
            std::fill(t, t + nb, value);
          } else {
            for (std::int64_t jj = 0; jj < nb; ++jj) t[jj * ks] = value;
          }
        }
      }
      return zeros ? mask_tile_kind::zeros : mask_tile_kind::excluded;
    }
  }
  // bool and f32 masks with unit key stride: the ISA's vectorised fill, from the rows' addresses.
  constexpr std::int64_t kMaxRows = 64;
  const bool is_bool = c.p->mask == mask_kind::boolean;
  if ((is_bool || m.type == dtype::f32) && m.sx == 1 && c.total <= kMaxRows && c.kt && c.kt->mask_tile) {
    const void* rows[kMaxRows];
    const std::size_t esize = is_bool ? sizeof(bool) : sizeof(float);
    for (std::int64_t r = 0; r < c.valid; ++r)
      rows[r] = static_cast<const char*>(m.data) + std::size_t(m.offset(c.b, c.h[r], c.i[r], j0)) * esize;
    return c.kt->mask_tile(mask_rows{rows, is_bool, c.total, c.valid, cols - j0}, nb, tile, rs, ks);
  }
  for (std::int64_t r = 0; r < c.total; ++r) {
    float* t = tile + r * rs;
    if (r >= c.valid) {
      for (std::int64_t jj = 0; jj < nb; ++jj) t[jj * ks] = 0.0f;
      continue;
    }
    // The rest (strided keys, f16/bf16/f64 masks, blocks of more rows): columns past the mask
    // are padding (also outside key_range), one loop per kind and dtype.
    const std::int64_t base = m.offset(c.b, c.h[r], c.i[r], j0), n = std::clamp<std::int64_t>(cols - j0, 0, nb);
    if (n > 0 && c.p->mask == mask_kind::boolean) {
      const bool* s = static_cast<const bool*>(m.data) + base;
      for (std::int64_t jj = 0; jj < n; ++jj) t[jj * ks] = s[jj * m.sx] ? 0.0f : -kInfF;
    } else if (n > 0 && m.type == dtype::f32) {
      const float* s = static_cast<const float*>(m.data) + base;
      for (std::int64_t jj = 0; jj < n; ++jj) t[jj * ks] = s[jj * m.sx];
    } else {
      for (std::int64_t jj = 0; jj < n; ++jj) t[jj * ks] = float(load_as_double(m.data, m.type, base + jj * m.sx));
    }
    for (std::int64_t jj = n; jj < nb; ++jj) t[jj * ks] = -kInfF;
  }
  return mask_tile_kind::mixed;
}

}  // namespace attn::detail

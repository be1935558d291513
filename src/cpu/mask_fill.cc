// src/cpu/mask_fill.cc — see mask_fill.h.
#include "cpu/mask_fill.h"

#include <algorithm>
#include <cstddef>
#include <limits>

#include "core/common.h"

namespace attn::detail {
namespace {
constexpr float kInfF = std::numeric_limits<float>::infinity();
}  // namespace

cpu::mask_tile_kind fill_bias(const void* vctx, std::int64_t j0, std::int64_t nb, float* tile, std::int64_t rs, std::int64_t ks) {
  using namespace cpu;
  const bias_ctx& c = *static_cast<const bias_ctx*>(vctx);
  const strided4& m = c.p->mask_view;
  const std::int64_t cols = c.p->mask_cols;
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

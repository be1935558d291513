// src/cpu/rows.cc — store_row (rows.h), built for baseline x86-64.
#include "cpu/rows.h"

#include <cstring>

#include "core/common.h"

namespace attn::detail::cpu {

void store_row(const strided4& t, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X, const float* src,
               std::int64_t src_stride, float mul) {
  if (t.type == dtype::f32) {
    float* d = t.ptr<float>(b, h, n, 0);
    if (t.sx == 1 && src_stride == 1)  // (vectorised)
      for (std::int64_t x = 0; x < X; ++x) d[x] = src[x] * mul;
    else
      for (std::int64_t x = 0; x < X; ++x) d[x * t.sx] = src[x * src_stride] * mul;
  } else if (t.type == dtype::bf16) {
    std::uint16_t* d = t.ptr<std::uint16_t>(b, h, n, 0);
    if (t.sx == 1 && src_stride == 1) {  // f32_to_bf16 without a branch (vectorised)
      for (std::int64_t x = 0; x < X; ++x) {
        std::uint32_t u;
        const float f = src[x] * mul;
        std::memcpy(&u, &f, 4);
        const std::uint32_t nan = (u >> 16) | 0x40u, even = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        d[x] = std::uint16_t((u & 0x7fffffffu) > 0x7f800000u ? nan : even);
      }
      return;
    }
    for (std::int64_t x = 0; x < X; ++x) d[x * t.sx] = f32_to_bf16(src[x * src_stride] * mul);
  } else if (t.type == dtype::f16) {
    std::uint16_t* d = t.ptr<std::uint16_t>(b, h, n, 0);
    for (std::int64_t x = 0; x < X; ++x) d[x * t.sx] = f32_to_f16(src[x * src_stride] * mul);
  } else {
    for (std::int64_t x = 0; x < X; ++x) t.store(b, h, n, x, double(src[x * src_stride] * mul));
  }
}

}  // namespace attn::detail::cpu

// src/cpu/rows.h — writing kernel results back to strided outputs: one row of floats (store_row),
// the columns of a transposed block [X][ld] to their rows (store_lane_rows: the forward's output
// and dq by lanes, the backward's dk/dv by keys, the family's rows), and rows to rows
// (store_rows: decode's). One copy for the core op's driver (cpu_backend.cc) and the family's
// (fused.cc).
#pragma once

#include <cstdint>

#include "core/problem.h"
#include "cpu/kernels.h"

namespace attn::detail::cpu {

// X floats src[x · src_stride] times mul to row (b, h, n) of t, of any float dtype (bf16 and f16
// rounded from the float32 product, nearest even).
void store_row(const strided4& t, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X, const float* src,
               std::int64_t src_stride, float mul);

// The most columns one store_lane_rows call hands to the register transposes (more take store_row).
inline constexpr std::int64_t kMaxStoreRows = 128;

// Column x < nl of xt [X][ld] (Lanes) or row x of it (X floats at xt + x·ld) times mul[x] to row
// row_of(x) = (h, n) of t (batch b): unit-stride float32 and bfloat16 rows by the kernels' stores
// (kt.store_lanes through W × W register transposes, kt.store_rows without: the same bits as
// store_row's), other views by store_row. Returns the columns x < 64 whose row got a non-finite
// value, as written — every column where it did not look (store_row's paths).
template <bool Lanes, class RowOf>
std::uint64_t store_out_rows(const kernel_table& kt, const strided4& t, std::int64_t b, std::int64_t nl, std::int64_t X,
                             const float* xt, std::int64_t ld, const float* mul, RowOf row_of) {
  if ((t.type == dtype::f32 || t.type == dtype::bf16) && (t.sx == 1 || X <= 1) && nl <= kMaxStoreRows &&
      (!Lanes || ld % kt.W == 0)) {
    void* rows[kMaxStoreRows];
    for (std::int64_t x = 0; x < nl; ++x) {
      const auto [h, n] = row_of(x);
      rows[x] = t.type == dtype::f32 ? static_cast<void*>(t.ptr<float>(b, h, n, 0))
                                     : static_cast<void*>(t.ptr<std::uint16_t>(b, h, n, 0));
    }
    const bool bf16 = t.type == dtype::bf16;
    return Lanes ? kt.store_lanes(xt, ld, nl, X, mul, rows, bf16) : kt.store_rows(xt, ld, nl, X, mul, rows, bf16);
  }
  for (std::int64_t x = 0; x < nl; ++x) {
    const auto [h, n] = row_of(x);
    store_row(t, b, h, n, X, Lanes ? xt + x : xt + x * ld, Lanes ? ld : 1, mul[x]);
  }
  return ~std::uint64_t(0);
}
// The forward's output and dq by lanes, the backward's dk/dv by keys, the family's rows.
template <class RowOf>
std::uint64_t store_lane_rows(const kernel_table& kt, const strided4& t, std::int64_t b, std::int64_t nl,
                              std::int64_t X, const float* xt, std::int64_t ld, const float* mul, RowOf row_of) {
  return store_out_rows<true>(kt, t, b, nl, X, xt, ld, mul, row_of);
}
// Decode's rows (forward_io::rows).
template <class RowOf>
std::uint64_t store_rows(const kernel_table& kt, const strided4& t, std::int64_t b, std::int64_t nl, std::int64_t X,
                         const float* o, std::int64_t ld, const float* mul, RowOf row_of) {
  return store_out_rows<false>(kt, t, b, nl, X, o, ld, mul, row_of);
}

}  // namespace attn::detail::cpu

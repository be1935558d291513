// src/cpu/mask_fill.h — the mask bias of a tile (the kernels' bias_fn, kernels.h) from a
// problem's attn_mask view, for the cpu backend's driver and the fused family's: the rows'
// addresses are found here, the values written by the ISA's kernel_table::mask_tile (bool and
// f32 masks with unit key stride) or by a scalar loop (other dtypes and strides).
#pragma once

#include <cstdint>
#include <vector>

#include "core/problem.h"
#include "cpu/kernels.h"

namespace attn::detail {

// The kept keys of each row of a bool or f32 mask with unit key stride, found once per call (one
// read of the mask) so that a tile no row keeps a key of, or whose every key every row keeps
// with bias 0, is known without reading the mask again — for a mask broadcast over heads (a
// causal [N, N] mask, padding [B, 1, 1, N]) the kernels otherwise read it once per head. Row
// (b, h, i) of the mask's own dims (a broadcast dim has one row): keys outside [lo, hi) are
// excluded (false / -inf, or past mask_cols); whole: every key of [lo, hi) is kept with bias 0.
struct mask_spans {
  std::int64_t sb = 0, sh = 0, sn = 0;  // row index = b·sb + h·sh + i·sn
  std::vector<std::int64_t> lo, hi;
  std::vector<std::uint8_t> whole;
  bool empty() const { return lo.empty(); }
};
// The spans of p's mask (empty for other dtypes, strided keys, no mask, or ATTN_MASK_SPANS=0),
// with nt threads.
mask_spans find_mask_spans(const problem& p, int nt);

// Rows r < total of a tile are query i[r] of head h[r] in batch b; rows >= valid are padding
// (bias 0); mask columns past problem::mask_cols are -inf (a short mask is padded, as ONNX does).
struct bias_ctx {
  const problem* p = nullptr;
  const cpu::kernel_table* kt = nullptr;  // whose mask_tile to use (null: the scalar loop)
  std::int64_t b = 0, valid = 0, total = 0;
  const std::int64_t* h = nullptr;
  const std::int64_t* i = nullptr;
  const mask_spans* spans = nullptr;  // when set and not empty: tiles it classifies are not read
};

// A cpu::bias_fn over a bias_ctx.
cpu::mask_tile_kind fill_bias(const void* ctx, std::int64_t j0, std::int64_t nb, float* tile, std::int64_t row_stride,
                              std::int64_t key_stride);

}  // namespace attn::detail

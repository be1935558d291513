// src/cpu/mask_fill.h — the mask bias of a tile (the kernels' bias_fn, kernels.h) from a
// problem's attn_mask view, for the cpu backend's driver and the fused family's: the rows'
// addresses are found here, the values written by the ISA's kernel_table::mask_tile (bool and
// f32 masks with unit key stride) or by a scalar loop (other dtypes and strides).
#pragma once

#include <cstdint>

#include "core/problem.h"
#include "cpu/kernels.h"

namespace attn::detail {

// Rows r < total of a tile are query i[r] of head h[r] in batch b; rows >= valid are padding
// (bias 0); mask columns past problem::mask_cols are -inf (a short mask is padded, as ONNX does).
struct bias_ctx {
  const problem* p = nullptr;
  const cpu::kernel_table* kt = nullptr;  // whose mask_tile to use (null: the scalar loop)
  std::int64_t b = 0, valid = 0, total = 0;
  const std::int64_t* h = nullptr;
  const std::int64_t* i = nullptr;
};

// A cpu::bias_fn over a bias_ctx.
cpu::mask_tile_kind fill_bias(const void* ctx, std::int64_t j0, std::int64_t nb, float* tile, std::int64_t row_stride,
                              std::int64_t key_stride);

}  // namespace attn::detail

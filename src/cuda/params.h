// src/cuda/params.h — what the cuda kernels receive: the validated problem (src/core/problem.h)
// as plain values and device pointers, and the launchers the host driver (cuda_backend.cc) calls.
// Plain C++: included by the .cu files (nvcc) and by the driver (the host compiler).
#pragma once

#include <cstdint>

namespace attn::detail::cuda {

enum class elem { f16, bf16 };

// One attention problem on the device. Tensors are [B, H, N, X] with unit stride along X and the
// element strides below (multiples of 8, 16-byte aligned rows: the kernels copy 16 bytes at a time).
struct dev_problem {
  int B = 0, Hq = 0, Hkv = 0, Nq = 0, Nk = 0, D = 0, Dv = 0;
  elem type = elem::bf16;
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  std::int64_t q_sb = 0, q_sh = 0, q_sn = 0;
  std::int64_t k_sb = 0, k_sh = 0, k_sn = 0;
  std::int64_t v_sb = 0, v_sh = 0, v_sn = 0;

  float scale = 1.0f, softcap = 0.0f;  // softcap <= 0: off
  // problem::query_pos: 0 top_left, 1 bottom_right, 2 after_past (past_len, or past_lens[b])
  int causal = 0, alignment = 0;
  std::int64_t past_len = 0;
  const std::int64_t* past_lens = nullptr;  // device [B] or null
  std::int64_t window_left = -1, window_right = -1;
  const std::int64_t* kv_len = nullptr;  // device [B] or null

  // Mask as f32 (a bool mask's false is -inf), element (b, h, i, j) at mask[b·m_sb + h·m_sh +
  // i·m_sn + j]; columns j >= mask_cols are excluded. Null: no mask.
  const float* mask = nullptr;
  std::int64_t m_sb = 0, m_sh = 0, m_sn = 0, mask_cols = 0;
  const float* alibi = nullptr;  // device [B·Hq] or null
  const float* sinks = nullptr;  // device [Hq] or null
  // The decode swap (launch_forward): > 0 when the rows of head h are the query heads
  // h·row_heads + i of a GQA group (their sink is sinks[h·row_heads + i]).
  int row_heads = 0;
};

// Forward outputs: out [B, Hq, Nq, Dv] (the input type) with the strides below, lse f32
// contiguous [B, Hq, Nq]. The launcher sets the rest: split-KV's split count, key blocks per
// split and float32 scratch (part_out [splits, B, Hq, Nq, Dv], part_lse [splits, B, Hq, Nq]).
struct dev_forward {
  void* out = nullptr;
  std::int64_t o_sb = 0, o_sh = 0, o_sn = 0;
  float* lse = nullptr;
  int splits = 1, split_blocks = 0;
  float *part_out = nullptr, *part_lse = nullptr;
};

// Backward: out, dout [B, Hq, Nq, Dv] and lse as saved by the forward; dq, dk, dv written (not
// accumulated) in the input type. delta: f32 scratch [B·Hq·Nq]. dalibi_part / dsinks_part: f32
// scratch [B·Hq·q_blocks(Nq)] receiving one partial sum per block (the driver adds them in a
// fixed order), null when not requested.
struct dev_backward {
  const void *out = nullptr, *dout = nullptr;
  std::int64_t o_sb = 0, o_sh = 0, o_sn = 0, do_sb = 0, do_sh = 0, do_sn = 0;
  const float* lse = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  std::int64_t dq_sb = 0, dq_sh = 0, dq_sn = 0, dk_sb = 0, dk_sh = 0, dk_sn = 0, dv_sb = 0, dv_sh = 0, dv_sn = 0;
  float* delta = nullptr;
  float* dalibi_part = nullptr;
  float* dsinks_part = nullptr;
};

// The head size the kernels are compiled for that holds max(D, Dv): 64, 128 or 256 (96 runs
// as 128 with zero columns); 0 when above 256.
int padded_head_size(int D, int Dv);
// Dynamic shared memory per block of the kernels for a padded head size (the largest of the
// forward's, or of the backward's kernels): D = 256 needs more than sm_80's 163 KB.
int shared_bytes(int padded_d, bool backward);
// How the forward runs a problem. Split-KV (FlashDecoding) is for grids too small to fill the
// device, decode above all (Nq = 1: B·Hq blocks of one live row each): the keys of each 64-row
// query block are cut into `splits` runs of `split_blocks` whole 64-key blocks, each run a block
// of its own, and a combine kernel merges the runs by their lse. The grid aims at two blocks per
// SM (the 64-row kernel's residency), with at least 4 key blocks (256 keys) per split, 128 splits
// at most. ATTN_CUDA_SPLITS=n forces n splits (up to 128) wherever there are n key blocks (1: never split);
// the GPU check runs every sweep so.
// The decode swap (FlashAttention-2's, for one query row and GQA), row_heads = the group size:
// with Nq = 1 and nothing that tells the group's query heads apart but their q (no mask, ALiBi or
// window; causal only bottom-right, which keeps every key), the group's heads become the rows of
// one query block over their shared K/V head — q's and out's head stride is the row stride, and
// lse [B, Hq, 1] is already [B, Hkv, group] — so K/V are read once per group and `group` rows of
// the block are live instead of one. Taken with split-KV only.
struct forward_plan {
  int splits = 1, split_blocks = 0, row_heads = 0;
};
// Reads the problem's sizes and which options are set (mask and alibi as null or not), no data.
forward_plan plan_forward(const dev_problem& p);
// Query rows per block of the dq kernel (the unit of dalibi_part / dsinks_part).
constexpr int kBackwardQueryBlock = 64;

// Launchers (on the default stream; they return the launch's cudaError_t as an int).
int launch_forward(const dev_problem& p, const dev_forward& f);
int launch_backward(const dev_problem& p, const dev_backward& g);

}  // namespace attn::detail::cuda

// src/cuda/flash.cuh — the cuda kernels: FlashAttention-2's tiling on mma.sync m16n8k16 tensor
// cores (f16 or bf16 operands, f32 accumulation), written once for both types and for head sizes
// kD = 64, 128, 256 (smaller D run with zero columns).
//
// Fragment layouts (PTX ISA, mma.m16n8k16; g = lane / 4, t = lane % 4):
//   A 16×16 (row-major): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B 16×8  (k × n):     b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C 16×8 f32:          c0 c1 (g, 2t..2t+1)   c2 c3 (g+8, 2t..2t+1)
// so two C tiles side by side are, rounded to 16 bits, the A fragment of the next product (P·V,
// dS·K) without passing through shared memory. ldmatrix (.x4, .trans) fills A and B fragments
// from shared tiles [rows][kD + 8] (the 16-byte pad puts the 8 rows an 8×8 load reads in
// different banks).
//
// Forward: one block of 4 warps per (64 query rows, q head, batch); each warp owns 16 rows and
// keeps its S tile, row max, row sum and O accumulator in registers (online softmax); K/V tiles
// of 64 keys are double-buffered with cp.async. Backward (deterministic, no atomics): delta =
// rowsum(dO ∘ O); a dk/dv kernel per (64 keys, kv head, batch) that walks the group's query
// heads and query blocks (S and dP recomputed transposed, so Pᵀ and dSᵀ are A fragments); a dq
// kernel per (64 query rows, q head, batch) that also writes per-block partial sums of the
// ALiBi and sink gradients.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "cuda/params.h"

namespace attn::detail::cuda {

constexpr float kInf = __builtin_huge_valf();
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// 2^x (MUFU.EX2; 2^-inf = 0). The softmax runs in base 2: scores times log2(e), the lse back in base e.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The kernels' plain instantiation (kPlain): scores are q·k · scale alone (no softcap, mask or ALiBi;
// causal, windows, kv lengths and sinks still apply) and D = Dv = kD, so no product stops early and
// the score of an element is one multiply. The other instantiation takes every option.
inline bool plain_scores(const dev_problem& p, int kD) {
  return !(p.softcap > 0.0f) && !p.mask && !p.alibi && p.D == kD && p.Dv == kD;
}

// ---- tensor-core and copy primitives ----

template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1);

template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                                   std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                            std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats rounded to the 16-bit type, the first in the low half (the lower column).
template <class T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ std::uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  std::uint32_t r;
  std::memcpy(&r, &v, 4);
  return r;
}
template <>
__device__ __forceinline__ std::uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  std::uint32_t r;
  std::memcpy(&r, &v, 4);
  return r;
}
template <class T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }

__device__ __forceinline__ std::uint32_t smem_addr(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm4t(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Shared tile [kRows][kD + 8] ← rows [0, rows) and columns [0, cols) of a global [N, ·] view with
// row stride sn; the rest zero. cols is a multiple of 8.
template <int kRows, int kD, class T>
__device__ __forceinline__ void load_tile(T* tile, const T* src, std::int64_t sn, int rows, int cols) {
  constexpr int kS = kD + 8, kChunks = kD / 8;
  for (int c = threadIdx.x; c < kRows * kChunks; c += blockDim.x) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    T* dst = tile + r * kS + col;
    if (r < rows && col < cols)
      cp_async16(dst, src + r * sn + col);
    else
      *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// Fragment addresses in a shared tile of row stride kS (elements), for this lane
// (m = lane / 8 picks the 8×8 matrix, r = lane % 8 its row):
//   a_at: the A fragment of rows [row0, +16) × k [k0, +16)                       (ldsm4)
//   bn_at: B fragments of two n-tiles [n0, +16) × k [k0, +16), tile rows = n    (ldsm4)
//   bk_at: B fragments of k [k0, +16) × two n-tiles [n0, +16), tile rows = k    (ldsm4t)
template <int kS, class T>
__device__ __forceinline__ const T* a_at(const T* tile, int row0, int k0, int lane) {
  const int m = lane >> 3, r = lane & 7;
  return tile + (row0 + (m & 1) * 8 + r) * kS + k0 + (m >> 1) * 8;
}
template <int kS, class T>
__device__ __forceinline__ const T* bn_at(const T* tile, int n0, int k0, int lane) {
  const int m = lane >> 3, r = lane & 7;
  return tile + (n0 + (m >> 1) * 8 + r) * kS + k0 + (m & 1) * 8;
}
template <int kS, class T>
__device__ __forceinline__ const T* bk_at(const T* tile, int k0, int n0, int lane) {
  const int m = lane >> 3, r = lane & 7;
  return tile + (k0 + (m & 1) * 8 + r) * kS + n0 + (m >> 1) * 8;
}

// The two product shapes of the kernels, for one warp's 16 rows:
//   mma_rows_rows: acc (16 × 8·N) += A (shared rows [row0, +16), k < kmax) · B, B's tile rows being
//                  its n (S = Q Kᵀ, dP = dO Vᵀ and their transposes);
//   mma_acc_rows:  acc (16 × 8·N) += C (accumulator tiles rounded to T, the k axis) · B, B's tile
//                  rows being its k, columns n < nmax (O += P V, dQ += dS K, dV += Pᵀ dO, dK += dSᵀ Q).
template <class T, int kS, int kK, int N>
__device__ __forceinline__ void mma_rows_rows(float (&acc)[N][4], const T* sA, int row0, const T* sB, int kmax,
                                              int lane) {
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    if (ks * 16 >= kmax) break;
    std::uint32_t a[4];
    ldsm4(a, a_at<kS>(sA, row0, ks * 16, lane));
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
      std::uint32_t bb[4];
      ldsm4(bb, bn_at<kS>(sB, np * 16, ks * 16, lane));
      mma<T>(acc[2 * np], a, bb[0], bb[1]);
      mma<T>(acc[2 * np + 1], a, bb[2], bb[3]);
    }
  }
}
template <class T, int kS, int NK, int N>
__device__ __forceinline__ void mma_acc_rows(float (&acc)[N][4], const float (&c)[NK][4], const T* sB, int nmax,
                                             int lane) {
#pragma unroll
  for (int kk = 0; kk < NK / 2; ++kk) {
    const std::uint32_t a[4] = {pack2<T>(c[2 * kk][0], c[2 * kk][1]), pack2<T>(c[2 * kk][2], c[2 * kk][3]),
                                pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]),
                                pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3])};
#pragma unroll
    for (int dd = 0; dd < N / 2; ++dd) {
      if (dd * 16 >= nmax) break;
      std::uint32_t bb[4];
      ldsm4t(bb, bk_at<kS>(sB, kk * 16, dd * 16, lane));
      mma<T>(acc[2 * dd], a, bb[0], bb[1]);
      mma<T>(acc[2 * dd + 1], a, bb[2], bb[3]);
    }
  }
}
// The wide blocks' shapes (two or more m-tiles of 16 rows per warp, rows row0 + 64·t): each B
// fragment read from shared memory feeds the kT m-tiles.
//   mma_rows_rows_wide: acc[t] (16 × 8·N) += A (shared rows) · B, B's tile rows being its n;
//   mma_acc_rows_wide:  acc[t] (16 × 8·N) += C[t] (accumulator tiles rounded to T) · B, B's tile
//                       rows being its k.
template <class T, int kS, int kK, int kT, int N>
__device__ __forceinline__ void mma_rows_rows_wide(float (&acc)[kT][N][4], const T* sA, int row0, const T* sB,
                                                   int lane) {
#pragma unroll
  for (int ks = 0; ks < kK / 16; ++ks) {
    std::uint32_t a[kT][4];
#pragma unroll
    for (int t = 0; t < kT; ++t) ldsm4(a[t], a_at<kS>(sA, t * 64 + row0, ks * 16, lane));
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
      std::uint32_t bb[4];
      ldsm4(bb, bn_at<kS>(sB, np * 16, ks * 16, lane));
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        mma<T>(acc[t][2 * np], a[t], bb[0], bb[1]);
        mma<T>(acc[t][2 * np + 1], a[t], bb[2], bb[3]);
      }
    }
  }
}
template <class T, int kS, int kT, int NK, int N>
__device__ __forceinline__ void mma_acc_rows_wide(float (&acc)[kT][N][4], const float (&c)[kT][NK][4], const T* sB,
                                                  int lane) {
#pragma unroll
  for (int kk = 0; kk < NK / 2; ++kk) {
    std::uint32_t a[kT][4];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      a[t][0] = pack2<T>(c[t][2 * kk][0], c[t][2 * kk][1]), a[t][1] = pack2<T>(c[t][2 * kk][2], c[t][2 * kk][3]);
      a[t][2] = pack2<T>(c[t][2 * kk + 1][0], c[t][2 * kk + 1][1]);
      a[t][3] = pack2<T>(c[t][2 * kk + 1][2], c[t][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dd = 0; dd < N / 2; ++dd) {
      std::uint32_t bb[4];
      ldsm4t(bb, bk_at<kS>(sB, kk * 16, dd * 16, lane));
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        mma<T>(acc[t][2 * dd], a[t], bb[0], bb[1]);
        mma<T>(acc[t][2 * dd + 1], a[t], bb[2], bb[3]);
      }
    }
  }
}
template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// ---- the problem's semantics (problem::key_range and problem::bias of src/core/problem.h) ----

__device__ __forceinline__ std::int64_t keys_valid(const dev_problem& p, int b) {
  return p.kv_len ? p.kv_len[b] : p.Nk;
}
__device__ __forceinline__ std::int64_t query_pos(const dev_problem& p, int b, std::int64_t i) {
  if (p.alignment == 1) return keys_valid(p, b) - p.Nq + i;
  if (p.alignment == 2) return (p.past_lens ? p.past_lens[b] : p.past_len) + i;
  return i;
}
// Keys [lo, hi) of query row i; lo >= hi: fully masked. Rows past Nq get an empty range.
__device__ __forceinline__ void key_range(const dev_problem& p, int b, std::int64_t i, int& lo, int& hi) {
  if (i >= p.Nq) {
    lo = hi = 0;
    return;
  }
  std::int64_t l = 0, h = keys_valid(p, b);
  if (p.causal || p.window_left >= 0 || p.window_right >= 0) {
    const std::int64_t pos = query_pos(p, b, i);
    if (p.causal) h = h < pos + 1 ? h : pos + 1;
    if (p.window_right >= 0) h = h < pos + p.window_right + 1 ? h : pos + p.window_right + 1;
    if (p.window_left >= 0) l = l > pos - p.window_left ? l : pos - p.window_left;
  }
  if (p.mask && h > p.mask_cols) h = p.mask_cols;
  if (h < l) h = l;
  lo = int(l), hi = int(h);
}

// The score of key j for query row i (inside its key range) from acc = q·k: scale, softcap,
// mask, ALiBi. *dfac receives d score / d acc (scale · (1 - tanh²) under softcap).
struct row_terms {
  const float* mask_row;  // null: no mask
  float slope;            // 0: no ALiBi
  std::int64_t pos;
};
__device__ __forceinline__ row_terms terms_of(const dev_problem& p, int b, int h, std::int64_t i) {
  row_terms t;
  t.mask_row = p.mask && i < p.Nq ? p.mask + b * p.m_sb + h * p.m_sh + i * p.m_sn : nullptr;
  t.slope = p.alibi ? p.alibi[b * p.Hq + h] : 0.0f;
  t.pos = i < p.Nq ? query_pos(p, b, i) : 0;
  return t;
}
__device__ __forceinline__ float score_of(const dev_problem& p, const row_terms& t, int j, float acc, float* dfac) {
  float x = acc * p.scale;
  if (p.softcap > 0.0f) {
    const float th = tanhf(x / p.softcap);
    x = p.softcap * th;
    if (dfac) *dfac = p.scale * (1.0f - th * th);
  } else if (dfac) {
    *dfac = p.scale;
  }
  if (t.mask_row) x += t.mask_row[j];
  if (p.alibi) {
    const std::int64_t d = t.pos - j;
    x -= t.slope * float(d < 0 ? -d : d);
  }
  return x;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Union [*kmin, *kmax) of the key ranges of rows [i0, i0 + rows), and whether every row holds all
// of [*kfull_lo, *kfull_hi) (blocks inside it need no range test). Block-wide; uses `cells`.
__device__ __forceinline__ void block_key_range(const dev_problem& p, int b, std::int64_t i0, int rows, int* cells,
                                                int& kmin, int& kmax, int& lo_max, int& hi_min) {
  if (threadIdx.x == 0) cells[0] = 0x7fffffff, cells[1] = 0, cells[2] = 0, cells[3] = 0x7fffffff;
  __syncthreads();
  for (int r = threadIdx.x; r < rows; r += blockDim.x) {
    int lo, hi;
    key_range(p, b, i0 + r, lo, hi);
    if (i0 + r >= p.Nq) continue;
    if (lo < hi) atomicMin(&cells[0], lo), atomicMax(&cells[1], hi);
    atomicMax(&cells[2], lo), atomicMin(&cells[3], hi);
  }
  __syncthreads();
  kmin = cells[0], kmax = cells[1], lo_max = cells[2], hi_min = cells[3];
  __syncthreads();
}

// The query rows [q0, q0 + rows) of (b, h) that a forward or dq block owns (64 rows, 16 a warp),
// the key blocks [jb0, jb1) of kN keys they reach, the bounds that let a key block skip the range
// test, and this thread's two rows (warp·16 + g and + 8): their key ranges and score terms.
struct query_block {
  int b, h, hk, rows, jb0, jb1, lo_max, hi_min;
  std::int64_t q0;
  int lo[2], hi[2];
  row_terms terms[2];
};
template <int kM, int kN>
__device__ __forceinline__ query_block own_rows(const dev_problem& p, int* cells, int qblock) {
  query_block q;
  q.b = blockIdx.z, q.h = blockIdx.y, q.hk = q.h / (p.Hq / p.Hkv);
  q.q0 = std::int64_t(qblock) * kM;
  q.rows = int(p.Nq - q.q0 < kM ? p.Nq - q.q0 : kM);
  int kmin, kmax;
  block_key_range(p, q.b, q.q0, q.rows, cells, kmin, kmax, q.lo_max, q.hi_min);
  q.jb0 = kmin / kN, q.jb1 = kmin < kmax ? (kmax + kN - 1) / kN : q.jb0;
  const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) >> 2;
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i = q.q0 + warp * 16 + g + 8 * r;
    key_range(p, q.b, i, q.lo[r], q.hi[r]);
    q.terms[r] = terms_of(p, q.b, q.h, i);
  }
  return q;
}

// K/V tiles of key block jb into buffer `buf` of the double buffer (cp.async, not committed).
template <int kN, int kD, class T>
__device__ __forceinline__ void load_kv(T* sK, T* sV, const T* K, const T* V, const dev_problem& p, int jb, int buf) {
  constexpr int kS = kD + 8;
  const int k0 = jb * kN;
  load_tile<kN, kD>(sK + buf * kN * kS, K + k0 * p.k_sn, p.k_sn, p.Nk - k0, p.D);
  load_tile<kN, kD>(sV + buf * kN * kS, V + k0 * p.v_sn, p.v_sn, p.Nk - k0, p.Dv);
}
// Before key block jb of [jb0, jb1): starts loading jb + 1 into the other buffer, waits for jb's
// tiles; returns jb's buffer.
template <int kN, int kD, class T>
__device__ __forceinline__ int next_kv(T* sK, T* sV, const T* K, const T* V, const dev_problem& p, int jb, int jb0,
                                       int jb1) {
  const int buf = (jb - jb0) & 1;
  if (jb + 1 < jb1) {
    load_kv<kN, kD>(sK, sV, K, V, p, jb + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
  } else {
    cp_async_wait<0>();
  }
  __syncthreads();
  return buf;
}

// The head whose sink row i of head h takes: h, or under the decode swap (row_heads > 0) the
// query head h·row_heads + i (rows past Nq clamped: their result is not stored).
__device__ __forceinline__ int sink_head(const dev_problem& p, int h, std::int64_t i) {
  return p.row_heads ? h * p.row_heads + int(i < p.Nq ? i : p.Nq - 1) : h;
}

// The end of a row's online softmax (base 2): m the running max, l this lane's part of Σ. The
// sink joins Σ, and the max when above it. out = O · inv; a row with no key gives inv = 0 and
// lse = -inf, or the sink's logit with a sink.
struct row_end {
  float inv, m, sum;
  __device__ float lse() const { return m == -kInf ? -kInf : (m + log2f(sum)) * kLn2; }
};
__device__ __forceinline__ row_end finish_row(const float* sinks, int h, float m, float l) {
  float sum = quad_sum(l), mm = m, keep = 1.0f;
  if (sinks) {
    const float sk = sinks[h] * kLog2e;
    if (sk != -kInf) {
      const float mf = fmaxf(mm, sk);
      keep = mm == -kInf ? 0.0f : ex2(mm - mf);
      sum = sum * keep + ex2(sk - mf);
      mm = mf;
    }
  }
  return {m == -kInf ? 0.0f : keep / sum, mm, sum};
}

// ---- forward ----

template <int kD>
constexpr int fwd_smem_bytes() {
  return (64 + 4 * 64) * (kD + 8) * 2;  // Q, then K and V double-buffered
}

template <class T, int kD, bool kPlain>
__global__ void __launch_bounds__(128) forward_kernel(const dev_problem p, const dev_forward f) {
  constexpr int kM = 64, kN = 64, kS = kD + 8;
  const int dmax = kPlain ? kD : p.D, vmax = kPlain ? kD : p.Dv;
  const float sl2 = p.scale * kLog2e;
  constexpr bool kQInRegs = kD <= 128;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int cells[4];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kM * kS;      // [2][kN][kS]
  T* sV = sK + 2 * kN * kS;  // [2][kN][kS]

  // Split-KV (f.splits > 1): blockIdx.x = query block · splits + split, and the block visits only
  // the split's key blocks [split · split_blocks, + split_blocks) of its range.
  const int split = f.splits > 1 ? int(blockIdx.x) % f.splits : 0;
  const query_block qb = own_rows<kM, kN>(p, cells, f.splits > 1 ? int(blockIdx.x) / f.splits : int(blockIdx.x));
  const int b = qb.b, h = qb.h, rows = qb.rows, lo_max = qb.lo_max, hi_min = qb.hi_min;
  int jb0 = qb.jb0, jb1 = qb.jb1;
  if (f.splits > 1) {
    jb0 = max(jb0, split * f.split_blocks), jb1 = min(jb1, (split + 1) * f.split_blocks);
    if (jb1 < jb0) jb1 = jb0;
  }
  const std::int64_t q0 = qb.q0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int(&lo)[2] = qb.lo, (&hi)[2] = qb.hi;
  const row_terms(&terms)[2] = qb.terms;
  const T* Q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + q0 * p.q_sn;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + qb.hk * p.k_sh;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + qb.hk * p.v_sh;

  float o[kD / 8][4];
  zero(o);
  float m[2] = {-kInf, -kInf}, l[2] = {0.0f, 0.0f};

  load_tile<kM, kD>(sQ, Q, p.q_sn, rows, p.D);
  if (jb0 < jb1) load_kv<kN, kD>(sK, sV, K, V, p, jb0, 0);
  cp_async_commit();

  std::uint32_t qf[kQInRegs ? kD / 16 : 1][4];
  // A warp whose 16 rows are all past Nq (decode: 3 of 4) only helps load K/V.
  const bool live = warp * 16 < rows;
  for (int jb = jb0; jb < jb1; ++jb) {
    const int buf = next_kv<kN, kD>(sK, sV, K, V, p, jb, jb0, jb1), k0 = jb * kN;
    if (!live) {
      __syncthreads();  // the other buffer is refilled next
      continue;
    }
    const T* sKb = sK + buf * kN * kS;
    const T* sVb = sV + buf * kN * kS;
    if constexpr (kQInRegs) {
      if (jb == jb0) {
#pragma unroll
        for (int ks = 0; ks < kD / 16; ++ks) ldsm4(qf[ks], a_at<kS>(sQ, warp * 16, ks * 16, lane));
      }
    }

    // S = Q Kᵀ for this warp's 16 rows × 64 keys.
    float s[kN / 8][4];
    zero(s);
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      if (ks * 16 >= dmax) break;
      std::uint32_t a[4];
      if constexpr (kQInRegs) {
        a[0] = qf[ks][0], a[1] = qf[ks][1], a[2] = qf[ks][2], a[3] = qf[ks][3];
      } else {
        ldsm4(a, a_at<kS>(sQ, warp * 16, ks * 16, lane));
      }
#pragma unroll
      for (int np = 0; np < kN / 16; ++np) {
        std::uint32_t bb[4];
        ldsm4(bb, bn_at<kS>(sKb, np * 16, ks * 16, lane));
        mma<T>(s[2 * np], a, bb[0], bb[1]);
        mma<T>(s[2 * np + 1], a, bb[2], bb[3]);
      }
    }

    // Scores in base 2 (times log2 e), then the online softmax of each row.
    const bool ranged = !(k0 >= lo_max && k0 + kN <= hi_min);
    float mx[2] = {m[0], m[1]};
    if (kPlain && !ranged) {
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[n][e] *= sl2;
          mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
        }
    } else {
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, j = k0 + n * 8 + 2 * t4 + (e & 1);
          const bool in = !ranged || (j >= lo[r] && j < hi[r]);
          const float x = !in ? -kInf : kPlain ? s[n][e] * sl2 : score_of(p, terms[r], j, s[n][e], nullptr) * kLog2e;
          s[n][e] = x;
          mx[r] = fmaxf(mx[r], x);
        }
    }
    float base[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = quad_max(mx[r]);
      base[r] = mx[r] == -kInf ? 0.0f : mx[r];
      const float alpha = ex2(m[r] - base[r]);
      m[r] = mx[r];
      l[r] *= alpha;
#pragma unroll
      for (int d = 0; d < kD / 8; ++d) o[d][2 * r] *= alpha, o[d][2 * r + 1] *= alpha;
    }
#pragma unroll
    for (int n = 0; n < kN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float pr = ex2(s[n][e] - base[e >> 1]);
        s[n][e] = pr;
        l[e >> 1] += pr;
      }

    mma_acc_rows<T, kS>(o, s, sVb, vmax, lane);  // O += P V
    __syncthreads();  // the other buffer is refilled next
  }
  cp_async_wait<0>();

  // out = O / Σ, lse = m + log Σ (base 2 until here). The sink joins Σ, and the max when above it:
  // a row with no key gives zeros, and lse = -inf, or the sink's logit with a sink. A split writes
  // its own out and lse in float32, without the sink (combine_kernel adds it once).
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i = q0 + warp * 16 + g + 8 * r;
    const row_end e = finish_row(f.splits > 1 ? nullptr : p.sinks, sink_head(p, h, i), m[r], l[r]);
    const float inv = e.inv;
    if (i >= p.Nq) continue;
    if (f.splits > 1) {
      const std::int64_t row = ((std::int64_t(split) * p.B + b) * p.Hq + h) * p.Nq + i;
      float* po = f.part_out + row * p.Dv;
#pragma unroll
      for (int d = 0; d < kD / 8; ++d) {
        const int col = d * 8 + 2 * t4;
        if (col < p.Dv) *reinterpret_cast<float2*>(po + col) = make_float2(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
      }
      if (t4 == 0) f.part_lse[row] = e.lse();
      continue;
    }
    T* out = static_cast<T*>(f.out) + b * f.o_sb + h * f.o_sh + i * f.o_sn;
#pragma unroll
    for (int d = 0; d < kD / 8; ++d) {
      const int col = d * 8 + 2 * t4;
      if (col < p.Dv)
        *reinterpret_cast<std::uint32_t*>(out + col) = pack2<T>(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    }
    if (t4 == 0) f.lse[(std::int64_t(b) * p.Hq + h) * p.Nq + i] = e.lse();
  }
}

// The plain forward (kPlain's scores) for D = Dv = kD <= 128: blocks of 128 query rows, each warp
// two m-tiles of 16 (rows warp·16 + 64·t), so each K and V fragment read from shared memory feeds
// four products instead of two, and each K/V tile serves twice the rows (FlashAttention-2's
// 128 × 64 tiles). Q is read from shared memory at each key block (its fragments would not fit in
// registers beside two O accumulators).
template <int kD>
constexpr int fwd_wide_smem_bytes() {
  return (128 + 4 * 64) * (kD + 8) * 2;  // Q, then K and V double-buffered
}

template <class T, int kD>
__global__ void __launch_bounds__(128) forward_wide_kernel(const dev_problem p, const dev_forward f) {
  constexpr int kM = 128, kN = 64, kS = kD + 8, kT = 2;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int cells[4];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sK = sQ + kM * kS;      // [2][kN][kS]
  T* sV = sK + 2 * kN * kS;  // [2][kN][kS]

  const int b = blockIdx.z, h = blockIdx.y, hk = h / (p.Hq / p.Hkv);
  const std::int64_t q0 = std::int64_t(blockIdx.x) * kM;
  const int rows = int(p.Nq - q0 < kM ? p.Nq - q0 : kM);
  int kmin, kmax, lo_max, hi_min;
  block_key_range(p, b, q0, rows, cells, kmin, kmax, lo_max, hi_min);
  const int jb0 = kmin / kN, jb1 = kmin < kmax ? (kmax + kN - 1) / kN : jb0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const float sl2 = p.scale * kLog2e;
  int lo[kT][2], hi[kT][2];
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) key_range(p, b, q0 + t * 64 + warp * 16 + g + 8 * r, lo[t][r], hi[t][r]);
  const T* Q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + q0 * p.q_sn;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + hk * p.v_sh;

  float o[kT][kD / 8][4];
  float m[kT][2], l[kT][2];
#pragma unroll
  for (int t = 0; t < kT; ++t) {
    zero(o[t]);
    m[t][0] = m[t][1] = -kInf;
    l[t][0] = l[t][1] = 0.0f;
  }

  load_tile<kM, kD>(sQ, Q, p.q_sn, rows, kD);
  if (jb0 < jb1) load_kv<kN, kD>(sK, sV, K, V, p, jb0, 0);
  cp_async_commit();

  for (int jb = jb0; jb < jb1; ++jb) {
    const int buf = next_kv<kN, kD>(sK, sV, K, V, p, jb, jb0, jb1), k0 = jb * kN;
    const T* sKb = sK + buf * kN * kS;
    const T* sVb = sV + buf * kN * kS;

    // S = Q Kᵀ: each K fragment serves both m-tiles.
    float s[kT][kN / 8][4];
#pragma unroll
    for (int t = 0; t < kT; ++t) zero(s[t]);
    mma_rows_rows_wide<T, kS, kD>(s, sQ, warp * 16, sKb, lane);

    // Scores in base 2, then the online softmax of each row.
    const bool ranged = !(k0 >= lo_max && k0 + kN <= hi_min);
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      float mx[2] = {m[t][0], m[t][1]};
      if (!ranged) {
#pragma unroll
        for (int n = 0; n < kN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[t][n][e] *= sl2;
            mx[e >> 1] = fmaxf(mx[e >> 1], s[t][n][e]);
          }
      } else {
#pragma unroll
        for (int n = 0; n < kN / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = e >> 1, j = k0 + n * 8 + 2 * t4 + (e & 1);
            const float x = j >= lo[t][r] && j < hi[t][r] ? s[t][n][e] * sl2 : -kInf;
            s[t][n][e] = x;
            mx[r] = fmaxf(mx[r], x);
          }
      }
      float base[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = quad_max(mx[r]);
        base[r] = mx[r] == -kInf ? 0.0f : mx[r];
        const float alpha = ex2(m[t][r] - base[r]);
        m[t][r] = mx[r];
        l[t][r] *= alpha;
#pragma unroll
        for (int d = 0; d < kD / 8; ++d) o[t][d][2 * r] *= alpha, o[t][d][2 * r + 1] *= alpha;
      }
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pr = ex2(s[t][n][e] - base[e >> 1]);
          s[t][n][e] = pr;
          l[t][e >> 1] += pr;
        }
    }

    mma_acc_rows_wide<T, kS>(o, s, sVb, lane);  // O += P V: each V fragment serves both m-tiles
    __syncthreads();  // the other buffer is refilled next
  }
  cp_async_wait<0>();

#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const row_end e = finish_row(p.sinks, h, m[t][r], l[t][r]);
      const float inv = e.inv;
      const std::int64_t i = q0 + t * 64 + warp * 16 + g + 8 * r;
      if (i >= p.Nq) continue;
      T* out = static_cast<T*>(f.out) + b * f.o_sb + h * f.o_sh + i * f.o_sn;
#pragma unroll
      for (int d = 0; d < kD / 8; ++d)
        *reinterpret_cast<std::uint32_t*>(out + d * 8 + 2 * t4) = pack2<T>(o[t][d][2 * r] * inv, o[t][d][2 * r + 1] * inv);
      if (t4 == 0) f.lse[(std::int64_t(b) * p.Hq + h) * p.Nq + i] = e.lse();
    }
}

// Split-KV's last step, one block of 128 threads a row (splits <= 128): each thread one split's
// lse, the block's max and Σ by shuffles, the weights in shared memory, then each thread two
// columns summed over the splits (float32 outs read coalesced). The sink joins the denominator
// once. A row with no key in any split (and no sink) gives zeros and lse = -inf; a NaN in a
// split's out or lse reaches the row (0 · NaN is NaN).
template <class T>
__global__ void __launch_bounds__(128) combine_kernel(const dev_problem p, const dev_forward f) {
  __shared__ float w[128], part_max[4], part_sum[4];
  __shared__ int part_nan[4];
  const std::int64_t rows = std::int64_t(p.B) * p.Hq * p.Nq, row = blockIdx.x;
  const int t = threadIdx.x, warp = t >> 5, lane = t & 31, h = int((row / p.Nq) % p.Hq);
  const std::int64_t b = row / (std::int64_t(p.Nq) * p.Hq), i = row % p.Nq;
  const float x = t < f.splits ? f.part_lse[t * rows + row] : -kInf;
  float mx = x;
  for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  const int nan_w = __any_sync(0xffffffffu, x != x);
  if (lane == 0) part_max[warp] = mx, part_nan[warp] = nan_w;
  __syncthreads();
  mx = fmaxf(fmaxf(part_max[0], part_max[1]), fmaxf(part_max[2], part_max[3]));
  const bool nan = part_nan[0] | part_nan[1] | part_nan[2] | part_nan[3];
  const float sk = p.sinks ? p.sinks[sink_head(p, h, i)] : -kInf;
  mx = fmaxf(mx, sk);
  const bool empty = mx == -kInf;
  const float base = empty ? 0.0f : mx;
  const float e = expf(x - base);  // 0 for t >= splits and empty splits, NaN for a NaN lse
  float sum = e;
  for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (lane == 0) part_sum[warp] = sum;
  __syncthreads();
  const float total = part_sum[0] + part_sum[1] + part_sum[2] + part_sum[3] + (sk == -kInf ? 0.0f : expf(sk - base));
  const float inv = empty ? 0.0f : 1.0f / total;
  w[t] = e * inv;
  __syncthreads();
  const int d = 2 * t;
  if (d < p.Dv) {
    float a0 = 0.0f, a1 = 0.0f;
    const float* src = f.part_out + row * p.Dv + d;
#pragma unroll 4
    for (int s = 0; s < f.splits; ++s) {
      const float2 v = *reinterpret_cast<const float2*>(src + s * rows * p.Dv);
      a0 += w[s] * v.x, a1 += w[s] * v.y;
    }
    T* out = static_cast<T*>(f.out) + b * f.o_sb + h * f.o_sh + i * f.o_sn;
    *reinterpret_cast<std::uint32_t*>(out + d) = pack2<T>(a0, a1);
  }
  if (t == 0) f.lse[row] = nan ? __int_as_float(0x7fffffff) : empty ? -kInf : base + logf(total);
}

// ---- backward ----

// delta[row] = Σ_d dO·O over the rows of [B, Hq, Nq]: one warp per row.
template <class T>
__global__ void delta_kernel(const dev_problem p, const dev_backward g) {
  const std::int64_t row = std::int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5);
  if (row >= std::int64_t(p.B) * p.Hq * p.Nq) return;
  const int lane = threadIdx.x & 31;
  const std::int64_t i = row % p.Nq, bh = row / p.Nq;
  const int h = int(bh % p.Hq), b = int(bh / p.Hq);
  const T* o = static_cast<const T*>(g.out) + b * g.o_sb + h * g.o_sh + i * g.o_sn;
  const T* d = static_cast<const T*>(g.dout) + b * g.do_sb + h * g.do_sh + i * g.do_sn;
  float acc = 0.0f;
  for (int x = lane; x < p.Dv; x += 32) acc += to_float<T>(o[x]) * to_float<T>(d[x]);
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) g.delta[row] = acc;
}

template <int kD>
constexpr int dq_smem_bytes() {
  return (2 * 64 + 4 * 64) * (kD + 8) * 2;  // Q, dO, then K and V double-buffered
}

// dq for 64 query rows of one (b, h); each warp 16 rows, 64 keys per step.
template <class T, int kD, bool kPlain>
__global__ void __launch_bounds__(128) dq_kernel(const dev_problem p, const dev_backward g) {
  constexpr int kM = 64, kN = 64, kS = kD + 8;
  const int dmax = kPlain ? kD : p.D, vmax = kPlain ? kD : p.Dv;
  const float sl2 = p.scale * kLog2e;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int cells[4];
  __shared__ float red[2][4];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kM * kS;
  T* sK = sdO + kM * kS;     // [2][kN][kS]
  T* sV = sK + 2 * kN * kS;  // [2][kN][kS]

  const query_block qb = own_rows<kM, kN>(p, cells, int(blockIdx.x));
  const int b = qb.b, h = qb.h, rows = qb.rows, lo_max = qb.lo_max, hi_min = qb.hi_min, jb0 = qb.jb0, jb1 = qb.jb1;
  const std::int64_t q0 = qb.q0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, t4 = lane & 3;
  const int(&lo)[2] = qb.lo, (&hi)[2] = qb.hi;
  const row_terms(&terms)[2] = qb.terms;
  const T* Q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + q0 * p.q_sn;
  const T* dO = static_cast<const T*>(g.dout) + b * g.do_sb + h * g.do_sh + q0 * g.do_sn;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + qb.hk * p.k_sh;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + qb.hk * p.v_sh;
  float lse[2], delta[2], lse2[2];  // lse2: in base 2, +inf for a row with no key (its p = 0)
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i = q0 + warp * 16 + gq + 8 * r;
    const std::int64_t row = (std::int64_t(b) * p.Hq + h) * p.Nq + i;
    lse[r] = i < p.Nq ? g.lse[row] : -kInf;
    delta[r] = i < p.Nq ? g.delta[row] : 0.0f;
    lse2[r] = lse[r] == -kInf ? kInf : lse[r] * kLog2e;
  }

  float dq[kD / 8][4];
  zero(dq);
  float dalibi = 0.0f;

  load_tile<kM, kD>(sQ, Q, p.q_sn, rows, p.D);
  load_tile<kM, kD>(sdO, dO, g.do_sn, rows, p.Dv);
  if (jb0 < jb1) load_kv<kN, kD>(sK, sV, K, V, p, jb0, 0);
  cp_async_commit();

  for (int jb = jb0; jb < jb1; ++jb) {
    const int buf = next_kv<kN, kD>(sK, sV, K, V, p, jb, jb0, jb1), k0 = jb * kN;
    const T* sKb = sK + buf * kN * kS;
    const T* sVb = sV + buf * kN * kS;

    float s[kN / 8][4], dp[kN / 8][4];
    zero(s);
    zero(dp);
    mma_rows_rows<T, kS, kD>(s, sQ, warp * 16, sKb, dmax, lane);    // S = Q Kᵀ
    mma_rows_rows<T, kS, kD>(dp, sdO, warp * 16, sVb, vmax, lane);  // dP = dO Vᵀ

    // dS = P ∘ (dP - delta); the product's operand is dS · d score / d(q·k).
    const bool ranged = !(k0 >= lo_max && k0 + kN <= hi_min);
    if (kPlain && !ranged) {
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1;
          s[n][e] = ex2(s[n][e] * sl2 - lse2[r]) * (dp[n][e] - delta[r]) * p.scale;
        }
    } else {
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, j = k0 + n * 8 + 2 * t4 + (e & 1);
          const bool in = (!ranged || (j >= lo[r] && j < hi[r])) && lse[r] != -kInf;
          float dfac = 0.0f, ds = 0.0f;
          if (in) {
            if constexpr (kPlain) {
              ds = ex2(s[n][e] * sl2 - lse2[r]) * (dp[n][e] - delta[r]);
              dfac = p.scale;
            } else {
              const float x = score_of(p, terms[r], j, s[n][e], &dfac);
              ds = __expf(x - lse[r]) * (dp[n][e] - delta[r]);
              if (p.alibi) {
                const std::int64_t dd = terms[r].pos - j;
                dalibi -= ds * float(dd < 0 ? -dd : dd);
              }
            }
          }
          s[n][e] = ds * dfac;
        }
    }

    mma_acc_rows<T, kS>(dq, s, sKb, dmax, lane);  // dQ += dX K
    __syncthreads();
  }
  cp_async_wait<0>();

  float dsink = 0.0f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t i = q0 + warp * 16 + gq + 8 * r;
    if (i >= p.Nq) continue;
    if (p.sinks && lse[r] != -kInf && t4 == 0) dsink -= __expf(p.sinks[h] - lse[r]) * delta[r];
    T* out = static_cast<T*>(g.dq) + b * g.dq_sb + h * g.dq_sh + i * g.dq_sn;
#pragma unroll
    for (int d = 0; d < kD / 8; ++d) {
      const int col = d * 8 + 2 * t4;
      if (col < p.D) *reinterpret_cast<std::uint32_t*>(out + col) = pack2<T>(dq[d][2 * r], dq[d][2 * r + 1]);
    }
  }
  // Per-block partial sums of the ALiBi slope and sink gradients, in a fixed order.
  if (g.dalibi_part || g.dsinks_part) {
    for (int off = 16; off > 0; off >>= 1) {
      dalibi += __shfl_xor_sync(0xffffffffu, dalibi, off);
      dsink += __shfl_xor_sync(0xffffffffu, dsink, off);
    }
    if (lane == 0) red[0][warp] = dalibi, red[1][warp] = dsink;
    __syncthreads();
    if (threadIdx.x == 0) {
      const std::int64_t at = (std::int64_t(b) * p.Hq + h) * gridDim.x + blockIdx.x;
      if (g.dalibi_part) g.dalibi_part[at] = (red[0][0] + red[0][1]) + (red[0][2] + red[0][3]);
      if (g.dsinks_part) g.dsinks_part[at] = (red[1][0] + red[1][1]) + (red[1][2] + red[1][3]);
    }
  }
}

// The plain dq (kPlain's scores) for D = Dv = kD <= 128: blocks of 128 query rows, each warp two
// m-tiles of 16 (rows warp·16 + 64·t), 32 keys per step, so each K and V fragment feeds four
// products. The ALiBi/sink partial sums stay per 64 rows (kBackwardQueryBlock): m-tile t is the
// block's half t.
template <int kD>
constexpr int dq_wide_smem_bytes() {
  return (2 * 128 + 4 * 32) * (kD + 8) * 2;  // Q, dO, then K and V double-buffered
}

template <class T, int kD>
__global__ void __launch_bounds__(128) dq_wide_kernel(const dev_problem p, const dev_backward g) {
  constexpr int kM = 128, kN = 32, kS = kD + 8, kT = 2;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int cells[4];
  __shared__ float red[kT][4];
  T* sQ = reinterpret_cast<T*>(smem);
  T* sdO = sQ + kM * kS;
  T* sK = sdO + kM * kS;     // [2][kN][kS]
  T* sV = sK + 2 * kN * kS;  // [2][kN][kS]

  const int b = blockIdx.z, h = blockIdx.y, hk = h / (p.Hq / p.Hkv);
  const std::int64_t q0 = std::int64_t(blockIdx.x) * kM;
  const int rows = int(p.Nq - q0 < kM ? p.Nq - q0 : kM);
  int kmin, kmax, lo_max, hi_min;
  block_key_range(p, b, q0, rows, cells, kmin, kmax, lo_max, hi_min);
  const int jb0 = kmin / kN, jb1 = kmin < kmax ? (kmax + kN - 1) / kN : jb0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, t4 = lane & 3;
  const float sl2 = p.scale * kLog2e;
  int lo[kT][2], hi[kT][2];
  float lse[kT][2], lse2[kT][2], delta[kT][2];
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::int64_t i = q0 + t * 64 + warp * 16 + gq + 8 * r;
      const std::int64_t row = (std::int64_t(b) * p.Hq + h) * p.Nq + i;
      key_range(p, b, i, lo[t][r], hi[t][r]);
      lse[t][r] = i < p.Nq ? g.lse[row] : -kInf;
      delta[t][r] = i < p.Nq ? g.delta[row] : 0.0f;
      lse2[t][r] = lse[t][r] == -kInf ? kInf : lse[t][r] * kLog2e;
    }
  const T* Q = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + q0 * p.q_sn;
  const T* dO = static_cast<const T*>(g.dout) + b * g.do_sb + h * g.do_sh + q0 * g.do_sn;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + hk * p.v_sh;

  float dq[kT][kD / 8][4];
#pragma unroll
  for (int t = 0; t < kT; ++t) zero(dq[t]);

  load_tile<kM, kD>(sQ, Q, p.q_sn, rows, kD);
  load_tile<kM, kD>(sdO, dO, g.do_sn, rows, kD);
  if (jb0 < jb1) load_kv<kN, kD>(sK, sV, K, V, p, jb0, 0);
  cp_async_commit();

  for (int jb = jb0; jb < jb1; ++jb) {
    const int buf = next_kv<kN, kD>(sK, sV, K, V, p, jb, jb0, jb1), k0 = jb * kN;
    const T* sKb = sK + buf * kN * kS;
    const T* sVb = sV + buf * kN * kS;

    // S = Q Kᵀ, then dP = dO Vᵀ: each K (V) fragment serves both m-tiles.
    float s[kT][kN / 8][4], dp[kT][kN / 8][4];
#pragma unroll
    for (int t = 0; t < kT; ++t) zero(s[t]), zero(dp[t]);
    mma_rows_rows_wide<T, kS, kD>(s, sQ, warp * 16, sKb, lane);
    mma_rows_rows_wide<T, kS, kD>(dp, sdO, warp * 16, sVb, lane);

    // dS · scale = P ∘ (dP - delta) · scale, in place of S.
    const bool ranged = !(k0 >= lo_max && k0 + kN <= hi_min);
#pragma unroll
    for (int t = 0; t < kT; ++t)
#pragma unroll
      for (int n = 0; n < kN / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = e >> 1, j = k0 + n * 8 + 2 * t4 + (e & 1);
          const float ds = ex2(s[t][n][e] * sl2 - lse2[t][r]) * (dp[t][n][e] - delta[t][r]) * p.scale;
          s[t][n][e] = !ranged || (j >= lo[t][r] && j < hi[t][r]) ? ds : 0.0f;
        }

    mma_acc_rows_wide<T, kS>(dq, s, sKb, lane);  // dQ += dS K: each K fragment serves both m-tiles
    __syncthreads();  // the other buffer is refilled next
  }
  cp_async_wait<0>();

  float dsink[kT] = {0.0f, 0.0f};
#pragma unroll
  for (int t = 0; t < kT; ++t)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const std::int64_t i = q0 + t * 64 + warp * 16 + gq + 8 * r;
      if (i >= p.Nq) continue;
      if (p.sinks && lse[t][r] != -kInf && t4 == 0) dsink[t] -= __expf(p.sinks[h] - lse[t][r]) * delta[t][r];
      T* out = static_cast<T*>(g.dq) + b * g.dq_sb + h * g.dq_sh + i * g.dq_sn;
#pragma unroll
      for (int d = 0; d < kD / 8; ++d)
        *reinterpret_cast<std::uint32_t*>(out + d * 8 + 2 * t4) = pack2<T>(dq[t][d][2 * r], dq[t][d][2 * r + 1]);
    }
  // The sink gradient's partial sums, one per 64 rows in a fixed order (kPlain: no ALiBi).
  if (g.dsinks_part) {
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      for (int off = 16; off > 0; off >>= 1) dsink[t] += __shfl_xor_sync(0xffffffffu, dsink[t], off);
      if (lane == 0) red[t][warp] = dsink[t];
    }
    __syncthreads();
    if (threadIdx.x < kT) {
      const int t = threadIdx.x, half = blockIdx.x * kT + t, halves = (p.Nq + 63) / 64;
      if (half < halves)
        g.dsinks_part[(std::int64_t(b) * p.Hq + h) * halves + half] = (red[t][0] + red[t][1]) + (red[t][2] + red[t][3]);
    }
  }
}

// The dk/dv kernels' steps: whether query block qb (kM rows) reaches keys [k0, k0 + kN) — key
// ranges are monotone in the row, so when its first row's range ends after k0 and its last row's
// starts before k0 + kN — and `whole`: every row of the block holds all of those keys.
template <int kN, int kM>
__device__ __forceinline__ bool block_reaches(const dev_problem& p, int b, int k0, int qb, bool* whole) {
  const std::int64_t q0 = std::int64_t(qb) * kM;
  const int rows = int(p.Nq - q0 < kM ? p.Nq - q0 : kM);
  int lo_first, hi_first, lo_last, hi_last;
  key_range(p, b, q0, lo_first, hi_first);
  key_range(p, b, q0 + rows - 1, lo_last, hi_last);
  if (whole) *whole = lo_last <= k0 && hi_first >= k0 + kN;
  return !(hi_last <= k0 || lo_first >= k0 + kN);
}
// A step's row values (rows q0.. of head h; `rows` of them real): key ranges, delta, and the lse
// (kBase2: times log2 e, +inf for a row with no key, so that its p is 0).
template <int kM, bool kBase2>
__device__ __forceinline__ void stage_rows(const dev_problem& p, const dev_backward& g, int b, int h, std::int64_t q0,
                                           int rows, float* lse, float* delta, int* lo, int* hi) {
  for (int r = threadIdx.x; r < kM; r += blockDim.x) {
    const std::int64_t i = q0 + r, row = (std::int64_t(b) * p.Hq + h) * p.Nq + i;
    key_range(p, b, i, lo[r], hi[r]);
    const float l = r < rows ? g.lse[row] : -kInf;
    lse[r] = !kBase2 ? l : l == -kInf ? kInf : l * kLog2e;
    delta[r] = r < rows ? g.delta[row] : 0.0f;
  }
}

template <int kD>
constexpr int dkdv_smem_bytes() {
  return (2 * 64 + 4 * 32) * (kD + 8) * 2 + 2 * 32 * 4 * 4;  // K, V, Q and dO double-buffered, row values ×2
}

// dk, dv for 64 keys of one (b, kv head); each warp 16 keys, 32 query rows per step, over every
// query head of the group. The steps that reach these keys run in a pipeline: the next step's Q
// and dO tiles and row values load (cp.async) while this one computes.
template <class T, int kD, bool kPlain>
__global__ void __launch_bounds__(128) dkdv_kernel(const dev_problem p, const dev_backward g) {
  constexpr int kN = 64, kM = 32, kS = kD + 8;
  const int dmax = kPlain ? kD : p.D, vmax = kPlain ? kD : p.Dv;
  const float sl2 = p.scale * kLog2e;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kN * kS;
  T* sQ = sV + kN * kS;        // [2][kM][kS]
  T* sdO = sQ + 2 * kM * kS;   // [2][kM][kS]
  float* s_lse = reinterpret_cast<float*>(sdO + 2 * kM * kS);  // [2][kM]; kPlain: base 2, +inf for no key
  float* s_delta = s_lse + 2 * kM;                               // [2][kM]
  int* s_lo = reinterpret_cast<int*>(s_delta + 2 * kM);          // [2][kM]
  int* s_hi = s_lo + 2 * kM;                                     // [2][kM]

  const int b = blockIdx.z, hk = blockIdx.y, group = p.Hq / p.Hkv;
  const int k0 = blockIdx.x * kN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, t4 = lane & 3;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + hk * p.k_sh + std::int64_t(k0) * p.k_sn;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + hk * p.v_sh + std::int64_t(k0) * p.v_sn;
  load_tile<kN, kD>(sK, K, p.k_sn, p.Nk - k0, p.D);
  load_tile<kN, kD>(sV, V, p.v_sn, p.Nk - k0, p.Dv);
  cp_async_commit();

  float dk[kD / 8][4], dv[kD / 8][4];
  zero(dk);
  zero(dv);

  // The steps (query head hh of the group, query block qb) in order; key ranges are monotone in
  // the row, so a block reaches these keys when its first row's range ends after k0 and its last
  // row's starts before k0 + kN. `whole`: every row of the block holds all of these keys.
  const int nqb = (p.Nq + kM - 1) / kM;
  auto reaches = [&](int qb, bool* whole) { return block_reaches<kN, kM>(p, b, k0, qb, whole); };
  auto advance = [&](int& hh, int& qb) {
    do {
      if (++qb == nqb) qb = 0, ++hh;
    } while (hh < group && !reaches(qb, nullptr));
  };
  auto stage = [&](int hh, int qb, int buf) {
    const int h = hk * group + hh;
    const std::int64_t q0 = std::int64_t(qb) * kM;
    const int rows = int(p.Nq - q0 < kM ? p.Nq - q0 : kM);
    load_tile<kM, kD>(sQ + buf * kM * kS, static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + q0 * p.q_sn, p.q_sn,
                      rows, p.D);
    load_tile<kM, kD>(sdO + buf * kM * kS,
                      static_cast<const T*>(g.dout) + b * g.do_sb + h * g.do_sh + q0 * g.do_sn, g.do_sn, rows, p.Dv);
    cp_async_commit();
    stage_rows<kM, kPlain>(p, g, b, h, q0, rows, s_lse + buf * kM, s_delta + buf * kM, s_lo + buf * kM,
                           s_hi + buf * kM);
  };

  int hh = 0, qb = -1, buf = 0;
  advance(hh, qb);
  if (hh < group) stage(hh, qb, 0);
  while (hh < group) {
    int nh = hh, nq = qb;
    advance(nh, nq);
    if (nh < group) {
      stage(nh, nq, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();

    const int h = hk * group + hh;
    const std::int64_t q0 = std::int64_t(qb) * kM;
    bool whole;
    reaches(qb, &whole);
    const T* sQb = sQ + buf * kM * kS;
    const T* sdOb = sdO + buf * kM * kS;
    const float* lse_b = s_lse + buf * kM;
    const float* delta_b = s_delta + buf * kM;
    const int* lo_b = s_lo + buf * kM;
    const int* hi_b = s_hi + buf * kM;

    // Sᵀ = K Qᵀ and dPᵀ = V dOᵀ: this warp's 16 keys × 32 rows.
    float st[kM / 8][4], dpt[kM / 8][4];
    zero(st);
    zero(dpt);
    mma_rows_rows<T, kS, kD>(st, sK, warp * 16, sQb, dmax, lane);    // Sᵀ = K Qᵀ
    mma_rows_rows<T, kS, kD>(dpt, sV, warp * 16, sdOb, vmax, lane);  // dPᵀ = V dOᵀ

    // Pᵀ into st, dXᵀ = dSᵀ · d score / d(q·k) into dpt.
    if (kPlain && whole) {
#pragma unroll
      for (int n = 0; n < kM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = n * 8 + 2 * t4 + (e & 1);
          const float pr = ex2(st[n][e] * sl2 - lse_b[r]);
          st[n][e] = pr;
          dpt[n][e] = pr * (dpt[n][e] - delta_b[r]) * p.scale;
        }
    } else {
      const float slope = p.alibi ? p.alibi[b * p.Hq + h] : 0.0f;
#pragma unroll
      for (int n = 0; n < kM / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = k0 + warp * 16 + gq + 8 * (e >> 1), r = n * 8 + 2 * t4 + (e & 1);
          const bool in = j >= lo_b[r] && j < hi_b[r] && (kPlain || lse_b[r] != -kInf);
          float pr = 0.0f, dx = 0.0f;
          if (in) {
            if constexpr (kPlain) {
              pr = ex2(st[n][e] * sl2 - lse_b[r]);
              dx = pr * (dpt[n][e] - delta_b[r]) * p.scale;
            } else {
              row_terms t;
              t.mask_row = p.mask ? p.mask + b * p.m_sb + h * p.m_sh + (q0 + r) * p.m_sn : nullptr;
              t.slope = slope;
              t.pos = query_pos(p, b, q0 + r);
              float dfac;
              const float x = score_of(p, t, j, st[n][e], &dfac);
              pr = __expf(x - lse_b[r]);
              dx = pr * (dpt[n][e] - delta_b[r]) * dfac;
            }
          }
          st[n][e] = pr;
          dpt[n][e] = dx;
        }
    }

    mma_acc_rows<T, kS>(dv, st, sdOb, vmax, lane);  // dV += Pᵀ dO
    mma_acc_rows<T, kS>(dk, dpt, sQb, dmax, lane);  // dK += dXᵀ Q
    __syncthreads();  // this buffer is refilled two steps on
    hh = nh, qb = nq, buf ^= 1;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const std::int64_t j = k0 + warp * 16 + gq + 8 * r;
    if (j >= p.Nk) continue;
    T* ok = static_cast<T*>(g.dk) + b * g.dk_sb + hk * g.dk_sh + j * g.dk_sn;
    T* ov = static_cast<T*>(g.dv) + b * g.dv_sb + hk * g.dv_sh + j * g.dv_sn;
#pragma unroll
    for (int d = 0; d < kD / 8; ++d) {
      const int col = d * 8 + 2 * t4;
      if (col < p.D) *reinterpret_cast<std::uint32_t*>(ok + col) = pack2<T>(dk[d][2 * r], dk[d][2 * r + 1]);
      if (col < p.Dv) *reinterpret_cast<std::uint32_t*>(ov + col) = pack2<T>(dv[d][2 * r], dv[d][2 * r + 1]);
    }
  }
}

// The plain dk/dv (kPlain's scores) for D = Dv = kD = 128, FlashAttention-2's layout: 8 warps
// over 128 keys, 64 query rows a step. Sᵀ = K Qᵀ and dPᵀ = V dOᵀ are split 4 (keys) × 2 (rows)
// across the warps, 32 × 32 each; Pᵀ and dSᵀ go to shared memory as 16-bit tiles; dV += Pᵀ dO
// and dK += dSᵀ Q are split 4 (keys) × 2 (columns of D), 32 × kD/2 each. Every fragment read
// feeds two to eight products, and 8 warps hide each other's latency. The steps run in the
// pipeline of dkdv_kernel (the next step's Q/dO tiles load while this one computes).
template <int kD>
constexpr int dkdv_wide_smem_bytes() {
  // K, V; Q and dO double-buffered; Pᵀ and dSᵀ [128][64 + 8]; row values ×2
  return (2 * 128 + 4 * 64) * (kD + 8) * 2 + 2 * 128 * 72 * 2 + 2 * 64 * 4 * 4;
}

template <class T, int kD>
__global__ void __launch_bounds__(256) dkdv_wide_kernel(const dev_problem p, const dev_backward g) {
  constexpr int kN = 128, kM = 64, kS = kD + 8, kP = kM + 8, kDW = kD / 2;
  extern __shared__ __align__(16) unsigned char smem[];
  T* sK = reinterpret_cast<T*>(smem);
  T* sV = sK + kN * kS;
  T* sQ = sV + kN * kS;       // [2][kM][kS]
  T* sdO = sQ + 2 * kM * kS;  // [2][kM][kS]
  T* sP = sdO + 2 * kM * kS;  // [kN][kP]: Pᵀ
  T* sdS = sP + kN * kP;      // [kN][kP]: dSᵀ · scale
  float* s_lse = reinterpret_cast<float*>(sdS + kN * kP);  // [2][kM], base 2, +inf for no key
  float* s_delta = s_lse + 2 * kM;                          // [2][kM]
  int* s_lo = reinterpret_cast<int*>(s_delta + 2 * kM);     // [2][kM]
  int* s_hi = s_lo + 2 * kM;                                // [2][kM]

  const int b = blockIdx.z, hk = blockIdx.y, group = p.Hq / p.Hkv;
  const int k0 = blockIdx.x * kN;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gq = lane >> 2, t4 = lane & 3;
  const int wk = warp >> 1, wx = warp & 1;  // keys [wk·32, +32); rows (GEMM 1) or columns (GEMM 2) half wx
  const float sl2 = p.scale * kLog2e;
  const T* K = static_cast<const T*>(p.k) + b * p.k_sb + hk * p.k_sh + std::int64_t(k0) * p.k_sn;
  const T* V = static_cast<const T*>(p.v) + b * p.v_sb + hk * p.v_sh + std::int64_t(k0) * p.v_sn;
  load_tile<kN, kD>(sK, K, p.k_sn, p.Nk - k0, kD);
  load_tile<kN, kD>(sV, V, p.v_sn, p.Nk - k0, kD);
  cp_async_commit();

  float dk[2][kDW / 8][4], dv[2][kDW / 8][4];
#pragma unroll
  for (int t = 0; t < 2; ++t) zero(dk[t]), zero(dv[t]);

  const int nqb = (p.Nq + kM - 1) / kM;
  auto reaches = [&](int qb, bool* whole) { return block_reaches<kN, kM>(p, b, k0, qb, whole); };
  auto advance = [&](int& hh, int& qb) {
    do {
      if (++qb == nqb) qb = 0, ++hh;
    } while (hh < group && !reaches(qb, nullptr));
  };
  auto stage = [&](int hh, int qb, int buf) {
    const int h = hk * group + hh;
    const std::int64_t q0 = std::int64_t(qb) * kM;
    const int rows = int(p.Nq - q0 < kM ? p.Nq - q0 : kM);
    load_tile<kM, kD>(sQ + buf * kM * kS, static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + q0 * p.q_sn, p.q_sn,
                      rows, kD);
    load_tile<kM, kD>(sdO + buf * kM * kS,
                      static_cast<const T*>(g.dout) + b * g.do_sb + h * g.do_sh + q0 * g.do_sn, g.do_sn, rows, kD);
    cp_async_commit();
    stage_rows<kM, true>(p, g, b, h, q0, rows, s_lse + buf * kM, s_delta + buf * kM, s_lo + buf * kM,
                         s_hi + buf * kM);
  };

  int hh = 0, qb = -1, buf = 0;
  advance(hh, qb);
  if (hh < group) stage(hh, qb, 0);
  while (hh < group) {
    cp_async_wait<0>();  // this step's tiles (and, the first time, K and V)
    __syncthreads();     // ... visible to all; every warp is past the last step's dV/dK products
    int nh = hh, nq = qb;
    advance(nh, nq);
    if (nh < group) stage(nh, nq, buf ^ 1);

    bool whole;
    reaches(qb, &whole);
    const T* sQb = sQ + buf * kM * kS;
    const T* sdOb = sdO + buf * kM * kS;
    const float* lse_b = s_lse + buf * kM;
    const float* delta_b = s_delta + buf * kM;

    // GEMM 1: this warp's Sᵀ and dPᵀ, keys [wk·32, +32) × rows [wx·32, +32).
    float st[2][4][4], dpt[2][4][4];
#pragma unroll
    for (int t = 0; t < 2; ++t) zero(st[t]), zero(dpt[t]);
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
      std::uint32_t ak[2][4], av[2][4];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        ldsm4(ak[t], a_at<kS>(sK, wk * 32 + t * 16, ks * 16, lane));
        ldsm4(av[t], a_at<kS>(sV, wk * 32 + t * 16, ks * 16, lane));
      }
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        std::uint32_t bq[4], bd[4];
        ldsm4(bq, bn_at<kS>(sQb, wx * 32 + np * 16, ks * 16, lane));
        ldsm4(bd, bn_at<kS>(sdOb, wx * 32 + np * 16, ks * 16, lane));
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          mma<T>(st[t][2 * np], ak[t], bq[0], bq[1]);
          mma<T>(st[t][2 * np + 1], ak[t], bq[2], bq[3]);
          mma<T>(dpt[t][2 * np], av[t], bd[0], bd[1]);
          mma<T>(dpt[t][2 * np + 1], av[t], bd[2], bd[3]);
        }
      }
    }

    // Pᵀ and dSᵀ · scale to shared memory (16-bit, two rows' values per 32-bit store).
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int key = wk * 32 + t * 16 + gq + 8 * hf, r0 = wx * 32 + n * 8 + 2 * t4;
          float pr[2], dx[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int r = r0 + c;
            const float pv = ex2(st[t][n][2 * hf + c] * sl2 - lse_b[r]);
            const float dv_ = pv * (dpt[t][n][2 * hf + c] - delta_b[r]) * p.scale;
            const bool in = whole || (k0 + key >= s_lo[buf * kM + r] && k0 + key < s_hi[buf * kM + r]);
            pr[c] = in ? pv : 0.0f;
            dx[c] = in ? dv_ : 0.0f;
          }
          *reinterpret_cast<std::uint32_t*>(sP + key * kP + r0) = pack2<T>(pr[0], pr[1]);
          *reinterpret_cast<std::uint32_t*>(sdS + key * kP + r0) = pack2<T>(dx[0], dx[1]);
        }
    __syncthreads();

    // GEMM 2: dV += Pᵀ dO and dK += dSᵀ Q for keys [wk·32, +32) × columns [wx·kD/2, +kD/2).
#pragma unroll
    for (int kk = 0; kk < kM / 16; ++kk) {
      std::uint32_t ap[2][4], as[2][4];
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        ldsm4(ap[t], a_at<kP>(sP, wk * 32 + t * 16, kk * 16, lane));
        ldsm4(as[t], a_at<kP>(sdS, wk * 32 + t * 16, kk * 16, lane));
      }
#pragma unroll
      for (int dd = 0; dd < kDW / 16; ++dd) {
        std::uint32_t bo[4], bq[4];
        ldsm4t(bo, bk_at<kS>(sdOb, kk * 16, wx * kDW + dd * 16, lane));
        ldsm4t(bq, bk_at<kS>(sQb, kk * 16, wx * kDW + dd * 16, lane));
#pragma unroll
        for (int t = 0; t < 2; ++t) {
          mma<T>(dv[t][2 * dd], ap[t], bo[0], bo[1]);
          mma<T>(dv[t][2 * dd + 1], ap[t], bo[2], bo[3]);
          mma<T>(dk[t][2 * dd], as[t], bq[0], bq[1]);
          mma<T>(dk[t][2 * dd + 1], as[t], bq[2], bq[3]);
        }
      }
    }
    hh = nh, qb = nq, buf ^= 1;
  }
  cp_async_wait<0>();

#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const std::int64_t j = k0 + wk * 32 + t * 16 + gq + 8 * hf;
      if (j >= p.Nk) continue;
      T* ok = static_cast<T*>(g.dk) + b * g.dk_sb + hk * g.dk_sh + j * g.dk_sn + wx * kDW;
      T* ov = static_cast<T*>(g.dv) + b * g.dv_sb + hk * g.dv_sh + j * g.dv_sn + wx * kDW;
#pragma unroll
      for (int d = 0; d < kDW / 8; ++d) {
        const int col = d * 8 + 2 * t4;
        *reinterpret_cast<std::uint32_t*>(ok + col) = pack2<T>(dk[t][d][2 * hf], dk[t][d][2 * hf + 1]);
        *reinterpret_cast<std::uint32_t*>(ov + col) = pack2<T>(dv[t][d][2 * hf], dv[t][d][2 * hf + 1]);
      }
    }
}

// ---- launchers ----

// The dynamic shared memory a kernel may take beyond 48 KB, set once per kernel (the first call's
// answer is kept: the attribute is the process's, for the device current at that call).
template <auto Kernel, int kBytes>
inline cudaError_t allow_smem() {
  static const cudaError_t e =
      kBytes > 48 * 1024 ? cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kBytes) : cudaSuccess;
  return e;
}

template <class T, int kD, bool kPlain>
int run_forward(const dev_problem& p, const dev_forward& f) {
  constexpr int bytes = fwd_smem_bytes<kD>();
  if (cudaError_t e = allow_smem<forward_kernel<T, kD, kPlain>, bytes>(); e != cudaSuccess) return int(e);
  if (f.splits > 1) {
    // Partial outs and lse in one stream-ordered allocation (no device-wide synchronisation).
    const std::int64_t rows = std::int64_t(p.B) * p.Hq * p.Nq;
    void* ws = nullptr;
    if (cudaError_t e = cudaMallocAsync(&ws, std::size_t(f.splits * rows) * (p.Dv + 1) * 4, 0);
        e != cudaSuccess)
      return int(e);
    dev_forward fs = f;
    fs.part_out = static_cast<float*>(ws);
    fs.part_lse = fs.part_out + f.splits * rows * p.Dv;
    const dim3 grid(unsigned((p.Nq + 63) / 64 * f.splits), p.Hq, p.B);
    forward_kernel<T, kD, kPlain><<<grid, 128, bytes>>>(p, fs);
    combine_kernel<T><<<unsigned(rows), 128>>>(p, fs);
    cudaError_t e = cudaGetLastError();
    const cudaError_t freed = cudaFreeAsync(ws, 0);
    return int(e != cudaSuccess ? e : freed);
  }
  const dim3 grid((p.Nq + 63) / 64, p.Hq, p.B);
  forward_kernel<T, kD, kPlain><<<grid, 128, bytes>>>(p, f);
  return int(cudaGetLastError());
}
template <class T, int kD>
int run_forward(const dev_problem& p0, const dev_forward& f0) {
  const forward_plan plan = plan_forward(p0);
  if (plan.splits > 1) {
    dev_problem p = p0;
    dev_forward f = f0;
    f.splits = plan.splits, f.split_blocks = plan.split_blocks;
    if (const int group = plan.row_heads) {  // the decode swap (params.h)
      p.Hq = p0.Hkv, p.Nq = group, p.causal = 0, p.row_heads = group;
      p.q_sn = p0.q_sh, p.q_sh = p0.q_sh * group;
      f.o_sn = f0.o_sh, f.o_sh = f0.o_sh * group;
    }
    return plain_scores(p, kD) ? run_forward<T, kD, true>(p, f) : run_forward<T, kD, false>(p, f);
  }
  const dev_problem& p = p0;
  const dev_forward& f = f0;
  if (!plain_scores(p, kD)) return run_forward<T, kD, false>(p, f);
  if constexpr (kD <= 128) {
    constexpr int bytes = fwd_wide_smem_bytes<kD>();
    if (cudaError_t e = allow_smem<forward_wide_kernel<T, kD>, bytes>(); e != cudaSuccess) return int(e);
    forward_wide_kernel<T, kD><<<dim3((p.Nq + 127) / 128, p.Hq, p.B), 128, bytes>>>(p, f);
    return int(cudaGetLastError());
  } else {
    return run_forward<T, kD, true>(p, f);
  }
}

template <class T, int kD, bool kPlain>
int run_backward(const dev_problem& p, const dev_backward& g) {
  const std::int64_t rows = std::int64_t(p.B) * p.Hq * p.Nq;
  if (rows > 0) delta_kernel<T><<<unsigned((rows + 3) / 4), 128>>>(p, g);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  constexpr int dq_bytes = dq_smem_bytes<kD>(), kv_bytes = dkdv_smem_bytes<kD>();
  if (cudaError_t e = allow_smem<dq_kernel<T, kD, kPlain>, dq_bytes>(); e != cudaSuccess) return int(e);
  if (cudaError_t e = allow_smem<dkdv_kernel<T, kD, kPlain>, kv_bytes>(); e != cudaSuccess) return int(e);
  bool wide = false;
  if constexpr (kPlain && kD == 128) {
    // The wide dk/dv where the device gives its shared memory (sm_90: 178 KB; sm_80 has 163). On
    // the H100, backward at B4 H16 N4096 in one call: D = 128, wide 177-180 TFLOP/s against
    // 147-150 (GQA 4:1 alike); D = 64, the 64-key kernel 130-134 against 128-129, so it stays.
    constexpr int wide_bytes = dkdv_wide_smem_bytes<kD>();
    static const int optin = [] {  // the current device's, asked once
      int dev = 0, bytes = 0;
      return cudaGetDevice(&dev) == cudaSuccess &&
                     cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess
                 ? bytes
                 : 0;
    }();
    if (optin >= wide_bytes) {
      if (cudaError_t e = allow_smem<dkdv_wide_kernel<T, kD>, wide_bytes>(); e != cudaSuccess) return int(e);
      wide = true;
      if (p.Nk > 0) dkdv_wide_kernel<T, kD><<<dim3((p.Nk + 127) / 128, p.Hkv, p.B), 256, wide_bytes>>>(p, g);
    }
  }
  if (!wide && p.Nk > 0) dkdv_kernel<T, kD, kPlain><<<dim3((p.Nk + 63) / 64, p.Hkv, p.B), 128, kv_bytes>>>(p, g);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return int(e);
  if (p.Nq == 0) return int(cudaGetLastError());
  if constexpr (kPlain && kD <= 128) {
    constexpr int wide_bytes = dq_wide_smem_bytes<kD>();
    if (cudaError_t e = allow_smem<dq_wide_kernel<T, kD>, wide_bytes>(); e != cudaSuccess) return int(e);
    dq_wide_kernel<T, kD><<<dim3((p.Nq + 127) / 128, p.Hq, p.B), 128, wide_bytes>>>(p, g);
  } else {
    dq_kernel<T, kD, kPlain><<<dim3((p.Nq + 63) / 64, p.Hq, p.B), 128, dq_bytes>>>(p, g);
  }
  return int(cudaGetLastError());
}
template <class T, int kD>
int run_backward(const dev_problem& p, const dev_backward& g) {
  return plain_scores(p, kD) ? run_backward<T, kD, true>(p, g) : run_backward<T, kD, false>(p, g);
}

}  // namespace attn::detail::cuda

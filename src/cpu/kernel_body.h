// src/cpu/kernel_body.h — the cpu kernels of one ISA: the entry points of kernel_table
// (kernels.h), written once and compiled once per ISA. kernels_<isa>.cc defines, in
// attn::detail::cpu::(anonymous),
//   constexpr int W (floats per vector), C (vectors per tile row), R (tile rows)
// then includes this file and builds its table with make_table<Dot>(name), Dot being the ISA's
// bf16 dot product (simd.h: no_bf16_dot, or simd_avx512bf16.h). Everything here is in an
// anonymous namespace, so no symbol can be merged with another ISA's copy.
//
// The body, by concern:
//   simd.h              vector types, exp/tanh, lane shuffles, element readers (portable)
//   simd_avx512bf16.h   the bf16 dot product (vdpbf16ps), the only intrinsic
//   tile.h              operand types (f32, bf16 pairs), the register tile and its GEMM
//   scores.h            the score transform (scale, softcap, mask, ALiBi, key range)
//   prefill.h           forward, dq (lane layout) and dk/dv (row layout), for any operand type
//   decode.h            the forward for at most W rows per (b, hkv)
//
// Numerics: fp32 accumulation throughout; exp is a degree-6 polynomial (simd.h). Every
// reduction runs in a fixed order inside one block, so a result never depends on which thread
// computed it. The bf16 entries multiply bf16 operands and round P and dS to bf16 for the
// products that consume them.
#pragma once

#include <cstdint>

#include "core/common.h"
#include "cpu/decode.h"
#include "cpu/kernels.h"
#include "cpu/prefill.h"
#include "cpu/simd.h"
#include "cpu/tile.h"

namespace attn::detail::cpu {
namespace {

// ---- f32 operands (every ISA; bf16 and f16 inputs widened by the driver) ----

// f32 key/value rows of the lane block as operands of both lane-layout products.
lane_operands<f32_operands> f32_lane_operands(const lane_block& lb) {
  lane_operands<f32_operands> op;
  op.qt = lb.qt;
  op.k = lb.k, op.k_rs = lb.ksn;
  op.v = lb.v, op.v_rs = lb.vsn;
  op.k_steps = lb.k, op.k_ss = lb.ksn;
  if (lb.vt) op.v_steps = lb.vt, op.v_ss = 1, op.v_es = lb.ldvt;
  else op.v_steps = lb.v, op.v_ss = lb.vsn;
  return op;
}

template <class Dot>
void forward_f32(const lane_block& lb, const forward_io& io) {
  if (lb.L == C * W) return forward_lanes<f32_operands, C>(lb, f32_lane_operands(lb), io, nullptr);
  decode_forward<Dot>(&lb, &io, 1);
}

// The decode forward of n lane blocks of lanes_small rows, interleaved key block by key block.
template <class Dot>
void decode_heads(const lane_block* lbs, const forward_io* ios, int n) {
  decode_forward<Dot>(lbs, ios, n);
}

void dq_f32(const lane_block& lb, const dq_io& io) {
  lane_operands<f32_operands> op = f32_lane_operands(lb);
  op.doutt = io.doutt;
  if (lb.L == C * W) return dq_lanes<f32_operands, C>(lb, op, io, nullptr);
  dq_lanes<f32_operands, 1>(lb, op, io, nullptr);
}

void dkdv_f32(const dkdv_pair& pr) {
  row_operands<f32_operands> op;
  op.q = pr.q, op.q_rs = pr.qsn;
  op.dout = pr.dout, op.dout_rs = pr.dsn;
  op.q_steps = pr.q, op.q_ss = pr.qsn;
  op.dout_steps = pr.dout, op.dout_ss = pr.dsn;
  op.kt = pr.kt, op.vt = pr.vt;
  dkdv_rows<f32_operands>(pr, op);
}

// ---- bf16 pair operands (ISAs with a bf16 dot product; layouts in kernels.h) ----

// P or dS as operand words, after the lane scratch.
std::uint32_t* lane_packed(const lane_block& lb) {
  return reinterpret_cast<std::uint32_t*>(lb.scratch + lane_scratch_floats(lb.L, lb.D, lb.Dv));
}

template <class Dot>
void forward_bf16(const lane_block& lb, const bf16_operands& in, const forward_io& io) {
  lane_operands<bf16_pair_operands<Dot>> op;
  op.qt = in.qp;
  op.k = reinterpret_cast<const std::uint32_t*>(in.k), op.k_rs = in.ldk / 2;
  op.v_steps = in.vp, op.v_ss = lb.Dv;
  forward_lanes<bf16_pair_operands<Dot>, C>(lb, op, io, lane_packed(lb));
}

template <class Dot>
void dq_bf16(const lane_block& lb, const bf16_dq_operands& in, const dq_io& io) {
  lane_operands<bf16_pair_operands<Dot>> op;
  op.qt = in.qp, op.doutt = in.dop;
  op.k = reinterpret_cast<const std::uint32_t*>(in.k), op.k_rs = lb.D / 2;
  op.v = reinterpret_cast<const std::uint32_t*>(in.v), op.v_rs = lb.Dv / 2;
  op.k_steps = in.kpairs, op.k_ss = lb.D;
  dq_lanes<bf16_pair_operands<Dot>, C>(lb, op, io, lane_packed(lb));
}

template <class Dot>
void dkdv_bf16(const dkdv_pair& pr, const bf16_dkdv_operands& in) {
  row_operands<bf16_pair_operands<Dot>> op;
  op.q = reinterpret_cast<const std::uint32_t*>(in.q), op.q_rs = pr.D / 2;
  op.dout = reinterpret_cast<const std::uint32_t*>(in.dout), op.dout_rs = pr.Dv / 2;
  op.q_steps = in.qpairs, op.q_ss = pr.D;
  op.dout_steps = in.dopairs, op.dout_ss = pr.Dv;
  op.kt = in.ktp, op.vt = in.vtp;
  dkdv_rows<bf16_pair_operands<Dot>>(pr, op);
}

// One vector of a row's values r (the first n < W or all W of them, already times 1/l) to row +
// d0 as float32, or as bfloat16 rounded as f32_to_bf16 (nearest even, NaN kept quiet); `bit`
// into bad where one of them is not finite as written. A whole vector by one store; a memcpy
// of a run-time length (the last d0 of a Dv that is not a multiple of W) went through the stack
// and `rep movsq` — 2/3 of store_lanes' time.
inline void store_row_vector(vf r, std::int64_t n, void* row, std::int64_t d0, bool bf16, std::uint64_t bit,
                             std::uint64_t& bad) {
  typedef std::uint16_t vh __attribute__((vector_size(W * 2)));
  const vi lanes = iota() < splati(std::int32_t(n));  // (a short last d0: its own elements)
  if (!bf16) {
    if (any_lane(lanes & not_finite(r))) bad |= bit;
    float* out = static_cast<float*>(row) + d0;
    if (n == W) store(out, r);
    else __builtin_memcpy(out, &r, std::size_t(n) * 4);
    return;
  }
  const vu u = (vu)r;
  const vu nan = (vu)((u & splatu(0x7fffffffu)) > splatu(0x7f800000u));
  const vu even = (u + splatu(0x7fffu) + ((u >> 16) & splatu(1u))) >> 16;
  const vu hw = (((u >> 16) | splatu(0x40u)) & nan) | (even & ~nan);
  if (any_lane(lanes & (vi)((hw & splatu(0x7f80u)) == splatu(0x7f80u)))) bad |= bit;
  const vh h = __builtin_convertvector(hw, vh);
  std::uint16_t* out = static_cast<std::uint16_t*>(row) + d0;
  if (n == W) __builtin_memcpy(out, &h, sizeof h);
  else __builtin_memcpy(out, &h, std::size_t(n) * 2);
}

// Oᵀ [Dv][L] of lanes [0, nl) → row x (rows[x], unit stride) = Oᵀ[·][x]·inv[x], as float32 or
// bfloat16 (store_row_vector) — W × W blocks transposed in registers, where a store per element
// read a column of Oᵀ (L floats apart) and rounded it alone.
std::uint64_t store_lanes(const float* ot, std::int64_t L, std::int64_t nl, std::int64_t Dv, const float* inv,
                          void* const* rows, bool bf16) {
  vf blk[W];
  std::uint64_t bad = 0;
  for (std::int64_t x0 = 0; x0 < nl; x0 += W)
    for (std::int64_t d0 = 0; d0 < Dv; d0 += W) {
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i) blk[i] = d0 + i < Dv ? load(ot + (d0 + i) * L + x0) : vf{};
      transpose(blk);
      const std::int64_t n = imin(W, Dv - d0);
      for (std::int64_t i = 0; i < W && x0 + i < nl; ++i)
        store_row_vector(blk[i] * splat(inv[x0 + i]), n, rows[x0 + i], d0, bf16,
                         x0 + i < 64 ? std::uint64_t(1) << (x0 + i) : 0, bad);
    }
  return bad;
}

// The same from rows: row x of o (x < nl, Dv floats at o + x·ld) times inv[x] to rows[x] — what
// decode writes where its caller asks for rows (forward_io::rows), with no transpose either way.
std::uint64_t store_rows(const float* o, std::int64_t ld, std::int64_t nl, std::int64_t Dv, const float* inv,
                         void* const* rows, bool bf16) {
  std::uint64_t bad = 0;
  for (std::int64_t x = 0; x < nl; ++x) {
    const vf s = splat(inv[x]);
    const std::uint64_t bit = x < 64 ? std::uint64_t(1) << x : 0;
    const float* src = o + x * ld;
    for (std::int64_t d0 = 0; d0 < Dv; d0 += W) {
      const std::int64_t n = imin(W, Dv - d0);
      vf r = vf{};
      if (n == W) r = load(src + d0);
      else __builtin_memcpy(&r, src + d0, std::size_t(n) * 4);
      store_row_vector(r * s, n, rows[x], d0, bf16, bit, bad);
    }
  }
  return bad;
}

// Words of rows → lane words: rows[x] (x < nl; Xw words of unit stride) to out [Xw][L], lane x
// of word w at out[w·L + x], lanes past nl zero — W × W blocks transposed in registers, where a
// store per word wrote a column of `out` (L words apart).
void lane_words(const std::uint32_t* const* rows, std::int64_t L, std::int64_t nl, std::int64_t Xw, std::uint32_t* out,
                std::int64_t ld) {
  vf blk[W];
  for (std::int64_t x0 = 0; x0 < L; x0 += W)
    for (std::int64_t w0 = 0; w0 < Xw; w0 += W) {
      const std::int64_t n = imin(W, Xw - w0);
#pragma GCC unroll 16
      for (int i = 0; i < W; ++i) {
        blk[i] = vf{};
        if (x0 + i >= nl) continue;
        if (n == W) blk[i] = (vf)loadu(rows[x0 + i] + w0);
        else __builtin_memcpy(&blk[i], rows[x0 + i] + w0, std::size_t(n) * 4);
      }
      transpose(blk);
      for (std::int64_t j = 0; j < n; ++j) storeu(out + (w0 + j) * ld + x0, (vu)blk[j]);
    }
}

// kernel_table::dot_f64. A product of two floats is exact in float64, so a contracted
// multiply-add (this ISA's FMA) gives the bits of sum8's multiply and add.
double dot_f64(const void* a, const void* b, std::int64_t n, bool bf16) {
  if (bf16) {
    const auto* x = static_cast<const std::uint16_t*>(a);
    const auto* y = static_cast<const std::uint16_t*>(b);
    return sum8(n, [x, y](std::int64_t i) { return double(bf16_to_f32(x[i])) * double(bf16_to_f32(y[i])); });
  }
  const auto* x = static_cast<const float*>(a);
  const auto* y = static_cast<const float*>(b);
  return sum8(n, [x, y](std::int64_t i) { return double(x[i]) * double(y[i]); });
}

// kernel_table::max_abs_bits: a float's and a bfloat16's magnitude order as their bits do once
// the sign is cleared, so an integer max (narrow lanes: loops the compiler vectorises).
std::int32_t max_abs_bits(const void* x, std::int64_t n, bool bf16) {
  if (bf16) {
    const auto* r = static_cast<const std::uint16_t*>(x);
    std::int16_t m = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      std::int16_t u = std::int16_t(r[i] & 0x7fff);
      u = u < 0x7f80 ? u : std::int16_t(0);
      m = m > u ? m : u;
    }
    return std::int32_t(m) << 16;  // the float32 of the bf16
  }
  const auto* r = static_cast<const float*>(x);
  std::int32_t m = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    std::int32_t u;
    __builtin_memcpy(&u, r + i, 4);
    u &= 0x7fffffff;
    u = u < 0x7f800000 ? u : 0;
    m = m > u ? m : u;
  }
  return m;
}

// The table of this ISA; the bf16 entries only where it has a bf16 dot product.
template <class Dot>
constexpr kernel_table make_table(const char* name) {
  kernel_table t{name, W, C * W, W, forward_f32<Dot>, dq_f32, dkdv_f32, nullptr, nullptr, nullptr, qk_lanes<C>, decode_heads<Dot>};
  if constexpr (Dot::available) t.forward_bf16 = forward_bf16<Dot>, t.dq_bf16 = dq_bf16<Dot>, t.dkdv_bf16 = dkdv_bf16<Dot>;
  t.int16_decode = Dot::int16;
  // Measured on Zen 5 (2 threads, B 8, Hq 32 / Hkv 8, Nk 4096, D 128, ms, prefill → decode):
  // avx512 levels f32 32 rows 22.3 → 17.2, 48 rows 22.4 → 23.7; bf16 32 rows 19.5 → 9.8, 48 rows
  // 19.8 → 14.6, 64 rows 19.6 → 18.6 (D 64: 10.0 → 11.0); avx2 (ATTN_CPU_ISA) f32 16 rows 10.8 →
  // 14.0, 24 rows 28.5 → 21.9, 32 rows 28.2 → 28.4; bf16 16 rows 20 → 14.7, 32 rows 38 → 29.
  t.decode_passes_f32 = C == 4 ? 2.5f : 1.5f;
  t.decode_passes_bf16 = C == 4 ? 3.5f : 2.5f;
  t.mask_tile = mask_tile;
  t.store_lanes = store_lanes;
  t.store_rows = store_rows;
  t.lane_words = lane_words;
  t.dot_f64 = dot_f64;
  t.max_abs_bits = max_abs_bits;
  return t;
}

}  // namespace
}  // namespace attn::detail::cpu

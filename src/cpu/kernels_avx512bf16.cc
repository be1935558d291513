// src/cpu/kernels_avx512bf16.cc — the cpu kernels for the avx512bf16 level: the avx512 kernels
// plus bf16 entries (forward, dq, dk/dv, and decode's q·k) whose products take bf16 pairs with
// vdpbf16ps (simd_avx512bf16.h: 32 bf16 products summed in pairs into 16 fp32 accumulators).
// Scores, softmax and outputs accumulate in fp32; P and dS are rounded to bf16 (nearest even)
// for the products that consume them, as FlashAttention does on GPUs. Flags in sources.cmake,
// code in kernel_body.h. The amx level's table is this one with the bf16 prefill forward on AMX
// tiles (amx.h; this unit's flags add AMX-TILE and AMX-BF16).
namespace attn::detail::cpu {
namespace {
constexpr int W = 16;  // floats per vector
constexpr int C = 4;   // vectors per tile row
constexpr int R = 6;   // tile rows: R·C accumulators
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/simd_avx512bf16.h"
#include "cpu/kernel_body.h"
#include "cpu/amx.h"

namespace attn::detail::cpu {
const kernel_table& kernels_avx512bf16() {
  static constexpr kernel_table table = make_table<avx512bf16_dot>("avx512bf16");
  return table;
}

namespace {
// The amx level's decode reads bf16 rows widened to f32 (decode.h, bf16_pairs_in_decode): Hq 32
// / Hkv 8, D 128, Nk 16384, a head-major bf16 cache, 2 threads: 2.4-2.5 ms with vdpbf16ps, 1.9 ms
// in f32 on the AMX Xeon. Its int8 decode keeps the VNNI int16 products.
// It also prefetches the next block into L1 as it reads one (decode.h, near_prefetch_in_decode):
// faster on that Xeon, slower on Zen 4.
struct amx_decode_dot : avx512bf16_dot {
  static constexpr bool bf16_decode = false;
  static constexpr bool decode_near_prefetch = true;
};
}  // namespace

const kernel_table& kernels_amx() {
  static constexpr kernel_table table = [] {
    kernel_table t = make_table<avx512bf16_dot>("amx");
    t.forward = forward_f32<amx_decode_dot>;  // (its prefill is forward_f32<avx512bf16_dot>'s: no Dot there)
    t.decode_heads = decode_heads<amx_decode_dot>;
    t.forward_amx = forward_amx<avx512bf16_dot>;
    t.dkdv_amx = dkdv_amx<avx512bf16_dot>;
    t.dq_amx = dq_amx<avx512bf16_dot>;
    // Shapes off the tiles multiply bf16 inputs widened to f32 in the backward: on the AMX Xeon
    // measured, vdpbf16ps runs at half the rate of the f32 FMA (probes 224 against 447 GFLOP/s,
    // 2 threads), and the bf16-pair backward took 240-248 ms where the f32 one takes 152 (B1 H8
    // N2048 D128).
    t.dq_bf16 = nullptr, t.dkdv_bf16 = nullptr;
    // Its bf16 prefill runs on the tiles, its bf16 decode widened to f32: a lane block counts as
    // many decode passes as with f32 K/V (a guess: not measured on an AMX machine).
    t.decode_passes_bf16 = t.decode_passes_f32;
    return t;
  }();
  return table;
}

// The avx512bf16 level where vdpbf16ps is slower than widening (bf16_dot_products, isa.cc): the
// amx level's table without the tiles — bf16 prefill, dq and dk/dv on f32 products, decode of
// bf16 rows widened to f32, the int8 decode's VNNI int16 products kept. Emerald Rapids Xeon (no
// AMX granted to the VM), 2 threads, bf16: B1 H8 N2048 D128 forward 120-123 ms with vdpbf16ps
// against 66-82 widened, backward 305-311 against 169-196.
// Its decode does not prefetch the next block into L1 (the amx level's does): on that Xeon, f32
// rows Hq 32 / Hkv 8, D 128, Nk 131072, 2 threads, 46.4-46.8 ms without against 55-61 with.
namespace {
struct widened_decode_dot : avx512bf16_dot {
  static constexpr bool bf16_decode = false;
};
}  // namespace

const kernel_table& kernels_avx512bf16_f32() {
  static constexpr kernel_table table = [] {
    kernel_table t = make_table<avx512bf16_dot>("avx512bf16 (f32 products)");
    t.forward = forward_f32<widened_decode_dot>;
    t.decode_heads = decode_heads<widened_decode_dot>;
    t.forward_bf16 = nullptr, t.dq_bf16 = nullptr, t.dkdv_bf16 = nullptr;
    t.decode_passes_bf16 = t.decode_passes_f32;
    return t;
  }();
  return table;
}
}  // namespace attn::detail::cpu

// src/cuda/forward.cu — the forward kernel's instantiations (f16, bf16 × head sizes 64, 128, 256).
#include <cstdlib>

#include "cuda/flash.cuh"

namespace attn::detail::cuda {

int padded_head_size(int D, int Dv) {
  const int m = D > Dv ? D : Dv;
  return m <= 64 ? 64 : m <= 128 ? 128 : m <= 256 ? 256 : 0;
}

int shared_bytes(int padded_d, bool backward) {
  auto pick = [&](auto fwd, auto dq, auto dkdv) { return backward ? (dq > dkdv ? dq : dkdv) : fwd; };
  switch (padded_d) {
    case 64: return pick(fwd_smem_bytes<64>(), dq_smem_bytes<64>(), dkdv_smem_bytes<64>());
    case 128: return pick(fwd_smem_bytes<128>(), dq_smem_bytes<128>(), dkdv_smem_bytes<128>());
    case 256: return pick(fwd_smem_bytes<256>(), dq_smem_bytes<256>(), dkdv_smem_bytes<256>());
    default: return 0;
  }
}

namespace {
// Splits of the key blocks for a grid of B·Hq·⌈Nq/64⌉ blocks (params.h); 1: none.
int key_splits(int B, int Hq, int Nq, int Nk, int* split_blocks) {
  const int nkb = (Nk + 63) / 64;
  const std::int64_t blocks = std::int64_t((Nq + 63) / 64) * Hq * B;
  int splits = 1;
  if (std::int64_t(B) * Hq * Nq > 0x7fffffff) return 1;  // combine_kernel's grid: a block a row
  if (const char* e = std::getenv("ATTN_CUDA_SPLITS"); e && *e) {
    splits = std::atoi(e);
    splits = splits < 1 ? 1 : splits > nkb ? nkb : splits > 128 ? 128 : splits;
  } else if (blocks > 0 && nkb >= 8) {
    static const int sms = [] {  // the current device's, asked once
      int dev = 0, n = 0;
      return cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess
                 ? n
                 : 0;
    }();
    if (sms == 0) return 1;
    const std::int64_t want = (2 * std::int64_t(sms) + blocks - 1) / blocks;
    splits = int(want < nkb / 4 ? want : nkb / 4);
    if (splits > 128) splits = 128;
  }
  if (splits <= 1) return 1;
  *split_blocks = (nkb + splits - 1) / splits;
  return (nkb + *split_blocks - 1) / *split_blocks;  // no split left empty by the rounding
}
}  // namespace

forward_plan plan_forward(const dev_problem& p) {
  forward_plan r;
  const bool swap = p.Nq == 1 && p.Hq > p.Hkv && !p.mask && !p.alibi && p.window_left < 0 && p.window_right < 0 &&
                    (!p.causal || p.alignment == 1);
  if (swap) {
    r.splits = key_splits(p.B, p.Hkv, p.Hq / p.Hkv, p.Nk, &r.split_blocks);
    if (r.splits > 1) {
      r.row_heads = p.Hq / p.Hkv;
      return r;
    }
  }
  r.splits = key_splits(p.B, p.Hq, p.Nq, p.Nk, &r.split_blocks);
  return r;
}

int launch_forward(const dev_problem& p, const dev_forward& f) {
  const bool bf = p.type == elem::bf16;
  switch (padded_head_size(p.D, p.Dv)) {
    case 64: return bf ? run_forward<__nv_bfloat16, 64>(p, f) : run_forward<__half, 64>(p, f);
    case 128: return bf ? run_forward<__nv_bfloat16, 128>(p, f) : run_forward<__half, 128>(p, f);
    case 256: return bf ? run_forward<__nv_bfloat16, 256>(p, f) : run_forward<__half, 256>(p, f);
    default: return int(cudaErrorInvalidValue);
  }
}

}  // namespace attn::detail::cuda

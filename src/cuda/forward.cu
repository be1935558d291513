// src/cuda/forward.cu — the forward kernel's instantiations (f16, bf16 × head sizes 64, 128, 256).
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

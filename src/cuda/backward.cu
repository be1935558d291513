// src/cuda/backward.cu — the backward kernels' instantiations (f16, bf16 × head sizes 64, 128, 256).
#include "cuda/flash.cuh"

namespace attn::detail::cuda {

int launch_backward(const dev_problem& p, const dev_backward& g) {
  const bool bf = p.type == elem::bf16;
  switch (padded_head_size(p.D, p.Dv)) {
    case 64: return bf ? run_backward<__nv_bfloat16, 64>(p, g) : run_backward<__half, 64>(p, g);
    case 128: return bf ? run_backward<__nv_bfloat16, 128>(p, g) : run_backward<__half, 128>(p, g);
    case 256: return bf ? run_backward<__nv_bfloat16, 256>(p, g) : run_backward<__half, 256>(p, g);
    default: return int(cudaErrorInvalidValue);
  }
}

}  // namespace attn::detail::cuda

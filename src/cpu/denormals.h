// src/cpu/denormals.h — the float32 kernels run with denormals flushed to zero.
//
// On Intel cores every float operation that takes or gives a denormal (|x| < 2^-126 ≈ 1.2e-38)
// is a microcode assist of about a hundred cycles. Attention makes them wherever scores spread
// widely (general × softmax at D 128 with W uniform in [-1, 1): scores over ±100): a weight
// 2^-125 ≤ p < 2^-100 times a value or a dP − Δ below one is one, in P·V, dV = Pᵀ dO and
// dS = P ⊙ (dP − Δ) and in the products that take dS. B1 H8 N4096 D128 float32 general ×
// softmax, 2 threads on an Emerald Rapids Xeon: forward + backward 2.17 s with them, 1.12 s
// flushed (docs/PERFORMANCE.md, "Denormals flushed"). So each thread of the kernels' parallel
// regions sets MXCSR's FTZ (results that would be denormal are 0) and DAZ (denormal inputs read
// as 0) for the region and puts the caller's MXCSR back after it — the caller's thread and the
// OpenMP team's threads are left as they were. What it changes: values of magnitude below 2^-126
// become 0, 2^-102 below a float32 rounding of anything of order 1 that they are added to; the
// float64 paths (reference, tiled) are not touched. ATTN_CPU_DENORMALS=keep leaves MXCSR alone
// (read at each region). Elsewhere than x86 a no-op.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace attn::detail::cpu {

// Whether the kernels flush denormals: yes unless ATTN_CPU_DENORMALS=keep (isa.cc).
bool flush_denormals();

// FTZ and DAZ on the calling thread for the guard's lifetime (the first statement of a
// parallel region's body, so that every thread of the team, the caller's included, has them).
class denormals_flushed {
 public:
  denormals_flushed() {
#if defined(__x86_64__) || defined(__i386__)
    if (!flush_denormals()) return;
    saved_ = _mm_getcsr();
    _mm_setcsr(saved_ | kFtz | kDaz);
    set_ = true;
#endif
  }
  ~denormals_flushed() {
#if defined(__x86_64__) || defined(__i386__)
    if (set_) _mm_setcsr(saved_);
#endif
  }
  denormals_flushed(const denormals_flushed&) = delete;
  denormals_flushed& operator=(const denormals_flushed&) = delete;

 private:
  static constexpr unsigned kFtz = 1u << 15, kDaz = 1u << 6;
  unsigned saved_ = 0;
  bool set_ = false;
};

}  // namespace attn::detail::cpu

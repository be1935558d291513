// tools/attn/bench_blas.h — the unfused baseline of `attn bench`: attention as BLAS GEMM +
// softmax + GEMM (and its backward as five GEMMs), materialising the [G·Nq, Nk] score matrix of
// one key/value head at a time, with OpenBLAS.
//
// OpenBLAS is opened with dlopen, not linked: the attn tool builds and runs without it (the
// peer is then reported as absent), and OPENBLAS_CORETYPE can be set in our own environment
// before the library initialises. Debian's OpenBLAS 0.3.21 does not recognise AVX-512 on AMD
// Zen 4/5 and falls back to AVX2 kernels (and an environment may pin OPENBLAS_CORETYPE=Haswell
// as well), which would make the baseline look slower than OpenBLAS can be; so by default,
// where the CPU has AVX-512F, we set OPENBLAS_CORETYPE=SkylakeX. describe() tells which core
// type the library chose.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attn/tensor.h"
#include "bench_grid.h"

namespace attn::cli::bench {

// OPENBLAS_CORETYPE for an OpenBLAS not yet opened in this process (the library reads it once,
// when it initialises): "auto" sets SkylakeX where the CPU has AVX-512F (Debian's 0.3.21 does not
// know AMD's AVX-512 and would take its Haswell kernels), "env" keeps the environment's, anything
// else is set as the core name. Returns what was done, for the report (" (OPENBLAS_CORETYPE=...)").
std::string apply_openblas_coretype(const std::string& coretype);

class blas_baseline {
 public:
  // Opens OpenBLAS (the first call, once per process): $ATTN_BENCH_OPENBLAS, else
  // libopenblas.so.0. coretype: "auto" (SkylakeX where the CPU has AVX-512F, else the
  // environment's), "env" (OPENBLAS_CORETYPE as set), or a core name such as "Haswell".
  static blas_baseline& instance(const std::string& coretype = "auto");

  bool available() const { return sgemm_ != nullptr; }
  // "OpenBLAS 0.3.21 DYNAMIC_ARCH ... core SkylakeX (OPENBLAS_CORETYPE=SkylakeX set by attn bench)"
  // or why it is not available.
  const std::string& describe() const { return describe_; }
  // Why this workload is not run (scores too large to materialise), or "".
  std::string skip_reason(const workload& p, int threads) const;

  // out = softmax(scale · q kᵀ + causal mask) v, per key/value head: every [G·Nq, Nk] score
  // block is written, soft-maxed and read back. Heads are spread over `threads` threads with
  // single-threaded GEMMs (or, with fewer heads than threads, multithreaded GEMMs).
  void forward(const workload& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int threads);
  // dq, dk, dv from dout, recomputing the scores (S = q kᵀ, P, dV = Pᵀ dO, dP = dO vᵀ,
  // dS = P∘(dP − rowsum(dO∘O)), dQ = dS k, dK = dSᵀ q): 5 GEMMs, 2.5× the forward's.
  void backward(const workload& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv, int threads);

 private:
  explicit blas_baseline(const std::string& coretype);
  using sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                            int);
  using set_threads_fn = void (*)(int);
  struct scratch;
  template <class Body>
  void for_each_head(const workload& p, int threads, Body&& body);

  sgemm_fn sgemm_ = nullptr;
  set_threads_fn set_threads_ = nullptr;
  std::string describe_;
  std::vector<std::unique_ptr<scratch>> scratch_;
};

}  // namespace attn::cli::bench

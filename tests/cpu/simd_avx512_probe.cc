// tests/cpu/simd_avx512_probe.cc — simd.h's vexp2, vtanh and vsigmoid in their AVX-512 forms
// (vrndscaleps, vscalefps; vrcp14ps),
// for kernel_body_test: this unit alone is compiled with -mavx512f (tests/CMakeLists.txt), and
// the test calls it only where the CPU has AVX-512. No static initialisation here, so nothing of
// it runs on a CPU without.
#include <cstdint>

namespace attn::detail::cpu {
namespace {
constexpr int W = 16;  // floats per vector
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/simd.h"

namespace attn::detail::cpu {
// out[i] = vexp2(u[i]) for i < n (n a multiple of 16).
void vexp2_avx512_probe(const float* u, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i + W <= n; i += W) store(out + i, vexp2(load(u + i)));
}
// out[i] = vtanh(x[i]) for i < n (n a multiple of 16).
void vtanh_avx512_probe(const float* x, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i + W <= n; i += W) store(out + i, vtanh(load(x + i)));
}
// out[i] = vsigmoid(x[i]) for i < n (n a multiple of 16).
void vsigmoid_avx512_probe(const float* x, float* out, std::int64_t n) {
  for (std::int64_t i = 0; i + W <= n; i += W) store(out + i, vsigmoid(load(x + i)));
}
}  // namespace attn::detail::cpu

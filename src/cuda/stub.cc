// src/cuda/stub.cc — the cuda backend of a build without CUDA (ATTN_CUDA=OFF, or no nvcc): the
// registry entry refuses every call with that reason, and attn/cuda.h throws it.
#include <string>

#include "attn/cuda.h"
#include "core/common.h"
#include "core/problem.h"

namespace attn {
namespace detail {
namespace {
constexpr const char* kWhy = "this build has no CUDA (ATTN_CUDA=OFF or no nvcc at configure time)";
std::string why_not(const problem&, const backend_request&) { return std::string("cuda: ") + kWhy; }
std::string path(const problem&, const backend_request&) { return "not built"; }
void forward(const problem&, const forward_outputs&) { fail("cuda", kWhy); }
void backward(const problem&, const backward_io&) { fail("cuda", kWhy); }
}  // namespace
const backend_impl& cuda_backend() {
  static const backend_impl b{backend::cuda, why_not, path, forward, backward, /*explicit_only=*/true};
  return b;
}
}  // namespace detail

namespace cuda {
bool available() { return false; }
std::string unavailable_reason() { return detail::kWhy; }
std::string device_name() { detail::fail("attn::cuda::device_name", detail::kWhy); }
void synchronize() { detail::fail("attn::cuda::synchronize", detail::kWhy); }
DeviceTensor::DeviceTensor(dtype, Shape) { detail::fail("attn::cuda::DeviceTensor", detail::kWhy); }
DeviceTensor DeviceTensor::from_host(const TensorView&) { detail::fail("attn::cuda::DeviceTensor", detail::kWhy); }
Tensor DeviceTensor::to_host() const { detail::fail("attn::cuda::DeviceTensor", detail::kWhy); }
void DeviceTensor::copy_from(const TensorView&) { detail::fail("attn::cuda::DeviceTensor", detail::kWhy); }
std::int64_t DeviceTensor::numel() const { return 0; }
device_result attention(const DeviceTensor&, const DeviceTensor&, const DeviceTensor&, const attention_options&) {
  detail::fail("attn::cuda::attention", detail::kWhy);
}
device_grads attention_backward(const DeviceTensor&, const DeviceTensor&, const DeviceTensor&, const DeviceTensor&,
                                const DeviceTensor&, const DeviceTensor&, const attention_options&) {
  detail::fail("attn::cuda::attention_backward", detail::kWhy);
}
void attention_into(const DeviceTensor&, const DeviceTensor&, const DeviceTensor&, const DeviceTensor&,
                    const DeviceTensor&, const attention_options&) {
  detail::fail("attn::cuda::attention_into", detail::kWhy);
}
device_grads attention_backward_into(const DeviceTensor&, const DeviceTensor&, const DeviceTensor&,
                                     const DeviceTensor&, const DeviceTensor&, const DeviceTensor&,
                                     const DeviceTensor&, const DeviceTensor&, const DeviceTensor&,
                                     const attention_options&) {
  detail::fail("attn::cuda::attention_backward_into", detail::kWhy);
}
}  // namespace cuda
}  // namespace attn

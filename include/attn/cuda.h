// attn/cuda.h — the core op on an NVIDIA GPU (src/cuda, built when CMake finds nvcc: ATTN_CUDA).
//
// Two ways in:
//   * host tensors through the usual front, asked for explicitly — the tensors are copied to the
//     device and back, so this is for checking and convenience, not speed:
//       attn::attention(q, k, v, opt, {.use_backend = attn::backend::cuda});
//   * device tensors, no copies of q, k, v or the results:
//       auto q = attn::cuda::DeviceTensor::from_host(q_host);   // or DeviceTensor(dtype, shape)
//       auto r = attn::cuda::attention(q, k, v, opt);            // r.out, r.lse on the device
//       auto g = attn::cuda::attention_backward(q, k, v, r.out, r.lse, dout, opt);
//       attn::cuda::attention_into(q, k, v, out, lse, opt);      // into given tensors, no allocation
//
// The kernels take float16 and bfloat16 inputs (float32 accumulation, tensor cores), head sizes
// D and Dv that are multiples of 8 up to 256, and every option of attention_options except the
// qk output, ONNX's past_key/past_value, check_finite and the float-mask gradient (those stay on
// the host backends). Masks, ALiBi slopes, sinks and nonpad_kv_seqlen are host tensors, copied
// at each call. Results are deterministic (no atomics). Without a device (or in a build without
// CUDA) available() is false, unavailable_reason() says why, and every call throws attn::error.
#pragma once

#include <memory>
#include <string>

#include "attn/attention.h"
#include "attn/tensor.h"

namespace attn::cuda {

// Whether this build has the cuda backend and a CUDA device can run it.
bool available();
// Why not ("" when available): "this build has no CUDA (ATTN_CUDA=OFF)", "no CUDA device: ...".
std::string unavailable_reason();
// "NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"; throws attn::error when unavailable.
std::string device_name();
// Waits for every kernel launched so far (cudaDeviceSynchronize), as attn::error on failure.
void synchronize();

// An owning C-contiguous tensor in device memory.
class DeviceTensor {
 public:
  DeviceTensor() = default;
  DeviceTensor(dtype t, Shape shape);  // uninitialised
  static DeviceTensor from_host(const TensorView& host);
  Tensor to_host() const;
  // Copies a host view of the same shape and dtype into this tensor.
  void copy_from(const TensorView& host);

  void* data() const { return mem_.get(); }
  dtype type() const { return type_; }
  const Shape& shape() const { return shape_; }
  std::int64_t numel() const;
  // A view of the device memory: its data pointer is a device pointer, for attn::cuda calls only.
  TensorView view() const { return TensorView(mem_.get(), type_, shape_); }

 private:
  std::shared_ptr<void> mem_;
  dtype type_ = dtype::f32;
  Shape shape_;
};

struct device_result {
  DeviceTensor out;  // like attention_result::out
  DeviceTensor lse;  // float32 [B, Hq, Nq]
};
device_result attention(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                        const attention_options& options = {});
// The same, written into given tensors (out: q's dtype and attention's out shape; lse: float32
// [B, Hq, Nq]) and without waiting for the kernels: nothing is allocated but stream-ordered
// scratch, for decode loops and for timing the kernels alone. attn::error on a wrong shape or
// dtype, naming the tensor.
void attention_into(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v, const DeviceTensor& out,
                    const DeviceTensor& lse, const attention_options& options = {});

struct device_grads {
  DeviceTensor dq, dk, dv;
  Tensor dalibi_slopes;  // host, like attention_grads (set when ALiBi slopes were given)
  Tensor dsinks;         // host (set when sinks were given)
};
device_grads attention_backward(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                                const DeviceTensor& out, const DeviceTensor& lse, const DeviceTensor& dout,
                                const attention_options& options = {});
// The same, written into given dq, dk, dv (the dtype and shape of q, k, v); the result's dq, dk,
// dv are those tensors (DeviceTensor shares its memory), the slope and sink gradients on the host.
device_grads attention_backward_into(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                                     const DeviceTensor& out, const DeviceTensor& lse, const DeviceTensor& dout,
                                     const DeviceTensor& dq, const DeviceTensor& dk, const DeviceTensor& dv,
                                     const attention_options& options = {});

}  // namespace attn::cuda

// python/src/arrays.cc — see arrays.h.
#include "arrays.h"

#include <fmt/format.h>

#include <string>

#include "attn/error.h"

namespace attn::py {

namespace {

const char* device_name(int type) {
  switch (type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::rocm::value: return "rocm";
    case nb::device::metal::value: return "metal";
    default: return "an accelerator";
  }
}

std::string dlpack_name(nb::dlpack::dtype t) {
  const char* code = "?";
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int: code = "int"; break;
    case nb::dlpack::dtype_code::UInt: code = "uint"; break;
    case nb::dlpack::dtype_code::Float: code = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: code = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: code = "complex"; break;
    case nb::dlpack::dtype_code::Bool: code = "bool"; break;
  }
  return fmt::format("{}{}", code, int(t.bits));
}

std::optional<dtype> attn_dtype(nb::dlpack::dtype t) {
  if (t.lanes != 1) return std::nullopt;
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Float:
      if (t.bits == 32) return dtype::f32;
      if (t.bits == 16) return dtype::f16;
      if (t.bits == 64) return dtype::f64;
      break;
    case nb::dlpack::dtype_code::Bfloat:
      if (t.bits == 16) return dtype::bf16;
      break;
    case nb::dlpack::dtype_code::UInt:
      if (t.bits == 16) return dtype::bf16;  // ml_dtypes.bfloat16 passed as a uint16 view
      if (t.bits == 8) break;
      break;
    case nb::dlpack::dtype_code::Bool:
      if (t.bits == 8) return dtype::boolean;
      break;
    case nb::dlpack::dtype_code::Int:
      if (t.bits == 64) return dtype::i64;
      if (t.bits == 32) return dtype::i32;
      if (t.bits == 8) return dtype::i8;
      break;
    default: break;
  }
  return std::nullopt;
}

nb::dlpack::dtype dlpack_of(dtype t, kind k) {
  switch (t) {
    case dtype::f32: return nb::dtype<float>();
    case dtype::f64: return nb::dtype<double>();
    case dtype::f16: return {std::uint8_t(nb::dlpack::dtype_code::Float), 16, 1};
    case dtype::bf16:
      if (k == kind::numpy) return nb::dtype<std::uint16_t>();
      return {std::uint8_t(nb::dlpack::dtype_code::Bfloat), 16, 1};
    case dtype::boolean: return nb::dtype<bool>();
    case dtype::i64: return nb::dtype<std::int64_t>();
    case dtype::i8: return nb::dtype<std::int8_t>();
    case dtype::i32: return nb::dtype<std::int32_t>();
  }
  return nb::dtype<float>();
}

}  // namespace

TensorView view_of(const Array& a, const char* op, const char* name) {
  if (a.device_type() != nb::device::cpu::value)
    throw error(fmt::format("{}: {} is on device {}, attn computes on the cpu; move it with .cpu()", op, name,
                            device_name(a.device_type())));
  const std::optional<dtype> t = attn_dtype(a.dtype());
  if (!t)
    throw error(fmt::format("{}: {} has dtype {}, expected float32, float16, bfloat16, float64, bool, int64, int32 or int8", op,
                            name, dlpack_name(a.dtype())));
  Shape shape(a.ndim()), strides(a.ndim());
  for (size_t i = 0; i < a.ndim(); ++i) {
    shape[i] = std::int64_t(a.shape(i));
    strides[i] = a.stride(i);
    if (strides[i] < 0 && shape[i] > 1)
      throw error(fmt::format("{}: {} has a negative stride on dim {}; attn reads strides >= 0", op, name, i));
    if (shape[i] <= 1) strides[i] = std::max<std::int64_t>(strides[i], 0);
  }
  return TensorView(const_cast<void*>(a.data()), *t, std::move(shape), std::move(strides));
}

std::optional<TensorArg> view_of(const std::optional<Array>& a, const char* op, const char* name) {
  if (!a) return std::nullopt;
  return TensorArg(view_of(*a, op, name));
}

nb::object to_python(const Tensor& t, kind k) {
  if (!t.defined()) return nb::none();
  auto* keep = new Tensor(t);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape(t.shape().begin(), t.shape().end());
  const nb::dlpack::dtype dt = dlpack_of(t.type(), k);
  if (k == kind::torch)
    return nb::ndarray<nb::pytorch>(keep->data(), shape.size(), shape.data(), owner, nullptr, dt).cast();
  return nb::ndarray<nb::numpy>(keep->data(), shape.size(), shape.data(), owner, nullptr, dt).cast();
}

}  // namespace attn::py

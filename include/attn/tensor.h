// attn/tensor.h — dtypes, a non-owning strided view and an owning tensor.
//
// Shapes and strides are in elements (not bytes). A stride may be 0 (broadcast) or any
// positive value (transposed, sliced views). Views never own memory; Tensor owns its
// storage through a shared pointer and converts implicitly to a view.
//
//   attn::Tensor q = attn::Tensor::zeros({2, 8, 128, 64}, attn::dtype::f32);
//   attn::TensorView kt = q.view().transpose(2, 3);   // [2, 8, 64, 128], no copy
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace attn {

enum class dtype : std::uint8_t { f32, f16, bf16, f64, boolean, i64, i8, i32 };

std::size_t dtype_size(dtype t);
// "float32", "float16", "bfloat16", "float64", "bool", "int64", "int8", "int32" (NumPy names).
std::string_view dtype_name(dtype t);
bool is_floating(dtype t);

// ---- scalar conversions (round to nearest even) ----
float f16_to_f32(std::uint16_t h);
std::uint16_t f32_to_f16(float f);
inline float bf16_to_f32(std::uint16_t b) {
  std::uint32_t u = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t f32_to_bf16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

using Shape = std::vector<std::int64_t>;

// "[2, 8, 128, 64]"
std::string shape_str(std::span<const std::int64_t> s);

// Non-owning view: pointer + dtype + shape + element strides.
class TensorView {
 public:
  TensorView() = default;
  // Empty `strides` means C-contiguous.
  TensorView(void* data, dtype t, Shape shape, Shape strides = {});

  void* data() const { return data_; }
  template <class T>
  T* data_as() const { return static_cast<T*>(data_); }
  dtype type() const { return dtype_; }
  int rank() const { return int(shape_.size()); }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  std::int64_t size(int dim) const;    // negative dims count from the end
  std::int64_t stride(int dim) const;  // negative dims count from the end
  std::int64_t numel() const;
  bool defined() const { return data_ != nullptr || numel() == 0; }
  bool is_contiguous() const;

  // Views that share memory.
  TensorView transpose(int a, int b) const;
  TensorView permute(std::span<const int> order) const;
  TensorView permute(std::initializer_list<int> order) const {
    return permute(std::span<const int>(order.begin(), order.size()));
  }
  // Requires a layout where the reshape needs no copy (always true when contiguous).
  TensorView reshape(Shape shape) const;
  // NumPy broadcasting of this view to `shape` (stride 0 on new/expanded dims).
  TensorView broadcast_to(const Shape& shape) const;
  TensorView slice(int dim, std::int64_t begin, std::int64_t end) const;

  // Element access by multi-index, converting through double (for tests and references).
  double get(std::span<const std::int64_t> index) const;
  void set(std::span<const std::int64_t> index, double value) const;
  double get(std::initializer_list<std::int64_t> index) const {
    return get(std::span<const std::int64_t>(index.begin(), index.size()));
  }
  void set(std::initializer_list<std::int64_t> index, double value) const {
    set(std::span<const std::int64_t>(index.begin(), index.size()), value);
  }
  std::int64_t offset_of(std::span<const std::int64_t> index) const;

 private:
  void* data_ = nullptr;
  dtype dtype_ = dtype::f32;
  Shape shape_;
  Shape strides_;
};

// Reads element `offset` (in elements) of a buffer of type `t` as double; writes likewise.
double load_as_double(const void* base, dtype t, std::int64_t offset);
void store_from_double(void* base, dtype t, std::int64_t offset, double value);

class TensorArg;

// Tensor buffers of 1 MiB or more, and the kernels' working memory of that size (packed or
// transposed K/V, gathered pages), are kept when freed (at most 512 MiB in all, the most recently
// freed first) and handed to the next allocation of the same size, so that a repeated call
// writes into pages the process already has rather than fresh ones (a page fault and the kernel's
// zeroing each). release_cached_buffers() gives them back to the system and returns their bytes;
// cached_buffer_bytes() is what is kept now.
std::size_t release_cached_buffers();
std::size_t cached_buffer_bytes();

// Owning, C-contiguous tensor. Copies share storage (like a shared_ptr).
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(Shape shape, dtype t);
  static Tensor zeros(Shape shape, dtype t);
  static Tensor full(Shape shape, dtype t, double value);
  // From float64 values, converted to `t`.
  static Tensor from_values(Shape shape, dtype t, std::span<const double> values);
  static Tensor from_values(Shape shape, dtype t, std::initializer_list<double> values) {
    return from_values(std::move(shape), t, std::span<const double>(values.begin(), values.size()));
  }
  // A contiguous copy of any view, converted to `t`.
  static Tensor copy_of(const TensorView& v, dtype t);
  static Tensor copy_of(const TensorView& v) { return copy_of(v, v.type()); }

  const TensorView& view() const { return view_; }
  operator const TensorView&() const { return view_; }  // NOLINT: implicit by design
  bool defined() const { return storage_ != nullptr || (!view_.shape().empty() && view_.numel() == 0); }

  void* data() const { return view_.data(); }
  template <class T>
  T* data_as() const { return view_.data_as<T>(); }
  dtype type() const { return view_.type(); }
  int rank() const { return view_.rank(); }
  const Shape& shape() const { return view_.shape(); }
  std::int64_t size(int dim) const { return view_.size(dim); }
  std::int64_t numel() const { return view_.numel(); }
  double get(std::initializer_list<std::int64_t> index) const { return view_.get(index); }
  void set(std::initializer_list<std::int64_t> index, double value) const { view_.set(index, value); }
  // All elements in C order, as float64.
  std::vector<double> to_vector() const;
  Tensor to(dtype t) const { return copy_of(view_, t); }

 private:
  friend class TensorArg;
  std::shared_ptr<std::byte[]> storage_;
  TensorView view_;
};

// A tensor held by an options struct (attention_options::attn_mask, score_spec::W, ...): a view
// that, when made from a Tensor, shares ownership of the Tensor's storage. Filling an option
// from a temporary is therefore safe:
//
//   opt.attn_mask = attn::relative_position_bias(table, Nq, Nk, rp);   // the bias lives in opt
//
// Made from a TensorView it only borrows, and the caller keeps that memory alive for the call.
class TensorArg : public TensorView {
 public:
  TensorArg() = default;
  TensorArg(const TensorView& v) : TensorView(v) {}                      // NOLINT: implicit by design
  TensorArg(const Tensor& t) : TensorView(t.view()), owner_(t.storage_) {}  // NOLINT: implicit by design

  // True when this argument keeps its memory alive itself (it was made from a Tensor).
  bool owns_storage() const { return owner_ != nullptr; }

 private:
  std::shared_ptr<const std::byte[]> owner_;
};

// All elements of a view in C order, as float64.
std::vector<double> to_vector(const TensorView& v);

}  // namespace attn

// src/core/tensor.cc — dtypes, views and owning tensors.
#include "attn/tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <new>
#include <numeric>
#include <type_traits>

#include "attn/error.h"

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace attn {

std::size_t dtype_size(dtype t) {
  switch (t) {
    case dtype::f32: return 4;
    case dtype::f16: return 2;
    case dtype::bf16: return 2;
    case dtype::f64: return 8;
    case dtype::boolean: return 1;
    case dtype::i64: return 8;
    case dtype::i8: return 1;
    case dtype::i32: return 4;
  }
  return 0;
}

std::string_view dtype_name(dtype t) {
  switch (t) {
    case dtype::f32: return "float32";
    case dtype::f16: return "float16";
    case dtype::bf16: return "bfloat16";
    case dtype::f64: return "float64";
    case dtype::boolean: return "bool";
    case dtype::i64: return "int64";
    case dtype::i8: return "int8";
    case dtype::i32: return "int32";
  }
  return "?";
}

bool is_floating(dtype t) {
  return t == dtype::f32 || t == dtype::f16 || t == dtype::bf16 || t == dtype::f64;
}

// IEEE binary16 <-> binary32, round to nearest even; handles subnormals, inf and NaN.
float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t man = h & 0x3ffu;
  std::uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        man <<= 1;
      } while ((man & 0x400u) == 0);
      u = sign | (std::uint32_t(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
    }
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::uint16_t f32_to_f16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // overflow (>= 65520) and inf
  if (u < 0x38800000u) {                         // subnormal or zero in f16
    if (u < 0x33000000u) return sign;            // < 2^-25: rounds to zero
    const std::uint32_t exp = u >> 23;
    const std::uint32_t man = (u & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exp;  // 14 + (112 - exp) ... bits to drop
    const std::uint32_t drop = shift;       // man >> drop gives the f16 subnormal mantissa
    std::uint32_t r = man >> drop;
    const std::uint32_t rem = man & ((1u << drop) - 1);
    const std::uint32_t half = 1u << (drop - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | std::uint16_t(r);
  }
  std::uint32_t r = u - 0x38000000u;  // rebias exponent 127 -> 15
  r = (r + 0xfffu + ((r >> 13) & 1u)) >> 13;
  return sign | std::uint16_t(r);
}

std::string shape_str(std::span<const std::int64_t> s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

namespace {
// a·b, or attn::error naming `what` when it leaves int64.
std::int64_t checked_mul(std::int64_t a, std::int64_t b, const Shape& shape, const char* what) {
  std::int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw error(fmt::format("tensor: shape {} has more {} than int64 holds", shape_str(shape), what));
  return r;
}
Shape contiguous_strides(const Shape& shape) {
  Shape st(shape.size());
  std::int64_t acc = 1;
  for (int i = int(shape.size()) - 1; i >= 0; --i) {
    st[i] = acc;
    if (i > 0) acc = checked_mul(acc, std::max<std::int64_t>(shape[i], 1), shape, "elements");
  }
  return st;
}
// Every element of a view must be addressable: numel and the largest offset fit in int64
// (a broadcast view of a huge logical shape is refused here, not by a crash later).
void check_extent(const Shape& shape, const Shape& strides) {
  std::int64_t n = 1, last = 0;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    n = checked_mul(n, shape[i], shape, "elements");
    if (shape[i] > 1 && __builtin_add_overflow(last, checked_mul(shape[i] - 1, strides[i], shape, "element offsets"), &last))
      throw error(fmt::format("tensor: shape {} with strides {} has offsets beyond int64", shape_str(shape),
                              shape_str(strides)));
  }
}
int norm_dim(int dim, int rank, const char* what) {
  const int d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank) throw error(fmt::format("tensor.{}: dim {} out of range for rank {}", what, dim, rank));
  return d;
}
}  // namespace

TensorView::TensorView(void* data, dtype t, Shape shape, Shape strides)
    : data_(data), dtype_(t), shape_(std::move(shape)), strides_(std::move(strides)) {
  for (auto s : shape_)
    if (s < 0) throw error(fmt::format("tensor: negative size in shape {}", shape_str(shape_)));
  if (strides_.empty()) {
    strides_ = contiguous_strides(shape_);
  } else if (strides_.size() != shape_.size()) {
    throw error(fmt::format("tensor: {} strides for shape {} of rank {}", strides_.size(), shape_str(shape_),
                            shape_.size()));
  }
  for (auto s : strides_)
    if (s < 0) throw error(fmt::format("tensor: negative stride in {}", shape_str(strides_)));
  check_extent(shape_, strides_);
}

std::int64_t TensorView::size(int dim) const { return shape_[norm_dim(dim, rank(), "size")]; }
std::int64_t TensorView::stride(int dim) const { return strides_[norm_dim(dim, rank(), "stride")]; }
std::int64_t TensorView::numel() const {
  return std::accumulate(shape_.begin(), shape_.end(), std::int64_t{1}, std::multiplies<>());
}
bool TensorView::is_contiguous() const {
  if (numel() == 0) return true;  // nothing to lay out
  std::int64_t acc = 1;
  for (int i = rank() - 1; i >= 0; --i) {
    if (shape_[i] != 1 && strides_[i] != acc) return false;
    acc *= shape_[i];
  }
  return true;
}

TensorView TensorView::transpose(int a, int b) const {
  a = norm_dim(a, rank(), "transpose");
  b = norm_dim(b, rank(), "transpose");
  TensorView r = *this;
  std::swap(r.shape_[a], r.shape_[b]);
  std::swap(r.strides_[a], r.strides_[b]);
  return r;
}

TensorView TensorView::permute(std::span<const int> order) const {
  if (int(order.size()) != rank())
    throw error(fmt::format("tensor.permute: {} dims given for rank {}", order.size(), rank()));
  std::vector<bool> seen(rank());
  TensorView r = *this;
  for (int i = 0; i < rank(); ++i) {
    const int d = norm_dim(order[i], rank(), "permute");
    if (seen[d]) throw error(fmt::format("tensor.permute: dim {} repeated", d));
    seen[d] = true;
    r.shape_[i] = shape_[d];
    r.strides_[i] = strides_[d];
  }
  return r;
}

TensorView TensorView::reshape(Shape shape) const {
  std::int64_t n = 1;
  int infer = -1;
  for (int i = 0; i < int(shape.size()); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) throw error("tensor.reshape: more than one -1");
      infer = i;
    } else {
      n *= shape[i];
    }
  }
  if (infer >= 0) shape[infer] = n == 0 ? 0 : numel() / n, n *= shape[infer];
  if (n != numel())
    throw error(fmt::format("tensor.reshape: cannot view {} as {}", shape_str(shape_), shape_str(shape)));
  if (!is_contiguous())
    throw error(fmt::format("tensor.reshape: view {} with strides {} is not contiguous", shape_str(shape_),
                            shape_str(strides_)));
  return TensorView(data_, dtype_, std::move(shape));
}

TensorView TensorView::broadcast_to(const Shape& shape) const {
  if (shape.size() < shape_.size())
    throw error(fmt::format("tensor.broadcast_to: cannot broadcast {} to {}", shape_str(shape_), shape_str(shape)));
  TensorView r;
  r.data_ = data_;
  r.dtype_ = dtype_;
  r.shape_ = shape;
  r.strides_.assign(shape.size(), 0);
  const std::size_t off = shape.size() - shape_.size();
  for (std::size_t i = 0; i < shape_.size(); ++i) {
    if (shape_[i] == shape[off + i]) {
      r.strides_[off + i] = shape_[i] == 1 ? 0 : strides_[i];
    } else if (shape_[i] != 1) {
      throw error(fmt::format("tensor.broadcast_to: cannot broadcast {} to {}", shape_str(shape_), shape_str(shape)));
    }
  }
  for (auto s : shape)
    if (s < 0) throw error(fmt::format("tensor.broadcast_to: negative size in shape {}", shape_str(shape)));
  check_extent(r.shape_, r.strides_);
  return r;
}

TensorView TensorView::slice(int dim, std::int64_t begin, std::int64_t end) const {
  dim = norm_dim(dim, rank(), "slice");
  if (begin < 0 || end < begin || end > shape_[dim])
    throw error(fmt::format("tensor.slice: [{}, {}) out of range for dim {} of size {}", begin, end, dim, shape_[dim]));
  TensorView r = *this;
  r.data_ = static_cast<std::byte*>(data_) + begin * strides_[dim] * std::int64_t(dtype_size(dtype_));
  r.shape_[dim] = end - begin;
  return r;
}

std::int64_t TensorView::offset_of(std::span<const std::int64_t> index) const {
  if (int(index.size()) != rank())
    throw error(fmt::format("tensor: index of {} dims for rank {}", index.size(), rank()));
  std::int64_t off = 0;
  for (int i = 0; i < rank(); ++i) {
    if (index[i] < 0 || index[i] >= shape_[i])
      throw error(fmt::format("tensor: index {} out of range for shape {}", shape_str(index), shape_str(shape_)));
    off += index[i] * strides_[i];
  }
  return off;
}

double load_as_double(const void* base, dtype t, std::int64_t i) {
  switch (t) {
    case dtype::f32: return static_cast<const float*>(base)[i];
    case dtype::f16: return f16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    case dtype::bf16: return bf16_to_f32(static_cast<const std::uint16_t*>(base)[i]);
    case dtype::f64: return static_cast<const double*>(base)[i];
    case dtype::boolean: return static_cast<const bool*>(base)[i] ? 1.0 : 0.0;
    case dtype::i64: return double(static_cast<const std::int64_t*>(base)[i]);
    case dtype::i8: return double(static_cast<const std::int8_t*>(base)[i]);
    case dtype::i32: return double(static_cast<const std::int32_t*>(base)[i]);
  }
  return 0;
}

void store_from_double(void* base, dtype t, std::int64_t i, double x) {
  switch (t) {
    case dtype::f32: static_cast<float*>(base)[i] = float(x); break;
    case dtype::f16: static_cast<std::uint16_t*>(base)[i] = f32_to_f16(float(x)); break;
    case dtype::bf16: static_cast<std::uint16_t*>(base)[i] = f32_to_bf16(float(x)); break;
    case dtype::f64: static_cast<double*>(base)[i] = x; break;
    case dtype::boolean: static_cast<bool*>(base)[i] = x != 0.0; break;
    case dtype::i64: static_cast<std::int64_t*>(base)[i] = std::int64_t(x); break;
    case dtype::i8: static_cast<std::int8_t*>(base)[i] = std::int8_t(x); break;
    case dtype::i32: static_cast<std::int32_t*>(base)[i] = std::int32_t(x); break;
  }
}

double TensorView::get(std::span<const std::int64_t> index) const {
  return load_as_double(data_, dtype_, offset_of(index));
}
void TensorView::set(std::span<const std::int64_t> index, double value) const {
  store_from_double(data_, dtype_, offset_of(index), value);
}

namespace {
// Calls f(offset) for every element of `shape`/`strides` in C order.
template <class F>
void for_each_offset(const Shape& shape, const Shape& strides, F&& f) {
  const int r = int(shape.size());
  for (auto s : shape)
    if (s == 0) return;
  std::vector<std::int64_t> idx(r, 0);
  std::int64_t off = 0;
  while (true) {
    f(off);
    int d = r - 1;
    for (; d >= 0; --d) {
      if (++idx[d] < shape[d]) {
        off += strides[d];
        break;
      }
      off -= (shape[d] - 1) * strides[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

// The float dtypes as C++ types (f16 and bf16 as their bit patterns in distinct wrappers), for
// typed conversion loops that give what load_as_double / store_from_double give.
struct f16_bits {
  std::uint16_t b;
};
struct bf16_bits {
  std::uint16_t b;
};
inline double to_double(float x) { return x; }
inline double to_double(double x) { return x; }
inline double to_double(f16_bits x) { return f16_to_f32(x.b); }
inline double to_double(bf16_bits x) { return bf16_to_f32(x.b); }
template <class T>
inline T from_double(double x) {
  if constexpr (std::is_same_v<T, float>) return float(x);
  else if constexpr (std::is_same_v<T, double>) return x;
  else if constexpr (std::is_same_v<T, f16_bits>) return {f32_to_f16(float(x))};
  else return {f32_to_bf16(float(x))};
}
template <class F>
void with_float_type(dtype t, F&& f) {
  switch (t) {
    case dtype::f32: return f(float{});
    case dtype::f64: return f(double{});
    case dtype::f16: return f(f16_bits{});
    case dtype::bf16: return f(bf16_bits{});
    default: break;
  }
}

}  // namespace

std::vector<double> to_vector(const TensorView& v) {
  if (!v.defined()) throw error("tensor.to_vector: the tensor is undefined (no data; e.g. a gradient not computed)");
  std::vector<double> out;
  out.reserve(std::size_t(v.numel()));
  for_each_offset(v.shape(), v.strides(), [&](std::int64_t off) { out.push_back(load_as_double(v.data(), v.type(), off)); });
  return out;
}

namespace {

// Freed buffers of a MiB or more (kKeepMin below: Tensors, and the backends' working memory
// through detail::alloc_working), kept for the next allocation of the same size: a
// process that repeats a call (a training step, a layer, attention() in a loop) then writes into
// pages it already has. Fresh ones cost a page fault and the kernel's zeroing each — on a virtual
// machine whose host takes freed memory back, 2–3 ms an 8 MiB buffer, up to a fifth of an
// attention() call (docs/PERFORMANCE.md, "Fresh memory") — and glibc maps and unmaps each
// 2 MiB-aligned block afresh. At most kCacheBytes in all, the most recently freed kept first;
// release_cached_buffers() gives them back.
constexpr std::size_t kHuge = std::size_t(2) << 20, kHugeMin = 4 * kHuge, kCacheBytes = std::size_t(512) << 20;

class buffer_cache {
 public:
  // A kept block of exactly `size` bytes (the most recent), or null.
  void* take(std::size_t size) {
    std::lock_guard<std::mutex> lock(m_);
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
      if (it->first == size) {
        void* p = it->second;
        bytes_ -= size;
        blocks_.erase(std::next(it).base());
        return p;
      }
    return nullptr;
  }
  // Keeps p (size bytes), giving back the oldest blocks to stay within kCacheBytes.
  void give(void* p, std::size_t size) {
    std::vector<void*> drop;
    {
      std::lock_guard<std::mutex> lock(m_);
      if (size > kCacheBytes) {
        drop.push_back(p);
      } else {
        while (bytes_ + size > kCacheBytes) {
          drop.push_back(blocks_.front().second);
          bytes_ -= blocks_.front().first;
          blocks_.erase(blocks_.begin());
        }
        blocks_.push_back({size, p});
        bytes_ += size;
      }
    }
    for (void* d : drop) std::free(d);
  }
  std::size_t release() {
    std::vector<std::pair<std::size_t, void*>> all;
    {
      std::lock_guard<std::mutex> lock(m_);
      all.swap(blocks_);
      bytes_ = 0;
    }
    std::size_t n = 0;
    for (const auto& [size, p] : all) n += size, std::free(p);
    return n;
  }
  std::size_t bytes() {
    std::lock_guard<std::mutex> lock(m_);
    return bytes_;
  }

 private:
  std::mutex m_;
  std::vector<std::pair<std::size_t, void*>> blocks_;  // oldest first
  std::size_t bytes_ = 0;
};

// Never destroyed: a Tensor held in a static may be freed after every other static is gone.
buffer_cache& huge_buffers() {
  static buffer_cache* c = new buffer_cache;
  return *c;
}

}  // namespace

std::size_t release_cached_buffers() { return huge_buffers().release(); }
std::size_t cached_buffer_bytes() { return huge_buffers().bytes(); }

namespace detail {

// A block of kHugeMin bytes or more is aligned to 2 MiB and asks the kernel for transparent huge
// pages, which it gives where THP is in `madvise` mode (the usual default): reading one in the
// order a kernel walks it (a head's rows, a page of a paged cache) then misses the TLB once per
// 2 MiB rather than once per 4 KiB. Measured: paged bf16 decode (Hq 32 / Hkv 8, D 128, Nk 16384,
// 2 threads) 3.5 → 3.0 ms, the dense decode 2.8 → 2.4 ms (docs/SERVING.md). Every block of
// kKeepMin bytes or more — a Tensor's or the kernels' working memory — comes from and goes back
// to huge_buffers() (above), the smaller ones in whole 4 KiB pages: glibc serves a block of that
// size from a fresh mmap unless it has freed a larger mapped block before (its threshold moves
// up then), so whether a call's 4 MiB pack or result faulted every call depended on what the
// process had freed earlier (the bf16 forward H8 N2048 D128 in the standard grid: 6 % slower once
// the larger blocks stopped being freed; the family's general × softmax, whose front converts
// and projects q through 4 MiB tensors, 32 000 faults in 41 calls or 88 000 by the order of a
// few small frees, 7 000 with them kept). Smaller blocks are malloc's, 64-byte aligned.
constexpr std::size_t kKeepMin = std::size_t(1) << 20, kPage = 4096;

namespace {
std::size_t block_size(std::size_t bytes, bool& huge, bool& kept) {
  bytes = std::max<std::size_t>(bytes, 1);
  huge = bytes >= kHugeMin, kept = bytes >= kKeepMin;
  const std::size_t align = huge ? kHuge : kept ? kPage : 64;
  return (bytes + align - 1) / align * align;
}
void* take_block(std::size_t bytes) {
  bool huge = false, kept = false;
  const std::size_t size = block_size(bytes, huge, kept);
  void* mem = kept ? huge_buffers().take(size) : nullptr;
  if (!mem) {
    mem = std::aligned_alloc(huge ? kHuge : kept ? kPage : 64, size);
#ifdef __linux__
    if (mem && huge) madvise(mem, size, MADV_HUGEPAGE);  // a hint: refused (THP off, an old kernel) changes nothing
#endif
  }
  return mem;
}
void give_block(void* p, std::size_t bytes) {
  if (!p) return;
  bool huge = false, kept = false;
  const std::size_t size = block_size(bytes, huge, kept);
  if (kept) huge_buffers().give(p, size);
  else std::free(p);
}
}  // namespace

void* alloc_working(std::size_t bytes) { return take_block(bytes); }
void free_working(void* p, std::size_t bytes) { give_block(p, bytes); }

}  // namespace detail

Tensor Tensor::empty(Shape shape, dtype t) {
  Tensor r;
  std::int64_t n = 1;
  for (auto s : shape) {
    if (s < 0) throw error(fmt::format("tensor: negative size in shape {}", shape_str(shape)));
    n = checked_mul(n, s, shape, "elements");
  }
  const std::int64_t bytes = checked_mul(std::max<std::int64_t>(n, 1), std::int64_t(dtype_size(t)), shape, "bytes");
  // 64-byte aligned (a cache line, an AVX-512 vector); a buffer of 8 MiB or more (a KV cache, a
  // weight matrix) 2 MiB aligned, on huge pages where the kernel gives them; one of 1 MiB or more
  // kept when freed for the next of its size (take_block, above).
  void* mem = detail::take_block(std::size_t(bytes));
  if (!mem) throw error(fmt::format("tensor: cannot allocate {} bytes for shape {} of {}", bytes, shape_str(shape), dtype_name(t)));
  r.storage_ = std::shared_ptr<std::byte[]>(static_cast<std::byte*>(mem),
                                            [bytes](std::byte* m) { detail::give_block(m, std::size_t(bytes)); });
  r.view_ = TensorView(r.storage_.get(), t, std::move(shape));
  return r;
}

Tensor Tensor::zeros(Shape shape, dtype t) {
  Tensor r = empty(std::move(shape), t);
  std::memset(r.data(), 0, std::size_t(r.numel()) * dtype_size(t));
  return r;
}

Tensor Tensor::full(Shape shape, dtype t, double value) {
  Tensor r = empty(std::move(shape), t);
  for (std::int64_t i = 0; i < r.numel(); ++i) store_from_double(r.data(), t, i, value);
  return r;
}

Tensor Tensor::from_values(Shape shape, dtype t, std::span<const double> values) {
  Tensor r = empty(std::move(shape), t);
  if (std::int64_t(values.size()) != r.numel())
    throw error(fmt::format("tensor.from_values: {} values for shape {} ({} elements)", values.size(),
                            shape_str(r.shape()), r.numel()));
  for (std::int64_t i = 0; i < r.numel(); ++i) store_from_double(r.data(), t, i, values[std::size_t(i)]);
  return r;
}

Tensor Tensor::copy_of(const TensorView& v, dtype t) {
  Tensor r = empty(v.shape(), t);
  std::int64_t i = 0;
  if (t == v.type() && v.is_contiguous()) {
    std::memcpy(r.data(), v.data(), std::size_t(v.numel()) * dtype_size(t));
    return r;
  }
  if (t == v.type()) {
    const std::size_t es = dtype_size(t);
    auto* dst = static_cast<std::byte*>(r.data());
    const auto* src = static_cast<const std::byte*>(v.data());
    for_each_offset(v.shape(), v.strides(), [&](std::int64_t off) { std::memcpy(dst + es * std::size_t(i++), src + es * off, es); });
    return r;
  }
  if (is_floating(t) && is_floating(v.type()) && v.rank() > 0) {
    // Float to float a row (the last dim) at a time, typed: the same values as the element-wise
    // path below (through double, and float(x) before a 16-bit rounding), without a switch and
    // an index walk per element — the family's preparations and Tensor::to convert whole inputs.
    const std::int64_t n = v.shape().back(), sx = v.strides().back();
    const Shape outer(v.shape().begin(), v.shape().end() - 1), so(v.strides().begin(), v.strides().end() - 1);
    with_float_type(v.type(), [&](auto src) {
      using S = decltype(src);
      with_float_type(t, [&](auto dst) {
        using T = decltype(dst);
        const S* in = static_cast<const S*>(v.data());
        T* out = static_cast<T*>(r.data());
        std::int64_t row = 0;
        const auto copy_row = [&](std::int64_t off) {
          T* o = out + row++ * n;
          for (std::int64_t x = 0; x < n; ++x) o[x] = from_double<T>(to_double(in[off + x * sx]));
        };
        if (outer.empty()) copy_row(0);
        else for_each_offset(outer, so, copy_row);
      });
    });
    return r;
  }
  for_each_offset(v.shape(), v.strides(),
                  [&](std::int64_t off) { store_from_double(r.data(), t, i++, load_as_double(v.data(), v.type(), off)); });
  return r;
}

std::vector<double> Tensor::to_vector() const { return attn::to_vector(view_); }

}  // namespace attn

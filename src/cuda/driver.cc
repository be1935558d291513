// src/cuda/driver.cc — the host side of the cuda backend: the registry entry (host tensors copied
// to the device and back, for use_backend = cuda), the device-tensor API of attn/cuda.h, and what
// both share (device buffers, the upload of masks, ALiBi slopes, sinks and lengths, the launch of
// the kernels in forward.cu / backward.cu).
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "attn/cuda.h"
#include "core/common.h"
#include "core/problem.h"
#include "cuda/params.h"

namespace attn {
namespace detail::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("cuda", fmt::format("{}: {} ({})", what, cudaGetErrorString(e), int(e)));
}

// The device, probed once: "" when usable, else why not.
struct device_probe {
  std::string why_not, name;
  std::size_t smem_optin = 0;  // the most dynamic shared memory a block may ask for
};
const device_probe& probe() {
  static const device_probe d = [] {
    device_probe r;
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      r.why_not = e != cudaSuccess ? fmt::format("no CUDA device ({})", cudaGetErrorString(e)) : "no CUDA device";
      cudaGetLastError();  // clear the sticky error of a failed probe
      return r;
    }
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
      r.why_not = "cudaGetDeviceProperties failed";
      return r;
    }
    if (prop.major < 8) {
      r.why_not = fmt::format("device {} is sm_{}{}; the kernels need sm_80 or newer", prop.name, prop.major, prop.minor);
      return r;
    }
    r.smem_optin = prop.sharedMemPerBlockOptin;
    r.name = fmt::format("{} (sm_{}{}, {} SMs)", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    return r;
  }();
  return d;
}

// Owning device memory.
class device_buffer {
 public:
  device_buffer() = default;
  // Stream-ordered on the default stream (no device-wide synchronisation at either end), so the
  // scratch of a call into given tensors costs no wait.
  explicit device_buffer(std::size_t bytes) {
    if (bytes) check(cudaMallocAsync(&p_, bytes, 0), fmt::format("cudaMallocAsync of {} bytes", bytes).c_str());
  }
  device_buffer(const void* host, std::size_t bytes) : device_buffer(bytes) {
    if (bytes) check(cudaMemcpy(p_, host, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
  }
  device_buffer(device_buffer&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }
  device_buffer& operator=(device_buffer&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (p_) cudaFreeAsync(p_, 0);
  }
  template <class T = void>
  T* get() const {
    return static_cast<T*>(p_);
  }
  void download(void* host, std::size_t bytes) const {
    if (bytes) check(cudaMemcpy(host, p_, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  }

 private:
  void* p_ = nullptr;
};

template <class T>
device_buffer upload(const std::vector<T>& v) {
  return device_buffer(v.data(), v.size() * sizeof(T));
}

// Everything besides q/k/v a problem points the kernels at, on the device.
struct uploads {
  device_buffer mask, alibi, sinks, kv_len, past_lens;
};

// The problem as kernel parameters; q/k/v pointers and strides are left for the caller.
dev_problem describe(const problem& p, uploads& up) {
  dev_problem d;
  d.B = int(p.B), d.Hq = int(p.Hq), d.Hkv = int(p.Hkv), d.Nq = int(p.Nq), d.Nk = int(p.Nk);
  d.D = int(p.D), d.Dv = int(p.Dv);
  d.type = p.q.type == dtype::bf16 ? elem::bf16 : elem::f16;
  d.scale = float(p.scale);
  d.softcap = float(p.softcap);
  d.causal = p.causal;
  d.alignment = p.alignment == causal_alignment::top_left ? 0 : p.alignment == causal_alignment::bottom_right ? 1 : 2;
  d.past_len = p.past_len;
  d.window_left = p.window_left, d.window_right = p.window_right;
  if (!p.past_lens.empty()) up.past_lens = upload(p.past_lens), d.past_lens = up.past_lens.get<std::int64_t>();
  if (!p.kv_len.empty()) up.kv_len = upload(p.kv_len), d.kv_len = up.kv_len.get<std::int64_t>();
  if (p.mask != mask_kind::none) {
    // Dense f32 over the mask's own (non-broadcast) batch and head dims, all Nq rows, mask_cols columns.
    const std::int64_t Bm = p.mask_view.sb ? p.B : 1, Hm = p.mask_view.sh ? p.Hq : 1, cols = p.mask_cols;
    std::vector<float> m(std::size_t(Bm * Hm * p.Nq * cols));
    const float neg = -std::numeric_limits<float>::infinity();
    std::size_t at = 0;
    for (std::int64_t b = 0; b < Bm; ++b)
      for (std::int64_t h = 0; h < Hm; ++h)
        for (std::int64_t i = 0; i < p.Nq; ++i)
          for (std::int64_t j = 0; j < cols; ++j, ++at) {
            const std::int64_t off = p.mask_view.offset(b, h, i, j);
            m[at] = p.mask == mask_kind::boolean ? (static_cast<const bool*>(p.mask_view.data)[off] ? 0.0f : neg)
                                                 : float(load_as_double(p.mask_view.data, p.mask_view.type, off));
          }
    up.mask = upload(m);
    d.mask = up.mask.get<float>();
    d.m_sn = cols, d.m_sh = Hm > 1 ? p.Nq * cols : 0, d.m_sb = Bm > 1 ? Hm * p.Nq * cols : 0;
    d.mask_cols = cols;
  }
  if (!p.alibi.empty()) {
    up.alibi = upload(std::vector<float>(p.alibi.begin(), p.alibi.end()));
    d.alibi = up.alibi.get<float>();
  }
  if (!p.sinks.empty()) {
    up.sinks = upload(std::vector<float>(p.sinks.begin(), p.sinks.end()));
    d.sinks = up.sinks.get<float>();
  }
  return d;
}

// 16-bit element bits of `want` (f16 or bf16) from any float dtype.
std::uint16_t bits_of(const void* data, dtype t, std::int64_t off, dtype want) {
  if (t == want) return static_cast<const std::uint16_t*>(data)[off];
  const float x = float(load_as_double(data, t, off));
  return want == dtype::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
}

// A [B, H, N, X] view packed C-contiguous as 16-bit `want` elements.
std::vector<std::uint16_t> pack(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                                dtype want) {
  std::vector<std::uint16_t> r(std::size_t(B * H * N * X));
  std::size_t at = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t x = 0; x < X; ++x) r[at++] = bits_of(s.data, s.type, s.offset(b, h, n, x), want);
  return r;
}
// 16-bit elements of `from` (f16 or bf16) into a [B, H, N, X] view of that dtype, or of float32
// (attention_backward_into's float32 gradients of a 16-bit q: these kernels write 16-bit ones,
// widened here exactly).
void unpack(const std::vector<std::uint16_t>& r, const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N,
            std::int64_t X, dtype from) {
  std::size_t at = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t x = 0; x < X; ++x, ++at) {
          if (s.type == dtype::f32) *s.ptr<float>(b, h, n, x) = from == dtype::bf16 ? bf16_to_f32(r[at]) : f16_to_f32(r[at]);
          else *s.ptr<std::uint16_t>(b, h, n, x) = r[at];
        }
}

// Contiguous [B, H, N, X] on the device: the element strides.
struct strides3 {
  std::int64_t sb, sh, sn;
};
strides3 contiguous(std::int64_t H, std::int64_t N, std::int64_t X) { return {H * N * X, N * X, X}; }

std::string why_not(const problem& p, const backend_request& req) {
  if (!probe().why_not.empty()) return "cuda: " + probe().why_not;
  if (p.q.type != dtype::f16 && p.q.type != dtype::bf16)
    return fmt::format("cuda: {} inputs (the kernels take float16 and bfloat16)", dtype_name(p.q.type));
  if (p.D % 8 || p.Dv % 8 || padded_head_size(int(p.D), int(p.Dv)) == 0)
    return fmt::format("cuda: head sizes D = {}, Dv = {} (the kernels take multiples of 8 up to 256)", p.D, p.Dv);
  const int smem = shared_bytes(padded_head_size(int(p.D), int(p.Dv)), req.backward);
  if (std::size_t(smem) > probe().smem_optin)
    return fmt::format("cuda: head size {} needs {} bytes of shared memory per block; this device gives {}",
                       padded_head_size(int(p.D), int(p.Dv)), smem, probe().smem_optin);
  if (req.qk != qk_output::none) return "cuda: a qk output needs the reference";
  if (req.dmask) return "cuda: the float-mask gradient needs the reference";
  if (p.page_table || p.k.type == dtype::i8) return "cuda: paged or int8 K/V are the cpu decode kernel's";
  constexpr std::int64_t kIntMax = 0x7fffffff;
  if (p.Nq > kIntMax || p.Nk > kIntMax || p.B > 65535 || p.Hq > 65535)
    return "cuda: a dimension beyond the grid's limits";
  return "";
}

std::string path(const problem& p, const backend_request& req) {
  // The forward's plan reads sizes and which options are set: a stand-in pointer marks a mask or slopes.
  static const float set = 0.0f;
  dev_problem d;
  d.B = int(p.B), d.Hq = int(p.Hq), d.Hkv = int(p.Hkv), d.Nq = int(p.Nq), d.Nk = int(p.Nk);
  d.causal = p.causal;
  d.alignment = p.alignment == causal_alignment::top_left ? 0 : p.alignment == causal_alignment::bottom_right ? 1 : 2;
  d.window_left = p.window_left, d.window_right = p.window_right;
  d.mask = p.mask != mask_kind::none ? &set : nullptr, d.alibi = p.alibi.empty() ? nullptr : &set;
  const forward_plan plan = req.backward ? forward_plan{} : plan_forward(d);
  return fmt::format("{}, head size {} on {}, {} f32 accumulation, host tensors copied to the device",
                     req.backward ? "flash backward (delta, dk/dv, dq kernels)"
                     : plan.splits > 1
                         ? fmt::format("flash forward, split-KV: {} splits of {} keys, merged by lse{}", plan.splits,
                                       64 * plan.split_blocks,
                                       plan.row_heads ? fmt::format(" (the GQA group's {} heads as rows)", plan.row_heads)
                                                      : std::string())
                         : std::string("flash forward"),
                     padded_head_size(int(p.D), int(p.Dv)), probe().name, dtype_name(p.q.type));
}

void sync_check(int launch, const char* what) {
  check(cudaError_t(launch), what);
  check(cudaDeviceSynchronize(), what);
}

// Host tensors: copy in, run, copy out.
void host_forward(const problem& p, const forward_outputs& o) {
  uploads up;
  dev_problem d = describe(p, up);
  const device_buffer q = upload(pack(p.q, p.B, p.Hq, p.Nq, p.D, p.q.type));
  const device_buffer k = upload(pack(p.k, p.B, p.Hkv, p.Nk, p.D, p.q.type));
  const device_buffer v = upload(pack(p.v, p.B, p.Hkv, p.Nk, p.Dv, p.q.type));
  d.q = q.get(), d.k = k.get(), d.v = v.get();
  const strides3 sq = contiguous(p.Hq, p.Nq, p.D), sk = contiguous(p.Hkv, p.Nk, p.D), sv = contiguous(p.Hkv, p.Nk, p.Dv);
  d.q_sb = sq.sb, d.q_sh = sq.sh, d.q_sn = sq.sn;
  d.k_sb = sk.sb, d.k_sh = sk.sh, d.k_sn = sk.sn;
  d.v_sb = sv.sb, d.v_sh = sv.sh, d.v_sn = sv.sn;
  const std::int64_t rows = p.B * p.Hq * p.Nq;
  const device_buffer out(std::size_t(rows * p.Dv) * 2), lse(std::size_t(rows) * 4);
  dev_forward f;
  f.out = out.get();
  const strides3 so = contiguous(p.Hq, p.Nq, p.Dv);
  f.o_sb = so.sb, f.o_sh = so.sh, f.o_sn = so.sn;
  f.lse = lse.get<float>();
  if (rows) sync_check(launch_forward(d, f), "the forward kernel");
  std::vector<std::uint16_t> oh(std::size_t(rows * p.Dv));
  std::vector<float> lh(static_cast<std::size_t>(rows));
  out.download(oh.data(), oh.size() * 2);
  lse.download(lh.data(), lh.size() * 4);
  unpack(oh, o.out, p.B, p.Hq, p.Nq, p.Dv, p.q.type);
  for (std::int64_t r = 0; r < rows; ++r) store_from_double(o.lse, o.lse_type, r, lh[std::size_t(r)]);
}

// Adds the per-block partial sums of the ALiBi and sink gradients into the front's accumulators.
void add_partials(const problem& p, const device_buffer& dalibi, const device_buffer& dsinks, double* alibi_acc,
                  double* sinks_acc) {
  const std::int64_t nqb = (p.Nq + kBackwardQueryBlock - 1) / kBackwardQueryBlock;
  std::vector<float> part(std::size_t(p.B * p.Hq * nqb));
  if (alibi_acc) {
    dalibi.download(part.data(), part.size() * 4);
    for (std::int64_t bh = 0; bh < p.B * p.Hq; ++bh)
      for (std::int64_t x = 0; x < nqb; ++x) alibi_acc[bh] += part[std::size_t(bh * nqb + x)];
  }
  if (sinks_acc) {
    dsinks.download(part.data(), part.size() * 4);
    for (std::int64_t bh = 0; bh < p.B * p.Hq; ++bh)
      for (std::int64_t x = 0; x < nqb; ++x) sinks_acc[bh % p.Hq] += part[std::size_t(bh * nqb + x)];
  }
}

void host_backward(const problem& p, const backward_io& io) {
  uploads up;
  dev_problem d = describe(p, up);
  const dtype t = p.q.type;
  const device_buffer q = upload(pack(p.q, p.B, p.Hq, p.Nq, p.D, t));
  const device_buffer k = upload(pack(p.k, p.B, p.Hkv, p.Nk, p.D, t));
  const device_buffer v = upload(pack(p.v, p.B, p.Hkv, p.Nk, p.Dv, t));
  const device_buffer out = upload(pack(io.out, p.B, p.Hq, p.Nq, p.Dv, t));
  const device_buffer dout = upload(pack(io.dout, p.B, p.Hq, p.Nq, p.Dv, t));
  const std::int64_t rows = p.B * p.Hq * p.Nq;
  std::vector<float> lse_h(static_cast<std::size_t>(rows));
  for (std::int64_t r = 0; r < rows; ++r) lse_h[std::size_t(r)] = float(load_as_double(io.lse, io.lse_type, r));
  const device_buffer lse = upload(lse_h);
  const strides3 sq = contiguous(p.Hq, p.Nq, p.D), sk = contiguous(p.Hkv, p.Nk, p.D), sv = contiguous(p.Hkv, p.Nk, p.Dv),
                 so = contiguous(p.Hq, p.Nq, p.Dv);
  d.q = q.get(), d.k = k.get(), d.v = v.get();
  d.q_sb = sq.sb, d.q_sh = sq.sh, d.q_sn = sq.sn;
  d.k_sb = sk.sb, d.k_sh = sk.sh, d.k_sn = sk.sn;
  d.v_sb = sv.sb, d.v_sh = sv.sh, d.v_sn = sv.sn;

  const device_buffer dq(std::size_t(rows * p.D) * 2), dk(std::size_t(p.B * p.Hkv * p.Nk * p.D) * 2),
      dv(std::size_t(p.B * p.Hkv * p.Nk * p.Dv) * 2), delta(std::size_t(rows) * 4);
  const std::int64_t nqb = (p.Nq + kBackwardQueryBlock - 1) / kBackwardQueryBlock;
  const device_buffer dalibi(io.dalibi ? std::size_t(p.B * p.Hq * nqb) * 4 : 0),
      dsinks(io.dsinks ? std::size_t(p.B * p.Hq * nqb) * 4 : 0);
  dev_backward g;
  g.out = out.get(), g.dout = dout.get();
  g.o_sb = so.sb, g.o_sh = so.sh, g.o_sn = so.sn;
  g.do_sb = so.sb, g.do_sh = so.sh, g.do_sn = so.sn;
  g.lse = lse.get<float>();
  g.dq = dq.get(), g.dk = dk.get(), g.dv = dv.get();
  g.dq_sb = sq.sb, g.dq_sh = sq.sh, g.dq_sn = sq.sn;
  g.dk_sb = sk.sb, g.dk_sh = sk.sh, g.dk_sn = sk.sn;
  g.dv_sb = sv.sb, g.dv_sh = sv.sh, g.dv_sn = sv.sn;
  g.delta = delta.get<float>();
  g.dalibi_part = dalibi.get<float>(), g.dsinks_part = dsinks.get<float>();
  if (rows || p.Nk) sync_check(launch_backward(d, g), "the backward kernels");

  std::vector<std::uint16_t> h(std::size_t(rows * p.D));
  dq.download(h.data(), h.size() * 2);
  unpack(h, io.dq, p.B, p.Hq, p.Nq, p.D, p.q.type);
  h.resize(std::size_t(p.B * p.Hkv * p.Nk * p.D));
  dk.download(h.data(), h.size() * 2);
  unpack(h, io.dk, p.B, p.Hkv, p.Nk, p.D, p.q.type);
  h.resize(std::size_t(p.B * p.Hkv * p.Nk * p.Dv));
  dv.download(h.data(), h.size() * 2);
  unpack(h, io.dv, p.B, p.Hkv, p.Nk, p.Dv, p.q.type);
  if (rows) add_partials(p, dalibi, dsinks, io.dalibi, io.dsinks);
}

}  // namespace

const backend_impl& backend_entry() {
  static const backend_impl b{backend::cuda, why_not, path, host_forward, host_backward, /*explicit_only=*/true};
  return b;
}

}  // namespace detail::cuda

namespace detail {
const backend_impl& cuda_backend() { return cuda::backend_entry(); }
}  // namespace detail

// ---- attn/cuda.h ----
namespace cuda {
using namespace detail;
using namespace detail::cuda;

namespace {
void require_available(const char* op) {
  if (!probe().why_not.empty()) fail(op, probe().why_not);
}
}  // namespace

bool available() { return probe().why_not.empty(); }
std::string unavailable_reason() { return probe().why_not; }
std::string device_name() {
  require_available("attn::cuda::device_name");
  return probe().name;
}
void synchronize() {
  require_available("attn::cuda::synchronize");
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
}

DeviceTensor::DeviceTensor(dtype t, Shape shape) : type_(t), shape_(std::move(shape)) {
  require_available("attn::cuda::DeviceTensor");
  std::int64_t n = 1;
  for (std::int64_t s : shape_) {
    if (s < 0) fail("attn::cuda::DeviceTensor", fmt::format("negative dimension in shape {}", shape_str(shape_)));
    n *= s;
  }
  const std::size_t bytes = std::size_t(n) * dtype_size(t);
  void* p = nullptr;
  if (bytes) check(cudaMalloc(&p, bytes), fmt::format("cudaMalloc of {} bytes", bytes).c_str());
  mem_ = std::shared_ptr<void>(p, [](void* x) {
    if (x) cudaFree(x);
  });
}

std::int64_t DeviceTensor::numel() const {
  std::int64_t n = 1;
  for (std::int64_t s : shape_) n *= s;
  return n;
}

DeviceTensor DeviceTensor::from_host(const TensorView& host) {
  DeviceTensor d(host.type(), host.shape());
  d.copy_from(host);
  return d;
}

void DeviceTensor::copy_from(const TensorView& host) {
  if (host.shape() != shape_ || host.type() != type_)
    fail("attn::cuda::DeviceTensor::copy_from",
         fmt::format("host view {} {} does not match the device tensor's {} {}", dtype_name(host.type()),
                     shape_str(host.shape()), dtype_name(type_), shape_str(shape_)));
  const Tensor c = host.is_contiguous() ? Tensor() : Tensor::copy_of(host);
  const void* src = c.defined() ? c.data() : host.data();
  const std::size_t bytes = std::size_t(numel()) * dtype_size(type_);
  if (bytes) check(cudaMemcpy(mem_.get(), src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}

Tensor DeviceTensor::to_host() const {
  Tensor t = Tensor::empty(shape_, type_);
  const std::size_t bytes = std::size_t(numel()) * dtype_size(type_);
  if (bytes) check(cudaMemcpy(t.data(), mem_.get(), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  return t;
}

namespace {

// The front's checks on device views (it reads no q/k/v data), and what this API leaves out.
problem device_problem(const char* op, const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                       const attention_options& o, problem_storage& store, bool backward) {
  require_available(op);
  if (o.past_key || o.past_value)
    fail(op, "past_key/past_value are not taken on the device (give the whole K/V as k and v)");
  if (o.check_finite) fail(op, "check_finite reads the inputs on the host: use attn::attention for it");
  if (o.return_qk != qk_output::none) fail(op, "return_qk needs the reference: use attn::attention for it");
  problem p = build_problem(op, q.view(), k.view(), v.view(), o, execution{}, store);
  const std::string why = detail::cuda::why_not(p, {.backward = backward});
  if (!why.empty()) fail(op, why);
  return p;
}

void set_qkv(dev_problem& d, const problem& p) {
  d.q = p.q.data, d.k = p.k.data, d.v = p.v.data;
  d.q_sb = p.q.sb, d.q_sh = p.q.sh, d.q_sn = p.q.sn;
  d.k_sb = p.k.sb, d.k_sh = p.k.sh, d.k_sn = p.k.sn;
  d.v_sb = p.v.sb, d.v_sh = p.v.sh, d.v_sn = p.v.sn;
}

Shape out_shape_of(const DeviceTensor& q, const problem& p) {
  return q.shape().size() == 4 ? Shape{p.B, p.Hq, p.Nq, p.Dv} : Shape{p.B, p.Nq, p.Hq * p.Dv};
}

// A tensor given to the API (a result written into, or an input saved by the forward) must have
// this dtype and shape.
void expect_like(const char* op, const char* name, const DeviceTensor& t, dtype type, const Shape& shape) {
  if (t.shape() != shape || t.type() != type)
    fail(op, fmt::format("{} is {} {}, expected {} {}", name, dtype_name(t.type()), shape_str(t.shape()),
                         dtype_name(type), shape_str(shape)));
}

// lse (device, f32 [rows]) += sign · the row shifts of a shifted mask (problem_storage).
void shift_lse(const problem& p, const problem_storage& store, float* lse, double sign) {
  const std::int64_t rows = p.B * p.Hq * p.Nq;
  std::vector<float> h(static_cast<std::size_t>(rows));
  check(cudaMemcpy(h.data(), lse, h.size() * 4, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t hh = 0; hh < p.Hq; ++hh)
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        float& x = h[std::size_t((b * p.Hq + hh) * p.Nq + i)];
        x = float(double(x) + sign * store.mask_shift.load(b, hh, i, 0));
      }
  check(cudaMemcpy(lse, h.data(), h.size() * 4, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}

// The forward of a validated problem into out and lse (checked here: given by the caller, or
// allocated to fit by attention()).
void forward_into(const char* op, const problem& p, const problem_storage& store, const DeviceTensor& q,
                  const DeviceTensor& out, const DeviceTensor& lse) {
  expect_like(op, "out", out, q.type(), out_shape_of(q, p));
  expect_like(op, "lse", lse, dtype::f32, {p.B, p.Hq, p.Nq});
  uploads up;
  dev_problem d = describe(p, up);
  set_qkv(d, p);
  const strided4 o = as_bhnx(out.view(), p.Hq);
  dev_forward f;
  f.out = out.data(), f.o_sb = o.sb, f.o_sh = o.sh, f.o_sn = o.sn;
  f.lse = static_cast<float*>(lse.data());
  if (p.B * p.Hq * p.Nq != 0) check(cudaError_t(launch_forward(d, f)), "the forward kernel");
  if (store.shift.defined()) shift_lse(p, store, f.lse, +1.0);
}

}  // namespace

void attention_into(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v, const DeviceTensor& out,
                    const DeviceTensor& lse, const attention_options& options) {
  const char* op = "attn::cuda::attention_into";
  problem_storage store;
  const problem p = device_problem(op, q, k, v, options, store, false);
  forward_into(op, p, store, q, out, lse);
}

device_result attention(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                        const attention_options& options) {
  const char* op = "attn::cuda::attention";
  problem_storage store;
  const problem p = device_problem(op, q, k, v, options, store, false);
  device_result r{DeviceTensor(q.type(), out_shape_of(q, p)), DeviceTensor(dtype::f32, {p.B, p.Hq, p.Nq})};
  forward_into(op, p, store, q, r.out, r.lse);
  return r;
}

namespace {

// The forward's results given to a backward: out and dout like attention's out, lse float32 [B, Hq, Nq].
void expect_saved(const char* op, const problem& p, const DeviceTensor& q, const DeviceTensor& out,
                  const DeviceTensor& lse, const DeviceTensor& dout) {
  const Shape os = out_shape_of(q, p);
  expect_like(op, "out", out, q.type(), os);
  expect_like(op, "dout", dout, q.type(), os);
  expect_like(op, "lse", lse, dtype::f32, {p.B, p.Hq, p.Nq});
}

// The backward of a validated problem (expect_saved; dq, dk, dv of q, k, v's dtype and shapes).
device_grads backward_into(const problem& p, const problem_storage& store, const attention_options& options,
                           const DeviceTensor& out, const DeviceTensor& lse, const DeviceTensor& dout,
                           const DeviceTensor& dq, const DeviceTensor& dk, const DeviceTensor& dv) {
  uploads up;
  dev_problem d = describe(p, up);
  set_qkv(d, p);

  device_grads r;
  r.dq = dq, r.dk = dk, r.dv = dv;
  const std::int64_t rows = p.B * p.Hq * p.Nq;
  const device_buffer delta(std::size_t(rows) * 4);
  const std::int64_t nqb = (p.Nq + kBackwardQueryBlock - 1) / kBackwardQueryBlock;
  const device_buffer dalibi(p.alibi.empty() ? 0 : std::size_t(p.B * p.Hq * nqb) * 4),
      dsinks(p.sinks.empty() ? 0 : std::size_t(p.B * p.Hq * nqb) * 4);
  // A shifted mask (rows beyond ±1024): the kernels need the lse of the shifted scores.
  DeviceTensor lse_shifted;
  const float* lse_ptr = static_cast<const float*>(lse.data());
  if (store.shift.defined()) {
    lse_shifted = DeviceTensor(dtype::f32, lse.shape());
    check(cudaMemcpy(lse_shifted.data(), lse.data(), std::size_t(rows) * 4, cudaMemcpyDeviceToDevice), "cudaMemcpy");
    shift_lse(p, store, static_cast<float*>(lse_shifted.data()), -1.0);
    lse_ptr = static_cast<const float*>(lse_shifted.data());
  }
  const strided4 so = as_bhnx(out.view(), p.Hq), sdo = as_bhnx(dout.view(), p.Hq), sq = as_bhnx(r.dq.view(), p.Hq),
                 sk = as_bhnx(r.dk.view(), p.Hkv), sv = as_bhnx(r.dv.view(), p.Hkv);
  dev_backward g;
  g.out = out.data(), g.dout = dout.data();
  g.o_sb = so.sb, g.o_sh = so.sh, g.o_sn = so.sn;
  g.do_sb = sdo.sb, g.do_sh = sdo.sh, g.do_sn = sdo.sn;
  g.lse = lse_ptr;
  g.dq = r.dq.data(), g.dk = r.dk.data(), g.dv = r.dv.data();
  g.dq_sb = sq.sb, g.dq_sh = sq.sh, g.dq_sn = sq.sn;
  g.dk_sb = sk.sb, g.dk_sh = sk.sh, g.dk_sn = sk.sn;
  g.dv_sb = sv.sb, g.dv_sh = sv.sh, g.dv_sn = sv.sn;
  g.delta = delta.get<float>();
  g.dalibi_part = dalibi.get<float>(), g.dsinks_part = dsinks.get<float>();
  if (rows || p.Nk) check(cudaError_t(launch_backward(d, g)), "the backward kernels");

  if (!p.alibi.empty() || !p.sinks.empty()) {
    Tensor da = Tensor::zeros({p.B * p.Hq}, dtype::f64), ds = Tensor::zeros({p.Hq}, dtype::f64);
    check(cudaDeviceSynchronize(), "the backward kernels");
    if (rows)
      add_partials(p, dalibi, dsinks, p.alibi.empty() ? nullptr : da.data_as<double>(),
                   p.sinks.empty() ? nullptr : ds.data_as<double>());
    if (!p.alibi.empty()) {
      const TensorView& s = *options.alibi_slopes;
      if (s.rank() == 1) {
        Tensor sum = Tensor::zeros({p.Hq}, dtype::f64);
        for (std::int64_t b = 0; b < p.B; ++b)
          for (std::int64_t h = 0; h < p.Hq; ++h) sum.data_as<double>()[h] += da.data_as<double>()[b * p.Hq + h];
        r.dalibi_slopes = sum.to(s.type());
      } else {
        r.dalibi_slopes = Tensor::copy_of(da.view().reshape({p.B, p.Hq}), s.type());
      }
    }
    if (!p.sinks.empty()) r.dsinks = ds.to(options.sinks->type());
  }
  return r;
}

}  // namespace

device_grads attention_backward_into(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                                     const DeviceTensor& out, const DeviceTensor& lse, const DeviceTensor& dout,
                                     const DeviceTensor& dq, const DeviceTensor& dk, const DeviceTensor& dv,
                                     const attention_options& options) {
  const char* op = "attn::cuda::attention_backward_into";
  problem_storage store;
  const problem p = device_problem(op, q, k, v, options, store, true);
  expect_saved(op, p, q, out, lse, dout);
  expect_like(op, "dq", dq, q.type(), q.shape());
  expect_like(op, "dk", dk, q.type(), k.shape());
  expect_like(op, "dv", dv, q.type(), v.shape());
  return backward_into(p, store, options, out, lse, dout, dq, dk, dv);
}

device_grads attention_backward(const DeviceTensor& q, const DeviceTensor& k, const DeviceTensor& v,
                                const DeviceTensor& out, const DeviceTensor& lse, const DeviceTensor& dout,
                                const attention_options& options) {
  const char* op = "attn::cuda::attention_backward";
  problem_storage store;
  const problem p = device_problem(op, q, k, v, options, store, true);
  expect_saved(op, p, q, out, lse, dout);  // before dq, dk and dv are allocated
  return backward_into(p, store, options, out, lse, dout, DeviceTensor(q.type(), q.shape()),
                       DeviceTensor(q.type(), k.shape()), DeviceTensor(q.type(), v.shape()));
}

}  // namespace cuda
}  // namespace attn

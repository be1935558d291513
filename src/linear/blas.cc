// src/linear/blas.cc — linear on OpenBLAS: one cblas_sgemm (f32, and f16/bf16 converted to f32)
// or cblas_dgemm (f64) per product. Operands whose layout BLAS can read (one unit stride, a
// leading dimension no smaller than the row) are passed as they are, transposed through the
// CBLAS flag when column-major; anything else (broadcast, two non-unit strides, f16/bf16) is
// gathered into a contiguous buffer first.
//
// OpenBLAS is opened with dlopen, once, because it reads OPENBLAS_CORETYPE when it loads: that
// is the only moment at which attn can ask for its AVX-512 kernels on CPUs the library does not
// recognise (Debian's 0.3.21 on AMD Zen 4/5 falls back to Haswell's AVX2 kernels).
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <vector>

#include "cpu/buffers.h"  // aligned64: working memory kept between calls
#include "cpu/kernels.h"  // available_isas: the one place that asks the CPU what it supports
#include "linear/linear_impl.h"

namespace attn::linear_detail::blas {
namespace {

// The CBLAS enums and signatures (cblas.h), declared here because the library is opened at run
// time. blasint is 32-bit in Debian's libopenblas0.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                          int);
using dgemm_fn = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int, double,
                          double*, int);
using set_threads_fn = void (*)(int);

struct library {
  sgemm_fn sgemm = nullptr;
  dgemm_fn dgemm = nullptr;
  set_threads_fn set_threads = nullptr;
  std::string why_not;   // "" when usable
  std::string describe;  // what was loaded
};

bool cpu_has_avx512() {
  int levels = 0;
  detail::cpu::available_isas(&levels);
  return levels >= 3;  // generic, avx2, avx512[, avx512bf16[, amx]]
}

library open_library() {
  library l;
  std::vector<std::string> names;
  if (const char* p = std::getenv("ATTN_OPENBLAS"); p && *p) names.emplace_back(p);
  names.insert(names.end(), {"libopenblas.so.0", "libopenblas.so"});

  const char* core_env = std::getenv("OPENBLAS_CORETYPE");
  std::string note;
  const bool set_core = !(core_env && *core_env) && cpu_has_avx512();
  if (set_core) {
    setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
    note = " (OPENBLAS_CORETYPE=SkylakeX set by attn while loading)";
  } else if (core_env && *core_env) {
    note = fmt::format(" (OPENBLAS_CORETYPE={} from the environment)", core_env);
  }
  void* lib = nullptr;
  std::string errors;
  for (const auto& n : names) {
    if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", dlerror());
  }
  if (set_core) unsetenv("OPENBLAS_CORETYPE");
  if (!lib) {
    l.why_not = fmt::format("OpenBLAS not found ({}); install libopenblas0 or set ATTN_OPENBLAS", errors);
    return l;
  }
  l.sgemm = reinterpret_cast<sgemm_fn>(dlsym(lib, "cblas_sgemm"));
  l.dgemm = reinterpret_cast<dgemm_fn>(dlsym(lib, "cblas_dgemm"));
  l.set_threads = reinterpret_cast<set_threads_fn>(dlsym(lib, "openblas_set_num_threads"));
  auto corename = reinterpret_cast<const char* (*)()>(dlsym(lib, "openblas_get_corename"));
  auto config = reinterpret_cast<const char* (*)()>(dlsym(lib, "openblas_get_config"));
  if (!l.sgemm || !l.dgemm || !l.set_threads) {
    l.sgemm = nullptr;
    l.why_not = "the OpenBLAS found has no cblas_sgemm / cblas_dgemm / openblas_set_num_threads";
    return l;
  }
  l.describe = fmt::format("{} core {}{}", config ? config() : "OpenBLAS", corename ? corename() : "?", note);
  return l;
}

const library& lib() {
  static const library l = open_library();
  return l;
}

// OpenBLAS runs single-threaded inside attn's OpenMP threads (see gemm below). Set on every
// call (a store when unchanged): another user of the library in this process may change it.
void use_one_thread() { lib().set_threads(1); }

// ---- operands ----

// Converted operands and outputs (a bf16 or f16 linear computes in f32) come from attn's working
// memory (core/common.h, alloc_working): a block of a MiB or more is kept for the next call of
// its size, where a std::vector's fresh pages faulted on every call (a bf16 projection of
// 16384 × 64: 4 MiB of f32 scratch a call).
template <class T>
using buffer = std::vector<T, detail::cpu::aligned64<T>>;

template <class T>
struct operand {
  const T* data = nullptr;
  int ld = 0;
  int trans = kNoTrans;
};

// Conversions of operands (into working memory, whose pages the process keeps) of at least
// this many elements run on the op's threads.
constexpr std::int64_t kParallelElements = std::int64_t(1) << 16;

// fn(r) for r in [0, rows), on `threads` threads where rows · cols is large enough.
template <class Fn>
void for_rows(std::int64_t rows, std::int64_t cols, int threads, const Fn& fn) {
  const bool par = threads > 1 && rows > 1 && rows * cols >= kParallelElements;
#pragma omp parallel for num_threads(threads) schedule(static) if (par)
  for (std::int64_t r = 0; r < rows; ++r) fn(r);
}

// Converts element i of a buffer of dtype t to T (the compute type: float or double).
template <class T, class Load>
void gather_as(const matrix& a, T* out, Load load, int threads) {
  for_rows(a.rows, a.cols, threads, [&](std::int64_t r) {
    for (std::int64_t c = 0; c < a.cols; ++c) out[r * a.cols + c] = T(load(a.offset(r, c)));
  });
}

template <class T>
void gather(const matrix& a, T* out, int threads) {
  switch (a.type) {
    case dtype::f32: {
      const float* s = static_cast<const float*>(a.data);
      gather_as<T>(a, out, [s](std::int64_t i) { return s[i]; }, threads);
      break;
    }
    case dtype::f64: {
      const double* s = static_cast<const double*>(a.data);
      gather_as<T>(a, out, [s](std::int64_t i) { return s[i]; }, threads);
      break;
    }
    case dtype::bf16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(a.data);
      gather_as<T>(a, out, [s](std::int64_t i) { return bf16_to_f32(s[i]); }, threads);
      break;
    }
    case dtype::f16: {
      const std::uint16_t* s = static_cast<const std::uint16_t*>(a.data);
      gather_as<T>(a, out, [s](std::int64_t i) { return f16_to_f32(s[i]); }, threads);
      break;
    }
    default: break;  // the front admits float dtypes only
  }
}

// op(a) for a GEMM, where op transposes when `transpose`. Reads `a` in place when its layout
// allows (its dtype is T and one stride is 1 with a large enough other one); otherwise gathers
// it row-major into `buf`.
template <class T>
operand<T> as_operand(const matrix& a, bool transpose, buffer<T>& buf, int threads) {
  const bool native = a.type == (sizeof(T) == 4 ? dtype::f32 : dtype::f64);
  const std::int64_t rmin = std::max<std::int64_t>(1, a.cols), cmin = std::max<std::int64_t>(1, a.rows);
  if (native && a.cs == 1 && (a.rows <= 1 || (a.rs >= rmin && a.rs <= INT_MAX)))
    return {static_cast<const T*>(a.data), int(a.rows <= 1 ? rmin : a.rs), transpose ? kTrans : kNoTrans};
  if (native && a.rs == 1 && (a.cols <= 1 || (a.cs >= cmin && a.cs <= INT_MAX)))
    return {static_cast<const T*>(a.data), int(a.cols <= 1 ? cmin : a.cs), transpose ? kNoTrans : kTrans};
  buf.resize(std::size_t(a.rows * a.cols));
  gather(a, buf.data(), threads);
  return {buf.data(), int(rmin), transpose ? kTrans : kNoTrans};
}

// C [m, n] (ldc = ldc) = op(A) [m, k] · op(B) [k, n] + beta · C, on the calling thread.
template <class T>
void gemm_serial(int m, int n, int k, const operand<T>& a, const operand<T>& b, T beta, T* c, int ldc) {
  if constexpr (sizeof(T) == 4)
    lib().sgemm(kRowMajor, a.trans, b.trans, m, n, k, 1.0f, a.data, a.ld, b.data, b.ld, beta, c, ldc);
  else
    lib().dgemm(kRowMajor, a.trans, b.trans, m, n, k, 1.0, a.data, a.ld, b.data, b.ld, beta, c, ldc);
}

// A thread gets at least this many rows of C and this many flops (≈ 50 µs): a smaller GEMM runs
// on the calling thread alone, as waking a second one costs more than it saves (much more on a
// machine with more runnable threads than cores, where the wake-up waits for a time slice).
constexpr int kMinRowsPerThread = 32;
constexpr double kMinFlopsPerThread = double(1 << 23);

// C [m, n] (contiguous, ldc = n) = op(A) [m, k] · op(B) [k, n] + beta · C, on `threads` of
// attn's OpenMP threads, each running a single-threaded OpenBLAS on one block of C's rows (row
// r0 of op(A) is A + r0·lda untransposed, A + r0 transposed). One pool of threads for the whole
// program: OpenBLAS's own pthreads would contend with the OpenMP workers of the ops before and
// after (both spin while idle), which on a machine with as many threads as cores costs more
// than the GEMM gains. The row split depends on m and `threads` only.
template <class T>
void gemm(int m, int n, int k, const operand<T>& a, const operand<T>& b, T beta, T* c, int threads) {
  const double flops = 2.0 * double(m) * double(n) * double(k);
  const int blocks = std::max(1, std::min({threads, m / kMinRowsPerThread, int(flops / kMinFlopsPerThread)}));
  const int ldc = std::max(1, n);
#pragma omp parallel for num_threads(blocks) schedule(static) if (blocks > 1)
  for (int i = 0; i < blocks; ++i) {
    const int r0 = int(std::int64_t(m) * i / blocks), r1 = int(std::int64_t(m) * (i + 1) / blocks);
    const operand<T> ai{a.data + (a.trans == kNoTrans ? std::int64_t(r0) * a.ld : r0), a.ld, a.trans};
    gemm_serial<T>(r1 - r0, n, k, ai, b, beta, c + std::int64_t(r0) * ldc, ldc);
  }
}

// An output [rows, cols] in compute type T: the output itself when its dtype is T (outputs are
// contiguous), else a scratch buffer that `finish` rounds into it.
template <class T>
struct output {
  const matrix& dst;
  buffer<T> scratch;
  T* data;
  explicit output(const matrix& m) : dst(m) {
    const bool native = m.type == (sizeof(T) == 4 ? dtype::f32 : dtype::f64);
    if (native) {
      data = static_cast<T*>(m.data);
    } else {
      scratch.resize(std::size_t(m.rows * m.cols));
      data = scratch.data();
    }
  }
  void finish() {
    if (scratch.empty()) return;
    const std::int64_t n = dst.rows * dst.cols;
    std::uint16_t* d = static_cast<std::uint16_t*>(dst.data);
    if (dst.type == dtype::bf16)
      for (std::int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(float(scratch[std::size_t(i)]));
    else
      for (std::int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(float(scratch[std::size_t(i)]));
  }
};

template <class T>
void forward_as(const problem& p) {
  output<T> y(p.y);
  // y rows start as the bias (or zero; read once); the GEMM adds x Wᵀ on top (beta = 1).
  std::vector<T> brow(std::size_t(p.N), T(0));
  if (p.b.data)
    for (std::int64_t n = 0; n < p.N; ++n) brow[std::size_t(n)] = T(p.b.load(n));
  // (on the calling thread: y is often fresh memory, and two threads faulting its pages in
  // together measured slower than one)
  for (std::int64_t m = 0; m < p.M; ++m) std::copy(brow.begin(), brow.end(), y.data + m * p.N);
  if (p.M > 0 && p.N > 0 && p.K > 0) {
    buffer<T> xb, wb;
    // y [M, N] = x [M, K] · Wᵀ [K, N]
    gemm<T>(int(p.M), int(p.N), int(p.K), as_operand<T>(p.x, false, xb, p.num_threads),
            as_operand<T>(p.W, true, wb, p.num_threads), T(1), y.data, p.num_threads);
  }
  y.finish();
}

template <class T>
void backward_as(const problem& p) {
  buffer<T> dyb, wb, xb;
  const bool any = p.M > 0 && p.N > 0 && p.K > 0;
  const operand<T> dy = any ? as_operand<T>(p.dy, false, dyb, p.num_threads) : operand<T>{};
  if (p.dx.data) {
    output<T> dx(p.dx);
    std::fill(dx.data, dx.data + p.M * p.K, T(0));
    // dx [M, K] = dy [M, N] · W [N, K]
    if (any) gemm<T>(int(p.M), int(p.K), int(p.N), dy, as_operand<T>(p.W, false, wb, p.num_threads), T(0), dx.data, p.num_threads);
    dx.finish();
  }
  if (p.dW.data) {
    output<T> dW(p.dW);
    std::fill(dW.data, dW.data + p.N * p.K, T(0));
    // dW [N, K] = dyᵀ [N, M] · x [M, K]
    if (any) {
      const operand<T> dyt{dy.data, dy.ld, dy.trans == kNoTrans ? kTrans : kNoTrans};
      gemm<T>(int(p.N), int(p.K), int(p.M), dyt, as_operand<T>(p.x, false, xb, p.num_threads), T(0), dW.data, p.num_threads);
    }
    dW.finish();
  }
  if (p.db.data) {
    // db [N] = Σ_m dy [m, :], summed in double (O(M N), beside the GEMMs' O(M N K)); the rows of
    // the row-major GEMM operand are read directly, a column-major dy element by element.
    std::vector<double> s(std::size_t(p.N), 0.0);
    if (any && dy.trans == kNoTrans) {
      for (std::int64_t m = 0; m < p.M; ++m) {
        const T* row = dy.data + m * dy.ld;
        for (std::int64_t n = 0; n < p.N; ++n) s[std::size_t(n)] += double(row[n]);
      }
    } else {
      for (std::int64_t m = 0; m < p.M; ++m)
        for (std::int64_t n = 0; n < p.N; ++n) s[std::size_t(n)] += p.dy.load(m, n);
    }
    for (std::int64_t n = 0; n < p.N; ++n) p.db.store(n, s[std::size_t(n)]);
  }
}

}  // namespace

const std::string& why_not() { return lib().why_not; }
const std::string& describe() { return lib().describe; }

void forward(const problem& p) {
  use_one_thread();
  if (p.type == dtype::f64)
    forward_as<double>(p);
  else
    forward_as<float>(p);
}

void backward(const problem& p) {
  use_one_thread();
  if (p.type == dtype::f64)
    backward_as<double>(p);
  else
    backward_as<float>(p);
}

}  // namespace attn::linear_detail::blas

// tools/attn/bench_blas.cc — the unfused OpenBLAS baseline (see bench_blas.h).
#include "bench_blas.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <thread>

#include "bench_probe.h"

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's reduce/cast intrinsics start from _mm512_undefined_*, which -Wuninitialized flags
// inside the header: a known false positive.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define ATTN_BENCH_X86 1
#endif

namespace attn::cli::bench {
namespace {

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;  // CBLAS enums

// ---- row softmax: the baseline needs a vectorised exp to be a fair one ----

// s[0, n) ← softmax(s[0, n)), s[n, total) ← 0 (keys past the causal frontier).
void softmax_row_portable(float* s, std::int64_t n, std::int64_t total) {
  float m = -std::numeric_limits<float>::infinity();
  for (std::int64_t j = 0; j < n; ++j) m = std::max(m, s[j]);
  float sum = 0;
  for (std::int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - m));
  const float inv = 1.0f / sum;
  for (std::int64_t j = 0; j < n; ++j) s[j] *= inv;
  std::fill(s + n, s + total, 0.0f);
}

#ifdef ATTN_BENCH_X86
// exp(x) for x <= 0: x = k·ln2 + r, |r| <= ln2/2, Taylor to r⁶ (relative error ~1e-7).
__attribute__((target("avx512f"))) inline __m512 exp_avx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)), _MM_FROUND_TO_NEAREST_INT);
  __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-0.693145752f), x);
  r = _mm512_fmadd_ps(k, _mm512_set1_ps(-1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.0f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, k);
}

__attribute__((target("avx512f"))) void softmax_row_avx512(float* s, std::int64_t n, std::int64_t total) {
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 vm = ninf;
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + j));
  const __mmask16 tail = __mmask16((1u << (n - j)) - 1);
  vm = _mm512_max_ps(vm, _mm512_mask_loadu_ps(ninf, tail, s + j));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(vm));
  __m512 vs = _mm512_setzero_ps();
  for (j = 0; j + 16 <= n; j += 16) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
    _mm512_storeu_ps(s + j, e);
    vs = _mm512_add_ps(vs, e);
  }
  const __m512 e = _mm512_maskz_mov_ps(tail, exp_avx512(_mm512_sub_ps(_mm512_mask_loadu_ps(m, tail, s + j), m)));
  _mm512_mask_storeu_ps(s + j, tail, e);
  vs = _mm512_add_ps(vs, e);
  const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vs));
  for (j = 0; j + 16 <= n; j += 16) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), inv));
  _mm512_mask_storeu_ps(s + j, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, s + j), inv));
  std::fill(s + n, s + total, 0.0f);
}
#endif

using softmax_fn = void (*)(float*, std::int64_t, std::int64_t);

// The one ISA choice of the baseline.
softmax_fn pick_softmax() {
#ifdef ATTN_BENCH_X86
  if (cpu_has_avx512f()) return softmax_row_avx512;
#endif
  return softmax_row_portable;
}

// A slice of a tensor as f32: the tensor's own memory for f32, else converted into `buf`.
const float* load_f32(const Tensor& t, std::int64_t offset, std::int64_t n, std::vector<float>& buf) {
  if (t.type() == dtype::f32) return t.data_as<float>() + offset;
  buf.resize(std::size_t(n));
  const auto* src = t.data_as<std::uint16_t>() + offset;
  if (t.type() == dtype::bf16)
    for (std::int64_t i = 0; i < n; ++i) buf[std::size_t(i)] = bf16_to_f32(src[i]);
  else
    for (std::int64_t i = 0; i < n; ++i) buf[std::size_t(i)] = f16_to_f32(src[i]);
  return buf.data();
}

// Where an f32 result for a slice of `t` goes: straight into t for f32, else into `buf`.
float* out_f32(const Tensor& t, std::int64_t offset, std::int64_t n, std::vector<float>& buf) {
  if (t.type() == dtype::f32) return t.data_as<float>() + offset;
  buf.resize(std::size_t(n));
  return buf.data();
}

void store_back(const Tensor& t, std::int64_t offset, std::int64_t n, const float* src) {
  if (t.type() == dtype::f32) return;
  auto* dst = t.data_as<std::uint16_t>() + offset;
  if (t.type() == dtype::bf16)
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
  else
    for (std::int64_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

}  // namespace

struct blas_baseline::scratch {
  std::vector<float> q, k, v, o, dout, s, dp, di, dq, dk, dv;
};

blas_baseline& blas_baseline::instance(const std::string& coretype) {
  static blas_baseline b(coretype);
  return b;
}

std::string apply_openblas_coretype(const std::string& coretype) {
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const std::string was = env ? fmt::format("; the environment had {}", env) : std::string();
  const std::string want = coretype == "auto" ? (cpu_has_avx512f() ? "SkylakeX" : "") : coretype == "env" ? "" : coretype;
  if (!want.empty()) {
    setenv("OPENBLAS_CORETYPE", want.c_str(), 1);
    return fmt::format(" (OPENBLAS_CORETYPE={} set by attn bench{})", want, was);
  }
  return env ? fmt::format(" (OPENBLAS_CORETYPE={} from the environment)", env) : std::string();
}

blas_baseline::blas_baseline(const std::string& coretype) {
  // OpenBLAS reads OPENBLAS_CORETYPE once, when the library initialises: set it before dlopen.
  const std::string note = apply_openblas_coretype(coretype);
  const char* env_path = std::getenv("ATTN_BENCH_OPENBLAS");
  std::vector<std::string> names;
  if (env_path && *env_path) names.emplace_back(env_path);
  names.insert(names.end(), {"libopenblas.so.0", "libopenblas.so"});
  void* lib = nullptr;
  std::string errors;
  for (const auto& n : names) {
    if ((lib = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
    errors += fmt::format("{}{}", errors.empty() ? "" : "; ", dlerror());
  }
  if (!lib) {
    describe_ = fmt::format("OpenBLAS not found ({}); install libopenblas0 or set ATTN_BENCH_OPENBLAS", errors);
    return;
  }
  sgemm_ = reinterpret_cast<sgemm_fn>(dlsym(lib, "cblas_sgemm"));
  set_threads_ = reinterpret_cast<set_threads_fn>(dlsym(lib, "openblas_set_num_threads"));
  auto corename = reinterpret_cast<const char* (*)()>(dlsym(lib, "openblas_get_corename"));
  auto config = reinterpret_cast<const char* (*)()>(dlsym(lib, "openblas_get_config"));
  if (!sgemm_ || !set_threads_) {
    sgemm_ = nullptr;
    describe_ = "the library found has no cblas_sgemm / openblas_set_num_threads";
    return;
  }
  describe_ = fmt::format("{} core {}{}", config ? config() : "OpenBLAS", corename ? corename() : "?", note);
}

std::string blas_baseline::skip_reason(const workload& p, int threads) const {
  if (!available()) return describe_;
  const double rows = double(p.Hq / p.Hkv) * double(p.Nq);
  const double bytes = 2.0 * rows * double(p.Nk) * 4.0 * std::max(1, threads);
  if (bytes > 8.0 * (1 << 30))
    return fmt::format("the score blocks need {:.1f} GiB", bytes / (1 << 30));
  return {};
}

// Runs body(b, h, scratch&) for every (batch, key/value head): heads spread over threads with
// one-thread GEMMs, or — with fewer heads than threads — one head at a time with threaded GEMMs.
template <class Body>
void blas_baseline::for_each_head(const workload& p, int threads, Body&& body) {
  const std::int64_t units = p.B * p.Hkv;
  const int workers = int(std::min<std::int64_t>(threads, units));
  while (int(scratch_.size()) < std::max(1, workers)) scratch_.push_back(std::make_unique<scratch>());
  if (workers <= 1 || units < threads) {
    set_threads_(threads);
    for (std::int64_t u = 0; u < units; ++u) body(u / p.Hkv, u % p.Hkv, *scratch_[0]);
    return;
  }
  set_threads_(1);
  std::atomic<std::int64_t> next{0};
  std::vector<std::thread> pool;
  for (int w = 0; w < workers; ++w)
    pool.emplace_back([&, w] {
      for (std::int64_t u; (u = next.fetch_add(1)) < units;) body(u / p.Hkv, u % p.Hkv, *scratch_[std::size_t(w)]);
    });
  for (auto& t : pool) t.join();
}

void blas_baseline::forward(const workload& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                            int threads) {
  static const softmax_fn softmax = pick_softmax();
  const std::int64_t G = p.Hq / p.Hkv, M = G * p.Nq, Nk = p.Nk, D = p.D, Dv = p.Dv;
  const float scale = float(1.0 / std::sqrt(double(D)));
  for_each_head(p, threads, [&](std::int64_t b, std::int64_t h, scratch& w) {
    // The G query heads of key/value head h are consecutive: one [G·Nq, D] block of q.
    const std::int64_t q_off = (b * p.Hq + h * G) * p.Nq * D, o_off = (b * p.Hq + h * G) * p.Nq * Dv;
    const std::int64_t k_off = (b * p.Hkv + h) * Nk * D, v_off = (b * p.Hkv + h) * Nk * Dv;
    const float* qf = load_f32(q, q_off, M * D, w.q);
    const float* kf = load_f32(k, k_off, Nk * D, w.k);
    const float* vf = load_f32(v, v_off, Nk * Dv, w.v);
    float* of = out_f32(out, o_off, M * Dv, w.o);
    w.s.resize(std::size_t(M * Nk));
    float* s = w.s.data();
    sgemm_(kRowMajor, kNoTrans, kTrans, int(M), int(Nk), int(D), scale, qf, int(D), kf, int(D), 0.0f, s, int(Nk));
    for (std::int64_t r = 0; r < M; ++r) {
      const std::int64_t i = r % p.Nq;
      softmax(s + r * Nk, p.causal ? std::min(Nk, i + 1) : Nk, Nk);
    }
    sgemm_(kRowMajor, kNoTrans, kNoTrans, int(M), int(Dv), int(Nk), 1.0f, s, int(Nk), vf, int(Dv), 0.0f, of, int(Dv));
    store_back(out, o_off, M * Dv, of);
  });
}

void blas_baseline::backward(const workload& p, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                             const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv, int threads) {
  static const softmax_fn softmax = pick_softmax();
  const std::int64_t G = p.Hq / p.Hkv, M = G * p.Nq, Nk = p.Nk, D = p.D, Dv = p.Dv;
  const float scale = float(1.0 / std::sqrt(double(D)));
  for_each_head(p, threads, [&](std::int64_t b, std::int64_t h, scratch& w) {
    const std::int64_t q_off = (b * p.Hq + h * G) * p.Nq * D, o_off = (b * p.Hq + h * G) * p.Nq * Dv;
    const std::int64_t k_off = (b * p.Hkv + h) * Nk * D, v_off = (b * p.Hkv + h) * Nk * Dv;
    const float* qf = load_f32(q, q_off, M * D, w.q);
    const float* kf = load_f32(k, k_off, Nk * D, w.k);
    const float* vf = load_f32(v, v_off, Nk * Dv, w.v);
    const float* of = load_f32(out, o_off, M * Dv, w.o);
    const float* gf = load_f32(dout, o_off, M * Dv, w.dout);
    float* dqf = out_f32(dq, q_off, M * D, w.dq);
    float* dkf = out_f32(dk, k_off, Nk * D, w.dk);
    float* dvf = out_f32(dv, v_off, Nk * Dv, w.dv);
    w.s.resize(std::size_t(M * Nk));
    w.dp.resize(std::size_t(M * Nk));
    w.di.resize(std::size_t(M));
    float *s = w.s.data(), *dp = w.dp.data();
    // P, recomputed as in the forward.
    sgemm_(kRowMajor, kNoTrans, kTrans, int(M), int(Nk), int(D), scale, qf, int(D), kf, int(D), 0.0f, s, int(Nk));
    for (std::int64_t r = 0; r < M; ++r) softmax(s + r * Nk, p.causal ? std::min(Nk, r % p.Nq + 1) : Nk, Nk);
    // dV = Pᵀ dO;  dP = dO Vᵀ
    sgemm_(kRowMajor, kTrans, kNoTrans, int(Nk), int(Dv), int(M), 1.0f, s, int(Nk), gf, int(Dv), 0.0f, dvf, int(Dv));
    sgemm_(kRowMajor, kNoTrans, kTrans, int(M), int(Nk), int(Dv), 1.0f, gf, int(Dv), vf, int(Dv), 0.0f, dp, int(Nk));
    // dS = P ∘ (dP − Di),  Di = rowsum(dO ∘ O)
    for (std::int64_t r = 0; r < M; ++r) {
      float di = 0;
      for (std::int64_t c = 0; c < Dv; ++c) di += gf[r * Dv + c] * of[r * Dv + c];
      float* dpr = dp + r * Nk;
      const float* sr = s + r * Nk;
      for (std::int64_t j = 0; j < Nk; ++j) dpr[j] = sr[j] * (dpr[j] - di);
    }
    // dQ = scale · dS K;  dK = scale · dSᵀ Q
    sgemm_(kRowMajor, kNoTrans, kNoTrans, int(M), int(D), int(Nk), scale, dp, int(Nk), kf, int(D), 0.0f, dqf, int(D));
    sgemm_(kRowMajor, kTrans, kNoTrans, int(Nk), int(D), int(M), scale, dp, int(Nk), qf, int(D), 0.0f, dkf, int(D));
    store_back(dq, q_off, M * D, dqf);
    store_back(dk, k_off, Nk * D, dkf);
    store_back(dv, v_off, Nk * Dv, dvf);
  });
}

}  // namespace attn::cli::bench

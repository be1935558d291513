// src/family/linear.cc — linear attention (Katharopoulos et al. 2020), forward and backward, and
// its float64 reference. Shapes: q [B, Hq, Nq, D], k [B, Hkv, Nk, D], v [B, Hkv, Nk, Dv] (or 3-D).
//
// Every row's keys are a prefix [0, hi_i) of the key axis (padding and causal only; the front
// refuses the rest), with hi_i non-decreasing in i. So, with a = φ(q_i), b_j = φ(k_j):
//   S_i = Σ_{j < hi_i} b_j v_jᵀ [D, Dv],  z_i = Σ_{j < hi_i} b_j [D]
//   num_i = S_iᵀ a,  den_i = a·z_i,  out_i = num_i / den_i (normalize) or num_i
// and S_i, z_i grow as i advances (prefix sums; without causal, hi_i = Nk for every i). Backward,
// with dnum_i = dout_i / den_i and dden_i = -dout_i·out_i / den_i (unnormalised: dout_i and 0):
//   dφq_i = S_i dnum_i + z_i dden_i                       (forward sweep)
//   G_j = Σ_{i: hi_i > j} a_i dnum_iᵀ,  g_j = Σ_{i: hi_i > j} a_i dden_i   (suffix sums over i)
//   dφk_j = G_j v_j + g_j,  dv_j = G_jᵀ b_j               (backward sweep over the keys)
// and dq = dφq ⊙ φ'(q), dk = dφk ⊙ φ'(k). Work is split by (batch, kv head); the query heads of
// a group run in order inside it, so dk and dv are summed in one fixed order: results are
// bitwise the same for any thread count.
//
// The reference (execution::path = reference) forms each row's weights s_ij = φ(q_i)·φ(k_j),
// α = s / Σ s, and differentiates that: a different algorithm, in float64, for the tests.
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "attn/family.h"
#include "core/common.h"
#include "cpu/family_kernels.h"
#include "cpu/denormals.h"
#include "family/family_impl.h"
#include "family/scores/score.h"

namespace attn {
namespace detail::family {
namespace {

double phi(feature_map f, double x) {
  if (f == feature_map::identity) return x;
  return f == feature_map::relu ? (x > 0.0 ? x : 0.0) : x > 0.0 ? x + 1.0 : std::exp(x);
}
double dphi(feature_map f, double x) {
  if (f == feature_map::identity) return 1.0;
  return x > 0.0 ? 1.0 : f == feature_map::relu ? 0.0 : std::exp(x);
}

struct lin_call {
  problem p;
  problem_storage store;
  feature_map f = feature_map::elu_plus_one;
  bool normalize = true;
  double scale = 1.0;  // unnormalised only: out = scale · num (the family's scaled_dot × identity)
  int rank = 4;
  dtype type = dtype::f32;
  bool reference = false;
};

void validate(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
              const linear_attention_options& o, const execution& exec, lin_call& L) {
  const int fi = int(o.phi);
  if (fi < 0 || fi > int(feature_map::identity)) fail(op, fmt::format("feature map {} is not a feature_map", fi));
  if (o.attn_mask)
    fail(op, "takes no attn_mask: linear attention never forms the Nq x Nk scores a mask would apply to (padding: "
             "nonpad_kv_seqlen; causal: is_causal)");
  if (o.window_left >= 0 || o.window_right >= 0)
    fail(op, fmt::format("takes no sliding window (got window_left = {}, window_right = {}): its keys are prefix sums",
                         o.window_left, o.window_right));
  if (exec.path == family_path::core)
    fail(op, "path core runs attn::attention (softmax); linear attention has its own kernel (automatic, tiled) and "
             "the reference");
  attention_options ao;
  static_cast<masking_options&>(ao) = o;
  ao.scale = 1.0;
  L.p = build_problem(op, q, k, v, ao, exec, L.store);
  L.f = o.phi, L.normalize = o.normalize, L.rank = q.rank(), L.type = q.type();
  family_path want = exec.path;
  if (want == family_path::automatic)
    if (const char* env = std::getenv("ATTN_FAMILY_PATH"); env && *env && std::string_view(env) != "automatic")
      want = parse_family_path(env);
  L.reference = want == family_path::reference;
}

// Keys [0, hi_i) of query i of batch b (key_range's lo is 0 without a window).
std::int64_t key_end(const problem& p, std::int64_t b, std::int64_t i) { return p.key_range(b, i).second; }

// ---- reference: each row's weights, in float64 ----

// s_j = φ(q_i)·φ(k_j) for j < hi into s; returns Σ s.
double row_weights(const lin_call& L, std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t hi,
                   std::vector<double>& s) {
  const problem& p = L.p;
  const std::int64_t hk = h / p.group();
  s.assign(std::size_t(hi), 0.0);
  double sum = 0.0;
  for (std::int64_t j = 0; j < hi; ++j) {
    double e = 0.0;
    for (std::int64_t d = 0; d < p.D; ++d) e += phi(L.f, p.q.load(b, h, i, d)) * phi(L.f, p.k.load(b, hk, j, d));
    s[std::size_t(j)] = e, sum += e;
  }
  return sum;
}

std::vector<double> reference_forward(const lin_call& L) {
  const problem& p = L.p;
  std::vector<double> out(std::size_t(p.B * p.Hq * p.Nq * p.Dv), 0.0), s;
  for_rows(p.B, p.Hq, p.Nq, [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t row) {
    const std::int64_t hi = key_end(p, b, i), hk = h / p.group();
    const double sum = row_weights(L, b, h, i, hi, s);
    if (L.normalize && sum == 0.0) return;  // no mass: out = 0
    const double div = L.normalize ? sum : 1.0 / L.scale;
    for (std::int64_t j = 0; j < hi; ++j)
      for (std::int64_t x = 0; x < p.Dv; ++x) out[std::size_t(row * p.Dv + x)] += s[std::size_t(j)] / div * p.v.load(b, hk, j, x);
  });
  return out;
}

// α_j = s_j / Σ s:  ds_j = (dα_j - Σ_l α_l dα_l) / Σ s  (unnormalised: ds = dα), dα_j = dout·v_j;
// s_j = a·b_j:  da += ds_j b_j,  db_j += ds_j a;  then through φ.
void reference_backward(const lin_call& L, const std::vector<double>& dout, std::vector<double>& dq,
                        std::vector<double>& dk, std::vector<double>& dv) {
  const problem& p = L.p;
  const std::int64_t D = p.D, Dv = p.Dv;
  dq.assign(std::size_t(p.B * p.Hq * p.Nq * D), 0.0);
  dk.assign(std::size_t(p.B * p.Hkv * p.Nk * D), 0.0);
  dv.assign(std::size_t(p.B * p.Hkv * p.Nk * Dv), 0.0);
  std::vector<double> s, da, ds;
  for_rows(p.B, p.Hq, p.Nq, [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t row) {
    const std::int64_t hi = key_end(p, b, i), hk = h / p.group();
    const double sum = row_weights(L, b, h, i, hi, s);
    if (L.normalize && sum == 0.0) return;
    const double div = L.normalize ? sum : 1.0 / L.scale;
    const double* dO = dout.data() + row * Dv;
    da.assign(std::size_t(hi), 0.0), ds.assign(std::size_t(hi), 0.0);
    double r = 0.0;
    for (std::int64_t j = 0; j < hi; ++j) {
      double t = 0.0;
      for (std::int64_t x = 0; x < Dv; ++x) {
        t += dO[x] * p.v.load(b, hk, j, x);
        dv[std::size_t(((b * p.Hkv + hk) * p.Nk + j) * Dv + x)] += s[std::size_t(j)] / div * dO[x];
      }
      da[std::size_t(j)] = t, r += s[std::size_t(j)] / div * t;
    }
    for (std::int64_t j = 0; j < hi; ++j) ds[std::size_t(j)] = L.normalize ? (da[std::size_t(j)] - r) / div : da[std::size_t(j)] / div;
    for (std::int64_t d = 0; d < D; ++d) {
      const double qd = p.q.load(b, h, i, d), a = phi(L.f, qd);
      double dA = 0.0;
      for (std::int64_t j = 0; j < hi; ++j) {
        const double kd = p.k.load(b, hk, j, d);
        dA += ds[std::size_t(j)] * phi(L.f, kd);
        dk[std::size_t(((b * p.Hkv + hk) * p.Nk + j) * D + d)] += ds[std::size_t(j)] * a * dphi(L.f, kd);
      }
      dq[std::size_t(row * D + d)] = dA * dphi(L.f, qd);
    }
  });
}

// ---- the fast path: prefix sums in T (float, or double for float64 input) ----

template <class T>
struct head_buffers {
  std::vector<T> K, V, Q;   // φ(k) [Nk, D], v [Nk, Dv], φ(q) of one head [Nq, D]
  std::vector<T> S, z;      // [D, Dv], [D]
  std::vector<std::int64_t> hi;  // [Nq]
};

// Loads φ of rows [0, N) of head h of x into out [N, X] (raw when f is null).
template <class T>
void load_rows(const strided4& x, std::int64_t b, std::int64_t h, std::int64_t N, std::int64_t X,
               const feature_map* f, std::vector<T>& out) {
  out.resize(std::size_t(N * X));
  std::vector<double> r(static_cast<std::size_t>(X), 0.0);
  for (std::int64_t n = 0; n < N; ++n) {
    load_row(x, b, h, n, X, r.data());
    for (std::int64_t d = 0; d < X; ++d) out[std::size_t(n * X + d)] = T(f ? phi(*f, r[std::size_t(d)]) : r[std::size_t(d)]);
  }
}

// S += b vᵀ, z += b for key j.
template <class T>
inline void add_key(std::int64_t D, std::int64_t Dv, const T* bj, const T* vj, T* S, T* z) {
  for (std::int64_t d = 0; d < D; ++d) {
    const T c = bj[d];
    T* Sd = S + d * Dv;
    for (std::int64_t x = 0; x < Dv; ++x) Sd[x] += c * vj[x];
    z[d] += c;
  }
}

// num = Sᵀ a [Dv]; returns a·z.
template <class T>
inline T query(std::int64_t D, std::int64_t Dv, const T* a, const T* S, const T* z, T* num) {
  for (std::int64_t x = 0; x < Dv; ++x) num[x] = T(0);
  T den = 0;
  for (std::int64_t d = 0; d < D; ++d) {
    const T c = a[d];
    const T* Sd = S + d * Dv;
    for (std::int64_t x = 0; x < Dv; ++x) num[x] += c * Sd[x];
    den += c * z[d];
  }
  return den;
}

template <class T>
void fast_forward(const lin_call& L, const strided4& out) {
  const problem& p = L.p;
  const std::int64_t D = p.D, Dv = p.Dv, G = p.group(), tasks = p.B * p.Hkv;
#pragma omp parallel num_threads(p.num_threads)
  {
    head_buffers<T> hb;
    std::vector<T> num(static_cast<std::size_t>(Dv), T(0));
    std::vector<double> o(static_cast<std::size_t>(Dv), 0.0);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t b = t / p.Hkv, hk = t % p.Hkv;
      load_rows<T>(p.k, b, hk, p.Nk, D, &L.f, hb.K);
      load_rows<T>(p.v, b, hk, p.Nk, Dv, nullptr, hb.V);
      for (std::int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        load_rows<T>(p.q, b, h, p.Nq, D, &L.f, hb.Q);
        hb.S.assign(std::size_t(D * Dv), T(0)), hb.z.assign(std::size_t(D), T(0));
        std::int64_t cur = 0;
        for (std::int64_t i = 0; i < p.Nq; ++i) {
          for (const std::int64_t hi = key_end(p, b, i); cur < hi; ++cur)
            add_key(D, Dv, hb.K.data() + cur * D, hb.V.data() + cur * Dv, hb.S.data(), hb.z.data());
          const T den = query(D, Dv, hb.Q.data() + i * D, hb.S.data(), hb.z.data(), num.data());
          for (std::int64_t x = 0; x < Dv; ++x)
            o[std::size_t(x)] = !L.normalize ? double(num[std::size_t(x)]) * L.scale
                                : den != T(0)  ? double(num[std::size_t(x)] / den)
                                               : 0.0;
          store_row(out, b, h, i, Dv, o.data());
        }
      }
    }
  }
}

template <class T>
void fast_backward(const lin_call& L, const strided4& dout, const strided4& dq, const strided4& dk,
                   const strided4& dv) {
  const problem& p = L.p;
  const std::int64_t D = p.D, Dv = p.Dv, G = p.group(), tasks = p.B * p.Hkv;
#pragma omp parallel num_threads(p.num_threads)
  {
    head_buffers<T> hb;
    std::vector<T> dO, dnum, dden, dK, dV, num(static_cast<std::size_t>(Dv), T(0)), dA(static_cast<std::size_t>(D), T(0));
    std::vector<double> row(static_cast<std::size_t>(std::max(D, Dv)), 0.0), raw(static_cast<std::size_t>(D), 0.0);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t b = t / p.Hkv, hk = t % p.Hkv;
      load_rows<T>(p.k, b, hk, p.Nk, D, &L.f, hb.K);
      load_rows<T>(p.v, b, hk, p.Nk, Dv, nullptr, hb.V);
      dK.assign(std::size_t(p.Nk * D), T(0)), dV.assign(std::size_t(p.Nk * Dv), T(0));
      for (std::int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        load_rows<T>(p.q, b, h, p.Nq, D, &L.f, hb.Q);
        load_rows<T>(dout, b, h, p.Nq, Dv, nullptr, dO);
        dnum.assign(std::size_t(p.Nq * Dv), T(0)), dden.assign(std::size_t(p.Nq), T(0));
        hb.hi.resize(std::size_t(p.Nq));
        // Forward sweep: S_i, z_i; dnum_i, dden_i; dq_i = (S_i dnum_i + z_i dden_i) ⊙ φ'(q_i).
        hb.S.assign(std::size_t(D * Dv), T(0)), hb.z.assign(std::size_t(D), T(0));
        std::int64_t cur = 0;
        for (std::int64_t i = 0; i < p.Nq; ++i) {
          const std::int64_t hi = key_end(p, b, i);
          hb.hi[std::size_t(i)] = hi;
          for (; cur < hi; ++cur) add_key(D, Dv, hb.K.data() + cur * D, hb.V.data() + cur * Dv, hb.S.data(), hb.z.data());
          const T* a = hb.Q.data() + i * D;
          const T* g = dO.data() + i * Dv;
          T* gn = dnum.data() + i * Dv;
          if (!L.normalize) {
            const T sc = T(L.scale);
            for (std::int64_t x = 0; x < Dv; ++x) gn[x] = g[x] * sc;
          } else {
            const T den = query(D, Dv, a, hb.S.data(), hb.z.data(), num.data());
            if (den != T(0)) {
              T go = 0;
              for (std::int64_t x = 0; x < Dv; ++x) gn[x] = g[x] / den, go += g[x] * (num[std::size_t(x)] / den);
              dden[std::size_t(i)] = -go / den;
            }
          }
          for (std::int64_t d = 0; d < D; ++d) {
            const T* Sd = hb.S.data() + d * Dv;
            T s = hb.z[std::size_t(d)] * dden[std::size_t(i)];
            for (std::int64_t x = 0; x < Dv; ++x) s += Sd[x] * gn[x];
            dA[std::size_t(d)] = s;
          }
          load_row(p.q, b, h, i, D, raw.data());
          for (std::int64_t d = 0; d < D; ++d)
            row[std::size_t(d)] = double(dA[std::size_t(d)]) * dphi(L.f, raw[std::size_t(d)]);
          store_row(dq, b, h, i, D, row.data());
        }
        // Backward sweep over the keys: G, g gather the queries that see key j (a suffix of i).
        std::vector<T>& Gm = hb.S;
        std::vector<T>& gv = hb.z;
        std::fill(Gm.begin(), Gm.end(), T(0)), std::fill(gv.begin(), gv.end(), T(0));
        std::int64_t qi = p.Nq - 1;
        for (std::int64_t j = p.Nk - 1; j >= 0; --j) {
          for (; qi >= 0 && hb.hi[std::size_t(qi)] > j; --qi) {
            const T* a = hb.Q.data() + qi * D;
            const T* gn = dnum.data() + qi * Dv;
            for (std::int64_t d = 0; d < D; ++d) {
              T* Gd = Gm.data() + d * Dv;
              for (std::int64_t x = 0; x < Dv; ++x) Gd[x] += a[d] * gn[x];
              gv[std::size_t(d)] += a[d] * dden[std::size_t(qi)];
            }
          }
          if (qi == p.Nq - 1) continue;  // no query sees key j (nor any key after the padding)
          const T* bj = hb.K.data() + j * D;
          const T* vj = hb.V.data() + j * Dv;
          T* dkj = dK.data() + j * D;
          T* dvj = dV.data() + j * Dv;
          for (std::int64_t d = 0; d < D; ++d) {
            const T* Gd = Gm.data() + d * Dv;
            T s = gv[std::size_t(d)];
            for (std::int64_t x = 0; x < Dv; ++x) s += Gd[x] * vj[x], dvj[x] += Gd[x] * bj[d];
            dkj[d] += s;
          }
        }
      }
      for (std::int64_t j = 0; j < p.Nk; ++j) {
        load_row(p.k, b, hk, j, D, raw.data());
        for (std::int64_t d = 0; d < D; ++d)
          row[std::size_t(d)] = double(dK[std::size_t(j * D + d)]) * dphi(L.f, raw[std::size_t(d)]);
        store_row(dk, b, hk, j, D, row.data());
        for (std::int64_t x = 0; x < Dv; ++x) row[std::size_t(x)] = double(dV[std::size_t(j * Dv + x)]);
        store_row(dv, b, hk, j, Dv, row.data());
      }
    }
  }
}

// ---- the float32 path: the SIMD kernels of the family table (cpu/family_linear_body.h) ----

// Rows [0, N) of head h of x as f32 rows of ld floats (zero past X), φ applied where f is given.
void f32_rows(const strided4& x, std::int64_t b, std::int64_t h, std::int64_t N, std::int64_t X, std::int64_t ld,
              const feature_map* f, float* out) {
  for (std::int64_t n = 0; n < N; ++n) {
    float* o = out + n * ld;
    switch (x.type) {
      case dtype::f32: {
        const float* p = x.ptr<float>(b, h, n, 0);
        for (std::int64_t d = 0; d < X; ++d) o[d] = p[d * x.sx];
        break;
      }
      case dtype::bf16: {
        const std::uint16_t* p = x.ptr<std::uint16_t>(b, h, n, 0);
        for (std::int64_t d = 0; d < X; ++d) o[d] = bf16_to_f32(p[d * x.sx]);
        break;
      }
      default:
        for (std::int64_t d = 0; d < X; ++d) o[d] = float(x.load(b, h, n, d));
    }
    if (f && *f != feature_map::identity)
      for (std::int64_t d = 0; d < X; ++d) o[d] = float(phi(*f, o[d]));
    for (std::int64_t d = X; d < ld; ++d) o[d] = 0.0f;
  }
}

// Row (b, h, n) of x from the X floats src, each times mul (mul applies in float).
void f32_store(const strided4& x, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X, const float* src,
               float mul) {
  switch (x.type) {
    case dtype::f32: {
      float* p = x.ptr<float>(b, h, n, 0);
      for (std::int64_t d = 0; d < X; ++d) p[d * x.sx] = src[d] * mul;
      break;
    }
    case dtype::bf16: {
      std::uint16_t* p = x.ptr<std::uint16_t>(b, h, n, 0);
      for (std::int64_t d = 0; d < X; ++d) p[d * x.sx] = f32_to_bf16(src[d] * mul);
      break;
    }
    default:
      for (std::int64_t d = 0; d < X; ++d) x.store(b, h, n, d, double(src[d] * mul));
  }
}

// g ⊙ φ'(x) for row (b, h, n) of x, in place: the chain rule through φ (nothing for identity).
void times_dphi(const lin_call& L, const strided4& x, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X,
                float* g) {
  if (L.f == feature_map::identity) return;
  for (std::int64_t d = 0; d < X; ++d) g[d] = float(double(g[d]) * dphi(L.f, x.load(b, h, n, d)));
}

std::int64_t padded(std::int64_t n, int W) { return (n + W - 1) / W * W; }
std::vector<float> floats(std::int64_t n) { return std::vector<float>(static_cast<std::size_t>(n), 0.0f); }

// One thread's rows of a (batch, kv head) and of its query heads, as the kernels take them.
struct f32_head {
  const lin_call& L;
  const problem& p;
  const cpu::family_table& kt;
  std::int64_t D, Dv, Dvp;
  std::vector<float> K, V, Q, S, z;
  std::vector<std::int64_t> hi;
  explicit f32_head(const lin_call& L_)
      : L(L_), p(L_.p), kt(cpu::select_family_kernels()), D(p.D), Dv(p.Dv),
        Dvp(padded(std::max<std::int64_t>(p.Dv, 1), kt.W)), K(floats(p.Nk * D)), V(floats(p.Nk * Dvp)),
        Q(floats(p.Nq * D)), S(floats(D * Dvp)), z(floats(D)), hi(static_cast<std::size_t>(p.Nq)) {}
  // φ(k), v and each query's keys of (b, hk).
  void load_kv(std::int64_t b, std::int64_t hk) {
    f32_rows(p.k, b, hk, p.Nk, D, D, &L.f, K.data());
    f32_rows(p.v, b, hk, p.Nk, Dv, Dvp, nullptr, V.data());
    for (std::int64_t i = 0; i < p.Nq; ++i) hi[static_cast<std::size_t>(i)] = key_end(p, b, i);
  }
  // φ(q) of query head h; the kernels' operands.
  cpu::family_linear load_q(std::int64_t b, std::int64_t h) {
    f32_rows(p.q, b, h, p.Nq, D, D, &L.f, Q.data());
    return {p.Nq, p.Nk, D, Dvp, Q.data(), K.data(), V.data(), hi.data(), L.normalize, float(L.scale), S.data(), z.data()};
  }
};

void f32_forward(const lin_call& L, const strided4& out) {
  const problem& p = L.p;
  const std::int64_t G = p.group(), tasks = p.B * p.Hkv;
#pragma omp parallel num_threads(p.num_threads)
  {
    const cpu::denormals_flushed ftz;
    f32_head w(L);
    std::vector<float> O = floats(p.Nq * w.Dvp);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t b = t / p.Hkv, hk = t % p.Hkv;
      w.load_kv(b, hk);
      for (std::int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        w.kt.linear_forward(w.load_q(b, h), O.data());
        for (std::int64_t i = 0; i < p.Nq; ++i) f32_store(out, b, h, i, p.Dv, O.data() + i * w.Dvp, 1.0f);
      }
    }
  }
}

void f32_backward(const lin_call& L, const strided4& dout, const strided4& dq, const strided4& dk,
                  const strided4& dv) {
  const problem& p = L.p;
  const std::int64_t D = p.D, G = p.group(), tasks = p.B * p.Hkv;
#pragma omp parallel num_threads(p.num_threads)
  {
    const cpu::denormals_flushed ftz;
    f32_head w(L);
    const std::int64_t Dvp = w.Dvp;
    std::vector<float> dO = floats(p.Nq * Dvp), dQ = floats(p.Nq * D), dK = floats(p.Nk * D), dV = floats(p.Nk * Dvp),
                       dnum = floats(p.Nq * Dvp), dden = floats(p.Nq), num = floats(Dvp);
#pragma omp for schedule(static)
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t b = t / p.Hkv, hk = t % p.Hkv;
      w.load_kv(b, hk);
      std::fill(dK.begin(), dK.end(), 0.0f), std::fill(dV.begin(), dV.end(), 0.0f);
      for (std::int64_t h = hk * G; h < (hk + 1) * G; ++h) {
        const cpu::family_linear a = w.load_q(b, h);
        f32_rows(dout, b, h, p.Nq, p.Dv, Dvp, nullptr, dO.data());
        w.kt.linear_backward(a, dO.data(), {dQ.data(), dK.data(), dV.data(), dnum.data(), dden.data(), num.data()});
        for (std::int64_t i = 0; i < p.Nq; ++i) {
          float* g = dQ.data() + i * D;
          times_dphi(L, p.q, b, h, i, D, g);
          f32_store(dq, b, h, i, D, g, 1.0f);
        }
      }
      for (std::int64_t j = 0; j < p.Nk; ++j) {
        times_dphi(L, p.k, b, hk, j, D, dK.data() + j * D);
        f32_store(dk, b, hk, j, D, dK.data() + j * D, 1.0f);
        f32_store(dv, b, hk, j, p.Dv, dV.data() + j * Dvp, 1.0f);
      }
    }
  }
}

}  // namespace
}  // namespace detail::family

using namespace detail::family;
using detail::fail;
using detail::problem;
using detail::strided4;
using detail::as_bhnx;

namespace detail::family {

linear_attention_result linear_scaled(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                                      const linear_attention_options& options, double scale, const execution& exec) {
  lin_call L;
  validate(op, q, k, v, options, exec, L);
  L.scale = scale;
  const problem& p = L.p;
  linear_attention_result r;
  if (L.reference) {
    r.out = store_bhnx(reference_forward(L), p.B, p.Hq, p.Nq, p.Dv, L.rank, L.type);
    r.path = "reference";
    return r;
  }
  r.out = empty_bhnx(p.B, p.Hq, p.Nq, p.Dv, L.rank, L.type);
  const strided4 out = as_bhnx(r.out, p.Hq);
  if (L.type == dtype::f64) fast_forward<double>(L, out), r.path = "linear (f64)";
  else f32_forward(L, out), r.path = fmt::format("linear (f32, {})", cpu::select_family_kernels().name);
  return r;
}

linear_attention_grads linear_scaled_backward(const char* op, const TensorView& q, const TensorView& k,
                                              const TensorView& v, const TensorView& dout,
                                              const linear_attention_options& options, double scale,
                                              const execution& exec) {
  lin_call L;
  validate(op, q, k, v, options, exec, L);
  L.scale = scale;
  const problem& p = L.p;
  const Shape os = L.rank == 4 ? Shape{p.B, p.Hq, p.Nq, p.Dv} : Shape{p.B, p.Nq, p.Hq * p.Dv};
  if (dout.shape() != os)
    fail(op, fmt::format("dout has shape {}, expected {} (the shape of out)", shape_str(dout.shape()), shape_str(os)));
  if (!is_floating(dout.type())) fail(op, fmt::format("dout has dtype {}, expected a float dtype", dtype_name(dout.type())));
  linear_attention_grads g;
  if (L.reference) {
    std::vector<double> dq, dk, dv;
    reference_backward(L, load_bhnx(dout, p.B, p.Hq, p.Nq, p.Dv), dq, dk, dv);
    g.dq = store_bhnx(dq, p.B, p.Hq, p.Nq, p.D, L.rank, L.type);
    g.dk = store_bhnx(dk, p.B, p.Hkv, p.Nk, p.D, L.rank, L.type);
    g.dv = store_bhnx(dv, p.B, p.Hkv, p.Nk, p.Dv, L.rank, L.type);
    g.path = "reference";
    return g;
  }
  g.dq = empty_bhnx(p.B, p.Hq, p.Nq, p.D, L.rank, L.type);
  g.dk = empty_bhnx(p.B, p.Hkv, p.Nk, p.D, L.rank, L.type);
  g.dv = empty_bhnx(p.B, p.Hkv, p.Nk, p.Dv, L.rank, L.type);
  const strided4 sdo = as_bhnx(dout, p.Hq), sdq = as_bhnx(g.dq, p.Hq), sdk = as_bhnx(g.dk, p.Hkv),
                 sdv = as_bhnx(g.dv, p.Hkv);
  if (L.type == dtype::f64) fast_backward<double>(L, sdo, sdq, sdk, sdv), g.path = "linear (f64)";
  else f32_backward(L, sdo, sdq, sdk, sdv), g.path = fmt::format("linear (f32, {})", cpu::select_family_kernels().name);
  return g;
}

}  // namespace detail::family

linear_attention_result linear_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                         const linear_attention_options& options, const execution& exec) {
  return linear_scaled("linear_attention", q, k, v, options, 1.0, exec);
}

linear_attention_grads linear_attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                                 const TensorView& dout, const linear_attention_options& options,
                                                 const execution& exec) {
  return linear_scaled_backward("linear_attention_backward", q, k, v, dout, options, 1.0, exec);
}

}  // namespace attn

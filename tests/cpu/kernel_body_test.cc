// tests/cpu_kernel_body_test.cc — the cpu kernel body (src/cpu/kernel_body.h) compiled once more
// here, for the baseline ISA (W = 4), with a portable stand-in for the bf16 dot product (and
// for the int16 one of AVX512_VNNI, which the int8 decode uses). That makes the bf16-pair
// entries (forward, dq, dk/dv and decode's q·k) and the int16 decode run on any CPU: the
// avx512bf16 level itself runs in cpu_attention_test only where the CPU has AVX512_BF16, and
// since bf16 is now an operand type of the same body, a wrong word layout, key-pair alignment
// or packing of P/dS shows here too. Each bf16 entry is compared with the f32 entry of the same
// table on the same bf16-exact inputs; the only differences allowed are the rounding of P and
// dS to bf16 (forward P·V, dq, dk/dv) and the order of the sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "cpu/kernels.h"

namespace attn::detail::cpu {
namespace {
constexpr int W = 4;  // floats per vector
constexpr int C = 2;  // vectors per tile row
constexpr int R = 6;  // tile rows
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/kernel_body.h"

namespace attn::detail::cpu {
namespace {

// vdpbf16ps in portable vector code: acc + a.hi·b.hi + a.lo·b.lo per 32-bit lane (the product
// of two bf16 is exact in f32).
struct portable_bf16_dot {
  static constexpr bool available = true;
  static vf dot_pairs(vf acc, vu a, vu b) {
    const vu hi = splatu(0xffff0000u);
    const vf alo = (vf)(a << 16), ahi = (vf)(a & hi), blo = (vf)(b << 16), bhi = (vf)(b & hi);
    const vf t = acc + ahi * bhi;
    return t + alo * blo;
  }
  template <int n>
  static void widen_int8(const std::int8_t* p, vf* out) {
    for (int v = 0; v < n; ++v) {
      vf x{};
      for (int l = 0; l < W; ++l) x[l] = float(p[v * W + l]);
      out[v] = x;
    }
  }
  static vu row_pairs(vf lo, vf hi) { return bf16_bits(hi) << 16 | bf16_bits(lo); }  // word x = (lo[x], hi[x])
  static vu pack_pairs(vf lo, vf hi) {  // word w = (x[2w], x[2w + 1]) of lo ‖ hi
    const vu a = bf16_bits(lo), b = bf16_bits(hi);
    vu r;
    for (int w = 0; w < W; ++w) r[w] = 2 * w < W ? a[2 * w] | a[2 * w + 1] << 16 : b[2 * w - W] | b[2 * w - W + 1] << 16;
    return r;
  }

  // vpdpwssd, vpmovsxbw and vpunpck[lh]wd (within 128-bit lanes) in portable code.
  static constexpr bool int16 = true;
  static std::int32_t half(std::uint32_t w, int k) { return std::int16_t(std::uint16_t(w >> (16 * k))); }
  static vi dot_int16(vi acc, vu a, vu b) {
    for (int l = 0; l < W; ++l) acc[l] += half(a[l], 0) * half(b[l], 0) + half(a[l], 1) * half(b[l], 1);
    return acc;
  }
  static vi dot_int16_bcast(vi acc, vu a, const std::uint32_t* p) { return dot_int16(acc, a, *p - vu{}); }
  static std::uint32_t pair(std::int32_t lo, std::int32_t hi) {
    return std::uint32_t(std::uint16_t(lo)) | std::uint32_t(std::uint16_t(hi)) << 16;
  }
  static vu widen_int8_words(const std::int8_t* p) {
    vu r;
    for (int w = 0; w < W; ++w) r[w] = pair(p[2 * w], p[2 * w + 1]);
    return r;
  }
  static std::int32_t value(vu x, int d) { return half(x[d / 2], d % 2); }  // int16 value d of 2W
  static vu interleave(vu a, vu b, int high) {
    vu r;
    for (int j = 0; j < W; ++j) {
      const int d = 8 * (j / 4) + 4 * high + j % 4;
      r[j] = pair(value(a, d), value(b, d));
    }
    return r;
  }
  static vu interleave_lo(vu a, vu b) { return interleave(a, b, 0); }
  static vu interleave_hi(vu a, vu b) { return interleave(a, b, 1); }
};

constexpr kernel_table kTable = make_table<portable_bf16_dot>("test");
constexpr float kInfF = std::numeric_limits<float>::infinity();

struct aligned_floats {
  float* p;
  explicit aligned_floats(std::int64_t n)
      : p(static_cast<float*>(std::aligned_alloc(64, std::size_t((n * 4 + 63) / 64 * 64)))) {
    std::fill(p, p + n, 0.0f);
  }
  ~aligned_floats() { std::free(p); }
  aligned_floats(const aligned_floats&) = delete;
  aligned_floats& operator=(const aligned_floats&) = delete;
};

// Random values that bf16 holds exactly, as floats and as bf16 bits.
struct bf16_values {
  std::vector<float> f;
  std::vector<std::uint16_t> h;
  bf16_values(std::size_t n, std::mt19937& rng) : f(n), h(n) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (std::size_t i = 0; i < n; ++i) {
      float x = u(rng);
      std::uint32_t bits;
      std::memcpy(&bits, &x, 4);
      h[i] = std::uint16_t(bits >> 16);
      bits = std::uint32_t(h[i]) << 16;
      std::memcpy(&f[i], &bits, 4);
    }
  }
};
std::uint32_t word(std::uint16_t lo, std::uint16_t hi) { return lo | std::uint32_t(hi) << 16; }

// An additive mask with -inf holes: row r (lane or query row), key j.
struct test_mask {
  std::int64_t rows = 0;
  static float value(std::int64_t r, std::int64_t j) {
    return (j * 7 + r * 3) % 5 == 0 ? -kInfF : 0.25f * float((j + r) % 3);
  }
};
mask_tile_kind fill_mask(const void* ctx, std::int64_t j0, std::int64_t nb, float* tile, std::int64_t rs, std::int64_t ks) {
  const auto& m = *static_cast<const test_mask*>(ctx);
  for (std::int64_t r = 0; r < m.rows; ++r)
    for (std::int64_t jj = 0; jj < nb; ++jj) tile[r * rs + jj * ks] = test_mask::value(r, j0 + jj);
  return mask_tile_kind::mixed;
}

struct variant {
  bool mask = false;
  float softcap = 0.0f;
  bool alibi = false;
};

score_params params(const variant& v, const test_mask* m, float scale) {
  score_params sp;
  sp.scale = scale;
  sp.softcap = v.softcap;
  sp.alibi = v.alibi;
  if (v.mask) sp.bias = fill_mask, sp.bias_ctx = m;
  return sp;
}

// Largest |a - b| over the largest finite |b| (at least 1e-3); infinite where only one side is
// infinite (masked rows have lse -inf on both sides).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0, m = 1e-3;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isfinite(b[i])) m = std::max(m, std::abs(double(b[i])));
    if (a[i] == b[i]) continue;
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
  }
  return d / m;
}
double max_abs(const std::vector<float>& a) {
  double m = 0.0;
  for (float x : a) m = std::max(m, std::abs(double(x)));
  return m;
}

// One lane block of L lanes against Nk keys, bf16-exact q, k, v, dout; both layouts the driver
// builds (f32 rows, bf16 pair words).
struct lane_case {
  std::int64_t L, nl, D, Dv, Nk, nk2;
  bf16_values q, k, v, dout;  // q, dout [L][D|Dv]; k, v [Nk][D|Dv]
  std::vector<std::int32_t> lo, hi, pos;
  std::vector<float> slope;
  test_mask mask;

  lane_case(std::int64_t L_, std::int64_t nl_, std::int64_t D_, std::int64_t Dv_, std::int64_t Nk_, std::mt19937& rng)
      : L(L_), nl(nl_), D(D_), Dv(Dv_), Nk(Nk_), nk2((Nk_ + 1) / 2 * 2),
        q(std::size_t(L_ * D_), rng), k(std::size_t(Nk_ * D_), rng), v(std::size_t(Nk_ * Dv_), rng),
        dout(std::size_t(L_ * Dv_), rng), lo(L_), hi(L_), pos(L_), slope(L_) {
    std::uniform_int_distribution<std::int64_t> u(0, Nk);
    for (std::int64_t x = 0; x < L; ++x) {
      std::int64_t a = u(rng), b = u(rng);
      if (x == 0) a = 0, b = Nk;  // one lane sees every key
      lo[x] = std::int32_t(std::min(a, b)), hi[x] = std::int32_t(std::max(a, b));
      if (x >= nl) lo[x] = hi[x] = 0;
      pos[x] = std::int32_t(x * 3);
      slope[x] = 0.05f * float(x + 1);
    }
    mask.rows = L;
  }

  lane_block block(const score_params& sp, float* scratch, const std::vector<float>& qt) const {
    lane_block lb;
    lb.L = L, lb.nl = nl, lb.D = D, lb.Dv = Dv;
    lb.qt = qt.data();
    lb.k = k.f.data(), lb.v = v.f.data(), lb.ksn = D, lb.vsn = Dv;
    lb.lo = lo.data(), lb.hi = hi.data(), lb.pos = pos.data(), lb.slope = slope.data();
    lb.klo = 0, lb.khi = Nk;
    lb.sp = sp;
    lb.scratch = scratch;
    return lb;
  }
  std::vector<float> transposed(const bf16_values& x, std::int64_t X) const {  // [X][L]
    std::vector<float> t(std::size_t(X * L), 0.0f);
    for (std::int64_t l = 0; l < nl; ++l)
      for (std::int64_t d = 0; d < X; ++d) t[std::size_t(d * L + l)] = x.f[std::size_t(l * X + d)];
    return t;
  }
  std::vector<std::uint32_t> lane_words(const bf16_values& x, std::int64_t X) const {  // [X/2][L]
    std::vector<std::uint32_t> w(std::size_t(X / 2 * L), 0);
    for (std::int64_t l = 0; l < nl; ++l)
      for (std::int64_t d = 0; d < X; d += 2)
        w[std::size_t(d / 2 * L + l)] = word(x.h[std::size_t(l * X + d)], x.h[std::size_t(l * X + d + 1)]);
    return w;
  }
  std::vector<std::uint16_t> key_rows(const bf16_values& x, std::int64_t X) const {  // [Nk'][X]
    std::vector<std::uint16_t> r(std::size_t(nk2 * X), 0);
    std::copy(x.h.begin(), x.h.end(), r.begin());
    return r;
  }
  std::vector<std::uint32_t> key_pairs(const bf16_values& x, std::int64_t X) const {  // [Nk'/2][X]
    std::vector<std::uint32_t> p(std::size_t(nk2 / 2 * X), 0);
    for (std::int64_t j = 0; j < Nk; ++j)
      for (std::int64_t d = 0; d < X; ++d) p[std::size_t(j / 2 * X + d)] |= std::uint32_t(x.h[std::size_t(j * X + d)]) << (16 * (j % 2));
    return p;
  }
};

struct forward_result {
  std::vector<float> out, lse;  // out [L][Dv] normalised
};
// out and lse of the lanes from a forward's m, l and oᵀ.
forward_result normalised(const lane_case& c, const std::vector<float>& m, const std::vector<float>& l,
                          const std::vector<float>& ot) {
  forward_result r{std::vector<float>(std::size_t(c.nl * c.Dv)), std::vector<float>(std::size_t(c.nl))};
  for (std::int64_t x = 0; x < c.nl; ++x) {
    r.lse[std::size_t(x)] = l[std::size_t(x)] > 0 ? m[std::size_t(x)] + std::log(l[std::size_t(x)]) : -kInfF;
    for (std::int64_t d = 0; d < c.Dv; ++d)
      r.out[std::size_t(x * c.Dv + d)] = l[std::size_t(x)] > 0 ? ot[std::size_t(d * c.L + x)] / l[std::size_t(x)] : 0.0f;
  }
  return r;
}
forward_result run_forward(const lane_case& c, bool bf16, bool q_bf16_decode, const score_params& sp) {
  aligned_floats scratch(lane_scratch_floats(c.L, c.D, c.Dv) + bf16_scratch_floats(c.L));
  std::vector<float> m(std::size_t(c.L), -kInfF), l(std::size_t(c.L), 0.0f), ot(std::size_t(c.Dv * c.L), 0.0f);
  const std::vector<float> qt = c.transposed(c.q, c.D);
  lane_block lb = c.block(sp, scratch.p, qt);
  const forward_io io{m.data(), l.data(), ot.data()};
  std::vector<std::uint16_t> k16, v16;
  if (bf16 && c.L == kTable.lanes) {
    const std::vector<std::uint32_t> qp = c.lane_words(c.q, c.D), vp = c.key_pairs(c.v, c.Dv);
    const std::vector<std::uint16_t> kr = c.key_rows(c.k, c.D);
    kTable.forward_bf16(lb, bf16_operands{qp.data(), kr.data(), c.D, vp.data()}, io);
  } else {
    if (bf16) {  // decode reads bf16 rows as they are
      k16 = c.key_rows(c.k, c.D), v16 = c.key_rows(c.v, c.Dv);
      lb.k16 = k16.data(), lb.v16 = v16.data(), lb.q_bf16 = q_bf16_decode;
    }
    kTable.forward(lb, io);
  }
  return normalised(c, m, l, ot);
}

const variant kVariants[] = {{}, {true, 0.0f, false}, {false, 3.0f, true}, {true, 5.0f, true}};

TEST(cpu_kernel_body, bf16_pair_forward_matches_f32) {
  std::mt19937 rng(7);
  for (const variant& v : kVariants)
    for (std::int64_t D : {2, 8, 34})
      for (std::int64_t Nk : {1, 5, 130, 257})
        for (std::int64_t nl : {std::int64_t(kTable.lanes), std::int64_t(5)}) {
          SCOPED_TRACE(::testing::Message() << "D " << D << " Nk " << Nk << " nl " << nl << " mask " << v.mask
                                            << " softcap " << v.softcap << " alibi " << v.alibi);
          const lane_case c(kTable.lanes, nl, D, D + 4, Nk, rng);
          const score_params sp = params(v, &c.mask, 0.3f);
          const forward_result f32 = run_forward(c, false, false, sp), b16 = run_forward(c, true, false, sp);
          EXPECT_LT(rel_diff(b16.lse, f32.lse), 1e-5);
          EXPECT_LT(rel_diff(b16.out, f32.out), 1e-2);  // P rounded to bf16
          if (Nk > 1) {
            EXPECT_GT(max_abs(f32.out), 1e-2);  // a comparison of zeros proves nothing
          }
        }
}

TEST(cpu_kernel_body, bf16_pair_decode_matches_f32) {
  std::mt19937 rng(8);
  for (const variant& v : kVariants)
    for (std::int64_t D : {8, 16, 64})
      for (std::int64_t Nk : {1, 7, 100})
        for (std::int64_t nl : {1, 2, 3, 4}) {
          SCOPED_TRACE(::testing::Message() << "D " << D << " Nk " << Nk << " nl " << nl << " mask " << v.mask);
          const lane_case c(kTable.lanes_small, nl, D, D, Nk, rng);
          const score_params sp = params(v, &c.mask, 0.3f);
          const forward_result f32 = run_forward(c, false, false, sp);
          const forward_result widened = run_forward(c, true, false, sp), pairs = run_forward(c, true, true, sp);
          EXPECT_LT(rel_diff(widened.out, f32.out), 1e-5);
          // q·k products exact; p rounded to bf16 (nearest even, 2^-9 relative) for P·V, as in the prefill
          EXPECT_LT(rel_diff(pairs.out, f32.out), 4e-3);
          EXPECT_LT(rel_diff(pairs.lse, f32.lse), 1e-5);
        }
}

// int8 K/V rows with per-row scales (decode): bf16 q through the int16 dot products (q and the
// weights p·scale_v as int16) against f32 q through the widened rows (exact products): the same
// lse to q's int16 rounding, the same output to the weights' (2^-16 of a block's largest).
TEST(cpu_kernel_body, int16_decode_of_int8_rows_matches_f32) {
  std::mt19937 rng(9);
  std::uniform_int_distribution<int> i8(-127, 127);
  std::uniform_real_distribution<float> sc(0.002f, 0.03f);
  for (const variant& v : kVariants)
    for (std::int64_t D : {16, 32, 64})
      for (std::int64_t Nk : {1, 7, 100})
        for (std::int64_t nl : {1, 2, 3, 4}) {
          SCOPED_TRACE(::testing::Message() << "D " << D << " Nk " << Nk << " nl " << nl << " mask " << v.mask
                                            << " softcap " << v.softcap << " alibi " << v.alibi);
          const lane_case c(kTable.lanes_small, nl, D, D, Nk, rng);
          const score_params sp = params(v, &c.mask, 0.3f);
          std::vector<std::int8_t> k8(std::size_t(Nk * D)), v8(std::size_t(Nk * D));
          for (auto& x : k8) x = std::int8_t(i8(rng));
          for (auto& x : v8) x = std::int8_t(i8(rng));
          std::vector<float> ks(static_cast<std::size_t>(Nk)), vs(static_cast<std::size_t>(Nk));
          for (auto& x : ks) x = sc(rng);
          for (auto& x : vs) x = sc(rng);
          const auto run = [&](bool q_bf16) {
            aligned_floats scratch(lane_scratch_floats(c.L, c.D, c.Dv));
            std::vector<float> m(std::size_t(c.L), -kInfF), l(std::size_t(c.L), 0.0f), ot(std::size_t(c.Dv * c.L), 0.0f);
            const std::vector<float> qt = c.transposed(c.q, c.D);
            lane_block lb = c.block(sp, scratch.p, qt);
            lb.k8 = k8.data(), lb.v8 = v8.data(), lb.kscale = ks.data(), lb.vscale = vs.data(), lb.kss = lb.vss = 1;
            lb.q_bf16 = q_bf16;
            kTable.forward(lb, forward_io{m.data(), l.data(), ot.data()});
            return normalised(c, m, l, ot);
          };
          const forward_result f32 = run(false), i16 = run(true);
          EXPECT_LT(rel_diff(i16.lse, f32.lse), 2e-5);
          EXPECT_LT(rel_diff(i16.out, f32.out), 2e-4);
          if (Nk > 1) {
            EXPECT_GT(max_abs(f32.out), 1e-2);
          }
        }
}

// lse of each lane in double (the backward's input), +inf on a lane with no key.
std::vector<float> lane_lse(const lane_case& c, const variant& v, float scale) {
  std::vector<float> lse(std::size_t(c.L), kInfF);
  for (std::int64_t x = 0; x < c.nl; ++x) {
    double mx = -INFINITY;
    std::vector<double> s;
    for (std::int64_t j = c.lo[std::size_t(x)]; j < c.hi[std::size_t(x)]; ++j) {
      double qk = 0.0;
      for (std::int64_t d = 0; d < c.D; ++d) qk += double(c.q.f[std::size_t(x * c.D + d)]) * c.k.f[std::size_t(j * c.D + d)];
      double t = scale * qk;
      if (v.softcap > 0) t = v.softcap * std::tanh(t / v.softcap);
      if (v.mask) t += test_mask::value(x, j);
      if (v.alibi) t -= c.slope[std::size_t(x)] * std::abs(double(c.pos[std::size_t(x)] - j));
      s.push_back(t), mx = std::max(mx, t);
    }
    if (mx == -INFINITY) continue;
    double sum = 0.0;
    for (double t : s) sum += std::exp(t - mx);
    lse[std::size_t(x)] = float(mx + std::log(sum));
  }
  return lse;
}

TEST(cpu_kernel_body, bf16_pair_dq_matches_f32) {
  std::mt19937 rng(9);
  for (const variant& v : kVariants)
    for (std::int64_t D : {2, 8, 34})
      for (std::int64_t Nk : {1, 5, 130, 257}) {
        SCOPED_TRACE(::testing::Message() << "D " << D << " Nk " << Nk << " mask " << v.mask << " softcap "
                                          << v.softcap << " alibi " << v.alibi);
        const std::int64_t L = kTable.lanes, Dv = D + 2;
        const lane_case c(L, 6, D, Dv, Nk, rng);
        const score_params sp = params(v, &c.mask, 0.3f);
        std::vector<float> lv = lane_lse(c, v, 0.3f);
        lv.resize(std::size_t(2 * L), 0.0f);
        for (std::int64_t x = 0; x < c.nl; ++x) lv[std::size_t(L + x)] = 0.1f * float(x) - 0.2f;  // Δ
        const std::vector<float> qt = c.transposed(c.q, D), doutt = c.transposed(c.dout, Dv);
        std::vector<float> dq32(std::size_t(D * L)), dq16(std::size_t(D * L));
        {
          aligned_floats scratch(lane_scratch_floats(L, D, Dv) + bf16_scratch_floats(L));
          kTable.dq(c.block(sp, scratch.p, qt), dq_io{doutt.data(), lv.data(), lv.data() + L, dq32.data()});
        }
        {
          aligned_floats scratch(lane_scratch_floats(L, D, Dv) + bf16_scratch_floats(L));
          const std::vector<std::uint32_t> qp = c.lane_words(c.q, D), dop = c.lane_words(c.dout, Dv);
          const std::vector<std::uint16_t> kr = c.key_rows(c.k, D), vr = c.key_rows(c.v, Dv);
          const std::vector<std::uint32_t> kp = c.key_pairs(c.k, D);
          kTable.dq_bf16(c.block(sp, scratch.p, qt), bf16_dq_operands{qp.data(), dop.data(), kr.data(), vr.data(), kp.data()},
                         dq_io{doutt.data(), lv.data(), lv.data() + L, dq16.data()});
        }
        EXPECT_LT(rel_diff(dq16, dq32), 2e-2);  // dS rounded to bf16
        if (Nk > 1) {
          EXPECT_GT(max_abs(dq32), 1e-3);
        }
      }
}

TEST(cpu_kernel_body, bf16_pair_dkdv_matches_f32) {
  std::mt19937 rng(10);
  for (const variant& v : kVariants)
    for (std::int64_t D : {2, 8, 34})
      for (std::int64_t nq : {1, 5, 64})
        for (std::int64_t nb : {1, 7, 64}) {
          SCOPED_TRACE(::testing::Message() << "D " << D << " nq " << nq << " nb " << nb << " mask " << v.mask
                                            << " softcap " << v.softcap << " alibi " << v.alibi);
          const std::int64_t Dv = D + 2, j0 = 3, Nk = j0 + nb, ld = (nb + W - 1) / W * W, nq2 = (nq + 1) / 2;
          // nq query rows as lanes of a case with keys [0, Nk): one head, the block [j0, j0 + nb).
          lane_case c(nq, nq, D, Dv, Nk, rng);
          c.mask.rows = nq;
          std::fill(c.slope.begin(), c.slope.end(), 0.1f);  // one head: one ALiBi slope
          const std::vector<float> lse = lane_lse(c, v, 0.3f);
          std::vector<float> delta(std::size_t(nq), 0.0f);
          for (std::int64_t r = 0; r < nq; ++r) delta[std::size_t(r)] = 0.05f * float(r % 7) - 0.1f;
          std::vector<float> kt(std::size_t(D * ld), 0.0f), vt(std::size_t(Dv * ld), 0.0f);
          std::vector<std::uint32_t> ktp(std::size_t(D / 2 * ld), 0), vtp(std::size_t(Dv / 2 * ld), 0);
          for (std::int64_t x = 0; x < nb; ++x) {
            const std::int64_t j = j0 + x;
            for (std::int64_t d = 0; d < D; ++d) kt[std::size_t(d * ld + x)] = c.k.f[std::size_t(j * D + d)];
            for (std::int64_t d = 0; d < Dv; ++d) vt[std::size_t(d * ld + x)] = c.v.f[std::size_t(j * Dv + d)];
            for (std::int64_t d = 0; d < D; d += 2)
              ktp[std::size_t(d / 2 * ld + x)] = word(c.k.h[std::size_t(j * D + d)], c.k.h[std::size_t(j * D + d + 1)]);
            for (std::int64_t d = 0; d < Dv; d += 2)
              vtp[std::size_t(d / 2 * ld + x)] = word(c.v.h[std::size_t(j * Dv + d)], c.v.h[std::size_t(j * Dv + d + 1)]);
          }
          std::vector<std::uint32_t> qpr(std::size_t(nq2 * D), 0), dopr(std::size_t(nq2 * Dv), 0);
          for (std::int64_t r = 0; r < nq; ++r) {
            for (std::int64_t d = 0; d < D; ++d) qpr[std::size_t(r / 2 * D + d)] |= std::uint32_t(c.q.h[std::size_t(r * D + d)]) << (16 * (r % 2));
            for (std::int64_t d = 0; d < Dv; ++d)
              dopr[std::size_t(r / 2 * Dv + d)] |= std::uint32_t(c.dout.h[std::size_t(r * Dv + d)]) << (16 * (r % 2));
          }
          std::vector<float> dk32(std::size_t(D * ld), 0.0f), dv32(std::size_t(Dv * ld), 0.0f);
          std::vector<float> dk16(std::size_t(D * ld), 0.0f), dv16(std::size_t(Dv * ld), 0.0f);
          double da32 = 0.0, da16 = 0.0;
          const score_params sp = params(v, &c.mask, 0.3f);
          for (int run = 0; run < 2; ++run) {
            aligned_floats scratch(row_scratch_floats(64, ld));
            dkdv_pair pr;
            pr.nq = nq, pr.nb = nb, pr.ldk = ld, pr.D = D, pr.Dv = Dv, pr.j0 = j0;
            pr.q = c.q.f.data(), pr.qsn = D, pr.dout = c.dout.f.data(), pr.dsn = Dv;
            pr.lse = lse.data(), pr.delta = delta.data();
            pr.lo = c.lo.data(), pr.hi = c.hi.data(), pr.pos = c.pos.data(), pr.slope = c.slope[0];
            pr.kt = kt.data(), pr.vt = vt.data();
            pr.dkt = run ? dk16.data() : dk32.data(), pr.dvt = run ? dv16.data() : dv32.data();
            pr.sp = sp;
            pr.dalibi = run ? &da16 : &da32;
            pr.scratch = scratch.p;
            if (run == 0) {
              kTable.dkdv(pr);
            } else {
              kTable.dkdv_bf16(pr, bf16_dkdv_operands{c.q.h.data(), c.dout.h.data(), qpr.data(), dopr.data(),
                                                      ktp.data(), vtp.data()});
            }
          }
          EXPECT_LT(rel_diff(dk16, dk32), 2e-2);  // P and dS rounded to bf16
          EXPECT_LT(rel_diff(dv16, dv32), 2e-2);
          if (v.alibi) {
            EXPECT_NEAR(da16, da32, 2e-2 * std::max(1.0, std::abs(da32)));
          }
          EXPECT_GT(max_abs(dv32), 1e-2);
        }
}

}  // namespace
}  // namespace attn::detail::cpu

namespace attn::detail::cpu {
namespace {

// vexp2 (simd.h), the prefill softmax's exponential, in its portable form (the AVX-512 form,
// vrndscaleps and vscalefps, runs in cpu_attention_test): within 3 ulp of 2^u over the range it
// is used on, exactly 1 at 0, exactly 0 below -125 and at -inf, NaN kept.
TEST(cpu_kernel_body, vexp2_accuracy_and_special_values) {
  double worst = 0.0;
  for (double u = -124.0; u <= 127.0; u += 0.00731) {
    const vf got = vexp2(splat(float(u)));
    const double want = std::exp2(double(float(u)));
    worst = std::max(worst, std::abs(double(got[0]) - want) / want);
  }
  EXPECT_LT(worst, 3 * 0x1p-24);
  EXPECT_EQ(vexp2(splat(0.0f))[0], 1.0f);
  EXPECT_EQ(vexp2(splat(-1.0f))[0], 0.5f);
  EXPECT_EQ(vexp2(splat(-126.0f))[0], 0.0f);
  EXPECT_EQ(vexp2(splat(-std::numeric_limits<float>::infinity()))[0], 0.0f);
  EXPECT_TRUE(std::isnan(vexp2(splat(std::numeric_limits<float>::quiet_NaN()))[0]));
  for (float u = -140.0f; u <= -110.0f; u += 0.0625f) {  // no denormal result: 0 below -125
    const float e = vexp2(splat(u))[0];
    EXPECT_NE(std::fpclassify(e), FP_SUBNORMAL) << u;
    if (u < -125.0f) {
      EXPECT_EQ(e, 0.0f) << u;
    }
  }
}

// vtanh (simd.h; the softcap's, activated_general's and additive's tanh) on the inputs of
// check_vtanh: within 2^-21 of tanh absolutely (the reciprocal's 2^-22 near 0, where 2/(e + 1) is
// near 1) and 2^-22 relatively where |tanh| ≥ 1/2; odd to the bit; ±1 exactly past 10 and at ±inf;
// ±0 at ±0; NaN kept.
std::vector<float> vtanh_inputs() {
  std::vector<float> x;
  for (double v = -12.0; v <= 12.0; v += 0.000913) x.push_back(float(v));
  for (float v = 1e-30f; v < 1.0f; v *= 1.37f) x.push_back(v), x.push_back(-v);
  for (float v : {0.0f, -0.0f, 10.0f, -10.0f, 20.0f, -88.0f, 1e30f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  while (x.size() % 16) x.push_back(0.5f);
  return x;
}
void check_vtanh(const std::vector<float>& x, const std::vector<float>& t) {
  double worst_abs = 0.0, worst_rel = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(t[i]));
      continue;
    }
    const double want = std::tanh(double(x[i]));
    const double err = std::abs(double(t[i]) - want);
    worst_abs = std::max(worst_abs, err);
    if (std::abs(want) >= 0.5) worst_rel = std::max(worst_rel, err / std::abs(want));
    EXPECT_LE(std::abs(t[i]), 1.0f) << x[i];
    EXPECT_EQ(std::signbit(t[i]), std::signbit(x[i])) << x[i];
    if (std::abs(x[i]) >= 10.0f) {
      EXPECT_EQ(std::abs(t[i]), 1.0f) << x[i];
    }
    if (x[i] == 0.0f) {
      EXPECT_EQ(t[i], 0.0f);
    }
  }
  EXPECT_LT(worst_abs, 0x1p-21);
  EXPECT_LT(worst_rel, 0x1p-22);
}

TEST(cpu_kernel_body, vtanh_accuracy_and_special_values) {
  const std::vector<float> x = vtanh_inputs();
  std::vector<float> t(x.size());
  for (std::size_t i = 0; i < x.size(); i += W) store(t.data() + i, vtanh(load(x.data() + i)));
  check_vtanh(x, t);
  for (std::size_t i = 0; i < x.size(); ++i)  // odd: tanh(-x) = -tanh(x) to the bit
    if (!std::isnan(x[i])) {
      EXPECT_EQ(vtanh(splat(-x[i]))[0], -t[i]) << x[i];
    }
}

// vsigmoid (simd.h; the family's sigmoid distribution and activation) on the inputs of
// check_vsigmoid: within 2^-21 + |x|·2^-23 of σ relatively where σ ≥ 2^-100 (the reciprocal's
// 2^-22, and the rounding of u = −x·log2 e, which moves 2^u by |x|·2^-24 relatively), never
// above 1, exactly 1 from 20 up and at +inf, 2^-126 (not 0, not a denormal) far below 0 and at
// -inf — the exponent's cap keeps 1 + 2^u finite for the Newton step, where inf would give NaN —
// and NaN kept.
std::vector<float> vsigmoid_inputs() {
  std::vector<float> x;
  for (double v = -100.0; v <= 100.0; v += 0.00917) x.push_back(float(v));
  for (float v : {0.0f, -0.0f, 20.0f, 88.0f, -87.0f, -88.0f, -200.0f, -1e30f, 1e30f, std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    x.push_back(v);
  while (x.size() % 16) x.push_back(0.5f);
  return x;
}
void check_vsigmoid(const std::vector<float>& x, const std::vector<float>& s) {
  double worst = 0.0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(s[i]));
      continue;
    }
    const double want = 1.0 / (1.0 + std::exp(-double(x[i])));
    EXPECT_FALSE(std::isnan(s[i])) << x[i];
    EXPECT_LE(s[i], 1.0f) << x[i];
    EXPECT_NE(std::fpclassify(s[i]), FP_SUBNORMAL) << x[i];
    if (x[i] >= 20.0f) {
      EXPECT_EQ(s[i], 1.0f) << x[i];
    }
    if (x[i] <= -88.0f) {
      EXPECT_EQ(s[i], 0x1p-126f) << x[i];
    }
    if (want >= 0x1p-100)
      worst = std::max(worst, std::abs(double(s[i]) - want) / want / (0x1p-21 + std::abs(double(x[i])) * 0x1p-23));
  }
  EXPECT_LT(worst, 1.0);  // (the error over its bound)
}

TEST(cpu_kernel_body, vsigmoid_accuracy_and_special_values) {
  const std::vector<float> x = vsigmoid_inputs();
  std::vector<float> s(x.size());
  for (std::size_t i = 0; i < x.size(); i += W) store(s.data() + i, vsigmoid(load(x.data() + i)));
  check_vsigmoid(x, s);
}

}  // namespace
void vexp2_avx512_probe(const float* u, float* out, std::int64_t n);  // simd_avx512_probe.cc
void vtanh_avx512_probe(const float* x, float* out, std::int64_t n);
void vsigmoid_avx512_probe(const float* x, float* out, std::int64_t n);
namespace {

// probe (one of simd_avx512_probe.cc's) over x.
std::vector<float> on_avx512(void (*probe)(const float*, float*, std::int64_t), const std::vector<float>& x) {
  std::vector<float> y(x.size());
  probe(x.data(), y.data(), std::int64_t(x.size()));
  return y;
}

// vsigmoid's and vtanh's AVX-512 forms (vexp2's, and vrcp14ps with a Newton step for the
// reciprocal): the same bounds, where the CPU has AVX-512.
TEST(cpu_kernel_body, vsigmoid_avx512_form) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "no AVX-512 on this CPU";
  const std::vector<float> x = vsigmoid_inputs();
  check_vsigmoid(x, on_avx512(vsigmoid_avx512_probe, x));
}
TEST(cpu_kernel_body, vtanh_avx512_form) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "no AVX-512 on this CPU";
  const std::vector<float> x = vtanh_inputs();
  check_vtanh(x, on_avx512(vtanh_avx512_probe, x));
}

// The same for vexp2's AVX-512 form (vrndscaleps, vscalefps; the prefill softmax's exponential
// on the avx512 levels), where the CPU has AVX-512: within 3 ulp over its range, exactly 0 below
// -125 (no denormal result, each of which costs Intel cores a microcode assist: scores spread
// over ±100 ran the bf16 forward 9× slower), 0 at -inf, NaN kept, and the bits of the portable
// form's exact points.
TEST(cpu_kernel_body, vexp2_avx512_form) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "no AVX-512 on this CPU";
  std::vector<float> u;
  for (double x = -124.0; x <= 127.0; x += 0.00731) u.push_back(float(x));
  for (float x = -140.0f; x <= -110.0f; x += 0.0625f) u.push_back(x);
  for (float x : {0.0f, -1.0f, -126.0f, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    u.push_back(x);
  while (u.size() % 16) u.push_back(0.0f);
  std::vector<float> e(u.size());
  vexp2_avx512_probe(u.data(), e.data(), std::int64_t(u.size()));
  double worst = 0.0;
  for (std::size_t i = 0; i < u.size(); ++i) {
    if (std::isnan(u[i])) {
      EXPECT_TRUE(std::isnan(e[i]));
      continue;
    }
    EXPECT_NE(std::fpclassify(e[i]), FP_SUBNORMAL) << u[i];
    if (u[i] < -125.0f) {
      EXPECT_EQ(e[i], 0.0f) << u[i];
      continue;
    }
    const double want = std::exp2(double(u[i]));
    worst = std::max(worst, std::abs(double(e[i]) - want) / want);
  }
  EXPECT_LT(worst, 3 * 0x1p-24);
  const float exact[] = {0.0f, -1.0f};
  float got[16] = {}, in[16] = {exact[0], exact[1]};
  vexp2_avx512_probe(in, got, 16);
  EXPECT_EQ(got[0], 1.0f);
  EXPECT_EQ(got[1], 0.5f);
}

}  // namespace
}  // namespace attn::detail::cpu

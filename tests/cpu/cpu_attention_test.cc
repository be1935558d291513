// tests/cpu/cpu_attention_test.cc — the fused cpu backend against the float64 reference: random
// sweeps over shapes, layouts, masks, alignments, windows, kv lengths, softcap, ALiBi, sinks,
// GQA ratios and dtypes, forward and every gradient, on every ISA level this CPU runs; bitwise
// equality across thread counts; fully masked rows; eligibility messages.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <xmmintrin.h>

#include "core/common.h"
#include "cpu/kernels.h"
#include "cpu_isa.h"
#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::env_scope;
using testing::isa_scope;
using testing::kIsaBf16Widened;
using testing::isas;
using testing::random_bool;
using testing::random_tensor;

// Sets ATTN_CPU_BACKWARD (fused | two_pass) for the lifetime of the object.
struct backward_scope {
  explicit backward_scope(const char* schedule) { setenv("ATTN_CPU_BACKWARD", schedule, 1); }
  ~backward_scope() { unsetenv("ATTN_CPU_BACKWARD"); }
};

enum class mask_type { none, boolean, additive };

struct config {
  std::int64_t B = 1, Hq = 1, Hkv = 1, Nq = 1, Nk = 1, D = 4, Dv = 4;
  dtype type = dtype::f32;
  bool three_d = false, transposed = false;
  mask_type mask = mask_type::none;
  int mask_rank = 4;          // 2: [Nq, Nk'] broadcast over B, H; 4: [B, Hq|1, Nq, Nk']
  bool mask_short = false;    // fewer mask columns than keys (padding)
  bool mask_heads = true;     // rank 4: one mask per head (else broadcast over heads)
  bool kv_len = false, alibi = false, sinks = false;
  attention_options opt;

  std::string str() const {
    return fmt::format("B{} Hq{} Hkv{} Nq{} Nk{} D{} Dv{} {} 3d{} tr{} mask{}/{}{} causal{} align{} win{},{} cap{} kvlen{} alibi{} sinks{}",
                       B, Hq, Hkv, Nq, Nk, D, Dv, std::string(dtype_name(type)), three_d, transposed, int(mask), mask_rank,
                       mask_short ? "s" : "", opt.is_causal, int(opt.alignment), opt.window_left, opt.window_right,
                       opt.softcap, kv_len, alibi, sinks);
  }
};

// Inputs of one case, kept alive together.
struct inputs {
  Tensor q, k, v, dout, mask, kvlen, alibi, sinks;
  TensorView qv, kv, vv, doutv;
  attention_options opt;
};

Tensor make_qkv(const config& c, std::int64_t H, std::int64_t N, std::int64_t X, std::mt19937& rng, TensorView& view) {
  if (c.three_d) {
    Tensor t = random_tensor({c.B, N, H * X}, c.type, rng);
    view = t;
    return t;
  }
  if (c.transposed) {  // stored [B, N, H, X], viewed [B, H, N, X]
    Tensor t = random_tensor({c.B, N, H, X}, c.type, rng);
    view = t.view().transpose(1, 2);
    return t;
  }
  Tensor t = random_tensor({c.B, H, N, X}, c.type, rng);
  view = t;
  return t;
}

inputs make_inputs(const config& c, std::mt19937& rng) {
  inputs in;
  in.q = make_qkv(c, c.Hq, c.Nq, c.D, rng, in.qv);
  in.k = make_qkv(c, c.Hkv, c.Nk, c.D, rng, in.kv);
  in.v = make_qkv(c, c.Hkv, c.Nk, c.Dv, rng, in.vv);
  in.dout = make_qkv(c, c.Hq, c.Nq, c.Dv, rng, in.doutv);
  in.opt = c.opt;
  if (c.three_d) in.opt.q_num_heads = c.Hq, in.opt.kv_num_heads = c.Hkv;
  const std::int64_t cols = c.mask_short ? std::max<std::int64_t>(c.Nk - 3, 0) : c.Nk;
  const Shape ms = c.mask_rank == 2 ? Shape{c.Nq, cols} : Shape{c.B, c.mask_heads ? c.Hq : 1, c.Nq, cols};
  if (c.mask == mask_type::boolean) in.mask = random_bool(ms, rng, 0.75);
  if (c.mask == mask_type::additive) in.mask = random_tensor(ms, c.type, rng, -2.0, 2.0);
  if (c.mask != mask_type::none) in.opt.attn_mask = in.mask;
  if (c.kv_len) {
    std::uniform_int_distribution<std::int64_t> u(0, c.Nk);
    std::vector<double> n(std::size_t(c.B));
    for (auto& x : n) x = double(u(rng));
    in.kvlen = Tensor::from_values({c.B}, dtype::i64, n);
    in.opt.nonpad_kv_seqlen = in.kvlen;
  }
  if (c.alibi) {
    in.alibi = random_tensor({c.Hq}, dtype::f32, rng, 0.0, 0.5);
    in.opt.alibi_slopes = in.alibi;
  }
  if (c.sinks) {
    in.sinks = random_tensor({c.Hq}, dtype::f32, rng, -1.0, 1.0);
    in.opt.sinks = in.sinks;
  }
  return in;
}

config random_config(std::mt19937& rng) {
  auto pick = [&](std::initializer_list<std::int64_t> v) {
    return *(v.begin() + std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng));
  };
  auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  config c;
  c.B = pick({1, 2});
  c.Hkv = pick({1, 2});
  c.Hq = c.Hkv * pick({1, 2, 3, 8});
  c.Nq = pick({0, 1, 2, 5, 17, 33, 70});
  c.Nk = pick({0, 1, 3, 16, 31, 64, 65, 130});
  c.D = pick({1, 3, 8, 17, 32, 72});
  c.Dv = coin(0.7) ? c.D : pick({1, 5, 16, 40});
  c.type = coin(0.7) ? dtype::f32 : coin(0.5) ? dtype::f16 : dtype::bf16;
  c.three_d = coin(0.2);
  c.transposed = !c.three_d && coin(0.3);
  c.mask = coin(0.6) ? mask_type::none : coin(0.5) ? mask_type::boolean : mask_type::additive;
  c.mask_rank = coin(0.5) ? 2 : 4;
  c.mask_short = coin(0.3);
  c.mask_heads = coin(0.5);
  c.opt.is_causal = coin(0.4);
  c.opt.alignment = coin(0.5) ? causal_alignment::top_left : causal_alignment::bottom_right;
  if (coin(0.25)) c.opt.window_left = pick({0, 2, 9}), c.opt.window_right = pick({-1, 0, 3});
  if (coin(0.2)) c.opt.softcap = pick({2, 20});
  c.kv_len = coin(0.2);
  c.alibi = coin(0.2);
  c.sinks = coin(0.2);
  if (coin(0.2)) c.opt.scale = 0.3;
  return c;
}

double fwd_tol(dtype t) { return t == dtype::f32 ? 2e-5 : testing::tolerance_for(t); }
double bwd_tol(dtype t) { return t == dtype::f32 ? 1e-4 : 2 * testing::tolerance_for(t); }

// Forward and backward of `c` on the cpu backend against the reference.
void check_case(const config& c, std::uint32_t seed) {
  SCOPED_TRACE(c.str() + " seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  inputs in = make_inputs(c, rng);
  const attention_options& opt = in.opt;
  const execution ref_exec{.use_backend = backend::reference}, cpu_exec{.use_backend = backend::cpu};
  const attention_result ref = attention(in.qv, in.kv, in.vv, opt, ref_exec);
  const attention_result got = attention(in.qv, in.kv, in.vv, opt, cpu_exec);
  ASSERT_EQ(got.backend, "cpu");
  const double ft = fwd_tol(c.type);
  EXPECT_TRUE(all_close(got.out, ref.out, ft, ft));
  EXPECT_TRUE(all_close(got.lse, ref.lse, ft, ft));
  EXPECT_FALSE(testing::any_nan(got.out));

  // The backward takes Δ = rowsum(dout∘out) from `out`; a 16-bit `out` perturbs Δ, and the ALiBi
  // gradient Σ ds·|pos - j| amplifies that by |pos - j| (the reference recomputes Δ from P). So
  // both backends get the same f32 out/lse, computed from the same (16-bit) input values.
  attention_result fo = ref;
  if (c.type != dtype::f32)
    fo = attention(Tensor::copy_of(in.qv, dtype::f32), Tensor::copy_of(in.kv, dtype::f32),
                   Tensor::copy_of(in.vv, dtype::f32), opt, ref_exec);
  const attention_grads gr = attention_backward(in.qv, in.kv, in.vv, fo.out, in.doutv, fo.lse, opt, ref_exec);
  const attention_grads gc = attention_backward(in.qv, in.kv, in.vv, fo.out, in.doutv, fo.lse, opt, cpu_exec);
  ASSERT_EQ(gc.backend, "cpu");
  if (c.mask == mask_type::additive) {  // its gradient, and the backward without it (mask_gradient)
    ASSERT_TRUE(gc.dattn_mask.defined() && gr.dattn_mask.defined());
    EXPECT_EQ(gc.dattn_mask.shape(), in.mask.shape());
    const double mt = bwd_tol(c.type);
    EXPECT_TRUE(all_close(gc.dattn_mask, gr.dattn_mask, mt, mt)) << "dattn_mask";
    attention_options no_dmask = opt;
    no_dmask.mask_gradient = false;
    const attention_grads gn = attention_backward(in.qv, in.kv, in.vv, fo.out, in.doutv, fo.lse, no_dmask, cpu_exec);
    ASSERT_EQ(gn.backend, "cpu");
    EXPECT_FALSE(gn.dattn_mask.defined());
    EXPECT_TRUE(all_close(gn.dq, gr.dq, mt, mt)) << "dq without dattn_mask";
    EXPECT_TRUE(all_close(gn.dv, gr.dv, mt, mt)) << "dv without dattn_mask";
  }
  const double bt = bwd_tol(c.type);
  EXPECT_TRUE(all_close(gc.dq, gr.dq, bt, bt)) << "dq";
  EXPECT_TRUE(all_close(gc.dk, gr.dk, bt, bt)) << "dk";
  EXPECT_TRUE(all_close(gc.dv, gr.dv, bt, bt)) << "dv";
  if (c.alibi) {
    EXPECT_TRUE(all_close(gc.dalibi_slopes, gr.dalibi_slopes, 10 * bt, bt)) << "dalibi";
  }
  if (c.sinks) {
    EXPECT_TRUE(all_close(gc.dsinks, gr.dsinks, bt, bt)) << "dsinks";
  }
}

TEST(cpu_attention, random_sweep_every_isa) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    std::mt19937 rng(1234);
    for (int n = 0; n < 120; ++n) {
      const config c = random_config(rng);
      check_case(c, std::uint32_t(n));
    }
  }
}

// The fused backward (dq, dk, dv in one pass; chosen by shape for B·Hkv >= 8, which the sweep
// above never reaches) forced on the same kind of random cases: dq accumulated in place (f32 dq
// whose rows are whole vectors) and in a buffer (16-bit dq, D not a multiple of W).
TEST(cpu_attention, fused_backward_random_sweep) {
  backward_scope fused("fused");
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    std::mt19937 rng(4321);
    for (int n = 0; n < 60; ++n) check_case(random_config(rng), std::uint32_t(1000 + n));
  }
}

// The backward's Δ = dout · out (kernel_table::dot_f64) and the front's coarse bound on the
// q·k terms (max_abs_bits), on every level: Δ bit for bit sum8's float64 sum, the bound the
// largest finite magnitude exactly — lengths off the vector width, NaN, ±inf, -0, subnormals
// and (bfloat16) the upper halves of the same floats.
TEST(cpu_attention, row_scans_every_isa) {
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f, 1e-41f, -3e38f};
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    const detail::cpu::kernel_table& kt = detail::cpu::select_kernels();
    for (std::int64_t n : {0, 1, 7, 8, 9, 31, 33, 64, 65, 1000}) {
      for (int special = -1; special < 6; ++special) {
        std::vector<float> a(static_cast<std::size_t>(n)), b(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) a[std::size_t(i)] = normal(rng), b[std::size_t(i)] = normal(rng);
        if (special >= 0 && n > 0) a[std::size_t(n / 2)] = specials[special];
        std::vector<std::uint16_t> ah(static_cast<std::size_t>(n)), bh(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          std::uint32_t u, v;
          std::memcpy(&u, &a[std::size_t(i)], 4), std::memcpy(&v, &b[std::size_t(i)], 4);
          ah[std::size_t(i)] = std::uint16_t(u >> 16), bh[std::size_t(i)] = std::uint16_t(v >> 16);
        }
        const std::string what = fmt::format("n {} special {}", n, special);
        // Δ: sum8 of the float64 products
        const double want = detail::sum8(n, [&](std::int64_t i) { return double(a[std::size_t(i)]) * double(b[std::size_t(i)]); });
        const double want16 = detail::sum8(n, [&](std::int64_t i) {
          return double(bf16_to_f32(ah[std::size_t(i)])) * double(bf16_to_f32(bh[std::size_t(i)]));
        });
        const double got = kt.dot_f64(a.data(), b.data(), n, false), got16 = kt.dot_f64(ah.data(), bh.data(), n, true);
        EXPECT_TRUE(std::memcmp(&got, &want, 8) == 0 || (std::isnan(got) && std::isnan(want))) << what << ": " << got << " vs " << want;
        EXPECT_TRUE(std::memcmp(&got16, &want16, 8) == 0 || (std::isnan(got16) && std::isnan(want16)))
            << what << " bf16: " << got16 << " vs " << want16;
        // the bound: the largest finite |a|, as float32 bits
        float top = 0.0f, top16 = 0.0f;
        for (std::int64_t i = 0; i < n; ++i) {
          const float x = std::abs(a[std::size_t(i)]), x16 = std::abs(bf16_to_f32(ah[std::size_t(i)]));
          if (std::isfinite(x)) top = std::max(top, x);
          if (std::isfinite(x16)) top16 = std::max(top16, x16);
        }
        const std::int32_t m = kt.max_abs_bits(a.data(), n, false), m16 = kt.max_abs_bits(ah.data(), n, true);
        float fm, fm16;
        std::memcpy(&fm, &m, 4), std::memcpy(&fm16, &m16, 4);
        EXPECT_EQ(fm, top) << what;
        EXPECT_EQ(fm16, top16) << what << " bf16";
      }
    }
  }
}

TEST(cpu_attention, edge_shapes) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    for (std::int64_t D : {1, 3, 17, 72, 130})
      for (std::int64_t Nq : {0, 1, 67})
        for (std::int64_t Nk : {0, 1, 67}) {
          config c;
          c.Hq = 3, c.Hkv = 1, c.Nq = Nq, c.Nk = Nk, c.D = D, c.Dv = D;
          c.opt.is_causal = Nq == Nk;
          check_case(c, std::uint32_t(D * 100 + Nq * 10 + Nk));
        }
  }
}

// Keys whose K and V outgrow 1 MiB a head: the f32 prefill forward then reads Vᵀ, packed once
// per call (lane_block::vt; rows Nk rounded up plus padding apart), with several lane blocks per
// head. Odd D, GQA 3, causal and windows that start the lanes' key ranges off block boundaries,
// a padding mask, ALiBi and sinks; f32 and bf16 (widened to f32 on the levels without a bf16 dot).
TEST(cpu_attention, values_transposed_for_long_keys) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    int seed = 0;
    for (dtype t : {dtype::f32, dtype::bf16})
      for (int variant = 0; variant < 3; ++variant) {
        config c;
        c.B = 2, c.Hq = 3, c.Hkv = 1, c.Nq = 47, c.Nk = 1037, c.D = 131, c.Dv = 129, c.type = t;
        if (variant == 1) {
          c.opt.is_causal = true, c.opt.alignment = causal_alignment::bottom_right;
          c.opt.window_left = 300, c.alibi = true;
        }
        if (variant == 2) {
          c.mask = mask_type::boolean, c.mask_rank = 2, c.mask_short = true;
          c.kv_len = true, c.sinks = true;
        }
        check_case(c, std::uint32_t(500 + seed++));
      }
  }
}

// Every alignment and window against a mask with padding columns, GQA 8, all ISAs.
TEST(cpu_attention, causal_alignments_windows) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    for (auto al : {causal_alignment::top_left, causal_alignment::bottom_right})
      for (auto [wl, wr] : {std::pair{-1, -1}, {0, 0}, {5, -1}, {-1, 4}, {70, 2}})
        for (auto [nq, nk] : {std::pair{90, 90}, {40, 150}, {150, 40}}) {
          config c;
          c.B = 2, c.Hq = 8, c.Hkv = 1, c.Nq = nq, c.Nk = nk, c.D = 16, c.Dv = 16;
          c.opt.is_causal = wr != 4;
          c.opt.alignment = al;
          c.opt.window_left = wl, c.opt.window_right = wr;
          c.mask = mask_type::boolean, c.mask_rank = 2, c.mask_short = true;
          c.kv_len = true;
          check_case(c, std::uint32_t(nq + nk + wl));
        }
  }
}

// Views: k/v broadcast over the batch (stride 0), q sliced out of a wider buffer (row stride
// 2D), dout with D as its slowest axis (x-stride Nq), a mask broadcast over heads.
TEST(cpu_attention, strided_and_broadcast_views) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    for (dtype t : {dtype::f32, dtype::bf16}) {
      std::mt19937 rng(21);
      const std::int64_t B = 2, Hq = 4, Hkv = 2, Nq = 37, Nk = 45, D = 24;
      Tensor qw = random_tensor({B, Hq, Nq, 2 * D}, t, rng);
      const TensorView q = qw.view().slice(3, 0, D);
      Tensor k1 = random_tensor({1, Hkv, Nk, D}, t, rng), v1 = random_tensor({1, Hkv, Nk, D}, t, rng);
      const TensorView k = k1.view().broadcast_to({B, Hkv, Nk, D}), v = v1.view().broadcast_to({B, Hkv, Nk, D});
      Tensor dt = random_tensor({B, Hq, D, Nq}, t, rng);
      const TensorView dout = dt.view().transpose(2, 3);
      Tensor mask = random_bool({B, 1, Nq, Nk}, rng, 0.8);
      attention_options o;
      o.attn_mask = mask;
      o.is_causal = true, o.alignment = causal_alignment::bottom_right;
      const execution ref_exec{.use_backend = backend::reference}, cpu_exec{.use_backend = backend::cpu};
      const auto ref = attention(q, k, v, o, ref_exec);
      const auto gr = attention_backward(q, k, v, ref.out, dout, ref.lse, o, ref_exec);
      const auto got = attention(q, k, v, o, cpu_exec);
      const auto gc = attention_backward(q, k, v, ref.out, dout, ref.lse, o, cpu_exec);
      const double ft = fwd_tol(t), bt = bwd_tol(t);
      EXPECT_TRUE(all_close(got.out, ref.out, ft, ft));
      EXPECT_TRUE(all_close(got.lse, ref.lse, ft, ft));
      EXPECT_TRUE(all_close(gc.dq, gr.dq, bt, bt)) << "dq";
      EXPECT_TRUE(all_close(gc.dk, gr.dk, bt, bt)) << "dk";
      EXPECT_TRUE(all_close(gc.dv, gr.dv, bt, bt)) << "dv";
    }
  }
}

// A KV cache (after_past alignment) runs on the cpu backend and matches the reference.
TEST(cpu_attention, kv_cache_after_past) {
  std::mt19937 rng(7);
  Tensor q = random_tensor({1, 4, 3, 16}, dtype::f32, rng), k = random_tensor({1, 2, 3, 16}, dtype::f32, rng),
         v = random_tensor({1, 2, 3, 16}, dtype::f32, rng), pk = random_tensor({1, 2, 50, 16}, dtype::f32, rng),
         pv = random_tensor({1, 2, 50, 16}, dtype::f32, rng);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::after_past;
  o.past_key = pk, o.past_value = pv;
  const auto ref = attention(q, k, v, o, {.use_backend = backend::reference});
  const auto got = attention(q, k, v, o, {.use_backend = backend::cpu});
  EXPECT_TRUE(all_close(got.out, ref.out, 2e-5));
  EXPECT_TRUE(all_close(got.lse, ref.lse, 2e-5));
}

// Fully masked rows: out 0, lse -inf (or the sink), zero gradients, no NaN — on every ISA.
TEST(cpu_attention, fully_masked_rows) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    std::mt19937 rng(3);
    Tensor q = random_tensor({1, 2, 5, 8}, dtype::f32, rng), k = random_tensor({1, 2, 7, 8}, dtype::f32, rng),
           v = random_tensor({1, 2, 7, 8}, dtype::f32, rng), dout = random_tensor({1, 2, 5, 8}, dtype::f32, rng);
    Tensor mask = random_bool({5, 7}, rng, 0.8);
    for (std::int64_t j = 0; j < 7; ++j) mask.set({2, j}, 0.0);  // row 2 sees nothing
    attention_options o;
    o.attn_mask = mask;
    const execution cpu_exec{.use_backend = backend::cpu};
    const auto r = attention(q, k, v, o, cpu_exec);
    EXPECT_FALSE(testing::any_nan(r.out));
    for (std::int64_t h = 0; h < 2; ++h) {
      EXPECT_EQ(r.lse.get({0, h, 2}), -std::numeric_limits<double>::infinity());
      for (std::int64_t d = 0; d < 8; ++d) EXPECT_EQ(r.out.get({0, h, 2, d}), 0.0);
    }
    const auto g = attention_backward(q, k, v, r.out, dout, r.lse, o, cpu_exec);
    EXPECT_FALSE(testing::any_nan(g.dq) || testing::any_nan(g.dk) || testing::any_nan(g.dv));
    for (std::int64_t d = 0; d < 8; ++d) EXPECT_EQ(g.dq.get({0, 1, 2, d}), 0.0);
  }
}

// Mask tiles of one kind: a causal mask given as a bool [Nq, Nk] tensor (blocks all 0, all
// false, and mixed: the kernels skip the blocks no row sees and take the unbiased path where
// the tile is all 0), its float form with random values kept (dattn_mask), and a key block that
// no row sees holding a NaN key: NaN + -inf is NaN in the reference, so no block may be skipped
// then (the kernels skip only where q and k are finite) and the rows are NaN on both. Forward
// and backward against the reference and against is_causal, both schedules, every ISA, bf16.
TEST(cpu_attention, mask_blocks_skipped_or_unbiased) {
  const std::int64_t N = 300, Hq = 4, Hkv = 2, D = 16;
  for (const std::string& isa : isas())
    for (const char* schedule : {"fused", "two_pass"})
      for (dtype type : {dtype::f32, dtype::bf16}) {
        SCOPED_TRACE(fmt::format("isa {} {} {}", isa, schedule, std::string(dtype_name(type))));
        isa_scope scope(isa.c_str());
        backward_scope bs(schedule);
        std::mt19937 rng(21);
        Tensor q = random_tensor({1, Hq, N, D}, type, rng), k = random_tensor({1, Hkv, N, D}, type, rng),
               v = random_tensor({1, Hkv, N, D}, type, rng), dout = random_tensor({1, Hq, N, D}, type, rng);
        Tensor causal = Tensor::zeros({N, N}, dtype::boolean), fmask = Tensor::empty({N, N}, dtype::f32);
        std::uniform_real_distribution<float> u(-1.0f, 1.0f);
        for (std::int64_t i = 0; i < N; ++i)
          for (std::int64_t j = 0; j < N; ++j) {
            causal.data_as<bool>()[i * N + j] = j <= i;
            fmask.data_as<float>()[i * N + j] = j <= i ? u(rng) : -INFINITY;
          }
        const execution ref_exec{.use_backend = backend::reference}, cpu_exec{.use_backend = backend::cpu};
        const double ft = fwd_tol(type), bt = bwd_tol(type);
        attention_options ob, of, oc;
        ob.attn_mask = causal, of.attn_mask = fmask, oc.is_causal = true;
        for (const attention_options* o : {&ob, &of}) {
          const auto ref = attention(q, k, v, *o, ref_exec);
          const auto got = attention(q, k, v, *o, cpu_exec);
          EXPECT_TRUE(all_close(got.out, ref.out, ft, ft));
          EXPECT_TRUE(all_close(got.lse, ref.lse, ft, ft));
          const auto gr = attention_backward(q, k, v, ref.out, dout, ref.lse, *o, ref_exec);
          const auto gc = attention_backward(q, k, v, ref.out, dout, ref.lse, *o, cpu_exec);
          EXPECT_TRUE(all_close(gc.dq, gr.dq, bt, bt)) << "dq";
          EXPECT_TRUE(all_close(gc.dk, gr.dk, bt, bt)) << "dk";
          EXPECT_TRUE(all_close(gc.dv, gr.dv, bt, bt)) << "dv";
          if (o == &of) {
            EXPECT_TRUE(all_close(gc.dattn_mask, gr.dattn_mask, bt, bt)) << "dattn_mask";
          }
        }
        const auto rc = attention(q, k, v, oc, cpu_exec), rb = attention(q, k, v, ob, cpu_exec);
        EXPECT_TRUE(all_close(rb.out, rc.out, ft, ft)) << "bool causal mask vs is_causal";
        // Keys 128..255 hidden from every row, one of them NaN: the NaN reaches the rows of its
        // kv head on both backends (and the other head's rows stay finite).
        Tensor band = Tensor::empty({N, N}, dtype::boolean);
        for (std::int64_t i = 0; i < N * N; ++i) band.data_as<bool>()[i] = i % N < 128 || i % N >= 256;
        Tensor kn = Tensor::copy_of(k);
        kn.set({0, 1, 200, 3}, std::numeric_limits<double>::quiet_NaN());
        attention_options on;
        on.attn_mask = band;
        const auto ref = attention(q, kn, v, on, ref_exec), got = attention(q, kn, v, on, cpu_exec);
        const std::vector<double> g = got.out.to_vector(), r = ref.out.to_vector();
        std::int64_t nans = 0;
        for (std::size_t x = 0; x < g.size(); ++x) {
          ASSERT_EQ(std::isnan(g[x]), std::isnan(r[x])) << "at " << x;
          nans += std::isnan(g[x]);
        }
        EXPECT_EQ(nans, 2 * N * D);  // the two q heads of kv head 1
        attention_options on_ok = on;
        Tensor kf = Tensor::copy_of(k);
        const auto ok = attention(q, kf, v, on_ok, cpu_exec), ok_ref = attention(q, kf, v, on_ok, ref_exec);
        EXPECT_TRUE(all_close(ok.out, ok_ref.out, ft, ft)) << "the band with finite keys";
      }
}

// Masks broadcast over heads are classified once per call from their rows' kept spans
// (cpu/mask_fill.h): the tiles they call excluded or unbiased are not read. Forward and every
// gradient bitwise equal to reading every tile (ATTN_MASK_SPANS=0) and close to the reference,
// for masks whose spans are whole (causal, padding, packed sequences), holed (a kept key inside
// the excluded part, a nonzero bias inside the kept part), short (fewer columns than keys), with
// a row that keeps nothing; f32 and bf16, both backward schedules, every ISA level.
TEST(cpu_attention, mask_spans_change_no_bit) {
  const std::int64_t N = 260, Hq = 4, Hkv = 2, D = 16;
  std::mt19937 rng(23);
  auto make = [&](std::int64_t b, std::int64_t rows, std::int64_t cols, bool is_bool, auto keep, auto bias) {
    Tensor m = Tensor::zeros({b, 1, rows, cols}, is_bool ? dtype::boolean : dtype::f32);
    for (std::int64_t x = 0; x < b; ++x)
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < cols; ++j) {
          const bool k = keep(x, i, j);
          if (is_bool) m.data_as<bool>()[(x * rows + i) * cols + j] = k;
          else m.data_as<float>()[(x * rows + i) * cols + j] = k ? float(bias(x, i, j)) : -INFINITY;
        }
    return m;
  };
  auto zero = [](std::int64_t, std::int64_t, std::int64_t) { return 0.0; };
  std::vector<std::pair<std::string, Tensor>> masks = {
      {"bool causal", make(1, N, N, true, [](auto, auto i, auto j) { return j <= i; }, zero)},
      {"bool padding [2, 1, 1, N]", make(2, 1, N, true, [](auto x, auto, auto j) { return x == 1 || j < 70; }, zero)},
      {"f32 causal 0/-inf", make(1, N, N, false, [](auto, auto i, auto j) { return j <= i; }, zero)},
      {"bool packed sequences 100 + 90 + 70",
       make(1, N, N, true, [](auto, auto i, auto j) { return (i < 100) == (j < 100) && (i < 190) == (j < 190); }, zero)},
      {"bool causal, holes and an empty row",
       make(1, N, N, true, [](auto, auto i, auto j) { return i != 77 && ((j <= i && j != i / 2) || (i == 5 && j == 250)); },
            zero)},
      {"f32 causal with a bias inside", make(1, N, N, false, [](auto, auto i, auto j) { return j <= i; },
                                              [](auto, auto i, auto j) { return i == 200 && j == 3 ? -1.5 : 0.0; })},
      {"bool short [N, 150] causal", make(1, N, 150, true, [](auto, auto i, auto j) { return j <= i; }, zero)},
  };
  const execution ref_exec{.use_backend = backend::reference}, cpu_exec{.use_backend = backend::cpu};
  for (dtype type : {dtype::f32, dtype::bf16}) {
    Tensor q = random_tensor({2, Hq, N, D}, type, rng), k = random_tensor({2, Hkv, N, D}, type, rng),
           v = random_tensor({2, Hkv, N, D}, type, rng), dout = random_tensor({2, Hq, N, D}, type, rng);
    for (const auto& [name, mask] : masks) {
      attention_options o;
      o.attn_mask = mask;
      const auto ref = attention(q, k, v, o, ref_exec);
      const auto gr = attention_backward(q, k, v, ref.out, dout, ref.lse, o, ref_exec);
      for (const std::string& isa : isas())
        for (const char* schedule : {"fused", "two_pass"}) {
          SCOPED_TRACE(fmt::format("{} {} {} {}", name, std::string(dtype_name(type)), isa, schedule));
          isa_scope scope(isa.c_str());
          backward_scope bs(schedule);
          const auto got = attention(q, k, v, o, cpu_exec);
          const auto gg = attention_backward(q, k, v, ref.out, dout, ref.lse, o, cpu_exec);
          setenv("ATTN_MASK_SPANS", "0", 1);
          const auto every = attention(q, k, v, o, cpu_exec);
          const auto ge = attention_backward(q, k, v, ref.out, dout, ref.lse, o, cpu_exec);
          unsetenv("ATTN_MASK_SPANS");
          EXPECT_EQ(got.out.to_vector(), every.out.to_vector()) << "out";
          EXPECT_EQ(got.lse.to_vector(), every.lse.to_vector()) << "lse";
          EXPECT_EQ(gg.dq.to_vector(), ge.dq.to_vector()) << "dq";
          EXPECT_EQ(gg.dk.to_vector(), ge.dk.to_vector()) << "dk";
          EXPECT_EQ(gg.dv.to_vector(), ge.dv.to_vector()) << "dv";
          const double ft = fwd_tol(type), bt = bwd_tol(type);
          EXPECT_TRUE(all_close(got.out, ref.out, ft, ft)) << "out against the reference";
          EXPECT_TRUE(all_close(gg.dq, gr.dq, bt, bt)) << "dq against the reference";
          EXPECT_TRUE(all_close(gg.dk, gr.dk, bt, bt)) << "dk against the reference";
          EXPECT_TRUE(all_close(gg.dv, gr.dv, bt, bt)) << "dv against the reference";
        }
    }
  }
}

// Results are bitwise identical for any number of threads, forward and backward, including the
// split-KV decode path and the parameter gradients.
TEST(cpu_attention, bitwise_identical_across_threads) {
  struct shape {
    std::int64_t Hq, Hkv, Nq, Nk, D;
    bool causal;
  };
  for (dtype type : {dtype::f32, dtype::bf16})
    for (const shape s : {shape{4, 2, 150, 200, 24, true}, shape{8, 2, 1, 9000, 32, false}, shape{3, 3, 70, 70, 18, false},
                          // B·Hkv >= 8: the fused backward, dq in place (D 32) and buffered (D 20)
                          shape{8, 8, 70, 150, 32, true}, shape{16, 8, 45, 77, 20, false}}) {
      SCOPED_TRACE(fmt::format("{} Hq {} Nq {} Nk {}", std::string(dtype_name(type)), s.Hq, s.Nq, s.Nk));
      std::mt19937 rng(11);
      Tensor q = random_tensor({1, s.Hq, s.Nq, s.D}, type, rng), k = random_tensor({1, s.Hkv, s.Nk, s.D}, type, rng),
             v = random_tensor({1, s.Hkv, s.Nk, s.D}, type, rng), dout = random_tensor({1, s.Hq, s.Nq, s.D}, type, rng);
      Tensor alibi = random_tensor({s.Hq}, dtype::f32, rng, 0.0, 0.1), sinks = random_tensor({s.Hq}, dtype::f32, rng);
      // A float mask and its gradient: one per head (the fused schedule keeps it), or one for
      // every head (shared by the kv heads: their dk/dv tasks grouped).
      const bool per_head = s.Hq % 2 == 0 && s.Nq % 2 == 1;
      Tensor mask = random_tensor(per_head ? Shape{1, s.Hq, s.Nq, s.Nk} : Shape{s.Nq, s.Nk}, dtype::f32, rng, -1.0, 1.0);
      std::vector<std::vector<double>> first;
      for (int threads : {1, 2, 3}) {
        attention_options o;
        o.is_causal = s.causal;
        o.alibi_slopes = alibi, o.sinks = sinks, o.attn_mask = mask;
        const execution exec{.use_backend = backend::cpu, .num_threads = threads};
        const auto r = attention(q, k, v, o, exec);
        const auto g = attention_backward(q, k, v, r.out, dout, r.lse, o, exec);
        std::vector<std::vector<double>> all = {r.out.to_vector(), r.lse.to_vector(), g.dq.to_vector(), g.dk.to_vector(),
                                                g.dv.to_vector(), g.dalibi_slopes.to_vector(), g.dsinks.to_vector(),
                                                g.dattn_mask.to_vector()};
        if (first.empty()) first = all;
        for (std::size_t t = 0; t < all.size(); ++t)
          EXPECT_EQ(0, std::memcmp(all[t].data(), first[t].data(), all[t].size() * sizeof(double)))
              << "output " << t << " differs with " << threads << " threads";
      }
    }
}

// The decode kernel and split-KV (few rows, many keys) against the reference, GQA 4, every ISA;
// f32 and bf16 (read as bf16), head sizes that do and do not fill whole vectors.
TEST(cpu_attention, split_kv_decode) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    for (dtype t : {dtype::f32, dtype::bf16})
      for (std::int64_t D : {40, 64}) {
        config c;
        c.type = t;
        c.Hq = 8, c.Hkv = 2, c.Nq = 1, c.Nk = 4111, c.D = D, c.Dv = D;
        c.sinks = true, c.kv_len = true, c.transposed = D == 64;
        check_case(c, std::uint32_t(D));
      }
  }
}

// The decode kernel's row groups (1, 2 or 4 rows per K/V read; up to W rows), its direct and
// padded-copy paths (head sizes that do / do not fill whole vectors or bf16 word vectors, D ≠ Dv;
// bf16 groups of 4 rows with D ≤ 128 take decode_scores_chunked),
// key counts that end mid-block and mid-chunk, and every mask and modifier, on every ISA.
TEST(cpu_attention, decode_row_groups_and_modifiers) {
  struct shape {
    std::int64_t Hq, Hkv, Nq, Nk, D, Dv;
  };
  const shape shapes[] = {
      {2, 2, 1, 4113, 128, 128},  // 1 row
      {4, 2, 1, 4113, 64, 64},    // 2 rows
      {6, 2, 1, 2063, 48, 48},    // 3 rows (a padded group); D a whole f32 vector, not a bf16 word vector
      {8, 2, 1, 4097, 128, 128},  // 4 rows
      {8, 2, 1, 1001, 96, 96},    // 4 rows, D of 3 bf16 units (the chunked q·k's NU = 3)
      {16, 2, 1, 300, 64, 32},    // 8 rows, D ≠ Dv
      {8, 2, 2, 4096, 40, 24},    // 8 rows (2 queries), odd head sizes
      {4, 1, 4, 77, 32, 32},      // 16 rows (4 queries: causal rows see different keys)
      {8, 2, 5, 2100, 64, 64},    // 20 rows: more than one pass (decode on every level, few_rows)
      {4, 1, 10, 1500, 128, 96},  // 40 rows: decode for bf16 on the avx512 levels, else prefill
      {2, 1, 1, 5, 16, 16},       // fewer keys than a block
  };
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    std::uint32_t seed = 0;
    for (dtype t : {dtype::f32, dtype::bf16})
      for (const shape& s : shapes)
        for (int variant = 0; variant < 3; ++variant) {
          config c;
          c.type = t;
          c.Hq = s.Hq, c.Hkv = s.Hkv, c.Nq = s.Nq, c.Nk = s.Nk, c.D = s.D, c.Dv = s.Dv;
          if (variant == 1) {  // masks, causal bottom-right, ALiBi, sinks, kv lengths
            c.mask = mask_type::boolean, c.mask_short = true;
            c.opt.is_causal = true, c.opt.alignment = causal_alignment::bottom_right;
            c.alibi = c.sinks = c.kv_len = true;
            c.B = 2;
          } else if (variant == 2) {  // additive mask, softcap, window, scale, strided rows
            c.mask = mask_type::additive, c.mask_rank = 2;
            c.opt.softcap = 5, c.opt.window_left = 1000, c.opt.window_right = 0, c.opt.scale = 0.3;
            c.opt.alignment = causal_alignment::bottom_right;
            c.transposed = true;
          }
          check_case(c, ++seed);
        }
  }
}

// A speculative step on GQA (Hq 32 / Hkv 8, Nq 8: 32 rows a kv head) runs on decode's passes,
// not in a prefill lane block half empty (cpu_backend.cc, few_rows); a prefill chunk of 64 queries
// (256 rows) stays on prefill; the 32 rows' results equal one decode call per query.
TEST(cpu_attention, few_rows_run_on_decode) {
  std::mt19937 rng(11);
  const Tensor q = random_tensor({1, 32, 8, 64}, dtype::bf16, rng), q64 = random_tensor({1, 32, 64, 64}, dtype::bf16, rng);
  const Tensor k = random_tensor({1, 8, 3000, 64}, dtype::bf16, rng), v = random_tensor({1, 8, 3000, 64}, dtype::bf16, rng);
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right;
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    const std::string path = explain_backend(q, k, v, o, false, {.use_backend = backend::cpu});
    if (isa != "generic") {  // (its vectors of 4 floats: 32 rows fill 4 lane blocks of 8, prefill)
      EXPECT_NE(path.find("decode ("), std::string::npos) << path;
    }
    const std::string path64 = explain_backend(q64, k, v, o, false, {.use_backend = backend::cpu});
    EXPECT_NE(path64.find("prefill"), std::string::npos) << path64;
    const attention_result r = attention(q, k, v, o, {.use_backend = backend::cpu});
    for (std::int64_t i = 0; i < 8; ++i) {  // query i alone sees keys [0, 3000 - 8 + i]
      const std::int64_t n = 3000 - 8 + i + 1;
      const attention_result one = attention(q.view().slice(2, i, i + 1), k.view().slice(2, 0, n), v.view().slice(2, 0, n), {},
                                             {.use_backend = backend::cpu});
      EXPECT_TRUE(all_close(r.out.view().slice(2, i, i + 1), one.out, 2e-2, 2e-2)) << "query " << i;
    }
  }
}

// Decode-shaped calls (split-KV) are bitwise identical for 1, 2 and 3 threads on every row-group
// size, f32 and bf16, with an odd number of keys.
TEST(cpu_attention, decode_bitwise_identical_across_threads) {
  for (dtype type : {dtype::f32, dtype::bf16})
    for (std::int64_t G : {1, 2, 3, 4, 24}) {  // 24: Nq 1 and 24 rows, two decode passes (few_rows)
      SCOPED_TRACE(fmt::format("{} G {}", std::string(dtype_name(type)), G));
      std::mt19937 rng(5);
      const std::int64_t Hkv = G == 24 ? 1 : 3, Nk = 10001, D = 128;
      Tensor q = random_tensor({1, Hkv * G, 1, D}, type, rng), k = random_tensor({1, Hkv, Nk, D}, type, rng),
             v = random_tensor({1, Hkv, Nk, D}, type, rng);
      std::vector<double> first_out, first_lse;
      for (int threads : {1, 2, 3}) {
        attention_options o;
        const auto r = attention(q, k, v, o, {.use_backend = backend::cpu, .num_threads = threads});
        const std::vector<double> out = r.out.to_vector(), lse = r.lse.to_vector();
        if (first_out.empty()) first_out = out, first_lse = lse;
        EXPECT_EQ(0, std::memcmp(out.data(), first_out.data(), out.size() * sizeof(double))) << threads << " threads";
        EXPECT_EQ(0, std::memcmp(lse.data(), first_lse.data(), lse.size() * sizeof(double))) << threads << " threads";
      }
    }
}

// bf16 inputs on every ISA (the avx512bf16 level multiplies in bf16 with fp32 accumulation):
// odd key counts, windows that start a block on an odd key, masks, GQA.
TEST(cpu_attention, bf16_every_isa) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    for (std::int64_t nk : {77, 128}) {
      config c;
      c.type = dtype::bf16;
      c.B = 2, c.Hq = 4, c.Hkv = 2, c.Nq = 100, c.Nk = nk, c.D = 32, c.Dv = 24;
      c.opt.is_causal = true, c.opt.alignment = causal_alignment::bottom_right;
      c.opt.window_left = 7;
      c.mask = mask_type::boolean, c.mask_short = true;
      c.alibi = c.sinks = true;
      check_case(c, std::uint32_t(nk));
      c.opt.is_causal = false, c.opt.window_left = -1, c.mask = mask_type::additive, c.opt.softcap = 5;
      check_case(c, std::uint32_t(nk + 1));
    }
  }
}

// The avx512bf16 level multiplies bf16 pairs by vdpbf16ps or widens them to f32
// (cpu::bf16_dot_products: by the CPU's vendor, or ATTN_CPU_BF16_DOTS): the path says which, the
// forward and backward take it, and both meet the reference (bf16_every_isa walks both too).
TEST(cpu_attention, bf16_products_or_widened_on_the_avx512bf16_level) {
  const std::vector<std::string> all = isas();
  if (std::find(all.begin(), all.end(), "avx512bf16") == all.end()) {  // (a CPU without the level: nothing to choose)
    EXPECT_EQ(std::find(all.begin(), all.end(), kIsaBf16Widened), all.end());
    return;
  }
  config c;
  c.type = dtype::bf16;
  c.B = 1, c.Hq = 4, c.Hkv = 2, c.Nq = 70, c.Nk = 90, c.D = 64, c.Dv = 32;
  std::mt19937 in_rng{5};
  const inputs in = make_inputs(c, in_rng);
  const execution e{.use_backend = backend::cpu};
  std::string fwd[2], bwd[2];
  for (int widened : {0, 1}) {
    isa_scope scope(widened ? kIsaBf16Widened : "avx512bf16");
    EXPECT_EQ(detail::cpu::bf16_dot_products(), !widened);
    fwd[widened] = explain_backend(in.qv, in.kv, in.vv, in.opt, false, e);
    bwd[widened] = explain_backend(in.qv, in.kv, in.vv, in.opt, true, e);
    check_case(c, 5);
  }
  EXPECT_EQ(fwd[0], "runs on cpu (avx512bf16 kernels, prefill, bf16 with bf16 dot products)");
  EXPECT_EQ(fwd[1], "runs on cpu (avx512bf16 (f32 products) kernels, prefill, bf16)");
  EXPECT_NE(bwd[0].find("with bf16 dot products"), std::string::npos) << bwd[0];
  EXPECT_EQ(bwd[1].find("dot products"), std::string::npos) << bwd[1];
  EXPECT_EQ(bwd[1].rfind("runs on cpu (avx512bf16 (f32 products) kernels, ", 0), 0u) << bwd[1];
  {  // an unknown value leaves the CPU's choice: vdpbf16ps except on Intel CPUs
    isa_scope scope("avx512bf16");
    env_scope dots("ATTN_CPU_BF16_DOTS", "maybe");
    __builtin_cpu_init();
    EXPECT_EQ(detail::cpu::bf16_dot_products(), !__builtin_cpu_is("intel"));
  }
}

// The shapes the bf16 prefill forward runs on AMX tiles (amx.h: D a multiple of 32, Dv of 16, more
// rows than decode takes), with every option, on every ISA this machine has: on the amx level the
// path says so and the tiles' results meet the reference and are bitwise the same for 1, 2 and 3
// threads; key counts around the tiles' 32 keys (1, 31, 129, 300) and lane blocks that end inside
// a tile, Dv = 48 for the odd tile of Oᵀ rows. The backward likewise, in both schedules (AMX
// tiles where D and Dv are multiples of 32; query blocks that end inside a tile).
TEST(cpu_attention, amx_shapes_every_isa) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    std::mt19937 rng(2026);
    auto pick = [&](std::initializer_list<std::int64_t> v) {
      return *(v.begin() + std::uniform_int_distribution<std::size_t>(0, v.size() - 1)(rng));
    };
    auto coin = [&](double p) { return std::bernoulli_distribution(p)(rng); };
    for (int n = 0; n < 28; ++n) {
      config c;
      c.type = dtype::bf16;
      c.B = pick({1, 2}), c.Hkv = pick({1, 2}), c.Hq = c.Hkv * pick({1, 4});
      c.Nq = pick({40, 65, 130}), c.Nk = pick({1, 31, 77, 128, 129, 300});
      c.D = pick({32, 64, 128}), c.Dv = pick({16, 32, 48, 64, 96});
      c.three_d = coin(0.2);
      c.transposed = !c.three_d && coin(0.3);
      c.mask = coin(0.5) ? mask_type::none : coin(0.5) ? mask_type::boolean : mask_type::additive;
      c.mask_rank = coin(0.5) ? 2 : 4, c.mask_short = coin(0.3), c.mask_heads = coin(0.5);
      c.opt.is_causal = coin(0.5);
      c.opt.alignment = coin(0.5) ? causal_alignment::top_left : causal_alignment::bottom_right;
      if (coin(0.3)) c.opt.window_left = pick({0, 9, 40}), c.opt.window_right = pick({-1, 0, 33});
      if (coin(0.2)) c.opt.softcap = 20;
      c.kv_len = coin(0.2), c.alibi = coin(0.2), c.sinks = coin(0.3);
      std::mt19937 in_rng{std::uint32_t(n)};
      const inputs in = make_inputs(c, in_rng);
      const std::string path = explain_backend(in.qv, in.kv, in.vv, in.opt, false, {.use_backend = backend::cpu});
      if (isa == "amx") EXPECT_NE(path.find("on AMX tiles"), std::string::npos) << path;
      else EXPECT_EQ(path.find("AMX"), std::string::npos) << path;
      check_case(c, std::uint32_t(n));
      for (const char* schedule : {"fused", "two_pass"}) {  // the backward on AMX tiles where D and Dv are multiples of 32
        backward_scope scope(schedule);
        const std::string bpath = explain_backend(in.qv, in.kv, in.vv, in.opt, true, {.use_backend = backend::cpu});
        const bool tiles = isa == "amx" && c.D % 32 == 0 && c.Dv % 32 == 0;
        EXPECT_EQ(bpath.find("on AMX tiles") != std::string::npos, tiles) << bpath;
        check_case(c, std::uint32_t(n));
      }
      std::vector<double> first;
      for (int threads : {1, 2, 3}) {
        const auto r = attention(in.qv, in.kv, in.vv, in.opt, {.use_backend = backend::cpu, .num_threads = threads});
        std::vector<double> all = r.out.to_vector(), lse = r.lse.to_vector();
        all.insert(all.end(), lse.begin(), lse.end());
        if (first.empty()) first = all;
        EXPECT_EQ(0, std::memcmp(all.data(), first.data(), all.size() * sizeof(double))) << threads << " threads";
      }
    }
  }
}

// The forward's running max moves only where a key block's max exceeds it by more than a slack
// (prefill.h, kMaxSlack = 8): scores that climb block by block by less than the slack (weights
// above 1, no rescale), by just under it, by far more (a rescale of O and l), fall again, climb
// just past it, and sit far from zero (-300 … -240, +400), with and without sinks, causal
// (diagonal blocks take the transformed path) or not, f32 and bf16, on every ISA. Scores are set
// by key norm along q's direction: s_ij = scale·(q_i·k_j) with q rows in one direction.
TEST(cpu_attention, running_max_slack) {
  const std::int64_t D = 16, Nq = 70, Nk = 6 * 128 + 37;
  const double steps[] = {0.0, 5.0, 12.9, 45.0, 20.0, 28.5, 28.5};  // block maxima: +5, +7.9, +32.1, -25, +8.5
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    for (const double base : {0.0, -300.0, 400.0})
      for (const dtype t : {dtype::f32, dtype::bf16})
        for (const bool causal : {false, true})
          for (const bool sinks : {false, true}) {
            SCOPED_TRACE(fmt::format("base {} {} causal {} sinks {}", base, dtype_name(t), causal, sinks));
            std::mt19937 rng(std::uint32_t(base + 7));
            std::uniform_real_distribution<double> jitter(-1.0, 1.0);
            Tensor q = Tensor::zeros({1, 2, Nq, D}, dtype::f32), k = Tensor::zeros({1, 1, Nk, D}, dtype::f32);
            for (std::int64_t h = 0; h < 2; ++h)
              for (std::int64_t i = 0; i < Nq; ++i)
                for (std::int64_t d = 0; d < D; ++d) q.set({0, h, i, d}, (1.0 + 0.1 * jitter(rng)) / 4.0);  // |q| ≈ 1
            for (std::int64_t j = 0; j < Nk; ++j) {
              const double s = base + steps[j / 128] + 2.0 * jitter(rng);  // target score
              for (std::int64_t d = 0; d < D; ++d) k.set({0, 0, j, d}, s / 4.0 + 0.05 * jitter(rng));
            }
            Tensor v = random_tensor({1, 1, Nk, D}, t, rng);
            attention_options o;
            o.scale = 1.0;
            o.is_causal = causal, o.alignment = causal_alignment::bottom_right;
            Tensor sk = Tensor::from_values({2}, dtype::f32, {base + 30.0, base - 5.0});
            if (sinks) o.sinks = sk;
            const Tensor qt = Tensor::copy_of(q, t), kt = Tensor::copy_of(k, t);
            const auto ref = attention(qt, kt, v, o, {.use_backend = backend::reference});
            const auto got = attention(qt, kt, v, o, {.use_backend = backend::cpu});
            ASSERT_EQ(got.backend, "cpu");
            const double ft = fwd_tol(t);
            EXPECT_TRUE(all_close(got.out, ref.out, ft, ft));
            EXPECT_TRUE(all_close(got.lse, ref.lse, ft, ft));
          }
  }
}

// Scores spread over 240 below the row's max (large logits: unscaled scores, a general score's
// projections), where the softmax's exponentials flush to 0 (vexp2 below 2^-125: its AVX-512
// form is checked in kernel_body_test): at every ISA level out and lse as the reference's, and
// the weights (return_qk probabilities) exactly 0 from about e^-87 down, never a denormal.
TEST(cpu_attention, wide_score_range_weights_flush_to_zero) {
  const std::int64_t D = 16, Nq = 5, Nk = 300;
  for (const std::string& isa : isas()) {
    isa_scope scope(isa.c_str());
    for (const dtype t : {dtype::f32, dtype::bf16}) {
      SCOPED_TRACE(fmt::format("isa {} {}", isa, dtype_name(t)));
      std::mt19937 rng(11);
      Tensor q = Tensor::zeros({1, 1, Nq, D}, dtype::f32), k = Tensor::zeros({1, 1, Nk, D}, dtype::f32);
      for (std::int64_t i = 0; i < Nq; ++i)
        for (std::int64_t d = 0; d < D; ++d) q.set({0, 0, i, d}, 0.25);
      for (std::int64_t j = 0; j < Nk; ++j)  // s_j = q·k_j = 40 - 0.8 (j·7 mod Nk): every key order
        for (std::int64_t d = 0; d < D; ++d) k.set({0, 0, j, d}, (40.0 - 0.8 * double(j * 7 % Nk)) / 4.0);
      const Tensor qt = Tensor::copy_of(q, t), kt = Tensor::copy_of(k, t), v = random_tensor({1, 1, Nk, D}, t, rng);
      attention_options o;
      o.scale = 1.0;
      const auto ref = attention(qt, kt, v, o, {.use_backend = backend::reference});
      const auto got = attention(qt, kt, v, o, {.use_backend = backend::cpu});
      ASSERT_EQ(got.backend, "cpu");
      EXPECT_TRUE(all_close(got.out, ref.out, fwd_tol(t), fwd_tol(t)));
      EXPECT_TRUE(all_close(got.lse, ref.lse, fwd_tol(t), fwd_tol(t)));
      o.return_qk = qk_output::probabilities;
      const std::vector<double> p = attention(qt, kt, v, o, {.use_backend = backend::cpu}).qk.to_vector();
      const std::vector<double> sk = kt.to_vector();
      for (std::int64_t j = 0; j < Nk; ++j) {
        const double below = 40.0 - 4.0 * sk[std::size_t(j * D)];  // m - s_j (q·k_j = 4·k_j0)
        for (std::int64_t i = 0; i < Nq; ++i) {
          const double pij = p[std::size_t(i * Nk + j)];
          EXPECT_NE(std::fpclassify(float(pij)), FP_SUBNORMAL) << "key " << j;
          if (below > 88.0) {
            EXPECT_EQ(pij, 0.0) << "key " << j << ", " << below << " below the max";
          }
          if (below < 80.0) {
            EXPECT_GT(pij, 0.0) << "key " << j << ", " << below << " below the max";
          }
        }
      }
    }
  }
}

// The kernels run with denormals flushed (cpu/denormals.h): a denormal v or dout reads as 0 in
// the core op's forward and backward and on the family's fused path, at every ISA level and
// thread count, and as itself under ATTN_CPU_DENORMALS=keep. Every thread's MXCSR — the caller's
// and the OpenMP team's — is as it was before the call, whether the caller had FTZ/DAZ or not.
TEST(cpu_attention, denormals_flushed_in_the_kernels_only) {
  constexpr unsigned kFtzDaz = (1u << 15) | (1u << 6);
  const auto team_csr = [] {  // the FTZ/DAZ bits of every thread of a 2-thread team, or-ed
    unsigned bits = 0;
#pragma omp parallel num_threads(2) reduction(| : bits)
    bits |= _mm_getcsr() & kFtzDaz;
    return bits;
  };
  const float tiny = 1e-39f;  // denormal
  ASSERT_EQ(std::fpclassify(tiny), FP_SUBNORMAL);
  const std::int64_t N = 37, D = 16;
  std::mt19937 rng(5);
  const Tensor q = random_tensor({1, 2, N, D}, dtype::f32, rng), k = random_tensor({1, 2, N, D}, dtype::f32, rng);
  Tensor v = Tensor::zeros({1, 2, N, D}, dtype::f32), dout = Tensor::zeros({1, 2, N, D}, dtype::f32);
  std::fill_n(v.data_as<float>(), v.numel(), tiny);
  std::fill_n(dout.data_as<float>(), dout.numel(), tiny);
  const unsigned caller = _mm_getcsr();
  for (const unsigned own : {0u, kFtzDaz}) {  // the caller's FTZ/DAZ: off, then on
    _mm_setcsr((caller & ~kFtzDaz) | own);
    for (const std::string& isa : isas())
      for (const int threads : {1, 2})
        for (const bool keep : {false, true}) {
          SCOPED_TRACE(fmt::format("isa {}, {} threads, {}, caller's FTZ/DAZ {}", isa, threads,
                                   keep ? "keep" : "flush", own ? "on" : "off"));
          isa_scope scope(isa.c_str());
          std::optional<env_scope> env;
          if (keep) env.emplace("ATTN_CPU_DENORMALS", "keep");
          const execution exec{.use_backend = backend::cpu, .num_threads = threads};
          const unsigned team_before = team_csr();
          const auto fwd = attention(q, k, v, {}, exec);
          const auto g = attention_backward(q, k, v, fwd.out, dout, fwd.lse, {}, exec);
          const family_result fam = sigmoid_attention(q, k, v, {}, exec);
          ASSERT_EQ(fam.path.rfind("fused", 0), 0u) << fam.path;
          EXPECT_EQ(_mm_getcsr() & kFtzDaz, own) << "the caller's MXCSR";
          EXPECT_EQ(team_csr(), team_before) << "the team's MXCSR";
          for (const auto& [what, t] : {std::pair<const char*, const Tensor*>{"out", &fwd.out}, {"dv", &g.dv},
                                        {"family out", &fam.out}}) {
            const std::vector<double> x = t->to_vector();
            if (!keep) {
              EXPECT_EQ(*std::max_element(x.begin(), x.end()), 0.0) << what;
              EXPECT_EQ(*std::min_element(x.begin(), x.end()), 0.0) << what;
            } else if (own == 0) {  // (a caller with DAZ of its own reads v as 0 on its thread)
              EXPECT_GT(*std::min_element(x.begin(), x.end()), 0.0) << what;
            }
          }
        }
  }
  _mm_setcsr(caller);
  EXPECT_EQ(team_csr(), 0u);
}

// The [B, Hq, Nq, Nk] intermediates (return_qk: scaled, softcapped, biased, probabilities) from
// the cpu backend against the reference's, over the random sweep's cases (masks, windows, causal
// alignments, kv lengths, softcap, ALiBi, sinks, GQA, 3-D and transposed views, f32/f16/bf16, Nq
// or Nk of 0 and 1) at every ISA level; out and lse as without them; excluded keys -inf (biased)
// and 0 (probabilities) exactly as the reference; rows longer than one key chunk (4096).
TEST(cpu_attention, qk_intermediates_every_isa) {
  const qk_output stages[] = {qk_output::scaled, qk_output::softcapped, qk_output::biased, qk_output::probabilities};
  const execution ref_exec{.use_backend = backend::reference}, cpu_exec{.use_backend = backend::cpu, .num_threads = 2};
  auto check = [&](const config& c, std::uint32_t seed) {
    SCOPED_TRACE(c.str() + " seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    inputs in = make_inputs(c, rng);
    for (qk_output stage : stages) {
      SCOPED_TRACE("stage " + std::to_string(int(stage)));
      in.opt.return_qk = stage;
      const attention_result ref = attention(in.qv, in.kv, in.vv, in.opt, ref_exec);
      const attention_result got = attention(in.qv, in.kv, in.vv, in.opt, cpu_exec);
      ASSERT_EQ(got.backend, "cpu");
      ASSERT_EQ(got.qk.shape(), ref.qk.shape());
      EXPECT_EQ(got.qk.type(), c.type);
      const double ft = fwd_tol(c.type);
      EXPECT_TRUE(all_close(got.out, ref.out, ft, ft));
      // Scores of unit-scale inputs reach |s| ~ 10: the 16-bit outputs round them to ~2^-8 relative.
      EXPECT_TRUE(all_close(got.qk, ref.qk, ft, ft));
      const std::vector<double> g = got.qk.to_vector(), r = ref.qk.to_vector();
      for (std::size_t x = 0; x < g.size(); ++x) {
        ASSERT_EQ(g[x] == -std::numeric_limits<double>::infinity(), r[x] == -std::numeric_limits<double>::infinity()) << x;
        if (stage == qk_output::probabilities) {
          ASSERT_EQ(g[x] == 0.0, r[x] == 0.0) << x;
        }
      }
    }
  };
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    std::mt19937 rng(777);
    for (int n = 0; n < 40; ++n) check(random_config(rng), std::uint32_t(3000 + n));
  }
  config c;  // a row longer than one key chunk, with a causal frontier and a float mask inside it
  c.Hq = 2, c.Hkv = 1, c.Nq = 3, c.Nk = 4100, c.D = 5, c.Dv = 3;
  c.mask = mask_type::additive, c.mask_rank = 2;
  c.opt.is_causal = true, c.opt.alignment = causal_alignment::bottom_right;
  check(c, 99);
}

// kernel_table::mask_tile (the vectorised mask fill) against the scalar definition of a tile, on
// every ISA: bool and f32 rows, lane layout (transposed W × W blocks; rows sharing one mask
// row: key by key), row layouts, padding rows, short masks, and its answer (every value 0;
// every valid row's -inf; or mixed).
TEST(cpu_attention, mask_tile_equals_scalar_fill) {
  for (const std::string& isa : isas()) {
    SCOPED_TRACE("isa " + isa);
    isa_scope scope(isa.c_str());
    const detail::cpu::kernel_table& kt = detail::cpu::select_kernels();
    ASSERT_NE(kt.mask_tile, nullptr);
    std::mt19937 rng(55);
    const auto pick = [&](std::initializer_list<std::int64_t> xs) {
      return *(xs.begin() + std::uniform_int_distribution<std::size_t>(0, xs.size() - 1)(rng));
    };
    for (int n_case = 0; n_case < 560; ++n_case) {
      const bool is_bool = n_case % 2 == 0;
      // 0, 1: random rows; 2: one shared row; 3: all 0; 4: shared and all 0; 5: all -inf; 6: shared, all -inf
      const int kind = n_case / 2 % 7;
      const bool shared_row = kind == 2 || kind == 4 || kind == 6;
      const std::int64_t total = pick({1, 4, 5, 8, 13, 16, 32, 48, 64}), valid = std::min(total, pick({0, 1, 3, 64, 64}));
      const std::int64_t nb = pick({1, 3, 8, 15, 16, 17, 64, 128}), n = pick({-2, 0, 5, nb, nb, nb + 7});
      const int layout = n_case / 10 % 3;  // lanes (rs 1, ks total) | rows (rs ld, ks 1) | both strided
      const std::int64_t ld = nb + pick({0, 3});
      const std::int64_t rs = layout == 0 ? 1 : layout == 1 ? ld : 2 * ld, ks = layout == 0 ? total : layout == 1 ? 1 : 2;
      SCOPED_TRACE(fmt::format("bool {} kind {} total {} valid {} nb {} n {} layout {}", is_bool, kind, total, valid, nb, n, layout));
      const std::int64_t cols = std::max<std::int64_t>(n, 0) + 8;
      std::vector<unsigned char> bytes(std::size_t(total * cols));
      std::vector<float> floats(std::size_t(total * cols));
      std::uniform_real_distribution<float> u(-2.0f, 2.0f);
      for (std::size_t x = 0; x < bytes.size(); ++x) {
        const bool zero = kind == 3 || kind == 4 || (kind < 3 && rng() % 4 != 0);
        bytes[x] = zero ? 1 : 0;
        floats[x] = zero ? 0.0f : kind >= 5 || rng() % 3 == 0 ? -INFINITY : u(rng);
      }
      std::vector<const void*> rows(static_cast<std::size_t>(total));
      for (std::int64_t r = 0; r < total; ++r) {
        const std::int64_t src = shared_row ? 0 : r;
        rows[std::size_t(r)] = is_bool ? static_cast<const void*>(bytes.data() + src * cols)
                                       : static_cast<const void*>(floats.data() + src * cols);
      }
      const std::int64_t span = (total - 1) * rs + (nb - 1) * ks + 1;
      std::vector<float> tile(std::size_t(span), 99.0f), want(std::size_t(span), 99.0f);
      bool all_zero = true, all_minf = true;
      for (std::int64_t r = 0; r < total; ++r)
        for (std::int64_t jj = 0; jj < nb; ++jj) {
          float x = 0.0f;
          if (r < valid) {
            const std::int64_t src = (shared_row ? 0 : r) * cols + jj;
            x = jj >= n ? -INFINITY : is_bool ? (bytes[std::size_t(src)] ? 0.0f : -INFINITY) : floats[std::size_t(src)];
            all_minf = all_minf && x == -INFINITY;
          }
          want[std::size_t(r * rs + jj * ks)] = x;
          all_zero = all_zero && x == 0.0f;
        }
      using detail::cpu::mask_tile_kind;
      const mask_tile_kind expect = all_zero ? mask_tile_kind::zeros : all_minf ? mask_tile_kind::excluded : mask_tile_kind::mixed;
      const mask_tile_kind got = kt.mask_tile(detail::cpu::mask_rows{rows.data(), is_bool, total, valid, n}, nb, tile.data(), rs, ks);
      EXPECT_EQ(int(got), int(expect));
      for (std::size_t x = 0; x < tile.size(); ++x) ASSERT_EQ(tile[x], want[x]) << "at " << x;
    }
  }
}

TEST(cpu_attention, eligibility_says_why) {
  std::mt19937 rng(1);
  Tensor q = random_tensor({1, 1, 4, 8}, dtype::f32, rng);
  attention_options o;
  EXPECT_NE(explain_backend(q, q, q, o).find("runs on cpu"), std::string::npos);
  o.return_qk = qk_output::probabilities;
  EXPECT_NE(explain_backend(q, q, q, o).find("runs on cpu"), std::string::npos);
  Tensor q64 = random_tensor({1, 1, 4, 8}, dtype::f64, rng);
  EXPECT_NE(explain_backend(q64, q64, q64, {}).find("cpu: float64 inputs need the reference"), std::string::npos);
  attention_options m;
  Tensor mask = random_tensor({4, 4}, dtype::f32, rng);
  m.attn_mask = mask;
  EXPECT_NE(explain_backend(q, q, q, m).find("runs on cpu"), std::string::npos);
  EXPECT_NE(explain_backend(q, q, q, m, true).find("runs on cpu"), std::string::npos);  // dattn_mask included
  const auto r = attention(q, q, q, m);
  const attention_grads g = attention_backward(q, q, q, r.out, r.out, r.lse, m);
  EXPECT_EQ(g.backend, "cpu");
  EXPECT_TRUE(g.dattn_mask.defined());
  m.mask_gradient = false;  // no mask gradient asked
  EXPECT_NE(explain_backend(q, q, q, m, true).find("runs on cpu"), std::string::npos);
  EXPECT_FALSE(attention_backward(q, q, q, r.out, r.out, r.lse, m).dattn_mask.defined());
  EXPECT_EQ(backends().front(), "cpu");
}

// The cpu kernels' working memory of 1 MiB or more (here the packed or widened bf16 K/V, 16 MiB
// each; the output is 128 KiB; 128 rows a head, which prefill lane blocks take) goes back to the buffer cache of attn/tensor.h when a call ends, and
// the next call of the same shape takes the same blocks: the cache holds as much after it as
// before. A repeated call then writes into pages the process has, not fresh ones (a fault and the
// kernel's zeroing per 4 KiB: 30–45 % of a B 4 Nk 4096 prefill, docs/PERFORMANCE.md).
TEST(cpu_attention, working_memory_kept_between_calls) {
  std::mt19937 rng(7);
  const Tensor q = random_tensor({1, 8, 128, 64}, dtype::bf16, rng);
  const Tensor k = random_tensor({1, 8, 16384, 64}, dtype::bf16, rng), v = random_tensor({1, 8, 16384, 64}, dtype::bf16, rng);
  release_cached_buffers();
  const attention_result a = attention(q, k, v, {}, {.use_backend = backend::cpu});
  const std::size_t kept = cached_buffer_bytes();
  EXPECT_GE(kept, std::size_t(8) << 20);
  for (int i = 0; i < 3; ++i) {
    const attention_result b = attention(q, k, v, {}, {.use_backend = backend::cpu});
    EXPECT_EQ(cached_buffer_bytes(), kept) << "call " << i;
    EXPECT_TRUE(all_close(b.out, a.out, 0, 0));
  }
  EXPECT_EQ(release_cached_buffers(), kept);
}

}  // namespace
}  // namespace attn

// src/family/fused.cc — the fused f32 path of attention_family: the driver of the SIMD kernels
// of src/cpu/family_kernels.h for every score — dot-product scores (kernel_kind::dot), additive
// (Bahdanau) with one w_v (F = 1) or multi-dimensional (w_v [Dv, A], F = Dv: the md_ kernels,
// statistics per (row, feature)), location (a dot product with the rows of W_a as the keys of
// every (b, hkv), dW_a the sum of their dk), box and triangle (squared distances) — with every
// distribution.
//
// Inputs (fused_source): the score's float64 preparation (Qp, Kp, V of family_impl.h) converted
// to f32 once or, for dot and scaled_dot, the user's q, k, v converted to f32 directly, so f32,
// bf16 and f16 inputs all run in f32 with f32 accumulation (float64 inputs keep the tiled path).
// Outputs are written row by row into strided views: the result tensor, and for the backward the
// float64 buffers of the score's chain rule or, direct, the gradient tensors themselves.
//
// Forward: tasks (b, hkv, lane block) as the core op's prefill; each runs the kernel of its
// block of L query rows over the keys they may see.
// Backward: two passes, so that every gradient element has one writer: dq over lane blocks
// (which also finds and saves each row's statistics and r), then dk/dv over (b, hkv, key
// block), every query row of every head of the GQA group against it. The parameter gradients
// (dbias, dsigmoid_bias, dbandwidth, additive's dw_v) are summed per lane block and added in
// block order. Sigmoid and identity (no row statistics) take one pass per (b, hkv) where B·Hkv
// >= 8; hardmax and top-k (k <= 32) a sparse backward on each row's kept keys (below).
// The partition depends only on the shape, so results are bitwise identical for any thread count.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string_view>

#include <fmt/format.h>

#include "core/common.h"
#include "cpu/bf16_words.h"
#include "cpu/denormals.h"
#include "cpu/buffers.h"
#include "cpu/family_kernels.h"
#include "cpu/kernels.h"
#include "cpu/mask_fill.h"
#include "cpu/rows.h"
#include "family/family_impl.h"
#include "family/scores/score.h"

namespace attn::detail::family {
namespace {

using cpu::family_act;
using cpu::family_dist;

constexpr std::int64_t kQueryBlock = 64;     // query rows per row-layout call (dk/dv)
constexpr std::int64_t kMaxLen = std::int64_t(1) << 30;  // positions are int32 in the kernels
constexpr float kInfF = std::numeric_limits<float>::infinity();

using cpu::fbuf;
fbuf alloc_floats(std::int64_t n) { return cpu::alloc_floats(n, "attention_family (fused)"); }

// The prepared inputs' f32 copies and the passes' large scratch: from the working memory kept
// between calls (cpu/buffers.h, aligned64: blocks of a MiB or more come back to the next call
// of their size), so a call repeated (a training step) writes into pages it already has rather
// than faulting fresh ones in; elements are left unset until written, as new float[n].
using fvec = std::vector<float, cpu::aligned64<float>>;

fvec to_f32(const std::vector<double>& x, int nt) {
  fvec r(x.size());
  const std::int64_t n = std::int64_t(x.size());
#pragma omp parallel for num_threads(nt) schedule(static)
  for (std::int64_t i = 0; i < n; ++i) r[std::size_t(i)] = float(x[std::size_t(i)]);
  return r;
}

// Rows of a [B, H, N, X] view (any float dtype, any strides) as contiguous f32, times mul
// (applied in float64, rounded once).
fvec load_f32(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, double mul,
              int nt) {
  fvec r(std::size_t(B * H * N * X));
  const std::int64_t rows = B * H * N;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (std::int64_t row = 0; row < rows; ++row) {
    const std::int64_t n = row % N, h = row / N % H, b = row / N / H;
    float* o = r.data() + row * X;
    switch (s.type) {
      case dtype::f32: {
        const float* p = s.ptr<float>(b, h, n, 0);
        for (std::int64_t x = 0; x < X; ++x) o[x] = float(double(p[x * s.sx]) * mul);
        break;
      }
      case dtype::bf16: {
        const std::uint16_t* p = s.ptr<std::uint16_t>(b, h, n, 0);
        for (std::int64_t x = 0; x < X; ++x) o[x] = float(double(bf16_to_f32(p[x * s.sx])) * mul);
        break;
      }
      default:
        for (std::int64_t x = 0; x < X; ++x) o[x] = float(s.load(b, h, n, x) * mul);
    }
  }
  return r;
}

// bf16 operands of the bf16 kernels (family_kernels.h: family_lanes::qtw, kw, vw), from bfloat16
// views [B, H, N, X] (any strides), X even (cpu/bf16_words.h): rows of X/2 words with `pad` zero
// rows after each (b, h)'s N; values by pairs of keys, [B·H][⌊N/2⌋ + 1][X] words.
cpu::words load_pairs(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                      std::int64_t pad, int nt) {
  return cpu::bf16_row_words(s, B, H, N, X, N + pad, nt);
}
cpu::words load_value_pairs(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                            int nt) {
  return cpu::bf16_pair_words(s, B, H, N, X, N / 2 + 1, nt);
}
using cpu::bf16_all_finite;

// Row (b, h, n) of `s` from the X floats src[x * ss], times mul.
void put_row(const strided4& s, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X, const float* src,
             std::int64_t ss, double mul);

// Rows row_of(x) = (h, n), x < nl, of s from the columns of xt [X][ld] (cpu::store_lane_rows).
template <class RowOf>
void put_lanes(const strided4& s, std::int64_t b, std::int64_t nl, std::int64_t X, const float* xt, std::int64_t ld,
               RowOf row_of) {
  float ones[cpu::kMaxStoreRows];
  if (nl > cpu::kMaxStoreRows) {
    for (std::int64_t x = 0; x < nl; ++x) {
      const auto [h, n] = row_of(x);
      put_row(s, b, h, n, X, xt + x, ld, 1.0);
    }
    return;
  }
  std::fill(ones, ones + nl, 1.0f);
  cpu::store_lane_rows(cpu::select_kernels(), s, b, nl, X, xt, ld, ones, row_of);
}

void put_row(const strided4& s, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X, const float* src,
             std::int64_t ss, double mul) {
  // mul 1: the same bits by cpu::store_row (one copy of the rounding; unit-stride rows vectorised)
  if (mul == 1.0) return cpu::store_row(s, b, h, n, X, src, ss, 1.0f);
  switch (s.type) {
    case dtype::f32: {
      float* p = s.ptr<float>(b, h, n, 0);
      if (mul == 1.0)
        for (std::int64_t x = 0; x < X; ++x) p[x * s.sx] = src[x * ss];
      else
        for (std::int64_t x = 0; x < X; ++x) p[x * s.sx] = float(double(src[x * ss]) * mul);
      break;
    }
    case dtype::f64: {
      double* p = s.ptr<double>(b, h, n, 0);
      for (std::int64_t x = 0; x < X; ++x) p[x * s.sx] = double(src[x * ss]) * mul;
      break;
    }
    case dtype::bf16: {  // (as store's rounding: to float, then to bf16)
      std::uint16_t* p = s.ptr<std::uint16_t>(b, h, n, 0);
      for (std::int64_t x = 0; x < X; ++x) p[x * s.sx] = f32_to_bf16(float(double(src[x * ss]) * mul));
      break;
    }
    default:
      for (std::int64_t x = 0; x < X; ++x) s.store(b, h, n, x, double(src[x * ss]) * mul);
  }
}

void zero_rows(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X) {
  const std::vector<float> zeros(static_cast<std::size_t>(X), 0.0f);
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t n = 0; n < N; ++n) put_row(s, b, h, n, X, zeros.data(), 1, 1.0);
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// The score's part of the kernels' parameters and the distribution with its constants.
cpu::family_params make_params(const fproblem& fp, const float* w_v, bool additive_exp) {
  cpu::family_params prm;
  prm.additive_exp = additive_exp;
  switch (fp.dist) {
    case distribution_kind::softmax: prm.dist = family_dist::softmax; break;
    case distribution_kind::sigmoid: prm.dist = family_dist::sigmoid; break;
    case distribution_kind::sparsemax: prm.dist = family_dist::sparsemax; break;
    case distribution_kind::entmax15: prm.dist = family_dist::entmax15; break;
    case distribution_kind::hardmax:
      prm.dist = fp.hardmax_grad == hardmax_gradient::zero ? family_dist::hardmax : family_dist::hardmax_st;
      break;
    case distribution_kind::topk: prm.dist = family_dist::topk; break;
    case distribution_kind::identity: prm.dist = family_dist::identity; break;
    case distribution_kind::kernel: prm.dist = family_dist::kernel; break;
  }
  prm.bias = float(fp.bias);
  prm.sigmoid_bias = float(fp.sigmoid_bias);
  prm.topk = fp.topk;
  switch (fp.kernel) {
    case kernel_kind::additive: prm.score = cpu::family_score::additive, prm.w_v = w_v; break;
    case kernel_kind::box:
    case kernel_kind::triangle:
      prm.score = cpu::family_score::distance, prm.h = float(fp.h);
      prm.act = fp.kernel == kernel_kind::box ? family_act::box : family_act::triangle;
      return prm;
    default: break;
  }
  switch (fp.act) {
    case act_kind::identity: prm.act = family_act::identity; break;
    case act_kind::tanh: prm.act = family_act::tanh; break;
    case act_kind::relu: prm.act = family_act::relu; break;
    case act_kind::sigmoid: prm.act = family_act::sigmoid; break;
  }
  return prm;
}

// Every element of the f32 rows finite (a sum a compiler vectorises: inf - inf and NaN stay NaN).
template <class Floats>
bool all_finite(const Floats& x, int nt) {
  const std::int64_t n = std::int64_t(x.size());
  float bad = 0.0f;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(+ : bad)
  for (std::int64_t i = 0; i < n; ++i) bad += x[std::size_t(i)] - x[std::size_t(i)];
  return bad == 0.0f;
}

// The prepared inputs in f32, and the problem's partition into lane blocks.
std::int64_t sparse_rows(const fproblem& fp);  // (below: the kept-keys forms of hardmax, top-k)

struct fused_inputs {
  const cpu::family_table& kt;
  std::int64_t L, G, nlb, units;
  fvec Q, K, V;
  std::int64_t kstride = 0;  // floats from one (b, hkv)'s keys to the next (0: location's W_a, shared)
  std::vector<float> w_v;  // additive: [A]
  // additive in exp form (family_params::additive_exp): e^{2 qp}, e^{2 kp}, what the kernels read
  fvec QE, KE;
  bool exp_form = false;
  const float* kq() const { return exp_form ? QE.data() : Q.data(); }
  const float* kk() const { return exp_form ? KE.data() : K.data(); }
  // Key 0 of (b, hkv) in the kernels' form, and as prepared.
  const float* keys(const fproblem& fp, std::int64_t b, std::int64_t hkv) const { return kk() + (b * fp.Hkv + hkv) * kstride; }
  const float* raw_keys(const fproblem& fp, std::int64_t b, std::int64_t hkv) const {
    return K.data() + (b * fp.Hkv + hkv) * kstride;
  }
  // The forward's f32 keys and values, read in place where the user's tensors are f32 rows of
  // unit stride (direct scores; a forward: the backward's row layout takes K and V as copies),
  // else from K and V: key j of (b, hkv) at key_rows(b, hkv) + j·key_step.
  strided4 Kin, Vin;  // (data null: not in place)
  const float* key_rows(const fproblem& fp, std::int64_t b, std::int64_t hkv) const {
    return Kin.data ? Kin.ptr<float>(b, hkv, 0, 0) : keys(fp, b, hkv);
  }
  std::int64_t key_step(const fproblem& fp) const { return Kin.data ? Kin.sn : fp.Pq; }
  const float* value_rows(const fproblem& fp, std::int64_t b, std::int64_t hkv) const {
    return Vin.data ? Vin.ptr<float>(b, hkv, 0, 0) : V.data() + (b * fp.Hkv + hkv) * fp.Nk * fp.Dv;
  }
  std::int64_t value_step(const fproblem& fp) const { return Vin.data ? Vin.sn : fp.Dv; }
  // Every V finite (the user's where it is read in place).
  bool values_finite(const fproblem& fp, int nt) const {
    return Vin.data ? cpu::view_all_finite(Vin, fp.B, fp.Hkv, fp.Nk, fp.Dv, nt) : all_finite(V, nt);
  }

  // bf16 products (forward_bf16, dq_bf16, dkdv_bf16): words of q rows [B·Hq·Nq][P/2], keys
  // [B·Hkv][Nk + 1][P/2] (a zero key at Nk); forward: values by key pairs [B·Hkv][Nk/2 + 1][Dv];
  // backward: query rows by pairs [B·Hq][Nq/2 + 1][P], value rows [B·Hkv][Nk + 1][Dv/2] and, for
  // the dq pass, keys by pairs [B·Hkv][Nk/2 + 1][P]; z = zscale·(q·k).
  // backward_pairs: the words of the row-layout pass alone (single pass); backward_pairs_f32: those
  // and the f32 inputs of the dq pass (two passes).
  // backward_pairs_all: the words of both passes (two passes, K and V finite).
  // forward_amx: the forward on AMX tiles (forward_amx): q and key words as forward_pairs', the
  // keys [B·Hkv][Nk + 32][P/2] (zero keys to whole tiles of 32), Vᵀ in key pairs [B·Hkv][Dv][ldvt].
  // backward_amx: the single row-layout pass on AMX tiles (dkdv_amx): backward_pairs' words, q
  // rows [B·Hq][Nq + 16][P/2] (zero rows to whole tiles), and Qᵀ in row pairs Qt [B·Hq][P][ldt];
  // backward_amx_f32: those and the f32 inputs of the dq pass (two passes, dk/dv on the tiles);
  // backward_amx_all: both passes on the tiles (dq_amx; K and V finite) — backward_amx's words
  // with keys and value rows zero to whole tiles (Nk + 32), and Kᵀ in key pairs Kt [B·Hkv][P][ldkt].
  enum class use {
    f32, forward_pairs, forward_amx, backward_pairs, backward_amx, backward_amx_f32, backward_amx_all,
    backward_pairs_f32, backward_pairs_all
  };
  bool pairs = false, row_pairs = false;  // the forward's lane blocks / the row-layout pass take words
  bool amx = false;                       // the forward's lane blocks take words, on tiles
  bool row_amx = false;                   // the row-layout pass takes words, on tiles (row_pairs too)
  bool box_rows = false;                  // box on words (the forward, the backward's dv-only pass): f32 q
                                          // and key rows too (box_bf16_products)
  // The lane blocks take bf16 words (q, keys; the dq pass: values), by vdpbf16ps or on the tiles.
  bool lane_words() const { return pairs || amx; }
  cpu::words Qw, Kw, Vw, Qn, Vd, Kn, Vt, Qt;
  // The forward's q rows and key rows (with kpad rows past Nk) as words, in place where the
  // user's tensors allow it (cpu::bf16_rows_in_place), in place of Qw and Kw.
  cpu::word_rows Qr, Kr;
  cpu::words Kt;
  std::int64_t kpad = 1, ldvt = 0;  // zero keys past Nk in Kw; Vt's row stride (words)
  std::int64_t vpad = 1, ldkt = 0;  // zero value rows past Nk in Vd; Kt's row stride (words)
  std::int64_t qpad = 0, ldt = 0;   // zero rows past Nq in Qw; Qt's row stride (words)
  float zscale = 1.0f;

  bool v_finite = false;  // V's words were packed, and V found finite on the way
  // The kernels may skip key blocks the mask hides from every row, and the products of blocks
  // whose weights are all 0 (family_params::zero_skip).
  bool zero_skip = false;
  // The backward of the triangle kernel: q and k finite (family_params::qk_finite).
  bool qk_finite = false;
  // The mask rows' kept spans (cpu/mask_fill.h), where the kernels would read a mask row more
  // than once: a mask broadcast over heads, or the backward's two passes.
  mask_spans spans;

  // dout: the backward's (its finiteness is part of zero_skip there).
  fused_inputs(const fproblem& fp, const fused_source& src, use u = use::f32, const strided4* dout = nullptr)
      : kt(cpu::select_family_kernels()), L(kt.lanes), G(fp.group()), nlb(ceil_div(fp.Nq * G, L)),
        units(fp.B * fp.Hkv * nlb), w_v(fp.w_v.begin(), fp.w_v.end()) {
    const int nt = std::max(1, fp.p.num_threads);
    prepare(fp, src, u, nt, !dout);
    zero_skip = may_skip(fp, src, dout, nt);
    // (the backward's zero_skip has seen q and k finite)
    qk_finite = dout && fp.kernel == kernel_kind::triangle && (zero_skip || rows_finite(fp, src, false, nt));
    if (fp.kernel == kernel_kind::box || (fp.kernel == kernel_kind::triangle && (box_rows || dout))) find_norms(fp, nt);
    if (fp.p.mask != mask_kind::none && ((fp.p.mask_view.sh == 0 && fp.Hq > 1) || dout)) spans = find_mask_spans(fp.p, nt);
  }

  // ‖q‖² of every f32 q row [B·Hq·Nq] and ‖k‖² of every key row [B·Hkv·Nk], in float32 in the
  // order of the features, or empty: box, and triangle on words (their scores from products), and
  // triangle's backward (the guard of its gradients' products, cpu::distance_rows_close).
  std::vector<float> QN2, KN2;
  const float* key_norms(const fproblem& fp, std::int64_t b, std::int64_t hkv) const {
    return KN2.empty() ? nullptr : KN2.data() + (b * fp.Hkv + hkv) * fp.Nk;
  }

 private:
  void find_norms(const fproblem& fp, int nt) {
    const std::int64_t P = fp.Pq, nq = fp.B * fp.Hq * fp.Nq, nk = fp.B * fp.Hkv * fp.Nk;
    QN2.assign(std::size_t(nq), 0.0f), KN2.assign(std::size_t(nk), 0.0f);
    const float* Qf = kq();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (std::int64_t e = 0; e < nq + nk; ++e) {
      const float* x = e < nq ? Qf + e * P : key_rows(fp, (e - nq) / fp.Nk / fp.Hkv, (e - nq) / fp.Nk % fp.Hkv) +
                                                 (e - nq) % fp.Nk * key_step(fp);
      float s = 0.0f;
      for (std::int64_t d = 0; d < P; ++d) s += x[d] * x[d];
      (e < nq ? QN2[std::size_t(e)] : KN2[std::size_t(e - nq)]) = s;
    }
  }

  // The bf16 forwards' words: V's in key pairs, and whether V is finite (the key pairs may put
  // a key no row sees beside the first one a row sees: its α = 0 must not meet an inf; false,
  // nothing kept, where it is not: the f32 products then); q and key rows read in place where
  // the tensors allow it.
  bool prepare_bf16_forward(const fproblem& fp, const fused_source& src, bool tiles, int nt) {
    bool finite = false;
    if (tiles) {
      ldvt = ((fp.Nk + 1) / 2 + 16 + 15) / 16 * 16;  // whole cache lines
      Vt = cpu::bf16_pair_words_t(src.v, fp.B, fp.Hkv, fp.Nk, fp.Dv, ldvt, nt, &finite);
    } else {
      Vw = cpu::bf16_pair_words(src.v, fp.B, fp.Hkv, fp.Nk, fp.Dv, fp.Nk / 2 + 1, nt, &finite);
    }
    if (!finite) {
      Vt = {}, Vw = {}, ldvt = 0;
      return false;
    }
    v_finite = true;
    zscale = float(src.scale);
    kpad = tiles ? 32 : 1;
    (tiles ? amx : pairs) = true;
    Qr = cpu::bf16_rows_in_place(src.q, fp.B, fp.Hq, fp.Nq, fp.Pq, 0, 4, nt);
    Kr = cpu::bf16_rows_in_place(src.k, fp.B, fp.Hkv, fp.Nk, fp.Pk, kpad, tiles ? 64 : 4, nt);
    return true;
  }

  void prepare(const fproblem& fp, const fused_source& src, use u, int nt, bool forward) {
    if (u == use::forward_amx || u == use::forward_pairs) {
      if (prepare_bf16_forward(fp, src, u == use::forward_amx, nt)) {
        if (fp.kernel != kernel_kind::box && fp.kernel != kernel_kind::triangle) return;
        box_rows = true;  // (and the f32 rows below)
      } else {
        u = use::f32;
      }
    }
    if (u != use::f32 && !box_rows) {
      zscale = float(src.scale);
      const bool row_tiles = u == use::backward_amx || u == use::backward_amx_f32 || u == use::backward_amx_all;
      qpad = row_tiles ? 16 : 0;
      kpad = u == use::backward_amx_all ? 32 : 1;
      Qw = load_pairs(src.q, fp.B, fp.Hq, fp.Nq, fp.Pq, qpad, nt);
      Kw = load_pairs(src.k, fp.B, fp.Hkv, fp.Nk, fp.Pk, kpad, nt);
      if (row_tiles) {
        row_pairs = row_amx = true;
        ldt = amx_pair_stride(fp.Nq);
        Qt = cpu::bf16_pair_words_t(src.q, fp.B, fp.Hq, fp.Nq, fp.Pq, ldt, nt);
        vpad = u == use::backward_amx_all ? 32 : 1;
        Vd = load_pairs(src.v, fp.B, fp.Hkv, fp.Nk, fp.Dv, vpad, nt);
        if (u == use::backward_amx_all) {
          amx = true;
          ldkt = ((fp.Nk + 1) / 2 + 16 + 15) / 16 * 16;  // whole cache lines
          Kt = cpu::bf16_pair_words_t(src.k, fp.B, fp.Hkv, fp.Nk, fp.Pk, ldkt, nt);
        }
        if (u != use::backward_amx_f32) return;
      } else {
        row_pairs = true;
        Qn = load_value_pairs(src.q, fp.B, fp.Hq, fp.Nq, fp.Pq, nt);
        Vd = load_pairs(src.v, fp.B, fp.Hkv, fp.Nk, fp.Dv, 1, nt);
        if (u == use::backward_pairs_all) pairs = true, Kn = load_value_pairs(src.k, fp.B, fp.Hkv, fp.Nk, fp.Pk, nt);
        // box's dv-only pass on words (box_bf16_products): ‖q‖², ‖k‖² and the differences from
        // the f32 q and key rows too (cpu::distance_row_finish), as the forward's lane blocks; the
        // triangle kernel's single pass likewise, and its dq, dk where keys lie close
        if (fp.kernel == kernel_kind::box || fp.kernel == kernel_kind::triangle) box_rows = true;
      }
      if (u != use::backward_pairs_f32 && u != use::backward_amx_f32 && !box_rows) return;
    }
    load(fp, src, nt, forward);
    kstride = fp.Nk * fp.Pq;
    if (fp.kernel == kernel_kind::location) K = to_f32(fp.W_a, nt), kstride = 0;
    if (fp.kernel == kernel_kind::additive && additive_exp_allowed() && within(Q, 20.0f) && within(K, 20.0f)) {
      exp_form = true;
      QE = exp2x(Q, nt), KE = exp2x(K, nt);
    }
  }

  // Whether a block the mask hides from every row, or whose weights are all 0, may be skipped:
  // every input the kernels read (the user's q, k, v — the bf16 products' words come from them —
  // the prepared f32 rows, dout) and every parameter inside the score finite, so each score of a
  // hidden block is -inf, and a block's α, de and products exactly 0 where its α are (0 · v = 0
  // for finite v). Asked where blocks of zeros are likely: a mask, or a distribution with exact
  // zeros (sparsemax, entmax15, hardmax, top-k, the box and triangle kernels — AdaSplash skips
  // entmax's zero blocks the same way). ATTN_FAMILY_MASK_SKIP=0 runs every block (for comparisons).
  bool may_skip(const fproblem& fp, const fused_source& src, const strided4* dout, int nt) const {
    const bool zeros = fp.dist == distribution_kind::sparsemax || fp.dist == distribution_kind::entmax15 ||
                       fp.dist == distribution_kind::hardmax || fp.dist == distribution_kind::topk ||
                       fp.dist == distribution_kind::kernel;
    // (hardmax and top-k on their kept keys form no block products to skip)
    if (fp.p.mask == mask_kind::none && (!zeros || sparse_rows(fp) > 0)) return false;
    if (const char* env = std::getenv("ATTN_FAMILY_MASK_SKIP"); env && std::string_view(env) == "0") return false;
    // The forward without a mask skips only Oᵀ += Vᵀ α of blocks whose α are all 0 (an α of a
    // NaN score is NaN, not 0): V alone must be finite.
    if (fp.p.mask == mask_kind::none && !dout) {
      if (v_finite) return true;  // seen while V was packed (prepare_bf16_forward)
      if (!V.empty()) return all_finite(V, nt);
      return src.direct && cpu::view_all_finite(src.v, fp.B, fp.Hkv, fp.Nk, fp.Dv, nt);
    }
    // The backward without a mask skips products of zero α (with dout) or zero dz (with q, k):
    // V enters none of them (dP = dO Vᵀ is always formed), so only a mask asks for V.
    const bool hidden = fp.p.mask != mask_kind::none;
    if (!std::isfinite(fp.bias) || !std::isfinite(fp.h) || !all_finite(w_v, nt)) return false;
    if (!rows_finite(fp, src, hidden, nt)) return false;
    return !dout || cpu::view_all_finite(*dout, fp.B, fp.Hq, fp.Nq, fp.Dv, nt);
  }

  // Every element of q and k (and of V, with_v) finite: the f32 copies where there are some, else
  // the user's tensors (a copy of a tensor with an inf or NaN has one too: q·scale, k and v
  // convert exactly or overflow; location's K is W_a).
  bool rows_finite(const fproblem& fp, const fused_source& src, bool with_v, int nt) const {
    for (const fvec* x : {&Q, &K, &V})
      if ((with_v || x != &V) && !all_finite(*x, nt)) return false;
    if (!src.direct) return true;
    const bool q_seen = !Q.empty(), k_seen = !K.empty() && fp.kernel != kernel_kind::location, v_seen = !V.empty();
    return (q_seen || cpu::view_all_finite(src.q, fp.B, fp.Hq, fp.Nq, fp.Pq, nt)) &&
           (k_seen || cpu::view_all_finite(src.k, fp.B, fp.Hkv, fp.Nk, fp.Pk, nt)) &&
           (v_seen || !with_v || cpu::view_all_finite(src.v, fp.B, fp.Hkv, fp.Nk, fp.Dv, nt));
  }

 public:
  // Dot scores of bfloat16 q, k, v (the user's tensors, direct), one feature, unless
  // ATTN_FAMILY_BF16=0 keeps f32 products: what both bf16 product paths need of the problem.
  static bool bf16_dot_operands(const fproblem& fp, const fused_source& src) {
    const char* env = std::getenv("ATTN_FAMILY_BF16");
    if (env && std::string_view(env) == "0") return false;
    return src.direct && fp.F == 1 && fp.kernel == kernel_kind::dot && src.q.type == dtype::bf16 &&
           src.k.type == dtype::bf16 && src.v.type == dtype::bf16 && fp.Pq == fp.Pk;
  }
  // Those with an even head size, on an ISA with a bf16 dot product (vdpbf16ps).
  static bool bf16_products(const fproblem& fp, const fused_source& src) {
    return cpu::select_family_kernels().forward_bf16 != nullptr && fp.Pq % 2 == 0 && bf16_dot_operands(fp, src);
  }
  // Words per row of a transpose in row pairs (Qᵀ, dOᵀ) for the AMX row pass: whole query blocks
  // of kQueryBlock rows (each block reads its pairs to whole tiles of 16 words), zero past Nq.
  static std::int64_t amx_pair_stride(std::int64_t Nq) {
    static_assert(kQueryBlock % 32 == 0);
    return ceil_div(Nq, kQueryBlock) * kQueryBlock / 2;
  }
  // The box kernel's forward on bf16 products (vdpbf16ps; not on the AMX tiles, whose level keeps
  // f32 products for the other scores): q·k from the words, exact as for dot scores, and ‖q‖²,
  // ‖k‖² and the differences where q·k cannot tell the side of h² from the f32 rows
  // (cpu::distance_lane_finish), so the weights are the f32 path's bit for bit; α (0 or 1) rounds
  // to itself for the product with V. The backward's dv-only pass likewise (cpu::distance_row_finish;
  // its α = K/ΣK rounded to bf16 for the product with dout, as the dot scores' pass rounds α).
  // The triangle kernel (1 - √z/h needs z itself) takes the products where they give z within
  // 2^-12 (cpu::distance_uncertain), the differences of the same f32 rows elsewhere; α rounded to
  // bf16 for V; its single-pass backward the same way.
  static bool box_bf16_products(const fproblem& fp, const fused_source& src) {
    const char* env = std::getenv("ATTN_FAMILY_BF16");
    if (env && std::string_view(env) == "0") return false;
    const cpu::family_table& kt = cpu::select_family_kernels();
    return kt.forward_bf16 != nullptr && kt.forward_amx == nullptr && src.direct && fp.F == 1 &&
           (fp.kernel == kernel_kind::box || fp.kernel == kernel_kind::triangle) && fp.bias == 0.0 && src.scale == 1.0 &&
           fp.Pq == fp.Pk && fp.Pq % 2 == 0 &&
           src.q.type == dtype::bf16 && src.k.type == dtype::bf16 && src.v.type == dtype::bf16;
  }
  // The same on AMX tiles (the amx level's forward_amx, and kept_amx for the sparse rows' kept
  // keys): whole tiles along P (32 values) and Dv (16).
  static bool amx_products(const fproblem& fp, const fused_source& src) {
    const cpu::family_table& kt = cpu::select_family_kernels();
    return kt.forward_amx != nullptr && kt.lanes % 32 == 0 && fp.Pq % 32 == 0 && fp.Dv % 16 == 0 &&
           bf16_dot_operands(fp, src);
  }
  // The forward (prepare takes the f32 products after all where V is not finite).
  static use forward_use(const fproblem& fp, const fused_source& src) {
    if (box_bf16_products(fp, src)) return use::forward_pairs;
    const bool amx = amx_products(fp, src);
    if (!amx && !bf16_products(fp, src)) return use::f32;
    return amx ? use::forward_amx : use::forward_pairs;
  }

 private:
  // ATTN_FAMILY_ADDITIVE=tanh keeps tanh(a + b) for every block (for comparisons and tests).
  static bool additive_exp_allowed() {
    const char* env = std::getenv("ATTN_FAMILY_ADDITIVE");
    return !(env && std::string_view(env) == "tanh");
  }
  // Every |x| <= bound (a NaN passes: it stays NaN in either form).
  static bool within(const fvec& x, float bound) {
    for (const float v : x)
      if (std::abs(v) > bound) return false;
    return true;
  }
  static fvec exp2x(const fvec& x, int nt) {
    fvec r(x.size());
    const std::int64_t n = std::int64_t(x.size());
#pragma omp parallel for num_threads(nt) schedule(static)
    for (std::int64_t i = 0; i < n; ++i) r[std::size_t(i)] = std::exp(2.0f * x[std::size_t(i)]);
    return r;
  }
  void load(const fproblem& fp, const fused_source& src, int nt, bool forward) {
    if (src.direct) {
      Q = load_f32(src.q, fp.B, fp.Hq, fp.Nq, fp.Pq, src.scale, nt);
      const auto rows = [&](const strided4& s) { return forward && s.type == dtype::f32 && s.sx == 1; };
      if (rows(src.k)) Kin = src.k;
      else K = load_f32(src.k, fp.B, fp.Hkv, fp.Nk, fp.Pk, 1.0, nt);
      if (box_rows) return;  // (V is read as words: Vw)
      if (rows(src.v)) Vin = src.v;
      else V = load_f32(src.v, fp.B, fp.Hkv, fp.Nk, fp.Dv, 1.0, nt);
    } else {
      Q = to_f32(fp.Qp, nt), K = to_f32(fp.Kp, nt), V = to_f32(fp.V, nt);
    }
  }
};

// Multi-dimensional additive keeps the scores of at most this many floats per thread (Fc
// features × the keys of a lane block × L lanes; sigmoid and identity stream instead).
constexpr std::int64_t kMdScoreFloats = std::int64_t(1) << 23;

// One thread's lane block: rows r = lbi·L + x of (b, hkv) are query i = r / G of head hkv·G + r % G.
// Statistics: L per feature (F = Dv for multi-dimensional additive, feature-major).
struct lane_state {
  std::int64_t L, P, F, nl = 0;
  std::vector<std::int32_t> lo, hi, cut;
  std::vector<std::int64_t> h, i;
  fbuf qt, t, lse, r, scratch;
  fbuf qtf;  // box on words (fused_inputs::box_rows): the f32 qᵀ [P][L] beside the words in qt
  std::vector<float> qn2;  // ‖q‖² of the lanes (fused_inputs::QN2, where there are norms)
  std::int64_t scratch_keys = -1;  // the key span `scratch` holds
  bias_ctx mc;  // the mask (cpu/mask_fill.h)
  cpu::family_params prm;
  // ATTN_FAMILY_MD_CHUNK=n caps the features per chunk (tests walk the chunked path with it).
  std::int64_t md_chunk = [] {
    const char* env = std::getenv("ATTN_FAMILY_MD_CHUNK");
    return env ? std::max<std::int64_t>(0, std::atoll(env)) : 0;
  }();

  lane_state(const fproblem& fp, const fused_inputs& in)
      : L(in.L), P(fp.Pq), F(fp.F), lo(L), hi(L), cut(std::size_t(L * F)), h(L), i(L), qt(alloc_floats(fp.Pq * L)),
        t(alloc_floats(L * F)), lse(alloc_floats(L * F)), r(alloc_floats(L * F)),
        qtf(in.box_rows ? alloc_floats(fp.Pq * L) : fbuf{}), qn2(in.QN2.empty() ? 0 : std::size_t(L), 0.0f),
        prm(make_params(fp, in.w_v.data(), in.exp_form)) {
    mc.p = &fp.p, mc.kt = &cpu::select_kernels(), mc.total = L, mc.h = h.data(), mc.i = i.data(), mc.spans = &in.spans;
    if (fp.p.mask != mask_kind::none) prm.mask = fill_bias, prm.mask_ctx = &mc;
    prm.zero_skip = in.zero_skip, prm.qk_finite = in.qk_finite;
  }

  cpu::family_lanes set(const fproblem& fp, const fused_inputs& in, std::int64_t b, std::int64_t hkv, std::int64_t lbi) {
    const std::int64_t rows = fp.Nq * in.G;
    nl = std::min(L, rows - lbi * L);
    for (std::int64_t x = 0; x < L; ++x) {
      if (!qn2.empty()) qn2[std::size_t(x)] = 0.0f;
      if (x >= nl) {
        lo[x] = hi[x] = 0, h[x] = i[x] = 0;
        for (std::int64_t d = 0; d < P; ++d) qt[d * L + x] = 0.0f;  // zero floats, or zero words [P/2][L]
        if (in.box_rows)
          for (std::int64_t d = 0; d < P; ++d) qtf[d * L + x] = 0.0f;
        continue;
      }
      const std::int64_t rr = lbi * L + x;
      i[x] = rr / in.G, h[x] = hkv * in.G + rr % in.G;
      const auto [a, e] = fp.p.key_range(b, i[x]);
      lo[x] = std::int32_t(a), hi[x] = std::int32_t(e);
      const std::int64_t qrow = (b * fp.Hq + h[x]) * fp.Nq + i[x];
      if (!qn2.empty()) qn2[std::size_t(x)] = in.QN2[std::size_t(qrow)];
      if (in.lane_words()) {  // words [P/2][L] in qt's room
        auto* qw = reinterpret_cast<std::uint32_t*>(qt.get());
        const std::int64_t bh = b * fp.Hq + h[x];
        const std::uint32_t* row = in.Qr.head.empty() ? in.Qw.data() + (bh * (fp.Nq + in.qpad) + i[x]) * (P / 2)  // (Qw: Nq + qpad rows per head)
                                                      : in.Qr.head[std::size_t(bh)] + i[x] * in.Qr.step[std::size_t(bh)];
        for (std::int64_t w = 0; w < P / 2; ++w) qw[w * L + x] = row[w];
        if (in.box_rows) {
          const float* q = in.kq() + qrow * P;
          for (std::int64_t d = 0; d < P; ++d) qtf[d * L + x] = q[d];
        }
        continue;
      }
      const float* q = in.kq() + qrow * P;
      for (std::int64_t d = 0; d < P; ++d) qt[d * L + x] = q[d];
    }
    mc.b = b, mc.valid = nl;
    // Scratch for the keys these rows see (a window keeps it small), grown when a block needs more.
    std::int64_t kmin = fp.Nk, kmax = 0;
    for (std::int64_t x = 0; x < nl; ++x)
      if (lo[x] < hi[x]) kmin = std::min<std::int64_t>(kmin, lo[x]), kmax = std::max<std::int64_t>(kmax, hi[x]);
    // (+2: the bf16 forward widens the range to whole key pairs)
    const std::int64_t span = std::max<std::int64_t>(kmax - kmin, 0) + (in.lane_words() ? 2 : 0);
    std::int64_t Fc = F;
    if (cpu::family_keeps_scores(prm.dist)) {
      Fc = std::clamp<std::int64_t>(kMdScoreFloats / std::max<std::int64_t>(span * L, 1), 1, F);
      if (md_chunk > 0) Fc = std::min(Fc, md_chunk);
    }
    if (span > scratch_keys) {
      scratch = alloc_floats(F > 1 ? cpu::family_md_lane_scratch_floats(L, in.kt.W, span, P, F, Fc, prm.dist)
                                   : cpu::family_lane_scratch_floats(L, span, prm.dist));
      scratch_keys = span;
    }
    cpu::family_lanes lb;
    lb.L = L, lb.nl = nl, lb.P = P, lb.Dv = fp.Dv;
    lb.qt = qt.get();
    if (in.lane_words()) {
      lb.qtw = reinterpret_cast<const std::uint32_t*>(qt.get());
      const std::int64_t bh = b * fp.Hkv + hkv;
      if (in.Kr.head.empty()) lb.kw = in.Kw.data() + bh * (fp.Nk + in.kpad) * (P / 2), lb.kwsn = P / 2;
      else lb.kw = in.Kr.head[std::size_t(bh)], lb.kwsn = in.Kr.step[std::size_t(bh)];
      if (!in.Vt.empty()) lb.vtw = in.Vt.data() + (b * fp.Hkv + hkv) * fp.Dv * in.ldvt, lb.ldvt = in.ldvt;
      if (!in.Vw.empty()) lb.vw = in.Vw.data() + (b * fp.Hkv + hkv) * (fp.Nk / 2 + 1) * fp.Dv, lb.vwss = fp.Dv;
      if (!in.Kt.empty()) {  // the backward's dq pass on the tiles
        lb.vrw = in.Vd.data() + (b * fp.Hkv + hkv) * (fp.Nk + in.vpad) * (fp.Dv / 2), lb.vrwsn = fp.Dv / 2;
        lb.ktw = in.Kt.data() + (b * fp.Hkv + hkv) * P * in.ldkt, lb.ldkt = in.ldkt;
      }
      if (!in.Kn.empty()) {  // the backward's dq pass
        lb.vrw = in.Vd.data() + (b * fp.Hkv + hkv) * (fp.Nk + in.vpad) * (fp.Dv / 2), lb.vrwsn = fp.Dv / 2;
        lb.kpw = in.Kn.data() + (b * fp.Hkv + hkv) * (fp.Nk / 2 + 1) * P, lb.kpwss = P;
      }
      lb.zscale = in.zscale;
      if (in.box_rows) lb.qt = qtf.get(), lb.k = in.key_rows(fp, b, hkv), lb.ksn = in.key_step(fp);
    } else {
      lb.k = in.key_rows(fp, b, hkv), lb.ksn = in.key_step(fp);
      lb.v = in.value_rows(fp, b, hkv), lb.vsn = in.value_step(fp);
    }
    lb.lo = lo.data(), lb.hi = hi.data();
    if (!qn2.empty()) lb.qn2 = qn2.data(), lb.kn2 = in.key_norms(fp, b, hkv);
    lb.fp = prm;
    lb.st = {t.get(), lse.get(), cut.data(), r.get()};
    lb.scratch = scratch.get();
    lb.Fc = Fc;
    return lb;
  }
  std::int64_t row(const fproblem& fp, std::int64_t b, std::int64_t x) const { return (b * fp.Hq + h[x]) * fp.Nq + i[x]; }
};


bool forced_two_pass() {
  const char* env = std::getenv("ATTN_FAMILY_BACKWARD");
  return env && std::string_view(env) == "two_pass";
}

// hardmax (zero gradient) and top-k with k <= kSparseTopk have at most k non-zero weights per
// row: the forward finds each row's kept keys (find_kept) and sums α v over them alone, O(k·Dv)
// per row in place of the product with every key's V, and keeps them for the backward. The
// backward then needs O(k·(P + Dv)) per row: dα = dout·v_j, dz, and dq, dk, dv of those keys
// alone — no dP, dq or dk/dv products over every key (3 products of 7); from the forward's kept
// keys where it has them, otherwise from the scores once more. ATTN_FAMILY_SPARSE=0 takes the
// dense forms (the weights' product with every V, the two passes) for comparisons;
// ATTN_FAMILY_BACKWARD=two_pass the dense backward alone.
constexpr std::int64_t kSparseTopk = cpu::kFamilySparseMax;
std::int64_t sparse_rows(const fproblem& fp) {
  const char* env = std::getenv("ATTN_FAMILY_SPARSE");
  if ((env && std::string_view(env) == "0") || fp.F > 1) return 0;
  if (fp.dist == distribution_kind::hardmax) return fp.hardmax_grad == hardmax_gradient::zero ? 1 : 0;
  return fp.dist == distribution_kind::topk && fp.topk <= kSparseTopk ? fp.topk : 0;
}
std::int64_t sparse_keep(const fproblem& fp) { return forced_two_pass() ? 0 : sparse_rows(fp); }

// The kept keys of every row (lane layout over (b, hkv, lane block)): up to K per row in key
// order, with their α and g = the score's act′ (1 for the identity activation).
kept_rows find_kept(const fproblem& fp, const fused_inputs& in, std::int64_t K) {
  const std::int64_t nrows = fp.B * fp.Hq * fp.Nq, L = in.L, nlb = in.nlb;
  kept_rows kr;
  kr.K = K;
  kr.cnt.assign(std::size_t(nrows), 0), kr.idx.assign(std::size_t(nrows * K), -1);
  kr.alpha.assign(std::size_t(nrows * K), 0.0f), kr.g.assign(std::size_t(nrows * K), 0.0f);
#pragma omp parallel num_threads(std::max(1, fp.p.num_threads))
  {
    const cpu::denormals_flushed ftz;
    lane_state ls(fp, in);
    std::vector<std::int32_t> cnt(static_cast<std::size_t>(L)), idx(static_cast<std::size_t>(L * K));
    std::vector<float> al(std::size_t(L * K)), gz(std::size_t(L * K));
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t u = 0; u < in.units; ++u) {
      const std::int64_t lbi = nlb - 1 - u % nlb, hkv = u / nlb % fp.Hkv, b = u / nlb / fp.Hkv;
      (in.amx ? in.kt.kept_amx : in.pairs ? in.kt.kept_bf16 : in.kt.kept)(ls.set(fp, in, b, hkv, lbi),
                                                cpu::family_kept{K, cnt.data(), idx.data(), al.data(), gz.data()});
      for (std::int64_t x = 0; x < ls.nl; ++x) {
        const std::int64_t r = ls.row(fp, b, x), n = cnt[std::size_t(x)];
        kr.cnt[std::size_t(r)] = std::int32_t(n);
        std::copy_n(idx.begin() + x * K, n, kr.idx.begin() + r * K);
        std::copy_n(al.begin() + x * K, n, kr.alpha.begin() + r * K);
        std::copy_n(gz.begin() + x * K, n, kr.g.begin() + r * K);
      }
    }
  }
  return kr;
}

}  // namespace

std::string fused_why_not(const fproblem& fp, dtype type) {
  if (type == dtype::f64) return "float64 inputs run the float64 tiled path";
  if (fp.Nq >= kMaxLen || fp.Nk >= kMaxLen) return "sequences of 2^30 or more are not fused";
  return {};
}

bool fused_keeps_stats(const fproblem& fp) {
  if (fp.F > 1) return fp.dist == distribution_kind::softmax;  // multi-dimensional: an lse per (row, feature)
  return fp.dist == distribution_kind::softmax || fp.dist == distribution_kind::kernel;
}

bool kept_reusable(const fproblem& fp) {
  const bool distance = fp.kernel == kernel_kind::box || fp.kernel == kernel_kind::triangle;  // act′ of the kernel
  return (fp.dist == distribution_kind::hardmax && fp.hardmax_grad == hardmax_gradient::zero) ||
         (fp.act == act_kind::identity && !distance);
}

const char* fused_forward(const fproblem& fp, const fused_source& src, const strided4& out, float* log_norm,
                          kept_rows* kept) {
  const std::int64_t K = sparse_rows(fp);
  const fused_inputs in(fp, src, fused_inputs::forward_use(fp, src));
  if (!fused_keeps_stats(fp)) log_norm = nullptr;
  if (log_norm) std::fill(log_norm, log_norm + fp.B * fp.Hq * fp.Nq * fp.F, -kInfF);
  if (fp.B * fp.Hq * fp.Nq == 0 || fp.Nk == 0) {
    zero_rows(out, fp.B, fp.Hq, fp.Nq, fp.Dv);
    return in.kt.name;
  }
  const int nt = std::max(1, fp.p.num_threads);
  // Sparse rows with every V finite (an inf or NaN in a V no row keeps still meets its α = 0 in
  // the dense forms, as in the reference; the bf16 products are taken only with V finite):
  // out_i = Σ α v over the row's kept keys alone, summed in key order in float64 (kept_out), V
  // read as the kernels read it (value_rows, or the user's bf16 rows where the products take bf16
  // pairs).
  if (K && (in.lane_words() || in.values_finite(fp, nt))) {
    kept_rows kr = find_kept(fp, in, K);
    const std::int64_t rows = fp.B * fp.Hq * fp.Nq, Dv = fp.Dv;
    // The user's bf16 rows with a stride between elements: a contiguous copy of each row read.
    const bool strided_words = in.lane_words() && src.v.sx != 1;
#pragma omp parallel num_threads(nt)
    {
      const cpu::denormals_flushed ftz;
      std::vector<float> row(static_cast<std::size_t>(Dv));
      std::vector<std::uint16_t> vrows(strided_words ? std::size_t(K * Dv) : 0);
      std::vector<std::int32_t> seq(strided_words ? std::size_t(K) : 0);  // 0, 1, …: the copied rows in order
      for (std::size_t e = 0; e < seq.size(); ++e) seq[e] = std::int32_t(e);
#pragma omp for schedule(static)
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t i = r % fp.Nq, h = r / fp.Nq % fp.Hq, b = r / fp.Nq / fp.Hq, hkv = h / in.G;
        cpu::family_kept_out ko;
        ko.cnt = kr.cnt[std::size_t(r)], ko.Dv = Dv;
        ko.alpha = kr.alpha.data() + r * K, ko.idx = kr.idx.data() + r * K;
        ko.out = row.data();
        if (strided_words) {
          for (std::int64_t e = 0; e < ko.cnt; ++e) {
            const std::uint16_t* vj = src.v.ptr<std::uint16_t>(b, hkv, ko.idx[e], 0);
            for (std::int64_t y = 0; y < Dv; ++y) vrows[std::size_t(e * Dv + y)] = vj[y * src.v.sx];
          }
          ko.vw = vrows.data(), ko.vstep = Dv, ko.idx = seq.data();
        } else if (in.lane_words()) {
          ko.vw = src.v.ptr<std::uint16_t>(b, hkv, 0, 0), ko.vstep = src.v.sn;
        } else {
          ko.v = in.value_rows(fp, b, hkv), ko.vstep = in.value_step(fp);
        }
        in.kt.kept_out(ko);
        put_row(out, b, h, i, Dv, row.data(), 1, 1.0);
      }
    }
    if (kept) *kept = std::move(kr);
    if (in.amx) return "amx, bf16 products on AMX tiles";
    return in.pairs ? "avx512bf16, bf16 products" : in.kt.name;
  }
  const bool softmax = fp.dist == distribution_kind::softmax;
  const std::int64_t L = in.L, nlb = in.nlb, Dv = fp.Dv;
#pragma omp parallel num_threads(std::max(1, fp.p.num_threads))
  {
    const cpu::denormals_flushed ftz;
    lane_state ls(fp, in);
    fbuf ot = alloc_floats(Dv * L);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t u = 0; u < in.units; ++u) {
      const std::int64_t lbi = nlb - 1 - u % nlb, hkv = u / nlb % fp.Hkv, b = u / nlb / fp.Hkv;
      const cpu::family_lanes lb = ls.set(fp, in, b, hkv, lbi);
      (in.amx ? in.kt.forward_amx : in.pairs ? in.kt.forward_bf16 : fp.F > 1 ? in.kt.md_forward : in.kt.forward)(lb, ot.get());
      put_lanes(out, b, ls.nl, Dv, ot.get(), L, [&](std::int64_t x) { return std::pair{ls.h[x], ls.i[x]}; });
      if (log_norm)  // softmax: t = lse (+inf: no key); kernel: lse = Σ e (0: none); [row][F]
        for (std::int64_t x = 0; x < ls.nl; ++x)
          for (std::int64_t f = 0; f < fp.F; ++f) {
            const std::int64_t e = f * L + x;
            log_norm[ls.row(fp, b, x) * fp.F + f] = softmax ? (ls.t[e] == kInfF ? -kInfF : ls.t[e]) : std::log(ls.lse[e]);
          }
    }
  }
  if (in.amx) return "amx, bf16 products on AMX tiles";
  return in.pairs ? "avx512bf16, bf16 products" : in.kt.name;  // forward_bf16 is that table's alone
}

const char* fused_weights(const fproblem& fp, const fused_source& src, const strided4& w) {
  const fused_inputs in(fp, src);
  if (fp.B * fp.Hq * fp.Nq == 0 || fp.Nk == 0) {
    zero_rows(w, fp.B, fp.Hq, fp.Nq, fp.Nk * fp.F);
    return in.kt.name;
  }
  const std::int64_t L = in.L, nlb = in.nlb, Nk = fp.Nk * fp.F;  // multi-dimensional: rows of [Nk, F]
#pragma omp parallel num_threads(std::max(1, fp.p.num_threads))
  {
    const cpu::denormals_flushed ftz;
    lane_state ls(fp, in);
    fbuf ot = alloc_floats(fp.Dv * L), ab = alloc_floats(L * Nk);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t u = 0; u < in.units; ++u) {
      const std::int64_t lbi = nlb - 1 - u % nlb, hkv = u / nlb % fp.Hkv, b = u / nlb / fp.Hkv;
      cpu::family_lanes lb = ls.set(fp, in, b, hkv, lbi);
      std::fill(ab.get(), ab.get() + L * Nk, 0.0f);
      lb.alpha = ab.get(), lb.alpha_ld = Nk;
      (fp.F > 1 ? in.kt.md_forward : in.kt.forward)(lb, ot.get());
      for (std::int64_t x = 0; x < ls.nl; ++x) put_row(w, b, ls.h[x], ls.i[x], Nk, ab.get() + x * Nk, 1, 1.0);
    }
  }
  return in.kt.name;
}

namespace {

// One thread's row-layout work (the dk/dv pass, or the single pass): key block kb of (b, hkv)
// against every query row of every head of the GQA group, in blocks of kQueryBlock rows.
struct row_pass {
  const fproblem& fp;
  const fused_inputs& in;
  const float* dO;
  const cpu::family_stats st;  // [B·Hq·Nq] rows' statistics
  std::int64_t P, Dv, W, ldmax, Pp;
  fbuf kvt, kr, scratch;
  fbuf kbox;  // box on words (fused_inputs::box_rows): the f32 key block [P][ld] beside the words in kt
  float *kt, *vt, *dkt, *dvt;
  std::vector<std::int32_t> lo, hi;
  std::vector<std::int64_t> hs, is;
  bias_ctx mc;  // the mask (cpu/mask_fill.h)
  cpu::family_params prm;

  // bf16 products (in.row_pairs): dout rows as words [B·Hq·Nq][Dv/2] and by pairs of rows [B·Hq][Nq/2 + 1][Dv]
  const std::uint32_t* dOw = nullptr;
  const std::uint32_t* dOn = nullptr;
  const std::uint32_t* dOt = nullptr;  // in.row_amx: dOᵀ in row pairs [B·Hq][Dv][in.ldt]
  double* dw_v = nullptr;  // single pass of additive scores: this (b, hkv)'s dw_v [P]

  row_pass(const fproblem& fp_, const fused_inputs& in_, const float* dO_, cpu::family_stats st_, bool single)
      : fp(fp_), in(in_), dO(dO_), st(st_), P(fp.Pq), Dv(fp.Dv), W(in.kt.W),
        ldmax(ceil_div(cpu::kRowKeyBlock, W) * W), Pp(ceil_div(P, W) * W), kvt(alloc_floats(2 * (P + Dv) * ldmax)),
        kr(single && (fp.kernel == kernel_kind::dot || fp.kernel == kernel_kind::triangle) ? alloc_floats(ldmax * Pp) : fbuf{}), scratch(alloc_floats(fp.F > 1 ? cpu::family_md_row_scratch_floats(kQueryBlock, ldmax, P, Dv)
                                      : cpu::family_row_scratch_floats(kQueryBlock, ldmax) + (in_.row_amx ? kQueryBlock * Pp : 0))),
        kbox(in_.box_rows ? alloc_floats(fp_.Pq * ldmax) : fbuf{}), lo(kQueryBlock), hi(kQueryBlock), hs(kQueryBlock),
        is(kQueryBlock), prm(make_params(fp, in.w_v.data(), in.exp_form)) {
    kt = kvt.get(), vt = kt + P * ldmax, dkt = vt + Dv * ldmax, dvt = dkt + P * ldmax;
    mc.p = &fp.p, mc.kt = &cpu::select_kernels(), mc.h = hs.data(), mc.i = is.data(), mc.spans = &in.spans;
    if (fp.p.mask != mask_kind::none) prm.mask = fill_bias, prm.mask_ctx = &mc;
    prm.zero_skip = in.zero_skip, prm.qk_finite = in.qk_finite;
  }

  // dk, dv of the block's keys into the sink; single pass: also dq [G·Nq][Pp] of (b, hkv)
  // += dz K (rows g·Nq + i) and sums[0, 1, 2] += Σ dz, Σ de, Σ de·∂e/∂h.
  void key_block(std::int64_t b, std::int64_t hkv, std::int64_t kb, const fused_grad_sink& sink, float* dq,
                 double* sums) {
    const std::int64_t G = in.G, j0 = kb * cpu::kRowKeyBlock, nb = std::min(cpu::kRowKeyBlock, fp.Nk - j0);
    const std::int64_t lw = in.row_amx ? 32 : W;  // (AMX: whole tiles of keys)
    const std::int64_t ld = ceil_div(nb, lw) * lw, bh = b * fp.Hkv + hkv;
    std::uint32_t* ktw = reinterpret_cast<std::uint32_t*>(kt);
    std::uint32_t* vtw = reinterpret_cast<std::uint32_t*>(vt);
    const std::uint32_t* Kw = in.row_pairs ? in.Kw.data() + bh * (fp.Nk + in.kpad) * (P / 2) : nullptr;
    const float* K = in.row_pairs && !in.box_rows ? nullptr : in.keys(fp, b, hkv);
    if (in.box_rows)  // (and the f32 key block, transposed)
      for (std::int64_t d = 0; d < P; ++d)
        for (std::int64_t x = 0; x < ld; ++x) kbox[d * ld + x] = x < nb ? K[(j0 + x) * P + d] : 0.0f;
    if (in.row_pairs) {  // the key block transposed as words: ktw [P/2][ld], vtw [Dv/2][ld]
      const std::uint32_t* Vd = in.Vd.data() + bh * (fp.Nk + in.vpad) * (Dv / 2);
      for (std::int64_t w = 0; w < P / 2; ++w)
        for (std::int64_t x = 0; x < ld; ++x) ktw[w * ld + x] = x < nb ? Kw[(j0 + x) * (P / 2) + w] : 0u;
      for (std::int64_t w = 0; w < Dv / 2; ++w)
        for (std::int64_t x = 0; x < ld; ++x) vtw[w * ld + x] = x < nb ? Vd[(j0 + x) * (Dv / 2) + w] : 0u;
    } else {
      const float* V = in.V.data() + bh * fp.Nk * Dv;
      for (std::int64_t d = 0; d < P; ++d)
        for (std::int64_t x = 0; x < ld; ++x) kt[d * ld + x] = x < nb ? K[(j0 + x) * P + d] : 0.0f;
      for (std::int64_t d = 0; d < Dv; ++d)
        for (std::int64_t x = 0; x < ld; ++x) vt[d * ld + x] = x < nb ? V[(j0 + x) * Dv + d] : 0.0f;
    }
    if (dq && in.row_pairs) {  // keys by pairs: krw [ld/2][Pp]
      auto* krw = reinterpret_cast<std::uint32_t*>(kr.get());
      const auto half = [&](std::int64_t j, std::int64_t d) -> std::uint32_t {
        if (j >= j0 + nb || d >= P) return 0u;
        const std::uint32_t w = Kw[j * (P / 2) + d / 2];
        return d % 2 ? w >> 16 : w & 0xffffu;
      };
      for (std::int64_t x = 0; x < ld / 2; ++x)
        for (std::int64_t d = 0; d < Pp; ++d) krw[x * Pp + d] = half(j0 + 2 * x, d) | half(j0 + 2 * x + 1, d) << 16;
    } else if (dq && kr) {  // (dot scores, triangle: dq += dS K; additive's terms read kt)
      for (std::int64_t x = 0; x < ld; ++x)
        for (std::int64_t d = 0; d < Pp; ++d) kr[x * Pp + d] = x < nb && d < P ? K[(j0 + x) * P + d] : 0.0f;
    }
    std::fill(dkt, dkt + P * ld, 0.0f);
    std::fill(dvt, dvt + Dv * ld, 0.0f);
    for (std::int64_t g = 0; g < G; ++g) {
      const std::int64_t h = hkv * G + g;
      for (std::int64_t i0 = 0; i0 < fp.Nq; i0 += kQueryBlock) {
        const std::int64_t nq = std::min(kQueryBlock, fp.Nq - i0);
        bool any = false;
        for (std::int64_t r = 0; r < nq; ++r) {
          const auto [a, e] = fp.p.key_range(b, i0 + r);
          lo[std::size_t(r)] = std::int32_t(a), hi[std::size_t(r)] = std::int32_t(e);
          hs[std::size_t(r)] = h, is[std::size_t(r)] = i0 + r;
          any |= a < e && a < j0 + nb && e > j0;
        }
        if (!any) continue;
        mc.b = b, mc.valid = mc.total = nq;
        const std::int64_t r0 = (b * fp.Hq + h) * fp.Nq + i0;
        cpu::family_rows pr;
        pr.nq = nq, pr.nb = nb, pr.ldk = ld, pr.P = P, pr.Dv = Dv, pr.j0 = j0;
        if (!in.row_pairs) pr.q = in.kq() + r0 * P, pr.dout = dO + r0 * Dv;  // (bf16 products: the words below)
        if (in.box_rows) pr.q = in.kq() + r0 * P;
        pr.qsn = P, pr.dsn = Dv;
        pr.lo = lo.data(), pr.hi = hi.data();
        pr.fp = prm;
        const std::int64_t so = r0 * fp.F;  // statistics [row][F]
        pr.st = {st.t + so, st.lse + so, st.cut + so, st.r + so};
        pr.kt = in.box_rows ? kbox.get() : kt, pr.vt = vt, pr.dkt = dkt, pr.dvt = dvt;
        if (!in.QN2.empty()) pr.qn2 = in.QN2.data() + r0, pr.kn2 = in.key_norms(fp, b, hkv) + j0;
        pr.scratch = scratch.get();
        if (dq) pr.dq = dq + (g * fp.Nq + i0) * Pp, pr.dqs = Pp, pr.Pp = Pp, pr.kr = kr.get(), pr.sums = sums, pr.dw_v = dw_v;
        if (in.row_pairs) {  // query blocks start on even rows: row pair i0/2 onwards
          const std::int64_t rp = (b * fp.Hq + h) * (fp.Nq / 2 + 1) + i0 / 2;
          const std::int64_t rw = (b * fp.Hq + h) * (fp.Nq + in.qpad) + i0;  // (q and dout rows as words)
          pr.qw = in.Qw.data() + rw * (P / 2), pr.qwsn = P / 2;
          pr.dow = dOw + rw * (Dv / 2), pr.dwsn = Dv / 2;
          if (in.row_amx) {
            pr.qt2 = in.Qt.data() + (b * fp.Hq + h) * P * in.ldt + i0 / 2, pr.ldt = in.ldt;
            pr.dot2 = dOt + (b * fp.Hq + h) * Dv * in.ldt + i0 / 2;
          } else {
            pr.qn = in.Qn.data() + rp * P, pr.don = dOn + rp * Dv;
          }
          pr.ktw = ktw, pr.vtw = vtw, pr.krw = reinterpret_cast<const std::uint32_t*>(kr.get()), pr.zscale = in.zscale;
        }
        (in.row_amx ? in.kt.dkdv_amx : in.row_pairs ? in.kt.dkdv_bf16 : fp.F > 1 ? in.kt.md_dkdv : in.kt.dkdv)(pr);
      }
    }
    put_lanes(sink.dk, b, nb, P, dkt, ld, [&](std::int64_t x) { return std::pair{hkv, j0 + x}; });
    put_lanes(sink.dv, b, nb, Dv, dvt, ld, [&](std::int64_t x) { return std::pair{hkv, j0 + x}; });
  }
};

// The single-pass backward runs where the distribution has no row statistics (sigmoid) and
// the problem has (b, hkv) units enough to keep threads busy (as the core op's fused backward,
// a rule of the shape alone, so results stay bitwise identical for any thread count);
// ATTN_FAMILY_BACKWARD=two_pass forces the two passes (for comparisons).
constexpr std::int64_t kSinglePassUnits = 8;
bool single_pass(const fproblem& fp) {
  const bool streams = fp.dist == distribution_kind::sigmoid || fp.dist == distribution_kind::identity;
  const bool kind = fp.kernel == kernel_kind::dot || (fp.kernel == kernel_kind::additive && fp.F > 1);
  if (!streams || !kind || fp.B * fp.Hkv < kSinglePassUnits) return false;
  return !forced_two_pass();
}


}  // namespace

namespace {
const char* backward_impl(const fproblem& fp, const fused_source& src, const strided4& dout,
                          const fused_grad_sink& sink, grad_acc& acc, const fused_saved* saved);
}  // namespace

const char* fused_backward(const fproblem& fp, const fused_source& src, const strided4& dout,
                           const fused_grad_sink& sink, grad_acc& acc, const fused_saved* saved) {
  if (fp.kernel != kernel_kind::location) return backward_impl(fp, src, dout, sink, acc, saved);
  // location: the kernels' dk of every (b, hkv) is a share of dW_a [Nk, D]; summed in (b, hkv) order.
  const std::int64_t P = fp.Pq, units = fp.B * fp.Hkv;
  std::vector<double> dk(std::size_t(units * fp.Nk * P), 0.0);
  fused_grad_sink s = sink;
  s.dk = rows_of(dk, fp.Hkv, fp.Nk, P);
  const char* isa = backward_impl(fp, src, dout, s, acc, saved);
  for (std::int64_t u = 0; u < units; ++u)
    for (std::int64_t e = 0; e < fp.Nk * P; ++e) acc.dW_a[std::size_t(e)] += dk[std::size_t(u * fp.Nk * P + e)];
  return isa;
}

namespace {

// The forward's statistics (one per row) as the kernels' — softmax t = lse; kernel t = 1/Σ e,
// lse = Σ e; +inf and 0 for a row with no key, as set_empty_stats and lane_stats leave them —
// and r = dout·out per row, in float64 from the tensors as they are. False, and nothing kept,
// where a statistic is NaN: the backward then recomputes them.
bool load_saved(const fproblem& fp, const fused_saved& sv, const strided4& dout, std::vector<float>& T,
                std::vector<float>& LSE, std::vector<float>& R) {
  const std::int64_t nrows = fp.B * fp.Hq * fp.Nq, Dv = fp.Dv, F = fp.F;
  const bool softmax = fp.dist == distribution_kind::softmax;
  for (std::int64_t o = 0; o < nrows * F; ++o)
    if (std::isnan(sv.log_norm[o])) return false;
  for (std::int64_t o = 0; o < nrows * F; ++o) {
    const float ln = sv.log_norm[o];
    float& t = T[std::size_t(o)];
    float& sum = LSE[std::size_t(o)];
    if (softmax) t = ln == -kInfF ? kInfF : ln;
    else sum = ln == -kInfF ? 0.0f : std::exp(ln), t = ln == -kInfF ? 0.0f : 1.0f / sum;
  }
#pragma omp parallel for num_threads(std::max(1, fp.p.num_threads)) schedule(static)
  for (std::int64_t row = 0; row < nrows; ++row) {
    const cpu::denormals_flushed ftz;
    const std::int64_t i = row % fp.Nq, h = row / fp.Nq % fp.Hq, b = row / fp.Nq / fp.Hq;
    if (F > 1) {  // multi-dimensional: r of each feature, dout[c]·out[c]
      for (std::int64_t y = 0; y < Dv; ++y) R[std::size_t(row * F + y)] = float(dout.load(b, h, i, y) * sv.out.load(b, h, i, y));
      continue;
    }
    double s = 0.0;
    for (std::int64_t y = 0; y < Dv; ++y) s += dout.load(b, h, i, y) * sv.out.load(b, h, i, y);
    R[std::size_t(row)] = float(s);
  }
  return true;
}

const char* backward_impl(const fproblem& fp, const fused_source& src, const strided4& dout,
                          const fused_grad_sink& sink, grad_acc& acc, const fused_saved* saved) {
  // The forward's statistics (fused_keeps_stats): box scores have no score gradient, so only the
  // dk/dv pass remains; dot-product scores take the single pass where sigmoid would.
  const std::int64_t nrows = fp.B * fp.Hq * fp.Nq, F = fp.F, nst = nrows * F;  // statistics [row][F]
  std::vector<float> T(std::size_t(nst), kInfF), LSE(std::size_t(nst), kInfF), Rr(std::size_t(nst), 0.0f);
  std::vector<std::int32_t> CUT(std::size_t(nst), -1);
  // Additive scores too take the single pass: their dq comes with dk from the same terms
  // (elem_row_grad), so each tanh is formed twice (score, gradient) instead of four times; and
  // the triangle kernel: dq with dk from the same dz (distance_row_products), its scores formed
  // twice instead of three times.
  const bool single_kind = fp.kernel == kernel_kind::dot || fp.kernel == kernel_kind::additive ||
                           fp.kernel == kernel_kind::triangle;
  const bool reuse = saved && fused_keeps_stats(fp) && !forced_two_pass() &&
                     (fp.kernel == kernel_kind::box || (single_kind && fp.B * fp.Hkv >= kSinglePassUnits)) &&
                     load_saved(fp, *saved, dout, T, LSE, Rr);
  const bool dv_only = reuse && fp.kernel == kernel_kind::box;
  const bool reuse_single = reuse && single_kind;
  // bf16 products (dout bf16 too) in the row-layout pass: the single pass, or the dk/dv pass of
  // the two (their dq pass multiplies in f32). The sparse hardmax/top-k backward has no such pass.
  using use = fused_inputs::use;
  const bool single = single_pass(fp) || reuse_single;
  // On the amx level the row-layout pass runs on AMX tiles (whole tiles along P and Dv: 32
  // values) — the single pass, or the dk/dv pass of the two after an f32 dq pass.
  const bool amx_rows = (single || !sparse_keep(fp)) && dout.type == dtype::bf16 && fp.Dv % 32 == 0 &&
                        fused_inputs::amx_products(fp, src);
  // box with the forward's statistics: its dv-only pass on words (q·k and αᵀ dout by vdpbf16ps)
  const bool box_pairs =
      dv_only && dout.type == dtype::bf16 && fp.Dv % 2 == 0 && fused_inputs::box_bf16_products(fp, src);
  // the triangle kernel's single pass likewise: its scores (cpu::distance_row_finish), dP = dO Vᵀ,
  // αᵀ dout and dq, dk as products (cpu::distance_row_products, dz rounded to bf16) on words; the
  // differences of the f32 rows where keys lie close to their queries
  const bool triangle_pairs = reuse_single && fp.kernel == kernel_kind::triangle && dout.type == dtype::bf16 &&
                              fp.Dv % 2 == 0 && fused_inputs::box_bf16_products(fp, src);
  const bool pairs = box_pairs || triangle_pairs || amx_rows ||
                     ((single || !sparse_keep(fp)) && dout.type == dtype::bf16 && fp.Dv % 2 == 0 &&
                      fused_inputs::bf16_products(fp, src));
  // (the dq pass widens key ranges to whole pairs, like the forward: K and V must be finite)
  const int nt0 = std::max(1, fp.p.num_threads);
  const auto kv_finite = [&] {
    return bf16_all_finite(src.k, fp.B, fp.Hkv, fp.Nk, fp.Pk, nt0) && bf16_all_finite(src.v, fp.B, fp.Hkv, fp.Nk, fp.Dv, nt0);
  };
  const use u = amx_rows ? (single ? use::backward_amx : kv_finite() ? use::backward_amx_all : use::backward_amx_f32)
                : box_pairs || triangle_pairs ? use::backward_pairs
                : !pairs ? use::f32
                : single ? use::backward_pairs
                : kv_finite() ? use::backward_pairs_all
                    : use::backward_pairs_f32;
  const fused_inputs in(fp, src, u, &dout);
  const std::int64_t P = fp.Pq, Dv = fp.Dv, G = in.G, L = in.L, nlb = in.nlb;
  if (fp.B * fp.Hq * fp.Nq == 0 || fp.Nk == 0) {
    zero_rows(sink.dq, fp.B, fp.Hq, fp.Nq, P);
    zero_rows(sink.dk, fp.B, fp.Hkv, fp.Nk, P);
    zero_rows(sink.dv, fp.B, fp.Hkv, fp.Nk, Dv);
    return in.kt.name;
  }
  const int nt = std::max(1, fp.p.num_threads);
  const fvec dO =
      pairs && (single || box_pairs || in.lane_words()) ? fvec()
                                                        : load_f32(dout, fp.B, fp.Hq, fp.Nq, Dv, 1.0, nt);
  cpu::words dOw, dOn, dOt;
  if (amx_rows)  // (rows padded as q's; dOᵀ in row pairs as Qᵀ)
    dOw = load_pairs(dout, fp.B, fp.Hq, fp.Nq, Dv, in.qpad, nt), dOt = cpu::bf16_pair_words_t(dout, fp.B, fp.Hq, fp.Nq, Dv, in.ldt, nt);
  else if (pairs)
    dOw = load_pairs(dout, fp.B, fp.Hq, fp.Nq, Dv, 0, nt), dOn = load_value_pairs(dout, fp.B, fp.Hq, fp.Nq, Dv, nt);
  const cpu::family_stats stats{T.data(), LSE.data(), CUT.data(), Rr.data()};
  const std::int64_t nkb = ceil_div(fp.Nk, cpu::kRowKeyBlock);
  // The dk/dv pass: row layout over (b, hkv, key block), from the rows' statistics.
  const auto dkdv_pass = [&] {
#pragma omp parallel num_threads(nt)
    {
      const cpu::denormals_flushed ftz;
      row_pass rp(fp, in, dO.data(), stats, false);
      rp.dOw = dOw.data(), rp.dOn = dOn.data(), rp.dOt = dOt.data();
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t task = 0; task < fp.B * fp.Hkv * nkb; ++task) {
        const std::int64_t kb = task % nkb, hkv = task / nkb % fp.Hkv, b = task / nkb / fp.Hkv;
        rp.key_block(b, hkv, kb, sink, nullptr, nullptr);
      }
    }
  };

  if (single) {
    // One task per (b, hkv) walks its key blocks in order: dk, dv per block as the dk/dv pass,
    // and dq of the group's rows accumulated in the task (in key-block order) from the same dz.
    const std::int64_t units = fp.B * fp.Hkv;
    const bool additive = fp.kernel == kernel_kind::additive;
    const std::int64_t nw = P * F;  // dw_v: [A], multi-dimensional [Dv, A]
    std::vector<double> sums(std::size_t(3 * units), 0.0), dwv(additive ? std::size_t(units * nw) : 0, 0.0);
#pragma omp parallel num_threads(nt)
    {
      const cpu::denormals_flushed ftz;
      row_pass rp(fp, in, dO.data(), stats, true);
      rp.dOw = dOw.data(), rp.dOn = dOn.data(), rp.dOt = dOt.data();
      fbuf dq = alloc_floats(G * fp.Nq * rp.Pp);
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t u = 0; u < units; ++u) {
        const std::int64_t hkv = u % fp.Hkv, b = u / fp.Hkv;
        std::fill(dq.get(), dq.get() + G * fp.Nq * rp.Pp, 0.0f);
        rp.dw_v = additive ? dwv.data() + u * nw : nullptr;
        for (std::int64_t kb = 0; kb < nkb; ++kb) rp.key_block(b, hkv, kb, sink, dq.get(), sums.data() + 3 * u);
        for (std::int64_t g = 0; g < G; ++g)
          for (std::int64_t i = 0; i < fp.Nq; ++i)
            put_row(sink.dq, b, hkv * G + g, i, P, dq.get() + (g * fp.Nq + i) * rp.Pp, 1, sink.dq_scale);
      }
    }
    for (std::int64_t u = 0; u < units; ++u) {
      acc.dbias += sums[std::size_t(3 * u)], acc.dsigmoid_bias += sums[std::size_t(3 * u + 1)];
      acc.dh += sums[std::size_t(3 * u + 2)];
      for (std::int64_t a = 0; additive && a < nw; ++a) acc.dw_v[std::size_t(a)] += dwv[std::size_t(u * nw + a)];
    }
    if (fp.dist != distribution_kind::sigmoid) acc.dsigmoid_bias = 0.0;
    if (amx_rows) return "amx, bf16 products on AMX tiles";
    return pairs ? "avx512bf16, bf16 products" : in.kt.name;  // dkdv_bf16 is that table's alone
  }

  if (const std::int64_t K = sparse_keep(fp)) {
    const kept_rows kr = saved && saved->kept.K == K && kept_reusable(fp) ? saved->kept : find_kept(fp, in, K);
    const std::vector<std::int32_t>&CNT = kr.cnt, &IDX = kr.idx;
    const std::vector<float>&ALPHA = kr.alpha, &GZ = kr.g;
    // Pass 2: per (b, hkv), its rows in order (so every sum has one order): dα_e = dout·v_j,
    // r = Σ α dα / Σ α, de = α (dα - r), dz = de act′; dot: dq += dz k_j, dk_j += dz q; additive,
    // with t = tanh(qp + kp_j): g = dz w_v ⊙ (1 - t²), dq += g, dk_j += g, dw_v += dz t; distance
    // (box, triangle): g = 2 dz (q - k_j), dq += g, dk_j -= g, dh += de ∂e/∂h; dv_j += α dout.
    const bool zero_grad = fp.dist == distribution_kind::hardmax && fp.hardmax_grad == hardmax_gradient::zero;
    const bool additive = fp.kernel == kernel_kind::additive;
    const bool distance = fp.kernel == kernel_kind::box || fp.kernel == kernel_kind::triangle;
    const std::int64_t units = fp.B * fp.Hkv;
    std::vector<double> sums(std::size_t(units), 0.0), dhs(std::size_t(units), 0.0);
    std::vector<double> dwv(additive ? std::size_t(units * P) : 0, 0.0);
    // The ISA's kernel, f32 vectors (family_kept_grad), for every score of this pass; dw_v and dh
    // per unit, summed in unit order below.
#pragma omp parallel num_threads(nt)
    {
      const cpu::denormals_flushed ftz;
      const std::int64_t rows = G * fp.Nq;
      fvec dk(std::size_t(fp.Nk * P)), dv(std::size_t(fp.Nk * Dv)), dq(std::size_t(rows * P));
      std::vector<float> dw(additive ? std::size_t(P) : 0);
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t u = 0; u < units; ++u) {
        const std::int64_t hkv = u % fp.Hkv, b = u / fp.Hkv, r0 = (b * fp.Hq + hkv * G) * fp.Nq;
        std::fill(dk.begin(), dk.end(), 0.0f);
        std::fill(dv.begin(), dv.end(), 0.0f);
        std::fill(dw.begin(), dw.end(), 0.0f);
        cpu::family_kept_grad kg;
        kg.rows = rows, kg.K = K, kg.P = P, kg.Dv = Dv;
        kg.cnt = CNT.data() + r0, kg.idx = IDX.data() + r0 * K, kg.alpha = ALPHA.data() + r0 * K;
        kg.g = GZ.data() + r0 * K, kg.q = in.Q.data() + r0 * P, kg.dout = dO.data() + r0 * Dv;
        kg.k = in.raw_keys(fp, b, hkv), kg.v = in.V.data() + (b * fp.Hkv + hkv) * fp.Nk * Dv;
        kg.dq = dq.data(), kg.dk = dk.data(), kg.dv = dv.data(), kg.sum_dz = &sums[std::size_t(u)];
        kg.zero_grad = zero_grad;
        kg.kind = additive ? cpu::family_kept_grad::additive : distance ? cpu::family_kept_grad::distance
                                                                         : cpu::family_kept_grad::dot;
        kg.w_v = additive ? in.w_v.data() : nullptr, kg.dw = dw.data();
        kg.triangle = fp.kernel == kernel_kind::triangle, kg.h = fp.h, kg.dh = &dhs[std::size_t(u)];
        in.kt.kept_grad(kg);
        for (std::int64_t a = 0; a < std::int64_t(dw.size()); ++a) dwv[std::size_t(u * P + a)] = double(dw[std::size_t(a)]);
        for (std::int64_t g = 0; g < G; ++g)
          for (std::int64_t i = 0; i < fp.Nq; ++i)
            put_row(sink.dq, b, hkv * G + g, i, P, dq.data() + (g * fp.Nq + i) * P, 1, sink.dq_scale);
        for (std::int64_t j = 0; j < fp.Nk; ++j) {
          put_row(sink.dk, b, hkv, j, P, dk.data() + j * P, 1, 1.0);
          put_row(sink.dv, b, hkv, j, Dv, dv.data() + j * Dv, 1, 1.0);
        }
      }
    }
    for (std::int64_t u = 0; u < units; ++u) {
      acc.dbias += sums[std::size_t(u)], acc.dh += dhs[std::size_t(u)];
      for (std::int64_t a = 0; additive && a < P; ++a) acc.dw_v[std::size_t(a)] += dwv[std::size_t(u * P + a)];
    }
    return in.kt.name;
  }

  if (dv_only) {  // box with the forward's statistics: dq = 0, dk = 0, dv from α
    zero_rows(sink.dq, fp.B, fp.Hq, fp.Nq, P);
    dkdv_pass();
    return box_pairs ? "avx512bf16, bf16 products in dv" : in.kt.name;
  }

  // Pass 1: dq and the row statistics, lane layout over (b, hkv, lane block).
  std::vector<double> sums(std::size_t(3 * in.units), 0.0);  // Σ dz, Σ de, Σ de ∂e/∂h per lane block
  const bool additive = fp.kernel == kernel_kind::additive;
  const std::int64_t nw = P * F;  // dw_v: [A], multi-dimensional [Dv, A]
  std::vector<double> dwv(additive ? std::size_t(in.units * nw) : 0, 0.0);  // dw_v per lane block
  // Row r = (b·Hq + h)·Nq + i of dout as words (dOw: Nq + qpad rows per head).
  const auto dout_row = [&](std::int64_t r) { return r / fp.Nq * (fp.Nq + in.qpad) + r % fp.Nq; };
#pragma omp parallel num_threads(nt)
  {
    const cpu::denormals_flushed ftz;
    lane_state ls(fp, in);
    fbuf doutt = alloc_floats(Dv * L), dqt = alloc_floats(P * L);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t u = 0; u < in.units; ++u) {
      const std::int64_t lbi = nlb - 1 - u % nlb, hkv = u / nlb % fp.Hkv, b = u / nlb / fp.Hkv;
      const cpu::family_lanes lb = ls.set(fp, in, b, hkv, lbi);
      auto* douttw = reinterpret_cast<std::uint32_t*>(doutt.get());  // bf16 products: words [Dv/2][L]
      for (std::int64_t x = 0; x < L; ++x) {
        const std::int64_t r = x < ls.nl ? ls.row(fp, b, x) : -1;
        if (in.lane_words())  // (the tiles' dout rows are padded to whole tiles: qpad)
          for (std::int64_t w = 0; w < Dv / 2; ++w) douttw[w * L + x] = r >= 0 ? dOw[std::size_t(dout_row(r) * (Dv / 2) + w)] : 0u;
        else
          for (std::int64_t y = 0; y < Dv; ++y) doutt[y * L + x] = r >= 0 ? dO[std::size_t(r * Dv + y)] : 0.0f;
      }
      cpu::family_dq_io io{doutt.get(), dqt.get(), sums.data() + 3 * u, additive ? dwv.data() + u * nw : nullptr};
      io.douttw = douttw;
      (in.amx ? in.kt.dq_amx : in.pairs ? in.kt.dq_bf16 : F > 1 ? in.kt.md_dq : in.kt.dq)(lb, io);
      for (std::int64_t x = 0; x < ls.nl; ++x) {
        const std::int64_t r = ls.row(fp, b, x);
        put_row(sink.dq, b, ls.h[x], ls.i[x], P, dqt.get() + x, L, sink.dq_scale);
        for (std::int64_t f = 0; f < F; ++f) {
          const std::size_t o = std::size_t(r * F + f), e = std::size_t(f * L + x);
          T[o] = ls.t[e], LSE[o] = ls.lse[e], Rr[o] = ls.r[e], CUT[o] = ls.cut[e];
        }
      }
    }
  }
  for (std::int64_t u = 0; u < in.units; ++u) {
    acc.dbias += sums[std::size_t(3 * u)], acc.dsigmoid_bias += sums[std::size_t(3 * u + 1)];
    acc.dh += sums[std::size_t(3 * u + 2)];
  }
  if (fp.dist != distribution_kind::sigmoid) acc.dsigmoid_bias = 0.0;
  for (std::int64_t u = 0; additive && u < in.units; ++u)
    for (std::int64_t a = 0; a < nw; ++a) acc.dw_v[std::size_t(a)] += dwv[std::size_t(u * nw + a)];

  // Pass 2: dk, dv.
  dkdv_pass();
  if (in.amx) return "amx, bf16 products on AMX tiles";
  if (amx_rows) return "amx, bf16 products on AMX tiles in dk/dv";
  return in.pairs ? "avx512bf16, bf16 products" : pairs ? "avx512bf16, bf16 products in dk/dv" : in.kt.name;
}

}  // namespace

}  // namespace attn::detail::family

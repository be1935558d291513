// fuzz/family_fuzz.cc — the differential fuzzer of the ops that share the core op's front
// (issue 14): the bytes pick one of
//   family      attention_family (score × distribution × masks) on the tiled path and, where
//               eligible, the core and fused paths, against the reference path on float64
//               copies of the same values (the truth), forward and backward, dtype-aware
//               tolerances; the weights (fused where eligible) against the truth's;
//   positional  rotary (both layouts, partial R, offset or ids) fast vs the float64 reference
//               (ATTN_BACKEND=reference), rotary_backward ∘ rotary = identity, and the T5 bias
//               against relative_position_bucket looked up by hand.
// The serving ops (varlen, paged) have a harness of their own: serving_fuzz.cc.
// Values are finite and moderate: the special-value contract is the core op's (api_fuzz).
// attn::error is a valid answer only where both sides of a comparison give it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "attn/error.h"
#include "attn/family.h"
#include "attn/positional.h"
#include "attn/tensor.h"
#include "fuzz_bytes.h"

namespace {

using namespace attn;

using fuzz::bytes;

Tensor filled(bytes& in, const Shape& s, dtype t) {
  Tensor r = Tensor::empty(s, t);
  for (std::int64_t i = 0; i < r.numel(); ++i) store_from_double(r.data(), t, i, in.moderate());
  return r;
}

[[noreturn]] void finding(const std::string& what, const std::string& detail) { fuzz::finding("family_fuzz", what, detail); }

double tol_for(dtype t) { return t == dtype::f32 ? 2e-4 : t == dtype::f16 ? 4e-3 : t == dtype::bf16 ? 3e-2 : 1e-9; }

// |got - want| <= tol (scale + |want|), NaN where the other is NaN.
void compare(const std::string& what, const TensorView& got, const TensorView& want, double tol, double scale = 1) {
  const std::vector<double> g = to_vector(got), w = to_vector(want);
  if (g.size() != w.size()) finding(what, "sizes differ");
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) || std::isnan(w[i])) {
      if (std::isnan(g[i]) != std::isnan(w[i])) finding(what, "NaN pattern at " + std::to_string(i));
      continue;
    }
    if (g[i] == w[i]) continue;  // ±inf too (an lse of a row with no key)
    if (!(std::abs(g[i] - w[i]) <= tol * (scale + std::abs(w[i]))))
      finding(what, "at " + std::to_string(i) + ": " + std::to_string(g[i]) + " vs " + std::to_string(w[i]));
  }
}

double amax(const TensorView& t) {
  double m = 0;
  for (double x : to_vector(t))
    if (std::isfinite(x)) m = std::max(m, std::abs(x));
  return m;
}

// Runs f; an attn::error becomes its message (the other side must fail too).
template <class F>
auto attempt(F&& f, std::string& err) -> std::optional<decltype(f())> {
  try {
    return f();
  } catch (const error& e) {
    err = e.what();
    return std::nullopt;
  }
}

// ---- the attention family ----

void fuzz_family(bytes& in) {
  const dtype types[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f64};
  const dtype t = types[in.upto(3)];
  const std::int64_t B = 1 + in.upto(1), Hkv = 1 + in.upto(1), Hq = Hkv * (1 + in.upto(1)), Nq = 1 + in.upto(6),
                     Nk = in.upto(8), D = 1 + in.upto(5), Dv = 1 + in.upto(5), A = 1 + in.upto(3);
  family_options o;
  const score_kind scores[] = {score_kind::dot,      score_kind::scaled_dot, score_kind::general, score_kind::biased_general,
                               score_kind::activated_general, score_kind::additive, score_kind::cosine,
                               score_kind::location, score_kind::gaussian,   score_kind::box,     score_kind::triangle};
  o.score.kind = scores[in.upto(10)];
  const distribution_kind dists[] = {distribution_kind::softmax, distribution_kind::sigmoid,  distribution_kind::sparsemax,
                                     distribution_kind::entmax15, distribution_kind::hardmax, distribution_kind::topk,
                                     distribution_kind::kernel};
  o.distribution.kind = dists[in.upto(6)];
  o.distribution.k = 1 + in.upto(3);
  o.distribution.hardmax_grad = in.upto(1) ? hardmax_gradient::straight_through : hardmax_gradient::zero;
  if (in.upto(3) == 0) o.distribution.sigmoid_bias = in.moderate();
  o.score.activation = score_activation(in.upto(2));
  o.score.temperature = 0.25 + in.upto(7) / 4.0;
  o.score.bandwidth = 0.5 + in.upto(7) / 2.0;
  if (o.score.kind == score_kind::scaled_dot && in.upto(1)) o.score.scale = in.moderate();
  o.is_causal = in.upto(1);
  o.alignment = causal_alignment(in.upto(2));
  o.window_left = in.upto(3) - 1;
  o.window_right = in.upto(3) - 1;
  switch (o.score.kind) {
    case score_kind::general: o.score.W = filled(in, {D, D}, t); break;
    case score_kind::biased_general:
    case score_kind::activated_general:
      o.score.W = filled(in, {D, D}, t), o.score.b = filled(in, {1}, t);
      break;
    case score_kind::additive:
      o.score.W_q = filled(in, {A, D}, t), o.score.W_k = filled(in, {A, D}, t), o.score.b = filled(in, {A}, t);
      o.score.w_v = in.upto(1) ? filled(in, {A}, t) : filled(in, {Dv, A}, t);  // multi-dimensional
      break;
    case score_kind::location: o.score.W_a = filled(in, {Nk, D}, t); break;
    default: break;
  }
  const Tensor q = filled(in, {B, Hq, Nq, D}, t), k = filled(in, {B, Hkv, Nk, D}, t), v = filled(in, {B, Hkv, Nk, Dv}, t),
               dout = filled(in, {B, Hq, Nq, Dv}, t);
  const int mask = in.upto(2);
  if (mask == 1) {
    Tensor m = Tensor::empty({Nq, Nk}, dtype::boolean);
    for (std::int64_t i = 0; i < m.numel(); ++i) m.data_as<bool>()[i] = in.upto(3) != 0;
    o.attn_mask = m;
  } else if (mask == 2) {
    o.attn_mask = filled(in, {1, Hq, Nq, Nk}, t);
  }
  // Hardmax, topk and the box kernel are discontinuous in the scores: a float32 path and the
  // float64 truth may pick different keys at near-ties, so those run on float64 inputs only
  // (the tiled path computes in float64: the same decisions as the truth's).
  const bool discontinuous = o.distribution.kind == distribution_kind::hardmax ||
                             o.distribution.kind == distribution_kind::topk || o.score.kind == score_kind::box;
  if (discontinuous && t != dtype::f64) return;

  // The truth: the reference path on float64 copies (parameters too).
  family_options o8 = o;
  for (std::optional<TensorArg>* p : {&o8.score.W, &o8.score.b, &o8.score.W_q, &o8.score.W_k, &o8.score.w_v, &o8.score.W_a})
    if (*p) *p = Tensor::copy_of(**p, dtype::f64);
  if (o.attn_mask && o.attn_mask->type() != dtype::boolean) o8.attn_mask = Tensor::copy_of(*o.attn_mask, dtype::f64);
  const Tensor q8 = q.to(dtype::f64), k8 = k.to(dtype::f64), v8 = v.to(dtype::f64), d8 = dout.to(dtype::f64);
  std::string terr;
  const auto truth = attempt([&] { return attention_family(q8, k8, v8, o8, {.path = family_path::reference}); }, terr);
  const double tol = tol_for(t);
  // A path that does not run this call refuses it with its reason (core: not a dot-like score
  // with softmax; fused: not a dot-product score, a distribution it does not fuse, float64).
  const auto refused = [](family_path path, const std::string& err) {
    return (path == family_path::core && err.find("path core runs only") != std::string::npos) ||
           (path == family_path::fused && err.find("path fused: ") != std::string::npos);
  };
  // The core route runs a bfloat16 or float16 call in that dtype: q' (and k') are rounded once
  // to it (docs/FAMILY.md), which moves a score by up to eps · D · max|q'| · max|k'| — past 1/2,
  // the softmax weights are not resolved (any mix of v's rows), below, off by about 4× that.
  double core_tol = tol;
  if (t == dtype::bf16 || t == dtype::f16) {
    const double eps = t == dtype::bf16 ? 0x1p-8 : 0x1p-11, dd = double(D);
    double smag = 0;
    switch (o.score.kind) {
      case score_kind::general:
      case score_kind::biased_general:
      case score_kind::activated_general:  // tanh (the route's softcap) moves a score no more than its argument
        smag = dd * (dd * amax(*o.score.W) * amax(q) + (o.score.b ? amax(*o.score.b) : 0.0)) * amax(k);
        break;
      case score_kind::location: smag = dd * amax(q) * amax(*o.score.W_a); break;
      case score_kind::cosine: smag = 1 / o.score.temperature; break;
      default: break;
    }
    const double delta = eps * smag;
    core_tol = delta > 0.5 ? 2.0 : tol + 4 * delta;
  }
  for (family_path path : {family_path::tiled, family_path::core, family_path::fused, family_path::reference}) {
    const std::string name = "family " + std::string(to_string(path)) + " " + to_string(o.score.kind) + "/" +
                             to_string(o.distribution.kind) + " " + std::string(dtype_name(t));
    std::string err;
    const auto r = attempt([&] { return attention_family(q, k, v, o, {.path = path, .num_threads = 1}); }, err);
    if (!r && refused(path, err)) continue;
    if (r.has_value() != truth.has_value()) finding(name + ": error on one side only", err + " | " + terr);
    if (!r) continue;
    compare(name + " out", r->out, truth->out, path == family_path::core ? core_tol : tol, 1 + amax(v8));
  }
  if (!truth) return;
  const auto g8 = attempt([&] { return attention_family_backward(q8, k8, v8, d8, o8, {.path = family_path::reference}); }, terr);
  // Gradients carry the scores' scale: |W|, |q|, |k| and 1/h, 1/τ multiply them.
  const double gscale = (1 + amax(d8)) * (1 + amax(v8)) * (1 + amax(q8)) * (1 + amax(k8)) * double(std::max(D, Dv)) *
                        (1 + 1 / o.score.bandwidth) * (1 + 1 / o.score.temperature);
  // The weights: from the fused kernels where they run (f32/f16/bf16 dot-product scores), else
  // the reference; against the truth's.
  {
    std::string err, werr;
    const auto w = attempt([&] { return attention_family_weights(q, k, v, o, {.num_threads = 1}); }, err);
    const auto w8 = attempt([&] { return attention_family_weights(q8, k8, v8, o8); }, werr);
    if (w.has_value() != w8.has_value()) finding("family weights: error on one side only", err + " | " + werr);
    if (w) compare("family weights", *w, *w8, tol, 1.0);
  }
  for (family_path path : {family_path::tiled, family_path::core, family_path::fused}) {
    const std::string name = "family backward " + std::string(to_string(path)) + " " + to_string(o.score.kind) + "/" +
                             to_string(o.distribution.kind) + " " + std::string(dtype_name(t));
    std::string err;
    const auto g = attempt([&] { return attention_family_backward(q, k, v, dout, o, {.path = path, .num_threads = 1}); }, err);
    if (!g && refused(path, err)) continue;
    if (g.has_value() != g8.has_value()) finding(name + ": error on one side only", err + " | " + terr);
    if (!g) continue;
    compare(name + " dq", g->dq, g8->dq, tol, gscale);
    compare(name + " dk", g->dk, g8->dk, tol, gscale);
    compare(name + " dv", g->dv, g8->dv, tol, gscale);
  }
}

// ---- positional ----

void fuzz_positional(bytes& in) {
  const dtype types[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::f64};
  const dtype t = types[in.upto(3)];
  const std::int64_t B = 1 + in.upto(1), H = 1 + in.upto(2), N = 1 + in.upto(7), D = 2 * (1 + in.upto(4));
  rotary_options ro;
  ro.rotary_dim = 2 * in.upto(int(D / 2));  // 0: all of D
  ro.layout = in.upto(1) ? rotary_layout::interleaved : rotary_layout::half_split;
  ro.base = in.upto(1) ? 10000.0 : 1.0 + in.upto(100);
  positions pos = std::int64_t(in.upto(200));
  if (in.upto(1)) {
    Tensor ids = Tensor::empty({in.upto(1) ? B : 1, N}, dtype::i64);
    for (std::int64_t i = 0; i < ids.numel(); ++i) ids.data_as<std::int64_t>()[i] = in.upto(255) * (1 + in.upto(3));
    if (ids.size(0) == 1) ids = Tensor::copy_of(ids.view().reshape({N}));
    pos = ids;
  }
  const Tensor x = filled(in, {B, H, N, D}, t);
  const Tensor fast = rotary(x, pos, ro);
  setenv("ATTN_BACKEND", "reference", 1);
  const Tensor ref = rotary(x.to(dtype::f64), pos, ro);
  unsetenv("ATTN_BACKEND");
  const double tol = tol_for(t);
  compare("rotary vs reference", fast, ref, tol, 1 + amax(x));
  compare("rotary_backward(rotary(x)) vs x", rotary_backward(rotary(x.to(dtype::f64), pos, ro), pos, ro), x, 1e-9, 1 + amax(x));

  relative_position_options rp;
  rp.bidirectional = in.upto(1);
  rp.num_buckets = 1 + in.upto(40);
  rp.max_distance = 1 + in.upto(150);
  rp.query_offset = in.upto(20);
  const std::int64_t Nq = 1 + in.upto(6), Nk = in.upto(9);
  std::string err;
  const Tensor table = filled(in, {rp.num_buckets, H}, t);
  const auto bias = attempt([&] { return relative_position_bias(table, Nq, Nk, rp); }, err);
  if (!bias) return;  // a refused configuration (num_buckets, max_distance): checked by the tests
  for (std::int64_t h = 0; h < H; ++h)
    for (std::int64_t i = 0; i < Nq; ++i)
      for (std::int64_t j = 0; j < Nk; ++j) {
        const std::int64_t bk = relative_position_bucket(j - (rp.query_offset + i), rp);
        if (bk < 0 || bk >= rp.num_buckets) finding("relative_position_bucket", "bucket " + std::to_string(bk) + " out of range");
        if (bias->get({0, h, i, j}) != table.get({bk, h})) finding("relative_position_bias", "differs from the table");
      }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bytes in{data, size};
  switch (in.upto(2)) {
    case 1: fuzz_positional(in); break;
    default: fuzz_family(in); break;  // (2 was the serving ops, now serving_fuzz's: the corpus keeps its meaning)
  }
  return 0;
}

// fuzz/api_fuzz.cc — the differential fuzzer of attn::attention and attention_backward: the
// bytes choose shapes (GQA, 3-D or 4-D), dtype, options (causal and its alignment, windows, a
// bool or float mask, softcap, scale, ALiBi, sinks, nonpad lengths, an intermediate to return) and values — some of them
// NaN or ±inf. The cpu backend and the reference run the call; both must agree with the float64
// truth (the reference on float64 copies of the same values) within the dtype's tolerance, with
// the same NaN/inf pattern, forward and backward (special values, attention.h). attn::error is a
// valid answer only when both backends give it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>

#include "attn/attention.h"
#include "attn/error.h"
#include "attn/npy.h"
#include "attn/tensor.h"
#include "fuzz_bytes.h"

namespace {

using namespace attn;

using fuzz::bytes;

Tensor filled(bytes& in, const Shape& s, dtype t, bool specials) {
  Tensor r = Tensor::empty(s, t);
  for (std::int64_t i = 0; i < r.numel(); ++i) {
    double x = in.value();
    if (!specials && !std::isfinite(x)) x = 1.0;
    store_from_double(r.data(), t, i, x);
  }
  return r;
}

[[noreturn]] void finding(const char* what, const std::string& detail) { fuzz::finding("api_fuzz", what, detail); }

double tol_for(dtype t) { return t == dtype::f32 ? 2e-4 : t == dtype::f16 ? 4e-3 : 3e-2; }

double max_finite(dtype t) {
  switch (t) {
    case dtype::f16: return 65504.0;
    case dtype::bf16: return 3.3895313892515355e38;
    case dtype::f32: return double(std::numeric_limits<float>::max());
    default: return std::numeric_limits<double>::max();
  }
}

// got vs the float64 truth: same NaN/inf pattern, else |got - want| <= tol (1 + m) with m = |want|,
// or mag[i] where given and larger (the magnitude of the terms that cancel into want).
void compare(const char* what, const TensorView& got, const TensorView& want, double tol,
             const std::vector<double>* mag = nullptr) {
  const std::vector<double> g = to_vector(got), w = to_vector(want);
  if (g.size() != w.size()) finding(what, "sizes differ");
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i]) || std::isnan(g[i])) {
      if (std::isnan(w[i]) != std::isnan(g[i])) finding(what, "NaN pattern at " + std::to_string(i));
      continue;
    }
    // A truth beyond the largest finite value of got's dtype rounds to inf of its sign (a
    // float32 lse of 6e38 is +inf): that is the right answer, not a finding.
    if (std::isinf(g[i]) && std::isfinite(w[i]) && std::abs(w[i]) > max_finite(got.type()) &&
        std::signbit(g[i]) == std::signbit(w[i]))
      continue;
    if (std::isinf(w[i]) || std::isinf(g[i])) {
      if (g[i] != w[i])
        finding(what, "inf at " + std::to_string(i) + ": " + std::to_string(g[i]) + " vs " + std::to_string(w[i]));
      continue;
    }
    const double m = mag && std::isfinite((*mag)[i]) ? std::max((*mag)[i], std::abs(w[i])) : std::abs(w[i]);
    if (std::abs(g[i] - w[i]) > tol * (1 + m))
      finding(what, "at " + std::to_string(i) + ": " + std::to_string(g[i]) + " vs " + std::to_string(w[i]));
  }
}

// |x|, elementwise, in float64.
// A destination of `shape` inside a larger buffer: the last dim padded by 3 elements (a strided
// view, as attention_into and attention_backward_into take).
struct padded {
  Tensor buf;
  TensorView view;
  padded(const Shape& shape, dtype t) {
    Shape big = shape;
    big.back() += 3;
    buf = Tensor::full(big, t, 7.25);
    view = buf.view().slice(int(big.size()) - 1, 1, 1 + shape.back());
  }
};

// The _into calls write the bits of the allocating ones (NaN as NaN).
void same_bits(const char* what, const TensorView& got, const TensorView& want) {
  const std::vector<double> g = to_vector(got), w = to_vector(want);
  for (std::size_t i = 0; i < g.size(); ++i)
    if (!(g[i] == w[i] || (std::isnan(g[i]) && std::isnan(w[i]))) || std::signbit(g[i]) != std::signbit(w[i]))
      finding(what, std::to_string(g[i]) + " vs " + std::to_string(w[i]) + " at " + std::to_string(i));
}

Tensor abs_f64(const Tensor& x) {
  std::vector<double> a = x.to_vector();
  for (double& y : a) y = std::abs(y);
  return Tensor::from_values(x.shape(), dtype::f64, a);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bytes in{data, size};
  const dtype types[] = {dtype::f32, dtype::f16, dtype::bf16};
  const dtype t = types[in.upto(2)];
  const bool specials = in.upto(3) == 0;
  const std::int64_t B = 1 + in.upto(1), Hkv = 1 + in.upto(1), G = 1 + in.upto(2), Nq = 1 + in.upto(8),
                     Nk = in.upto(9), D = 1 + in.upto(7), Dv = 1 + in.upto(7);
  const std::int64_t Hq = Hkv * G;
  attention_options o;
  o.is_causal = in.upto(1);
  o.alignment = causal_alignment(in.upto(2) % 3);
  o.window_left = in.upto(3) - 1;
  o.window_right = in.upto(3) - 1;
  if (in.upto(3) == 0) o.softcap = 0.5 + in.upto(40) / 4.0;
  if (in.upto(3) == 0) o.scale = (in.upto(20) - 10) / 4.0;
  Tensor q = filled(in, {B, Hq, Nq, D}, t, specials), k = filled(in, {B, Hkv, Nk, D}, t, specials),
         v = filled(in, {B, Hkv, Nk, Dv}, t, specials), dout = filled(in, {B, Hq, Nq, Dv}, t, false);
  const int mask = in.upto(2);
  if (mask == 1) {
    Tensor m = Tensor::empty({Nq, Nk}, dtype::boolean);
    for (std::int64_t i = 0; i < m.numel(); ++i) m.data_as<bool>()[i] = in.upto(3) != 0;
    o.attn_mask = m;
  } else if (mask == 2) {
    o.attn_mask = filled(in, {1, Hq, Nq, Nk}, dtype::f32, specials);
  }
  if (in.upto(3) == 0) {
    o.alibi_slopes = filled(in, {Hq}, dtype::f32, false);  // ±1e19 too (corpus: cpu_alibi_huge_slope_*)
  }
  if (in.upto(3) == 0) o.sinks = filled(in, {Hq}, dtype::f32, false);
  if (in.upto(3) == 0) {
    Tensor n = Tensor::empty({B}, dtype::i64);
    for (std::int64_t b = 0; b < B; ++b) n.data_as<std::int64_t>()[b] = in.upto(int(Nk));
    o.nonpad_kv_seqlen = n;
  }
  // Last, so the corpus written before it keeps its meaning (no byte left: none).
  const qk_output stages[] = {qk_output::none, qk_output::scaled, qk_output::softcapped, qk_output::biased,
                              qk_output::probabilities};
  o.return_qk = stages[in.upto(4)];

  if (std::getenv("ATTN_FUZZ_VERBOSE"))  // what a finding ran: rerun its artifact with this set
    std::fprintf(stderr, "%s B%ld Hq%ld Hkv%ld Nq%ld Nk%ld D%ld Dv%ld causal %d align %d window %ld %ld softcap %g scale %g mask %d alibi %d sinks %d nonpad %d return_qk %d\n",
                 std::string(dtype_name(t)).c_str(), long(B), long(Hq), long(Hkv), long(Nq), long(Nk), long(D), long(Dv),
                 int(o.is_causal), int(o.alignment), long(o.window_left), long(o.window_right), o.softcap,
                 o.scale.value_or(-99), mask, int(o.alibi_slopes.has_value()), int(o.sinks.has_value()),
                 int(o.nonpad_kv_seqlen.has_value()), int(o.return_qk));
  if (std::getenv("ATTN_FUZZ_DUMP")) {
    write_npy("/tmp/fuzz_q.npy", q), write_npy("/tmp/fuzz_k.npy", k), write_npy("/tmp/fuzz_v.npy", v);
    if (o.attn_mask) write_npy("/tmp/fuzz_mask.npy", *o.attn_mask);
    if (o.alibi_slopes) write_npy("/tmp/fuzz_alibi.npy", *o.alibi_slopes);
  }
  std::optional<attention_result> cpu, ref;
  std::string cpu_err, ref_err;
  try { cpu = attention(q, k, v, o, {.use_backend = backend::cpu, .num_threads = 1}); } catch (const error& e) { cpu_err = e.what(); }
  try { ref = attention(q, k, v, o, {.use_backend = backend::reference}); } catch (const error& e) { ref_err = e.what(); }
  if (cpu_err.empty() != ref_err.empty()) finding("forward error on one backend only", cpu_err + " | " + ref_err);
  if (!cpu) return 0;
  if (o.return_qk == qk_output::none) {  // the cpu forward into strided destinations: the same bits
    padded out(cpu->out.shape(), cpu->out.type()), lse(cpu->lse.shape(), cpu->lse.type());
    attention_into(q, k, v, {.out = out.view, .lse = lse.view}, o, {.use_backend = backend::cpu, .num_threads = 1});
    same_bits("attention_into out", out.view, cpu->out);
    same_bits("attention_into lse", lse.view, cpu->lse);
  }
  // The float64 truth: the reference on float64 copies of the same values.
  const Tensor q8 = q.to(dtype::f64), k8 = k.to(dtype::f64), v8 = v.to(dtype::f64), d8 = dout.to(dtype::f64);
  const attention_result truth = attention(q8, k8, v8, o, {.use_backend = backend::reference});
  // The truth checks itself: without sinks, the weights of a row that sees some key sum to 1, so
  // v = 1 gives out = 1 (a float64 p = e^{s - lse} once gave two keys tied at 2e19 weight 1 each).
  if (!o.sinks) {
    const Tensor ones = Tensor::full(v8.shape(), dtype::f64, 1.0);
    const attention_result unit = attention(q8, k8, ones, o, {.use_backend = backend::reference});
    const std::vector<double> u = unit.out.to_vector(), l = unit.lse.to_vector();
    for (std::size_t i = 0; i < u.size(); ++i) {
      const double lse = l[i / std::size_t(Dv)];
      const double want = std::isnan(lse) ? NAN : lse == -INFINITY ? 0.0 : 1.0;
      if (!(std::isnan(want) ? std::isnan(u[i]) : std::abs(u[i] - want) <= 1e-9))
        finding("truth weights do not sum to 1", std::to_string(u[i]) + " at " + std::to_string(i));
    }
  }
  const double tol = tol_for(t);
  const auto finite_max = [](const TensorView& x) {
    double m = 0;
    for (double y : to_vector(x)) if (std::isfinite(y)) m = std::max(m, std::abs(y));
    return m;
  };
  // The largest term a score adds up: q·k (times the scale), the float mask, ALiBi's slope times
  // a distance (at most Nq + Nk). float32 resolves a score to that magnitude · 2^-24 even where
  // the terms cancel to a small score (a mask of 1e19 against an ALiBi bias of -1e19), and the
  // backends may add the terms in different orders (attention.h, "Finite but huge scores").
  double mag = finite_max(q) * finite_max(k) * double(D) * (o.scale ? std::abs(*o.scale) : 1.0);
  if (o.attn_mask && o.attn_mask->type() != dtype::boolean) mag += finite_max(*o.attn_mask);
  if (o.alibi_slopes) mag += finite_max(*o.alibi_slopes) * double(Nq + Nk);
  // Scores past |s| = 1024 are resolved by float32 to worse than 2^-13: weights of nearly tied
  // keys may then differ from float64 (documented in attention.h); the cpu is held to the
  // NaN/inf pattern only there. Below that, its weights are off by up to ~2^-24 · mag each.
  double lmax = 0;
  for (double x : truth.lse.to_vector()) if (std::isfinite(x)) lmax = std::max(lmax, std::abs(x));
  const double ctol = lmax > 1024 ? INFINITY : std::max(tol, 8 * std::ldexp(mag, -24));
  // out = Σ_j α_j v_j may cancel terms far larger than itself (v = ±1e19 at two keys of equal
  // weight: a float32 α off by one ulp leaves 1e19 · 6e-8 · α, on a truth of 0); float32 resolves
  // out only to its share of Σ_j α_j |v_j|, the truth's output for |v|.
  std::vector<double> out_mag = attention(q8, k8, abs_f64(v8), o, {.use_backend = backend::reference}).out.to_vector();
  // Where float32 resolves a score only to worse than 1/2 (terms of ±1e19 that cancel to a small
  // score: its small terms lost to the order of the sum), a weight may be off by a factor e^ctol,
  // not by ctol: out is then some mix of v's rows, held to the largest |v| (corpus:
  // cpu_qk_cancelled_terms_weights_unresolved).
  if (ctol > 0.5) {
    const double vmax = finite_max(v);
    for (double& m : out_mag) m = std::max(m, vmax);
  }
  compare("cpu out", cpu->out, truth.out, ctol, &out_mag);
  compare("reference out", ref->out, truth.out, tol, &out_mag);
  // The float32 lse is s + log Σ exp(s - s_max) summed in float32: its error scales with the
  // largest addend (mag), not with the lse, which may be a small difference of large terms.
  // tol (1 + |lse|) then holds with |lse| raised to that magnitude.
  const double lse_tol = lmax > 1024 ? INFINITY : 1e-5 * (1 + mag) / (1 + lmax);
  compare("cpu lse", cpu->lse, truth.lse, lse_tol > 1e-5 ? lse_tol : 1e-5);
  compare("reference lse", ref->lse, truth.lse, 1e-6);
  if (o.return_qk != qk_output::none) {
    // Scores carry float32's resolution of their largest term (mag) and the dtype's rounding;
    // probabilities are weights, held as out is.
    const std::vector<double> score_mag(std::size_t(truth.qk.numel()), mag);
    if (o.return_qk == qk_output::probabilities) compare("cpu probabilities", cpu->qk, truth.qk, ctol);
    else compare("cpu scores", cpu->qk, truth.qk, std::max(tol, 8 * std::ldexp(1.0, -24)), &score_mag);
    o.return_qk = qk_output::none;  // the backward takes none
  }

  if (o.attn_mask && o.attn_mask->type() != dtype::boolean) return 0;  // dmask: reference only
  const attention_grads gc = attention_backward(q, k, v, cpu->out, dout, cpu->lse, o, {.use_backend = backend::cpu, .num_threads = 1});
  {  // the cpu backward into strided destinations: the same bits
    padded dq(q.shape(), t), dk(k.shape(), t), dv(v.shape(), t);
    attention_backward_into(q, k, v, cpu->out, dout, cpu->lse, {.dq = dq.view, .dk = dk.view, .dv = dv.view}, o,
                            {.use_backend = backend::cpu, .num_threads = 1});
    same_bits("attention_backward_into dq", dq.view, gc.dq);
    same_bits("attention_backward_into dk", dk.view, gc.dk);
    same_bits("attention_backward_into dv", dv.view, gc.dv);
  }
  const attention_grads gr = attention_backward(q, k, v, ref->out, dout, ref->lse, o, {.use_backend = backend::reference});
  const attention_grads g8 = attention_backward(q8, k8, v8, truth.out, d8, truth.lse, o, {.use_backend = backend::reference});
  // The stated bound of the float32 backward (special_values_test): grows with |lse|.
  double gmax = 1;
  for (const Tensor* g : {&g8.dq, &g8.dk, &g8.dv})
    for (double x : g->to_vector()) if (std::isfinite(x)) gmax = std::max(gmax, std::abs(x));
  // gscale: the gradients' own scale, or that of the cancelling difference dp - Δ in ds.
  const auto amax = [](const Tensor& x) {
    double m = 0;
    for (double y : x.to_vector()) if (std::isfinite(y)) m = std::max(m, std::abs(y));
    return m;
  };
  const double sc = o.scale ? std::abs(*o.scale) : 1.0 / std::sqrt(double(D));
  const double gscale = std::max(gmax, sc * amax(d8) * amax(v8) * std::max(amax(q8), amax(k8)) * double(Dv));
  const double btol = (t == dtype::f32 ? 1e-5 : 4 * tol) * (1 + lmax) * gscale;
  compare("cpu dq", gc.dq, g8.dq, btol);
  compare("cpu dk", gc.dk, g8.dk, btol);
  // dv = Pᵀ dout may likewise cancel terms far larger than itself (dout = ±1e19 on two rows that
  // each weigh a key fully): float32 resolves dv only to its share of Σ_i p_ij |dout_i|, the
  // truth's dv for |dout| (corpus: dv_cancelling_dout_06708eac).
  const std::vector<double> dv_mag =
      attention_backward(q8, k8, v8, truth.out, abs_f64(d8), truth.lse, o, {.use_backend = backend::reference}).dv.to_vector();
  compare("cpu dv", gc.dv, g8.dv, btol, &dv_mag);
  compare("reference dq", gr.dq, g8.dq, btol);
  compare("reference dk", gr.dk, g8.dk, btol);
  compare("reference dv", gr.dv, g8.dv, btol, &dv_mag);
  return 0;
}

// src/family/front.cc — the front of attention_family: the checks every score shares (q, k, v,
// heads, the masks through the core op's own front, the distribution and how it meets the
// score), the choice of path, and the orchestration around the score's own checks, preparation
// and chain rule (scores/<score>.cc, listed in scores/table.cc):
//   core       attn::attention on what the score prepares (for dot and scaled_dot: the user's
//              own q, k, v), then attention_backward and the score's core_backward
//   tiled      q, k, v copied to float64, prepared, the tiled kernels, the score's backward
//   fused      as tiled, the prepared vectors in f32 on the fused SIMD kernels (fused.cc), for
//              dot-product scores; `automatic` takes it where it runs (fused_why_not). For dot
//              and scaled_dot (score_def::fused_direct) the kernels read the user's q, k, v
//              and write the result tensors: no float64 copy at all
//   reference  as tiled, with the reference kernels (the oracle)
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "attn/error.h"
#include "attn/family.h"
#include "core/common.h"
#include "cpu/bf16_words.h"
#include "family/family_impl.h"
#include "family/scores/score.h"

namespace attn {
namespace detail::family {
namespace {

// One validated call: what the score sees, its checked parameters, and the problem of the
// kernels (masks and distribution; the tiled route adds the prepared vectors).
struct call {
  score_call c;
  const score_def* def = nullptr;
  score_state st;
  fproblem fp;
  family_path path = family_path::tiled;
  bool automatic = false;  // the path was not asked for: fused replaces tiled where it runs
};

// The path asked for: exec.path, or ATTN_FAMILY_PATH where exec leaves it automatic.
family_path requested_path(const execution& exec) {
  family_path want = exec.path;
  if (want == family_path::automatic) {
    const char* env = std::getenv("ATTN_FAMILY_PATH");
    if (env && *env && std::string_view(env) != "automatic") want = parse_family_path(env);
  }
  return want;
}

family_path resolve_path(const char* op, const family_options& o, const execution& exec, bool core_ok,
                         bool& automatic) {
  family_path want = requested_path(exec);
  automatic = want == family_path::automatic;
  if (want == family_path::core && !core_ok)
    fail(op, fmt::format("path core runs only {} scores with softmax (got {} with {})", core_score_names(),
                         to_string(o.score.kind), to_string(o.distribution.kind)));
  if (want == family_path::automatic) want = core_ok ? family_path::core : family_path::tiled;
  return want;
}

// Checks every argument (those of the score through its own `check`) and picks the path.
void validate(const char* op, const TensorView& q, const TensorView& k, const TensorView& v, const family_options& o,
              const execution& exec, call& C) {
  detail::check_qkv_types(op, q, k, v);
  std::int64_t Hq = 0, Hkv = 0;
  if (q.rank() == 3) {
    Hq = o.q_num_heads, Hkv = o.kv_num_heads;
    if (Hq <= 0 || Hkv <= 0)
      fail(op, fmt::format("3-D inputs need q_num_heads and kv_num_heads > 0 (got {} and {})", Hq, Hkv));
    for (auto [name, t, H] : {std::tuple{"q", &q, Hq}, {"k", &k, Hkv}, {"v", &v, Hkv}})
      if (t->size(2) % H)
        fail(op, fmt::format("{} hidden size {} is not a multiple of its {} heads", name, t->size(2), H));
  } else {
    Hq = q.size(1), Hkv = k.size(1);
    if (o.q_num_heads && o.q_num_heads != Hq)
      fail(op, fmt::format("q_num_heads = {} but 4-D q {} has {} heads", o.q_num_heads, shape_str(q.shape()), Hq));
    if (o.kv_num_heads && o.kv_num_heads != Hkv)
      fail(op, fmt::format("kv_num_heads = {} but 4-D k {} has {} heads", o.kv_num_heads, shape_str(k.shape()), Hkv));
  }
  if (Hq <= 0 || Hkv <= 0 || Hq % Hkv)
    fail(op, fmt::format("q has {} heads and k/v {}; Hq must be a positive multiple of Hkv", Hq, Hkv));
  // [B, H, N, X] of a q/k/v-like view with H heads.
  auto dims = [](const TensorView& t, std::int64_t H) {
    return t.rank() == 4 ? std::array{t.size(0), t.size(1), t.size(2), t.size(3)}
                         : std::array{t.size(0), H, t.size(1), t.size(2) / H};
  };
  const auto qd = dims(q, Hq), kd = dims(k, Hkv), vd = dims(v, Hkv);
  if (kd[0] != qd[0] || vd[0] != qd[0])
    fail(op, fmt::format("batch sizes differ: q {}, k {}, v {}", qd[0], kd[0], vd[0]));
  if (vd[1] != kd[1] || vd[2] != kd[2])
    fail(op, fmt::format("v has shape {}, k has shape {}; they need the same heads and keys", shape_str(v.shape()),
                         shape_str(k.shape())));
  score_call& c = C.c;
  c.op = op;
  c.spec = &o.score;
  c.B = qd[0], c.Hq = Hq, c.Hkv = Hkv, c.Nq = qd[2], c.Nk = kd[2], c.D = qd[3], c.Dk = kd[3], c.Dv = vd[3];
  c.rank = q.rank(), c.type = q.type();
  const std::int64_t B = c.B, Nq = c.Nq, Nk = c.Nk, D = c.D, Dv = c.Dv;

  // Masks: the semantics of attn::attention, through its own front (on stand-in views).
  fproblem& fp = C.fp;
  {
    attention_options ao;
    static_cast<masking_options&>(ao) = o;
    ao.scale = 1.0;
    const TensorView sq(q.data(), q.type(), {B, Hq, Nq, D}, {0, 0, 0, 0});
    const TensorView sk(k.data(), q.type(), {B, Hkv, Nk, D}, {0, 0, 0, 0});
    const TensorView sv(v.data(), q.type(), {B, Hkv, Nk, Dv}, {0, 0, 0, 0});
    ao.check_finite = false;  // the stand-in views hold no values
    fp.p = build_problem(op, sq, sk, sv, ao, exec, fp.store);
  }
  fp.B = B, fp.Hq = Hq, fp.Hkv = Hkv, fp.Nq = Nq, fp.Nk = Nk, fp.Dv = Dv;
  c.threads = std::max(1, fp.p.num_threads);

  // Score: what every score shares.
  const score_spec& sc = o.score;
  C.def = &score_of(op, sc.kind);
  const score_def& def = *C.def;
  c.name = to_string(sc.kind);
  const std::string& sname = c.name;
  if (def.same_head_size && D != c.Dk)
    fail(op, fmt::format("score {} needs q and k of the same head size (q has {}, k has {})", sname, D, c.Dk));
  // Parameters a score does not read are refused, so a typo does not silently do nothing.
  const std::pair<const char*, bool> given[] = {{"W", bool(sc.W)},     {"b", bool(sc.b)},     {"W_q", bool(sc.W_q)},
                                                {"W_k", bool(sc.W_k)}, {"w_v", bool(sc.w_v)}, {"W_a", bool(sc.W_a)}};
  const std::string takes(def.params);
  for (auto [name, is_given] : given)
    if (is_given && (" " + takes + " ").find(" " + std::string(name) + " ") == std::string::npos)
      fail(op, fmt::format("score {} takes no parameter {} (it takes: {})", sname, name, takes.empty() ? "none" : takes));
  if (sc.scale && sc.kind != score_kind::scaled_dot) fail(op, fmt::format("scale is a scaled_dot option; score is {}", sname));

  // Distribution, and how it meets the score.
  const distribution_spec& ds = o.distribution;
  const int di = int(ds.kind);
  if (di < 0 || di > int(distribution_kind::identity))
    fail(op, fmt::format("distribution kind {} is not a distribution", di));
  fp.dist = ds.kind;
  if (ds.kind == distribution_kind::kernel) {
    if (def.kernel == kernel_role::none)
      fail(op, fmt::format("distribution kernel needs a gaussian, box or triangle score (got {})", sname));
    if (def.kernel == kernel_role::log) fp.dist = distribution_kind::softmax;  // softmax of the log-kernel
    else if (fp.p.mask == mask_kind::additive)
      fail(op, fmt::format("distribution kernel with score {} takes a bool attn_mask only (got a {} mask): the "
                           "kernel weights are not logits",
                           sname, dtype_name(o.attn_mask->type())));
  }
  if (ds.kind == distribution_kind::topk && ds.k < 1) fail(op, fmt::format("topk needs k >= 1 (got k = {})", ds.k));
  fp.topk = ds.k;
  fp.hardmax_grad = ds.hardmax_grad;
  fp.sigmoid_bias = ds.sigmoid_bias ? *ds.sigmoid_bias : (Nk > 0 ? -std::log(double(Nk)) : 0.0);
  if (!std::isfinite(fp.sigmoid_bias)) fail(op, fmt::format("sigmoid_bias = {} is not finite", fp.sigmoid_bias));
  c.dist = fp.dist;
  c.shift_invariant = fp.dist != distribution_kind::sigmoid && fp.dist != distribution_kind::kernel &&
                      fp.dist != distribution_kind::identity;

  // Score: its own options and parameters.
  def.check(c, C.st);
  C.path = resolve_path(op, o, exec,
                        fp.dist == distribution_kind::softmax && def.core_prepare && (!def.core_when || def.core_when(c)),
                        C.automatic);
}

// Once prepared: `automatic` takes fused over tiled where the fused kernels run; fused asked
// for where they do not is an error saying why.
void settle_fused(call& C) {
  if (C.path != family_path::fused && !(C.path == family_path::tiled && C.automatic)) return;
  const std::string why = fused_why_not(C.fp, C.c.type);
  if (C.path == family_path::fused && !why.empty()) fail(C.c.op, fmt::format("path fused: {}", why));
  if (why.empty()) C.path = family_path::fused;
}

// Tiled and reference routes: q, k, v to float64, prepared by the score into C.fp. Returns the
// float64 q, k the score's backward reads.
f64_qkv prepare_f64(call& C, const TensorView& q, const TensorView& k, const TensorView& v) {
  const score_call& c = C.c;
  f64_qkv in{load_bhnx(q, c.B, c.Hq, c.Nq, c.D), load_bhnx(k, c.B, c.Hkv, c.Nk, c.Dk), {}};
  C.def->prepare(c, C.st, in, C.fp);
  C.fp.V = load_bhnx(v, c.B, c.Hkv, c.Nk, c.Dv);
  settle_fused(C);
  return in;
}

// The fused path on the user's own views (score_def::fused_direct), when the call takes the
// fused path: no float64 copies. Returns the source; not direct when the caller must prepare.
fused_source prepare_direct(call& C, const TensorView& q, const TensorView& k, const TensorView& v) {
  const score_call& c = C.c;
  const bool fused_wanted = C.path == family_path::fused || (C.path == family_path::tiled && C.automatic);
  if (!C.def->fused_direct || c.type == dtype::f64 || !fused_wanted) return {};
  C.fp.Pq = C.fp.Pk = c.D;  // kernel dot, identity activation, no bias: fproblem's defaults
  if (C.def->direct_prepare) C.def->direct_prepare(c, C.st, C.fp);
  settle_fused(C);
  if (C.path != family_path::fused) return {};
  return {true, as_bhnx(q, c.Hq), as_bhnx(k, c.Hkv), as_bhnx(v, c.Hkv), C.st.scale};
}

// The identity distribution over dot and scaled_dot scores, where the path was not asked for,
// every row's keys are a prefix (no attn_mask, no window) and q, k, v are finite: linear
// attention with φ = identity (linear.cc), by associativity — Σ_j (q_i·k_j) v_j = q_iᵀ Σ_j k_j v_jᵀ,
// O(N·D·Dv) where the pairwise kernels are O(Nq·Nk·D). A NaN or ±inf goes to the pairwise
// kernels, whose special values follow the family's contract pair by pair.
bool by_associativity(const call& C, const family_options& o, const TensorView& q, const TensorView& k,
                      const TensorView& v) {
  const score_call& c = C.c;
  const score_kind kind = c.spec->kind;
  if (!C.automatic || C.fp.dist != distribution_kind::identity) return false;
  if (kind != score_kind::dot && kind != score_kind::scaled_dot) return false;
  if (o.attn_mask || o.window_left >= 0 || o.window_right >= 0) return false;
  const int nt = std::max(1, C.fp.p.num_threads);
  return cpu::view_all_finite(as_bhnx(q, c.Hq), c.B, c.Hq, c.Nq, c.D, nt) &&
         cpu::view_all_finite(as_bhnx(k, c.Hkv), c.B, c.Hkv, c.Nk, c.Dk, nt) &&
         cpu::view_all_finite(as_bhnx(v, c.Hkv), c.B, c.Hkv, c.Nk, c.Dv, nt);
}
linear_attention_options identity_linear_options(const family_options& o) {
  linear_attention_options lo;
  static_cast<masking_options&>(lo) = o;
  lo.phi = feature_map::identity, lo.normalize = false;
  return lo;
}

// The options of attn::attention on the core route: the masks, and the score's scale.
attention_options core_options(const family_options& o, const core_qkv& in) {
  attention_options ao;
  static_cast<masking_options&>(ao) = o;
  ao.scale = in.scale;
  ao.softcap = in.softcap;
  ao.mask_gradient = false;  // family_grads has no mask gradient
  return ao;
}

}  // namespace
}  // namespace detail::family

using namespace detail::family;
using detail::as_bhnx;
using detail::fail;

family_result attention_family(const TensorView& q, const TensorView& k, const TensorView& v,
                               const family_options& options, const execution& exec) {
  call C;
  validate("attention_family", q, k, v, options, exec, C);
  const score_call& c = C.c;
  family_result r;
  if (by_associativity(C, options, q, k, v)) {
    linear_attention_result l =
        linear_scaled("attention_family", q, k, v, identity_linear_options(options), C.st.scale, exec);
    r.out = std::move(l.out);
    r.path = fmt::format("{}: identity by associativity, q·(Kᵀv)", l.path);
    return r;
  }
  if (C.path == family_path::core) {
    const core_qkv in = C.def->core_prepare(c, C.st, q, k, v);
    const attention_result a = attention(in.q, in.k, in.v, core_options(options, in), exec);
    r.out = to_dtype(a.out, c.type);
    r.lse = a.lse;
    r.path = fmt::format("core ({})", a.backend);
    return r;
  }
  fused_source src = prepare_direct(C, q, k, v);
  if (!src.direct) prepare_f64(C, q, k, v);
  if (C.path == family_path::fused) {
    r.out = empty_bhnx(c.B, c.Hq, c.Nq, c.Dv, c.rank, c.type);
    if (fused_keeps_stats(C.fp))  // [B, Hq, Nq], multi-dimensional [B, Hq, Nq, Dv]
      r.lse = Tensor::empty(C.fp.F > 1 ? Shape{c.B, c.Hq, c.Nq, c.Dv} : Shape{c.B, c.Hq, c.Nq}, dtype::f32);
    kept_rows kept;
    r.path = fmt::format("fused ({})", fused_forward(C.fp, src, as_bhnx(r.out, c.Hq),
                                                     r.lse.defined() ? static_cast<float*>(r.lse.data()) : nullptr,
                                                     &kept));
    if (kept.K > 0) {
      r.kept_index = Tensor::empty({c.B, c.Hq, c.Nq, kept.K}, dtype::i64);
      r.kept_weight = Tensor::empty({c.B, c.Hq, c.Nq, kept.K}, dtype::f32);
      auto* ix = static_cast<std::int64_t*>(r.kept_index.data());
      std::copy(kept.idx.begin(), kept.idx.end(), ix);
      std::copy(kept.alpha.begin(), kept.alpha.end(), static_cast<float*>(r.kept_weight.data()));
    }
    return r;
  }
  std::vector<double> out;
  if (C.path == family_path::reference) reference_forward(C.fp, out, nullptr);
  else tiled_forward(C.fp, out);
  r.out = store_bhnx(out, c.B, c.Hq, c.Nq, c.Dv, c.rank, c.type);
  if (r.path.empty()) r.path = std::string(to_string(C.path));
  return r;
}

namespace {

// The keys a forward kept (family_result::kept_index, kept_weight), checked against the call:
// both or neither, [B, Hq, Nq, K] with K what the distribution keeps, indices int64 in [0, Nk)
// rising along each row, then -1 to its end.
void check_kept(const char* op, const family_result& fwd, const call& C) {
  const score_call& c = C.c;
  if (!fwd.kept_index.defined() && !fwd.kept_weight.defined()) return;
  if (fwd.kept_index.defined() != fwd.kept_weight.defined())
    fail(op, fmt::format("forward.kept_index is {} but forward.kept_weight is {} (give both or neither)",
                         fwd.kept_index.defined() ? "given" : "empty", fwd.kept_weight.defined() ? "given" : "empty"));
  const bool sparse = C.fp.dist == distribution_kind::hardmax || C.fp.dist == distribution_kind::topk;
  if (!sparse)
    fail(op, fmt::format("forward.kept_index is given, but distribution {} keeps no key set (hardmax and topk do)",
                         to_string(C.fp.dist)));
  const std::int64_t K = C.fp.dist == distribution_kind::hardmax ? 1 : C.fp.topk;
  const Shape ks{c.B, c.Hq, c.Nq, K};
  if (fwd.kept_index.shape() != ks)
    fail(op, fmt::format("forward.kept_index has shape {}, expected {} (B, Hq, Nq, K)", shape_str(fwd.kept_index.shape()),
                         shape_str(ks)));
  if (fwd.kept_weight.shape() != ks)
    fail(op, fmt::format("forward.kept_weight has shape {}, expected {} (B, Hq, Nq, K)",
                         shape_str(fwd.kept_weight.shape()), shape_str(ks)));
  if (fwd.kept_index.type() != dtype::i64)
    fail(op, fmt::format("forward.kept_index has dtype {}, expected int64", dtype_name(fwd.kept_index.type())));
  if (!is_floating(fwd.kept_weight.type()))
    fail(op, fmt::format("forward.kept_weight has dtype {}, expected a float dtype", dtype_name(fwd.kept_weight.type())));
  const Tensor ix = fwd.kept_index.view().is_contiguous() ? fwd.kept_index : Tensor::copy_of(fwd.kept_index.view());
  const auto* p = static_cast<const std::int64_t*>(ix.data());
  for (std::int64_t r = 0; r < c.B * c.Hq * c.Nq; ++r) {
    std::int64_t last = -1;
    bool ended = false;
    for (std::int64_t e = 0; e < K; ++e) {
      const std::int64_t j = p[r * K + e];
      const bool ok = ended ? j == -1 : (j == -1 || (j > last && j < c.Nk));
      if (!ok)
        fail(op, fmt::format("forward.kept_index row {} entry {} is {}: expected keys in [0, {}) rising along the row, "
                             "then -1",
                             r, e, j, c.Nk));
      if (j == -1) ended = true;
      else last = j;
    }
  }
}

// The checked kept keys as the fused backward reads them (g = 1: kept_reusable).
kept_rows kept_of(const family_result& fwd, const score_call& c) {
  const std::int64_t K = fwd.kept_index.shape()[3], n = c.B * c.Hq * c.Nq * K;
  const Tensor ix = fwd.kept_index.view().is_contiguous() ? fwd.kept_index : Tensor::copy_of(fwd.kept_index.view());
  const Tensor w = fwd.kept_weight.type() == dtype::f32 && fwd.kept_weight.view().is_contiguous()
                       ? fwd.kept_weight
                       : fwd.kept_weight.to(dtype::f32);
  const auto* p = static_cast<const std::int64_t*>(ix.data());
  const auto* a = static_cast<const float*>(w.data());
  kept_rows kr;
  kr.K = K;
  kr.idx.assign(p, p + n), kr.alpha.assign(a, a + n), kr.g.assign(std::size_t(n), 1.0f);
  kr.cnt.assign(std::size_t(c.B * c.Hq * c.Nq), 0);
  for (std::int64_t r = 0; r < c.B * c.Hq * c.Nq; ++r)
    for (std::int64_t e = 0; e < K && p[r * K + e] >= 0; ++e) ++kr.cnt[std::size_t(r)];
  return kr;
}

// The backward of both entry points; `fwd`: the forward's result, or null.
family_grads family_backward(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& dout,
                             const family_result* fwd, const family_options& options, const execution& exec) {
  const char* op = "attention_family_backward";
  call C;
  validate(op, q, k, v, options, exec, C);
  const score_call& c = C.c;
  const Shape os = c.rank == 4 ? Shape{c.B, c.Hq, c.Nq, c.Dv} : Shape{c.B, c.Nq, c.Hq * c.Dv};
  if (dout.shape() != os)
    fail(op, fmt::format("dout has shape {}, expected {} (the shape of out)", shape_str(dout.shape()), shape_str(os)));
  if (!is_floating(dout.type())) fail(op, fmt::format("dout has dtype {}, expected a float dtype", dtype_name(dout.type())));

  family_grads g;
  if (by_associativity(C, options, q, k, v)) {
    linear_attention_grads l =
        linear_scaled_backward(op, q, k, v, dout, identity_linear_options(options), C.st.scale, exec);
    g.dq = std::move(l.dq), g.dk = std::move(l.dk), g.dv = std::move(l.dv);
    g.path = fmt::format("{}: identity by associativity, q·(Kᵀv)", l.path);
    return g;
  }
  if (fwd) {  // the forward's result: its out (the shape of dout) and, where given, its lse
    if (fwd->out.shape() != os)
      fail(op, fmt::format("forward.out has shape {}, expected {} (the shape of out)", shape_str(fwd->out.shape()),
                           shape_str(os)));
    const bool md = C.st.w_v.view && C.st.w_v.view->rank() == 2;  // multi-dimensional additive (F = Dv)
    const Shape ls = md ? Shape{c.B, c.Hq, c.Nq, c.Dv} : Shape{c.B, c.Hq, c.Nq};
    if (fwd->lse.defined() && fwd->lse.shape() != ls)
      fail(op, fmt::format("forward.lse has shape {}, expected {} ({})", shape_str(fwd->lse.shape()), shape_str(ls),
                           md ? "B, Hq, Nq, Dv: multi-dimensional" : "B, Hq, Nq"));
    check_kept(op, *fwd, C);
  }
  if (C.path == family_path::core) {
    C.c.backward = true;
    const core_qkv in = C.def->core_prepare(c, C.st, q, k, v);
    const attention_options ao = core_options(options, in);
    attention_result a;
    if (fwd && fwd->lse.defined()) a.out = fwd->out, a.lse = fwd->lse;
    else a = attention(in.q, in.k, in.v, ao, exec);
    attention_grads cg;
    if (in.f32_grads) {
      Tensor dq = Tensor::empty(in.q.shape(), dtype::f32), dk = Tensor::empty(in.k.shape(), dtype::f32),
             dv = Tensor::empty(in.v.shape(), dtype::f32);
      cg = attention_backward_into(in.q, in.k, in.v, a.out, dout, a.lse, {dq.view(), dk.view(), dv.view()}, ao, exec);
      cg.dq = dq, cg.dk = dk, cg.dv = dv;
    } else {
      cg = attention_backward(in.q, in.k, in.v, a.out, dout, a.lse, ao, exec);
    }
    g.dv = to_dtype(cg.dv, c.type);
    C.def->core_backward(c, C.st, q, k, in, cg, g);
    g.path = fmt::format("core ({})", cg.backend);
    return g;
  }
  const fused_source src = prepare_direct(C, q, k, v);
  // The fused forward's statistics, where it kept them (f32 [B, Hq, Nq], read contiguous).
  Tensor saved_lse;
  fused_saved saved;
  const auto saved_of = [&]() -> const fused_saved* {
    if (fwd && fwd->kept_index.defined() && kept_reusable(C.fp)) {
      saved.kept = kept_of(*fwd, c);
      return &saved;
    }
    if (!fwd || !fwd->lse.defined() || !fused_keeps_stats(C.fp)) return nullptr;
    saved_lse = fwd->lse.type() == dtype::f32 && fwd->lse.view().is_contiguous() ? fwd->lse : fwd->lse.to(dtype::f32);
    saved.log_norm = static_cast<const float*>(saved_lse.data());
    saved.out = as_bhnx(fwd->out, c.Hq);
    return &saved;
  };
  grad_acc acc;
  if (src.direct) {  // the kernels write dq = scale·dQp, dk, dv into the result tensors
    new_dq_dk(c, g);
    g.dv = empty_bhnx(c.B, c.Hkv, c.Nk, c.Dv, c.rank, c.type);
    const fused_grad_sink sink{as_bhnx(g.dq, c.Hq), as_bhnx(g.dk, c.Hkv), as_bhnx(g.dv, c.Hkv), src.scale};
    g.path = fmt::format("fused ({})", fused_backward(C.fp, src, as_bhnx(dout, c.Hq), sink, acc, saved_of()));
    g.dsigmoid_bias = acc.dsigmoid_bias;
    g.dbandwidth = acc.dh;  // triangle
    return g;
  }
  const f64_qkv in = prepare_f64(C, q, k, v);
  std::vector<double> dQp;
  if (C.path == family_path::fused) {
    const fproblem& fp = C.fp;
    dQp.assign(std::size_t(fp.B * fp.Hq * fp.Nq * fp.Pq), 0.0);
    acc.init(fp);
    const fused_grad_sink sink{rows_of(dQp, fp.Hq, fp.Nq, fp.Pq), rows_of(acc.dKp, fp.Hkv, fp.Nk, fp.Pk),
                               rows_of(acc.dV, fp.Hkv, fp.Nk, fp.Dv)};
    g.path = fmt::format("fused ({})", fused_backward(fp, src, as_bhnx(dout, c.Hq), sink, acc, saved_of()));
  } else {
    const std::vector<double> dO = load_bhnx(dout, c.B, c.Hq, c.Nq, c.Dv);
    if (C.path == family_path::reference) reference_backward(C.fp, dO, dQp, acc), g.path = "reference";
    else tiled_backward(C.fp, dO, dQp, acc), g.path = "tiled";
  }
  std::vector<double> dq(std::size_t(c.rows_q() * c.D), 0.0), dk(std::size_t(c.rows_k() * c.Dk), 0.0);
  C.def->backward(c, C.st, in, C.fp, dQp, acc, dq, dk, g);
  g.dsigmoid_bias = acc.dsigmoid_bias;
  g.dq = store_bhnx(dq, c.B, c.Hq, c.Nq, c.D, c.rank, c.type);
  g.dk = store_bhnx(dk, c.B, c.Hkv, c.Nk, c.Dk, c.rank, c.type);
  g.dv = store_bhnx(acc.dV, c.B, c.Hkv, c.Nk, c.Dv, c.rank, c.type);
  return g;
}

}  // namespace

family_grads attention_family_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& dout, const family_options& options,
                                       const execution& exec) {
  return family_backward(q, k, v, dout, nullptr, options, exec);
}

family_grads attention_family_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& dout, const family_result& forward,
                                       const family_options& options, const execution& exec) {
  return family_backward(q, k, v, dout, &forward, options, exec);
}

Tensor attention_family_weights(const TensorView& q, const TensorView& k, const TensorView& v,
                                const family_options& options, const execution& exec) {
  execution e = exec;
  e.path = family_path::reference;
  call C;
  validate("attention_family_weights", q, k, v, options, e, C);
  // The fused kernels where the call would take them (or path fused is asked for: refused with
  // its reason where they do not run), else the reference.
  const family_path want = requested_path(exec);
  if (want == family_path::fused) C.path = family_path::fused;
  else if (want == family_path::automatic) C.path = family_path::tiled, C.automatic = true;
  fused_source src = prepare_direct(C, q, k, v);
  if (!src.direct) prepare_f64(C, q, k, v);
  if (C.path == family_path::fused) {
    const score_call& c = C.c;
    const std::int64_t F = C.fp.F;  // multi-dimensional: [B, Hq, Nq, Nk, F], written as rows of Nk·F
    Tensor w = Tensor::empty(F > 1 ? Shape{c.B, c.Hq, c.Nq, c.Nk, F} : Shape{c.B, c.Hq, c.Nq, c.Nk}, dtype::f64);
    fused_weights(C.fp, src, as_bhnx(F > 1 ? w.view().reshape({c.B, c.Hq, c.Nq, c.Nk * F}) : w.view(), c.Hq));
    return w;
  }
  std::vector<double> out, w;
  reference_forward(C.fp, out, &w);
  const fproblem& fp = C.fp;
  Shape s{fp.B, fp.Hq, fp.Nq, fp.Nk};
  if (fp.F > 1) s.push_back(fp.F);
  return Tensor::from_values(s, dtype::f64, w);
}

// ---- named helpers ----

family_result additive_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& W_q,
                                 const TensorView& W_k, const TensorView& b, const TensorView& w_v, family_options o,
                                const execution& exec) {
  o.score.kind = score_kind::additive;
  o.score.W_q = W_q, o.score.W_k = W_k, o.score.b = b, o.score.w_v = w_v;
  return attention_family(q, k, v, o, exec);
}
family_result general_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& W,
                                family_options o,
                                const execution& exec) {
  o.score.kind = score_kind::general;
  o.score.W = W;
  return attention_family(q, k, v, o, exec);
}
family_result cosine_attention(const TensorView& q, const TensorView& k, const TensorView& v, double temperature,
                               family_options o,
                                const execution& exec) {
  o.score.kind = score_kind::cosine;
  o.score.temperature = temperature;
  return attention_family(q, k, v, o, exec);
}
family_result location_attention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& W_a,
                                 family_options o,
                                const execution& exec) {
  o.score.kind = score_kind::location;
  o.score.W_a = W_a;
  return attention_family(q, k, v, o, exec);
}
family_result nadaraya_watson(const TensorView& q, const TensorView& k, const TensorView& v, score_kind kernel,
                              double bandwidth, family_options o,
                                const execution& exec) {
  if (kernel != score_kind::gaussian && kernel != score_kind::box && kernel != score_kind::triangle)
    throw error(fmt::format("nadaraya_watson: kernel must be gaussian, box or triangle (got {})", to_string(kernel)));
  o.score.kind = kernel;
  o.score.bandwidth = bandwidth;
  o.distribution.kind = distribution_kind::kernel;
  return attention_family(q, k, v, o, exec);
}
family_result sigmoid_attention(const TensorView& q, const TensorView& k, const TensorView& v, family_options o,
                                const execution& exec) {
  o.distribution.kind = distribution_kind::sigmoid;
  return attention_family(q, k, v, o, exec);
}
family_result sparsemax_attention(const TensorView& q, const TensorView& k, const TensorView& v, family_options o,
                                const execution& exec) {
  o.distribution.kind = distribution_kind::sparsemax;
  return attention_family(q, k, v, o, exec);
}
family_result entmax15_attention(const TensorView& q, const TensorView& k, const TensorView& v, family_options o,
                                const execution& exec) {
  o.distribution.kind = distribution_kind::entmax15;
  return attention_family(q, k, v, o, exec);
}
family_result hard_attention(const TensorView& q, const TensorView& k, const TensorView& v, family_options o,
                                const execution& exec) {
  o.distribution.kind = distribution_kind::hardmax;
  return attention_family(q, k, v, o, exec);
}
family_result topk_attention(const TensorView& q, const TensorView& k, const TensorView& v, std::int64_t k_top,
                             family_options o,
                                const execution& exec) {
  o.distribution.kind = distribution_kind::topk;
  o.distribution.k = k_top;
  return attention_family(q, k, v, o, exec);
}

}  // namespace attn

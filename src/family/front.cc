// src/family/front.cc — the front of attention_family: checks every argument, copies q, k, v
// to float64, prepares the score (family_impl.h), picks a path (attn::attention, the tiled
// kernels or the reference), and applies the chain rule back through the preparation.
#include <fmt/format.h>
#include <omp.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <map>

#include "attn/error.h"
#include "attn/family.h"
#include "core/common.h"
#include "family/family_impl.h"

namespace attn {
namespace detail::family {
namespace {


const std::array<const char*, 11> kScoreNames = {"dot",      "scaled_dot", "general", "biased_general",
                                                 "activated_general", "additive", "cosine", "location",
                                                 "gaussian", "box",        "triangle"};
const std::array<const char*, 7> kDistNames = {"softmax", "sigmoid", "sparsemax", "entmax15",
                                               "hardmax", "topk",    "kernel"};

bool same_d_score(score_kind s) {
  return s == score_kind::dot || s == score_kind::scaled_dot || s == score_kind::cosine || s == score_kind::gaussian ||
         s == score_kind::box || s == score_kind::triangle;
}
bool is_kernel_score(score_kind s) { return s == score_kind::gaussian || s == score_kind::box || s == score_kind::triangle; }

// A user tensor [B, H, N, X] (4-D) or [B, N, H*X] (3-D) copied to contiguous float64 [B, H, N, X].
struct bhnx {
  std::int64_t B = 0, H = 0, N = 0, X = 0;
  std::vector<double> data;
};

bhnx load(const TensorView& t, std::int64_t heads) {
  bhnx r;
  r.B = t.size(0);
  std::int64_t sb = t.stride(0), sh, sn, sx;
  if (t.rank() == 4) {
    r.H = t.size(1), r.N = t.size(2), r.X = t.size(3);
    sh = t.stride(1), sn = t.stride(2), sx = t.stride(3);
  } else {
    r.H = heads, r.N = t.size(1), r.X = t.size(2) / heads;
    sh = r.X * t.stride(2), sn = t.stride(1), sx = t.stride(2);
  }
  r.data.resize(std::size_t(r.B * r.H * r.N * r.X));
  std::size_t o = 0;
  for (std::int64_t b = 0; b < r.B; ++b)
    for (std::int64_t h = 0; h < r.H; ++h)
      for (std::int64_t n = 0; n < r.N; ++n)
        for (std::int64_t x = 0; x < r.X; ++x)
          r.data[o++] = load_as_double(t.data(), t.type(), b * sb + h * sh + n * sn + x * sx);
  return r;
}

// Contiguous float64 [B, H, N, X] to a tensor in the layout of `like` (4-D, or 3-D [B, N, H*X]).
Tensor store(const std::vector<double>& x, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int rank,
             dtype t) {
  if (rank == 4) return Tensor::from_values({B, H, N, X}, t, x);
  std::vector<double> y(x.size());
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t n = 0; n < N; ++n)
        for (std::int64_t c = 0; c < X; ++c)
          y[std::size_t(((b * N + n) * H + h) * X + c)] = x[std::size_t(((b * H + h) * N + n) * X + c)];
  return Tensor::from_values({B, N, H * X}, t, y);
}

// A learned parameter: checked shape, finite values, C-order float64 copy.
struct param {
  const TensorView* view = nullptr;
  std::vector<double> values;
};

param get_param(const char* op, const char* score, const char* name, const std::optional<TensorArg>& t,
                std::initializer_list<Shape> shapes, bool required = true) {
  param p;
  std::string want;
  for (const Shape& s : shapes) want += (want.empty() ? "" : " or ") + shape_str(s);
  if (!t) {
    if (required) fail(op, fmt::format("score {} needs {} of shape {}", score, name, want));
    return p;
  }
  if (!is_floating(t->type()))
    fail(op, fmt::format("{} has dtype {}, expected a float dtype", name, dtype_name(t->type())));
  bool ok = false;
  for (const Shape& s : shapes) ok |= t->shape() == s;
  if (!ok) fail(op, fmt::format("{} has shape {}, expected {} for score {}", name, shape_str(t->shape()), want, score));
  p.view = &*t;
  p.values = to_vector(*t);
  for (double x : p.values)
    if (!std::isfinite(x)) fail(op, fmt::format("{} holds a non-finite value ({})", name, x));
  return p;
}

Tensor param_grad(const param& p, const std::vector<double>& g) {
  if (!p.view) return {};
  return Tensor::from_values(p.view->shape(), p.view->type(), g);
}

// Everything the front keeps between preparation and the chain rule.
struct prepared {
  fproblem fp;
  bhnx q, k, v;
  int rank = 4;
  dtype type = dtype::f32;
  std::int64_t D = 0, Dk = 0;
  score_kind score = score_kind::scaled_dot;
  double scale = 1.0, tau = 1.0, h = 1.0;
  bool gaussian_q_term = false;  // -‖q‖²/(2h²) kept (only where the distribution is not shift-invariant)
  std::vector<double> qnorm, knorm;  // cosine
  param W, b, W_q, W_k, w_v, W_a;
  family_path path = family_path::tiled;
};

family_path resolve_path(const char* op, const family_options& o, const execution& exec, bool core_ok) {
  family_path want = exec.path;
  if (want == family_path::automatic) {
    const char* env = std::getenv("ATTN_FAMILY_PATH");
    if (env && *env && std::string_view(env) != "automatic") want = parse_family_path(env);
  }
  if (want == family_path::core && !core_ok)
    fail(op, fmt::format("path core runs only dot, scaled_dot, general, cosine and gaussian scores with softmax "
                         "(got {} with {})",
                         to_string(o.score.kind), to_string(o.distribution.kind)));
  if (want == family_path::automatic) want = core_ok ? family_path::core : family_path::tiled;
  return want;
}

void prepare(const char* op, const TensorView& q, const TensorView& k, const TensorView& v, const family_options& o,
             const execution& exec, prepared& P) {
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
  P.q = load(q, Hq), P.k = load(k, Hkv), P.v = load(v, Hkv);
  if (P.k.B != P.q.B || P.v.B != P.q.B)
    fail(op, fmt::format("batch sizes differ: q {}, k {}, v {}", P.q.B, P.k.B, P.v.B));
  if (P.v.H != P.k.H || P.v.N != P.k.N)
    fail(op, fmt::format("v has shape {}, k has shape {}; they need the same heads and keys", shape_str(v.shape()),
                         shape_str(k.shape())));
  P.rank = q.rank(), P.type = q.type();
  P.D = P.q.X, P.Dk = P.k.X;
  const std::int64_t B = P.q.B, Nq = P.q.N, Nk = P.k.N, Dv = P.v.X, D = P.D, Dk = P.Dk;

  // Masks: the semantics of attn::attention, through its own front (on stand-in views).
  attention_options ao;
  static_cast<masking_options&>(ao) = o;
  ao.scale = 1.0;
  {
    problem_storage unused;
    const TensorView sq(q.data(), q.type(), {B, Hq, Nq, D}, {0, 0, 0, 0});
    const TensorView sk(k.data(), q.type(), {B, Hkv, Nk, D}, {0, 0, 0, 0});
    const TensorView sv(v.data(), q.type(), {B, Hkv, Nk, Dv}, {0, 0, 0, 0});
    P.fp.p = build_problem(op, sq, sk, sv, ao, exec, unused);
  }

  // Score.
  const score_spec& sc = o.score;
  const int si = int(sc.kind);
  if (si < 0 || si >= int(kScoreNames.size())) fail(op, fmt::format("score kind {} is not a score", si));
  const char* sname = kScoreNames[std::size_t(si)];
  P.score = sc.kind;
  if (same_d_score(sc.kind) && D != Dk)
    fail(op, fmt::format("score {} needs q and k of the same head size (q has {}, k has {})", sname, D, Dk));
  // Parameters a score does not read are refused, so a typo does not silently do nothing.
  {
    std::string takes;  // the parameters score `kind` reads
    switch (sc.kind) {
      case score_kind::general: takes = "W"; break;
      case score_kind::biased_general:
      case score_kind::activated_general: takes = "W b"; break;
      case score_kind::additive: takes = "W_q W_k b w_v"; break;
      case score_kind::location: takes = "W_a"; break;
      default: break;
    }
    const std::pair<const char*, bool> given[] = {{"W", bool(sc.W)},     {"b", bool(sc.b)},     {"W_q", bool(sc.W_q)},
                                                  {"W_k", bool(sc.W_k)}, {"w_v", bool(sc.w_v)}, {"W_a", bool(sc.W_a)}};
    for (auto [name, is_given] : given)
      if (is_given && (" " + takes + " ").find(" " + std::string(name) + " ") == std::string::npos)
        fail(op, fmt::format("score {} takes no parameter {} (it takes: {})", sname, name, takes.empty() ? "none" : takes));
  }
  if (sc.scale && sc.kind != score_kind::scaled_dot) fail(op, fmt::format("scale is a scaled_dot option; score is {}", sname));
  fproblem& fp = P.fp;
  fp.B = B, fp.Hq = Hq, fp.Hkv = Hkv, fp.Nq = Nq, fp.Nk = Nk, fp.Dv = Dv;
  fp.V = P.v.data;
  fp.F = 1;
  fp.kernel = kernel_kind::dot;
  fp.act = act_kind::identity;

  // Distribution (needed before the gaussian preparation).
  const distribution_spec& ds = o.distribution;
  const int di = int(ds.kind);
  if (di < 0 || di >= int(kDistNames.size())) fail(op, fmt::format("distribution kind {} is not a distribution", di));
  fp.dist = ds.kind;
  if (ds.kind == distribution_kind::kernel) {
    if (!is_kernel_score(sc.kind))
      fail(op, fmt::format("distribution kernel needs a gaussian, box or triangle score (got {})", sname));
    if (sc.kind == score_kind::gaussian) fp.dist = distribution_kind::softmax;  // softmax of the log-kernel
    else if (P.fp.p.mask == mask_kind::additive)
      fail(op, fmt::format("distribution kernel with score {} takes a bool attn_mask only (got a {} mask): the "
                           "kernel weights are not logits",
                           sname, dtype_name(o.attn_mask->type())));
  }
  if (ds.kind == distribution_kind::topk && ds.k < 1) fail(op, fmt::format("topk needs k >= 1 (got k = {})", ds.k));
  fp.topk = ds.k;
  fp.hardmax_grad = ds.hardmax_grad;
  fp.sigmoid_bias = ds.sigmoid_bias ? *ds.sigmoid_bias : (Nk > 0 ? -std::log(double(Nk)) : 0.0);
  if (!std::isfinite(fp.sigmoid_bias)) fail(op, fmt::format("sigmoid_bias = {} is not finite", fp.sigmoid_bias));
  const bool shift_invariant = fp.dist != distribution_kind::sigmoid && fp.dist != distribution_kind::kernel;

  const std::int64_t rows_q = B * Hq * Nq, rows_k = B * Hkv * Nk;
  auto matvec = [](const std::vector<double>& M, std::int64_t R, std::int64_t C, const double* x, double* y,
                   bool transposed) {  // y = M x ([R, C] · [C]) or Mᵀ x
    if (!transposed)
      for (std::int64_t r = 0; r < R; ++r) {
        double s = 0.0;
        for (std::int64_t c = 0; c < C; ++c) s += M[std::size_t(r * C + c)] * x[c];
        y[r] = s;
      }
    else
      for (std::int64_t c = 0; c < C; ++c) {
        double s = 0.0;
        for (std::int64_t r = 0; r < R; ++r) s += M[std::size_t(r * C + c)] * x[r];
        y[c] = s;
      }
  };
  switch (sc.kind) {
    case score_kind::dot:
    case score_kind::scaled_dot: {
      P.scale = sc.kind == score_kind::dot ? 1.0 : sc.scale ? *sc.scale : 1.0 / std::sqrt(double(std::max<std::int64_t>(D, 1)));
      if (!std::isfinite(P.scale)) fail(op, fmt::format("scale = {} is not finite", P.scale));
      fp.Pq = fp.Pk = D;
      fp.Qp = P.q.data;
      for (double& x : fp.Qp) x *= P.scale;
      fp.Kp = P.k.data;
      break;
    }
    case score_kind::general:
    case score_kind::biased_general:
    case score_kind::activated_general: {
      P.W = get_param(op, sname, "W", sc.W, {{D, Dk}});
      if (sc.kind != score_kind::general) {
        P.b = get_param(op, sname, "b", sc.b, {{}, {1}});
        fp.bias = P.b.values[0];
      }
      if (sc.kind == score_kind::activated_general)
        fp.act = sc.activation == score_activation::tanh   ? act_kind::tanh
                 : sc.activation == score_activation::relu ? act_kind::relu
                                                           : act_kind::sigmoid;
      fp.Pq = fp.Pk = Dk;  // fold W into q: qp = Wᵀ q
      fp.Qp.resize(std::size_t(rows_q * Dk));
      for (std::int64_t r = 0; r < rows_q; ++r) matvec(P.W.values, D, Dk, P.q.data.data() + r * D, fp.Qp.data() + r * Dk, true);
      fp.Kp = P.k.data;
      break;
    }
    case score_kind::cosine: {
      P.tau = sc.temperature;
      if (!(P.tau > 0.0) || !std::isfinite(P.tau))
        fail(op, fmt::format("cosine temperature = {} must be finite and > 0", P.tau));
      fp.Pq = fp.Pk = D;
      auto normalise = [&](const std::vector<double>& x, std::int64_t rows, double div, std::vector<double>& out,
                           std::vector<double>& norms) {
        out.assign(x.size(), 0.0), norms.assign(std::size_t(rows), 0.0);
        for (std::int64_t r = 0; r < rows; ++r) {
          double n = 0.0;
          for (std::int64_t d = 0; d < D; ++d) n += x[std::size_t(r * D + d)] * x[std::size_t(r * D + d)];
          n = std::sqrt(n);
          norms[std::size_t(r)] = n;
          if (n > 0.0)
            for (std::int64_t d = 0; d < D; ++d) out[std::size_t(r * D + d)] = x[std::size_t(r * D + d)] / (n * div);
        }
      };
      normalise(P.q.data, rows_q, P.tau, fp.Qp, P.qnorm);
      normalise(P.k.data, rows_k, 1.0, fp.Kp, P.knorm);
      break;
    }
    case score_kind::gaussian: {
      // -‖q-k‖²/(2h²) = [q/h², 1, -‖q‖²/(2h²)] · [k, -‖k‖²/(2h²), 1]
      P.h = sc.bandwidth;
      if (!(P.h > 0.0) || !std::isfinite(P.h)) fail(op, fmt::format("bandwidth h = {} must be finite and > 0", P.h));
      P.gaussian_q_term = !shift_invariant;
      const double h2 = P.h * P.h;
      fp.Pq = fp.Pk = D + 2;
      fp.Qp.assign(std::size_t(rows_q * (D + 2)), 0.0);
      fp.Kp.assign(std::size_t(rows_k * (D + 2)), 0.0);
      for (std::int64_t r = 0; r < rows_q; ++r) {
        double n2 = 0.0;
        for (std::int64_t d = 0; d < D; ++d) {
          const double x = P.q.data[std::size_t(r * D + d)];
          fp.Qp[std::size_t(r * (D + 2) + d)] = x / h2, n2 += x * x;
        }
        fp.Qp[std::size_t(r * (D + 2) + D)] = 1.0;
        fp.Qp[std::size_t(r * (D + 2) + D + 1)] = P.gaussian_q_term ? -n2 / (2.0 * h2) : 0.0;
      }
      for (std::int64_t r = 0; r < rows_k; ++r) {
        double n2 = 0.0;
        for (std::int64_t d = 0; d < D; ++d) {
          const double x = P.k.data[std::size_t(r * D + d)];
          fp.Kp[std::size_t(r * (D + 2) + d)] = x, n2 += x * x;
        }
        fp.Kp[std::size_t(r * (D + 2) + D)] = -n2 / (2.0 * h2);
        fp.Kp[std::size_t(r * (D + 2) + D + 1)] = 1.0;
      }
      break;
    }
    case score_kind::box:
    case score_kind::triangle: {
      P.h = sc.bandwidth;
      if (!(P.h > 0.0) || !std::isfinite(P.h)) fail(op, fmt::format("bandwidth h = {} must be finite and > 0", P.h));
      fp.kernel = sc.kind == score_kind::box ? kernel_kind::box : kernel_kind::triangle;
      fp.h = P.h;
      fp.Pq = fp.Pk = D;
      fp.Qp = P.q.data, fp.Kp = P.k.data;
      break;
    }
    case score_kind::additive: {
      if (!sc.W_q) fail(op, "score additive needs W_q of shape [A, D]");
      const std::int64_t A = sc.W_q->rank() == 2 ? sc.W_q->size(0) : -1;
      if (A < 1) fail(op, fmt::format("W_q has shape {}, expected [A, D] = [A, {}] with A >= 1", shape_str(sc.W_q->shape()), D));
      P.W_q = get_param(op, sname, "W_q", sc.W_q, {{A, D}});
      P.W_k = get_param(op, sname, "W_k", sc.W_k, {{A, Dk}});
      P.b = get_param(op, sname, "b", sc.b, {{A}}, /*required=*/false);
      P.w_v = get_param(op, sname, "w_v", sc.w_v, {{A}, {Dv, A}});
      fp.kernel = kernel_kind::additive;
      fp.F = sc.w_v->rank() == 2 ? Dv : 1;
      fp.w_v = P.w_v.values;
      fp.Pq = fp.Pk = A;
      fp.Qp.resize(std::size_t(rows_q * A));
      fp.Kp.resize(std::size_t(rows_k * A));
      for (std::int64_t r = 0; r < rows_q; ++r) matvec(P.W_q.values, A, D, P.q.data.data() + r * D, fp.Qp.data() + r * A, false);
      for (std::int64_t r = 0; r < rows_k; ++r) {
        matvec(P.W_k.values, A, Dk, P.k.data.data() + r * Dk, fp.Kp.data() + r * A, false);
        if (P.b.view)
          for (std::int64_t a = 0; a < A; ++a) fp.Kp[std::size_t(r * A + a)] += P.b.values[std::size_t(a)];
      }
      break;
    }
    case score_kind::location: {
      P.W_a = get_param(op, sname, "W_a", sc.W_a, {{Nk, D}});
      fp.kernel = kernel_kind::location;
      fp.W_a = P.W_a.values;
      fp.Pq = D, fp.Pk = 0;
      fp.Qp = P.q.data;
      break;
    }
  }
  if (fp.F > 1 && fp.dist == distribution_kind::kernel)
    fail(op, "multi-dimensional scores (w_v [Dv, A]) do not take the kernel distribution");

  const bool core_ok = fp.dist == distribution_kind::softmax &&
                       (sc.kind == score_kind::dot || sc.kind == score_kind::scaled_dot ||
                        sc.kind == score_kind::general || sc.kind == score_kind::cosine ||
                        sc.kind == score_kind::gaussian);
  P.path = resolve_path(op, o, exec, core_ok);
}



// The options of attn::attention that carry the masks (scores are prepared: scale 1).
attention_options core_options(const family_options& o) {
  attention_options ao;
  static_cast<masking_options&>(ao) = o;
  ao.scale = 1.0;
  return ao;
}

dtype core_dtype(dtype t) { return t == dtype::f64 ? dtype::f64 : dtype::f32; }

struct core_inputs {
  Tensor q, k, v;
};
core_inputs core_tensors(const prepared& P) {
  const fproblem& fp = P.fp;
  const dtype t = core_dtype(P.type);
  return {Tensor::from_values({fp.B, fp.Hq, fp.Nq, fp.Pq}, t, fp.Qp),
          Tensor::from_values({fp.B, fp.Hkv, fp.Nk, fp.Pk}, t, fp.Kp),
          Tensor::from_values({fp.B, fp.Hkv, fp.Nk, fp.Dv}, t, fp.V)};
}

std::vector<double> forward_values(const prepared& P, const family_options& o, const execution& exec,
                                   std::string& path) {
  std::vector<double> out;
  switch (P.path) {
    case family_path::core: {
      const core_inputs c = core_tensors(P);
      const attention_result r = attention(c.q, c.k, c.v, core_options(o), exec);
      path = fmt::format("core ({})", r.backend);
      return r.out.to_vector();
    }
    case family_path::reference: reference_forward(P.fp, out, nullptr); break;
    default: tiled_forward(P.fp, out); break;
  }
  path = to_string(P.path);
  return out;
}

// The chain rule back through `prepare`: dQp, dKp (and the kernels' parameter gradients in
// acc) to the gradients of q, k and the score's parameters.
void finish(const prepared& P, const std::vector<double>& dQp, const grad_acc& acc, family_grads& g) {
  const fproblem& fp = P.fp;
  const std::int64_t D = P.D, Dk = P.Dk, rows_q = fp.B * fp.Hq * fp.Nq, rows_k = fp.B * fp.Hkv * fp.Nk;
  std::vector<double> dq(std::size_t(rows_q * D), 0.0), dk(std::size_t(rows_k * Dk), 0.0);
  const std::vector<double>& Q = P.q.data;
  const std::vector<double>& K = P.k.data;
  switch (P.score) {
    case score_kind::dot:
    case score_kind::scaled_dot:
      for (std::size_t x = 0; x < dq.size(); ++x) dq[x] = P.scale * dQp[x];
      dk = acc.dKp;
      break;
    case score_kind::general:
    case score_kind::biased_general:
    case score_kind::activated_general: {  // qp = Wᵀ q: dq = W dqp, dW = Σ q dqpᵀ
      std::vector<double> dW(std::size_t(D * Dk), 0.0);
      for (std::int64_t r = 0; r < rows_q; ++r)
        for (std::int64_t d = 0; d < D; ++d) {
          double s = 0.0;
          const double qd = Q[std::size_t(r * D + d)];
          for (std::int64_t x = 0; x < Dk; ++x) {
            const double gx = dQp[std::size_t(r * Dk + x)];
            s += P.W.values[std::size_t(d * Dk + x)] * gx;
            dW[std::size_t(d * Dk + x)] += qd * gx;
          }
          dq[std::size_t(r * D + d)] = s;
        }
      dk = acc.dKp;
      g.dW = param_grad(P.W, dW);
      if (P.b.view) g.db = param_grad(P.b, {acc.dbias});
      break;
    }
    case score_kind::cosine: {  // x̂ = x/‖x‖: dx = (dx̂ - x̂ (x̂·dx̂)) / ‖x‖; qp = q̂/τ
      auto back = [&](const std::vector<double>& x, const std::vector<double>& norms, const std::vector<double>& dxp,
                      double tau, std::int64_t rows, std::vector<double>& dx) {
        for (std::int64_t r = 0; r < rows; ++r) {
          const double n = norms[std::size_t(r)];
          if (n == 0.0) continue;  // the score is 0 around the zero vector's direction: no gradient
          double proj = 0.0;
          for (std::int64_t d = 0; d < D; ++d) proj += x[std::size_t(r * D + d)] / n * dxp[std::size_t(r * D + d)] / tau;
          for (std::int64_t d = 0; d < D; ++d)
            dx[std::size_t(r * D + d)] = (dxp[std::size_t(r * D + d)] / tau - x[std::size_t(r * D + d)] / n * proj) / n;
        }
      };
      back(Q, P.qnorm, dQp, P.tau, rows_q, dq);
      back(K, P.knorm, acc.dKp, 1.0, rows_k, dk);
      double dtau = 0.0;  // qp = q̂/τ: ∂qp/∂τ = -qp/τ
      for (std::size_t x = 0; x < dQp.size(); ++x) dtau -= dQp[x] * fp.Qp[x] / P.tau;
      g.dtemperature = dtau;
      break;
    }
    case score_kind::gaussian: {
      const double h = P.h, h2 = h * h, h3 = h2 * h;
      double dh = 0.0;
      for (std::int64_t r = 0; r < rows_q; ++r) {
        const double* gq = dQp.data() + r * (D + 2);
        double n2 = 0.0;
        for (std::int64_t d = 0; d < D; ++d) n2 += Q[std::size_t(r * D + d)] * Q[std::size_t(r * D + d)];
        for (std::int64_t d = 0; d < D; ++d) {
          const double x = Q[std::size_t(r * D + d)];
          dq[std::size_t(r * D + d)] = gq[d] / h2 + (P.gaussian_q_term ? -gq[D + 1] * x / h2 : 0.0);
          dh += gq[d] * (-2.0 * x / h3);
        }
        if (P.gaussian_q_term) dh += gq[D + 1] * n2 / h3;
      }
      for (std::int64_t r = 0; r < rows_k; ++r) {
        const double* gk = acc.dKp.data() + r * (D + 2);
        double n2 = 0.0;
        for (std::int64_t d = 0; d < D; ++d) n2 += K[std::size_t(r * D + d)] * K[std::size_t(r * D + d)];
        for (std::int64_t d = 0; d < D; ++d) dk[std::size_t(r * D + d)] = gk[d] - gk[D] * K[std::size_t(r * D + d)] / h2;
        dh += gk[D] * n2 / h3;
      }
      g.dbandwidth = dh;
      break;
    }
    case score_kind::box:
    case score_kind::triangle:
      dq = dQp;
      dk = acc.dKp;
      g.dbandwidth = acc.dh;
      break;
    case score_kind::additive: {  // qp = W_q q, kp = W_k k + b
      const std::int64_t A = fp.Pq;
      std::vector<double> dWq(std::size_t(A * D), 0.0), dWk(std::size_t(A * Dk), 0.0), db(std::size_t(A), 0.0);
      for (std::int64_t r = 0; r < rows_q; ++r)
        for (std::int64_t a = 0; a < A; ++a) {
          const double ga = dQp[std::size_t(r * A + a)];
          if (ga == 0.0) continue;
          for (std::int64_t d = 0; d < D; ++d) {
            dq[std::size_t(r * D + d)] += P.W_q.values[std::size_t(a * D + d)] * ga;
            dWq[std::size_t(a * D + d)] += ga * Q[std::size_t(r * D + d)];
          }
        }
      for (std::int64_t r = 0; r < rows_k; ++r)
        for (std::int64_t a = 0; a < A; ++a) {
          const double ga = acc.dKp[std::size_t(r * A + a)];
          if (ga == 0.0) continue;
          db[std::size_t(a)] += ga;
          for (std::int64_t d = 0; d < Dk; ++d) {
            dk[std::size_t(r * Dk + d)] += P.W_k.values[std::size_t(a * Dk + d)] * ga;
            dWk[std::size_t(a * Dk + d)] += ga * K[std::size_t(r * Dk + d)];
          }
        }
      g.dW_q = param_grad(P.W_q, dWq);
      g.dW_k = param_grad(P.W_k, dWk);
      g.db = param_grad(P.b, db);
      g.dw_v = param_grad(P.w_v, acc.dw_v);
      break;
    }
    case score_kind::location:
      dq = dQp;  // the keys are not read: dk stays 0
      g.dW_a = param_grad(P.W_a, acc.dW_a);
      break;
  }
  g.dsigmoid_bias = acc.dsigmoid_bias;
  g.dq = store(dq, fp.B, fp.Hq, fp.Nq, D, P.rank, P.type);
  g.dk = store(dk, fp.B, fp.Hkv, fp.Nk, Dk, P.rank, P.type);
  g.dv = store(acc.dV, fp.B, fp.Hkv, fp.Nk, fp.Dv, P.rank, P.type);
}

}  // namespace
}  // namespace detail::family

using namespace detail::family;
using detail::fail;

family_result attention_family(const TensorView& q, const TensorView& k, const TensorView& v,
                               const family_options& options, const execution& exec) {
  prepared P;
  prepare("attention_family", q, k, v, options, exec, P);
  family_result r;
  const std::vector<double> out = forward_values(P, options, exec, r.path);
  r.out = store(out, P.fp.B, P.fp.Hq, P.fp.Nq, P.fp.Dv, P.rank, P.type);
  return r;
}

family_grads attention_family_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& dout, const family_options& options,
                                       const execution& exec) {
  const char* op = "attention_family_backward";
  prepared P;
  prepare(op, q, k, v, options, exec, P);
  const fproblem& fp = P.fp;
  const Shape os = P.rank == 4 ? Shape{fp.B, fp.Hq, fp.Nq, fp.Dv} : Shape{fp.B, fp.Nq, fp.Hq * fp.Dv};
  if (dout.shape() != os)
    fail(op, fmt::format("dout has shape {}, expected {} (the shape of out)", shape_str(dout.shape()), shape_str(os)));
  if (!is_floating(dout.type())) fail(op, fmt::format("dout has dtype {}, expected a float dtype", dtype_name(dout.type())));
  const std::vector<double> dO = load(dout, fp.Hq).data;

  family_grads g;
  std::vector<double> dQp;
  grad_acc acc;
  switch (P.path) {
    case family_path::core: {
      const core_inputs c = core_tensors(P);
      const attention_options ao = core_options(options);
      const attention_result r = attention(c.q, c.k, c.v, ao, exec);
      const Tensor dout_t = Tensor::from_values({fp.B, fp.Hq, fp.Nq, fp.Dv}, c.q.type(), dO);
      const attention_grads cg = attention_backward(c.q, c.k, c.v, r.out, dout_t, r.lse, ao, exec);
      dQp = cg.dq.to_vector();
      acc.init(fp);
      acc.dKp = cg.dk.to_vector();
      acc.dV = cg.dv.to_vector();
      g.path = fmt::format("core ({})", cg.backend);
      break;
    }
    case family_path::reference: reference_backward(fp, dO, dQp, acc), g.path = "reference"; break;
    default: tiled_backward(fp, dO, dQp, acc), g.path = "tiled"; break;
  }
  finish(P, dQp, acc, g);
  return g;
}

Tensor attention_family_weights(const TensorView& q, const TensorView& k, const TensorView& v,
                                const family_options& options, const execution& exec) {
  execution e = exec;
  e.path = family_path::reference;
  prepared P;
  prepare("attention_family_weights", q, k, v, options, e, P);
  std::vector<double> out, w;
  reference_forward(P.fp, out, &w);
  const fproblem& fp = P.fp;
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
  if (!is_kernel_score(kernel))
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

// ---- names ----

namespace {
template <class E, std::size_t N>
E parse_name(const char* what, const std::string& s, const std::array<const char*, N>& names) {
  std::string all;
  for (std::size_t i = 0; i < N; ++i) {
    if (s == names[i]) return E(i);
    all += (i ? ", " : "") + std::string(names[i]);
  }
  throw error(fmt::format("{}: '{}' is not one of {}", what, s, all));
}
}  // namespace

std::string to_string(score_kind s) {
  const auto i = std::size_t(s);
  return i < kScoreNames.size() ? kScoreNames[i] : fmt::format("score_kind({})", int(s));
}
std::string to_string(distribution_kind d) {
  const auto i = std::size_t(d);
  return i < kDistNames.size() ? kDistNames[i] : fmt::format("distribution_kind({})", int(d));
}
score_kind parse_score_kind(const std::string& s) { return parse_name<score_kind>("score", s, kScoreNames); }
distribution_kind parse_distribution_kind(const std::string& s) {
  return parse_name<distribution_kind>("distribution", s, kDistNames);
}
score_activation parse_score_activation(const std::string& s) {
  return parse_name<score_activation>("activation", s, std::array<const char*, 3>{"tanh", "relu", "sigmoid"});
}
hardmax_gradient parse_hardmax_gradient(const std::string& s) {
  return parse_name<hardmax_gradient>("hardmax gradient", s, std::array<const char*, 2>{"zero", "straight_through"});
}

}  // namespace attn

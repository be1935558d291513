// src/family/scores/general.cc — the general family (Luong; Galassi et al. 2020's taxonomy): W [D, Dk].
//   general            e = qᵀ W k                    = kᵀ (Wᵀ q)
//   biased_general     e = kᵀ (Wᵀ q + b),  b [Dk]    (one bias per key dimension: the term bᵀk
//                                                     differs per key, so it matters under softmax)
//   activated_general  e = act(qᵀ W k + b),  b [] or [1],  act ∈ tanh, relu, sigmoid
// W (and the bias of biased_general) is folded into the query, qp = Wᵀ q (+ b) [.., Dk], so the
// keys pass unprepared (kp = k) and the score is the dot kernel with a scalar bias and an
// activation. general and biased_general with softmax run on attn::attention with q' = Wᵀ q (+ b)
// (one float32 GEMM over the query rows, float64 for float64 input; bfloat16 input: q' rounded to
// bfloat16, so the core op takes its bf16 products) and the user's k and v (no copy when they
// already have that dtype). So does activated_general with tanh: tanh is the core op's softcap at
// 1 (scale 1); its scalar b, inside the tanh, rides on one augmented column (core_prepare_activated).
#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "attn/linear.h"
#include "core/common.h"
#include "family/scores/score.h"

namespace attn::detail::family {
namespace {

void check_general(const score_call& c, score_state& s) { s.W = get_param(c, "W", c.spec->W, {{c.D, c.Dk}}); }

void check_biased(const score_call& c, score_state& s) {
  check_general(c, s);
  s.b = get_param(c, "b", c.spec->b, {{c.Dk}});
}

void check_activated(const score_call& c, score_state& s) {
  check_general(c, s);
  s.b = get_param(c, "b", c.spec->b, {{}, {1}});
}

bool folds_bias(const score_call& c) { return c.spec->kind == score_kind::biased_general; }

// The rows (b, h, n) of a [B, H, N, X] view as a TensorView in the order of the layout `rank`
// (4: [B, H, N, X]; 3: [B, N, H, X]), so that a row-wise product's contiguous result is that
// layout.
TensorView layout_rows(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int rank) {
  if (rank == 4) return TensorView(s.data, s.type, {B, H, N, X}, {s.sb, s.sh, s.sn, s.sx});
  return TensorView(s.data, s.type, {B, N, H, X}, {s.sb, s.sn, s.sh, s.sx});
}
// A float64 (or float32) tensor in the same layout order back into the [B, H, N, X] view `out`.
void store_layout(const Tensor& y, const strided4& out, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                  int rank) {
  const bool f64 = y.type() == dtype::f64;  // else float32 (unfold's float32 backward)
  std::vector<double> row(f64 ? 0 : std::size_t(X));
  for_rows(B, H, N, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t) {
    const std::int64_t r = rank == 4 ? (b * H + h) * N + n : (b * N + n) * H + h;
    if (f64) return store_row(out, b, h, n, X, y.data_as<const double>() + r * X);
    const float* f = y.data_as<const float>() + r * X;
    std::copy(f, f + X, row.begin());
    store_row(out, b, h, n, X, row.data());
  });
}
// W as linear's weight [out = Dk, in = D] (Wᵀ), float64.
Tensor weight_t(const score_call& c, const score_state& s) {
  const std::int64_t D = c.D, Dk = c.Dk;
  std::vector<double> wt(std::size_t(D * Dk));
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t e = 0; e < Dk; ++e) wt[std::size_t(e * D + d)] = s.W.values[std::size_t(d * Dk + e)];
  return Tensor::from_values({Dk, D}, dtype::f64, wt);
}

// qp = Wᵀ q (+ b for biased_general) for every row of q [.., D] into qp [.., Dk]: one float64
// GEMM (attn::linear, OpenBLAS) over the rows, rounded once into qp's dtype.
void fold(const score_call& c, const score_state& s, const strided4& q, const strided4& qp) {
  const Tensor x = Tensor::copy_of(layout_rows(q, c.B, c.Hq, c.Nq, c.D, c.rank), dtype::f64);
  const Tensor b = folds_bias(c) ? Tensor::from_values({c.Dk}, dtype::f64, s.b.values) : Tensor();
  const Tensor y = linear(x, weight_t(c, s), b.defined() ? std::optional<TensorView>(b.view()) : std::nullopt);
  store_layout(y, qp, c.B, c.Hq, c.Nq, c.Dk, c.rank);
}

// The dtype the core route folds W in (core_prepare) and unfolds it back (core_backward).
dtype fold_dtype(const score_call& c) { return core_dtype(c.type) == dtype::f64 ? dtype::f64 : dtype::f32; }

// qp = Wᵀ q + b:  dq = W dqp,  dW = Σ_rows q dqpᵀ,  db = Σ_rows dqp (into *db when given), by
// attn::linear_backward in `t`: float64 for the float64 paths, float32 on the core op's float32
// and bfloat16 routes (whose forward folds W in float32 too: core_prepare). Reads q and dqp,
// writes dq; returns dW [D, Dk].
std::vector<double> unfold(const score_call& c, const score_state& s, const strided4& q, const strided4& dqp,
                           const strided4& dq, std::vector<double>* db = nullptr, dtype t = dtype::f64) {
  // The rows in [B, H, N] order whatever the layout: dW and db sum them in the same order for a
  // 3-D and a 4-D call (the same bits in float32).
  const std::int64_t D = c.D, Dk = c.Dk;
  const Tensor x = Tensor::copy_of(layout_rows(q, c.B, c.Hq, c.Nq, D, 4), t);
  const Tensor dy = Tensor::copy_of(layout_rows(dqp, c.B, c.Hq, c.Nq, Dk, 4), t);
  const linear_grads lg = linear_backward(x, weight_t(c, s).to(t), dy, {.dx = true, .dW = true, .db = db != nullptr});
  store_layout(lg.dx, dq, c.B, c.Hq, c.Nq, D, 4);
  const std::vector<double> gw = lg.dW.to_vector();  // [Dk, D]: the gradient of Wᵀ
  std::vector<double> dW(std::size_t(D * Dk));
  for (std::int64_t d = 0; d < D; ++d)
    for (std::int64_t e = 0; e < Dk; ++e) dW[std::size_t(d * Dk + e)] = gw[std::size_t(e * D + d)];
  if (db) {
    const std::vector<double> g = lg.db.to_vector();
    for (std::int64_t e = 0; e < Dk; ++e) (*db)[std::size_t(e)] += g[std::size_t(e)];
  }
  return dW;
}

void prepare(const score_call& c, const score_state& s, const f64_qkv& in, fproblem& fp) {
  const score_spec& sc = *c.spec;
  if (s.b.view && !folds_bias(c)) fp.bias = s.b.values[0];
  if (sc.kind == score_kind::activated_general)
    fp.act = sc.activation == score_activation::tanh   ? act_kind::tanh
             : sc.activation == score_activation::relu ? act_kind::relu
                                                       : act_kind::sigmoid;
  fp.Pq = fp.Pk = c.Dk;
  fp.Qp.resize(std::size_t(c.rows_q() * c.Dk));
  fold(c, s, rows_of(in.q, c.Hq, c.Nq, c.D), rows_of(fp.Qp, c.Hq, c.Nq, c.Dk));
  fp.Kp = in.k;
}

void backward(const score_call& c, const score_state& s, const f64_qkv& in, const fproblem&,
              const std::vector<double>& dQp, const grad_acc& acc, std::vector<double>& dq, std::vector<double>& dk,
              family_grads& g) {
  std::vector<double> db(std::size_t(c.Dk), 0.0);
  const bool fb = folds_bias(c);
  g.dW = param_grad(s.W, unfold(c, s, rows_of(in.q, c.Hq, c.Nq, c.D), rows_of(dQp, c.Hq, c.Nq, c.Dk),
                                rows_of(dq, c.Hq, c.Nq, c.D), fb ? &db : nullptr));
  dk = acc.dKp;
  if (fb) g.db = param_grad(s.b, db);                         // qp = Wᵀq + b: db = Σ dqp
  else if (s.b.view) g.db = param_grad(s.b, {acc.dbias});  // e = act(z + b): db = Σ dz
}

// general and biased_general (and activated_general's q'): q' = Wᵀ q (+ b).
core_qkv core_prepare(const score_call& c, const score_state& s, const TensorView& q, const TensorView& k,
                      const TensorView& v) {
  const dtype t = core_dtype(c.type);
  if (t == dtype::f64) {
    Tensor qp = empty_bhnx(c.B, c.Hq, c.Nq, c.Dk, c.rank, t);
    fold(c, s, as_bhnx(q, c.Hq), as_bhnx(qp, c.Hq));
    return {qp, with_dtype(k, t), with_dtype(v, t), 1.0};
  }
  // float32 (bfloat16: the core op's dtype too): qp = Wᵀ q (+ b) as one float32 GEMM over the
  // rows of the user's view (attn::linear, OpenBLAS sgemm; a 16-bit q converted to float32 rows
  // first), in the rows' layout order, then rounded once into t.
  const TensorView rows = layout_rows(as_bhnx(q, c.Hq), c.B, c.Hq, c.Nq, c.D, c.rank);
  const Tensor x = rows.type() == dtype::f32 ? Tensor() : Tensor::copy_of(rows, dtype::f32);
  const Tensor wt = weight_t(c, s).to(dtype::f32);
  const Tensor b = folds_bias(c) ? Tensor::from_values({c.Dk}, dtype::f32, s.b.values) : Tensor();
  const Tensor y = linear(x.defined() ? x.view() : rows, wt, b.defined() ? std::optional<TensorView>(b.view()) : std::nullopt);
  const Tensor qp = t == dtype::f32 && c.rank == 4
                        ? y
                        : Tensor::copy_of(y.view().reshape(c.rank == 4 ? Shape{c.B, c.Hq, c.Nq, c.Dk}
                                                                       : Shape{c.B, c.Nq, c.Hq * c.Dk}),
                                          t);
  return {qp, with_dtype(k, t), with_dtype(v, t), 1.0};
}

void core_backward(const score_call& c, const score_state& s, const TensorView& q, const TensorView&,
                   const core_qkv&, const attention_grads& cg, family_grads& g) {
  g.dq = empty_bhnx(c.B, c.Hq, c.Nq, c.D, c.rank, c.type);
  std::vector<double> db(std::size_t(c.Dk), 0.0);
  const bool fb = folds_bias(c);
  g.dW = param_grad(s.W, unfold(c, s, as_bhnx(q, c.Hq), as_bhnx(cg.dq, c.Hq), as_bhnx(g.dq, c.Hq), fb ? &db : nullptr,
                                fold_dtype(c)));
  if (fb) g.db = param_grad(s.b, db);
  g.dk = to_dtype(cg.dk, c.type);
}

bool core_when_activated(const score_call& c) { return c.spec->activation == score_activation::tanh; }

// activated_general with tanh on the core op: e = tanh(q'·k + b) is softcap 1 of the score q'·k + b.
// A forward with b = 0 takes q' and the user's k (general's preparation). Otherwise — and in the
// backward always, for db = Σ dk''[Dk] — one column more: q'' = [q', 1], k'' = [k, b] (float32;
// float64 for float64 input), or for bfloat16 input [q', 1, 1, 1, 0…] · [k, b₁, b₂, b₃, 0…] with b
// split in three bfloat16 parts (their sum is b within |b|·2^-25, below the float32 accumulation),
// padded to split_row_width — gaussian's split. The bfloat16 backward's db
// sums dk''[Dk] rounded to bfloat16 (relative error 2^-9 at most, that of its dq and dk); it runs
// 3.5× faster than a float32 backward at N 4096, D 128 (151 against 522 ms).
core_qkv core_prepare_activated(const score_call& c, const score_state& s, const TensorView& q, const TensorView& k,
                                const TensorView& v) {
  core_qkv in = core_prepare(c, s, q, k, v);
  in.softcap = 1.0;
  if (!c.backward && s.b.values[0] == 0.0) return in;
  const bool bf = in.q.type() == dtype::bf16;
  const dtype t = bf ? dtype::bf16 : c.type == dtype::f64 ? dtype::f64 : dtype::f32;
  const std::int64_t Dk = c.Dk, P = bf ? split_row_width(Dk) : Dk + 1;
  Tensor qa = empty_bhnx(c.B, c.Hq, c.Nq, P, c.rank, t), ka = empty_bhnx(c.B, c.Hkv, c.Nk, P, c.rank, t);
  const strided4 qs = as_bhnx(in.q, c.Hq), ks = as_bhnx(k, c.Hkv), qo = as_bhnx(qa, c.Hq), ko = as_bhnx(ka, c.Hkv);
  std::vector<double> qcols(std::size_t(P - Dk), 0.0), kcols = qcols;  // the columns past Dk of q'' and k''
  if (bf) {
    const auto part = [](double x) { return double(bf16_to_f32(f32_to_bf16(float(x)))); };
    double rest = s.b.values[0];
    for (std::size_t i = 0; i < 3; ++i) {
      qcols[i] = 1.0, kcols[i] = part(rest);
      rest = std::isfinite(kcols[i]) ? rest - kcols[i] : 0.0;
    }
  } else {
    qcols[0] = 1.0, kcols[0] = s.b.values[0];
  }
  std::vector<std::vector<double>> rows(std::size_t(std::max(1, c.threads)), std::vector<double>(std::size_t(P)));
  const auto copy = [&](const strided4& from, const strided4& to, const std::vector<double>& extra, std::int64_t H,
                        std::int64_t N) {
    for_rows_parallel(c.B, H, N, c.threads, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t, int th) {
      std::vector<double>& r = rows[std::size_t(th)];
      load_row(from, b, h, n, Dk, r.data());
      std::copy(extra.begin(), extra.end(), r.begin() + Dk);
      store_row(to, b, h, n, P, r.data());
    });
  };
  copy(qs, qo, qcols, c.Hq, c.Nq);
  copy(ks, ko, kcols, c.Hkv, c.Nk);
  in.q = qa, in.k = ka;
  if (in.v.type() != t) in.v = with_dtype(v, t);
  return in;
}

// Through the augmentation: dq' = dq''[:Dk] (on to dq and dW as general's), dk = dk''[:Dk],
// db = Σ over every key row of dk''[Dk].
void core_backward_activated(const score_call& c, const score_state& s, const TensorView& q, const TensorView&,
                             const core_qkv& in, const attention_grads& cg, family_grads& g) {
  const std::int64_t Dk = c.Dk, P = in.k.size(in.k.rank() - 1) / (c.rank == 3 ? c.Hkv : 1);
  new_dq_dk(c, g);
  g.dW = param_grad(s.W, unfold(c, s, as_bhnx(q, c.Hq), as_bhnx(cg.dq, c.Hq), as_bhnx(g.dq, c.Hq), nullptr,
                                fold_dtype(c)));
  const strided4 dks = as_bhnx(cg.dk, c.Hkv), dko = as_bhnx(g.dk, c.Hkv);
  std::vector<double> r(static_cast<std::size_t>(P));
  double db = 0.0;
  for_rows(c.B, c.Hkv, c.Nk, [&](std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t) {
    load_row(dks, b, h, n, P, r.data());
    db += r[std::size_t(Dk)];
    store_row(dko, b, h, n, Dk, r.data());
  });
  g.db = param_grad(s.b, {db});
}

}  // namespace

const score_def kGeneralScore = {.params = "W", .same_head_size = false, .check = check_general, .prepare = prepare,
                                 .backward = backward, .core_prepare = core_prepare, .core_backward = core_backward};
const score_def kBiasedGeneralScore = {.params = "W b", .same_head_size = false, .check = check_biased,
                                       .prepare = prepare, .backward = backward, .core_prepare = core_prepare,
                                       .core_backward = core_backward};
const score_def kActivatedGeneralScore = {.params = "W b",
                                          .same_head_size = false,
                                          .check = check_activated,
                                          .prepare = prepare,
                                          .backward = backward,
                                          .core_when = core_when_activated,
                                          .core_when_text = "(tanh)",
                                          .core_prepare = core_prepare_activated,
                                          .core_backward = core_backward_activated};

}  // namespace attn::detail::family

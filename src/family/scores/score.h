// src/family/scores/score.h — one score of the family as the front sees it: the checks of its
// own options and parameters, its preparation (prepared q/k vectors, family_impl.h) and its
// chain rule back to q, k and its parameters, written side by side in scores/<score>.cc.
//
// A score has up to two routes, both optional but for the tiled one:
//   tiled / reference  float64 prepared vectors Qp [B, Hq, Nq, Pq], Kp [B, Hkv, Nk, Pk] for the
//                      family kernels; `backward` maps their dQp, dKp (and the kernels'
//                      parameter gradients) to dq, dk and the score's parameter gradients
//   core               with softmax: the q, k, v of attn::attention — the user's own views where
//                      nothing needs preparing (no copy, dtype kept), prepared tensors elsewhere —
//                      and `core_backward` from attention_backward's dq, dk
// Each score writes its preparation once, on strided4 rows, and calls it from both routes.
//
// Adding a score: the enumerator (family.h), its file here (a `score_def`), one line in the
// table of scores/table.cc, and the file in family/sources.cmake.
#pragma once

#include <omp.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "attn/attention.h"
#include "attn/family.h"
#include "family/family_impl.h"

namespace attn::detail::family {

// The validated call, as a score sees it (front.cc fills it).
struct score_call {
  const char* op = "";
  const score_spec* spec = nullptr;
  std::string name;  // "general"
  std::int64_t B = 0, Hq = 0, Hkv = 0, Nq = 0, Nk = 0, D = 0, Dk = 0, Dv = 0;
  int rank = 4;                                        // of q, k, v (4, or 3: [B, N, H*X])
  dtype type = dtype::f32;                             // of q, k, v
  distribution_kind dist = distribution_kind::softmax;  // gaussian's kernel arrives as softmax
  bool shift_invariant = true;                          // the distribution ignores a per-row constant
  int threads = 1;                                      // the call's thread count (execution::num_threads)
  bool backward = false;  // attention_family_backward's call (core_prepare may prepare a forward alone otherwise)

  std::int64_t rows_q() const { return B * Hq * Nq; }
  std::int64_t rows_k() const { return B * Hkv * Nk; }
};

// A learned parameter: the user's view, checked (shape, float dtype, finite), and its values
// in C order as float64.
struct param {
  const TensorView* view = nullptr;
  std::vector<double> values;
};
// `shapes` lists the accepted shapes; a missing required parameter, a wrong shape or dtype, or a
// non-finite value throws attn::error naming c.op, the parameter and the values.
param get_param(const score_call& c, const char* name, const std::optional<TensorArg>& t,
                std::initializer_list<Shape> shapes, bool required = true);
// The gradient of `p` in its shape and dtype (an undefined Tensor when p was not given).
Tensor param_grad(const param& p, const std::vector<double>& g);

// What a score keeps between its checks and its chain rule.
struct score_state {
  param W, b, W_q, W_k, w_v, W_a;
  double scale = 1.0;   // dot, scaled_dot
  double tau = 1.0;     // cosine
  double h = 1.0;       // gaussian, box, triangle
  bool q_term = false;  // gaussian: -‖q‖²/(2h²) kept (the distribution is not shift-invariant)
};

// q, k, v as contiguous float64 [B, H, N, X] (the tiled and reference routes).
struct f64_qkv {
  std::vector<double> q, k, v;
};

// The inputs of attn::attention on the core route: a TensorArg borrows the user's view or owns
// a prepared tensor. The layout (rank) is that of the user's q, k, v.
struct core_qkv {
  TensorArg q, k, v;
  double scale = 1.0;    // attention_options::scale
  double softcap = 0.0;  // attention_options::softcap (activated_general's tanh: 1)
  bool f32_grads = false;  // bf16 q: the backward's dq, dk, dv in float32 (attention_backward_into),
                           // for a chain rule that needs them before their rounding (gaussian's)
};

// Where gaussian and box/triangle meet distribution_kind::kernel.
enum class kernel_role {
  none,     // the kernel distribution is refused
  log,      // the score is the log of a kernel: kernel = softmax of it (gaussian)
  weights,  // the score is the kernel weight itself: α = K / Σ K (box, triangle)
};

struct score_def {
  std::string_view params = "";  // the score_spec tensors it reads ("W b"); any other given is refused
  bool same_head_size = true;   // q and k need the same D
  kernel_role kernel = kernel_role::none;
  // The preparation is Qp = scale·q, Kp = k and the backward dq = scale·dQp, dk = dKp (dot,
  // scaled_dot; box and triangle with scale 1): the fused path then reads the user's views
  // directly (fused_source), with no float64 copy, and writes the gradient tensors itself.
  bool fused_direct = false;
  // With fused_direct: the fields of fp besides Qp, Kp that `prepare` sets (kernel kind,
  // bandwidth); null: fproblem's defaults (a dot product).
  void (*direct_prepare)(const score_call& c, const score_state& s, fproblem& fp) = nullptr;
  // Checks the score's own options and parameters into `s` (attn::error naming c.op).
  void (*check)(const score_call& c, score_state& s) = nullptr;
  // Tiled route: fp.Qp, fp.Kp, fp.Pq, fp.Pk and the kernel fields of fp from in.q, in.k.
  void (*prepare)(const score_call& c, const score_state& s, const f64_qkv& in, fproblem& fp) = nullptr;
  // Chain rule back through `prepare`: from dQp and acc (acc.dKp and the kernels' parameter
  // gradients) into dq [B, Hq, Nq, D], dk [B, Hkv, Nk, Dk] (zeroed, contiguous) and g's
  // parameter gradients.
  void (*backward)(const score_call& c, const score_state& s, const f64_qkv& in, const fproblem& fp,
                   const std::vector<double>& dQp, const grad_acc& acc, std::vector<double>& dq,
                   std::vector<double>& dk, family_grads& g) = nullptr;
  // Core route with softmax (null: none). q, k, v are the user's views.
  // core_when: the calls the route takes (null: all); core_when_text says which, for messages.
  bool (*core_when)(const score_call& c) = nullptr;
  std::string_view core_when_text = "";
  core_qkv (*core_prepare)(const score_call& c, const score_state& s, const TensorView& q, const TensorView& k,
                           const TensorView& v) = nullptr;
  // From attention_backward's gradients of the prepared inputs to g.dq, g.dk (layouts of q, k,
  // dtype of q) and the score's parameter gradients.
  void (*core_backward)(const score_call& c, const score_state& s, const TensorView& q, const TensorView& k,
                        const core_qkv& in, const attention_grads& cg, family_grads& g) = nullptr;
};

// The score of `kind` (scores/table.cc); throws attn::error naming `op` for a value outside the enum.
const score_def& score_of(const char* op, score_kind kind);

// "dot, scaled_dot, general, cosine and gaussian": the scores with a core route, for messages.
std::string core_score_names();

// The scores (one file each, or one per group that shares its preparation).
extern const score_def kDotScore, kScaledDotScore;                                    // dot.cc
extern const score_def kGeneralScore, kBiasedGeneralScore, kActivatedGeneralScore;   // general.cc
extern const score_def kAdditiveScore;                                                // additive.cc
extern const score_def kCosineScore;                                                  // cosine.cc
extern const score_def kLocationScore;                                                // location.cc
extern const score_def kGaussianScore;                                                // gaussian.cc
extern const score_def kBoxScore, kTriangleScore;                                     // box_triangle.cc

// ---- rows: the preparations read and write [B, H, N, X] rows through strided4 views, so one
// function serves the float64 buffers of the tiled route and the user's tensors of the core one.

// A contiguous float64 [B, H, N, X] buffer as a strided4.
inline strided4 rows_of(const std::vector<double>& x, std::int64_t H, std::int64_t N, std::int64_t X) {
  return {const_cast<double*>(x.data()), dtype::f64, H * N * X, N * X, X, 1};
}
// Row (b, h, n) of a view with X features, as float64 into `out`; and back.
void load_row(const strided4& s, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X, double* out);
void store_row(const strided4& s, std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t X, const double* in);
// A q/k/v-like view copied to contiguous float64 [B, H, N, X].
std::vector<double> load_bhnx(const TensorView& t, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X);
// An uninitialised tensor of `rank` (4: [B, H, N, X]; 3: [B, N, H*X]) and dtype t.
Tensor empty_bhnx(std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int rank, dtype t);
// The width of the bf16 rows of D values and four columns more (a float64 value split in three
// bf16 parts, and gaussian's row sums of dS: gaussian's and activated_general's augmentations for
// the core op's bf16 products): a multiple of 32 where those products run on AMX tiles, which take
// no other width, else of 2 (the key pairs of vdpbf16ps) — D 64: 96 on the amx level, 68 below.
std::int64_t split_row_width(std::int64_t D);
// Contiguous float64 [B, H, N, X] to a new tensor of `rank` and dtype t.
Tensor store_bhnx(const std::vector<double>& x, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                  int rank, dtype t);
// New dq, dk for g in the layouts of q, k and the dtype of q (the core route's results).
inline void new_dq_dk(const score_call& c, family_grads& g) {
  g.dq = empty_bhnx(c.B, c.Hq, c.Nq, c.D, c.rank, c.type);
  g.dk = empty_bhnx(c.B, c.Hkv, c.Nk, c.Dk, c.rank, c.type);
}

// Calls f(b, h, n, r) for every row of [B, H, N, ·], r = (b·H + h)·N + n.
template <class F>
void for_rows(std::int64_t B, std::int64_t H, std::int64_t N, F&& f) {
  for (std::int64_t b = 0, r = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t n = 0; n < N; ++n, ++r) f(b, h, n, r);
}
// The same on `threads` threads (each row once, in no particular order): f(b, h, n, row, t) with
// t the thread's index in [0, threads), for per-thread buffers.
template <class F>
void for_rows_parallel(std::int64_t B, std::int64_t H, std::int64_t N, int threads, F&& f) {
  const std::int64_t rows = B * H * N;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) f(r / N / H, r / N % H, r % N, r, omp_get_thread_num());
}

// The dtype the core route prepares in and runs the core op in: float64 and bfloat16 inputs their
// own (bfloat16: the core op's bf16 products, and the user's v unconverted), else float32.
inline dtype core_dtype(dtype t) { return t == dtype::f64 || t == dtype::bf16 ? t : dtype::f32; }
// `t` itself when it has dtype d (no copy), else a converted copy.
TensorArg with_dtype(const TensorView& t, dtype d);
// `t` itself when it has dtype d, else a converted copy.
Tensor to_dtype(const Tensor& t, dtype d);

}  // namespace attn::detail::family

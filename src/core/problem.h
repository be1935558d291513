// src/core/problem.h — the validated, layout-normalised description of one attention call.
//
// The front (attention.cc) checks every user argument and builds a `problem`; backends
// (src/reference, src/cpu) receive it and never check user input again. All tensors are
// seen as 4-D strided views [B, H, N, X] in elements, whatever layout the user passed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/attention.h"
#include "attn/tensor.h"

namespace attn::detail {

// A 4-D strided view: element (b, h, n, x) lives at data + b*sb + h*sh + n*sn + x*sx.
struct strided4 {
  void* data = nullptr;
  dtype type = dtype::f32;
  std::int64_t sb = 0, sh = 0, sn = 0, sx = 0;

  std::int64_t offset(std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t x) const {
    return b * sb + h * sh + n * sn + x * sx;
  }
  double load(std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t x) const {
    return load_as_double(data, type, offset(b, h, n, x));
  }
  void store(std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t x, double value) const {
    store_from_double(data, type, offset(b, h, n, x), value);
  }
  template <class T>
  T* ptr(std::int64_t b, std::int64_t h, std::int64_t n, std::int64_t x) const {
    return static_cast<T*>(data) + offset(b, h, n, x);
  }
};

enum class mask_kind { none, boolean, additive };

struct problem {
  std::int64_t B = 0, Hq = 0, Hkv = 0, Nq = 0, Nk = 0, D = 0, Dv = 0;
  strided4 q, k, v;  // q [B, Hq, Nq, D], k [B, Hkv, Nk, D], v [B, Hkv, Nk, Dv]

  // Mask as [B, Hq, Nq, Nk] (stride 0 on broadcast dims). Columns j >= mask_cols are padding:
  // excluded (ONNX pads a short mask with false / -inf).
  mask_kind mask = mask_kind::none;
  strided4 mask_view;
  std::int64_t mask_cols = 0;

  double scale = 1.0;
  double softcap = 0.0;  // <= 0: off
  bool causal = false;
  causal_alignment alignment = causal_alignment::top_left;
  std::int64_t past_len = 0;           // P, for causal_alignment::after_past
  std::vector<std::int64_t> past_lens;  // empty, or [B]: per-batch P (in-place KV cache)
  std::int64_t window_left = -1, window_right = -1;
  std::vector<std::int64_t> kv_len;  // empty, or [B] with 0 <= kv_len[b] <= Nk
  std::vector<double> alibi;         // empty, or [B * Hq]
  std::vector<double> sinks;         // empty, or [Hq]
  int num_threads = 1;

  // K/V storage that only the cpu backend's decode kernel reads, set only by the serving ops
  // (src/serving/), which call that backend directly; the core front never sets them.
  //   int8 K/V (k.type == v.type == dtype::i8): element (b, h, n, x) is scale(b, h, n) · k(b, h, n, x),
  //   the f32 scales in k_scale / v_scale as [B, Hkv, Nk] views (sx unused).
  strided4 k_scale, v_scale;
  //   Paged K/V (page_table set): row n of (b, h) of k lies in page t = page_table[b·max_pages +
  //   n / page_size] at k.data + t·page_stride.k + (n % page_size)·k.sn + h·k.sh (k.sb unused);
  //   the same for v and for the scales. Every page a row reaches is a valid page.
  struct page_strides {
    std::int64_t k = 0, v = 0, k_scale = 0, v_scale = 0;  // elements
  };
  const std::int64_t* page_table = nullptr;
  std::int64_t max_pages = 0, page_size = 0;
  page_strides page_stride;
  //   Blocked int8 keys (k_blocked, paged int8 only; include/attn/serving.h): keys in blocks of
  //   16 with 16 keys side by side for every 4 elements of d — key n, element x of head h at
  //   k.data + t·page_stride.k + ((n % page_size) / 16)·k.sn + h·k.sh + (x / 4)·64 + (n % 16)·4 + x % 4
  //   (k.sn is the stride of a block, not of a row; k.sx = 1). Values stay rows.
  bool k_blocked = false;
  //   int8 K/V: whether decode may round q and the weights (to int16; with bf16 pairs the weights
  //   to bf16), or keeps every product exact in float32 (paged_kv_view::query).
  bool int8_rounding = true;
  //   int8 K/V: the weights rounded to 8 bits, with blocked keys q too (int8_query::int8)
  bool int8_bytes = false;

  std::int64_t group() const { return Hq / Hkv; }
  std::int64_t keys_valid(std::int64_t b) const { return kv_len.empty() ? Nk : kv_len[b]; }

  // Key position of query row i (see causal_alignment).
  std::int64_t query_pos(std::int64_t b, std::int64_t i) const {
    switch (alignment) {
      case causal_alignment::top_left: return i;
      case causal_alignment::bottom_right: return keys_valid(b) - Nq + i;
      case causal_alignment::after_past: return (past_lens.empty() ? past_len : past_lens[b]) + i;
    }
    return i;
  }

  // Keys [lo, hi) left to row i by nonpad_kv_seqlen, the causal frontier and the window
  // (masks and padding columns are not included). lo >= hi means the row is fully masked.
  std::pair<std::int64_t, std::int64_t> key_range(std::int64_t b, std::int64_t i) const {
    std::int64_t lo = 0, hi = keys_valid(b);
    if (causal || window_left >= 0 || window_right >= 0) {
      const std::int64_t pos = query_pos(b, i);
      if (causal) hi = std::min(hi, pos + 1);
      if (window_right >= 0) hi = std::min(hi, pos + window_right + 1);
      if (window_left >= 0) lo = std::max<std::int64_t>(lo, pos - window_left);
    }
    if (mask != mask_kind::none) hi = std::min(hi, mask_cols);
    return {lo, std::max(lo, hi)};
  }

  // Mask + ALiBi bias of (b, h, i, j) for j inside key_range; -inf where a bool mask excludes.
  double bias(std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) const {
    double s = 0.0;
    if (mask == mask_kind::boolean) {
      if (!static_cast<const bool*>(mask_view.data)[mask_view.offset(b, h, i, j)])
        return -std::numeric_limits<double>::infinity();
    } else if (mask == mask_kind::additive) {
      s = mask_view.load(b, h, i, j);
    }
    if (!alibi.empty()) s -= alibi[b * Hq + h] * double(std::abs(query_pos(b, i) - j));
    return s;
  }
  bool has_bias() const { return mask != mask_kind::none || !alibi.empty(); }
};

// Where a forward pass writes. `out` has the dtype of q; `lse` is contiguous [B, Hq, Nq]
// (float64 when q is float64, else float32); `qk` is set only when an intermediate is asked.
// What a fast backend may hand back to the front's check of special values (attention.cc,
// check_special_rows): the rows (b·Hq + h)·Nq + i, in any order, whose out has a non-finite
// element or whose lse is not finite — a superset of the rows the front redoes — and `complete`
// when it looked at every row as it wrote it. The front then checks those rows alone instead of
// reading out and lse again.
struct special_rows {
  bool complete = false;
  std::vector<std::int64_t> rows;
};

struct forward_outputs {
  strided4 out;
  void* lse = nullptr;
  dtype lse_type = dtype::f32;
  strided4 qk;  // [B, Hq, Nq, Nk]
  qk_output qk_mode = qk_output::none;
  special_rows* found = nullptr;  // (the front's; a backend may leave it untouched)
};

// What a call asks of a backend beyond the problem itself: the eligibility predicates and the
// path description read this, never the output pointers.
struct backend_request {
  bool backward = false;
  qk_output qk = qk_output::none;  // forward: an intermediate [B, Hq, Nq, Nk] is returned
  bool dmask = false;              // backward: the gradient of a float attn_mask is returned
};

// Inputs and outputs of a backward pass. Gradients of q, k, v are written (not accumulated)
// in the dtype of q. The optional parameter gradients are float64 accumulators the backend
// adds into (the front zeroes them): dmask as a [B, Hq, Nq, Nk] strided view with stride 0 on
// the mask's broadcast dims (so a backend must accumulate, serially or per thread), dalibi
// [B * Hq], dsinks [Hq]. A null pointer means "not requested".
struct backward_io {
  strided4 out, dout;
  const void* lse = nullptr;
  dtype lse_type = dtype::f32;
  strided4 dq, dk, dv;
  strided4 dmask;  // f64, or f32 when each element takes one term (a float32 mask without broadcast dims); data null when not requested
  double* dalibi = nullptr;
  double* dsinks = nullptr;
  // [3]: dq, dk, dv. A backend that saw every element it wrote of one of them finite, as written,
  // may set its entry true; the front then skips its own scan of that gradient (left false: the
  // front scans it, and recomputes a non-finite one on the reference).
  bool* finite = nullptr;
};

// One backend. `why_not` returns an empty string when the backend can run the request, or a
// short reason ("cpu: qk output needs the reference") when it cannot; `path` names what the
// backend would do inside ("prefill, bf16 dot products") for explain_backend.
struct backend_impl {
  backend id;
  std::string (*why_not)(const problem&, const backend_request&);
  std::string (*path)(const problem&, const backend_request&);
  void (*forward)(const problem&, const forward_outputs&);
  void (*backward)(const problem&, const backward_io&);
  // Taken only when asked by name (use_backend or ATTN_BACKEND), never by `automatic`: the cuda
  // backend, whose host tensors cross to the device and back.
  bool explicit_only = false;
  std::string_view name() const { return to_string(id); }
};

// Backends in the order `backend::automatic` tries them; the reference is always last.
const std::vector<const backend_impl*>& backend_registry();

const backend_impl& reference_backend();  // src/reference
// The reference's forward of some rows only, row = (b·Hq + h)·Nq + i: the front recomputes
// there the rows a fast backend left non-finite (special values, attention.h).
void reference_forward_rows(const problem& p, const forward_outputs& o, std::span<const std::int64_t> rows);
const backend_impl& cpu_backend();        // src/cpu
// The cpu kernels' scan of this CPU's level (src/cpu; read once per call, as ATTN_CPU_ISA may
// change): the largest finite |x| of n unit-stride float32 values (bfloat16 with bf16), as the
// bits of a float32 (0 where there is none) — the front's coarse bound on the q·k terms.
using max_abs_bits_fn = std::int32_t (*)(const void* x, std::int64_t n, bool bf16);
max_abs_bits_fn cpu_max_abs_bits();
const backend_impl& cuda_backend();       // src/cuda (a refusing stub in builds without CUDA)

// The one backend selector, used by every call and by explain_backend. `want` is the caller's
// execution::use_backend; with `automatic`, ATTN_BACKEND (if set) names the backend. `chosen`
// is null when none is eligible (or the name is unknown); `reasons` holds every refusal, in
// registry order, and `unknown` the name ATTN_BACKEND gave that matches no backend.
struct selection {
  const backend_impl* chosen = nullptr;
  std::string reasons;
  std::string unknown;
};
selection select_backend(const problem& p, const backend_request& req, backend want);
// The backend select_backend picks, or attn::error "<op>: ..." naming why none can run.
const backend_impl& pick(const char* op, const problem& p, const backend_request& req, backend want);

// Everything a problem points into that the front had to allocate.
struct problem_storage {
  Tensor present_key, present_value;
  // A float mask with rows beyond ±1024, shifted row by row to a maximum of 0 (softmax is
  // shift-invariant; -1e30 everywhere then equals no mask), and the shift of query row
  // (b, h, i) at mask_shift.offset(b, h, i, 0): the front adds it back to the lse.
  Tensor shifted_mask, shift;
  strided4 mask_shift;
};

// An in-place KV cache seen by the front: buffers [B, Hkv, capacity, D|Dv] and the tokens each
// batch entry holds before this call. build_problem writes the new keys/values at rows
// [lengths[b], lengths[b] + Nnew) and points the problem at the cache.
struct cache_input {
  TensorView key, value;
  std::vector<std::int64_t> lengths;
};

// attn_mask m onto p (mask, mask_view, mask_cols; a float mask with rows beyond ±1024 shifted
// into store, see problem_storage): m broadcasts right-aligned to [p.B, p.Hq, p.Nq, p.Nk], a
// shorter last dim being padding (excluded columns). build_problem calls it; the paged front
// calls it with Nk the block table's capacity.
void set_attn_mask(const char* op, const TensorView& m, problem& p, problem_storage& store, int nt);

// q, k, v: float dtypes, all the same; all 4-D or all 3-D. Throws attn::error naming `op`.
void check_qkv_types(const char* op, const TensorView& q, const TensorView& k, const TensorView& v);

// Checks every argument of an attention call and builds its problem (src/core/attention.cc).
// Other fronts (src/family) reuse it for the mask, causal, window and padding semantics.
// `cache`, when given, makes k and v the new tokens appended to it (past_key must be unset).
// With check_finite: attn::error "<op>: check_finite: <name> holds nan at index [0, 1, 2, 3]"
// for the first NaN or ±inf of t (-inf allowed when minus_inf_ok, as in a float mask).
void check_finite(const char* op, const char* name, const TensorView& t, bool minus_inf_ok = false);

problem build_problem(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention_options& o, const execution& exec, problem_storage& store,
                      const cache_input* cache = nullptr);

// The front's check of special values after a fast backend's forward (src/core/attention.cc):
// rows the float32 kernels left non-finite where float64 would not (overflow, NaN or inf
// scores), or with lse -inf though a key is visible, are computed again by the float64
// reference. Every front that calls a backend's forward itself (serving's varlen) runs it, so
// that special values get the answer attn::attention gives.
void check_special_rows(const problem& p, const forward_outputs& fo);
// A backend's forward of p as attn::attention runs it (outputs out, lse, and qk when out.qk_mode
// asks): out of memory as attn::error naming op, special rows (check_special_rows) on the
// reference, and with a shifted mask (store.shift) the shift added back to lse (and biased
// scores) in float64 before they are rounded once; sinks beside a shifted mask are left to the
// front, which joins each row's sink after the shift is back (attention.cc, join_sinks).
// After a shifted mask's shift is back in fo.lse (float64 [B, Hq, Nq], rows in order): each
// row's sink joins its softmax, L = log(e^lse + e^sink_h), out (and qk's probabilities) times
// e^(lse - L). attention.cc's forward_on and attention_paged's decode path.
void join_sinks(const problem& p, const forward_outputs& fo);

void forward_on(const char* op, const problem& p, const problem_storage& store, const backend_impl& be,
                const forward_outputs& out);

// log(e^a + e^t) for a sink logit t joining a row whose keys' lse is a (-inf: no key), in
// float64 (forward_on, backward_on and attention_paged join sinks so beside a shifted mask).
inline double sink_joined_lse(double a, double t) {
  if (a == -std::numeric_limits<double>::infinity()) return t;
  return std::max(a, t) + std::log1p(std::exp(-std::abs(a - t)));
}

// What backward_on needs of a front's gradients: the views io.dq, io.dk and io.dv write (scanned
// for non-finite values the backend did not see), `reset` zeroing the accumulating outputs
// (io.dmask, io.dalibi, io.dsinks) and `finite` telling whether those are all finite.
struct backward_guards {
  TensorView dq, dk, dv;
  std::function<void()> reset;
  std::function<bool()> finite;
};
// The backward of p as attn::attention_backward runs it, from the forward's lse ([B, Hq, Nq],
// any strides): a shifted mask's lse recomputed on the forward backend `use` picks; an lse or
// q·k terms past ±1024 on the float64 reference (its lse recomputed); non-finite gradients from
// `picked` computed again by the reference after guards.reset(). Sinks beside a shifted mask:
// the backend runs without them, on the keys' lse with each row's sink joined at sink_h - c,
// and io.dsinks gets -Σ_i e^(sink_h - c_i - lse_i)·(dout_i · out_i) from the front. Returns the
// backend whose gradients io holds.
const backend_impl& backward_on(const char* op, const problem& p, const problem_storage& store, const TensorView& lse,
                                backward_io io, const backend_impl& picked, backend use, const backward_guards& guards);

// Its first half: the rows it would redo, in row order. It reads out, lse and the mask, never
// q, k or v (a front that must first lay the keys out for the reference, as attention_paged
// does, copies them only when a row is special).
std::vector<std::int64_t> special_rows_of(const problem& p, const forward_outputs& fo);

}  // namespace attn::detail

// src/core/attention.cc — the front of attn::attention: checks every argument, normalises
// layouts to 4-D strided views, writes new tokens into the KV cache, allocates outputs and
// asks the one selector (select.cc) for a backend. Backends never see user input that was not
// checked here.
#include "attn/attention.h"

#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

#include "attn/error.h"
#include "core/common.h"
#include "core/overlap.h"
#include "core/problem.h"
#include "core/team.h"

namespace attn {
namespace detail {

std::vector<std::int64_t> read_index(const char* op, const char* name, const TensorView& t, int rank, const char* want) {
  if (t.type() != dtype::i64 && t.type() != dtype::i32)
    fail(op, fmt::format("{} has dtype {}, expected int64 or int32", name, dtype_name(t.type())));
  if (t.rank() != rank) fail(op, fmt::format("{} has shape {}, expected {}", name, shape_str(t.shape()), want));
  if (t.data() == nullptr && t.numel() != 0) fail(op, fmt::format("{} has no data", name));
  std::vector<std::int64_t> r;
  r.reserve(std::size_t(t.numel()));
  const auto at = [&t](std::int64_t i) {
    return t.type() == dtype::i64 ? t.data_as<const std::int64_t>()[i] : std::int64_t(t.data_as<const std::int32_t>()[i]);
  };
  if (rank == 1) {
    for (std::int64_t i = 0; i < t.size(0); ++i) r.push_back(at(i * t.stride(0)));
  } else {
    for (std::int64_t i = 0; i < t.size(0); ++i)
      for (std::int64_t j = 0; j < t.size(1); ++j) r.push_back(at(i * t.stride(0) + j * t.stride(1)));
  }
  return r;
}

void check_qkv_types(const char* op, const TensorView& q, const TensorView& k, const TensorView& v) {
  for (auto [name, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}}) {
    if (!is_floating(t->type()))
      fail(op, fmt::format("{} has dtype {}, expected float32, float16, bfloat16 or float64", name, dtype_name(t->type())));
    if (t->data() == nullptr && t->numel() != 0) fail(op, fmt::format("{} has no data", name));
  }
  if (k.type() != q.type() || v.type() != q.type())
    fail(op, fmt::format("q, k, v have dtypes {}, {}, {}; they must be the same", dtype_name(q.type()),
                         dtype_name(k.type()), dtype_name(v.type())));
  if (q.rank() != 4 && q.rank() != 3)
    fail(op, fmt::format("q has {} dims, expected 4 (B, Hq, Nq, D) or 3 (B, Nq, Hq*D)", q.rank()));
  if (k.rank() != q.rank() || v.rank() != q.rank())
    fail(op, fmt::format("q, k, v have {}, {}, {} dims; they must all be 4-D or all 3-D", q.rank(), k.rank(), v.rank()));
}

namespace {

struct qkv_dims {
  std::int64_t B, Hq, Hkv, Nq, Nk, D, Dv;
};

qkv_dims check_qkv(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                   const attention_options& o) {
  check_qkv_types(op, q, k, v);
  if (o.q_num_heads < 0 || o.kv_num_heads < 0)
    fail(op, fmt::format("q_num_heads = {} and kv_num_heads = {} must not be negative", o.q_num_heads, o.kv_num_heads));
  qkv_dims d{};
  d.B = q.size(0);
  if (q.rank() == 4) {
    d.Hq = q.size(1), d.Nq = q.size(2), d.D = q.size(3);
    d.Hkv = k.size(1), d.Nk = k.size(2);
    if (k.size(3) != d.D)
      fail(op, fmt::format("k has head size {} (shape {}), q has {}; they must match", k.size(3), shape_str(k.shape()), d.D));
    if (v.size(1) != d.Hkv || v.size(2) != d.Nk)
      fail(op, fmt::format("v has shape {}, expected [B, {}, {}, Dv] to match k {}", shape_str(v.shape()), d.Hkv, d.Nk,
                           shape_str(k.shape())));
    d.Dv = v.size(3);
    if (o.q_num_heads && o.q_num_heads != d.Hq)
      fail(op, fmt::format("q_num_heads = {} but 4-D q {} has {} heads", o.q_num_heads, shape_str(q.shape()), d.Hq));
    if (o.kv_num_heads && o.kv_num_heads != d.Hkv)
      fail(op, fmt::format("kv_num_heads = {} but 4-D k {} has {} heads", o.kv_num_heads, shape_str(k.shape()), d.Hkv));
  } else {
    if (o.q_num_heads == 0 || o.kv_num_heads == 0)
      fail(op, fmt::format("3-D inputs need q_num_heads and kv_num_heads (got {} and {})", o.q_num_heads, o.kv_num_heads));
    d.Hq = o.q_num_heads, d.Hkv = o.kv_num_heads;
    d.Nq = q.size(1), d.Nk = k.size(1);
    if (q.size(2) % d.Hq)
      fail(op, fmt::format("q hidden size {} is not a multiple of q_num_heads = {}", q.size(2), d.Hq));
    if (k.size(2) % d.Hkv)
      fail(op, fmt::format("k hidden size {} is not a multiple of kv_num_heads = {}", k.size(2), d.Hkv));
    if (v.size(2) % d.Hkv)
      fail(op, fmt::format("v hidden size {} is not a multiple of kv_num_heads = {}", v.size(2), d.Hkv));
    d.D = q.size(2) / d.Hq;
    d.Dv = v.size(2) / d.Hkv;
    if (k.size(2) / d.Hkv != d.D)
      fail(op, fmt::format("k head size {} (hidden {} / {} heads) differs from q head size {}", k.size(2) / d.Hkv,
                           k.size(2), d.Hkv, d.D));
    if (v.size(1) != d.Nk)
      fail(op, fmt::format("v has {} keys, k has {}; they must match", v.size(1), d.Nk));
  }
  if (k.size(0) != d.B || v.size(0) != d.B)
    fail(op, fmt::format("batch sizes differ: q {}, k {}, v {}", d.B, k.size(0), v.size(0)));
  if (d.Hkv == 0 || d.Hq == 0 || d.Hq % d.Hkv)
    fail(op, fmt::format("q has {} heads and k/v {}; Hq must be a positive multiple of Hkv", d.Hq, d.Hkv));
  if (d.D == 0 && !o.scale) fail(op, "head size D is 0; the default scale 1/sqrt(D) is undefined (pass scale)");
  // Broadcast (stride-0) views can describe logical shapes far beyond memory: refuse a call
  // whose multiply-adds B·Hq·Nq·Nk·(D + Dv) pass kMaxWork instead of hanging or overflowing.
  constexpr std::int64_t kMaxWork = std::int64_t(1) << 56;
  std::int64_t work = d.D + d.Dv;
  for (std::int64_t x : {d.B, d.Hq, d.Nq, d.Nk})
    if (x != 0 && work > kMaxWork / x) {
      fail(op, fmt::format("B = {}, Hq = {}, Nq = {}, Nk = {}, D = {}, Dv = {} need B·Hq·Nq·Nk·(D + Dv) multiply-adds, "
                           "more than 2^56 (refused: days of compute, beyond what the views can hold)",
                           d.B, d.Hq, d.Nq, d.Nk, d.D, d.Dv));
    } else {
      work *= x;
    }
  return d;
}

// Copies rows [0, N) of `src` ([B, H, N, X] strided) into rows [n0_b, n0_b + N) of `dst`, both
// of one dtype (bytes are copied, never converted): a row at a time when both rows are
// contiguous. n0 holds one start row per batch entry. memmove: src may alias dst.
void copy_rows(const strided4& src, const strided4& dst, std::int64_t B, std::int64_t H, std::int64_t N,
               std::int64_t X, const std::vector<std::int64_t>& n0) {
  const std::size_t es = dtype_size(src.type);
  auto* s = static_cast<const std::byte*>(src.data);
  auto* d = static_cast<std::byte*>(dst.data);
  const bool rows = (src.sx == 1 && dst.sx == 1) || X <= 1;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t h = 0; h < H; ++h)
      for (std::int64_t n = 0; n < N; ++n) {
        if (rows) {
          std::memmove(d + dst.offset(b, h, n0[b] + n, 0) * es, s + src.offset(b, h, n, 0) * es, std::size_t(X) * es);
        } else {
          for (std::int64_t x = 0; x < X; ++x)
            std::memmove(d + dst.offset(b, h, n0[b] + n, x) * es, s + src.offset(b, h, n, x) * es, es);
        }
      }
}

// The cache buffers: 4-D [B, Hkv, capacity, D|Dv] of q's dtype. Returns the capacity.
std::int64_t check_cache(const char* op, const cache_input& c, const qkv_dims& d, dtype t) {
  const TensorView& ck = c.key;
  const TensorView& cv = c.value;
  if (ck.rank() != 4 || cv.rank() != 4)
    fail(op, fmt::format("cache key {} and value {} must be 4-D [B, Hkv, capacity, D]", shape_str(ck.shape()),
                         shape_str(cv.shape())));
  if (ck.type() != t || cv.type() != t)
    fail(op, fmt::format("cache key/value have dtypes {}/{}, expected {} like q", dtype_name(ck.type()),
                         dtype_name(cv.type()), dtype_name(t)));
  if (ck.size(0) != d.B || ck.size(1) != d.Hkv || ck.size(3) != d.D)
    fail(op, fmt::format("cache key has shape {}, expected [{}, {}, capacity, {}]", shape_str(ck.shape()), d.B, d.Hkv, d.D));
  if (cv.size(0) != d.B || cv.size(1) != d.Hkv || cv.size(2) != ck.size(2) || cv.size(3) != d.Dv)
    fail(op, fmt::format("cache value has shape {}, expected [{}, {}, {}, {}]", shape_str(cv.shape()), d.B, d.Hkv,
                         ck.size(2), d.Dv));
  if (ck.data() == nullptr && ck.numel() != 0) fail(op, "cache key has no data");
  if (cv.data() == nullptr && cv.numel() != 0) fail(op, "cache value has no data");
  const std::int64_t cap = ck.size(2);
  if (std::int64_t(c.lengths.size()) != d.B)
    fail(op, fmt::format("cache lengths has {} entries, expected B = {}", c.lengths.size(), d.B));
  for (std::int64_t b = 0; b < d.B; ++b) {
    const std::int64_t L = c.lengths[std::size_t(b)];
    if (L < 0 || L > cap - d.Nk)
      fail(op, fmt::format("cache lengths[{}] = {} with {} new tokens does not fit the capacity {} (needs 0 <= length "
                           "<= {})",
                           b, L, d.Nk, cap, cap - d.Nk));
  }
  return cap;
}

std::vector<double> small_vector(const char* op, const char* name, const TensorView& t) {
  if (!is_floating(t.type()))
    fail(op, fmt::format("{} has dtype {}, expected a float dtype", name, dtype_name(t.type())));
  std::vector<double> r = to_vector(t);
  for (double x : r)
    if (!std::isfinite(x)) fail(op, fmt::format("{} holds a non-finite value ({})", name, x));
  return r;
}

// Float masks are shift-invariant per query row: softmax(s + m - c) = softmax(s + m). Adding
// -1e30 to float32 (or float64) scores would erase them, so a mask with rows beyond
// ±kMaskShift whose finite values lie within kMaskBand is replaced by a copy with each such
// row's largest finite value subtracted (its rows only, without the broadcast dims); the shift
// goes back into the lse (front) and the backward recomputes its own lse. A constant mask then
// equals no mask exactly.
constexpr double kMaskShift = 1024.0, kMaskBand = 1 << 20;

void shift_mask_rows(const TensorView& mask, problem& p, problem_storage& store, int nt) {
  // With lengths per batch entry (p.kv_len: nonpad_kv_seqlen, an in-place cache, the paged op's
  // seq_lens), a row's shift is the largest value among the keys its entry has: the mask is seen
  // as 4-D with B explicit, so that entries of one broadcast row may shift apart.
  const bool per_entry = !p.kv_len.empty();
  TensorView m = mask;
  if (per_entry) {
    Shape sh(4, 1), st(4, 0);
    const int o4 = 4 - mask.rank();
    for (int d = 0; d < mask.rank(); ++d) sh[std::size_t(o4 + d)] = mask.size(d), st[std::size_t(o4 + d)] = mask.stride(d);
    if (sh[0] != p.B) sh[0] = p.B, st[0] = 0;
    m = TensorView(mask.data(), mask.type(), sh, st);
  }
  Shape cs = m.shape();
  for (int d = per_entry ? 1 : 0; d + 1 < m.rank(); ++d)
    if (m.stride(d) == 0) cs[std::size_t(d)] = 1;
  const std::int64_t cols = cs.back(), sx = m.stride(-1);
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < m.rank(); ++d) rows *= cs[std::size_t(d)];
  if (cols == 0) rows = 0;
  const std::int64_t per_b = per_entry && p.B > 0 ? rows / p.B : 0;
  // The columns row r takes its shift over.
  const auto used = [&](std::int64_t r) {
    return per_entry ? std::min(p.mask_cols, p.kv_len[std::size_t(r / per_b)]) : p.mask_cols;
  };
  // Element offset of row r (the dims before the last, over cs) in the mask's own layout.
  const auto row_offset = [&](std::int64_t r) {
    std::int64_t off = 0;
    for (int d = m.rank() - 2; d >= 0; --d) {
      const std::int64_t n = cs[std::size_t(d)];
      off += r % n * m.stride(d), r /= n;
    }
    return off;
  };
  // Each row read where it is, in its dtype, on the call's threads.
  const auto value = [&](std::int64_t base, std::int64_t j) {
    const std::int64_t at = base + j * sx;
    if (m.type() == dtype::f32) return double(static_cast<const float*>(m.data())[at]);
    if (m.type() == dtype::f64) return static_cast<const double*>(m.data())[at];
    return load_as_double(m.data(), m.type(), at);
  };
  std::vector<double> shift(std::size_t(rows), 0.0);
  int wide = 0;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : wide)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t base = row_offset(r);
    double mx = kNegInf, mn = -kNegInf;
    for (std::int64_t j = 0, n = used(r); j < n; ++j) {
      const double x = value(base, j);
      if (std::isfinite(x)) mx = std::max(mx, x), mn = std::min(mn, x);
    }
    // Only rows whose finite values all lie within kMaskBand of each other: the keys a query
    // keeps may be any subset, and a shift set by a far larger value it does not keep would
    // erase the ones it does (such rows are left as they are).
    if (std::isfinite(mx) && std::abs(mx) > kMaskShift && mx - mn <= kMaskBand) shift[std::size_t(r)] = mx, wide = 1;
  }
  if (!wide) return;
  store.shifted_mask = Tensor::empty(cs, p.q.type == dtype::f64 ? dtype::f64 : dtype::f32);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t base = row_offset(r);
    for (std::int64_t j = 0; j < cols; ++j)
      store_from_double(store.shifted_mask.data(), store.shifted_mask.type(), r * cols + j,
                        value(base, j) - shift[std::size_t(r)]);
  }
  Shape ss = cs;
  ss.back() = 1;
  store.shift = Tensor::from_values(ss, dtype::f64, shift);
  // Strides over [B, Hq, Nq, Nk] as for the mask itself: 0 on broadcast dims.
  std::int64_t ms[4] = {0, 0, 0, 0}, hs[4] = {0, 0, 0, 0};
  const int off = 4 - m.rank();
  for (int d = 0; d < m.rank(); ++d) {
    if (cs[std::size_t(d)] != 1 || off + d == 3) ms[off + d] = store.shifted_mask.view().stride(d);
    if (cs[std::size_t(d)] != 1 && off + d != 3) hs[off + d] = store.shift.view().stride(d);
  }
  p.mask_view = strided4{store.shifted_mask.data(), store.shifted_mask.type(), ms[0], ms[1], ms[2], ms[3]};
  store.mask_shift = strided4{store.shift.data(), dtype::f64, hs[0], hs[1], hs[2], 0};
}

}  // namespace

// Mask: [.., Nq', Nk'] broadcast to [B, Hq, Nq, Nk] right-aligned; a short last dim is padding.
void set_attn_mask(const char* op, const TensorView& m, problem& p, problem_storage& store, int nt) {
  if (m.type() != dtype::boolean && !is_floating(m.type()))
    fail(op, fmt::format("attn_mask has dtype {}, expected bool or a float dtype", dtype_name(m.type())));
  if (m.rank() < 1 || m.rank() > 4)
    fail(op, fmt::format("attn_mask has {} dims {}, expected 1 to 4 (broadcast to [B, Hq, Nq, Nk])", m.rank(),
                         shape_str(m.shape())));
  const std::int64_t full[4] = {p.B, p.Hq, p.Nq, p.Nk};
  std::int64_t st[4] = {0, 0, 0, 0};
  const int off = 4 - m.rank();
  for (int i = 0; i < m.rank(); ++i) {
    const std::int64_t s = m.size(i), want = full[off + i];
    if (off + i == 3) {
      if (s > want && s != 1)  // a size-1 dim still broadcasts onto Nk = 0
        fail(op, fmt::format("attn_mask {} has {} columns but there are {} keys", shape_str(m.shape()), s, want));
      st[3] = m.stride(i);
    } else if (s == want && s != 1) {
      st[off + i] = m.stride(i);
    } else if (s != 1) {
      fail(op, fmt::format("attn_mask {} does not broadcast to [B, Hq, Nq, Nk] = {}", shape_str(m.shape()),
                           shape_str(full)));
    }
  }
  p.mask = m.type() == dtype::boolean ? mask_kind::boolean : mask_kind::additive;
  p.mask_view = strided4{m.data(), m.type(), st[0], st[1], st[2], st[3]};
  p.mask_cols = std::min(m.size(-1), p.Nk);
  if (p.mask == mask_kind::additive) shift_mask_rows(m, p, store, nt);
}

problem build_problem(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                      const attention_options& o, const execution& exec, problem_storage& store,
                      const cache_input* cache) {
  const qkv_dims d = check_qkv(op, q, k, v, o);
  problem p;
  p.B = d.B, p.Hq = d.Hq, p.Hkv = d.Hkv, p.Nq = d.Nq, p.Nk = d.Nk, p.D = d.D, p.Dv = d.Dv;
  p.q = as_bhnx(q, d.Hq);
  p.k = as_bhnx(k, d.Hkv);
  p.v = as_bhnx(v, d.Hkv);

  // KV cache. In place: the new tokens go into rows [L_b, L_b + Nnew) of the cache and the
  // problem reads the cache's first max_b(L_b + Nnew) rows, with kv_len[b] = L_b + Nnew. ONNX's
  // past/present is the same with a fresh present buffer holding a copy of the past (L_b = P).
  if (o.past_key.has_value() != o.past_value.has_value())
    fail(op, "past_key and past_value must be given together");
  cache_input onnx_cache;
  if (cache && o.nonpad_kv_seqlen)
    fail(op, "nonpad_kv_seqlen cannot be combined with a KV cache (its lengths say which keys are valid)");
  if (o.past_key) {
    if (cache) fail(op, "past_key/past_value and an in-place KV cache cannot be combined");
    const TensorView& pk = *o.past_key;
    const TensorView& pv = *o.past_value;
    if (pk.rank() != 4 || pv.rank() != 4)
      fail(op, fmt::format("past_key {} and past_value {} must be 4-D [B, Hkv, P, D]", shape_str(pk.shape()),
                           shape_str(pv.shape())));
    if (pk.type() != q.type() || pv.type() != q.type())
      fail(op, fmt::format("past_key/past_value have dtypes {}/{}, expected {} like q", dtype_name(pk.type()),
                           dtype_name(pv.type()), dtype_name(q.type())));
    if (pk.size(0) != d.B || pk.size(1) != d.Hkv || pk.size(3) != d.D)
      fail(op, fmt::format("past_key has shape {}, expected [{}, {}, P, {}]", shape_str(pk.shape()), d.B, d.Hkv, d.D));
    if (pv.size(0) != d.B || pv.size(1) != d.Hkv || pv.size(2) != pk.size(2) || pv.size(3) != d.Dv)
      fail(op, fmt::format("past_value has shape {}, expected [{}, {}, {}, {}]", shape_str(pv.shape()), d.B, d.Hkv,
                           pk.size(2), d.Dv));
    const std::int64_t P = pk.size(2);
    store.present_key = Tensor::empty({d.B, d.Hkv, P + d.Nk, d.D}, q.type());
    store.present_value = Tensor::empty({d.B, d.Hkv, P + d.Nk, d.Dv}, q.type());
    const std::vector<std::int64_t> zero(std::size_t(d.B), 0);
    copy_rows(as_bhnx(pk, d.Hkv), as_bhnx(store.present_key, d.Hkv), d.B, d.Hkv, P, d.D, zero);
    copy_rows(as_bhnx(pv, d.Hkv), as_bhnx(store.present_value, d.Hkv), d.B, d.Hkv, P, d.Dv, zero);
    onnx_cache = {store.present_key, store.present_value, std::vector<std::int64_t>(std::size_t(d.B), P)};
    cache = &onnx_cache;
  }
  if (cache) {
    check_cache(op, *cache, d, q.type());
    const strided4 ck = as_bhnx(cache->key, d.Hkv), cv = as_bhnx(cache->value, d.Hkv);
    copy_rows(p.k, ck, d.B, d.Hkv, d.Nk, d.D, cache->lengths);
    copy_rows(p.v, cv, d.B, d.Hkv, d.Nk, d.Dv, cache->lengths);
    p.k = ck, p.v = cv;
    p.Nk = 0;
    for (std::int64_t b = 0; b < d.B; ++b) {
      p.kv_len.push_back(cache->lengths[std::size_t(b)] + d.Nk);
      p.Nk = std::max(p.Nk, p.kv_len.back());
    }
    p.past_lens = cache->lengths;
    p.past_len = d.B ? *std::max_element(p.past_lens.begin(), p.past_lens.end()) : 0;
    // Every batch entry has P keys before the new ones: the plain ONNX case, no lengths needed.
    if (std::all_of(p.kv_len.begin(), p.kv_len.end(), [&](std::int64_t n) { return n == p.Nk; })) {
      p.kv_len.clear();
      p.past_lens.clear();
    }
  }

  // Scale, softcap, window, alignment.
  p.scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(d.D));
  // Every backend must see the same number: the fast ones use scale and softcap as float32, so
  // a value that float32 would flush to 0 or round to inf is refused rather than read two ways.
  constexpr double kMinF = std::numeric_limits<float>::min(), kMaxF = std::numeric_limits<float>::max();
  if (!std::isfinite(p.scale)) fail(op, fmt::format("scale = {} is not finite", p.scale));
  if (p.scale != 0.0 && (std::abs(p.scale) < kMinF || std::abs(p.scale) > kMaxF))
    fail(op, fmt::format("scale = {} is outside the normal float32 range [{}, {}] (or 0)", p.scale, kMinF, kMaxF));
  if (!(o.softcap >= 0.0) || !std::isfinite(o.softcap))
    fail(op, fmt::format("softcap = {} must be finite and >= 0 (0 turns it off)", o.softcap));
  if (o.softcap != 0.0 && (o.softcap < kMinF || o.softcap > kMaxF))
    fail(op, fmt::format("softcap = {} is outside the normal float32 range [{}, {}] (0 turns it off)", o.softcap,
                         kMinF, kMaxF));
  p.softcap = o.softcap;
  p.causal = o.is_causal;
  p.alignment = o.alignment;
  // A window side beyond 2^62 covers every key (INT64_MAX means unbounded); clamping it keeps
  // pos ± window inside int64 in key_range.
  constexpr std::int64_t kWideWindow = std::int64_t(1) << 62;
  p.window_left = o.window_left < 0 ? -1 : std::min(o.window_left, kWideWindow);
  p.window_right = o.window_right < 0 ? -1 : std::min(o.window_right, kWideWindow);

  if (o.nonpad_kv_seqlen) {
    const TensorView& t = *o.nonpad_kv_seqlen;
    const std::string want = fmt::format("[B] = [{}]", p.B);
    const std::vector<std::int64_t> lens = read_index(op, "nonpad_kv_seqlen", t, 1, want.c_str());
    if (t.size(0) != p.B)
      fail(op, fmt::format("nonpad_kv_seqlen has shape {}, expected {}", shape_str(t.shape()), want));
    for (std::int64_t b = 0; b < p.B; ++b) {
      const std::int64_t n = lens[std::size_t(b)];
      if (n < 0 || n > p.Nk)
        fail(op, fmt::format("nonpad_kv_seqlen[{}] = {} is outside [0, {}] (the number of keys)", b, n, p.Nk));
      p.kv_len.push_back(n);
    }
  }
  // (after the lengths: a float row's shift is taken over the keys its batch entry has)
  if (o.attn_mask) set_attn_mask(op, *o.attn_mask, p, store, thread_count(op, exec));

  if (o.alibi_slopes) {
    const TensorView& t = *o.alibi_slopes;
    const bool ok = (t.rank() == 1 && t.size(0) == p.Hq) || (t.rank() == 2 && t.size(0) == p.B && t.size(1) == p.Hq);
    if (!ok) fail(op, fmt::format("alibi_slopes has shape {}, expected [Hq] = [{}] or [B, Hq] = [{}, {}]",
                                  shape_str(t.shape()), p.Hq, p.B, p.Hq));
    std::vector<double> s = small_vector(op, "alibi_slopes", t);
    if (t.rank() == 1) {
      p.alibi.resize(std::size_t(p.B * p.Hq));
      for (std::int64_t b = 0; b < p.B; ++b) std::copy(s.begin(), s.end(), p.alibi.begin() + b * p.Hq);
    } else {
      p.alibi = std::move(s);
    }
  }
  if (o.sinks) {
    const TensorView& t = *o.sinks;
    if (t.rank() != 1 || t.size(0) != p.Hq)
      fail(op, fmt::format("sinks has shape {}, expected [Hq] = [{}]", shape_str(t.shape()), p.Hq));
    p.sinks = small_vector(op, "sinks", t);
  }
  p.num_threads = thread_count(op, exec);
  if (o.check_finite) {
    check_finite(op, "q", q);
    check_finite(op, "k", k);
    check_finite(op, "v", v);
    if (p.mask == mask_kind::additive) check_finite(op, "attn_mask", *o.attn_mask, /*minus_inf_ok=*/true);
  }
  return p;
}

namespace {
// f(index) for every index of `shape` in C order, until f returns false; returns whether it ran
// to the end.
template <class F>
bool for_each_index(const Shape& shape, F f) {
  Shape idx(shape.size(), 0);
  const std::int64_t n = TensorView(nullptr, dtype::f32, shape).numel();
  for (std::int64_t i = 0; i < n; ++i) {
    if (!f(idx)) return false;
    for (int d = int(shape.size()) - 1; d >= 0 && ++idx[std::size_t(d)] == shape[std::size_t(d)]; --d) idx[std::size_t(d)] = 0;
  }
  return true;
}
}  // namespace

void check_finite(const char* op, const char* name, const TensorView& t, bool minus_inf_ok) {
  if (!is_floating(t.type())) return;
  for_each_index(t.shape(), [&](const Shape& idx) {
    const double x = load_as_double(t.data(), t.type(), t.offset_of(idx));
    if (!std::isfinite(x) && !(minus_inf_ok && x == kNegInf))
      fail(op, fmt::format("check_finite: {} holds {} at index {}", name, x, shape_str(idx)));
    return true;
  });
}

const backend_impl& pick(const char* op, const problem& p, const backend_request& req, backend want) {
  const selection sel = select_backend(p, req, want);
  if (!sel.unknown.empty()) fail(op, fmt::format("ATTN_BACKEND = '{}' names no backend", sel.unknown));
  if (!sel.chosen)
    fail(op, fmt::format("no backend can run this call: {}", sel.reasons.empty() ? "backend not compiled in" : sel.reasons));
  return *sel.chosen;
}

namespace {

// Runs a backend's pass; working memory the machine does not have arrives as attn::error
// naming the call's sizes, never as std::bad_alloc.
template <class F>
void run_guarded(const char* op, const problem& p, const backend_impl& be, F&& pass) {
  try {
    pass();
  } catch (const std::bad_alloc&) {
    fail(op, fmt::format("out of memory on backend {} (B = {}, Hq = {}, Hkv = {}, Nq = {}, Nk = {}, D = {}, Dv = {})",
                         be.name(), p.B, p.Hq, p.Hkv, p.Nq, p.Nk, p.D, p.Dv));
  }
}

// Whether every key row i may see is excluded (-inf bias): a row with lse = -inf for a reason.
bool fully_masked(const problem& p, std::int64_t b, std::int64_t h, std::int64_t i) {
  const auto [lo, hi] = p.key_range(b, i);
  if (lo >= hi) return true;
  if (p.mask == mask_kind::none) return false;
  for (std::int64_t j = lo; j < hi; ++j)
    if (p.bias(b, h, i, j) != kNegInf) return false;
  return true;
}

}  // namespace

// One answer on every backend (special values, attention.h): a fast backend computes in
// float32, so a row it leaves non-finite (NaN or +inf scores, overflow, NaN or inf in v) or
// with lse = -inf although some key is visible (scores that overflowed to -inf) is computed
// again by the float64 reference. Where the backend handed over the rows it found non-finite as
// it wrote them (forward_outputs::found; the cpu backend), those alone are checked; otherwise
// one pass over out and lse, on the call's threads (each row read in its own dtype: at small
// shapes a serial, element-by-element scan cost a sixth of the forward). The rows redone are
// the rare ones, in row order.
// Elements below which a scan of the front runs on the calling thread alone.
constexpr std::int64_t kSerialScan = std::int64_t(1) << 16;

std::vector<std::int64_t> special_rows_of(const problem& p, const forward_outputs& fo) {
  const std::int64_t nrows = p.B * p.Hq * p.Nq;
  const strided4& out = fo.out;
  // The returned intermediate: NaN or +inf anywhere, or -inf where a score is not excluded (an
  // overflow; scaled and softcapped scores are never excluded).
  const strided4& qk = fo.qk;
  const auto qk_finite = [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    if (fo.qk_mode == qk_output::none) return true;
    const auto [lo, hi] = p.key_range(b, i);
    const float* row = qk.type == dtype::f32 ? qk.ptr<float>(b, h, i, 0) : nullptr;
    for (std::int64_t j = 0; j < p.Nk; ++j) {
      const double x = row ? double(row[j * qk.sx]) : qk.load(b, h, i, j);
      if (std::isnan(x) || x == -kNegInf) return false;
      if (x != kNegInf || fo.qk_mode == qk_output::probabilities) continue;
      if (fo.qk_mode != qk_output::biased || (j >= lo && j < hi && p.bias(b, h, i, j) != kNegInf)) return false;
    }
    return true;
  };
  // A count of the row's non-finite elements, not a short-circuit: the unit-stride loops vectorise.
  const auto finite_row = [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    const std::int64_t sx = out.sx, Dv = p.Dv;
    int bad = 0;
    if (out.type == dtype::f32) {
      const float* o = out.ptr<float>(b, h, i, 0);
      if (sx == 1)
        for (std::int64_t d = 0; d < Dv; ++d) bad += !(o[d] * 0.0f == 0.0f);  // NaN and ±inf give NaN
      else
        for (std::int64_t d = 0; d < Dv; ++d) bad += !(o[d * sx] * 0.0f == 0.0f);
      return bad == 0;
    }
    if (out.type == dtype::bf16 || out.type == dtype::f16) {
      const std::uint16_t* o = out.ptr<std::uint16_t>(b, h, i, 0);
      const std::uint16_t e = out.type == dtype::bf16 ? 0x7f80 : 0x7c00;  // all-ones exponent: inf or NaN
      if (sx == 1)
        for (std::int64_t d = 0; d < Dv; ++d) bad += (o[d] & e) == e;
      else
        for (std::int64_t d = 0; d < Dv; ++d) bad += (o[d * sx] & e) == e;
      return bad == 0;
    }
    for (std::int64_t d = 0; d < Dv; ++d) bad += !std::isfinite(out.load(b, h, i, d));
    return bad == 0;
  };
  const auto is_special = [&](std::int64_t row) {
    const std::int64_t i = row % p.Nq, h = row / p.Nq % p.Hq, b = row / p.Nq / p.Hq;
    const double lse = fo.lse_type == dtype::f32 ? double(static_cast<const float*>(fo.lse)[row])
                                                 : load_as_double(fo.lse, fo.lse_type, row);
    return std::isnan(lse) || lse == -kNegInf || (lse == kNegInf && !fully_masked(p, b, h, i)) || !finite_row(b, h, i) ||
           !qk_finite(b, h, i);
  };
  std::vector<std::int64_t> rows;
  if (fo.found && fo.found->complete && fo.qk_mode == qk_output::none) {
    // The backend noted, as it wrote them, the rows with a non-finite out or lse (a superset of
    // the special ones): those alone are checked, without a second read of out and lse.
    std::vector<std::int64_t> seen = fo.found->rows;
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    for (const std::int64_t row : seen)
      if (is_special(row)) rows.push_back(row);
    return rows;
  }
  // A decode step's out is a few thousand elements: one thread reads them in microseconds, where
  // waking the others (a futex each, under OMP_WAIT_POLICY=passive) costs more than the scan.
  const std::int64_t work = nrows * (p.Dv + (fo.qk_mode == qk_output::none ? 0 : p.Nk));
  const int nt = work < kSerialScan ? 1 : std::max(1, p.num_threads);
  std::vector<char> special(std::size_t(nrows), 0);
#pragma omp parallel for num_threads(nt) schedule(static)
  for (std::int64_t row = 0; row < nrows; ++row) special[std::size_t(row)] = is_special(row);
  for (std::int64_t row = 0; row < nrows; ++row)
    if (special[std::size_t(row)]) rows.push_back(row);
  return rows;
}

void check_special_rows(const problem& p, const forward_outputs& fo) {
  const std::vector<std::int64_t> rows = special_rows_of(p, fo);
  if (!rows.empty()) reference_forward_rows(p, fo, rows);
}

namespace {

// The lse (and biased scores) of the unshifted mask: + the row's shift (shift_mask_rows).
void unshift(const problem& p, const problem_storage& store, const forward_outputs& fo) {
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h)
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const double c = store.mask_shift.load(b, h, i, 0);
        const std::int64_t row = (b * p.Hq + h) * p.Nq + i;
        store_from_double(fo.lse, fo.lse_type, row, load_as_double(fo.lse, fo.lse_type, row) + c);
        if (fo.qk_mode == qk_output::biased)
          for (std::int64_t j = 0; j < p.Nk; ++j) fo.qk.store(b, h, i, j, fo.qk.load(b, h, i, j) + c);
      }
}

}  // namespace

// Sinks beside a shifted mask. Softmax is shift-invariant over the whole row, the sink's logit
// included: softmax(s + m, sink) = softmax(s + m - c, sink - c). A backend takes one sink per
// head, not per row, so such problems run without their sinks and each row's sink joins after
// the shift is back, in float64: with a the keys' lse, the row's lse becomes
// L = log(e^a + e^sink_h) and its weights (out, probabilities) are multiplied by e^(a - L). A
// row of finfo.min (no key kept) then gives zeros and lse = sink_h, as the unshifted softmax
// does (a backend that shifted only the mask weighed the keys as if there were no sink).
void join_sinks(const problem& p, const forward_outputs& fo) {  // fo.lse: float64, unshifted
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h)
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        const std::int64_t row = (b * p.Hq + h) * p.Nq + i;
        double* lse = static_cast<double*>(fo.lse) + row;
        const double a = *lse;
        if (std::isnan(a)) continue;  // (a NaN row stays NaN)
        const double L = sink_joined_lse(a, p.sinks[std::size_t(h)]);
        const double w = a == kNegInf ? 0.0 : std::exp(a - L);
        *lse = L;
        for (std::int64_t x = 0; x < p.Dv; ++x) fo.out.store(b, h, i, x, fo.out.load(b, h, i, x) * w);
        if (fo.qk_mode == qk_output::probabilities)
          for (std::int64_t j = 0; j < p.Nk; ++j) fo.qk.store(b, h, i, j, fo.qk.load(b, h, i, j) * w);
      }
}

void forward_on(const char* op, const problem& p, const problem_storage& store, const backend_impl& be,
                const forward_outputs& out) {
  forward_outputs fo = out;
  const bool sunk = store.shift.defined() && !p.sinks.empty();  // sinks joined by join_sinks
  problem p0;
  if (sunk) p0 = p, p0.sinks.clear();
  const problem& run = sunk ? p0 : p;
  // A shifted mask: the lse of the shifted scores may be a large number whose shift-back leaves a
  // small one (1e19 - 9.85e18): it stays float64 until the shift is added, then is rounded once.
  Tensor lse64, qk64, out64;
  if (store.shift.defined() && out.lse_type != dtype::f64) {
    lse64 = Tensor::empty({p.B, p.Hq, p.Nq}, dtype::f64);
    fo.lse = lse64.data();
    fo.lse_type = dtype::f64;
  }
  // Likewise the biased scores: a score of the shifted mask (-1e19 beside a shift of 1e19) is
  // past float16's range, and inf + shift cannot give the score back; and what join_sinks
  // rescales (out, probabilities), rounded once.
  const bool qk_later = out.qk_mode == qk_output::biased || (sunk && out.qk_mode == qk_output::probabilities);
  if (store.shift.defined() && qk_later && out.qk.type != dtype::f64) {
    qk64 = Tensor::empty({p.B, p.Hq, p.Nq, p.Nk}, dtype::f64);
    fo.qk = as_bhnx(qk64, p.Hq);
  }
  if (sunk && out.out.type != dtype::f64) {
    out64 = Tensor::empty({p.B, p.Hq, p.Nq, p.Dv}, dtype::f64);
    fo.out = as_bhnx(out64, p.Hq);
  }
  run_guarded(op, run, be, [&] { be.forward(run, fo); });
  if (&be != &reference_backend()) check_special_rows(run, fo);
  if (store.shift.defined()) unshift(p, store, fo);
  if (sunk) join_sinks(p, fo);
  const std::int64_t rows = p.B * p.Hq * p.Nq;
  if (lse64.defined())
    for (std::int64_t r = 0; r < rows; ++r) store_from_double(out.lse, out.lse_type, r, lse64.data_as<double>()[r]);
  if (!qk64.defined() && !out64.defined()) return;
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t h = 0; h < p.Hq; ++h)
      for (std::int64_t i = 0; i < p.Nq; ++i) {
        if (qk64.defined())
          for (std::int64_t j = 0; j < p.Nk; ++j) out.qk.store(b, h, i, j, fo.qk.load(b, h, i, j));
        if (out64.defined())
          for (std::int64_t x = 0; x < p.Dv; ++x) out.out.store(b, h, i, x, fo.out.load(b, h, i, x));
      }
}

namespace {

// The largest magnitude of the q·k terms a score adds up, bounded by Cauchy–Schwarz:
// Σ_d |q_id k_jd| <= |q_i|·|k_j|, so scale · max_i |q_i| · max_j |k_j| over the rows of q and the
// keys each batch entry holds (finite elements only: NaN and inf have their own contract). A
// float32 backend resolves a score to this magnitude · 2^-24, however small the score itself.
// One pass over q and k, on the call's threads (a maximum: the same whatever the order), each row
// read in its own dtype (f32 and bf16 directly: the pass is O(N·D), which a small backward
// notices).
namespace {
// Σ y² over the finite y = load(d) of a row, d < D, in eight partial sums (lane d % 8: a fixed
// order whatever the threads).
// (a non-finite y adds +0: the same bits as skipping it, the sums being >= +0)
template <class Load>
double finite_sum_of_squares(std::int64_t D, Load load) {
  return sum8(D, [&](std::int64_t d) {
    const double y = load(d);
    return std::isfinite(y) ? y * y : 0.0;
  });
}
// The same for a float32 row with unit stride, in the same order: when the row is finite (an
// integer test of the exponents first), loops without a branch that the compiler vectorises.
double finite_sum_of_squares(std::int64_t D, const float* r) {
  std::uint32_t bad = 0;
  for (std::int64_t d = 0; d < D; ++d) {
    std::uint32_t u;
    std::memcpy(&u, r + d, 4);
    bad |= std::uint32_t((u & 0x7f800000u) == 0x7f800000u);
  }
  if (bad) return finite_sum_of_squares(D, [r](std::int64_t d) { return double(r[d]); });
  return sum8(D, [r](std::int64_t d) { return double(r[d]) * double(r[d]); });
}
// The same for a bfloat16 row with unit stride (a bf16 is the high half of its float32).
double finite_sum_of_squares(std::int64_t D, const std::uint16_t* r) {
  const auto value = [r](std::int64_t d) { return double(bf16_to_f32(r[d])); };
  std::uint32_t bad = 0;
  for (std::int64_t d = 0; d < D; ++d) bad |= std::uint32_t((r[d] & 0x7f80u) == 0x7f80u);
  if (bad) return finite_sum_of_squares(D, value);
  return sum8(D, [&](std::int64_t d) { return value(d) * value(d); });
}
}  // namespace

double qk_term_bound(const problem& p) {
  const int nt = std::max(1, p.num_threads);
  const auto max_norm = [nt](const strided4& x, std::int64_t B, std::int64_t H, std::int64_t D, auto rows_of) {
    double m = 0;
#pragma omp parallel for collapse(2) reduction(max : m) num_threads(nt) schedule(static)
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t n = 0; n < rows_of(b); ++n) {
          double ss = 0;
          if (x.type == dtype::f32 && x.sx == 1) {
            const float* r = x.ptr<float>(b, h, n, 0);
            ss = finite_sum_of_squares(D, r);
          } else if (x.type == dtype::f32) {
            const float* r = x.ptr<float>(b, h, n, 0);
            ss = finite_sum_of_squares(D, [r, &x](std::int64_t d) { return double(r[d * x.sx]); });
          } else if (x.type == dtype::bf16 && x.sx == 1) {
            ss = finite_sum_of_squares(D, static_cast<const std::uint16_t*>(x.ptr<std::uint16_t>(b, h, n, 0)));
          } else if (x.type == dtype::bf16) {
            const std::uint16_t* r = x.ptr<std::uint16_t>(b, h, n, 0);
            ss = finite_sum_of_squares(D, [r, &x](std::int64_t d) { return double(bf16_to_f32(r[d * x.sx])); });
          } else {
            ss = finite_sum_of_squares(D, [&x, b, h, n](std::int64_t d) { return x.load(b, h, n, d); });
          }
          m = std::max(m, ss);
        }
    return std::sqrt(m);
  };
  const double q = max_norm(p.q, p.B, p.Hq, p.D, [&](std::int64_t) { return p.Nq; });
  const double k = max_norm(p.k, p.B, p.Hkv, p.D, [&](std::int64_t b) { return p.keys_valid(b); });
  return std::abs(p.scale) * q * k;
}

// qk_term_bound's bound, coarser, at the cost of one integer max per element: |q_i|·|k_j| <=
// D · max_d |q_id| · max_d |k_jd| over the finite elements (a float's and a bfloat16's magnitude
// orders as its bits do, the sign cleared). +inf where a view is not unit-stride float32 or
// bfloat16. Most calls are decided by it (N(0, 1) rows at D 128: ≈ 230 against kWideLse's 1024).
// The scan is the cpu kernels' (cpu_max_abs_bits: this CPU's vectors), a head at a time.
double qk_term_bound_coarse(const problem& p) {
  const auto scannable = [](const strided4& x, std::int64_t D) {
    return (x.type == dtype::f32 || x.type == dtype::bf16) && (x.sx == 1 || D <= 1);
  };
  if (!scannable(p.q, p.D) || !scannable(p.k, p.D)) return std::numeric_limits<double>::infinity();
  // Rows [0, n) of head (b, h): one span where the rows are contiguous, else row by row.
  const max_abs_bits_fn scan = cpu_max_abs_bits();
  const auto head_max = [&](const strided4& x, std::int64_t b, std::int64_t h, std::int64_t n) {
    const std::int64_t es = std::int64_t(dtype_size(x.type));
    const bool bf16 = x.type == dtype::bf16;
    const char* r = static_cast<const char*>(x.data) + x.offset(b, h, 0, 0) * es;
    if (x.sn == p.D || n <= 1) return scan(r, n * p.D, bf16);
    std::int32_t m = 0;
    for (std::int64_t i = 0; i < n; ++i) m = std::max(m, scan(r + i * x.sn * es, p.D, bf16));
    return m;
  };
  // q's heads, then k's, in one parallel region (each region wakes the threads: a futex each
  // under OMP_WAIT_POLICY=passive, tens of microseconds on a virtual machine).
  const std::int64_t hq = p.B * p.Hq, hk = p.B * p.Hkv;
  std::int32_t mq = 0, mk = 0;
  team_join join;
#pragma omp parallel num_threads(std::max(1, p.num_threads))
  {
#pragma omp for reduction(max : mq) schedule(static) nowait
    for (std::int64_t u = 0; u < hq; ++u) mq = std::max(mq, head_max(p.q, u / p.Hq, u % p.Hq, p.Nq));
#pragma omp for reduction(max : mk) schedule(static) nowait
    for (std::int64_t u = 0; u < hk; ++u) mk = std::max(mk, head_max(p.k, u / p.Hkv, u % p.Hkv, p.keys_valid(u / p.Hkv)));
    join.arrive();
  }
  const auto as_float = [](std::int32_t m) {
    float f;
    std::memcpy(&f, &m, 4);
    return double(f);
  };
  return std::abs(p.scale) * double(p.D) * as_float(mq) * as_float(mk);
}

// Whether n elements of type t from d (unit stride) hold a NaN or ±inf: read in their own dtype,
// or-ed into an accumulator as narrow as the elements (no widening to 64 bits per element, which
// cost more than the loads), no short-circuit, so that the loops vectorise.
bool any_special(const void* d, dtype t, std::int64_t n) {
  switch (t) {
    case dtype::f32: {
      const float* y = static_cast<const float*>(d);
      std::int32_t any = 0;
      for (std::int64_t i = 0; i < n; ++i) any |= std::int32_t(!(y[i] * 0.0f == 0.0f));  // NaN and ±inf give NaN
      return any != 0;
    }
    case dtype::bf16:
    case dtype::f16: {
      const std::uint16_t* y = static_cast<const std::uint16_t*>(d);
      const std::uint16_t e = t == dtype::bf16 ? 0x7f80 : 0x7c00;  // all-ones exponent: inf or NaN
      std::uint16_t any = 0;
      for (std::int64_t i = 0; i < n; ++i) any |= std::uint16_t((y[i] & e) == e);
      return any != 0;
    }
    default: {
      std::int64_t bad = 0;
      for (std::int64_t i = 0; i < n; ++i) bad += !std::isfinite(load_as_double(d, t, i));
      return bad != 0;
    }
  }
}

// Whether every element of a gradient is finite: a contiguous one in chunks on nt threads (a
// serial float64 copy of dq, dk and dv cost a tenth of a small backward); a strided one (the
// caller's, attention_backward_into; a packed sequence's rows, the varlen ops) row by row where
// its last dim has unit stride, else element by element.
bool all_finite(const TensorView& t, int nt) {
  const std::size_t es = dtype_size(t.type());
  if (!t.is_contiguous()) {
    if (t.rank() < 2 || t.stride(-1) != 1)
      return for_each_index(t.shape(), [&](const Shape& idx) {
        return std::isfinite(load_as_double(t.data(), t.type(), t.offset_of(idx)));
      });
    const Shape outer(t.shape().begin(), t.shape().end() - 1);
    Shape idx(t.shape().size(), 0);
    return for_each_index(outer, [&](const Shape& o) {
      std::copy(o.begin(), o.end(), idx.begin());
      return !any_special(static_cast<const std::byte*>(t.data()) + std::size_t(t.offset_of(idx)) * es, t.type(),
                          t.size(-1));
    });
  }
  const std::int64_t n = t.numel();
  std::int64_t bad = 0;
  constexpr std::int64_t kChunk = std::int64_t(1) << 14;
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for num_threads(nt) reduction(+ : bad) schedule(static)
  for (std::int64_t c = 0; c < chunks; ++c)
    bad += any_special(static_cast<const std::byte*>(t.data()) + std::size_t(c * kChunk) * es, t.type(),
                       std::min(kChunk, n - c * kChunk));
  return bad == 0;
}
bool all_finite(const Tensor& t, int nt) { return !t.defined() || all_finite(t.view(), nt); }

// Element by element, src into dst of the same shape (any strides, converting through double).
void copy_elements(const TensorView& src, const TensorView& dst) {
  for_each_index(src.shape(), [&](const Shape& idx) {
    store_from_double(dst.data(), dst.type(), dst.offset_of(idx), load_as_double(src.data(), src.type(), src.offset_of(idx)));
    return true;
  });
}

// A destination of a *_into call: its shape and dtype, memory behind it, and no element written
// twice.
void check_destination(const char* op, const char* name, const TensorView& t, const Shape& shape, dtype type) {
  if (t.shape() != shape) fail(op, fmt::format("{} has shape {}, expected {}", name, shape_str(t.shape()), shape_str(shape)));
  if (t.type() != type) fail(op, fmt::format("{} has dtype {}, expected {}", name, dtype_name(t.type()), dtype_name(type)));
  if (t.data() == nullptr && t.numel() != 0) fail(op, fmt::format("{} has no data", name));
  if (overlaps_itself(t)) fail(op, fmt::format("{} overlaps itself (strides {})", name, shape_str(t.strides())));
}

// No destination shares memory with another or with an input (a null input: not given).
using named_views = std::vector<std::pair<const char*, const TensorView*>>;
void check_disjoint(const char* op, const named_views& outputs, const named_views& inputs) {
  for (auto o = outputs.begin(); o != outputs.end(); ++o) {
    for (auto x = std::next(o); x != outputs.end(); ++x)
      if (may_share_memory(*o->second, *x->second)) fail(op, fmt::format("{} and {} share memory", o->first, x->first));
    for (const auto& [name, t] : inputs)
      if (t && may_share_memory(*o->second, *t)) fail(op, fmt::format("{} shares memory with input {}", o->first, name));
  }
}

Shape out_shape(const TensorView& q, const problem& p) {
  return q.rank() == 4 ? Shape{p.B, p.Hq, p.Nq, p.Dv} : Shape{p.B, p.Nq, p.Hq * p.Dv};
}

// attention(), or attention_into() when dst is set (out and lse in the caller's memory; the
// result's out and lse then stay empty).
attention_result run_forward(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                             const attention_options& options, const execution& exec, const cache_input* cache,
                             const attention_outputs* dst = nullptr) {
  if (dst && (options.past_key || options.past_value))
    fail(op, "past_key/past_value are refused (their present is a new tensor): use attention()");
  if (dst && options.return_qk != qk_output::none) fail(op, "return_qk is refused: use attention()");
  problem_storage store;
  const problem p = build_problem(op, q, k, v, options, exec, store, cache);

  attention_result r;
  const dtype lse_type = q.type() == dtype::f64 ? dtype::f64 : dtype::f32;
  const Shape lse_shape{p.B, p.Hq, p.Nq};
  TensorView out_view, lse_view;  // where the backend writes them
  if (dst) {
    check_destination(op, "out", dst->out, out_shape(q, p), q.type());
    if (dst->lse) check_destination(op, "lse", *dst->lse, lse_shape, lse_type);
    named_views outs{{"out", &dst->out}};
    if (dst->lse) outs.push_back({"lse", &*dst->lse});
    check_disjoint(op, outs, {{"q", &q}, {"k", &k}, {"v", &v}, {"attn_mask", options.attn_mask ? &*options.attn_mask : nullptr}});
    out_view = dst->out;
    // The backends write lse as contiguous rows: the caller's own when it is laid out so.
    if (dst->lse && dst->lse->is_contiguous()) lse_view = *dst->lse;
    else r.lse = Tensor::empty(lse_shape, lse_type), lse_view = r.lse.view();
  } else {
    r.out = Tensor::empty(out_shape(q, p), q.type());
    r.lse = Tensor::empty(lse_shape, lse_type);
    out_view = r.out.view(), lse_view = r.lse.view();
  }
  special_rows found;
  forward_outputs fo;
  fo.out = as_bhnx(out_view, p.Hq);
  fo.lse = lse_view.data();
  fo.lse_type = lse_type;
  fo.qk_mode = options.return_qk;
  fo.found = &found;
  if (options.return_qk != qk_output::none) {
    r.qk = Tensor::empty({p.B, p.Hq, p.Nq, p.Nk}, q.type());
    fo.qk = as_bhnx(r.qk, p.Hq);
  }
  const backend_impl& be = pick(op, p, {.backward = false, .qk = options.return_qk}, exec.use_backend);
  forward_on(op, p, store, be, fo);
  if (dst && dst->lse && lse_view.data() != dst->lse->data()) copy_elements(lse_view, *dst->lse);
  if (dst) r.lse = Tensor();
  r.backend = be.name();
  r.present_key = store.present_key;
  r.present_value = store.present_value;
  return r;
}

// The cache lengths as a vector: int64 or int32 [B].
std::vector<std::int64_t> cache_lengths(const char* op, const TensorView& t) {
  return read_index(op, "cache lengths", t, 1, "[B]");
}

}  // namespace

}  // namespace detail

attention_result attention(const TensorView& q, const TensorView& k, const TensorView& v,
                           const attention_options& options, const execution& exec) {
  return detail::run_forward("attention", q, k, v, options, exec, nullptr);
}

std::string attention_into(const TensorView& q, const TensorView& k, const TensorView& v, const attention_outputs& dst,
                           const attention_options& options, const execution& exec) {
  return detail::run_forward("attention_into", q, k, v, options, exec, nullptr, &dst).backend;
}

attention_result attention_with_kv_cache(const TensorView& q, const TensorView& k_new, const TensorView& v_new,
                                         const kv_cache_view& cache, const attention_options& options,
                                         const execution& exec) {
  using namespace detail;
  const char* op = "attention_with_kv_cache";
  const cache_input in{cache.key, cache.value, cache_lengths(op, cache.lengths)};
  return run_forward(op, q, k_new, v_new, options, exec, &in);
}

kv_cache::kv_cache(std::int64_t B, std::int64_t Hkv, std::int64_t capacity, std::int64_t D, std::int64_t Dv, dtype t) {
  using detail::fail;
  if (B < 0 || Hkv < 0 || capacity < 0 || D < 0 || Dv < 0)
    fail("kv_cache", fmt::format("sizes B = {}, Hkv = {}, capacity = {}, D = {}, Dv = {} must not be negative", B, Hkv,
                                 capacity, D, Dv));
  if (!is_floating(t)) fail("kv_cache", fmt::format("dtype {} is not a float dtype", dtype_name(t)));
  key_ = Tensor::zeros({B, Hkv, capacity, D}, t);
  value_ = Tensor::zeros({B, Hkv, capacity, Dv}, t);
  lengths_ = Tensor::zeros({B}, dtype::i64);
}

void kv_cache::advance(std::int64_t n) {
  auto* len = lengths_.data_as<std::int64_t>();
  for (std::int64_t b = 0; b < lengths_.size(0); ++b)
    if (n < 0 ? len[b] + n < 0 : len[b] > capacity() - n)
      detail::fail("kv_cache", fmt::format("advancing length {} of batch entry {} by {} leaves [0, {}]", len[b], b, n,
                                           capacity()));
  for (std::int64_t b = 0; b < lengths_.size(0); ++b) len[b] += n;
}

void kv_cache::clear() {
  auto* len = lengths_.data_as<std::int64_t>();
  std::fill(len, len + lengths_.size(0), std::int64_t(0));
}

attention_result attention_with_kv_cache(const TensorView& q, const TensorView& k_new, const TensorView& v_new,
                                         kv_cache& cache, const attention_options& options, const execution& exec) {
  attention_result r = attention_with_kv_cache(q, k_new, v_new, cache.view(), options, exec);
  cache.advance(k_new.rank() >= 3 ? k_new.size(k_new.rank() == 4 ? 2 : 1) : 0);
  return r;
}

namespace detail {
const backend_impl& backward_on(const char* op, const problem& p, const problem_storage& store, const TensorView& lse,
                                backward_io io, const backend_impl& picked, backend use, const backward_guards& guards) {
  Tensor lse_c = lse.is_contiguous() ? Tensor() : Tensor::copy_of(lse);
  // Sinks beside a shifted mask run without them (join_sinks): the lse recomputed below is the
  // keys' with the row's sink joined at sink_h - c, and dsinks is the front's, from it.
  const bool sunk = store.shift.defined() && !p.sinks.empty();
  problem p0;
  if (sunk) p0 = p, p0.sinks.clear();
  const problem& run = sunk ? p0 : p;
  double* const dsinks = io.dsinks;
  if (sunk) io.dsinks = nullptr;
  // A float32 backward recomputes p = e^{s - lse}: |lse| past kWideLse leaves s - lse fewer
  // than 13 good bits, so such calls run on the float64 reference, whatever was asked (one
  // answer on every backend; the result's `backend` says so). The lse they were given came from
  // some forward, perhaps a float32 one whose scores differ from float64's by more than p's
  // range (huge terms that cancel, added in another order: s = -1.5e18 against float64's 0 made
  // p = e^{1.5e18}), so the reference computes their lse again, from its own scores.
  // The same holds for q·k terms past kWideLse that cancel into a small score and lse: float32
  // resolves such a score only to the terms' magnitude · 2^-24, a forward and a backward that
  // add the terms in different orders disagree by that much, and p = e^{s - lse} is off by the
  // exponential of it (terms of 3.6e19 cancelling to 8.7: the cpu forward's score 0 and lse
  // 0.13, its backward's score 8.7, p = 5245). An ALiBi bias needs no such bound here: it can
  // cancel only against large q·k terms (caught by this bound) or a float mask (whose gradient
  // runs on the reference); otherwise a large bias makes the score itself large, and so the lse
  // or the key's weight negligible.
  constexpr double kWideLse = 1024.0;
  const auto lse_from = [&](const backend_impl& fb) {
    const Tensor o = Tensor::empty({p.B, p.Hq, p.Nq, p.Dv}, p.q.type);
    lse_c = Tensor::empty({p.B, p.Hq, p.Nq}, p.q.type == dtype::f64 || &fb == &reference_backend() ? dtype::f64 : dtype::f32);
    special_rows found;
    forward_outputs fo;
    fo.out = as_bhnx(o, p.Hq), fo.lse = lse_c.data(), fo.lse_type = lse_c.type(), fo.found = &found;
    run_guarded(op, run, fb, [&] { fb.forward(run, fo); });
    if (&fb != &reference_backend()) check_special_rows(run, fo);
    if (sunk)
      for (std::int64_t b = 0; b < p.B; ++b)
        for (std::int64_t h = 0; h < p.Hq; ++h)
          for (std::int64_t i = 0; i < p.Nq; ++i) {
            const std::int64_t row = (b * p.Hq + h) * p.Nq + i;
            const double a = load_as_double(fo.lse, fo.lse_type, row);
            if (!std::isnan(a))
              store_from_double(fo.lse, fo.lse_type, row,
                                sink_joined_lse(a, p.sinks[std::size_t(h)] - store.mask_shift.load(b, h, i, 0)));
          }
  };
  // A shifted mask: the lse of the shifted scores, recomputed.
  if (store.shift.defined()) lse_from(pick(op, p, {}, use));
  bool wide = false;  // the lse or the q·k terms past kWideLse
  for (double x : to_vector(lse_c.defined() ? lse_c.view() : lse)) wide |= std::isfinite(x) && std::abs(x) > kWideLse;
  wide |= qk_term_bound_coarse(p) > kWideLse && qk_term_bound(p) > kWideLse;
  if (wide) lse_from(reference_backend());

  io.lse = lse_c.defined() ? lse_c.data() : lse.data();
  io.lse_type = lse_c.defined() ? lse_c.type() : lse.type();
  const int nt = std::max(1, p.num_threads);
  const backend_impl& be = wide ? reference_backend() : picked;
  bool seen_finite[3] = {false, false, false};  // dq, dk, dv as the backend saw them (backward_io::finite)
  io.finite = seen_finite;
  run_guarded(op, run, be, [&] { be.backward(run, io); });
  io.finite = nullptr;
  // d sink_h = -Σ_i p_sink,i · Δ_i, Δ_i = dout_i · out_i (the sink's value row is zero).
  const auto sink_gradient = [&] {
    if (!sunk || !dsinks) return;
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t h = 0; h < p.Hq; ++h)
        for (std::int64_t i = 0; i < p.Nq; ++i) {
          const double l = load_as_double(io.lse, io.lse_type, (b * p.Hq + h) * p.Nq + i);
          if (l == kNegInf) continue;
          double delta = 0.0;
          for (std::int64_t x = 0; x < p.Dv; ++x) delta += io.dout.load(b, h, i, x) * io.out.load(b, h, i, x);
          dsinks[h] -= std::exp(p.sinks[std::size_t(h)] - store.mask_shift.load(b, h, i, 0) - l) * delta;
        }
  };
  // One answer on every backend: non-finite gradients from a float32 backend (special values,
  // overflow) are computed again, all of them, by the float64 reference.
  if (&be != &reference_backend() &&
      !((seen_finite[0] || all_finite(guards.dq, nt)) && (seen_finite[1] || all_finite(guards.dk, nt)) &&
        (seen_finite[2] || all_finite(guards.dv, nt)) && guards.finite())) {
    guards.reset();
    reference_backend().backward(run, io);
    sink_gradient();
    return reference_backend();
  }
  sink_gradient();
  return be;
}

namespace {

// attention_backward(), or attention_backward_into() when dst is set (dq, dk, dv in the caller's
// memory; the result's then stay empty).
attention_grads run_backward(const char* op, const TensorView& q, const TensorView& k, const TensorView& v,
                             const TensorView& out, const TensorView& dout, const TensorView& lse,
                             const attention_options& options, const execution& exec,
                             const attention_grad_outputs* dst) {
  if (options.past_key || options.past_value)
    fail(op, "past_key/past_value are not accepted; pass present_key/present_value as k and v");
  if (options.return_qk != qk_output::none) fail(op, "return_qk is a forward option; leave it at none");
  problem_storage store;
  problem p = build_problem(op, q, k, v, options, exec, store);

  const Shape os = out_shape(q, p);
  if (out.shape() != os) fail(op, fmt::format("out has shape {}, expected {}", shape_str(out.shape()), shape_str(os)));
  if (dout.shape() != os) fail(op, fmt::format("dout has shape {}, expected {}", shape_str(dout.shape()), shape_str(os)));
  if (!is_floating(out.type()) || !is_floating(dout.type()))
    fail(op, fmt::format("out/dout have dtypes {}/{}, expected float dtypes", dtype_name(out.type()), dtype_name(dout.type())));
  const Shape ls{p.B, p.Hq, p.Nq};
  if (lse.shape() != ls) fail(op, fmt::format("lse has shape {}, expected {}", shape_str(lse.shape()), shape_str(ls)));
  if (lse.type() != dtype::f32 && lse.type() != dtype::f64)
    fail(op, fmt::format("lse has dtype {}, expected float32 or float64", dtype_name(lse.type())));
  if (options.check_finite) {
    check_finite(op, "out", out);
    check_finite(op, "dout", dout);
    check_finite(op, "lse", lse, /*minus_inf_ok=*/true);  // -inf: a fully masked row
  }
  attention_grads g;
  TensorView dq, dk, dv;  // where the backend writes them
  if (dst) {
    // The dtype of q, or float32 for a 16-bit q: the gradients before their rounding (a
    // mixed-precision trainer's float32 gradients; the family's chain rules through a prepared
    // q and k). The backends accumulate in float32 either way and round once, on the store.
    const bool half = q.type() == dtype::bf16 || q.type() == dtype::f16;
    const auto check_grad = [&](const char* name, const TensorView& t, const Shape& shape) {
      if (half && t.type() != q.type() && t.type() != dtype::f32)
        fail(op, fmt::format("{} has dtype {}, expected {} or float32 (the dtype of q, or float32 for a 16-bit q)", name,
                             dtype_name(t.type()), dtype_name(q.type())));
      check_destination(op, name, t, shape, half && t.type() == dtype::f32 ? dtype::f32 : q.type());
    };
    check_grad("dq", dst->dq, q.shape());
    check_grad("dk", dst->dk, k.shape());
    check_grad("dv", dst->dv, v.shape());
    const TensorView* mask = options.attn_mask ? &*options.attn_mask : nullptr;
    check_disjoint(op, {{"dq", &dst->dq}, {"dk", &dst->dk}, {"dv", &dst->dv}},
                   {{"q", &q}, {"k", &k}, {"v", &v}, {"out", &out}, {"dout", &dout}, {"lse", &lse}, {"attn_mask", mask}});
    dq = dst->dq, dk = dst->dk, dv = dst->dv;
  } else {
    g.dq = Tensor::empty(q.shape(), q.type());
    g.dk = Tensor::empty(k.shape(), q.type());
    g.dv = Tensor::empty(v.shape(), q.type());
    dq = g.dq.view(), dk = g.dk.view(), dv = g.dv.view();
  }
  backward_io io;
  io.out = as_bhnx(out, p.Hq);
  io.dout = as_bhnx(dout, p.Hq);
  io.dq = as_bhnx(dq, p.Hq);
  io.dk = as_bhnx(dk, p.Hkv);
  io.dv = as_bhnx(dv, p.Hkv);

  Tensor dmask, dalibi, dsinks;
  if (p.mask == mask_kind::additive && options.mask_gradient) {
    const TensorView& m = *options.attn_mask;
    // A float32 mask without broadcast dims takes one ds per element: written in float32 (the
    // same rounding as a float64 sum of one term), without a float64 copy of its size.
    const bool one_term = m.numel() == p.B * p.Hq * p.Nq * m.size(-1);
    dmask = Tensor::zeros(m.shape(), one_term && m.type() == dtype::f32 ? dtype::f32 : dtype::f64);
    // Same broadcast strides as the mask, over the contiguous accumulator.
    const TensorView acc = dmask.view();
    std::int64_t st[4] = {0, 0, 0, 0};
    const int off = 4 - m.rank();
    for (int i = 0; i < m.rank(); ++i)
      if (m.size(i) != 1 || off + i == 3) st[off + i] = acc.stride(i);
    io.dmask = strided4{dmask.data(), dmask.type(), st[0], st[1], st[2], st[3]};
  }
  if (!p.alibi.empty()) {
    dalibi = Tensor::zeros({p.B * p.Hq}, dtype::f64);
    io.dalibi = dalibi.data_as<double>();
  }
  if (!p.sinks.empty()) {
    dsinks = Tensor::zeros({p.Hq}, dtype::f64);
    io.dsinks = dsinks.data_as<double>();
  }

  const backend_impl& picked = pick(op, p, {.backward = true, .dmask = io.dmask.data != nullptr}, exec.use_backend);
  const int nt = std::max(1, p.num_threads);
  const backward_guards guards{
      dq, dk, dv,
      [&] {
        for (const Tensor* acc : {&dmask, &dalibi, &dsinks})
          if (acc->defined()) std::memset(acc->data(), 0, std::size_t(acc->numel()) * dtype_size(acc->type()));
      },
      [&] { return all_finite(dalibi, 1) && all_finite(dsinks, 1) && all_finite(dmask, nt); }};
  g.backend = backward_on(op, p, store, lse, io, picked, exec.use_backend, guards).name();

  if (dmask.defined()) g.dattn_mask = dmask.type() == options.attn_mask->type() ? dmask : dmask.to(options.attn_mask->type());
  if (dalibi.defined()) {
    const TensorView& s = *options.alibi_slopes;
    if (s.rank() == 1) {  // slopes shared by the batch: sum over b
      Tensor r = Tensor::zeros({p.Hq}, dtype::f64);
      for (std::int64_t b = 0; b < p.B; ++b)
        for (std::int64_t h = 0; h < p.Hq; ++h) r.data_as<double>()[h] += dalibi.data_as<double>()[b * p.Hq + h];
      g.dalibi_slopes = r.to(s.type());
    } else {
      g.dalibi_slopes = Tensor::copy_of(dalibi.view().reshape({p.B, p.Hq}), s.type());
    }
  }
  if (dsinks.defined()) g.dsinks = dsinks.to(options.sinks->type());
  return g;
}

}  // namespace
}  // namespace detail

attention_grads attention_backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& dout, const TensorView& lse,
                                   const attention_options& options, const execution& exec) {
  return detail::run_backward("attention_backward", q, k, v, out, dout, lse, options, exec, nullptr);
}

attention_grads attention_backward_into(const TensorView& q, const TensorView& k, const TensorView& v,
                                        const TensorView& out, const TensorView& dout, const TensorView& lse,
                                        const attention_grad_outputs& dst, const attention_options& options,
                                        const execution& exec) {
  return detail::run_backward("attention_backward_into", q, k, v, out, dout, lse, options, exec, &dst);
}

std::string explain_backend(const TensorView& q, const TensorView& k, const TensorView& v,
                            const attention_options& options, bool backward, const execution& exec) {
  using namespace detail;
  problem_storage store;
  attention_options o = options;
  if (backward) o.past_key.reset(), o.past_value.reset();
  const problem p = build_problem("explain_backend", q, k, v, o, exec, store);
  backend_request req;
  req.backward = backward;
  req.qk = backward ? qk_output::none : options.return_qk;
  req.dmask = backward && p.mask == mask_kind::additive && options.mask_gradient;
  const selection sel = select_backend(p, req, exec.use_backend);
  std::string s = sel.reasons;
  auto add = [&s](const std::string& x) { s += (s.empty() ? "" : "; ") + x; };
  if (!sel.unknown.empty()) {
    add(fmt::format("ATTN_BACKEND = '{}' names no backend", sel.unknown));
  } else if (!sel.chosen) {
    add("no backend is eligible");
  } else {
    const std::string path = sel.chosen->path ? sel.chosen->path(p, req) : std::string();
    add(fmt::format("runs on {}{}", sel.chosen->name(), path.empty() ? "" : " (" + path + ")"));
  }
  return s;
}

}  // namespace attn

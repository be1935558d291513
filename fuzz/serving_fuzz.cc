// fuzz/serving_fuzz.cc — the differential fuzzer of the serving ops (include/attn/serving.h):
// attention_paged on float or int8 pages (paged_kv_append first on half the inputs),
// attention_paged_backward on float pages, attention_paged_varlen and its backward, and attention_varlen forward and backward (both varlen ops with masks
// packed per sequence on a third of the inputs). The bytes choose the batch,
// heads, sizes, page size, block tables (shuffled, shared, entries past a sequence's pages out of
// range: legal, never read), int32 or int64 indices, the options (causal and its alignment,
// windows, softcap, scale, ALiBi [Hq] or [B, Hq], sinks, a bool or float mask on the paged op),
// the thread count and the values. Every page slot that no sequence reads holds NaN, ±inf or
// ±1e19 (a real cache's stale rows): none may reach a result.
//
// A valid input must run on both backends and give, sequence by sequence, what attn::attention
// gives on the dense keys of that sequence — the float64 reference on float64 copies of the same
// values (the dequantised ones for int8 pages) — within the dtype's tolerance; with special
// values in the data (one input in four) the NaN/±inf pattern must be the core op's on the cpu
// backend. One input in eight corrupts one argument (a page outside the table that a sequence
// reads, a length beyond the capacity, cu_seqlens out of order or past max_seqlen, scales of
// the wrong shape, a mask wider than the capacity): the op must then throw attn::error naming
// itself, on both backends, and leave the cache as it was.
#include <algorithm>
#include <array>
#include <functional>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attn/attention.h"
#include "attn/error.h"
#include "attn/serving.h"
#include "attn/tensor.h"
#include "fuzz_bytes.h"
#include "serving_fuzz.h"

namespace attn::fuzz {
serving_counts& serving_fuzz_counts() {
  static serving_counts c;
  return c;
}
}  // namespace attn::fuzz

namespace {

using namespace attn;
using fuzz::bytes;

[[noreturn]] void finding(const std::string& what, const std::string& detail) {
  fuzz::finding("serving_fuzz", what, detail);
}

double tol_for(dtype t) {
  switch (t) {
    case dtype::f64: return 1e-9;
    case dtype::f32: return 2e-4;
    case dtype::f16: return 4e-3;
    default: return 3e-2;
  }
}

// A stale slot's value: what an uninitialised or reused page may hold.
double garbage(std::int64_t i) {
  constexpr double g[] = {NAN, INFINITY, -INFINITY, 1e19, -1e19, NAN, 3e38};
  return g[i % 7];
}

Tensor index_tensor(const Shape& s, bool i32, const std::vector<std::int64_t>& v) {
  Tensor t = Tensor::empty(s, i32 ? dtype::i32 : dtype::i64);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i32) t.data_as<std::int32_t>()[i] = std::int32_t(v[i]);
    else t.data_as<std::int64_t>()[i] = v[i];
  }
  return t;
}

// got vs want, elementwise: with specials only the NaN/±inf pattern, else |got − want| ≤ tol (1 + |want|) too;
// max_finite: the largest finite value of got's dtype; nonfinite_alike: NaN and ±inf count as one.
void compare(const std::string& what, const std::vector<double>& g, const std::vector<double>& w, double tol,
             bool pattern_only, double max_finite, bool nonfinite_alike = false, double slack = 0) {
  if (g.size() != w.size()) finding(what, "sizes differ: " + std::to_string(g.size()) + " vs " + std::to_string(w.size()));
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (nonfinite_alike && !std::isfinite(g[i]) && !std::isfinite(w[i])) continue;
    if (std::isnan(g[i]) || std::isnan(w[i])) {
      if (std::isnan(g[i]) != std::isnan(w[i]))
        finding(what, "NaN pattern at " + std::to_string(i) + ": " + std::to_string(g[i]) + " vs " + std::to_string(w[i]));
      continue;
    }
    // A truth beyond the output dtype's largest finite value rounds to inf of its sign (float16
    // holds 65504 at most): the right answer, not a finding.
    if (std::isinf(g[i]) && std::isfinite(w[i]) && std::abs(w[i]) > max_finite && std::signbit(g[i]) == std::signbit(w[i]))
      continue;
    if (std::isinf(g[i]) || std::isinf(w[i])) {
      if (g[i] != w[i] && !(pattern_only && std::isinf(g[i]) && std::isinf(w[i])))
        finding(what, "inf at " + std::to_string(i) + ": " + std::to_string(g[i]) + " vs " + std::to_string(w[i]));
      continue;
    }
    if (!pattern_only && std::abs(g[i] - w[i]) > tol * (1 + std::abs(w[i])) + slack)
      finding(what, "at " + std::to_string(i) + ": " + std::to_string(g[i]) + " vs " + std::to_string(w[i]));
  }
}

// The bytes' choices common to every op.
struct setup {
  int op = 0;           // 0 paged (float pages), 1 paged (int8 pages), 2 paged_varlen, 3 varlen
  dtype t = dtype::f32;  // q's dtype (and the float pages')
  bool specials = false, corrupt = false, i32 = false;
  std::int64_t B = 1, Hkv = 1, G = 1, Hq = 1, D = 1, Dv = 1;
  attention_options o;
  execution cpu{.use_backend = backend::automatic, .num_threads = 1};  // the cpu backend where it runs the call
};

// A value of the data: moderate, or with specials anything fuzz::bytes::value gives.
double datum(bytes& in, const setup& s) { return s.specials ? in.value() : in.moderate(); }

void fill(bytes& in, const setup& s, Tensor& x) {
  for (std::int64_t i = 0; i < x.numel(); ++i) store_from_double(x.data(), x.type(), i, datum(in, s));
}

// The options of one sequence for the dense oracle: ALiBi's row b, the mask's batch entry b and
// its first L columns, after_past as bottom_right (the paged ops' reading of it).
attention_options oracle_options(const attention_options& o, std::int64_t b, std::int64_t L, bool paged) {
  attention_options r = o;
  if (o.alibi_slopes && o.alibi_slopes->rank() == 2) r.alibi_slopes = Tensor::copy_of(o.alibi_slopes->slice(0, b, b + 1).reshape({o.alibi_slopes->size(1)}));
  if (paged && r.alignment == causal_alignment::after_past) r.alignment = causal_alignment::bottom_right;
  if (o.attn_mask) {
    TensorView m = *o.attn_mask;
    if (m.size(0) > 1) m = m.slice(0, b, b + 1);
    if (L == 0) r.attn_mask.reset();  // no keys: nothing to mask
    else r.attn_mask = Tensor::copy_of(m.slice(3, 0, std::min(m.size(3), L)));
  }
  return r;
}

// The paged cache of a case: pages in any order, shared, some slots stale.
struct cache_case {
  std::int64_t ps = 1, max_pages = 0, num_pages = 1, cap = 0;
  std::vector<std::int64_t> table, lens;
  Tensor kp, vp, ks, vs;  // ks/vs: int8 scales
  bool int8 = false, blocked = false;
  int8_query query = int8_query::automatic;  // int8: both ways of multiplying q (serving.h)
  Tensor ktable, tlens;

  double key(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t x) const {
    const std::int64_t p = table[std::size_t(b * max_pages + t / ps)], slot = t % ps;
    if (!int8) return kp.view().get(std::vector<std::int64_t>{p, slot, h, x});
    const double sc = ks.view().get(std::vector<std::int64_t>{p, slot, h});
    const double e = blocked ? kp.view().get(std::vector<std::int64_t>{p, slot / 16, h, x / 4, slot % 16, x % 4})
                             : kp.view().get(std::vector<std::int64_t>{p, slot, h, x});
    return sc * e;
  }
  double value(std::int64_t b, std::int64_t t, std::int64_t h, std::int64_t x) const {
    const std::int64_t p = table[std::size_t(b * max_pages + t / ps)], slot = t % ps;
    if (!int8) return vp.view().get(std::vector<std::int64_t>{p, slot, h, x});
    return vs.view().get(std::vector<std::int64_t>{p, slot, h}) * vp.view().get(std::vector<std::int64_t>{p, slot, h, x});
  }
  // Sequence b's first L keys and values, dense [1, Hkv, L, X], float64.
  Tensor dense(bool keys, std::int64_t b, std::int64_t L, std::int64_t Hkv, std::int64_t X) const {
    Tensor r = Tensor::empty({1, Hkv, L, X}, dtype::f64);
    double* p = r.data_as<double>();
    for (std::int64_t h = 0; h < Hkv; ++h)
      for (std::int64_t t = 0; t < L; ++t)
        for (std::int64_t x = 0; x < X; ++x) *p++ = keys ? key(b, t, h, x) : value(b, t, h, x);
    return r;
  }
  paged_kv_view view() const {
    paged_kv_view c{kp, vp, ktable, tlens};
    if (int8) c.k_scales = ks, c.v_scales = vs, c.query = query;
    return c;
  }
};

cache_case make_cache(bytes& in, setup& s, std::int64_t extra) {
  cache_case c;
  c.int8 = s.op == 1;
  c.blocked = c.int8 && extra == 0 && s.D % 4 == 0 && in.upto(2) == 0;
  if (c.int8) c.query = std::array{int8_query::automatic, int8_query::float32, int8_query::int8}[std::size_t(in.upto(2))];
  c.ps = c.blocked ? 16 : in.upto(3) == 0 ? 16 : 1 + in.upto(4);
  c.max_pages = std::max<std::int64_t>(in.upto(3), (extra + c.ps - 1) / c.ps);  // room for an append
  c.num_pages = 1 + in.upto(5);
  c.cap = c.max_pages * c.ps;
  c.table.resize(std::size_t(s.B * c.max_pages));
  c.lens.resize(std::size_t(s.B));
  for (std::int64_t b = 0; b < s.B; ++b) {
    c.lens[std::size_t(b)] = in.upto(int(std::max<std::int64_t>(c.cap - extra, 0)));
    for (std::int64_t p = 0; p < c.max_pages; ++p) {
      // Pages past the sequence's last one may hold anything, in range or not.
      const bool read = p * c.ps < c.lens[std::size_t(b)] + extra;
      c.table[std::size_t(b * c.max_pages + p)] = read || in.upto(1) ? in.upto(int(c.num_pages - 1)) : -7 - p;
    }
  }
  // Which slots some sequence reads (after any append): the others are stale.
  std::vector<char> live(std::size_t(c.num_pages * c.ps), 0);
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t t = 0; t < c.lens[std::size_t(b)] + extra && t < c.cap; ++t)
      live[std::size_t(c.table[std::size_t(b * c.max_pages + t / c.ps)] * c.ps + t % c.ps)] = 1;
  const dtype pt = c.int8 ? dtype::i8 : s.t;
  c.kp = c.blocked ? Tensor::empty({c.num_pages, c.ps / 16, s.Hkv, s.D / 4, 16, 4}, pt)
                   : Tensor::empty({c.num_pages, c.ps, s.Hkv, s.D}, pt);
  c.vp = Tensor::empty({c.num_pages, c.ps, s.Hkv, s.Dv}, pt);
  if (c.int8) c.ks = Tensor::empty({c.num_pages, c.ps, s.Hkv}, dtype::f32), c.vs = Tensor::empty({c.num_pages, c.ps, s.Hkv}, dtype::f32);
  std::int64_t gi = in.next();
  for (std::int64_t p = 0; p < c.num_pages; ++p)
    for (std::int64_t slot = 0; slot < c.ps; ++slot) {
      const bool on = live[std::size_t(p * c.ps + slot)];
      for (std::int64_t h = 0; h < s.Hkv; ++h) {
        if (c.int8) {
          // A live key scale may be NaN but not ±inf: the kernel factors the scale out of q·k
          // (scale · Σ q·k8, docs/SERVING.md), where the dequantised cache multiplies each element.
          for (Tensor* sc : {&c.ks, &c.vs}) {
            double x = on ? (s.specials && in.upto(7) == 0 ? in.value() : 0.01 + in.upto(8) / 64.0) : garbage(gi++);
            if (on && sc == &c.ks && std::isinf(x)) x = NAN;
            sc->view().set(std::vector<std::int64_t>{p, slot, h}, x);
          }
          for (std::int64_t x = 0; x < s.D; ++x) {
            const double e = in.next() % 255 - 127.0;
            if (c.blocked) c.kp.view().set(std::vector<std::int64_t>{p, slot / 16, h, x / 4, slot % 16, x % 4}, e);
            else c.kp.view().set(std::vector<std::int64_t>{p, slot, h, x}, e);
          }
          for (std::int64_t x = 0; x < s.Dv; ++x) c.vp.view().set(std::vector<std::int64_t>{p, slot, h, x}, in.next() % 255 - 127.0);
        } else {
          for (std::int64_t x = 0; x < s.D; ++x) c.kp.view().set(std::vector<std::int64_t>{p, slot, h, x}, on ? datum(in, s) : garbage(gi++));
          for (std::int64_t x = 0; x < s.Dv; ++x) c.vp.view().set(std::vector<std::int64_t>{p, slot, h, x}, on ? datum(in, s) : garbage(gi++));
        }
      }
    }
  c.ktable = index_tensor({s.B, c.max_pages}, s.i32, c.table);
  c.tlens = index_tensor({s.B}, s.i32, c.lens);
  return c;
}

// One corrupt index of the cache that some sequence reads, or a length beyond the capacity
// (false where this cache has none to corrupt).
bool corrupt_cache(bytes& in, const setup& s, cache_case& c, std::int64_t extra) {
  const std::int64_t b = in.upto(int(s.B - 1));
  const std::int64_t need = (c.lens[std::size_t(b)] + extra + c.ps - 1) / c.ps;
  if (need > 0 && in.upto(1)) {
    const std::int64_t p = in.upto(int(need - 1));
    const std::int64_t bad = in.upto(1) ? -1 - in.upto(3) : c.num_pages + in.upto(3);
    c.table[std::size_t(b * c.max_pages + p)] = bad;
    c.ktable = index_tensor({s.B, c.max_pages}, s.i32, c.table);
    return true;
  }
  const std::int64_t bad = in.upto(1) ? c.cap - extra + 1 + in.upto(3) : -1 - in.upto(3);
  if (bad >= 0 && bad + extra <= c.cap) return false;
  c.lens[std::size_t(b)] = bad;
  c.tlens = index_tensor({s.B}, s.i32, c.lens);
  return true;
}

// Runs f on the cpu backend and (run_ref) the reference: a valid input must run; a corrupt one
// must throw attn::error naming op (then counted as refused). Returns the results where they ran.
template <class R>
struct ran {
  std::optional<R> cpu, ref;
};
template <class R, class F>
ran<R> both(const char* op, const setup& s, bool expect_error, bool run_ref, F&& f) {
  std::optional<R> r[2];
  const execution ex[2] = {s.cpu, {.use_backend = backend::reference}};
  for (int i = 0; i < (run_ref ? 2 : 1); ++i) {
    std::string err;
    try {
      r[i] = f(ex[i]);
    } catch (const error& e) {
      err = e.what();
    }
    const char* who = i ? " (reference)" : " (cpu)";
    if (expect_error && err.empty()) finding(std::string(op) + ": a corrupt argument was accepted", who);
    if (!expect_error && !err.empty()) finding(std::string(op) + ": a valid input was refused" + who, err);
    if (expect_error && err.find(op) == std::string::npos) finding(std::string(op) + ": the message names another op", err);
  }
  if (expect_error) ++fuzz::serving_fuzz_counts().refused[s.op];
  return {std::move(r[0]), std::move(r[1])};
}

struct oracle {
  attention_result truth;
  std::optional<attention_result> cpu;
  bool wide = false;  // scores may span past float64's e^x underflow (|s| > 300)
};
oracle dense_oracle(const setup& s, const Tensor& q8, const Tensor& k8, const Tensor& v8, const attention_options& ob,
                    bool int8 = false) {
  oracle r{attention(q8, k8, v8, ob, {.use_backend = backend::reference}), std::nullopt};
  if (s.specials) {
    // float pages: the core op on the same values in q's dtype; int8: float32 keys (the
    // dequantised values exactly), which the core op takes beside a float32 q only.
    const dtype ct = int8 ? dtype::f32 : s.t;
    try {
      r.cpu = attention(q8.to(s.t), k8.to(ct), v8.to(ct), ob, s.cpu);
    } catch (const error&) {
      r.cpu.reset();  // (mixed dtypes refused: the truth's pattern)
    }
    // A key whose weight is e^-745 or less on one path and 0 on another (the paged runs merge
    // by lse) turns a ±inf of its value into inf on one and NaN (0 · inf) on the other: with
    // scores that wide, NaN and ±inf are not told apart.
    const auto fmax = [](const TensorView& x) {
      double m = 0;
      for (double y : to_vector(x)) if (std::isfinite(y)) m = std::max(m, std::abs(y));
      return m;
    };
    double mag = fmax(q8) * fmax(k8) * double(q8.size(3)) * (ob.scale ? std::abs(*ob.scale) : 1.0);
    if (ob.alibi_slopes) mag += fmax(*ob.alibi_slopes) * double(q8.size(2) + k8.size(2));
    if (ob.attn_mask && ob.attn_mask->type() != dtype::boolean) mag += fmax(*ob.attn_mask);
    if (ob.sinks) mag += fmax(*ob.sinks);
    r.wide = mag > 300;
  }
  return r;
}

// ATTN_FUZZ_DEBUG=1: a sequence's dense inputs and the outputs compared, to read a finding by.
void debug_dump(const std::vector<std::pair<const char*, std::vector<double>>>& xs) {
  if (!std::getenv("ATTN_FUZZ_DEBUG")) return;
  for (const auto& [name, v] : xs) {
    std::fprintf(stderr, "%s:", name);
    for (double x : v) std::fprintf(stderr, " %g", x);
    std::fprintf(stderr, "\n");
  }
}

// What each op returned, row b of it, against the oracle.
// lse_tol: at least this for lse (the default is the dtype's).
// lse_tol: what lse may move beyond the dtype's rounding; out_slack: what out may (absolute).
void check_rows(const std::string& what, const setup& s, const std::vector<double>& got_out,
                const std::vector<double>& got_lse, const oracle& want, double tol, double lse_tol = 0,
                double out_slack = 0) {
  const attention_result& w = s.specials && want.cpu ? *want.cpu : want.truth;
  const double out_max = s.t == dtype::f16 ? 65504.0 : s.t == dtype::f64 ? DBL_MAX : FLT_MAX;
  compare(what + " out", got_out, w.out.to_vector(), tol, s.specials, out_max, want.wide, out_slack);
  const double lt = s.t == dtype::f64 ? 1e-9 : s.t == dtype::f32 ? 1e-5 : 2e-3;
  compare(what + " lse", got_lse, w.lse.to_vector(), std::max(lt, lse_tol), s.specials, s.t == dtype::f64 ? DBL_MAX : FLT_MAX);
}

// int8 pages and float32 / float16 q with int8_query::automatic: where the int16 products run, each
// element of q moves by at most 2^-14 of its row's largest |q| (serving.h), so a score moves by at
// most 2^-14 · max|q| · |scale| · ‖k_j‖₁ and lse no further: that bound over sequence b's rows q8
// [1, Hq, Nq, D] and keys k8 [1, Hkv, L, D] (float64), 0 where it is not finite.
// With int8_query::int8 on blocked keys (the byte products) an element moves by at most 1/254 of
// its row's largest (q_step).
double int16_lse_bound(const setup& s, const Tensor& q8, const Tensor& k8, double q_step = 0x1p-14) {
  double qm = 0, k1 = 0;
  for (const double x : q8.to_vector()) qm = std::max(qm, std::abs(x));
  const std::vector<double> k = k8.to_vector();
  const std::size_t D = std::size_t(s.D);
  for (std::size_t r = 0; r * D < k.size(); ++r) {
    double n = 0;
    for (std::size_t x = 0; x < D; ++x) n += std::abs(k[r * D + x]);
    k1 = std::max(k1, n);
  }
  const double scale = std::abs(s.o.scale.value_or(1 / std::sqrt(double(s.D))));  // (a scale may be negative)
  const double b = qm * scale * k1 * q_step;
  return std::isfinite(b) ? b : 0.0;
}

// The same path moves out: scores by at most β = int16_lse_bound move each weight p_j by at most
// p_j·(e^{2β} − 1) of its row's sum, and each block of W keys rounds its weights p·scale_v to int16
// within 2^-14 of the block's largest (serving.h), a sum over the blocks no larger than W·2^-14 of
// the row's (W = 16: the int16 products run on AVX-512 only); both times the largest |v| of
// sequence b's dequantised values v8 (float64), 0 where it is not finite.
// int8_query::int8 rounds each weight within 1/510 of the block's largest (w_step).
double int16_out_bound(double lse_bound, const Tensor& v8, double w_step = 0x1p-14) {
  double vm = 0;
  for (const double x : v8.to_vector()) vm = std::max(vm, std::abs(x));
  const double b = (std::expm1(2 * lse_bound) + 16 * w_step) * vm;
  return std::isfinite(b) ? b : 0.0;
}

std::size_t page_bytes(const Tensor& x) { return std::size_t(x.numel()) * dtype_size(x.type()); }

// paged_kv_append of k_new/v_new at each sequence's end: a corrupt cache (bad_cache) must be
// refused by message and leave the pages as they were (then false); else the rows are checked
// and the lengths advanced.
bool run_append(const setup& s, cache_case& c, std::int64_t extra, const Tensor& k_new, const Tensor& v_new,
                bool bad_cache) {
  const Tensor kp0 = Tensor::copy_of(c.kp), vp0 = Tensor::copy_of(c.vp);
  std::string err;
  try {
    paged_kv_append(c.view(), k_new, v_new);
  } catch (const error& e) {
    err = e.what();
  }
  if (bad_cache && err.empty()) finding("paged_kv_append: a corrupt cache was accepted", "");
  if (!bad_cache && !err.empty()) finding("paged_kv_append: a valid append was refused", err);
  if (bad_cache) {
    if (std::memcmp(kp0.data(), c.kp.data(), page_bytes(c.kp)) || std::memcmp(vp0.data(), c.vp.data(), page_bytes(c.vp)))
      finding("paged_kv_append: a refused append wrote the pages", err);
    if (err.find("paged_kv_append") == std::string::npos) finding("paged_kv_append: the message names another op", err);
    ++fuzz::serving_fuzz_counts().refused[s.op];
    return false;
  }
  // Each appended row is what was given — float pages exactly, int8 within half a step — where
  // it was written last (rows may share a slot of a page).
  for (std::int64_t b = 0; b < s.B; ++b)
    for (std::int64_t t = 0; t < extra; ++t) {
      const std::int64_t pos = c.lens[std::size_t(b)] + t;
      const std::int64_t p = c.table[std::size_t(b * c.max_pages + pos / c.ps)], slot = pos % c.ps;
      bool last = true;
      for (std::int64_t b2 = b; b2 < s.B; ++b2)  // (a table may name one page twice, too)
        for (std::int64_t t2 = b2 == b ? t + 1 : 0; t2 < extra; ++t2) {
          const std::int64_t pos2 = c.lens[std::size_t(b2)] + t2;
          if (c.table[std::size_t(b2 * c.max_pages + pos2 / c.ps)] == p && pos2 % c.ps == slot) last = false;
        }
      if (!last) continue;
      for (std::int64_t h = 0; h < s.Hkv; ++h)
        for (int kv = 0; kv < 2; ++kv) {
          const Tensor& src = kv ? v_new : k_new;
          const std::int64_t X = kv ? s.Dv : s.D;
          double amax = 0;
          for (std::int64_t x = 0; x < X; ++x) amax = std::max(amax, std::abs(src.view().get(std::vector<std::int64_t>{b, h, t, x})));
          for (std::int64_t x = 0; x < X; ++x) {
            const double want = src.view().get(std::vector<std::int64_t>{b, h, t, x});
            const double got = kv ? c.value(b, pos, h, x) : c.key(b, pos, h, x);
            if (!(std::abs(got - want) <= (c.int8 ? amax / 127.0 * 0.5001 + 1e-12 : 0.0)))
              finding("paged_kv_append: a row does not dequantise to what was appended",
                      std::to_string(got) + " vs " + std::to_string(want));
          }
        }
    }
  for (auto& L : c.lens) L += extra;
  c.tlens = index_tensor({s.B}, s.i32, c.lens);
  return true;
}

// A mask of this shape: bool (an eighth false) or float32 (an eighth -inf, else moderate).
Tensor random_mask(bytes& in, const Shape& shape) {
  Tensor m = Tensor::empty(shape, in.upto(1) ? dtype::boolean : dtype::f32);
  for (std::int64_t i = 0; i < m.numel(); ++i) {
    const int x = in.upto(7);
    if (m.type() == dtype::boolean) m.data_as<bool>()[i] = x != 0;
    else m.data_as<float>()[i] = x == 0 ? -INFINITY : float(in.moderate());
  }
  return m;
}

double amax(const Tensor& x) {
  double m = 0;
  for (double y : x.to_vector()) m = std::max(m, std::abs(y));
  return m;
}

// api_fuzz's bound of the backward of one sequence (float64 q8, k8, v8, dout8; g8 and lse8 the
// float64 reference's): the gradients' own scale or that of the difference dp − Δ in ds (Δ =
// rowsum(dout ∘ out) from the rounded out), growing with |lse|.
double backward_bound(const setup& s, const attention_grads& g8, const Tensor& lse8, const Tensor& dout8,
                      const Tensor& q8, const Tensor& k8, const Tensor& v8) {
  double gmax = 1, lmax = 0;
  for (const Tensor* g : {&g8.dq, &g8.dk, &g8.dv, &g8.dattn_mask})
    if (g->defined()) gmax = std::max(gmax, amax(*g));
  for (double x : lse8.to_vector()) if (std::isfinite(x)) lmax = std::max(lmax, std::abs(x));
  const double sc = s.o.scale ? std::abs(*s.o.scale) : 1.0 / std::sqrt(double(s.D));
  const double gscale = std::max(gmax, sc * amax(dout8) * amax(v8) * std::max(amax(q8), amax(k8)) * double(s.Dv));
  const double tol = tol_for(s.t);
  return (s.t == dtype::f64 ? 1e-9 : s.t == dtype::f32 ? 1e-5 : 4 * tol) * (1 + lmax) * gscale;
}

// An absolute bound at the gradients' scale (compare() adds |want| to 1).
void compare_within(const std::string& what, const std::vector<double>& got, const std::vector<double>& want, double bound) {
  if (got.size() != want.size()) finding(what, "sizes differ");
  for (std::size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= bound))
      finding(what, "at " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs " + std::to_string(want[i]));
}

// How a paged backward lays out one sequence b: its queries' rows of q and dout as the oracle's
// float64 [1, Hq, n, X], the oracle's options on its keys [0, L), its rows of a result's dq, and
// where a float mask's gradient block of the oracle lands in the mask's gradient (float64, the
// mask's shape).
struct paged_layout {
  std::function<Tensor(const Tensor& x, std::int64_t b)> rows;  // q or dout (or dq) rows of b, float64
  std::function<attention_options(std::int64_t b, std::int64_t L)> options;
  std::function<void(const Tensor& dmask, std::int64_t b, std::int64_t L, const Tensor& g8)> add_mask;
};

// A paged backward `run` (cpu and reference, each from its own forward) against
// attention_backward of the float64 reference on each sequence's keys laid out densely: dq per
// sequence, the pages' gradients as the dense ones carried back through the table (shared pages
// summed), ALiBi, sinks and a float mask's gradient likewise; the pages are not written.
void check_paged_grads(const char* op, const setup& s, const cache_case& c, const Tensor& q, const Tensor& dout,
                       const paged_layout& lay, const std::function<paged_grads(const execution&)>& run) {
  const Tensor kp0 = Tensor::copy_of(c.kp);
  const auto g = both<paged_grads>(op, s, false, true, run);
  if (std::memcmp(kp0.data(), c.kp.data(), std::size_t(c.kp.numel()) * dtype_size(c.kp.type())))
    finding(std::string(op) + " wrote the pages", "");
  if (!g.cpu || !g.ref) return;
  const Tensor dk = Tensor::zeros(c.kp.shape(), dtype::f64), dv = Tensor::zeros(c.vp.shape(), dtype::f64);
  const bool float_mask = s.o.attn_mask && s.o.attn_mask->type() != dtype::boolean;
  const Tensor dmask = float_mask ? Tensor::zeros(s.o.attn_mask->shape(), dtype::f64) : Tensor();
  const Tensor dsinks = s.o.sinks ? Tensor::zeros({s.Hq}, dtype::f64) : Tensor();
  const Tensor dalibi = s.o.alibi_slopes ? Tensor::zeros(s.o.alibi_slopes->shape(), dtype::f64) : Tensor();
  double bound = 0;
  for (std::int64_t b = 0; b < s.B; ++b) {
    const std::int64_t L = c.lens[std::size_t(b)];
    const Tensor qb = lay.rows(q, b), db = lay.rows(dout, b);
    const Tensor kb = c.dense(true, b, L, s.Hkv, s.D), vb = c.dense(false, b, L, s.Hkv, s.Dv);
    const attention_options ob = lay.options(b, L);
    const execution ref{.use_backend = backend::reference};
    const attention_result f8 = attention(qb, kb, vb, ob, ref);
    const attention_grads g8 = attention_backward(qb, kb, vb, f8.out, db, f8.lse, ob, ref);
    const double bb = backward_bound(s, g8, f8.lse, db, qb, kb, vb);
    bound = std::max(bound, bb);
    for (const auto* gg : {&*g.ref, &*g.cpu})
      compare_within(std::string(op) + (gg == &*g.cpu ? " cpu" : " reference") + " dq (sequence " + std::to_string(b) + ")",
                     lay.rows(gg->dq, b).to_vector(), g8.dq.to_vector(), bb);
    for (std::int64_t t = 0; t < L; ++t) {  // the dense gradients back through the table
      const std::int64_t p = c.table[std::size_t(b * c.max_pages + t / c.ps)], slot = t % c.ps;
      for (std::int64_t h = 0; h < s.Hkv; ++h) {
        for (std::int64_t x = 0; x < s.D; ++x)
          dk.set({p, slot, h, x}, dk.get({p, slot, h, x}) + g8.dk.get({0, h, t, x}));
        for (std::int64_t x = 0; x < s.Dv; ++x)
          dv.set({p, slot, h, x}, dv.get({p, slot, h, x}) + g8.dv.get({0, h, t, x}));
      }
    }
    for (std::int64_t h = 0; h < s.Hq && L > 0 && qb.size(2) > 0; ++h) {
      if (dsinks.defined()) dsinks.set({h}, dsinks.get({h}) + g8.dsinks.get({h}));
      if (dalibi.defined()) {
        const std::int64_t at = dalibi.rank() == 2 ? b * s.Hq + h : h;
        dalibi.data_as<double>()[at] += g8.dalibi_slopes.get({h});
      }
    }
    if (dmask.defined() && L > 0 && g8.dattn_mask.defined()) lay.add_mask(dmask, b, L, g8.dattn_mask);
  }
  for (const auto* gg : {&*g.ref, &*g.cpu}) {
    const std::string who = std::string(op) + (gg == &*g.cpu ? " cpu " : " reference ");
    // a shared page sums several sequences' gradients: the bound of each, times the sequences
    compare_within(who + "dk_pages", gg->dk_pages.to_vector(), dk.to_vector(), bound * double(s.B));
    compare_within(who + "dv_pages", gg->dv_pages.to_vector(), dv.to_vector(), bound * double(s.B));
    if (dsinks.defined()) compare_within(who + "dsinks", gg->dsinks.to_vector(), dsinks.to_vector(), bound * double(s.B));
    if (dalibi.defined()) compare_within(who + "dalibi_slopes", gg->dalibi_slopes.to_vector(), dalibi.to_vector(), bound * double(s.B));
    if (gg->dattn_mask.defined() != float_mask) finding(who + "dattn_mask", "returned for no float mask, or missing for one");
    if (dmask.defined() && gg->dattn_mask.defined())
      compare_within(who + "dattn_mask", gg->dattn_mask.to_vector(), dmask.to_vector(), bound * double(s.B));
  }
}

// attention_paged_backward on float pages: [B, Hq, Nq, ·] rows, the mask [B|1, ·, ·, K].
void check_paged_backward(bytes& in, const setup& s, const cache_case& c, const Tensor& q,
                          const ran<attention_result>& fw) {
  Tensor dout = Tensor::empty({s.B, s.Hq, q.size(2), s.Dv}, s.t);
  for (std::int64_t i = 0; i < dout.numel(); ++i) store_from_double(dout.data(), s.t, i, in.moderate());
  const paged_layout lay{
      [](const Tensor& x, std::int64_t b) { return Tensor::copy_of(x.view().slice(0, b, b + 1), dtype::f64); },
      [&](std::int64_t b, std::int64_t L) { return oracle_options(s.o, b, L, true); },
      [](const Tensor& dmask, std::int64_t b, std::int64_t L, const Tensor& g8) {  // rows of b (or all), columns [0, min(K, L))
        TensorView at = dmask.view();
        if (at.size(0) > 1) at = at.slice(0, b, b + 1);
        at = at.slice(3, 0, std::min(at.size(3), L));
        const std::vector<double> add = g8.to_vector();
        std::size_t i = 0;
        for (std::int64_t a = 0; a < at.size(0); ++a)
          for (std::int64_t h = 0; h < at.size(1); ++h)
            for (std::int64_t r = 0; r < at.size(2); ++r)
              for (std::int64_t j = 0; j < at.size(3); ++j) at.set({a, h, r, j}, at.get({a, h, r, j}) + add[i++]);
      }};
  check_paged_grads("attention_paged_backward", s, c, q, dout, lay, [&](const execution& ex) {
    const attention_result& f = ex.use_backend == backend::reference ? *fw.ref : *fw.cpu;
    return attention_paged_backward(q, c.view(), f.out, dout, f.lse, s.o, ex);
  });
}

void run_paged(bytes& in, setup& s) {
  const char* op = "attention_paged";
  const bool append = in.upto(1);  // paged_kv_append first (it quantises into int8 pages)
  // Nq: a decode or speculative step (1…6), or a prefill chunk (17…40: float pages are then
  // gathered out of the pages by the cpu backend and run as dense prefill, cpu_backend.cc).
  const std::int64_t Nq = in.upto(3) ? 1 + in.upto(5) : 17 + in.upto(23), extra = append ? 1 + in.upto(2) : 0;
  cache_case c = make_cache(in, s, extra);
  Tensor q = Tensor::empty({s.B, s.Hq, Nq, s.D}, s.t);
  fill(in, s, q);
  // A mask over the capacity: bool or float, broadcast from [1|B, 1|Hq, 1|Nq, K ≤ cap].
  if (c.cap > 0 && in.upto(2) == 0) {
    const Shape ms{in.upto(1) ? s.B : 1, in.upto(1) ? s.Hq : 1, in.upto(1) ? Nq : 1, 1 + in.upto(int(c.cap - 1))};
    s.o.attn_mask = random_mask(in, ms);
  }
  Tensor k_new, v_new;  // float32 for int8 pages (quantised on append), else the pages' dtype
  if (append) {
    const dtype nt = c.int8 ? dtype::f32 : s.t;
    k_new = Tensor::empty({s.B, s.Hkv, extra, s.D}, nt), v_new = Tensor::empty({s.B, s.Hkv, extra, s.Dv}, nt);
    for (Tensor* x : {&k_new, &v_new})
      for (std::int64_t i = 0; i < x->numel(); ++i) store_from_double(x->data(), nt, i, in.moderate());
  }
  bool bad_cache = false, bad_mask = false;  // the cache's arguments (append's too), or the mask alone
  if (s.corrupt) {
    const int what = in.upto(3);
    if (what == 0 && c.int8) {
      c.ks = Tensor::empty({c.num_pages, c.ps + 1, s.Hkv}, dtype::f32), bad_cache = true;
    } else if (what == 1 && s.o.attn_mask) {
      Shape ms = s.o.attn_mask->shape();
      ms[3] = c.cap + 1 + in.upto(2);
      s.o.attn_mask = Tensor::zeros(ms, s.o.attn_mask->type()), bad_mask = true;
    } else {
      bad_cache = corrupt_cache(in, s, c, extra);
    }
  }
  const auto page_bytes = [](const Tensor& x) { return std::size_t(x.numel()) * dtype_size(x.type()); };
  if (append && !run_append(s, c, extra, k_new, v_new, bad_cache)) return;
  const bool bad = bad_cache || bad_mask;
  const Tensor kp0 = Tensor::copy_of(c.kp);
  // int8 pages: the cpu decode kernel alone (serving.h); the reference refuses them.
  const auto r = both<attention_result>(op, s, bad, !c.int8, [&](const execution& ex) {
    return attention_paged(q, c.view(), s.o, ex);
  });
  if (std::memcmp(kp0.data(), c.kp.data(), page_bytes(c.kp)))
    finding("attention_paged wrote the pages", "");
  if (bad) return;
  const double tol = tol_for(s.t);
  const std::vector<double> out_c = r.cpu->out.to_vector(), lse_c = r.cpu->lse.to_vector();
  const std::vector<double> out_r = c.int8 ? std::vector<double>{} : r.ref->out.to_vector();
  const std::vector<double> lse_r = c.int8 ? std::vector<double>{} : r.ref->lse.to_vector();
  const Tensor q8 = q.to(dtype::f64);
  for (std::int64_t b = 0; b < s.B; ++b) {
    const std::int64_t L = c.lens[std::size_t(b)];
    const Tensor qb = Tensor::copy_of(q8.view().slice(0, b, b + 1));
    const oracle w = dense_oracle(s, qb, c.dense(true, b, L, s.Hkv, s.D), c.dense(false, b, L, s.Hkv, s.Dv),
                                  oracle_options(s.o, b, L, true), c.int8);
    const std::size_t no = std::size_t(s.Hq * Nq * s.Dv), nl = std::size_t(s.Hq * Nq);
    const auto part = [](const std::vector<double>& v, std::size_t at, std::size_t n) {
      return std::vector<double>(v.begin() + std::ptrdiff_t(at), v.begin() + std::ptrdiff_t(at + n));
    };
    const std::string where = " (sequence " + std::to_string(b) + ", L " + std::to_string(L) + ")";
    debug_dump({{"q", qb.to_vector()}, {"k", c.dense(true, b, L, s.Hkv, s.D).to_vector()},
                {"v", c.dense(false, b, L, s.Hkv, s.Dv).to_vector()}, {"truth out", w.truth.out.to_vector()},
                {"truth lse", w.truth.lse.to_vector()}, {"cpu out", part(out_c, b * no, no)}, {"cpu lse", part(lse_c, b * nl, nl)}});
    // int8_query::int8: 8-bit weights (every q dtype), and on blocked keys 8-bit q; the bounds
    // hold for the int16 path too
    const bool bytes_w = c.int8 && c.query == int8_query::int8, bytes_q = bytes_w && c.blocked;
    const bool int16_q = c.int8 && (bytes_w || (s.t != dtype::bf16 && c.query != int8_query::float32));
    const double lse_b =
        int16_q ? int16_lse_bound(s, qb, c.dense(true, b, L, s.Hkv, s.D), bytes_q ? 1.0 / 254 : 0x1p-14) : 0.0;
    check_rows(std::string(op) + " cpu" + where, s, part(out_c, b * no, no), part(lse_c, b * nl, nl), w, tol, lse_b,
               int16_q ? int16_out_bound(lse_b, c.dense(false, b, L, s.Hkv, s.Dv), bytes_w ? 1.0 / 510 : 0x1p-14) : 0.0);
    if (!c.int8) check_rows(std::string(op) + " reference" + where, s, part(out_r, b * no, no), part(lse_r, b * nl, nl), w, tol);
  }
  // The backward's special values: api_fuzz, on the core op (which this one runs per sequence).
  if (!c.int8 && !s.specials && in.upto(1)) check_paged_backward(in, s, c, q, r);
}

// cu_seqlens of n lengths drawn up to top (some 0).
std::vector<std::int64_t> draw_lengths(bytes& in, std::int64_t n, int top) {
  std::vector<std::int64_t> cu{0};
  for (std::int64_t b = 0; b < n; ++b) cu.push_back(cu.back() + in.upto(top));
  return cu;
}

// Packed rows [cu[b], cu[b+1]) of x [total, H, X] as [1, H, n, X], float64.
Tensor sequence_of(const Tensor& x, const std::vector<std::int64_t>& cu, std::int64_t b) {
  const std::int64_t r0 = cu[std::size_t(b)], n = cu[std::size_t(b) + 1] - r0;
  const Tensor t = Tensor::copy_of(x.view().slice(0, r0, r0 + n).transpose(0, 1), dtype::f64);
  return Tensor::copy_of(t.view().reshape({1, x.size(1), n, x.size(2)}));
}

// out [total, H, X] rows of sequence b as [H, n, X] order (the oracle's), and lse [H, total] likewise.
std::vector<double> rows_of(const Tensor& out, const std::vector<std::int64_t>& cu, std::int64_t b) {
  return Tensor::copy_of(out.view().slice(0, cu[std::size_t(b)], cu[std::size_t(b) + 1]).transpose(0, 1)).to_vector();
}
std::vector<double> lse_of(const Tensor& lse, const std::vector<std::int64_t>& cu, std::int64_t b) {
  return Tensor::copy_of(lse.view().slice(1, cu[std::size_t(b)], cu[std::size_t(b) + 1])).to_vector();
}

// Corrupts cu (out of order, or a last entry other than total) or lowers max below a length.
bool corrupt_cu(bytes& in, std::vector<std::int64_t>& cu, std::int64_t& max_len) {
  const std::int64_t B = std::int64_t(cu.size()) - 1;
  switch (in.upto(2)) {
    case 0:
      if (max_len == 0) return false;
      max_len -= 1;  // max_len is the longest length: one less is exceeded
      return true;
    case 1: cu[std::size_t(B)] += 1 + in.upto(2); return true;  // past the packed length
    default:
      if (B < 2) return false;
      cu[1] = cu[2] + 1;  // decreasing
      return true;
  }
}

// A packed attn_mask (serving.h: each sequence's [nq[b], nk[b]] block row-major, back to back)
// on one input in three — none where the bytes have run out, so older corpus inputs keep their
// meaning: [S] or [1|Hq, S], bool or float32 (-inf or moderate values). With `corrupt`, one
// element too many (then true: the call must be refused).
bool draw_packed_mask(bytes& in, setup& s, const std::vector<std::int64_t>& nq, const std::vector<std::int64_t>& nk,
                      bool corrupt) {
  if (in.upto(2) != 1) return false;
  std::int64_t S = 0;
  for (std::size_t b = 0; b < nq.size(); ++b) S += nq[b] * nk[b];
  const bool bad = corrupt && in.upto(1);
  if (bad) S += 1;
  const int layout = in.upto(2);
  s.o.attn_mask = random_mask(in, layout == 0 ? Shape{S} : Shape{layout == 1 ? 1 : s.Hq, S});
  return bad;
}

// Sequence b's block of the packed mask as the dense oracle's mask ([nq, nk] or [Hm, nq, nk]),
// in the options of oracle_options (no keys: no mask).
attention_options packed_oracle_options(const attention_options& o, std::int64_t b, std::int64_t nq, std::int64_t L,
                                        const std::vector<std::int64_t>& nqs, const std::vector<std::int64_t>& nks,
                                        bool paged) {
  attention_options plain = o;
  plain.attn_mask.reset();
  attention_options r = oracle_options(plain, b, L, paged);
  if (!o.attn_mask || L == 0) return r;
  std::int64_t off = 0;
  for (std::int64_t c = 0; c < b; ++c) off += nqs[std::size_t(c)] * nks[std::size_t(c)];
  const TensorView& m = *o.attn_mask;
  if (m.rank() == 1) r.attn_mask = Tensor::copy_of(Tensor::copy_of(m.slice(0, off, off + nq * L)).view().reshape({nq, L}));
  else r.attn_mask = Tensor::copy_of(Tensor::copy_of(m.slice(1, off, off + nq * L)).view().reshape({m.size(0), nq, L}));
  return r;
}

void run_paged_varlen(bytes& in, setup& s) {
  const char* op = "attention_paged_varlen";
  cache_case c = make_cache(in, s, 0);
  std::vector<std::int64_t> cu = draw_lengths(in, s.B, 5);
  std::int64_t max_q = 0;
  for (std::int64_t b = 0; b < s.B; ++b) max_q = std::max(max_q, cu[std::size_t(b) + 1] - cu[std::size_t(b)]);
  const std::int64_t total = cu.back();
  Tensor q = Tensor::empty({total, s.Hq, s.D}, s.t);
  fill(in, s, q);
  bool bad = false;
  if (s.corrupt) bad = in.upto(1) ? corrupt_cu(in, cu, max_q) : corrupt_cache(in, s, c, 0);
  std::vector<std::int64_t> nqs;
  for (std::int64_t b = 0; b < s.B; ++b) nqs.push_back(cu[std::size_t(b) + 1] - cu[std::size_t(b)]);
  if (!bad) bad = draw_packed_mask(in, s, nqs, c.lens, s.corrupt);
  const Tensor tcu = index_tensor({s.B + 1}, s.i32, cu);
  const auto r = both<varlen_result>(op, s, bad, true, [&](const execution& ex) {
    return attention_paged_varlen(q, tcu, max_q, c.view(), s.o, ex);
  });
  if (bad) return;
  const double tol = tol_for(s.t);
  for (std::int64_t b = 0; b < s.B; ++b) {
    const std::int64_t L = c.lens[std::size_t(b)];
    const oracle w = dense_oracle(s, sequence_of(q, cu, b), c.dense(true, b, L, s.Hkv, s.D),
                                  c.dense(false, b, L, s.Hkv, s.Dv),
                                  packed_oracle_options(s.o, b, nqs[std::size_t(b)], L, nqs, c.lens, true));
    const std::string where = " (sequence " + std::to_string(b) + ", L " + std::to_string(L) + ")";
    debug_dump({{"q", sequence_of(q, cu, b).to_vector()}, {"k", c.dense(true, b, L, s.Hkv, s.D).to_vector()},
                {"v", c.dense(false, b, L, s.Hkv, s.Dv).to_vector()}, {"truth out", w.truth.out.to_vector()},
                {"truth lse", w.truth.lse.to_vector()}, {"cpu out", rows_of(r.cpu->out, cu, b)}, {"cpu lse", lse_of(r.cpu->lse, cu, b)}});
    check_rows(std::string(op) + " cpu" + where, s, rows_of(r.cpu->out, cu, b), lse_of(r.cpu->lse, cu, b), w, tol);
    check_rows(std::string(op) + " reference" + where, s, rows_of(r.ref->out, cu, b), lse_of(r.ref->lse, cu, b), w, tol);
  }
  // The backward on float pages (its special values: api_fuzz, on the core op it runs per sequence).
  if (c.int8 || s.specials || !in.upto(1)) return;
  Tensor dout = Tensor::empty({total, s.Hq, s.Dv}, s.t);
  for (std::int64_t i = 0; i < dout.numel(); ++i) store_from_double(dout.data(), s.t, i, in.moderate());
  const paged_layout lay{
      [&](const Tensor& x, std::int64_t b) { return sequence_of(x, cu, b); },
      [&](std::int64_t b, std::int64_t L) { return packed_oracle_options(s.o, b, nqs[std::size_t(b)], L, nqs, c.lens, true); },
      [&](const Tensor& dmask, std::int64_t b, std::int64_t L, const Tensor& g8) {  // sequence b's packed block
        std::int64_t off = 0;
        for (std::int64_t e = 0; e < b; ++e) off += nqs[std::size_t(e)] * c.lens[std::size_t(e)];
        const std::int64_t n = nqs[std::size_t(b)] * L, hm = dmask.rank() == 2 ? dmask.size(0) : 1;
        const std::vector<double> add = g8.to_vector();
        for (std::int64_t h = 0; h < hm; ++h)
          for (std::int64_t x = 0; x < n; ++x) dmask.data_as<double>()[h * (dmask.numel() / hm) + off + x] += add[std::size_t(h * n + x)];
      }};
  check_paged_grads("attention_paged_varlen_backward", s, c, q, dout, lay, [&](const execution& ex) {
    const varlen_result& f = ex.use_backend == backend::reference ? *r.ref : *r.cpu;
    return attention_paged_varlen_backward(q, tcu, max_q, c.view(), f.out, dout, f.lse, s.o, ex);
  });
}

void run_varlen(bytes& in, setup& s) {
  const char* op = "attention_varlen";
  std::vector<std::int64_t> cq = draw_lengths(in, s.B, 6), ck = draw_lengths(in, s.B, 9);
  std::int64_t max_q = 0, max_k = 0;
  for (std::int64_t b = 0; b < s.B; ++b) {
    max_q = std::max(max_q, cq[std::size_t(b) + 1] - cq[std::size_t(b)]);
    max_k = std::max(max_k, ck[std::size_t(b) + 1] - ck[std::size_t(b)]);
  }
  Tensor q = Tensor::empty({cq.back(), s.Hq, s.D}, s.t), k = Tensor::empty({ck.back(), s.Hkv, s.D}, s.t),
         v = Tensor::empty({ck.back(), s.Hkv, s.Dv}, s.t), dout = Tensor::empty({cq.back(), s.Hq, s.Dv}, s.t);
  fill(in, s, q), fill(in, s, k), fill(in, s, v);
  for (std::int64_t i = 0; i < dout.numel(); ++i) store_from_double(dout.data(), s.t, i, in.moderate());
  bool bad = false;
  if (s.corrupt) bad = in.upto(1) ? corrupt_cu(in, cq, max_q) : corrupt_cu(in, ck, max_k);
  std::vector<std::int64_t> nqs, nks;
  for (std::int64_t b = 0; b < s.B; ++b)
    nqs.push_back(cq[std::size_t(b) + 1] - cq[std::size_t(b)]), nks.push_back(ck[std::size_t(b) + 1] - ck[std::size_t(b)]);
  if (!bad) bad = draw_packed_mask(in, s, nqs, nks, s.corrupt);
  const Tensor tq = index_tensor({s.B + 1}, s.i32, cq), tk = index_tensor({s.B + 1}, s.i32, ck);
  const auto r = both<varlen_result>(op, s, bad, true, [&](const execution& ex) {
    return attention_varlen(q, k, v, tq, tk, max_q, max_k, s.o, ex);
  });
  if (bad) return;
  const double tol = tol_for(s.t);
  std::vector<oracle> w;
  for (std::int64_t b = 0; b < s.B; ++b) {
    const std::int64_t L = ck[std::size_t(b) + 1] - ck[std::size_t(b)];
    w.push_back(dense_oracle(s, sequence_of(q, cq, b), sequence_of(k, ck, b), sequence_of(v, ck, b),
                             packed_oracle_options(s.o, b, nqs[std::size_t(b)], L, nqs, nks, false)));
    const std::string where = " (sequence " + std::to_string(b) + ")";
    check_rows(std::string(op) + " cpu" + where, s, rows_of(r.cpu->out, cq, b), lse_of(r.cpu->lse, cq, b), w.back(), tol);
    check_rows(std::string(op) + " reference" + where, s, rows_of(r.ref->out, cq, b), lse_of(r.ref->lse, cq, b), w.back(), tol);
  }
  if (s.specials) return;  // the backward's special values: api_fuzz, on the core op
  const char* bop = "attention_varlen_backward";
  const auto g = both<varlen_grads>(bop, s, false, true, [&](const execution& ex) {
    const varlen_result& fw = ex.use_backend == backend::cpu ? *r.cpu : *r.ref;
    return attention_varlen_backward(q, k, v, fw.out, dout, fw.lse, tq, tk, max_q, max_k, s.o, ex);
  });
  const auto& gc = g.cpu;
  const auto& gr = g.ref;
  for (std::int64_t b = 0; b < s.B; ++b) {
    const std::int64_t L = ck[std::size_t(b) + 1] - ck[std::size_t(b)];
    const attention_options ob = packed_oracle_options(s.o, b, nqs[std::size_t(b)], L, nqs, nks, false);
    const Tensor qb = sequence_of(q, cq, b), kb = sequence_of(k, ck, b), vb = sequence_of(v, ck, b);
    const attention_grads g8 = attention_backward(qb, kb, vb, w[std::size_t(b)].truth.out, sequence_of(dout, cq, b),
                                                  w[std::size_t(b)].truth.lse, ob, {.use_backend = backend::reference});
    const double btol = backward_bound(s, g8, w[std::size_t(b)].truth.lse, sequence_of(dout, cq, b), qb, kb, vb);
    for (const auto* g : {&*gr, &*gc}) {
      const std::string who = std::string(bop) + (g == &*gc ? " cpu" : " reference") + " (sequence " + std::to_string(b) + ")";
      const auto cmp = [&](const char* name, const std::vector<double>& got, const Tensor& want) {
        compare_within(who + " " + name, got, want.to_vector(), btol);
      };
      cmp("dq", rows_of(g->dq, cq, b), g8.dq);
      cmp("dk", rows_of(g->dk, ck, b), g8.dk);
      cmp("dv", rows_of(g->dv, ck, b), g8.dv);
      if (g8.dattn_mask.defined()) {  // the float packed mask's gradient: sequence b's block
        const TensorView dm = g->dattn_mask.view();
        std::int64_t off = 0;
        for (std::int64_t c = 0; c < b; ++c) off += nqs[std::size_t(c)] * nks[std::size_t(c)];
        const std::int64_t n = nqs[std::size_t(b)] * L;
        cmp("dattn_mask", Tensor::copy_of(dm.rank() == 1 ? dm.slice(0, off, off + n) : dm.slice(1, off, off + n)).to_vector(),
            g8.dattn_mask);
      }
      if (g->dattn_mask.defined() != (s.o.attn_mask && s.o.attn_mask->type() != dtype::boolean))
        finding(who + " dattn_mask", "returned for no float mask, or missing for one");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  bytes in{data, size};
  setup s;
  s.op = in.upto(3);
  const dtype types[] = {dtype::f32, dtype::bf16, dtype::f16, dtype::f64};
  s.t = types[in.upto(3)];
  if (s.op == 1 && s.t == dtype::f64) s.t = dtype::f32;  // int8 pages take float32, bfloat16 or float16 q
  s.specials = in.upto(3) == 0;
  s.corrupt = in.upto(7) == 0;
  s.i32 = in.upto(1);
  s.B = 1 + in.upto(2), s.Hkv = 1 + in.upto(1), s.G = 1 + in.upto(2), s.Hq = s.Hkv * s.G;
  s.D = 1 + in.upto(8), s.Dv = in.upto(1) ? s.D : 1 + in.upto(8);
  if (s.op == 1 && in.upto(1)) s.D = 4 * (1 + in.upto(2));  // blocked int8 keys need D % 4 == 0
  // One input in eight: a model's head size, where the kernels take their whole-unit paths
  // (bf16 pairs in decode's q·k at D ≤ 128, int8 rows on int16 products in units of 64).
  if (in.upto(7) == 0) s.D = 32 << in.upto(2), s.Dv = in.upto(1) ? s.D : 32 << in.upto(2);
  s.cpu.num_threads = 1 + in.upto(1);
  attention_options& o = s.o;
  o.is_causal = in.upto(1);
  o.alignment = causal_alignment(s.op == 3 ? in.upto(1) : in.upto(2));
  o.window_left = in.upto(4) - 1;
  o.window_right = in.upto(4) - 1;
  if (in.upto(3) == 0) o.softcap = 0.5 + in.upto(40) / 4.0;
  if (in.upto(3) == 0) o.scale = (in.upto(20) - 10) / 4.0;
  if (in.upto(3) == 0) {
    const bool per_seq = in.upto(1);
    Tensor a = Tensor::empty(per_seq ? Shape{s.B, s.Hq} : Shape{s.Hq}, dtype::f32);
    for (std::int64_t i = 0; i < a.numel(); ++i) a.data_as<float>()[i] = float(in.moderate());
    o.alibi_slopes = a;
  }
  if (in.upto(3) == 0) {
    Tensor k = Tensor::empty({s.Hq}, dtype::f32);
    for (std::int64_t i = 0; i < k.numel(); ++i) k.data_as<float>()[i] = float(in.moderate());
    o.sinks = k;
  }
  if (std::getenv("ATTN_FUZZ_VERBOSE"))
    std::fprintf(stderr, "op %d %s specials %d corrupt %d i32 %d B%ld Hq%ld Hkv%ld D%ld Dv%ld threads %d causal %d align %d window %ld %ld softcap %g scale %g alibi %d sinks %d\n",
                 s.op, std::string(dtype_name(s.t)).c_str(), int(s.specials), int(s.corrupt), int(s.i32), long(s.B),
                 long(s.Hq), long(s.Hkv), long(s.D), long(s.Dv), s.cpu.num_threads, int(o.is_causal), int(o.alignment),
                 long(o.window_left), long(o.window_right), o.softcap, o.scale.value_or(-99),
                 o.alibi_slopes ? int(o.alibi_slopes->rank()) : 0, int(o.sinks.has_value()));
  fuzz::serving_counts& counts = fuzz::serving_fuzz_counts();
  const std::int64_t refused = counts.refused[s.op];
  switch (s.op) {
    case 0:
    case 1: run_paged(in, s); break;
    case 2: run_paged_varlen(in, s); break;
    default: run_varlen(in, s); break;
  }
  if (counts.refused[s.op] == refused) ++counts.checked[s.op];
  return 0;
}

// tools/attn/cmd_bench.cc — `attn bench`: time attention forward/backward and its peers in one
// run, and print each result next to what the machine can do (probed in the same run).
//
//   attn bench --hq 16 --nq 2048 --d 64 --causal            one shape, forward
//   attn bench --grid standard --threads 1,2 --csv out.csv    the standard grid, two thread counts
//   attn bench --hq 32 --hkv 8 --nq 1 --nk 131072 --d 128 --kv-cache both   one decode step
//   attn bench --nq 16 --nk 16 --d 8 --reps 1 --json          CI smoke test
//   attn bench --layer mha                                     nn::MultiHeadAttention vs torch (bench_layer.h)
//   attn bench --varlen 64:4096 --batch 16 --causal           packed sequences vs padded (bench_serving.h)
//   attn bench --paged 16 --hq 32 --hkv 8 --nq 1 --nk 16384 --d 128   paged decode vs dense
//   attn bench --score additive --distribution softmax --nq 2048 --threads 2   the family vs torch eager
//   attn bench --grid family --pass both                      every family pair (bench_family.h)
//
// Every configuration is timed as: --warmup untimed calls of each contender, then --reps rounds
// of one timed call each (attn, then every peer), the medians reported.
// FLOPs: forward 4·B·Hq·Nq·Nk·D (2·B·Hq·Nq·Nk·(D + Dv) in general), halved for causal;
// backward 2.5× the forward. GB/s: bytes of K and V (read once per call at least) per second.
// Peers, alternating with attn on the same inputs and threads (docs/PERFORMANCE.md):
//   blas      attention as OpenBLAS GEMM + softmax + GEMM (bench_blas.h), in this process
//   torch     torch.nn.functional.scaled_dot_product_attention   } bench/peers.py, run by the
//   ggml      ggml_flash_attn_ext (forward only)                 } benchmark venv's python
//   ort       ONNX Runtime's CPU Attention (opset 23, forward)   }
// The other files: bench_grid (configurations), bench_probe (machine peaks), bench_memory (RSS),
// bench_peers (the Python peer process), bench_report (table, JSON, CSV).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "attn/attn.h"
#include "bench_ab.h"
#include "bench_blas.h"
#include "bench_family.h"
#include "bench_grid.h"
#include "bench_layer.h"
#include "bench_memory.h"
#include "bench_peers.h"
#include "bench_probe.h"
#include "bench_report.h"
#include "bench_serving.h"
#include "cli.h"

namespace attn::cli {
namespace {

using bench::ab_knob;
using bench::ab_spec;
using bench::config;
using bench::env_guard;
using bench::parse_ab;
using bench::kv_mode;
using bench::row;
using bench::workload;

struct bench_args {
  std::int64_t batch = 1, hq = 8, hkv = 0, nq = 1024, nk = 0, d = 64, dv = 0;
  std::string dtype_name = "f32", pass = "forward", backend_name = "automatic", grid = "none", csv, peers = "blas,torch,ggml,ort";
  std::string python, peer_script, openblas_coretype = "auto", kv_cache;
  bool causal = false, backward = false, json = false, check = false;
  std::vector<int> threads{0};
  int reps = 5, warmup = 1;
  std::int64_t probe_mib = 512;
  std::string layer = "none";
  std::string varlen;        // --varlen MIN:MAX
  std::int64_t paged = 0;    // --paged PAGE_SIZE
  std::string kv_dtype;      // --kv-dtype int8 | bf16 | f32 (--paged; default --dtype)
  bool fastest = false;      // --fastest (--varlen, --paged)
  bool prefetch_probe = false;  // --prefetch-probe: the prefetcher probe alone
  std::string ab;            // --ab VAR=A,B: attn with an environment knob at A and at B, alternated
  bench::family_bench_args fam;  // --score/--distribution, --grid family: the family options
};

// --score/--distribution or --grid family: the family benchmark (bench_family.h) with the shape,
// passes, threads and peers of the command line. Without --pass/--backward it times the forward
// (the grid: both passes); --peers takes torch, tiled, core or none.
int run_family(const bench_args& a, bool pass_given, bool peers_given) {
  bench::family_bench_args f = a.fam;
  f.grid = a.grid == "family";
  f.B = a.batch, f.Hq = a.hq, f.Hkv = a.hkv ? a.hkv : a.hq, f.Nq = a.nq, f.Nk = a.nk ? a.nk : a.nq, f.D = a.d;
  f.Dv = a.dv ? a.dv : a.d, f.causal = a.causal;
  f.type = bench::parse_bench_dtype(a.dtype_name);
  const std::string pass = a.backward && !pass_given ? "both" : pass_given ? a.pass : f.grid ? "both" : "forward";
  f.passes.clear();
  if (pass == "forward" || pass == "both") f.passes.push_back(false);
  if (pass == "backward" || pass == "both") f.passes.push_back(true);
  f.threads.clear();
  for (int t : a.threads) {
    if (t < 0) throw error(fmt::format("attn bench: --threads {} must be >= 0 (0: all)", t));
    f.threads.push_back(t);
  }
  f.reps = a.reps, f.warmup = a.warmup, f.python = a.python, f.peer_script = a.peer_script, f.ab = a.ab;
  f.probe_mib = a.probe_mib;
  f.torch = f.tiled = f.core = false;
  std::stringstream ss(peers_given ? a.peers : std::string("torch,tiled,core"));
  for (std::string name; std::getline(ss, name, ',');) {
    if (name == "torch") f.torch = true;
    else if (name == "tiled") f.tiled = true;
    else if (name == "core") f.core = true;
    else if (name != "none" && !name.empty())
      throw error(fmt::format("attn bench: --peers {}: '{}' is not one of torch, tiled, core, none (the family's peers)",
                              a.peers, name));
  }
  return bench::run_family_bench(f);
}

// Which options were given on the command line (their defaults depend on it).
struct given {
  bool dtype = false, pass = false, kv_cache = false;
};

// Largest |a − b| over two tensors of one shape.
double max_abs_diff(const Tensor& a, const Tensor& b) {
  const Tensor fa = a.to(dtype::f32), fb = b.to(dtype::f32);
  const float *pa = fa.data_as<float>(), *pb = fb.data_as<float>();
  double m = 0;
  for (std::int64_t i = 0; i < fa.numel(); ++i) m = std::max(m, double(std::fabs(pa[i] - pb[i])));
  return m;
}

double elem_bytes(dtype t) { return double(dtype_size(t)); }

struct timing {
  double median_ms, min_ms;
};

timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  if (n == 0) return {NAN, NAN};
  return {n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]), ms.front()};
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// ---- what to run ----

std::vector<kv_mode> parse_kv_modes(const std::string& s) {
  if (s.empty() || s == "inplace") return {kv_mode::in_place};
  if (s == "onnx") return {kv_mode::onnx_past};
  if (s == "both") return {kv_mode::in_place, kv_mode::onnx_past};
  throw error(fmt::format("attn bench: --kv-cache {} is not one of inplace, onnx, both", s));
}

std::vector<config> make_configs(const bench_args& a, const given& g) {
  std::vector<bool> passes;
  const std::string pass = a.backward && !g.pass ? "both" : a.pass;
  if (pass == "forward" || pass == "both") passes.push_back(false);
  if (pass == "backward" || pass == "both") passes.push_back(true);

  std::vector<config> configs;
  if (a.grid == "standard") {
    if (g.kv_cache) throw error("attn bench: --kv-cache times one shape; it does not combine with --grid standard");
    std::vector<dtype> dtypes = g.dtype ? std::vector<dtype>{bench::parse_bench_dtype(a.dtype_name)}
                                        : std::vector<dtype>{dtype::f32, dtype::bf16};
    return bench::standard_grid(dtypes, g.pass || a.backward ? passes : std::vector<bool>{false, true});
  }
  workload w;
  w.B = a.batch, w.Hq = a.hq, w.Hkv = a.hkv ? a.hkv : a.hq, w.Nq = a.nq, w.Nk = a.nk ? a.nk : a.nq, w.D = a.d;
  w.Dv = a.dv ? a.dv : a.d, w.causal = a.causal, w.type = bench::parse_bench_dtype(a.dtype_name);
  for (auto [name, val] : {std::pair{"--batch", w.B}, {"--hq", w.Hq}, {"--hkv", w.Hkv}, {"--nq", w.Nq},
                           {"--nk", w.Nk}, {"--d", w.D}, {"--dv", w.Dv}})
    if (val < 1) throw error(fmt::format("attn bench: {} {} must be >= 1", name, val));
  if (w.Hq % w.Hkv != 0) throw error(fmt::format("attn bench: --hq {} is not a multiple of --hkv {}", w.Hq, w.Hkv));
  if (!g.kv_cache) {
    for (bool bwd : passes) configs.push_back({"custom", w, bwd});
    return configs;
  }
  if (passes.size() != 1 || passes[0])
    throw error("attn bench: --kv-cache times the forward decode step; --backward and --pass backward|both do not apply");
  if (w.Nk < w.Nq)
    throw error(fmt::format("attn bench: --kv-cache needs --nk {} (keys after the step) >= --nq {} (new tokens)", w.Nk,
                            w.Nq));
  for (kv_mode m : parse_kv_modes(a.kv_cache))
    configs.push_back({m == kv_mode::in_place ? "kv-cache" : "kv-cache-onnx", w, false, m});
  return configs;
}

std::vector<int> thread_counts(const bench_args& a) {
  std::vector<int> threads;
  for (int t : a.threads) threads.push_back(bench::resolve_threads(t));
  return threads;
}

// --peers split into the in-process OpenBLAS baseline and the Python peers ("torch,ggml,ort").
struct peer_choice {
  bool blas = false;
  std::string python;
};

peer_choice parse_peers(const std::string& list) {
  peer_choice c;
  std::stringstream ss(list);
  for (std::string name; std::getline(ss, name, ',');) {
    if (name == "blas")
      c.blas = true;
    else if (name == "torch" || name == "ggml" || name == "ort")
      c.python += (c.python.empty() ? "" : ",") + name;
    else if (name != "none" && !name.empty())
      throw error(fmt::format("attn bench: --peers {}: '{}' is not one of blas, torch, ggml, ort, none", list, name));
  }
  return c;
}

// ---- one configuration ----

// The inputs of one configuration, shared by every thread count. Plain: q, k, v (and dout for
// the backward). KV-cache modes: k and v are the Nq new rows; in_place adds a cache of capacity
// Nk holding Nk − Nq rows (lengths stay Nk − Nq, so every call is the same step); onnx_past adds
// a past of Nk − Nq rows.
struct inputs {
  Tensor q, k, v, dout;
  Tensor cache_k, cache_v, lengths;
  Tensor past_k, past_v;
};

inputs make_inputs(const config& c) {
  const workload& w = c.w;
  inputs in;
  const std::int64_t n_new = c.kv == kv_mode::plain ? w.Nk : w.Nq, n_past = w.Nk - w.Nq;
  in.q = bench::random_tensor({w.B, w.Hq, w.Nq, w.D}, w.type, 1);
  in.k = bench::random_tensor({w.B, w.Hkv, n_new, w.D}, w.type, 2);
  in.v = bench::random_tensor({w.B, w.Hkv, n_new, w.Dv}, w.type, 3);
  if (c.backward) in.dout = bench::random_tensor({w.B, w.Hq, w.Nq, w.Dv}, w.type, 4);
  if (c.kv == kv_mode::in_place) {
    in.cache_k = bench::random_tensor({w.B, w.Hkv, w.Nk, w.D}, w.type, 5);
    in.cache_v = bench::random_tensor({w.B, w.Hkv, w.Nk, w.Dv}, w.type, 6);
    in.lengths = Tensor::full({w.B}, dtype::i64, double(n_past));
  } else if (c.kv == kv_mode::onnx_past) {
    in.past_k = bench::random_tensor({w.B, w.Hkv, n_past, w.D}, w.type, 5);
    in.past_v = bench::random_tensor({w.B, w.Hkv, n_past, w.Dv}, w.type, 6);
  }
  return in;
}

// attn's call for the configuration; returns its result.
attention_result call_attn(const config& c, const inputs& in, const attention_options& o, const execution& exec) {
  switch (c.kv) {
    case kv_mode::in_place:
      return attention_with_kv_cache(in.q, in.k, in.v, kv_cache_view{in.cache_k, in.cache_v, in.lengths}, o, exec);
    case kv_mode::onnx_past: {
      attention_options op = o;
      op.past_key = in.past_k, op.past_value = in.past_v;
      return attention(in.q, in.k, in.v, op, exec);
    }
    case kv_mode::plain: break;
  }
  return attention(in.q, in.k, in.v, o, exec);
}

// With --check in a KV-cache mode: the step's output against a plain attention over the keys
// it saw (the cache after the step, or the present), bottom-right aligned as the step is.
double check_kv_step(const config& c, const inputs& in, const attention_options& o) {
  const attention_result r = call_attn(c, in, o, {});
  const Tensor K = c.kv == kv_mode::in_place ? in.cache_k : r.present_key;
  const Tensor V = c.kv == kv_mode::in_place ? in.cache_v : r.present_value;
  attention_options plain = o;
  plain.alignment = causal_alignment::bottom_right;
  return max_abs_diff(r.out, attention(in.q, K, V, plain).out);
}

// One contender timed in this process: attn (one way of calling it) or the OpenBLAS baseline.
struct contender {
  row r;
  std::function<void()> call;
  bool probe_memory = false;  // measure the memory its first call touches (attn's work_mib)
  std::vector<double> ms;
};

// --warmup untimed calls of each contender, then --reps rounds of one timed call each, in turn
// (then `after_round`, the Python peers' call), so that a change of load on a shared machine
// falls on all of them alike; `turn_about`: every other round in the reverse order (--ab: a
// contender that always ran second would always find the caches the first one left). Fills each
// contender's ms and, where asked, work_mib (before the results are subtracted).
void time_contenders(std::vector<contender>& cs, int warmup, int reps, const std::function<void()>& after_round,
                     bool turn_about = false) {
  auto call = [](contender& c, bool first) {
    const bool probe = first && c.probe_memory;
    bench::memory_probe mem;
    if (probe) mem.begin();
    const auto t0 = std::chrono::steady_clock::now();
    c.call();
    const double ms = ms_since(t0);
    if (probe) c.r.work_mib = mem.end_mib();
    return ms;
  };
  for (auto& c : cs)
    for (int i = 0; i < warmup; ++i) call(c, i == 0);
  for (int rep = 0; rep < reps; ++rep) {
    for (std::size_t i = 0; i < cs.size(); ++i) {
      contender& c = cs[turn_about && rep % 2 ? cs.size() - 1 - i : i];
      c.ms.push_back(call(c, warmup == 0 && rep == 0));
    }
    if (after_round) after_round();
  }
}

// Median and minimum into the contenders' rows.
void summarize_rows(std::vector<contender>& cs) {
  for (auto& c : cs) {
    const timing tm = summarize(c.ms);
    c.r.median_ms = tm.median_ms, c.r.min_ms = tm.min_ms;
  }
}

// attn's contender(s) for one call: one, or with --ab two (the knob at A, then at B, before each
// of its calls), each writing the backend that ran into its row's detail.
void add_attn(std::vector<contender>& cs, const row& r, const ab_knob& ab, std::function<std::string()> call) {
  for (int i = 0; i < (ab.spec ? 2 : 1); ++i) {
    row ar = r;
    if (ab.spec) ar.impl = "attn[" + (i == 0 ? ab.spec->a : ab.spec->b) + "]";
    const std::size_t at = cs.size();
    cs.push_back({ar, [&cs, &ab, at, i, call] {
                    if (ab.spec) ab.guard->set(i == 0 ? ab.spec->a : ab.spec->b);
                    cs[at].r.detail = call();
                  }, true, {}});
  }
}

// The line of --ab for contenders x (the knob at A) and y (at B): the median of y's times over
// x's, round by round.
std::string ab_line(const ab_spec& ab, const config& c, int t, const contender& x, const contender& y) {
  const std::string what = c.kv == kv_mode::plain ? (c.backward ? "backward" : "forward") : c.name;
  return bench::ab_ratio_line(ab, fmt::format("{} {} {}", bench::shape_label(c.w), bench::short_dtype(c.w.type), what),
                              t, x.ms, y.ms);
}

// Inputs are uniform in [-1, 1): results are O(1), gradients O(√Nk) at most.
double check_tolerance(const config& c) {
  return (c.w.type == dtype::f32 ? 2e-3 : 6e-2) * (c.backward ? std::sqrt(double(c.w.Nk)) : 1.0);
}

struct run_context {
  const bench_args& a;
  backend be;
  bench::blas_baseline* blas;
  bench::python_peers* py;
  bench::report& out;
};

// Times one configuration at one thread count — attn, the OpenBLAS baseline, the Python peers —
// and emits its rows; returns the number of failed checks (0 or 1).
int time_config(const run_context& ctx, const config& c, const inputs& in, int t) {
  const bench_args& a = ctx.a;
  const workload& p = c.w;
  attention_options o;
  o.is_causal = p.causal;
  const execution exec{.use_backend = ctx.be, .num_threads = t};

  std::vector<contender> locals;
  row attn_row{c, t, "attn", "", false};
  attention_result fwd;  // the forward that the backward differentiates (not timed)
  if (c.backward) fwd = attention(in.q, in.k, in.v, o, exec);
  const ab_knob ab(a.ab);  // --ab: attn twice, the knob set to each value before each of its calls
  // attn writes into results allocated and touched once, before the timing, as the OpenBLAS
  // baseline does (attention_into, attention_backward_into): the calls time the attention, not
  // the page faults of fresh memory for out or dq/dk/dv, which an engine's arena or a caching
  // allocator does not pay either (3–5 % of a large float32 call; docs/PERFORMANCE.md).
  Tensor res[3];
  if (!c.backward) {
    res[0] = Tensor::zeros({p.B, p.Hq, p.Nq, p.Dv}, p.type), res[1] = Tensor::zeros({p.B, p.Hq, p.Nq}, dtype::f32);
  } else {
    for (int i = 0; i < 3; ++i) res[i] = Tensor::zeros((i == 0 ? in.q : i == 1 ? in.k : in.v).shape(), p.type);
  }
  const auto attn_call = [&]() -> std::string {  // the backend that ran
    if (!c.backward) return attention_into(in.q, in.k, in.v, {.out = res[0], .lse = res[1].view()}, o, exec);
    return attention_backward_into(in.q, in.k, in.v, fwd.out, in.dout, fwd.lse,
                                   {.dq = res[0], .dk = res[1], .dv = res[2]}, o, exec)
        .backend;
  };
  add_attn(locals, attn_row, ab, attn_call);
  const std::size_t n_attn = locals.size();
  const Tensor out = Tensor::empty({p.B, p.Hq, p.Nq, p.Dv}, p.type);
  Tensor dq, dk, dv;
  if (ctx.blas) {
    row b{c, t, "blas_unfused", ctx.blas->describe(), true};
    if (const std::string why = ctx.blas->skip_reason(p, t); !why.empty()) {
      ctx.out.skipped(t, b.impl, why);
    } else if (!c.backward) {
      locals.push_back({b, [&] { ctx.blas->forward(p, in.q, in.k, in.v, out, t); }, false, {}});
    } else {
      ctx.blas->forward(p, in.q, in.k, in.v, out, t);
      dq = Tensor::empty(in.q.shape(), p.type), dk = Tensor::empty(in.k.shape(), p.type);
      dv = Tensor::empty(in.v.shape(), p.type);
      locals.push_back({b, [&] { ctx.blas->backward(p, in.q, in.k, in.v, out, in.dout, dq, dk, dv, t); }, false, {}});
    }
  }
  bench::python_peers* py = ctx.py && ctx.py->ok() ? ctx.py : nullptr;
  std::vector<bench::python_peers::peer_state> remote;
  std::map<std::string, std::vector<double>> remote_ms;
  if (py) remote = py->prepare(c, t, a.warmup);

  // attn's first call also measures the memory it touches beyond its results (touched before).
  time_contenders(
      locals, a.warmup, a.reps,
      [&] {
        if (py && !remote.empty())
          for (const auto& [impl, ms] : py->rep()) remote_ms[impl].push_back(ms);
      },
      ab.spec.has_value());
  summarize_rows(locals);
  const double attn_ms = locals[0].r.median_ms;
  for (auto& l : locals)
    if (l.r.peer) l.r.attn_ms = attn_ms;
  // (printed after the rows)
  const std::string ab_text = ab.spec ? ab_line(*ab.spec, c, t, locals[0], locals[1]) : std::string();

  int failed = 0;
  if (a.check && locals.size() > n_attn) {  // the baseline's results against attn's
    row& b = locals[n_attn].r;
    b.max_abs_diff = 0;
    for (std::size_t i = 0; i < n_attn; ++i) {  // with --ab, attn under each value of the knob
      if (ab.spec) ab.guard->set(i == 0 ? ab.spec->a : ab.spec->b);
      double d = 0;
      if (!c.backward) {
        d = max_abs_diff(out, attention(in.q, in.k, in.v, o).out);
      } else {
        const attention_grads g = attention_backward(in.q, in.k, in.v, fwd.out, in.dout, fwd.lse, o);
        d = std::max({max_abs_diff(dq, g.dq), max_abs_diff(dk, g.dk), max_abs_diff(dv, g.dv)});
      }
      b.max_abs_diff = std::isnan(d) ? d : std::max(b.max_abs_diff, d);
      if (std::isnan(d)) break;
    }
    const double tol = check_tolerance(c);
    if (!(b.max_abs_diff <= tol)) {
      fmt::print(stderr, "attn bench: check failed: {} {} {}: |blas_unfused − attn| = {:.3g} > {:.3g}\n",
                 bench::shape_label(p), bench::short_dtype(p.type), c.backward ? "backward" : "forward",
                 b.max_abs_diff, tol);
      failed = 1;
    }
  }
  for (const auto& l : locals) ctx.out.emit(l.r);
  for (const auto& ps : remote) {
    const auto it = remote_ms.find(ps.impl);
    if (!ps.ready || it == remote_ms.end()) {
      ctx.out.skipped(t, ps.impl, ps.ready ? "failed while timed" : ps.detail);
      continue;
    }
    row pr{c, t, ps.impl, ps.detail, true};
    const timing tm = summarize(it->second);
    pr.median_ms = tm.median_ms, pr.min_ms = tm.min_ms, pr.attn_ms = attn_ms;
    ctx.out.emit(pr);
  }
  if (py) py->release();
  if (!ab_text.empty()) fmt::print(a.json ? stderr : stdout, "{}", ab_text);
  return failed;
}

// Times the decode step of each KV-cache configuration (in place, ONNX past/present: one or
// both, on one workload) at one thread count, alternating call by call; emits a row per mode and
// returns the number of failed checks.
int time_kv_steps(const run_context& ctx, const std::vector<config>& cs, const std::vector<inputs>& ins, int t) {
  const bench_args& a = ctx.a;
  attention_options o;
  o.is_causal = cs.front().w.causal;
  o.alignment = causal_alignment::after_past;  // the new tokens follow the cache
  const execution exec{.use_backend = ctx.be, .num_threads = t};
  const ab_knob ab(a.ab);
  const std::size_t per = ab.spec ? 2 : 1;  // contenders of a mode: steps[i·per …]
  std::vector<contender> steps;
  for (std::size_t i = 0; i < cs.size(); ++i)
    add_attn(steps, row{cs[i], t, "attn", "", false}, ab, [&, i] { return call_attn(cs[i], ins[i], o, exec).backend; });
  time_contenders(steps, a.warmup, a.reps, nullptr, ab.spec.has_value());
  summarize_rows(steps);
  int failed = 0;
  for (std::size_t j = 0; j < steps.size(); ++j) {
    const std::size_t i = j / per;
    const workload& w = cs[i].w;
    row& r = steps[j].r;
    // Results: out and lse, and with a past the present key and value.
    double result_bytes = double(w.B * w.Hq * w.Nq) * (double(w.Dv) * elem_bytes(w.type) + 4.0);
    if (cs[i].kv == kv_mode::onnx_past) result_bytes += bench::kv_bytes(w);
    r.work_mib -= result_bytes / (1 << 20);
    if (a.check) {
      if (ab.spec) ab.guard->set(j % per == 0 ? ab.spec->a : ab.spec->b);  // the row's own value
      r.max_abs_diff = check_kv_step(cs[i], ins[i], o);
      const double tol = check_tolerance(cs[i]);
      if (!(r.max_abs_diff <= tol)) {
        fmt::print(stderr, "attn bench: check failed: {} {} {}: |step − plain attention| = {:.3g} > {:.3g}\n",
                   bench::shape_label(w), bench::short_dtype(w.type), cs[i].name, r.max_abs_diff, tol);
        failed++;
      }
    }
    ctx.out.emit(r);
  }
  if (ab.spec)
    for (std::size_t i = 0; i < cs.size(); ++i)
      fmt::print(a.json ? stderr : stdout, "{}", ab_line(*ab.spec, cs[i], t, steps[i * per], steps[i * per + 1]));
  return failed;
}

// ---- the run ----

int run(const bench_args& a, const given& g) {
  if (a.reps < 1) throw error(fmt::format("attn bench: --reps {} must be >= 1", a.reps));
  if (a.warmup < 0) throw error(fmt::format("attn bench: --warmup {} must be >= 0", a.warmup));
  const std::vector<config> configs = make_configs(a, g);
  const std::vector<int> threads = thread_counts(a);
  const backend be = parse_backend(a.backend_name);
  if (be == backend::cuda)  // its host path times two copies over PCIe, not the kernels
    throw error("attn bench: --backend cuda is not benchmarked yet: the device-tensor timing is issue 16's "
                "next step (docs/CUDA.md)");
  peer_choice peers = parse_peers(a.peers);
  if (g.kv_cache) peers = {};  // the peers have no KV cache

  // What the machine can do, probed now (the same run as the timings below).
  bench::machine m;
  m.cpu = bench::cpu_model_name();
  for (int t : threads) {
    if (m.f32_peak.count(t)) continue;
    m.f32_peak[t] = bench::probe_fma_peak(dtype::f32, t);
    m.bf16_peak[t] = bench::probe_fma_peak(dtype::bf16, t);
    if (a.probe_mib > 0) m.dram[t] = bench::probe_dram_read(t, std::size_t(a.probe_mib) << 20);
  }
  bench::blas_baseline* blas = peers.blas ? &bench::blas_baseline::instance(a.openblas_coretype) : nullptr;
  m.blas = blas ? blas->describe() : g.kv_cache ? "not run with --kv-cache" : "not asked for (--peers)";
  std::unique_ptr<bench::python_peers> py;
  if (!peers.python.empty()) {
    const std::string python = bench::find_python(a.python), script = bench::find_peer_script(a.peer_script);
    if (python.empty())
      m.python = "not measured: no benchmark venv (run bench/setup_venv.sh, or pass --python)";
    else if (script.empty())
      m.python = "not measured: bench/peers.py not found (pass --peer-script)";
    else {
      py = std::make_unique<bench::python_peers>(python, script, peers.python);
      m.python = py->ok() ? python + " " + script : "not measured: " + py->why();
      if (py->ok()) m.peer_versions = py->versions();
    }
  }
  bench::report out(m, a.json, a.csv, threads.front());
  out.header();

  const run_context ctx{a, be, blas, py.get(), out};
  int failed_checks = 0;
  if (g.kv_cache) {  // the modes share one workload and alternate
    std::vector<inputs> ins;
    for (const config& c : configs) ins.push_back(make_inputs(c));
    for (int t : threads) failed_checks += time_kv_steps(ctx, configs, ins, t);
  } else {
    for (const config& c : configs) {
      const inputs in = make_inputs(c);
      for (int t : threads) failed_checks += time_config(ctx, c, in, t);
    }
  }
  return failed_checks ? 1 : 0;
}

// --varlen / --paged: the serving ops (bench_serving.cc); --hkv defaults to --hq.
int run_serving(const bench_args& a, bool varlen) {
  bench::serving_args s;
  s.batch = a.batch, s.hq = a.hq, s.hkv = a.hkv ? a.hkv : a.hq, s.nq = a.nq, s.nk = a.nk ? a.nk : a.nq, s.d = a.d;
  s.causal = a.causal, s.type = bench::parse_bench_dtype(a.dtype_name), s.threads = a.threads;
  s.reps = a.reps, s.warmup = a.warmup, s.probe_mib = a.probe_mib, s.page_size = a.paged, s.fastest = a.fastest;
  s.ab = a.ab;
  s.kv_type = a.kv_dtype.empty() ? s.type : a.kv_dtype == "int8" ? dtype::i8 : bench::parse_bench_dtype(a.kv_dtype);
  s.backward = a.backward || a.pass == "backward" || a.pass == "both";
  if (varlen && s.backward) throw error("attn bench: --varlen times the forward; --backward and --pass backward|both apply to --paged");
  if (!varlen) return bench::run_paged(s);
  const auto colon = a.varlen.find(':');
  try {
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    s.len_min = std::stoll(a.varlen.substr(0, colon)), s.len_max = std::stoll(a.varlen.substr(colon + 1));
  } catch (const std::exception&) {
    throw error(fmt::format("attn bench: --varlen {} is not MIN:MAX (two whole numbers)", a.varlen));
  }
  return bench::run_varlen(s);
}

}  // namespace

void add_bench(CLI::App& app, int& exit_code) {
  auto* s = app.add_subcommand("bench", "Time attention (and peers: OpenBLAS unfused, PyTorch, ggml, ONNX Runtime) against the machine's peak");
  auto a = std::make_shared<bench_args>();
  s->add_option("--batch", a->batch, "B");
  s->add_option("--hq", a->hq, "query heads Hq");
  s->add_option("--hkv", a->hkv, "key/value heads Hkv (default Hq)");
  s->add_option("--nq", a->nq, "query length Nq");
  s->add_option("--nk", a->nk, "key length Nk (default Nq)");
  s->add_option("--d", a->d, "query/key head size D");
  s->add_option("--dv", a->dv, "value head size Dv (default D)");
  auto* dt = s->add_option("--dtype", a->dtype_name, "f32 | bf16 | f16 (with --grid: only this dtype)")
                 ->check(CLI::IsMember({"f32", "float32", "bf16", "bfloat16", "f16", "float16"}));
  s->add_flag("--causal", a->causal, "causal mask (top-left aligned)");
  auto* ps = s->add_option("--pass", a->pass, "forward | backward | both (with --grid: default both)")
                 ->check(CLI::IsMember({"forward", "backward", "both"}));
  s->add_flag("--backward", a->backward, "time the backward too (same as --pass both)");
  s->add_option("--threads", a->threads, "thread counts, comma-separated (0: all cores)")->delimiter(',');
  s->add_option("--reps", a->reps, "timed repetitions (the median is reported)");
  s->add_option("--warmup", a->warmup, "untimed calls before the timed ones");
  s->add_option("--backend", a->backend_name, "attn backend: automatic | reference | cpu")
      ->check(backend_name_check());
  s->add_option("--grid", a->grid,
                "none | standard (the grid of docs/PERFORMANCE.md) | family (every family pair at B1 H8 N2048 D64 and "
                "B1 H8 N4096 D128)")
      ->check(CLI::IsMember({"none", "standard", "family"}));
  s->add_flag("--json", a->json, "one JSON object per line and configuration (the header goes to stderr)");
  s->add_option("--csv", a->csv, "also write every row to this CSV file");
  s->add_flag("--check", a->check,
              "compare the OpenBLAS baseline's results with attn's (exit status 1 when they differ)");
  s->add_option("--peers", a->peers, "peers to measure, comma-separated: blas, torch, ggml, ort, or none; with --score/--distribution/--grid family: torch (eager), tiled, core, or none");
  s->add_option("--python", a->python, "python of the benchmark venv (default $ATTN_BENCH_PYTHON, ~/.cache/attn-bench-venv)");
  s->add_option("--peer-script", a->peer_script, "bench/peers.py (found next to the build tree by default)");
  s->add_option("--openblas-coretype", a->openblas_coretype,
                 "auto (SkylakeX where the CPU has AVX-512F) | env (keep OPENBLAS_CORETYPE) | a core name");
  s->add_option("--probe-mib", a->probe_mib, "buffer of the DRAM bandwidth probe in MiB (0: no probe)");
  auto* kv = s->add_option("--kv-cache", a->kv_cache,
                           "time one decode step appending --nq tokens to a cache of --nk − --nq: inplace (default: "
                           "attention_with_kv_cache), onnx (past_key/past_value copied into a new present), both")
                 ->expected(0, 1);
  auto* vl = s->add_option("--varlen", a->varlen,
                           "MIN:MAX — attention_varlen on --batch sequences of random lengths in [MIN, MAX] against "
                           "the batch padded to the longest");
  auto* pg = s->add_option("--paged", a->paged,
                           "PAGE_SIZE — attention_paged (consecutive and shuffled pages) against dense attention, "
                           "--batch sequences of --nk keys, --nq queries each; with --pass backward|both (float caches) "
                           "attention_paged_backward against the dense backward too");
  s->add_option("--kv-dtype", a->kv_dtype, "with --paged: K/V cache dtype int8 | bf16 | f32 (default --dtype; a float cache sets q's dtype too)")
      ->check(CLI::IsMember({"int8", "bf16", "bfloat16", "f32", "float32"}));
  s->add_flag("--prefetch-probe", a->prefetch_probe,
              "print what the hardware prefetchers follow (two streams read a 4 KiB block at a time: one load "
              "instruction in a loop, a load instruction per line, the latter with prefetcht1 ahead) for each --threads, "
              "over --probe-mib, and exit");
  auto* abo = s->add_option(
      "--ab", a->ab,
      "VAR=A,B — time attn (the plain call, the --kv-cache step, a family pair, or every contender of --varlen/--paged) with the environment variable VAR at A and at "
      "B, alternated call by call in this process (the order turned about every other round), and print the median "
      "of the paired B/A time ratios: a few per cent resolved on a host whose speed drifts by more between runs. For "
      "the knobs the library reads on every call (ATTN_CPU_BACKWARD, ATTN_CPU_ISA, ATTN_CPU_BF16_DOTS, "
      "ATTN_DECODE_INT8, ATTN_MASK_SPANS, …)");
  s->add_flag("--fastest", a->fastest,
              "with --varlen or --paged: report the fastest of the --reps calls rather than the median (steadier for a "
              "compute-bound kernel on a shared host)");
  auto* batch = s->get_option("--batch");
  auto* hq = s->get_option("--hq");
  auto* nq = s->get_option("--nq");
  auto* d = s->get_option("--d");
  auto* threads = s->get_option("--threads");
  s->add_option("--layer", a->layer,
                "none | mha: time nn::MultiHeadAttention forward+backward beside torch.nn.MultiheadAttention "
                "(default shape B8 N512 H8 D64, 2 threads; --batch, --nq, --hq, --d, --threads, --reps change it)")
      ->check(CLI::IsMember({"none", "mha"}));
  // The attention family (bench_family.h): the options of `attn run` that shape the call.
  bench::family_bench_args& f = a->fam;
  s->add_option("--score", f.score,
                "time attn::attention_family with this score (dot | scaled_dot | general | biased_general | "
                "activated_general | additive | cosine | location | gaussian | box | triangle) beside torch eager")
      ->check(CLI::IsMember({"dot", "scaled_dot", "general", "biased_general", "activated_general", "additive",
                             "cosine", "location", "gaussian", "box", "triangle"}));
  s->add_option("--distribution", f.distribution,
                "family distribution: softmax | sigmoid | sparsemax | entmax15 | hardmax | topk | kernel | identity")
      ->check(CLI::IsMember({"softmax", "sigmoid", "sparsemax", "entmax15", "hardmax", "topk", "kernel", "identity"}));
  s->add_option("--activation", f.activation, "family: activated_general's tanh | relu | sigmoid")
      ->check(CLI::IsMember({"tanh", "relu", "sigmoid"}));
  s->add_option("--scale", f.scale, "family: scaled_dot's scale (default 1/sqrt(D))");
  s->add_option("--temperature", f.temperature, "family: cosine temperature (default 1)");
  s->add_option("--bandwidth", f.bandwidth,
                "family: gaussian, box, triangle bandwidth (default: gaussian 1; box, triangle sqrt(2D/3), the median "
                "distance of the bench's uniform inputs, so that about half the keys fall inside)");
  s->add_option("--gaussian-form", f.gaussian_form, "family: gaussian sigma | width")
      ->check(CLI::IsMember({"sigma", "width"}));
  s->add_option("--sigmoid-bias", f.sigmoid_bias, "family: sigmoid bias (default -log Nk)");
  s->add_option("--topk", f.topk, "family: topk's k (default 8)");
  s->add_option("--hardmax-gradient", f.hardmax_gradient, "family: zero | straight_through")
      ->check(CLI::IsMember({"zero", "straight_through"}));
  s->add_option("--family-path", f.family_path, "family: the path attn is timed on: automatic | core | fused | tiled | reference")
      ->check(CLI::IsMember({"automatic", "core", "fused", "tiled", "reference"}));
  s->add_option("--additive-hidden", f.A, "family: the additive score's hidden size A (default 64)");
  s->add_flag("--multi-dimensional", f.multi_dim, "family: additive with w_v [Dv, A], one distribution per value feature");
  auto* peers = s->get_option("--peers");
  s->callback([a, dt, ps, kv, vl, pg, batch, hq, nq, d, threads, peers, abo, &exit_code] {
    if (abo->count()) {
      parse_ab(a->ab);  // (a malformed one is named before anything runs)
      if (a->prefetch_probe || a->layer != "none" || a->grid == "standard")
        throw error("attn bench: --ab times the plain attention call, the --kv-cache step, the family's pairs "
                    "(--score/--distribution, --grid family), --varlen and --paged; not with --grid standard, --layer or "
                    "--prefetch-probe");
    }
    if (a->prefetch_probe) {
      if (vl->count() || pg->count() || kv->count() || a->layer != "none" || a->grid != "none" ||
          !a->fam.score.empty() || !a->fam.distribution.empty() || a->fastest)
        throw error("attn bench: --prefetch-probe runs alone (with --threads and --probe-mib)");
      const std::vector<int> threads = thread_counts(*a);
      if (a->probe_mib <= 0) throw error(fmt::format("attn bench: --prefetch-probe needs --probe-mib > 0 (got {})", a->probe_mib));
      for (int n : threads) {
        const bench::prefetch_probe_result r = bench::probe_prefetchers(n, std::size_t(a->probe_mib) << 20);
        fmt::print("prefetch probe, {} thread{}, {} MiB ({}): one load instruction a stream {:.1f} GB/s | a load "
                   "instruction per line {:.1f} GB/s | the same with prefetcht1 16 KiB ahead {:.1f} GB/s\n",
                   n, n == 1 ? "" : "s", a->probe_mib, r.isa, r.rolled, r.unrolled, r.unrolled_prefetch);
      }
      exit_code = 0;
      return;
    }
    if (a->grid == "family" || !a->fam.score.empty() || !a->fam.distribution.empty()) {
      if (vl->count() || pg->count() || kv->count() || a->layer != "none")
        throw error("attn bench: --score/--distribution/--grid family do not combine with --varlen, --paged, "
                    "--kv-cache or --layer");
      exit_code = run_family(*a, ps->count() > 0, peers->count() > 0);
      return;
    }
    if (vl->count() || pg->count()) {
      exit_code = run_serving(*a, vl->count() > 0);
      return;
    }
    if (a->fastest) throw error("attn bench: --fastest applies to --varlen and --paged only");
    if (a->layer == "mha") {
      bench::layer_args l;
      if (batch->count()) l.B = a->batch;
      if (hq->count()) l.H = a->hq;
      if (nq->count()) l.N = a->nq;
      if (d->count()) l.D = a->d;
      if (threads->count()) l.threads = a->threads;
      l.reps = a->reps, l.warmup = a->warmup, l.python = a->python, l.peer_script = a->peer_script;
      l.torch = a->peers.find("torch") != std::string::npos;
      l.openblas_coretype = a->openblas_coretype;
      exit_code = bench::run_mha_layer(l);
      return;
    }
    exit_code = run(*a, given{dt->count() > 0, ps->count() > 0, kv->count() > 0});
  });
}

}  // namespace attn::cli

// tools/attn/bench_family.cc — `attn bench --score/--distribution` and `--grid family`
// (bench_family.h).
#include "bench_family.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <array>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "attn/attn.h"
#include "bench_ab.h"
#include "bench_grid.h"
#include "bench_peers.h"
#include "bench_probe.h"

namespace attn::cli::bench {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The inputs of one pair at one shape, and the options that point into them.
struct family_inputs {
  Tensor q, k, v, dout, W, b, W_q, W_k, w_v, W_a;
  family_options o;
};

// The bandwidth of a pair at head size D: --bandwidth, else for box and triangle the median
// distance of the bench's inputs (uniform in [-1, 1): E‖q − k‖² = 2D/3), so that about half of
// the keys fall inside a query's box — at 1 every key lies outside and the output is zeros —,
// and 1 for gaussian (its scores go through softmax: any h gives a distribution).
double family_bandwidth(const family_bench_args& a, const std::string& score, std::int64_t D) {
  if (a.bandwidth) return *a.bandwidth;
  return score == "box" || score == "triangle" ? std::sqrt(2.0 * double(D) / 3.0) : 1.0;
}

family_inputs make_inputs(const family_bench_args& a, const workload& w, const std::string& score,
                          const std::string& dist) {
  family_inputs in;
  in.q = random_tensor({w.B, w.Hq, w.Nq, w.D}, w.type, 1);
  in.k = random_tensor({w.B, w.Hkv, w.Nk, w.D}, w.type, 2);
  in.v = random_tensor({w.B, w.Hkv, w.Nk, w.Dv}, w.type, 3);
  in.dout = random_tensor({w.B, w.Hq, w.Nq, w.Dv}, w.type, 4);
  family_options& o = in.o;
  o.score.kind = parse_score_kind(score);
  o.distribution.kind = parse_distribution_kind(dist);
  o.score.scale = a.scale;
  o.score.activation = parse_score_activation(a.activation);
  o.score.temperature = a.temperature;
  o.score.bandwidth = family_bandwidth(a, score, w.D);
  o.score.gaussian = parse_gaussian_form(a.gaussian_form);
  o.distribution.sigmoid_bias = a.sigmoid_bias;
  o.distribution.k = a.topk;
  o.distribution.hardmax_grad = parse_hardmax_gradient(a.hardmax_gradient);
  o.is_causal = w.causal;
  switch (o.score.kind) {
    case score_kind::general:
    case score_kind::biased_general:
    case score_kind::activated_general:
      in.W = random_tensor({w.D, w.D}, w.type, 5), o.score.W = in.W.view();
      if (o.score.kind == score_kind::biased_general) in.b = random_tensor({w.D}, w.type, 6), o.score.b = in.b.view();
      if (o.score.kind == score_kind::activated_general) in.b = random_tensor({1}, w.type, 6), o.score.b = in.b.view();
      break;
    case score_kind::additive:
      in.W_q = random_tensor({a.A, w.D}, w.type, 7), in.W_k = random_tensor({a.A, w.D}, w.type, 8);
      in.b = random_tensor({a.A}, w.type, 9), in.w_v = a.multi_dim ? random_tensor({w.Dv, a.A}, w.type, 10) : random_tensor({a.A}, w.type, 10);
      o.score.W_q = in.W_q.view(), o.score.W_k = in.W_k.view(), o.score.b = in.b.view(), o.score.w_v = in.w_v.view();
      break;
    case score_kind::location: in.W_a = random_tensor({w.Nk, w.D}, w.type, 11), o.score.W_a = in.W_a.view(); break;
    default: break;
  }
  return in;
}

// The family fields of bench/peers.py's prepare line.
std::string peer_spec(const family_bench_args& a, const std::string& score, const std::string& dist, double bandwidth) {
  std::string s = fmt::format("family score={} dist={} A={} topk={} temperature={} bandwidth={} form={} activation={}",
                              score, dist, a.A, a.topk, a.temperature, bandwidth, a.gaussian_form, a.activation);
  if (a.scale) s += fmt::format(" scale={}", *a.scale);
  if (a.multi_dim) s += " multi_dim=1";
  if (a.sigmoid_bias) s += fmt::format(" sigmoid_bias={}", *a.sigmoid_bias);
  return s;
}

struct contender {
  std::string impl;
  std::function<std::string()> call;  // returns the path it ran
  std::string detail;
  std::vector<double> ms;
};

void print_row(const std::string& pair, const workload& w, bool fb, int t, const std::string& impl, double med,
               double mn, double attn_ms, const std::string& detail) {
  fmt::print("{:<28} {:<22} {:<8} {:>3} {:<12} {:>11.2f} {:>11.2f} {:>8} {}\n", pair, shape_label(w),
             fb ? "fwd+bwd" : "forward", t, impl, med, mn,
             impl == "attn" ? std::string("1.00") : fmt::format("{:.2f}", med / attn_ms), detail);
}

// Times one pair at one shape, pass and thread count; prints its rows.
void time_pair(const family_bench_args& a, python_peers* py, const workload& w, const std::string& score,
               const std::string& dist, bool fb, int t) {
  family_inputs in = make_inputs(a, w, score, dist);
  const family_options& o = in.o;
  const execution exec{.path = parse_family_path(a.family_path), .num_threads = t};
  std::vector<contender> cs;
  auto family_call = [&in, fb](execution e) {
    return [&in, fb, e] {
      const family_result r = attention_family(in.q, in.k, in.v, in.o, e);
      if (fb) return attention_family_backward(in.q, in.k, in.v, in.dout, r, in.o, e).path;
      return r.path;
    };
  };
  // --ab: attn[A] and attn[B], the knob set before each of their calls.
  const std::optional<ab_spec> ab = a.ab.empty() ? std::nullopt : std::optional<ab_spec>(parse_ab(a.ab));
  std::optional<env_guard> guard;
  if (ab) guard.emplace(ab->var);
  if (!ab) cs.push_back({"attn", family_call(exec), "", {}});
  for (int i = 0; ab && i < 2; ++i) {
    const std::string value = i == 0 ? ab->a : ab->b;
    cs.push_back({"attn[" + value + "]", [&guard, value, call = family_call(exec)] {
                    guard->set(value);
                    return call();
                  }, "", {}});
  }
  // attn's first warm-up call (an extra untimed one without warm-up) tells which path it takes:
  // the tiled contender runs only where that is not already tiled.
  int attn_warm = 0;
  if (a.tiled) cs[0].detail = cs[0].call(), attn_warm = 1;
  if (a.tiled && cs[0].detail != "tiled") {
    execution et = exec;
    et.path = family_path::tiled;
    cs.push_back({"attn_tiled", family_call(et), "", {}});
  }
  const bool core_pair = (o.score.kind == score_kind::dot || o.score.kind == score_kind::scaled_dot) &&
                         o.distribution.kind == distribution_kind::softmax;
  if (a.core && core_pair) {
    attention_options ao;
    ao.is_causal = w.causal;
    ao.scale = o.score.kind == score_kind::dot ? std::optional<double>(1.0) : o.score.scale;
    const execution ec{.num_threads = t};
    cs.push_back({"attn_core", [&in, ao, ec, fb] {
                    const attention_result r = attention(in.q, in.k, in.v, ao, ec);
                    if (fb) return attention_backward(in.q, in.k, in.v, r.out, in.dout, r.lse, ao, ec).backend;
                    return r.backend;
                  }, "", {}});
  }
  std::vector<python_peers::peer_state> remote;
  std::map<std::string, std::vector<double>> remote_ms;
  if (py) {
    config c{"family", w, fb};
    remote = py->prepare(c, t, a.warmup, peer_spec(a, score, dist, o.score.bandwidth));
  }
  for (auto& c : cs)
    for (int i = &c == &cs[0] ? attn_warm : 0; i < a.warmup; ++i) c.detail = c.call();
  for (int rep = 0; rep < a.reps; ++rep) {
    for (std::size_t j = 0; j < cs.size(); ++j) {
      // --ab: attn[B] before attn[A] every other round, so that neither always follows the other
      contender& c = cs[ab && rep % 2 && j < 2 ? 1 - j : j];
      const auto t0 = std::chrono::steady_clock::now();
      c.detail = c.call();
      c.ms.push_back(ms_since(t0));
    }
    if (py)
      for (const auto& [impl, ms] : py->rep()) remote_ms[impl].push_back(ms);
  }
  if (py) py->release();
  const std::string pair = score + " x " + dist;
  const double attn_ms = median(cs[0].ms);
  for (const auto& c : cs) {
    std::string detail = "path " + c.detail;
    if (c.impl == "attn_core") detail = "attn::attention, backend " + c.detail;
    print_row(pair, w, fb, t, c.impl, median(c.ms), *std::min_element(c.ms.begin(), c.ms.end()), attn_ms, detail);
  }
  if (ab)  // the paired B/A ratios of attn[A] (cs[0]) and attn[B] (cs[1])
    fmt::print("{}", ab_ratio_line(*ab, fmt::format("{} {} {}", pair, shape_label(w), fb ? "fwd+bwd" : "forward"), t,
                                   cs[0].ms, cs[1].ms));
  for (const auto& ps : remote) {
    const auto it = remote_ms.find(ps.impl);
    if (!ps.ready || it == remote_ms.end()) {
      fmt::print("{:<28} {:<22} {:<8} {:>3} {:<12} skipped: {}\n", pair, shape_label(w), fb ? "fwd+bwd" : "forward", t,
                 ps.impl, ps.ready ? "failed while timed" : ps.detail);
      continue;
    }
    print_row(pair, w, fb, t, ps.impl, median(it->second), *std::min_element(it->second.begin(), it->second.end()),
              attn_ms, ps.detail);
  }
  std::fflush(stdout);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> family_grid_pairs() {
  std::vector<std::pair<std::string, std::string>> p;
  for (const char* s : {"dot", "scaled_dot", "general", "biased_general", "activated_general", "additive", "cosine",
                        "location"})
    p.emplace_back(s, "softmax");
  for (const char* s : {"gaussian", "box", "triangle"}) p.emplace_back(s, "kernel");
  for (const char* d : {"sigmoid", "sparsemax", "entmax15", "hardmax", "topk", "identity"}) p.emplace_back("scaled_dot", d);
  return p;
}

int run_family_bench(const family_bench_args& a) {
  if (a.reps < 1) throw error(fmt::format("attn bench: --reps {} must be >= 1", a.reps));
  if (a.warmup < 0) throw error(fmt::format("attn bench: --warmup {} must be >= 0", a.warmup));
  if (a.A < 1) throw error(fmt::format("attn bench: --additive-hidden {} must be >= 1", a.A));
  if (a.bandwidth && !(*a.bandwidth > 0.0)) throw error(fmt::format("attn bench: --bandwidth {} must be > 0", *a.bandwidth));
  std::vector<std::pair<std::string, std::string>> pairs;
  std::vector<workload> shapes;
  if (a.grid) {
    if (!a.score.empty() || !a.distribution.empty())
      throw error("attn bench: --grid family runs every pair; --score/--distribution pick one pair without it");
    pairs = family_grid_pairs();
    for (auto [h, n, d] : {std::array<std::int64_t, 3>{8, 2048, 64}, {8, 4096, 128}})
      shapes.push_back({1, h, h, n, n, d, d, a.causal, a.type});
  } else {
    pairs.emplace_back(a.score.empty() ? "scaled_dot" : a.score, a.distribution.empty() ? "softmax" : a.distribution);
    workload w{a.B, a.Hq, a.Hkv, a.Nq, a.Nk, a.D, a.Dv, a.causal, a.type};
    for (auto [name, val] : {std::pair{"--batch", w.B}, {"--hq", w.Hq}, {"--hkv", w.Hkv}, {"--nq", w.Nq},
                             {"--nk", w.Nk}, {"--d", w.D}, {"--dv", w.Dv}})
      if (val < 1) throw error(fmt::format("attn bench: {} {} must be >= 1", name, val));
    if (w.Hq % w.Hkv) throw error(fmt::format("attn bench: --hq {} is not a multiple of --hkv {}", w.Hq, w.Hkv));
    shapes.push_back(w);
  }
  for (const auto& [s, d] : pairs) parse_score_kind(s), parse_distribution_kind(d);  // names first

  fmt::print("# attn bench, the attention family: {} {}; learned parameters uniform in [-1, 1), additive A = {}, "
             "topk k = {}, bandwidth {}\n",
             short_dtype(a.type), a.causal ? "causal (top-left)" : "no mask", a.A, a.topk,
             a.bandwidth ? fmt::format("{}", *a.bandwidth)
                         : std::string("1 (gaussian), sqrt(2D/3) (box, triangle: about half the keys inside)"));
  fmt::print("# cpu: {}\n", cpu_model_name());
  for (int t : a.threads) {  // what the machine can do, beside every time of this run
    const int n = resolve_threads(t);
    const probe_result f32 = probe_fma_peak(dtype::f32, n), b16 = probe_fma_peak(dtype::bf16, n);
    const std::string dram = a.probe_mib > 0
                                 ? fmt::format("{:.1f} GB/s", probe_dram_read(n, std::size_t(a.probe_mib) << 20).value)
                                 : std::string("not probed (--probe-mib 0)");
    fmt::print("# probes, {} thread{}: FMA peak f32 {:.0f} GFLOP/s ({}), bf16 {:.0f} GFLOP/s ({}); DRAM read {}\n", n,
               n == 1 ? "" : "s", f32.value, f32.isa, b16.value, b16.isa, dram);
  }
  std::unique_ptr<python_peers> py;
  if (a.torch) {
    const std::string python = find_python(a.python), script = find_peer_script(a.peer_script);
    if (python.empty() || script.empty())
      fmt::print("# torch_eager: not measured ({})\n",
                 python.empty() ? "no benchmark venv: run bench/setup_venv.sh or pass --python" : "bench/peers.py not found");
    else {
      py = std::make_unique<python_peers>(python, script, "torch_eager");
      if (!py->ok()) fmt::print("# torch_eager: not measured: {}\n", py->why()), py.reset();
      else
        for (const auto& [impl, v] : py->versions()) fmt::print("# {}: {}\n", impl, v);
    }
  }
  fmt::print("# {} alternating rounds after {} warm-up call(s) each; ms: median and minimum; 'x attn': this row's "
             "median / attn's (above 1: attn is faster)\n",
             a.reps, a.warmup);
  fmt::print("{:<28} {:<22} {:<8} {:>3} {:<12} {:>11} {:>11} {:>8} {}\n", "pair", "shape", "pass", "thr", "impl",
             "median ms", "min ms", "x attn", "detail");
  for (const workload& w : shapes)
    for (const auto& [s, d] : pairs)
      for (bool fb : a.passes)
        for (int t : a.threads) time_pair(a, py.get(), w, s, d, fb, resolve_threads(t));
  return 0;
}

}  // namespace attn::cli::bench

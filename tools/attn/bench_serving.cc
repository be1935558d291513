// tools/attn/bench_serving.cc — `attn bench --varlen` / `--paged` (bench_serving.h). Each
// contender gets --warmup untimed calls, then --reps rounds of one timed call each, contenders
// alternating within a round; medians of wall and of process CPU time are printed. The load
// average is printed with the results: on a shared machine it says how far the times can be
// trusted, and the CPU time (run with OMP_WAIT_POLICY=passive) is the steadier measure there.
#include "bench_serving.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <thread>

#include <time.h>

#include "attn/attn.h"
#include "bench_ab.h"
#include "bench_probe.h"

namespace attn::cli::bench {
namespace {

Tensor uniform(const Shape& s, dtype t, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  std::vector<double> v(std::size_t(TensorView(nullptr, t, s).numel()));
  for (double& x : v) x = u(rng);
  return Tensor::from_values(s, t, v);
}

Tensor int64s(Shape s, const std::vector<std::int64_t>& v) {
  return Tensor::from_values(std::move(s), dtype::i64, std::vector<double>(v.begin(), v.end()));
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return f ? fmt::format("{} {} {}", a, b, c) : std::string("unknown");
}

double cpu_ms() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

// Median wall and CPU (all threads of the process) milliseconds of one contender. Under load
// the CPU time is the steadier of the two (with OMP_WAIT_POLICY=passive: no spinning counted).
// With fastest, the fastest call of each instead: for a change to a compute-bound kernel on a
// shared host, whose neighbours slow some calls but never speed one up, the steadier statistic
// (one thread, an L2- or L3-resident cache: the fastest of 400 calls moves by under 1 % from run
// to run where the median moves by 5 %).
struct medians {
  double wall = 0, cpu = 0;
};

// Every timed call of each contender: wall and CPU milliseconds.
struct times {
  std::vector<std::vector<double>> wall, cpu;
};

// The contenders' calls, alternating within every round. With --ab the contenders come in
// pairs (the knob at A, then at B: 2i, 2i + 1) and every other round runs each pair B first.
times time_calls(const std::vector<std::function<void()>>& fs, int warmup, int reps, bool ab_pairs) {
  for (const auto& f : fs)
    for (int i = 0; i < warmup; ++i) f();
  times t{std::vector<std::vector<double>>(fs.size()), std::vector<std::vector<double>>(fs.size())};
  for (int r = 0; r < reps; ++r)
    for (std::size_t j = 0; j < fs.size(); ++j) {
      const std::size_t i = ab_pairs && r % 2 ? j ^ 1 : j;
      const double c0 = cpu_ms();
      const auto t0 = std::chrono::steady_clock::now();
      fs[i]();
      t.wall[i].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      t.cpu[i].push_back(cpu_ms() - c0);
    }
  return t;
}

// Medians (or the fastest) of contenders first, first + step, … of t.
std::vector<medians> summarise(const times& t, bool fastest, std::size_t first = 0, std::size_t step = 1) {
  auto pick = [&](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return fastest ? v.front() : v[v.size() / 2];
  };
  std::vector<medians> m;
  for (std::size_t i = first; i < t.wall.size(); i += step) m.push_back({pick(t.wall[i]), pick(t.cpu[i])});
  return m;
}

// --ab for the serving benches: each contender twice, the knob set to A before one's calls and
// to B before the other's; nothing without --ab.
struct serving_ab : ab_knob {
  using ab_knob::ab_knob;
  // fs as they are, or each as the pair (A, B).
  std::vector<std::function<void()>> contenders(const std::vector<std::function<void()>>& fs) const {
    if (!spec) return fs;
    std::vector<std::function<void()>> out;
    for (const auto& f : fs)
      for (const std::string* v : {&spec->a, &spec->b})
        out.push_back([this, f, v] { guard->set(*v), f(); });
    return out;
  }
  // Runs fs (as contenders()) and hands report() the medians of each value of the knob in turn
  // (headed by the value), then prints a ratio line per contender named in `names`.
  void run(const std::vector<std::function<void()>>& fs, const std::vector<std::string>& names, const std::string& what,
           int threads, int warmup, int reps, bool fastest, const std::function<void(const std::vector<medians>&)>& report) const {
    const times t = time_calls(contenders(fs), warmup, reps, spec.has_value());
    if (!spec) return report(summarise(t, fastest));
    for (std::size_t v = 0; v < 2; ++v) {
      fmt::print("  [{}={}]\n", spec->var, v == 0 ? spec->a : spec->b);
      report(summarise(t, fastest, v, 2));
    }
    for (std::size_t i = 0; i < fs.size() && i < names.size(); ++i)
      fmt::print("{}", ab_ratio_line(*spec, what + " " + names[i], threads, t.wall[2 * i], t.wall[2 * i + 1]));
  }
};

void check_common(const serving_args& a) {
  if (a.reps < 1) throw error(fmt::format("attn bench: --reps {} must be >= 1", a.reps));
  if (a.warmup < 0) throw error(fmt::format("attn bench: --warmup {} must be >= 0", a.warmup));
  if (a.batch < 1 || a.hq < 1 || a.hkv < 1 || a.d < 1)
    throw error(fmt::format("attn bench: --batch {}, --hq {}, --hkv {}, --d {} must be positive", a.batch, a.hq, a.hkv, a.d));
  if (a.hq % a.hkv) throw error(fmt::format("attn bench: --hq {} is not a multiple of --hkv {}", a.hq, a.hkv));
}

}  // namespace

int run_varlen(const serving_args& a) {
  check_common(a);
  if (a.len_min < 1 || a.len_max < a.len_min)
    throw error(fmt::format("attn bench: --varlen {}:{} needs 1 <= MIN <= MAX", a.len_min, a.len_max));
  std::mt19937 rng(1);
  std::uniform_int_distribution<std::int64_t> pick(a.len_min, a.len_max);
  std::vector<std::int64_t> lens(std::size_t(a.batch)), cu{0};
  for (std::int64_t& n : lens) n = pick(rng), cu.push_back(cu.back() + n);
  const std::int64_t T = cu.back(), M = *std::max_element(lens.begin(), lens.end());
  const std::int64_t mean = T / a.batch;
  // Useful work: 2·Hq·Nq·Nk·2D per sequence, halved (about) for causal.
  auto work = [&](std::int64_t n) { return 4.0 * double(a.hq) * double(a.d) * double(n) * double(n) / (a.causal ? 2 : 1); };
  double flops = 0;
  for (std::int64_t n : lens) flops += work(n);

  const Tensor q = uniform({T, a.hq, a.d}, a.type, rng), k = uniform({T, a.hkv, a.d}, a.type, rng);
  const Tensor v = uniform({T, a.hkv, a.d}, a.type, rng), cut = int64s({a.batch + 1}, cu);
  const Tensor qp = uniform({a.batch, a.hq, M, a.d}, a.type, rng), kp = uniform({a.batch, a.hkv, M, a.d}, a.type, rng);
  const Tensor vp = uniform({a.batch, a.hkv, M, a.d}, a.type, rng);
  const Tensor q1 = uniform({1, a.hq, mean, a.d}, a.type, rng), k1 = uniform({1, a.hkv, mean, a.d}, a.type, rng);
  const Tensor v1 = uniform({1, a.hkv, mean, a.d}, a.type, rng);
  attention_options o;
  o.is_causal = a.causal, o.alignment = causal_alignment::bottom_right;
  attention_options padded = o;
  padded.alignment = causal_alignment::top_left;  // Nq = Nk per sequence: the same frontier
  padded.nonpad_kv_seqlen = int64s({a.batch}, lens);

  fmt::print("attn bench --varlen: B {} lengths {}..{} (total {}, longest {}), Hq {} Hkv {} D {} {}{}; load average {}{}\n",
             a.batch, a.len_min, a.len_max, T, M, a.hq, a.hkv, a.d, dtype_name(a.type), a.causal ? " causal" : "",
             load_average(), a.fastest ? "; fastest of --reps calls" : "");
  const serving_ab ab(a.ab);
  for (int t : a.threads) {
    const execution ex{.num_threads = t};
    const auto report = [&](const std::vector<medians>& ms) {
      const double single = work(mean) / ms[2].wall / 1e6;
      fmt::print("  threads {}: varlen {:.2f} ms {:.1f} GFLOP/s | padded {:.2f} ms (varlen {:.2f}x faster) | one sequence "
                 "of {} {:.1f} GFLOP/s (varlen at {:.0f}%)\n",
                 resolve_threads(t), ms[0].wall, flops / ms[0].wall / 1e6, ms[1].wall, ms[1].wall / ms[0].wall, mean,
                 single, 100.0 * flops / ms[0].wall / 1e6 / single);
      fmt::print("    cpu time: varlen {:.2f} ms | padded {:.2f} ms ({:.2f}x) | one sequence {:.1f} GFLOP/cpu-s (varlen at "
                 "{:.0f}%)\n",
                 ms[0].cpu, ms[1].cpu, ms[1].cpu / ms[0].cpu, work(mean) / ms[2].cpu / 1e6,
                 100.0 * (flops / ms[0].cpu) / (work(mean) / ms[2].cpu));
    };
    ab.run({[&] { attention_varlen(q, k, v, cut, cut, M, M, o, ex); }, [&] { attention(qp, kp, vp, padded, ex); },
            [&] { attention(q1, k1, v1, o, ex); }},
           {"varlen", "padded", "one sequence"}, fmt::format("varlen B{} {}", a.batch, dtype_name(a.type)),
           resolve_threads(t), a.warmup, a.reps, a.fastest, report);
  }
  return 0;
}

// Fills a tensor with values in [-1, 1) (int8: [-127, 127], the scales of such rows: 1/127)
// from a cheap generator: the decode caches hold up to a GiB.
void fill(Tensor& t, std::uint64_t seed) {
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  const auto next = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return float(std::int64_t(x >> 40) - (std::int64_t(1) << 23)) / float(1 << 23);
  };
  const std::int64_t n = t.numel();
  switch (t.type()) {
    case dtype::f32: for (std::int64_t i = 0; i < n; ++i) t.data_as<float>()[i] = next(); break;
    case dtype::bf16: for (std::int64_t i = 0; i < n; ++i) t.data_as<std::uint16_t>()[i] = f32_to_bf16(next()); break;
    case dtype::i8: for (std::int64_t i = 0; i < n; ++i) t.data_as<std::int8_t>()[i] = std::int8_t(next() * 127.0f); break;
    default: throw error(fmt::format("attn bench: no filler for {}", dtype_name(t.type())));
  }
}

// A cache of `pages` pages of `ps` tokens in one of two layouts, as the [pages, ps, Hkv, D] view
// attention_paged takes: head-major storage [pages, Hkv, ps, D] (each head's page rows
// contiguous, vLLM's order) or token-major storage [pages, ps, Hkv, D].
struct page_cache {
  Tensor k, v, ks, vs;  // storage; scales [pages, ps, Hkv] for int8 (1/127)
  TensorView kview, vview;
  // blocked: int8 keys blocked (include/attn/serving.h), [pages, (hkv,) ps / 16, (hkv,) d / 4, 16, 4]
  page_cache(std::int64_t pages, std::int64_t ps, std::int64_t hkv, std::int64_t d, dtype t, bool head_major, std::uint64_t seed,
             bool blocked = false) {
    const Shape s = head_major ? Shape{pages, hkv, ps, d} : Shape{pages, ps, hkv, d};
    const Shape sb = head_major ? Shape{pages, hkv, ps / 16, d / 4, 16, 4} : Shape{pages, ps / 16, hkv, d / 4, 16, 4};
    k = Tensor::empty(blocked ? sb : s, t), v = Tensor::empty(s, t);
    fill(k, seed), fill(v, seed + 1);
    kview = !head_major ? k.view() : blocked ? k.view().permute({0, 2, 1, 3, 4, 5}) : k.view().permute({0, 2, 1, 3});
    vview = head_major ? v.view().permute({0, 2, 1, 3}) : v.view();
    // int8 scales in the pages' order: head-major [pages, Hkv, ps] (a head's scales contiguous,
    // read as one stream beside its rows) or token-major [pages, ps, Hkv]
    if (t == dtype::i8) ks = Tensor::full(head_major ? Shape{pages, hkv, ps} : Shape{pages, ps, hkv}, dtype::f32, 1.0 / 127), vs = ks;
    if (t == dtype::i8) ksview = head_major ? ks.view().permute({0, 2, 1}) : ks.view(), vsview = ksview;
  }
  TensorView ksview, vsview;
  paged_kv_view view(const Tensor& table, const Tensor& lens) const { return {kview, vview, table, lens, ksview, vsview}; }
};

int run_paged(const serving_args& a) {
  check_common(a);
  const std::int64_t ps = a.page_size;
  if (ps < 1 || a.nk < 1 || a.nk % ps)
    throw error(fmt::format("attn bench: --paged {} needs a positive page size that divides --nk {}", ps, a.nk));
  if (a.nq < 1 || a.nq > a.nk) throw error(fmt::format("attn bench: --nq {} must be in [1, --nk {}]", a.nq, a.nk));
  const dtype kvt = a.kv_type;
  const bool int8 = kvt == dtype::i8;
  if (int8 && a.backward) throw error("attn bench: --paged with --kv-dtype int8 has no backward (a quantised cache has no gradient)");
  std::mt19937 rng(1);
  const std::int64_t per = a.nk / ps, pages = a.batch * per;
  // q has the dtype of a float cache (the core op takes one dtype); an int8 cache takes --dtype.
  const Tensor q = uniform({a.batch, a.hq, a.nq, a.d}, int8 ? a.type : kvt, rng);
  std::vector<std::int64_t> order(static_cast<std::size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  const Tensor shuffled = int64s({a.batch, per}, order);
  std::vector<std::int64_t> own(static_cast<std::size_t>(a.batch));
  std::iota(own.begin(), own.end(), 0);
  const Tensor one_page = int64s({a.batch, 1}, own);
  const Tensor lens = int64s({a.batch}, std::vector<std::int64_t>(std::size_t(a.batch), a.nk));
  attention_options o;
  o.is_causal = a.causal, o.alignment = causal_alignment::bottom_right;
  // Dense: [B, Hkv, Nk, D] (for int8: the same buffer as one head-major page per sequence).
  const page_cache dense(a.batch, a.nk, a.hkv, a.d, kvt, true, 11);
  const page_cache head_major(pages, ps, a.hkv, a.d, kvt, true, 13), token_major(pages, ps, a.hkv, a.d, kvt, false, 15);
  // int8 runs also time a bf16 dense cache: int8 vs bf16 tokens/s in one run.
  const page_cache dense16 = int8 ? page_cache(a.batch, a.nk, a.hkv, a.d, dtype::bf16, true, 17) : page_cache(0, 1, 1, 1, dtype::f32, true, 0);
  const Tensor q16 = int8 ? Tensor::copy_of(q, dtype::bf16) : Tensor();
  // int8 with pages of whole blocks of 16 and head sizes of whole quads: blocked keys too (dense, paged head-major).
  const bool blocked = int8 && ps % 16 == 0 && a.d % 4 == 0;
  const page_cache dense_b = blocked ? page_cache(a.batch, a.nk, a.hkv, a.d, kvt, true, 11, true) : page_cache(0, 1, 1, 1, dtype::f32, true, 0);
  const page_cache head_b = blocked ? page_cache(pages, ps, a.hkv, a.d, kvt, true, 13, true) : page_cache(0, 1, 1, 1, dtype::f32, true, 0);
  const auto kv_bytes = [&](dtype t) {
    return 2.0 * double(a.batch * a.hkv * a.nk) * (double(a.d * std::int64_t(dtype_size(t))) + (t == dtype::i8 ? 4.0 : 0.0));
  };
  const paged_kv_view cd = dense.view(one_page, lens), ch = head_major.view(shuffled, lens), ct = token_major.view(shuffled, lens);
  paged_kv_view cd_exact = cd;  // int8: the dense cache with every product in float32 (paged_kv_view::query)
  cd_exact.query = int8_query::float32;

  const serving_ab ab(a.ab);
  fmt::print("attn bench --paged {}: B {} Nq {} Nk {} Hq {} Hkv {} D {}, q {}, K/V {} (shuffled pages); load average {}{}\n", ps,
             a.batch, a.nq, a.nk, a.hq, a.hkv, a.d, dtype_name(q.type()), dtype_name(kvt), load_average(), a.fastest ? "; fastest of --reps calls" : "");
  for (int t : a.threads) {
    const execution ex{.num_threads = t};
    std::vector<std::function<void()>> fs{
        [&] {
          if (int8) attention_paged(q, cd, o, ex);
          else attention(q, TensorView(dense.k.view()), TensorView(dense.v.view()), o, ex);
        },
        [&] { attention_paged(q, ch, o, ex); }, [&] { attention_paged(q, ct, o, ex); }};
    const std::size_t bf16_at = fs.size();  // (int8) the bf16 dense cache, the tokens/s the goals compare with
    if (int8) fs.push_back([&] { attention(q16, TensorView(dense16.k.view()), TensorView(dense16.v.view()), o, ex); });
    const std::size_t blocked_at = fs.size();  // blocked keys: dense, paged head-major
    if (blocked) {
      fs.push_back([&] { attention_paged(q, dense_b.view(one_page, lens), o, ex); });
      fs.push_back([&] { attention_paged(q, head_b.view(shuffled, lens), o, ex); });
    }
    std::vector<std::string> names{"dense", "paged head-major", "paged token-major"};
    if (int8) names.push_back("bf16 dense");
    if (blocked) names.push_back("int8 blocked keys dense"), names.push_back("int8 blocked keys paged head-major");
    // blocked keys with q and the weights in 8 bits (int8_query::int8)
    paged_kv_view cb8, hb8;
    const std::size_t bytes_at = fs.size();
    if (blocked) {
      cb8 = dense_b.view(one_page, lens), hb8 = head_b.view(shuffled, lens);
      cb8.query = hb8.query = int8_query::int8;
      fs.push_back([&] { attention_paged(q, cb8, o, ex); });
      fs.push_back([&] { attention_paged(q, hb8, o, ex); });
      names.push_back("int8 blocked keys dense, int8 query"), names.push_back("int8 blocked keys paged head-major, int8 query");
    }
    const std::size_t exact_at = fs.size();
    if (int8) fs.push_back([&] { attention_paged(q, cd_exact, o, ex); }), names.push_back("int8 dense query float32");
    paged_kv_view cd8 = cd;  // int8 rows with 8-bit weights (int8_query::int8)
    cd8.query = int8_query::int8;
    const std::size_t rows8_at = fs.size();
    if (int8) fs.push_back([&] { attention_paged(q, cd8, o, ex); }), names.push_back("int8 dense, int8 query");
    // (the probe once, after the timed calls)
    double probe = -1;
    const auto report = [&](const std::vector<medians>& ms) {
      if (probe < 0) probe = a.probe_mib > 0 ? probe_dram_read(resolve_threads(t), std::size_t(a.probe_mib) << 20).value : 0.0;
      const std::string dram = a.probe_mib > 0 ? fmt::format("{:.1f} GB/s", probe) : std::string("not probed");
      const double bytes = kv_bytes(kvt), tok = double(a.batch * a.nq);
      const auto gbs = [&](double b, double msv) { return b / msv / 1e6; };
      fmt::print("  threads {}: DRAM read {} | dense {} {:.3f} ms {:.1f} GB/s{} {:.0f} tok/s | paged head-major {:.3f} ms ({:.0f}% of dense) | "
                 "paged token-major {:.3f} ms ({:.0f}% of dense)\n",
                 resolve_threads(t), dram, dtype_name(kvt), ms[0].wall, gbs(bytes, ms[0].wall),
                 probe > 0 ? fmt::format(" ({:.0f}% of the probe)", 100 * gbs(bytes, ms[0].wall) / probe) : std::string(),
                 tok / ms[0].wall * 1e3, ms[1].wall, 100 * ms[0].wall / ms[1].wall, ms[2].wall, 100 * ms[0].wall / ms[2].wall);
      fmt::print("    cpu time: dense {:.3f} ms | paged head-major {:.3f} ms ({:.0f}%) | paged token-major {:.3f} ms ({:.0f}%)\n",
                 ms[0].cpu, ms[1].cpu, 100 * ms[0].cpu / ms[1].cpu, ms[2].cpu, 100 * ms[0].cpu / ms[2].cpu);
      if (int8)
        fmt::print("    bf16 dense {:.3f} ms {:.1f} GB/s {:.0f} tok/s: int8 dense {:.2f}x the bf16 tokens/s (cpu time {:.3f} vs {:.3f} ms: {:.2f}x)\n",
                   ms[bf16_at].wall, gbs(kv_bytes(dtype::bf16), ms[bf16_at].wall), tok / ms[bf16_at].wall * 1e3, ms[bf16_at].wall / ms[0].wall,
                   ms[0].cpu, ms[bf16_at].cpu, ms[bf16_at].cpu / ms[0].cpu);
      if (blocked)
        fmt::print("    int8 blocked keys: dense {:.3f} ms {:.1f} GB/s {:.0f} tok/s ({:.2f}x the rows, {:.2f}x the bf16 tokens/s; cpu time {:.3f} ms) | "
                   "paged head-major {:.3f} ms ({:.0f}% of dense)\n",
                   ms[blocked_at].wall, gbs(bytes, ms[blocked_at].wall), tok / ms[blocked_at].wall * 1e3, ms[0].wall / ms[blocked_at].wall, ms[bf16_at].wall / ms[blocked_at].wall,
                   ms[blocked_at].cpu, ms[blocked_at + 1].wall, 100 * ms[blocked_at].wall / ms[blocked_at + 1].wall);
      if (blocked) {
        const auto &m8 = ms[bytes_at], &h8 = ms[bytes_at + 1];
        fmt::print("    int8 blocked keys, q and weights in 8 bits (int8_query::int8): dense {:.3f} ms {:.1f} GB/s{} {:.0f} tok/s "
                   "({:.2f}x automatic, {:.2f}x the bf16 tokens/s; cpu time {:.3f} ms) | paged head-major {:.3f} ms ({:.0f}% of dense)\n",
                   m8.wall, gbs(bytes, m8.wall),
                   probe > 0 ? fmt::format(" ({:.0f}% of the probe)", 100 * gbs(bytes, m8.wall) / probe) : std::string(), tok / m8.wall * 1e3,
                   ms[blocked_at].wall / m8.wall, ms[bf16_at].wall / m8.wall, m8.cpu, h8.wall, 100 * m8.wall / h8.wall);
      }
      if (int8) {
        const auto& me = ms[exact_at];
        fmt::print("    int8 dense, query float32 (every product in f32): {:.3f} ms {:.1f} GB/s {:.0f} tok/s (automatic {:.2f}x its tokens/s; "
                   "cpu time {:.3f} ms)\n",
                   me.wall, gbs(bytes, me.wall), tok / me.wall * 1e3, me.wall / ms[0].wall, me.cpu);
        const auto& m8 = ms[rows8_at];
        fmt::print("    int8 dense rows, weights in 8 bits (int8_query::int8): {:.3f} ms {:.1f} GB/s {:.0f} tok/s ({:.2f}x automatic, "
                   "{:.2f}x the bf16 tokens/s; cpu time {:.3f} ms)\n",
                   m8.wall, gbs(bytes, m8.wall), tok / m8.wall * 1e3, ms[0].wall / m8.wall, ms[bf16_at].wall / m8.wall, m8.cpu);
      }
    };
    ab.run(fs, names, fmt::format("paged {} B{} Nq{} Nk{} K/V {}", ps, a.batch, a.nq, a.nk, dtype_name(kvt)), resolve_threads(t),
           a.warmup, a.reps, a.fastest, report);
    if (!a.backward) continue;
    // The backward of each from its own forward: dense attention_backward against the paged one
    // on shuffled pages of both layouts (which copies each sequence's keys dense and scatters the
    // key gradients back through the table).
    const Tensor dout = uniform({a.batch, a.hq, a.nq, a.d}, q.type(), rng);
    const TensorView dk(dense.k.view()), dv(dense.v.view());
    const attention_result fd = attention(q, dk, dv, o, ex), fh = attention_paged(q, ch, o, ex), ft = attention_paged(q, ct, o, ex);
    const auto report_bwd = [&](const std::vector<medians>& mb) {
      fmt::print("    backward: dense {:.3f} ms | paged head-major {:.3f} ms ({:.0f}% of dense) | paged token-major {:.3f} ms "
                 "({:.0f}% of dense); cpu time {:.3f} | {:.3f} | {:.3f} ms\n",
                 mb[0].wall, mb[1].wall, 100 * mb[0].wall / mb[1].wall, mb[2].wall, 100 * mb[0].wall / mb[2].wall, mb[0].cpu,
                 mb[1].cpu, mb[2].cpu);
    };
    ab.run({[&] { attention_backward(q, dk, dv, fd.out, dout, fd.lse, o, ex); },
            [&] { attention_paged_backward(q, ch, fh.out, dout, fh.lse, o, ex); },
            [&] { attention_paged_backward(q, ct, ft.out, dout, ft.lse, o, ex); }},
           {"backward dense", "backward paged head-major", "backward paged token-major"},
           fmt::format("paged {} B{} Nq{} Nk{} K/V {}", ps, a.batch, a.nq, a.nk, dtype_name(kvt)), resolve_threads(t),
           a.warmup, a.reps, a.fastest, report_bwd);
  }
  return 0;
}

}  // namespace attn::cli::bench

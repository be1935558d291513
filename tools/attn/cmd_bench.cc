// tools/attn/cmd_bench.cc — `attn bench`: time attention forward/backward and its peers in one
// run, and print each result next to what the machine can do (probed in the same run).
//
//   attn bench --hq 16 --nq 2048 --d 64 --causal            one shape, forward
//   attn bench --grid standard --threads 1,2 --csv out.csv    the grid, two thread counts
//   attn bench --nq 16 --nk 16 --d 8 --reps 1 --json          CI smoke test
//
// Every configuration is timed as: --warmup untimed calls of each contender, then --reps rounds
// of one timed call each (attn, then every peer), the medians reported.
// FLOPs: forward 4·B·Hq·Nq·Nk·D (2·B·Hq·Nq·Nk·(D + Dv) in general), halved for causal;
// backward 2.5× the forward. GB/s: bytes of K and V (read once per call at least) per second.
// Peers, alternating with attn on the same inputs and threads (docs/PERFORMANCE.md):
//   blas      attention as OpenBLAS GEMM + softmax + GEMM (bench_blas.h), in this process
//   torch     torch.nn.functional.scaled_dot_product_attention   } bench/peers.py, run by the
//   ggml      ggml_flash_attn_ext (forward only)                 } benchmark venv's python
#include <fmt/format.h>
#include <malloc.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "attn/attn.h"
#include "bench_blas.h"
#include "bench_probe.h"
#include "cli.h"

extern char** environ;

namespace attn::cli {
namespace {

using bench::problem;

struct bench_args {
  std::int64_t batch = 1, hq = 8, hkv = 0, nq = 1024, nk = 0, d = 64, dv = 0;
  std::string dtype_name = "f32", pass = "forward", backend_name = "automatic", grid = "none", csv, peers = "blas,torch,ggml";
  std::string python, peer_script, openblas_coretype = "auto";
  bool causal = false, backward = false, json = false, check = false;
  std::vector<int> threads{0};
  int reps = 5, warmup = 1;
  std::int64_t probe_mib = 512;
};

struct config {
  std::string name;  // "prefill", "gqa-prefill", "decode", "custom"
  problem p;
  bool backward = false;
};

// One measured row: attn or a peer on one configuration and thread count.
struct row {
  config c;
  int threads = 1;
  std::string impl, detail;  // impl: attn | blas_unfused | torch_sdpa | ggml_flash_attn_ext
  bool peer = false;
  double median_ms = 0, min_ms = 0;
  double attn_ms = 0;  // attn's median on the same configuration (for the speed-up column)
  double work_mib = NAN;  // attn only: memory the call used beyond its inputs and results
  double max_abs_diff = NAN;  // blas_unfused with --check: largest |baseline − attn| of the results
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

double flops(const config& c) {
  const problem& p = c.p;
  double f = 2.0 * double(p.B * p.Hq) * double(p.Nq) * double(p.Nk) * double(p.D + p.Dv);
  if (p.causal) f /= 2;
  return c.backward ? 2.5 * f : f;
}

double kv_bytes(const problem& p) { return double(p.B * p.Hkv) * double(p.Nk) * double(p.D + p.Dv) * elem_bytes(p.type); }

std::string short_dtype(dtype t) {
  switch (t) {
    case dtype::f32: return "f32";
    case dtype::bf16: return "bf16";
    case dtype::f16: return "f16";
    default: return std::string(dtype_name(t));
  }
}

dtype parse_bench_dtype(const std::string& s) {
  if (s == "f32" || s == "float32") return dtype::f32;
  if (s == "bf16" || s == "bfloat16") return dtype::bf16;
  if (s == "f16" || s == "float16") return dtype::f16;
  throw error(fmt::format("attn bench: --dtype {} is not one of f32, bf16, f16", s));
}

std::string shape_label(const problem& p) {
  std::string s = fmt::format("B{} Hq{}", p.B, p.Hq);
  if (p.Hkv != p.Hq) s += fmt::format("/{}", p.Hkv);
  s += fmt::format(" Nq{} Nk{} D{}", p.Nq, p.Nk, p.D);
  if (p.Dv != p.D) s += fmt::format("/{}", p.Dv);
  if (p.causal) s += " causal";
  return s;
}

// The standard grid: prefill B=1 (H, N, D) in {(16,512,64), (16,2048,64), (8,2048,128),
// (8,4096,128)} causal and not; GQA prefill Hq=32 Hkv=8 N=1024 D=128 causal and not; decode
// Nq=1 Hq=32 Hkv=8 D=128 Nk in {4096, 16384, 131072} (forward only: decode is inference).
std::vector<config> standard_grid(const std::vector<dtype>& dtypes, const std::vector<bool>& passes) {
  struct shape {
    const char* name;
    std::int64_t hq, hkv, nq, nk, d;
    bool causal;
  };
  std::vector<shape> shapes;
  for (auto [h, n, d] : {std::array<std::int64_t, 3>{16, 512, 64}, {16, 2048, 64}, {8, 2048, 128}, {8, 4096, 128}})
    for (bool causal : {false, true}) shapes.push_back({"prefill", h, h, n, n, d, causal});
  for (bool causal : {false, true}) shapes.push_back({"gqa-prefill", 32, 8, 1024, 1024, 128, causal});
  for (std::int64_t nk : {4096, 16384, 131072}) shapes.push_back({"decode", 32, 8, 1, nk, 128, false});
  std::vector<config> out;
  for (bool bwd : passes)
    for (dtype t : dtypes)
      for (const shape& s : shapes) {
        if (bwd && s.nq == 1) continue;
        out.push_back({s.name, problem{1, s.hq, s.hkv, s.nq, s.nk, s.d, s.d, s.causal, t}, bwd});
      }
  return out;
}

// Uniform values in [-1, 1) from a fixed seed (the values do not matter for timing, but NaN-free
// and not all equal so that no shortcut is taken).
Tensor random_tensor(Shape shape, dtype t, std::uint64_t seed) {
  Tensor f = Tensor::empty(std::move(shape), dtype::f32);
  float* p = f.data_as<float>();
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::int64_t i = 0; i < f.numel(); ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    p[i] = float(double(x >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
  return t == dtype::f32 ? f : f.to(t);
}

struct timing {
  double median_ms, min_ms;
};

// kB of a "Vm..." line of /proc/self/status, or -1.
double proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  const std::string k = std::string(key) + ":";
  for (std::string line; std::getline(f, line);)
    if (line.rfind(k, 0) == 0) return std::stod(line.substr(k.size()));
  return -1;
}

// Peak resident memory added by one call: free heap pages are returned first (malloc_trim) and
// the kernel's high-water mark reset (clear_refs 5), so HWM − RSS before is what the call
// touched. Linux only; NAN elsewhere.
struct memory_probe {
  double base_kb = -1;
  void begin() {
    malloc_trim(0);
    std::ofstream("/proc/self/clear_refs") << "5";
    base_kb = proc_status_kb("VmRSS");
  }
  double end_mib() const {
    const double hwm = proc_status_kb("VmHWM");
    return base_kb < 0 || hwm < 0 ? NAN : (hwm - base_kb) / 1024.0;
  }
};

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  if (n == 0) return {NAN, NAN};
  return {n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]), ms.front()};
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

std::string exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string(".") : p.parent_path().string();
}

// ---- the Python peers (bench/peers.py), one process for the whole run ----
//
// Protocol (bench/peers.py has the other end): commands one line each, replies tab-separated
// lines closed by "done". At start the peers send "peer\t<impl>\t<version>" (or "skip") lines,
// then "ready".
//   prepare B Hq Hkv Nq Nk D Dv causal dtype pass threads warmup
//                 -> "ready\t<impl>\t<detail>" or "skip\t<impl>\t<why>" per peer
//   rep           -> "time\t<impl>\t<ms>" per ready peer (one timed call each)
//   release       -> (frees the configuration's tensors)
// attn bench alternates single calls — attn, the OpenBLAS baseline, then one `rep` of the
// Python peers — so that a change of load on a shared machine falls on all of them alike.
class python_peers {
 public:
  python_peers(const std::string& python, const std::string& script, const std::string& which) {
    std::signal(SIGPIPE, SIG_IGN);  // a peer process that dies must not take attn bench with it
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) {
      why_ = "pipe() failed";
      return;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
    posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
    for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) posix_spawn_file_actions_addclose(&fa, fd);
    std::vector<std::string> args = {python, "-u", script, "--peers", which};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, python.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(to_child[0]);
    close(from_child[1]);
    if (rc != 0) {
      close(to_child[1]);
      close(from_child[0]);
      pid_ = -1;
      why_ = fmt::format("cannot start {}", python);
      return;
    }
    in_ = fdopen(to_child[1], "w");
    out_ = fdopen(from_child[0], "r");
    for (std::string line; read_line(line);) {
      if (line == "ready") {
        ok_ = true;
        break;
      }
      auto f = split(line);
      if (f.size() >= 3 && f[0] == "peer") versions_[f[1]] = f[2];
      if (f.size() >= 3 && f[0] == "skip") versions_[f[1]] = "absent: " + f[2];
    }
    if (!ok_) why_ = fmt::format("{} {} did not start (see its messages above)", python, script);
  }
  ~python_peers() {
    if (in_) fclose(in_);
    if (out_) fclose(out_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }
  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const std::map<std::string, std::string>& versions() const { return versions_; }

  struct peer_state {
    std::string impl;
    bool ready = false;
    std::string detail;  // version and kernel used, or why it is skipped
  };
  // Builds the inputs of every peer for one configuration and runs its warm-up calls.
  std::vector<peer_state> prepare(const config& c, int threads, int warmup) {
    const problem& p = c.p;
    std::vector<peer_state> out;
    for (const auto& f : transact(fmt::format("prepare {} {} {} {} {} {} {} {} {} {} {} {}", p.B, p.Hq, p.Hkv, p.Nq,
                                              p.Nk, p.D, p.Dv, int(p.causal), short_dtype(p.type),
                                              c.backward ? "backward" : "forward", threads, warmup)))
      if (f.size() >= 3 && (f[0] == "ready" || f[0] == "skip")) out.push_back({f[1], f[0] == "ready", f[2]});
    return out;
  }
  // One timed call of every prepared peer: (impl, milliseconds); a peer that failed is absent.
  std::vector<std::pair<std::string, double>> rep() {
    std::vector<std::pair<std::string, double>> out;
    for (const auto& f : transact("rep"))
      if (f.size() >= 3 && f[0] == "time") out.emplace_back(f[1], std::stod(f[2]));
    return out;
  }
  // Frees the inputs of the configuration.
  void release() { transact("release"); }

 private:
  // Sends one command line; returns the reply lines up to "done", split at tabs.
  std::vector<std::vector<std::string>> transact(const std::string& command) {
    std::vector<std::vector<std::string>> lines;
    if (!ok_) return lines;
    fmt::print(in_, "{}\n", command);
    fflush(in_);
    for (std::string line; read_line(line);) {
      if (line == "done") return lines;
      lines.push_back(split(line));
    }
    ok_ = false;
    why_ = "the peer process ended early";
    return lines;
  }

  bool read_line(std::string& line) {
    line.clear();
    for (int ch; (ch = fgetc(out_)) != EOF;) {
      if (ch == '\n') return true;
      line.push_back(char(ch));
    }
    return !line.empty();
  }
  static std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> f;
    std::stringstream ss(s);
    for (std::string x; std::getline(ss, x, '\t');) f.push_back(x);
    return f;
  }
  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  bool ok_ = false;
  std::string why_;
  std::map<std::string, std::string> versions_;
};

std::string find_python(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* e = std::getenv("ATTN_BENCH_PYTHON"); e && *e) return e;
  std::string venv;
  if (const char* e = std::getenv("ATTN_BENCH_VENV"); e && *e)
    venv = e;
  else if (const char* h = std::getenv("HOME"))
    venv = std::string(h) + "/.cache/attn-bench-venv";
  const std::string py = venv + "/bin/python";
  return std::filesystem::exists(py) ? py : std::string();
}

std::string find_peer_script(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* e = std::getenv("ATTN_BENCH_PEERS"); e && *e) return e;
  const std::string dir = exe_dir();
  // build/<preset>/tools/attn/attn -> <source>/bench/peers.py; installed: <prefix>/share/attn/bench
  for (const std::string& c : {dir + "/../../../bench/peers.py", dir + "/../share/attn/bench/peers.py",
                               std::string("bench/peers.py")})
    if (std::filesystem::exists(c)) return std::filesystem::weakly_canonical(c).string();
  return {};
}

// ---- output ----

struct machine {
  std::string cpu;
  std::map<int, bench::probe_result> f32_peak, bf16_peak, dram;
  std::string blas, python;
  std::map<std::string, std::string> peer_versions;

  double peak(dtype t, int threads) const {
    const auto& m = t == dtype::bf16 ? bf16_peak : f32_peak;
    const auto it = m.find(threads);
    return it == m.end() ? NAN : it->second.value;
  }
};

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\')
      o += '\\', o += ch;
    else if (static_cast<unsigned char>(ch) < 0x20)
      o += fmt::format("\\u{:04x}", int(static_cast<unsigned char>(ch)));
    else
      o += ch;
  }
  return o + "\"";
}

std::string json_num(double x) { return std::isfinite(x) ? fmt::format("{:.6g}", x) : "null"; }

// The fields of one row, in order, as (name, JSON value); CSV uses the same names.
std::vector<std::pair<std::string, std::string>> fields(const row& r, const machine& m) {
  const problem& p = r.c.p;
  const double gflops = flops(r.c) / (r.median_ms * 1e-3) / 1e9;
  const double peak = m.peak(p.type, r.threads);
  const double gbps = kv_bytes(p) / (r.median_ms * 1e-3) / 1e9;
  const double dram = m.dram.count(r.threads) ? m.dram.at(r.threads).value : 0.0;
  return {
      {"config", json_str(r.c.name)},
      {"impl", json_str(r.impl)},
      {"peer", r.peer ? "true" : "false"},
      {"backend", json_str(r.detail)},
      {"pass", json_str(r.c.backward ? "backward" : "forward")},
      {"dtype", json_str(short_dtype(p.type))},
      {"B", fmt::format("{}", p.B)},
      {"Hq", fmt::format("{}", p.Hq)},
      {"Hkv", fmt::format("{}", p.Hkv)},
      {"Nq", fmt::format("{}", p.Nq)},
      {"Nk", fmt::format("{}", p.Nk)},
      {"D", fmt::format("{}", p.D)},
      {"Dv", fmt::format("{}", p.Dv)},
      {"causal", p.causal ? "true" : "false"},
      {"threads", fmt::format("{}", r.threads)},
      {"median_ms", json_num(r.median_ms)},
      {"min_ms", json_num(r.min_ms)},
      {"gflops", json_num(gflops)},
      {"peak_gflops", json_num(peak)},
      {"pct_peak", json_num(100.0 * gflops / peak)},
      {"gbps", json_num(gbps)},
      {"dram_gbps", json_num(dram)},
      {"pct_dram", json_num(dram > 0 ? 100.0 * gbps / dram : NAN)},
      {"attn_speedup", json_num(r.peer && r.attn_ms > 0 ? r.median_ms / r.attn_ms : NAN)},
      {"work_mib", json_num(r.work_mib)},
      {"max_abs_diff", json_num(r.max_abs_diff)},
      {"peak_rss_mib", json_num(peak_rss_mib())},
      {"cpu", json_str(m.cpu)},
  };
}

void print_json(const row& r, const machine& m) {
  std::string s = "{";
  for (const auto& [k, v] : fields(r, m)) s += fmt::format("{}\"{}\": {}", s.size() > 1 ? ", " : "", k, v);
  fmt::print("{}}}\n", s);
  std::fflush(stdout);
}

void print_header_text(std::FILE* f, const machine& m) {
  fmt::print(f, "attn bench — {}\n", m.cpu);
  for (const auto& [t, pk] : m.f32_peak)
    fmt::print(f, "  {} thread{}: FMA peak f32 {:.0f} GFLOP/s ({}), bf16 {:.0f} GFLOP/s ({}); DRAM read {}\n", t,
               t == 1 ? "" : "s", pk.value, pk.isa, m.bf16_peak.at(t).value, m.bf16_peak.at(t).isa,
               m.dram.count(t) ? fmt::format("{:.1f} GB/s", m.dram.at(t).value) : std::string("not probed"));
  fmt::print(f, "  blas:  {}\n", m.blas);
  if (!m.python.empty()) fmt::print(f, "  python peers: {}\n", m.python);
  for (const auto& [k, v] : m.peer_versions) fmt::print(f, "  {}: {}\n", k, v);
  fmt::print(f, "  times: median of --reps after a warm-up call; GFLOP/s forward 4·B·Hq·Nq·Nk·D (/2 causal), backward ×2.5\n");
  fmt::print(f, "\n{:<36} {:<4} {:<3} {:>3} {:<20} {:>10} {:>8} {:>6} {:>7} {:>6} {:>7}\n", "shape", "type", "pas", "thr",
             "impl", "median_ms", "GFLOP/s", "%peak", "GB/s", "%DRAM", "attn×");
}

void print_text(const row& r, const machine& m) {
  auto f = fields(r, m);
  auto get = [&](const char* k) {
    for (auto& [n, v] : f)
      if (n == k) return v == "null" ? NAN : std::stod(v);
    return double(NAN);
  };
  const bool decode = r.c.p.Nq <= 16;
  fmt::print("{:<36} {:<4} {:<3} {:>3} {:<20} {:>10.3f} {:>8.1f} {:>5.1f}% {:>7} {:>6} {:>7}\n", shape_label(r.c.p),
             short_dtype(r.c.p.type), r.c.backward ? "bwd" : "fwd", r.threads, r.impl, r.median_ms, get("gflops"),
             get("pct_peak"), decode ? fmt::format("{:.1f}", get("gbps")) : "",
             decode && get("dram_gbps") > 0 ? fmt::format("{:.0f}%", get("pct_dram")) : "",
             r.peer ? fmt::format("{:.2f}", get("attn_speedup")) : "");
  std::fflush(stdout);
}

// ---- the run ----

int run(const bench_args& a, bool dtype_given, bool pass_given) {
  if (a.reps < 1) throw error(fmt::format("attn bench: --reps {} must be >= 1", a.reps));
  if (a.warmup < 0) throw error(fmt::format("attn bench: --warmup {} must be >= 0", a.warmup));
  std::vector<bool> passes;
  const std::string pass = a.backward && !pass_given ? "both" : a.pass;
  if (pass == "forward" || pass == "both") passes.push_back(false);
  if (pass == "backward" || pass == "both") passes.push_back(true);

  std::vector<config> configs;
  if (a.grid == "standard") {
    std::vector<dtype> dtypes = dtype_given ? std::vector<dtype>{parse_bench_dtype(a.dtype_name)}
                                            : std::vector<dtype>{dtype::f32, dtype::bf16};
    configs = standard_grid(dtypes, pass_given || a.backward ? passes : std::vector<bool>{false, true});
  } else {
    problem p;
    p.B = a.batch, p.Hq = a.hq, p.Hkv = a.hkv ? a.hkv : a.hq, p.Nq = a.nq, p.Nk = a.nk ? a.nk : a.nq, p.D = a.d;
    p.Dv = a.dv ? a.dv : a.d, p.causal = a.causal, p.type = parse_bench_dtype(a.dtype_name);
    for (auto [name, val] : {std::pair{"--batch", p.B}, {"--hq", p.Hq}, {"--hkv", p.Hkv}, {"--nq", p.Nq},
                             {"--nk", p.Nk}, {"--d", p.D}, {"--dv", p.Dv}})
      if (val < 1) throw error(fmt::format("attn bench: {} {} must be >= 1", name, val));
    if (p.Hq % p.Hkv != 0)
      throw error(fmt::format("attn bench: --hq {} is not a multiple of --hkv {}", p.Hq, p.Hkv));
    for (bool bwd : passes) configs.push_back({"custom", p, bwd});
  }

  std::vector<int> threads;
  for (int t : a.threads) {
    if (t < 0) throw error(fmt::format("attn bench: --threads {} must be >= 0 (0: all)", t));
    threads.push_back(t ? t : int(std::max(1u, std::thread::hardware_concurrency())));
  }
  const backend be = parse_backend(a.backend_name);
  bool want_blas = false;
  std::string py_peers;
  {
    std::stringstream ss(a.peers);
    for (std::string name; std::getline(ss, name, ',');) {
      if (name == "blas")
        want_blas = true;
      else if (name == "torch" || name == "ggml")
        py_peers += (py_peers.empty() ? "" : ",") + name;
      else if (name != "none" && !name.empty())
        throw error(fmt::format("attn bench: --peers {}: '{}' is not one of blas, torch, ggml, none", a.peers, name));
    }
  }

  // What the machine can do, probed now (the same run as the timings below).
  machine m;
  m.cpu = bench::cpu_model_name();
  for (int t : threads) {
    if (m.f32_peak.count(t)) continue;
    m.f32_peak[t] = bench::probe_fma_peak(dtype::f32, t);
    m.bf16_peak[t] = bench::probe_fma_peak(dtype::bf16, t);
    if (a.probe_mib > 0) m.dram[t] = bench::probe_dram_read(t, std::size_t(a.probe_mib) << 20);
  }
  bench::blas_baseline* blas = want_blas ? &bench::blas_baseline::instance(a.openblas_coretype) : nullptr;
  m.blas = blas ? blas->describe() : "not asked for (--peers)";
  std::unique_ptr<python_peers> py;
  if (!py_peers.empty()) {
    const std::string python = find_python(a.python), script = find_peer_script(a.peer_script);
    if (python.empty())
      m.python = "not measured: no benchmark venv (run bench/setup_venv.sh, or pass --python)";
    else if (script.empty())
      m.python = "not measured: bench/peers.py not found (pass --peer-script)";
    else {
      py = std::make_unique<python_peers>(python, script, py_peers);
      m.python = py->ok() ? python : "not measured: " + py->why();
      if (py->ok()) m.peer_versions = py->versions();
    }
  }
  print_header_text(a.json ? stderr : stdout, m);

  std::ofstream csv;
  if (!a.csv.empty()) {
    csv.open(a.csv);
    if (!csv) throw error(fmt::format("attn bench: cannot write --csv {}", a.csv));
    row dummy;
    dummy.threads = threads.front();
    bool first = true;
    for (const auto& [k, v] : fields(dummy, m)) csv << (first ? "" : ",") << k, first = false;
    csv << "\n";
  }
  auto emit = [&](const row& r) {
    if (a.json)
      print_json(r, m);
    else
      print_text(r, m);
    if (csv.is_open()) {
      bool first = true;
      for (const auto& [k, v] : fields(r, m)) {
        std::string x = v;
        if (x.size() >= 2 && x.front() == '"') x = "\"" + x.substr(1, x.size() - 2) + "\"";
        csv << (first ? "" : ",") << (x == "null" ? "" : x);
        first = false;
      }
      csv << "\n";
      csv.flush();
    }
  };

  int failed_checks = 0;
  for (const config& c : configs) {
    const problem& p = c.p;
    const Tensor q = random_tensor({p.B, p.Hq, p.Nq, p.D}, p.type, 1);
    const Tensor k = random_tensor({p.B, p.Hkv, p.Nk, p.D}, p.type, 2);
    const Tensor v = random_tensor({p.B, p.Hkv, p.Nk, p.Dv}, p.type, 3);
    const Tensor dout = random_tensor({p.B, p.Hq, p.Nq, p.Dv}, p.type, 4);
    for (int t : threads) {
      attention_options o;
      o.is_causal = p.causal;
      const execution exec{.use_backend = be, .num_threads = t};

      // The contenders run in process (attn, the OpenBLAS baseline) or in the peer process.
      struct local {
        row r;
        std::function<void()> call;
        std::vector<double> ms;
      };
      std::vector<local> locals;
      row attn_row{c, t, "attn", "", false};
      attention_result fwd;  // the forward that the backward differentiates (not timed)
      if (c.backward) fwd = attention(q, k, v, o, exec);
      if (!c.backward)
        locals.push_back({attn_row, [&, &r = locals] { r[0].r.detail = attention(q, k, v, o, exec).backend; }, {}});
      else
        locals.push_back({attn_row, [&, &r = locals] {
                            r[0].r.detail = attention_backward(q, k, v, fwd.out, dout, fwd.lse, o, exec).backend;
                          }, {}});
      const Tensor out = Tensor::empty({p.B, p.Hq, p.Nq, p.Dv}, p.type);
      Tensor dq, dk, dv;
      if (blas) {
        row b{c, t, "blas_unfused", blas->describe(), true};
        if (const std::string why = blas->skip_reason(p, t); !why.empty()) {
          if (!a.json) fmt::print("{:<36} {:<4} {:<3} {:>3} {:<20} skipped: {}\n", "", "", "", t, b.impl, why);
        } else if (!c.backward) {
          locals.push_back({b, [&] { blas->forward(p, q, k, v, out, t); }, {}});
        } else {
          blas->forward(p, q, k, v, out, t);
          dq = Tensor::empty(q.shape(), p.type), dk = Tensor::empty(k.shape(), p.type);
          dv = Tensor::empty(v.shape(), p.type);
          locals.push_back({b, [&] { blas->backward(p, q, k, v, out, dout, dq, dk, dv, t); }, {}});
        }
      }
      std::vector<python_peers::peer_state> remote;
      std::map<std::string, std::vector<double>> remote_ms;
      if (py && py->ok()) remote = py->prepare(c, t, a.warmup);

      // Warm-up; attn's first call also measures the memory it touches beyond its results
      // (out and lse, or dq, dk and dv).
      for (auto& l : locals)
        for (int i = 0; i < a.warmup; ++i) {
          const bool probe = i == 0 && &l == &locals[0];
          memory_probe mem;
          if (probe) mem.begin();
          l.call();
          if (probe) l.r.work_mib = mem.end_mib();
        }
      // Timed calls, alternating between the contenders.
      for (int rep = 0; rep < a.reps; ++rep) {
        for (auto& l : locals) {
          const bool probe = a.warmup == 0 && rep == 0 && &l == &locals[0];
          memory_probe mem;
          if (probe) mem.begin();
          const auto t0 = std::chrono::steady_clock::now();
          l.call();
          l.ms.push_back(ms_since(t0));
          if (probe) l.r.work_mib = mem.end_mib();
        }
        if (py && py->ok() && !remote.empty())
          for (const auto& [impl, ms] : py->rep()) remote_ms[impl].push_back(ms);
      }

      const double result_mib =
          (c.backward ? double(q.numel() + k.numel() + v.numel()) * elem_bytes(p.type)
                      : double(p.B * p.Hq * p.Nq) * (double(p.Dv) * elem_bytes(p.type) + 4.0)) /
          (1 << 20);
      locals[0].r.work_mib -= result_mib;
      const timing attn_t = summarize(locals[0].ms);
      for (auto& l : locals) {
        const timing tm = summarize(l.ms);
        l.r.median_ms = tm.median_ms, l.r.min_ms = tm.min_ms;
        if (l.r.peer) l.r.attn_ms = attn_t.median_ms;
      }
      if (a.check && locals.size() > 1) {  // the baseline's results against attn's
        row& b = locals[1].r;
        if (!c.backward) {
          b.max_abs_diff = max_abs_diff(out, attention(q, k, v, o).out);
        } else {
          const attention_grads g = attention_backward(q, k, v, fwd.out, dout, fwd.lse, o);
          b.max_abs_diff = std::max({max_abs_diff(dq, g.dq), max_abs_diff(dk, g.dk), max_abs_diff(dv, g.dv)});
        }
        // Inputs are uniform in [-1, 1): results are O(1), gradients O(√Nk) at most.
        const double tol = (p.type == dtype::f32 ? 2e-3 : 6e-2) * (c.backward ? std::sqrt(double(p.Nk)) : 1.0);
        if (!(b.max_abs_diff <= tol)) {
          fmt::print(stderr, "attn bench: check failed: {} {} {}: |blas_unfused − attn| = {:.3g} > {:.3g}\n",
                     shape_label(p), short_dtype(p.type), c.backward ? "backward" : "forward", b.max_abs_diff, tol);
          failed_checks++;
        }
      }
      for (const auto& l : locals) emit(l.r);
      for (const auto& ps : remote) {
        const auto it = remote_ms.find(ps.impl);
        if (!ps.ready || it == remote_ms.end()) {
          if (!a.json)
            fmt::print("{:<36} {:<4} {:<3} {:>3} {:<20} skipped: {}\n", "", "", "", t, ps.impl,
                       ps.ready ? "failed while timed" : ps.detail);
          continue;
        }
        row pr{c, t, ps.impl, ps.detail, true};
        const timing tm = summarize(it->second);
        pr.median_ms = tm.median_ms, pr.min_ms = tm.min_ms, pr.attn_ms = attn_t.median_ms;
        emit(pr);
      }
      if (py && py->ok()) py->release();
    }
  }
  return failed_checks ? 1 : 0;
}

}  // namespace

void add_bench(CLI::App& app, int& exit_code) {
  auto* s = app.add_subcommand("bench", "Time attention (and peers: OpenBLAS unfused, PyTorch, ggml) against the machine's peak");
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
  s->add_option("--grid", a->grid, "none | standard (the grid of docs/PERFORMANCE.md)")
      ->check(CLI::IsMember({"none", "standard"}));
  s->add_flag("--json", a->json, "one JSON object per line and configuration (the header goes to stderr)");
  s->add_option("--csv", a->csv, "also write every row to this CSV file");
  s->add_flag("--check", a->check,
              "compare the OpenBLAS baseline's results with attn's (exit status 1 when they differ)");
  s->add_option("--peers", a->peers, "peers to measure, comma-separated: blas, torch, ggml, or none");
  s->add_option("--python", a->python, "python of the benchmark venv (default $ATTN_BENCH_PYTHON, ~/.cache/attn-bench-venv)");
  s->add_option("--peer-script", a->peer_script, "bench/peers.py (found next to the build tree by default)");
  s->add_option("--openblas-coretype", a->openblas_coretype,
                 "auto (SkylakeX where the CPU has AVX-512F) | env (keep OPENBLAS_CORETYPE) | a core name");
  s->add_option("--probe-mib", a->probe_mib, "buffer of the DRAM bandwidth probe in MiB (0: no probe)");
  s->callback([a, dt, ps, &exit_code] { exit_code = run(*a, dt->count() > 0, ps->count() > 0); });
}

}  // namespace attn::cli

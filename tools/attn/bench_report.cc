// tools/attn/bench_report.cc — text, JSON and CSV output of `attn bench` (bench_report.h).
#include "bench_report.h"

#include <fmt/format.h>

#include "attn/error.h"
#include "bench_memory.h"

namespace attn::cli::bench {
namespace {

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

void print_json(const row& r, const machine& m) {
  std::string s = "{";
  for (const auto& [k, v] : fields(r, m)) s += fmt::format("{}\"{}\": {}", s.size() > 1 ? ", " : "", k, v);
  fmt::print("{}}}\n", s);
  std::fflush(stdout);
}

void print_text(const row& r, const machine& m) {
  auto f = fields(r, m);
  auto get = [&](const char* k) {
    for (auto& [n, v] : f)
      if (n == k) return v == "null" ? NAN : std::stod(v);
    return double(NAN);
  };
  const bool decode = r.c.w.Nq <= 16;
  // The KV-cache modes time attn in two ways on one shape: the mode goes next to the name.
  const std::string impl = r.c.kv == kv_mode::plain ? r.impl : fmt::format("{} {}", r.impl, r.c.name);
  fmt::print("{:<36} {:<4} {:<3} {:>3} {:<20} {:>10.3f} {:>8.1f} {:>5.1f}% {:>7} {:>6} {:>7}\n", shape_label(r.c.w),
             short_dtype(r.c.w.type), r.c.backward ? "bwd" : "fwd", r.threads, impl, r.median_ms, get("gflops"),
             get("pct_peak"), decode ? fmt::format("{:.1f}", get("gbps")) : "",
             decode && get("dram_gbps") > 0 ? fmt::format("{:.0f}%", get("pct_dram")) : "",
             r.peer ? fmt::format("{:.2f}", get("attn_speedup")) : "");
  std::fflush(stdout);
}

}  // namespace

// bf16 rows count against the faster way this CPU multiplies bf16: its bf16 dot product, or
// widening to f32 and the FMA where that is faster (Intel's vdpbf16ps runs at half the FMA's
// FLOP rate; attn widens there: cpu::bf16_dot_products).
double machine::peak(dtype t, int threads) const {
  const auto get = [threads](const std::map<int, probe_result>& m) {
    const auto it = m.find(threads);
    return it == m.end() ? NAN : it->second.value;
  };
  return t == dtype::bf16 ? std::fmax(get(bf16_peak), get(f32_peak)) : get(f32_peak);
}

std::vector<std::pair<std::string, std::string>> fields(const row& r, const machine& m) {
  const workload& w = r.c.w;
  const double gflops = flops(r.c) / (r.median_ms * 1e-3) / 1e9;
  const double peak = m.peak(w.type, r.threads);
  const double gbps = kv_bytes(w) / (r.median_ms * 1e-3) / 1e9;
  const double dram = m.dram.count(r.threads) ? m.dram.at(r.threads).value : 0.0;
  return {
      {"config", json_str(r.c.name)},
      {"impl", json_str(r.impl)},
      {"peer", r.peer ? "true" : "false"},
      {"backend", json_str(r.detail)},
      {"pass", json_str(r.c.backward ? "backward" : "forward")},
      {"dtype", json_str(short_dtype(w.type))},
      {"B", fmt::format("{}", w.B)},
      {"Hq", fmt::format("{}", w.Hq)},
      {"Hkv", fmt::format("{}", w.Hkv)},
      {"Nq", fmt::format("{}", w.Nq)},
      {"Nk", fmt::format("{}", w.Nk)},
      {"D", fmt::format("{}", w.D)},
      {"Dv", fmt::format("{}", w.Dv)},
      {"causal", w.causal ? "true" : "false"},
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

report::report(const machine& m, bool json, const std::string& csv_path, int first_threads) : m_(m), json_(json) {
  if (csv_path.empty()) return;
  csv_.open(csv_path);
  if (!csv_) throw error(fmt::format("attn bench: cannot write --csv {}", csv_path));
  row dummy;
  dummy.threads = first_threads;
  bool first = true;
  for (const auto& [k, v] : fields(dummy, m_)) csv_ << (first ? "" : ",") << k, first = false;
  csv_ << "\n";
}

void report::header() const {
  std::FILE* f = json_ ? stderr : stdout;
  fmt::print(f, "attn bench — {}\n", m_.cpu);
  for (const auto& [t, pk] : m_.f32_peak)
    fmt::print(f, "  {} thread{}: FMA peak f32 {:.0f} GFLOP/s ({}), bf16 {:.0f} GFLOP/s ({}{}); DRAM read {}\n", t,
               t == 1 ? "" : "s", pk.value, pk.isa, m_.bf16_peak.at(t).value, m_.bf16_peak.at(t).isa,
               m_.bf16_peak.at(t).value < pk.value ? ", below f32's: bf16 rows' %peak is of f32's" : "",
               m_.dram.count(t) ? fmt::format("{:.1f} GB/s", m_.dram.at(t).value) : std::string("not probed"));
  fmt::print(f, "  blas:  {}\n", m_.blas);
  if (!m_.python.empty()) fmt::print(f, "  python peers: {}\n", m_.python);
  for (const auto& [k, v] : m_.peer_versions) fmt::print(f, "  {}: {}\n", k, v);
  fmt::print(f, "  times: median of --reps after a warm-up call; GFLOP/s forward 4·B·Hq·Nq·Nk·D (/2 causal), backward ×2.5\n");
  fmt::print(f, "\n{:<36} {:<4} {:<3} {:>3} {:<20} {:>10} {:>8} {:>6} {:>7} {:>6} {:>7}\n", "shape", "type", "pas", "thr",
             "impl", "median_ms", "GFLOP/s", "%peak", "GB/s", "%DRAM", "attn×");
}

void report::emit(const row& r) {
  if (json_)
    print_json(r, m_);
  else
    print_text(r, m_);
  if (!csv_.is_open()) return;
  bool first = true;
  for (const auto& [k, v] : fields(r, m_)) {  // JSON strings are quoted CSV fields as they are
    csv_ << (first ? "" : ",") << (v == "null" ? "" : v);
    first = false;
  }
  csv_ << "\n";
  csv_.flush();
  if (!csv_) throw error("attn bench: writing the --csv file failed (disk full?)");
}

void report::skipped(int threads, const std::string& impl, const std::string& why) const {
  if (!json_) fmt::print("{:<36} {:<4} {:<3} {:>3} {:<20} skipped: {}\n", "", "", "", threads, impl, why);
}

}  // namespace attn::cli::bench

// tools/attn/bench_ab.h — `attn bench --ab VAR=A,B`: the knob's name and two values, and a guard
// that sets it for one contender's calls and puts it back when the run ends (cmd_bench.cc for the
// plain call and the --kv-cache step, bench_family.cc for --score/--distribution and --grid family).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/attn.h"

namespace attn::cli::bench {

// --ab VAR=A,B: one environment variable the library reads on every call, and its two values.
struct ab_spec {
  std::string var, a, b;
};

inline ab_spec parse_ab(const std::string& s) {
  const auto bad = [&](const char* why) {
    return error(fmt::format("attn bench: --ab '{}': {} (expected VAR=A,B: an environment variable and two values)", s,
                             why));
  };
  const std::size_t eq = s.find('='), comma = s.find(',', eq == std::string::npos ? 0 : eq);
  if (eq == std::string::npos) throw bad("no '='");
  if (eq == 0) throw bad("no variable before '='");
  ab_spec r{s.substr(0, eq), "", ""};
  for (char ch : r.var)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_'))
      throw bad("the variable's name is not [A-Za-z0-9_]");
  if (comma == std::string::npos) throw bad("no ',' between the two values");
  r.a = s.substr(eq + 1, comma - eq - 1), r.b = s.substr(comma + 1);
  if (r.b.find(',') != std::string::npos) throw bad("more than two values");
  if (r.a == r.b) throw bad("the two values are the same");
  return r;
}

// Sets an environment variable for the calls of one --ab contender, and puts the variable back
// as it was when the run ends.
class env_guard {
 public:
  explicit env_guard(std::string var) : var_(std::move(var)) {
    if (const char* v = std::getenv(var_.c_str())) old_ = v, had_ = true;
  }
  ~env_guard() {
    if (had_) setenv(var_.c_str(), old_.c_str(), 1);
    else unsetenv(var_.c_str());
  }
  void set(const std::string& value) const { setenv(var_.c_str(), value.c_str(), 1); }
  env_guard(const env_guard&) = delete;
  env_guard& operator=(const env_guard&) = delete;

 private:
  std::string var_, old_;
  bool had_ = false;
};

// --ab: the knob and its guard for one run of contenders (nothing without --ab).
struct ab_knob {
  std::optional<ab_spec> spec;
  std::optional<env_guard> guard;
  explicit ab_knob(const std::string& arg) {
    if (arg.empty()) return;
    spec = parse_ab(arg);
    guard.emplace(spec->var);
  }
};

// The line --ab prints per configuration and pass: the median of the paired time ratios B/A of
// attn[A]'s and attn[B]'s calls (a_ms[i] and b_ms[i] timed in the same round), how many pairs B
// won, and the two medians. `what` names the configuration ("B1 Hq8 … f32 forward").
inline std::string ab_ratio_line(const ab_spec& ab, std::string_view what, int threads,
                                 const std::vector<double>& a_ms, const std::vector<double>& b_ms) {
  const auto median = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    const auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
    std::nth_element(v.begin(), mid, v.end());
    if (v.size() % 2) return *mid;
    return 0.5 * (*mid + *std::max_element(v.begin(), mid));
  };
  std::vector<double> ratio;
  int b_faster = 0;
  for (std::size_t i = 0; i < a_ms.size() && i < b_ms.size(); ++i) {
    ratio.push_back(b_ms[i] / a_ms[i]);
    b_faster += b_ms[i] < a_ms[i];
  }
  return fmt::format(
      "  ab: {}, {} thread{}: {}={} / {}={}: median of {} paired time ratios {:.3f} ({} faster in {} of {}; medians "
      "{:.3f} / {:.3f} ms)\n",
      what, threads, threads == 1 ? "" : "s", ab.var, ab.b, ab.var, ab.a, ratio.size(), median(ratio), ab.b, b_faster,
      ratio.size(), median(b_ms), median(a_ms));
}

}  // namespace attn::cli::bench

// tools/attn/bench_ab.h — `attn bench --ab VAR=A,B`: the knob's name and two values, and a guard
// that sets it for one contender's calls and puts it back when the run ends (cmd_bench.cc for the
// plain call and the --kv-cache step, bench_family.cc for --score/--distribution and --grid family).
#pragma once

#include <fmt/format.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <utility>

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

}  // namespace attn::cli::bench

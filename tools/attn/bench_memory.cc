// tools/attn/bench_memory.cc — resident-set probes of `attn bench` (bench_memory.h).
#include "bench_memory.h"

#include <malloc.h>
#include <sys/resource.h>

#include <cmath>
#include <fstream>
#include <string>

namespace attn::cli::bench {
namespace {

// kB of a "Vm..." line of /proc/self/status, or -1.
double proc_status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  const std::string k = std::string(key) + ":";
  for (std::string line; std::getline(f, line);)
    if (line.rfind(k, 0) == 0) return std::stod(line.substr(k.size()));
  return -1;
}

}  // namespace

void memory_probe::begin() {
  malloc_trim(0);
  std::ofstream("/proc/self/clear_refs") << "5";
  base_kb = proc_status_kb("VmRSS");
}

double memory_probe::end_mib() const {
  const double hwm = proc_status_kb("VmHWM");
  return base_kb < 0 || hwm < 0 ? NAN : (hwm - base_kb) / 1024.0;
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

}  // namespace attn::cli::bench

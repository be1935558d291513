// tools/attn/bench_report.h — what `attn bench` prints: the header (the machine and its probed
// peaks), one row per contender and configuration as a text table, JSON lines or CSV. The
// fields and their meaning are listed in docs/PERFORMANCE.md ("What is printed").
#pragma once

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_grid.h"
#include "bench_probe.h"

namespace attn::cli::bench {

// One measured row: attn or a peer on one configuration and thread count.
struct row {
  config c;
  int threads = 1;
  std::string impl, detail;  // impl: attn | blas_unfused | torch_sdpa | ggml_flash_attn_ext
  bool peer = false;
  double median_ms = 0, min_ms = 0;
  double attn_ms = 0;         // attn's median on the same configuration (for the speed-up column)
  double work_mib = NAN;      // attn only: memory the call used beyond its inputs and results
  double max_abs_diff = NAN;  // blas_unfused with --check: largest |baseline − attn| of the results
};

// What the machine can do (probed in the same run) and which peers ran.
struct machine {
  std::string cpu;
  std::map<int, probe_result> f32_peak, bf16_peak, dram;  // by thread count
  std::string blas, python;
  std::map<std::string, std::string> peer_versions;

  double peak(dtype t, int threads) const;
};

// The fields of one row, in order, as (name, JSON value); CSV uses the same names.
std::vector<std::pair<std::string, std::string>> fields(const row& r, const machine& m);

// Prints rows as a text table (stdout) or JSON lines (stdout, header on stderr), and also into
// a CSV file when one is given.
class report {
 public:
  // Throws attn::error when the CSV file cannot be written.
  report(const machine& m, bool json, const std::string& csv_path, int first_threads);
  void header() const;
  void emit(const row& r);
  // "<impl> skipped: <why>" in the text table (nothing in JSON).
  void skipped(int threads, const std::string& impl, const std::string& why) const;

 private:
  const machine& m_;
  bool json_;
  std::ofstream csv_;
};

}  // namespace attn::cli::bench

// tests/fuzz_sweep.h — a differential fuzz harness of fuzz/ (its LLVMFuzzerTestOneInput linked
// into the test binary) driven without libFuzzer: random inputs and its corpus at every ISA
// level of this build. The fuzz build stops at AVX2 (fuzz/CMakeLists.txt); here the AVX-512,
// bf16-dot, VNNI and AMX kernels meet the same checks. A finding prints its message and stops
// the binary (the harnesses trap). ATTN_FUZZ_SWEEP_INPUTS (default 3000 a level) and
// ATTN_FUZZ_SWEEP_SEED (default 1) make a longer or another run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cpu_isa.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace attn::testing {

inline long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atol(v) : fallback;
}

// At every level: the sweep's random inputs (lengths 64…4095, uniform bytes: the harnesses read
// them as choices), then after(level, inputs). The avx512bf16 level's second walk, bf16 widened to
// f32 (cpu_isa.h), takes a third of them: its kernels are the avx512 level's but for the int8
// decode. Returns the inputs run.
template <class After>
long sweep_random_inputs(After&& after) {
  const long n = env_long("ATTN_FUZZ_SWEEP_INPUTS", 3000), seed = env_long("ATTN_FUZZ_SWEEP_SEED", 1);
  const std::vector<std::string> levels = isas();
  std::vector<std::uint8_t> bytes;
  long total = 0;
  for (std::size_t li = 0; li < levels.size(); ++li) {
    const isa_scope scope(levels[li]);
    std::mt19937 rng(std::uint32_t(seed * 131 + long(li)));
    const long m = levels[li] == kIsaBf16Widened ? (n + 2) / 3 : n;
    for (long i = 0; i < m; ++i) {
      bytes.resize(64 + rng() % 4032);
      for (auto& b : bytes) b = std::uint8_t(rng());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    }
    after(levels[li], m);
    total += m;
  }
  return total;
}

// The inputs of fuzz/corpus/<name> (the regression inputs of past findings among them).
inline std::vector<std::vector<std::uint8_t>> fuzz_corpus(const std::string& name) {
  std::vector<std::vector<std::uint8_t>> inputs;
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(ATTN_SOURCE_DIR) / "fuzz" / "corpus" / name)) {
    std::ifstream f(e.path(), std::ios::binary);
    inputs.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return inputs;
}

// The corpus at every level; returns the inputs run.
inline long sweep_corpus(const std::string& name) {
  const std::vector<std::vector<std::uint8_t>> inputs = fuzz_corpus(name);
  for (const std::string& level : isas()) {
    const isa_scope scope(level);
    for (const auto& in : inputs) LLVMFuzzerTestOneInput(in.data(), in.size());
  }
  return long(inputs.size());
}

}  // namespace attn::testing

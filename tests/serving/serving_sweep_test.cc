// tests/serving/serving_sweep_test.cc — the differential check of fuzz/serving_fuzz.cc (paged on
// float and int8 pages with appends, paged_varlen, varlen forward and backward, against the core
// op on each sequence's dense keys; stale page slots; corrupt tables, lengths and cu_seqlens
// refused by message) driven without libFuzzer: random inputs and the corpus
// fuzz/corpus/serving at every ISA level of this build — the fuzz build stops at AVX2, so this
// is where the AVX-512, bf16-dot and VNNI decode paths meet the harness. A finding prints its
// message and stops the binary (the harness traps); the counts say each op was checked and
// each kind of corrupt call refused.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "serving_fuzz.h"

namespace attn {
namespace {

struct isa_scope {
  explicit isa_scope(const std::string& isa) { setenv("ATTN_CPU_ISA", isa.c_str(), 1); }
  ~isa_scope() { unsetenv("ATTN_CPU_ISA"); }
};

std::vector<std::string> isas() {
  int n = 0;
  const char* const* names = detail::cpu::available_isas(&n);
  return std::vector<std::string>(names, names + n);
}

long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atol(v) : fallback;
}

// ATTN_SERVING_SWEEP_INPUTS random inputs a level (default 3000), from ATTN_SERVING_SWEEP_SEED
// (default 1): lengths 64…4095, the bytes uniform — the harness reads them as choices.
TEST(ServingSweep, RandomInputsAtEveryIsaLevel) {
  const long n = env_long("ATTN_SERVING_SWEEP_INPUTS", 3000), seed = env_long("ATTN_SERVING_SWEEP_SEED", 1);
  const std::vector<std::string> levels = isas();
  for (std::size_t li = 0; li < levels.size(); ++li) {
    SCOPED_TRACE(levels[li]);
    const isa_scope scope(levels[li]);
    const fuzz::serving_counts before = fuzz::serving_fuzz_counts();
    std::mt19937 rng(std::uint32_t(seed * 131 + long(li)));
    std::vector<std::uint8_t> bytes;
    for (long i = 0; i < n; ++i) {
      bytes.resize(64 + rng() % 4032);
      for (auto& b : bytes) b = std::uint8_t(rng());
      LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    }
    const fuzz::serving_counts& after = fuzz::serving_fuzz_counts();
    std::printf("%-11s checked (paged, int8 paged, paged_varlen, varlen) %ld %ld %ld %ld, refused %ld %ld %ld %ld\n",
                levels[li].c_str(), long(after.checked[0] - before.checked[0]), long(after.checked[1] - before.checked[1]),
                long(after.checked[2] - before.checked[2]), long(after.checked[3] - before.checked[3]),
                long(after.refused[0] - before.refused[0]), long(after.refused[1] - before.refused[1]),
                long(after.refused[2] - before.refused[2]), long(after.refused[3] - before.refused[3]));
    for (int op = 0; op < 4; ++op) {
      // About n/4 inputs an op, one in eight of them corrupt: every op is checked and refuses.
      EXPECT_GT(after.checked[op] - before.checked[op], n / 16) << "op " << op;
      EXPECT_GT(after.refused[op] - before.refused[op], 0) << "op " << op;
    }
  }
}

// The corpus CI's fuzzer starts from (its regression inputs among them), at every level.
TEST(ServingSweep, CorpusAtEveryIsaLevel) {
  const std::filesystem::path dir = std::filesystem::path(ATTN_SOURCE_DIR) / "fuzz" / "corpus" / "serving";
  std::vector<std::vector<std::uint8_t>> inputs;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    inputs.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  ASSERT_GE(inputs.size(), 9u) << dir;
  for (const std::string& level : isas()) {
    SCOPED_TRACE(level);
    const isa_scope scope(level);
    const fuzz::serving_counts before = fuzz::serving_fuzz_counts();
    for (const auto& in : inputs) LLVMFuzzerTestOneInput(in.data(), in.size());
    std::int64_t ran = 0;
    for (int op = 0; op < 4; ++op)
      ran += fuzz::serving_fuzz_counts().checked[op] + fuzz::serving_fuzz_counts().refused[op] - before.checked[op] -
             before.refused[op];
    EXPECT_EQ(ran, std::int64_t(inputs.size()));
  }
}

}  // namespace
}  // namespace attn

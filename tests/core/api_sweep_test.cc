// tests/core/api_sweep_test.cc — fuzz/api_fuzz.cc's differential check of attention and
// attention_backward (cpu and reference against a float64 truth, NaN/inf patterns, the _into
// forms bitwise) at every ISA level of this build, on random inputs and its corpus
// (tests/fuzz_sweep.h): the fuzz build's kernels stop at AVX2.
#include <gtest/gtest.h>

#include "fuzz_sweep.h"

namespace attn {
namespace {

TEST(ApiSweep, RandomInputsAtEveryIsaLevel) {
  EXPECT_GT(testing::sweep_random_inputs([](const std::string&, long) {}), 0);
}

TEST(ApiSweep, CorpusAtEveryIsaLevel) { EXPECT_GE(testing::sweep_corpus("api"), 20); }

}  // namespace
}  // namespace attn

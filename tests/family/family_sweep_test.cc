// tests/family/family_sweep_test.cc — fuzz/family_fuzz.cc's differential check of
// attention_family (tiled, core, fused and reference paths against the float64 reference,
// forward, backward and weights; rotary and the T5 bias) at every ISA level of this build, on
// random inputs and its corpus (tests/fuzz_sweep.h): the fused family kernels' AVX-512 and bf16
// forms are not in the fuzz build.
#include <gtest/gtest.h>

#include "fuzz_sweep.h"

namespace attn {
namespace {

TEST(FamilySweep, RandomInputsAtEveryIsaLevel) {
  EXPECT_GT(testing::sweep_random_inputs([](const std::string&, long) {}), 0);
}

TEST(FamilySweep, CorpusAtEveryIsaLevel) { EXPECT_GE(testing::sweep_corpus("family"), 5); }

}  // namespace
}  // namespace attn

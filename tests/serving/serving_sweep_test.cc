// tests/serving/serving_sweep_test.cc — the differential check of fuzz/serving_fuzz.cc (paged on
// float and int8 pages with appends, paged_varlen, varlen forward and backward, against the core
// op on each sequence's dense keys; stale page slots; corrupt tables, lengths and cu_seqlens
// refused by message) at every ISA level of this build, on random inputs and its corpus
// (tests/fuzz_sweep.h). The harness's counts say each op was checked and each refused a
// corrupt call.
#include <gtest/gtest.h>

#include <cstdio>

#include "fuzz_sweep.h"
#include "serving_fuzz.h"

namespace attn {
namespace {

TEST(ServingSweep, RandomInputsAtEveryIsaLevel) {
  fuzz::serving_counts before = fuzz::serving_fuzz_counts();
  testing::sweep_random_inputs([&](const std::string& level, long n) {
    const fuzz::serving_counts& after = fuzz::serving_fuzz_counts();
    std::printf("%-11s checked (paged, int8 paged, paged_varlen, varlen) %ld %ld %ld %ld, refused %ld %ld %ld %ld\n",
                level.c_str(), long(after.checked[0] - before.checked[0]), long(after.checked[1] - before.checked[1]),
                long(after.checked[2] - before.checked[2]), long(after.checked[3] - before.checked[3]),
                long(after.refused[0] - before.refused[0]), long(after.refused[1] - before.refused[1]),
                long(after.refused[2] - before.refused[2]), long(after.refused[3] - before.refused[3]));
    for (int op = 0; op < 4; ++op) {
      // About n/4 inputs an op, one in eight of them corrupt: every op is checked and refuses.
      EXPECT_GT(after.checked[op] - before.checked[op], n / 16) << level << ", op " << op;
      EXPECT_GT(after.refused[op] - before.refused[op], 0) << level << ", op " << op;
    }
    before = after;
  });
}

TEST(ServingSweep, CorpusAtEveryIsaLevel) {
  const fuzz::serving_counts before = fuzz::serving_fuzz_counts();
  const long n = testing::sweep_corpus("serving");
  ASSERT_GE(n, 9);
  std::int64_t ran = 0;
  for (int op = 0; op < 4; ++op)
    ran += fuzz::serving_fuzz_counts().checked[op] + fuzz::serving_fuzz_counts().refused[op] - before.checked[op] -
           before.refused[op];
  EXPECT_EQ(ran, std::int64_t(n) * std::int64_t(testing::isas().size()));
}

}  // namespace
}  // namespace attn

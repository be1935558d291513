// fuzz/serving_fuzz.h — what serving_fuzz.cc offers besides libFuzzer's entry point: counts of
// the calls it checked, so that a driver without libFuzzer (tests/serving/serving_sweep_test.cc,
// random inputs at every ISA level of the release build) can tell that it checked something.
#pragma once

#include <cstddef>
#include <cstdint>

namespace attn::fuzz {

// By op: 0 attention_paged on float pages, 1 on int8 pages, 2 attention_paged_varlen,
// 3 attention_varlen. checked: valid calls compared with the oracle; refused: corrupt calls
// refused as they must be (paged_kv_append's refusals counted with op 1).
struct serving_counts {
  std::int64_t checked[4] = {}, refused[4] = {};
};
serving_counts& serving_fuzz_counts();

}  // namespace attn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

// fuzz/fuzz_bytes.h — what the differential fuzzers (api_fuzz, family_fuzz) share: the input
// bytes read as small choices and values, and how a finding stops the run.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

namespace attn::fuzz {

// The fuzzer's input, consumed front to back; past its end every byte reads 0.
struct bytes {
  const std::uint8_t* p;
  std::size_t n;
  std::uint8_t next() {
    if (!n) return 0;
    --n;
    return *p++;
  }
  int upto(int k) { return next() % (k + 1); }  // 0..k
  // A value in [-4, 4): two bytes.
  double moderate() { return (next() - 128) / 32.0 + next() / 8192.0; }
  // A value mostly in [-4, 4], sometimes large or special (NaN, ±inf, ±1e19, 300).
  double value() {
    const std::uint8_t c = next();
    if (c < 240) return (c - 120) / 30.0 + next() / 7680.0;
    switch (c) {
      case 240: return std::nan("");
      case 241: return INFINITY;
      case 242: return -INFINITY;
      case 243: return 1e19;
      case 244: return -1e19;
      case 245: return 300.0;
      default: return 0.0;
    }
  }
};

// A finding: what disagreed, printed, then a trap (libFuzzer saves the input as the artifact).
[[noreturn]] inline void finding(const char* fuzzer, const std::string& what, const std::string& detail) {
  std::fprintf(stderr, "%s finding: %s: %s\n", fuzzer, what.c_str(), detail.c_str());
  __builtin_trap();
}

}  // namespace attn::fuzz

// fuzz/npy_fuzz.cc — libFuzzer harness of the .npy reader: any bytes either load as a tensor
// whose every element can be read (and written back and read again to the same values) or
// give attn::error. A crash, a sanitizer report or another exception is a finding.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include <unistd.h>

#include "attn/error.h"
#include "attn/npy.h"
#include "attn/tensor.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  attn::Tensor t;
  try {
    t = attn::parse_npy(data, size, "fuzz.npy");
  } catch (const attn::error&) {
    return 0;
  }
  const std::vector<double> v = t.to_vector();
  if (std::int64_t(v.size()) != t.numel()) __builtin_trap();
  const std::string path = "/tmp/attn_npy_fuzz_" + std::to_string(getpid()) + ".npy";
  attn::write_npy(path, t);
  const std::vector<double> back = attn::read_npy(path).to_vector();
  std::remove(path.c_str());
  if (back.size() != v.size()) __builtin_trap();
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!(back[i] == v[i] || (std::isnan(back[i]) && std::isnan(v[i])))) __builtin_trap();
  return 0;
}

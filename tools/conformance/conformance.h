// tools/conformance/conformance.h — the runner of ONNX Attention conformance case folders
// (format: ../shared/conformance/README.md): a case.json naming the attributes and the .npy
// files of the inputs and expected outputs. Used by `attn conformance` and the tests; not part
// of the shipped library (it parses JSON with nlohmann_json).
#pragma once

#include <string>
#include <vector>

#include "attn/execution.h"

namespace attn::conformance {

struct case_result {
  std::string name;
  bool passed = false;
  std::string detail;     // on failure: which output and its worst error, or the exception text
  double worst_excess = 0;  // max over outputs of |a - e| - (atol + rtol |e|)
};

// Runs one case folder (case.json + .npy files). Never throws for a bad case: a case that
// cannot be read fails with the reason in `detail`.
case_result run_case(const std::string& dir, backend use_backend = backend::automatic);

// Case folders under `dir` (a folder holding case.json is itself one case), sorted by name.
std::vector<std::string> find_cases(const std::string& dir);

}  // namespace attn::conformance

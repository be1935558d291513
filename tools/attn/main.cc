// tools/attn/main.cc — the `attn` command-line tool (placeholder entry; subcommands follow).
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include "attn/attn.h"

int main(int argc, char** argv) {
  CLI::App app{"attn: attention mechanisms"};
  app.require_subcommand(1);
  std::vector<std::string> dirs;
  auto* conf = app.add_subcommand("conformance", "run ONNX Attention conformance case folders");
  conf->add_option("dirs", dirs, "case folders, or folders of case folders")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  int passed = 0, failed = 0;
  try {
    for (const auto& d : dirs)
      for (const auto& c : attn::onnx::find_cases(d)) {
        auto r = attn::onnx::run_case(c);
        if (r.passed) ++passed;
        else ++failed, fmt::print("FAIL {}: {}\n", r.name, r.detail);
      }
  } catch (const std::exception& e) {
    fmt::print(stderr, "attn: {}\n", e.what());
    return 2;
  }
  fmt::print("{} passed, {} failed\n", passed, failed);
  return failed ? 1 : 0;
}

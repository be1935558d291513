// tools/attn/cmd_conformance.cc — `attn conformance DIR...`: runs every case folder (format:
// ../shared/conformance/README.md), prints a line per failing case with its worst error, and
// ends with "N passed, M failed". Exit 0 only when all pass.
#include <fmt/format.h>

#include "attn/attn.h"
#include "cli.h"
#include "conformance.h"

namespace attn::cli {

void add_conformance(CLI::App& app, int& exit_code) {
  auto* sub = app.add_subcommand("conformance", "Run ONNX Attention conformance case folders");
  struct args_t {
    std::vector<std::string> dirs;
    std::string backend = "automatic";
    bool verbose = false;
  };
  auto args = std::make_shared<args_t>();
  sub->add_option("dirs", args->dirs, "case folders, or folders holding case folders")->required();
  sub->add_option("--backend", args->backend, "automatic, reference or cpu")
      ->check(backend_name_check());
  sub->add_flag("-v,--verbose", args->verbose, "print a line for passing cases too");
  sub->callback([args, &exit_code] {
    const backend be = parse_backend(args->backend);
    std::vector<std::string> cases;
    for (const auto& d : args->dirs)
      for (auto& c : conformance::find_cases(d)) cases.push_back(std::move(c));
    int passed = 0, failed = 0;
    for (const auto& c : cases) {
      const conformance::case_result r = conformance::run_case(c, be);
      if (r.passed) {
        ++passed;
        if (args->verbose) fmt::print("ok   {}\n", r.name);
      } else {
        ++failed;
        fmt::print("FAIL {}: {}\n", r.name, r.detail);
      }
    }
    fmt::print("{} passed, {} failed\n", passed, failed);
    exit_code = failed || cases.empty() ? 1 : 0;
  });
}

}  // namespace attn::cli

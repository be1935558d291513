// tools/attn/main.cc — the `attn` command-line tool.
//   attn conformance DIR...      run ONNX Attention conformance cases
//   attn run --q q.npy ...       one attention from .npy files
//   attn bench [--grid standard] time attention and its peers against the machine's peak
//   attn tokenize --text "..."   BERT WordPiece tokenization of a model folder
//   attn embed --text "..."      sentence embeddings (all-MiniLM-L6-v2) on attn
// Exit status: 0 success, 1 a check failed (conformance), 2 bad arguments or files.
#include <fmt/format.h>

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <regex>

#include "cli.h"

namespace {

// CLI11 reads a decimal integer beyond int64 as INT64_MAX (strtoll saturates): every integer
// option of every subcommand refuses it instead, by name and value.
void refuse_integers_beyond_int64(CLI::App& app) {
  static const std::regex decimal("[+-]?[0-9]+");
  const CLI::Validator in_int64(
      [](std::string& s) -> std::string {
        if (!std::regex_match(s, decimal)) return {};  // CLI11 reports what it cannot convert
        std::int64_t v;
        const char* b = s.data() + (s[0] == '+');
        const auto r = std::from_chars(b, s.data() + s.size(), v);
        return r.ec == std::errc::result_out_of_range ? "is beyond int64" : std::string();
      },
      "INT64");
  for (CLI::Option* o : app.get_options())
    if (o->get_type_name() == "INT") o->check(in_int64);
  for (CLI::App* sub : app.get_subcommands({})) refuse_integers_beyond_int64(*sub);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"attn: attention mechanisms (https://github.com/attn)", "attn"};
  app.require_subcommand(1);
  int exit_code = 0;
  attn::cli::add_conformance(app, exit_code);
  attn::cli::add_run(app, exit_code);
  attn::cli::add_bench(app, exit_code);
  attn::cli::add_tokenize(app, exit_code);
  attn::cli::add_embed(app, exit_code);
  refuse_integers_beyond_int64(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "attn: {}\n", e.what());
    return 2;
  }
  return exit_code;
}

// tools/attn/app.cc — parsing and dispatch of the `attn` tool, callable in-process: main.cc
// runs it over every subcommand, fuzz/cli_fuzz.cc over `attn run` with fuzzed arguments.
#include <fmt/format.h>

#include <charconv>
#include <cstdint>
#include <regex>

#include "cli.h"

namespace attn::cli {

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

int run_app(CLI::App& app, const int& exit_code, int argc, const char* const* argv) {
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

}  // namespace attn::cli

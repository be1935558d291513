// tools/attn/cli.h — subcommands of the `attn` tool. Each adds itself to the app and sets
// `exit_code` when it runs. Bad arguments or files throw (attn::error, CLI::Error); main
// prints the message and exits with status 2.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

#include "attn/attention.h"
#include "attn/error.h"
#include "attn/execution.h"

namespace attn::cli {

// A CLI11 check of a --backend value with attn's own parser (one list of names: the library's).
inline CLI::Validator backend_name_check() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        try {
          parse_backend(s);
          return {};
        } catch (const error& e) {
          return e.what();
        }
      },
      "BACKEND");
}

void add_conformance(CLI::App& app, int& exit_code);

// `attn run --ring` (cmd_run_ring.cc): what run() hands over besides the inputs and options.
struct ring_run {
  std::string layout = "contiguous";
  std::string out, lse, dq, dk, dv, dalibi, dsinks;
  std::optional<Tensor> dout;
};
int run_ring(const ring_run& a, const Tensor& q, const Tensor& k, const Tensor& v, const attention_options& o,
             const execution& exec);
void add_run(CLI::App& app, int& exit_code);
void add_bench(CLI::App& app, int& exit_code);
void add_tokenize(CLI::App& app, int& exit_code);
void add_embed(CLI::App& app, int& exit_code);

// Integer options refuse values beyond int64 (CLI11 would saturate them), in every subcommand.
void refuse_integers_beyond_int64(CLI::App& app);
// Parses argv and runs the chosen subcommand: its exit_code, 0 for --help, 2 for bad arguments
// or files (the message printed). main.cc and fuzz/cli_fuzz.cc call it.
int run_app(CLI::App& app, const int& exit_code, int argc, const char* const* argv);

}  // namespace attn::cli

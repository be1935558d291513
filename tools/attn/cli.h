// tools/attn/cli.h — subcommands of the `attn` tool. Each adds itself to the app and sets
// `exit_code` when it runs. Bad arguments or files throw (attn::error, CLI::Error); main
// prints the message and exits with status 2.
#pragma once

#include <CLI/CLI.hpp>

namespace attn::cli {

void add_conformance(CLI::App& app, int& exit_code);
void add_run(CLI::App& app, int& exit_code);
void add_bench(CLI::App& app, int& exit_code);

}  // namespace attn::cli

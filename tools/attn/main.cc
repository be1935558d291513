// tools/attn/main.cc — the `attn` command-line tool.
//   attn conformance DIR...      run ONNX Attention conformance cases
//   attn run --q q.npy ...       one attention from .npy files
//   attn bench [--grid standard] time attention and its peers against the machine's peak
//   attn tokenize --text "..."   BERT WordPiece tokenization of a model folder
//   attn embed --text "..."      sentence embeddings (all-MiniLM-L6-v2) on attn
// Exit status: 0 success, 1 a check failed (conformance), 2 bad arguments or files.
#include <CLI/CLI.hpp>

#include "cli.h"

int main(int argc, char** argv) {
  CLI::App app{"attn: attention mechanisms (https://github.com/attn)", "attn"};
  app.require_subcommand(1);
  int exit_code = 0;
  attn::cli::add_conformance(app, exit_code);
  attn::cli::add_run(app, exit_code);
  attn::cli::add_bench(app, exit_code);
  attn::cli::add_tokenize(app, exit_code);
  attn::cli::add_embed(app, exit_code);
  return attn::cli::run_app(app, exit_code, argc, argv);
}

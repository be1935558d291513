// tools/attn/cmd_tokenize.cc — `attn tokenize`: the BERT WordPiece tokenizer of a model folder
// (or a tokenizer.json / vocab.txt) over one text per line, or over --text.
//   attn tokenize --model DIR --input lines.txt --out ids.txt   one line of ids per input line
//   attn tokenize --model DIR --text "Hello, world!"            prints the pieces and the ids
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "attn/error.h"
#include "attn/models/wordpiece.h"
#include "cli.h"
#include "model_dir.h"

namespace attn::cli {

void add_tokenize(CLI::App& app, int& exit_code) {
  auto* s = app.add_subcommand("tokenize", "BERT WordPiece tokenization (a model folder's tokenizer.json)");
  struct args_t {
    std::string model, input, out, text;
    std::int64_t max_length = 0;
  };
  auto a = std::make_shared<args_t>();
  s->add_option("--model", a->model, "model folder (with tokenizer.json or vocab.txt), or the file itself");
  s->add_option("--input", a->input, "UTF-8 text, one input per line ('\\n' separates lines)");
  s->add_option("--out", a->out, "write the ids of each line as one line of numbers");
  s->add_option("--text", a->text, "tokenize this text and print the pieces and ids");
  s->add_option("--max-length", a->max_length, "truncate to this many ids ([CLS] and [SEP] included; 0: no limit)");
  s->callback([a, &exit_code] {
    if (a->input.empty() == a->text.empty()) throw error("attn tokenize: give --input or --text (one of them)");
    if (!a->input.empty() && a->out.empty()) throw error("attn tokenize: --input needs --out");
    const std::string dir = find_model_dir(a->model);
    const std::string file = std::filesystem::is_directory(dir)
                                 ? (std::filesystem::exists(dir + "/tokenizer.json") ? dir + "/tokenizer.json"
                                                                                       : dir + "/vocab.txt")
                                 : dir;
    const models::wordpiece_tokenizer tok = models::wordpiece_tokenizer::from_file(file);
    if (!a->text.empty()) {
      std::string pieces;
      for (const std::string& p : tok.tokenize(a->text)) pieces += (pieces.empty() ? "" : " ") + p;
      fmt::print("pieces: {}\nids: {}\n", pieces, fmt::join(tok.encode(a->text, a->max_length), " "));
      exit_code = 0;
      return;
    }
    std::ifstream in(a->input, std::ios::binary);
    if (!in) throw error(fmt::format("attn tokenize: cannot open {}", a->input));
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string all = ss.str();
    std::ofstream out(a->out, std::ios::binary);
    if (!out) throw error(fmt::format("attn tokenize: cannot write {}", a->out));
    std::size_t start = 0, line = 1;
    while (start <= all.size()) {
      std::size_t end = all.find('\n', start);
      if (end == std::string::npos) end = all.size();
      if (end == all.size() && start == all.size() && line > 1) break;  // no line after a final '\n'
      try {
        out << fmt::format("{}\n", fmt::join(tok.encode(std::string_view(all).substr(start, end - start), a->max_length), " "));
      } catch (const error& e) {
        throw error(fmt::format("attn tokenize: {} line {}: {}", a->input, line, e.what()));
      }
      start = end + 1, ++line;
    }
    out.flush();
    if (!out) throw error(fmt::format("attn tokenize: writing {} failed", a->out));
    exit_code = 0;
  });
}

}  // namespace attn::cli

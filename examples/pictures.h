// examples/pictures.h — where the examples write their PNG pictures (attn::viz): into the folder
// given as the argument after the example's budget and threshold, else the current folder. The
// ctests run in the build folder (build/release/examples), so they leave the source tree clean.
//
//   const pictures png(argc, argv, 3);
//   png.heatmap("alignment.png", weights, rows, cols, {.title = "..."});   // prints "wrote ./alignment.png"
#pragma once

#include <attn/viz.h>

#include <cstdio>
#include <string>
#include <vector>

struct pictures {
  std::string dir;

  pictures(int argc, char** argv, int index) : dir(argc > index ? argv[index] : ".") {}

  std::string path(const std::string& file) const { return dir + "/" + file; }

  void heatmap(const std::string& file, const attn::TensorView& weights, const std::vector<std::string>& rows,
               const std::vector<std::string>& cols, const attn::viz::heatmap_options& opt) const {
    attn::viz::write_heatmap(path(file), weights, rows, cols, opt);
    std::printf("wrote %s\n", path(file).c_str());
  }
  void plot(const std::string& file, const std::vector<attn::viz::series>& data, const attn::viz::plot_options& opt) const {
    attn::viz::write_plot(path(file), data, opt);
    std::printf("wrote %s\n", path(file).c_str());
  }
};

// One label a character: the axis of a character-level model.
inline std::vector<std::string> char_labels(const std::string& s) {
  std::vector<std::string> out;
  for (char c : s) out.emplace_back(1, c);
  return out;
}

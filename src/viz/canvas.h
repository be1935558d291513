// src/viz/canvas.h — what the heatmap and the plot draw on: an RGB picture in memory, filled
// rectangles, lines, text in a built-in 5×8 ASCII font, and the PNG writer (libpng).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attn/viz.h"

namespace attn::viz::detail {

// Glyphs are 5 columns × 8 rows (the last row for descenders); text advances 6 px a character
// and a line of text takes kLineH px, the gap included.
constexpr int kGlyphW = 5, kGlyphH = 8, kAdvance = 6, kLineH = 10;
constexpr rgb kWhite{255, 255, 255}, kBlack{0, 0, 0}, kGrey{160, 160, 160};

struct canvas {
  int width = 0, height = 0;
  std::vector<std::uint8_t> px;  // [height, width, 3] RGB, rows top to bottom

  canvas(int w, int h, rgb background);
  // Everything outside the picture is clipped.
  void set(int x, int y, rgb c);
  void fill(int x, int y, int w, int h, rgb c);
  void line(int x0, int y0, int x1, int y1, rgb c);
  rgb at(int x, int y) const;
};

// Pixels a text of n characters spans along its line.
inline int text_width(std::size_t n) { return n ? int(n) * kAdvance - 1 : 0; }
// s cut to at most max_chars characters, the last one replaced by '~' when cut.
std::string fit(std::string_view s, std::size_t max_chars);
// Text with its top-left corner at (x, y), left to right. Characters outside ' '..'~' draw as '?'.
void draw_text(canvas& c, int x, int y, std::string_view s, rgb colour);
// Text turned 90° counter-clockwise, read bottom to top: its first character starts at row y
// (the text's bottom end), the glyphs' tops face left at column x.
void draw_text_up(canvas& c, int x, int y, std::string_view s, rgb colour);

// Writes the picture as an 8-bit RGB PNG; `op` names the caller in the attn::error thrown when
// the path cannot be written.
void write_png(const canvas& c, const std::string& path, const char* op);

}  // namespace attn::viz::detail

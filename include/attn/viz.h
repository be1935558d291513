// attn/viz.h — pictures of attention: a heatmap of a weight matrix and a simple x–y plot,
// written as PNG files (libpng). Library attn::viz (src/viz), apart from the core library so
// that attn itself needs no image library.
//
//   weights [Nq, Nk]   rows = queries, columns = keys; f32, f64, f16, bf16 (bool, int64 too),
//                      any strides (a slice of a [B, Hq, Nq, Nk] probability tensor as it is)
//
//   o.return_qk = attn::qk_output::probabilities;
//   attn::Tensor p = attn::attention(q, k, v, o).qk;               // [B, Hq, Nq, Nk]
//   attn::TensorView one = attn::viz::matrix_of(p, 0, 1);          // batch 0, head 1: [Nq, Nk]
//   attn::viz::write_heatmap("head1.png", one, {"the", "cat", "sat"}, {"the", "cat", "sat"},
//                            {.title = "layer 0 head 1", .range = attn::viz::value_range::unit});
//
// The picture, top to bottom: the title, the column labels (written upwards), then the row
// labels at the left of the cells and a colour bar with its max (top) and min (bottom) at the
// right. Colours follow viridis (dark purple → yellow: lightness grows with the value, also in
// grey print); NaN cells are magenta, +inf and −inf take the top and bottom colours. Each cell
// is a square of 32 px for small matrices, shrinking to 1 px as the larger side reaches 512,
// so a 512 × 512 map is 512 px wide. Labels use a built-in 5×8 ASCII font; a label longer than
// max_label_chars (24) is cut (its last character becomes '~'), and where cells are narrower
// than a line of text only every k-th label is drawn, so labels never overlap.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attn/tensor.h"

namespace attn::viz {

struct rgb {
  std::uint8_t r = 0, g = 0, b = 0;
  bool operator==(const rgb&) const = default;
};

// The colour scale at t in [0, 1] (clamped): viridis, interpolated between nine control points.
// colour_at(0) is the bottom colour (min), colour_at(1) the top (max).
rgb colour_at(double t);
// The colour of NaN cells: magenta, which viridis never reaches.
inline constexpr rgb nan_colour{255, 0, 255};

enum class value_range {
  automatic,  // [min, max] of the finite cells (a constant matrix: every cell the middle colour)
  unit,       // fixed [0, 1]: probabilities, comparable across pictures; values outside clamp
};

struct heatmap_options {
  std::string title{};  // drawn above the map ("" for none); cut to the picture's width
  value_range range = value_range::automatic;
  std::size_t max_label_chars = 24;  // longer labels are cut; 1 .. 256
};

// Where everything lands in the picture, in pixels (x right, y down from the top-left corner).
// write_heatmap draws with exactly this layout; tests and callers can find cells with it.
struct heatmap_layout {
  int width = 0, height = 0;          // the picture
  int cell = 0;                       // side of one square cell
  int map_x = 0, map_y = 0;           // top-left corner of cell (0, 0); cell (i, j) at
                                      // (map_x + j·cell, map_y + i·cell)
  int row_label_x = 0, row_label_w = 0;  // the row labels' column: [row_label_x, +w) × the map's rows
  int col_label_y = 0, col_label_h = 0;  // the column labels' band: the map's columns × [col_label_y, +h)
  int row_label_step = 1, col_label_step = 1;  // every k-th label is drawn (k > 1 where cells are small)
  int bar_x = 0, bar_y = 0, bar_w = 0, bar_h = 0;  // colour bar: top row the max colour, bottom the min
};

// The layout of a rows × cols heatmap with these labels (empty: none) and options; rows and
// cols in 1 .. 4096 (else attn::error).
heatmap_layout layout_heatmap(std::int64_t rows, std::int64_t cols, const std::vector<std::string>& row_labels,
                              const std::vector<std::string>& col_labels, const heatmap_options& opt = {});

// Writes weights [rows, cols] as a PNG heatmap. row_labels has rows entries or none, col_labels
// cols entries or none. Throws attn::error naming the function, the argument and its value: a
// weights tensor that is not 2-D, is empty, or has a side over 4096; a label count that differs
// from the rows/cols; a path that cannot be written (with the system's reason).
void write_heatmap(const std::string& path, const TensorView& weights, const std::vector<std::string>& row_labels = {},
                   const std::vector<std::string>& col_labels = {}, const heatmap_options& opt = {});

// The [Nq, Nk] matrix of batch b, head h of a [B, H, Nq, Nk] tensor (a view, no copy); throws
// attn::error when t is not 4-D or b, h are out of range.
TensorView matrix_of(const TensorView& t, std::int64_t b, std::int64_t h);

// ---- a simple x–y plot ----

struct series {
  std::string name;             // in the legend
  std::vector<double> x, y;     // equal lengths
  rgb colour{};
  bool line = true;             // joined by straight lines (in x order as given), else dots
};

struct plot_options {
  std::string title{};
  int width = 480, height = 320;  // the picture, 160 .. 4096 each
};

// Writes the series as a PNG plot: axes spanning every finite point, min/max of each axis
// written at its ends, a legend with each series' name in its colour. Throws attn::error on no
// series, x/y of different lengths, a size out of range, or a path that cannot be written.
void write_plot(const std::string& path, const std::vector<series>& data, const plot_options& opt = {});

}  // namespace attn::viz

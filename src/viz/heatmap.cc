// src/viz/heatmap.cc — write_heatmap: a weight matrix as a PNG of coloured cells with labels
// and a colour bar (include/attn/viz.h). The layout is computed once (layout_heatmap) and the
// drawing follows it, so tests can find every cell.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include "core/common.h"
#include "viz/canvas.h"

namespace attn::viz {
namespace {

using detail::kAdvance;
using detail::kLineH;

constexpr int kMargin = 6;            // around everything
constexpr int kGap = 4;               // between labels and the map
constexpr int kMaxCell = 32, kMapTarget = 512;  // a cell is 512 / max(rows, cols) px, within [1, 32]
constexpr std::int64_t kMaxSide = 4096;         // cells a side at most (a 4096 px map at 1 px a cell)
constexpr std::size_t kMaxLabelLimit = 256;  // of heatmap_options::max_label_chars
constexpr std::size_t kValueChars = 10;         // "-1.23e-100": the colour bar's min and max
constexpr int kBarGap = 10, kBarW = 12, kBarMinH = 64;

// matplotlib's viridis at t = 0, 1/8, ..., 1.
constexpr std::array<rgb, 9> kViridis = {{{68, 1, 84},
                                          {71, 45, 123},
                                          {59, 82, 139},
                                          {44, 114, 142},
                                          {33, 145, 140},
                                          {40, 174, 128},
                                          {94, 201, 98},
                                          {173, 220, 48},
                                          {253, 231, 37}}};

std::size_t longest(const std::vector<std::string>& labels, std::size_t max_chars) {
  std::size_t n = 0;
  for (const std::string& s : labels) n = std::max(n, std::min(s.size(), max_chars));
  return n;
}

// Every k-th label so that drawn labels are at least a line of text apart.
int label_step(int cell) { return (kLineH + cell - 1) / cell; }

std::string value_text(double v) { return detail::fit(fmt::format("{:.3g}", v), kValueChars); }

}  // namespace

rgb colour_at(double t) {
  if (!(t > 0)) return kViridis.front();  // NaN too: callers colour NaN themselves
  if (t >= 1) return kViridis.back();
  const double pos = t * double(kViridis.size() - 1);
  const std::size_t i = std::size_t(pos);
  const double f = pos - double(i);
  const rgb a = kViridis[i], b = kViridis[i + 1];
  auto mix = [f](std::uint8_t x, std::uint8_t y) { return std::uint8_t(std::lround(x + (y - x) * f)); };
  return {mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)};
}

heatmap_layout layout_heatmap(std::int64_t rows, std::int64_t cols, const std::vector<std::string>& row_labels,
                              const std::vector<std::string>& col_labels, const heatmap_options& opt) {
  if (rows < 1 || cols < 1 || rows > kMaxSide || cols > kMaxSide)
    attn::detail::fail("layout_heatmap", fmt::format("rows {} and cols {} must each be in 1 .. {}", rows, cols, kMaxSide));
  heatmap_layout l;
  l.cell = int(std::clamp<std::int64_t>(kMapTarget / std::max<std::int64_t>({rows, cols, 1}), 1, kMaxCell));
  l.row_label_step = label_step(l.cell);
  l.col_label_step = l.row_label_step;
  l.row_label_w = detail::text_width(longest(row_labels, opt.max_label_chars));
  l.col_label_h = detail::text_width(longest(col_labels, opt.max_label_chars));
  const int title_h = opt.title.empty() ? 0 : kLineH + kGap;
  l.row_label_x = kMargin;
  l.map_x = kMargin + (l.row_label_w ? l.row_label_w + kGap : 0);
  l.col_label_y = kMargin + title_h;
  l.map_y = l.col_label_y + (l.col_label_h ? l.col_label_h + kGap : 0);
  const int map_w = int(cols) * l.cell, map_h = int(rows) * l.cell;
  l.bar_x = l.map_x + map_w + kBarGap;
  l.bar_y = l.map_y;
  l.bar_w = kBarW;
  l.bar_h = std::max(map_h, kBarMinH);
  l.width = l.bar_x + l.bar_w + kGap + detail::text_width(kValueChars) + kMargin;
  l.height = l.map_y + l.bar_h + kMargin;
  return l;
}

TensorView matrix_of(const TensorView& t, std::int64_t b, std::int64_t h) {
  if (t.rank() != 4)
    attn::detail::fail("matrix_of", fmt::format("t has {} dims {}, expected 4 (B, H, Nq, Nk)", t.rank(), shape_str(t.shape())));
  if (b < 0 || b >= t.size(0) || h < 0 || h >= t.size(1))
    attn::detail::fail("matrix_of", fmt::format("batch {} head {} is outside t {} (batch < {}, head < {})", b, h,
                                          shape_str(t.shape()), t.size(0), t.size(1)));
  const std::int64_t at[4] = {b, h, 0, 0};
  auto* base = static_cast<std::byte*>(t.data()) + t.offset_of(at) * std::int64_t(dtype_size(t.type()));
  return TensorView(base, t.type(), {t.size(2), t.size(3)}, {t.stride(2), t.stride(3)});
}

void write_heatmap(const std::string& path, const TensorView& weights, const std::vector<std::string>& row_labels,
                   const std::vector<std::string>& col_labels, const heatmap_options& opt) {
  constexpr const char* op = "write_heatmap";
  if (weights.rank() != 2)
    attn::detail::fail(op, fmt::format("weights has {} dims {}, expected 2 (rows = queries, cols = keys)", weights.rank(),
                                 shape_str(weights.shape())));
  const std::int64_t rows = weights.size(0), cols = weights.size(1);
  if (rows == 0 || cols == 0) attn::detail::fail(op, fmt::format("weights {} has no cells", shape_str(weights.shape())));
  if (!weights.defined()) attn::detail::fail(op, fmt::format("weights {} has no data", shape_str(weights.shape())));
  if (rows > kMaxSide || cols > kMaxSide)
    attn::detail::fail(op, fmt::format("weights {} has a side over {} cells; slice or pool it first", shape_str(weights.shape()),
                                 kMaxSide));
  if (!row_labels.empty() && std::int64_t(row_labels.size()) != rows)
    attn::detail::fail(op, fmt::format("row_labels has {} entries but weights {} has {} rows", row_labels.size(),
                                 shape_str(weights.shape()), rows));
  if (!col_labels.empty() && std::int64_t(col_labels.size()) != cols)
    attn::detail::fail(op, fmt::format("col_labels has {} entries but weights {} has {} cols", col_labels.size(),
                                 shape_str(weights.shape()), cols));
  if (opt.max_label_chars < 1 || opt.max_label_chars > kMaxLabelLimit)
    attn::detail::fail(op, fmt::format("opt.max_label_chars is {}, expected 1 .. {}", opt.max_label_chars, kMaxLabelLimit));

  // Pass 1: the values as float64 and their range.
  std::vector<double> v(std::size_t(rows * cols));
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j) {
      const std::int64_t at[2] = {i, j};
      const double x = load_as_double(weights.data(), weights.type(), weights.offset_of(at));
      v[std::size_t(i * cols + j)] = x;
      if (std::isfinite(x)) lo = std::min(lo, x), hi = std::max(hi, x);
    }
  if (opt.range == value_range::unit || lo > hi) lo = 0, hi = 1;  // lo > hi: no finite cell
  // A constant matrix has no scale: every finite cell takes the middle colour.
  auto colour = [&](double x) {
    if (std::isnan(x)) return nan_colour;
    if (std::isinf(x)) return colour_at(x > 0 ? 1.0 : 0.0);
    return colour_at(hi > lo ? (x - lo) / (hi - lo) : 0.5);
  };

  // Pass 2: draw the title, the cells, the labels and the colour bar where the layout puts them.
  const heatmap_layout l = layout_heatmap(rows, cols, row_labels, col_labels, opt);
  detail::canvas c(l.width, l.height, detail::kWhite);
  const int max_title = std::max(0, (l.width - 2 * kMargin + 1) / kAdvance);
  if (!opt.title.empty()) detail::draw_text(c, kMargin, kMargin, detail::fit(opt.title, std::size_t(max_title)), detail::kBlack);
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      c.fill(l.map_x + int(j) * l.cell, l.map_y + int(i) * l.cell, l.cell, l.cell, colour(v[std::size_t(i * cols + j)]));
  // Row labels end at the map, centred on their row; column labels read upwards from the map.
  for (std::int64_t i = 0; i < std::int64_t(row_labels.size()); i += l.row_label_step) {
    const std::string s = detail::fit(row_labels[std::size_t(i)], opt.max_label_chars);
    const int y = l.map_y + int(i) * l.cell + l.cell / 2 - detail::kGlyphH / 2;
    detail::draw_text(c, l.row_label_x + l.row_label_w - detail::text_width(s.size()), y, s, detail::kBlack);
  }
  for (std::int64_t j = 0; j < std::int64_t(col_labels.size()); j += l.col_label_step) {
    const std::string s = detail::fit(col_labels[std::size_t(j)], opt.max_label_chars);
    const int x = l.map_x + int(j) * l.cell + l.cell / 2 - detail::kGlyphH / 2;
    detail::draw_text_up(c, x, l.col_label_y + l.col_label_h - 1, s, detail::kBlack);
  }
  for (int y = 0; y < l.bar_h; ++y)
    c.fill(l.bar_x, l.bar_y + y, l.bar_w, 1, colour_at(l.bar_h > 1 ? 1.0 - double(y) / double(l.bar_h - 1) : 1.0));
  const int text_x = l.bar_x + l.bar_w + kGap;
  detail::draw_text(c, text_x, l.bar_y, value_text(hi), detail::kBlack);
  detail::draw_text(c, text_x, l.bar_y + l.bar_h - detail::kGlyphH, value_text(lo), detail::kBlack);
  detail::write_png(c, path, op);
}

}  // namespace attn::viz

// tests/viz/viz_test.cc — attn::viz: heatmaps and plots are written, decoded again with libpng
// and checked by their pixels (size, the colours of the max, min and NaN cells, the colour bar,
// dark label pixels where labels go and nowhere else), and bad input is refused by message.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>

#include "attn/viz.h"
#include "test_util.h"
#include "viz/png_read.h"

namespace attn {
namespace {
namespace fs = std::filesystem;
using testing::read_png;

std::string scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / "attn_viz_test";
  fs::create_directories(d);
  return (d / name).string();
}

// The colour at the centre of cell (i, j).
viz::rgb cell(const testing::decoded_png& p, const viz::heatmap_layout& l, int i, int j) {
  return p.at(l.map_x + j * l.cell + l.cell / 2, l.map_y + i * l.cell + l.cell / 2);
}

const double kNaN = std::numeric_limits<double>::quiet_NaN();

TEST(Viz, ColourScaleRunsDarkToLightAndNeverReachesTheNanColour) {
  EXPECT_EQ(viz::colour_at(0), (viz::rgb{68, 1, 84}));
  EXPECT_EQ(viz::colour_at(1), (viz::rgb{253, 231, 37}));
  EXPECT_EQ(viz::colour_at(-3), viz::colour_at(0));
  EXPECT_EQ(viz::colour_at(7), viz::colour_at(1));
  // Perceptually ordered: the luma (Rec. 601) grows along the scale.
  double prev = -1;
  for (int k = 0; k <= 64; ++k) {
    const viz::rgb c = viz::colour_at(k / 64.0);
    const double luma = 0.299 * c.r + 0.587 * c.g + 0.114 * c.b;
    EXPECT_GT(luma, prev) << "at t = " << k / 64.0;
    prev = luma;
    EXPECT_NE(c, viz::nan_colour);
  }
}

// A 3 × 4 f32 matrix: max at (0, 1), min at (1, 2), NaN at (2, 3), labelled.
TEST(Viz, HeatmapCellsTakeTheScaleEndsAndNaNItsColour) {
  const Tensor w = Tensor::from_values({3, 4}, dtype::f32, {0.1, 0.9, 0.3, 0.4, 0.5, 0.6, -0.2, 0.3, 0.2, 0.4, 0.5, kNaN});
  const std::vector<std::string> rows = {"the", "cat", "sat"}, cols = {"a", "b", "c", "d"};
  const std::string path = scratch("small.png");
  viz::write_heatmap(path, w, rows, cols, {.title = "three queries"});
  const viz::heatmap_layout l = viz::layout_heatmap(3, 4, rows, cols, {.title = "three queries"});
  const auto p = read_png(path);
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.width, l.width);
  EXPECT_EQ(p.height, l.height);
  EXPECT_EQ(l.cell, 32);  // small matrices get the largest cells
  EXPECT_EQ(cell(p, l, 0, 1), viz::colour_at(1));
  EXPECT_EQ(cell(p, l, 1, 2), viz::colour_at(0));
  EXPECT_EQ(cell(p, l, 2, 3), viz::nan_colour);
  EXPECT_EQ(cell(p, l, 1, 0), viz::colour_at((0.5 + 0.2) / 1.1));
  // The colour bar: max colour on top, min at the bottom, its values written beside it.
  EXPECT_EQ(p.at(l.bar_x + l.bar_w / 2, l.bar_y), viz::colour_at(1));
  EXPECT_EQ(p.at(l.bar_x + l.bar_w / 2, l.bar_y + l.bar_h - 1), viz::colour_at(0));
  EXPECT_GT(p.dark_pixels(l.bar_x + l.bar_w, l.bar_y, p.width - l.bar_x - l.bar_w, 10), 0);
  // Labels leave dark pixels in their areas; the title above them.
  EXPECT_GT(l.row_label_w, 0);
  EXPECT_GT(l.col_label_h, 0);
  for (int i = 0; i < 3; ++i) EXPECT_GT(p.dark_pixels(l.row_label_x, l.map_y + i * l.cell, l.row_label_w, l.cell), 5) << i;
  for (int j = 0; j < 4; ++j) EXPECT_GT(p.dark_pixels(l.map_x + j * l.cell, l.col_label_y, l.cell, l.col_label_h), 5) << j;
  EXPECT_GT(p.dark_pixels(0, 0, p.width, l.col_label_y), 20);
}

TEST(Viz, HeatmapWithoutLabelsHasNoLabelAreas) {
  const Tensor w = Tensor::from_values({2, 2}, dtype::f64, {0, 1, 2, 3});
  const std::string path = scratch("nolabels.png");
  viz::write_heatmap(path, w);
  const viz::heatmap_layout l = viz::layout_heatmap(2, 2, {}, {});
  EXPECT_EQ(l.row_label_w, 0);
  EXPECT_EQ(l.col_label_h, 0);
  const auto p = read_png(path);
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.dark_pixels(0, 0, l.map_x, p.height), 0);  // nothing left of the map
  EXPECT_EQ(p.dark_pixels(0, 0, p.width, l.map_y), 0);   // nor above it
  EXPECT_EQ(cell(p, l, 1, 1), viz::colour_at(1));
  EXPECT_EQ(cell(p, l, 0, 0), viz::colour_at(0));
}

TEST(Viz, HeatmapReadsEveryDtypeAndStridedViews) {
  for (dtype t : {dtype::f32, dtype::f64, dtype::f16, dtype::bf16}) {
    const Tensor w = Tensor::from_values({2, 3}, t, {0.25, 0.5, 0.75, 1.0, 0.0, 0.5});
    const TensorView wt = w.view().transpose(0, 1);  // [3, 2], strides (1, 3)
    const std::string path = scratch("dtype.png");
    viz::write_heatmap(path, wt);
    const viz::heatmap_layout l = viz::layout_heatmap(3, 2, {}, {});
    const auto p = read_png(path);
    ASSERT_TRUE(p.error.empty()) << p.error;
    EXPECT_EQ(cell(p, l, 0, 1), viz::colour_at(1)) << dtype_name(t);  // w[1, 0] = 1
    EXPECT_EQ(cell(p, l, 1, 1), viz::colour_at(0)) << dtype_name(t);  // w[1, 1] = 0
    EXPECT_EQ(cell(p, l, 2, 0), viz::colour_at(0.75)) << dtype_name(t);
  }  // A bool matrix (an adjacency): true cells on top, false at the bottom; int64 likewise.
  for (dtype t : {dtype::boolean, dtype::i64}) {
    const std::string path = scratch("bool.png");
    viz::write_heatmap(path, Tensor::from_values({1, 2}, t, {1, 0}));
    const viz::heatmap_layout l = viz::layout_heatmap(1, 2, {}, {});
    const auto p = read_png(path);
    EXPECT_EQ(cell(p, l, 0, 0), viz::colour_at(1)) << dtype_name(t);
    EXPECT_EQ(cell(p, l, 0, 1), viz::colour_at(0)) << dtype_name(t);
  }
}

TEST(Viz, UnitRangeKeepsValuesWhereTheyAreOnZeroToOne) {
  const Tensor w = Tensor::from_values({1, 3}, dtype::f32, {0.25, 0.5, 2.0});
  const std::string path = scratch("unit.png");
  viz::write_heatmap(path, w, {}, {}, {.range = viz::value_range::unit});
  const viz::heatmap_layout l = viz::layout_heatmap(1, 3, {}, {});
  auto p = read_png(path);
  EXPECT_EQ(cell(p, l, 0, 0), viz::colour_at(0.25));
  EXPECT_EQ(cell(p, l, 0, 1), viz::colour_at(0.5));
  EXPECT_EQ(cell(p, l, 0, 2), viz::colour_at(1));  // clamped
  viz::write_heatmap(path, w);                      // automatic: 0.25 is the bottom
  p = read_png(path);
  EXPECT_EQ(cell(p, l, 0, 0), viz::colour_at(0));
  EXPECT_EQ(cell(p, l, 0, 1), viz::colour_at(0.25 / 1.75));
}

TEST(Viz, ConstantAndInfiniteCells) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor w = Tensor::from_values({1, 4}, dtype::f64, {3, 3, inf, -inf});
  const std::string path = scratch("const.png");
  viz::write_heatmap(path, w);
  const viz::heatmap_layout l = viz::layout_heatmap(1, 4, {}, {});
  const auto p = read_png(path);
  EXPECT_EQ(cell(p, l, 0, 0), viz::colour_at(0.5));  // no spread: the middle colour
  EXPECT_EQ(cell(p, l, 0, 2), viz::colour_at(1));
  EXPECT_EQ(cell(p, l, 0, 3), viz::colour_at(0));
}

TEST(Viz, BigMatricesStayASaneSizeAndTheirLabelsDoNotOverlap) {
  std::mt19937 rng(1);
  const Tensor w = testing::random_tensor({512, 512}, dtype::f32, rng, 0, 1);
  std::vector<std::string> labels;
  for (int i = 0; i < 512; ++i) labels.push_back(fmt::format("k{}", i));
  const std::string path = scratch("big.png");
  viz::write_heatmap(path, w, labels, labels);
  const viz::heatmap_layout l = viz::layout_heatmap(512, 512, labels, labels);
  EXPECT_EQ(l.cell, 1);
  // Drawn labels are a line of text (10 px) apart.
  EXPECT_GE(l.row_label_step * l.cell, 10);
  EXPECT_GE(l.col_label_step * l.cell, 10);
  const auto p = read_png(path);
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.width, l.width);
  EXPECT_LT(p.width, 700);
  EXPECT_LT(p.height, 700);
  EXPECT_GT(p.dark_pixels(l.row_label_x, l.map_y, l.row_label_w, 512), 100);
  EXPECT_GT(p.dark_pixels(l.map_x, l.col_label_y, 512, l.col_label_h), 100);
  // 16 × 16 cells: 32 px each; 100 × 3: 5 px, every second label.
  EXPECT_EQ(viz::layout_heatmap(16, 16, {}, {}).cell, 32);
  EXPECT_EQ(viz::layout_heatmap(100, 3, {}, {}).cell, 5);
  EXPECT_EQ(viz::layout_heatmap(100, 3, {}, {}).row_label_step, 2);
}

TEST(Viz, LongLabelsAreCut) {
  const std::vector<std::string> rows = {std::string(100, 'x'), "y"};
  const viz::heatmap_layout l = viz::layout_heatmap(2, 2, rows, {});
  EXPECT_EQ(l.row_label_w, 24 * 6 - 1);
  const std::string path = scratch("long.png");
  viz::write_heatmap(path, Tensor::from_values({2, 2}, dtype::f32, {1, 2, 3, 4}), rows, {});
  const auto p = read_png(path);
  EXPECT_EQ(p.width, l.width);
  EXPECT_GT(p.dark_pixels(l.row_label_x, l.map_y, l.row_label_w, l.cell), 20);
  EXPECT_EQ(viz::layout_heatmap(2, 2, rows, {}, {.max_label_chars = 40}).row_label_w, 40 * 6 - 1);
  EXPECT_EQ(viz::layout_heatmap(2, 2, {"ab", "c"}, {}, {.max_label_chars = 40}).row_label_w, 2 * 6 - 1);
}

TEST(Viz, MatrixOfPicksOneBatchAndHead) {
  const Tensor p = Tensor::from_values({2, 3, 2, 2}, dtype::f32, std::vector<double>(24, 0.0));
  p.set({1, 2, 0, 1}, 5.0);
  const TensorView m = viz::matrix_of(p, 1, 2);
  EXPECT_EQ(m.shape(), (Shape{2, 2}));
  EXPECT_EQ(m.get({0, 1}), 5.0);
  EXPECT_THROW_MSG(viz::matrix_of(p, 2, 0), "matrix_of: batch 2 head 0 is outside t [2, 3, 2, 2] (batch < 2, head < 3)");
  EXPECT_THROW_MSG(viz::matrix_of(p, 0, -1), "matrix_of: batch 0 head -1 is outside");
  EXPECT_THROW_MSG(viz::matrix_of(Tensor::zeros({2, 2}, dtype::f32), 0, 0), "matrix_of: t has 2 dims [2, 2], expected 4");
}

TEST(Viz, HeatmapBadInputIsAnErrorNamingTheArgument) {
  const Tensor w = Tensor::zeros({3, 4}, dtype::f32);
  const std::string path = scratch("bad.png");
  EXPECT_THROW_MSG(viz::write_heatmap(path, Tensor::zeros({2, 3, 4}, dtype::f32)),
                   "write_heatmap: weights has 3 dims [2, 3, 4], expected 2 (rows = queries, cols = keys)");
  EXPECT_THROW_MSG(viz::write_heatmap(path, Tensor::zeros({0, 4}, dtype::f32)), "write_heatmap: weights [0, 4] has no cells");
  EXPECT_THROW_MSG(viz::write_heatmap(path, TensorView(nullptr, dtype::f32, {2, 2})), "write_heatmap: weights [2, 2] has no data");
  EXPECT_THROW_MSG(viz::write_heatmap(path, TensorView(w.data(), dtype::f32, {5000, 1}, {0, 0})),
                   "write_heatmap: weights [5000, 1] has a side over 4096 cells");
  EXPECT_THROW_MSG(viz::write_heatmap(path, w, {"a", "b"}), "write_heatmap: row_labels has 2 entries but weights [3, 4] has 3 rows");
  EXPECT_THROW_MSG(viz::write_heatmap(path, w, {}, {"a", "b", "c", "d", "e"}),
                   "write_heatmap: col_labels has 5 entries but weights [3, 4] has 4 cols");
  EXPECT_THROW_MSG(viz::layout_heatmap(0, 3, {}, {}), "layout_heatmap: rows 0 and cols 3 must each be in 1 .. 4096");
  EXPECT_THROW_MSG(viz::layout_heatmap(2, 5000, {}, {}), "layout_heatmap: rows 2 and cols 5000 must each be in 1 .. 4096");
  EXPECT_THROW_MSG(viz::write_heatmap(path, w, {}, {}, {.max_label_chars = 0}),
                   "write_heatmap: opt.max_label_chars is 0, expected 1 .. 256");
  EXPECT_THROW_MSG(viz::write_heatmap("/nonexistent-attn-dir/x.png", w),
                   "write_heatmap: path \"/nonexistent-attn-dir/x.png\" cannot be written: No such file or directory");
  EXPECT_THROW_MSG(viz::write_heatmap(fs::temp_directory_path().string(), w), "cannot be written: Is a directory");
}

TEST(Viz, PlotDrawsEachSeriesInItsColour) {
  std::vector<double> x, y;
  for (int i = 0; i <= 50; ++i) x.push_back(0.1 * i), y.push_back(std::sin(0.1 * i));
  const viz::rgb red{220, 40, 40}, blue{30, 90, 200};
  const std::string path = scratch("plot.png");
  viz::write_plot(path, {{"sin x", x, y, red, true}, {"points", {1, 2, 3}, {0, 0.5, -0.5}, blue, false}},
                  {.title = "a plot", .width = 400, .height = 300});
  const auto p = read_png(path);
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.width, 400);
  EXPECT_EQ(p.height, 300);
  int reds = 0, blues = 0;
  for (int yy = 0; yy < p.height; ++yy)
    for (int xx = 0; xx < p.width; ++xx) reds += p.at(xx, yy) == red, blues += p.at(xx, yy) == blue;
  EXPECT_GT(reds, 300);   // a line across the plot (and its legend bar)
  EXPECT_GE(blues, 3 * 9);  // three 3 × 3 dots
  EXPECT_GT(p.dark_pixels(0, 0, p.width, 12), 20);  // the title
}

TEST(Viz, PlotBadInputIsAnErrorNamingTheArgument) {
  const std::string path = scratch("badplot.png");
  EXPECT_THROW_MSG(viz::write_plot(path, {}), "write_plot: data has no series");
  EXPECT_THROW_MSG(viz::write_plot(path, {{"f", {1, 2}, {1}, {}, true}}), "write_plot: series 0 (\"f\") has 2 x and 1 y values");
  EXPECT_THROW_MSG(viz::write_plot(path, {{"f", {1}, {1}, {}, true}}, {.width = 10}),
                   "write_plot: size 10 x 320 is outside [160, 4096] px");
  EXPECT_THROW_MSG(viz::write_plot("/nonexistent-attn-dir/p.png", {{"f", {1}, {1}, {}, true}}),
                   "write_plot: path \"/nonexistent-attn-dir/p.png\" cannot be written");
}

}  // namespace
}  // namespace attn

// src/viz/plot.cc — write_plot: series of (x, y) points as lines or dots on one pair of axes,
// as a PNG (include/attn/viz.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/common.h"
#include "viz/canvas.h"

namespace attn::viz {
namespace {

constexpr int kMargin = 6, kMinSide = 160, kMaxSidePx = 4096;
constexpr std::size_t kTickChars = 9;

struct span {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  // A range with no finite point becomes [0, 1]; a single value v becomes [v − 1, v + 1].
  void settle() {
    if (lo > hi) lo = 0, hi = 1;
    if (lo == hi) lo -= 1, hi += 1;
  }
};

std::string tick(double v) { return detail::fit(fmt::format("{:.3g}", v), kTickChars); }

}  // namespace

void write_plot(const std::string& path, const std::vector<series>& data, const plot_options& opt) {
  constexpr const char* op = "write_plot";
  if (data.empty()) attn::detail::fail(op, "data has no series");
  for (std::size_t s = 0; s < data.size(); ++s)
    if (data[s].x.size() != data[s].y.size())
      attn::detail::fail(op, fmt::format("series {} (\"{}\") has {} x and {} y values", s, data[s].name, data[s].x.size(),
                                   data[s].y.size()));
  if (opt.width < kMinSide || opt.width > kMaxSidePx || opt.height < kMinSide || opt.height > kMaxSidePx)
    attn::detail::fail(op, fmt::format("size {} x {} is outside [{}, {}] px", opt.width, opt.height, kMinSide, kMaxSidePx));

  span xs, ys;
  for (const series& s : data) {
    for (double x : s.x) xs.add(x);
    for (double y : s.y) ys.add(y);
  }
  xs.settle(), ys.settle();

  // The plot area: y ticks at its left, x ticks below it, the title above.
  const int left = kMargin + detail::text_width(kTickChars) + 4;
  const int top = kMargin + (opt.title.empty() ? 0 : detail::kLineH + 4);
  const int right = opt.width - kMargin - 1, bottom = opt.height - kMargin - detail::kLineH - 4;
  auto px = [&](double x) { return left + int(std::lround((x - xs.lo) / (xs.hi - xs.lo) * (right - left))); };
  auto py = [&](double y) { return bottom - int(std::lround((y - ys.lo) / (ys.hi - ys.lo) * (bottom - top))); };

  detail::canvas c(opt.width, opt.height, detail::kWhite);
  if (!opt.title.empty())
    detail::draw_text(c, kMargin, kMargin, detail::fit(opt.title, std::size_t((opt.width - 2 * kMargin) / detail::kAdvance)),
                      detail::kBlack);
  c.line(left, top, left, bottom, detail::kBlack);
  c.line(left, bottom, right, bottom, detail::kBlack);
  const std::string y_hi = tick(ys.hi), y_lo = tick(ys.lo), x_lo = tick(xs.lo), x_hi = tick(xs.hi);
  detail::draw_text(c, left - 4 - detail::text_width(y_hi.size()), top, y_hi, detail::kBlack);
  detail::draw_text(c, left - 4 - detail::text_width(y_lo.size()), bottom - detail::kGlyphH, y_lo, detail::kBlack);
  detail::draw_text(c, left, bottom + 4, x_lo, detail::kBlack);
  detail::draw_text(c, right - detail::text_width(x_hi.size()), bottom + 4, x_hi, detail::kBlack);

  for (const series& s : data) {
    bool have_prev = false;
    int x0 = 0, y0 = 0;
    for (std::size_t i = 0; i < s.x.size(); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {  // a gap in the line
        have_prev = false;
        continue;
      }
      const int x1 = px(s.x[i]), y1 = py(s.y[i]);
      if (!s.line) c.fill(x1 - 1, y1 - 1, 3, 3, s.colour);
      if (s.line && have_prev) c.line(x0, y0, x1, y1, s.colour), c.line(x0, y0 + 1, x1, y1 + 1, s.colour);
      x0 = x1, y0 = y1, have_prev = true;
    }
  }
  // The legend, top right inside the axes: a short bar in each series' colour and its name.
  int ly = top + 2;
  for (const series& s : data) {
    const std::string name = detail::fit(s.name, 30);
    const int lx = right - 4 - detail::text_width(name.size()) - 16;
    c.fill(lx, ly + 3, 12, 3, s.colour);
    detail::draw_text(c, lx + 16, ly, name, detail::kBlack);
    ly += detail::kLineH;
  }
  detail::write_png(c, path, op);
}

}  // namespace attn::viz

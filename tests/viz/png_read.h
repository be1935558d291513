// tests/viz/png_read.h — decodes a PNG file with libpng (its simplified API) into 8-bit RGB, so
// the tests check the pictures attn::viz and `attn run --probs-png` write by their pixels.
#pragma once

#include <png.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "attn/viz.h"

namespace attn::testing {

struct decoded_png {
  int width = 0, height = 0;
  std::vector<std::uint8_t> px;  // [height, width, 3]
  std::string error;             // libpng's message when decoding failed

  viz::rgb at(int x, int y) const {
    const std::uint8_t* p = px.data() + (std::size_t(y) * std::size_t(width) + std::size_t(x)) * 3;
    return {p[0], p[1], p[2]};
  }
  // Pixels of [x, x + w) × [y, y + h) whose every channel is below 80 (text is black).
  int dark_pixels(int x, int y, int w, int h) const {
    int n = 0;
    for (int yy = y; yy < y + h; ++yy)
      for (int xx = x; xx < x + w; ++xx) {
        const viz::rgb c = at(xx, yy);
        n += c.r < 80 && c.g < 80 && c.b < 80;
      }
    return n;
  }
};

inline decoded_png read_png(const std::string& path) {
  decoded_png d;
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_file(&img, path.c_str())) {
    d.error = img.message;
    return d;
  }
  img.format = PNG_FORMAT_RGB;
  d.px.resize(PNG_IMAGE_SIZE(img));
  if (!png_image_finish_read(&img, nullptr, d.px.data(), 0, nullptr)) {
    d.error = img.message;
    png_image_free(&img);
    return d;
  }
  d.width = int(img.width), d.height = int(img.height);
  return d;
}

}  // namespace attn::testing

// src/core/npy.cc — NumPy .npy read/write. Format: magic "\x93NUMPY", major, minor, header
// length (u16 for 1.0, u32 for 2.0/3.0), a Python dict literal with 'descr', 'fortran_order'
// and 'shape', padded with spaces to a 64-byte boundary, then the raw data.
#include "attn/npy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <iterator>

#include "attn/error.h"
#include "core/common.h"

namespace attn {
namespace {

// "npy: <file>: <what>": the fronts' error helper with the file named after the op.
[[noreturn]] void fail(const std::string& file, const std::string& what) { detail::fail("npy", file + ": " + what); }

// Finds the value text after 'key': in the header dict.
std::string dict_value(const std::string& header, const std::string& key, const std::string& name) {
  const std::string pat = "'" + key + "'";
  auto p = header.find(pat);
  if (p == std::string::npos) fail(name, fmt::format("header has no '{}' entry", key));
  p = header.find(':', p + pat.size());
  if (p == std::string::npos) fail(name, fmt::format("header entry '{}' has no value", key));
  ++p;
  while (p < header.size() && std::isspace(static_cast<unsigned char>(header[p]))) ++p;
  if (p >= header.size()) fail(name, fmt::format("header entry '{}' has no value", key));
  std::size_t e = p;
  if (header[p] == '\'' || header[p] == '"') {
    e = header.find(header[p], p + 1);
    if (e == std::string::npos) fail(name, fmt::format("unterminated string for '{}'", key));
    return header.substr(p + 1, e - p - 1);
  }
  if (header[p] == '(') {
    e = header.find(')', p);
    if (e == std::string::npos) fail(name, "unterminated shape tuple");
    return header.substr(p, e - p + 1);
  }
  while (e < header.size() && header[e] != ',' && header[e] != '}') ++e;
  std::string v = header.substr(p, e - p);
  while (!v.empty() && std::isspace(static_cast<unsigned char>(v.back()))) v.pop_back();
  return v;
}

dtype parse_descr(const std::string& d, const std::string& name) {
  if (d == "<f4") return dtype::f32;
  if (d == "<f2") return dtype::f16;
  if (d == "<f8") return dtype::f64;
  if (d == "|b1") return dtype::boolean;
  if (d == "<i8") return dtype::i64;
  if (d == "|i1") return dtype::i8;
  if (d == "<i4") return dtype::i32;
  if (d.size() == 3 && d[0] == '>') fail(name, fmt::format("big-endian dtype '{}' is not supported", d));
  fail(name, fmt::format("unsupported dtype '{}' (supported: <f4 <f2 <f8 |b1 <i8 <i4 |i1)", d));
}

// A Python tuple of non-negative integers: "()", "(5,)", "(2, 3)". Elements are separated by
// commas; "(4   000, 3)" (digits split by spaces) is refused, as Python would.
Shape parse_shape(const std::string& s, const std::string& name) {
  auto bad = [&] { fail(name, fmt::format("bad shape '{}'", s)); };
  if (s.size() < 2 || s.front() != '(' || s.back() != ')') bad();
  auto space = [&](std::size_t p) { return std::isspace(static_cast<unsigned char>(s[p])) != 0; };
  auto digit = [&](std::size_t p) { return std::isdigit(static_cast<unsigned char>(s[p])) != 0; };
  const std::size_t end = s.size() - 1;  // the ')'
  Shape shape;
  std::size_t p = 1;
  while (p < end && space(p)) ++p;
  while (p < end) {
    if (!digit(p)) bad();
    std::int64_t v = 0;
    for (; p < end && digit(p); ++p) {
      if (v > (std::int64_t(1) << 40)) fail(name, fmt::format("shape '{}' is too large", s));
      v = v * 10 + (s[p] - '0');
    }
    shape.push_back(v);
    while (p < end && space(p)) ++p;
    if (p == end) break;
    if (s[p] != ',') bad();
    ++p;
    while (p < end && space(p)) ++p;
  }
  if (shape.size() > 16) fail(name, fmt::format("shape '{}' has more than 16 dims", s));
  return shape;
}

}  // namespace

Tensor parse_npy(const void* bytes, std::size_t size, const std::string& name) {
  const auto* b = static_cast<const unsigned char*>(bytes);
  if (size < 10 || std::memcmp(b, "\x93NUMPY", 6) != 0) fail(name, "not a .npy file (bad magic)");
  const int major = b[6];
  std::size_t hlen, hstart;
  if (major == 1) {
    hlen = std::size_t(b[8]) | (std::size_t(b[9]) << 8);
    hstart = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) fail(name, "truncated header");
    hlen = std::size_t(b[8]) | (std::size_t(b[9]) << 8) | (std::size_t(b[10]) << 16) | (std::size_t(b[11]) << 24);
    hstart = 12;
  } else {
    fail(name, fmt::format("unsupported format version {}.{}", major, int(b[7])));
  }
  if (hstart + hlen > size) fail(name, fmt::format("truncated header ({} bytes declared, {} in file)", hlen, size - hstart));
  const std::string header(reinterpret_cast<const char*>(b + hstart), hlen);
  if (header.find('{') == std::string::npos) fail(name, "header is not a dict");
  const dtype t = parse_descr(dict_value(header, "descr", name), name);
  const std::string fo = dict_value(header, "fortran_order", name);
  if (fo != "True" && fo != "False") fail(name, fmt::format("bad fortran_order '{}'", fo));
  const Shape shape = parse_shape(dict_value(header, "shape", name), name);

  // Elements, and the same product with zero sizes read as 1 (the strides of a view): both
  // bounded, so no stride computation can overflow, even for an empty array.
  std::int64_t n = 1, extent = 1;
  for (auto s : shape) {
    const std::int64_t s1 = std::max<std::int64_t>(s, 1);
    if (extent > (std::int64_t(1) << 48) / s1)
      fail(name, fmt::format("shape {} is too large (more than 2^48 elements)", shape_str(shape)));
    extent *= s1;
    n *= s;
  }
  const std::size_t data_bytes = std::size_t(n) * dtype_size(t);
  const std::size_t data_start = hstart + hlen;
  if (size - data_start < data_bytes)
    fail(name, fmt::format("truncated data: shape {} needs {} bytes, file has {}", shape_str(shape), data_bytes,
                           size - data_start));

  if (t == dtype::boolean)  // a C++ bool must hold 0 or 1
    for (std::size_t i = 0; i < data_bytes; ++i)
      if (b[data_start + i] > 1)
        fail(name, fmt::format("bool element {} is byte {}, expected 0 or 1", i, int(b[data_start + i])));
  if (fo == "False" || shape.size() < 2) {
    Tensor r = Tensor::empty(shape, t);
    std::memcpy(r.data(), b + data_start, data_bytes);
    return r;
  }
  // Fortran order: the data is the C-order layout of the reversed shape; view it transposed.
  Shape rev(shape.rbegin(), shape.rend());
  Tensor tmp = Tensor::empty(rev, t);
  std::memcpy(tmp.data(), b + data_start, data_bytes);
  std::vector<int> order(shape.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = int(order.size() - 1 - i);
  return Tensor::copy_of(tmp.view().permute(order));
}

Tensor read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open file");
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return parse_npy(bytes.data(), bytes.size(), path);
}

void write_npy(const std::string& path, const TensorView& t) {
  Tensor c = (t.type() == dtype::bf16) ? Tensor::copy_of(t, dtype::f32) : Tensor::copy_of(t);
  std::string descr;
  switch (c.type()) {
    case dtype::f32: descr = "<f4"; break;
    case dtype::f16: descr = "<f2"; break;
    case dtype::f64: descr = "<f8"; break;
    case dtype::boolean: descr = "|b1"; break;
    case dtype::i64: descr = "<i8"; break;
    case dtype::i8: descr = "|i1"; break;
    case dtype::i32: descr = "<i4"; break;
    case dtype::bf16: break;
  }
  // Python tuple syntax: "()", "(5,)", "(2, 3)".
  std::string shape = "(";
  for (int i = 0; i < c.rank(); ++i) shape += (i ? ", " : "") + std::to_string(c.shape()[i]);
  shape += c.rank() == 1 ? ",)" : ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape);
  const std::size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  std::ofstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open file for writing");
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(header.size() & 0xff),
                                 (unsigned char)(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(pre), 10);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(static_cast<const char*>(c.data()), std::streamsize(std::size_t(c.numel()) * dtype_size(c.type())));
  f.close();  // flushes: a full disk shows here, not in the destructor
  if (!f) fail(path, "write failed");
}

}  // namespace attn

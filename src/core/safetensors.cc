// src/core/safetensors.cc — safetensors read/write (see attn/safetensors.h).
#include "attn/safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "attn/error.h"

namespace attn {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw error(fmt::format("safetensors: {}: {}", path, what));
}

struct dtype_code {
  const char* code;
  dtype type;
};
constexpr dtype_code kCodes[] = {{"F32", dtype::f32}, {"F16", dtype::f16}, {"BF16", dtype::bf16},
                                 {"F64", dtype::f64}, {"I64", dtype::i64}, {"I32", dtype::i32}, {"I8", dtype::i8}, {"BOOL", dtype::boolean}};

const char* code_of(dtype t) {
  for (const auto& c : kCodes)
    if (c.type == t) return c.code;
  return "?";
}

}  // namespace

const Tensor& safetensors_file::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  fail(path, fmt::format("no tensor named '{}' ({} tensors in the file)", name, tensors.size()));
}

bool safetensors_file::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& p) { return p.first == name; });
}

safetensors_file read_safetensors(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail(path, "cannot open the file");
  f.seekg(0, std::ios::end);
  const auto size = static_cast<std::uint64_t>(f.tellg());
  f.seekg(0);
  if (size < 8) fail(path, fmt::format("the file has {} bytes; a header length needs 8", size));
  unsigned char len8[8];
  f.read(reinterpret_cast<char*>(len8), 8);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];
  if (n > size - 8 || n > (std::uint64_t(100) << 20))
    fail(path, fmt::format("header length {} does not fit a file of {} bytes (or exceeds 100 MiB)", n, size));
  std::string header(std::size_t(n), '\0');
  f.read(header.data(), std::streamsize(n));
  if (!f) fail(path, "the header is cut off");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const std::exception& e) {
    fail(path, fmt::format("the header is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) fail(path, "the header is not a JSON object");

  struct entry {
    std::string name;
    dtype type;
    Shape shape;
    std::uint64_t begin, end;
  };
  std::vector<entry> entries;
  safetensors_file out;
  out.path = path;
  const std::uint64_t data_size = size - 8 - n;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it.value().is_object()) fail(path, "__metadata__ is not an object");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        if (!m.value().is_string()) fail(path, fmt::format("metadata '{}' is not a string", m.key()));
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string& name = it.key();
    const auto& v = it.value();
    try {
      entry e{name, dtype::f32, {}, 0, 0};
      const std::string code = v.at("dtype").get<std::string>();
      bool known = false;
      for (const auto& c : kCodes)
        if (code == c.code) e.type = c.type, known = true;
      if (!known) fail(path, fmt::format("tensor '{}' has dtype {}, which attn does not read (F32, F16, BF16, F64, I64, BOOL)", name, code));
      std::uint64_t count = 1;
      for (const auto& d : v.at("shape")) {
        const std::int64_t s = d.get<std::int64_t>();
        if (s < 0) fail(path, fmt::format("tensor '{}' has a negative dim {}", name, s));
        if (s && count > (std::uint64_t(1) << 62) / std::uint64_t(s)) fail(path, fmt::format("tensor '{}' is too large", name));
        count *= std::uint64_t(s);
        e.shape.push_back(s);
      }
      const auto& off = v.at("data_offsets");
      if (!off.is_array() || off.size() != 2) fail(path, fmt::format("tensor '{}': data_offsets must be [begin, end]", name));
      e.begin = off[0].get<std::uint64_t>(), e.end = off[1].get<std::uint64_t>();
      if (e.begin > e.end || e.end > data_size)
        fail(path, fmt::format("tensor '{}': bytes [{}, {}) are outside the {} bytes of data", name, e.begin, e.end, data_size));
      if (e.end - e.begin != count * dtype_size(e.type))
        fail(path, fmt::format("tensor '{}': {} bytes for shape {} of {} ({} expected)", name, e.end - e.begin,
                               shape_str(e.shape), code, count * dtype_size(e.type)));
      entries.push_back(std::move(e));
    } catch (const nlohmann::json::exception& ex) {
      fail(path, fmt::format("tensor '{}': {}", name, ex.what()));
    }
  }
  // The ranges tile the data exactly: no overlap, no gap (as the format requires).
  std::vector<const entry*> by_offset;
  for (const entry& e : entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(), [](const entry* a, const entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  std::uint64_t at = 0;
  for (const entry* e : by_offset) {
    if (e->begin != at)
      fail(path, fmt::format("tensor '{}' starts at byte {} but the previous one ends at {} (overlap or gap)", e->name,
                             e->begin, at));
    at = e->end;
  }
  if (at != data_size) fail(path, fmt::format("the tensors cover {} of the {} bytes of data", at, data_size));

  std::sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) { return a.begin < b.begin; });
  for (const entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.type);
    f.seekg(std::streamoff(8 + n + e.begin));
    f.read(static_cast<char*>(t.data()), std::streamsize(e.end - e.begin));
    if (!f) fail(path, fmt::format("tensor '{}': the data is cut off", e.name));
    if (e.type == dtype::boolean) {
      const auto* b = static_cast<const unsigned char*>(t.data());
      for (std::uint64_t i = 0; i < e.end - e.begin; ++i)
        if (b[i] > 1) fail(path, fmt::format("tensor '{}': bool byte {} is {} (not 0 or 1)", e.name, i, int(b[i])));
    }
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json j = nlohmann::json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  std::vector<Tensor> data;
  std::uint64_t at = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__") fail(path, "a tensor cannot be named __metadata__");
    if (j.contains(name)) fail(path, fmt::format("two tensors are named '{}'", name));
    const char* code = code_of(t.type());
    data.push_back(Tensor::copy_of(t));
    const std::uint64_t bytes = std::uint64_t(t.numel()) * dtype_size(t.type());
    j[name] = {{"dtype", code}, {"shape", t.shape()}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string header = j.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail(path, "cannot open the file for writing");
  unsigned char len8[8];
  for (int i = 0; i < 8; ++i) len8[i] = static_cast<unsigned char>(std::uint64_t(header.size()) >> (8 * i));
  f.write(reinterpret_cast<const char*>(len8), 8);
  f.write(header.data(), std::streamsize(header.size()));
  for (const Tensor& t : data) f.write(static_cast<const char*>(t.data()), std::streamsize(t.numel() * dtype_size(t.type())));
  f.flush();
  if (!f) fail(path, "writing failed");
}

}  // namespace attn

// src/nn/checkpoint.cc — safetensors reader and writer, and parameter lists by name.
#include "attn/nn/checkpoint.h"

#include <bit>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors is little-endian; so is this code");

using detail::fail;

struct dtype_name_pair {
  dtype type;
  const char* name;
};
constexpr dtype_name_pair kNames[] = {{dtype::f32, "F32"}, {dtype::f64, "F64"},  {dtype::f16, "F16"},
                                      {dtype::bf16, "BF16"}, {dtype::i64, "I64"}, {dtype::boolean, "BOOL"}};
static_assert(std::size(kNames) == std::size_t(dtype::i64) + 1, "every attn dtype has a safetensors name");

const char* safetensors_name(dtype t) {
  for (const auto& n : kNames)
    if (n.type == t) return n.name;
  return "?";
}

std::string file_error(const std::string& path, const std::string& what) { return fmt::format("{}: {}", path, what); }

}  // namespace

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const char* op = "save_safetensors";
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<Tensor> data;  // contiguous copies, in file order
  std::set<std::string> seen;
  std::size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__")
      fail(op, fmt::format("'{}' cannot name a tensor", name));
    if (!seen.insert(name).second) fail(op, fmt::format("the name '{}' is given twice", name));
    if (!t.defined()) fail(op, fmt::format("'{}' has no data", name));
    data.push_back(Tensor::copy_of(t));
    const std::size_t bytes = std::size_t(t.numel()) * dtype_size(t.type());
    header[name] = {{"dtype", safetensors_name(t.type())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  std::ofstream f(path, std::ios::binary);
  if (!f) fail(op, fmt::format("cannot open '{}' for writing", path));
  const std::uint64_t n = text.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f.write(text.data(), std::streamsize(text.size()));
  for (const Tensor& t : data)
    if (t.numel() > 0) f.write(static_cast<const char*>(t.data()), std::streamsize(std::size_t(t.numel()) * dtype_size(t.type())));
  if (!f) fail(op, fmt::format("writing '{}' failed", path));
}

safetensors_file load_safetensors(const std::string& path) {
  const char* op = "load_safetensors";
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) fail(op, file_error(path, "cannot open the file"));
  const std::uint64_t file_size = std::uint64_t(f.tellg());
  f.seekg(0);
  std::uint64_t n = 0;
  if (file_size < 8 || !f.read(reinterpret_cast<char*>(&n), 8)) fail(op, file_error(path, "shorter than the 8-byte header length"));
  if (n > file_size - 8)
    fail(op, file_error(path, fmt::format("header length {} runs past the end of the file ({} bytes)", n, file_size)));
  std::string text(std::size_t(n), '\0');
  f.read(text.data(), std::streamsize(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail(op, file_error(path, fmt::format("the header is not JSON ({})", e.what())));
  }
  if (!header.is_object()) fail(op, file_error(path, "the header is not a JSON object"));
  const std::uint64_t data_size = file_size - 8 - n;
  safetensors_file out;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(op, file_error(path, "__metadata__ is not an object"));
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(op, file_error(path, fmt::format("__metadata__ '{}' is not a string", k)));
        out.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const auto bad = [&](const std::string& what) { fail(op, file_error(path, fmt::format("'{}': {}", name, what))); };
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets"))
      bad("expected an object with dtype, shape and data_offsets");
    if (!entry["dtype"].is_string()) bad("dtype is not a string");
    const std::string dt = entry["dtype"].get<std::string>();
    const dtype_name_pair* match = nullptr;
    for (const auto& k : kNames)
      if (dt == k.name) match = &k;
    if (!match) bad(fmt::format("dtype {} is not supported (F32, F64, F16, BF16, I64, BOOL)", dt));
    Shape shape;
    std::uint64_t numel = 1;
    if (!entry["shape"].is_array()) bad("shape is not an array");
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) bad(fmt::format("shape {} holds a value that is not a size", entry["shape"].dump()));
      const std::uint64_t s = d.get<std::uint64_t>();
      if (s > (std::uint64_t(1) << 40) || (s > 0 && numel > (std::uint64_t(1) << 40) / s)) bad("shape is too large");
      shape.push_back(std::int64_t(s));
      numel *= s;
    }
    const auto& off = entry["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      bad("data_offsets is not [begin, end]");
    const std::uint64_t begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
    const std::uint64_t bytes = numel * dtype_size(match->type);
    if (begin > end || end > data_size)
      bad(fmt::format("data_offsets [{}, {}] lie outside the {} data bytes", begin, end, data_size));
    if (end - begin != bytes)
      bad(fmt::format("data_offsets [{}, {}] hold {} bytes, dtype {} shape {} needs {}", begin, end, end - begin, dt,
                      shape_str(shape), bytes));
    Tensor t = Tensor::empty(shape, match->type);
    f.seekg(std::streamoff(8 + n + begin));
    if (bytes > 0 && !f.read(static_cast<char*>(t.data()), std::streamsize(bytes))) bad("reading the data failed");
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

void save_parameters(const std::string& path, const parameter_list& params,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, TensorView>> list;
  for (const parameter_ref& p : params) list.emplace_back(p.name, p.value->view());
  save_safetensors(path, list, metadata);
}

void load_parameters(const std::string& path, const parameter_list& params) {
  const char* op = "load_parameters";
  const safetensors_file file = load_safetensors(path);
  std::set<std::string> wanted;
  // Check everything first, so that a bad file changes nothing.
  for (const parameter_ref& p : params) {
    wanted.insert(p.name);
    const auto it = file.tensors.find(p.name);
    if (it == file.tensors.end()) fail(op, file_error(path, fmt::format("the parameter '{}' is missing", p.name)));
    const Tensor& t = it->second;
    if (t.shape() != p.value->shape())
      fail(op, file_error(path, fmt::format("'{}' has shape {}, the model's is {}", p.name, shape_str(t.shape()),
                                            shape_str(p.value->shape()))));
    if (t.type() != p.value->type())
      fail(op, file_error(path, fmt::format("'{}' has dtype {}, the model's is {}", p.name, dtype_name(t.type()),
                                            dtype_name(p.value->type()))));
  }
  for (const auto& [name, t] : file.tensors)
    if (!wanted.count(name))
      fail(op, file_error(path, fmt::format("'{}' names no parameter of the model ({} parameters)", name, params.size())));
  for (const parameter_ref& p : params) {
    const Tensor& t = file.tensors.at(p.name);
    if (t.numel() > 0) std::memcpy(p.value->data(), t.data(), std::size_t(t.numel()) * dtype_size(t.type()));
  }
}

}  // namespace attn::nn

// src/nn/checkpoint.cc — parameter lists to and from safetensors files (attn/safetensors.h), by
// name.
#include "attn/nn/checkpoint.h"

#include <cstring>
#include <set>

#include "attn/safetensors.h"
#include "nn/nn_impl.h"

namespace attn::nn {
namespace {

std::string in_file(const std::string& path, const std::string& what) { return fmt::format("{}: {}", path, what); }

}  // namespace

void save_parameters(const std::string& path, const parameter_list& params,
                     const std::map<std::string, std::string>& metadata) {
  std::vector<std::pair<std::string, TensorView>> list;
  for (const parameter_ref& p : params) list.emplace_back(p.name, p.value->view());
  write_safetensors(path, list, metadata);
}

void load_parameters(const std::string& path, const parameter_list& params) {
  const char* op = "load_parameters";
  const safetensors_file file = read_safetensors(path);
  std::set<std::string> wanted;
  // Check everything first, so that a bad file changes nothing.
  for (const parameter_ref& p : params) {
    wanted.insert(p.name);
    if (!file.contains(p.name)) detail::fail(op, in_file(path, fmt::format("the parameter '{}' is missing", p.name)));
    const Tensor& t = file.at(p.name);
    if (t.shape() != p.value->shape())
      detail::fail(op, in_file(path, fmt::format("'{}' has shape {}, the model's is {}", p.name, shape_str(t.shape()),
                                                 shape_str(p.value->shape()))));
    if (t.type() != p.value->type())
      detail::fail(op, in_file(path, fmt::format("'{}' has dtype {}, the model's is {}", p.name, dtype_name(t.type()),
                                                 dtype_name(p.value->type()))));
  }
  for (const auto& [name, t] : file.tensors)
    if (!wanted.count(name))
      detail::fail(op, in_file(path, fmt::format("'{}' names no parameter of the model ({} parameters)", name,
                                                 params.size())));
  for (const parameter_ref& p : params) {
    const Tensor& t = file.at(p.name);
    if (t.numel() > 0) std::memcpy(p.value->data(), t.data(), std::size_t(t.numel()) * dtype_size(t.type()));
  }
}

}  // namespace attn::nn

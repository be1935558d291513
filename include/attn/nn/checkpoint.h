// attn/nn/checkpoint.h — a model's parameters in a safetensors checkpoint (the format of PyTorch
// and Hugging Face; the file format itself is attn/safetensors.h), each under its dotted name.
//
//   attn::nn::parameter_list ps;
//   model.parameters(ps);
//   attn::nn::save_parameters("model.safetensors", ps);     // every parameter by name
//   attn::nn::load_parameters("model.safetensors", ps);     // exact: same names, shapes, dtypes
//
// In Python: safetensors.numpy.load_file("model.safetensors")["enc.fwd.ih.weight"].
// Mismatches throw attn::error naming the file and the tensor, and change nothing:
//   "load_parameters: model.safetensors: 'out_proj.weight' has shape [8, 4], the model's is [8, 8]".
#pragma once

#include <map>
#include <string>

#include "attn/nn/parameter.h"

namespace attn::nn {

// Every parameter's value under its name, in list order.
void save_parameters(const std::string& path, const parameter_list& params,
                     const std::map<std::string, std::string>& metadata = {});
// Copies each file tensor into the parameter of the same name. Throws, changing nothing, when
// the file lacks a parameter, holds a name the list does not have, or a shape or dtype differs.
void load_parameters(const std::string& path, const parameter_list& params);

}  // namespace attn::nn

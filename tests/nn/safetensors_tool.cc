// tests/nn/safetensors_tool.cc — attn's side of tests/nn/safetensors_interop.py (not a unit
// test by itself):
//   safetensors_tool write DIR   DIR/attn_model.safetensors (a small model's parameters) and
//                                DIR/attn_dtypes.safetensors (one tensor per dtype), and each
//                                tensor again as DIR/attn/<name>.npy for Python to compare with
//   safetensors_tool check DIR   reads DIR/py_dtypes.safetensors and DIR/py_model.safetensors
//                                (written by the Python package) and compares them bit for bit
//                                with DIR/py/<name>.npy; loads the model file into the model
// Exit status 0 when everything matches, 1 with a message otherwise.
#include <attn/attn.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace {

using namespace attn;

struct model {
  nn::Embedding emb;
  nn::BiGRUEncoder enc;
  nn::MultiHeadAttention mha;
  nn::LayerNorm ln;
  model() {
    nn::rng gen(3);
    emb = nn::Embedding(7, 6, gen);
    enc = nn::BiGRUEncoder(6, 3, gen);
    mha = nn::MultiHeadAttention({.embed_dim = 6, .num_heads = 2}, gen);
    ln = nn::LayerNorm(6);
  }
  nn::parameter_list parameters() {
    nn::parameter_list ps;
    emb.parameters(ps, "emb.");
    enc.parameters(ps, "enc.");
    mha.parameters(ps, "mha.");
    ln.parameters(ps, "ln.");
    return ps;
  }
};

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.type() != b.type() || a.shape() != b.shape()) return false;
  const std::size_t n = std::size_t(a.numel()) * dtype_size(a.type());
  return n == 0 || std::memcmp(a.data(), b.data(), n) == 0;
}

int write(const std::string& dir) {
  std::filesystem::create_directories(dir + "/attn");
  model m;
  const nn::parameter_list ps = m.parameters();
  nn::save_parameters(dir + "/attn_model.safetensors", ps, {{"written_by", "attn"}});
  for (const nn::parameter_ref& p : ps) write_npy(dir + "/attn/" + p.name + ".npy", *p.value);
  // bf16 values exactly representable, so that the float32 .npy holds them exactly.
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"f64", Tensor::from_values({2, 2}, dtype::f64, {0.1, -2.5e-300, 1e300, 3.0})},
      {"f16", Tensor::from_values({3}, dtype::f16, {0.5, -65504.0, 6.1035156e-05})},
      {"bf16", Tensor::from_values({4}, dtype::bf16, {1.5, -2.0, 0.0078125, 3.0e38})},
      {"i64", Tensor::from_values({3}, dtype::i64, {-7, 0, 1LL << 50})},
      {"bool", Tensor::from_values({2, 2}, dtype::boolean, {1, 0, 0, 1})},
      {"empty", Tensor::zeros({0, 4}, dtype::f32)},
  };
  std::vector<std::pair<std::string, TensorView>> views;
  for (const auto& [name, t] : tensors) {
    views.emplace_back(name, t);
    write_npy(dir + "/attn/" + name + ".npy", t);
  }
  write_safetensors(dir + "/attn_dtypes.safetensors", views);
  return 0;
}

int check(const std::string& dir) {
  int bad = 0;
  auto compare_file = [&](const std::string& file) {
    const safetensors_file f = read_safetensors(dir + "/" + file);
    for (const auto& [name, t] : f.tensors) {
      const Tensor want = read_npy(dir + "/py/" + name + ".npy");
      if (!same_bits(t, want)) {
        std::printf("%s: '%s' (%s %s) differs from py/%s.npy (%s %s)\n", file.c_str(), name.c_str(),
                    std::string(dtype_name(t.type())).c_str(), shape_str(t.shape()).c_str(), name.c_str(),
                    std::string(dtype_name(want.type())).c_str(), shape_str(want.shape()).c_str());
        ++bad;
      }
    }
    std::printf("%s: %zu tensors, metadata entries %zu\n", file.c_str(), f.tensors.size(), f.metadata.size());
    return f;
  };
  const safetensors_file dtypes = compare_file("py_dtypes.safetensors");
  if (dtypes.tensors.size() != 6) std::printf("py_dtypes.safetensors: expected 6 tensors\n"), ++bad;
  if (dtypes.metadata.count("written_by") == 0 || dtypes.metadata.at("written_by") != "python")
    std::printf("py_dtypes.safetensors: metadata written_by=python missing\n"), ++bad;
  compare_file("py_model.safetensors");
  model m;
  const nn::parameter_list ps = m.parameters();
  nn::load_parameters(dir + "/py_model.safetensors", ps);
  for (const nn::parameter_ref& p : ps)
    if (!same_bits(*p.value, read_npy(dir + "/py/" + p.name + ".npy")))
      std::printf("model parameter '%s' differs after load_parameters\n", p.name.c_str()), ++bad;
  std::printf("%s\n", bad ? "MISMATCH" : "all tensors match");
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::string(argv[1]) != "write" && std::string(argv[1]) != "check")) {
    std::fprintf(stderr, "usage: safetensors_tool write|check DIR\n");
    return 2;
  }
  try {
    return std::string(argv[1]) == "write" ? write(argv[2]) : check(argv[2]);
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 1;
  }
}

// tests/nn/nn_checkpoint_test.cc — a model's parameters through a safetensors checkpoint: the
// exact round trip, and every mismatch (missing, unknown, wrong shape or dtype) by message,
// changing nothing. The file format has its own tests (tests/core/safetensors_test.cc);
// tests/nn/safetensors_interop.py checks checkpoints against the Python package.
#include <cstdio>

#include "attn/safetensors.h"

#include "nn/nn_test_util.h"

namespace attn::nn {
namespace {

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "attn_ckpt_" + name; }

// A small model of several layers: save, scramble, load, and every parameter is back.
struct small_model {
  Embedding emb;
  BiGRUEncoder enc;
  MultiHeadAttention mha;
  LayerNorm ln;
  explicit small_model(std::uint64_t seed) {
    rng gen(seed);
    emb = Embedding(11, 8, gen);
    enc = BiGRUEncoder(8, 4, gen);
    mha = MultiHeadAttention({.embed_dim = 8, .num_heads = 2, .num_kv_heads = 1}, gen);
    ln = LayerNorm(8);
  }
  parameter_list parameters() {
    parameter_list ps;
    emb.parameters(ps, "emb.");
    enc.parameters(ps, "enc.");
    mha.parameters(ps, "mha.");
    ln.parameters(ps, "ln.");
    return ps;
  }
};

TEST(NnCheckpoint, ModelParametersRoundTrip) {
  small_model a(1), b(2);
  const parameter_list pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), 1u + 8u + 8u + 2u);
  const std::string path = temp_path("model.safetensors");
  save_parameters(path, pa);
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].name, pb[i].name);
  EXPECT_FALSE(all_close(*pb[1].value, *pa[1].value, 0.0));  // different seeds
  load_parameters(path, pb);
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(all_close(*pb[i].value, *pa[i].value, 0.0)) << pa[i].name;
  std::remove(path.c_str());
}

TEST(NnCheckpoint, LoadErrorsChangeNothing) {
  small_model a(1);
  const parameter_list ps = a.parameters();
  const std::string path = temp_path("errors.safetensors");
  auto save_without = [&](const std::string& skip, const std::string& rename, const Tensor& replace) {
    std::vector<std::pair<std::string, TensorView>> list;
    for (const parameter_ref& p : ps) {
      if (p.name == skip) continue;
      list.emplace_back(p.name == rename ? "mha.q_proj.wieght" : p.name,
                        p.name == rename && replace.defined() ? replace.view() : p.value->view());
    }
    write_safetensors(path, list);
  };
  const Tensor before = Tensor::copy_of(*ps[0].value);
  save_without("ln.bias", "", Tensor());
  EXPECT_THROW_MSG(load_parameters(path, ps), path + ": the parameter 'ln.bias' is missing");
  save_without("", "mha.q_proj.weight", Tensor());
  EXPECT_THROW_MSG(load_parameters(path, ps), "the parameter 'mha.q_proj.weight' is missing");
  std::vector<std::pair<std::string, TensorView>> extra;
  for (const parameter_ref& p : ps) extra.emplace_back(p.name, p.value->view());
  const Tensor stray = Tensor::zeros({2}, dtype::f32);
  extra.emplace_back("decoder.weight", stray);
  write_safetensors(path, extra);
  EXPECT_THROW_MSG(load_parameters(path, ps), "'decoder.weight' names no parameter of the model (19 parameters)");
  extra.pop_back();
  const Tensor wrong_shape = Tensor::zeros({8, 4}, dtype::f32), wrong_type = Tensor::zeros({8}, dtype::f64);
  for (auto& [name, view] : extra) {
    if (name == "mha.out_proj.weight") view = wrong_shape;
    if (name == "ln.weight") view = wrong_type;
  }
  write_safetensors(path, extra);
  EXPECT_THROW_MSG(load_parameters(path, ps), "'mha.out_proj.weight' has shape [8, 4], the model's is [8, 8]");
  EXPECT_TRUE(all_close(*ps[0].value, before, 0.0));  // nothing was copied
  for (auto& [name, view] : extra)
    if (name == "mha.out_proj.weight") view = a.mha.out_proj.weight.view();
  write_safetensors(path, extra);
  EXPECT_THROW_MSG(load_parameters(path, ps), "'ln.weight' has dtype float64, the model's is float32");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace attn::nn

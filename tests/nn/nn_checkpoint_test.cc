// tests/nn/nn_checkpoint_test.cc — safetensors: the bytes of a small file written out by hand,
// exact round trips of every dtype and of whole models' parameters, and every error by message.
// (tests/nn/safetensors_interop.py checks the same files against the Python package.)
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>

#include "attn/nn/nn.h"
#include "test_util.h"

namespace attn::nn {
namespace {

using testing::all_close;
using testing::random_tensor;

std::string temp_path(const std::string& name) { return ::testing::TempDir() + "attn_ckpt_" + name; }

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& header, const std::string& data) {
  std::ofstream f(path, std::ios::binary);
  const std::uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << data;
}

TEST(NnCheckpoint, BytesOfASmallFile) {
  const std::string path = temp_path("small.safetensors");
  save_safetensors(path, {{"a", Tensor::from_values({2}, dtype::f32, {1.0, 2.0})}});
  const std::string header = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";  // 54 bytes
  std::string want(8, '\0');
  want[0] = 56;  // padded with spaces to a multiple of 8
  want += header + "  ";
  const float values[] = {1.0f, 2.0f};
  want.append(reinterpret_cast<const char*>(values), 8);
  EXPECT_EQ(read_bytes(path), want);
  std::remove(path.c_str());
}

TEST(NnCheckpoint, EveryDtypeRoundTripsExactly) {
  std::mt19937 r(1);
  const Tensor f32 = random_tensor({3, 4}, dtype::f32, r), f64 = random_tensor({5}, dtype::f64, r);
  const Tensor f16 = random_tensor({2, 3}, dtype::f16, r), bf16 = random_tensor({7}, dtype::bf16, r);
  const Tensor i64 = Tensor::from_values({3}, dtype::i64, {-5, 0, 1LL << 40});
  const Tensor b = testing::random_bool({2, 2}, r), empty = Tensor::zeros({0, 3}, dtype::f32);
  const Tensor scalar = Tensor::from_values({}, dtype::f64, {3.25});
  const Tensor big = random_tensor({6, 5}, dtype::f32, r);
  const TensorView strided = big.view().transpose(0, 1).slice(0, 1, 4);  // [3, 6], saved contiguous
  const std::string path = temp_path("dtypes.safetensors");
  save_safetensors(path,
                   {{"f32", f32}, {"f64", f64}, {"f16", f16}, {"bf16", bf16}, {"i64", i64}, {"bool", b},
                    {"empty", empty}, {"scalar", scalar}, {"strided", strided}},
                   {{"format", "pt"}, {"step", "12"}});
  const safetensors_file f = load_safetensors(path);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}}));
  ASSERT_EQ(f.tensors.size(), 9u);
  for (const auto& [name, want] : std::vector<std::pair<std::string, TensorView>>{
           {"f32", f32}, {"f64", f64}, {"f16", f16}, {"bf16", bf16}, {"i64", i64}, {"bool", b},
           {"empty", empty}, {"scalar", scalar}, {"strided", strided}}) {
    const Tensor& got = f.tensors.at(name);
    EXPECT_EQ(got.type(), want.type()) << name;
    EXPECT_TRUE(all_close(got, want, 0.0)) << name;  // bit-exact
  }
  std::remove(path.c_str());
}

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
    save_safetensors(path, list);
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
  save_safetensors(path, extra);
  EXPECT_THROW_MSG(load_parameters(path, ps), "'decoder.weight' names no parameter of the model (19 parameters)");
  extra.pop_back();
  const Tensor wrong_shape = Tensor::zeros({8, 4}, dtype::f32), wrong_type = Tensor::zeros({8}, dtype::f64);
  for (auto& [name, view] : extra) {
    if (name == "mha.out_proj.weight") view = wrong_shape;
    if (name == "ln.weight") view = wrong_type;
  }
  save_safetensors(path, extra);
  EXPECT_THROW_MSG(load_parameters(path, ps), "'mha.out_proj.weight' has shape [8, 4], the model's is [8, 8]");
  EXPECT_TRUE(all_close(*ps[0].value, before, 0.0));  // nothing was copied
  for (auto& [name, view] : extra)
    if (name == "mha.out_proj.weight") view = a.mha.out_proj.weight.view();
  save_safetensors(path, extra);
  EXPECT_THROW_MSG(load_parameters(path, ps), "'ln.weight' has dtype float64, the model's is float32");
  std::remove(path.c_str());
}

TEST(NnCheckpoint, MalformedFiles) {
  const std::string path = temp_path("bad.safetensors");
  EXPECT_THROW_MSG(load_safetensors(temp_path("does_not_exist")), "cannot open the file");
  write_bytes(path, "", "");
  { std::ofstream(path, std::ios::binary) << "abc"; }
  EXPECT_THROW_MSG(load_safetensors(path), "shorter than the 8-byte header length");
  write_bytes(path, "{", "");
  EXPECT_THROW_MSG(load_safetensors(path), "the header is not JSON");
  write_bytes(path, R"({"x":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})", "abcd");
  EXPECT_THROW_MSG(load_safetensors(path), "'x': dtype I32 is not supported (F32, F64, F16, BF16, I64, BOOL)");
  write_bytes(path, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "abcd");
  EXPECT_THROW_MSG(load_safetensors(path), "'x': data_offsets [0, 4] hold 4 bytes, dtype F32 shape [2] needs 8");
  write_bytes(path, R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "abcd");
  EXPECT_THROW_MSG(load_safetensors(path), "'x': data_offsets [0, 8] lie outside the 4 data bytes");
  write_bytes(path, R"({"x":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", "abcdefgh");
  EXPECT_THROW_MSG(load_safetensors(path), "'x': shape [-2] holds a value that is not a size");
  write_bytes(path, R"([1, 2])", "");
  EXPECT_THROW_MSG(load_safetensors(path), "the header is not a JSON object");
  {
    std::ofstream f(path, std::ios::binary);
    const std::uint64_t n = 1000;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f << "{}";
  }
  EXPECT_THROW_MSG(load_safetensors(path), "header length 1000 runs past the end of the file (10 bytes)");
  const Tensor t = Tensor::zeros({1}, dtype::f32);
  EXPECT_THROW_MSG(save_safetensors(path, {{"a", t}, {"a", t}}), "save_safetensors: the name 'a' is given twice");
  EXPECT_THROW_MSG(save_safetensors(path, {{"__metadata__", t}}), "'__metadata__' cannot name a tensor");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace attn::nn

// tests/core/safetensors_test.cc — safetensors round trips (every dtype, strided input,
// metadata, empty tensors) and malformed files refused by message.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>

#include "attn/attn.h"
#include "test_util.h"

namespace attn {
namespace {

std::string temp_path(const char* name) { return ::testing::TempDir() + name; }

std::string read_all(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
void write_all(const std::string& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

TEST(safetensors, round_trip_every_dtype_exactly) {
  std::mt19937 rng(1);
  const Tensor a = testing::random_tensor({3, 5}, dtype::f32, rng), b = testing::random_tensor({7}, dtype::bf16, rng),
               c = testing::random_tensor({2, 2, 2}, dtype::f16, rng), d = testing::random_tensor({4}, dtype::f64, rng),
               e = Tensor::from_values({3}, dtype::i64, {-5, 0, 1ll << 40}), f = testing::random_bool({2, 3}, rng),
               z = Tensor::zeros({0, 4}, dtype::f32);
  const TensorView at = a.view().transpose(0, 1);  // strided: stored C-contiguous
  const std::string p = temp_path("round.safetensors");
  write_safetensors(p, {{"a.t", at}, {"b", b}, {"c", c}, {"d", d}, {"e", e}, {"f", f}, {"z", z}}, {{"format", "pt"}});
  const safetensors_file r = read_safetensors(p);
  ASSERT_EQ(r.tensors.size(), 7u);
  EXPECT_EQ(r.tensors[0].first, "a.t");
  EXPECT_EQ(r.metadata.at("format"), "pt");
  EXPECT_TRUE(testing::all_close(r.at("a.t"), at, 0.0));
  EXPECT_EQ(r.at("a.t").shape(), (Shape{5, 3}));
  for (const char* n : {"b", "c", "d", "e", "f"}) {
    EXPECT_EQ(r.at(n).type(), (n[0] == 'b' ? b : n[0] == 'c' ? c : n[0] == 'd' ? d : n[0] == 'e' ? e : f).type());
  }
  EXPECT_EQ(r.at("b").to_vector(), b.to_vector());
  EXPECT_EQ(r.at("c").to_vector(), c.to_vector());
  EXPECT_EQ(r.at("d").to_vector(), d.to_vector());
  EXPECT_EQ(r.at("e").to_vector(), e.to_vector());
  EXPECT_EQ(r.at("f").to_vector(), f.to_vector());
  EXPECT_EQ(r.at("z").shape(), (Shape{0, 4}));
  EXPECT_THROW_MSG(r.at("nope"), "no tensor named 'nope' (7 tensors in the file)");
}

TEST(safetensors, malformed_files_refused_by_message) {
  const std::string p = temp_path("ok.safetensors"), q = temp_path("bad.safetensors");
  write_safetensors(p, {{"w", Tensor::zeros({2, 3}, dtype::f32)}, {"b", Tensor::zeros({3}, dtype::f32)}});
  const std::string good = read_all(p);
  auto expect = [&](const std::string& bytes, const std::string& msg) {
    write_all(q, bytes);
    EXPECT_THROW_MSG(read_safetensors(q), msg);
  };
  expect(good.substr(0, 5), "the file has 5 bytes; a header length needs 8");
  std::string big = good;
  big[6] = 1;  // header length 2^48
  expect(big, "does not fit a file of");
  expect(good.substr(0, good.size() - 4), "bytes [24, 36) are outside the 32 bytes of data");
  std::string j = good;
  j[8] = '[';
  expect(j, "the header is not valid JSON");
  auto header_swap = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    s.replace(at, from.size(), to);  // same length keeps the header length right
    return s;
  };
  expect(header_swap("\"F32\"", "\"I16\""), "has dtype I16, which attn does not read");
  expect(header_swap("[2,3]", "[3,3]"), "tensor 'w': 24 bytes for shape [3, 3] of F32 (36 expected)");
  expect(read_all(p) + "junk", "the tensors cover 36 of the 40 bytes of data");
  EXPECT_THROW_MSG(read_safetensors(temp_path("missing.safetensors")), "cannot open the file");
  EXPECT_THROW_MSG(write_safetensors(q, {{"x", Tensor::zeros({1}, dtype::f32)}, {"x", Tensor::zeros({1}, dtype::f32)}}),
                   "two tensors are named 'x'");
}

}  // namespace
}  // namespace attn

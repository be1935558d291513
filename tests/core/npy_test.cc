// tests/core/npy_test.cc — .npy round trips for every dtype and rank, Fortran order, format 2.0,
// and malformed or truncated files (a clear attn::error, never a crash).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "test_util.h"

namespace attn {
namespace {

std::string tmp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("attn_npy_test_" + name)).string();
}

std::string file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

// A hand-built .npy image: header dict text, then raw data.
std::string npy_image(int major, const std::string& dict, const std::string& data) {
  std::string header = dict;
  const std::size_t pre = major == 1 ? 10 : 12;
  header.append((64 - (pre + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string s = "\x93NUMPY";
  s.push_back(char(major));
  s.push_back(0);
  const std::size_t n = header.size();
  s.push_back(char(n & 0xff));
  s.push_back(char((n >> 8) & 0xff));
  if (major != 1) s.push_back(char((n >> 16) & 0xff)), s.push_back(char(n >> 24));
  return s + header + data;
}

TEST(Npy, RoundTripsEveryDtypeAndRank) {
  std::mt19937 rng(1);
  for (dtype t : {dtype::f32, dtype::f16, dtype::f64, dtype::boolean, dtype::i64, dtype::i8}) {
    for (const Shape& shape : {Shape{}, Shape{5}, Shape{2, 3}, Shape{2, 0, 4}, Shape{1, 2, 3, 4}}) {
      Tensor a = t == dtype::boolean ? testing::random_bool(shape, rng) : testing::random_tensor(shape, t, rng, -50, 50);
      if (t == dtype::i64) a = Tensor::copy_of(a);
      const std::string p = tmp_path("rt.npy");
      write_npy(p, a);
      const Tensor b = read_npy(p);
      EXPECT_EQ(b.type(), t);
      EXPECT_EQ(b.shape(), shape);
      EXPECT_EQ(b.to_vector(), a.to_vector());
      EXPECT_EQ(file_bytes(p).find("\x93NUMPY"), 0u);
      EXPECT_EQ((file_bytes(p).size() - std::size_t(a.numel()) * dtype_size(t)) % 64, 0u);  // header padded to 64
    }
  }
}

TEST(Npy, Bfloat16IsWrittenAsFloat32) {
  Tensor a = Tensor::from_values({2}, dtype::bf16, {1.5, -3});
  const std::string p = tmp_path("bf16.npy");
  write_npy(p, a);
  const Tensor b = read_npy(p);
  EXPECT_EQ(b.type(), dtype::f32);
  EXPECT_EQ(b.to_vector(), (std::vector<double>{1.5, -3}));
}

TEST(Npy, StridedViewsAreWrittenInCOrder) {
  Tensor a = Tensor::from_values({2, 3}, dtype::f32, {0, 1, 2, 3, 4, 5});
  const std::string p = tmp_path("strided.npy");
  write_npy(p, a.view().transpose(0, 1));
  EXPECT_EQ(read_npy(p).to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Npy, ReadsFortranOrderAndFormat2) {
  const float data[6] = {0, 3, 1, 4, 2, 5};  // [[0,1,2],[3,4,5]] in Fortran order
  const std::string raw(reinterpret_cast<const char*>(data), sizeof data);
  const std::string f = npy_image(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", raw);
  const Tensor a = parse_npy(f.data(), f.size());
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(a.to_vector(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  const std::string g = npy_image(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", raw);
  EXPECT_EQ(parse_npy(g.data(), g.size()).to_vector(), (std::vector<double>{0, 3, 1, 4, 2, 5}));
}

TEST(Npy, MalformedFilesGiveClearErrors) {
  const std::string ok = npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", std::string(16, '\0'));
  EXPECT_THROW_MSG(parse_npy("hello world", 11, "x.npy"), "npy: x.npy: not a .npy file (bad magic)");
  EXPECT_THROW_MSG(parse_npy(ok.data(), ok.size() - 1, "t.npy"), "truncated data: shape [2, 2] needs 16 bytes, file has 15");
  EXPECT_THROW_MSG(parse_npy(ok.data(), 30, "t.npy"), "truncated header");
  const std::string be = npy_image(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", "abcd");
  EXPECT_THROW_MSG(parse_npy(be.data(), be.size()), "big-endian dtype '>f4' is not supported");
  const std::string u8 = npy_image(1, "{'descr': '|u1', 'fortran_order': False, 'shape': (1,), }", "a");
  EXPECT_THROW_MSG(parse_npy(u8.data(), u8.size()), "unsupported dtype '|u1'");
  const std::string noshape = npy_image(1, "{'descr': '<f4', 'fortran_order': False}", "");
  EXPECT_THROW_MSG(parse_npy(noshape.data(), noshape.size()), "header has no 'shape' entry");
  const std::string badshape = npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", "");
  EXPECT_THROW_MSG(parse_npy(badshape.data(), badshape.size()), "bad shape");
  const std::string v9 = npy_image(1, "{}", "");
  std::string v9b = v9;
  v9b[6] = 9;
  EXPECT_THROW_MSG(parse_npy(v9b.data(), v9b.size()), "unsupported format version 9.0");
  EXPECT_THROW_MSG(read_npy(tmp_path("does_not_exist.npy")), "cannot open file");
}

TEST(Npy, NeverCrashesOnTruncationsOrCorruption) {
  const std::string ok = npy_image(1, "{'descr': '<f8', 'fortran_order': True, 'shape': (3, 2), }", std::string(48, '\1'));
  for (std::size_t n = 0; n < ok.size(); ++n) EXPECT_THROW((void)parse_npy(ok.data(), n), error) << n;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s = ok;
    for (int f = 0; f < 3; ++f) s[rng() % 128] = char(rng());
    try {
      (void)parse_npy(s.data(), s.size());
    } catch (const error&) {
    }
  }
}

}  // namespace
}  // namespace attn

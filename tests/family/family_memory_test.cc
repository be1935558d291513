// tests/family/family_memory_test.cc — every streaming score × distribution pair at Nq = Nk = 32768,
// forward and backward, with its peak resident memory printed and bounded far below one
// Nq × Nk matrix (4 GiB in float32).
//
// The rows use a causal sliding window of 128 keys (local attention) so that the test is quick:
// the window bounds the work, not the memory an implementation would allocate if it
// materialised the scores. Skipped under AddressSanitizer (its shadow memory and slowdown make
// the numbers meaningless); run the release build:  ctest --preset release -R FamilyMemory
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "family_util.h"

#if defined(__SANITIZE_ADDRESS__)
#define ATTN_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ATTN_UNDER_ASAN 1
#endif
#endif

namespace attn::testing {
namespace {

// Peak resident set (VmHWM) in MiB; reset_peak() restarts it at the current size (Linux).
double peak_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0.0;
}
double current_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0.0;
}
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

struct pair_case {
  score_kind score;
  distribution_kind dist;
  bool multi_dim = false;  // additive with w_v [Dv, A]
};

class FamilyMemory : public ::testing::TestWithParam<pair_case> {};

TEST_P(FamilyMemory, StreamsWithoutAnNqByNkMatrix) {
#ifdef ATTN_UNDER_ASAN
  GTEST_SKIP() << "peak memory is not measured under AddressSanitizer; run the release build";
#endif
  const auto [s, d, md] = GetParam();
  const std::int64_t N = 32768, D = 8, Dv = 8;
  std::mt19937 rng(41);
  family_case c(s, d, rng, 1, 1, 1, 4, 4, D, Dv, md);  // parameters sized for Nk = 4; resized below
  c.q = random_tensor({1, 1, N, D}, dtype::f32, rng);
  c.k = random_tensor({1, 1, N, c.Dk}, dtype::f32, rng);
  c.v = random_tensor({1, 1, N, Dv}, dtype::f32, rng);
  if (s == score_kind::location) c.W_a = random_tensor({N, D}, dtype::f64, rng), c.opt.score.W_a = c.W_a.view();
  if (d == distribution_kind::topk) c.opt.distribution.k = 8;
  c.opt.is_causal = true;
  c.opt.window_left = 127;
  // attn::attention's own reference backend scores every key of a row; without a fast core
  // backend compiled in, measure the tiled path instead.
  const bool fast_core = backends().size() > 1;
  if (!fast_core) c.exec.path = family_path::tiled;
  const Tensor dout = random_tensor({1, 1, N, Dv}, dtype::f32, rng);

  const double before = current_mib();
  reset_peak();
  const family_result r = attention_family(c.q, c.k, c.v, c.opt, c.exec);
  const family_grads g = attention_family_backward(c.q, c.k, c.v, dout, c.opt, c.exec);
  const double peak = peak_mib();
  EXPECT_FALSE(any_nan(r.out));
  EXPECT_FALSE(any_nan(g.dq));
  const double nqnk_f32 = double(N) * double(N) * 4.0 / (1024.0 * 1024.0);
  std::printf("[ memory ] %-17s x %-9s  Nq = Nk = %lld  path %-12s  peak RSS %.1f MiB (%.1f MiB above the start; "
              "one Nq x Nk float32 matrix: %.0f MiB)\n",
              (to_string(s) + (md ? " (md)" : "")).c_str(), to_string(d).c_str(), static_cast<long long>(N), r.path.c_str(), peak,
              peak - before, nqnk_f32);
  EXPECT_LT(peak - before, 256.0) << "peak memory grew by " << peak - before << " MiB";
}

std::vector<pair_case> streaming_pairs() {
  std::vector<pair_case> r;
  for (score_kind s : all_scores()) r.push_back({s, s == score_kind::box || s == score_kind::triangle
                                                        ? distribution_kind::kernel
                                                        : distribution_kind::softmax});
  for (distribution_kind d : {distribution_kind::sigmoid, distribution_kind::sparsemax, distribution_kind::entmax15,
                              distribution_kind::hardmax, distribution_kind::topk})
    r.push_back({score_kind::scaled_dot, d});
  r.push_back({score_kind::additive, distribution_kind::sigmoid});
  r.push_back({score_kind::additive, distribution_kind::entmax15});
  r.push_back({score_kind::additive, distribution_kind::sigmoid, true});
  r.push_back({score_kind::additive, distribution_kind::entmax15, true});
  r.push_back({score_kind::gaussian, distribution_kind::kernel});
  return r;
}

INSTANTIATE_TEST_SUITE_P(Pairs, FamilyMemory, ::testing::ValuesIn(streaming_pairs()),
                         [](const ::testing::TestParamInfo<pair_case>& i) {
                           return to_string(i.param.score) + (i.param.multi_dim ? "_md_" : "_") +
                                  to_string(i.param.dist);
                         });

}  // namespace
}  // namespace attn::testing

// tests/core/options_test.cc — the options API: TensorArg keeps temporaries alive (the
// documented examples, run under ASan by the asan preset), masking_options is shared by the
// core op and the family, execution is apart, the backend names and the one selector.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "attn/attn.h"
#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::random_tensor;

using testing::env_scope;

// include/attn/positional.h's example, as written there: the bias is a temporary Tensor that
// the option keeps alive. Under ASan a borrowed view would be a heap-use-after-free here.
TEST(options, documented_t5_bias_example_keeps_the_temporary_alive) {
  std::mt19937 rng(1);
  const std::int64_t H = 2, Nq = 5, Nk = 7;
  const Tensor table = random_tensor({32, H}, dtype::f32, rng);
  const Tensor q = random_tensor({1, H, Nq, 8}, dtype::f32, rng), k = random_tensor({1, H, Nk, 8}, dtype::f32, rng),
               v = random_tensor({1, H, Nk, 8}, dtype::f32, rng);
  attn::relative_position_options rp;
  attn::attention_options opt;
  opt.attn_mask = attn::relative_position_bias(table, Nq, Nk, rp);  // the temporary dies here
  opt.scale = 1.0;
  ASSERT_TRUE(opt.attn_mask->owns_storage());
  const attention_result r = attention(q, k, v, opt);

  const Tensor bias = relative_position_bias(table, Nq, Nk, rp);  // the same bias, kept by the test
  attention_options kept;
  kept.attn_mask = bias.view();  // borrowed
  kept.scale = 1.0;
  EXPECT_FALSE(kept.attn_mask->owns_storage());
  EXPECT_TRUE(all_close(r.out, attention(q, k, v, kept).out, 0.0));
}

// The same for a family parameter and for positions: options filled from temporaries.
TEST(options, family_parameters_and_positions_from_temporaries) {
  std::mt19937 rng(2);
  const Tensor q = random_tensor({1, 1, 3, 4}, dtype::f64, rng), k = random_tensor({1, 1, 5, 6}, dtype::f64, rng),
               v = random_tensor({1, 1, 5, 2}, dtype::f64, rng);
  family_options o;
  o.score.kind = score_kind::general;
  o.score.W = random_tensor({4, 6}, dtype::f64, rng);  // temporary
  const Tensor W = Tensor::copy_of(*o.score.W);
  const family_result a = attention_family(q, k, v, o);
  family_options b;
  b.score.kind = score_kind::general;
  b.score.W = W.view();
  EXPECT_TRUE(all_close(a.out, attention_family(q, k, v, b).out, 0.0));

  positions pos = Tensor::from_values({3}, dtype::i64, {4, 5, 6});  // a temporary id tensor
  const Tensor x = random_tensor({1, 3, 8}, dtype::f32, rng);
  EXPECT_TRUE(all_close(add_sinusoidal_encoding(x, pos), add_sinusoidal_encoding(x, 4), 1e-6));
}

// One masking block: the same fields mean the same for the core op and the family.
TEST(options, masking_options_shared_by_core_and_family) {
  std::mt19937 rng(3);
  const Tensor q = random_tensor({2, 2, 6, 4}, dtype::f64, rng), k = random_tensor({2, 1, 9, 4}, dtype::f64, rng),
               v = random_tensor({2, 1, 9, 3}, dtype::f64, rng);
  masking_options m;
  m.is_causal = true;
  m.alignment = causal_alignment::bottom_right;
  m.window_left = 3;
  m.attn_mask = testing::random_bool({6, 9}, rng, 0.8);
  m.nonpad_kv_seqlen = Tensor::from_values({2}, dtype::i64, {9, 7});
  attention_options ao;
  static_cast<masking_options&>(ao) = m;
  family_options fo;
  static_cast<masking_options&>(fo) = m;
  const execution ref{.use_backend = backend::reference, .path = family_path::reference};
  EXPECT_TRUE(all_close(attention_family(q, k, v, fo, ref).out, attention(q, k, v, ao, ref).out, 1e-12));
}

TEST(options, backend_and_path_names_round_trip) {
  for (backend b : {backend::automatic, backend::reference, backend::cpu, backend::cuda})
    EXPECT_EQ(parse_backend(to_string(b)), b);
  for (family_path p : {family_path::automatic, family_path::core, family_path::tiled, family_path::reference})
    EXPECT_EQ(parse_family_path(to_string(p)), p);
  EXPECT_THROW_MSG(parse_backend("tpu"), "backend: 'tpu' is not one of automatic, reference, cpu, cuda");
  EXPECT_THROW_MSG(parse_family_path("fast"), "family path: 'fast' is not one of automatic, core, tiled, reference");
#ifdef ATTN_HAS_CUDA
  EXPECT_EQ(backends(), (std::vector<std::string>{"cpu", "cuda", "reference"}));
#else
  EXPECT_EQ(backends(), (std::vector<std::string>{"cpu", "reference"}));
#endif
}

// explain_backend makes the same choice as the call — ATTN_BACKEND included — and names the
// path inside the backend.
TEST(options, explain_backend_is_the_selection_the_call_makes) {
  std::mt19937 rng(4);
  const Tensor q = random_tensor({1, 2, 64, 16}, dtype::f32, rng);
  const Tensor q1 = random_tensor({1, 2, 1, 16}, dtype::f32, rng), kl = random_tensor({1, 2, 5000, 16}, dtype::f32, rng);
  attention_options o;
  const std::string fwd = explain_backend(q, q, q, o);
  EXPECT_NE(fwd.find("runs on cpu ("), std::string::npos) << fwd;
  EXPECT_NE(fwd.find("prefill"), std::string::npos) << fwd;
  EXPECT_EQ(attention(q, q, q, o).backend, "cpu");
  const std::string dec = explain_backend(q1, kl, kl, o);
  EXPECT_NE(dec.find("decode"), std::string::npos) << dec;
  EXPECT_NE(dec.find("split-KV"), std::string::npos) << dec;
  EXPECT_NE(explain_backend(q, q, q, o, true).find("backward"), std::string::npos);
  {
    env_scope env("ATTN_BACKEND", "reference");
    const std::string s = explain_backend(q, q, q, o);
    EXPECT_NE(s.find("runs on reference"), std::string::npos) << s;
    EXPECT_EQ(s.find("cpu"), std::string::npos) << s;  // cpu is not tried: the variable forces the reference
    EXPECT_EQ(attention(q, q, q, o).backend, "reference");
    // An explicit choice wins over the variable.
    EXPECT_EQ(attention(q, q, q, o, {.use_backend = backend::cpu}).backend, "cpu");
    EXPECT_NE(explain_backend(q, q, q, o, false, {.use_backend = backend::cpu}).find("runs on cpu"), std::string::npos);
  }
  {
    env_scope env("ATTN_BACKEND", "gpu");
    EXPECT_NE(explain_backend(q, q, q, o).find("ATTN_BACKEND = 'gpu' names no backend"), std::string::npos);
    EXPECT_THROW_MSG(attention(q, q, q, o), "attention: ATTN_BACKEND = 'gpu' names no backend");
  }
  o.return_qk = qk_output::probabilities;  // the cpu backend returns the intermediates too
  const std::string qk = explain_backend(q, q, q, o);
  EXPECT_NE(qk.find("runs on cpu"), std::string::npos) << qk;
  EXPECT_EQ(attention(q, q, q, o).backend, "cpu");
  const Tensor q64 = q.to(dtype::f64);
  const std::string f64 = explain_backend(q64, q64, q64, o);
  EXPECT_NE(f64.find("cpu: float64 inputs need the reference; runs on reference"), std::string::npos) << f64;
}

TEST(options, execution_threads_checked) {
  std::mt19937 rng(5);
  const Tensor q = random_tensor({1, 1, 3, 4}, dtype::f32, rng);
  EXPECT_THROW_MSG(attention(q, q, q, {}, {.num_threads = -1}), "attention: num_threads = -1 must be >= 0");
  family_options f;
  EXPECT_THROW_MSG(attention_family(q, q, q, f, {.num_threads = -3}), "attention_family: num_threads = -3 must be >= 0");
}

}  // namespace
}  // namespace attn

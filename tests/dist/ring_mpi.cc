// tests/dist/ring_mpi.cc — attn::dist under mpirun (tests/CMakeLists.txt runs it with -np 2,
// 3 and 4): every rank builds the same full q/k/v from one seed, runs the ring on its shard,
// gathers, and compares out, lse and every gradient with one process's attn::attention /
// attention_backward on the full tensors. Bad input must throw the same attn::error on every
// rank (a hang fails by the CTest timeout).
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "attn/attn.h"
#include "attn/dist.h"
#include "test_util.h"

namespace {

using attn::Tensor;
using attn::TensorView;
using attn::dist::sequence_layout;

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
int world_size() {
  int p = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  return p;
}

// The same pseudo-random tensor on every rank (values in [-1, 1)).
Tensor random(const attn::Shape& shape, attn::dtype t, unsigned seed) {
  std::mt19937 rng(seed);
  return attn::testing::random_tensor(shape, t, rng);
}

// max |a - b| with -inf only where both are -inf; NaN anywhere fails.
void expect_near(const TensorView& got, const TensorView& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const std::vector<double> g = attn::to_vector(got), w = attn::to_vector(want);
  double worst = 0.0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    ASSERT_FALSE(std::isnan(g[i])) << what << " has NaN at " << i;
    if (std::isinf(w[i]) || std::isinf(g[i])) {
      ASSERT_EQ(g[i], w[i]) << what << " at " << i;
      continue;
    }
    if (std::abs(g[i] - w[i]) > worst) worst = std::abs(g[i] - w[i]), at = i;
  }
  EXPECT_LE(worst, tol) << what << ": worst at " << at << " (" << g[at] << " vs " << w[at] << ")";
}

struct ring_case {
  std::int64_t B = 1, Hq = 2, Hkv = 2, N = 16, D = 8, Dv = 8;
  attn::dtype type = attn::dtype::f32;
  attn::dist::ring_options opt;
};

// Forward and backward of the ring against one process, on every rank.
void check_case(const ring_case& c, const std::string& name) {
  SCOPED_TRACE(name + " layout " + std::string(attn::dist::to_string(c.opt.layout)) + " P " +
               std::to_string(world_size()));
  const int P = world_size(), r = world_rank();
  const Tensor q = random({c.B, c.Hq, c.N, c.D}, c.type, 1), k = random({c.B, c.Hkv, c.N, c.D}, c.type, 2);
  const Tensor v = random({c.B, c.Hkv, c.N, c.Dv}, c.type, 3), dout = random({c.B, c.Hq, c.N, c.Dv}, c.type, 4);
  const attn::execution one{.num_threads = 1};
  const attn::attention_options& base = c.opt;
  const auto want = attn::attention(q, k, v, base, one);
  const auto dwant = attn::attention_backward(q, k, v, want.out, dout, want.lse, base, one);

  const auto L = c.opt.layout;
  const Tensor ql = attn::dist::shard(q, P, r, L), kl = attn::dist::shard(k, P, r, L), vl = attn::dist::shard(v, P, r, L);
  const auto got = attn::dist::ring_attention(MPI_COMM_WORLD, ql, kl, vl, c.opt, one);
  const auto dgot = attn::dist::ring_attention_backward(MPI_COMM_WORLD, ql, kl, vl, got.out,
                                                        attn::dist::shard(dout, P, r, L), got.lse, c.opt, one);
  const double tol = c.type == attn::dtype::f64 ? 1e-10 : 1e-5;
  expect_near(attn::dist::gather(MPI_COMM_WORLD, got.out, L, -1), want.out, tol, "out");
  expect_near(attn::dist::gather(MPI_COMM_WORLD, got.lse, L, -1), want.lse, tol, "lse");
  expect_near(attn::dist::gather(MPI_COMM_WORLD, dgot.dq, L, -1), dwant.dq, tol, "dq");
  expect_near(attn::dist::gather(MPI_COMM_WORLD, dgot.dk, L, -1), dwant.dk, tol, "dk");
  expect_near(attn::dist::gather(MPI_COMM_WORLD, dgot.dv, L, -1), dwant.dv, tol, "dv");
  if (c.opt.alibi_slopes) expect_near(dgot.dalibi_slopes, dwant.dalibi_slopes, 10 * tol, "dalibi_slopes");
  if (c.opt.sinks) expect_near(dgot.dsinks, dwant.dsinks, 10 * tol, "dsinks");
  EXPECT_EQ(got.stats.steps.size(), std::size_t(P));
}

// Runs `make` for both layouts.
void both_layouts(ring_case c, const std::string& name) {
  for (auto L : {sequence_layout::contiguous, sequence_layout::zigzag}) {
    c.opt.layout = L;
    check_case(c, name);
  }
}

TEST(Ring, Plain) { both_layouts({}, "plain"); }

TEST(Ring, Causal) {
  ring_case c;
  c.opt.is_causal = true;
  both_layouts(c, "causal");
}

TEST(Ring, GqaUnevenDv) {  // Hq = 4 reads Hkv = 2; Dv != D; N = 19 divides by no P of 2, 3, 4
  ring_case c;
  c.Hq = 4, c.Hkv = 2, c.N = 19, c.Dv = 5, c.B = 2;
  both_layouts(c, "gqa");
  c.opt.is_causal = true;
  both_layouts(c, "gqa causal");
}

TEST(Ring, Float64) {
  ring_case c;
  c.type = attn::dtype::f64, c.Hq = 4, c.Hkv = 1, c.N = 13, c.opt.is_causal = true;
  both_layouts(c, "f64 causal mqa");
}

TEST(Ring, Windows) {
  ring_case c;
  c.N = 23, c.opt.window_left = 3, c.opt.window_right = 2;
  both_layouts(c, "window (3, 2)");
  c.opt.is_causal = true, c.opt.window_left = 5, c.opt.window_right = -1;
  both_layouts(c, "causal window 5");
}

TEST(Ring, ShortSequence) {  // N < 2P: empty zigzag chunks, and ranks with no rows at all (P = 4)
  ring_case c;
  c.N = 3, c.opt.is_causal = true;
  both_layouts(c, "N = 3");
}

TEST(Ring, LongShardsCutIntoPieces) {  // shards of more than 256 rows run as several kernel calls per step
  ring_case c;
  c.Hq = 1, c.Hkv = 1, c.N = 1100, c.D = 4, c.Dv = 4, c.opt.is_causal = true;
  both_layouts(c, "N = 1100");
}

TEST(Ring, SoftcapAlibiSinksPadding) {  // positions are global: ALiBi distances, bottom_right with padding
  ring_case c;
  c.B = 2, c.Hq = 2, c.Hkv = 1, c.N = 17;
  c.opt.softcap = 2.0;
  c.opt.alibi_slopes = Tensor::from_values({2}, attn::dtype::f32, {0.25, 0.5});
  both_layouts(c, "softcap alibi");
  c.opt.sinks = Tensor::from_values({2}, attn::dtype::f32, {0.3, -1.0});
  c.opt.is_causal = true;
  both_layouts(c, "causal softcap alibi sinks");
  c.opt.nonpad_kv_seqlen = Tensor::from_values({2}, attn::dtype::i64, {11, 17});
  c.opt.alignment = attn::causal_alignment::bottom_right;
  both_layouts(c, "bottom_right padding");
  c.opt.sinks.reset();
  c.opt.alignment = attn::causal_alignment::top_left;
  c.opt.nonpad_kv_seqlen = Tensor::from_values({2}, attn::dtype::i64, {0, 9});  // batch 0 fully masked
  both_layouts(c, "fully masked batch");
}

// Causal zigzag gives every rank the same number of unmasked scores (within 10 % of the mean);
// contiguous does not — the check can fail.
TEST(Ring, ZigzagBalancesCausalWork) {
  const int P = world_size(), r = world_rank();
  const std::int64_t N = 24 * P + 5;
  const Tensor q = random({1, 1, N, 4}, attn::dtype::f32, 5);
  for (auto L : {sequence_layout::zigzag, sequence_layout::contiguous}) {
    attn::dist::ring_options opt;
    opt.is_causal = true, opt.layout = L;
    const Tensor ql = attn::dist::shard(q, P, r, L);
    const auto res = attn::dist::ring_attention(MPI_COMM_WORLD, ql, ql, ql, opt, {.num_threads = 1});
    std::int64_t mine = res.stats.scores();
    std::vector<std::int64_t> all(static_cast<std::size_t>(P));
    MPI_Allgather(&mine, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD);
    double total = 0, worst = 0;
    for (auto a : all) total += double(a);
    EXPECT_EQ(total, double(N * (N + 1) / 2));  // every unmasked score once
    for (auto a : all) worst = std::max(worst, std::abs(double(a) - total / P) / (total / P));
    if (L == sequence_layout::zigzag) EXPECT_LE(worst, 0.10) << "zigzag imbalance";
    else EXPECT_GT(worst, 0.10) << "contiguous causal is expected to be unbalanced";
  }
}

// A sliding window on a contiguous layout: blocks more than one rank away are fully masked,
// so those steps compute nothing (the block only travels on).
TEST(Ring, WindowSkipsFarBlocks) {
  const int P = world_size(), r = world_rank();
  const std::int64_t N = 8 * P;
  const Tensor q = random({1, 1, N, 4}, attn::dtype::f32, 6);
  attn::dist::ring_options opt;
  opt.is_causal = true, opt.window_left = 3;
  const Tensor ql = attn::dist::shard(q, P, r, opt.layout);
  const auto res = attn::dist::ring_attention(MPI_COMM_WORLD, ql, ql, ql, opt, {.num_threads = 1});
  ASSERT_EQ(res.stats.steps.size(), std::size_t(P));
  for (int s = 2; s < P; ++s) EXPECT_EQ(res.stats.steps[std::size_t(s)].scores, 0) << "step " << s;
  if (r > 0 && P > 1) {
    EXPECT_EQ(res.stats.steps[1].scores, 6) << "3 + 2 + 1 scores reach the previous rank";
  }
}

TEST(Shard, GatherInvertsShard) {
  const int P = world_size(), r = world_rank();
  const Tensor full = random({2, 11, 3}, attn::dtype::f32, 7);
  for (auto L : {sequence_layout::contiguous, sequence_layout::zigzag})
    for (int dim : {1, 0}) {
      const Tensor part = attn::dist::shard(full, P, r, L, dim);
      const Tensor back = attn::dist::gather(MPI_COMM_WORLD, part, L, 0, dim);
      if (r == 0) expect_near(back, full, 0.0, "gather to rank 0");
      else EXPECT_FALSE(back.defined());
      expect_near(attn::dist::gather(MPI_COMM_WORLD, part, L, -1, dim), full, 0.0, "gather to all");
    }
  const auto segs = attn::dist::sequence_segments(10, 2, 1, sequence_layout::zigzag);  // chunks 3,3,2,2
  ASSERT_EQ(segs.size(), 2u);
  EXPECT_EQ(segs[0].begin, 3);
  EXPECT_EQ(segs[1].begin, 6);
  EXPECT_EQ(segs[1].length, 2);
}

// Every rank must throw attn::error whose message holds `part` (a rank that did not would
// leave the others blocked: the CTest timeout fails that).
void expect_error_everywhere(const std::function<void()>& f, const std::string& part) {
  std::string msg = "(no error)";
  try {
    f();
  } catch (const attn::error& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find(part), std::string::npos) << "message: " << msg;
}

TEST(RingErrors, EveryRankThrows) {
  const int P = world_size(), r = world_rank();
  const Tensor x = random({1, 2, 4, 8}, attn::dtype::f32, 8);
  attn::dist::ring_options opt;
  auto ring = [&](const TensorView& q, const TensorView& k, const attn::dist::ring_options& o) {
    return [q = TensorView(q), k = TensorView(k), o] { attn::dist::ring_attention(MPI_COMM_WORLD, q, k, k, o); };
  };

  // One rank's head size differs: every rank names the shapes.
  const Tensor odd = random({1, 2, 4, r == P - 1 ? 6 : 8}, attn::dtype::f32, 9);
  expect_error_everywhere(ring(odd, odd, opt), "ring_attention: ranks disagree on shapes");
  // One rank's dtype is not supported: every rank names that rank and the dtype.
  const Tensor half = x.to(r == 0 ? attn::dtype::f16 : attn::dtype::f32);
  expect_error_everywhere(ring(half, half, opt), "ring_attention: rank 0: q has dtype float16");
  // Options that differ between ranks.
  attn::dist::ring_options causal_here = opt;
  causal_here.is_causal = r == 0;
  if (P > 1) expect_error_everywhere(ring(x, x, causal_here), "ranks disagree on options");
  // Shards that do not match the layout (rank 0 one row short).
  const TensorView short_x = r == 0 ? x.view().slice(2, 0, 3) : x.view();
  expect_error_everywhere(ring(short_x, short_x, opt), "layout of N =");
  // Unsupported options, by name.
  attn::dist::ring_options masked = opt;
  masked.attn_mask = Tensor::full({4, 4}, attn::dtype::boolean, 1.0);
  expect_error_everywhere(ring(x, x, masked), "attn_mask is not supported");
  attn::dist::ring_options qk = opt;
  qk.return_qk = attn::qk_output::probabilities;
  expect_error_everywhere(ring(x, x, qk), "return_qk is not supported");
  const Tensor x3 = random({1, 4, 16}, attn::dtype::f32, 10);
  attn::dist::ring_options heads = opt;
  heads.q_num_heads = 2, heads.kv_num_heads = 2;
  expect_error_everywhere(ring(x3, x3, heads), "ring attention takes 4-D shards");
  attn::dist::ring_options pad = opt;
  pad.nonpad_kv_seqlen = Tensor::from_values({1}, attn::dtype::i64, {double(4 * P + 1)});
  expect_error_everywhere(ring(x, x, pad), "is outside [0, " + std::to_string(4 * P) + "]");
  // A bad communicator.
  expect_error_everywhere([&] { attn::dist::ring_attention(MPI_COMM_NULL, x, x, x, opt); }, "comm is MPI_COMM_NULL");
  // The backward checks its own arguments the same way.
  const auto fwd = attn::dist::ring_attention(MPI_COMM_WORLD, x, x, x, opt);
  const TensorView bad_lse = r == 0 ? fwd.lse.view().slice(2, 0, 2) : fwd.lse.view();
  expect_error_everywhere(
      [&] { attn::dist::ring_attention_backward(MPI_COMM_WORLD, x, x, x, fwd.out, fwd.out, bad_lse, opt); },
      "ring_attention_backward: rank 0: lse has shape [1, 2, 2], expected [1, 2, 4]");
  // gather with a shard of another shape.
  expect_error_everywhere([&] { attn::dist::gather(MPI_COMM_WORLD, odd, sequence_layout::contiguous); },
                          P > 1 ? "only dim 2 may differ" : "(no error)");
  expect_error_everywhere([] { attn::dist::parse_sequence_layout("striped"); }, "expected contiguous or zigzag");
}

// Prints the failures of ranks other than 0 (whose output gtest's default printer owns).
class rank_failure_printer : public ::testing::EmptyTestEventListener {
 public:
  explicit rank_failure_printer(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      std::fprintf(stderr, "[rank %d] %s:%d: %s\n", rank_, r.file_name() ? r.file_name() : "?", r.line_number(),
                   r.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const int rank = world_rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new rank_failure_printer(rank));
  }
  int rc = RUN_ALL_TESTS();
  MPI_Allreduce(MPI_IN_PLACE, &rc, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);  // any rank failing fails the run
  MPI_Finalize();
  return rc;
}

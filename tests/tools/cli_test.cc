// tests/tools/cli_test.cc — the `attn` tool end to end: conformance summary and exit codes, `run`
// against the C++ API, and bad arguments or files (a message and exit status 2, no crash).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include "test_util.h"
#include "viz/png_read.h"

namespace attn {
namespace {
namespace fs = std::filesystem;

struct proc_result {
  int code;
  std::string out;
};

proc_result sh(const std::string& args) {
  const std::string cmd = std::string(ATTN_CLI) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

fs::path scratch(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("attn_cli_test_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

TEST(Cli, ConformancePassesShippedCases) {
  const auto r = sh(std::string("conformance ") + ATTN_CONFORMANCE_DIR);
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("38 passed, 0 failed\n"), std::string::npos) << r.out;
}

TEST(Cli, ConformanceReportsAFailingCase) {
  const fs::path d = scratch("conf");
  const fs::path src = fs::path(ATTN_CONFORMANCE_DIR) / "attention_4d_scaled";
  fs::copy(src, d / "broken", fs::copy_options::recursive);
  fs::copy(src, d / "fine", fs::copy_options::recursive);
  Tensor y = read_npy((d / "broken" / "expected_Y.npy").string());
  y.set({0, 0, 0, 0}, y.get({0, 0, 0, 0}) + 0.5);
  write_npy((d / "broken" / "expected_Y.npy").string(), y);
  const auto r = sh("conformance " + d.string());
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("FAIL broken: Y: worst error 0.5"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("1 passed, 1 failed"), std::string::npos) << r.out;
  std::ofstream(d / "broken" / "case.json") << "{not json";
  EXPECT_NE(sh("conformance " + d.string()).out.find("case.json is not valid JSON"), std::string::npos);
}

TEST(Cli, RunMatchesTheApiAndWritesGradients) {
  const fs::path d = scratch("run");
  std::mt19937 rng(3);
  Tensor q = testing::random_tensor({1, 4, 5, 8}, dtype::f32, rng), k = testing::random_tensor({1, 2, 7, 8}, dtype::f32, rng),
         v = testing::random_tensor({1, 2, 7, 3}, dtype::f32, rng), dout = testing::random_tensor({1, 4, 5, 3}, dtype::f32, rng);
  for (auto [n, t] : {std::pair{"q", &q}, {"k", &k}, {"v", &v}, {"dout", &dout}}) write_npy((d / (std::string(n) + ".npy")).string(), *t);
  auto f = [&](const char* n) { return (d / n).string(); };
  const auto r = sh("run --q " + f("q.npy") + " --k " + f("k.npy") + " --v " + f("v.npy") + " --causal --alignment bottom_right" +
                    " --softcap 2 --out " + f("out.npy") + " --lse " + f("lse.npy") + " --dout " + f("dout.npy") +
                    " --dq " + f("dq.npy") + " --dk " + f("dk.npy") + " --dv " + f("dv.npy"));
  ASSERT_EQ(r.code, 0) << r.out;
  attention_options o;
  o.is_causal = true, o.alignment = causal_alignment::bottom_right, o.softcap = 2;
  const auto want = attention(q, k, v, o);
  const auto g = attention_backward(q, k, v, want.out, dout, want.lse, o);
  EXPECT_TRUE(testing::all_close(read_npy(f("out.npy")), want.out, 0));
  EXPECT_TRUE(testing::all_close(read_npy(f("lse.npy")), want.lse, 0));
  EXPECT_TRUE(testing::all_close(read_npy(f("dq.npy")), g.dq, 0));
  EXPECT_TRUE(testing::all_close(read_npy(f("dk.npy")), g.dk, 0));
  EXPECT_TRUE(testing::all_close(read_npy(f("dv.npy")), g.dv, 0));
}

// --probs-png draws one (batch, head) of the probabilities: the decoded PNG has the size the
// layout of an [Nq, Nk] map gives, and every cell the colour of that head's probability on the
// fixed [0, 1] scale (the causal first row attends to key 0 alone: the top colour there).
TEST(Cli, RunDrawsOneHeadsProbabilitiesAsAPng) {
  const fs::path d = scratch("png");
  std::mt19937 rng(5);
  const Tensor q = testing::random_tensor({2, 3, 5, 4}, dtype::f32, rng), k = testing::random_tensor({2, 3, 7, 4}, dtype::f32, rng);
  write_npy((d / "q.npy").string(), q);
  write_npy((d / "k.npy").string(), k);
  const std::string qkv = " --q " + (d / "q.npy").string() + " --k " + (d / "k.npy").string() + " --v " + (d / "k.npy").string() +
                          " --out " + (d / "o.npy").string();
  const std::string png = (d / "p.png").string();
  auto r = sh("run" + qkv + " --causal --probs-png " + png + " --probs-head 1,2 --probs " + (d / "p.npy").string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::vector<std::string> rows, cols;
  for (int i = 0; i < 5; ++i) rows.push_back(std::to_string(i));
  for (int j = 0; j < 7; ++j) cols.push_back(std::to_string(j));
  const viz::heatmap_layout l = viz::layout_heatmap(5, 7, rows, cols, {.title = "probabilities, batch 1 head 2"});
  auto p = testing::read_png(png);
  ASSERT_TRUE(p.error.empty()) << p.error;
  EXPECT_EQ(p.width, l.width);
  EXPECT_EQ(p.height, l.height);
  const Tensor probs = read_npy((d / "p.npy").string());
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j) {
      const viz::rgb want = viz::colour_at(probs.get({1, 2, i, j}));
      EXPECT_EQ(p.at(l.map_x + j * l.cell + l.cell / 2, l.map_y + i * l.cell + l.cell / 2), want) << i << ", " << j;
    }
  // The family path draws its weights too (default head 0,0).
  r = sh("run" + qkv + " --score cosine --distribution sparsemax --probs-png " + png);
  ASSERT_EQ(r.code, 0) << r.out;
  p = testing::read_png(png);
  EXPECT_EQ(p.width, l.width);
  EXPECT_GT(p.dark_pixels(l.row_label_x, l.map_y, l.row_label_w, 5 * l.cell), 10);
  // Bad --probs-head: a message and exit status 2.
  r = sh("run" + qkv + " --probs-png " + png + " --probs-head 2,0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("attn run: --probs-head 2,0 is outside the probabilities [2, 3, 5, 7] (batch < 2, head < 3)"),
            std::string::npos) << r.out;
  r = sh("run" + qkv + " --probs-png " + png + " --probs-head 1:2");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("attn run: --probs-head \"1:2\" is not B,H"), std::string::npos) << r.out;
  r = sh("run" + qkv + " --probs-head 0,1");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("attn run: --probs-head needs --probs-png"), std::string::npos) << r.out;
  r = sh("run" + qkv + " --probs-png /nonexistent-attn-dir/p.png");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("write_heatmap: path \"/nonexistent-attn-dir/p.png\" cannot be written"), std::string::npos) << r.out;
}

// The family's newer members through `attn run`: biased_general with b [Dk] and its gradient,
// distribution identity, the gaussian's width form, linear attention forward and backward;
// each against the C++ API on the same files, and refusals by message.
TEST(Cli, RunFamilyMembersAndLinearAttention) {
  const fs::path d = scratch("fam");
  std::mt19937 rng(8);
  const Tensor q = testing::random_tensor({1, 2, 5, 3}, dtype::f64, rng), k = testing::random_tensor({1, 1, 6, 4}, dtype::f64, rng),
               k3 = testing::random_tensor({1, 1, 6, 3}, dtype::f64, rng), v = testing::random_tensor({1, 1, 6, 2}, dtype::f64, rng),
               dout = testing::random_tensor({1, 2, 5, 2}, dtype::f64, rng), W = testing::random_tensor({3, 4}, dtype::f64, rng),
               b = testing::random_tensor({4}, dtype::f64, rng);
  const Tensor lens = Tensor::from_values({1}, dtype::i64, {4.0});
  auto f = [&](const std::string& n) { return (d / (n + ".npy")).string(); };
  for (auto [n, t] : {std::pair{"q", &q}, {"k", &k}, {"k3", &k3}, {"v", &v}, {"dout", &dout}, {"W", &W}, {"b", &b}, {"lens", &lens}})
    write_npy(f(n), *t);
  const std::string base = "run --q " + f("q") + " --v " + f("v") + " --out " + f("out");
  // biased_general: e = kᵀ(Wᵀq + b), with db.
  auto r = sh(base + " --k " + f("k") + " --score biased_general --W " + f("W") + " --b " + f("b") + " --dout " +
              f("dout") + " --db " + f("db") + " --dq " + f("dq"));
  ASSERT_EQ(r.code, 0) << r.out;
  family_options o;
  o.score.kind = score_kind::biased_general, o.score.W = W.view(), o.score.b = b.view();
  EXPECT_TRUE(testing::all_close(read_npy(f("out")), attention_family(q, k, v, o).out, 0));
  const family_grads g = attention_family_backward(q, k, v, dout, o);
  EXPECT_TRUE(testing::all_close(read_npy(f("db")), g.db, 0));
  EXPECT_EQ(read_npy(f("db")).shape(), (Shape{4}));
  EXPECT_TRUE(testing::all_close(read_npy(f("dq")), g.dq, 0));
  // identity, and the gaussian's width form.
  r = sh(base + " --k " + f("k3") + " --distribution identity");
  ASSERT_EQ(r.code, 0) << r.out;
  family_options id;
  id.distribution.kind = distribution_kind::identity;
  EXPECT_TRUE(testing::all_close(read_npy(f("out")), attention_family(q, k3, v, id).out, 0));
  r = sh(base + " --k " + f("k3") + " --score gaussian --gaussian-form width --bandwidth 3 --distribution kernel");
  ASSERT_EQ(r.code, 0) << r.out;
  family_options gw;
  gw.score.kind = score_kind::gaussian, gw.score.gaussian = gaussian_form::width, gw.score.bandwidth = 3;
  gw.distribution.kind = distribution_kind::kernel;
  EXPECT_TRUE(testing::all_close(read_npy(f("out")), attention_family(q, k3, v, gw).out, 0));
  // Linear attention: causal, bottom-right, padded; forward and gradients.
  r = sh(base + " --k " + f("k3") + " --linear relu --causal --alignment bottom_right --nonpad-kv-seqlen " + f("lens") +
         " --dout " + f("dout") + " --dq " + f("dq") + " --dk " + f("dk") + " --dv " + f("dv"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("linear attention, relu, path linear (f64)"), std::string::npos) << r.out;
  linear_attention_options lo;
  lo.phi = feature_map::relu, lo.is_causal = true, lo.alignment = causal_alignment::bottom_right;
  lo.nonpad_kv_seqlen = lens.view();
  EXPECT_TRUE(testing::all_close(read_npy(f("out")), linear_attention(q, k3, v, lo).out, 0));
  const linear_attention_grads lg = linear_attention_backward(q, k3, v, dout, lo);
  EXPECT_TRUE(testing::all_close(read_npy(f("dq")), lg.dq, 0));
  EXPECT_TRUE(testing::all_close(read_npy(f("dk")), lg.dk, 0));
  EXPECT_TRUE(testing::all_close(read_npy(f("dv")), lg.dv, 0));
  // The same lengths as an int32 .npy (<i4): the same result.
  write_npy(f("lens32"), lens.to(dtype::i32));
  r = sh(base + " --k " + f("k3") + " --linear relu --causal --alignment bottom_right --nonpad-kv-seqlen " + f("lens32"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(testing::all_close(read_npy(f("out")), linear_attention(q, k3, v, lo).out, 0));
  r = sh(base + " --k " + f("k3") + " --linear elu_plus_one --linear-unnormalised --family-path reference");
  ASSERT_EQ(r.code, 0) << r.out;
  lo = {}, lo.normalize = false;
  EXPECT_TRUE(testing::all_close(read_npy(f("out")), linear_attention(q, k3, v, lo).out, 1e-12));
  // Refusals: exit status 2 and a message naming the option.
  for (auto [args, msg] : {std::pair<std::string, std::string>{" --linear relu --score dot", "attn run: --score does not apply to --linear"},
                           {" --linear relu --mask " + f("lens"), "linear_attention: takes no attn_mask"},
                           {" --linear relu --softcap 2", "attn run: --softcap is an option of the core op, not of --linear"},
                           {" --linear-unnormalised", "attn run: --linear-unnormalised needs --linear"},
                           {" --gaussian-form width", "attn run: --gaussian-form needs --score gaussian"},
                           {" --score cosine --gaussian-form width", "attn run: --gaussian-form width needs --score gaussian (got cosine)"},
                           {" --linear gelu", "--linear: gelu not in {elu_plus_one,relu,identity}"}}) {
    r = sh(base + " --k " + f("k3") + args);
    EXPECT_EQ(r.code, 2) << args;
    EXPECT_NE(r.out.find(msg), std::string::npos) << args << ": " << r.out;
  }
}

// `attn bench --paged P --pass both`: the paged forward and backward beside the dense op on a
// tiny cache, one rep; an int8 cache has no backward, --varlen no backward timing (exit 2).
TEST(Cli, BenchPagedBackward) {
  const std::string tiny = "bench --paged 4 --batch 2 --hq 2 --hkv 1 --nq 3 --nk 8 --d 4 --reps 1 --warmup 0 --threads 1 --probe-mib 0";
  auto r = sh(tiny + " --pass both");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want : {"attn bench --paged 4: B 2 Nq 3 Nk 8 Hq 2 Hkv 1 D 4", "paged head-major", "backward: dense",
                           "paged token-major"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  EXPECT_EQ(sh(tiny).out.find("backward: dense"), std::string::npos);
  r = sh(tiny + " --kv-dtype int8 --backward");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--kv-dtype int8 has no backward"), std::string::npos) << r.out;
  r = sh("bench --varlen 2:5 --batch 2 --hq 2 --d 4 --reps 1 --warmup 0 --threads 1 --probe-mib 0 --pass backward");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--varlen times the forward"), std::string::npos) << r.out;
}

// `attn bench --ab VAR=A,B`: attn twice, the knob at each value, a row each and the line of
// paired ratios per pass; malformed specs and combinations it does not time are refused.
TEST(Cli, BenchAbAlternatesAKnob) {
  const std::string tiny = "bench --hq 2 --nq 16 --d 8 --reps 4 --warmup 0 --threads 1 --probe-mib 0 --peers none";
  auto r = sh(tiny + " --pass both --ab ATTN_CPU_BACKWARD=fused,two_pass");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want :
       {"attn[fused]", "attn[two_pass]",
        "ab: B1 Hq2 Nq16 Nk16 D8 f32 forward, 1 thread: ATTN_CPU_BACKWARD=two_pass / ATTN_CPU_BACKWARD=fused: median "
        "of 4 paired time ratios",
        "ab: B1 Hq2 Nq16 Nk16 D8 f32 backward, 1 thread: ATTN_CPU_BACKWARD=two_pass / ATTN_CPU_BACKWARD=fused: median "
        "of 4 paired time ratios",
        "two_pass faster in"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  // Each contender's calls see its own value (ATTN_BACKEND picks the backend the row names).
  r = sh(tiny + " --json --ab ATTN_BACKEND=reference,cpu");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find(R"("impl": "attn[reference]", "peer": false, "backend": "reference")"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(R"("impl": "attn[cpu]", "peer": false, "backend": "cpu")"), std::string::npos) << r.out;
  for (auto [ab, msg] : {std::pair<std::string, std::string>{"X", "--ab 'X': no '='"},
                         {"=a,b", "no variable before '='"},
                         {"V=a", "no ',' between the two values"},
                         {"V=a,a", "the two values are the same"},
                         {"V=a,b,c", "more than two values"},
                         {"V-1=a,b", "the variable's name is not [A-Za-z0-9_]"}}) {
    r = sh(tiny + " --ab " + ab);
    EXPECT_EQ(r.code, 2) << ab;
    EXPECT_NE(r.out.find(msg), std::string::npos) << ab << ": " << r.out;
  }
  // The decode step of --kv-cache too, a line per mode.
  // (--check: each row's step checked under its own value of the knob)
  r = sh("bench --hq 2 --nq 1 --nk 9 --d 8 --reps 4 --warmup 0 --threads 1 --probe-mib 0 --kv-cache both --json "
         "--check --ab ATTN_BACKEND=reference,cpu");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want : {R"("config": "kv-cache", "impl": "attn[reference]", "peer": false, "backend": "reference")",
                           R"("config": "kv-cache", "impl": "attn[cpu]", "peer": false, "backend": "cpu")",
                           R"("config": "kv-cache-onnx", "impl": "attn[cpu]", "peer": false, "backend": "cpu")",
                           "f32 kv-cache, 1 thread: ATTN_BACKEND=cpu / ATTN_BACKEND=reference: median of 4",
                           "f32 kv-cache-onnx, 1 thread: ATTN_BACKEND=cpu / ATTN_BACKEND=reference: median of 4"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  r = sh(tiny + " --ab V=a,b --grid standard");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--ab times the plain attention call, the --kv-cache step, the family's pairs"), std::string::npos)
      << r.out;
  // --paged and --varlen: every contender under each value, a report per value and a line per contender.
  r = sh("bench --paged 4 --batch 2 --hq 2 --hkv 1 --nq 3 --nk 8 --d 4 --reps 4 --warmup 0 --threads 1 --probe-mib 0 "
         "--kv-dtype int8 --dtype bf16 --ab ATTN_DECODE_INT8=widen,auto");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want : {"[ATTN_DECODE_INT8=widen]", "[ATTN_DECODE_INT8=auto]",
                           "ab: paged 4 B2 Nq3 Nk8 K/V int8 dense, 1 thread: ATTN_DECODE_INT8=auto / ATTN_DECODE_INT8=widen: "
                           "median of 4 paired time ratios",
                           "ab: paged 4 B2 Nq3 Nk8 K/V int8 paged token-major, 1 thread", "K/V int8 bf16 dense, 1 thread"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  r = sh("bench --varlen 4:9 --batch 3 --hq 2 --d 4 --reps 4 --warmup 0 --threads 1 --probe-mib 0 --ab V=x,y");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want : {"[V=x]", "[V=y]", "ab: varlen B3 float32 varlen, 1 thread: V=y / V=x: median of 4",
                           "ab: varlen B3 float32 padded, 1 thread", "ab: varlen B3 float32 one sequence, 1 thread"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  // The knob reaches the serving calls: a value that names no backend fails them, by message.
  r = sh("bench --varlen 4:9 --batch 3 --hq 2 --d 4 --reps 2 --warmup 0 --threads 1 --probe-mib 0 --ab "
         "ATTN_BACKEND=cpu,bogus");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("ATTN_BACKEND = 'bogus' names no backend"), std::string::npos) << r.out;
  // A family pair: each contender's calls take their own path (ATTN_FAMILY_PATH, read per call).
  r = sh("bench --hq 2 --nq 9 --d 4 --reps 4 --warmup 0 --threads 1 --peers none --score additive "
         "--additive-hidden 3 --pass both --ab ATTN_FAMILY_PATH=tiled,fused");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want : {"attn[tiled]", "attn[fused]", "path tiled", "path fused (",
                           "ab: additive x softmax B1 Hq2 Nq9 Nk9 D4 forward, 1 thread: ATTN_FAMILY_PATH=fused / "
                           "ATTN_FAMILY_PATH=tiled: median of 4 paired time ratios",
                           "ab: additive x softmax B1 Hq2 Nq9 Nk9 D4 fwd+bwd, 1 thread"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
}

// `attn bench --score/--distribution`: the family benchmark on a tiny shape, one rep, the
// in-process peers (the tiled path, attn::attention itself); the machine's probes in the header;
// bad combinations refused.
TEST(Cli, BenchFamilyPairs) {
  const std::string tiny = "bench --hq 2 --nq 9 --d 4 --reps 1 --warmup 0 --threads 1 --probe-mib 0";
  auto r = sh(tiny + " --score scaled_dot --distribution softmax --pass both --peers tiled,core");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("# probes, 1 thread: FMA peak f32 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("DRAM read not probed (--probe-mib 0)"), std::string::npos) << r.out;
  for (const char* want : {"scaled_dot x softmax", "B1 Hq2 Nq9 Nk9 D4", "forward", "fwd+bwd", "attn_tiled",
                           "attn_core", "attn::attention, backend", "path core ("})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  r = sh("bench --hq 2 --nq 9 --d 4 --reps 1 --warmup 0 --score dot --peers none --probe-mib 8 --threads 1,2");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* want : {"# probes, 1 thread: FMA peak f32 ", "# probes, 2 threads: FMA peak f32 ", " GB/s\n"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  r = sh(tiny + " --score additive --distribution entmax15 --additive-hidden 3 --causal --peers tiled");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("additive x entmax15"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("path fused ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attn_tiled"), std::string::npos) << r.out;
  r = sh(tiny + " --score additive --distribution entmax15 --additive-hidden 3 --causal --peers tiled --family-path tiled");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("path tiled"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("attn_tiled"), std::string::npos) << "attn's path is tiled already\n" << r.out;
  for (const char* d : {"sigmoid", "sparsemax", "hardmax", "topk", "identity"}) {
    r = sh(tiny + " --distribution " + std::string(d) + " --topk 2 --peers none --pass backward");
    EXPECT_EQ(r.code, 0) << d << r.out;
    EXPECT_NE(r.out.find("scaled_dot x " + std::string(d)), std::string::npos) << r.out;
  }
  r = sh(tiny + " --score gaussian --distribution kernel --gaussian-form width --python /nonexistent/python --peers torch");
  EXPECT_EQ(r.code, 0) << r.out;
  r = sh(tiny + " --score dot --peers blas");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("'blas' is not one of torch, tiled, core, none"), std::string::npos) << r.out;
  r = sh(tiny + " --grid family --score dot");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--grid family runs every pair"), std::string::npos) << r.out;
  r = sh(tiny + " --score box --distribution softmax --additive-hidden 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("--additive-hidden 0 must be >= 1"), std::string::npos) << r.out;
  // box and triangle default to the median distance of the inputs (at 1 every key is outside)
  r = sh(tiny + " --score box --distribution kernel --peers none");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("bandwidth 1 (gaussian), sqrt(2D/3) (box, triangle"), std::string::npos) << r.out;
  r = sh(tiny + " --score triangle --distribution kernel --peers none --bandwidth 2.5");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("topk k = 8, bandwidth 2.5\n"), std::string::npos) << r.out;
  r = sh(tiny + " --score box --distribution kernel --bandwidth 0");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("attn bench: --bandwidth 0 must be > 0"), std::string::npos) << r.out;
}

TEST(Cli, BadInputExitsWithStatus2AndAMessage) {
  const fs::path d = scratch("bad");
  Tensor q = Tensor::zeros({1, 2, 3, 4}, dtype::f32), k = Tensor::zeros({1, 3, 3, 4}, dtype::f32);
  write_npy((d / "q.npy").string(), q);
  write_npy((d / "k.npy").string(), k);
  std::ofstream(d / "junk.npy") << "not an npy file";
  const std::string qf = (d / "q.npy").string(), kf = (d / "k.npy").string(), jf = (d / "junk.npy").string();
  const std::string out = " --out " + (d / "o.npy").string();
  auto r = sh("run --q " + qf + " --k " + kf + " --v " + kf + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("attn: attention: q has 2 heads and k/v 3"), std::string::npos) << r.out;
  r = sh("run --q " + jf + " --k " + kf + " --v " + kf + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("not a .npy file"), std::string::npos) << r.out;
  r = sh("run --q " + qf + " --k " + qf + " --v " + qf + " --alignment sideways" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("sideways"), std::string::npos) << r.out;
  r = sh("run --q " + qf + " --k " + qf + " --v " + qf + " --dq x.npy" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("gradients need --dout"), std::string::npos) << r.out;
  // The cuda backend, named, refuses float32 inputs (or, without a device, says so): exit 2.
  r = sh("run --q " + qf + " --k " + qf + " --v " + qf + " --backend cuda" + out);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("attention: no backend can run this call: cuda: "), std::string::npos) << r.out;
  EXPECT_EQ(sh("conformance " + (d / "nope").string()).code, 2);
  EXPECT_EQ(sh("frobnicate").code, 2);
  EXPECT_EQ(sh("").code, 2);
  EXPECT_EQ(sh("run --help").code, 0);
}

// Issue 14: no output is lost without a word, no argument crashes the tool.
TEST(Cli, EveryOutputWriteIsChecked) {
  const fs::path d = scratch("full");
  std::mt19937 rng(5);
  for (const char* n : {"q", "dout"}) write_npy((d / (std::string(n) + ".npy")).string(), testing::random_tensor({1, 2, 3, 4}, dtype::f32, rng));
  const std::string in = " --q " + (d / "q.npy").string() + " --k " + (d / "q.npy").string() + " --v " + (d / "q.npy").string();
  const std::string out = " --out " + (d / "o.npy").string();
  for (const std::string flag : {"--lse", "--dq", "--dv"}) {
    const auto r = sh("run" + in + out + " --dout " + (d / "dout.npy").string() + " " + flag + " /dev/full");
    EXPECT_EQ(r.code, 2) << flag;
    EXPECT_NE(r.out.find("npy: /dev/full: write failed"), std::string::npos) << r.out;
  }
}

TEST(Cli, OnePathForTwoFilesIsRefusedNamingBoth) {
  const fs::path d = scratch("paths");
  const std::string qf = (d / "q.npy").string(), kf = (d / "k.npy").string();
  std::mt19937 rng(6);
  write_npy(qf, testing::random_tensor({1, 2, 3, 4}, dtype::f32, rng));
  write_npy(kf, testing::random_tensor({1, 2, 3, 4}, dtype::f32, rng));
  const std::string in = " --q " + qf + " --k " + kf + " --v " + kf;
  auto r = sh("run" + in + " --out " + (d / "o.npy").string() + " --lse " + (d / "." / "o.npy").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("attn run: --out and --lse both write"), std::string::npos) << r.out;
  r = sh("run" + in + " --out " + qf);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("attn run: --out would overwrite the input --q"), std::string::npos) << r.out;
  r = sh("run" + in + " --out " + (d / "o.npy").string() + " --dout " + qf + " --dq " + (d / ".." / d.filename() / "k.npy").string());
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("attn run: --dq would overwrite the input --k"), std::string::npos) << r.out;
  EXPECT_EQ(read_npy(qf).shape(), (Shape{1, 2, 3, 4}));  // untouched
}

TEST(Cli, IntegersBeyondInt64AndHugeThreadCounts) {
  const fs::path d = scratch("ints");
  const std::string qf = (d / "q.npy").string();
  std::mt19937 rng(7);
  write_npy(qf, testing::random_tensor({1, 2, 3, 4}, dtype::f32, rng));
  const std::string run = "run --q " + qf + " --k " + qf + " --v " + qf + " --out " + (d / "o.npy").string();
  for (const char* arg : {"--window-left 99999999999999999999999", "--window-right -99999999999999999999999",
                          "--q-num-heads 9223372036854775808"}) {
    const auto r = sh(run + " " + arg);
    EXPECT_EQ(r.code, 2) << arg;
    EXPECT_NE(r.out.find("is beyond int64"), std::string::npos) << r.out;
  }
  EXPECT_EQ(sh(run + " --window-left 9223372036854775807").code, 0);
  for (const char* t : {"100000", "2147483647"}) {
    const auto r = sh(run + " --threads " + t);
    EXPECT_EQ(r.code, 0) << r.out;
  }
  const auto r = sh("bench --nq 100000000000 --nk 100000000000 --d 64 --reps 1 --warmup 0 --peers none --threads 1");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out.find("bad_alloc"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("cannot allocate"), std::string::npos) << r.out;
}


// `attn bench` finds bench/peers.py from the binary's own path: installed beside it
// (<prefix>/bin/attn, <prefix>/<datadir>/attn/bench/peers.py), or the source tree's from the
// build tree, wherever it is started from. A stand-in python speaks the peers' protocol with no
// peer in it, so nothing is timed but the script's path is printed.
TEST(Cli, BenchFindsPeerScriptFromBinaryPath) {
  const fs::path d = fs::weakly_canonical(scratch("peers"));
  fs::create_directories(d / "bin");
  fs::copy_file(ATTN_CLI, d / "bin" / "attn");
  const fs::path installed = d / "bin" / ATTN_BIN_TO_DATA / "attn" / "bench" / "peers.py";
  fs::create_directories(installed.parent_path());
  std::ofstream(installed) << "# stand-in: the fake python below never reads it\n";
  const fs::path py = d / "python";
  std::ofstream(py) << "#!/bin/sh\necho ready\nwhile read -r line; do echo done; done\n";
  fs::permissions(py, fs::perms::owner_all);
  const std::string args = " bench --nq 4 --d 4 --reps 1 --warmup 0 --threads 1 --probe-mib 0 --peers torch --python " + py.string();
  auto run = [&](const std::string& exe) {
    const std::string cmd = "cd " + d.string() + " && " + exe + args + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    while (std::size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
    const int st = pclose(p);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << out;
    return out;
  };
  std::string out = run((d / "bin" / "attn").string());
  EXPECT_NE(out.find("python peers: " + py.string() + " " + fs::weakly_canonical(installed).string()), std::string::npos) << out;
  out = run(ATTN_CLI);  // the build tree's binary: the source tree's script
  EXPECT_NE(out.find(" " + fs::weakly_canonical(fs::path(ATTN_SOURCE_DIR) / "bench" / "peers.py").string()), std::string::npos) << out;
  fs::remove(installed);  // a copy with no script beside it says so
  out = run((d / "bin" / "attn").string());
  EXPECT_NE(out.find("bench/peers.py not found"), std::string::npos) << out;
}

}  // namespace
}  // namespace attn

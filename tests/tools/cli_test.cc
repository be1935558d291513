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

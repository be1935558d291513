// fuzz/cli_fuzz.cc — the `attn run` command line, fuzzed in-process: the bytes pick a sequence
// of tokens (every option of `attn run`, file names, numbers at and beyond the limits, garbage)
// that is parsed and run by the tool's own dispatch (run_app, tools/attn/app.cc). Every call
// must end with exit status 0 (it ran) or 2 (a message: bad arguments or files) — a crash, a
// sanitizer report, an abort, an uncaught exception or a hang (libFuzzer's -timeout) is a
// finding. It runs in a temporary folder (removed at exit) holding small .npy inputs; files a
// call writes there are removed after it, and raw tokens cannot name a path outside it.
// `attn bench` is not driven here: it starts peer processes and times for seconds by design
// (its argument checks are tested in tests/tools/cli_test.cc).
#include <stdlib.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "attn/npy.h"
#include "attn/tensor.h"
#include "cli.h"

namespace {

namespace fs = std::filesystem;
using namespace attn;

fs::path dir;  // the temporary folder, the working directory of every call
// The inputs every call may name: shapes fit one another (B 1, Hq 2, Hkv 1, Nq 3, Nk 4, D 4).
std::set<fs::path> inputs;

void write(const std::string& name, const Tensor& t) {
  write_npy(name, t);
  inputs.insert(dir / name);
}

Tensor ramp(const Shape& s, dtype t) {
  Tensor r = Tensor::empty(s, t);
  for (std::int64_t i = 0; i < r.numel(); ++i) store_from_double(r.data(), t, i, double(i % 7) / 3.0 - 1.0);
  return r;
}

const char* const kTokens[] = {
    // options of `attn run`
    "--q", "--k", "--v", "--out", "--lse", "--probs", "--probs-png", "--probs-head", "--qk", "--qk-mode", "--dtype",
    "--scale", "--causal", "--alignment", "--window-left", "--window-right", "--softcap", "--mask",
    "--nonpad-kv-seqlen", "--alibi-slopes", "--sinks", "--past-key", "--past-value", "--present-key",
    "--present-value", "--q-num-heads", "--kv-num-heads", "--backend", "--threads", "--ring", "--layout", "--explain",
    "--dout", "--dq", "--dk", "--dv", "--dmask", "--dalibi", "--dsinks", "--score", "--distribution", "--activation",
    "--temperature", "--bandwidth", "--W", "--b", "--W-q", "--W-k", "--w-v", "--W-a", "--sigmoid-bias", "--topk",
    "--hardmax-gradient", "--family-path", "--dW", "--db", "--dW-q", "--dW-k", "--dw-v", "--dW-a", "--help",
    // files: inputs, outputs, paths that cannot be written or read
    "q.npy", "k.npy", "v.npy", "q3.npy", "k3.npy", "mask_bool.npy", "mask_f32.npy", "dout.npy", "slopes.npy",
    "nonpad.npy", "bad.npy", "o.npy", "o2.npy", "p.png", "missing.npy", "./q.npy", "sub/o.npy", "sub/../q.npy",
    "/dev/full", "/", ".",
    // values
    "0", "1", "2", "3", "-1", "-2", "0,1", "1,0", "0,0", "5,5", "0.5", "1e308", "-1e308", "nan", "inf", "-inf", "1e-46",
    "9223372036854775807", "-9223372036854775808", "99999999999999999999999", "100000", "f32", "f16", "bf16", "f64",
    "i64", "input", "top_left", "bottom_right", "after_past", "none", "scaled", "softcapped", "biased", "probs",
    "automatic", "cpu", "reference", "tiled", "core", "additive", "cosine", "gaussian", "box", "general", "location",
    "softmax", "sparsemax", "entmax15", "hardmax", "topk", "kernel", "sigmoid", "tanh", "relu", "straight_through",
    "contiguous", "", "=", "--", "-", "run", "bench", "x"};

}  // namespace

// libFuzzer parses its flags after this: its own paths (corpus folders, inputs, artifact
// prefix) are made absolute here, so they still hold once the first call has made `dir` the
// working directory (not here: -jobs runs argv[0] again, which may be relative).
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  static std::vector<std::string> absolute;
  absolute.reserve(std::size_t(*argc));
  for (int i = 1; i < *argc; ++i) {
    const std::string a = (*argv)[i];
    std::string flag;
    for (const char* f : {"-artifact_prefix=", "-exact_artifact_path="})
      if (a.starts_with(f)) flag = f;
    if (a.empty() || (a[0] == '-' && flag.empty())) continue;  // other flags
    absolute.push_back(flag + fs::absolute(a.substr(flag.size())).string());
    (*argv)[i] = absolute.back().data();  // reserved: no reallocation moves it
  }
  return 0;
}

namespace {

// The temporary folder and its inputs, made by the first call.
void enter_folder() {
  char name[] = "/tmp/attn_cli_fuzz_XXXXXX";
  if (!mkdtemp(name) || chdir(name) != 0) {
    std::perror("cli_fuzz: temporary folder");
    std::abort();
  }
  dir = name;
  std::atexit([] { fs::remove_all(dir); });
  write("q.npy", ramp({1, 2, 3, 4}, dtype::f32));
  write("k.npy", ramp({1, 1, 4, 4}, dtype::f32));
  write("v.npy", ramp({1, 1, 4, 4}, dtype::f32));
  write("q3.npy", ramp({1, 3, 8}, dtype::f32));
  write("k3.npy", ramp({1, 4, 4}, dtype::f32));
  Tensor m = Tensor::empty({3, 4}, dtype::boolean);
  for (std::int64_t i = 0; i < 12; ++i) m.data_as<bool>()[i] = i % 3 != 0;
  write("mask_bool.npy", m);
  write("mask_f32.npy", ramp({3, 4}, dtype::f32));
  write("dout.npy", ramp({1, 2, 3, 4}, dtype::f32));
  write("slopes.npy", ramp({2}, dtype::f32));
  write("nonpad.npy", Tensor::from_values({1}, dtype::i64, {3}));
  std::FILE* f = std::fopen("bad.npy", "wb");
  std::fputs("\x93NUMPY not really", f);
  std::fclose(f);
  inputs.insert(dir / "bad.npy");
  fs::create_directory("sub");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (dir.empty()) enter_folder();
  std::vector<std::string> args = {"attn", "run"};
  for (std::size_t i = 0; i < size && args.size() < 40; ++i) {
    const std::uint8_t c = data[i];
    if (c < 240 || i + 1 >= size) {
      args.push_back(kTokens[c % std::size(kTokens)]);
    } else {  // 240..255: a raw token of the next (c - 239) bytes, no '/' (it stays in dir)
      const std::size_t n = std::min<std::size_t>(c - 239, size - i - 1);
      std::string t(reinterpret_cast<const char*>(data + i + 1), n);
      std::replace(t.begin(), t.end(), '/', '_');
      args.push_back(t);
      i += n;
    }
  }
  std::vector<const char*> argv;
  for (const std::string& t : args) argv.push_back(t.c_str());
  CLI::App app{"attn", "attn"};
  app.require_subcommand(1);
  int exit_code = 0;
  attn::cli::add_run(app, exit_code);
  const int rc = attn::cli::run_app(app, exit_code, int(argv.size()), argv.data());
  if (rc != 0 && rc != 2) {
    std::fprintf(stderr, "cli_fuzz finding: exit status %d\n", rc);
    __builtin_trap();
  }
  // Remove what the call wrote (outputs), keep the inputs.
  std::vector<fs::path> written;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && !inputs.count(e.path().lexically_normal())) written.push_back(e.path());
  for (const fs::path& p : written) fs::remove(p);
  return 0;
}

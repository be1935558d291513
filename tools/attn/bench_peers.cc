// tools/attn/bench_peers.cc — the Python peer process of `attn bench` (bench_peers.h).
#include "bench_peers.h"

#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <sstream>

extern char** environ;

namespace attn::cli::bench {
namespace {

std::vector<std::string> split_tabs(const std::string& s) {
  std::vector<std::string> f;
  std::stringstream ss(s);
  for (std::string x; std::getline(ss, x, '\t');) f.push_back(x);
  return f;
}

std::filesystem::path exe_dir() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path(".") : p.parent_path();
}

}  // namespace

python_peers::python_peers(const std::string& python, const std::string& script, const std::string& which) {
  std::signal(SIGPIPE, SIG_IGN);  // a peer process that dies must not take attn bench with it
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) {
    why_ = "pipe() failed";
    return;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, to_child[0], 0);
  posix_spawn_file_actions_adddup2(&fa, from_child[1], 1);
  for (int fd : {to_child[0], to_child[1], from_child[0], from_child[1]}) posix_spawn_file_actions_addclose(&fa, fd);
  std::vector<std::string> args = {python, "-u", script, "--peers", which};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int rc = posix_spawn(&pid_, python.c_str(), &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(to_child[0]);
  close(from_child[1]);
  if (rc != 0) {
    close(to_child[1]);
    close(from_child[0]);
    pid_ = -1;
    why_ = fmt::format("cannot start {}", python);
    return;
  }
  in_ = fdopen(to_child[1], "w");
  out_ = fdopen(from_child[0], "r");
  for (std::string line; read_line(line);) {
    if (line == "ready") {
      ok_ = true;
      break;
    }
    auto f = split_tabs(line);
    if (f.size() >= 3 && f[0] == "peer") versions_[f[1]] = f[2];
    if (f.size() >= 3 && f[0] == "skip") versions_[f[1]] = "absent: " + f[2];
  }
  if (!ok_) why_ = fmt::format("{} {} did not start (see its messages above)", python, script);
}

python_peers::~python_peers() {
  if (in_) fclose(in_);
  if (out_) fclose(out_);
  if (pid_ > 0) waitpid(pid_, nullptr, 0);
}

std::vector<python_peers::peer_state> python_peers::prepare(const config& c, int threads, int warmup,
                                                            const std::string& extra) {
  const workload& w = c.w;
  std::vector<peer_state> out;
  for (const auto& f : transact(fmt::format("prepare {} {} {} {} {} {} {} {} {} {} {} {}{}{}", w.B, w.Hq, w.Hkv, w.Nq,
                                            w.Nk, w.D, w.Dv, int(w.causal), short_dtype(w.type),
                                            c.backward ? "backward" : "forward", threads, warmup,
                                            extra.empty() ? "" : " ", extra)))
    if (f.size() >= 3 && (f[0] == "ready" || f[0] == "skip")) out.push_back({f[1], f[0] == "ready", f[2]});
  return out;
}

std::vector<std::pair<std::string, double>> python_peers::rep() {
  std::vector<std::pair<std::string, double>> out;
  for (const auto& f : transact("rep"))
    if (f.size() >= 3 && f[0] == "time") out.emplace_back(f[1], std::stod(f[2]));
  return out;
}

void python_peers::release() { transact("release"); }

std::vector<std::vector<std::string>> python_peers::transact(const std::string& command) {
  std::vector<std::vector<std::string>> lines;
  if (!ok_) return lines;
  fmt::print(in_, "{}\n", command);
  fflush(in_);
  for (std::string line; read_line(line);) {
    if (line == "done") return lines;
    lines.push_back(split_tabs(line));
  }
  ok_ = false;
  why_ = "the peer process ended early";
  return lines;
}

bool python_peers::read_line(std::string& line) {
  line.clear();
  for (int ch; (ch = fgetc(out_)) != EOF;) {
    if (ch == '\n') return true;
    line.push_back(char(ch));
  }
  return !line.empty();
}

std::string find_python(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* e = std::getenv("ATTN_BENCH_PYTHON"); e && *e) return e;
  std::string venv;
  if (const char* e = std::getenv("ATTN_BENCH_VENV"); e && *e)
    venv = e;
  else if (const char* h = std::getenv("HOME"))
    venv = std::string(h) + "/.cache/attn-bench-venv";
  const std::string py = venv + "/bin/python";
  return std::filesystem::exists(py) ? py : std::string();
}

std::string find_peer_script(const std::string& given) {
  if (!given.empty()) return given;
  if (const char* e = std::getenv("ATTN_BENCH_PEERS"); e && *e) return e;
  namespace fs = std::filesystem;
  const fs::path dir = exe_dir();
  std::vector<fs::path> candidates = {dir / ATTN_BIN_TO_DATA / "attn/bench/peers.py"};  // installed
  std::error_code ec;
  if (fs::equivalent(dir, ATTN_CLI_BUILD_DIR, ec)) candidates.push_back(fs::path(ATTN_SOURCE_DIR) / "bench/peers.py");
  candidates.push_back("bench/peers.py");  // run from a source tree
  for (const fs::path& c : candidates)
    if (fs::exists(c, ec)) return fs::weakly_canonical(c, ec).string();
  return {};
}

}  // namespace attn::cli::bench

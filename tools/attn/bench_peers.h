// tools/attn/bench_peers.h — the Python peers of `attn bench` (torch SDPA, ggml flash
// attention: bench/peers.py), run in one helper process for the whole run, and where to find
// the benchmark venv's python and the script.
//
// Protocol (bench/peers.py has the other end): commands one line each, replies tab-separated
// lines closed by "done". At start the peers send "peer\t<impl>\t<version>" (or "skip") lines,
// then "ready".
//   prepare B Hq Hkv Nq Nk D Dv causal dtype pass threads warmup [family key=value ...]
//                 -> "ready\t<impl>\t<detail>" or "skip\t<impl>\t<why>" per peer
//   rep           -> "time\t<impl>\t<ms>" per ready peer (one timed call each)
//   release       -> (frees the configuration's tensors)
// attn bench alternates single calls — attn, the OpenBLAS baseline, then one `rep` of the
// Python peers — so that a change of load on a shared machine falls on all of them alike.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_grid.h"

namespace attn::cli::bench {

class python_peers {
 public:
  // Starts `python -u script --peers which` (which: "torch,ggml") and reads its greeting.
  python_peers(const std::string& python, const std::string& script, const std::string& which);
  ~python_peers();
  python_peers(const python_peers&) = delete;
  python_peers& operator=(const python_peers&) = delete;

  bool ok() const { return ok_; }
  const std::string& why() const { return why_; }
  const std::map<std::string, std::string>& versions() const { return versions_; }

  struct peer_state {
    std::string impl;
    bool ready = false;
    std::string detail;  // version and kernel used, or why it is skipped
  };
  // Builds the inputs of every peer for one configuration and runs its warm-up calls. `extra`
  // is appended to the prepare line (the family fields of bench/peers.py: "family score=...").
  std::vector<peer_state> prepare(const config& c, int threads, int warmup, const std::string& extra = "");
  // One timed call of every prepared peer: (impl, milliseconds); a peer that failed is absent.
  std::vector<std::pair<std::string, double>> rep();
  // Frees the inputs of the configuration.
  void release();

 private:
  // Sends one command line; returns the reply lines up to "done", split at tabs.
  std::vector<std::vector<std::string>> transact(const std::string& command);
  bool read_line(std::string& line);

  pid_t pid_ = -1;
  FILE* in_ = nullptr;
  FILE* out_ = nullptr;
  bool ok_ = false;
  std::string why_;
  std::map<std::string, std::string> versions_;
};

// The benchmark venv's python: `given`, else $ATTN_BENCH_PYTHON, else $ATTN_BENCH_VENV/bin/python
// or ~/.cache/attn-bench-venv/bin/python when it exists; "" when there is none.
std::string find_python(const std::string& given);

// bench/peers.py: `given`, else $ATTN_BENCH_PEERS, else the installed copy
// (<bindir>/<path to datadir>/attn/bench/peers.py, from the binary's own path), else the source
// tree's when the binary runs from its build tree, else ./bench/peers.py; "" when not found.
std::string find_peer_script(const std::string& given);

}  // namespace attn::cli::bench

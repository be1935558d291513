// bench/ring_bench.cc — ring attention's time per step: compute (the local fused kernel) and
// communication not hidden by it (time blocked in MPI_Waitall after the compute), per rank,
// against one process running attn::attention on the whole sequence.
//
//   mpirun -np 2 attn_ring_bench --n 16384 --h 8 --d 64 --threads 1 [--causal] [--layout zigzag] [--backward]
//   attn_ring_bench --n 16384 --h 8 --d 64 --threads 2            (P = 1: one process, no ring)
//
// Each rank makes its own shard (random, float32, B = 1); nothing is gathered. Prints, on rank
// 0, the median over --reps of the whole call and, per step, the slowest rank's compute and
// wait; measures and prints, asserts nothing.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>

#include "attn/attn.h"
#include "attn/dist.h"

namespace {

struct args {
  std::int64_t n = 4096, h = 8, d = 64;
  int threads = 1, reps = 3;
  bool causal = false, backward = false;
  std::string layout = "contiguous";
};

args parse(int argc, char** argv) {
  args a;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw attn::error("attn_ring_bench: " + s + " needs a value");
      return argv[++i];
    };
    if (s == "--n") a.n = std::stoll(next());
    else if (s == "--h") a.h = std::stoll(next());
    else if (s == "--d") a.d = std::stoll(next());
    else if (s == "--threads") a.threads = std::stoi(next());
    else if (s == "--reps") a.reps = std::stoi(next());
    else if (s == "--layout") a.layout = next();
    else if (s == "--causal") a.causal = true;
    else if (s == "--backward") a.backward = true;
    else throw attn::error("attn_ring_bench: unknown argument " + s);
  }
  return a;
}

attn::Tensor random(attn::Shape shape, unsigned seed) {
  attn::Tensor t = attn::Tensor::empty(std::move(shape), attn::dtype::f32);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = u(gen);
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int P = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  try {
    const args a = parse(argc, argv);
    attn::dist::ring_options opt;
    opt.is_causal = a.causal;
    opt.layout = attn::dist::parse_sequence_layout(a.layout);
    std::int64_t n = 0;
    for (const auto& s : attn::dist::sequence_segments(a.n, P, rank, opt.layout)) n += s.length;
    const attn::Tensor q = random({1, a.h, n, a.d}, 1 + rank), k = random({1, a.h, n, a.d}, 100 + rank),
                       v = random({1, a.h, n, a.d}, 200 + rank), dout = random({1, a.h, n, a.d}, 300 + rank);
    const attn::execution exec{.num_threads = a.threads};
    // The link alone: one blocking ring exchange of a K and a V block (what one step moves).
    if (P > 1) {
      std::vector<double> link;
      const attn::Tensor kr = attn::Tensor::empty(k.shape(), k.type()), vr = attn::Tensor::empty(v.shape(), v.type());
      for (int rep = 0; rep < 5; ++rep) {
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime();
        for (const auto* pair : {&k, &v}) {
          const attn::Tensor& out = *pair;
          const attn::Tensor& in = pair == &k ? kr : vr;
          MPI_Sendrecv(out.data(), int(out.numel()), MPI_FLOAT, (rank + 1) % P, 0, in.data(), int(in.numel()), MPI_FLOAT,
                       (rank + P - 1) % P, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        }
        double t = MPI_Wtime() - t0;
        MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        link.push_back(t);
      }
      const double t = median(link), bytes = 2.0 * double(k.numel()) * 4.0;
      if (rank == 0) std::printf("link: one K/V exchange (%.1f MiB) %.4f s, %.2f GB/s per rank\n", bytes / (1 << 20), t, bytes / t * 1e-9);
    }
    std::vector<double> total;
    std::vector<attn::dist::ring_stats> stats;
    for (int rep = 0; rep <= a.reps; ++rep) {  // rep 0 warms up
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      attn::dist::ring_stats st;
      if (P == 1) {  // the baseline: the core op on the whole sequence, no ring
        const auto r = attn::attention(q, k, v, opt, exec);
        if (a.backward) attn::attention_backward(q, k, v, r.out, dout, r.lse, opt, exec);
      } else {
        const auto r = attn::dist::ring_attention(MPI_COMM_WORLD, q, k, v, opt, exec);
        st = r.stats;
        if (a.backward) st = attn::dist::ring_attention_backward(MPI_COMM_WORLD, q, k, v, r.out, dout, r.lse, opt, exec).stats;
      }
      double t = MPI_Wtime() - t0;
      MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      if (rep > 0) total.push_back(t), stats.push_back(st);
    }
    const double T = median(total);
    const double flops = 4.0 * double(a.n) * double(a.n) * double(a.d) * double(a.h) * (a.causal ? 0.5 : 1.0) *
                         (a.backward ? 3.5 : 1.0);  // backward ≈ 2.5× the forward's matmuls, plus the forward
    if (rank == 0)
      std::printf("P %d  N %lld  H %lld  D %lld  %s%s layout %s threads/rank %d: median %.4f s  %.2f GFLOP/s\n", P,
                  (long long)a.n, (long long)a.h, (long long)a.d, a.causal ? "causal " : "",
                  a.backward ? "fwd+bwd" : "fwd", a.layout.c_str(), a.threads, T, flops / T * 1e-9);
    // Per step of the median repetition: compute and wait, fastest and slowest rank. A wait is
    // the link's time not hidden by compute plus the time for the slowest rank to catch up.
    const std::size_t pick = std::size_t(std::find(total.begin(), total.end(), T) - total.begin());
    const auto& st = stats[pick];
    const std::size_t K = st.steps.size();
    std::vector<double> c(K), w(K), cmax(K), wmax(K), cmin(K), wmin(K);
    for (std::size_t s = 0; s < K; ++s) c[s] = st.steps[s].compute_s, w[s] = st.steps[s].wait_s;
    MPI_Reduce(c.data(), cmax.data(), int(K), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(w.data(), wmax.data(), int(K), MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(c.data(), cmin.data(), int(K), MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(w.data(), wmin.data(), int(K), MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    if (rank == 0)
      for (std::size_t s = 0; s < K; ++s)
        std::printf("  %s step %zu: compute %.4f .. %.4f s  wait %.4f .. %.4f s (ranks' min .. max)\n",
                    a.backward ? "backward" : "forward", s, cmin[s], cmax[s], wmin[s], wmax[s]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    rc = 2;
  }
  MPI_Finalize();
  return rc;
}

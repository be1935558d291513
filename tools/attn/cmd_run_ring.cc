// tools/attn/cmd_run_ring.cc — `attn run --ring`: the same call as `attn run`, as ring attention
// over MPI (include/attn/dist.h). Under `mpirun -np P attn run ... --ring`, every rank reads
// the same .npy inputs, takes its shard, runs the ring (and its backward with --dout), and
// rank 0 writes the gathered outputs: the files a single-process `attn run` writes.
#include <fmt/format.h>

#include "attn/attn.h"
#include "cli.h"

#if ATTN_HAVE_MPI
#include "attn/dist.h"
#endif

namespace attn::cli {

#if ATTN_HAVE_MPI
namespace {

// MPI_Init on entry (unless the caller did), MPI_Finalize on every way out.
struct mpi_session {
  bool owned = false;
  mpi_session() {
    int up = 0;
    MPI_Initialized(&up);
    if (!up) MPI_Init(nullptr, nullptr), owned = true;
  }
  ~mpi_session() {
    if (owned) MPI_Finalize();
  }
};

}  // namespace

int run_ring(const ring_run& a, const Tensor& q, const Tensor& k, const Tensor& v, const attention_options& o,
             const execution& exec) {
  if (q.rank() != 4)
    throw error(fmt::format("attn run: --ring takes 4-D inputs [B, H, N, D]; q has shape {}", shape_str(q.shape())));
  mpi_session mpi;
  int P = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  dist::ring_options ro;
  static_cast<attention_options&>(ro) = o;
  ro.layout = dist::parse_sequence_layout(a.layout);
  auto part = [&](const TensorView& t) { return dist::shard(t, P, rank, ro.layout); };
  auto write = [&](const std::string& path, const TensorView& local) {
    const Tensor full = dist::gather(MPI_COMM_WORLD, local, ro.layout, 0);  // collective: every rank calls it
    if (rank == 0) write_npy(path, full);
    return full;
  };
  const Tensor ql = part(q), kl = part(k), vl = part(v);
  const dist::ring_result r = dist::ring_attention(MPI_COMM_WORLD, ql, kl, vl, ro, exec);
  const Tensor out = write(a.out, r.out);
  if (!a.lse.empty()) write(a.lse, r.lse);
  if (a.dout) {
    const dist::ring_grads g =
        dist::ring_attention_backward(MPI_COMM_WORLD, ql, kl, vl, r.out, part(*a.dout), r.lse, ro, exec);
    if (!a.dq.empty()) write(a.dq, g.dq);
    if (!a.dk.empty()) write(a.dk, g.dk);
    if (!a.dv.empty()) write(a.dv, g.dv);
    if (rank == 0 && !a.dalibi.empty() && g.dalibi_slopes.defined()) write_npy(a.dalibi, g.dalibi_slopes);
    if (rank == 0 && !a.dsinks.empty() && g.dsinks.defined()) write_npy(a.dsinks, g.dsinks);
  }
  if (rank == 0)
    fmt::print("out {} {} (ring of {} ranks, {} layout, backend {})\n", shape_str(out.shape()), dtype_name(out.type()),
               P, dist::to_string(ro.layout), r.backend);
  return 0;
}

#else

int run_ring(const ring_run&, const Tensor&, const Tensor&, const Tensor&, const attention_options&, const execution&) {
  throw error("attn run: --ring needs attn built with MPI (attn::dist); install libopenmpi-dev and reconfigure");
}

#endif

}  // namespace attn::cli

// src/dist/mpi_util.h — what every MPI call of attn::dist shares: MPI return codes turned into
// attn::error, and a private duplicate of the user's communicator (so the ring's messages never
// match the user's, and its error handler returns codes instead of aborting the job).
#pragma once

#include <mpi.h>

#include <string>

#include "core/common.h"

namespace attn::dist::detail {

// Throws attn::error "<op>: MPI <what> failed: <MPI's message>" when rc is not MPI_SUCCESS.
inline void check_mpi(const char* op, int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  attn::detail::fail(op, fmt::format("MPI {} failed: {}", what, std::string(msg, std::size_t(len))));
}

// MPI_Comm_dup of `comm` with MPI_ERRORS_RETURN, freed on scope exit. Collective. Refuses
// MPI_COMM_NULL and an MPI that is not initialised (locally: those are the same on every rank).
class private_comm {
 public:
  private_comm(const char* op, MPI_Comm comm) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    if (!up || down) attn::detail::fail(op, "MPI is not initialised (call MPI_Init first) or already finalised");
    if (comm == MPI_COMM_NULL) attn::detail::fail(op, "comm is MPI_COMM_NULL");
    check_mpi(op, MPI_Comm_dup(comm, &comm_), "Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(comm_, &rank_);
  }
  ~private_comm() { MPI_Comm_free(&comm_); }
  private_comm(const private_comm&) = delete;
  private_comm& operator=(const private_comm&) = delete;

  MPI_Comm get() const { return comm_; }
  int size() const { return size_; }
  int rank() const { return rank_; }

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int size_ = 1, rank_ = 0;
};

}  // namespace attn::dist::detail

// src/dist/shard.cc — which global positions each rank holds (contiguous, zigzag), and the
// helpers that cut a full tensor into a rank's shard and gather shards back into it.
#include <climits>
#include <cstring>

#include "attn/dist.h"
#include "dist/mpi_util.h"

namespace attn::dist {

using attn::detail::fail;

std::string_view to_string(sequence_layout l) {
  return l == sequence_layout::zigzag ? "zigzag" : "contiguous";
}

sequence_layout parse_sequence_layout(std::string_view name) {
  if (name == "contiguous") return sequence_layout::contiguous;
  if (name == "zigzag") return sequence_layout::zigzag;
  throw error(fmt::format("sequence_layout: '{}' is not a layout; expected contiguous or zigzag", name));
}

namespace {

// Chunk c of N split into M chunks as numpy.array_split: the first N % M chunks are one longer.
segment chunk(std::int64_t N, std::int64_t M, std::int64_t c) {
  const std::int64_t base = N / M, rem = N % M;
  return {c * base + std::min(c, rem), base + (c < rem ? 1 : 0)};
}

// A contiguous tensor seen as [outer, n, inner] around `dim`, in bytes per row of `inner`.
struct rows3 {
  std::int64_t outer = 1, n = 0, row_bytes = 0;
};
rows3 rows_of(const Shape& s, int dim, dtype t) {
  rows3 r;
  r.n = s[std::size_t(dim)];
  std::int64_t inner = 1;
  for (int i = 0; i < int(s.size()); ++i) {
    if (i < dim) r.outer *= s[std::size_t(i)];
    if (i > dim) inner *= s[std::size_t(i)];
  }
  r.row_bytes = inner * std::int64_t(dtype_size(t));
  return r;
}

// Rows [src_at, src_at + len) of src to rows [dst_at, ...) of dst, for every outer index.
void copy_rows(const std::byte* src, const rows3& s, std::int64_t src_at, std::byte* dst, const rows3& d,
               std::int64_t dst_at, std::int64_t len) {
  if (len == 0) return;
  for (std::int64_t o = 0; o < s.outer; ++o)
    std::memcpy(dst + (o * d.n + dst_at) * d.row_bytes, src + (o * s.n + src_at) * s.row_bytes,
                std::size_t(len * s.row_bytes));
}

int check_dim(const char* op, const TensorView& t, int dim) {
  const int d = dim < 0 ? dim + t.rank() : dim;
  if (d < 0 || d >= t.rank())
    fail(op, fmt::format("dim = {} is outside a tensor of {} dims {}", dim, t.rank(), shape_str(t.shape())));
  return d;
}

}  // namespace

std::vector<segment> sequence_segments(std::int64_t N, int P, int rank, sequence_layout layout) {
  const char* op = "sequence_segments";
  if (P < 1 || rank < 0 || rank >= P) fail(op, fmt::format("rank {} of P = {} is not a rank (0 <= rank < P)", rank, P));
  if (N < 0) fail(op, fmt::format("N = {} must be >= 0", N));
  if (layout == sequence_layout::contiguous) return {chunk(N, P, rank)};
  return {chunk(N, 2 * P, rank), chunk(N, 2 * P, 2 * P - 1 - rank)};
}

Tensor shard(const TensorView& full, int P, int rank, sequence_layout layout, int dim) {
  const char* op = "shard";
  dim = check_dim(op, full, dim);
  const std::vector<segment> segs = sequence_segments(full.size(dim), P, rank, layout);
  Shape shape = full.shape();
  shape[std::size_t(dim)] = 0;
  for (const segment& s : segs) shape[std::size_t(dim)] += s.length;
  Tensor local = Tensor::empty(shape, full.type());
  const rows3 d = rows_of(shape, dim, full.type());
  std::int64_t at = 0;
  for (const segment& s : segs) {
    const Tensor part = Tensor::copy_of(full.slice(dim, s.begin, s.begin + s.length));  // [outer, len, inner]
    copy_rows(static_cast<const std::byte*>(part.data()), rows_of(part.shape(), dim, full.type()), 0,
              static_cast<std::byte*>(local.data()), d, at, s.length);
    at += s.length;
  }
  return local;
}

Tensor gather(MPI_Comm user_comm, const TensorView& local, sequence_layout layout, int root, int dim) {
  const char* op = "gather";
  detail::private_comm comm(op, user_comm);
  const int P = comm.size();
  if (root >= P) fail(op, fmt::format("root = {} is not a rank of a communicator of {}", root, P));

  // Shapes first, so that a rank with another shape gives an error on every rank.
  constexpr int kMaxDims = 8;
  std::int64_t mine[kMaxDims + 3] = {};
  mine[0] = local.rank(), mine[1] = std::int64_t(local.type()), mine[2] = dim;
  for (int i = 0; i < std::min(local.rank(), kMaxDims); ++i) mine[3 + i] = local.size(i);
  std::vector<std::int64_t> all(std::size_t(P) * (kMaxDims + 3));
  detail::check_mpi(op, MPI_Allgather(mine, kMaxDims + 3, MPI_INT64_T, all.data(), kMaxDims + 3, MPI_INT64_T, comm.get()),
                    "Allgather");
  if (local.rank() > kMaxDims) fail(op, fmt::format("local has {} dims; at most {}", local.rank(), kMaxDims));
  dim = check_dim(op, local, dim);
  std::vector<std::int64_t> n(static_cast<std::size_t>(P));
  std::int64_t N = 0;
  for (int s = 0; s < P; ++s) {
    const std::int64_t* o = &all[std::size_t(s) * (kMaxDims + 3)];
    bool same = o[0] == mine[0] && o[1] == mine[1] && o[2] == mine[2];
    for (int i = 0; i < kMaxDims; ++i) same = same && (i == dim || o[3 + i] == mine[3 + i]);
    if (!same)
      fail(op, fmt::format("rank {} has a shard of {} dims, dtype {}, shape {}; rank {} has {} dims, dtype {}, shape {} "
                           "(only dim {} may differ)",
                           s, o[0], dtype_name(dtype(o[1])), shape_str(std::span(o + 3, std::size_t(std::min<std::int64_t>(o[0], kMaxDims)))),
                           comm.rank(), local.rank(), dtype_name(local.type()), shape_str(local.shape()), dim));
    n[std::size_t(s)] = o[3 + dim];
    N += o[3 + dim];
  }
  for (int s = 0; s < P; ++s) {
    std::int64_t want = 0;
    for (const segment& g : sequence_segments(N, P, s, layout)) want += g.length;
    if (want != n[std::size_t(s)])
      fail(op, fmt::format("rank {} holds {} positions along dim {}, but the {} layout of N = {} over {} ranks gives it {}",
                           s, n[std::size_t(s)], dim, to_string(layout), N, P, want));
  }

  const Tensor mine_c = local.is_contiguous() ? Tensor() : Tensor::copy_of(local);
  const void* send = mine_c.defined() ? mine_c.data() : local.data();
  const rows3 lr = rows_of(local.shape(), dim, local.type());
  std::vector<int> counts(static_cast<std::size_t>(P)), displs(static_cast<std::size_t>(P));
  std::int64_t total = 0;
  for (int s = 0; s < P; ++s) {
    const std::int64_t bytes = lr.outer * n[std::size_t(s)] * lr.row_bytes;
    if (bytes > INT_MAX || total > INT_MAX)
      fail(op, fmt::format("rank {}'s shard is {} bytes; gather moves at most {} bytes per rank", s, bytes, INT_MAX));
    counts[std::size_t(s)] = int(bytes), displs[std::size_t(s)] = int(total);
    total += bytes;
  }
  const bool receives = root < 0 || comm.rank() == root;
  std::vector<std::byte> buf(receives ? std::size_t(total) : 0);
  if (root < 0)
    detail::check_mpi(op, MPI_Allgatherv(send, counts[std::size_t(comm.rank())], MPI_BYTE, buf.data(), counts.data(),
                                         displs.data(), MPI_BYTE, comm.get()), "Allgatherv");
  else
    detail::check_mpi(op, MPI_Gatherv(send, counts[std::size_t(comm.rank())], MPI_BYTE, buf.data(), counts.data(),
                                      displs.data(), MPI_BYTE, root, comm.get()), "Gatherv");
  if (!receives) return Tensor();

  Shape shape = local.shape();
  shape[std::size_t(dim)] = N;
  Tensor full = Tensor::empty(shape, local.type());
  const rows3 fr = rows_of(shape, dim, local.type());
  for (int s = 0; s < P; ++s) {
    rows3 sr = lr;
    sr.n = n[std::size_t(s)];
    std::int64_t at = 0;
    for (const segment& g : sequence_segments(N, P, s, layout)) {
      copy_rows(buf.data() + displs[std::size_t(s)], sr, at, static_cast<std::byte*>(full.data()), fr, g.begin, g.length);
      at += g.length;
    }
  }
  return full;
}

}  // namespace attn::dist

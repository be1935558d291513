// src/dist/ring.cc — ring attention over MPI: the forward and, below it, the backward.
//
// P ranks, rank r holding the segments of the sequence its layout gives it (dist.h). Step s of
// P: rank r holds the K/V block of rank (r - s) mod P, attends its own queries to it with the
// core op's backend, and meanwhile sends the block to rank r + 1 and receives the next from
// rank r - 1. A (query segment, key segment) pair is one core-op problem whose positions are
// the global ones: query_pos is shifted by the key segment's start (after_past alignment with a
// per-batch "past" of q_begin - k_begin), nonpad_kv_seqlen becomes a per-block key count, so
// causal frontiers, windows and ALiBi distances are those of the full problem. Pairs with no
// unmasked score are skipped. Partial results merge by log-sum-exp; the sinks join the
// denominator once per row, after the last step.
#include <algorithm>
#include <array>
#include <climits>
#include <cmath>
#include <cstring>

#include "attn/dist.h"
#include "core/common.h"
#include "dist/plan.h"

namespace attn::dist {

std::int64_t ring_stats::scores() const {
  std::int64_t n = 0;
  for (const ring_step& s : steps) n += s.scores;
  return n;
}
double ring_stats::compute_s() const {
  double t = 0.0;
  for (const ring_step& s : steps) t += s.compute_s;
  return t;
}
double ring_stats::wait_s() const {
  double t = 0.0;
  for (const ring_step& s : steps) t += s.wait_s;
  return t;
}

namespace {

using attn::detail::as_bhnx;
using attn::detail::fail;
using attn::detail::kNegInf;
using attn::detail::problem;
using attn::detail::problem_storage;
using detail::block_problem;
using detail::check_mpi;
using detail::make_plan;
using detail::private_comm;
using detail::ring_plan;
using detail::unmasked_scores;

// A contiguous [B, H, rows, X] prefix of a buffer allocated for the longest shard.
TensorView rows_view(const Tensor& buf, std::int64_t rows) {
  return TensorView(buf.data(), buf.type(), {buf.size(0), buf.size(1), rows, buf.size(3)});
}

MPI_Datatype mpi_type(dtype t) { return t == dtype::f64 ? MPI_DOUBLE : MPI_FLOAT; }

// Non-blocking exchange with the ring neighbours: sends go to rank + 1, receives come from rank - 1.
class ring_link {
 public:
  ring_link(const ring_plan& plan, MPI_Comm comm) : plan_(plan), comm_(comm) {}

  void send(const TensorView& t, int tag) { post(t, tag, true); }
  void recv(const TensorView& t, int tag) { post(t, tag, false); }
  // Lets MPI move posted messages along without blocking. Open MPI without a progress thread
  // moves a large (rendezvous) message only inside MPI calls, so the ring calls this between
  // the kernel calls of a step.
  void progress() {
    if (reqs_.empty()) return;
    int done = 0;
    check_mpi(plan_.op, MPI_Testall(int(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE), "Testall on the ring");
    if (done) reqs_.clear();
  }
  // Blocks until every posted send and receive is done; returns the seconds it waited.
  double wait() {
    const double t0 = MPI_Wtime();
    check_mpi(plan_.op, MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE), "Waitall on the ring");
    reqs_.clear();
    return MPI_Wtime() - t0;
  }

 private:
  void post(const TensorView& t, int tag, bool out) {
    if (t.numel() > INT_MAX)
      fail(plan_.op, fmt::format("a block of {} elements is more than one MPI message carries ({}); use more ranks",
                                 t.numel(), INT_MAX));
    const int right = (plan_.rank + 1) % plan_.P, left = (plan_.rank + plan_.P - 1) % plan_.P;
    MPI_Request r;
    if (out)
      check_mpi(plan_.op, MPI_Isend(t.data(), int(t.numel()), mpi_type(t.type()), right, tag, comm_, &r), "Isend");
    else
      check_mpi(plan_.op, MPI_Irecv(t.data(), int(t.numel()), mpi_type(t.type()), left, tag, comm_, &r), "Irecv");
    reqs_.push_back(r);
  }
  const ring_plan& plan_;
  MPI_Comm comm_;
  std::vector<MPI_Request> reqs_;
};

enum tag : int { tag_k = 1, tag_v, tag_dk, tag_dv };

// Two [B, Hkv, rows_max, X] buffers sized for the longest shard: at step s, [s % 2] holds the
// block in use (of rank owner(s)) and [(s + 1) % 2] receives the next one.
using buffer_pair = std::array<Tensor, 2>;

int owner_at(const ring_plan& plan, int s) { return ((plan.rank - s) % plan.P + plan.P) % plan.P; }

buffer_pair make_buffers(const ring_plan& plan, std::int64_t rows_max, std::int64_t X) {
  return {Tensor::zeros({plan.B, plan.Hkv, rows_max, X}, plan.type), Tensor::zeros({plan.B, plan.Hkv, rows_max, X}, plan.type)};
}

// Step s: posts the send of a and b's blocks in use to rank + 1 and the receive of the next
// ones (of rank owner(s + 1)) from rank - 1.
void pass_on(ring_link& link, const ring_plan& plan, int s, const buffer_pair& a, int tag_a, const buffer_pair& b,
             int tag_b) {
  const std::int64_t rows = plan.n[std::size_t(owner_at(plan, s))], next = plan.n[std::size_t(owner_at(plan, s + 1))];
  link.send(rows_view(a[s % 2], rows), tag_a);
  link.send(rows_view(b[s % 2], rows), tag_b);
  link.recv(rows_view(a[(s + 1) % 2], next), tag_a);
  link.recv(rows_view(b[(s + 1) % 2], next), tag_b);
}

// Calls f(T{}) with T the C++ type of dtype t (float32 or float64: what the ring accepts).
template <class F>
void with_type(dtype t, F&& f) {
  if (t == dtype::f64) f(double{});
  else f(float{});
}

// dst rows [at, at + rows) += src, both contiguous [B·H, *, X] (dst has dst_rows rows per head).
template <class Dst, class Src>
void add_rows(Dst* dst, std::int64_t dst_rows, std::int64_t at, const Src* src, std::int64_t rows,
              std::int64_t heads, std::int64_t X) {
  for (std::int64_t bh = 0; bh < heads; ++bh) {
    Dst* d = dst + (bh * dst_rows + at) * X;
    const Src* s = src + bh * rows * X;
    for (std::int64_t e = 0; e < rows * X; ++e) d[e] += Dst(s[e]);
  }
}

// Every (query rows, key segment) pair of one step: f(q_local_offset, qg, k_local_offset, kg).
// A query segment is cut into up to kPieces runs of at least kMinRows rows, so that the ring
// can let MPI progress between kernel calls (the results do not depend on the cut).
constexpr std::int64_t kPieces = 4, kMinRows = 256;
template <class F>
void for_each_pair(const ring_plan& plan, int owner, F&& f) {
  std::int64_t lq = 0;
  for (const segment& qs : plan.segs[std::size_t(plan.rank)]) {
    const std::int64_t piece = std::max(kMinRows, (qs.length + kPieces - 1) / kPieces);
    for (std::int64_t at = 0; at < qs.length; at += piece) {
      const segment qg{qs.begin + at, std::min(piece, qs.length - at)};
      std::int64_t lk = 0;
      for (const segment& kg : plan.segs[std::size_t(owner)]) {
        if (kg.length) f(lq + at, qg, lk, kg);
        lk += kg.length;
      }
    }
    lq += qs.length;
  }
}

// This rank's k or v (any strides) into the first rows of a ring buffer.
void load_block(const TensorView& t, const Tensor& buf) {
  const Tensor c = t.is_contiguous() ? Tensor() : Tensor::copy_of(t);
  std::memcpy(buf.data(), c.defined() ? c.data() : t.data(), std::size_t(t.numel()) * dtype_size(t.type()));
}

std::int64_t longest(const ring_plan& plan) { return *std::max_element(plan.n.begin(), plan.n.end()); }

}  // namespace

// ---- forward ----
//
// acc_out [B, Hq, n, Dv] (f64) and acc_lse [B, Hq, n] hold the merge of the blocks so far:
//   lse' = log(e^acc_lse + e^lse_blk)     out' = e^(acc_lse - lse') out + e^(lse_blk - lse') out_blk
// A fully masked block (lse_blk = -inf) adds nothing; a row no block reaches keeps out 0,
// lse -inf. The sink of head h is one more partial with out 0 and lse = sink_h.
ring_result ring_attention(MPI_Comm user_comm, const TensorView& q, const TensorView& k, const TensorView& v,
                           const ring_options& options, const execution& exec) {
  const char* op = "ring_attention";
  private_comm comm(op, user_comm);
  const ring_plan plan = make_plan(op, comm, q, k, v, options, exec, false, [](const problem&) {});
  const std::int64_t B = plan.B, Hq = plan.Hq, n = plan.n[std::size_t(plan.rank)];
  const std::int64_t rows_max = longest(plan);

  std::vector<double> acc_out(std::size_t(B * Hq * n * plan.Dv), 0.0), acc_lse(std::size_t(B * Hq * n), kNegInf);
  auto merge = [&](std::int64_t at, std::int64_t rows, const Tensor& out, const Tensor& lse) {
    with_type(plan.type, [&](auto t) {
      using T = decltype(t);
      const T* o = out.data_as<T>();
      const T* l = lse.data_as<T>();
      for (std::int64_t bh = 0; bh < B * Hq; ++bh)
        for (std::int64_t i = 0; i < rows; ++i) {
          const double lb = double(l[bh * rows + i]);
          double& la = acc_lse[std::size_t(bh * n + at + i)];
          if (lb == kNegInf) continue;
          const double m = std::max(la, lb), lnew = m + std::log(std::exp(la - m) + std::exp(lb - m));
          const double wa = std::exp(la - lnew), wb = std::exp(lb - lnew);
          double* a = &acc_out[std::size_t((bh * n + at + i) * plan.Dv)];
          for (std::int64_t d = 0; d < plan.Dv; ++d) a[d] = wa * a[d] + wb * double(o[(bh * rows + i) * plan.Dv + d]);
          la = lnew;
        }
    });
  };

  const buffer_pair kb = make_buffers(plan, rows_max, plan.D), vb = make_buffers(plan, rows_max, plan.Dv);
  load_block(k, kb[0]), load_block(v, vb[0]);

  ring_result res;
  res.backend = std::string(plan.backend->name());
  ring_link link(plan, comm.get());
  for (int s = 0; s < plan.P; ++s) {
    const int owner = owner_at(plan, s);
    const Tensor &kc = kb[s % 2], &vc = vb[s % 2];
    if (s + 1 < plan.P) pass_on(link, plan, s, kb, tag_k, vb, tag_v);  // the block moves on while in use
    ring_step step;
    const double t0 = MPI_Wtime();
    const TensorView kv = rows_view(kc, plan.n[std::size_t(owner)]), vv = rows_view(vc, plan.n[std::size_t(owner)]);
    for_each_pair(plan, owner, [&](std::int64_t lq, segment qg, std::int64_t lk, segment kg) {
      const TensorView qs = q.slice(2, lq, lq + qg.length);
      problem_storage store;
      const problem p = block_problem(plan, qs, kv.slice(2, lk, lk + kg.length), vv.slice(2, lk, lk + kg.length), qg,
                                      kg, store);
      const std::int64_t scores = unmasked_scores(p);
      if (scores == 0) return;  // fully masked: nothing to compute, the block only travels on
      step.scores += scores;
      const Tensor out = Tensor::empty({B, Hq, qg.length, plan.Dv}, plan.type);
      const Tensor lse = Tensor::empty({B, Hq, qg.length}, plan.type);
      attn::detail::forward_outputs fo;
      fo.out = as_bhnx(out, Hq);
      fo.lse = lse.data();
      fo.lse_type = plan.type;
      plan.backend->forward(p, fo);
      link.progress();
      merge(lq, qg.length, out, lse);
    });
    step.compute_s = MPI_Wtime() - t0;
    if (s + 1 < plan.P) step.wait_s = link.wait();
    res.stats.steps.push_back(step);
  }

  if (!plan.sinks.empty()) {
    const Tensor zero = Tensor::zeros({B, Hq, n, plan.Dv}, plan.type);
    Tensor sink_lse = Tensor::empty({B, Hq, n}, plan.type);
    for (std::int64_t bh = 0; bh < B * Hq; ++bh)
      for (std::int64_t i = 0; i < n; ++i)
        store_from_double(sink_lse.data(), plan.type, bh * n + i, plan.sinks[std::size_t(bh % Hq)]);
    merge(0, n, zero, sink_lse);
  }
  res.out = Tensor::from_values({B, Hq, n, plan.Dv}, plan.type, acc_out);
  res.lse = Tensor::from_values({B, Hq, n}, plan.type, acc_lse);
  return res;
}

// ---- backward ----
//
// With the merged out and lse of the forward, each block's gradients are the core backward's
// on that block alone (p_ij = e^(s_ij - lse_i), Δ_i = dout_i·out_i are global, so the pieces
// add up): dq_i = Σ_blocks dq_i^blk, dk_j = Σ_ranks dk_j^blk. dq accumulates here; dk/dv of a
// block accumulate in buffers that travel with the block and reach its owner after P hops.
// ALiBi slope gradients add over blocks and ranks; sinks are not in any block:
//   dsink_h = -Σ_{b,i} e^(sink_h - lse_bhi) Δ_bhi       (summed over ranks)
ring_grads ring_attention_backward(MPI_Comm user_comm, const TensorView& q, const TensorView& k, const TensorView& v,
                                   const TensorView& out, const TensorView& dout, const TensorView& lse,
                                   const ring_options& options, const execution& exec) {
  const char* op = "ring_attention_backward";
  private_comm comm(op, user_comm);
  const ring_plan plan = make_plan(op, comm, q, k, v, options, exec, true, [&](const problem& p) {
    const Shape os{p.B, p.Hq, p.Nq, p.Dv}, ls{p.B, p.Hq, p.Nq};
    if (out.shape() != os || dout.shape() != os)
      fail(op, fmt::format("out {} and dout {} must have shape {}", shape_str(out.shape()), shape_str(dout.shape()),
                           shape_str(os)));
    if (lse.shape() != ls) fail(op, fmt::format("lse has shape {}, expected {}", shape_str(lse.shape()), shape_str(ls)));
    for (const TensorView* t : {&out, &dout, &lse})
      if (t->type() != q.type())
        fail(op, fmt::format("out/dout/lse have dtypes {}/{}/{}, expected {} like q", dtype_name(out.type()),
                             dtype_name(dout.type()), dtype_name(lse.type()), dtype_name(q.type())));
  });
  const std::int64_t B = plan.B, Hq = plan.Hq, Hkv = plan.Hkv, n = plan.n[std::size_t(plan.rank)];
  const std::int64_t rows_max = longest(plan);
  const Tensor lse_c = Tensor::copy_of(lse);  // [B, Hq, n] contiguous; a segment's rows are copied out of it

  ring_grads g;
  g.backend = std::string(plan.backend->name());
  Tensor dq_acc = Tensor::zeros({B, Hq, n, plan.D}, dtype::f64);
  std::vector<double> dalibi(plan.block.alibi_slopes ? std::size_t(B * Hq) : 0, 0.0);

  // K/V buffers as in the forward, and the dK/dV accumulators of the block in use and of the
  // one arriving (they travel one step behind K/V: a block's accumulator leaves after its step).
  const buffer_pair kb = make_buffers(plan, rows_max, plan.D), vb = make_buffers(plan, rows_max, plan.Dv);
  const buffer_pair dkb = make_buffers(plan, rows_max, plan.D), dvb = make_buffers(plan, rows_max, plan.Dv);
  load_block(k, kb[0]), load_block(v, vb[0]);

  ring_link kv_link(plan, comm.get()), dkv_link(plan, comm.get());
  for (int s = 0; s < plan.P; ++s) {
    const int owner = owner_at(plan, s);
    const std::int64_t rows = plan.n[std::size_t(owner)];
    const Tensor &kc = kb[s % 2], &vc = vb[s % 2], &dkc = dkb[s % 2], &dvc = dvb[s % 2];
    if (s + 1 < plan.P) pass_on(kv_link, plan, s, kb, tag_k, vb, tag_v);
    ring_step step;
    const double t0 = MPI_Wtime();
    // This step's dk/dv contributions, added to the owner's accumulator once it has arrived.
    const Tensor dk_step = Tensor::zeros({B, Hkv, rows, plan.D}, plan.type);
    const Tensor dv_step = Tensor::zeros({B, Hkv, rows, plan.Dv}, plan.type);
    const TensorView kv = rows_view(kc, rows), vv = rows_view(vc, rows);
    for_each_pair(plan, owner, [&](std::int64_t lq, segment qg, std::int64_t lk, segment kg) {
      problem_storage store;
      const problem p = block_problem(plan, q.slice(2, lq, lq + qg.length), kv.slice(2, lk, lk + kg.length),
                                      vv.slice(2, lk, lk + kg.length), qg, kg, store);
      const std::int64_t scores = unmasked_scores(p);
      if (scores == 0) return;
      step.scores += scores;
      const Tensor dq = Tensor::empty({B, Hq, qg.length, plan.D}, plan.type);
      const Tensor dk = Tensor::empty({B, Hkv, kg.length, plan.D}, plan.type);
      const Tensor dv = Tensor::empty({B, Hkv, kg.length, plan.Dv}, plan.type);
      const Tensor lse_seg = Tensor::copy_of(lse_c.view().slice(2, lq, lq + qg.length));
      attn::detail::backward_io io;
      io.out = as_bhnx(out.slice(2, lq, lq + qg.length), Hq);
      io.dout = as_bhnx(dout.slice(2, lq, lq + qg.length), Hq);
      io.lse = lse_seg.data();
      io.lse_type = plan.type;
      io.dq = as_bhnx(dq, Hq), io.dk = as_bhnx(dk, Hkv), io.dv = as_bhnx(dv, Hkv);
      io.dalibi = dalibi.empty() ? nullptr : dalibi.data();
      plan.backend->backward(p, io);
      kv_link.progress(), dkv_link.progress();
      with_type(plan.type, [&](auto t) {
        using T = decltype(t);
        add_rows(dq_acc.data_as<double>(), n, lq, dq.data_as<T>(), qg.length, B * Hq, plan.D);
        add_rows(dk_step.data_as<T>(), rows, lk, dk.data_as<T>(), kg.length, B * Hkv, plan.D);
        add_rows(dv_step.data_as<T>(), rows, lk, dv.data_as<T>(), kg.length, B * Hkv, plan.Dv);
      });
    });
    step.compute_s = MPI_Wtime() - t0;
    // The owner's accumulator (zero at step 0) arrived during the compute; add and pass it on.
    step.wait_s = s > 0 ? dkv_link.wait() : 0.0;
    with_type(plan.type, [&](auto t) {
      using T = decltype(t);
      add_rows(dkc.data_as<T>(), rows, 0, dk_step.data_as<T>(), rows, B * Hkv, plan.D);
      add_rows(dvc.data_as<T>(), rows, 0, dv_step.data_as<T>(), rows, B * Hkv, plan.Dv);
    });
    if (plan.P > 1) pass_on(dkv_link, plan, s, dkb, tag_dk, dvb, tag_dv);  // after step P - 1: the hop home
    if (s + 1 < plan.P) step.wait_s += kv_link.wait();
    g.stats.steps.push_back(step);
  }
  if (plan.P > 1) g.stats.steps.back().wait_s += dkv_link.wait();
  const int home = plan.P > 1 ? plan.P % 2 : 0;  // the buffer the last hop wrote ("step P")

  g.dq = dq_acc.to(plan.type);
  g.dk = Tensor::copy_of(rows_view(dkb[home], n));
  g.dv = Tensor::copy_of(rows_view(dvb[home], n));

  if (!dalibi.empty()) {
    check_mpi(op, MPI_Allreduce(MPI_IN_PLACE, dalibi.data(), int(dalibi.size()), MPI_DOUBLE, MPI_SUM, comm.get()),
              "Allreduce of dalibi_slopes");
    const TensorView& sl = *options.alibi_slopes;
    Tensor r = Tensor::zeros(sl.shape(), dtype::f64);  // [Hq] sums over b; [B, Hq] as is
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hq; ++h)
        r.data_as<double>()[sl.rank() == 1 ? h : b * Hq + h] += dalibi[std::size_t(b * Hq + h)];
    g.dalibi_slopes = r.to(sl.type());
  }
  if (!plan.sinks.empty()) {
    std::vector<double> ds(std::size_t(Hq), 0.0);
    for (std::int64_t b = 0; b < B; ++b)
      for (std::int64_t h = 0; h < Hq; ++h)
        for (std::int64_t i = 0; i < n; ++i) {
          const double l = lse_c.get({b, h, i});
          if (l == kNegInf) continue;
          double delta = 0.0;
          for (std::int64_t d = 0; d < plan.Dv; ++d) delta += dout.get({b, h, i, d}) * out.get({b, h, i, d});
          ds[std::size_t(h)] -= std::exp(plan.sinks[std::size_t(h)] - l) * delta;
        }
    check_mpi(op, MPI_Allreduce(MPI_IN_PLACE, ds.data(), int(Hq), MPI_DOUBLE, MPI_SUM, comm.get()),
              "Allreduce of dsinks");
    g.dsinks = Tensor::from_values({Hq}, options.sinks->type(), ds);
  }
  return g;
}

}  // namespace attn::dist

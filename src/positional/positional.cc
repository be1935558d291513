// src/positional/positional.cc — the front of the positional encodings: checks every argument,
// views inputs as strided [B, H, N, D], allocates outputs and runs the fast path (or the
// float64 reference when ATTN_BACKEND=reference). Messages: "op: what, got values".
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "attn/error.h"
#include "attn/positional.h"
#include "core/common.h"
#include "positional/positional_impl.h"

namespace attn {
namespace positional_detail {
namespace {
using detail::fail;


// The one switch to the reference path (the same variable the core op reads).
bool use_reference() {
  const char* env = std::getenv("ATTN_BACKEND");
  return env && std::string(env) == "reference";
}

void check_float(const char* op, const char* name, const TensorView& t) {
  if (!is_floating(t.type()))
    fail(op, fmt::format("{} has dtype {}, expected float32, float16, bfloat16 or float64", name, dtype_name(t.type())));
  if (t.data() == nullptr && t.numel() != 0) fail(op, fmt::format("{} has no data", name));
}

// [.., N, D] seen as [B, 1, N, D] (rank 2: B = 1, batch stride 0). Not detail::as_bhnx: that
// one splits 3-D [B, N, H*X] into heads and has no rank 2; positional tables and x are
// [N, D] or [B, N, D] with one head.
strided4 as_bnd(const TensorView& t) {
  return strided4{t.data(), t.type(), t.rank() == 3 ? t.stride(0) : 0, 0, t.stride(-2), t.stride(-1)};
}

struct resolved_positions {
  row_positions rows;
  std::int64_t batches = 0;  // 0: shared by every batch (offset or ids [N]); else ids.size(0)
  std::shared_ptr<std::vector<std::int64_t>> widened;  // int32 ids as int64 (rows.ids points here)
};

resolved_positions resolve_positions(const char* op, const positions& pos, std::int64_t N) {
  resolved_positions r;
  if (!pos.ids) {
    r.rows.offset = pos.offset;
    return r;
  }
  const TensorView& t = *pos.ids;
  if (pos.offset != 0)
    fail(op, fmt::format("positions has both offset = {} and ids {}; give one of them", pos.offset, shape_str(t.shape())));
  if (t.type() != dtype::i64 && t.type() != dtype::i32)
    fail(op, fmt::format("positions has dtype {}, expected int64 or int32", dtype_name(t.type())));
  if (t.data() == nullptr && t.numel() != 0) fail(op, "positions has no data");
  if ((t.rank() != 1 && t.rank() != 2) || t.size(-1) != N)
    fail(op, fmt::format("positions has shape {}, expected [N] = [{}] or [B, N] = [B, {}]", shape_str(t.shape()), N, N));
  if (t.rank() == 2) r.batches = t.size(0);
  if (t.type() == dtype::i32) {  // widened once, C order (the kernels read int64 ids)
    r.widened = std::make_shared<std::vector<std::int64_t>>(detail::read_index(op, "positions", t, t.rank(), "[N] or [B, N]"));
    r.rows.ids = r.widened->data();
    r.rows.sn = 1;
    r.rows.sb = r.batches > 1 ? N : 0;
    return r;
  }
  r.rows.ids = t.data_as<const std::int64_t>();
  r.rows.sn = t.stride(-1);
  if (t.rank() == 2) r.rows.sb = r.batches == 1 ? 0 : t.stride(0);
  return r;
}

// Positions with ids [Bp, N] applied to a tensor of batch B: Bp must be 1 or B.
void check_batches(const char* op, const resolved_positions& r, std::int64_t B, const char* name, const TensorView& x) {
  if (r.batches > 1 && r.batches != B)
    fail(op, fmt::format("positions has {} batches but {} {} has {}; expected [N] or [1 or {}, N]", r.batches, name,
                         shape_str(x.shape()), B, B));
}

// Every position must index a row of a table of `P` rows.
void check_in_table(const char* op, const resolved_positions& r, std::int64_t B, std::int64_t N, std::int64_t P) {
  if (!r.rows.ids) {
    if (N > 0 && (r.rows.offset < 0 || r.rows.offset + N > P))
      fail(op, fmt::format("positions offset = {} with N = {} reaches {}, outside the table's rows [0, {})",
                           r.rows.offset, N, r.rows.offset < 0 ? r.rows.offset : r.rows.offset + N - 1, P));
    return;
  }
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t n = 0; n < N; ++n) {
      const std::int64_t p = r.rows.at(b, n);
      if (p < 0 || p >= P)
        fail(op, fmt::format("positions[{}, {}] = {} is outside the table's rows [0, {})", b, n, p, P));
    }
}

void check_base(const char* op, double base) {
  if (!(base > 0.0) || !std::isfinite(base)) fail(op, fmt::format("base = {} must be finite and > 0", base));
}

void check_relative(const char* op, const relative_position_options& o) {
  const std::int64_t nb = o.bidirectional ? o.num_buckets / 2 : o.num_buckets;
  if (nb / 2 < 1)
    fail(op, fmt::format("num_buckets = {} is too small; T5 needs max_exact = {} = {} >= 1, so num_buckets >= {}",
                         o.num_buckets, o.bidirectional ? "num_buckets / 4" : "num_buckets / 2", nb / 2,
                         o.bidirectional ? 4 : 2));
  if (o.max_distance <= nb / 2)
    fail(op, fmt::format("max_distance = {} must exceed max_exact = {} (num_buckets = {}, {})", o.max_distance, nb / 2,
                         o.num_buckets, o.bidirectional ? "bidirectional" : "causal"));
}

Tensor rotary_impl(const char* op, const char* name, const TensorView& x, const positions& pos,
                   const rotary_options& o, bool inverse) {
  check_float(op, name, x);
  if (x.rank() != 4 && x.rank() != 3)
    fail(op, fmt::format("{} has {} dims {}, expected 4 (B, H, N, D) or 3 (B, N, H*D)", name, x.rank(),
                         shape_str(x.shape())));
  if (o.num_heads < 0) fail(op, fmt::format("num_heads = {} must not be negative", o.num_heads));
  rotary_problem p;
  p.B = x.size(0);
  if (x.rank() == 4) {
    p.H = x.size(1), p.N = x.size(2), p.D = x.size(3);
    if (o.num_heads && o.num_heads != p.H)
      fail(op, fmt::format("num_heads = {} but 4-D {} {} has {} heads", o.num_heads, name, shape_str(x.shape()), p.H));
  } else {
    if (o.num_heads == 0) fail(op, fmt::format("3-D {} {} needs num_heads (got 0)", name, shape_str(x.shape())));
    if (x.size(2) % o.num_heads)
      fail(op, fmt::format("{} hidden size {} is not a multiple of num_heads = {}", name, x.size(2), o.num_heads));
    p.H = o.num_heads, p.N = x.size(1), p.D = x.size(2) / o.num_heads;
  }
  if (o.rotary_dim < 0 || o.rotary_dim > p.D)
    fail(op, fmt::format("rotary_dim = {} is outside [0, D] = [0, {}] (0 means D)", o.rotary_dim, p.D));
  p.R = o.rotary_dim ? o.rotary_dim : p.D;
  if (p.R % 2)
    fail(op, o.rotary_dim ? fmt::format("rotary_dim = {} must be even (features rotate in pairs)", p.R)
                          : fmt::format("rotary_dim defaults to D = {}, which is odd; features rotate in pairs "
                                        "(set an even rotary_dim < D)", p.D));
  check_base(op, o.base);
  const resolved_positions rp = resolve_positions(op, pos, p.N);
  check_batches(op, rp, p.B, name, x);
  p.base = o.base;
  p.layout = o.layout;
  p.inverse = inverse;
  p.pos = rp.rows;

  Tensor out = Tensor::empty(x.shape(), x.type());
  const auto view = [&](const TensorView& t) {
    if (t.rank() == 4) return strided4{t.data(), t.type(), t.stride(0), t.stride(1), t.stride(2), t.stride(3)};
    return strided4{t.data(), t.type(), t.stride(0), p.D * t.stride(2), t.stride(1), t.stride(2)};
  };
  p.x = view(x);
  p.out = view(out);
  if (out.numel() == 0) return out;
  use_reference() ? reference::rotary(p) : fast::rotary(p);
  return out;
}

}  // namespace
}  // namespace positional_detail

using namespace positional_detail;

// ---- sinusoidal ----------------------------------------------------------------------------

Tensor sinusoidal_encoding(std::int64_t N, std::int64_t D, double base, dtype t, const positions& pos) {
  const char* op = "sinusoidal_encoding";
  if (N < 0 || D < 0) fail(op, fmt::format("N = {} and D = {} must not be negative", N, D));
  if (!is_floating(t)) fail(op, fmt::format("dtype {} is not a float dtype", dtype_name(t)));
  check_base(op, base);
  const resolved_positions rp = resolve_positions(op, pos, N);
  sinusoidal_problem p;
  p.B = rp.batches ? rp.batches : 1, p.N = N, p.D = D, p.base = base, p.pos = rp.rows;
  Tensor out = Tensor::empty(rp.batches ? Shape{rp.batches, N, D} : Shape{N, D}, t);
  p.out = as_bnd(out);
  if (out.numel() == 0) return out;
  use_reference() ? reference::sinusoidal(p) : fast::sinusoidal(p);
  return out;
}

Tensor add_sinusoidal_encoding(const TensorView& x, const positions& pos, double base) {
  const char* op = "add_sinusoidal_encoding";
  check_float(op, "x", x);
  if (x.rank() != 2 && x.rank() != 3)
    fail(op, fmt::format("x has {} dims {}, expected 2 (N, D) or 3 (B, N, D)", x.rank(), shape_str(x.shape())));
  check_base(op, base);
  sinusoidal_problem p;
  p.B = x.rank() == 3 ? x.size(0) : 1, p.N = x.size(-2), p.D = x.size(-1), p.base = base, p.add = true;
  const resolved_positions rp = resolve_positions(op, pos, p.N);
  if (x.rank() == 2 && rp.batches > 1)
    fail(op, fmt::format("positions has {} batches but x {} has none; pass x as [B, N, D]", rp.batches,
                         shape_str(x.shape())));
  check_batches(op, rp, p.B, "x", x);
  p.pos = rp.rows;
  Tensor out = Tensor::empty(x.shape(), x.type());
  p.x = as_bnd(x);
  p.out = as_bnd(out);
  if (out.numel() == 0) return out;
  use_reference() ? reference::sinusoidal(p) : fast::sinusoidal(p);
  return out;
}

// ---- learned table -------------------------------------------------------------------------

Tensor learned_position_encoding(const TensorView& table, std::int64_t N, const positions& pos) {
  const char* op = "learned_position_encoding";
  check_float(op, "table", table);
  if (table.rank() != 2)
    fail(op, fmt::format("table has {} dims {}, expected 2 (num_positions, D)", table.rank(), shape_str(table.shape())));
  if (N < 0) fail(op, fmt::format("N = {} must not be negative", N));
  const resolved_positions rp = resolve_positions(op, pos, N);
  learned_problem p;
  p.B = rp.batches ? rp.batches : 1, p.N = N, p.D = table.size(1), p.P = table.size(0), p.pos = rp.rows;
  check_in_table(op, rp, p.B, N, p.P);
  Tensor out = Tensor::empty(rp.batches ? Shape{rp.batches, N, p.D} : Shape{N, p.D}, table.type());
  p.table = strided4{table.data(), table.type(), 0, 0, table.stride(0), table.stride(1)};
  p.out = as_bnd(out);
  if (out.numel() == 0) return out;
  use_reference() ? reference::learned_forward(p) : fast::learned_forward(p);
  return out;
}

Tensor learned_position_encoding_backward(const TensorView& dout, std::int64_t num_positions, const positions& pos) {
  const char* op = "learned_position_encoding_backward";
  check_float(op, "dout", dout);
  if (dout.rank() != 2 && dout.rank() != 3)
    fail(op, fmt::format("dout has {} dims {}, expected 2 (N, D) or 3 (B, N, D)", dout.rank(), shape_str(dout.shape())));
  if (num_positions < 0) fail(op, fmt::format("num_positions = {} must not be negative", num_positions));
  learned_problem p;
  p.B = dout.rank() == 3 ? dout.size(0) : 1, p.N = dout.size(-2), p.D = dout.size(-1), p.P = num_positions;
  const resolved_positions rp = resolve_positions(op, pos, p.N);
  if (dout.rank() == 2 && rp.batches > 1)
    fail(op, fmt::format("positions has {} batches but dout {} has none; pass dout as [B, N, D]", rp.batches,
                         shape_str(dout.shape())));
  check_batches(op, rp, p.B, "dout", dout);
  check_in_table(op, rp, p.B, p.N, p.P);
  p.pos = rp.rows;
  Tensor acc = Tensor::zeros({num_positions, p.D}, dtype::f64);
  p.dout = as_bnd(dout);
  p.dtable = acc.data_as<double>();
  if (dout.numel() > 0) use_reference() ? reference::learned_backward(p) : fast::learned_backward(p);
  return acc.to(dout.type());
}

// ---- rotary --------------------------------------------------------------------------------

Tensor rotary(const TensorView& x, const positions& pos, const rotary_options& options) {
  return rotary_impl("rotary", "x", x, pos, options, false);
}

Tensor rotary_backward(const TensorView& dy, const positions& pos, const rotary_options& options) {
  return rotary_impl("rotary_backward", "dy", dy, pos, options, true);
}

// ---- T5 relative position bias -------------------------------------------------------------

std::int64_t relative_position_bucket(std::int64_t relative_position, const relative_position_options& options) {
  check_relative("relative_position_bucket", options);
  return t5_bucket(relative_position, options);
}

Tensor relative_position_buckets(std::int64_t Nq, std::int64_t Nk, const relative_position_options& options) {
  const char* op = "relative_position_buckets";
  check_relative(op, options);
  if (Nq < 0 || Nk < 0) fail(op, fmt::format("Nq = {} and Nk = {} must not be negative", Nq, Nk));
  Tensor out = Tensor::empty({Nq, Nk}, dtype::i64);
  auto* o = out.data_as<std::int64_t>();
  for (std::int64_t i = 0; i < Nq; ++i)
    for (std::int64_t j = 0; j < Nk; ++j) o[i * Nk + j] = t5_bucket(j - (options.query_offset + i), options);
  return out;
}

Tensor relative_position_bias(const TensorView& table, std::int64_t Nq, std::int64_t Nk,
                              const relative_position_options& options) {
  const char* op = "relative_position_bias";
  check_relative(op, options);
  check_float(op, "table", table);
  if (table.rank() != 2 || table.size(0) != options.num_buckets)
    fail(op, fmt::format("table has shape {}, expected [num_buckets, H] = [{}, H]", shape_str(table.shape()),
                         options.num_buckets));
  if (Nq < 0 || Nk < 0) fail(op, fmt::format("Nq = {} and Nk = {} must not be negative", Nq, Nk));
  relative_problem p;
  p.H = table.size(1), p.Nq = Nq, p.Nk = Nk, p.opt = options;
  Tensor out = Tensor::empty({1, p.H, Nq, Nk}, table.type());
  p.table = strided4{table.data(), table.type(), 0, 0, table.stride(0), table.stride(1)};
  p.out = strided4{out.data(), out.type(), 0, Nq * Nk, Nk, 1};
  if (out.numel() == 0) return out;
  use_reference() ? reference::relative_forward(p) : fast::relative_forward(p);
  return out;
}

Tensor relative_position_bias_backward(const TensorView& dbias, const relative_position_options& options) {
  const char* op = "relative_position_bias_backward";
  check_relative(op, options);
  check_float(op, "dbias", dbias);
  if (dbias.rank() != 3 && dbias.rank() != 4)
    fail(op, fmt::format("dbias has {} dims {}, expected 4 (B, H, Nq, Nk) or 3 (H, Nq, Nk)", dbias.rank(),
                         shape_str(dbias.shape())));
  relative_problem p;
  p.Bd = dbias.rank() == 4 ? dbias.size(0) : 1;
  p.H = dbias.size(-3), p.Nq = dbias.size(-2), p.Nk = dbias.size(-1), p.opt = options;
  Tensor acc = Tensor::zeros({options.num_buckets, p.H}, dtype::f64);
  p.dbias = strided4{dbias.data(), dbias.type(), dbias.rank() == 4 ? dbias.stride(0) : 0, dbias.stride(-3),
                     dbias.stride(-2), dbias.stride(-1)};
  p.dtable = acc.data_as<double>();
  if (dbias.numel() > 0) use_reference() ? reference::relative_backward(p) : fast::relative_backward(p);
  return acc.to(dbias.type());
}

}  // namespace attn

// src/serving/serving.cc — pieces shared by the varlen and paged fronts (serving.h).
#include "serving/serving.h"

#include <fmt/format.h>

#include <cstddef>

#include "core/common.h"
#include "core/names.h"

namespace attn {

namespace {
constexpr std::array kInt8QueryNames = {detail::enum_name{int8_query::automatic, "automatic"},
                                        detail::enum_name{int8_query::float32, "float32"},
                                        detail::enum_name{int8_query::int8, "int8"}};
static_assert(detail::names_cover(kInt8QueryNames, int8_query::int8));
}  // namespace

std::string_view to_string(int8_query q) {
  const auto i = static_cast<std::size_t>(q);
  return i < kInt8QueryNames.size() ? kInt8QueryNames[i].name : std::string_view("unknown int8_query");
}
int8_query parse_int8_query(std::string_view name) { return detail::parse_name(kInt8QueryNames, name, "int8_query"); }

}  // namespace attn

namespace attn::detail {

void check_serving_options(const char* op, const attention_options& o, std::int64_t B, std::int64_t Hq,
                           std::int64_t Hkv, bool mask_ok) {
  if (o.attn_mask && !mask_ok) fail(op, "attn_mask is not supported per sequence (use causal, windows or ALiBi)");
  if (o.nonpad_kv_seqlen) fail(op, "nonpad_kv_seqlen is not accepted: the sequence lengths say which keys are valid");
  if (o.past_key || o.past_value) fail(op, "past_key/past_value are not accepted; the keys are given in full");
  if (o.return_qk != qk_output::none) fail(op, "return_qk is not supported; leave it at none");
  if (o.q_num_heads && o.q_num_heads != Hq)
    fail(op, fmt::format("q_num_heads = {} but q has {} heads", o.q_num_heads, Hq));
  if (o.kv_num_heads && o.kv_num_heads != Hkv)
    fail(op, fmt::format("kv_num_heads = {} but k has {} heads", o.kv_num_heads, Hkv));
  if (o.alibi_slopes) {
    const TensorView& s = *o.alibi_slopes;
    const bool ok = (s.rank() == 1 && s.size(0) == Hq) || (s.rank() == 2 && s.size(0) == B && s.size(1) == Hq);
    if (!ok)
      fail(op, fmt::format("alibi_slopes has shape {}, expected [Hq] = [{}] or [B, Hq] = [{}, {}]",
                           shape_str(s.shape()), Hq, B, Hq));
  }
}

void check_saved(const char* op, const TensorView& out, const TensorView& dout, const TensorView& lse,
                 const Shape& out_shape, const Shape& lse_shape, const char* lse_layout) {
  if (out.shape() != out_shape)
    fail(op, fmt::format("out has shape {}, expected {}", shape_str(out.shape()), shape_str(out_shape)));
  if (dout.shape() != out_shape)
    fail(op, fmt::format("dout has shape {}, expected {}", shape_str(dout.shape()), shape_str(out_shape)));
  if (!is_floating(out.type()) || !is_floating(dout.type()))
    fail(op, fmt::format("out/dout have dtypes {}/{}, expected float dtypes", dtype_name(out.type()), dtype_name(dout.type())));
  if (lse.shape() != lse_shape)
    fail(op, fmt::format("lse has shape {}, expected {} = {}", shape_str(lse.shape()), lse_layout, shape_str(lse_shape)));
  if (lse.type() != dtype::f32 && lse.type() != dtype::f64)
    fail(op, fmt::format("lse has dtype {}, expected float32 or float64", dtype_name(lse.type())));
}

attention_options for_sequence(const attention_options& o, std::int64_t b) {
  attention_options r = o;
  r.q_num_heads = r.kv_num_heads = 0;
  if (o.alibi_slopes && o.alibi_slopes->rank() == 2) {
    const TensorView& s = *o.alibi_slopes;
    r.alibi_slopes = TensorView(static_cast<std::byte*>(s.data()) + b * s.stride(0) * dtype_size(s.type()), s.type(),
                                {s.size(1)}, {s.stride(1)});
  }
  return r;
}

std::vector<std::int64_t> read_cu_seqlens(const char* op, const char* name, const TensorView& t, std::int64_t total,
                                          std::int64_t max_seqlen) {
  std::vector<std::int64_t> cu = read_index(op, name, t, 1, "[B + 1]");
  if (cu.empty()) fail(op, fmt::format("{} has 0 entries, expected B + 1 >= 1", name));
  if (cu[0] != 0) fail(op, fmt::format("{}[0] = {}, expected 0", name, cu[0]));
  for (std::size_t b = 1; b < cu.size(); ++b) {
    if (cu[b] < cu[b - 1])
      fail(op, fmt::format("{}[{}] = {} is less than {}[{}] = {}; cumulative lengths must not decrease", name, b,
                           cu[b], name, b - 1, cu[b - 1]));
    if (cu[b] - cu[b - 1] > max_seqlen)
      fail(op, fmt::format("sequence {} has length {} ({}[{}] - {}[{}]), more than max_seqlen = {}", b - 1,
                           cu[b] - cu[b - 1], name, b, name, b - 1, max_seqlen));
  }
  if (cu.back() != total)
    fail(op, fmt::format("{}[{}] = {} but the packed tensor has {} tokens; the last entry must be the total", name,
                         cu.size() - 1, cu.back(), total));
  return cu;
}

TensorView token_rows(const TensorView& t, std::int64_t r0, std::int64_t n) {
  auto* base = static_cast<std::byte*>(t.data());
  if (base) base += r0 * t.stride(0) * std::int64_t(dtype_size(t.type()));
  return TensorView(base, t.type(), {1, t.size(1), n, t.size(2)},
                    {n * t.stride(0), t.stride(1), t.stride(0), t.stride(2)});
}

std::vector<std::int64_t> packed_mask_offsets(const char* op, const TensorView& m, const std::vector<std::int64_t>& nq,
                                              const std::vector<std::int64_t>& nk, std::int64_t Hq) {
  if (m.type() != dtype::boolean && !is_floating(m.type()))
    fail(op, fmt::format("attn_mask has dtype {}, expected bool or a float dtype", dtype_name(m.type())));
  std::vector<std::int64_t> off{0};
  for (std::size_t b = 0; b < nq.size(); ++b) off.push_back(off.back() + nq[b] * nk[b]);
  const std::int64_t S = off.back();
  const bool ok = (m.rank() == 1 && m.size(0) == S) ||
                  (m.rank() == 2 && (m.size(0) == 1 || m.size(0) == Hq) && m.size(1) == S);
  if (!ok)
    fail(op, fmt::format("attn_mask has shape {}, expected the sequences' masks packed: [S] or [1 or Hq, S] with "
                         "Hq = {} and S = sum of Nq_b * Nk_b = {}",
                         shape_str(m.shape()), Hq, S));
  if (m.data() == nullptr && m.numel() != 0) fail(op, "attn_mask has no data");
  return off;
}

TensorView packed_mask_block(const TensorView& m, std::int64_t off, std::int64_t nq, std::int64_t nk) {
  const std::int64_t s = m.stride(m.rank() - 1);
  auto* base = static_cast<std::byte*>(m.data());
  if (base) base += off * s * std::int64_t(dtype_size(m.type()));
  if (m.rank() == 1) return TensorView(base, m.type(), {nq, nk}, {nk * s, s});
  return TensorView(base, m.type(), {m.size(0), nq, nk}, {m.stride(0), nk * s, s});
}

}  // namespace attn::detail

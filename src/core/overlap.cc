// src/core/overlap.cc — see overlap.h.
#include "core/overlap.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace attn::detail {
namespace {

// [first byte, one past the last byte] of a non-empty view.
std::pair<std::uintptr_t, std::uintptr_t> byte_range(const TensorView& t) {
  std::int64_t last = 0;
  for (int d = 0; d < t.rank(); ++d) last += (t.size(d) - 1) * t.stride(d);
  const auto base = reinterpret_cast<std::uintptr_t>(t.data());
  const std::uintptr_t e = dtype_size(t.type());
  return {base, base + std::uintptr_t(last) * e + e};
}

// Whether target = Σ_k y_k c_k has a solution with y_k in [lo_k, hi_k]: terms by decreasing c
// (all c > 0), each y taken only where the terms after it can still reach what is left. Views
// whose dims do not interleave leave at most two choices a term; `budget` bounds the search
// (spent: the answer is "maybe", true).
struct term {
  std::int64_t c, lo, hi;
};
bool reachable(const std::vector<term>& t, std::size_t k, std::int64_t target, const std::vector<std::int64_t>& rest_lo,
               const std::vector<std::int64_t>& rest_hi, std::int64_t& budget) {
  if (--budget < 0) return true;
  if (k == t.size()) return target == 0;
  const term& x = t[k];
  // y with target - y·c in [rest_lo[k+1], rest_hi[k+1]]
  const auto floor_div = [](std::int64_t a, std::int64_t b) { return a / b - (a % b != 0 && (a < 0) != (b < 0)); };
  const auto ceil_div = [&](std::int64_t a, std::int64_t b) { return -floor_div(-a, b); };
  const std::int64_t y0 = std::max(x.lo, ceil_div(target - rest_hi[k + 1], x.c));
  const std::int64_t y1 = std::min(x.hi, floor_div(target - rest_lo[k + 1], x.c));
  for (std::int64_t y = y0; y <= y1; ++y)
    if (reachable(t, k + 1, target - y * x.c, rest_lo, rest_hi, budget)) return true;
  return false;
}

}  // namespace

bool overlaps_itself(const TensorView& t) {
  if (t.numel() <= 1) return false;
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size) of dims of size > 1
  for (int d = 0; d < t.rank(); ++d)
    if (t.size(d) > 1) dims.push_back({t.stride(d), t.size(d)});
  std::sort(dims.begin(), dims.end());
  std::int64_t reach = 0;  // the largest offset the dims before this one make
  for (const auto& [s, n] : dims) {
    if (s <= reach) return true;  // (a stride of 0 included)
    reach += (n - 1) * s;
  }
  return false;
}

bool may_share_memory(const TensorView& a, const TensorView& b) {
  if (a.numel() == 0 || b.numel() == 0) return false;
  const auto [a0, a1] = byte_range(a);
  const auto [b0, b1] = byte_range(b);
  if (a1 <= b0 || b1 <= a0) return false;
  const std::int64_t e = std::int64_t(dtype_size(a.type()));
  const std::int64_t delta = std::int64_t(b0) - std::int64_t(a0);
  if (a.type() != b.type() || delta % e != 0 || overlaps_itself(a) || overlaps_itself(b)) return true;
  // An element of a at Σ i_d sa_d meets one of b at δ + Σ j_d sb_d: Σ i_d sa_d - Σ j_d sb_d = δ,
  // the terms of one stride merged (y = i - j).
  std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> by_stride;  // stride → [lo, hi]
  for (int d = 0; d < a.rank(); ++d)
    if (a.size(d) > 1) by_stride[a.stride(d)].second += a.size(d) - 1;
  for (int d = 0; d < b.rank(); ++d)
    if (b.size(d) > 1) by_stride[b.stride(d)].first -= b.size(d) - 1;
  std::vector<term> t;
  for (const auto& [s, r] : by_stride) t.push_back({s, r.first, r.second});
  std::reverse(t.begin(), t.end());  // by decreasing stride
  std::vector<std::int64_t> rest_lo(t.size() + 1, 0), rest_hi(t.size() + 1, 0);
  for (std::size_t k = t.size(); k-- > 0;)
    rest_lo[k] = rest_lo[k + 1] + t[k].lo * t[k].c, rest_hi[k] = rest_hi[k + 1] + t[k].hi * t[k].c;
  std::int64_t budget = 100000;
  return reachable(t, 0, delta / e, rest_lo, rest_hi, budget);
}

}  // namespace attn::detail

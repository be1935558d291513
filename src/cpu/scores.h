// src/cpu/scores.h — what the cpu kernels do to a score between the two products, shared by
// the prefill passes and decode: x = scale·(q·k) → softcap → + mask + ALiBi → -inf outside the
// query's key range [lo, hi); and which keys of a lane block any lane may see.
#pragma once

#include <cstdint>

#include "cpu/kernels.h"
#include "cpu/simd.h"

namespace attn::detail::cpu {
namespace {

struct score_consts {
  vf scale, cap, inv_cap;
  vf scale_log2;  // scale·log2 e
  bool softcap, bias, alibi;
  bool plain;     // no softcap, mask or ALiBi: the score is scale·q·k (or -inf outside the range)
  explicit score_consts(const score_params& sp)
      : scale(splat(sp.scale)),
        cap(splat(sp.softcap)),
        inv_cap(splat(sp.softcap > 0 ? 1.0f / sp.softcap : 0.0f)),
        scale_log2(splat(sp.scale * kLog2e)),
        softcap(sp.softcap > 0),
        bias(sp.bias != nullptr),
        alibi(sp.alibi),
        plain(!softcap && !bias && !alibi) {}
};

// |pos - j| as floats: the ALiBi distance of key j from the query at key position pos.
inline vf key_distance(vi pos, vi j) {
  const vi d = pos - j;
  return __builtin_convertvector(d < 0 ? -d : d, vf);
}

// The score of q·k for key j (pos: the query's key position, for ALiBi); *t receives
// tanh(scale·qk / cap) with softcap (the backward's chain rule needs 1 - t²). `ranged`: some
// lane's key range excludes part of the block, so [lo, hi) must be applied.
inline vf transform(vf qk, const score_consts& c, vf* t, vf bias, vi j, vi pos, vi lo, vi hi, vf slope, bool ranged) {
  vf s = qk * c.scale;
  if (c.softcap) {
    const vf th = vtanh(s * c.inv_cap);
    *t = th;
    s = c.cap * th;
  }
  if (c.bias) s += bias;
  if (c.alibi) s -= slope * key_distance(pos, j);
  if (ranged) s = ((j >= lo) & (j < hi)) ? s : splat(-kInf);
  return s;
}

// (s - m)·log2 e for the score s of qk (transform's arguments; mz = m·log2 e), so that vexp2 of
// it is the weight e^{s - m}: a plain score takes scale and log2 e in one multiply-add.
inline vf weight_log2(vf qk, const score_consts& c, vf* t, vf bias, vi j, vi pos, vi lo, vi hi, vf slope, bool ranged,
                      vf mz) {
  if (!c.plain) return transform(qk, c, t, bias, j, pos, lo, hi, slope, ranged) * splat(kLog2e) - mz;
  const vf u = qk * c.scale_log2 - mz;
  return ranged ? ((j >= lo) & (j < hi)) ? u : splat(-kInf) : u;
}

// Keys [kmin, kmax) that some valid lane of the block may see, within the call's [klo, khi).
struct lane_range {
  std::int64_t kmin, kmax;
  explicit lane_range(const lane_block& lb) : kmin(lb.khi), kmax(lb.klo) {
    for (std::int64_t x = 0; x < lb.nl; ++x)
      if (lb.lo[x] < lb.hi[x]) kmin = imin(kmin, lb.lo[x]), kmax = imax(kmax, lb.hi[x]);
    kmin = imax(kmin, lb.klo), kmax = imin(kmax, lb.khi);
  }
};
// Whether some lane's key range excludes part of [j0, j1).
inline bool block_ranged(const lane_block& lb, std::int64_t j0, std::int64_t j1) {
  for (std::int64_t x = 0; x < lb.nl; ++x)
    if (lb.lo[x] > j0 || lb.hi[x] < j1) return true;
  return false;
}

}  // namespace
}  // namespace attn::detail::cpu

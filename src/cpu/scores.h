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
  // For a block whose mask tile is all 0 (mask_tile_kind::zeros): the scores are unbiased.
  void drop_bias() { bias = false, plain = !softcap && !alibi; }
};

// |pos - j| as floats: the ALiBi distance of key j from the query at key position pos.
inline vf key_distance(vi pos, vi j) {
  const vi d = pos - j;
  return __builtin_convertvector(d < 0 ? -d : d, vf);
}

// cap·tanh(scale·qk / cap), *t = the tanh: transform's softcap, the same operations (the same bits).
inline vf softcapped(vf qk, const score_consts& c, vf* t = nullptr) {
  const vf th = vtanh(qk * c.scale * c.inv_cap);
  if (t) *t = th;
  return c.cap * th;
}

// The score of q·k for key j (pos: the query's key position, for ALiBi); *t receives
// tanh(scale·qk / cap) with softcap (the backward's chain rule needs 1 - t²). `ranged`: some
// lane's key range excludes part of the block, so [lo, hi) must be applied.
inline vf transform(vf qk, const score_consts& c, vf* t, vf bias, vi j, vi pos, vi lo, vi hi, vf slope, bool ranged) {
  vf s = c.softcap ? softcapped(qk, c, t) : qk * c.scale;
  if (c.bias) s += bias;
  if (c.alibi) s -= slope * key_distance(pos, j);
  if (ranged) s = ((j >= lo) & (j < hi)) ? s : splat(-kInf);
  return s;
}

// ---- mask tiles (kernel_table::mask_tile) ----

// Keys [jj + c·W, jj + (c + 1)·W) of one mask row: a bool byte is 0 / -inf, an f32 is itself.
// A bool row is read 4W bytes at a time (one vector load: keys jj .. jj + 4W must lie in the
// row), and chunk c spread from its W/4 words by a lane shuffle and per-lane shifts (a
// conversion of W bytes to W lanes compiles to scalar code with GCC).
template <int... X>
inline vu bool_chunk_shifts(std::integer_sequence<int, X...>) {
  return vu{std::uint32_t(8 * (X % 4))...};
}
template <int c, int... X>
inline vf bool_chunk(vu words, std::integer_sequence<int, X...> seq) {
  const vu b = (vu)shuffle2<(c * W / 4 + X / 4)...>((vf)words, (vf)words) >> bool_chunk_shifts(seq);
  return (b & splatu(0xffu)) != 0 ? vf{} : splat(-kInf);
}
template <int c>
inline vf mask_chunk(const void* row, bool is_bool, std::int64_t jj) {
  if (!is_bool) return load(static_cast<const float*>(row) + jj + c * W);
  vu words;
  __builtin_memcpy(&words, static_cast<const unsigned char*>(row) + jj, 4 * W);
  return bool_chunk<c>(words, std::make_integer_sequence<int, W>{});
}

// Keys [jj, jj + W) of a mask row (bool: W bytes read, widened; f32: one vector).
inline vf mask_vector(const void* row, bool is_bool, std::int64_t jj) {
  if (!is_bool) return load(static_cast<const float*>(row) + jj);
  typedef unsigned char vbytes __attribute__((vector_size(W)));
  vbytes b;
  __builtin_memcpy(&b, static_cast<const unsigned char*>(row) + jj, W);
  return __builtin_convertvector(b, vi) != 0 ? vf{} : splat(-kInf);
}

inline float mask_value(const mask_rows& m, std::int64_t r, std::int64_t jj, std::int64_t n) {
  if (r >= m.valid) return 0.0f;
  if (jj >= n) return -kInf;
  return m.is_bool ? (static_cast<const unsigned char*>(m.row[r])[jj] != 0 ? 0.0f : -kInf)
                   : static_cast<const float*>(m.row[r])[jj];
}

// What mask_tile saw: lanes (or one flag) with a value other than 0, and, among the valid rows,
// other than -inf.
struct mask_seen {
  vi nonzero{}, finite{};
  bool nonzero1 = false, finite1 = false;
  void add(vf v) { nonzero |= v != 0, finite |= v != splat(-kInf); }
  void add(float x) { nonzero1 |= x != 0.0f, finite1 |= x != -kInf; }
  mask_tile_kind kind() const {
    if (!nonzero1 && !any_lane(nonzero)) return mask_tile_kind::zeros;
    if (!finite1 && !any_lane(finite)) return mask_tile_kind::excluded;
    return mask_tile_kind::mixed;
  }
};

// Chunk c of keys [jj, jj + 4W) of rows r0 .. r0 + W in the lane layout: W rows of W keys,
// transposed into keys of W lanes.
template <int c>
inline void lane_blocks(const mask_rows& m, std::int64_t r0, std::int64_t jj, float* tile, std::int64_t ks, mask_seen& seen) {
  vf v[W];
#pragma GCC unroll 16
  for (int x = 0; x < W; ++x) {
    v[x] = vf{};
    if (r0 + x < m.valid) seen.add(v[x] = mask_chunk<c>(m.row[r0 + x], m.is_bool, jj));
  }
  transpose(v);
#pragma GCC unroll 16
  for (int x = 0; x < W; ++x) store(tile + (jj + c * W + x) * ks + r0, v[x]);
}

mask_tile_kind mask_tile(const mask_rows& m, std::int64_t nb, float* tile, std::int64_t rs, std::int64_t ks) {
  const std::int64_t n = imax(0, imin(m.n, nb));
  bool shared = m.valid > 0;  // every valid row reads the same mask row (key padding)
  for (std::int64_t r = 1; r < m.valid && shared; ++r) shared = m.row[r] == m.row[0];
  mask_seen seen;
  if (rs == 1 && m.total % W == 0) {  // lane layout
    if (shared) {  // key by key: one value splat over the valid lanes
      for (std::int64_t jj = 0; jj < nb; ++jj) {
        const float x = mask_value(m, 0, jj, n);
        seen.add(x);
        for (std::int64_t r0 = 0; r0 < m.total; r0 += W)
          store(tile + jj * ks + r0, iota() + std::int32_t(r0) < splati(std::int32_t(m.valid)) ? splat(x) : vf{});
      }
      return seen.kind();
    }
    for (std::int64_t r0 = 0; r0 < m.total; r0 += W) {  // rows r0..r0+W of 4W keys, W × W blocks transposed
      std::int64_t jj = 0;
      for (; jj + 4 * W <= n; jj += 4 * W) {
        lane_blocks<0>(m, r0, jj, tile, ks, seen);
        lane_blocks<1>(m, r0, jj, tile, ks, seen);
        lane_blocks<2>(m, r0, jj, tile, ks, seen);
        lane_blocks<3>(m, r0, jj, tile, ks, seen);
      }
      for (; jj < nb; ++jj)
        for (int x = 0; x < W; ++x) {
          const float y = mask_value(m, r0 + x, jj, n);
          if (r0 + x < m.valid) seen.add(y);
          tile[jj * ks + r0 + x] = y;
        }
    }
    return seen.kind();
  }
  for (std::int64_t r = 0; r < m.total; ++r) {
    float* t = tile + r * rs;
    std::int64_t jj = 0;
    if (ks == 1 && r < m.valid)
      for (; jj + 4 * W <= n; jj += 4 * W) {
        const vf v[4] = {mask_chunk<0>(m.row[r], m.is_bool, jj), mask_chunk<1>(m.row[r], m.is_bool, jj),
                         mask_chunk<2>(m.row[r], m.is_bool, jj), mask_chunk<3>(m.row[r], m.is_bool, jj)};
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          seen.add(v[c]);
          store(t + jj + c * W, v[c]);
        }
      }
    if (ks == 1 && r < m.valid)  // (a decode block: W keys)
      for (; jj + W <= n; jj += W) {
        const vf v = mask_vector(m.row[r], m.is_bool, jj);
        seen.add(v);
        store(t + jj, v);
      }
    for (; jj < nb; ++jj) {
      const float y = mask_value(m, r, jj, n);
      if (r < m.valid) seen.add(y);
      t[jj * ks] = y;
    }
  }
  return seen.kind();
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
  std::int64_t hmin;  // the smallest hi: keys below it are past every lane's lo only
  explicit lane_range(const lane_block& lb) : kmin(lb.khi), kmax(lb.klo), hmin(lb.khi) {
    for (std::int64_t x = 0; x < lb.nl; ++x)
      if (lb.lo[x] < lb.hi[x]) kmin = imin(kmin, lb.lo[x]), kmax = imax(kmax, lb.hi[x]), hmin = imin(hmin, lb.hi[x]);
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

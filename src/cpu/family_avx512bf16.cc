// src/cpu/family_avx512bf16.cc — the fused family kernels (family_kernels.h) for the avx512bf16
// level: the avx512 kernels plus forward_bf16, the forward of dot scores whose products take
// bf16 pairs with vdpbf16ps (simd_avx512bf16.h); and the amx level's forward of dot scores on
// AMX tiles (family_amx). Flags in sources.cmake (the kernel flags: -mamx-tile -mamx-bf16), code
// in family_body.h and, for the tiles, below.
namespace attn::detail::cpu {
namespace {
constexpr int W = 16;  // floats per vector
constexpr int C = 4;  // vectors per lane group: L = C·W query rows per lane block
constexpr int R = 6;  // tile rows
}  // namespace
}  // namespace attn::detail::cpu

#include "cpu/simd_avx512bf16.h"
#include "cpu/family_body.h"
#include "cpu/amx_gemm.h"

namespace attn::detail::cpu {
namespace {

// The scores of keys [j0, j0 + nb) (j0 even) of a lane block on the tiles: Sᵀ [keys][L] = K · Qᵀ
// (A: key rows as words, kw; B: the lanes' query words, qtw), 32 keys at a time — the rows past
// nb land in the next block's rows or the scratch's spare block — times zscale, then the mask,
// activation and ranges (lane_transform). True where the mask hid the block (lane_mask: S = -inf).
// pending: as lane_scores_pairs' (zscale left to α where the transform changes nothing).
inline bool amx_lane_scores(const family_lanes& lb, std::int64_t j0, std::int64_t nb, float* S, float* mask,
                            float* pending = nullptr) {
  constexpr std::int64_t L = C * W;
  if (pending) *pending = 1.0f;
  if (lane_mask<C>(lb, j0, nb, S, nullptr, mask)) return true;
  amx_gemm((nb + 31) / 32 * 32, L, lb.P / 2, lb.kw + j0 * lb.kwsn, lb.kwsn, lb.qtw, L, S, L, false);
  lane_scale_transform<C>(lb, j0, nb, S, mask, pending);
  return false;
}

// fam_forward of bf16 pair operands with its two products on AMX tiles (amx_gemm.h):
//   Sᵀ [keys][L] = K · Qᵀ    A: key rows as words (kw), B: the lanes' query words (qtw)
//   Oᵀ [Dv][L]  += Vᵀ · A    A: Vᵀ in key pairs (vtw), B: α in key pairs
// Blocks of kLaneKeyBlock keys computed 32 at a time: the scores of the keys past a short block
// land in rows the next block (or the scratch's spare block) overwrites; α's pairs past it are
// zeroed, and the keys past Nk are zero keys and values (family_lanes::vtw), so they add nothing.
// The rest — masks, activation, ranges, statistics, α — is fam_forward's.
template <family_dist Dist>
void fam_forward_amx(const family_lanes& lb, float* ot) {
  using Ops = bf16_pair_operands<avx512bf16_dot>;
  constexpr std::int64_t L = C * W;
  static_assert(L % 32 == 0 && kLaneKeyBlock % 32 == 0);
  for (std::int64_t i = 0; i < lb.Dv * L; ++i) ot[i] = 0.0f;
  set_empty_stats<C>(lb);
  std::int64_t kmin, kmax;
  fam_range(lb, kmin, kmax);
  if (kmin >= kmax) return;
  kmin = kmin / 2 * 2, kmax = (kmax + 1) / 2 * 2;  // whole key pairs, as fam_forward's
  constexpr bool keep = family_keeps_scores(Dist);
  const lane_scratch sc(lb, keep ? kmax - kmin + kLaneKeyBlock : kLaneKeyBlock);
  amx_configure();
  float pending = 1.0f;  // (the streaming distributions: zscale left to α)
  const auto scores = [&](std::int64_t j0, std::int64_t nb, float* S) {
    return amx_lane_scores(lb, j0, nb, S, sc.mask, keep ? nullptr : &pending);
  };
  std::int64_t k0 = kmin, k1 = kmax;
  if (keep) {
    live_keys live(kmin, kmax);
    for (std::int64_t j0 = kmin; j0 < kmax; j0 += kLaneKeyBlock) {
      const std::int64_t nb = imin(kLaneKeyBlock, kmax - j0);
      live.add(j0, nb, scores(j0, nb, sc.S + (j0 - kmin) * L));
    }
    if (live.none()) return _tile_release();  // every block hidden: empty rows
    k0 = live.lo, k1 = live.hi;
    lane_stats<Dist, C>(lb, sc.S + (k0 - kmin) * L, k1 - k0, k0, sc.buf);
  }
  for (std::int64_t j0 = k0; j0 < k1; j0 += kLaneKeyBlock) {
    const std::int64_t nb = imin(kLaneKeyBlock, k1 - j0), nt = (nb + 31) / 32 * 32;
    float* S = keep ? sc.S + (j0 - kmin) * L : sc.S;
    if (!keep && scores(j0, nb, S)) continue;  // hidden by the mask: α = 0
    auto* aw = reinterpret_cast<std::uint32_t*>(sc.dP);  // dP's room holds α as words [nt/2][L]
    if (!lane_alpha_pairs<Ops, Dist, C>(lb, S, j0, nb, aw, pending) && lb.fp.zero_skip) continue;
    for (std::int64_t i = nb / 2 * L; i < nt / 2 * L; i += W) storeu(aw + i, vu{});
    amx_gemm(lb.Dv, L, nt / 2, lb.vtw + j0 / 2, lb.ldvt, aw, L, ot, L, true);  // Oᵀ += Vᵀ A
  }
  _tile_release();
}

// fam_dq of bf16 pair operands with its three products on AMX tiles:
//   Sᵀ  [keys][L] = K · Qᵀ     A: key rows as words (kw), B: the lanes' query words (qtw)
//   dPᵀ [keys][L] = V · dOᵀ    A: value rows as words (vrw), B: the lanes' dout words (io.douttw)
//   dqᵀ [P][L]   += Kᵀ · dS    A: Kᵀ in key pairs (ktw), B: dS in key pairs
// Key ranges widened to whole pairs and blocks computed 32 keys at a time, as fam_forward_amx
// (the keys and values past Nk are zero rows to whole tiles); dS's pairs past a short block are
// zeroed. The rest — masks, ranges, statistics, r, dS — is fam_dq's.
template <family_dist Dist>
void fam_dq_amx(const family_lanes& lb, const family_dq_io& io) {
  using Ops = bf16_pair_operands<avx512bf16_dot>;
  constexpr std::int64_t L = C * W;
  static_assert(L % 32 == 0 && kLaneKeyBlock % 32 == 0);
  const auto scores_dp = [&](std::int64_t j0, std::int64_t nb, float* S, float* dP, float*, float* mask, bool no_dz) {
    if (amx_lane_scores(lb, j0, nb, S, mask)) {
      if (!no_dz)
        for (std::int64_t i = 0; i < nb * L; i += W) store(dP + i, vf{});
      return true;
    }
    if (!no_dz) amx_gemm((nb + 31) / 32 * 32, L, lb.Dv / 2, lb.vrw + j0 * lb.vrwsn, lb.vrwsn, io.douttw, L, dP, L, false);
    return false;
  };
  const auto dq_product = [&](std::int64_t j0, std::int64_t nb, float* S, const float*, const lane_scratch& sc) {
    const std::int64_t nt = (nb + 31) / 32 * 32;
    auto* dsw = reinterpret_cast<std::uint32_t*>(sc.G);  // dS as words [nt/2][L] in G's room
    Ops::pack_rows(S, nb, L, dsw);
    for (std::int64_t i = nb / 2 * L; i < nt / 2 * L; i += W) storeu(dsw + i, vu{});
    amx_gemm(lb.P, L, nt / 2, lb.ktw + j0 / 2, lb.ldkt, dsw, L, io.dqt, L, true);  // dqᵀ += Kᵀ dS
  };
  amx_configure();
  fam_dq_with<Ops, Dist, C>(lb, io, scores_dp, dq_product);
  _tile_release();
}

// fam_dkdv's row pass of dot scores with its five products on AMX tiles — the single pass (dq
// with it), or the dk/dv pass of the two (pr.dq null: the dq pass found dq and the statistics):
//   S  [nq][ld]  = Q · Kᵀ        A: query rows as words (qw), B: the key block's words (ktw)
//   dP [nq][ld]  = dO · Vᵀ       A: dout rows (dow), B: vtw
//   dVᵀ [Dv][ld] += dOᵀ · α      A: dOᵀ in row pairs (dot2), B: α in row pairs
//   dq  [nq][P]  += dz · K       A: dz in key pairs, B: the keys by pairs (krw)
//   dKᵀ [P][ld]  += Qᵀ · dz      A: Qᵀ in row pairs (qt2), B: dz in row pairs
// Rows are computed 16 at a time (M16): the rows past nq (the next rows or the driver's zero
// rows) give S and dP rows nothing reads — α and dz are packed from rows < nq, zero pairs past
// them to whole tiles, and dq takes rows < nq from the product's scratch.
template <family_dist Dist>
void fam_dkdv_amx(const family_rows& pr) {
  using Ops = bf16_pair_operands<avx512bf16_dot>;
  const std::int64_t ld = pr.ldk, nq = pr.nq, M16 = (nq + 15) / 16 * 16, nqp = (nq + 1) / 2, K16 = (nqp + 15) / 16 * 16;
  const family_params& fp = pr.fp;
  float* S = pr.scratch;
  float* dP = S + M16 * ld;
  float* mask = dP + M16 * ld;
  auto* packed = reinterpret_cast<std::uint32_t*>(mask + M16 * ld);  // α, then dz, as words [K16][ld]
  float* dqb = mask + 2 * M16 * ld;                                   // dz · K [M16][Pp]
  if (fp.mask) {
    if (fp.mask(fp.mask_ctx, pr.j0, pr.nb, mask, ld, 1) == mask_tile_kind::excluded && fp.zero_skip) return;
    for (std::int64_t r = 0; r < nq; ++r)
      for (std::int64_t x = pr.nb; x < ld; ++x) mask[r * ld + x] = 0.0f;
  }
  amx_configure();
  amx_gemm(M16, ld, pr.P / 2, pr.qw, pr.qwsn, pr.ktw, ld, S, ld, false);
  if (pr.zscale != 1.0f)
    for (std::int64_t i = 0; i < nq * ld; i += W) store(S + i, load(S + i) * splat(pr.zscale));
  amx_gemm(M16, ld, pr.Dv / 2, pr.dow, pr.dwsn, pr.vtw, ld, dP, ld, false);
  vf sum_dz{}, sum_de{};
  const weights_set set = row_weights<Dist>(pr, S, dP, mask, false, sum_dz, sum_de);
  const auto pack_pairs = [&](const float* X) {  // rows < nq in pairs [nqp][ld], zero pairs to K16
    Ops::pack_rows(X, nq, ld, packed);
    for (std::int64_t i = nqp * ld; i < K16 * ld; i += W) storeu(packed + i, vu{});
    return packed;
  };
  // Blocks of zero α (dz) skip their products, as fam_dkdv does (zero_skip).
  if (!fp.zero_skip || set.alpha) amx_gemm(pr.Dv, ld, K16, pr.dot2, pr.ldt, pack_pairs(S), ld, pr.dvt, ld, true);  // dVᵀ += dOᵀ α
  const bool dz_zero = fp.zero_skip && !set.dz;
  if (pr.dq) {  // single pass: dz as words of key pairs [M16][ld/2], then dq += dz K (rows < nq of the product)
    if (!dz_zero) {
      for (std::int64_t i = 0; i < M16 * ld; i += W) store_lane_pairs(packed + i / 2, load(dP + i));
      amx_gemm(M16, pr.Pp, ld / 2, packed, ld / 2, pr.krw, pr.Pp, dqb, pr.Pp, false);
      for (std::int64_t r = 0; r < nq; ++r)
        for (std::int64_t d = 0; d < pr.Pp; d += W)
          store(pr.dq + r * pr.dqs + d, load(pr.dq + r * pr.dqs + d) + load(dqb + r * pr.Pp + d));
    }
    double a = 0.0, b = 0.0;
    for (int x = 0; x < W; ++x) a += double(sum_dz[x]), b += double(sum_de[x]);
    pr.sums[0] += a, pr.sums[1] += b;
  }
  if (dz_zero) return _tile_release();
  if (pr.zscale != 1.0f)  // q unscaled: dKᵀ += Qᵀ (zscale·dz)
    for (std::int64_t i = 0; i < nq * ld; i += W) store(dP + i, load(dP + i) * splat(pr.zscale));
  amx_gemm(pr.P, ld, K16, pr.qt2, pr.ldt, pack_pairs(dP), ld, pr.dkt, ld, true);
  _tile_release();
}

void fam_dkdv_amx_entry(const family_rows& pr) {
  with_dist(pr.fp.dist, [&](auto d) { fam_dkdv_amx<decltype(d)::value>(pr); });
}

// fam_kept_keys (hardmax, top-k: each lane's kept keys) with the scores on the tiles.
template <family_dist Dist>
void fam_kept_amx(const family_lanes& lb, const family_kept& out) {
  amx_configure();
  fam_kept_keys_with<bf16_pair_operands<avx512bf16_dot>, Dist, C>(
      lb, out, [&](std::int64_t j0, std::int64_t nb, float* S, float*, float* mask) { return amx_lane_scores(lb, j0, nb, S, mask); });
  _tile_release();
}

void fam_kept_amx_entry(const family_lanes& lb, const family_kept& out) {
  if (lb.fp.dist == family_dist::hardmax) fam_kept_amx<family_dist::hardmax>(lb, out);
  else fam_kept_amx<family_dist::topk>(lb, out);
}

void fam_dq_amx_entry(const family_lanes& lb, const family_dq_io& io) {
  with_dist(lb.fp.dist, [&](auto d) { fam_dq_amx<decltype(d)::value>(lb, io); });
}

void fam_forward_amx_entry(const family_lanes& lb, float* ot) {
  with_dist(lb.fp.dist, [&](auto d) { fam_forward_amx<decltype(d)::value>(lb, ot); });
}

}  // namespace

const family_table& family_avx512bf16() {
  static constexpr family_table table = make_family_table<avx512bf16_dot>("avx512bf16");
  return table;
}

// The amx level: f32 products everywhere (vdpbf16ps runs at half the FMA rate on the AMX Xeons;
// isa.cc) but the bf16 forward of dot scores, which takes the tiles.
const family_table& family_amx() {
  static const family_table table = [] {
    family_table t = family_avx512();
    t.name = "amx";
    t.forward_amx = fam_forward_amx_entry;
    t.dkdv_amx = fam_dkdv_amx_entry;
    t.dq_amx = fam_dq_amx_entry;
    t.kept_amx = fam_kept_amx_entry;
    return t;
  }();
  return table;
}

const family_table& family_avx512bf16_f32() {
  static const family_table table = [] {
    family_table t = family_avx512();
    t.name = "avx512bf16 (f32 products)";
    return t;
  }();
  return table;
}
}  // namespace attn::detail::cpu

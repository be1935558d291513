// src/cpu/family_kernels.h — the plain interface of the fused f32 kernels of the attention
// family (include/attn/family.h) for every score — dot products of prepared vectors
// (family_impl.h, kernel_kind::dot: dot, scaled_dot, general and its variants, cosine, gaussian;
// location with W_a's rows as keys), additive (one w_v, or multi-dimensional: the md_ entries,
// family_md_body.h), and the box/triangle kernels on squared distances — with every
// distribution. No SIMD types here:
// family_body.h holds the code, compiled once per ISA (family_<isa>.cc), and isa.cc picks the
// table (select_family_kernels). The driver is src/family/fused.cc.
//
// Per pair (q row i, key j), with z = qp_i·kp_j (dot), z = Σ_a w_a tanh(qp_ia + kp_ja)
// (additive; then dqp_i = Σ_j dz w ⊙ (1 - t²), dkp_j likewise over i, dw_a = Σ dz t_a) or
// z = ‖qp_i - kp_j‖² (distance; dqp_i = Σ_j 2 dz (qp_i - kp_j), dkp_j the opposite):
//   s_ij = act(z + bias) + mask_ij, or -inf outside the row's key range [lo, hi) or where a
//          bool mask excludes
//   α_ij = distribution(s_i·)            (exactly 0 for s = -inf)
//   out_i = Σ_j α_ij v_j
// Backward (closed form, as src/family/tiled.cc): dα_ij = dout_i·v_j, r_i = Σ u dα / Σ u,
//   de_ij = w (dα_ij - r_i), dz_ij = de_ij act'(z); dqp_i = Σ_j dz k_j, dkp_j = Σ_i dz q_i,
//   dv_j = Σ_i α_ij dout_i, dbias = Σ dz, dsigmoid_bias = Σ de (sigmoid).
//
// Layouts are those of the core kernels (kernels.h): the forward and the dq pass keep query
// rows in SIMD lanes (a lane block of L rows of one (b, hkv)), the dk/dv pass keeps keys in
// lanes (a block of at most kRowKeyBlock keys against blocks of query rows). Sigmoid needs no
// row statistics and streams over key blocks; the other distributions keep the scores of the
// lane block's keys (O(Nk · L) floats per thread, never Nq × Nk), find their row statistics
// on them (see family_body.h), then stream. The dk/dv pass reads the statistics the dq pass
// saved per row.
#pragma once

#include <cstdint>

#include "cpu/kernels.h"

namespace attn::detail::cpu {

// hardmax_st: hardmax with the straight-through gradient (forward one-hot, backward the softmax
// Jacobian at the same scores).
// kernel: α = e / Σ e (Nadaraya–Watson normalisation of box/triangle weights).
enum class family_dist : int { softmax, sigmoid, sparsemax, entmax15, hardmax, topk, identity, hardmax_st, kernel };
// box: e = 1{z <= h²}, triangle: e = max(0, 1 - √z / h) (z a squared distance, h the bandwidth).
enum class family_act : int { identity, tanh, relu, sigmoid, box, triangle };
// How z is formed from the prepared vectors: dot, z = qp·kp (a GEMM on the register tile);
// additive (Bahdanau), z = Σ_a w_v[a] tanh(qp_a + kp_a) over the P = A prepared features;
// distance, z = ‖qp - kp‖² (box and triangle kernels), as differences, never as a GEMM.
enum class family_score : int { dot, additive, distance };

struct family_params {
  family_dist dist = family_dist::softmax;
  family_score score = family_score::dot;
  const float* w_v = nullptr;  // additive: [P]; multi-dimensional: [Dv][P]
  // additive: the prepared vectors arrive as e^{2x} (both sides), and tanh(a + b) is formed as
  // 1 - 2 / (1 + e^{2a} e^{2b}): a product and a reciprocal instead of an exp and a division per
  // (pair, feature). The driver takes it when every |qp|, |kp| <= 20, so e^{±40} and their
  // products stay finite, normal floats.
  bool additive_exp = false;
  float h = 1.0f;  // box, triangle: the bandwidth
  family_act act = family_act::identity;
  float bias = 0.0f;          // inside act
  float sigmoid_bias = 0.0f;  // sigmoid: α = σ(s + sigmoid_bias)
  std::int64_t topk = 1;
  bias_fn mask = nullptr;     // fills the mask tile (0 / -inf for bool, the value for float); null: none
  const void* mask_ctx = nullptr;
  // The kernels may skip a key block whose mask tile is -inf for every row (mask_tile_kind::
  // excluded), and the products of a block whose weights (α·V, dOᵀα) or dz (dq, dk) are all 0:
  // set by the driver (fused.cc, may_skip) where the inputs those skips pass over are finite — with
  // a mask every input the kernels read, so that every score of a hidden block is -inf and its α
  // and de exactly 0; without one (sparsemax, entmax15, hardmax, top-k, box, triangle) the
  // operands of the skipped products — so the products add nothing: the same bits as running the
  // block (NaN + -inf is NaN, 0·inf is NaN otherwise).
  bool zero_skip = false;
  // The backward's q and k rows all finite (set by the driver for the triangle kernel): its dq and
  // dk may come from products (family_body.h, distance_products).
  bool qk_finite = false;
};

// Per-row statistics, one entry per row (lane or tile row):
//   softmax          t = lse (+inf for a row with no key)
//   sparsemax        t = τ relative to the row max m, held in lse: α = max((s - m) - τ, 0)
//   entmax15         t = τ relative to m/2, held in lse: α = max((s/2 - m/2) - τ, 0)²
//   hardmax, topk    t = the k-th best score (k = 1 for hardmax); a key is kept when s > t, or
//                    s = t and j <= cut (first index wins ties); lse over the kept keys (topk),
//                    over every key (hardmax_st: its backward's softmax)
//   kernel           t = 1 / Σ e (0 when Σ e = 0), held with lse = Σ e
//   every one        r = Σ u dα / Σ u of the backward (0 for sigmoid and hardmax)
struct family_stats {
  float* t = nullptr;
  float* lse = nullptr;
  std::int32_t* cut = nullptr;
  float* r = nullptr;
};

// One lane block: rows (lanes) [0, nl) of one (b, hkv); lanes >= nl are padding (zero q, lo = hi).
struct family_lanes {
  std::int64_t L = 0, nl = 0, P = 0, Dv = 0;
  const float* qt = nullptr;          // [P][L] prepared queries of the lanes
  const float* k = nullptr;           // prepared key j of this (b, hkv) at k + j·ksn
  // ‖q‖² of the lanes [L] (0 past nl) and ‖k‖² of key j at kn2[j]: the box and triangle scores
  // from products (distance_lane_finish) read them, and ‖q‖² the guard of triangle's dq products
  // (distance_lane_products).
  const float* qn2 = nullptr;
  const float* kn2 = nullptr;
  const float* v = nullptr;           // value j at v + j·vsn
  std::int64_t ksn = 0, vsn = 0;
  const std::int32_t* lo = nullptr;   // [L] key range of each lane
  const std::int32_t* hi = nullptr;
  family_params fp;
  family_stats st;                    // [L] written by forward and dq
  float* scratch = nullptr;           // family_lane_scratch_floats(...) floats, 64-byte aligned
  // Forward only, when not null: α of lane x and key j into alpha[x·alpha_ld + j] for the keys
  // the block visits (the caller zeroes the rest): the weights drawn from the fused kernels.
  float* alpha = nullptr;
  std::int64_t alpha_ld = 0;
  // Multi-dimensional additive (md_*): the features whose scores are kept at once (Dv for
  // sigmoid and identity); the statistics hold Dv·L entries, feature-major ([Dv][L]); alpha, if
  // set, receives α of lane x, key j, feature c at alpha[x·alpha_ld + j·Dv + c].
  std::int64_t Fc = 0;
  // forward_bf16 (dot scores of bfloat16 inputs, P even): the operands as words of two bf16,
  // low half first — the lanes' queries qtw [P/2][L], key j's words at kw + j·kwsn (rows past Nk
  // — one, 31 on the AMX tiles — are read and given no weight: zero rows, or the bytes that
  // follow in the user's tensor, cpu::bf16_rows_in_place), values by pairs of keys: word (j', d) at vw[j'·vwss + d] = v[2j'][d] |
  // v[2j' + 1][d] << 16 (zero past the last key). z = zscale · (q·k), products exact, α rounded
  // to bf16 for the product with V.
  const std::uint32_t* qtw = nullptr;
  const std::uint32_t* kw = nullptr;
  const std::uint32_t* vw = nullptr;
  std::int64_t kwsn = 0, vwss = 0;
  float zscale = 1.0f;
  // dq_bf16 also: value j's words (pairs along Dv, a zero row at Nk) at vrw + j·vrwsn, and keys
  // by pairs: word (j', d) = k[2j'][d] | k[2j' + 1][d] << 16 at kpw[j'·kpwss + d].
  const std::uint32_t* vrw = nullptr;
  const std::uint32_t* kpw = nullptr;
  std::int64_t vrwsn = 0, kpwss = 0;
  // forward_amx (the amx level; P a multiple of 32, Dv of 16, L of 32): qtw and kw as for
  // forward_bf16, but the keys past Nk zero up to Nk + 32 (tiles of 32 keys), and the values as
  // Vᵀ in key pairs: word (d, j') at vtw[d·ldvt + j'] = v[2j'][d] | v[2j' + 1][d] << 16, zero past
  // the last key up to ldvt >= ⌈Nk/2⌉ + 16.
  const std::uint32_t* vtw = nullptr;
  std::int64_t ldvt = 0;
  // dq_amx (the amx level's dq pass): qtw and kw as for forward_amx, vrw as for dq_bf16 but zero
  // rows past Nk up to Nk + 32, and the keys as Kᵀ in key pairs: word (d, j') at ktw[d·ldkt + j']
  // = k[2j'][d] | k[2j' + 1][d] << 16, zero past the last key up to ldkt >= ⌈Nk/2⌉ + 16.
  const std::uint32_t* ktw = nullptr;
  std::int64_t ldkt = 0;
};

// Forward: ot [Dv][L] receives out of each lane. dq: doutt [Dv][L] in, dqt [P][L] out (Σ_j dz
// k_j), the statistics of every lane (r included) and sums[0] += Σ dz, sums[1] += Σ de,
// sums[2] += Σ de ∂e/∂h (triangle) over the block (added in a fixed order).
struct family_dq_io {
  const float* doutt = nullptr;
  float* dqt = nullptr;
  double* sums = nullptr;
  double* dw_v = nullptr;  // additive: [P] (multi-dimensional [Dv][P]) += Σ dz tanh(qp + kp) over the block
  const std::uint32_t* douttw = nullptr;  // dq_bf16: doutt as words [Dv/2][L]
};

// The kept keys of a lane block (hardmax, top-k: at most kmax = k per row, α zero elsewhere):
// for lane x < nl, cnt[x] keys in key order at idx[x·kmax + e], with α and act′(z) beside them.
struct family_kept {
  std::int64_t kmax = 0;
  std::int32_t* cnt = nullptr;
  std::int32_t* idx = nullptr;
  float* alpha = nullptr;
  float* g = nullptr;
};

// The backward of sparse rows (hardmax, top-k: family_kept) over one (b, hkv), for dot-like,
// additive or distance scores (kind, below): rows [0, rows) — the G heads' query rows in order —
// with cnt[r] kept keys idx[r·K + e], their α and act′ (g), prepared rows q [rows][P] and dout
// [rows][Dv], the unit's keys k [Nk][P] and values v [Nk][Dv] (f32, contiguous). dα_e = dout·v_j,
// r = Σ α dα / Σ α, de = α (dα − r), dz = de·g; dot-like scores: dq [rows][P] = Σ_e dz k_j
// (written), dk [Nk][P] += dz q; every score: dv [Nk][Dv] += α dout (dk, dv accumulated: the
// caller zeroes them), *sum_dz += Σ dz. zero_grad (hardmax with the zero gradient): dv alone.
// Rows in order, keys in their order: the same sums for any thread count.
// The output row of a sparse row: out[y] = float(Σ_e α_e · v_{idx[e]}[y]) over e in [0, cnt) in
// that order, summed in float64 (each product exact: α and v are floats), V rows v + j·vstep with
// contiguous elements, f32 (vw null) or bf16 words (vw, v null). The same bits at every level.
struct family_kept_out {
  std::int64_t cnt = 0, Dv = 0, vstep = 0;
  const float* alpha = nullptr;
  const std::int32_t* idx = nullptr;
  const float* v = nullptr;
  const std::uint16_t* vw = nullptr;
  float* out = nullptr;
};

inline constexpr std::int64_t kFamilySparseMax = 32;  // the most keys a sparse row keeps (top-k's k)
struct family_kept_grad {
  std::int64_t rows = 0, K = 0, P = 0, Dv = 0;
  const std::int32_t* cnt = nullptr;
  const std::int32_t* idx = nullptr;
  const float* alpha = nullptr;
  const float* g = nullptr;
  const float* q = nullptr;
  const float* dout = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  double* sum_dz = nullptr;
  bool zero_grad = false;
  // The score: dot-like (dq += dz k_j, dk_j += dz q); additive, q and k the prepared W_q q and
  // W_k k of width P (t = tanh(q + k_j), g = dz w_v ⊙ (1 − t²): dq += g, dk_j += g, dw_v += dz t
  // into dw [P]); distance, box or triangle (g = 2 dz (q − k_j): dq += g, dk_j −= g; triangle:
  // dh += de·(−1/2)/(h³ act′) into *dh).
  enum kind_t { dot, additive, distance } kind = dot;
  const float* w_v = nullptr;
  float* dw = nullptr;
  bool triangle = false;
  double h = 0.0;
  double* dh = nullptr;
};

// Row layout: rows [0, nq) are prepared queries q + r·qsn of one head, with their dout rows
// and the statistics the dq pass saved, against keys [j0, j0 + nb). kt [P][ldk], vt [Dv][ldk]
// hold the key block transposed and zero-padded; dkt, dvt accumulate Σ dz q and Σ α dout.
struct family_rows {
  std::int64_t nq = 0, nb = 0, ldk = 0, P = 0, Dv = 0, j0 = 0;
  const float* q = nullptr;
  const float* dout = nullptr;
  std::int64_t qsn = 0, dsn = 0;
  const std::int32_t* lo = nullptr;   // [nq]
  const std::int32_t* hi = nullptr;
  family_params fp;
  family_stats st;                    // [nq], read only
  const float* kt = nullptr;
  const float* vt = nullptr;
  // ‖q‖² of the rows [nq] and ‖k‖² of the block's keys [nb] (distance_row_finish and, q's alone,
  // distance_rows_close read them)
  const float* qn2 = nullptr;
  const float* kn2 = nullptr;
  float* dkt = nullptr;
  float* dvt = nullptr;
  float* scratch = nullptr;           // family_row_scratch_floats(nq, ldk) floats
  // Single pass (sigmoid: no row statistics; or the forward's): also dq [nq][Pp] (row stride dqs) += dz K, with
  // kr [ldk][Pp] the key block's rows zero-padded to Pp (a multiple of W) and ldk, and
  // sums[0] += Σ dz, sums[1] += Σ de, sums[2] += Σ de·∂e/∂h (triangle; else 0) over the block.
  // Null dq: the dq pass does that.
  float* dq = nullptr;
  std::int64_t dqs = 0, Pp = 0;
  const float* kr = nullptr;
  double* sums = nullptr;
  double* dw_v = nullptr;  // single pass of additive scores: [P] (multi-dimensional [Dv][P]) += Σ dz tanh(qp + kp) over the block
  // dkdv_bf16 (dot scores of bfloat16 inputs, P and Dv even): the operands of S, dP, dv and dk as
  // words of two bf16, low half first — query rows qw [nq][P/2] (row stride qwsn), dout rows dow
  // [nq][Dv/2] (dwsn), query rows by pairs qn [⌈nq/2⌉][P] (word (r', d) = q[2r'][d] |
  // q[2r' + 1][d] << 16, a zero row past an odd nq) and dout rows likewise don [⌈nq/2⌉][Dv], the
  // key block transposed ktw [P/2][ldk] and vtw [Dv/2][ldk] (zero past nb), and for the single
  // pass its keys by pairs krw [ldk/2][Pp] (word (x', d) = k[2x'][d] | k[2x' + 1][d] << 16).
  // z = zscale·(q·k); α and dz are rounded to bf16 for the products that take them. Box scores
  // (dv alone) and triangle scores take q·k from the words and the rest from the f32 rows q and kt
  // (distance_row_finish; triangle: dq and dk too from the f32 rows where keys lie close).
  const std::uint32_t* qw = nullptr;
  const std::uint32_t* krw = nullptr;
  const std::uint32_t* dow = nullptr;
  const std::uint32_t* qn = nullptr;
  const std::uint32_t* don = nullptr;
  const std::uint32_t* ktw = nullptr;
  const std::uint32_t* vtw = nullptr;
  std::int64_t qwsn = 0, dwsn = 0;
  float zscale = 1.0f;
  // dkdv_amx (the amx level's single pass; P a multiple of 32, Dv of 32, ldk of 32): qw and dow
  // readable to ⌈nq/16⌉·16 rows (the driver pads each head's rows), and in place of qn and don
  // the transposes Qᵀ [P][ldt] and dOᵀ [Dv][ldt] in pairs of rows from the block's first pair,
  // zero past Nq and readable to ⌈nq/32⌉·16 words. Scratch: family_row_scratch_floats + nq·Pp.
  const std::uint32_t* qt2 = nullptr;
  const std::uint32_t* dot2 = nullptr;
  std::int64_t ldt = 0;
};

// Scratch, in floats. `static` for the reason given in kernels.h.
// sigmoid and identity (α = s) need no row statistics: they stream.
static constexpr inline bool family_keeps_scores(family_dist d) {
  return d != family_dist::sigmoid && d != family_dist::identity;
}
// nk: the keys a lane block may see (at most Nk).
static inline std::int64_t family_search_floats(std::int64_t keys, family_dist d) {
  return d == family_dist::entmax15 ? 16 * (keys + 32) + 32 : 0;
}
static inline std::int64_t family_lane_scratch_floats(std::int64_t L, std::int64_t nk, family_dist d) {
  const std::int64_t keys = family_keeps_scores(d) ? nk + kLaneKeyBlock : kLaneKeyBlock;
  // S, dP, act' [keys][L], mask tile, top-k buffer (the threshold search's key indices and, for
  // entmax15, its lists: each lane's keys, for the widest vector's 16 lanes)
  return 3 * keys * L + kLaneKeyBlock * L + keys + 64 + family_search_floats(keys, d);
}
static inline std::int64_t family_row_scratch_floats(std::int64_t rows, std::int64_t ldk) {
  return 4 * rows * ldk + 64;
}
// Multi-dimensional additive: keys per score GEMM of the lane layout, query rows per score GEMM
// of the row layout.
inline constexpr std::int64_t kMdKeys = 16;
inline constexpr std::int64_t kMdRows = 8;
static inline std::int64_t md_pad(std::int64_t n, std::int64_t w) { return (n + w - 1) / w * w; }
// Multi-dimensional additive, P = A features, W floats per vector: a lane block whose keys span
// nk with Fc features' scores kept at once, and a row-layout call.
static inline std::int64_t family_md_lane_scratch_floats(std::int64_t L, std::int64_t W, std::int64_t nk, std::int64_t A,
                                                         std::int64_t Dv, std::int64_t Fc, family_dist d) {
  const std::int64_t keys = family_keeps_scores(d) ? nk : kLaneKeyBlock, Ap = md_pad(A, W);
  return (kMdKeys + 1) * A * L + Fc * keys * L + 2 * Dv * L + L * Ap + Dv * Ap + kLaneKeyBlock * L + nk + kLaneKeyBlock + 64 +
         family_search_floats(nk + kLaneKeyBlock, d);
}
static inline std::int64_t family_md_row_scratch_floats(std::int64_t rows, std::int64_t ldk, std::int64_t A,
                                                        std::int64_t Dv) {
  // T, E, de, dT per group of kMdRows rows, the mask tile; single pass: dW_v [Dv][A'] and the
  // lane sums of four features [4][A'][16] (A' = A rounded up to 16, the widest vector)
  const std::int64_t Ap = md_pad(A, 16);
  return (2 * A + 2 * Dv) * kMdRows * ldk + rows * ldk + Dv * Ap + 4 * Ap * 16 + 64;
}

// Linear attention of one query head on f32 rows (src/family/linear.cc drives it; the kernels are
// family_linear_body.h): a = φ(q) Q [Nq][D], b = φ(k) K [Nk][D], v V [Nk][Dvp] (Dv padded with
// zeros to Dvp, a multiple of W); query i sees keys [0, hi[i]) (hi non-decreasing);
// out_i = Sᵀa_i / a_i·z (normalize; 0 where the denominator is 0) or scale · Sᵀa_i.
// Scratch S [D][Dvp], z [D].
struct family_linear {
  std::int64_t Nq = 0, Nk = 0, D = 0, Dvp = 0;
  const float* Q = nullptr;
  const float* K = nullptr;
  const float* V = nullptr;
  const std::int64_t* hi = nullptr;
  bool normalize = true;
  float scale = 1.0f;
  float* S = nullptr;
  float* z = nullptr;
};
// The backward's outputs and scratch: dq [Nq][D] receives dφq; dK [Nk][D], dV [Nk][Dvp]
// accumulate dφk and dv (+=, over the query heads of a group); dnum [Nq][Dvp], dden [Nq], num [Dvp].
struct family_linear_grads {
  float* dq = nullptr;
  float* dK = nullptr;
  float* dV = nullptr;
  float* dnum = nullptr;
  float* dden = nullptr;
  float* num = nullptr;
};

struct family_table {
  const char* name;  // "generic", "avx2", "avx512", "avx512bf16"
  int W;             // floats per vector
  int lanes;         // L of a lane block
  void (*forward)(const family_lanes&, float* ot);
  void (*dq)(const family_lanes&, const family_dq_io&);
  void (*dkdv)(const family_rows&);
  // hardmax and top-k: the scores, each lane's statistics (into lb.st) and its kept keys
  void (*kept)(const family_lanes&, const family_kept&);
  // Multi-dimensional additive (w_v [Dv, A] in fp.w_v, F = Dv): forward, dq (io.dw_v [Dv][A]),
  // dk/dv with the statistics [row][Dv] (family_md_body.h).
  void (*md_forward)(const family_lanes&, float* ot);
  void (*md_dq)(const family_lanes&, const family_dq_io&);
  void (*md_dkdv)(const family_rows&);
  // The forward of dot scores on bf16 pair operands (family_lanes::qtw, kw, vw), every
  // distribution; null where the ISA has no bf16 dot product.
  void (*forward_bf16)(const family_lanes&, float* ot);
  // The dk/dv (and single-pass dq) row-layout pass of dot scores on bf16 pair operands
  // (family_rows::qw …); null where the ISA has no bf16 dot product.
  void (*dkdv_bf16)(const family_rows&);
  // The dq pass (lane layout, with the row statistics) of dot scores on bf16 pair operands.
  void (*dq_bf16)(const family_lanes&, const family_dq_io&);
  // kept on bf16 pair operands (family_lanes::qtw, kw): the forward of sparse rows of bf16 inputs.
  void (*kept_bf16)(const family_lanes&, const family_kept&);
  // The backward of sparse rows of dot-product scores over one (b, hkv) (family_kept_grad).
  void (*kept_grad)(const family_kept_grad&);
  // Linear attention of one query head (family_linear): out [Nq][Dvp]; the backward from
  // dout [Nq][Dvp].
  void (*linear_forward)(const family_linear&, float* out);
  void (*linear_backward)(const family_linear&, const float* dout, const family_linear_grads&);
  // The output row of a sparse row (family_kept_out).
  void (*kept_out)(const family_kept_out&);
  // The forward of dot scores on AMX tiles (family_lanes::qtw, kw, vtw), every distribution;
  // the amx level's table alone (family_amx), whose other entries are the avx512 table's.
  void (*forward_amx)(const family_lanes&, float* ot) = nullptr;
  // The single row-layout pass of dot scores on AMX tiles (family_rows::qw, dow, qt2, dot2, ktw,
  // vtw, krw), every distribution the single pass takes; the amx level's table alone.
  void (*dkdv_amx)(const family_rows&) = nullptr;
  // The dq pass of dot scores on AMX tiles (family_lanes::qtw, kw, vrw, ktw; io.douttw), every
  // distribution the dense dq pass takes; the amx level's table alone.
  void (*dq_amx)(const family_lanes&, const family_dq_io&) = nullptr;
  // kept with the scores on AMX tiles (family_lanes::qtw, kw as for forward_amx); the amx level's alone.
  void (*kept_amx)(const family_lanes&, const family_kept&) = nullptr;
};

const family_table& family_generic();
const family_table& family_avx2();
const family_table& family_avx512();
const family_table& family_avx512bf16();
const family_table& family_amx();
// family_avx512's kernels under the avx512bf16 level's name: that level where bf16_dot_products()
// is false (kernels.h).
const family_table& family_avx512bf16_f32();

// The table for this CPU (isa.cc; ATTN_CPU_ISA caps it).
const family_table& select_family_kernels();

}  // namespace attn::detail::cpu

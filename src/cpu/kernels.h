// src/cpu/kernels.h — the plain interface between the cpu backend's driver (cpu_backend.cc,
// compiled for baseline x86-64) and its SIMD kernels. No SIMD types here.
//
// Words: a *kernel* is one entry of kernel_table (forward, dq, dkdv and their bf16 variants);
// kernels_<isa>.cc builds one ISA's table by compiling the kernel body (kernel_body.h and the
// headers it includes) with that ISA's flags; isa.cc picks the table.
//
// Two tile layouts, both fed to one register tile (tile.h)
//   out[r][x..x+W) (+)= Σ_k a[r·ars + k·aks] · b[k·bks + x..x+W)     (a broadcast, b vector)
// so that only our own padded buffers are ever read as vectors (b) and user rows (q, k, v,
// dout, converted to f32 with unit x-stride) are only read as scalars (a):
//   lane layout (forward, dq):  query rows are SIMD lanes. A lane block holds up to L rows
//     (i, g) of one (b, hkv) — i-major, so the G query heads sharing a K/V head sit side by
//     side and each K/V block is read once for all of them. Scores are kept transposed,
//     Sᵀ[key][lane]; the softmax state (m, l) is one vector per lane group, with no horizontal
//     reductions.
//   row layout (dk/dv): one query row per tile row, keys in SIMD lanes, Kᵀ/Vᵀ packed per key
//     block; dKᵀ/dVᵀ accumulate over every query row and every head of the GQA group.
// Decode (a (b, hkv) with at most W query rows: Nq·G small) uses neither: D sits in the SIMD
// lanes for the q·k dots — each K vector loaded once for up to 4 rows, W dots folded into one
// vector by a transpose-add tree — and the softmax runs on vectors of (row, key) lanes, so each
// K/V row is read once, as is, for all the rows of the group — f32 or bf16, no copy.
// bf16 inputs on an ISA with a bf16 dot product use the same layouts with bf16 pairs as the
// words of the products (bf16_operands below): the same code, another operand type.
//
// ISA code must not call inline functions shared with other translation units (they may be
// merged by the linker with the copy built for another ISA): the kernel body is in an
// anonymous namespace and uses only builtins and always-inline intrinsics.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace attn::detail::cpu {

// What a mask tile holds: every value 0 (the block's scores are unbiased), every value of the
// tile's valid rows -inf (no row sees a key of the block: the prefill kernels skip it), or
// anything else (`mixed` is always a correct answer).
enum class mask_tile_kind : int { mixed, zeros, excluded };

// Fills a tile with the mask bias of keys [j0, j0 + nb) for every row of the block:
// tile[row·row_stride + (j - j0)·key_stride] = 0 / -inf (bool) or the additive value; rows
// past the block's valid rows get 0.
using bias_fn = mask_tile_kind (*)(const void* ctx, std::int64_t j0, std::int64_t nb, float* tile,
                                   std::int64_t row_stride, std::int64_t key_stride);

// A mask tile from rows the driver located (bool or f32 masks with unit key stride; what
// bias_fn fills for them): row r < valid reads its mask at row[r][jj] for keys jj < n of the
// tile (bool bytes: 0 / -inf; f32: the value), keys n <= jj < nb are past a short mask (-inf),
// rows valid <= r < total are padding (0). kernel_table::mask_tile writes
// tile[r·row_stride + jj·key_stride]; it is the same values as a scalar loop, in any layout.
struct mask_rows {
  const void* const* row = nullptr;
  bool is_bool = false;
  std::int64_t total = 0, valid = 0, n = 0;
};

// What every score transform needs: x = scale·q·k → softcap → + mask + ALiBi → -inf outside [lo, hi).
struct score_params {
  float scale = 1.0f;     // applied to q·k (1 when q is pre-scaled)
  float softcap = 0.0f;   // <= 0: off
  bool alibi = false;     // slopes given
  bias_fn bias = nullptr; // mask present
  const void* bias_ctx = nullptr;
  // The prefill kernels may skip a key block whose mask tile is all -inf (mask_tile_kind::
  // excluded): q and k are finite, so none of its products would have been NaN (NaN + -inf is
  // NaN, which the reference propagates).
  bool skip_excluded = false;
};

// Lane layout: one block of L lanes of one (b, hkv). Lanes >= nl are padding (zero q, lo = hi).
struct lane_block {
  std::int64_t L = 0, nl = 0, D = 0, Dv = 0;
  const float* qt = nullptr;           // [D][L] pre-scaled q (forward, dq)
  const float* k = nullptr;            // key rows of this (b, hkv): k + j·ksn, unit x-stride
  const float* v = nullptr;
  std::int64_t ksn = 0, vsn = 0;
  // Forward, f32 prefill lanes, when set: Vᵀ of this (b, hkv), value column d of key j at
  // vt[d·ldvt + j] (the Oᵀ += Vᵀ P product then broadcasts along keys, each cache line of V for
  // W steps of one tile; along V's rows every step would take a new line, for ⌈W/R⌉ tiles).
  const float* vt = nullptr;
  std::int64_t ldvt = 0;
  const std::uint16_t* k16 = nullptr;  // decode only: bf16 key/value rows (unit x-stride) read
  const std::uint16_t* v16 = nullptr;  // directly instead of k / v, same row strides
  bool q_bf16 = false;                 // decode: qt holds exact bf16 values, unscaled (sp.scale applies)
  bool int8_rounding = false;          // decode of int8 rows: q and the weights may be rounded (to
                                       // int16; the weights to bf16 for bf16 pairs): paged_kv_view::query
  bool int8_bytes = false;             // with the int16 products: the weights rounded to 8 bits, and
                                       // with kblocked q too (int8_query::int8; decode.h, decode_pv_u8)
  // Decode only: int8 rows (instead of k / v, same row strides) with one f32 scale per row:
  // key j is kscale[j·kss] · k8[j·ksn + x] (values likewise).
  const std::int8_t* k8 = nullptr;
  const std::int8_t* v8 = nullptr;
  const float* kscale = nullptr;
  const float* vscale = nullptr;
  std::int64_t kss = 0, vss = 0;
  // Decode only: paged rows. Key j is row j % page_size of page pages[j / page_size]: the row
  // offsets above become pages[j / page_size]·(page stride) + (j % page_size)·(row stride),
  // page strides kps, vps (rows) and ksps, vsps (scales), in elements. Null: dense rows.
  const std::int64_t* pages = nullptr;
  std::int64_t page_size = 0, kps = 0, vps = 0, ksps = 0, vsps = 0;
  // Decode only, paged int8 keys: blocked (problem::k_blocked) — key j, element d at
  // k8 + pages[j / page_size]·kps + (j % page_size / 16)·ksn + (d / 4)·64 + j % 16·4 + d % 4
  // (ksn: the stride of a block of 16 keys).
  bool kblocked = false;
  const std::int32_t* lo = nullptr;    // [L] per-lane key range [lo, hi)
  const std::int32_t* hi = nullptr;
  const std::int32_t* pos = nullptr;   // [L] key position of the query (ALiBi)
  const float* slope = nullptr;        // [L] ALiBi slope (when score_params::alibi)
  std::int64_t klo = 0, khi = 0;       // keys this call may visit (split-KV chunk)
  score_params sp;
  float* scratch = nullptr;            // lane_scratch_floats(...) floats, 64-byte aligned
};

// Forward: online softmax over the keys of the block. m, l: [L] running max and sum (callers
// initialise them: m = sink, l = 1 with sinks, else -inf, 0); ot: [Dv][L] unnormalised output —
// or, with rows (decode's lane blocks of lanes_small rows only), rows [L][Dv]: row x at
// ot + x·Dv, in the order of d (the caller then stores them by kernel_table::store_rows, where
// oᵀ took two register transposes, the kernel's and store_lanes').
struct forward_io {
  float* m = nullptr;
  float* l = nullptr;
  float* ot = nullptr;
  bool rows = false;
};

// dq from the saved lse: doutt: [Dv][L] dout rows transposed, lse: [L] (+inf on fully masked
// rows), delta: [L] rowsum(dout∘out); dqt: [D][L] receives Σ_j ds_ij k_j (the caller multiplies
// by scale).
struct dq_io {
  const float* doutt = nullptr;
  const float* lse = nullptr;
  const float* delta = nullptr;
  float* dqt = nullptr;
};

// Row layout: rows [0, nq) are queries q + r·qsn of one head against keys [j0, j0 + nb).
// kt [D][ldk], vt [Dv][ldk] hold the key block transposed and zero-padded to ldk (a multiple
// of W); dkt, dvt [D|Dv][ldk] accumulate Σ ds q and Σ p dout.
struct dkdv_pair {
  std::int64_t nq = 0, nb = 0, ldk = 0, D = 0, Dv = 0, j0 = 0;
  const float* q = nullptr;
  const float* dout = nullptr;
  std::int64_t qsn = 0, dsn = 0;
  const float* lse = nullptr;          // [nq], +inf on fully masked rows
  const float* delta = nullptr;        // [nq]
  const std::int32_t* lo = nullptr;    // [nq]
  const std::int32_t* hi = nullptr;
  const std::int32_t* pos = nullptr;
  float slope = 0.0f;
  const float* kt = nullptr;
  const float* vt = nullptr;
  float* dkt = nullptr;
  float* dvt = nullptr;
  score_params sp;
  double* dalibi = nullptr;            // += Σ ds · -|pos - j| (when sp.alibi)
  float* ds_out = nullptr;             // [nq][ldk] when set: ds before the softcap factor (the
                                       // gradient of the biased score: a float mask's)
  float* scratch = nullptr;            // row_scratch_floats(...) floats, 64-byte aligned
  // Fused backward (dq in the same pass): dq row r at dq + r·dqs, ldq columns, += dS · K, the
  // caller scaling dq at the end. f32: an f32 product with the block's nb key rows at krows, krs
  // apart, ldq floats each (a multiple of W: the keys in place where D is one, else a copy
  // zero-padded to ldq); with bf16 pair operands on bf16 pairs instead, dS rounded to bf16 in key
  // pairs and krw [ldk/2][ldq] the block's keys by pairs (word (x', d) = k[2x'][d] |
  // k[2x' + 1][d] << 16, zero past nb and D). Null dq: no dq.
  const float* krows = nullptr;
  std::int64_t krs = 0;
  const std::uint32_t* krw = nullptr;
  float* dq = nullptr;
  std::int64_t ldq = 0, dqs = 0;
};

// The [Nq, Nk] intermediate of the forward (attention.h, qk_output), lane layout: for keys
// [lb.klo, lb.khi) of every lane x < nl, out[x·ld + j - klo] =
//   scaled         scale·q·k             (q unscaled in qt; score_params::scale applies)
//   softcapped     after softcap         (= scaled without one)
//   biased         + mask + ALiBi, -inf outside the lane's key range [lo, hi)
//   probabilities  e^{biased - lse}      lse [L] (+inf for a row with no key)
//   row_stats      nothing written: m [L], l [L] (the caller starts them at -inf, 0) take the
//                  online max and Σ e^{s - m} of the biased scores, so that the probabilities
//                  are those of the pass's own scores (the forward's may round differently)
enum class qk_stage : int { scaled, softcapped, biased, probabilities, row_stats };
struct qk_io {
  qk_stage stage = qk_stage::scaled;
  const float* lse = nullptr;
  float* m = nullptr;
  float* l = nullptr;
  float* out = nullptr;
  std::int64_t ld = 0;
};

// Key-block sizes: the lane-layout kernels visit keys in blocks of kLaneKeyBlock; the row
// layout packs kRowKeyBlock keys per task (on AMX tiles the driver's kAmxRowKeyBlock, 128).
inline constexpr std::int64_t kLaneKeyBlock = 128;
inline constexpr std::int64_t kRowKeyBlock = 64;

// Scratch sizes, in floats. `static`: the kernel body calls them too, and an inline function
// with external linkage could be merged by the linker with a copy compiled for another ISA.
static constexpr inline std::int64_t lane_scratch_floats(std::int64_t L, std::int64_t D, std::int64_t Dv) {
  // decode (decode.h, decode_layout; W <= L): q and o rows, per-lane state, mask, padded block
  const std::int64_t decode = (2 * L + 4) * (D + Dv + 4 * L) + 10 * L * (L + 4) + 64;
  return 4 * kLaneKeyBlock * L + 8 * L + decode;
}
static inline std::int64_t row_scratch_floats(std::int64_t rows, std::int64_t ldk) { return 5 * rows * ldk + 2 * ldk + 64; }

// bf16 operands of the forward on an ISA with a bf16 dot product, in pairs along the reduction
// axis of each product (one 32-bit word = two bf16): qp [D/2][L] (pair d of lane x at
// qp[(d/2)·L + x]), k [Nk'][ldk] rows with ldk even, vp [Nk'/2][Dv] (keys 2j', 2j'+1 of column
// x at vp[j'·Dv + x]); Nk' = Nk rounded up to even, the extra row zero. D is even; scores are
// scaled by score_params::scale.
// The AMX forward (kernel_table::forward_amx) takes Vᵀ instead of vp: vt [Dv][ldvt] (keys 2j',
// 2j'+1 of column x at vt[x·ldvt + j']), and k and vt padded with 32 zero keys past Nk (amx.h).
struct bf16_operands {
  const std::uint32_t* qp = nullptr;
  const std::uint16_t* k = nullptr;
  std::int64_t ldk = 0;
  const std::uint32_t* vp = nullptr;
  const std::uint32_t* vt = nullptr;
  std::int64_t ldvt = 0;
};

// bf16 operands of the backward on an ISA with a bf16 dot product (D and Dv even; words = bf16
// pairs, low half first).
//   dq pass (lane layout): qp [D/2][L], dop [Dv/2][L] lane words of q and dout; k, v: key rows
//     [Nk'][D|Dv]; kpairs [Nk'/2][D] (keys 2j', 2j'+1 of column d at kpairs[j'·D + d]).
struct bf16_dq_operands {
  const std::uint32_t* qp = nullptr;
  const std::uint32_t* dop = nullptr;
  const std::uint16_t* k = nullptr;
  const std::uint16_t* v = nullptr;
  const std::uint32_t* kpairs = nullptr;
  // The AMX pass (kernel_table::dq_amx) takes Kᵀ in key pairs instead of kpairs: kt [D][ldkt]
  // (keys 2j', 2j'+1 of column d at kt[d·ldkt + j']), and k, v, kt padded with 32 zero keys.
  const std::uint32_t* kt = nullptr;
  std::int64_t ldkt = 0;
};
//   dk/dv pass (row layout): q, dout: the pair's rows [nq][D|Dv]; qpairs [nq'/2][D], dopairs
//     [nq'/2][Dv] (rows 2r', 2r'+1; nq' = nq rounded up to even, the extra row zero);
//     ktp [D/2][ldk], vtp [Dv/2][ldk] (pair d/2 of key x at [d/2·ldk + x]).
struct bf16_dkdv_operands {
  const std::uint16_t* q = nullptr;
  const std::uint16_t* dout = nullptr;
  const std::uint32_t* qpairs = nullptr;
  const std::uint32_t* dopairs = nullptr;
  const std::uint32_t* ktp = nullptr;
  const std::uint32_t* vtp = nullptr;
  // The AMX pass (kernel_table::dkdv_amx) takes Qᵀ and dOᵀ in pairs of rows instead of qpairs
  // and dopairs: word (d, r') = rows 2r', 2r'+1 of column d at qt[d·ldt + r'] (amx.h).
  const std::uint32_t* qt = nullptr;
  const std::uint32_t* dot = nullptr;
  std::int64_t ldt = 0;
};

struct kernel_table {
  const char* name;       // "generic", "avx2", "avx512", "avx512bf16", "amx"
  int W;                  // floats per vector
  int lanes;              // L for prefill-sized lane blocks
  int lanes_small;        // L when the whole (b, hkv) has at most this many rows (decode)
  void (*forward)(const lane_block&, const forward_io&);
  void (*dq)(const lane_block&, const dq_io&);
  void (*dkdv)(const dkdv_pair&);
  // Forward from bf16 operands with fp32 accumulation (ISAs with a bf16 dot product only:
  // avx512bf16; null elsewhere).
  // Uses lanes == kernel_table::lanes; scratch as lane_scratch_floats plus bf16_scratch_floats.
  void (*forward_bf16)(const lane_block&, const bf16_operands&, const forward_io&);
  // Backward passes from bf16 operands, fp32 accumulation (likewise).
  void (*dq_bf16)(const lane_block&, const bf16_dq_operands&, const dq_io&);
  void (*dkdv_bf16)(const dkdv_pair&, const bf16_dkdv_operands&);
  // The forward's [Nq, Nk] intermediate (qk_io) from f32 q and k rows (lanes == kernel_table::lanes).
  void (*qk)(const lane_block&, const qk_io&);
  // The decode forward (lanes == lanes_small) of n lane blocks of one shape and storage, e.g.
  // the heads of a (b, key chunk): their key blocks interleaved, so that the rows of one block
  // of every head are read together; each result as forward's.
  void (*decode_heads)(const lane_block* lbs, const forward_io* ios, int n);
  // Whether decode_heads reads int8 rows with int16 q and weights (decode.h, int8_as_int16).
  bool int16_decode = false;
  // What one prefill lane block of `lanes` rows costs in decode passes of lanes_small rows, with
  // float32 K/V and with bfloat16 K/V rows (which decode reads in place and the bf16 prefill
  // packs): the forward runs a (b, hkv) of up to 2·lanes rows on decode where its passes are at
  // most this many per lane block it would fill (cpu_backend.cc, few_rows).
  float decode_passes_f32 = 1.0f, decode_passes_bf16 = 1.0f;
  // The mask bias of a tile (mask_rows above), vectorised: in the lane layout (row_stride 1)
  // W × W blocks are loaded by rows and transposed.
  // Returns bias_fn's answer (zeros, excluded or mixed, exactly). Rows that all read the same
  // mask row (a key padding mask) are filled key by key, without the transpose.
  mask_tile_kind (*mask_tile)(const mask_rows&, std::int64_t nb, float* tile, std::int64_t row_stride,
                              std::int64_t key_stride) = nullptr;
  // The same forward with its products on AMX tiles (the amx level only; null elsewhere): D a
  // multiple of 32, Dv of 16, bf16_operands::vt set.
  void (*forward_amx)(const lane_block&, const bf16_operands&, const forward_io&) = nullptr;
  // The backward's row pass (dk, dv; dq too when fused) with its products on AMX tiles (amx
  // level only): D and Dv multiples of 32, pr.ldk of 32, the padded operands of bf16_dkdv_operands.
  void (*dkdv_amx)(const dkdv_pair&, const bf16_dkdv_operands&) = nullptr;
  // The two-pass backward's dq pass on AMX tiles (likewise; bf16_dq_operands::kt set).
  void (*dq_amx)(const lane_block&, const bf16_dq_operands&, const dq_io&) = nullptr;
  // The forward's rows out of Oᵀ [Dv][L]: lane x < nl, times inv[x], to rows[x] (unit stride) as
  // float32 (bf16 false) or bfloat16 rounded as f32_to_bf16. Returns the lanes x < 64 whose row
  // got a non-finite value (bit x), as written (a bf16 that rounded to inf included).
  std::uint64_t (*store_lanes)(const float* ot, std::int64_t L, std::int64_t nl, std::int64_t Dv, const float* inv,
                               void* const* rows, bool bf16) = nullptr;
  // The same from rows: row x < nl of o (Dv floats at o + x·ld), times inv[x], to rows[x].
  std::uint64_t (*store_rows)(const float* o, std::int64_t ld, std::int64_t nl, std::int64_t Dv, const float* inv,
                              void* const* rows, bool bf16) = nullptr;
  // The other way, for the bf16 products' operands: rows[x] (x < nl, Xw words of bf16 pairs at
  // unit stride) to lane words out [Xw][L] of row stride ld (>= L; L a multiple of W), lanes
  // past nl zero. A float is a word: f32 rows transpose the same way.
  void (*lane_words)(const std::uint32_t* const* rows, std::int64_t L, std::int64_t nl, std::int64_t Xw,
                     std::uint32_t* out, std::int64_t ld) = nullptr;
  // Σ a[x]·b[x] over n unit-stride float32 values (bfloat16 with bf16) in float64, in sum8's
  // order (core/common.h): the backward's Δ = dout · out of a row.
  double (*dot_f64)(const void* a, const void* b, std::int64_t n, bool bf16) = nullptr;
  // The largest finite |x| of n unit-stride float32 values (bfloat16 with bf16), as the bits of
  // a float32; 0 where there is none (the front's coarse bound on the q·k terms).
  std::int32_t (*max_abs_bits)(const void* x, std::int64_t n, bool bf16) = nullptr;
};

static constexpr inline std::int64_t bf16_scratch_floats(std::int64_t L) { return kLaneKeyBlock / 2 * L + 64; }

// Whether decode reads an int8 cache with q and the weights as int16 (decode.h,
// int16_pair_operands), as far as the shape tells: an ISA with the int16 dot product, q and the
// weights allowed as int16 (`rounding`: problem::int8_rounding, paged_kv_view::query), whole
// units of d (4W values) in D and Dv, sums of D products that fit in int32 (D·128·32767 <
// 2^31), unless ATTN_DECODE_INT8=widen asks for the bf16 products of widened rows (read on every
// call, as the tests switch it). The kernel also needs q finite, which only it sees. One
// predicate for the kernel and for explain_backend.
static inline bool int8_decode_int16(bool isa_int16, bool rounding, std::int64_t W, std::int64_t D, std::int64_t Dv) {
  const char* e = std::getenv("ATTN_DECODE_INT8");
  const bool widen = e && std::strcmp(e, "widen") == 0;
  return isa_int16 && rounding && D % (4 * W) == 0 && Dv % (4 * W) == 0 && D <= 512 && !widen;
}

// The kernels of each ISA compiled in (each defined in its own kernels_<isa>.cc).
const kernel_table& kernels_generic();
const kernel_table& kernels_avx2();
const kernel_table& kernels_avx512();
const kernel_table& kernels_avx512bf16();
const kernel_table& kernels_amx();  // avx512bf16's table and forward_amx (kernels_avx512bf16.cc)
// The avx512bf16 level with bf16 inputs widened to f32 for every product (no vdpbf16ps) and the
// int8 decode's VNNI products kept: what the level runs where bf16_dot_products() is false.
const kernel_table& kernels_avx512bf16_f32();

// Runtime ISA dispatch — the one place that asks the CPU what it supports (isa.cc). The
// environment variable ATTN_CPU_ISA=generic|avx2|avx512|avx512bf16 caps the level (read on
// every call, so tests can walk every path); an unknown name is ignored, and a level above
// what the CPU runs gives the best level it has.
const kernel_table& select_kernels();
// Every ISA level this CPU can run, lowest first ("generic", ...).
const char* const* available_isas(int* count);
// Whether the avx512bf16 level multiplies bf16 pairs by vdpbf16ps (else it widens them to f32
// and takes the FMA): not on Intel CPUs, which run vdpbf16ps at half the FLOP rate of their f32
// FMA (measured: a Xeon with AMX 224-236 against 447-475 GFLOP/s, an Emerald Rapids Xeon 166
// against 332, 2 threads), where AMD's Zen 4 and Zen 5 run it at twice. ATTN_CPU_BF16_DOTS=on|off
// decides instead (read on every call, as ATTN_CPU_ISA is). The amx level is not affected.
bool bf16_dot_products();

}  // namespace attn::detail::cpu

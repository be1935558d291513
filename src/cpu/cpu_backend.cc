// src/cpu/cpu_backend.cc — the fused CPU backend ("cpu"): eligibility, work partition,
// threads, and the scalar set-up around the SIMD kernels of kernels.h.
//
// Forward: tasks are (b, hkv, lane block[, key chunk]); each runs an online softmax over the
// keys its rows may see (causal / window / kv-length block skipping) and saves only the lse.
// Decode-shaped calls (few lane blocks, many keys) split the keys into fixed chunks merged in
// chunk order afterwards (split-KV), so every thread has work.
// Backward (FlashAttention-2 recompute from the lse, Δ = rowsum(dout∘out)): every gradient
// element has exactly one writer. Fused (B·Hkv >= kFusedMinUnits): one task per (b, hkv) walks
// its key blocks in order; per block it computes dk/dv over every query row of the group and
// adds dS·K to dq (in bf16 pairs beside the bf16 dot products) — five products per score
// instead of seven, one exp. Two passes (fewer (b, hkv)): dq over lane blocks (like the
// forward), then dk/dv over key blocks, summed over the query rows of every head of the group.
//
// Precision: fp32 arithmetic. bf16 inputs on the avx512bf16 level multiply bf16 operands with
// fp32 accumulation (vdpbf16ps); P and dS are rounded to bf16 for the products that consume
// them. Other levels, and f16, convert to f32 on load. Decode (few rows, many keys) reads bf16
// K/V rows as they are: q·k with vdpbf16ps from the exact bf16 q (scores scaled after), P·V in
// fp32 (p not rounded).
//
// Memory: per-thread tiles (tens to hundreds of KiB) plus Δ and lse ([B, Hq, Nq] floats); inputs
// are copied only when they are not f32 with unit x-stride (once, to f32), and bf16 K/V are
// packed once per call for the dot-product kernels. Nothing of size Nq × Nk is ever allocated.
//
// Determinism: the partition into tasks, the chunking, and every reduction order depend only on
// the problem's shape — never on the number of threads or on which thread runs a task — so
// results are bitwise identical for any num_threads, forward and backward (tested). Different
// ISA levels (ATTN_CPU_ISA) sum in different orders and may differ in the last bits.
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/common.h"
#include "core/problem.h"
#include "core/team.h"
#include "cpu/bf16_words.h"
#include "cpu/buffers.h"
#include "cpu/denormals.h"
#include "cpu/kernels.h"
#include "cpu/mask_fill.h"
#include "cpu/rows.h"

namespace attn::detail {
namespace {

using namespace cpu;

constexpr float kInfF = std::numeric_limits<float>::infinity();

// Split-KV: used when fewer than kSplitUnits (b, hkv, lane block) units exist; chunks of
// kSplitKeys keys. Both constants, never the thread count, decide the partition.
constexpr std::int64_t kSplitUnits = 32;
constexpr std::int64_t kSplitKeys = 2048;
// Decode whose kv heads a task reads together (forward_plan::heads: a token-major cache, int8 or
// bf16 pages of 16) takes fewer heads a task where that leaves fewer than kDecodeTasks tasks: one
// sequence with all its heads in one task runs on one thread. Measured, Zen 4, 2 threads, B 1,
// Hq 32 / Hkv 8, D 128, Nk 1024, pages of 16, the fastest of 300 calls: bf16 token-major
// 0.21 ms in one task against 0.11 dense (docs/SERVING.md). Only where the key chunks (split-KV,
// Nk >= 2·kSplitKeys) do not already make the tasks: a token-major cache read 4 heads a task
// rather than 8 (1 KiB runs of each token's 2 KiB) ran 15-25 % slower at Nk 131072. Heads, not
// key chunks: a chunk repeats its heads' setup and adds a merge (two chunks cost dense decode
// 10-30 % at Nk 1024 and 2048), and splitting keys by the layout would change the bits from one
// layout to another.
constexpr std::int64_t kDecodeTasks = 2;
// Decode reads every kv head of a task together (forward_plan::heads) when one head's rows lie in
// runs shorter than this (a page of 16 bf16 rows of D 128 is 4 KiB): read one head at a time, such
// runs cost 35–50 % of the bandwidth; runs this long (a page of 256 such rows) do not, and the
// interleaved heads' state (q, o, m, l of every head) would crowd L1.
constexpr std::int64_t kHeadRunBytes = 65536;
// Heads whose runs are short are taken together until their runs add up to this (a page of 16
// bf16 rows of D 128, 4 KiB a head, in fours): measured on Zen 4 at Hkv 8, alternating, 4 heads a
// task read pages of 16 at 86–87 % of dense where all 8 read them at 78–86 %. Heads whose rows interleave
// (token-major) all go together, so that each block's rows are whole.
constexpr std::int64_t kHeadGroupBytes = 16384;
// The most lanes a kernel table has (every table's lanes today): the drivers' per-lane-block
// arrays of row pointers are this long, and larger lane blocks take the element-by-element paths.
constexpr std::int64_t kMaxLanes = 64;
// Query rows per row-layout block in the dk/dv pass.
constexpr std::int64_t kRowQueryBlock = 64;
// The row-layout backward pass on AMX tiles takes 128 query rows against 128 keys: its
// accumulating products (dVᵀ += dOᵀ P, dKᵀ += Qᵀ dS, dQ += dS K) then load and store their tile
// accumulators once per 4 steps of 16 words, not per 2 (bf16 backward, 2 threads: B1 H8 N2048
// D128 55.5, 58.0 → 45.5, 54.3 ms; causal 46.6, 48.3 → 37.9, 38.3; H16 N2048 D64 61.7, 61.0 →
// 58.8, 53.0; H16 N512 D64 7.3, 7.6 → 8.0, 7.8; 256 rows or keys did no better).
constexpr std::int64_t kAmxRowQueryBlock = 128;
constexpr std::int64_t kAmxRowKeyBlock = 128;
// The most keys of a row-layout backward block (the stack arrays of its register transposes).
constexpr std::int64_t kMaxKeyBlock = std::max(kRowKeyBlock, kAmxRowKeyBlock);
// The fused backward (one pass: dq, dk, dv) runs one task per (b, hkv), so it is chosen only
// when there are at least this many: fewer leave threads idle, and the two passes, which split
// every (b, hkv) into blocks, are then faster. A constant of the shape, never the thread count.
constexpr std::int64_t kFusedMinUnits = 8;

// n floats, 64-byte aligned (buffers.h); attn::error naming the size when the memory is not there.
fbuf alloc_floats(std::int64_t n) { return cpu::alloc_floats(n, "attention (cpu)"); }

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

// [B, H, N, X] as f32 rows with unit x-stride: the user's memory when it already is, else a copy.
struct rows_f32 {
  const float* data = nullptr;
  std::int64_t sb = 0, sh = 0, sn = 0;
  fbuf own;
  const float* row(std::int64_t b, std::int64_t h, std::int64_t n) const { return data + b * sb + h * sh + n * sn; }
};

// Elements below which as_rows converts on one thread.
constexpr std::int64_t kSerialCopy = std::int64_t(1) << 16;

rows_f32 as_rows(const strided4& t, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int nt) {
  rows_f32 r;
  if (t.type == dtype::f32 && (t.sx == 1 || X <= 1)) {
    r.data = static_cast<const float*>(t.data);
    r.sb = t.sb, r.sh = t.sh, r.sn = t.sn;
    return r;
  }
  r.own = alloc_floats(B * H * N * X);
  r.data = r.own.get();
  r.sn = X, r.sh = N * X, r.sb = H * N * X;
  float* dst = r.own.get();
  // A decode step's q is a few thousand elements: converted on the calling thread, where waking
  // the others (a futex each under OMP_WAIT_POLICY=passive) would cost more than the copy.
  if (B * H * N * X < kSerialCopy) nt = 1;
#pragma omp parallel for num_threads(nt) schedule(static)
  for (std::int64_t row = 0; row < B * H * N; ++row) {
    const std::int64_t n = row % N, h = row / N % H, b = row / N / H;
    float* d = dst + row * X;
    const std::int64_t base = t.offset(b, h, n, 0);
    switch (t.type) {
      case dtype::f32:
        for (std::int64_t x = 0; x < X; ++x) d[x] = static_cast<const float*>(t.data)[base + x * t.sx];
        break;
      case dtype::bf16:
        for (std::int64_t x = 0; x < X; ++x) d[x] = bf16_to_f32(static_cast<const std::uint16_t*>(t.data)[base + x * t.sx]);
        break;
      case dtype::f16:
        for (std::int64_t x = 0; x < X; ++x) d[x] = f16_to_f32(static_cast<const std::uint16_t*>(t.data)[base + x * t.sx]);
        break;
      default:
        for (std::int64_t x = 0; x < X; ++x) d[x] = float(load_as_double(t.data, t.type, base + x * t.sx));
    }
  }
  return r;
}

// Lanes of one lane block: row r = lb·L + x of (b, hkv) is query i = r / G of head hkv·G + r % G.
struct lane_setup {
  std::int64_t L = 0, nl = 0;
  std::vector<std::int32_t> lo, hi, pos;
  std::vector<float> slope;
  std::vector<std::int64_t> h, i;
  fbuf qt;

  bool prescale = true;  // qᵀ = scale·q (else q as it is; the kernel scales the scores)

  lane_setup(std::int64_t L_, std::int64_t D) : L(L_), lo(L_), hi(L_), pos(L_), slope(L_), h(L_), i(L_), qt(alloc_floats(D * L_)) {}

  // Lane x's row (h, i) of the outputs (store_lane_rows).
  auto row_of() const {
    return [this](std::int64_t x) { return std::pair{h[x], i[x]}; };
  }

  // Q null: lane positions only (no qᵀ).
  void set(const kernel_table& kt, const problem& p, const rows_f32* Q, std::int64_t b, std::int64_t hkv, std::int64_t lbi) {
    const std::int64_t G = p.group(), rows = p.Nq * G;
    nl = std::min(L, rows - lbi * L);
    const float scale = float(p.scale);
    const float* q[kMaxLanes];
    for (std::int64_t x = 0; x < L; ++x) {
      if (x >= nl) {
        lo[x] = hi[x] = pos[x] = 0, slope[x] = 0.0f, h[x] = i[x] = 0;
        continue;
      }
      const std::int64_t r = lbi * L + x;
      i[x] = r / G, h[x] = hkv * G + r % G;
      const auto [a, e] = p.key_range(b, i[x]);
      lo[x] = std::int32_t(a), hi[x] = std::int32_t(e), pos[x] = std::int32_t(p.query_pos(b, i[x]));
      slope[x] = p.alibi.empty() ? 0.0f : float(p.alibi[b * p.Hq + h[x]]);
      if (Q) q[x] = Q->row(b, h[x], i[x]);
    }
    if (!Q) return;
    // qᵀ by the kernels' W × W register transposes of 32-bit words (zeros past nl), then scaled:
    // for a decode step's few rows, 8 transposes at D 128 where a loop over d took a scalar
    // store per element and a fill of the other lanes
    const std::uint32_t* qw[kMaxLanes];
    for (std::int64_t x = 0; x < nl; ++x) qw[x] = reinterpret_cast<const std::uint32_t*>(q[x]);
    kt.lane_words(qw, L, nl, p.D, reinterpret_cast<std::uint32_t*>(qt.get()), L);
    if (prescale && scale != 1.0f)  // the rows' lanes only: the zeros past nl stay zeros (scale may be inf)
      for (std::int64_t d = 0; d < p.D; ++d)
        for (std::int64_t x = 0; x < nl; ++x) qt[d * L + x] *= scale;
  }
};

// Whether the prefill kernels may skip key blocks the mask hides from every row: q and k finite.
bool mask_may_skip(const problem& p, int nt) {
  return p.mask != mask_kind::none && view_all_finite(p.q, p.B, p.Hq, p.Nq, p.D, nt) &&
         view_all_finite(p.k, p.B, p.Hkv, p.Nk, p.D, nt);
}

score_params make_score_params(const problem& p, const bias_ctx* bc, float scale, bool skip_excluded = false) {
  score_params sp;
  sp.scale = scale;
  sp.softcap = float(p.softcap);
  sp.alibi = !p.alibi.empty();
  if (p.mask != mask_kind::none) sp.bias = fill_bias, sp.bias_ctx = bc, sp.skip_excluded = skip_excluded;
  return sp;
}

lane_block make_lane_block(const problem& p, const lane_setup& ls, const rows_f32& K, const rows_f32& V,
                           std::int64_t b, std::int64_t hkv, const score_params& sp, float* scratch) {
  lane_block lb;
  lb.L = ls.L, lb.nl = ls.nl, lb.D = p.D, lb.Dv = p.Dv;
  lb.qt = ls.qt.get();
  lb.k = K.row(b, hkv, 0), lb.v = V.row(b, hkv, 0);
  lb.ksn = K.sn, lb.vsn = V.sn;
  lb.lo = ls.lo.data(), lb.hi = ls.hi.data(), lb.pos = ls.pos.data(), lb.slope = ls.slope.data();
  lb.klo = 0, lb.khi = p.Nk;
  lb.sp = sp;
  lb.scratch = scratch;
  return lb;
}

std::int64_t lanes_for(const problem& p, const kernel_table& kt) {
  return p.Nq * p.group() <= kt.lanes_small ? kt.lanes_small : kt.lanes;
}

// ---- forward ----

std::uint32_t word(std::uint16_t lo, std::uint16_t hi) { return lo | std::uint32_t(hi) << 16; }

// Keys and values of every (b, hkv) for the AVX512_BF16 kernels, packed once per call
// (bf16_words.h): rows [Nk'][D|Dv] (as words, D and Dv even) and key pairs [Nk'/2][D|Dv]
// (Nk' = Nk rounded up to even, the extra key zero); only the layouts asked for.
// The AMX kernels (amx.h) take key pairs transposed (the forward's Vᵀ, the dq pass's Kᵀ) and
// every layout padded with kAmxPad zero keys (their products take keys 32 at a time).
struct bf16_pack {
  static constexpr std::int64_t kAmxPad = 32;
  words k, v, kp, vp, kt, vt;
  std::int64_t nk2 = 0;

  // amx: every layout padded to a multiple of 32 keys and kAmxPad more, so that the rows of Kᵀ
  // and Vᵀ (nk2 / 2 words) start on cache lines as the tiles want; key pairs transposed (kt: Kᵀ,
  // the dq pass's) in place of kp, value pairs (vt: Vᵀ, the forward's) in place of vp.
  bf16_pack(const problem& p, int nt, bool k_rows, bool k_pairs, bool v_rows, bool v_pairs, bool amx = false)
      : nk2(amx ? (p.Nk + 31) / 32 * 32 + kAmxPad : (p.Nk + 1) / 2 * 2) {
    std::vector<word_pack> packs;  // (rows and pairs in one parallel region)
    if (k_rows) packs.push_back({word_pack::rows, &p.k, p.B, p.Hkv, p.Nk, p.D, nk2, &k});
    if (v_rows) packs.push_back({word_pack::rows, &p.v, p.B, p.Hkv, p.Nk, p.Dv, nk2, &v});
    if (k_pairs && !amx) packs.push_back({word_pack::pairs, &p.k, p.B, p.Hkv, p.Nk, p.D, nk2 / 2, &kp});
    if (v_pairs && !amx) packs.push_back({word_pack::pairs, &p.v, p.B, p.Hkv, p.Nk, p.Dv, nk2 / 2, &vp});
    if (!packs.empty()) bf16_packs(packs, nt);
    if (k_pairs && amx) kt = bf16_pair_words_t(p.k, p.B, p.Hkv, p.Nk, p.D, nk2 / 2, nt);
    if (v_pairs && amx) vt = bf16_pair_words_t(p.v, p.B, p.Hkv, p.Nk, p.Dv, nk2 / 2, nt);
  }
  // Row 0 of the (b, hkv) whose first packed row is `base`, as the kernels' bf16 rows.
  static const std::uint16_t* rows(const words& w, std::int64_t base, std::int64_t X) {
    return reinterpret_cast<const std::uint16_t*>(w.data() + base * X / 2);
  }
};

// Lane words [X/2][L] of rows (b, h[x], i[x]) of a bf16 view (zero past the valid lanes): by the
// kernels' register transposes where every row is unit-stride words on 4-byte boundaries.
void pack_lane_words(const kernel_table& kt, const strided4& t, std::int64_t b, const lane_setup& ls, std::int64_t X,
                     std::uint32_t* out) {
  if ((t.sx == 1 || X <= 1) && ls.L <= kMaxLanes) {
    const std::uint32_t* rows[kMaxLanes];
    bool aligned = true;  // every row on a 4-byte boundary: readable as words
    for (std::int64_t x = 0; x < ls.nl && aligned; ++x) {
      const std::uint16_t* r = t.ptr<std::uint16_t>(b, ls.h[x], ls.i[x], 0);
      aligned = reinterpret_cast<std::uintptr_t>(r) % 4 == 0;
      rows[x] = reinterpret_cast<const std::uint32_t*>(r);
    }
    if (aligned) return kt.lane_words(rows, ls.L, ls.nl, X / 2, out, ls.L);
  }
  for (std::int64_t x = 0; x < ls.L; ++x) {
    if (x >= ls.nl) {
      for (std::int64_t d = 0; d < X; d += 2) out[d / 2 * ls.L + x] = 0;
      continue;
    }
    const std::uint16_t* r = t.ptr<std::uint16_t>(b, ls.h[x], ls.i[x], 0);
    if (t.sx == 1)  // the row's own words (the low half first, as word() pairs them)
      for (std::int64_t d = 0; d < X; d += 2) out[d / 2 * ls.L + x] = word(r[d], r[d + 1]);
    else
      for (std::int64_t d = 0; d < X; d += 2) out[d / 2 * ls.L + x] = word(r[d * t.sx], r[(d + 1) * t.sx]);
  }
}

// How the forward runs a problem; decided here alone, for forward() and for explain_backend.
struct forward_plan {
  std::int64_t lanes = 0, lane_blocks = 0, units = 0;  // L, blocks of L rows per (b, hkv), B·Hkv·blocks
  bool bf16_dots = false;  // bf16 inputs, even D, prefill-sized lane blocks: vdpbf16ps tiles
  bool amx = false;        // the same on AMX tiles (the amx level; D a multiple of 32, Dv of 16)
  bool k16 = false;        // decode reads bf16 key/value rows as they are (memory-bound: no f32 copy)
  bool raw_q = false;      // bf16 q with bf16 or int8 K/V rows: q stays exact (unscaled) for the
                           // bf16 decode dots; the scores are scaled instead
  bool k8 = false;         // int8 K/V rows with per-row scales (serving), read in place by decode
  bool int8_rounding = false;  // int8 K/V: q and the weights may be rounded (problem::int8_rounding)
  bool int8_bytes = false;     // int8 K/V: the weights in 8 bits, with blocked keys q too (problem::int8_bytes)
  bool paged = false;      // K/V rows in pages through a block table (serving), read in place by decode
  // Decode reading K/V in place from rows whose heads interleave (a page of every head, or a
  // token-major cache): one task runs every kv head of a (b, lane block, key chunk), block by
  // block (kernel_table::decode_heads), so the rows of a key block are read together rather than
  // one head's slice of each at a time. heads: kv heads per task (1: one, as elsewhere);
  // ATTN_DECODE_HEADS=N caps it (the largest divisor of Hkv up to N; 0 or 1: one head per task).
  std::int64_t heads = 1;
  std::int64_t nchunk = 1, chunk = 1;  // split-KV: key chunks per unit, keys per chunk
};

// kv heads per decode task: the fewest (a divisor of Hkv) whose runs of rows add up to
// kHeadGroupBytes (run_bytes = 0: every head, their rows interleave), capped by ATTN_DECODE_HEADS.
std::int64_t decode_heads_per_task(std::int64_t Hkv, std::int64_t run_bytes) {
  std::int64_t n = 1;
  if (run_bytes == 0) n = Hkv;
  else
    while (n < Hkv && (Hkv % n || n * run_bytes < kHeadGroupBytes)) ++n;
  if (const char* e = std::getenv("ATTN_DECODE_HEADS"); e && *e) {
    n = std::min(n, std::max<std::int64_t>(1, std::atoll(e)));
    while (Hkv % n) --n;
  }
  return n;
}

// Paged or int8 K/V (set only by the serving ops) are read in place, by the decode kernel alone:
// every lane block has at most lanes_small rows, however many rows a (b, hkv) has.
bool decode_only(const problem& p) { return p.page_table != nullptr || p.k.type == dtype::i8; }

// A (b, hkv) with a few more rows than lanes_small (a speculative step of 2–16 tokens on GQA, a
// short chunk against a long cache) runs on decode's passes of lanes_small rows rather than in
// prefill lane blocks mostly empty (with bf16 K/V, also packed whole for the lane blocks every
// call): where a block costs more than the passes its rows take in decode
// (kernel_table::decode_passes; bf16 K/V rows that decode reads in place as they are).
bool few_rows(const problem& p, const kernel_table& kt) {
  const std::int64_t rows = p.Nq * p.group();
  if (rows <= kt.lanes_small) return true;
  if (rows > 2 * kt.lanes) return false;
  const bool bf16_rows = p.k.type == dtype::bf16 && (p.k.sx == 1 || p.D <= 1) && (p.v.sx == 1 || p.Dv <= 1);
  const float passes = bf16_rows ? kt.decode_passes_bf16 : kt.decode_passes_f32;
  return float(ceil_div(rows, kt.lanes_small)) <= passes * float(ceil_div(rows, kt.lanes));
}

forward_plan plan_forward(const problem& p, const kernel_table& kt) {
  forward_plan f;
  f.lanes = decode_only(p) || few_rows(p, kt) ? kt.lanes_small : lanes_for(p, kt);
  f.lane_blocks = ceil_div(p.Nq * p.group(), f.lanes);
  f.units = p.B * p.Hkv * f.lane_blocks;
  f.bf16_dots = kt.forward_bf16 && p.q.type == dtype::bf16 && p.D % 2 == 0 && f.lanes == kt.lanes;
  f.amx = f.bf16_dots && kt.forward_amx && p.D % 32 == 0 && p.Dv % 16 == 0;
  f.k16 = f.lanes == kt.lanes_small && p.k.type == dtype::bf16 && (p.k.sx == 1 || p.D <= 1) &&
          (p.v.sx == 1 || p.Dv <= 1);
  f.k8 = p.k.type == dtype::i8;
  f.raw_q = (f.k16 || f.k8) && p.q.type == dtype::bf16;
  f.int8_rounding = f.k8 && p.int8_rounding;
  f.int8_bytes = f.int8_rounding && p.int8_bytes;
  f.paged = p.page_table != nullptr;
  {
    // (blocked int8 keys: k.sn is the stride of a block of 16 keys)
    const std::int64_t row_bytes = p.k.sn * std::int64_t(dtype_size(p.k.type)) / (p.k_blocked ? 16 : 1);
    const bool interleaved = p.k.sh < p.k.sn;  // a token's rows of every head side by side
    const bool short_runs = f.paged && p.page_size * row_bytes < kHeadRunBytes;  // a head's rows of a page
    if ((f.k16 || f.k8 || f.paged) && (interleaved || short_runs))
      f.heads = decode_heads_per_task(p.Hkv, interleaved ? 0 : p.page_size * row_bytes);
  }
  f.chunk = std::max<std::int64_t>(p.Nk, 1);
  const std::int64_t tasks = f.units / f.heads;
  if (tasks < kSplitUnits && p.Nk >= 2 * kSplitKeys) f.nchunk = ceil_div(p.Nk, kSplitKeys), f.chunk = kSplitKeys;
  // at least kDecodeTasks tasks where the heads allow it (heads apart give the same bits; the key
  // chunks, decided above, stay as they are)
  while (f.heads > 1 && f.units / f.heads * f.nchunk < kDecodeTasks)
    for (--f.heads; p.Hkv % f.heads;) --f.heads;
  return f;
}

// Paged float32 or bfloat16 K/V whose (b, hkv) has many query rows (a prefill chunk, a long
// speculative step): the decode kernel reads every key once per pass of lanes_small rows, at
// about 0.6 of the prefill kernels' rate on whole lane blocks, so the pages are gathered into
// rows and the call runs as dense prefill where that pays — from two whole prefill lane blocks
// of rows, or from four decode passes when the pages are token-major (a token's heads side by
// side, which decode reads a block of every head at a time, slower still). Measured, Zen 5,
// 2 threads, Hq 32 / Hkv 8, D 128, Nk 4096, shuffled pages of 16, B 1 (`attn bench --paged 16`,
// decode → gathered, ms):
//   f32  head-major   Nq 16: 4.5 → 4.0 | 24: 6.3 → 8.6 (both kept on decode) | 32: 8.6 → 8.5 | 64: 16.1 → 13.4 | 256: 61 → 42
//        token-major  Nq 12: 4.6 → 4.0–5.0 (kept on decode) | 16: 5.9 → 4.0 | 32: 10.6 → 8.5 | 64: 20.7 → 13.1
//   bf16 head-major   Nq 16: 3.7 → 3.7 | 24: 4.9 → 5.1 (both kept on decode) | 32: 6.3 → 5.6 | 64: 10.8 → 8.0 | 256: 40 → 23
//        token-major  Nq 12: 3.0 → 3.8 (kept on decode) | 16: 4.3 → 3.9 | 32: 7.8 → 5.4 | 64: 12.6 → 7.7 | 256: 51 → 24
// (dense f32 3.3 / 6.6 / 8.7 / 10.5 / 39 at Nq 16 / 24 / 32 / 64 / 256, bf16 2.6–2.8 / 4.0 /
// 4.2 / 6.4 / 21.5; 24 rows a head leave the second lane block of 64 half empty).
bool paged_gather(const problem& p, const kernel_table& kt) {
  if (p.page_table == nullptr || (p.k.type != dtype::f32 && p.k.type != dtype::bf16) ||
      std::int64_t(p.kv_len.size()) != p.B)  // (the serving front always sets the lengths)
    return false;
  const std::int64_t rows = p.Nq * p.group();
  const bool token_major = p.k.sh < p.k.sn;
  return rows >= 2 * kt.lanes || (token_major && rows >= 4 * kt.lanes_small);
}

// The most bytes of gathered K/V one pass of forward_paged_gathered holds: 8 MiB (a quarter of
// a 32 MiB L3, so the lane blocks read the rows the gather just wrote from cache), or
// ATTN_PAGED_GATHER_MIB (0: one kv head of one sequence a pass).
std::int64_t gather_bytes() {
  if (const char* e = std::getenv("ATTN_PAGED_GATHER_MIB"); e && *e) return std::max<std::int64_t>(0, std::atoll(e)) << 20;
  return std::int64_t(8) << 20;
}

void forward_out(const problem& p, const forward_outputs& o);

// Kv heads [h0, h1) of sequences [b0, b1) (every head, or some heads of one sequence): rows
// [0, kv_len[b]) copied from their pages into [b][hkv][n][X] (rows past a sequence's length up to
// the pass's longest zero), then the dense forward of the same rows of q, the same kv_len.
void forward_gathered_pass(const problem& p, const forward_outputs& o, std::int64_t b0, std::int64_t b1, std::int64_t h0,
                           std::int64_t h1) {
  const int nt = std::max(1, p.num_threads);
  const std::int64_t es = std::int64_t(dtype_size(p.k.type)), G = p.group(), nb = b1 - b0, nh = h1 - h0;
  std::int64_t nk = 0;
  for (std::int64_t b = b0; b < b1; ++b) nk = std::max(nk, p.kv_len[std::size_t(b)]);
  fbuf kv = alloc_floats(ceil_div(nb * nh * nk * (p.D + p.Dv) * es, 4));  // (kept between calls: alloc_working)
  auto* kd = reinterpret_cast<std::byte*>(kv.get());
  std::byte* vd = kd + nb * nh * nk * p.D * es;
  const std::int64_t pages = ceil_div(nk, p.page_size);
#pragma omp parallel for num_threads(nb * nh * nk * (p.D + p.Dv) < kSerialCopy ? 1 : nt) schedule(static)
  for (std::int64_t t = 0; t < nb * nh * pages; ++t) {
    const std::int64_t pg = t % pages, hl = t / pages % nh, bl = t / pages / nh, b = b0 + bl;
    const std::int64_t n0 = pg * p.page_size, n1 = std::min(nk, n0 + p.page_size);
    const std::int64_t valid = std::clamp<std::int64_t>(p.kv_len[std::size_t(b)] - n0, 0, n1 - n0);
    const auto copy = [&](const strided4& src, std::int64_t page_stride, std::int64_t X, std::byte* dst) {
      std::byte* d = dst + ((bl * nh + hl) * nk + n0) * X * es;
      if (valid > 0) {
        const auto* s = static_cast<const std::byte*>(src.data) +
                        (p.page_table[b * p.max_pages + pg] * page_stride + (h0 + hl) * src.sh) * es;
        for (std::int64_t n = 0; n < valid; ++n) std::memcpy(d + n * X * es, s + n * src.sn * es, std::size_t(X * es));
      }
      std::memset(d + valid * X * es, 0, std::size_t((n1 - n0 - valid) * X * es));
    };
    copy(p.k, p.page_stride.k, p.D, kd);
    copy(p.v, p.page_stride.v, p.Dv, vd);
  }
  problem d = p;
  d.B = nb, d.Hkv = nh, d.Hq = nh * G, d.Nk = nk;
  d.page_table = nullptr, d.max_pages = 0, d.page_size = 0, d.page_stride = {};
  d.k = strided4{kd, p.k.type, nh * nk * p.D, nk * p.D, p.D, 1};
  d.v = strided4{vd, p.v.type, nh * nk * p.Dv, nk * p.Dv, p.Dv, 1};
  const auto at = [](const strided4& t, std::int64_t b, std::int64_t h) {
    return static_cast<void*>(static_cast<std::byte*>(t.data) + t.offset(b, h, 0, 0) * std::int64_t(dtype_size(t.type)));
  };
  d.q.data = at(p.q, b0, h0 * G);
  if (p.mask != mask_kind::none) d.mask_view.data = at(p.mask_view, b0, h0 * G);
  d.kv_len.assign(p.kv_len.begin() + b0, p.kv_len.begin() + b1);
  d.alibi.clear();
  if (!p.alibi.empty())
    for (std::int64_t b = b0; b < b1; ++b)
      d.alibi.insert(d.alibi.end(), p.alibi.begin() + b * p.Hq + h0 * G, p.alibi.begin() + b * p.Hq + h1 * G);
  if (!p.sinks.empty()) d.sinks.assign(p.sinks.begin() + h0 * G, p.sinks.begin() + h1 * G);
  if (!p.past_lens.empty()) d.past_lens.assign(p.past_lens.begin() + b0, p.past_lens.begin() + b1);
  // lse [B, Hq, Nq] is contiguous: the pass's rows (all heads of its sequences, or some heads of one)
  // are one run from row0.
  const std::int64_t row0 = (b0 * p.Hq + h0 * G) * p.Nq;
  forward_outputs od = o;
  od.out.data = at(o.out, b0, h0 * G);
  od.lse = static_cast<std::byte*>(o.lse) + row0 * std::int64_t(dtype_size(o.lse_type));
  special_rows found;
  od.found = o.found ? &found : nullptr;
  forward_out(d, od);
  if (o.found) {
    for (const std::int64_t r : found.rows) o.found->rows.push_back(row0 + r);
    o.found->complete = o.found->complete && found.complete;
  }
}

// Paged K/V gathered pass by pass: whole sequences while they fit in gather_bytes() together, a
// sequence that does not alone in passes of as many of its kv heads as fit (one at least). The
// passes depend on the shapes and lengths only, never on the thread count.
void forward_paged_gathered(const problem& p, const forward_outputs& o) {
  const std::int64_t head_token = (p.D + p.Dv) * std::int64_t(dtype_size(p.k.type));  // bytes
  const std::int64_t budget = gather_bytes();
  if (o.found) o.found->rows.clear(), o.found->complete = true;
  for (std::int64_t b0 = 0; b0 < p.B;) {
    const std::int64_t len = p.kv_len[std::size_t(b0)];
    if (len * p.Hkv * head_token > budget) {
      const std::int64_t hp = std::clamp<std::int64_t>(budget / std::max<std::int64_t>(1, len * head_token), 1, p.Hkv);
      for (std::int64_t h0 = 0; h0 < p.Hkv; h0 += hp) forward_gathered_pass(p, o, b0, b0 + 1, h0, std::min(p.Hkv, h0 + hp));
      ++b0;
      continue;
    }
    std::int64_t b1 = b0 + 1, nk = len;
    while (b1 < p.B && std::max(nk, p.kv_len[std::size_t(b1)]) * (b1 + 1 - b0) * p.Hkv * head_token <= budget)
      nk = std::max(nk, p.kv_len[std::size_t(b1)]), ++b1;
    forward_gathered_pass(p, o, b0, b1, 0, p.Hkv);
    b0 = b1;
  }
}

void forward_out(const problem& p, const forward_outputs& o) {
  const kernel_table& kt = select_kernels();
  if (paged_gather(p, kt)) return forward_paged_gathered(p, o);
  const int nt = std::max(1, p.num_threads);
  const forward_plan plan = plan_forward(p, kt);
  const std::int64_t L = plan.lanes, nlb = plan.lane_blocks, units = plan.units;
  const bool dp = plan.bf16_dots, k16 = plan.k16, raw_q = plan.raw_q, k8 = plan.k8, paged = plan.paged;
  const bool kv_in_place = k16 || k8 || paged;  // paged f32 rows too (why_not checks the strides)
  const bool amx = plan.amx;
  std::unique_ptr<bf16_pack> pack = dp ? std::make_unique<bf16_pack>(p, nt, true, false, false, true, amx) : nullptr;
  const rows_f32 Q = dp ? rows_f32{} : as_rows(p.q, p.B, p.Hq, p.Nq, p.D, nt);
  const rows_f32 K = dp || kv_in_place ? rows_f32{} : as_rows(p.k, p.B, p.Hkv, p.Nk, p.D, nt);
  const rows_f32 V = dp || kv_in_place ? rows_f32{} : as_rows(p.v, p.B, p.Hkv, p.Nk, p.Dv, nt);
  const std::int64_t nchunk = plan.nchunk, chunk = plan.chunk;
  // f32 prefill lanes: Vᵀ of every (b, hkv) (lane_block::vt), packed once here for the lane
  // blocks that share it, its rows Nk rounded up to W plus W apart (a power-of-two stride would
  // put the tiles' rows in one set of L1). Only where a head's K and V outgrow half of a 2 MiB L2
  // and stream from L3 for every lane block: from L2 the products run as fast on V's rows, and
  // the pack's fresh pages cost more than it saves (H16 N512 D64: 4.2-4.4 → 4.5-4.9 ms).
  const bool vt_pack = !dp && !kv_in_place && L == kt.lanes && nlb >= 2 && p.Nk * (p.D + p.Dv) * 4 > (std::int64_t(1) << 20);
  const std::int64_t ldvt = vt_pack ? (p.Nk + kt.W - 1) / kt.W * kt.W + kt.W : 0;
  constexpr std::int64_t kVtKeys = 64;  // keys a pack task transposes
  const std::int64_t vt_chunks = ceil_div(p.Nk, kVtKeys);
  fbuf vtb = vt_pack ? alloc_floats(p.B * p.Hkv * p.Dv * ldvt) : fbuf();
  const std::int64_t per = 2 * L + p.Dv * L;  // m, l, oᵀ of one task
  fbuf part = nchunk > 1 ? alloc_floats(units * nchunk * per) : fbuf();
  // (decode never skips a block, and a scan of the whole cache would cost what decode does)
  const bool skip = L != kt.lanes_small && mask_may_skip(p, nt);
  // A mask broadcast over heads is read once here, not once per head (cpu/mask_fill.h).
  const mask_spans spans = p.mask_view.sh == 0 && p.Hq > 1 && !decode_only(p) ? find_mask_spans(p, nt) : mask_spans{};

  // Normalises and writes the rows of one lane block from its (m, l, oᵀ), and notes in `special`
  // the rows the front must look at (forward_outputs::found): a non-finite out or lse.
  const bool lse_exact = o.lse_type == dtype::f32 || o.lse_type == dtype::f64;  // (a finite lse stays finite)
  std::vector<std::vector<std::int64_t>> special(o.found ? static_cast<std::size_t>(nt) : 0);
  auto finish = [&](const lane_setup& ls, std::int64_t b, const float* m, const float* l, const float* ot, bool row_layout) {
    float inv[kMaxLanes];
    bool lse_bad[kMaxLanes];
    for (std::int64_t x = 0; x < ls.nl; ++x) {  // l NaN (a NaN score): out NaN, redone by the front
      inv[x] = l[x] > 0.0f || std::isnan(l[x]) ? 1.0f / l[x] : 0.0f;
      const double lse = l[x] > 0.0f || std::isnan(l[x]) ? double(m[x] + std::log(l[x])) : kNegInf;
      lse_bad[x] = !std::isfinite(lse) || !lse_exact;
      store_from_double(o.lse, o.lse_type, (b * p.Hq + ls.h[x]) * p.Nq + ls.i[x], lse);
    }
    const std::uint64_t bad = row_layout ? cpu::store_rows(kt, o.out, b, ls.nl, p.Dv, ot, p.Dv, inv, ls.row_of())
                                         : cpu::store_lane_rows(kt, o.out, b, ls.nl, p.Dv, ot, ls.L, inv, ls.row_of());
    if (!o.found) return;
    std::vector<std::int64_t>& rows = special[std::size_t(omp_get_thread_num())];
    for (std::int64_t x = 0; x < ls.nl; ++x)
      if (lse_bad[x] || x >= 64 || (bad >> x & 1)) rows.push_back((b * p.Hq + ls.h[x]) * p.Nq + ls.i[x]);
  };
  // Hands the rows to the front, once every row is written.
  const auto hand_over = [&] {
    if (!o.found) return;
    o.found->rows.clear();
    for (const std::vector<std::int64_t>& r : special) o.found->rows.insert(o.found->rows.end(), r.begin(), r.end());
    o.found->complete = true;
  };

  // Decode's lane blocks hand their rows over as rows (forward_io::rows), stored without the two
  // transposes of oᵀ; split-KV chunks keep oᵀ for the merge.
  const bool decode_rows_out = nchunk == 1 && L == kt.lanes_small && kt.lanes_small != kt.lanes && !dp;
  // Tasks: (unit, chunk), or with plan.heads (b, lane block, chunk) running every kv head.
  const std::int64_t nh = plan.heads, tasks = units / nh * nchunk;
  // Floats of one head's scratch, 64-byte aligned.
  const std::int64_t scratch_floats = (lane_scratch_floats(L, p.D, p.Dv) + bf16_scratch_floats(L) + 15) / 16 * 16;
  team_join join;
#pragma omp parallel num_threads(nt)
  {
    const denormals_flushed ftz;
    // Per head of a task: its lane positions and qᵀ, scratch, (m, l, oᵀ), mask context, block.
    std::vector<lane_setup> lss;
    lss.reserve(std::size_t(nh));
    for (std::int64_t h = 0; h < nh; ++h) lss.emplace_back(L, p.D);
    fbuf scratch = alloc_floats(nh * scratch_floats);
    words qp(dp ? std::size_t(p.D / 2 * L) : 0);
    fbuf mlo = alloc_floats(nh * per);
    std::vector<bias_ctx> bcs(static_cast<std::size_t>(nh));
    std::vector<lane_block> lbs(static_cast<std::size_t>(nh));
    std::vector<forward_io> ios(static_cast<std::size_t>(nh));
    std::vector<std::int64_t> us(static_cast<std::size_t>(nh));
    if (vt_pack) {
#pragma omp for schedule(static)
      for (std::int64_t t = 0; t < p.B * p.Hkv * vt_chunks; ++t) {
        const std::int64_t bh = t / vt_chunks, j0 = t % vt_chunks * kVtKeys, n = std::min(kVtKeys, p.Nk - j0);
        const std::uint32_t* rows[kVtKeys];
        for (std::int64_t x = 0; x < n; ++x)
          rows[x] = reinterpret_cast<const std::uint32_t*>(V.row(bh / p.Hkv, bh % p.Hkv, j0 + x));
        kt.lane_words(rows, ceil_div(n, kt.W) * kt.W, n, p.Dv, reinterpret_cast<std::uint32_t*>(vtb.get() + bh * p.Dv * ldvt + j0),
                      ldvt);
      }
    }
#pragma omp for schedule(dynamic, 1) nowait
    for (std::int64_t t = 0; t < tasks; ++t) {
      const std::int64_t c = t % nchunk, w = t / nchunk;
      for (std::int64_t hh = 0; hh < nh; ++hh) {
        // unit u = (b·Hkv + hkv)·nlb + lane block index, as without plan.heads
        const std::int64_t g = w / nlb, u = ((g / (p.Hkv / nh)) * p.Hkv + g % (p.Hkv / nh) * nh + hh) * nlb + w % nlb;
        const std::int64_t lbi = nlb - 1 - u % nlb;  // later query blocks see more keys (causal): start them first
        const std::int64_t hkv = u / nlb % p.Hkv, b = u / nlb / p.Hkv;
        lane_setup& ls = lss[std::size_t(hh)];
        bias_ctx& bc = bcs[std::size_t(hh)];
        float *m = mlo.get() + hh * per, *l = m + L, *ot = l + L;
        us[std::size_t(hh)] = u;
        ios[std::size_t(hh)] = forward_io{m, l, ot, decode_rows_out};
        // q is pre-scaled on the f32 path; the bf16 path scales the scores.
        ls.prescale = !raw_q;
        ls.set(kt, p, dp ? nullptr : &Q, b, hkv, lbi);
        bc.p = &p, bc.kt = &kt, bc.total = L, bc.h = ls.h.data(), bc.i = ls.i.data(), bc.spans = &spans;
        bc.b = b, bc.valid = ls.nl;
        const score_params sp = make_score_params(p, &bc, dp || raw_q ? float(p.scale) : 1.0f, skip);
        for (std::int64_t x = 0; x < L; ++x) {
          const bool sink = !p.sinks.empty() && x < ls.nl && c == 0;
          m[x] = sink ? float(p.sinks[ls.h[x]]) : -kInfF;
          l[x] = sink ? 1.0f : 0.0f;
        }
        if (!decode_rows_out) std::fill(ot, ot + p.Dv * L, 0.0f);  // (decode writes every row it has)
        lane_block& lb = lbs[std::size_t(hh)];
        lb = make_lane_block(p, ls, K, V, b, hkv, sp, scratch.get() + hh * scratch_floats);
        lb.klo = c * chunk, lb.khi = std::min(p.Nk, (c + 1) * chunk);
        if (vt_pack) lb.vt = vtb.get() + (b * p.Hkv + hkv) * p.Dv * ldvt, lb.ldvt = ldvt;
        if (kv_in_place) {  // rows of (b, hkv) from element 0 of their first page (paged), or of the view
          const std::int64_t kb = paged ? hkv * p.k.sh : p.k.offset(b, hkv, 0, 0);
          const std::int64_t vb = paged ? hkv * p.v.sh : p.v.offset(b, hkv, 0, 0);
          lb.ksn = p.k.sn, lb.vsn = p.v.sn;
          if (k8) {
            lb.k8 = static_cast<const std::int8_t*>(p.k.data) + kb, lb.v8 = static_cast<const std::int8_t*>(p.v.data) + vb;
            lb.kscale = static_cast<const float*>(p.k_scale.data) + (paged ? hkv * p.k_scale.sh : p.k_scale.offset(b, hkv, 0, 0));
            lb.vscale = static_cast<const float*>(p.v_scale.data) + (paged ? hkv * p.v_scale.sh : p.v_scale.offset(b, hkv, 0, 0));
            lb.kss = p.k_scale.sn, lb.vss = p.v_scale.sn;
            lb.kblocked = p.k_blocked;
            lb.q_bf16 = raw_q, lb.int8_rounding = plan.int8_rounding, lb.int8_bytes = plan.int8_bytes;
          } else if (k16) {
            lb.k16 = static_cast<const std::uint16_t*>(p.k.data) + kb, lb.v16 = static_cast<const std::uint16_t*>(p.v.data) + vb;
            lb.q_bf16 = raw_q;
          } else {
            lb.k = static_cast<const float*>(p.k.data) + kb, lb.v = static_cast<const float*>(p.v.data) + vb;
          }
          if (paged) {
            lb.pages = p.page_table + b * p.max_pages, lb.page_size = p.page_size;
            lb.kps = p.page_stride.k, lb.vps = p.page_stride.v;
            lb.ksps = p.page_stride.k_scale, lb.vsps = p.page_stride.v_scale;
          }
        }
      }
      if (nh > 1) {
        kt.decode_heads(lbs.data(), ios.data(), int(nh));
      } else if (dp) {
        const std::int64_t u = us[0], hkv = u / nlb % p.Hkv, b = u / nlb / p.Hkv;
        pack_lane_words(kt, p.q, b, lss[0], p.D, qp.data());
        const std::int64_t base = (b * p.Hkv + hkv) * pack->nk2;
        bf16_operands op{qp.data(), bf16_pack::rows(pack->k, base, p.D), p.D};
        if (amx) {
          op.vt = pack->vt.data() + base / 2 * p.Dv, op.ldvt = pack->nk2 / 2;
          kt.forward_amx(lbs[0], op, ios[0]);
        } else {
          op.vp = pack->vp.data() + base / 2 * p.Dv;
          kt.forward_bf16(lbs[0], op, ios[0]);
        }
      } else {
        kt.forward(lbs[0], ios[0]);
      }
      for (std::int64_t hh = 0; hh < nh; ++hh) {
        const std::int64_t u = us[std::size_t(hh)], b = u / nlb / p.Hkv;
        const forward_io& io = ios[std::size_t(hh)];
        if (nchunk == 1) finish(lss[std::size_t(hh)], b, io.m, io.l, io.ot, io.rows);
        else std::copy(io.m, io.m + per, part.get() + (u * nchunk + c) * per);
      }
    }
    join.arrive();
  }
  if (nchunk == 1) return hand_over();

  // Split-KV merge, chunk by chunk in key order: a decode step's few partial rows on the calling
  // thread (waking the others again would cost more than the merge).
#pragma omp parallel num_threads(units * nchunk * per < kSerialCopy ? 1 : nt)
  {
    const denormals_flushed ftz;
    lane_setup ls(L, 0);
    fbuf acc = alloc_floats(per);
    float *m = acc.get(), *l = m + L, *ot = l + L;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t u = 0; u < units; ++u) {
      const std::int64_t lbi = nlb - 1 - u % nlb, hkv = u / nlb % p.Hkv, b = u / nlb / p.Hkv;
      ls.set(kt, p, nullptr, b, hkv, lbi);
      const float* pc = part.get() + u * nchunk * per;
      for (std::int64_t x = 0; x < L; ++x) {
        float mx = -kInfF;
        for (std::int64_t c = 0; c < nchunk; ++c) mx = std::max(mx, pc[c * per + x]);
        l[x] = 0.0f, m[x] = mx;
        for (std::int64_t d = 0; d < p.Dv; ++d) ot[d * L + x] = 0.0f;
        if (mx == -kInfF) {  // no key, or only NaN scores (l NaN): keep the NaN
          for (std::int64_t c = 0; c < nchunk; ++c) l[x] += pc[c * per + L + x];
          continue;
        }
        for (std::int64_t c = 0; c < nchunk; ++c) {
          const float* q = pc + c * per;
          const float w = std::exp(q[x] - mx);
          l[x] += w * q[L + x];
          for (std::int64_t d = 0; d < p.Dv; ++d) ot[d * L + x] += w * q[2 * L + d * L + x];
        }
      }
      finish(ls, b, m, l, ot, false);
    }
  }
  hand_over();
}

// The [B, Hq, Nq, Nk] intermediate (qk_output) after forward_out: lane blocks of the prefill
// width over f32 rows of q and k (bf16 and f16 widened), the kernels' own score transform, and
// for the probabilities e^{s - lse} with the lse of a first pass over the same scores (with the
// sink); each lane block writes its own rows, in key chunks of kQkKeys. Rows the float32 scores leave non-finite where float64 would not (NaN, ±inf
// of an overflow) are redone by the front on the reference (check_special_rows), as for out.
constexpr std::int64_t kQkKeys = 4096;

void qk_pass(const problem& p, const forward_outputs& o) {
  const kernel_table& kt = select_kernels();
  const int nt = std::max(1, p.num_threads);
  const std::int64_t L = kt.lanes, nlb = ceil_div(p.Nq * p.group(), L), units = p.B * p.Hkv * nlb;
  const rows_f32 Q = as_rows(p.q, p.B, p.Hq, p.Nq, p.D, nt);
  const rows_f32 K = as_rows(p.k, p.B, p.Hkv, p.Nk, p.D, nt);
  const rows_f32 V;  // not read
  qk_io io;
  switch (o.qk_mode) {
    case qk_output::scaled: io.stage = qk_stage::scaled; break;
    case qk_output::softcapped: io.stage = qk_stage::softcapped; break;
    case qk_output::biased: io.stage = qk_stage::biased; break;
    default: io.stage = qk_stage::probabilities;
  }
  const std::int64_t chunk = std::min<std::int64_t>(std::max<std::int64_t>(p.Nk, 1), kQkKeys);
#pragma omp parallel num_threads(nt)
  {
    const denormals_flushed ftz;
    lane_setup ls(L, p.D);  // q pre-scaled, as the f32 forward's: the same scores, the same overflows
    fbuf scratch = alloc_floats(lane_scratch_floats(L, p.D, p.Dv)), lse = alloc_floats(L), stats = alloc_floats(2 * L),
         out = alloc_floats(L * chunk);
    bias_ctx bc;
    bc.p = &p, bc.kt = &kt, bc.total = L, bc.h = ls.h.data(), bc.i = ls.i.data();
    const score_params sp = make_score_params(p, &bc, 1.0f);
    qk_io my = io;
    my.lse = lse.get(), my.out = out.get(), my.ld = chunk;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t u = 0; u < units; ++u) {
      const std::int64_t lbi = u % nlb, hkv = u / nlb % p.Hkv, b = u / nlb / p.Hkv;
      ls.set(kt, p, &Q, b, hkv, lbi);
      bc.b = b, bc.valid = ls.nl;
      lane_block lb = make_lane_block(p, ls, K, V, b, hkv, sp, scratch.get());
      if (io.stage == qk_stage::probabilities) {
        // The lse of this pass's own scores (and the sink), so that a row's probabilities sum
        // to 1 to float32 rounding even where the forward's kernel rounded a huge score otherwise.
        float *m = stats.get(), *l = m + L;
        std::fill(m, m + L, -kInfF), std::fill(l, l + L, 0.0f);
        qk_io st = my;
        st.stage = qk_stage::row_stats, st.m = m, st.l = l;
        lb.klo = 0, lb.khi = p.Nk;
        kt.qk(lb, st);
        for (std::int64_t x = 0; x < L; ++x) {
          if (x < ls.nl && !p.sinks.empty()) {
            const float sink = float(p.sinks[std::size_t(ls.h[x])]), mx = std::max(m[x], sink);
            l[x] = (m[x] == -kInfF ? 0.0f : l[x] * std::exp(m[x] - mx)) + std::exp(sink - mx), m[x] = mx;
          }
          lse.get()[x] = l[x] > 0.0f || std::isnan(l[x]) ? m[x] + std::log(l[x]) : kInfF;  // no key: every probability 0
        }
      }
      for (std::int64_t j0 = 0; j0 < p.Nk; j0 += chunk) {
        lb.klo = j0, lb.khi = std::min(p.Nk, j0 + chunk);
        kt.qk(lb, my);
        const std::int64_t n = lb.khi - j0;
        strided4 cols = o.qk;  // columns [j0, j0 + n)
        cols.data = static_cast<char*>(cols.data) + j0 * cols.sx * std::int64_t(dtype_size(cols.type));
        for (std::int64_t x = 0; x < ls.nl; ++x) cpu::store_row(cols, b, ls.h[x], ls.i[x], n, out.get() + x * chunk, 1, 1.0f);
      }
    }
  }
}

void forward(const problem& p, const forward_outputs& o) {
  if (p.B * p.Hq * p.Nq == 0) return;
  forward_out(p, o);
  if (o.qk_mode != qk_output::none && p.Nk > 0) qk_pass(p, o);
}

// ---- backward ----

// How the backward runs a problem; decided here alone, for backward() and explain_backend.
struct backward_plan {
  bool bf16_dots = false;  // bf16 inputs and dout, even D and Dv, prefill-sized lane blocks
  bool fused = false;      // one pass over (b, hkv) units: dq accumulated per key block
  bool amx = false;        // the passes on AMX tiles (the amx level; D and Dv multiples of 32)
};

// The gradient of a float mask shared by batch entries (B > 1) or by kv heads (Hkv > 1): the
// dk/dv tasks of the (b, hkv) that share an element then run in one task, in order.
struct dmask_sharing {
  bool b = false, h = false;
};
dmask_sharing shared_dmask(const problem& p, bool dmask) {
  if (!dmask) return {};
  return {p.B > 1 && p.mask_view.sb == 0, p.Hkv > 1 && p.mask_view.sh == 0};
}

backward_plan plan_backward(const problem& p, const kernel_table& kt, dtype dout_type, bool dmask) {
  backward_plan b;
  b.bf16_dots = kt.dq_bf16 && p.q.type == dtype::bf16 && dout_type == dtype::bf16 && p.D % 2 == 0 && p.Dv % 2 == 0 &&
                lanes_for(p, kt) == kt.lanes;
  // With bf16 dot products the fused pass multiplies all five products in bf16 pairs (dq =
  // scale · Σ dS K, dS rounded to bf16 in key pairs, as for dK).
  b.fused = p.B * p.Hkv >= kFusedMinUnits;
  // ATTN_CPU_BACKWARD=fused|two_pass forces a schedule (tests walk both; bisecting a wrong
  // gradient); read on every call, like ATTN_CPU_ISA.
  if (const char* e = std::getenv("ATTN_CPU_BACKWARD")) {
    if (std::strcmp(e, "fused") == 0) b.fused = true;
    if (std::strcmp(e, "two_pass") == 0) b.fused = false;
  }
  // The fused schedule has one task per (b, hkv): a mask gradient shared between them needs the
  // two passes, whose dk/dv tasks can group them.
  const dmask_sharing sh = shared_dmask(p, dmask);
  if (sh.b || sh.h) b.fused = false;
  // AMX tiles for either schedule (the amx level; other shapes keep f32 products there).
  b.amx = kt.dkdv_amx && kt.dq_amx && p.q.type == dtype::bf16 && dout_type == dtype::bf16 && p.D % 32 == 0 &&
          p.Dv % 32 == 0 && lanes_for(p, kt) == kt.lanes;
  return b;
}

// Σ_x a(x)·b(x) in float64 (sum8: the same order whatever the strides).
template <class A, class Bv>
double dot8(std::int64_t n, A a, Bv b) {
  return sum8(n, [&](std::int64_t x) { return a(x) * b(x); });
}

void backward(const problem& p, const backward_io& io) {
  const kernel_table& kt = select_kernels();
  const int nt = std::max(1, p.num_threads);
  const std::int64_t G = p.group(), L = lanes_for(p, kt), nlb = ceil_div(p.Nq * G, L);
  const backward_plan plan = plan_backward(p, kt, io.dout.type, io.dmask.data != nullptr);
  const bool amx = plan.amx, dp = plan.bf16_dots || amx, fused = plan.fused;
  const rows_f32 Q = dp ? rows_f32{} : as_rows(p.q, p.B, p.Hq, p.Nq, p.D, nt);
  const rows_f32 K = dp ? rows_f32{} : as_rows(p.k, p.B, p.Hkv, p.Nk, p.D, nt);
  const rows_f32 V = dp ? rows_f32{} : as_rows(p.v, p.B, p.Hkv, p.Nk, p.Dv, nt);
  const rows_f32 dO = dp ? rows_f32{} : as_rows(io.dout, p.B, p.Hq, p.Nq, p.Dv, nt);
  // (the packed K/V of the dq pass; the fused schedule has none)
  std::unique_ptr<bf16_pack> pack = dp && !fused ? std::make_unique<bf16_pack>(p, nt, true, true, true, false, amx) : nullptr;
  const float scale = float(p.scale);
  const bool skip = mask_may_skip(p, nt);
  // The two passes read each mask row more than once: its spans are found once (cpu/mask_fill.h).
  const mask_spans spans = find_mask_spans(p, nt);

  // Whether dq, dk, dv each had a row not seen finite where it was stored (store_lane_rows' bits;
  // backward_io::finite): the front scans only those.
  std::atomic<bool> unseen[3] = {false, false, false};
  const auto note = [&unseen](int which, std::uint64_t bad, std::int64_t rows) {
    if (rows > 64 || (bad & (rows == 64 ? ~std::uint64_t(0) : (std::uint64_t(1) << rows) - 1)))
      unseen[which].store(true, std::memory_order_relaxed);
  };

  // Δ_i = dout_i · out_i and the lse (+inf on fully masked rows, so p = e^{s - lse} = 0) of row
  // r = (b·Hq + h)·Nq + i. The fused schedule reads a row's only in the task of its (b, hkv) and
  // finds them there (without dsinks, which sum them all first): no parallel region of their own
  // (its wake and barrier cost a futex each under OMP_WAIT_POLICY=passive).
  const std::int64_t nrows = p.B * p.Hq * p.Nq;
  fbuf delta = alloc_floats(nrows), lse = alloc_floats(nrows);
  const auto dout_dot_out = [&](std::int64_t b, std::int64_t h, std::int64_t i) {
    double s = 0.0;
    const std::int64_t ox = io.out.sx;
    if (dp) {  // dout bf16; out read as what it is
      const std::uint16_t* d = io.dout.ptr<std::uint16_t>(b, h, i, 0);
      const std::int64_t dx = io.dout.sx;
      const auto dl = [d, dx](std::int64_t x) { return double(bf16_to_f32(d[x * dx])); };
      if (io.out.type == dtype::bf16) {
        const std::uint16_t* o = io.out.ptr<std::uint16_t>(b, h, i, 0);
        if (dx == 1 && ox == 1)
          s = kt.dot_f64(d, o, p.Dv, true);  // (dot8's sum, on this level's vectors)
        else
          s = dot8(p.Dv, dl, [o, ox](std::int64_t x) { return double(bf16_to_f32(o[x * ox])); });
      } else if (io.out.type == dtype::f32) {
        const float* o = io.out.ptr<float>(b, h, i, 0);
        s = dot8(p.Dv, dl, [o, ox](std::int64_t x) { return double(o[x * ox]); });
      } else {
        s = dot8(p.Dv, dl, [&](std::int64_t x) { return io.out.load(b, h, i, x); });
      }
    } else if (io.out.type == dtype::f32) {  // the same sum, out read as what it is
      const float* d = dO.row(b, h, i);
      const float* o = io.out.ptr<float>(b, h, i, 0);
      if (ox == 1)
        s = kt.dot_f64(d, o, p.Dv, false);
      else
        s = dot8(p.Dv, [d](std::int64_t x) { return double(d[x]); }, [o, ox](std::int64_t x) { return double(o[x * ox]); });
    } else {
      const float* d = dO.row(b, h, i);
      s = dot8(p.Dv, [d](std::int64_t x) { return double(d[x]); }, [&](std::int64_t x) { return io.out.load(b, h, i, x); });
    }
    return s;
  };
  // Rows [i0, i1) of head (b, h): no index arithmetic per row, the lse read as float32 where it is.
  const auto head_stats = [&](std::int64_t b, std::int64_t h, std::int64_t i0, std::int64_t i1) {
    const std::int64_t r0 = (b * p.Hq + h) * p.Nq;
    for (std::int64_t i = i0; i < i1; ++i) delta[r0 + i] = float(dout_dot_out(b, h, i));
    if (io.lse_type == dtype::f32) {
      const float* l = static_cast<const float*>(io.lse) + r0;
      for (std::int64_t i = i0; i < i1; ++i) lse[r0 + i] = l[i] == -kInfF ? kInfF : l[i];
    } else {
      for (std::int64_t i = i0; i < i1; ++i) {
        const double l = load_as_double(io.lse, io.lse_type, r0 + i);
        lse[r0 + i] = l == kNegInf ? kInfF : float(l);
      }
    }
  };
  const bool stats_in_task = fused && !io.dsinks;
  if (!stats_in_task) {  // heads in chunks of kStatRows rows
    constexpr std::int64_t kStatRows = 64;
    const std::int64_t nc = ceil_div(p.Nq, kStatRows);
#pragma omp parallel for num_threads(nt) schedule(static)
    for (std::int64_t u = 0; u < p.B * p.Hq * nc; ++u) {
      const denormals_flushed ftz;
      const std::int64_t c = u % nc, h = u / nc % p.Hq, b = u / nc / p.Hq;
      head_stats(b, h, c * kStatRows, std::min(p.Nq, (c + 1) * kStatRows));
    }
  }
  if (io.dsinks) {  // dsink_h = -Σ_{b,i} e^{sink_h - lse} Δ_i, in (b, i) order
#pragma omp parallel for num_threads(nt) schedule(static)
    for (std::int64_t h = 0; h < p.Hq; ++h) {
      double s = 0.0;
      for (std::int64_t b = 0; b < p.B; ++b)
        for (std::int64_t i = 0; i < p.Nq; ++i) {
          const std::int64_t r = (b * p.Hq + h) * p.Nq + i;
          if (lse[r] != kInfF) s += std::exp(p.sinks[h] - double(lse[r])) * double(delta[r]);
        }
      io.dsinks[h] -= s;
    }
  }

  // Pass 1: dq, lane layout over (b, hkv, lane block) (the fused schedule does it in pass 2).
  if (!fused) {
#pragma omp parallel num_threads(nt)
    {
      const denormals_flushed ftz;
      lane_setup ls(L, p.D);
      fbuf scratch = alloc_floats(lane_scratch_floats(L, p.D, p.Dv) + bf16_scratch_floats(L));
      fbuf dot = alloc_floats(p.Dv * L), dqt = alloc_floats(p.D * L), lv = alloc_floats(2 * L);
      float scales[kMaxLanes];  // dq = scale · Σ dS K, every lane
      std::fill(scales, scales + kMaxLanes, scale);
      words qp(dp ? std::size_t(p.D / 2 * L) : 0), dop(dp ? std::size_t(p.Dv / 2 * L) : 0);
      bias_ctx bc;
      bc.p = &p, bc.kt = &kt, bc.total = L, bc.h = ls.h.data(), bc.i = ls.i.data(), bc.spans = &spans;
      const score_params sp = make_score_params(p, &bc, dp ? scale : 1.0f, skip);
#pragma omp for schedule(dynamic, 1)
      for (std::int64_t u = 0; u < p.B * p.Hkv * nlb; ++u) {
        const std::int64_t lbi = nlb - 1 - u % nlb, hkv = u / nlb % p.Hkv, b = u / nlb / p.Hkv;
        ls.set(kt, p, dp ? nullptr : &Q, b, hkv, lbi);
        bc.b = b, bc.valid = ls.nl;
        for (std::int64_t x = 0; x < L; ++x) {
          const std::int64_t r = (b * p.Hq + ls.h[x]) * p.Nq + ls.i[x];
          const bool ok = x < ls.nl;
          lv[x] = ok ? lse[r] : kInfF;
          lv[L + x] = ok ? delta[r] : 0.0f;
        }
        if (!dp) {  // doutᵀ [Dv][L] (lanes past nl zero) from dout's unit-stride f32 rows
          const std::uint32_t* rows[kMaxLanes] = {};
          for (std::int64_t x = 0; x < ls.nl; ++x) rows[x] = reinterpret_cast<const std::uint32_t*>(dO.row(b, ls.h[x], ls.i[x]));
          kt.lane_words(rows, L, ls.nl, p.Dv, reinterpret_cast<std::uint32_t*>(dot.get()), L);
        }
        const lane_block lb = make_lane_block(p, ls, K, V, b, hkv, sp, scratch.get());
        const dq_io dio{dot.get(), lv.get(), lv.get() + L, dqt.get()};
        if (dp) {
          pack_lane_words(kt, p.q, b, ls, p.D, qp.data());
          pack_lane_words(kt, io.dout, b, ls, p.Dv, dop.data());
          const std::int64_t base = (b * p.Hkv + hkv) * pack->nk2;
          bf16_dq_operands op{qp.data(), dop.data(), bf16_pack::rows(pack->k, base, p.D), bf16_pack::rows(pack->v, base, p.Dv)};
          if (amx) {
            op.kt = pack->kt.data() + base / 2 * p.D, op.ldkt = pack->nk2 / 2;
            kt.dq_amx(lb, op, dio);
          } else {
            op.kpairs = pack->kp.data() + base / 2 * p.D;
            kt.dq_bf16(lb, op, dio);
          }
        } else {
          kt.dq(lb, dio);
        }
        note(0, cpu::store_lane_rows(kt, io.dq, b, ls.nl, p.D, dqt.get(), ls.L, scales, ls.row_of()), ls.nl);
      }
    }
  }

  // bf16 pass 2: q and dout rows as words [B·Hq][Nq][X/2] (read as uint16: the rows) and by
  // pairs of rows [B·Hq][ceil(Nq/2)][X], packed once for every key block (query blocks start on
  // even rows, so a block's pairs are the call's; the pair past an odd Nq is zero).
  // AMX (amx.h, dkdv_amx): the rows padded with zero rows to whole tiles of 16, and instead of
  // the pairs Qᵀ and dOᵀ in pairs of rows [B·Hq][D|Dv][nqt], zero to whole query blocks.
  const std::int64_t nqp = (p.Nq + 1) / 2, nqw = amx ? ceil_div(p.Nq, 16) * 16 : p.Nq;
  const std::int64_t qb = amx ? kAmxRowQueryBlock : kRowQueryBlock;
  const std::int64_t nqt = amx ? ceil_div(p.Nq, qb) * qb / 2 : 0;
  words Qw, DOw, Qp, DOp, Qt, DOt;
  if (dp) {  // (the rows and pairs in one parallel region)
    std::vector<word_pack> packs{{word_pack::rows, &p.q, p.B, p.Hq, p.Nq, p.D, nqw, &Qw},
                                 {word_pack::rows, &io.dout, p.B, p.Hq, p.Nq, p.Dv, nqw, &DOw}};
    if (!amx) {
      packs.push_back({word_pack::pairs, &p.q, p.B, p.Hq, p.Nq, p.D, nqp, &Qp});
      packs.push_back({word_pack::pairs, &io.dout, p.B, p.Hq, p.Nq, p.Dv, nqp, &DOp});
    }
    bf16_packs(packs, nt);
  }
  if (amx) {
    Qt = bf16_pair_words_t(p.q, p.B, p.Hq, p.Nq, p.D, nqt, nt);
    DOt = bf16_pair_words_t(io.dout, p.B, p.Hq, p.Nq, p.Dv, nqt, nt);
  }

  // Pass 2: dk, dv, row layout over (b, hkv, key block), every query row of every head of the
  // group. Fused: one task per (b, hkv) walks its key blocks in order and also accumulates
  // dq += dS·(scale·K) — a fixed order for every dq element, whatever the thread count — into
  // the f32 dq itself when its rows are whole vectors, else into a per-task buffer.
  const std::int64_t rkb = amx ? kAmxRowKeyBlock : kRowKeyBlock;
  const std::int64_t nkb = ceil_div(p.Nk, rkb);
  const std::int64_t ntask = p.B * p.Hkv * nkb;
  std::vector<double> dalibi_part(io.dalibi ? std::size_t(ntask * G) : 0, 0.0);
  const std::int64_t ldq = ceil_div(p.D, kt.W) * kt.W;
  const bool dq_direct = fused && io.dq.type == dtype::f32 && (io.dq.sx == 1 || p.D <= 1) && ldq == p.D;
  team_join join;
#pragma omp parallel num_threads(nt)
  {
    const denormals_flushed ftz;
    const std::int64_t ldk = ceil_div(rkb, kt.W) * kt.W;
    fbuf kvt = alloc_floats(2 * (p.D + p.Dv) * ldk + (fused ? rkb * ldq : 0));
    float *ktp = kvt.get(), *vtp = ktp + p.D * ldk, *dkt = vtp + p.Dv * ldk, *dvt = dkt + p.D * ldk;
    float* krows = dvt + p.Dv * ldk;  // fused, f32 keys not in place: [rkb][ldq] the key rows, zero-padded
    fbuf dqbuf;  // fused, dq not in place: one unit's dq rows [G][Nq][ldq], made by a thread's first unit
    // (so at most min(threads, units) of them: together no larger than dq in f32)
    fbuf scratch = alloc_floats(row_scratch_floats(qb, ldk));
    fbuf dsb = io.dmask.data ? alloc_floats(qb * ldk) : fbuf{};  // a pair's ds, for dmask
    std::vector<std::int32_t> lo(qb), hi(qb), pos(qb);
    std::vector<std::int64_t> hs(qb), is(qb);
    bias_ctx bc;
    bc.p = &p, bc.kt = &kt, bc.h = hs.data(), bc.i = is.data(), bc.spans = &spans;
    const score_params sp = make_score_params(p, &bc, scale, skip);
    // bf16: the key block's words, transposed.
    words ktw(dp ? std::size_t(p.D / 2 * ldk) : 0), vtw(dp ? std::size_t(p.Dv / 2 * ldk) : 0);
    // dq rows of head g of the group (fused): where they accumulate and their stride.
    auto dq_rows = [&](std::int64_t b, std::int64_t hkv, std::int64_t g, std::int64_t i) -> float* {
      return dq_direct ? io.dq.ptr<float>(b, hkv * G + g, i, 0) : dqbuf.get() + (g * p.Nq + i) * ldq;
    };
    const std::int64_t dqs = dq_direct ? io.dq.sn : ldq;
    // dKᵀ or dVᵀ [X][ld] of keys j0 … j0 + nb → their rows of t, times mul.
    auto store_key_rows = [&](const strided4& t, std::int64_t b, std::int64_t hkv, std::int64_t j0, std::int64_t nb,
                              std::int64_t X, const float* xt, std::int64_t ld, float mul) {
      float muls[kMaxKeyBlock];
      std::fill(muls, muls + nb, mul);
      return cpu::store_lane_rows(kt, t, b, nb, X, xt, ld, muls, [&](std::int64_t x) { return std::pair{hkv, j0 + x}; });
    };
    // Key block t = (b, hkv, kb) against every query row of the group.
    auto key_block = [&](std::int64_t t) {
      const std::int64_t kb = t % nkb, hkv = t / nkb % p.Hkv, b = t / nkb / p.Hkv;
      const std::int64_t j0 = kb * rkb, nb = std::min(rkb, p.Nk - j0);
      const std::int64_t ld = ceil_div(nb, amx ? 32 : kt.W) * (amx ? 32 : kt.W);  // (AMX: whole tiles of keys)
      if (fused && dp) {  // the block's keys by pairs, unscaled (dq is scaled when stored)
        auto* krw = reinterpret_cast<std::uint32_t*>(krows);
        std::fill(krw, krw + ld / 2 * ldq, 0u);
        for (std::int64_t x = 0; x < nb; ++x) {
          const std::uint16_t* k = p.k.ptr<std::uint16_t>(b, hkv, j0 + x, 0);
          std::uint32_t* w = krw + x / 2 * ldq;
          const int shift = 16 * int(x % 2);
          if (p.k.sx == 1)  // (a loop the compiler vectorises)
            for (std::int64_t d = 0; d < p.D; ++d) w[d] |= std::uint32_t(k[d]) << shift;
          else
            for (std::int64_t d = 0; d < p.D; ++d) w[d] |= std::uint32_t(k[d * p.k.sx]) << shift;
        }
      } else if (fused && ldq != p.D) {  // (else the unit-stride key rows are read in place)
        for (std::int64_t x = 0; x < nb; ++x) {
          const float* k = K.row(b, hkv, j0 + x);
          float* r = krows + x * ldq;
          std::copy(k, k + p.D, r);
          std::fill(r + p.D, r + ldq, 0.0f);
        }
      }
      if (dp) {  // word (d/2, x) = (row x's d, d + 1), zero past nb
        const auto transpose = [&](const strided4& t, std::int64_t X, std::uint32_t* out) {
          if (t.sx == 1 || X <= 1) {  // rows of words on 4-byte boundaries: the W × W register transposes
            const std::uint32_t* rows[kMaxKeyBlock] = {};
            bool aligned = true;
            for (std::int64_t x = 0; x < nb && aligned; ++x) {
              const std::uint16_t* r = t.ptr<std::uint16_t>(b, hkv, j0 + x, 0);
              aligned = reinterpret_cast<std::uintptr_t>(r) % 4 == 0;
              rows[x] = reinterpret_cast<const std::uint32_t*>(r);
            }
            if (aligned) return kt.lane_words(rows, ld, nb, X / 2, out, ld);
          }
          for (std::int64_t x = 0; x < ld; ++x) {
            if (x >= nb) {
              for (std::int64_t d = 0; d < X; d += 2) out[d / 2 * ld + x] = 0;
              continue;
            }
            const std::uint16_t* r = t.ptr<std::uint16_t>(b, hkv, j0 + x, 0);
            for (std::int64_t d = 0; d < X; d += 2) out[d / 2 * ld + x] = word(r[d * t.sx], r[(d + 1) * t.sx]);
          }
        };
        transpose(p.k, p.D, ktw.data());
        transpose(p.v, p.Dv, vtw.data());
      } else {
        // Kᵀ and Vᵀ of the block [d][ld], columns past nb zero: rows_f32 rows are unit-stride, so
        // the W × W register transposes of lane_words (a float is a word).
        const auto transpose = [&](const rows_f32& t, std::int64_t X, float* out) {
          const std::uint32_t* rows[kMaxKeyBlock] = {};
          for (std::int64_t x = 0; x < nb; ++x) rows[x] = reinterpret_cast<const std::uint32_t*>(t.row(b, hkv, j0 + x));
          kt.lane_words(rows, ld, nb, X, reinterpret_cast<std::uint32_t*>(out), ld);
        };
        transpose(K, p.D, ktp);
        transpose(V, p.Dv, vtp);
      }
      std::fill(dkt, dkt + p.D * ld, 0.0f);
      std::fill(dvt, dvt + p.Dv * ld, 0.0f);
      for (std::int64_t g = 0; g < G; ++g) {
        const std::int64_t h = hkv * G + g;
        for (std::int64_t i0 = 0; i0 < p.Nq; i0 += qb) {
          const std::int64_t nq = std::min(qb, p.Nq - i0);
          bool any = false;
          for (std::int64_t r = 0; r < nq; ++r) {
            const auto [a, e] = p.key_range(b, i0 + r);
            lo[r] = std::int32_t(a), hi[r] = std::int32_t(e), pos[r] = std::int32_t(p.query_pos(b, i0 + r));
            hs[r] = h, is[r] = i0 + r;
            any |= a < e && a < j0 + nb && e > j0;
          }
          if (!any) continue;
          bc.b = b, bc.valid = bc.total = nq;
          dkdv_pair pr;
          pr.nq = nq, pr.nb = nb, pr.ldk = ld, pr.D = p.D, pr.Dv = p.Dv, pr.j0 = j0;
          if (!dp) pr.q = Q.row(b, h, i0), pr.qsn = Q.sn, pr.dout = dO.row(b, h, i0), pr.dsn = dO.sn;
          const std::int64_t r0 = (b * p.Hq + h) * p.Nq + i0;
          pr.lse = lse.get() + r0, pr.delta = delta.get() + r0;
          pr.lo = lo.data(), pr.hi = hi.data(), pr.pos = pos.data();
          pr.slope = p.alibi.empty() ? 0.0f : float(p.alibi[b * p.Hq + h]);
          pr.kt = ktp, pr.vt = vtp, pr.dkt = dkt, pr.dvt = dvt;
          pr.sp = sp;
          pr.dalibi = io.dalibi ? &dalibi_part[std::size_t(t * G + g)] : nullptr;
          pr.scratch = scratch.get();
          if (fused) {
            const bool in_place = !dp && ldq == p.D;
            pr.krows = in_place ? K.row(b, hkv, j0) : krows, pr.krs = in_place ? K.sn : ldq;
            pr.krw = reinterpret_cast<const std::uint32_t*>(krows), pr.dq = dq_rows(b, hkv, g, i0), pr.ldq = ldq, pr.dqs = dqs;
          }
          pr.ds_out = dsb.get();
          if (!dp) {
            kt.dkdv(pr);
          } else {
            const std::int64_t bh = b * p.Hq + h;
            const auto* q16 = reinterpret_cast<const std::uint16_t*>(Qw.data() + (bh * nqw + i0) * (p.D / 2));
            const auto* do16 = reinterpret_cast<const std::uint16_t*>(DOw.data() + (bh * nqw + i0) * (p.Dv / 2));
            if (amx) {
              bf16_dkdv_operands op{q16, do16, nullptr, nullptr, ktw.data(), vtw.data()};
              op.qt = Qt.data() + bh * p.D * nqt + i0 / 2, op.dot = DOt.data() + bh * p.Dv * nqt + i0 / 2, op.ldt = nqt;
              kt.dkdv_amx(pr, op);
            } else {
              kt.dkdv_bf16(pr, bf16_dkdv_operands{q16, do16, Qp.data() + (bh * nqp + i0 / 2) * p.D,
                                                  DOp.data() + (bh * nqp + i0 / 2) * p.Dv, ktw.data(), vtw.data()});
            }
          }
          // dmask += ds where the mask's element is (one task writes each, in order); keys past a
          // short mask have none (their ds is 0: they are excluded).
          const std::int64_t nm = std::clamp<std::int64_t>(p.mask_cols - j0, 0, nb);
          if (io.dmask.data && nm > 0) {
            for (std::int64_t r = 0; r < nq; ++r) {
              const std::int64_t base = io.dmask.offset(b, h, i0 + r, j0), sx = io.dmask.sx;
              const float* d = dsb.get() + r * ld;
              if (io.dmask.type == dtype::f32) {  // one term per element (the front's choice)
                float* dm = static_cast<float*>(io.dmask.data) + base;
                for (std::int64_t x = 0; x < nm; ++x) dm[x * sx] += d[x];
              } else {
                double* dm = static_cast<double*>(io.dmask.data) + base;
                for (std::int64_t x = 0; x < nm; ++x) dm[x * sx] += double(d[x]);
              }
            }
          }
        }
      }
      note(1, store_key_rows(io.dk, b, hkv, j0, nb, p.D, dkt, ld, scale), nb);
      note(2, store_key_rows(io.dv, b, hkv, j0, nb, p.Dv, dvt, ld, 1.0f), nb);
    };
    if (!fused) {
      // Tasks t = (b·Hkv + hkv)·nkb + kb; the (b, hkv) that share a mask gradient's elements run
      // in one task, b then hkv in order (the same sums for any thread count).
      const dmask_sharing sh = shared_dmask(p, io.dmask.data != nullptr);
      const std::int64_t gb = sh.b ? p.B : 1, gh = sh.h ? p.Hkv : 1;
#pragma omp for schedule(dynamic, 1) nowait
      for (std::int64_t o = 0; o < ntask / (gb * gh); ++o) {
        // o over (b', hkv', kb) of the dims not shared
        const std::int64_t kb = o % nkb, hkv0 = sh.h ? 0 : o / nkb % p.Hkv, b0 = sh.b ? 0 : o / nkb / (sh.h ? 1 : p.Hkv);
        for (std::int64_t bb = 0; bb < gb; ++bb)
          for (std::int64_t hh = 0; hh < gh; ++hh) key_block(((b0 + bb) * p.Hkv + hkv0 + hh) * nkb + kb);
      }
    } else {
#pragma omp for schedule(dynamic, 1) nowait
      for (std::int64_t u = 0; u < p.B * p.Hkv; ++u) {
        const std::int64_t hkv = u % p.Hkv, b = u / p.Hkv;
        if (stats_in_task)  // the rows of the group's heads
          for (std::int64_t g = 0; g < G; ++g) head_stats(b, hkv * G + g, 0, p.Nq);
        if (!dq_direct && !dqbuf) dqbuf = alloc_floats(G * p.Nq * ldq);
        for (std::int64_t g = 0; g < G; ++g)
          for (std::int64_t i = 0; i < p.Nq; ++i) std::fill(dq_rows(b, hkv, g, i), dq_rows(b, hkv, g, i) + p.D, 0.0f);
        for (std::int64_t kb = 0; kb < nkb; ++kb) key_block(u * nkb + kb);
        int bad = 0;  // (dq = scale · Σ dS K)  // a non-finite element in dq rows accumulated in place (converted ones: not looked at)
        for (std::int64_t g = 0; g < G; ++g)
          for (std::int64_t i = 0; i < p.Nq; ++i) {
            float* r = dq_rows(b, hkv, g, i);
            if (!dq_direct) {
              cpu::store_row(io.dq, b, hkv * G + g, i, p.D, r, 1, scale);
              continue;
            }
            for (std::int64_t d = 0; d < p.D; ++d) r[d] *= scale;
            for (std::int64_t d = 0; d < p.D; ++d) bad |= !(r[d] * 0.0f == 0.0f);  // NaN and ±inf give NaN
          }
        if (bad || !dq_direct) unseen[0].store(true, std::memory_order_relaxed);
      }
    }
    join.arrive();
  }
  if (io.dalibi) {
    for (std::int64_t b = 0; b < p.B; ++b)
      for (std::int64_t h = 0; h < p.Hq; ++h)
        for (std::int64_t kb = 0; kb < nkb; ++kb)
          io.dalibi[b * p.Hq + h] += dalibi_part[std::size_t(((b * p.Hkv + h / G) * nkb + kb) * G + h % G)];
  }
  if (io.finite)
    for (int x = 0; x < 3; ++x) io.finite[x] = !unseen[x].load();
}

// ---- eligibility ----

constexpr std::int64_t kMaxLen = std::int64_t(1) << 30;  // positions are int32 in the kernels

std::string why_not_common(const problem& p) {
  if (p.q.type == dtype::f64) return "cpu: float64 inputs need the reference";
  if (p.Nq >= kMaxLen || p.Nk >= kMaxLen || p.past_len >= kMaxLen) return "cpu: sequences of 2^30 or more need the reference";
  return {};
}

std::string why_not(const problem& p, const backend_request& req) {
  if (decode_only(p)) {
    if (req.backward || req.qk != qk_output::none) return "cpu: paged or int8 K/V are read by the forward alone";
    const auto in_place = [](const strided4& t, std::int64_t X) {
      return (t.type == dtype::f32 || t.type == dtype::bf16 || t.type == dtype::i8) && (t.sx == 1 || X <= 1);
    };
    if (!in_place(p.k, p.D) || !in_place(p.v, p.Dv) || p.k.type != p.v.type)
      return "cpu: paged or int8 K/V are read in place: float32, bfloat16 or int8 rows with unit x-stride";
    if (p.k.type == dtype::i8 && (p.k_scale.data == nullptr || p.v_scale.data == nullptr))
      return "cpu: int8 K/V need their scales";
  }

  return why_not_common(p);
}

// How decode reads int8 K/V rows, in words: with q and the weights as int16 (int8_decode_int16,
// kernels.h; a non-finite q, known only when the kernel runs, keeps the widened rows), or
// widened to bf16 or f32.
const char* int8_decode_words(const problem& p, const kernel_table& kt, const forward_plan& fp) {
  if (int8_decode_int16(kt.int16_decode, fp.int8_rounding, kt.W, p.D, p.Dv)) {
    if (p.k_blocked && kt.W == 16)
      return fp.int8_bytes ? ", int8 K/V read in place, blocked keys, q and weights as 8-bit (byte dot products)"
                           : ", int8 K/V read in place, blocked keys (byte dot products with 14-bit q), weights as int16";
    return fp.int8_bytes && kt.W == 16 ? ", int8 K/V read in place, q as int16 (int16 dot products), weights as 8-bit (byte dot products)"
                                       : ", int8 K/V read in place, q and weights as int16 (int16 dot products)";
  }
  return p.k_blocked ? ", int8 K/V dequantised, blocked keys copied as rows" : ", int8 K/V dequantised in place";
}

// What forward() / backward() will do for this problem, in words (explain_backend).
std::string describe(const problem& p, const backend_request& req) {
  const kernel_table& kt = select_kernels();
  const forward_plan fp = plan_forward(p, kt);
  const char* type = p.q.type == dtype::bf16 ? "bf16" : p.q.type == dtype::f16 ? "f16 as f32" : "f32";
  std::string s = fmt::format("{} kernels, ", kt.name);
  if (req.backward) {
    const backward_plan bp = plan_backward(p, kt, p.q.type, req.dmask);  // dout's dtype is not known here: assume q's
    s += fmt::format("{} backward, {}{}", bp.fused ? "fused (dq, dk, dv in one pass)" : "two-pass (dq, then dk/dv)", type,
                     bp.amx         ? " with bf16 dot products on AMX tiles when dout is bf16"
                     : bp.bf16_dots ? " with bf16 dot products when dout is bf16"
                                    : "");
  }
  else if (fp.lanes == kt.lanes_small)
    s += fmt::format("decode ({} rows per pass{}), {}{}{}{}", fp.lanes, fp.nchunk > 1 ? fmt::format(", split-KV in {} chunks", fp.nchunk) : "",
                     type, fp.k8 ? int8_decode_words(p, kt, fp) : fp.k16 || fp.paged ? ", K/V read in place" : "",
                     fp.paged ? ", paged" : "", fp.heads > 1 ? fmt::format(", {} kv heads per task", fp.heads) : std::string());
  else
    s += fmt::format("prefill{}, {}{}", fp.nchunk > 1 ? fmt::format(", split-KV in {} chunks", fp.nchunk) : "", type,
                     fp.amx ? " with bf16 dot products on AMX tiles" : fp.bf16_dots ? " with bf16 dot products" : "");
  return s;
}

}  // namespace

max_abs_bits_fn cpu_max_abs_bits() { return cpu::select_kernels().max_abs_bits; }

const backend_impl& cpu_backend() {
  static const backend_impl impl{backend::cpu, why_not, describe, forward, backward};
  return impl;
}

}  // namespace attn::detail

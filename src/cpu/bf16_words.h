// src/cpu/bf16_words.h — bfloat16 views [B, H, N, X] (any strides) packed into the 32-bit words
// the bf16 dot-product kernels take (vdpbf16ps multiplies pairs), and the finiteness checks of
// views the drivers need; one copy for the core op's driver (cpu_backend.cc) and the family's
// (fused.cc, front.cc).
// Built for baseline x86-64 (bf16_words.cc), threaded with OpenMP over rows; the transposed
// pairs take the kernels' register transposes (select_kernels().lane_words) at unit stride.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/problem.h"
#include "cpu/buffers.h"

namespace attn::detail::cpu {

// Pairs along a row: [B·H][Np][X/2] words, word w of row n = s[n][2w] | s[n][2w + 1] << 16
// (the bits of rows [N, Np) zero). X even. Read as uint16 this is the rows [Np][X] themselves.
words bf16_row_words(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                     std::int64_t Np, int nt);

// bf16_row_words' rows where they may be read in place: row n of (b, h) at head[b·H + h] +
// n·step[b·H + h] words. The view's own bytes (no copy) when it has unit stride, even strides,
// rows aligned to `align` bytes (a power of two >= 4: 64 for AMX tiles, which load a row that
// straddles two cache lines at a third of the speed) and, per (b, h), its `pad` rows past N
// inside the view's extent — the span from its lowest to its highest element, all of one
// allocation; read, never zero (the kernels give rows past N no weight). The other heads (as a
// rule the last one, whose rows past N would leave the tensor) are copied with `pad` zero rows
// into `copies`; every head is, where the view is not fit to be read in place.
struct word_rows {
  std::vector<const std::uint32_t*> head;
  std::vector<std::int64_t> step;
  words copies;
};
word_rows bf16_rows_in_place(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                             std::int64_t pad, std::int64_t align, int nt);

// Pairs across two rows (keys j, j + 1): [B·H][Npairs][X] words, word (j', x) =
// s[2j'][x] | s[2j' + 1][x] << 16 (rows at or past N zero). Npairs >= ceil(N / 2).
// finite (the two packs below): set to whether every value is finite, seen as the words are
// formed (one pass over the view where a check first took two).
words bf16_pair_words(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                      std::int64_t Npairs, int nt, bool* finite = nullptr);

// The same pairs transposed: [B·H][X][Npairs] words, word (x, j') = s[2j'][x] | s[2j' + 1][x] << 16
// (rows at or past N zero) — each column's keys in pairs, as the AMX forward's Vᵀ (amx.h).
words bf16_pair_words_t(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                        std::int64_t Npairs, int nt, bool* finite = nullptr);

// One pack for bf16_packs: the layout of bf16_row_words (rows, np = Np rows a head) or of
// bf16_pair_words (pairs, np = Npairs; finite as there) of the view s [B, H, N, X], into *out.
struct word_pack {
  enum layout { rows, pairs } kind;
  const strided4* s;
  std::int64_t B, H, N, X, np;
  words* out;
  bool* finite = nullptr;
};
// Every pack of `packs` (the same words as the functions above, one by one) in one parallel
// region: each region wakes the threads, a futex each under OMP_WAIT_POLICY=passive — ≈ 37 µs
// on the 2-core virtual machines of docs/PERFORMANCE.md (four packs: 3 % of a bf16 backward at
// H16 N512 D64).
void bf16_packs(std::span<const word_pack> packs, int nt);

// Every element of the bfloat16 view finite (exponent bits not all ones).
bool bf16_all_finite(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int nt);
// The same for a view of any float dtype (float16, bfloat16, float32, float64).
bool view_all_finite(const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X, int nt);

}  // namespace attn::detail::cpu

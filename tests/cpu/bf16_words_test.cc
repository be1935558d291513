// tests/cpu/bf16_words_test.cc — the bf16 word packs and checks the cpu drivers share
// (src/cpu/bf16_words.h): rows read in place where a view allows it and copied where it does
// not, and the finiteness check over every position and stride.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cpu/bf16_words.h"

namespace attn::detail::cpu {
namespace {

struct free_bytes {
  void operator()(void* p) const { std::free(p); }
};

// n bf16 values, 64-byte aligned, from `first` on (first = 1 misaligns every row by 2 bytes).
struct bf16_buffer {
  std::unique_ptr<void, free_bytes> mem;
  std::uint16_t* v = nullptr;
  bf16_buffer(std::int64_t n, std::int64_t first, std::mt19937& rng) {
    mem.reset(std::aligned_alloc(64, std::size_t((n + first) * 2 + 63) / 64 * 64));
    v = static_cast<std::uint16_t*>(mem.get()) + first;
    std::uniform_int_distribution<int> bits(0, 0x3f7f);  // finite bf16 of either sign
    for (std::int64_t i = 0; i < n; ++i) v[i] = std::uint16_t(bits(rng) | (i % 3 == 0 ? 0x8000 : 0));
  }
};

// Every row n < N of every (b, h) as the view holds it, rows [N, N + pad) zero where copied.
void expect_rows(const word_rows& r, const strided4& s, std::int64_t B, std::int64_t H, std::int64_t N, std::int64_t X,
                 std::int64_t pad) {
  ASSERT_EQ(r.head.size(), std::size_t(B * H));
  for (std::int64_t bh = 0; bh < B * H; ++bh) {
    const std::uint32_t* head = r.head[std::size_t(bh)];
    const std::int64_t step = r.step[std::size_t(bh)];
    const bool copied = head >= r.copies.data() && head < r.copies.data() + r.copies.size();
    for (std::int64_t n = 0; n < N + (copied ? pad : 0); ++n)
      for (std::int64_t w = 0; w < X / 2; ++w) {
        const std::uint32_t want = n < N ? std::uint32_t(*s.ptr<std::uint16_t>(bh / H, bh % H, n, 2 * w)) |
                                               std::uint32_t(*s.ptr<std::uint16_t>(bh / H, bh % H, n, 2 * w + 1)) << 16
                                         : 0u;
        ASSERT_EQ(head[n * step + w], want) << "head " << bh << " row " << n << " word " << w;
      }
  }
}

// A contiguous [B, H, N, X] tensor is read in place but for its last head, whose rows past N
// would leave it: that one is copied with zero rows after.
TEST(Bf16Words, ContiguousRowsInPlaceButTheLastHead) {
  std::mt19937 rng(5);
  const std::int64_t B = 2, H = 3, N = 37, X = 64, pad = 32;
  const bf16_buffer buf(B * H * N * X, 0, rng);
  const strided4 s{buf.v, dtype::bf16, H * N * X, N * X, X, 1};
  const word_rows r = bf16_rows_in_place(s, B, H, N, X, pad, 64, 2);
  for (std::int64_t bh = 0; bh + 1 < B * H; ++bh)
    EXPECT_EQ(static_cast<const void*>(r.head[std::size_t(bh)]), static_cast<const void*>(buf.v + bh * N * X)) << bh;
  EXPECT_EQ(r.copies.size(), std::size_t((N + pad) * X / 2));  // the last head alone
  EXPECT_EQ(r.head.back(), r.copies.data());
  expect_rows(r, s, B, H, N, X, pad);
  // Heads whose rows past N land in the next head's rows: in place with pad = N of them too.
  const word_rows one = bf16_rows_in_place(s, B, H, N, X, N, 64, 2);
  EXPECT_EQ(static_cast<const void*>(one.head[0]), static_cast<const void*>(buf.v));
  expect_rows(one, s, B, H, N, X, N);
}

// A view with rows of a larger tensor (row stride past X, sliced heads) is read in place
// wherever its pad rows stay inside its own extent; a view without unit stride, with odd
// strides or with rows off the asked alignment is copied whole.
TEST(Bf16Words, ViewsCopiedWhereTheyCannotBeReadInPlace) {
  std::mt19937 rng(6);
  const std::int64_t B = 1, H = 4, N = 20, X = 32, pad = 3;
  const bf16_buffer wide(H * N * 2 * X, 0, rng);  // rows of 2X values: the view takes the first X
  const strided4 rows{wide.v, dtype::bf16, H * N * 2 * X, N * 2 * X, 2 * X, 1};
  const word_rows a = bf16_rows_in_place(rows, B, H, N, X, pad, 64, 1);
  EXPECT_EQ(static_cast<const void*>(a.head[0]), static_cast<const void*>(wide.v));
  EXPECT_EQ(a.step[0], X);  // the view's row stride, in words
  expect_rows(a, rows, B, H, N, X, pad);

  const strided4 every_other{wide.v, dtype::bf16, H * N * 2 * X, N * 2 * X, 2 * X, 2};  // sx = 2
  const word_rows b = bf16_rows_in_place(every_other, B, H, N, X, pad, 4, 2);
  EXPECT_EQ(b.copies.size(), std::size_t(B * H * (N + pad) * X / 2));
  expect_rows(b, every_other, B, H, N, X, pad);

  const bf16_buffer off(H * N * X + 64, 1, rng);  // 2 bytes past a cache line
  const strided4 shifted{off.v, dtype::bf16, H * N * X, N * X, X, 1};
  const word_rows c = bf16_rows_in_place(shifted, B, H, N, X, pad, 64, 2);
  EXPECT_EQ(c.copies.size(), std::size_t(B * H * (N + pad) * X / 2));
  expect_rows(c, shifted, B, H, N, X, pad);

  const strided4 odd{wide.v, dtype::bf16, H * N * 2 * X, N * 2 * X + 1, 2 * X, 1};  // an odd head stride
  const word_rows d = bf16_rows_in_place(odd, B, H, N, X, pad, 4, 1);
  EXPECT_EQ(d.copies.size(), std::size_t(B * H * (N + pad) * X / 2));
  expect_rows(d, odd, B, H, N, X, pad);

  const word_rows none = bf16_rows_in_place(rows, B, H, 0, X, pad, 4, 1);  // no rows: pad zero rows each
  EXPECT_EQ(none.copies.size(), std::size_t(B * H * pad * X / 2));
  for (const std::uint32_t w : none.copies) EXPECT_EQ(w, 0u);
}

// bf16_all_finite, and the finite flag of the two pair packs as they form their words, find
// one inf or NaN anywhere — each position of a row, either row of a pair, the odd last row,
// unit and wider strides (the packs' fast and plain paths) — and nothing in finite data (the
// largest finite exponent included); the words are the same with the flag asked or not.
TEST(Bf16Words, AllFiniteFindsEveryInfAndNaN) {
  std::mt19937 rng(7);
  const std::int64_t B = 2, H = 2, N = 41, X = 16;
  for (const std::int64_t sx : {1, 3}) {
    bf16_buffer buf(B * H * N * X * sx, 0, rng);
    const strided4 s{buf.v, dtype::bf16, H * N * X * sx, N * X * sx, X * sx, sx};
    buf.v[5] = 0x7f7f;  // the largest finite value
    const auto check = [&](bool want, const char* what) {
      SCOPED_TRACE(what);
      EXPECT_EQ(bf16_all_finite(s, B, H, N, X, 2), want);
      bool t = !want, p = !want;
      const words wt = bf16_pair_words_t(s, B, H, N, X, 32, 2, &t), wp = bf16_pair_words(s, B, H, N, X, 21, 2, &p);
      EXPECT_EQ(t, want);
      EXPECT_EQ(p, want);
      EXPECT_EQ(wt, bf16_pair_words_t(s, B, H, N, X, 32, 2));
      EXPECT_EQ(wp, bf16_pair_words(s, B, H, N, X, 21, 2));
    };
    check(true, "finite");
    for (const std::uint16_t special : {std::uint16_t(0x7f80), std::uint16_t(0xff80), std::uint16_t(0x7fc1)})
      for (const std::int64_t at : {std::int64_t(0), X - 1, 4 * X + 9, 5 * X + 2, (N - 1) * X + 3, B * H * N * X - 1}) {
        std::uint16_t* p = s.ptr<std::uint16_t>(0, 0, 0, 0) + (at / X) * s.sn + (at % X) * sx;
        const std::uint16_t keep = *p;
        *p = special;
        check(false, fmt::format("sx {} at {} bits {:#x}", sx, at, special).c_str());
        *p = keep;
      }
  }
}

}  // namespace
}  // namespace attn::detail::cpu

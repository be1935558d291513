// tests/linear/linear_test.cc — attn::linear: the float64 reference pinned by hand-computed
// values; the OpenBLAS path against the reference over shapes (0, 1, odd), layouts (transposed,
// sliced, broadcast, unmergeable leading dims) and dtypes; gradients against central finite
// differences; error messages.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "test_util.h"

namespace attn {
namespace {

using testing::all_close;
using testing::random_tensor;
using testing::reference_scope;

// The OpenBLAS path must be there, or every fast-vs-reference comparison below would compare
// the reference with itself.
TEST(Linear, OpenBlasIsLoaded) {
  const std::string info = linear_backend_info();
  EXPECT_EQ(info.find("not found"), std::string::npos) << info;
  EXPECT_NE(info.find("core"), std::string::npos) << info;
}

TEST(Linear, HandComputedValues) {
  // x [2, 3], W [2, 3], b [2]:  y = x Wᵀ + b
  const Tensor x = Tensor::from_values({2, 3}, dtype::f64, {1, 2, 3, 4, 5, 6});
  const Tensor W = Tensor::from_values({2, 3}, dtype::f64, {1, 0, -1, 0.5, 0.5, 0.5});
  const Tensor b = Tensor::from_values({2}, dtype::f64, {10, -1});
  const Tensor want = Tensor::from_values({2, 2}, dtype::f64, {1 - 3 + 10, 3 - 1, 4 - 6 + 10, 7.5 - 1});
  const Tensor dy = Tensor::from_values({2, 2}, dtype::f64, {1, 2, 3, 4});
  // dx = dy W, dW = dyᵀ x, db = Σ_rows dy
  const Tensor dx = Tensor::from_values({2, 3}, dtype::f64, {2, 1, 0, 5, 2, -1});
  const Tensor dW = Tensor::from_values({2, 3}, dtype::f64, {13, 17, 21, 18, 24, 30});
  const Tensor db = Tensor::from_values({2}, dtype::f64, {4, 6});
  for (bool ref : {false, true}) {
    std::optional<reference_scope> scope;
    if (ref) scope.emplace();
    EXPECT_TRUE(all_close(linear(x, W, b), want, 1e-12)) << "reference " << ref;
    const linear_grads g = linear_backward(x, W, dy, {.dx = true, .dW = true, .db = true});
    EXPECT_TRUE(all_close(g.dx, dx, 1e-12)) << "reference " << ref;
    EXPECT_TRUE(all_close(g.dW, dW, 1e-12)) << "reference " << ref;
    EXPECT_TRUE(all_close(g.db, db, 1e-12)) << "reference " << ref;
  }
}

// How x (and W) are laid out in memory.
enum class layout { contiguous, transposed, sliced, broadcast_rows, unmergeable };

const char* name_of(layout l) {
  switch (l) {
    case layout::contiguous: return "contiguous";
    case layout::transposed: return "transposed";
    case layout::sliced: return "sliced";
    case layout::broadcast_rows: return "broadcast_rows";
    case layout::unmergeable: return "unmergeable";
  }
  return "?";
}

// A view of shape `shape` ([..., last]) with layout `l`, filled with random values; `keep`
// holds the storage.
TensorView make_input(const Shape& shape, dtype t, layout l, std::mt19937& rng, Tensor& keep) {
  const int r = int(shape.size());
  switch (l) {
    case layout::contiguous:
      keep = random_tensor(shape, t, rng);
      return keep.view();
    case layout::transposed: {  // the last two dims stored swapped (column-major matrices)
      Shape s = shape;
      std::swap(s[r - 1], s[r - 2]);
      keep = random_tensor(s, t, rng);
      return keep.view().transpose(r - 1, r - 2);
    }
    case layout::sliced: {  // every other element of the last dim, rows padded
      Shape s = shape;
      s.back() = 2 * s.back() + 1;
      keep = random_tensor(s, t, rng);
      TensorView v = keep.view();
      return TensorView(v.data(), t, shape, [&] {
        Shape st = v.strides();
        st.back() = 2;
        return st;
      }());
    }
    case layout::broadcast_rows: {  // every row the same (stride 0 on the leading dims)
      keep = random_tensor({shape.back()}, t, rng);
      return keep.view().broadcast_to(shape);
    }
    case layout::unmergeable: {  // leading dims permuted: no single row stride covers them
      Shape s = shape;
      std::swap(s[0], s[1]);
      keep = random_tensor(s, t, rng);
      return keep.view().transpose(0, 1);
    }
  }
  return {};
}

struct sweep_case {
  Shape x;  // [..., K]
  std::int64_t N;
  layout lx, lw;
  bool bias;
};

std::vector<sweep_case> sweep() {
  std::vector<sweep_case> cases;
  const std::vector<Shape> xs = {{0, 5}, {1, 1}, {1, 7}, {3, 0}, {5, 3}, {17, 33}, {2, 9, 16}, {3, 5, 65}, {4, 1, 2, 8}};
  for (const Shape& x : xs)
    for (std::int64_t N : {0, 1, 6, 19})
      for (layout lx : {layout::contiguous, layout::transposed, layout::sliced, layout::broadcast_rows,
                        layout::unmergeable}) {
        if (lx == layout::unmergeable && x.size() < 3) continue;
        for (layout lw : {layout::contiguous, layout::transposed, layout::sliced})
          cases.push_back({x, N, lx, lw, (N + int(lx) + int(lw)) % 2 == 0});
      }
  return cases;
}

// Tolerance of the OpenBLAS path against the float64 reference for inner size K: f32/f64 sums of
// K products; f16/bf16 outputs additionally round once (both paths round, possibly to
// neighbouring values).
double tolerance(dtype t, std::int64_t K) {
  const double k = std::sqrt(double(std::max<std::int64_t>(K, 1)));
  switch (t) {
    case dtype::f64: return 1e-13 * k;
    case dtype::f32: return 1e-6 * k;
    case dtype::f16: return 2e-3 * k;
    default: return 1e-2 * k;  // bf16
  }
}

TEST(Linear, FastMatchesReferenceForwardAndBackward) {
  std::mt19937 rng(11);
  int compared = 0;
  for (dtype t : {dtype::f32, dtype::f64, dtype::bf16, dtype::f16})
    for (const sweep_case& c : sweep()) {
      const std::int64_t K = c.x.back();
      Tensor kx, kw, kb, kdy;
      const TensorView x = make_input(c.x, t, c.lx, rng, kx);
      const TensorView W = make_input({c.N, K}, t, c.lw, rng, kw);
      std::optional<TensorView> b;
      if (c.bias) b = (kb = random_tensor({c.N}, t, rng)).view();
      Shape yshape = c.x;
      yshape.back() = c.N;
      const TensorView dy = make_input(yshape, t, layout::contiguous, rng, kdy);
      const linear_needs all{.dx = true, .dW = true, .db = true};

      const Tensor y = linear(x, W, b);
      const linear_grads g = linear_backward(x, W, dy, all);
      Tensor y_ref;
      linear_grads g_ref;
      {
        reference_scope ref;
        y_ref = linear(x, W, b);
        g_ref = linear_backward(x, W, dy, all);
      }
      const std::string what = fmt::format("{} x {} ({}) W [{}, {}] ({}) bias {}", dtype_name(t), shape_str(c.x),
                                           name_of(c.lx), c.N, K, name_of(c.lw), c.bias);
      ASSERT_EQ(y.shape(), yshape) << what;
      EXPECT_TRUE(all_close(y, y_ref, tolerance(t, K))) << what << ": y";
      // dx sums N products, dW and db sum M (the rows of x) products.
      const std::int64_t M = x.numel() / std::max<std::int64_t>(K, 1);
      EXPECT_TRUE(all_close(g.dx, g_ref.dx, tolerance(t, c.N))) << what << ": dx";
      EXPECT_TRUE(all_close(g.dW, g_ref.dW, tolerance(t, M))) << what << ": dW";
      EXPECT_TRUE(all_close(g.db, g_ref.db, tolerance(t, M))) << what << ": db";
      ++compared;
    }
  EXPECT_GT(compared, 500);
}

// The reference rounds once from float64; the OpenBLAS f32 path must not stray from it by more
// than f32 accumulation allows, also at a size where BLAS blocks the product.
TEST(Linear, LargeProductF32) {
  std::mt19937 rng(3);
  const Tensor x = random_tensor({2, 150, 300}, dtype::f32, rng), W = random_tensor({257, 300}, dtype::f32, rng);
  const Tensor b = random_tensor({257}, dtype::f32, rng);
  const Tensor y = linear(x, W, b);
  reference_scope ref;
  EXPECT_TRUE(all_close(y, linear(x, W, b), tolerance(dtype::f32, 300)));
}

TEST(Linear, ExecutionPicksThePath) {
  std::mt19937 rng(6);
  const Tensor x = random_tensor({3, 5}, dtype::f32, rng), W = random_tensor({4, 5}, dtype::f32, rng);
  const Tensor want = [&] {
    reference_scope ref;
    return linear(x, W);
  }();
  const execution reference{.use_backend = backend::reference};
  EXPECT_TRUE(all_close(linear(x, W, std::nullopt, reference), want, 0.0));  // bitwise: the same loops
  EXPECT_TRUE(all_close(linear(x, W, std::nullopt, {.use_backend = backend::cpu}), want, tolerance(dtype::f32, 5)));
  EXPECT_TRUE(all_close(linear(x, W, std::nullopt, {.num_threads = 1}), want, tolerance(dtype::f32, 5)));
  EXPECT_THROW_MSG(linear(x, W, std::nullopt, {.num_threads = -1}), "linear: num_threads = -1 must be >= 0");
  setenv("ATTN_BACKEND", "gpu", 1);
  EXPECT_THROW_MSG(linear(x, W), "linear: ATTN_BACKEND = 'gpu' names no backend");
  unsetenv("ATTN_BACKEND");
}

TEST(Linear, OnlyRequestedGradients) {
  std::mt19937 rng(5);
  const Tensor x = random_tensor({4, 3}, dtype::f32, rng), W = random_tensor({2, 3}, dtype::f32, rng);
  const Tensor dy = random_tensor({4, 2}, dtype::f32, rng);
  const linear_grads g = linear_backward(x, W, dy, {.dx = false, .dW = true, .db = false});
  EXPECT_FALSE(g.dx.defined());
  EXPECT_TRUE(g.dW.defined());
  EXPECT_FALSE(g.db.defined());
  const linear_grads d = linear_backward(x, W, dy);  // default: dx and dW
  EXPECT_TRUE(d.dx.defined() && d.dW.defined());
  EXPECT_FALSE(d.db.defined());
}

// L = Σ y ∘ w; dL/dy = w. Both paths, float64, against central differences.
TEST(Linear, GradientsMatchFiniteDifferences) {
  std::mt19937 rng(9);
  for (bool ref : {false, true}) {
    std::optional<reference_scope> scope;
    if (ref) scope.emplace();
    const Tensor x = random_tensor({2, 3, 5}, dtype::f64, rng), W = random_tensor({4, 5}, dtype::f64, rng);
    const Tensor b = random_tensor({4}, dtype::f64, rng), w = random_tensor({2, 3, 4}, dtype::f64, rng);
    auto loss = [&] { return testing::weighted_sum(linear(x, W, b), w); };
    const linear_grads g = linear_backward(x, W, w, {.dx = true, .dW = true, .db = true});
    testing::expect_gradient("dx", x, g.dx, loss);
    testing::expect_gradient("dW", W, g.dW, loss);
    testing::expect_gradient("db", b, g.db, loss);
  }
}

TEST(Linear, ErrorsNameTheArgument) {
  std::mt19937 rng(1);
  const Tensor x = random_tensor({2, 4}, dtype::f32, rng), W = random_tensor({3, 4}, dtype::f32, rng);
  EXPECT_THROW_MSG(linear(x, random_tensor({3, 5}, dtype::f32, rng)),
                   "linear: W has shape [3, 5], expected [out, in] with in = 4 (the last dim of x [2, 4])");
  EXPECT_THROW_MSG(linear(x, random_tensor({4}, dtype::f32, rng)), "linear: W has shape [4], expected [out, in]");
  EXPECT_THROW_MSG(linear(x, random_tensor({3, 4}, dtype::f64, rng)), "linear: W has dtype float64, x has float32");
  EXPECT_THROW_MSG(linear(x, W, random_tensor({4}, dtype::f32, rng)),
                   "linear: b has shape [4], expected [out] = [3] (the first dim of W [3, 4])");
  EXPECT_THROW_MSG(linear(x, W, random_tensor({3}, dtype::bf16, rng)), "linear: b has dtype bfloat16, x has float32");
  EXPECT_THROW_MSG(linear(Tensor::zeros({2, 4}, dtype::i64), W), "linear: x has dtype int64, expected float32");
  EXPECT_THROW_MSG(linear(Tensor::zeros({}, dtype::f32), W), "linear: x has shape [], expected [..., in]");
  EXPECT_THROW_MSG(linear_backward(x, W, random_tensor({2, 4}, dtype::f32, rng)),
                   "linear_backward: dy has shape [2, 4], expected [2, 3] (the shape of y = x [2, 4] · Wᵀ, W [3, 4])");
  EXPECT_THROW_MSG(linear_backward(x, W, random_tensor({2, 3}, dtype::f16, rng)),
                   "linear_backward: dy has dtype float16, x has float32");
}

}  // namespace
}  // namespace attn

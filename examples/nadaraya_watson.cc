// examples/nadaraya_watson.cc — attention as kernel regression (literature 002, d2l §11.2):
// training data y = 2 sin(x) + x^0.8 + ε, ε ~ N(0, 0.5²), 50 points in [0, 5).
//
//   non-parametric   f(x) = Σ_i softmax_i(−(x − x_i)² / 2) y_i                 (w = 1 fixed)
//   parametric       f(x) = Σ_i softmax_i(−((x − x_i) w)² / 2) y_i             (w learned)
// Both are attn's family op with the gaussian score at bandwidth h = 1/w; the parametric one
// learns h by SGD on the training MSE through attention_family_backward (dbandwidth), each
// training point attending to the others (its own key masked out, or w would grow without
// bound and the fit would memorise the noise).
//
//   ./build/release/examples/example_nadaraya_watson [epochs] [max_test_mse] [png_dir]
// Prints both test losses and the learned w; exits 1 if the parametric test MSE exceeds
// max_test_mse or the non-parametric one, or the training loss did not fall (used as a test).
// Writes nadaraya_watson_weights.png (the learned kernel's weights, test × train points) and
// nadaraya_watson_fit.png (truth, training points and both fits) into png_dir (default ".").
#include <attn/attn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "pictures.h"

namespace {

using attn::Tensor;
constexpr std::int64_t N = 50;

double truth(double x) { return 2 * std::sin(x) + std::pow(x, 0.8); }

// f(queries) with train keys/values at bandwidth h; the mask (if any) hides keys.
attn::family_options kernel_options(double h, const std::optional<Tensor>& mask) {
  attn::family_options o;
  o.score.kind = attn::score_kind::gaussian;
  o.score.bandwidth = h;
  o.q_num_heads = o.kv_num_heads = 1;
  if (mask) o.attn_mask = *mask;
  return o;
}

double mse_of(const Tensor& pred, const Tensor& y) { return attn::nn::mse(pred, y).loss; }

std::vector<std::string> x_labels(const std::vector<double>& xs) {
  std::vector<std::string> out;
  for (double x : xs) out.push_back(std::to_string(x).substr(0, 4));  // "3.14"
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  const int epochs = argc > 1 ? std::atoi(argv[1]) : 20;
  const double max_test_mse = argc > 2 ? std::atof(argv[2]) : 1e9;
  attn::nn::rng gen(0);
  // x_train sorted in [0, 5); x_test a grid over the same range. Shapes [1, N, 1] (B, N, features).
  std::vector<double> xs(N);
  for (auto& x : xs) x = gen.uniform(0.0, 5.0);
  std::sort(xs.begin(), xs.end());
  std::vector<double> ys(N), xt(N), yt(N);
  for (std::int64_t i = 0; i < N; ++i) {
    ys[std::size_t(i)] = truth(xs[std::size_t(i)]) + gen.normal(0.0, 0.5);
    xt[std::size_t(i)] = 0.1 * double(i);
    yt[std::size_t(i)] = truth(xt[std::size_t(i)]);
  }
  const Tensor x_train = Tensor::from_values({1, N, 1}, attn::dtype::f64, xs);
  const Tensor y_train = Tensor::from_values({1, N, 1}, attn::dtype::f64, ys);
  const Tensor x_test = Tensor::from_values({1, N, 1}, attn::dtype::f64, xt);
  const Tensor y_test = Tensor::from_values({1, N, 1}, attn::dtype::f64, yt);
  std::vector<double> others(std::size_t(N * N), 1.0);  // leave-one-out: query i does not see key i
  for (std::int64_t i = 0; i < N; ++i) others[std::size_t(i * N + i)] = 0.0;
  const Tensor leave_one_out = Tensor::from_values({1, 1, N, N}, attn::dtype::boolean, others);

  const double base = mse_of(attn::attention_family(x_test, x_train, y_train, kernel_options(1.0, {})).out, y_test);
  std::printf("non-parametric (w = 1): test mse %.4f\n", base);

  // The parametric model: one learned scalar, h = 1/w, as a [1] parameter for nn::sgd.
  Tensor h = Tensor::from_values({1}, attn::dtype::f64, {1.0}), dh = Tensor::zeros({1}, attn::dtype::f64);
  const attn::nn::parameter_list params = {{"h", &h, &dh}};
  attn::nn::sgd opt{.lr = 0.5};
  double first = 0, last = 0;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    const attn::family_options o = kernel_options(h.get({0}), leave_one_out);
    const Tensor pred = attn::attention_family(x_train, x_train, y_train, o).out;
    const attn::nn::loss_result l = attn::nn::mse(pred, y_train);
    // pred = attention_family(x, x, y; h)  →  dL/dh
    const attn::family_grads g = attn::attention_family_backward(x_train, x_train, y_train, l.grad, o);
    attn::nn::zero_grad(params);
    dh.set({0}, g.dbandwidth);
    opt.step(params);
    if (epoch == 1) first = l.loss;
    last = l.loss;
    if (epoch == 1 || epoch % 5 == 0 || epoch == epochs)
      std::printf("epoch %3d  train mse %.4f  w = 1/h = %.3f\n", epoch, l.loss, 1.0 / h.get({0}));
  }
  const attn::family_options learned = kernel_options(h.get({0}), {});
  const Tensor fit = attn::attention_family(x_test, x_train, y_train, learned).out;
  const double test = mse_of(fit, y_test);
  std::printf("parametric (learned w = %.3f): test mse %.4f\n", 1.0 / h.get({0}), test);

  // Each test point's weights over the sorted training points: a band along the diagonal, as
  // narrow as the learned kernel.
  const pictures png(argc, argv, 3);
  const Tensor weights = attn::attention_family_weights(x_test, x_train, y_train, learned);  // [1, 1, N, N]
  char title[64];
  std::snprintf(title, sizeof title, "Nadaraya-Watson weights, w = %.2f", 1.0 / h.get({0}));
  png.heatmap("nadaraya_watson_weights.png", attn::viz::matrix_of(weights, 0, 0), x_labels(xt), x_labels(xs),
              {.title = title});
  const std::vector<double> base_fit =
      attn::attention_family(x_test, x_train, y_train, kernel_options(1.0, {})).out.to_vector();
  png.plot("nadaraya_watson_fit.png",
           {{"truth", xt, yt, {40, 40, 40}, true},
            {"training points", xs, ys, {120, 120, 220}, false},
            {"w = 1", xt, base_fit, {230, 150, 40}, true},
            {"learned w", xt, fit.to_vector(), {200, 30, 30}, true}},
           {.title = "y = 2 sin x + x^0.8: kernel regression"});
  if (!(last < first) || test > max_test_mse || !(test < base)) {
    std::printf("did not learn: train mse %.4f -> %.4f, test mse %.4f (max %.4f)\n", first, last, test, max_test_mse);
    return 1;
  }
  return 0;
}

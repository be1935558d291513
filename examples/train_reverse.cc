// examples/train_reverse.cc — trains a one-layer multi-head attention model, end to end with
// attn's forward and backward, to reverse sequences of digits: y_i = x_{N-1-i}.
//
//   h = E[x] + P            token embedding + learned position table   [B, N, C]
//   q, k, v = linear(h, Wq), linear(h, Wk), linear(h, Wv)               [B, N, H*Dh] (3-D layout)
//   o = attn::attention(q, k, v)  (H heads)                             [B, N, H*Dh]
//   logits = linear(o, Wo, bo); loss = mean cross-entropy               [B, N, V]
//
// The only way to solve the task is for query i to attend to key N-1-i, which the model must
// learn from the position table through W^Q and W^K. Prints the loss and the token accuracy on
// fresh batches; exits 1 if the final accuracy is below --min-accuracy (used as a test).
//
//   ./build/release/examples/example_train_reverse [steps] [min_accuracy]
#include <attn/attn.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

namespace {

constexpr int V = 10, N = 8, C = 32, H = 2, Dh = 16, HD = H * Dh, B = 32;

// A parameter tensor (f32) with its gradient and Adam moments.
struct param {
  attn::Tensor w, g;
  std::vector<float> m, v;
  param(attn::Shape shape, float scale, std::mt19937& rng)
      : w(attn::Tensor::zeros(shape, attn::dtype::f32)), g(attn::Tensor::zeros(shape, attn::dtype::f32)),
        m(std::size_t(w.numel())), v(std::size_t(w.numel())) {
    std::normal_distribution<float> d(0.0f, scale);
    float* p = w.data_as<float>();
    for (std::int64_t i = 0; i < w.numel(); ++i) p[i] = d(rng);
  }
  float* data() const { return w.data_as<float>(); }
  void accumulate(const attn::Tensor& d) {
    float* gp = g.data_as<float>();
    const float* dp = d.data_as<float>();
    for (std::int64_t i = 0; i < g.numel(); ++i) gp[i] += dp[i];
  }
  void adam(float lr, int t) {
    const float b1 = 0.9f, b2 = 0.999f, c1 = 1 - std::pow(b1, float(t)), c2 = 1 - std::pow(b2, float(t));
    float* wp = w.data_as<float>();
    float* gp = g.data_as<float>();
    for (std::size_t i = 0; i < m.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * gp[i];
      v[i] = b2 * v[i] + (1 - b2) * gp[i] * gp[i];
      wp[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + 1e-8f);
      gp[i] = 0;
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 600;
  const double min_accuracy = argc > 2 ? std::atof(argv[2]) : 0.0;
  std::mt19937 rng(7);
  // Projection weights are [out, in], as attn::linear takes them.
  param E({V, C}, 0.5f, rng), P({N, C}, 0.5f, rng), Wq({HD, C}, 0.2f, rng), Wk({HD, C}, 0.2f, rng),
      Wv({HD, C}, 0.2f, rng), Wo({V, HD}, 0.2f, rng), bo({V}, 0.0f, rng);
  attn::attention_options opt;
  opt.q_num_heads = H, opt.kv_num_heads = H;
  std::uniform_int_distribution<int> digit(0, V - 1);
  double accuracy = 0;

  for (int step = 1; step <= steps; ++step) {
    std::vector<int> x(B * N), y(B * N);
    for (int b = 0; b < B; ++b)
      for (int n = 0; n < N; ++n) x[b * N + n] = digit(rng);
    for (int b = 0; b < B; ++b)
      for (int n = 0; n < N; ++n) y[b * N + n] = x[b * N + (N - 1 - n)];

    // ---- forward ----
    const attn::Tensor pos = attn::learned_position_encoding(P.w, N);  // [N, C]
    const attn::Tensor h = attn::Tensor::empty({B, N, C}, attn::dtype::f32);
    float* hp = h.data_as<float>();
    for (int r = 0; r < B * N; ++r)
      for (int c = 0; c < C; ++c) hp[r * C + c] = E.data()[x[r] * C + c] + pos.data_as<float>()[(r % N) * C + c];
    const attn::Tensor q = attn::linear(h, Wq.w), k = attn::linear(h, Wk.w), v = attn::linear(h, Wv.w);  // [B, N, HD]
    const attn::attention_result r = attn::attention(q, k, v, opt);
    const attn::Tensor logits = attn::linear(r.out, Wo.w, bo.w);  // [B, N, V]
    double loss = 0;
    int correct = 0;
    const attn::Tensor dlogits = attn::Tensor::empty({B, N, V}, attn::dtype::f32);
    for (int row = 0; row < B * N; ++row) {
      const float* l = logits.data_as<float>() + row * V;
      int arg = 0;
      float mx = -INFINITY;
      for (int c = 0; c < V; ++c)
        if (l[c] > mx) mx = l[c], arg = c;
      double z = 0;
      for (int c = 0; c < V; ++c) z += std::exp(double(l[c] - mx));
      loss += -(double(l[y[row]] - mx) - std::log(z));
      correct += arg == y[row];
      for (int c = 0; c < V; ++c)
        dlogits.data_as<float>()[row * V + c] = float((std::exp(double(l[c] - mx)) / z - (c == y[row])) / (B * N));
    }
    accuracy = double(correct) / (B * N);
    if (step == 1 || step % 100 == 0 || step == steps)
      std::printf("step %4d  loss %.4f  accuracy %.3f\n", step, loss / (B * N), accuracy);
    if (step == steps) break;  // the last batch only measures

    // ---- backward ----  (each line quotes the forward line it differentiates)
    // logits = linear(o, Wo, bo)
    const attn::linear_grads go = attn::linear_backward(r.out, Wo.w, dlogits, {.dx = true, .dW = true, .db = true});
    Wo.accumulate(go.dW);
    bo.accumulate(go.db);
    // o = attention(q, k, v)
    const attn::attention_grads g = attn::attention_backward(q, k, v, r.out, go.dx, r.lse, opt);
    // q, k, v = linear(h, Wq), linear(h, Wk), linear(h, Wv)
    const attn::Tensor dh = attn::Tensor::zeros({B, N, C}, attn::dtype::f32);
    for (auto [dp, W] : {std::pair{&g.dq, &Wq}, {&g.dk, &Wk}, {&g.dv, &Wv}}) {
      const attn::linear_grads gl = attn::linear_backward(h, W->w, *dp);
      W->accumulate(gl.dW);
      for (int i = 0; i < B * N * C; ++i) dh.data_as<float>()[i] += gl.dx.data_as<float>()[i];
    }
    // h = E[x] + P
    for (int row = 0; row < B * N; ++row)
      for (int c = 0; c < C; ++c) E.g.data_as<float>()[x[row] * C + c] += dh.data_as<float>()[row * C + c];
    P.accumulate(attn::learned_position_encoding_backward(dh, N));

    for (param* p : {&E, &P, &Wq, &Wk, &Wv, &Wo, &bo}) p->adam(3e-3f, step);
  }
  if (accuracy < min_accuracy) {
    std::printf("accuracy %.3f is below the required %.3f\n", accuracy, min_accuracy);
    return 1;
  }
  return 0;
}

// examples/train_reverse.cc — trains a one-layer multi-head attention model, end to end with
// attn's forward and backward, to reverse sequences of digits: y_i = x_{N-1-i}.
//
//   h = E[x] + P            token embedding + learned position table   [B, N, C]
//   q, k, v = h Wq, h Wk, h Wv                                          [B, N, H*Dh] (3-D layout)
//   o = attn::attention(q, k, v)  (H heads)                             [B, N, H*Dh]
//   logits = o Wo + bo; loss = mean cross-entropy                       [B, N, V]
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

using vec = std::vector<float>;

// y[M, Nc] = x[M, K] · w[K, Nc] (+ y when accumulate)
void matmul(const float* x, const float* w, float* y, int M, int K, int Nc, bool accumulate = false) {
  for (int m = 0; m < M; ++m) {
    float* yr = y + m * Nc;
    if (!accumulate)
      for (int n = 0; n < Nc; ++n) yr[n] = 0;
    for (int k = 0; k < K; ++k) {
      const float a = x[m * K + k];
      const float* wr = w + k * Nc;
      for (int n = 0; n < Nc; ++n) yr[n] += a * wr[n];
    }
  }
}
// dw[K, Nc] += xᵀ[K, M] · dy[M, Nc]
void matmul_tn(const float* x, const float* dy, float* dw, int M, int K, int Nc) {
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) {
      const float a = x[m * K + k];
      for (int n = 0; n < Nc; ++n) dw[k * Nc + n] += a * dy[m * Nc + n];
    }
}
// dx[M, K] (+)= dy[M, Nc] · wᵀ[Nc, K]
void matmul_nt(const float* dy, const float* w, float* dx, int M, int K, int Nc, bool accumulate) {
  for (int m = 0; m < M; ++m)
    for (int k = 0; k < K; ++k) {
      float s = accumulate ? dx[m * K + k] : 0.0f;
      for (int n = 0; n < Nc; ++n) s += dy[m * Nc + n] * w[k * Nc + n];
      dx[m * K + k] = s;
    }
}

struct param {
  vec w, g, m, v;  // value, gradient, Adam moments
  param(std::size_t n, float scale, std::mt19937& rng) : w(n), g(n), m(n), v(n) {
    std::normal_distribution<float> d(0.0f, scale);
    for (auto& x : w) x = d(rng);
  }
  void adam(float lr, int t) {
    const float b1 = 0.9f, b2 = 0.999f, c1 = 1 - std::pow(b1, float(t)), c2 = 1 - std::pow(b2, float(t));
    for (std::size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      w[i] -= lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + 1e-8f);
      g[i] = 0;
    }
  }
};

attn::Tensor as_tensor(vec& x, attn::Shape shape) {
  return attn::Tensor::copy_of(attn::TensorView(x.data(), attn::dtype::f32, std::move(shape)));
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 600;
  const double min_accuracy = argc > 2 ? std::atof(argv[2]) : 0.0;
  std::mt19937 rng(7);
  param E(V * C, 0.5f, rng), P(N * C, 0.5f, rng), Wq(C * HD, 0.2f, rng), Wk(C * HD, 0.2f, rng), Wv(C * HD, 0.2f, rng),
      Wo(HD * V, 0.2f, rng), bo(V, 0.0f, rng);
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
    const attn::Tensor pos = attn::learned_position_encoding(as_tensor(P.w, {N, C}), N);  // [N, C]
    vec h(B * N * C);
    for (int r = 0; r < B * N; ++r)
      for (int c = 0; c < C; ++c) h[r * C + c] = E.w[x[r] * C + c] + pos.data_as<float>()[(r % N) * C + c];
    vec q(B * N * HD), k(B * N * HD), v(B * N * HD);
    matmul(h.data(), Wq.w.data(), q.data(), B * N, C, HD);
    matmul(h.data(), Wk.w.data(), k.data(), B * N, C, HD);
    matmul(h.data(), Wv.w.data(), v.data(), B * N, C, HD);
    const attn::Tensor tq = as_tensor(q, {B, N, HD}), tk = as_tensor(k, {B, N, HD}), tv = as_tensor(v, {B, N, HD});
    const attn::attention_result r = attn::attention(tq, tk, tv, opt);
    const float* o = r.out.data_as<float>();
    vec logits(B * N * V);
    matmul(o, Wo.w.data(), logits.data(), B * N, HD, V);
    double loss = 0;
    int correct = 0;
    vec dlogits(B * N * V);
    for (int row = 0; row < B * N; ++row) {
      float* l = logits.data() + row * V;
      int arg = 0;
      float mx = -INFINITY;
      for (int c = 0; c < V; ++c) {
        l[c] += bo.w[c];
        if (l[c] > mx) mx = l[c], arg = c;
      }
      double z = 0;
      for (int c = 0; c < V; ++c) z += std::exp(double(l[c] - mx));
      loss += -(double(l[y[row]] - mx) - std::log(z));
      correct += arg == y[row];
      for (int c = 0; c < V; ++c)
        dlogits[row * V + c] = float((std::exp(double(l[c] - mx)) / z - (c == y[row])) / (B * N));
    }
    accuracy = double(correct) / (B * N);
    if (step == 1 || step % 100 == 0 || step == steps)
      std::printf("step %4d  loss %.4f  accuracy %.3f\n", step, loss / (B * N), accuracy);
    if (step == steps) break;  // the last batch only measures

    // ---- backward ----  (each line quotes the forward line it differentiates)
    // logits = o Wo + bo
    matmul_tn(o, dlogits.data(), Wo.g.data(), B * N, HD, V);
    for (int row = 0; row < B * N; ++row)
      for (int c = 0; c < V; ++c) bo.g[c] += dlogits[row * V + c];
    vec dout(B * N * HD);
    matmul_nt(dlogits.data(), Wo.w.data(), dout.data(), B * N, HD, V, false);
    // o = attention(q, k, v)
    const attn::attention_grads g = attn::attention_backward(tq, tk, tv, r.out, as_tensor(dout, {B, N, HD}), r.lse, opt);
    // q, k, v = h Wq, h Wk, h Wv
    vec dh(B * N * C);
    bool first = true;
    for (auto [dp, W] : {std::pair{&g.dq, &Wq}, {&g.dk, &Wk}, {&g.dv, &Wv}}) {
      matmul_tn(h.data(), dp->data_as<float>(), W->g.data(), B * N, C, HD);
      matmul_nt(dp->data_as<float>(), W->w.data(), dh.data(), B * N, C, HD, !first);
      first = false;
    }
    // h = E[x] + P
    for (int row = 0; row < B * N; ++row)
      for (int c = 0; c < C; ++c) E.g[x[row] * C + c] += dh[row * C + c];
    const attn::Tensor dP = attn::learned_position_encoding_backward(as_tensor(dh, {B, N, C}), N);
    for (int i = 0; i < N * C; ++i) P.g[i] += dP.data_as<float>()[i];

    for (param* p : {&E, &P, &Wq, &Wk, &Wv, &Wo, &bo}) p->adam(3e-3f, step);
  }
  if (accuracy < min_accuracy) {
    std::printf("accuracy %.3f is below the required %.3f\n", accuracy, min_accuracy);
    return 1;
  }
  return 0;
}

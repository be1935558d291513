// examples/graph_image_attention.cc — self-attention over graphs and over images (literature 000:
// attention as message passing restricted by a mask, and over the patches of an image).
//
// (a) Graph: node classification on a stochastic block model. 120 nodes in 4 communities of 30;
//     an edge joins two nodes of one community with probability 0.2, of two communities with
//     0.02. Each node's features are its community's mean plus heavy noise (8 features, σ = 2.5),
//     so features alone classify poorly. About half the nodes are labelled (training), the rest
//     are the test. Two layers of nn::MultiHeadAttention whose bool attn_mask is the adjacency
//     with self loops — a node attends to its neighbours and itself only:
//       x [1, n, F] ─ Linear ─ h0 ─ MHA(mask) ─ ReLU ─ h1 ─ MHA(mask) ─ h2 ─ Linear ─ logits [1, n, C]
//     (no residual connections: a node's own noisy features reach it only through its self loop,
//     weighed against its neighbours' by the attention, as in graph attention networks)
//     compared with an MLP on the features alone (Linear ─ ReLU ─ Linear), trained the same way.
// (b) Image: 16 × 16 images of four shapes (filled square, frame, plus, X; random size 6–9 and
//     place, noise σ = 0.3), cut into 4 × 4 patches → 16 tokens of 16 pixels:
//       patches [B, 16, 16] ─ Linear ─ + learned position (Embedding of 0..15) ─ encoder layer
//       (pre-norm, 4 heads) ─ LayerNorm ─ mean over tokens ─ Linear ─ logits [B, 4]
//
//   ./build/release/examples/example_graph_image_attention [image_steps] [min_accuracy] [png_dir]
// Prints progress, the graph's test accuracy against the MLP's, the image test accuracy on 500
// held-out images; writes graph_attention.png (layer 1, head 0, nodes ordered by community),
// image_input.png and image_attention.png (one test image and its patches' attention) into
// png_dir (default "."). Exits 1 when an accuracy is below min_accuracy or the graph attention
// does not beat the MLP by 0.1 (used as a test).
#include <attn/attn.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pictures.h"
#include "progress.h"

namespace {

using attn::Tensor;
namespace nn = attn::nn;

// Cross-entropy over the counted rows, then the accuracy of another set of rows: the labels of
// the rows not counted are ignore_index (-100).
constexpr std::int64_t kIgnore = -100;

double accuracy_on(const Tensor& logits, const std::vector<std::int64_t>& labels) {
  const std::int64_t C = logits.size(-1);
  std::int64_t correct = 0, count = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] == kIgnore) continue;
    const float* l = logits.data_as<float>() + std::int64_t(i) * C;
    correct += std::max_element(l, l + C) - l == labels[i];
    ++count;
  }
  return count ? double(correct) / double(count) : 0.0;
}

Tensor label_tensor(const std::vector<std::int64_t>& labels, const attn::Shape& shape) {
  return Tensor::from_values(shape, attn::dtype::i64, std::vector<double>(labels.begin(), labels.end()));
}

// ---------------------------------------------------------------------------------------------
// (a) Graph

constexpr std::int64_t kCommunities = 4, kPerCommunity = 30, kNodes = kCommunities * kPerCommunity, kF = 8, kGE = 32;

struct graph {
  Tensor x;                                // [1, n, F] features
  Tensor adjacency;                        // bool [1, 1, n, n], self loops included
  std::vector<std::int64_t> train, test;   // labels, kIgnore where the node is in the other set
};

graph make_graph(nn::rng& gen) {
  graph g{Tensor::empty({1, kNodes, kF}, attn::dtype::f32), Tensor::zeros({1, 1, kNodes, kNodes}, attn::dtype::boolean),
          std::vector<std::int64_t>(kNodes, kIgnore), std::vector<std::int64_t>(kNodes, kIgnore)};
  std::vector<double> means(std::size_t(kCommunities * kF));
  for (double& m : means) m = gen.normal();
  auto* adj = g.adjacency.data_as<bool>();
  for (std::int64_t i = 0; i < kNodes; ++i) {
    const std::int64_t c = i / kPerCommunity;
    for (std::int64_t f = 0; f < kF; ++f)
      g.x.data_as<float>()[i * kF + f] = float(means[std::size_t(c * kF + f)] + gen.normal(0.0, 2.5));
    adj[i * kNodes + i] = true;
    for (std::int64_t j = i + 1; j < kNodes; ++j)
      if (gen.uniform() < (j / kPerCommunity == c ? 0.2 : 0.02)) adj[i * kNodes + j] = adj[j * kNodes + i] = true;
    (gen.uniform() < 0.5 ? g.train : g.test)[std::size_t(i)] = c;
  }
  // Each feature standardised over the nodes (mean 0, variance 1), so that the first scores
  // q·k are small and attention starts near uniform over the neighbours.
  float* x = g.x.data_as<float>();
  for (std::int64_t f = 0; f < kF; ++f) {
    double sum = 0, sq = 0;
    for (std::int64_t i = 0; i < kNodes; ++i) sum += x[i * kF + f], sq += double(x[i * kF + f]) * x[i * kF + f];
    const double mean = sum / kNodes, sd = std::sqrt(sq / kNodes - mean * mean);
    for (std::int64_t i = 0; i < kNodes; ++i) x[i * kF + f] = float((x[i * kF + f] - mean) / sd);
  }
  return g;
}

struct graph_attention_net {
  nn::Linear in, out;
  nn::MultiHeadAttention mha1, mha2;

  explicit graph_attention_net(nn::rng& gen)
      : in(kF, kGE, gen), out(kGE, kCommunities, gen), mha1({.embed_dim = kGE, .num_heads = 4}, gen),
        mha2({.embed_dim = kGE, .num_heads = 4}, gen) {}

  nn::parameter_list parameters() {
    nn::parameter_list ps;
    in.parameters(ps, "in.");
    mha1.parameters(ps, "mha1.");
    mha2.parameters(ps, "mha2.");
    out.parameters(ps, "out.");
    return ps;
  }

  struct saved {
    nn::MultiHeadAttention::saved a1, a2;
    Tensor h0, pre1, h1, h2;
  };
  Tensor forward(const graph& g, saved& s) const {
    attn::masking_options m;
    m.attn_mask = g.adjacency;
    s.h0 = in.forward(g.x);
    s.pre1 = mha1.forward(s.h0, s.h0, s.h0, m, &s.a1).out;
    s.h1 = nn::activate(nn::activation::relu, s.pre1);
    s.h2 = mha2.forward(s.h1, s.h1, s.h1, m, &s.a2).out;
    return out.forward(s.h2);
  }
  // Each line undoes one line of forward, last first. Self-attention reads its input three
  // times (query, key, value): the three gradients add up.
  void backward(const graph& g, const saved& s, const Tensor& dlogits) {
    const nn::MultiHeadAttention::grads g2 = mha2.backward(s.a2, out.backward(s.h2, dlogits));
    const Tensor dh1 = nn::add(nn::add(g2.dquery, g2.dkey), g2.dvalue);
    const nn::MultiHeadAttention::grads g1 = mha1.backward(s.a1, nn::activate_backward(nn::activation::relu, s.pre1, dh1));
    in.backward(g.x, nn::add(nn::add(g1.dquery, g1.dkey), g1.dvalue), false);
  }
  // Layer 1's attention [1, Hq, n, n].
  Tensor weights(const graph& g) const {
    attn::masking_options m;
    m.attn_mask = g.adjacency;
    const Tensor h0 = in.forward(g.x);
    return mha1.forward(h0, h0, h0, m, nullptr, true).weights;
  }
};

// The baseline: what the features alone say.
struct mlp {
  nn::Linear fc1, fc2;
  explicit mlp(nn::rng& gen) : fc1(kF, kGE, gen), fc2(kGE, kCommunities, gen) {}
  nn::parameter_list parameters() {
    nn::parameter_list ps;
    fc1.parameters(ps, "fc1.");
    fc2.parameters(ps, "fc2.");
    return ps;
  }
};

// Full-batch training on the labelled nodes with Adam; returns the test accuracy.
template <class Forward, class Backward>
double train_nodes(const graph& g, nn::parameter_list ps, int steps, const char* name, Forward forward, Backward backward) {
  nn::adam opt{.lr = 3e-3, .weight_decay = 1e-2, .decoupled = true};
  const Tensor targets = label_tensor(g.train, {1, kNodes});
  const progress meter{.name = name};
  Tensor logits;
  for (int step = 0; step < steps; ++step) {
    logits = forward();
    const nn::loss_result l = nn::cross_entropy(logits, targets, kIgnore);
    nn::zero_grad(ps);
    backward(l.grad);
    opt.step(ps);
    meter.report(step, steps, 100, l, "train accuracy", 1, "steps");
  }
  return accuracy_on(forward(), g.test);
}

struct graph_outcome {
  double attention, mlp;
};

graph_outcome run_graph(const pictures& png) {
  nn::rng data(11), gen(12);
  const graph g = make_graph(data);
  std::int64_t edges = 0;
  for (std::int64_t i = 0; i < kNodes * kNodes; ++i) edges += g.adjacency.data_as<bool>()[i];
  const auto labelled = std::count_if(g.train.begin(), g.train.end(), [](std::int64_t c) { return c != kIgnore; });
  std::printf("(a) graph: %lld nodes (%lld labelled), %lld edges, 4 communities, features N(mean_c, 2.5^2)\n",
              (long long)kNodes, (long long)labelled, (long long)(edges - kNodes) / 2);

  graph_attention_net net(gen);
  graph_attention_net::saved s;
  const double att = train_nodes(
      g, net.parameters(), 200, "gat", [&] { return net.forward(g, s); }, [&](const Tensor& d) { net.backward(g, s, d); });
  mlp base(gen);
  Tensor hidden;
  const double feat = train_nodes(
      g, base.parameters(), 200, "mlp",
      [&] {
        hidden = base.fc1.forward(g.x);
        return base.fc2.forward(nn::activate(nn::activation::relu, hidden));
      },
      [&](const Tensor& d) {
        const Tensor dr = base.fc2.backward(nn::activate(nn::activation::relu, hidden), d);
        base.fc1.backward(g.x, nn::activate_backward(nn::activation::relu, hidden, dr), false);
      });
  std::printf("graph test accuracy: attention over neighbours %.3f, MLP on features %.3f\n", att, feat);

  // Nodes are numbered by community, so the picture shows four diagonal blocks: each node
  // attends within its community (no edge: weight 0, the bottom colour).
  std::vector<std::string> names;
  for (std::int64_t i = 0; i < kNodes; ++i)
    names.push_back(std::string(1, char('A' + i / kPerCommunity)) + std::to_string(i % kPerCommunity));
  png.heatmap("graph_attention.png", attn::viz::matrix_of(net.weights(g), 0, 0), names, names,
              {.title = "graph attention, layer 1 head 0", .range = attn::viz::value_range::unit});
  return {att, feat};
}

// ---------------------------------------------------------------------------------------------
// (b) Image

constexpr std::int64_t kSide = 16, kPatch = 4, kTokens = (kSide / kPatch) * (kSide / kPatch), kPixels = kPatch * kPatch;
constexpr std::int64_t kShapes = 4, kIE = 32, kIB = 64;
const char* const kShapeNames[kShapes] = {"square", "frame", "plus", "X"};

struct images {
  Tensor pixels;   // [B, 16, 16]
  Tensor patches;  // [B, 16 tokens, 16 pixels]: token = 4·(y / 4) + x / 4, pixel = 4·(y % 4) + x % 4
  std::vector<std::int64_t> labels;
};

images make_images(nn::rng& gen, std::int64_t b) {
  images im{Tensor::zeros({b, kSide, kSide}, attn::dtype::f32), Tensor::empty({b, kTokens, kPixels}, attn::dtype::f32), {}};
  for (std::int64_t n = 0; n < b; ++n) {
    const std::int64_t cls = gen.integer(0, kShapes - 1), s = gen.integer(6, 9);
    const std::int64_t x0 = gen.integer(0, kSide - s), y0 = gen.integer(0, kSide - s);
    float* img = im.pixels.data_as<float>() + n * kSide * kSide;
    for (std::int64_t y = 0; y < s; ++y)
      for (std::int64_t x = 0; x < s; ++x) {
        const bool on = cls == 0   ? true
                        : cls == 1 ? (y == 0 || y == s - 1 || x == 0 || x == s - 1)
                        : cls == 2 ? (x == s / 2 || y == s / 2)
                                   : (x == y || x == s - 1 - y);
        if (on) img[(y0 + y) * kSide + x0 + x] = 1.0f;
      }
    for (std::int64_t i = 0; i < kSide * kSide; ++i) img[i] += float(gen.normal(0.0, 0.3));
    float* p = im.patches.data_as<float>() + n * kTokens * kPixels;
    for (std::int64_t y = 0; y < kSide; ++y)
      for (std::int64_t x = 0; x < kSide; ++x)
        p[((y / kPatch) * (kSide / kPatch) + x / kPatch) * kPixels + (y % kPatch) * kPatch + x % kPatch] = img[y * kSide + x];
    im.labels.push_back(cls);
  }
  return im;
}

struct patch_transformer {
  nn::Linear embed, head;
  nn::Embedding pos;
  nn::TransformerEncoderLayer enc;
  nn::LayerNorm norm;

  explicit patch_transformer(nn::rng& gen)
      : embed(kPixels, kIE, gen), head(kIE, kShapes, gen), pos(kTokens, kIE, gen),
        enc({.d_model = kIE, .num_heads = 4, .d_ff = 2 * kIE, .pre_norm = true}, gen), norm(kIE) {
    nn::fill_normal(pos.weight, 0.0, 0.02, gen);  // as ViT: N(0, 1) rows would drown the patches
  }

  nn::parameter_list parameters() {
    nn::parameter_list ps;
    embed.parameters(ps, "embed.");
    pos.parameters(ps, "pos.");
    enc.parameters(ps, "enc.");
    norm.parameters(ps, "norm.");
    head.parameters(ps, "head.");
    return ps;
  }

  static Tensor positions(std::int64_t b) {
    Tensor ids = Tensor::empty({b, kTokens}, attn::dtype::i64);
    for (std::int64_t i = 0; i < b * kTokens; ++i) ids.data_as<std::int64_t>()[i] = i % kTokens;
    return ids;
  }

  struct saved {
    Tensor ids, h, n, pooled;
    nn::TransformerEncoderLayer::saved enc;
  };
  Tensor forward(const images& im, saved& s) {
    const std::int64_t b = im.patches.size(0);
    s.ids = positions(b);
    s.h = enc.forward(nn::add(embed.forward(im.patches), pos.forward(s.ids)), {}, &s.enc);
    s.n = norm.forward(s.h);
    // pooled[b, e] = mean over the 16 tokens of n[b, t, e]
    s.pooled = Tensor::zeros({b, kIE}, attn::dtype::f32);
    for (std::int64_t i = 0; i < b; ++i)
      for (std::int64_t t = 0; t < kTokens; ++t)
        for (std::int64_t e = 0; e < kIE; ++e)
          s.pooled.data_as<float>()[i * kIE + e] += s.n.data_as<float>()[(i * kTokens + t) * kIE + e] / float(kTokens);
    return head.forward(s.pooled);
  }
  void backward(const images& im, const saved& s, const Tensor& dlogits) {
    const Tensor dpooled = head.backward(s.pooled, dlogits);
    // pooled = mean over tokens  →  dn[b, t, e] = dpooled[b, e] / 16
    const std::int64_t b = dpooled.size(0);
    Tensor dn = Tensor::empty({b, kTokens, kIE}, attn::dtype::f32);
    for (std::int64_t i = 0; i < b * kTokens; ++i)
      for (std::int64_t e = 0; e < kIE; ++e)
        dn.data_as<float>()[i * kIE + e] = dpooled.data_as<float>()[(i / kTokens) * kIE + e] / float(kTokens);
    const Tensor dx = enc.backward(s.enc, norm.backward(s.h, dn));
    // x = embed(patches) + pos(ids)
    embed.backward(im.patches, dx, false);
    pos.backward(s.ids, dx);
  }
  // The encoder's self-attention [b, Hq, 16, 16] as the forward saw it.
  Tensor attention(const saved& s) const {
    return enc.self_attn.forward(s.enc.attn.query, s.enc.attn.key, s.enc.attn.value, {}, nullptr, true).weights;
  }
};

double run_image(int steps, const pictures& png) {
  nn::rng gen(21), data(22), held_out(23);
  patch_transformer net(gen);
  const nn::parameter_list ps = net.parameters();
  std::printf("(b) image: 16 x 16 shapes (square, frame, plus, X), 4 x 4 patches -> 16 tokens, %lld parameters\n",
              (long long)nn::parameter_count(ps));
  nn::adam opt{.lr = 3e-3, .weight_decay = 0.01, .decoupled = true};
  const progress meter;
  for (int step = 0; step < steps; ++step) {
    const images im = make_images(data, kIB);
    patch_transformer::saved s;
    const nn::loss_result l = nn::cross_entropy(net.forward(im, s), label_tensor(im.labels, {kIB}));
    nn::zero_grad(ps);
    net.backward(im, s, l.grad);
    nn::clip_grad_norm(ps, 1.0);
    opt.lr = nn::warmup_cosine(step, 50, steps, 3e-3, 1e-4);
    opt.step(ps);
    meter.report(step, steps, 100, l, "accuracy", double(kIB), "images");
  }
  const images test = make_images(held_out, 500);
  net.enc.set_training(false);
  patch_transformer::saved s;
  const double accuracy = accuracy_on(net.forward(test, s), test.labels);
  std::printf("image test accuracy (500 held-out images): %.3f\n", accuracy);

  std::vector<std::string> patch_names;
  for (std::int64_t t = 0; t < kTokens; ++t)
    patch_names.push_back(std::to_string(t / (kSide / kPatch)) + "," + std::to_string(t % (kSide / kPatch)));
  const std::string shape = kShapeNames[test.labels[0]];
  png.heatmap("image_input.png", attn::viz::matrix_of(test.pixels.view().reshape({500, 1, kSide, kSide}), 0, 0), {}, {},
              {.title = "test image 0: " + shape});
  png.heatmap("image_attention.png", attn::viz::matrix_of(net.attention(s), 0, 0), patch_names, patch_names,
              {.title = "patch attention, head 0 (" + shape + ")", .range = attn::viz::value_range::unit});
  return accuracy;
}

}  // namespace

int main(int argc, char** argv) {
  const int image_steps = argc > 1 ? std::atoi(argv[1]) : 600;
  const double min_accuracy = argc > 2 ? std::atof(argv[2]) : 0.0;
  const pictures png(argc, argv, 3);
  const graph_outcome g = run_graph(png);
  const double image = run_image(image_steps, png);
  bool ok = true;
  if (g.attention < min_accuracy || g.attention < g.mlp + 0.1) {
    std::printf("graph attention %.3f is below the required %.3f or not 0.1 above the MLP's %.3f\n", g.attention,
                min_accuracy, g.mlp);
    ok = false;
  }
  if (image < min_accuracy) {
    std::printf("image accuracy %.3f is below the required %.3f\n", image, min_accuracy);
    ok = false;
  }
  return ok ? 0 : 1;
}

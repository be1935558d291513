// examples/co_attention_match.cc — fine-grained parallel co-attention (literature 003,
// "multiple inputs: co-attention") decides whether a question is answered by a context:
//   context   "mary lives in paris . john lives in rome . anna lives in oslo ."   (3–6 facts)
//   question  "mary paris ?"  →  yes        "mary rome ?"  →  no
// Every fact pairs a different person with a different city, and in a "no" question both words
// occur in the context, only not in the same fact: counting words cannot answer, the model has
// to find the fact each question word belongs to and check that it is the same one.
//
//   question words x [B, 2, E] = Embedding(word)      facts y [B, Nf, E] = Embedding(person) + Embedding(city)
//   CoAttention (parallel, fine): L = x W_b yᵀ; y_context_i = Σ_j softmax_j(L_ij) y_j   (padding facts masked)
//   z = y_context_person ∘ y_context_city   (large when both words found the same fact)
//   logits = W_2 tanh(W_1 z + b_1) + b_2                                             [B, 2]
// Prints the accuracy on 1000 held-out questions and the co-attention of a "yes" and a "no"
// question as text heatmaps.
//
// Writes the two heatmaps as co_attention_yes.png and co_attention_no.png into png_dir (default ".").
//
//   ./build/release/examples/example_co_attention_match [steps] [min_accuracy] [png_dir] [parallel|alternating]
// (alternating: each fact first gathers the question words, then each question word attends over
// the facts against what they gathered; W_2 started at I + noise too).
#include <attn/attn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "classifier.h"
#include "pictures.h"

namespace {

using attn::Tensor;
namespace nn = attn::nn;

const std::vector<std::string> kWords = {"<pad>", "mary",  "john",   "anna",  "omar",  "lena",   "ivan",  "sara",
                                         "tom",   "paris", "rome",   "oslo",  "lima",  "cairo",  "delhi", "tokyo",
                                         "quito"};
constexpr std::int64_t kPeople = 1, kCities = 9, kEach = 8, V = 17, Nf = 6, E = 16, Hc = 32, B = 64;

struct batch {
  Tensor facts;     // [n, Nf, 2] (person, city) ids, 0 after the length
  Tensor question;  // [n, 2] (person, city)
  Tensor lengths;   // [n] facts
  Tensor labels;    // [n] 1 = the pair is a fact
};

batch make(nn::rng& gen, std::int64_t n) {
  batch s{Tensor::zeros({n, Nf, 2}, attn::dtype::i64), Tensor::empty({n, 2}, attn::dtype::i64),
          Tensor::empty({n}, attn::dtype::i64), Tensor::empty({n}, attn::dtype::i64)};
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t L = gen.integer(3, Nf);
    std::vector<std::int64_t> people(std::size_t(kEach), 0), cities(std::size_t(kEach), 0);
    std::iota(people.begin(), people.end(), kPeople), std::iota(cities.begin(), cities.end(), kCities);
    for (std::int64_t i = kEach - 1; i > 0; --i) {  // Fisher–Yates on both lists
      std::swap(people[std::size_t(i)], people[std::size_t(gen.integer(0, i))]);
      std::swap(cities[std::size_t(i)], cities[std::size_t(gen.integer(0, i))]);
    }
    std::int64_t* f = s.facts.data_as<std::int64_t>() + b * Nf * 2;
    for (std::int64_t j = 0; j < L; ++j) f[2 * j] = people[std::size_t(j)], f[2 * j + 1] = cities[std::size_t(j)];
    const std::int64_t k = gen.integer(0, L - 1), yes = gen.integer(0, 1);
    std::int64_t other = gen.integer(0, L - 2);
    other += other >= k;  // another fact than k
    s.question.data_as<std::int64_t>()[2 * b] = people[std::size_t(k)];
    s.question.data_as<std::int64_t>()[2 * b + 1] = cities[std::size_t(yes ? k : other)];
    s.lengths.data_as<std::int64_t>()[b] = L;
    s.labels.data_as<std::int64_t>()[b] = yes;
  }
  return s;
}

struct model {
  nn::Embedding emb;
  nn::CoAttention co;
  nn::Linear hidden, out;

  model(nn::rng& gen, nn::co_attention_kind kind)
      : emb(V, E, gen),
        co({kind, nn::co_attention_granularity::fine, E, E}, gen),
        hidden(E, Hc, gen),
        out(Hc, 2, gen) {
    // N(0, 0.3²) rows: with PyTorch's N(0, 1) the bilinear scores start at |L| ~ 10, the softmax
    // is saturated from the first step and its gradient vanishes.
    nn::fill_normal(emb.weight, 0.0, 0.3, gen);
    // W_b = I + Xavier noise: the affinity starts as the similarity x·y, so each question word
    // starts out preferring the facts that contain it.
    for (std::int64_t i = 0; i < E; ++i) co.W_b.data_as<float>()[i * E + i] += 1.0f;
    if (co.W_2.defined())
      for (std::int64_t i = 0; i < E; ++i) co.W_2.data_as<float>()[i * E + i] += 1.0f;
  }

  struct saved {
    Tensor words, facts, a, z, h, yc;
    nn::CoAttention::saved co;
  };

  nn::CoAttention::result run(const batch& s, saved& sv, bool need_weights) const {
    const std::int64_t n = s.question.size(0);
    sv.words = emb.forward(s.question);  // [n, 2, E]
    // facts: Embedding(person) + Embedding(city), [n, Nf, E]
    const Tensor pair = emb.forward(s.facts);  // [n, Nf, 2, E]
    sv.facts = Tensor::empty({n, Nf, E}, attn::dtype::f32);
    for (std::int64_t r = 0; r < n * Nf; ++r)
      for (std::int64_t c = 0; c < E; ++c)
        sv.facts.data_as<float>()[r * E + c] = pair.data_as<float>()[(2 * r) * E + c] + pair.data_as<float>()[(2 * r + 1) * E + c];
    nn::CoAttention::result r = co.forward(sv.words, sv.facts, std::nullopt, s.lengths, &sv.co, need_weights);
    // z = y_context_0 ∘ y_context_1
    sv.yc = r.y_context;  // [n, 2, E]
    sv.z = Tensor::empty({n, E}, attn::dtype::f32);
    const float* y = sv.yc.data_as<float>();
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t c = 0; c < E; ++c) sv.z.data_as<float>()[b * E + c] = y[(2 * b) * E + c] * y[(2 * b + 1) * E + c];
    sv.a = hidden.forward(sv.z);
    sv.h = nn::activate(nn::activation::tanh, sv.a);
    return r;
  }
  Tensor logits(const saved& sv) const { return out.forward(sv.h); }

  // Each line undoes one line of the forward, last first.
  void backward(const batch& s, const saved& sv, const Tensor& dlogits) {
    const std::int64_t n = s.question.size(0);
    const Tensor dh = out.backward(sv.h, dlogits);                     // logits = W_2 h + b_2
    const Tensor da = nn::activate_backward(nn::activation::tanh, sv.a, dh);  // h = tanh(a)
    const Tensor dz = hidden.backward(sv.z, da);                       // a = W_1 z + b_1
    // z = yc_0 ∘ yc_1  →  dyc_0 = dz ∘ yc_1, dyc_1 = dz ∘ yc_0
    Tensor dyc = Tensor::empty({n, 2, E}, attn::dtype::f32);
    const float* y = sv.yc.data_as<float>();
    for (std::int64_t b = 0; b < n; ++b)
      for (std::int64_t c = 0; c < E; ++c) {
        const float g = dz.data_as<float>()[b * E + c];
        dyc.data_as<float>()[(2 * b) * E + c] = g * y[(2 * b + 1) * E + c];
        dyc.data_as<float>()[(2 * b + 1) * E + c] = g * y[(2 * b) * E + c];
      }
    const nn::CoAttention::grads g = co.backward(sv.co, Tensor{}, dyc);  // x_context is not used
    emb.backward(s.question, g.dx);
    // facts = Embedding(person) + Embedding(city): both rows get dy
    Tensor dpair = Tensor::empty({n, Nf, 2, E}, attn::dtype::f32);
    for (std::int64_t r = 0; r < n * Nf; ++r)
      for (std::int64_t c = 0; c < E; ++c)
        dpair.data_as<float>()[(2 * r) * E + c] = dpair.data_as<float>()[(2 * r + 1) * E + c] = g.dy.data_as<float>()[r * E + c];
    emb.backward(s.facts, dpair);
  }

  void parameters(nn::parameter_list& ps) {
    emb.parameters(ps, "emb.");
    co.parameters(ps, "co.");
    hidden.parameters(ps, "hidden.");
    out.parameters(ps, "out.");
  }
};

std::string word(const Tensor& ids, std::initializer_list<std::int64_t> at) {
  return kWords[std::size_t(ids.get(at))];
}

// The weights of each question word over the facts: printed with one row per fact and one column
// per word, and written as a PNG with one row per word.
void heatmap(const batch& s, const nn::CoAttention::result& r, std::int64_t b, std::int64_t predicted,
             const pictures& png) {
  const char* shades = " .:-=+*#%@";
  const std::string q0 = word(s.question, {b, 0}), q1 = word(s.question, {b, 1});
  std::printf("\n\"%s %s ?\"  answer %s, predicted %s   (darker = more weight)\n", q0.c_str(), q1.c_str(),
              s.labels.get({b}) ? "yes" : "no", predicted ? "yes" : "no");
  std::printf("  %-24s %8s %8s\n", "fact", q0.c_str(), q1.c_str());
  for (std::int64_t j = 0; j < std::int64_t(s.lengths.get({b})); ++j) {
    const std::string fact = word(s.facts, {b, j, 0}) + " lives in " + word(s.facts, {b, j, 1});
    std::printf("  %-24s", fact.c_str());
    for (std::int64_t i = 0; i < 2; ++i) {
      const double w = r.y_weights.get({b, i, j});
      std::printf("  %c %.2f", shades[std::min(9, int(w * 10))], w);
    }
    std::printf("\n");
  }
  const std::int64_t L = std::int64_t(s.lengths.get({b}));
  Tensor w = Tensor::empty({2, L}, attn::dtype::f64);
  std::vector<std::string> facts;
  for (std::int64_t j = 0; j < L; ++j) {
    facts.push_back(word(s.facts, {b, j, 0}) + " - " + word(s.facts, {b, j, 1}));
    for (std::int64_t i = 0; i < 2; ++i) w.set({i, j}, r.y_weights.get({b, i, j}));
  }
  const bool yes = s.labels.get({b}) != 0;
  png.heatmap(yes ? "co_attention_yes.png" : "co_attention_no.png", w, {q0, q1}, facts,
              {.title = "\"" + q0 + " " + q1 + " ?\" answer " + (yes ? "yes" : "no") + ": each word over the facts",
               .range = attn::viz::value_range::unit});
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 1500;
  const double min_accuracy = argc > 2 ? std::atof(argv[2]) : 0.0;
  nn::rng gen(1), data(2), held_out(3);
  const pictures png(argc, argv, 3);
  const bool alternating = argc > 4 && std::string(argv[4]) == "alternating";
  model m(gen, alternating ? nn::co_attention_kind::alternating : nn::co_attention_kind::parallel);
  train_classifier(m, make, data, steps, B, "questions");
  const std::int64_t n = 1000;
  const batch test = make(held_out, n);
  model::saved sv;
  const nn::CoAttention::result r = m.run(test, sv, true);
  std::int64_t correct = 0;
  const std::vector<std::int64_t> predicted = predicted_classes(m.logits(sv));
  for (std::int64_t b = 0; b < n; ++b) correct += predicted[std::size_t(b)] == std::int64_t(test.labels.get({b}));
  // The first "yes" and the first "no" question.
  for (std::int64_t want : {1, 0})
    for (std::int64_t b = 0; b < n; ++b)
      if (std::int64_t(test.labels.get({b})) == want) {
        heatmap(test, r, b, predicted[std::size_t(b)], png);
        break;
      }
  const double accuracy = double(correct) / double(n);
  std::printf("held-out accuracy: %.3f (chance 0.5)\n", accuracy);
  if (accuracy < min_accuracy) {
    std::printf("accuracy %.3f is below the required %.3f\n", accuracy, min_accuracy);
    return 1;
  }
  return 0;
}

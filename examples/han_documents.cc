// examples/han_documents.cc — the hierarchical attention network (Yang et al. 2016; literature
// 003, hierarchical input architectures) classifies generated reviews whose label is decided by
// one sentence, the one that starts with "overall":
//   "the staff was rude . overall it was not bad . we had a lovely view ."  →  positive
// Documents have 3–5 sentences of 3–6 words. The "overall" sentence holds a verdict word (great,
// good, lovely / awful, bad, rude), negated when "not" stands right before it. Every other
// sentence holds, half the time, a verdict of its own (either polarity, maybe negated) that
// decides nothing, and "not" also occurs as a filler. Counting words cannot decide it: the word
// encoder has to read "not" next to the verdict, and the sentence attention has to find the
// "overall" sentence.
//
//   x = Embedding(words) [B, S, W, E] ─ HierarchicalAttention ─ document [B, 2Hs] ─ Linear ─ logits [B, 2]
// Prints the accuracy on 1000 held-out documents, how often the sentence attention peaks on the
// deciding sentence, and the sentence and word weights of two documents as text heatmaps; writes
// the first document's sentence weights and the word weights of its most attended sentence as
// han_sentences.png and han_words.png into png_dir (default ".").
//
//   ./build/release/examples/example_han_documents [steps] [min_accuracy] [png_dir]
#include <attn/attn.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "classifier.h"
#include "pictures.h"

namespace {

using attn::Tensor;
namespace nn = attn::nn;

const std::vector<std::string> kWords = {"<pad>", "the",   "food",  "staff", "room",  "view",  "was",  "is",
                                         "we",    "had",   "a",     "it",    "from",  "far",   "nice", "night",
                                         "not",   "great", "good",  "lovely", "awful", "bad",  "rude",  "overall"};
constexpr std::int64_t kFillers = 1, kNumFillers = 15, kNot = 16, kGood = 17, kBad = 20, kOverall = 23;
constexpr std::int64_t V = 24, S = 5, W = 6, E = 16, Hw = 16, Hs = 16, B = 32;

struct batch {
  Tensor ids;               // [n, S, W] word ids, 0 = padding
  Tensor word_lengths;      // [n, S]
  Tensor sentence_lengths;  // [n]
  Tensor labels;            // [n] 1 = positive
  std::vector<std::int64_t> key;  // the "overall" sentence
};

batch make(nn::rng& gen, std::int64_t n) {
  batch d{Tensor::zeros({n, S, W}, attn::dtype::i64), Tensor::zeros({n, S}, attn::dtype::i64),
          Tensor::empty({n}, attn::dtype::i64), Tensor::empty({n}, attn::dtype::i64), {}};
  for (std::int64_t b = 0; b < n; ++b) {
    const std::int64_t sentences = gen.integer(3, S), key = gen.integer(0, sentences - 1);
    const std::int64_t positive = gen.integer(0, 1), negated = gen.integer(0, 1);
    for (std::int64_t i = 0; i < sentences; ++i) {
      const std::int64_t len = gen.integer(3, W);
      std::int64_t* w = d.ids.data_as<std::int64_t>() + (b * S + i) * W;
      for (std::int64_t t = 0; t < len; ++t) w[t] = kFillers + gen.integer(0, kNumFillers - 1);
      if (gen.integer(0, 2) == 0) w[gen.integer(0, len - 1)] = kNot;  // a "not" that decides nothing
      // verdict at `at`, "not" (or a filler) before it: the deciding one in the key sentence,
      // one of either polarity in half the others
      auto verdict = [&](std::int64_t at, bool good, bool negate) {
        w[at] = (good ^ negate ? kGood : kBad) + gen.integer(0, 2);
        w[at - 1] = negate ? kNot : kFillers + gen.integer(0, kNumFillers - 1);
      };
      if (i == key) {
        w[0] = kOverall;
        verdict(gen.integer(2, len - 1), positive, negated);
      } else if (gen.integer(0, 1)) {
        verdict(gen.integer(1, len - 1), gen.integer(0, 1), gen.integer(0, 1));
      }
      d.word_lengths.data_as<std::int64_t>()[b * S + i] = len;
    }
    d.sentence_lengths.data_as<std::int64_t>()[b] = sentences;
    d.labels.data_as<std::int64_t>()[b] = positive;
    d.key.push_back(key);
  }
  return d;
}

struct model {
  nn::Embedding emb;
  nn::HierarchicalAttention han;
  nn::Linear classify;

  explicit model(nn::rng& gen) : emb(V, E, gen), han(E, Hw, Hs, gen), classify(2 * Hs, 2, gen) {}

  struct saved {
    nn::HierarchicalAttention::saved han;
    Tensor document;
  };

  nn::HierarchicalAttention::result run(const batch& d, saved& sv, bool need_weights) const {
    nn::HierarchicalAttention::result r =
        han.forward(emb.forward(d.ids), d.word_lengths, d.sentence_lengths, &sv.han, need_weights);
    sv.document = r.document;
    return r;
  }
  Tensor logits(const saved& sv) const { return classify.forward(sv.document); }

  // Each line undoes one line of the forward, last first.
  void backward(const batch& d, const saved& sv, const Tensor& dlogits) {
    const Tensor ddocument = classify.backward(sv.document, dlogits);  // logits = W document + b
    const Tensor dx = han.backward(sv.han, ddocument);                // document = HAN(x)
    emb.backward(d.ids, dx);                                          // x = Embedding(ids)
  }

  void parameters(nn::parameter_list& ps) {
    emb.parameters(ps, "emb.");
    han.parameters(ps, "han.");
    classify.parameters(ps, "classify.");
  }
};

// One line per sentence: its weight, then each word with its weight's shade.
void heatmap(const batch& d, const nn::HierarchicalAttention::result& r, std::int64_t b, std::int64_t predicted) {
  const char* shades = " .:-=+*#%@";
  auto shade = [&](double w) { return shades[std::min(9, int(w * 10))]; };
  std::printf("\ndocument %lld: %s, predicted %s   (sentence weight | words, darker = more weight)\n", (long long)b,
              d.labels.get({b}) ? "positive" : "negative", predicted ? "positive" : "negative");
  for (std::int64_t i = 0; i < std::int64_t(d.sentence_lengths.get({b})); ++i) {
    const double ws = r.sentence_weights.get({b, i});
    std::printf("  %c %.2f |", shade(ws), ws);
    for (std::int64_t t = 0; t < std::int64_t(d.word_lengths.get({b, i})); ++t)
      std::printf(" %s%c", kWords[std::size_t(d.ids.get({b, i, t}))].c_str(), shade(r.word_weights.get({b, i, t})));
    std::printf("\n");
  }
}

std::string sentence(const batch& d, std::int64_t b, std::int64_t i) {
  std::string out;
  for (std::int64_t t = 0; t < std::int64_t(d.word_lengths.get({b, i})); ++t)
    out += (t ? " " : "") + kWords[std::size_t(d.ids.get({b, i, t}))];
  return out;
}

// Document b's sentence weights (one row, a column per sentence) and the word weights of its
// most attended sentence (one row, a column per word).
void pictures_of(const batch& d, const nn::HierarchicalAttention::result& r, std::int64_t b, const pictures& png) {
  const std::int64_t S_b = std::int64_t(d.sentence_lengths.get({b}));
  Tensor ws = Tensor::empty({1, S_b}, attn::dtype::f64);
  std::vector<std::string> sentences;
  std::int64_t top = 0;
  for (std::int64_t i = 0; i < S_b; ++i) {
    ws.set({0, i}, r.sentence_weights.get({b, i}));
    sentences.push_back(sentence(d, b, i));
    if (r.sentence_weights.get({b, i}) > r.sentence_weights.get({b, top})) top = i;
  }
  const std::string label = d.labels.get({b}) ? "positive" : "negative";
  png.heatmap("han_sentences.png", ws, {"document"}, sentences,
              {.title = "sentence attention, " + label, .range = attn::viz::value_range::unit, .max_label_chars = 40});
  const std::int64_t L = std::int64_t(d.word_lengths.get({b, top}));
  Tensor ww = Tensor::empty({1, L}, attn::dtype::f64);
  std::vector<std::string> words;
  for (std::int64_t t = 0; t < L; ++t) {
    ww.set({0, t}, r.word_weights.get({b, top, t}));
    words.push_back(kWords[std::size_t(d.ids.get({b, top, t}))]);
  }
  png.heatmap("han_words.png", ww, {"sentence " + std::to_string(top + 1)}, words,
              {.title = "word attention in the most attended sentence", .range = attn::viz::value_range::unit});
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 1000;
  const double min_accuracy = argc > 2 ? std::atof(argv[2]) : 0.0;
  nn::rng gen(1), data(2), held_out(3);
  model m(gen);
  train_classifier(m, make, data, steps, B, "documents");
  const std::int64_t n = 1000;
  const batch test = make(held_out, n);
  model::saved sv;
  const nn::HierarchicalAttention::result r = m.run(test, sv, true);
  std::int64_t correct = 0, on_key = 0;
  const std::vector<std::int64_t> predicted = predicted_classes(m.logits(sv));
  for (std::int64_t b = 0; b < n; ++b) {
    correct += predicted[std::size_t(b)] == std::int64_t(test.labels.get({b}));
    // Does the sentence attention peak on the "overall" sentence?
    std::int64_t best = 0;
    for (std::int64_t i = 1; i < S; ++i)
      if (r.sentence_weights.get({b, i}) > r.sentence_weights.get({b, best})) best = i;
    on_key += best == test.key[std::size_t(b)];
  }
  heatmap(test, r, 0, predicted[0]);
  heatmap(test, r, 1, predicted[1]);
  pictures_of(test, r, 0, pictures(argc, argv, 3));
  const double accuracy = double(correct) / double(n);
  std::printf("held-out accuracy: %.3f (chance 0.5); the sentence attention peaks on the \"overall\" sentence in %.3f\n",
              accuracy, double(on_key) / double(n));
  if (accuracy < min_accuracy) {
    std::printf("accuracy %.3f is below the required %.3f\n", accuracy, min_accuracy);
    return 1;
  }
  return 0;
}

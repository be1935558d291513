// examples/bahdanau_dates.cc — Bahdanau's encoder–decoder with additive attention (literature
// 001/003) learns to rewrite written dates: "23 November 2026" → "2026-11-23", and
// "November 23, 2026" → the same, character by character.
//
//   encoder  chars ─ Embedding ─ BiGRUEncoder ─ h_j = [h→_j ; h←_j]                  [B, Ns, 2H]
//   decoder  s_0 = tanh(W_init h←_0)
//            c_t = AdditiveAttention(query s_{t−1}, keys h, values h)               (padding masked)
//            s_t = GRUCell([Embedding(y_{t−1}) ; c_t], s_{t−1})
//            logits_t = W_out [s_t ; c_t] + b_out
// Trained with teacher forcing and cross-entropy; evaluated by greedy decoding on held-out
// dates (exact match of all 10 characters); prints one alignment as a text heatmap and writes
// it as bahdanau_alignment.png into png_dir (default ".").
//
//   ./build/release/examples/example_bahdanau_dates [steps] [min_exact_match] [png_dir]
#include <attn/attn.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "pictures.h"
#include "progress.h"

namespace {

using attn::Tensor;
namespace nn = attn::nn;

const char* const kMonths[] = {"January", "February", "March",     "April",   "May",      "June",
                               "July",    "August",   "September", "October", "November", "December"};
const std::string kSrcChars = " ,0123456789ADFJMNOSabceghilmnoprstuvy";  // every char of the inputs
const std::string kTgtChars = "0123456789-";
constexpr std::int64_t kNs = 18, kNt = 10, kBos = 11, E = 32, H = 64, Hd = 128, A = 64, B = 64;

struct date_pair {
  std::string src, tgt;
};

date_pair random_date(nn::rng& gen) {
  const std::int64_t month = gen.integer(1, 12), year = gen.integer(1950, 2049);
  const std::int64_t days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const std::int64_t day = gen.integer(1, days[month - 1]);
  char tgt[16], src[40];
  std::snprintf(tgt, sizeof tgt, "%04lld-%02lld-%02lld", (long long)year, (long long)month, (long long)day);
  if (gen.integer(0, 1))
    std::snprintf(src, sizeof src, "%lld %s %lld", (long long)day, kMonths[month - 1], (long long)year);
  else
    std::snprintf(src, sizeof src, "%s %lld, %lld", kMonths[month - 1], (long long)day, (long long)year);
  return {src, tgt};
}

// [B, Ns] source ids (padded with 0 = ' '), lengths, [B, Nt] targets and decoder inputs.
struct batch {
  Tensor src, lengths, tgt, tgt_in;
  std::vector<date_pair> pairs;
};

batch make_batch(nn::rng& gen, std::int64_t b) {
  batch r{Tensor::zeros({b, kNs}, attn::dtype::i64), Tensor::empty({b}, attn::dtype::i64),
          Tensor::empty({b, kNt}, attn::dtype::i64), Tensor::empty({b, kNt}, attn::dtype::i64), {}};
  for (std::int64_t i = 0; i < b; ++i) {
    const date_pair d = random_date(gen);
    r.pairs.push_back(d);
    for (std::size_t n = 0; n < d.src.size(); ++n)
      r.src.data_as<std::int64_t>()[i * kNs + std::int64_t(n)] = std::int64_t(kSrcChars.find(d.src[n]));
    r.lengths.data_as<std::int64_t>()[i] = std::int64_t(d.src.size());
    for (std::int64_t t = 0; t < kNt; ++t) {
      const std::int64_t id = std::int64_t(kTgtChars.find(d.tgt[std::size_t(t)]));
      r.tgt.data_as<std::int64_t>()[i * kNt + t] = id;
      r.tgt_in.data_as<std::int64_t>()[i * kNt + t] = t == 0 ? kBos : r.tgt.data_as<std::int64_t>()[i * kNt + t - 1];
    }
  }
  return r;
}

// [a ; b] along the last dim of two [B, x] / [B, y] tensors, and back.
Tensor concat(const Tensor& a, const Tensor& b) {
  const std::int64_t n = a.size(0), x = a.size(-1), y = b.size(-1);
  Tensor out = Tensor::empty({n, x + y}, attn::dtype::f32);
  for (std::int64_t i = 0; i < n; ++i) {
    std::copy_n(a.data_as<float>() + i * x, x, out.data_as<float>() + i * (x + y));
    std::copy_n(b.data_as<float>() + i * y, y, out.data_as<float>() + i * (x + y) + x);
  }
  return out;
}
Tensor columns(const Tensor& t, std::int64_t begin, std::int64_t end) {
  return Tensor::copy_of(t.view().slice(1, begin, end));
}
// Column t of [B, N] token ids, as [B].
Tensor token_column(const Tensor& ids, std::int64_t t) {
  const Tensor column = Tensor::copy_of(ids.view().slice(1, t, t + 1));  // [B, 1]
  return Tensor::copy_of(column.view().reshape({ids.size(0)}));
}
// A [B, 1, D] view of [B, D] and back (the attention layer takes sequences).
Tensor as_seq(const Tensor& t) { return Tensor::copy_of(t.view().reshape({t.size(0), 1, t.size(1)})); }
Tensor as_rows(const Tensor& t) { return Tensor::copy_of(t.view().reshape({t.size(0), t.size(2)})); }

struct model {
  nn::Embedding src_emb, tgt_emb;
  nn::BiGRUEncoder enc;
  nn::Linear init;
  nn::AdditiveAttention att;
  nn::GRUCell cell;
  nn::Linear out;

  explicit model(nn::rng& gen)
      : src_emb(std::int64_t(kSrcChars.size()), E, gen),
        tgt_emb(std::int64_t(kTgtChars.size()) + 1, E, gen),
        enc(E, H, gen),
        init(H, Hd, gen),
        att(Hd, 2 * H, A, gen),
        cell(E + 2 * H, Hd, gen),
        out(Hd + 2 * H, std::int64_t(kTgtChars.size()), gen) {}

  nn::parameter_list parameters() {
    nn::parameter_list ps;
    src_emb.parameters(ps, "src_emb.");
    tgt_emb.parameters(ps, "tgt_emb.");
    enc.parameters(ps, "enc.");
    init.parameters(ps, "init.");
    att.parameters(ps, "att.");
    cell.parameters(ps, "cell.");
    out.parameters(ps, "out.");
    return ps;
  }

  struct step_saved {
    Tensor s_prev, context, y_emb, gru_in, s, out_in;
    nn::scored_result att;  // the attention's forward result: its backward starts from it
    nn::GRUCell::saved gru;
  };
  struct saved {
    Tensor x, h, h_bwd, init_pre;
    nn::BiGRUEncoder::saved enc;
    std::vector<step_saved> steps;
    attn::masking_options mask;
  };

  Tensor encode(const batch& bt, saved& s) {
    s.x = src_emb.forward(bt.src);
    const nn::BiGRUEncoder::result r = enc.forward(s.x, bt.lengths, &s.enc);
    s.h = r.out;
    s.mask.nonpad_kv_seqlen = bt.lengths;
    s.h_bwd = r.h_bwd;
    s.init_pre = init.forward(s.h_bwd);
    return nn::activate(nn::activation::tanh, s.init_pre);
  }

  // One decoder step from the previous state and token ids [B]; fills st; returns logits [B, V].
  Tensor step(const saved& s, const Tensor& s_prev, const Tensor& tokens, step_saved& st, bool weights = false,
              Tensor* alignment = nullptr) {
    st.s_prev = s_prev;
    st.att = att.forward(as_seq(s_prev), s.h, s.h, s.mask, weights);
    if (alignment) *alignment = st.att.weights;
    st.context = as_rows(st.att.context);
    st.y_emb = tgt_emb.forward(tokens);
    st.gru_in = concat(st.y_emb, st.context);
    st.s = cell.forward(st.gru_in, s_prev, &st.gru);
    st.out_in = concat(st.s, st.context);
    return out.forward(st.out_in);
  }

  // Teacher-forced logits [B, Nt, V].
  Tensor forward(const batch& bt, saved& s) {
    Tensor state = encode(bt, s);
    const std::int64_t b = bt.src.size(0), V = std::int64_t(kTgtChars.size());
    Tensor logits = Tensor::empty({b, kNt, V}, attn::dtype::f32);
    s.steps.assign(std::size_t(kNt), {});
    for (std::int64_t t = 0; t < kNt; ++t) {
      const Tensor l = step(s, state, token_column(bt.tgt_in, t), s.steps[std::size_t(t)]);
      for (std::int64_t i = 0; i < b; ++i) std::copy_n(l.data_as<float>() + i * V, V, logits.data_as<float>() + (i * kNt + t) * V);
      state = s.steps[std::size_t(t)].s;
    }
    return logits;
  }

  // Backward through time, quoting the forward lines.
  void backward(const batch& bt, const saved& s, const Tensor& dlogits) {
    const std::int64_t b = bt.src.size(0), V = std::int64_t(kTgtChars.size());
    Tensor dh = Tensor::zeros(s.h.shape(), attn::dtype::f32);
    Tensor ds = Tensor::zeros({b, Hd}, attn::dtype::f32);  // ∂L/∂s_t carried back from step t+1
    for (std::int64_t t = kNt - 1; t >= 0; --t) {
      const step_saved& st = s.steps[std::size_t(t)];
      Tensor dl = Tensor::empty({b, V}, attn::dtype::f32);
      for (std::int64_t i = 0; i < b; ++i) std::copy_n(dlogits.data_as<float>() + (i * kNt + t) * V, V, dl.data_as<float>() + i * V);
      // logits = out([s ; c])
      const Tensor dout_in = out.backward(st.out_in, dl);
      nn::add_into(ds, columns(dout_in, 0, Hd));
      Tensor dc = columns(dout_in, Hd, Hd + 2 * H);
      // s = GRU([y_emb ; c], s_prev)
      const nn::GRUCell::grads g = cell.backward(st.gru_in, st.gru, ds);
      tgt_emb.backward(token_column(bt.tgt_in, t), columns(g.dx, 0, E));
      nn::add_into(dc, columns(g.dx, E, E + 2 * H));
      // c = attention(s_prev, h, h)
      const nn::scored_grads ga = att.backward(as_seq(st.s_prev), s.h, s.h, as_seq(dc), s.mask, &st.att);
      nn::add_into(dh, ga.dkeys);
      nn::add_into(dh, ga.dvalues);
      ds = g.dh;
      nn::add_into(ds, as_rows(ga.dquery));
    }
    // s_0 = tanh(init(h←))
    const Tensor dh_bwd = init.backward(s.h_bwd, nn::activate_backward(nn::activation::tanh, s.init_pre, ds));
    // h = BiGRU(x), x = src_emb(src)
    src_emb.backward(bt.src, enc.backward(s.enc, dh, Tensor(), dh_bwd));
  }

  // Greedy decoding; the alignment of batch entry 0 into *alignment ([Nt, Ns]) when given.
  std::vector<std::string> decode(const batch& bt, std::vector<std::vector<double>>* alignment = nullptr) {
    saved s;
    Tensor state = encode(bt, s);
    const std::int64_t b = bt.src.size(0), V = std::int64_t(kTgtChars.size());
    std::vector<std::string> text(static_cast<std::size_t>(b));
    Tensor tokens = Tensor::full({b}, attn::dtype::i64, double(kBos));
    for (std::int64_t t = 0; t < kNt; ++t) {
      step_saved st;
      Tensor weights;
      const Tensor l = step(s, state, tokens, st, alignment != nullptr, &weights);
      if (alignment) {
        alignment->emplace_back();
        for (std::int64_t j = 0; j < kNs; ++j) alignment->back().push_back(weights.get({0, 0, 0, j}));
      }
      for (std::int64_t i = 0; i < b; ++i) {
        const float* row = l.data_as<float>() + i * V;
        const std::int64_t arg = std::max_element(row, row + V) - row;
        tokens.data_as<std::int64_t>()[i] = arg;
        text[std::size_t(i)] += kTgtChars[std::size_t(arg)];
      }
      state = st.s;
    }
    return text;
  }
};

// The alignment as text: one row per output character, one column per input character.
void print_alignment(const date_pair& d, const std::string& got, const std::vector<std::vector<double>>& w) {
  const char* shades = " .:-=+*#%@";
  std::printf("\nalignment of \"%s\" -> \"%s\" (darker = more weight)\n      %s\n", d.src.c_str(), got.c_str(),
              d.src.c_str());
  for (std::size_t t = 0; t < w.size(); ++t) {
    std::printf("  %c   ", got[t]);
    for (std::size_t j = 0; j < d.src.size(); ++j) std::putchar(shades[std::min<int>(9, int(w[t][j] * 10))]);
    std::putchar('\n');
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 600;
  const double min_exact = argc > 2 ? std::atof(argv[2]) : 0.0;
  nn::rng gen(1), data(2), held_out(3);
  model m(gen);
  const nn::parameter_list ps = m.parameters();
  std::printf("parameters: %lld\n", (long long)nn::parameter_count(ps));
  nn::adam opt;
  const progress meter;
  for (int step = 0; step < steps; ++step) {
    const batch bt = make_batch(data, B);
    model::saved s;
    const nn::loss_result l = nn::cross_entropy(m.forward(bt, s), bt.tgt);
    nn::zero_grad(ps);
    m.backward(bt, s, l.grad);
    nn::clip_grad_norm(ps, 1.0);
    opt.lr = nn::warmup_cosine(step, 100, steps, 3e-3, 1e-4);
    opt.step(ps);
    meter.report(step, steps, 100, l, "char accuracy", 1, "steps");
  }
  const batch test = make_batch(held_out, 512);
  std::vector<std::vector<double>> alignment;
  const std::vector<std::string> got = m.decode(test, &alignment);
  std::int64_t exact = 0;
  for (std::size_t i = 0; i < got.size(); ++i) exact += got[i] == test.pairs[i].tgt;
  for (std::size_t i = 0; i < 3; ++i) std::printf("%-20s -> %s\n", test.pairs[i].src.c_str(), got[i].c_str());
  print_alignment(test.pairs[0], got[0], alignment);
  // The same alignment as a picture: [Nt output characters, the input's characters].
  const std::string& src = test.pairs[0].src;
  Tensor picture = Tensor::empty({kNt, std::int64_t(src.size())}, attn::dtype::f64);
  for (std::int64_t t = 0; t < kNt; ++t)
    for (std::size_t j = 0; j < src.size(); ++j) picture.set({t, std::int64_t(j)}, alignment[std::size_t(t)][j]);
  pictures(argc, argv, 3).heatmap("bahdanau_alignment.png", picture, char_labels(got[0]), char_labels(src),
                                  {.title = "alignment: \"" + src + "\" -> \"" + got[0] + "\"",
                                   .range = attn::viz::value_range::unit});
  const double rate = double(exact) / double(got.size());
  std::printf("held-out exact match (greedy): %.3f\n", rate);
  if (rate < min_exact) {
    std::printf("exact match %.3f is below the required %.3f\n", rate, min_exact);
    return 1;
  }
  return 0;
}

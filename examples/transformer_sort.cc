// examples/transformer_sort.cc — a small Transformer encoder–decoder (literature 000) learns to
// sort strings of digits: "3 1 4 1 5 9 2 6" → "1 1 2 3 4 5 6 9". Built from attn::nn layers with
// an explicit backward; evaluated by greedy decoding through the decoder's KV cache.
//
//   src [B, N] ─ Embedding ─ encoder layer ─ memory [B, N, E]      (no positions: sorting ignores order)
//   BOS + tgt[:-1] ─ Embedding ─ decoder layer (rotary self-attention, cross-attention) ─ LN ─ Linear ─ logits
//
//   ./build/release/examples/example_transformer_sort [steps] [min_exact_match] [png_dir]
// Prints loss and token accuracy while training, then the exact-match rate of greedy decoding
// on 512 held-out strings; exits 1 below min_exact_match (used as a test). Writes the decoder's
// cross-attention on one held-out string, one picture a head, as transformer_sort_cross_head<h>.png
// into png_dir (default ".").
#include <attn/attn.h>

#include <cstdio>
#include <cstdlib>

#include "pictures.h"
#include "progress.h"

namespace {

using attn::Tensor;
namespace nn = attn::nn;
constexpr std::int64_t V = 10, BOS = 10, N = 8, E = 64, B = 64;

struct model {
  nn::Embedding src_emb, tgt_emb;
  nn::TransformerEncoderLayer enc;
  nn::TransformerDecoderLayer dec;
  nn::LayerNorm final_norm;
  nn::Linear head;

  explicit model(nn::rng& gen)
      : src_emb(V, E, gen),
        tgt_emb(V + 1, E, gen),
        enc({.d_model = E, .num_heads = 4, .d_ff = 4 * E, .pre_norm = true}, gen),
        dec({.d_model = E, .num_heads = 4, .d_ff = 4 * E, .pre_norm = true, .rotary = true}, gen),
        final_norm(E),
        head(E, V, gen) {}

  nn::parameter_list parameters() {
    nn::parameter_list ps;
    src_emb.parameters(ps, "src_emb.");
    tgt_emb.parameters(ps, "tgt_emb.");
    enc.parameters(ps, "enc.");
    dec.parameters(ps, "dec.");
    final_norm.parameters(ps, "final_norm.");
    head.parameters(ps, "head.");
    return ps;
  }

  struct saved {
    nn::TransformerEncoderLayer::saved enc;
    nn::TransformerDecoderLayer::saved dec;
    Tensor d, n;  // decoder output, after the final norm
  };
  Tensor forward(const Tensor& src, const Tensor& tgt_in, saved& s) {
    const Tensor memory = enc.forward(src_emb.forward(src), {}, &s.enc);
    s.d = dec.forward(tgt_emb.forward(tgt_in), memory, {}, &s.dec);
    s.n = final_norm.forward(s.d);
    return head.forward(s.n);
  }
  // Each line undoes one line of forward, last first.
  void backward(const Tensor& src, const Tensor& tgt_in, const saved& s, const Tensor& dlogits) {
    const Tensor dn = head.backward(s.n, dlogits);
    const nn::TransformerDecoderLayer::grads g = dec.backward(s.dec, final_norm.backward(s.d, dn));
    tgt_emb.backward(tgt_in, g.dx);
    src_emb.backward(src, enc.backward(s.enc, g.dmemory));
  }

  // The cross-attention [1, Hq, N, N] of one string src [1, N] while it decodes `out` [1, N]:
  // the forward on BOS + out[:-1] saves what the cross-attention saw, which is run again with
  // need_weights.
  Tensor cross_attention(const Tensor& src, const Tensor& out) {
    Tensor tgt_in = Tensor::full({1, N}, attn::dtype::i64, double(BOS));
    for (std::int64_t t = 1; t < N; ++t) tgt_in.set({0, t}, out.get({0, t - 1}));
    enc.set_training(false), dec.set_training(false);
    saved s;
    forward(src, tgt_in, s);
    enc.set_training(true), dec.set_training(true);
    return dec.cross_attn.forward(s.dec.cross.query, s.dec.cross.key, s.dec.cross.value, {}, nullptr, true).weights;
  }

  // Greedy decoding: one token a step through the self-attention cache.
  Tensor greedy(const Tensor& src) {
    const std::int64_t b = src.size(0);
    enc.set_training(false), dec.set_training(false);
    const Tensor memory = enc.forward(src_emb.forward(src));
    const auto kv = dec.cross_attn.project_kv(memory, memory);
    attn::kv_cache cache = dec.self_attn.make_cache(b, N);
    Tensor out = Tensor::zeros({b, N}, attn::dtype::i64);
    Tensor token = Tensor::full({b, 1}, attn::dtype::i64, double(BOS));
    for (std::int64_t t = 0; t < N; ++t) {
      const Tensor logits = head.forward(final_norm.forward(dec.forward_step(tgt_emb.forward(token), cache, kv)));
      for (std::int64_t i = 0; i < b; ++i) {
        const float* l = logits.data_as<float>() + i * V;
        const std::int64_t arg = std::max_element(l, l + V) - l;
        out.data_as<std::int64_t>()[i * N + t] = arg;
        token.data_as<std::int64_t>()[i] = arg;
      }
    }
    enc.set_training(true), dec.set_training(true);
    return out;
  }
};

// src: random digits; tgt: src sorted; tgt_in: BOS + tgt[:-1].
void make_batch(nn::rng& gen, std::int64_t b, Tensor& src, Tensor& tgt, Tensor& tgt_in) {
  src = Tensor::empty({b, N}, attn::dtype::i64), tgt = Tensor::empty({b, N}, attn::dtype::i64);
  tgt_in = Tensor::empty({b, N}, attn::dtype::i64);
  for (std::int64_t i = 0; i < b; ++i) {
    std::int64_t* s = src.data_as<std::int64_t>() + i * N;
    std::int64_t* t = tgt.data_as<std::int64_t>() + i * N;
    for (std::int64_t n = 0; n < N; ++n) s[n] = gen.integer(0, V - 1);
    std::copy(s, s + N, t);
    std::sort(t, t + N);
    std::int64_t* ti = tgt_in.data_as<std::int64_t>() + i * N;
    ti[0] = BOS;
    std::copy(t, t + N - 1, ti + 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 1500;
  const double min_exact = argc > 2 ? std::atof(argv[2]) : 0.0;
  nn::rng gen(1), data(2), held_out(3);
  model m(gen);
  const nn::parameter_list ps = m.parameters();
  std::printf("parameters: %lld\n", (long long)nn::parameter_count(ps));
  nn::adam opt{.lr = 1e-3, .weight_decay = 0.01, .decoupled = true};
  const progress meter;
  for (int step = 0; step < steps; ++step) {
    Tensor src, tgt, tgt_in;
    make_batch(data, B, src, tgt, tgt_in);
    model::saved s;
    const nn::loss_result l = nn::cross_entropy(m.forward(src, tgt_in, s), tgt);
    nn::zero_grad(ps);
    m.backward(src, tgt_in, s, l.grad);
    nn::clip_grad_norm(ps, 1.0);
    opt.lr = nn::warmup_cosine(step, 100, steps, 2e-3, 1e-4);
    opt.step(ps);
    meter.report(step, steps, 100, l, "token accuracy", double(B * N), "tokens");
  }
  Tensor src, tgt, tgt_in;
  make_batch(held_out, 512, src, tgt, tgt_in);
  const Tensor pred = m.greedy(src);
  std::int64_t exact = 0;
  for (std::int64_t i = 0; i < 512; ++i)
    exact += std::equal(pred.data_as<std::int64_t>() + i * N, pred.data_as<std::int64_t>() + (i + 1) * N,
                        tgt.data_as<std::int64_t>() + i * N);
  const double rate = double(exact) / 512.0;
  // Where each output position looks in the input: sorting reads the input digit it writes.
  const Tensor one = Tensor::copy_of(src.view().slice(0, 0, 1)), got = Tensor::copy_of(pred.view().slice(0, 0, 1));
  const Tensor cross = m.cross_attention(one, got);
  std::vector<std::string> in_digits, out_digits;
  for (std::int64_t n = 0; n < N; ++n)
    in_digits.push_back(std::to_string(one.data_as<std::int64_t>()[n])),
        out_digits.push_back(std::to_string(got.data_as<std::int64_t>()[n]));
  const pictures png(argc, argv, 3);
  for (std::int64_t h = 0; h < cross.size(1); ++h)
    png.heatmap("transformer_sort_cross_head" + std::to_string(h) + ".png", attn::viz::matrix_of(cross, 0, h), out_digits,
                in_digits, {.title = "cross-attention head " + std::to_string(h), .range = attn::viz::value_range::unit});
  std::printf("held-out exact match (greedy, KV cache): %.3f\n", rate);
  if (rate < min_exact) {
    std::printf("exact match %.3f is below the required %.3f\n", rate, min_exact);
    return 1;
  }
  return 0;
}

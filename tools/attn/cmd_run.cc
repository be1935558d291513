// tools/attn/cmd_run.cc — `attn run`: one attention (and optionally its backward) from .npy
// files, with every option of attn::attention.
//
//   attn run --q q.npy --k k.npy --v v.npy --causal --out out.npy --lse lse.npy
//   attn run ... --dout dout.npy --dq dq.npy --dk dk.npy --dv dv.npy      (backward too)
//   attn run ... --score additive --W-q wq.npy --W-k wk.npy --w-v wv.npy --distribution entmax15
//                                                   (the attention family, include/attn/family.h)
//   attn run ... --probs-png p.png --probs-head 0,2   (batch 0, head 2's probabilities as a heatmap)
//   attn run ... --linear elu_plus_one --causal        (linear attention, Katharopoulos et al. 2020)
#include <fmt/format.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "attn/attn.h"
#include "attn/viz.h"
#include "cli.h"

namespace attn::cli {
namespace {

struct run_args {
  std::string q, k, v, out, lse, probs, probs_png, probs_head, qk, mask, past_key, past_value, present_key,
      present_value, nonpad, alibi, sinks, dout, dq, dk, dv, dmask, dalibi, dsinks;
  std::string dtype_name = "input", alignment = "top_left", qk_mode = "none", backend = "automatic";
  bool ring = false;  // --ring: ring attention over MPI (cmd_run_ring.cc)
  std::string layout = "contiguous";
  std::optional<double> scale;
  double softcap = 0;
  bool causal = false, explain = false;
  std::int64_t window_left = -1, window_right = -1, q_heads = 0, kv_heads = 0;
  int threads = 0;
  // The attention family (--score / --distribution): see run_family.
  std::string score, distribution, activation = "tanh", hardmax_gradient = "zero", family_path = "automatic", W, b,
      W_q, W_k, w_v, W_a, dW, db, dW_q, dW_k, dw_v, dW_a, gaussian_form = "sigma";
  // Linear attention (--linear FEATURE_MAP): see run_linear.
  std::string linear;
  bool linear_unnormalised = false;
  double temperature = 1.0, bandwidth = 1.0;
  std::optional<double> sigmoid_bias;
  std::int64_t topk = 1;
};

dtype parse_dtype(const std::string& s) {
  static const std::map<std::string, dtype> m = {{"f32", dtype::f32},  {"float32", dtype::f32}, {"f16", dtype::f16},
                                                 {"float16", dtype::f16}, {"bf16", dtype::bf16}, {"bfloat16", dtype::bf16},
                                                 {"f64", dtype::f64},  {"float64", dtype::f64}};
  return m.at(s);
}

using named_path = std::pair<const char*, const std::string*>;

// Two outputs on one file, or an output over an input, would lose data without a word: both
// are refused, naming the two options. Paths are compared after resolving ".", ".." and links.
void check_paths(const run_args& a) {
  const named_path inputs[] = {{"--q", &a.q},         {"--k", &a.k},       {"--v", &a.v},
                               {"--mask", &a.mask},   {"--past-key", &a.past_key}, {"--past-value", &a.past_value},
                               {"--nonpad-kv-seqlen", &a.nonpad}, {"--alibi-slopes", &a.alibi},
                               {"--sinks", &a.sinks}, {"--dout", &a.dout}, {"--W", &a.W}, {"--b", &a.b},
                               {"--W-q", &a.W_q},     {"--W-k", &a.W_k},   {"--w-v", &a.w_v}, {"--W-a", &a.W_a}};
  const named_path outputs[] = {{"--out", &a.out},     {"--lse", &a.lse},       {"--probs", &a.probs},
                                {"--probs-png", &a.probs_png},
                                {"--qk", &a.qk},       {"--present-key", &a.present_key},
                                {"--present-value", &a.present_value}, {"--dq", &a.dq}, {"--dk", &a.dk},
                                {"--dv", &a.dv},       {"--dmask", &a.dmask},   {"--dalibi", &a.dalibi},
                                {"--dsinks", &a.dsinks}, {"--dW", &a.dW},       {"--db", &a.db},
                                {"--dW-q", &a.dW_q},   {"--dW-k", &a.dW_k},     {"--dw-v", &a.dw_v},
                                {"--dW-a", &a.dW_a}};
  auto resolved = [](const std::string& p) {
    std::error_code ec;
    const std::filesystem::path r = std::filesystem::weakly_canonical(p, ec);
    return ec ? std::filesystem::path(p).lexically_normal() : r;
  };
  for (std::size_t i = 0; i < std::size(outputs); ++i) {
    const auto [out, path] = outputs[i];
    if (path->empty()) continue;
    const std::filesystem::path r = resolved(*path);
    for (std::size_t j = 0; j < i; ++j)
      if (!outputs[j].second->empty() && resolved(*outputs[j].second) == r)
        throw error(fmt::format("attn run: {} and {} both write {}", outputs[j].first, out, *path));
    for (const auto& [in, in_path] : inputs)
      if (!in_path->empty() && resolved(*in_path) == r)
        throw error(fmt::format("attn run: {} would overwrite the input {} ({})", out, in, *path));
  }
}

void write_if(const std::string& path, const Tensor& t, const char* what) {
  if (path.empty()) return;
  if (!t.defined()) throw error(fmt::format("attn run: --{} was asked for but this call produces none", what));
  write_npy(path, t);
}

struct batch_head {
  std::int64_t b = 0, h = 0;
};

// --probs-head "B,H": two indices >= 0; checked before anything runs (the range after, against
// the probabilities' shape).
batch_head parse_probs_head(const run_args& a) {
  if (a.probs_head.empty()) return {};
  if (a.probs_png.empty()) throw error("attn run: --probs-head needs --probs-png");
  batch_head bh;
  char comma = 0, rest = 0;
  const int n = std::sscanf(a.probs_head.c_str(), "%" SCNd64 "%c%" SCNd64 "%c", &bh.b, &comma, &bh.h, &rest);
  if (n != 3 || comma != ',' || bh.b < 0 || bh.h < 0)
    throw error(fmt::format("attn run: --probs-head \"{}\" is not B,H (two indices >= 0, e.g. 0,1)", a.probs_head));
  return bh;
}

// --probs-png: one (batch, head) of the probabilities [B, Hq, Nq, Nk] as a heatmap on [0, 1],
// rows the queries, columns the keys, labelled by position.
void write_probs_png(const run_args& a, const Tensor& probs) {
  if (a.probs_png.empty()) return;
  const batch_head bh = parse_probs_head(a);
  if (bh.b >= probs.size(0) || bh.h >= probs.size(1))
    throw error(fmt::format("attn run: --probs-head {},{} is outside the probabilities {} (batch < {}, head < {})", bh.b,
                            bh.h, shape_str(probs.shape()), probs.size(0), probs.size(1)));
  auto positions = [](std::int64_t n) {
    std::vector<std::string> s;
    for (std::int64_t i = 0; i < n; ++i) s.push_back(std::to_string(i));
    return s;
  };
  viz::write_heatmap(a.probs_png, viz::matrix_of(probs, bh.b, bh.h), positions(probs.size(2)), positions(probs.size(3)),
                     {.title = fmt::format("probabilities, batch {} head {}", bh.b, bh.h), .range = viz::value_range::unit});
}

// Options of the core op that neither the family nor linear attention takes: refused by name.
void refuse_core_only(const run_args& a, const char* what) {
  const std::pair<const char*, bool> core_only[] = {
      {"--lse", !a.lse.empty()},          {"--qk", !a.qk.empty()},           {"--qk-mode", a.qk_mode != "none"},
      {"--softcap", a.softcap != 0},      {"--alibi-slopes", !a.alibi.empty()}, {"--sinks", !a.sinks.empty()},
      {"--past-key", !a.past_key.empty()}, {"--past-value", !a.past_value.empty()},
      {"--present-key", !a.present_key.empty()}, {"--present-value", !a.present_value.empty()},
      {"--backend", a.backend != "automatic"}, {"--explain", a.explain}, {"--dmask", !a.dmask.empty()},
      {"--dalibi", !a.dalibi.empty()},    {"--dsinks", !a.dsinks.empty()}};
  for (auto [name, given] : core_only)
    if (given) throw error(fmt::format("attn run: {} is an option of the core op, not of {}", name, what));
}

causal_alignment parse_alignment(const std::string& s) {
  return s == "bottom_right" ? causal_alignment::bottom_right
         : s == "after_past" ? causal_alignment::after_past
                             : causal_alignment::top_left;
}

// attn run with --linear: attn::linear_attention (padding through --nonpad-kv-seqlen; causal).
// Family options and the core op's own are refused by name; --mask and windows by the library.
int run_linear(const run_args& a, const Tensor& q, const Tensor& k, const Tensor& v) {
  refuse_core_only(a, "--linear");
  const std::pair<const char*, bool> family_only[] = {
      {"--score", !a.score.empty()}, {"--distribution", !a.distribution.empty()}, {"--probs", !a.probs.empty()},
      {"--probs-png", !a.probs_png.empty()}, {"--W", !a.W.empty()}, {"--b", !a.b.empty()},
      {"--W-q", !a.W_q.empty()}, {"--W-k", !a.W_k.empty()}, {"--w-v", !a.w_v.empty()}, {"--W-a", !a.W_a.empty()},
      {"--scale", a.scale.has_value()}, {"--dW", !a.dW.empty()}, {"--db", !a.db.empty()},
      {"--dW-q", !a.dW_q.empty()}, {"--dW-k", !a.dW_k.empty()}, {"--dw-v", !a.dw_v.empty()},
      {"--dW-a", !a.dW_a.empty()}};
  for (auto [name, given] : family_only)
    if (given)
      throw error(fmt::format("attn run: {} does not apply to --linear (linear attention forms no scores)", name));
  linear_attention_options o;
  o.phi = parse_feature_map(a.linear);
  o.normalize = !a.linear_unnormalised;
  o.is_causal = a.causal;
  o.alignment = parse_alignment(a.alignment);
  o.window_left = a.window_left, o.window_right = a.window_right;
  o.q_num_heads = a.q_heads, o.kv_num_heads = a.kv_heads;
  if (!a.mask.empty()) o.attn_mask = read_npy(a.mask);
  if (!a.nonpad.empty()) o.nonpad_kv_seqlen = read_npy(a.nonpad);
  const execution exec{.path = parse_family_path(a.family_path), .num_threads = a.threads};
  const linear_attention_result r = linear_attention(q, k, v, o, exec);
  write_npy(a.out, r.out);
  const bool want_grad = !a.dq.empty() || !a.dk.empty() || !a.dv.empty();
  if (want_grad && a.dout.empty()) throw error("attn run: gradients need --dout");
  if (!a.dout.empty()) {
    const linear_attention_grads g = linear_attention_backward(q, k, v, read_npy(a.dout).to(q.type()), o, exec);
    write_if(a.dq, g.dq, "dq");
    write_if(a.dk, g.dk, "dk");
    write_if(a.dv, g.dv, "dv");
  }
  fmt::print("out {} {} (linear attention, {}{}, path {})\n", shape_str(r.out.shape()), dtype_name(r.out.type()),
             to_string(o.phi), o.normalize ? "" : ", unnormalised", r.path);
  return 0;
}

// attn run with --score or --distribution: attn::attention_family on the same .npy inputs and
// masks. Options of the core op that the family does not take are refused by name.
int run_family(const run_args& a, const Tensor& q, const Tensor& k, const Tensor& v) {
  refuse_core_only(a, "--score/--distribution");
  family_options o;
  o.score.kind = parse_score_kind(a.score.empty() ? "scaled_dot" : a.score);
  o.distribution.kind = parse_distribution_kind(a.distribution.empty() ? "softmax" : a.distribution);
  o.score.scale = a.scale;
  o.score.activation = parse_score_activation(a.activation);
  o.score.temperature = a.temperature;
  o.score.bandwidth = a.bandwidth;
  o.score.gaussian = parse_gaussian_form(a.gaussian_form);
  if (o.score.gaussian != gaussian_form::sigma && o.score.kind != score_kind::gaussian)
    throw error(fmt::format("attn run: --gaussian-form {} needs --score gaussian (got {})", a.gaussian_form,
                            to_string(o.score.kind)));
  o.distribution.sigmoid_bias = a.sigmoid_bias;
  o.distribution.k = a.topk;
  o.distribution.hardmax_grad = parse_hardmax_gradient(a.hardmax_gradient);
  o.is_causal = a.causal;
  o.alignment = parse_alignment(a.alignment);
  o.window_left = a.window_left, o.window_right = a.window_right;
  o.q_num_heads = a.q_heads, o.kv_num_heads = a.kv_heads;
  const execution exec{.path = parse_family_path(a.family_path), .num_threads = a.threads};
  auto opt = [&](const std::string& path) -> std::optional<TensorArg> {
    if (path.empty()) return std::nullopt;
    return read_npy(path);  // the option owns the loaded tensor
  };
  o.attn_mask = opt(a.mask);
  o.nonpad_kv_seqlen = opt(a.nonpad);
  o.score.W = opt(a.W), o.score.b = opt(a.b), o.score.W_q = opt(a.W_q), o.score.W_k = opt(a.W_k);
  o.score.w_v = opt(a.w_v), o.score.W_a = opt(a.W_a);

  const family_result r = attention_family(q, k, v, o, exec);
  write_npy(a.out, r.out);
  if (!a.probs.empty() || !a.probs_png.empty()) {
    const Tensor p = attention_family_weights(q, k, v, o, exec);
    if (!a.probs.empty()) write_npy(a.probs, p);
    write_probs_png(a, p);
  }
  const bool want_grad = !a.dq.empty() || !a.dk.empty() || !a.dv.empty() || !a.dW.empty() || !a.db.empty() ||
                         !a.dW_q.empty() || !a.dW_k.empty() || !a.dw_v.empty() || !a.dW_a.empty();
  if (want_grad && a.dout.empty()) throw error("attn run: gradients need --dout");
  if (!a.dout.empty()) {
    const family_grads g = attention_family_backward(q, k, v, read_npy(a.dout).to(q.type()), r, o, exec);
    write_if(a.dq, g.dq, "dq");
    write_if(a.dk, g.dk, "dk");
    write_if(a.dv, g.dv, "dv");
    write_if(a.dW, g.dW, "dW");
    write_if(a.db, g.db, "db");
    write_if(a.dW_q, g.dW_q, "dW-q");
    write_if(a.dW_k, g.dW_k, "dW-k");
    write_if(a.dw_v, g.dw_v, "dw-v");
    write_if(a.dW_a, g.dW_a, "dW-a");
    if (o.score.kind == score_kind::cosine) fmt::print("dtemperature {}\n", g.dtemperature);
    if (o.score.kind == score_kind::gaussian || o.score.kind == score_kind::box || o.score.kind == score_kind::triangle)
      fmt::print("dbandwidth {}\n", g.dbandwidth);
    if (o.distribution.kind == distribution_kind::sigmoid) fmt::print("dsigmoid_bias {}\n", g.dsigmoid_bias);
  }
  fmt::print("out {} {} ({} x {}, path {})\n", shape_str(r.out.shape()), dtype_name(r.out.type()),
             to_string(o.score.kind), to_string(o.distribution.kind), r.path);
  return 0;
}

int run(const run_args& a) {
  check_paths(a);
  parse_probs_head(a);  // a bad --probs-head stops the run before any work
  Tensor q = read_npy(a.q), k = read_npy(a.k), v = read_npy(a.v);
  if (a.dtype_name != "input") {
    const dtype t = parse_dtype(a.dtype_name);
    q = q.to(t), k = k.to(t), v = v.to(t);
  }
  if (a.linear_unnormalised && a.linear.empty()) throw error("attn run: --linear-unnormalised needs --linear");
  if (!a.linear.empty()) return run_linear(a, q, k, v);
  if (!a.score.empty() || !a.distribution.empty()) return run_family(a, q, k, v);
  if (a.gaussian_form != "sigma") throw error("attn run: --gaussian-form needs --score gaussian");
  attention_options o;
  o.scale = a.scale;
  o.is_causal = a.causal;
  o.alignment = a.alignment == "bottom_right" ? causal_alignment::bottom_right
                : a.alignment == "after_past" ? causal_alignment::after_past
                                              : causal_alignment::top_left;
  o.window_left = a.window_left;
  o.window_right = a.window_right;
  o.softcap = a.softcap;
  o.q_num_heads = a.q_heads;
  o.kv_num_heads = a.kv_heads;
  const execution exec{.use_backend = parse_backend(a.backend), .num_threads = a.threads};
  static const std::map<std::string, qk_output> modes = {{"none", qk_output::none},
                                                         {"scaled", qk_output::scaled},
                                                         {"softcapped", qk_output::softcapped},
                                                         {"biased", qk_output::biased},
                                                         {"probabilities", qk_output::probabilities}};
  o.return_qk = modes.at(a.qk_mode);
  if (!a.probs.empty() || !a.probs_png.empty()) {
    if (o.return_qk != qk_output::none && o.return_qk != qk_output::probabilities)
      throw error("attn run: --probs/--probs-png and --qk-mode other than probabilities cannot be combined");
    o.return_qk = qk_output::probabilities;
  }
  if (!a.qk.empty() && o.return_qk == qk_output::none)
    throw error("attn run: --qk needs --qk-mode (scaled, softcapped, biased or probabilities)");
  // The options own the tensors they are given (TensorArg).
  auto opt = [&](const std::string& path) -> std::optional<TensorArg> {
    if (path.empty()) return std::nullopt;
    return read_npy(path);
  };
  auto opt_as_q = [&](const std::string& path) -> std::optional<TensorArg> {
    if (path.empty()) return std::nullopt;
    return read_npy(path).to(q.type());
  };
  o.attn_mask = opt(a.mask);
  o.past_key = opt_as_q(a.past_key);
  o.past_value = opt_as_q(a.past_value);
  o.nonpad_kv_seqlen = opt(a.nonpad);
  o.alibi_slopes = opt(a.alibi);
  o.sinks = opt(a.sinks);

  if (a.ring) {
    const std::pair<const char*, bool> single_only[] = {
        {"--probs", !a.probs.empty()}, {"--qk", !a.qk.empty()}, {"--present-key", !a.present_key.empty()},
        {"--present-value", !a.present_value.empty()}, {"--dmask", !a.dmask.empty()}, {"--explain", a.explain}};
    for (auto [name, given] : single_only)
      if (given) throw error(fmt::format("attn run: {} cannot be combined with --ring", name));
    if ((!a.dq.empty() || !a.dk.empty() || !a.dv.empty() || !a.dalibi.empty() || !a.dsinks.empty()) && a.dout.empty())
      throw error("attn run: gradients need --dout");
    ring_run rr{a.layout, a.out, a.lse, a.dq, a.dk, a.dv, a.dalibi, a.dsinks, std::nullopt};
    if (!a.dout.empty()) rr.dout = read_npy(a.dout).to(q.type());
    return run_ring(rr, q, k, v, o, exec);
  }
  if (a.explain) fmt::print("{}\n", explain_backend(q, k, v, o, !a.dout.empty(), exec));
  const attention_result r = attention(q, k, v, o, exec);
  write_npy(a.out, r.out);
  write_if(a.lse, r.lse, "lse");
  write_if(a.probs, r.qk, "probs");
  write_probs_png(a, r.qk);
  write_if(a.qk, r.qk, "qk");
  write_if(a.present_key, r.present_key, "present-key");
  write_if(a.present_value, r.present_value, "present-value");

  const bool want_grad = !a.dq.empty() || !a.dk.empty() || !a.dv.empty() || !a.dmask.empty() || !a.dalibi.empty() ||
                         !a.dsinks.empty();
  if (want_grad && a.dout.empty()) throw error("attn run: gradients need --dout");
  if (!a.dout.empty()) {
    const Tensor dout = read_npy(a.dout).to(q.type());
    attention_options ob = o;
    ob.return_qk = qk_output::none;
    TensorView kk = k, vv = v;
    if (o.past_key) ob.past_key.reset(), ob.past_value.reset(), kk = r.present_key, vv = r.present_value;
    const attention_grads g = attention_backward(q, kk, vv, r.out, dout, r.lse, ob, exec);
    write_if(a.dq, g.dq, "dq");
    write_if(a.dk, g.dk, "dk");
    write_if(a.dv, g.dv, "dv");
    write_if(a.dmask, g.dattn_mask, "dmask");
    write_if(a.dalibi, g.dalibi_slopes, "dalibi");
    write_if(a.dsinks, g.dsinks, "dsinks");
  }
  fmt::print("out {} {} (backend {})\n", shape_str(r.out.shape()), dtype_name(r.out.type()), r.backend);
  return 0;
}

}  // namespace

void add_run(CLI::App& app, int& exit_code) {
  auto* s = app.add_subcommand("run", "Compute one attention (and optionally its gradients) from .npy files");
  auto a = std::make_shared<run_args>();
  s->add_option("--q", a->q, "queries [B, Hq, Nq, D] or [B, Nq, Hq*D]")->required();
  s->add_option("--k", a->k, "keys [B, Hkv, Nk, D] or [B, Nk, Hkv*D]")->required();
  s->add_option("--v", a->v, "values [B, Hkv, Nk, Dv] or [B, Nk, Hkv*Dv]")->required();
  s->add_option("--out", a->out, "output file")->required();
  s->add_option("--lse", a->lse, "write the log-sum-exp [B, Hq, Nq]");
  s->add_option("--probs", a->probs, "write the probabilities [B, Hq, Nq, Nk]");
  s->add_option("--probs-png", a->probs_png, "draw one (batch, head) of the probabilities as a PNG heatmap");
  s->add_option("--probs-head", a->probs_head, "B,H: the batch and head --probs-png draws (default 0,0)");
  s->add_option("--qk", a->qk, "write the intermediate chosen by --qk-mode");
  s->add_option("--qk-mode", a->qk_mode, "scaled | softcapped | biased | probabilities")
      ->check(CLI::IsMember({"none", "scaled", "softcapped", "biased", "probabilities"}));
  s->add_option("--dtype", a->dtype_name, "compute dtype: input (as read) | f32 | f16 | bf16 | f64")
      ->check(CLI::IsMember({"input", "f32", "float32", "f16", "float16", "bf16", "bfloat16", "f64", "float64"}));
  s->add_option("--scale", a->scale, "score scale (default 1/sqrt(D))");
  s->add_flag("--causal", a->causal, "causal mask");
  s->add_option("--alignment", a->alignment, "causal/window alignment: top_left | bottom_right | after_past")
      ->check(CLI::IsMember({"top_left", "bottom_right", "after_past"}));
  s->add_option("--window-left", a->window_left, "sliding window: keys before the query position kept (-1: all)");
  s->add_option("--window-right", a->window_right, "sliding window: keys after the query position kept (-1: all)");
  s->add_option("--softcap", a->softcap, "softcap * tanh(x / softcap) on the scores (0: off)");
  s->add_option("--mask", a->mask, "bool (true = attend) or float additive mask, broadcast to [B, Hq, Nq, Nk]");
  s->add_option("--nonpad-kv-seqlen", a->nonpad, "int64 or int32 [B]: valid keys per batch row");
  s->add_option("--alibi-slopes", a->alibi, "ALiBi slopes [Hq] or [B, Hq]");
  s->add_option("--sinks", a->sinks, "attention-sink logits [Hq]");
  s->add_option("--past-key", a->past_key, "KV cache keys [B, Hkv, P, D]");
  s->add_option("--past-value", a->past_value, "KV cache values [B, Hkv, P, Dv]");
  s->add_option("--present-key", a->present_key, "write the concatenated keys");
  s->add_option("--present-value", a->present_value, "write the concatenated values");
  s->add_option("--q-num-heads", a->q_heads, "query heads (required for 3-D inputs)");
  s->add_option("--kv-num-heads", a->kv_heads, "key/value heads (required for 3-D inputs)");
  s->add_option("--backend", a->backend, "automatic | reference | cpu | cuda (docs/CUDA.md; named only)")
      ->check(backend_name_check());
  s->add_option("--threads", a->threads, "threads (0: all)");
  s->add_flag("--ring", a->ring, "ring attention over MPI: run under mpirun -np P; rank 0 writes the outputs");
  s->add_option("--layout", a->layout, "--ring: how the sequence is split: contiguous | zigzag")
      ->check(CLI::IsMember({"contiguous", "zigzag"}));
  s->add_flag("--explain", a->explain, "print which backend runs and why others do not");
  s->add_option("--dout", a->dout, "upstream gradient of out: runs the backward");
  s->add_option("--dq", a->dq, "write dq");
  s->add_option("--dk", a->dk, "write dk");
  s->add_option("--dv", a->dv, "write dv");
  s->add_option("--dmask", a->dmask, "write the gradient of a float mask");
  s->add_option("--dalibi", a->dalibi, "write the gradient of the ALiBi slopes");
  s->add_option("--dsinks", a->dsinks, "write the gradient of the sink logits");
  // The attention family (include/attn/family.h, docs/FAMILY.md).
  s->add_option("--score", a->score,
                "family score: dot | scaled_dot | general | biased_general | activated_general | additive | cosine | "
                "location | gaussian | box | triangle (runs attn::attention_family)")
      ->check(CLI::IsMember({"dot", "scaled_dot", "general", "biased_general", "activated_general", "additive",
                             "cosine", "location", "gaussian", "box", "triangle"}));
  s->add_option("--distribution", a->distribution,
                "family distribution: softmax | sigmoid | sparsemax | entmax15 | hardmax | topk | kernel | identity")
      ->check(CLI::IsMember({"softmax", "sigmoid", "sparsemax", "entmax15", "hardmax", "topk", "kernel", "identity"}));
  s->add_option("--activation", a->activation, "activated_general: tanh | relu | sigmoid")
      ->check(CLI::IsMember({"tanh", "relu", "sigmoid"}));
  s->add_option("--temperature", a->temperature, "cosine: temperature tau > 0 (default 1)");
  s->add_option("--bandwidth", a->bandwidth, "gaussian, box, triangle: bandwidth h > 0 (default 1)");
  s->add_option("--gaussian-form", a->gaussian_form,
                "gaussian: sigma (exp(-|q-k|^2/(2h^2)), default) | width (exp(-|q-k|^2/h), seed 002's form)")
      ->check(CLI::IsMember({"sigma", "width"}));
  s->add_option("--W", a->W, "general family: W [D, Dk]");
  s->add_option("--b", a->b, "biased/activated_general: b [] or [1]; additive: b [A]");
  s->add_option("--W-q", a->W_q, "additive: W_q [A, D]");
  s->add_option("--W-k", a->W_k, "additive: W_k [A, Dk]");
  s->add_option("--w-v", a->w_v, "additive: w_v [A], or [Dv, A] for multi-dimensional attention");
  s->add_option("--W-a", a->W_a, "location: W_a [Nk, D]");
  s->add_option("--sigmoid-bias", a->sigmoid_bias, "sigmoid: bias b (default -log Nk)");
  s->add_option("--topk", a->topk, "topk: k >= 1 (default 1)");
  s->add_option("--hardmax-gradient", a->hardmax_gradient, "hardmax backward: zero | straight_through")
      ->check(CLI::IsMember({"zero", "straight_through"}));
  s->add_option("--family-path", a->family_path, "automatic | core | fused | tiled | reference")
      ->check(CLI::IsMember({"automatic", "core", "fused", "tiled", "reference"}));
  s->add_option("--linear", a->linear,
                "linear attention with feature map elu_plus_one | relu | identity (runs attn::linear_attention; masks: --causal, "
                "--alignment, --nonpad-kv-seqlen)")
      ->check(CLI::IsMember({"elu_plus_one", "relu", "identity"}));
  s->add_flag("--linear-unnormalised", a->linear_unnormalised,
              "--linear: the numerator alone, sum_j phi(q).phi(k_j) v_j (no division)");
  s->add_option("--dW", a->dW, "write the gradient of W");
  s->add_option("--db", a->db, "write the gradient of b");
  s->add_option("--dW-q", a->dW_q, "write the gradient of W_q");
  s->add_option("--dW-k", a->dW_k, "write the gradient of W_k");
  s->add_option("--dw-v", a->dw_v, "write the gradient of w_v");
  s->add_option("--dW-a", a->dW_a, "write the gradient of W_a");
  s->callback([a, &exit_code] { exit_code = run(*a); });
}

}  // namespace attn::cli

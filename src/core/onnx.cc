// src/core/onnx.cc — the ONNX Attention operator (opsets 23/24) mapped onto attn::attention,
// and the conformance-case runner used by tests and `attn conformance`.
#include "attn/onnx.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "attn/error.h"
#include "attn/npy.h"

namespace attn::onnx {
namespace fs = std::filesystem;

attention_options to_options(const inputs& in, const attributes& a) {
  attention_options o;
  o.scale = a.scale;
  o.is_causal = a.is_causal;
  o.softcap = a.softcap;
  o.q_num_heads = a.q_num_heads;
  o.kv_num_heads = a.kv_num_heads;
  // ONNX's causal frontier: after the past when past_key is given; otherwise at the end of the
  // valid keys (nonpad_kv_seqlen) when those are given; otherwise top-left.
  o.alignment = in.past_key ? causal_alignment::after_past
                : in.nonpad_kv_seqlen ? causal_alignment::bottom_right
                                      : causal_alignment::top_left;
  o.attn_mask = in.attn_mask;
  o.past_key = in.past_key;
  o.past_value = in.past_value;
  o.nonpad_kv_seqlen = in.nonpad_kv_seqlen;
  switch (a.qk_matmul_output_mode) {
    case -1: o.return_qk = qk_output::none; break;
    case 0:
    case 1: o.return_qk = qk_output::softcapped; break;  // the reference returns the softcapped scores for both
    case 2: o.return_qk = qk_output::biased; break;
    case 3: o.return_qk = qk_output::probabilities; break;
    default:
      throw error(fmt::format("onnx.Attention: qk_matmul_output_mode = {}, expected 0, 1, 2 or 3", a.qk_matmul_output_mode));
  }
  const int sp = a.softmax_precision;
  if (sp != 0 && sp != 1 && sp != 10 && sp != 11 && sp != 16)
    throw error(fmt::format("onnx.Attention: softmax_precision = {}, expected 1 (float), 10 (float16), 11 (double) or "
                            "16 (bfloat16)", sp));
  return o;
}

outputs run(const inputs& in, const attributes& a, const execution& exec) {
  const attention_options o = to_options(in, a);
  attention_result r = attention(in.Q, in.K, in.V, o, exec);
  outputs out;
  out.Y = r.out;
  out.qk_matmul_output = r.qk;
  if (in.past_key) {
    out.present_key = r.present_key;
    out.present_value = r.present_value;
  } else {  // present = K, V as [B, Hkv, Nk, D]
    auto as4 = [&](const TensorView& t) {
      if (t.rank() == 4) return Tensor::copy_of(t);
      const std::int64_t H = o.kv_num_heads;
      return Tensor::copy_of(t.reshape({t.size(0), t.size(1), H, t.size(2) / H}).permute({0, 2, 1, 3}));
    };
    out.present_key = as4(in.K);
    out.present_value = as4(in.V);
  }
  return out;
}

namespace {

dtype parse_dtype(const std::string& s, const std::string& where) {
  for (dtype t : {dtype::f32, dtype::f16, dtype::bf16, dtype::f64, dtype::boolean, dtype::i64})
    if (dtype_name(t) == s) return t;
  throw error(fmt::format("{}: unknown dtype '{}'", where, s));
}

// Compares one output; returns "" on a match, else a description of the worst element.
std::string compare(const std::string& name, const Tensor& got, const Tensor& want, double& worst_excess) {
  if (!got.defined()) return fmt::format("{}: not produced", name);
  if (got.shape() != want.shape())
    return fmt::format("{}: shape {} but expected {}", name, shape_str(got.shape()), shape_str(want.shape()));
  const double tol = want.type() == dtype::f16 || want.type() == dtype::bf16 ? 1e-2 : 1e-4;
  const std::vector<double> g = got.to_vector(), w = want.to_vector();
  double worst = -1, worst_err = 0, worst_g = 0, worst_w = 0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    double excess;
    if (std::isnan(w[i]) || std::isinf(w[i]) || std::isnan(g[i]) || std::isinf(g[i])) {
      const bool same = (std::isnan(w[i]) && std::isnan(g[i])) || g[i] == w[i];
      excess = same ? -1 : std::numeric_limits<double>::infinity();
    } else {
      excess = std::abs(g[i] - w[i]) - (tol + tol * std::abs(w[i]));
    }
    if (excess > worst) worst = excess, worst_i = i, worst_err = std::abs(g[i] - w[i]), worst_g = g[i], worst_w = w[i];
  }
  worst_excess = std::max(worst_excess, worst);
  if (worst <= 0) return {};
  return fmt::format("{}: worst error {:.3g} at flat index {} (got {}, expected {}, atol = rtol = {})", name, worst_err,
                     worst_i, worst_g, worst_w, tol);
}

}  // namespace

case_result run_case(const std::string& dir, backend use_backend) {
  case_result res;
  res.name = fs::path(dir).filename().string();
  if (res.name.empty()) res.name = fs::path(dir).parent_path().filename().string();
  try {
    const fs::path root(dir);
    std::ifstream f(root / "case.json");
    if (!f) throw error(fmt::format("cannot open {}", (root / "case.json").string()));
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(f);
    } catch (const nlohmann::json::exception& e) {
      throw error(fmt::format("case.json is not valid JSON: {}", e.what()));
    }
    if (j.value("op", std::string()) != "Attention")
      throw error(fmt::format("case.json op is '{}', expected 'Attention'", j.value("op", std::string())));
    const int opset = j.value("opset", 0);
    if (opset != 23 && opset != 24) throw error(fmt::format("opset {} is not supported (23 or 24)", opset));

    attributes a;
    const nlohmann::json attrs = j.value("attributes", nlohmann::json::object());
    for (const auto& [key, val] : attrs.items()) {
      if (key == "scale") a.scale = val.get<double>();
      else if (key == "is_causal") a.is_causal = val.get<int>() != 0;
      else if (key == "q_num_heads") a.q_num_heads = val.get<std::int64_t>();
      else if (key == "kv_num_heads") a.kv_num_heads = val.get<std::int64_t>();
      else if (key == "softcap") a.softcap = val.get<double>();
      else if (key == "qk_matmul_output_mode") a.qk_matmul_output_mode = val.get<int>();
      else if (key == "softmax_precision") a.softmax_precision = val.get<int>();
      else throw error(fmt::format("unknown attribute '{}'", key));
    }
    const nlohmann::json outs = j.value("outputs", nlohmann::json::object());
    if (outs.contains("qk_matmul_output") && a.qk_matmul_output_mode < 0) a.qk_matmul_output_mode = 0;
    if (!outs.contains("qk_matmul_output")) a.qk_matmul_output_mode = -1;

    auto load = [&](const nlohmann::json& e, const std::string& slot) {
      const std::string file = e.at("file").get<std::string>();
      Tensor t = read_npy((root / file).string());
      if (e.contains("dtype")) {
        const dtype want = parse_dtype(e["dtype"].get<std::string>(), slot);
        if (t.type() != want)
          throw error(fmt::format("{}: {} holds {}, case.json says {}", slot, file, dtype_name(t.type()), dtype_name(want)));
      }
      if (e.contains("shape") && e["shape"].get<Shape>() != t.shape())
        throw error(fmt::format("{}: {} has shape {}, case.json says {}", slot, file, shape_str(t.shape()),
                                shape_str(e["shape"].get<Shape>())));
      return t;
    };
    const auto& ins = j.at("inputs");
    for (const auto& [key, val] : ins.items())
      if (key != "Q" && key != "K" && key != "V" && key != "attn_mask" && key != "past_key" && key != "past_value" &&
          key != "nonpad_kv_seqlen")
        throw error(fmt::format("unknown input '{}'", key));
    std::vector<Tensor> keep;
    auto opt_in = [&](const char* slot) -> std::optional<TensorArg> {
      if (!ins.contains(slot)) return std::nullopt;
      keep.push_back(load(ins[slot], slot));
      return keep.back().view();
    };
    for (const char* s : {"Q", "K", "V"})
      if (!ins.contains(s)) throw error(fmt::format("input {} is missing", s));
    inputs in{*opt_in("Q"), *opt_in("K"), *opt_in("V"), std::nullopt, std::nullopt, std::nullopt, std::nullopt};
    in.attn_mask = opt_in("attn_mask");
    in.past_key = opt_in("past_key");
    in.past_value = opt_in("past_value");
    in.nonpad_kv_seqlen = opt_in("nonpad_kv_seqlen");

    const outputs got = run(in, a, {.use_backend = use_backend});
    std::string detail;
    for (const auto& [key, val] : outs.items()) {
      const Tensor want = load(val, key);
      const Tensor* g = key == "Y"                  ? &got.Y
                        : key == "present_key"      ? &got.present_key
                        : key == "present_value"    ? &got.present_value
                        : key == "qk_matmul_output" ? &got.qk_matmul_output
                                                    : nullptr;
      if (!g) throw error(fmt::format("unknown output '{}'", key));
      const std::string d = compare(key, *g, want, res.worst_excess);
      if (!d.empty()) detail += (detail.empty() ? "" : "; ") + d;
    }
    if (outs.empty()) throw error("case has no expected outputs");
    res.passed = detail.empty();
    res.detail = detail;
  } catch (const std::exception& e) {
    res.passed = false;
    res.detail = e.what();
  }
  return res;
}

std::vector<std::string> find_cases(const std::string& dir) {
  std::vector<std::string> r;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw error(fmt::format("conformance: '{}' is not a directory", dir));
  if (fs::exists(fs::path(dir) / "case.json")) return {dir};
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory() && fs::exists(e.path() / "case.json")) r.push_back(e.path().string());
  std::sort(r.begin(), r.end());
  return r;
}

}  // namespace attn::onnx

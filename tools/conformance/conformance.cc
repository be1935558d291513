// tools/conformance/conformance.cc — runs ONNX Attention conformance case folders (case.json
// parsed with nlohmann_json, .npy inputs and expected outputs) through attn::onnx::run.
#include "conformance.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "attn/error.h"
#include "attn/npy.h"
#include "attn/onnx.h"

namespace attn::conformance {
namespace fs = std::filesystem;
using onnx::attributes;
using onnx::inputs;
using onnx::outputs;

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

}  // namespace attn::conformance

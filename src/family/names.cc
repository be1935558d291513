// src/family/names.cc — the names of the family's enums (the score names live with the score
// table, scores/table.cc), each table tied to its enum by a static_assert (core/names.h).
#include <array>

#include "attn/family.h"
#include "core/names.h"

namespace attn {
namespace {

using detail::enum_name;

constexpr std::array kDistributionNames = {
    enum_name{distribution_kind::softmax, "softmax"},   enum_name{distribution_kind::sigmoid, "sigmoid"},
    enum_name{distribution_kind::sparsemax, "sparsemax"}, enum_name{distribution_kind::entmax15, "entmax15"},
    enum_name{distribution_kind::hardmax, "hardmax"},   enum_name{distribution_kind::topk, "topk"},
    enum_name{distribution_kind::kernel, "kernel"},     enum_name{distribution_kind::identity, "identity"}};
static_assert(detail::names_cover(kDistributionNames, distribution_kind::identity), "a distribution_kind has no name");

constexpr std::array kGaussianFormNames = {enum_name{gaussian_form::sigma, "sigma"},
                                           enum_name{gaussian_form::width, "width"}};
static_assert(detail::names_cover(kGaussianFormNames, gaussian_form::width), "a gaussian_form has no name");

constexpr std::array kFeatureMapNames = {enum_name{feature_map::elu_plus_one, "elu_plus_one"},
                                         enum_name{feature_map::relu, "relu"},
                                         enum_name{feature_map::identity, "identity"}};
static_assert(detail::names_cover(kFeatureMapNames, feature_map::identity), "a feature_map has no name");

constexpr std::array kActivationNames = {enum_name{score_activation::tanh, "tanh"},
                                         enum_name{score_activation::relu, "relu"},
                                         enum_name{score_activation::sigmoid, "sigmoid"}};
static_assert(detail::names_cover(kActivationNames, score_activation::sigmoid), "a score_activation has no name");

constexpr std::array kHardmaxGradientNames = {enum_name{hardmax_gradient::zero, "zero"},
                                              enum_name{hardmax_gradient::straight_through, "straight_through"}};
static_assert(detail::names_cover(kHardmaxGradientNames, hardmax_gradient::straight_through),
              "a hardmax_gradient has no name");

}  // namespace

std::string to_string(distribution_kind d) { return detail::name_of(kDistributionNames, d, "distribution_kind"); }
std::string to_string(score_activation a) { return detail::name_of(kActivationNames, a, "score_activation"); }
std::string to_string(gaussian_form f) { return detail::name_of(kGaussianFormNames, f, "gaussian_form"); }
std::string to_string(feature_map f) { return detail::name_of(kFeatureMapNames, f, "feature_map"); }
std::string to_string(hardmax_gradient g) { return detail::name_of(kHardmaxGradientNames, g, "hardmax_gradient"); }

distribution_kind parse_distribution_kind(const std::string& s) {
  return detail::parse_name(kDistributionNames, s, "distribution");
}
score_activation parse_score_activation(const std::string& s) {
  return detail::parse_name(kActivationNames, s, "activation");
}
gaussian_form parse_gaussian_form(const std::string& s) {
  return detail::parse_name(kGaussianFormNames, s, "gaussian form");
}
feature_map parse_feature_map(const std::string& s) { return detail::parse_name(kFeatureMapNames, s, "feature map"); }
hardmax_gradient parse_hardmax_gradient(const std::string& s) {
  return detail::parse_name(kHardmaxGradientNames, s, "hardmax gradient");
}

}  // namespace attn

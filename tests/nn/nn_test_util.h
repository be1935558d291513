// tests/nn/nn_test_util.h — what every attn::nn test uses: the layers and the shared test
// helpers (random tensors, all_close, finite differences) under their short names.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "attn/nn/nn.h"
#include "test_util.h"

namespace attn::nn {
using testing::all_close;
using testing::expect_gradient;
using testing::random_tensor;
using testing::weighted_sum;
}  // namespace attn::nn

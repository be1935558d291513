// attn/nn/nn.h — every layer of attn::nn. docs/MODULES.md maps each to the tutorial concept
// it implements, an example and its test.
//
// Conventions (llm.c's): each layer is a plain struct of parameters (`weight`) and gradients
// (`dweight`); `forward` computes, `backward` takes what the forward saw (its input, or a
// `saved` record the forward filled) and dy, accumulates parameter gradients and returns dx.
// There is no autograd: a model's backward calls its layers' backwards in reverse order.
// Layers compute in the dtype of their parameters, float32 or float64.
#pragma once

#include "attn/nn/activation.h"
#include "attn/nn/checkpoint.h"
#include "attn/nn/co_attention.h"
#include "attn/nn/dropout.h"
#include "attn/nn/embedding.h"
#include "attn/nn/gru.h"
#include "attn/nn/hierarchical.h"
#include "attn/nn/init.h"
#include "attn/nn/linear.h"
#include "attn/nn/loss.h"
#include "attn/nn/memory_network.h"
#include "attn/nn/multihead.h"
#include "attn/nn/norm.h"
#include "attn/nn/optim.h"
#include "attn/nn/parameter.h"
#include "attn/nn/scored_attention.h"
#include "attn/nn/transformer.h"

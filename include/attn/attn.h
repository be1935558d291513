// attn/attn.h — everything in attn.
#pragma once

#include "attn/attention.h"
#include "attn/error.h"
#include "attn/execution.h"
#include "attn/family.h"
#include "attn/linear.h"
#include "attn/nn/nn.h"
#include "attn/npy.h"
#include "attn/onnx.h"
#include "attn/positional.h"
#include "attn/safetensors.h"
#include "attn/serving.h"
#include "attn/tensor.h"

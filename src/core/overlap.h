// src/core/overlap.h — whether two strided views can touch the same bytes: the checks of the
// *_into entry points, whose destinations are the caller's memory (an arena, a slice of a larger
// buffer) and must not alias an input or one another.
#pragma once

#include "attn/tensor.h"

namespace attn::detail {

// Whether two elements of `t` share an address (a stride of 0 on a dim of size > 1, or strides
// that interleave dims): writing such a view would write an element twice.
bool overlaps_itself(const TensorView& t);

// Whether views a and b may share a byte. Exact for views of one dtype, neither overlapping
// itself, whose bases lie a whole number of elements apart — the slices of one buffer (dq, dk
// and dv interleaved in a packed [B, N, 3, H, D] gradient are disjoint); otherwise true whenever
// their byte ranges meet.
bool may_share_memory(const TensorView& a, const TensorView& b);

}  // namespace attn::detail

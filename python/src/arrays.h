// python/src/arrays.h — NumPy / PyTorch / DLPack arrays to attn views and attn tensors back.
//
// In: any nanobind ndarray (NumPy's buffer or DLPack, torch tensors, any DLPack producer) on
// the CPU becomes a TensorView on the same memory with the same element strides — no copy.
// uint16 arrays are read as bfloat16: the Python layer passes ml_dtypes.bfloat16 NumPy arrays
// as a uint16 view, NumPy having no bfloat16 of its own.
// Out: an attn::Tensor becomes an array of the caller's kind (NumPy or torch) that shares the
// Tensor's storage (a capsule holds a reference); bfloat16 goes back to NumPy as uint16.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>

#include "attn/tensor.h"

namespace attn::py {

namespace nb = nanobind;

using Array = nb::ndarray<nb::ro>;

// Which kind of array a call returns.
enum class kind : int { numpy = 0, torch = 1 };

// Throws attn::error "<op>: <name> is on device cuda:0, ..." or "... has dtype uint8, ...".
TensorView view_of(const Array& a, const char* op, const char* name);
std::optional<TensorArg> view_of(const std::optional<Array>& a, const char* op, const char* name);

// None for an undefined tensor.
nb::object to_python(const Tensor& t, kind k);

// f() with the GIL released: attn computes while other Python threads run.
template <class F>
auto without_gil(F&& f) {
  nb::gil_scoped_release unlocked;
  return f();
}

}  // namespace attn::py

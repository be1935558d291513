"""Array plumbing between the public functions and the extension ``attn._attn``.

Inputs are handed to the extension as they are (NumPy arrays, torch CPU tensors, any DLPack
producer), which reads them in place through their strides. Three cases are adjusted first,
without copying except the last:

- ``ml_dtypes.bfloat16`` NumPy arrays travel as a ``uint16`` view (NumPy has no bfloat16 of
  its own; the extension reads uint16 as bfloat16);
- torch tensors that require grad are detached (attn's own functions are not autograd-aware;
  ``attn.torch`` is);
- NumPy views with a negative stride (``x[::-1]``) are copied, attn reading strides >= 0.

torch CPU tensors travel as NumPy views of their memory (``Tensor.numpy()``: no copy, and much
cheaper to read than ``__dlpack__``). The extension always returns NumPy arrays that own attn's
buffers; they come back as the kind of the first input: torch in (``torch.from_numpy``, no
copy), torch out; anything else, NumPy.
"""

from __future__ import annotations

import numpy as np

try:  # optional: bfloat16 for NumPy
    import ml_dtypes as _ml_dtypes

    _NP_BF16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is an optional dependency
    _ml_dtypes = None
    _NP_BF16 = None

NUMPY, TORCH = 0, 1

_torch = None


def _torch_module():
    global _torch
    if _torch is None:
        import sys

        _torch = sys.modules.get("torch")
    return _torch


def kind_of(x) -> int:
    """TORCH when x is a torch tensor, else NUMPY."""
    t = _torch_module()
    if t is not None and isinstance(x, t.Tensor):
        return TORCH
    return NUMPY


def arg(x):
    """One array argument, ready for the extension (see the module docstring)."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        if x.dtype == np.uint16:  # the extension reads uint16 as bfloat16: refuse real uint16
            raise TypeError("attn: an array has dtype uint16, expected float32, float16, bfloat16, float64, bool, int64, int32 or int8")
        if _NP_BF16 is not None and x.dtype == _NP_BF16:
            x = x.view(np.uint16)
        if any(s < 0 for s in x.strides):
            x = np.ascontiguousarray(x)
        return x
    t = _torch_module()
    if t is not None and isinstance(x, t.Tensor):
        if x.dtype == t.uint16:
            raise TypeError("attn: a tensor has dtype torch.uint16, expected float32, float16, bfloat16, float64, bool, int64, int32 or int8")
        if x.device.type == "cpu" and not x.is_conj() and not x.is_neg():
            # A NumPy view of the same memory: the buffer protocol is several times cheaper
            # than torch's __dlpack__ for the extension to read (docs/PERFORMANCE.md).
            x = x.detach()
            return (x.view(t.uint16) if x.dtype == t.bfloat16 else x).numpy()
        return x.detach() if x.requires_grad else x
    return x


def index(x):
    """An index array (cu_seqlens, block_table, seq_lens, cache_lengths, nonpad_kv_seqlen): attn
    reads int64 and int32 in place (FlashAttention's, vLLM's and PyTorch's int32 ones pass
    without a copy); a smaller or unsigned integer array is widened to int64 (a copy: B + 1 or
    B × pages values, exact). Anything else goes through as it is, to be checked by the
    extension."""
    if x is None:
        return None
    if isinstance(x, np.ndarray):
        if x.dtype.kind in "iu" and x.dtype.itemsize <= 4 and x.dtype != np.int32:
            return x.astype(np.int64)
        return arg(x)
    t = _torch_module()
    if t is not None and isinstance(x, t.Tensor) and x.dtype in (t.int16, t.int8, t.uint8):
        return arg(x.to(t.int64))
    return arg(x)


_INDEX_OPTIONS = {"nonpad_kv_seqlen"}


def opts(**kw):
    """The options dict for the extension: None-valued entries dropped, tensors prepared."""
    out = {}
    for key, value in kw.items():
        if value is None:
            continue
        if key in _INDEX_OPTIONS:
            value = index(value)
        elif isinstance(value, (np.ndarray,)) or kind_of(value) == TORCH:
            value = arg(value)
        out[key] = value
    return out


def result(x, kind: int):
    """An array from the extension (NumPy; bfloat16 as uint16), as the caller's kind."""
    if x is None:
        return None
    if kind == TORCH:
        y = _torch.from_numpy(x)
        return y.view(_torch.bfloat16) if x.dtype == np.uint16 else y
    if x.dtype == np.uint16:
        if _NP_BF16 is None:  # pragma: no cover
            raise TypeError("attn: a bfloat16 result needs ml_dtypes for NumPy (pip install ml_dtypes)")
        return x.view(_NP_BF16)
    return x

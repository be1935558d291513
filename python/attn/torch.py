"""attn for PyTorch: differentiable ops and drop-in modules.

- :func:`scaled_dot_product_attention` — the signature and semantics of
  ``torch.nn.functional.scaled_dot_product_attention``, differentiable (attn's backward from
  the saved log-sum-exp; gradients for query, key, value and a float mask), plus attn's extras
  as keywords.
- :class:`MultiheadAttention` — a drop-in for ``torch.nn.MultiheadAttention`` (same
  constructor, forward, parameter names and state dict), plus ``num_kv_heads`` for GQA/MQA.
- :func:`attention` — the whole core op (every option of :func:`attn.attention`), differentiable.
- :func:`attention_varlen`, :func:`attention_paged`, :func:`attention_paged_varlen` — packed
  batches and the paged KV cache, differentiable (the pages' gradients through the block table).
- :func:`attention_family` and the modules :class:`AdditiveAttention`,
  :class:`GeneralAttention`, :class:`NadarayaWatson` — the family with parameter gradients.
- :func:`rotary`, :func:`t5_relative_bias`, :func:`sinusoidal` — positional, differentiable.

Contract differences from PyTorch (docs/PYTHON.md): a fully masked row gives 0 (and zero
gradients), not NaN; ``dropout_p > 0`` is refused; ``is_causal`` together with
``attn_mask`` applies both (PyTorch refuses the pair).
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
from torch import Tensor, nn

from . import _attn
from ._arrays import NUMPY as _NP, TORCH as _TORCH, arg as _a, index as _i, result as _r

__all__ = [
    "scaled_dot_product_attention", "attention", "attention_varlen", "attention_paged", "attention_paged_varlen",
    "MultiheadAttention", "attention_family",
    "AdditiveAttention", "GeneralAttention", "NadarayaWatson", "rotary", "t5_relative_bias",
    "sinusoidal",
]


# ---- the core op ----------------------------------------------------------------------------

class _Attention(torch.autograd.Function):
    """out = attention(q, k, v; mask, alibi_slopes, sinks, opts); backward from the saved lse."""

    @staticmethod
    def forward(ctx, q, k, v, mask, alibi, sinks, opts):
        o = _with_tensors(opts, attn_mask=mask, alibi_slopes=alibi, sinks=sinks)
        out, lse, *_ = _attn.attention(_a(q), _a(k), _a(v), o, _NP)
        out, lse = _r(out, _TORCH), _r(lse, _TORCH)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts = o
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        # A float mask's gradient costs an accumulator of its size: ask for it only when autograd does.
        o = dict(ctx.opts, mask_gradient=bool(ctx.needs_input_grad[3]))
        g = _attn.attention_backward(_a(q), _a(k), _a(v), _a(out), _a(dout), _a(lse), o, _NP)
        dq, dk, dv, dmask, dalibi, dsinks = (_r(x, _TORCH) for x in g[:6])
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                dmask if need[3] else None, dalibi if need[4] else None,
                dsinks if need[5] else None, None)


def _opts(**kw):
    return {k: v for k, v in kw.items() if v is not None}


def attention(q: Tensor, k: Tensor, v: Tensor, *, attn_mask: Optional[Tensor] = None,
              is_causal: bool = False, alignment: str = "top_left", scale: Optional[float] = None,
              window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
              alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
              nonpad_kv_seqlen: Optional[Tensor] = None, q_num_heads: int = 0,
              kv_num_heads: int = 0, return_lse: bool = False, backend: str = "automatic",
              num_threads: int = 0):
    """:func:`attn.attention` for torch tensors, differentiable in q, k, v, a float
    ``attn_mask``, ``alibi_slopes`` and ``sinks``. Returns ``out`` (and ``lse`` with
    ``return_lse``). The ONNX past/present cache is :func:`attn.attention`'s (not differentiable).
    """
    opts = _opts(is_causal=is_causal, alignment=alignment, scale=scale, window=tuple(window),
                 softcap=softcap, nonpad_kv_seqlen=_i(nonpad_kv_seqlen), q_num_heads=q_num_heads,
                 kv_num_heads=kv_num_heads, backend=backend, num_threads=num_threads)
    out, lse = _Attention.apply(q, k, v, attn_mask, alibi_slopes, sinks, opts)
    return (out, lse) if return_lse else out


def _with_tensors(opts, **tensors):
    """opts plus the given tensors (as arrays for the extension), leaving out those that are None."""
    o = dict(opts)
    o.update((key, _a(t)) for key, t in tensors.items() if t is not None)
    return o


class _Varlen(torch.autograd.Function):
    """out = attention_varlen(q, k, v; cu_seqlens, alibi_slopes, sinks, attn_mask, opts); backward
    from the lse."""

    @staticmethod
    def forward(ctx, q, k, v, alibi, sinks, mask, cu_q, cu_k, max_q, max_k, opts):
        o = _with_tensors(opts, alibi_slopes=alibi, sinks=sinks, attn_mask=mask)
        out, lse, _ = _attn.attention_varlen(_a(q), _a(k), _a(v), _i(cu_q), _i(cu_k), max_q, max_k, o, _NP)
        out, lse = _r(out, _TORCH), _r(lse, _TORCH)
        ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
        ctx.opts, ctx.max = o, (max_q, max_k)
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        g = _attn.attention_varlen_backward(_a(q), _a(k), _a(v), _a(out), _a(dout.contiguous()), _a(lse),
                                            _i(cu_q), _i(cu_k), *ctx.max, ctx.opts, _NP)
        dq, dk, dv, dalibi, dsinks = (_r(x, _TORCH) for x in g[:5])
        dmask = _r(g[6], _TORCH)
        need = ctx.needs_input_grad
        return (dq if need[0] else None, dk if need[1] else None, dv if need[2] else None,
                dalibi if need[3] else None, dsinks if need[4] else None, dmask if need[5] else None,
                None, None, None, None, None)


def attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                     max_seqlen_q: int, max_seqlen_k: int, *, is_causal: bool = False,
                     alignment: str = "top_left", scale: Optional[float] = None,
                     window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
                     attn_mask: Optional[Tensor] = None,
                     return_lse: bool = False, backend: str = "automatic", num_threads: int = 0):
    """:func:`attn.attention_varlen` for torch tensors (FlashAttention's ``flash_attn_varlen_func``
    on the CPU), differentiable in q, k, v, ``alibi_slopes``, ``sinks`` and a float ``attn_mask``
    (packed per sequence as FlashInfer's ``custom_mask``: ``[S]`` or ``[1 or Hq, S]``, ``S =
    sum(Nq_b * Nk_b)``, each sequence's ``[Nq_b, Nk_b]`` row-major). ``q [total_q, Hq, D]``,
    ``k``/``v [total_k, Hkv, ·]``, integer ``cu_seqlens_* [B + 1]`` (int32 as FlashAttention's is
    widened to int64). Returns ``out`` (and ``lse
    [Hq, total_q]`` with ``return_lse``).
    """
    opts = _opts(is_causal=is_causal, alignment=alignment, scale=scale, window=tuple(window),
                 softcap=softcap, backend=backend, num_threads=num_threads)
    out, lse = _Varlen.apply(q, k, v, alibi_slopes, sinks, attn_mask, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                             int(max_seqlen_k), opts)
    return (out, lse) if return_lse else out


class _Paged(torch.autograd.Function):
    """out = attention_paged(q, k_pages, v_pages; block_table, seq_lens, alibi_slopes, sinks,
    attn_mask, opts); backward from the lse."""

    @staticmethod
    def forward(ctx, q, k_pages, v_pages, alibi, sinks, mask, table, lens, opts):
        o = _with_tensors(opts, alibi_slopes=alibi, sinks=sinks, attn_mask=mask)
        out, lse, _ = _attn.attention_paged(_a(q), _a(k_pages), _a(v_pages), _i(table), _i(lens), None, None, o,
                                            _NP)
        out, lse = _r(out, _TORCH), _r(lse, _TORCH)
        # The table and lengths as they were: a decode loop advances seq_lens in place (NumPy
        # memory under the tensor bumps no version counter), and appended rows past the old
        # lengths are not read, so the backward sees exactly the forward's keys.
        ctx.save_for_backward(q, k_pages, v_pages, out, lse, table.clone(), lens.clone())
        ctx.opts = o
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k_pages, v_pages, out, lse, table, lens = ctx.saved_tensors
        o = dict(ctx.opts, mask_gradient=bool(ctx.needs_input_grad[5]))
        g = _attn.attention_paged_backward(_a(q), _a(k_pages), _a(v_pages), _i(table), _i(lens), _a(out),
                                           _a(dout.contiguous()), _a(lse), o, _NP)
        grads = [_r(x, _TORCH) for x in g[:6]]
        need = ctx.needs_input_grad
        return (*(x if n else None for x, n in zip(grads, need[:6])), None, None, None)


def attention_paged(q: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor, seq_lens: Tensor, *,
                    is_causal: bool = False, alignment: str = "bottom_right", scale: Optional[float] = None,
                    window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
                    attn_mask: Optional[Tensor] = None, return_lse: bool = False, backend: str = "automatic",
                    num_threads: int = 0):
    """:func:`attn.attention_paged` for torch tensors (float pages), differentiable in q, the pages
    ``k_pages``/``v_pages [num_pages, page_size, Hkv, ·]``, ``alibi_slopes``, ``sinks`` and a float
    ``attn_mask``: a page that several sequences' block tables name (a shared prompt) receives the
    sum of their gradients. Returns ``out [B, Hq, Nq, Dv]`` (and ``lse [B, Hq, Nq]`` with
    ``return_lse``).
    """
    opts = _opts(is_causal=is_causal, alignment=alignment, scale=scale, window=tuple(window),
                 softcap=softcap, backend=backend, num_threads=num_threads)
    out, lse = _Paged.apply(q, k_pages, v_pages, alibi_slopes, sinks, attn_mask, torch.as_tensor(block_table),
                            torch.as_tensor(seq_lens), opts)
    return (out, lse) if return_lse else out


class _PagedVarlen(torch.autograd.Function):
    """out = attention_paged_varlen(q, k_pages, v_pages; cu_seqlens_q, block_table, seq_lens,
    alibi_slopes, sinks, packed attn_mask, opts); backward from the lse."""

    @staticmethod
    def forward(ctx, q, k_pages, v_pages, alibi, sinks, mask, cu_q, max_q, table, lens, opts):
        o = _with_tensors(opts, alibi_slopes=alibi, sinks=sinks, attn_mask=mask)
        out, lse, _ = _attn.attention_paged_varlen(_a(q), _i(cu_q), max_q, _a(k_pages), _a(v_pages), _i(table),
                                                   _i(lens), None, None, o, _NP)
        out, lse = _r(out, _TORCH), _r(lse, _TORCH)
        ctx.save_for_backward(q, k_pages, v_pages, out, lse, cu_q.clone(), table.clone(), lens.clone())
        ctx.opts, ctx.max_q = o, max_q
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k_pages, v_pages, out, lse, cu_q, table, lens = ctx.saved_tensors
        o = dict(ctx.opts, mask_gradient=bool(ctx.needs_input_grad[5]))
        g = _attn.attention_paged_varlen_backward(_a(q), _i(cu_q), ctx.max_q, _a(k_pages), _a(v_pages), _i(table),
                                                  _i(lens), _a(out), _a(dout.contiguous()), _a(lse), o, _NP)
        grads = [_r(x, _TORCH) for x in g[:6]]
        need = ctx.needs_input_grad
        return (*(x if n else None for x, n in zip(grads, need[:6])), None, None, None, None, None)


def attention_paged_varlen(q: Tensor, cu_seqlens_q: Tensor, max_seqlen_q: int, k_pages: Tensor, v_pages: Tensor,
                           block_table: Tensor, seq_lens: Tensor, *, is_causal: bool = False,
                           alignment: str = "bottom_right", scale: Optional[float] = None,
                           window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                           alibi_slopes: Optional[Tensor] = None, sinks: Optional[Tensor] = None,
                           attn_mask: Optional[Tensor] = None, return_lse: bool = False,
                           backend: str = "automatic", num_threads: int = 0):
    """:func:`attn.attention_paged_varlen` for torch tensors (float pages): decode steps and
    prefill chunks packed as ``q [total_q, Hq, D]`` with ``cu_seqlens_q``, differentiable in q, the
    pages, ``alibi_slopes``, ``sinks`` and a float packed ``attn_mask``. Returns ``out [total_q, Hq,
    Dv]`` (and ``lse [Hq, total_q]`` with ``return_lse``).
    """
    opts = _opts(is_causal=is_causal, alignment=alignment, scale=scale, window=tuple(window),
                 softcap=softcap, backend=backend, num_threads=num_threads)
    out, lse = _PagedVarlen.apply(q, k_pages, v_pages, alibi_slopes, sinks, attn_mask, torch.as_tensor(cu_seqlens_q),
                                  int(max_seqlen_q), torch.as_tensor(block_table), torch.as_tensor(seq_lens), opts)
    return (out, lse) if return_lse else out


_SDPA_EXTRAS = {"alignment", "window", "softcap", "alibi_slopes", "sinks", "nonpad_kv_seqlen",
                "backend", "num_threads"}


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor,
                                 attn_mask: Optional[Tensor] = None, dropout_p: float = 0.0,
                                 is_causal: bool = False, scale: Optional[float] = None,
                                 enable_gqa: bool = False, **attn_extras) -> Tensor:
    """Drop-in for ``torch.nn.functional.scaled_dot_product_attention``, run by attn.

    ``query (..., Hq, L, E)``, ``key (..., Hkv, S, E)``, ``value (..., Hkv, S, Ev)``; 3-D
    inputs ``(N, L, E)`` are one head. ``attn_mask``: bool (True = take part) or float (added),
    broadcast to ``(..., Hq, L, S)``. ``is_causal``: top-left causal mask. ``enable_gqa``: Hkv
    divides Hq (query head h reads key/value head h // (Hq/Hkv)). Differentiable in query, key,
    value and a float attn_mask.

    Differences: ``dropout_p`` must be 0 (attn has no dropout); a fully masked row gives 0, not
    NaN; ``is_causal`` with ``attn_mask`` applies both.

    attn extras (keywords): alignment ("top_left", "bottom_right", "after_past"),
    window=(left, right), softcap, alibi_slopes [Hq] or [B, Hq], sinks [Hq],
    nonpad_kv_seqlen int64 [B], backend, num_threads.

    >>> from attn.torch import scaled_dot_product_attention as sdpa
    >>> out = sdpa(q, k, v, is_causal=True)          # q [B, H, L, E]
    """
    op = "scaled_dot_product_attention"
    if dropout_p != 0.0:
        raise ValueError(f"{op}: dropout_p = {dropout_p} is not supported; attn has no attention "
                         "dropout (pass dropout_p=0.0, e.g. in eval mode)")
    unknown = set(attn_extras) - _SDPA_EXTRAS
    if unknown:
        raise TypeError(f"{op}: unknown keyword argument(s) {sorted(unknown)}; attn extras are "
                        f"{sorted(_SDPA_EXTRAS)}")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{op}: {name} is a {type(t).__name__}, expected a torch.Tensor")
    if query.dim() < 2 or query.dim() != key.dim() or query.dim() != value.dim():
        raise ValueError(f"{op}: query, key, value have {query.dim()}, {key.dim()}, {value.dim()} "
                         "dims; expected the same number, at least 2")
    q, k, v, m = query, key, value, attn_mask
    lead = None
    if q.dim() < 4:  # (L, E) or (N, L, E): one head
        while q.dim() < 4:
            q, k, v = q.unsqueeze(-3), k.unsqueeze(-3), v.unsqueeze(-3)
            if m is not None and m.dim() >= 3:
                m = m.unsqueeze(-3)
    elif q.dim() > 4:  # (..., H, L, E): leading dims flattened into the batch
        lead = q.shape[:-3]
        if m is not None:
            m = m.expand(*lead, q.shape[-3], q.shape[-2], k.shape[-2]).reshape(-1, q.shape[-3], q.shape[-2], k.shape[-2])
        q = q.reshape(-1, *q.shape[-3:])
        k = k.reshape(-1, *k.shape[-3:])
        v = v.reshape(-1, *v.shape[-3:])
    if m is not None and m.dim() >= 1 and m.shape[-1] == 1 and k.shape[-2] != 1:
        # torch broadcasts a last mask dim of 1; attn (as ONNX) would pad it: expand, no copy
        m = m.expand(*m.shape[:-1], k.shape[-2])
    Hq, Hkv = q.shape[1], k.shape[1]
    if Hq != Hkv and not enable_gqa and Hkv != 1:
        raise ValueError(f"{op}: query has {Hq} heads and key {Hkv}; pass enable_gqa=True for "
                         "grouped-query attention")
    if m is not None and m.dim() > 4:
        raise ValueError(f"{op}: attn_mask has {m.dim()} dims, more than the inputs")
    opts = _opts(is_causal=bool(is_causal), scale=scale, **{k_: v_ for k_, v_ in attn_extras.items()
                                                            if k_ not in ("alibi_slopes", "sinks")})
    if "window" in opts:
        opts["window"] = tuple(opts["window"])
    if "nonpad_kv_seqlen" in opts:
        opts["nonpad_kv_seqlen"] = _i(opts["nonpad_kv_seqlen"])
    out, _ = _Attention.apply(q, k, v, m, attn_extras.get("alibi_slopes"), attn_extras.get("sinks"), opts)
    if lead is not None:
        return out.reshape(*lead, *out.shape[-3:])
    if query.dim() == 3:
        return out.squeeze(1)
    if query.dim() == 2:
        return out.squeeze(0).squeeze(0)
    return out


# ---- MultiheadAttention ----------------------------------------------------------------------

class MultiheadAttention(nn.Module):
    """Drop-in for ``torch.nn.MultiheadAttention``, its attention run by attn.

    Same constructor, forward, parameter names (``in_proj_weight`` or ``q_proj_weight``/
    ``k_proj_weight``/``v_proj_weight``, ``in_proj_bias``, ``bias_k``, ``bias_v``,
    ``out_proj``), so ``load_state_dict(torch_mha.state_dict())`` gives the same outputs and
    gradients. Extra: ``num_kv_heads`` (grouped-query / multi-query attention: the k and v
    projections have ``num_kv_heads · head_dim`` outputs; the parameter shapes then differ
    from torch's).

    Differences: ``dropout > 0`` is refused in training mode; a fully masked row gives 0 (not
    NaN); the returned attention weights are not differentiable (the output is).

    >>> mha = attn.torch.MultiheadAttention(64, 8, batch_first=True)
    >>> out, w = mha(x, x, x, key_padding_mask=pad)
    """

    __constants__ = ["batch_first"]

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: Optional[int] = None,
                 vdim: Optional[int] = None, batch_first: bool = False, device=None, dtype=None,
                 *, num_kv_heads: Optional[int] = None) -> None:
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"MultiheadAttention: embed_dim = {embed_dim} and num_heads = "
                             f"{num_heads} must be > 0")
        if embed_dim % num_heads:
            raise ValueError(f"MultiheadAttention: embed_dim = {embed_dim} is not divisible by "
                             f"num_heads = {num_heads}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(f"MultiheadAttention: num_kv_heads = {num_kv_heads} must divide "
                             f"num_heads = {num_heads}")
        fk = {"device": device, "dtype": dtype}
        super().__init__()
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        self.add_zero_attn = add_zero_attn
        E, Ekv = embed_dim, num_kv_heads * self.head_dim
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = nn.Parameter(torch.empty((E, E), **fk))
            self.k_proj_weight = nn.Parameter(torch.empty((Ekv, self.kdim), **fk))
            self.v_proj_weight = nn.Parameter(torch.empty((Ekv, self.vdim), **fk))
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = nn.Parameter(torch.empty((E + 2 * Ekv, E), **fk))
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(E + 2 * Ekv, **fk))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.modules.linear.NonDynamicallyQuantizableLinear(E, E, bias=bias, **fk)
        if add_bias_kv:
            self.bias_k = nn.Parameter(torch.empty((1, 1, Ekv), **fk))
            self.bias_v = nn.Parameter(torch.empty((1, 1, Ekv), **fk))
        else:
            self.bias_k = self.bias_v = None
        self._reset_parameters()

    def _reset_parameters(self):  # as torch.nn.MultiheadAttention
        if self._qkv_same_embed_dim:
            nn.init.xavier_uniform_(self.in_proj_weight)
        else:
            nn.init.xavier_uniform_(self.q_proj_weight)
            nn.init.xavier_uniform_(self.k_proj_weight)
            nn.init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            nn.init.constant_(self.in_proj_bias, 0.0)
            nn.init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            nn.init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            nn.init.xavier_normal_(self.bias_v)

    def _projections(self):
        E, Ekv = self.embed_dim, self.num_kv_heads * self.head_dim
        if self._qkv_same_embed_dim:
            Wq, Wk, Wv = self.in_proj_weight.split([E, Ekv, Ekv])
        else:
            Wq, Wk, Wv = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        if self.in_proj_bias is None:
            bq = bk = bv = None
        else:
            bq, bk, bv = self.in_proj_bias.split([E, Ekv, Ekv])
        return Wq, Wk, Wv, bq, bk, bv

    def forward(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """``query (L, N, E)`` (``(N, L, E)`` with batch_first, ``(L, E)`` unbatched),
        ``key (S, N, kdim)``, ``value (S, N, vdim)``. ``key_padding_mask (N, S)`` and
        ``attn_mask (L, S)`` or ``(N·H, L, S)``: bool True = not attended, or float added.
        Returns ``(attn_output, attn_weights)``; weights ``(N, L, S)`` averaged over heads, or
        ``(N, H, L, S)``, or None without need_weights."""
        op = "MultiheadAttention"
        if self.dropout > 0.0 and self.training:
            raise ValueError(f"{op}: dropout = {self.dropout} is not supported in training mode; "
                             "attn has no attention dropout (use dropout=0.0, or eval())")
        if is_causal and attn_mask is None:
            raise ValueError(f"{op}: is_causal is a hint that attn_mask is the causal mask; pass "
                             "attn_mask too (as torch.nn.MultiheadAttention requires)")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        elif self.batch_first:  # to (L, N, E) views: no copy
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        L, N, E = query.shape
        H, Hkv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        if E != self.embed_dim:
            raise ValueError(f"{op}: query has embedding size {E}, expected embed_dim = {self.embed_dim}")
        Wq, Wk, Wv, bq, bk, bv = self._projections()
        # (L, N, E) @ W.T -> (L, N, H*hd); attn reads them as [N, L, H*hd] strided views.
        q = nn.functional.linear(query, Wq, bq)
        k = nn.functional.linear(key, Wk, bk)
        v = nn.functional.linear(value, Wv, bv)

        # Masks in "attend" form, broadcast to (N, H, L, S): bool True = attend, or float added.
        def canon(m, what):
            if m is None:
                return None
            if m.dtype == torch.bool:
                return ~m
            if not m.is_floating_point():
                raise TypeError(f"{op}: {what} has dtype {m.dtype}, expected bool or a float dtype")
            return m.to(q.dtype)

        am, kpm = canon(attn_mask, "attn_mask"), canon(key_padding_mask, "key_padding_mask")
        if am is not None:
            if am.dim() == 2:
                am = am.reshape(1, 1, *am.shape)
            elif am.dim() == 3:
                if am.shape[0] != N * H:
                    raise ValueError(f"{op}: attn_mask has shape {list(attn_mask.shape)}, expected "
                                     f"({L}, S) or ({N * H}, {L}, S)")
                am = am.reshape(N, H, *am.shape[1:])
            else:
                raise ValueError(f"{op}: attn_mask has {am.dim()} dims, expected 2 or 3")
        if kpm is not None:
            kpm = kpm.reshape(kpm.shape[0], 1, 1, kpm.shape[-1])

        def pad(m):  # one more key that every query attends (bias_k / zero attention)
            if m is None:
                return None
            col = torch.ones if m.dtype == torch.bool else torch.zeros
            return torch.cat([m, col(*m.shape[:-1], 1, dtype=m.dtype, device=m.device)], dim=-1)

        if self.bias_k is not None and self.bias_v is not None:
            k = torch.cat([k, self.bias_k.expand(1, N, -1)])
            v = torch.cat([v, self.bias_v.expand(1, N, -1)])
            am, kpm = pad(am), pad(kpm)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(1, N, k.shape[-1])])
            v = torch.cat([v, v.new_zeros(1, N, v.shape[-1])])
            am, kpm = pad(am), pad(kpm)
        if am is None or kpm is None:
            mask = am if kpm is None else kpm
        elif am.dtype == torch.bool and kpm.dtype == torch.bool:
            mask = am & kpm
        else:
            def additive(m):
                if m.dtype != torch.bool:
                    return m
                return torch.zeros(m.shape, dtype=q.dtype).masked_fill_(~m, float("-inf"))
            mask = additive(am) + additive(kpm)

        # [N, L, H*hd] 3-D layout: the (L, N, ·) projections read through a transposed view.
        qn, kn, vn = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
        opts = {"q_num_heads": H, "kv_num_heads": Hkv}
        out, _ = _Attention.apply(qn, kn, vn, mask, None, None, opts)   # [N, L, E]
        out = nn.functional.linear(out, self.out_proj.weight, self.out_proj.bias)
        out = out if self.batch_first and not unbatched else out.transpose(0, 1)
        if unbatched:
            out = out.squeeze(1)

        weights = None
        if need_weights:
            with torch.no_grad():
                o = dict(opts, return_qk="probabilities")
                if mask is not None:
                    o["attn_mask"] = _a(mask)
                weights = _r(_attn.attention(_a(qn), _a(kn), _a(vn), o, _NP)[2], _TORCH)
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if unbatched:
                weights = weights.squeeze(0)
        return out, weights


# ---- the family ------------------------------------------------------------------------------

_FAMILY_TENSORS = ("W", "b", "W_q", "W_k", "w_v", "W_a")
_FAMILY_SCALARS = ("temperature", "bandwidth", "sigmoid_bias")


class _Family(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, opts, *params):
        # params: the 6 tensors of _FAMILY_TENSORS then the 3 scalars of _FAMILY_SCALARS (None: absent)
        o = dict(opts)
        for name, p in zip(_FAMILY_TENSORS + _FAMILY_SCALARS, params):
            if p is None:
                continue
            o[name] = _a(p) if name in _FAMILY_TENSORS else float(p)
        out, _, lse, kept_index, kept_weight = _attn.attention_family(_a(q), _a(k), _a(v), o, _NP)
        out = _r(out, _TORCH)
        # The forward's lse (softmax, kernel) or kept keys (hardmax, top-k): the backward starts
        # from them and out, not from another forward.
        ctx.lse, ctx.kept_index, ctx.kept_weight = lse, kept_index, kept_weight
        ctx.save_for_backward(q, k, v, out)
        ctx.opts = o
        ctx.scalars = [p if isinstance(p, torch.Tensor) else None for p in params[6:]]
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out = ctx.saved_tensors
        g = _attn.attention_family_backward(_a(q), _a(k), _a(v), _a(dout), ctx.opts, _NP,
                                            _a(out), _a(ctx.lse), ctx.kept_index, ctx.kept_weight)
        g = [_r(x, _TORCH) for x in g[:9]] + list(g[9:])
        need = ctx.needs_input_grad
        grads = [g[0] if need[0] else None, g[1] if need[1] else None, g[2] if need[2] else None, None]
        grads += [g[3 + i] if need[4 + i] else None for i in range(6)]
        for i, p in enumerate(ctx.scalars):
            grads.append(torch.full_like(p, g[9 + i]) if (p is not None and need[10 + i]) else None)
        return tuple(grads)


def attention_family(q: Tensor, k: Tensor, v: Tensor, *, score: str = "scaled_dot",
                     distribution: str = "softmax", **params) -> Tensor:
    """:func:`attn.attention_family` for torch tensors, differentiable in q, k, v and the learned
    parameters: W, b, W_q, W_k, w_v, W_a (tensors) and temperature, bandwidth, sigmoid_bias
    (given as tensors to get their gradients; plain floats are constants).

    >>> W = torch.randn(D, Dk, requires_grad=True)
    >>> out = attn.torch.attention_family(q, k, v, score="general", W=W); out.sum().backward()
    """
    tensors = [params.pop(n, None) for n in _FAMILY_TENSORS]
    scalars = [params.pop(n, None) for n in _FAMILY_SCALARS]
    opts = {k_: (_a(v_) if isinstance(v_, torch.Tensor) else v_) for k_, v_ in params.items() if v_ is not None}
    if "window" in opts:
        opts["window"] = tuple(opts["window"])
    opts["score"], opts["distribution"] = score, distribution
    return _Family.apply(q, k, v, opts, *tensors, *scalars)


def _heads_layout(x: Tensor):
    """[B, N, D] (one head, attn's 3-D layout with 1 head) or [B, H, N, D] as they are."""
    return {"q_num_heads": 1, "kv_num_heads": 1} if x.dim() == 3 else {}


class AdditiveAttention(nn.Module):
    """Bahdanau (additive) attention: ``e_ij = w_vᵀ tanh(W_q q_i + W_k k_j (+ b))``, softmax
    (or ``distribution``) over keys. Parameters ``W_q [A, D]``, ``W_k [A, Dk]``, ``w_v [A]``,
    ``b [A]`` with ``bias=True``. Inputs ``[B, N, ·]`` (one head) or ``[B, H, N, ·]``.

    >>> att = attn.torch.AdditiveAttention(query_size=20, key_size=2, num_hiddens=8)
    >>> out = att(queries, keys, values, attn_mask=valid)   # queries [B, Nq, 20]
    """

    def __init__(self, query_size: int, key_size: int, num_hiddens: int, bias: bool = False,
                 distribution: str = "softmax", dtype=None):
        super().__init__()
        self.W_q = nn.Parameter(torch.empty(num_hiddens, query_size, dtype=dtype))
        self.W_k = nn.Parameter(torch.empty(num_hiddens, key_size, dtype=dtype))
        self.w_v = nn.Parameter(torch.empty(num_hiddens, dtype=dtype))
        self.b = nn.Parameter(torch.zeros(num_hiddens, dtype=dtype)) if bias else None
        self.distribution = distribution
        for w in (self.W_q, self.W_k):
            nn.init.xavier_uniform_(w)
        nn.init.uniform_(self.w_v, -1 / math.sqrt(num_hiddens), 1 / math.sqrt(num_hiddens))

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor, attn_mask: Optional[Tensor] = None,
                **masking) -> Tensor:
        return attention_family(queries, keys, values, score="additive", distribution=self.distribution,
                                W_q=self.W_q, W_k=self.W_k, w_v=self.w_v, b=self.b, attn_mask=attn_mask,
                                **_heads_layout(queries), **masking)


class GeneralAttention(nn.Module):
    """Luong general attention ``e_ij = q_iᵀ W k_j`` with ``W [D, Dk]`` (``bias=True``:
    ``e_ij = k_jᵀ (Wᵀ q_i + b)`` with ``b [Dk]``, biased_general). Inputs ``[B, N, ·]`` (one head) or ``[B, H, N, ·]``."""

    def __init__(self, query_size: int, key_size: int, bias: bool = False,
                 distribution: str = "softmax", dtype=None):
        super().__init__()
        self.W = nn.Parameter(torch.empty(query_size, key_size, dtype=dtype))
        nn.init.xavier_uniform_(self.W)
        self.b = nn.Parameter(torch.zeros(key_size, dtype=dtype)) if bias else None
        self.distribution = distribution

    def forward(self, queries: Tensor, keys: Tensor, values: Tensor, attn_mask: Optional[Tensor] = None,
                **masking) -> Tensor:
        score = "general" if self.b is None else "biased_general"
        return attention_family(queries, keys, values, score=score, distribution=self.distribution,
                                W=self.W, b=self.b, attn_mask=attn_mask, **_heads_layout(queries), **masking)


class NadarayaWatson(nn.Module):
    """Nadaraya–Watson kernel regression with a learned bandwidth h:
    ``f(x) = Σ_i K(x, x_i) y_i / Σ_i K(x, x_i)``, kernel "gaussian", "box" or "triangle".

    Inputs: ``x_query [Nq]``, ``x_train [Nk]``, ``y_train [Nk]`` (scalars), or ``[Nq, D]``,
    ``[Nk, D]``, ``[Nk, Dv]``, or batched ``[B, N, ·]``.

    >>> nw = attn.torch.NadarayaWatson(bandwidth=0.5)
    >>> y_hat = nw(x_test, x_train, y_train)
    """

    def __init__(self, kernel: str = "gaussian", bandwidth: float = 1.0, dtype=None):
        super().__init__()
        self.kernel = kernel
        self.bandwidth = nn.Parameter(torch.tensor(float(bandwidth), dtype=dtype or torch.get_default_dtype()))

    def forward(self, x_query: Tensor, x_train: Tensor, y_train: Tensor) -> Tensor:
        dims = x_query.dim()
        if dims not in (1, 2, 3):
            raise ValueError(f"NadarayaWatson: x_query has {dims} dims, expected 1, 2 or 3")

        def lift(t):
            if dims == 1:
                return t.reshape(1, 1, -1, 1)
            if dims == 2:
                return t.reshape(1, 1, *t.shape)
            return t.unsqueeze(1)
        distribution = "softmax" if self.kernel == "gaussian" else "kernel"
        out = attention_family(lift(x_query), lift(x_train), lift(y_train), score=self.kernel,
                               distribution=distribution, bandwidth=self.bandwidth)
        if dims == 1:
            return out.reshape(-1)
        if dims == 2:
            return out[0, 0]
        return out[:, 0]


# ---- positional ------------------------------------------------------------------------------

def _pos(positions):
    return positions if positions is None or isinstance(positions, int) else _a(positions)


class _Rotary(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, positions, rotary_dim, base, layout, num_heads):
        ctx.args = (_pos(positions), rotary_dim, base, layout, num_heads)
        return _r(_attn.rotary(_a(x), *ctx.args, False, _NP), _TORCH)

    @staticmethod
    def backward(ctx, dy):
        return _r(_attn.rotary(_a(dy), *ctx.args, True, _NP), _TORCH), None, None, None, None, None


def rotary(x: Tensor, positions=None, *, rotary_dim: int = 0, base: float = 10000.0,
           layout: str = "half_split", num_heads: int = 0) -> Tensor:
    """:func:`attn.rotary`, differentiable in x.

    >>> q, k = attn.torch.rotary(q, past_len), attn.torch.rotary(k, past_len)
    """
    return _Rotary.apply(x, positions, rotary_dim, base, layout, num_heads)


class _T5Bias(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, Nq, Nk, bidirectional, num_buckets, max_distance, query_offset):
        ctx.args = (bidirectional, num_buckets, max_distance, query_offset)
        return _r(_attn.t5_relative_bias(_a(table), Nq, Nk, *ctx.args, _NP), _TORCH)

    @staticmethod
    def backward(ctx, dbias):
        return (_r(_attn.t5_relative_bias_backward(_a(dbias), *ctx.args, _NP), _TORCH),) + (None,) * 6


def t5_relative_bias(table: Tensor, Nq: int, Nk: int, *, bidirectional: bool = True,
                     num_buckets: Optional[int] = None, max_distance: int = 128,
                     query_offset: int = 0) -> Tensor:
    """:func:`attn.t5_relative_bias`, differentiable in ``table [num_buckets, H]``; the result
    ``[1, H, Nq, Nk]`` is a float attn_mask for :func:`scaled_dot_product_attention`.

    >>> bias = attn.torch.t5_relative_bias(rel_emb.weight, L, L)
    >>> out = attn.torch.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
    """
    nb = table.shape[0] if num_buckets is None else num_buckets
    return _T5Bias.apply(table, Nq, Nk, bidirectional, nb, max_distance, query_offset)


def sinusoidal(N: int, D: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32,
               positions=None) -> Tensor:
    """:func:`attn.sinusoidal` as a torch tensor (no parameters, no gradient)."""
    names = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
             torch.bfloat16: "bfloat16"}
    if dtype not in names:
        raise TypeError(f"sinusoidal: dtype {dtype} is not one of {list(names)}")
    return _r(_attn.sinusoidal(N, D, base, names[dtype], _pos(positions), _NP), _TORCH)

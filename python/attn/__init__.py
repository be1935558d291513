"""attn — attention mechanisms for NumPy and PyTorch, over the attn C++ library.

Shape legend (as in C++): B batch · Hq/Hkv query/key-value heads · Nq/Nk lengths · D key
size · Dv value size. Layouts: 4-D ``q [B, Hq, Nq, D]``, ``k [B, Hkv, Nk, D]``,
``v [B, Hkv, Nk, Dv]``; or 3-D ``[B, N, H*D]`` with ``q_num_heads``/``kv_num_heads``.

Every function takes NumPy arrays (bfloat16 through ``ml_dtypes``), torch CPU tensors or any
DLPack producer, reads them in place through their strides (no copy), and returns the kind it
was given. attn's errors arrive as ``ValueError`` (bad values or shapes) or ``TypeError``
(bad dtypes: the message mentions a dtype), with attn's message.

``attn.torch`` holds the differentiable versions and the drop-ins for
``torch.nn.functional.scaled_dot_product_attention`` and ``torch.nn.MultiheadAttention``.
docs/PYTHON.md has an example of every function.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Tuple

from . import _attn
from ._arrays import arg as _arg, index as _index, kind_of as _kind_of, opts as _opts, result as _result

_EXT = 0  # the extension returns NumPy arrays; _result gives them the caller's kind

__version__: str = _attn.__version__

__all__ = [
    "AttentionResult", "AttentionGrads", "FamilyGrads", "FamilyKept", "attention", "attention_backward",
    "attention_into", "attention_backward_into", "release_cached_buffers", "cached_buffer_bytes",
    "attention_with_kv_cache", "attention_varlen", "attention_varlen_backward", "VarlenResult",
    "VarlenGrads", "attention_paged", "attention_paged_backward", "PagedGrads", "attention_paged_varlen",
    "attention_paged_varlen_backward", "paged_kv_append", "explain_backend", "backends", "attention_family",
    "attention_family_backward", "attention_weights", "linear_attention", "linear_attention_backward", "rotary", "rotary_backward", "sinusoidal",
    "t5_relative_bias", "t5_relative_bias_backward", "t5_relative_buckets", "plot_attention",
    "__version__",
]


class AttentionResult(NamedTuple):
    """What :func:`attention` returns when asked for more than ``out``."""

    out: Any            # layout and dtype of q
    lse: Any            # [B, Hq, Nq] float32 (float64 for float64 inputs); -inf on fully masked rows
    qk: Any             # [B, Hq, Nq, Nk] with return_qk, else None
    present_key: Any    # [B, Hkv, P + Nk, D] with past_key, else None
    present_value: Any  # [B, Hkv, P + Nk, Dv] with past_value, else None
    backend: str        # the backend that ran


class AttentionGrads(NamedTuple):
    """Gradients from :func:`attention_backward`; None where an input has no gradient."""

    dq: Any
    dk: Any
    dv: Any
    dattn_mask: Any     # float masks: in the mask's own shape (broadcast dims summed)
    dalibi_slopes: Any
    dsinks: Any
    backend: str


class FamilyKept(NamedTuple):
    """:func:`attention_family` with ``return_kept=True``: the output and, for hardmax (zero
    gradient) and top-k (k <= 32) on the fused path, the keys each row kept — ``kept_index``
    ``[B, Hq, Nq, K]`` int64 in key order, -1 past a row's count, and their weights ``kept_weight``
    (float32, 0 past the count); None where the path keeps none."""

    out: Any
    kept_index: Any
    kept_weight: Any


class FamilyGrads(NamedTuple):
    """Gradients from :func:`attention_family_backward`; None for parameters not given."""

    dq: Any
    dk: Any
    dv: Any
    dW: Any
    db: Any
    dW_q: Any
    dW_k: Any
    dw_v: Any
    dW_a: Any
    dtemperature: float
    dbandwidth: float
    dsigmoid_bias: float
    path: str


def _attention_opts(attn_mask, is_causal, alignment, scale, window, softcap, alibi_slopes, sinks,
                    nonpad_kv_seqlen, past_key, past_value, q_num_heads, kv_num_heads, return_qk,
                    backend, num_threads):
    return _opts(attn_mask=attn_mask, is_causal=is_causal, alignment=alignment, scale=scale,
                 window=None if window is None else tuple(window), softcap=softcap,
                 alibi_slopes=alibi_slopes, sinks=sinks, nonpad_kv_seqlen=nonpad_kv_seqlen,
                 past_key=past_key, past_value=past_value, q_num_heads=q_num_heads,
                 kv_num_heads=kv_num_heads, return_qk=return_qk, backend=backend,
                 num_threads=num_threads)


def attention(q, k, v, *, attn_mask=None, is_causal: bool = False, alignment: str = "top_left",
              scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
              softcap: float = 0.0, alibi_slopes=None, sinks=None, nonpad_kv_seqlen=None,
              past_key=None, past_value=None, q_num_heads: int = 0, kv_num_heads: int = 0,
              return_lse: bool = False, return_qk: Optional[str] = None,
              backend: str = "automatic", num_threads: int = 0):
    """Scaled-dot-product attention with the semantics of ONNX ``Attention`` (opsets 23/24).

    Per query row i (keys j): ``s_ij = scale·q_i·k_j`` (softcapped: ``c·tanh(s/c)``) ``+ mask_ij
    + alibi_ij``; ``p = softmax(s)`` (with ``sinks``, ``exp(sink_h)`` joins the denominator);
    ``out_i = Σ_j p_ij v_j``. A row with no key left gives 0 (never NaN).

    Args:
      q, k, v: ``[B, Hq, Nq, D]``, ``[B, Hkv, Nk, D]``, ``[B, Hkv, Nk, Dv]`` (Hq % Hkv == 0),
        or 3-D ``[B, N, H*D]`` with q_num_heads/kv_num_heads. float32/float16/bfloat16/float64.
      attn_mask: bool (True = attend) or float (added), broadcast to ``[B, Hq, Nq, Nk]``.
      is_causal: keep keys j <= pos_i; ``alignment`` ("top_left" as PyTorch,
        "bottom_right", "after_past") says where row i sits.
      scale: default ``1/sqrt(D)``. window: ``(left, right)`` keys kept around pos_i, -1 unbounded.
      softcap: > 0 turns on ``softcap·tanh(s/softcap)``.
      alibi_slopes: ``[Hq]`` or ``[B, Hq]``. sinks: ``[Hq]`` per-head logits.
      nonpad_kv_seqlen: integer ``[B]`` valid keys per batch entry.
      past_key, past_value: ONNX KV cache in front of k, v (present_* are returned).
      return_lse: also return the log-sum-exp. return_qk: "scaled", "softcapped", "biased" or
        "probabilities" returns that ``[B, Hq, Nq, Nk]`` intermediate (runs on the reference).
      backend: "automatic", "cpu" or "reference". num_threads: 0 = all cores.

    Returns:
      ``out`` (layout and dtype of q) — or, with return_lse, return_qk or past_key, an
      :class:`AttentionResult`.

    >>> out = attn.attention(q, k, v, is_causal=True)
    """
    kind = _kind_of(q)
    o = _attention_opts(attn_mask, is_causal, alignment, scale, window, softcap, alibi_slopes,
                        sinks, nonpad_kv_seqlen, past_key, past_value, q_num_heads, kv_num_heads,
                        return_qk, backend, num_threads)
    out, lse, qk, pk, pv, used = _attn.attention(_arg(q), _arg(k), _arg(v), o, _EXT)
    out = _result(out, kind)
    if not (return_lse or return_qk or past_key is not None or past_value is not None):
        return out
    return AttentionResult(out, _result(lse, kind), _result(qk, kind), _result(pk, kind),
                           _result(pv, kind), used)


def attention_backward(q, k, v, out, dout, lse, *, attn_mask=None, is_causal: bool = False,
                       alignment: str = "top_left", scale: Optional[float] = None,
                       window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                       alibi_slopes=None, sinks=None, nonpad_kv_seqlen=None,
                       q_num_heads: int = 0, kv_num_heads: int = 0, backend: str = "automatic",
                       num_threads: int = 0, mask_gradient: bool = True) -> AttentionGrads:
    """Backward of :func:`attention` from its saved ``out`` and ``lse`` (``return_lse=True``).

    Same options as the forward. With a KV cache pass ``present_key``/``present_value`` as k, v.
    Returns :class:`AttentionGrads`: dq, dk, dv in the shapes of q, k, v; ``dattn_mask`` for a
    float mask (in its own shape; ``mask_gradient=False`` skips it, for a mask that is not
    trained); ``dalibi_slopes``, ``dsinks`` when given.

    >>> r = attn.attention(q, k, v, return_lse=True)
    >>> g = attn.attention_backward(q, k, v, r.out, dout, r.lse)
    """
    kind = _kind_of(q)
    o = _attention_opts(attn_mask, is_causal, alignment, scale, window, softcap, alibi_slopes,
                        sinks, nonpad_kv_seqlen, None, None, q_num_heads, kv_num_heads, None,
                        backend, num_threads)
    o["mask_gradient"] = mask_gradient
    g = _attn.attention_backward(_arg(q), _arg(k), _arg(v), _arg(out), _arg(dout), _arg(lse), o, _EXT)
    return AttentionGrads(*(_result(x, kind) for x in g[:6]), g[6])


def attention_into(q, k, v, out, lse=None, *, attn_mask=None, is_causal: bool = False,
                   alignment: str = "top_left", scale: Optional[float] = None,
                   window: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                   sinks=None, nonpad_kv_seqlen=None, q_num_heads: int = 0, kv_num_heads: int = 0,
                   backend: str = "automatic", num_threads: int = 0) -> str:
    """:func:`attention` writing into arrays the caller owns; returns the backend that ran.

    ``out``: writable, the shape :func:`attention` returns, q's dtype, any strides (a slice of a
    larger buffer). ``lse``: optional writable ``[B, Hq, Nq]`` float32 (float64 for float64
    inputs). Neither may share memory with the other or an input. The ONNX past cache and
    ``return_qk`` are :func:`attention`'s.

    >>> attn.attention_into(q, k, v, out_buf, lse_buf, is_causal=True)
    """
    o = _attention_opts(attn_mask, is_causal, alignment, scale, window, softcap, alibi_slopes,
                        sinks, nonpad_kv_seqlen, None, None, q_num_heads, kv_num_heads, None,
                        backend, num_threads)
    return _attn.attention_into(_arg(q), _arg(k), _arg(v), _arg(out), _arg(lse), o)


def attention_backward_into(q, k, v, out, dout, lse, dq, dk, dv, *, attn_mask=None,
                            is_causal: bool = False, alignment: str = "top_left",
                            scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
                            softcap: float = 0.0, alibi_slopes=None, sinks=None,
                            nonpad_kv_seqlen=None, q_num_heads: int = 0, kv_num_heads: int = 0,
                            backend: str = "automatic", num_threads: int = 0,
                            mask_gradient: bool = True) -> AttentionGrads:
    """:func:`attention_backward` writing dq, dk, dv into writable arrays the caller owns (shapes
    of q, k, v, q's dtype — or float32 for a bfloat16/float16 q, the gradients before their
    rounding —, any strides; dq, dk, dv may interleave in one packed buffer but share
    no element, nor memory with an input). Returns :class:`AttentionGrads` holding those arrays
    and the other gradients.

    >>> attn.attention_backward_into(q, k, v, r.out, dout, r.lse, dqkv[:, :, 0], dqkv[:, :, 1], dqkv[:, :, 2])
    """
    kind = _kind_of(q)
    o = _attention_opts(attn_mask, is_causal, alignment, scale, window, softcap, alibi_slopes,
                        sinks, nonpad_kv_seqlen, None, None, q_num_heads, kv_num_heads, None,
                        backend, num_threads)
    o["mask_gradient"] = mask_gradient
    g = _attn.attention_backward_into(_arg(q), _arg(k), _arg(v), _arg(out), _arg(dout), _arg(lse), _arg(dq),
                                      _arg(dk), _arg(dv), o, _EXT)
    return AttentionGrads(dq, dk, dv, *(_result(x, kind) for x in g[:3]), g[3])


def attention_with_kv_cache(q, k_new, v_new, cache_key, cache_value, cache_lengths, *,
                            attn_mask=None, is_causal: bool = False, alignment: str = "after_past",
                            scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
                            softcap: float = 0.0, alibi_slopes=None, sinks=None,
                            q_num_heads: int = 0, kv_num_heads: int = 0, return_lse: bool = False,
                            backend: str = "automatic", num_threads: int = 0):
    """One decoding step on an in-place KV cache (FlashAttention's ``flash_attn_with_kvcache``).

    ``cache_key [B, Hkv, capacity, D]`` and ``cache_value [B, Hkv, capacity, Dv]`` are writable
    arrays of q's dtype; ``cache_lengths`` integer ``[B]`` says how many tokens each batch entry
    holds. ``k_new``/``v_new`` are written into rows ``[L_b, L_b + Nnew)`` and q attends to
    keys ``[0, L_b + Nnew)``, read in place. ``cache_lengths`` is not changed: add Nnew after.

    >>> out = attn.attention_with_kv_cache(q_t, k_t, v_t, K, V, lens, is_causal=True); lens += 1
    """
    kind = _kind_of(q)
    o = _attention_opts(attn_mask, is_causal, alignment, scale, window, softcap, alibi_slopes,
                        sinks, None, None, None, q_num_heads, kv_num_heads, None, backend,
                        num_threads)
    ck, cv = _arg(cache_key), _arg(cache_value)
    out, lse, _, _, _, used = _attn.attention_with_kv_cache(_arg(q), _arg(k_new), _arg(v_new), ck,
                                                            cv, _index(cache_lengths), o, _EXT)
    out = _result(out, kind)
    return AttentionResult(out, _result(lse, kind), None, None, None, used) if return_lse else out


# ---- serving: packed variable-length batches and the paged KV cache (docs/SERVING.md) --------

class VarlenResult(NamedTuple):
    """What :func:`attention_varlen` returns with ``return_lse=True``."""

    out: Any      # [total_q, Hq, Dv], dtype of q
    lse: Any      # [Hq, total_q] (FlashAttention's varlen layout); -inf on rows with no key
    backend: str


class VarlenGrads(NamedTuple):
    """Gradients from :func:`attention_varlen_backward`; None where not asked."""

    dq: Any
    dk: Any
    dv: Any
    dalibi_slopes: Any
    dsinks: Any
    backend: str
    dattn_mask: Any = None  # a float packed attn_mask: its gradient, in its shape


def _serving_opts(is_causal, alignment, scale, window, softcap, alibi_slopes, sinks, backend,
                  num_threads, extra, attn_mask=None):
    if attn_mask is not None:
        extra = dict(extra, attn_mask=attn_mask)
    return _opts(is_causal=is_causal, alignment=alignment, scale=scale,
                 window=None if window is None else tuple(window), softcap=softcap,
                 alibi_slopes=alibi_slopes, sinks=sinks, backend=backend, num_threads=num_threads,
                 **extra)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, *,
                     attn_mask=None, is_causal: bool = False, alignment: str = "top_left",
                     scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
                     softcap: float = 0.0, alibi_slopes=None, sinks=None,
                     return_lse: bool = False, backend: str = "automatic", num_threads: int = 0,
                     **extra):
    """Attention over B sequences packed back to back (FlashAttention's ``flash_attn_varlen_func``).

    ``q [total_q, Hq, D]``, ``k [total_k, Hkv, D]``, ``v [total_k, Hkv, Dv]``; integer
    ``cu_seqlens_q``/``cu_seqlens_k [B + 1]`` (0, then cumulative lengths): sequence b owns query
    rows ``[cu_q[b], cu_q[b+1])`` and key rows ``[cu_k[b], cu_k[b+1])``. ``max_seqlen_*`` bound
    the lengths. Every option applies to each sequence on its own ("bottom_right" is
    FlashAttention's causal alignment); ALiBi slopes are ``[Hq]`` or ``[B, Hq]``. No padding work.

    ``attn_mask`` (bool, True = attend; or float, added) is packed per sequence as FlashInfer's
    ``custom_mask``: each sequence's ``[Nq_b, Nk_b]`` mask flattened row-major, the sequences back
    to back — shape ``[S]`` (every head) or ``[1 or Hq, S]``, ``S = sum(Nq_b * Nk_b)``.

    Returns ``out [total_q, Hq, Dv]`` — or, with return_lse, a :class:`VarlenResult` whose lse is
    ``[Hq, total_q]``.

    >>> out = attn.attention_varlen(q, k, v, cu, cu, 512, 512, is_causal=True, alignment="bottom_right")
    """
    kind = _kind_of(q)
    o = _serving_opts(is_causal, alignment, scale, window, softcap, alibi_slopes, sinks, backend,
                      num_threads, extra, attn_mask)
    out, lse, used = _attn.attention_varlen(_arg(q), _arg(k), _arg(v), _index(cu_seqlens_q),
                                            _index(cu_seqlens_k), int(max_seqlen_q), int(max_seqlen_k),
                                            o, _EXT)
    out = _result(out, kind)
    return VarlenResult(out, _result(lse, kind), used) if return_lse else out


def attention_varlen_backward(q, k, v, out, dout, lse, cu_seqlens_q, cu_seqlens_k,
                              max_seqlen_q: int, max_seqlen_k: int, *, attn_mask=None,
                              is_causal: bool = False,
                              alignment: str = "top_left", scale: Optional[float] = None,
                              window: Tuple[int, int] = (-1, -1), softcap: float = 0.0,
                              alibi_slopes=None, sinks=None, backend: str = "automatic",
                              num_threads: int = 0, **extra) -> VarlenGrads:
    """Backward of :func:`attention_varlen` from its saved ``out`` and ``lse`` (``return_lse=True``).
    A float packed ``attn_mask`` gets its gradient (``dattn_mask``, in the mask's shape).

    >>> r = attn.attention_varlen(q, k, v, cu, cu, 512, 512, return_lse=True)
    >>> g = attn.attention_varlen_backward(q, k, v, r.out, dout, r.lse, cu, cu, 512, 512)
    """
    kind = _kind_of(q)
    o = _serving_opts(is_causal, alignment, scale, window, softcap, alibi_slopes, sinks, backend,
                      num_threads, extra, attn_mask)
    g = _attn.attention_varlen_backward(_arg(q), _arg(k), _arg(v), _arg(out), _arg(dout), _arg(lse),
                                        _index(cu_seqlens_q), _index(cu_seqlens_k), int(max_seqlen_q),
                                        int(max_seqlen_k), o, _EXT)
    return VarlenGrads(*(_result(x, kind) for x in g[:5]), g[5], _result(g[6], kind))


def attention_paged(q, k_pages, v_pages, block_table, seq_lens, *, k_scales=None, v_scales=None,
                    attn_mask=None, is_causal: bool = False, alignment: str = "bottom_right",
                    scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
                    softcap: float = 0.0, alibi_slopes=None, sinks=None,
                    return_lse: bool = False, backend: str = "automatic", num_threads: int = 0,
                    int8_query: str = "automatic", **extra):
    """Attention of ``q [B, Hq, Nq, D]`` against a paged KV cache, read in place (vLLM's
    PagedAttention; FlashAttention's ``block_table``).

    ``k_pages [num_pages, page_size, Hkv, D]``, ``v_pages [num_pages, page_size, Hkv, Dv]``;
    integer ``block_table [B, max_pages]`` (the pages of each sequence, in order) and ``seq_lens
    [B]`` (its keys). int8 pages come with float32 ``k_scales``/``v_scales [num_pages, page_size,
    Hkv]`` (see :func:`paged_kv_append`); int8 ``k_pages`` may also be blocked keys ``[num_pages,
    page_size / 16, Hkv, D / 4, 16, 4]`` (16 keys side by side for every 4 elements of d: the
    layout the AVX512-VNNI decode reads fastest). With ``is_causal`` and "bottom_right", query i of
    sequence b sits at key ``seq_lens[b] - Nq + i`` (the queries are the newest tokens).
    ``attn_mask``: bool (True = attend) or float (added; HF-style finfo.min rows are taken, shifted
    by their maximum as :func:`attention` shifts them) over each sequence's key positions, broadcast to ``[B, Hq, Nq, K]`` with K = max_pages ·
    page_size (a shorter last dim excludes the positions past it) — e.g. a tree of draft tokens
    in a speculative step. Returns ``out [B, Hq, Nq, Dv]`` — or, with return_lse, an
    :class:`AttentionResult`; :func:`attention_paged_backward` differentiates it
    (:func:`attn.torch.attention_paged` with autograd).

    ``int8_query`` (int8 pages): "automatic" rounds each row of q, and each block's weights, to
    int16 where the CPU has AVX512-VNNI int16 dot products (exact for bfloat16 q; a float32
    element moves by at most 2^-14 of its row's largest |q|; about 1.6x the float32 rate);
    "float32" keeps every product exact in float32; "int8" on such a CPU rounds the weights to
    unsigned 8 bits (1/510 of a block's largest at most) and, with blocked keys, q to 8 bits too
    (1/254 of a row's largest |q|): half the products of "automatic" (elsewhere it is "automatic").

    >>> attn.paged_kv_append(K, V, table, lens, k_t, v_t); lens += 1
    >>> out = attn.attention_paged(q_t, K, V, table, lens, is_causal=True)
    """
    kind = _kind_of(q)
    if attn_mask is not None:
        extra = dict(extra, attn_mask=attn_mask)
    o = _serving_opts(is_causal, alignment, scale, window, softcap, alibi_slopes, sinks, backend,
                      num_threads, dict(extra, int8_query=int8_query))
    out, lse, used = _attn.attention_paged(_arg(q), _arg(k_pages), _arg(v_pages), _index(block_table),
                                           _index(seq_lens), None if k_scales is None else _arg(k_scales),
                                           None if v_scales is None else _arg(v_scales), o, _EXT)
    out = _result(out, kind)
    return AttentionResult(out, _result(lse, kind), None, None, None, used) if return_lse else out


class PagedGrads(NamedTuple):
    """Gradients from :func:`attention_paged_backward`; None where there is nothing to return."""

    dq: Any             # [B, Hq, Nq, D]
    dk_pages: Any       # [num_pages, page_size, Hkv, D], dtype of the pages
    dv_pages: Any       # [num_pages, page_size, Hkv, Dv]
    dalibi_slopes: Any
    dsinks: Any
    dattn_mask: Any     # a float attn_mask: its gradient, in its shape
    backend: str


def attention_paged_backward(q, k_pages, v_pages, block_table, seq_lens, out, dout, lse, *,
                             attn_mask=None, is_causal: bool = False, alignment: str = "bottom_right",
                             scale: Optional[float] = None, window: Tuple[int, int] = (-1, -1),
                             softcap: float = 0.0, alibi_slopes=None, sinks=None,
                             backend: str = "automatic", num_threads: int = 0, **extra) -> PagedGrads:
    """Backward of :func:`attention_paged` (float pages) from its saved ``out`` and ``lse``
    (``return_lse=True``), with the same options. ``dk_pages``/``dv_pages`` have the pages' shape:
    each sequence's key gradients go back through its block table, a page that several sequences
    read (a shared prefix) gets their sum, rows nobody reads get 0. int8 pages are refused.

    >>> r = attn.attention_paged(q, K, V, table, lens, is_causal=True, return_lse=True)
    >>> g = attn.attention_paged_backward(q, K, V, table, lens, r.out, dout, r.lse, is_causal=True)
    """
    kind = _kind_of(q)
    o = _serving_opts(is_causal, alignment, scale, window, softcap, alibi_slopes, sinks, backend,
                      num_threads, extra, attn_mask)
    g = _attn.attention_paged_backward(_arg(q), _arg(k_pages), _arg(v_pages), _index(block_table),
                                       _index(seq_lens), _arg(out), _arg(dout), _arg(lse), o, _EXT)
    return PagedGrads(*(_result(x, kind) for x in g[:6]), g[6])


def attention_paged_varlen(q, cu_seqlens_q, max_seqlen_q: int, k_pages, v_pages, block_table, seq_lens, *,
                           k_scales=None, v_scales=None, attn_mask=None, is_causal: bool = False,
                           alignment: str = "bottom_right", scale: Optional[float] = None,
                           window: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                           sinks=None, return_lse: bool = False, backend: str = "automatic",
                           num_threads: int = 0, int8_query: str = "automatic", **extra):
    """:func:`attention_paged` for a batch whose sequences bring different numbers of new tokens
    (decode steps beside prefill chunks): ``q [total_q, Hq, D]`` packed with integer
    ``cu_seqlens_q [B + 1]`` (every length <= ``max_seqlen_q``), against the paged cache of the same
    B sequences. Sequence b's queries are its newest ``Nq_b`` tokens. Returns ``out [total_q, Hq,
    Dv]`` — or, with return_lse, a :class:`VarlenResult` whose lse is ``[Hq, total_q]``.
    ``attn_mask`` is packed as for :func:`attention_varlen`, with ``Nk_b = seq_lens[b]`` (e.g. a
    tree of draft tokens per sequence). ``int8_query`` as for :func:`attention_paged`.

    >>> out = attn.attention_paged_varlen(q, cu, 16, K, V, table, lens, is_causal=True)
    """
    kind = _kind_of(q)
    o = _serving_opts(is_causal, alignment, scale, window, softcap, alibi_slopes, sinks, backend,
                      num_threads, dict(extra, int8_query=int8_query), attn_mask)
    out, lse, used = _attn.attention_paged_varlen(_arg(q), _index(cu_seqlens_q), int(max_seqlen_q),
                                                  _arg(k_pages), _arg(v_pages), _index(block_table),
                                                  _index(seq_lens), None if k_scales is None else _arg(k_scales),
                                                  None if v_scales is None else _arg(v_scales), o, _EXT)
    out = _result(out, kind)
    return VarlenResult(out, _result(lse, kind), used) if return_lse else out


def attention_paged_varlen_backward(q, cu_seqlens_q, max_seqlen_q: int, k_pages, v_pages, block_table, seq_lens,
                                    out, dout, lse, *, attn_mask=None, is_causal: bool = False,
                                    alignment: str = "bottom_right", scale: Optional[float] = None,
                                    window: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
                                    sinks=None, backend: str = "automatic", num_threads: int = 0,
                                    **extra) -> PagedGrads:
    """Backward of :func:`attention_paged_varlen` (float pages) from its saved ``out [total_q, Hq,
    Dv]`` and ``lse [Hq, total_q]`` (``return_lse=True``), with the same options: ``dq`` packed like
    q, ``dk_pages``/``dv_pages`` as :func:`attention_paged_backward` gives them, a float packed
    ``attn_mask``'s gradient in its packed shape.

    >>> r = attn.attention_paged_varlen(q, cu, 16, K, V, table, lens, is_causal=True, return_lse=True)
    >>> g = attn.attention_paged_varlen_backward(q, cu, 16, K, V, table, lens, r.out, dout, r.lse, is_causal=True)
    """
    kind = _kind_of(q)
    o = _serving_opts(is_causal, alignment, scale, window, softcap, alibi_slopes, sinks, backend,
                      num_threads, extra, attn_mask)
    g = _attn.attention_paged_varlen_backward(_arg(q), _index(cu_seqlens_q), int(max_seqlen_q), _arg(k_pages),
                                              _arg(v_pages), _index(block_table), _index(seq_lens), _arg(out),
                                              _arg(dout), _arg(lse), o, _EXT)
    return PagedGrads(*(_result(x, kind) for x in g[:6]), g[6])


def paged_kv_append(k_pages, v_pages, block_table, seq_lens, k_new, v_new, *, k_scales=None,
                    v_scales=None) -> None:
    """Writes ``k_new [B, Hkv, Nnew, D]`` / ``v_new [B, Hkv, Nnew, Dv]`` at positions
    ``[seq_lens[b], seq_lens[b] + Nnew)`` of each sequence's pages, in place (the pages must be
    writable arrays). int8 pages are quantised on the way in (one scale per token and head, written
    into ``k_scales``/``v_scales``; a non-finite value is an error and nothing is written).
    ``seq_lens`` is not changed: add Nnew after.
    """
    _attn.paged_kv_append(_arg(k_pages), _arg(v_pages), _index(block_table), _index(seq_lens),
                          None if k_scales is None else _arg(k_scales),
                          None if v_scales is None else _arg(v_scales), _arg(k_new), _arg(v_new))


def explain_backend(q, k, v, *, backward: bool = False, **options) -> str:
    """Which backend :func:`attention` (or its backward) runs for these inputs, and why.

    Takes the options of :func:`attention` as keywords.

    >>> attn.explain_backend(q.double(), k.double(), v.double())
    'cpu: float64 inputs need the reference; runs on reference'
    """
    return _attn.explain_backend(_arg(q), _arg(k), _arg(v), _opts(**options), backward)


def release_cached_buffers() -> int:
    """attn keeps freed buffers of 8 MiB or more (at most 512 MiB, the most recent first) for the
    next result of the same size — a repeated call then writes into memory it already has. This
    gives them back to the system and returns their bytes."""
    return _attn.release_cached_buffers()


def cached_buffer_bytes() -> int:
    """The bytes :func:`release_cached_buffers` would give back now."""
    return _attn.cached_buffer_bytes()


def backends() -> list:
    """The backends compiled in, in the order "automatic" tries them."""
    return list(_attn.backends())


# ---- the family -----------------------------------------------------------------------------

def attention_family(q, k, v, *, score: str = "scaled_dot", distribution: str = "softmax",
                     return_kept: bool = False, **params):
    """The attention family: ``out_i = Σ_j distribution(score(q_i, k_j) + mask_ij) v_j``.

    Scores: dot, scaled_dot (``scale``), general (``W [D, Dk]``), biased_general (``W``, ``b``),
    activated_general (``W``, ``b``, ``activation`` tanh|relu|sigmoid), additive (``W_q [A, D]``,
    ``W_k [A, Dk]``, ``b [A]``, ``w_v [A]`` or ``[Dv, A]``), cosine (``temperature``), location
    (``W_a [Nk, D]``), gaussian, box, triangle (``bandwidth``).
    Distributions: softmax, sigmoid (``sigmoid_bias``), sparsemax, entmax15, hardmax
    (``hardmax_grad`` zero|straight_through), topk (``top_k``), kernel.
    Masking keywords as :func:`attention`: attn_mask, is_causal, alignment, window,
    nonpad_kv_seqlen, q_num_heads, kv_num_heads; and backend, path, num_threads.

    ``return_kept=True`` returns :class:`FamilyKept` (out and the keys hardmax and top-k kept).

    >>> out = attn.attention_family(q, k, v, score="cosine", temperature=0.1, distribution="sparsemax")
    >>> r = attn.attention_family(q, k, v, distribution="topk", top_k=8, return_kept=True)
    """
    kind = _kind_of(q)
    r = _attn.attention_family(_arg(q), _arg(k), _arg(v),
                               _opts(score=score, distribution=distribution, **params), _EXT)
    if return_kept:
        return FamilyKept(_result(r[0], kind), _result(r[3], kind), _result(r[4], kind))
    return _result(r[0], kind)


def attention_family_backward(q, k, v, dout, *, score: str = "scaled_dot",
                              distribution: str = "softmax", **params) -> FamilyGrads:
    """Gradients of ``Σ dout·out`` for :func:`attention_family` with the same arguments:
    :class:`FamilyGrads` (dq, dk, dv, each parameter's gradient, and the scalar gradients of
    temperature, bandwidth and sigmoid_bias)."""
    kind = _kind_of(q)
    g = _attn.attention_family_backward(_arg(q), _arg(k), _arg(v), _arg(dout),
                                        _opts(score=score, distribution=distribution, **params), _EXT)
    return FamilyGrads(*(_result(x, kind) for x in g[:9]), *g[9:])


def attention_weights(q, k, v, *, score: str = "scaled_dot", distribution: str = "softmax",
                      **params):
    """The attention weights α of :func:`attention_family` (float64 ``[B, Hq, Nq, Nk]``, or
    ``[B, Hq, Nq, Nk, Dv]`` when multi-dimensional), for inspection and plotting.

    >>> alpha = attn.attention_weights(q, k, v, score="additive", W_q=Wq, W_k=Wk, b=b, w_v=wv)
    """
    kind = _kind_of(q)
    return _result(_attn.attention_weights(_arg(q), _arg(k), _arg(v),
                                           _opts(score=score, distribution=distribution, **params), _EXT), kind)


def linear_attention(q, k, v, *, feature_map: str = "elu_plus_one", normalize: bool = True, **params):
    """Linear attention (Katharopoulos et al. 2020): ``out_i = Σ_j φ(q_i)·φ(k_j) v_j / Σ_j φ(q_i)·φ(k_j)``
    in O(N·D·Dv), never forming the weights; ``feature_map`` "elu_plus_one", "relu" or "identity";
    ``normalize=False`` keeps the numerator alone. Masks: is_causal, alignment,
    nonpad_kv_seqlen (attn_mask and window are refused); path ("reference": the float64
    oracle), num_threads, q_num_heads, kv_num_heads.

    >>> out = attn.linear_attention(q, k, v, feature_map="elu_plus_one", is_causal=True)
    """
    kind = _kind_of(q)
    out, _ = _attn.linear_attention(_arg(q), _arg(k), _arg(v),
                                    _opts(feature_map=feature_map, normalize=normalize, **params), _EXT)
    return _result(out, kind)


def linear_attention_backward(q, k, v, dout, *, feature_map: str = "elu_plus_one", normalize: bool = True,
                              **params):
    """Gradients ``(dq, dk, dv)`` of ``Σ dout·out`` for :func:`linear_attention` with the same arguments."""
    kind = _kind_of(q)
    dq, dk, dv, _ = _attn.linear_attention_backward(_arg(q), _arg(k), _arg(v), _arg(dout),
                                                    _opts(feature_map=feature_map, normalize=normalize, **params),
                                                    _EXT)
    return _result(dq, kind), _result(dk, kind), _result(dv, kind)


# ---- positional -----------------------------------------------------------------------------

def _positions(positions):
    return positions if positions is None or isinstance(positions, int) else _arg(positions)


def rotary(x, positions=None, *, rotary_dim: int = 0, base: float = 10000.0,
           layout: str = "half_split", num_heads: int = 0):
    """Rotary position embedding (RoPE) of ``x [B, H, N, D]`` (or ``[B, N, H*D]`` with num_heads).

    ``positions``: an int offset (row n at offset + n) or int64 / int32 ids ``[N]`` / ``[B, N]``.
    ``layout``: "half_split" (GPT-NeoX, LLaMA) or "interleaved" (GPT-J). ``rotary_dim``: the
    leading features rotated (0 = all).

    >>> qr = attn.rotary(q, 16)          # rows at positions 16, 17, ...
    """
    kind = _kind_of(x)
    return _result(_attn.rotary(_arg(x), _positions(positions), rotary_dim, base, layout,
                                num_heads, False, _EXT), kind)


def rotary_backward(dy, positions=None, *, rotary_dim: int = 0, base: float = 10000.0,
                    layout: str = "half_split", num_heads: int = 0):
    """Backward of :func:`rotary`: the inverse rotation of ``dy``."""
    kind = _kind_of(dy)
    return _result(_attn.rotary(_arg(dy), _positions(positions), rotary_dim, base, layout,
                                num_heads, True, _EXT), kind)


def sinusoidal(N: int, D: int, *, base: float = 10000.0, dtype: str = "float32", positions=None,
               like=None):
    """Sinusoidal encoding ``PE[p, 2i] = sin(p·base^(-2i/D))``, ``PE[p, 2i+1] = cos(...)``.

    Returns ``[N, D]`` (``[B, N, D]`` for ids ``[B, N]``), NumPy unless ``like`` is a torch
    tensor. dtype: "float32", "float64", "float16" or "bfloat16".

    >>> pe = attn.sinusoidal(128, 512)
    """
    kind = _NUMPY if like is None else _kind_of(like)
    return _result(_attn.sinusoidal(N, D, base, dtype, _positions(positions), _EXT), kind)


def t5_relative_bias(table, Nq: int, Nk: int, *, bidirectional: bool = True,
                     num_buckets: Optional[int] = None, max_distance: int = 128,
                     query_offset: int = 0):
    """T5 relative position bias ``[1, H, Nq, Nk]`` from ``table [num_buckets, H]`` — a float
    ``attn_mask`` for :func:`attention` (T5 uses ``scale=1``).

    >>> bias = attn.t5_relative_bias(table, 16, 16)
    >>> out = attn.attention(q, k, v, attn_mask=bias, scale=1.0)
    """
    kind = _kind_of(table)
    nb = table.shape[0] if num_buckets is None else num_buckets
    return _result(_attn.t5_relative_bias(_arg(table), Nq, Nk, bidirectional, nb, max_distance,
                                          query_offset, _EXT), kind)


def t5_relative_bias_backward(dbias, *, bidirectional: bool = True, num_buckets: int = 32,
                              max_distance: int = 128, query_offset: int = 0):
    """Gradient of the table ``[num_buckets, H]`` from ``dbias [B', H, Nq, Nk]`` (summed over B')."""
    kind = _kind_of(dbias)
    return _result(_attn.t5_relative_bias_backward(_arg(dbias), bidirectional, num_buckets,
                                                   max_distance, query_offset, _EXT), kind)


def t5_relative_buckets(Nq: int, Nk: int, *, bidirectional: bool = True, num_buckets: int = 32,
                        max_distance: int = 128, query_offset: int = 0):
    """int64 ``[Nq, Nk]``: the T5 bucket of every (query, key) pair (NumPy)."""
    return _attn.t5_relative_buckets(Nq, Nk, bidirectional, num_buckets, max_distance, query_offset)


from ._arrays import NUMPY as _NUMPY  # noqa: E402
from .plot import plot_attention  # noqa: E402


def __getattr__(name):  # `attn.torch` on first use, so `import attn` does not import torch
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'attn' has no attribute {name!r}")

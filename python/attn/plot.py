"""Heatmaps of attention weights (matplotlib, an optional dependency: ``pip install matplotlib``)."""

from __future__ import annotations

from typing import Optional, Sequence


def plot_attention(alpha, x_labels: Optional[Sequence[str]] = None,
                   y_labels: Optional[Sequence[str]] = None, path: Optional[str] = None,
                   title: Optional[str] = None, ax=None):
    """Draw attention weights ``alpha [Nq, Nk]`` as a heatmap, queries down, keys across.

    ``alpha`` may carry leading size-1 dims (``[1, 1, Nq, Nk]`` from :func:`attn.attention_weights`
    for one head). ``x_labels`` name the keys, ``y_labels`` the queries. With ``path`` the
    figure is saved there (PNG, PDF, SVG by extension). Returns the matplotlib Axes.

    >>> alpha = attn.attention_weights(q, k, v)[0, 0]
    >>> attn.plot_attention(alpha, x_labels=src_tokens, y_labels=tgt_tokens, path="alpha.png")
    """
    import numpy as np

    try:
        import matplotlib

        if path is not None and ax is None:
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as e:  # pragma: no cover - optional dependency
        raise ImportError("attn.plot_attention needs matplotlib: pip install matplotlib") from e

    if hasattr(alpha, "detach"):  # torch
        alpha = alpha.detach().float().cpu().numpy()
    a = np.asarray(alpha, dtype=np.float64)
    while a.ndim > 2 and a.shape[0] == 1:
        a = a[0]
    if a.ndim != 2:
        raise ValueError(f"plot_attention: alpha has shape {list(np.shape(alpha))}, expected [Nq, Nk] "
                         "(leading dims of size 1 allowed)")
    Nq, Nk = a.shape
    if x_labels is not None and len(x_labels) != Nk:
        raise ValueError(f"plot_attention: {len(x_labels)} x_labels for Nk = {Nk} keys")
    if y_labels is not None and len(y_labels) != Nq:
        raise ValueError(f"plot_attention: {len(y_labels)} y_labels for Nq = {Nq} queries")

    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(max(3.0, 0.45 * Nk + 1.5), max(2.5, 0.45 * Nq + 1.0)))
    im = ax.imshow(a, cmap="Reds", vmin=0.0, vmax=max(1e-12, float(a.max())), aspect="auto")
    ax.figure.colorbar(im, ax=ax)
    ax.set_xlabel("keys")
    ax.set_ylabel("queries")
    if x_labels is not None:
        ax.set_xticks(range(Nk), labels=list(x_labels), rotation=90)
    if y_labels is not None:
        ax.set_yticks(range(Nq), labels=list(y_labels))
    if title:
        ax.set_title(title)
    if path is not None:
        ax.figure.tight_layout()
        ax.figure.savefig(path)
        if fig is not None:
            plt.close(fig)
    return ax

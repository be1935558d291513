"""sparsemax and entmax15 attention against the `entmax` package (forward and backward)."""

import pytest
import torch
from entmax import entmax15, sparsemax

import attn.torch as at
from conftest import assert_close


@pytest.mark.parametrize("dist,fn", [("sparsemax", sparsemax), ("entmax15", entmax15)])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1, 4), (2, 3, 5, 7, 4), (1, 2, 9, 33, 5)])
@pytest.mark.parametrize("masked", [False, True])
def test_against_entmax(dist, fn, shape, masked):
    B, H, Nq, Nk, D = shape
    g = torch.Generator().manual_seed(Nq * 31 + Nk)
    q = torch.randn(B, H, Nq, D, dtype=torch.float64, generator=g) * 2
    k = torch.randn(B, H, Nk, D, dtype=torch.float64, generator=g)
    v = torch.randn(B, H, Nk, 3, dtype=torch.float64, generator=g)
    mask = None
    if masked:
        mask = torch.rand(Nq, Nk, generator=g) < 0.7
        mask[:, 0] = True
    a = [t.clone().requires_grad_() for t in (q, k, v)]
    b = [t.clone().requires_grad_() for t in (q, k, v)]
    out = at.attention_family(*a, score="scaled_dot", distribution=dist, attn_mask=mask)
    s = b[0] @ b[1].transpose(-1, -2) / D ** 0.5
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    ref = fn(s, dim=-1) @ b[2]
    assert_close(out, ref, 1e-10, f"{dist} out")
    dout = torch.randn(ref.shape, dtype=torch.float64, generator=g)
    for name, x, y in zip("qkv", torch.autograd.grad(out, a, dout), torch.autograd.grad(ref, b, dout)):
        assert_close(x, y, 1e-9, f"{dist} d{name}")


@pytest.mark.parametrize("dist,fn", [("sparsemax", sparsemax), ("entmax15", entmax15)])
def test_weights_against_entmax(dist, fn):
    import attn

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 4, 6, dtype=torch.float64, generator=g) * 3 for _ in range(3))
    alpha = attn.attention_weights(q, k, v, score="dot", distribution=dist)
    assert_close(alpha, fn(q @ k.transpose(-1, -2), dim=-1), 1e-12, "weights")
    assert (alpha == 0).any(), "sparse maps give exact zeros here"

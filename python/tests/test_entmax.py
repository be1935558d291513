"""sparsemax and entmax15 attention against the `entmax` package (forward and backward)."""

import math

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
@pytest.mark.parametrize("kind", ["causal", "padding"])
def test_fused_mask_tensor_against_entmax(dist, fn, kind):
    """float32 on the fused kernels with a bool mask tensor that hides whole key blocks (a causal
    [N, N] mask, key padding [B, 1, 1, N]): the blocks are skipped; forward and gradients against
    the entmax package in float64 on the same float32 inputs."""
    B, H, N, D = 2, 2, 300, 16
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(B, H, N, D, generator=g) * 2 for _ in range(3))
    if kind == "causal":
        mask = torch.ones(N, N, dtype=torch.bool).tril()
    else:
        mask = torch.ones(B, 1, 1, N, dtype=torch.bool)
        mask[0, ..., 40:] = False
    a = [t.clone().requires_grad_() for t in (q, k, v)]
    b = [t.double().requires_grad_() for t in (q, k, v)]
    out = at.attention_family(*a, score="scaled_dot", distribution=dist, attn_mask=mask, num_threads=2)
    s = (b[0] @ b[1].transpose(-1, -2) / D ** 0.5).masked_fill(~mask, float("-inf"))
    ref = fn(s, dim=-1) @ b[2]
    assert_close(out.double(), ref, 1e-4, f"{dist} {kind} out")
    dout = torch.randn(ref.shape, generator=g)
    got = torch.autograd.grad(out, a, dout)
    want = torch.autograd.grad(ref, b, dout.double())
    for name, x, y in zip("qkv", got, want):
        assert_close(x.double(), y, 1e-4, f"{dist} {kind} d{name}")


@pytest.mark.parametrize("dist,fn", [("sparsemax", sparsemax), ("entmax15", entmax15)])
def test_weights_against_entmax(dist, fn):
    import attn

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 4, 6, dtype=torch.float64, generator=g) * 3 for _ in range(3))
    alpha = attn.attention_weights(q, k, v, score="dot", distribution=dist)
    assert_close(alpha, fn(q @ k.transpose(-1, -2), dim=-1), 1e-12, "weights")
    assert (alpha == 0).any(), "sparse maps give exact zeros here"


@pytest.mark.parametrize("dist", ["softmax", "sigmoid", "sparsemax", "entmax15"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("H", [3, 8])
def test_multidimensional_additive_fused_against_torch(dist, causal, H):
    """Multi-dimensional additive attention (w_v [Dv, A]: one distribution per value feature) in
    float32 on attn's fused kernels against the formula in PyTorch eager float64 (the `entmax`
    package for the sparse maps): out and the gradients of q, k, v, W_q, W_k, b and w_v. With
    B·H >= 8 softmax and sigmoid take the one-pass backward (softmax from the forward's lse per
    feature, which the autograd Function saves)."""
    B, Nq, Nk, D, Dv, A = 2, 21, 37, 6, 5, 7
    g = torch.Generator().manual_seed(11 + causal)
    leaves64 = [torch.randn(*s, dtype=torch.float64, generator=g) for s in
                ((B, H, Nq, D), (B, H, Nk, D), (B, H, Nk, Dv), (A, D), (A, D), (A,), (Dv, A))]
    leaves64 = [t.float().double() for t in leaves64]  # values a float32 holds exactly
    mine = [t.float().requires_grad_() for t in leaves64]
    ref = [t.clone().requires_grad_() for t in leaves64]
    q, k, v, Wq, Wk, b, wv = mine
    out = at.attention_family(q, k, v, score="additive", W_q=Wq, W_k=Wk, b=b, w_v=wv, distribution=dist,
                              is_causal=causal)
    q, k, v, Wq, Wk, b, wv = ref
    t = torch.tanh((q @ Wq.T).unsqueeze(-2) + (k @ Wk.T + b).unsqueeze(-3))  # [B, H, Nq, Nk, A]
    s = (t @ wv.T).movedim(-1, -2)                                            # [B, H, Nq, Dv, Nk]
    if causal:
        keep = torch.arange(Nk)[None, :] <= torch.arange(Nq)[:, None]
        s = s.masked_fill(~keep[:, None, :], float("-inf"))
    fn = {"softmax": lambda x: torch.softmax(x, -1), "sigmoid": lambda x: torch.sigmoid(x - math.log(Nk)),
          "sparsemax": lambda x: sparsemax(x, dim=-1), "entmax15": lambda x: entmax15(x, dim=-1)}[dist]
    want = torch.einsum("bhicj,bhjc->bhic", fn(s), v)
    assert_close(out.double(), want, 2e-5, f"{dist} out")
    dout = torch.randn(want.shape, dtype=torch.float64, generator=g)
    got = torch.autograd.grad(out, mine, dout.float())
    exp = torch.autograd.grad(want, ref, dout)
    for name, x, y in zip(("q", "k", "v", "W_q", "W_k", "b", "w_v"), got, exp):
        assert_close(x.double(), y, 2e-4, f"{dist} d{name}")


def _family_reference(dist, s, Nk):
    """α of float64 scores s [.., Nk] by PyTorch (the `entmax` package for the sparse maps)."""
    return {"softmax": lambda x: torch.softmax(x, -1), "sigmoid": lambda x: torch.sigmoid(x - math.log(Nk)),
            "sparsemax": lambda x: sparsemax(x, dim=-1), "entmax15": lambda x: entmax15(x, dim=-1),
            "identity": lambda x: x.masked_fill(x == float("-inf"), 0.0)}[dist](s)


@pytest.mark.parametrize("isa", ["", "avx512bf16"])
@pytest.mark.parametrize("dist", ["softmax", "sigmoid", "sparsemax", "entmax15", "identity"])
@pytest.mark.parametrize("causal", [False, True])
def test_bf16_dot_scores_against_torch(dist, causal, isa, monkeypatch):
    """bfloat16 dot scores on the fused kernels' bf16 products — on AMX tiles where the CPU has
    them (the best level, isa ""), by vdpbf16ps at the avx512bf16 level, f32 products below it —
    against PyTorch and `entmax` in float64 on the same bfloat16 values: out and dq, dk, dv, at
    key counts that leave partial tiles (70, 200) and D = Dv = 64 (whole tiles)."""
    if isa:
        monkeypatch.setenv("ATTN_CPU_ISA", isa)
        monkeypatch.setenv("ATTN_CPU_BF16_DOTS", "on")  # (else Intel CPUs widen bf16 to f32 there)
    for N in (70, 200):
        B, H, D = 1, 4, 64
        g = torch.Generator().manual_seed(N + causal)
        q, k, v = ((torch.randn(B, H, N, D, generator=g) * s).bfloat16() for s in (1.5, 1.0, 1.0))
        a = [t.clone().requires_grad_() for t in (q, k, v)]
        b = [t.double().requires_grad_() for t in (q, k, v)]
        out = at.attention_family(*a, score="scaled_dot", distribution=dist, is_causal=causal, num_threads=2)
        s = b[0] @ b[1].transpose(-1, -2) / D ** 0.5
        if causal:
            s = s.masked_fill(~torch.ones(N, N, dtype=torch.bool).tril(), float("-inf"))
        ref = _family_reference(dist, s, N) @ b[2]
        assert out.dtype == torch.bfloat16
        assert_close(out, ref, 8e-3, f"{dist} N{N} out")  # (measured 1.7e-3 to 4.1e-3: bf16 out)
        dout = torch.randn(ref.shape, generator=g).bfloat16()
        got = torch.autograd.grad(out, a, dout)
        want = torch.autograd.grad(ref, b, dout.double())
        for name, x, y in zip("qkv", got, want):
            assert_close(x, y, 8e-3, f"{dist} N{N} d{name}")  # (1.5e-3 to 4.7e-3)

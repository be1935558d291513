"""attn.torch.scaled_dot_product_attention against torch's SDPA (math backend, float64 oracle):
forward and gradients of query, key, value and float masks over a random sweep of shapes,
masks (bool/float, broadcast), causal, GQA, scale, 3-D/4-D and dtypes."""

import itertools
import random

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attn.torch as at
from conftest import GRAD_TOL, TOL, assert_close


def oracle(q, k, v, mask=None, **kw):
    """torch's math SDPA in float64 on float64 copies of the inputs."""
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)


def make_case(seed):
    r = random.Random(seed)
    B = r.choice([1, 2, 3])
    Hkv = r.choice([1, 2, 3])
    group = r.choice([1, 1, 2, 3]) if seed % 3 else 1
    Hq = Hkv * group
    L, S = r.choice([1, 2, 5, 17, 33]), r.choice([1, 3, 7, 16, 31])
    E, Ev = r.choice([1, 4, 8, 13]), r.choice([1, 4, 8, 9])
    mask_kind = r.choice(["none", "bool", "float"])
    mask_shape = r.choice([(B, Hq, L, S), (1, 1, L, S), (L, S), (B, 1, 1, S), (1, Hq, L, 1), (S,)])
    causal = r.random() < 0.3 and mask_kind == "none"
    scale = r.choice([None, None, 0.3])
    three_d = r.random() < 0.2 and Hq == 1 and Hkv == 1
    return dict(B=B, Hq=Hq, Hkv=Hkv, L=L, S=S, E=E, Ev=Ev, mask_kind=mask_kind,
                mask_shape=mask_shape, causal=causal, scale=scale, three_d=three_d)


def tensors(c, gen):
    shape = lambda H, N, D: (c["B"], N, D) if c["three_d"] else (c["B"], H, N, D)  # noqa: E731
    q = torch.randn(*shape(c["Hq"], c["L"], c["E"]), dtype=torch.float64, generator=gen)
    k = torch.randn(*shape(c["Hkv"], c["S"], c["E"]), dtype=torch.float64, generator=gen)
    v = torch.randn(*shape(c["Hkv"], c["S"], c["Ev"]), dtype=torch.float64, generator=gen)
    mask = None
    if c["mask_kind"] == "bool":
        mask = torch.rand(*c["mask_shape"], generator=gen) < 0.7
        # keep at least one key per row, so torch (NaN on fully masked rows) is a valid oracle
        mask = mask.expand(*torch.broadcast_shapes(mask.shape, (c["L"], c["S"]))).clone()
        mask[..., 0] = True
    elif c["mask_kind"] == "float":
        mask = torch.randn(*c["mask_shape"], dtype=torch.float64, generator=gen)
    if c["three_d"] and mask is not None and mask.dim() == 4:
        mask = mask[:, 0]
    return q, k, v, mask


CASES = list(range(40))


@pytest.mark.parametrize("seed", CASES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_forward_and_grads(seed, dtype):
    c = make_case(seed)
    gen = torch.Generator().manual_seed(seed)
    q, k, v, mask = tensors(c, gen)
    kw = dict(is_causal=c["causal"], scale=c["scale"], enable_gqa=c["Hq"] != c["Hkv"])
    want_grad_mask = mask is not None and mask.is_floating_point()

    ins = [t.clone().requires_grad_() for t in (q, k, v)]
    m64 = mask.clone().requires_grad_() if want_grad_mask else mask
    ref = oracle(*ins, m64, **kw)

    low = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
    mlow = mask
    if want_grad_mask:
        mlow = mask.to(dtype).requires_grad_()
    out = at.scaled_dot_product_attention(*low, mlow, **kw)
    assert out.dtype == dtype and out.shape == ref.shape
    # compare with the oracle on the rounded inputs, so only attn's arithmetic is measured
    ins_r = [t.detach().to(dtype).double().requires_grad_() for t in (q, k, v)]
    m_r = mlow.detach().double().requires_grad_() if want_grad_mask else mask
    ref_r = oracle(*ins_r, m_r, **kw)
    assert_close(out, ref_r, TOL[dtype], f"out {c}")

    dout = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    targets_r = ins_r + ([m_r] if want_grad_mask else [])
    targets = low + ([mlow] if want_grad_mask else [])
    g_ref = torch.autograd.grad(ref_r, targets_r, dout)
    g = torch.autograd.grad(out, targets, dout.to(dtype))
    for name, a, b in zip(["dq", "dk", "dv", "dmask"], g, g_ref):
        assert a.dtype == dtype, name
        assert_close(a, b, GRAD_TOL[dtype], f"{name} {c}")
    if dtype == torch.float64:  # and the untouched oracle, for good measure
        assert_close(out, ref, 1e-12, "out vs f64")


@pytest.mark.parametrize("shape", [(5, 8), (2, 5, 8), (2, 3, 2, 5, 8)])
def test_ranks_other_than_4(shape):
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(*shape, dtype=torch.float64, generator=gen)
    k = torch.randn(*shape[:-2], 6, 8, dtype=torch.float64, generator=gen)
    v = torch.randn(*shape[:-2], 6, 3, dtype=torch.float64, generator=gen)
    mask = torch.rand(shape[-2], 6, generator=gen) < 0.8
    mask[:, 0] = True
    assert_close(at.scaled_dot_product_attention(q, k, v, mask), oracle(q, k, v, mask), 1e-12, str(shape))


def test_fully_masked_row_contract():
    """attn's contract: a row with no key left gives 0 and zero gradients, never NaN. PyTorch's
    math backend (torch >= 2.5, _safe_softmax) also gives 0 here; older ones gave NaN. attn is
    checked on its own contract, and the oracle's value is stated, not assumed."""
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False  # row 1 sees no key
    out = at.scaled_dot_product_attention(q, k, v, mask)
    assert torch.all(out[:, :, 1] == 0)
    out.sum().backward()
    assert torch.all(q.grad[:, :, 1] == 0) and torch.isfinite(k.grad).all() and torch.isfinite(v.grad).all()
    ref = oracle(q.detach(), k.detach(), v.detach(), mask)
    torch_row = ref[:, :, 1]
    assert bool(torch.isnan(torch_row).all()) or bool((torch_row == 0).all())
    assert_close(out[:, :, [0, 2]], ref[:, :, [0, 2]], 1e-12, "other rows")


def test_float_mask_broadcast_gradient_shape():
    q = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    m = torch.randn(1, 3, 1, 6, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    v = torch.randn(2, 3, 6, 5, dtype=torch.float64)
    at.scaled_dot_product_attention(q, k, v, m).sum().backward()
    m2 = m.detach().clone().requires_grad_()
    oracle(q, k, v, m2).sum().backward()
    assert m.grad.shape == m.shape
    assert_close(m.grad, m2.grad, 1e-10, "dmask")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 3, 1, 9), (9, 9), (1, 3, 9, 9)])
def test_float_mask_gradient_on_the_fused_kernels(dtype, shape):
    """A float mask's gradient runs on the fused kernels (masks shared by batch entries or heads
    included), and a float mask that autograd does not ask a gradient for (an additive padding
    or causal mask, a fixed bias) is not differentiated at all: the grads of q, k, v (and the
    mask) equal torch's math SDPA (float64, on the rounded inputs) either way."""
    import attn
    gen = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, 3, 9, 8, dtype=torch.float64, generator=gen).to(dtype) for _ in range(3))
    mask = torch.randn(*shape, dtype=torch.float64, generator=gen) * 2
    mask[..., 4] = -float("inf")  # a key no row sees, as a padding mask would
    mask = mask.to(dtype)
    dout = torch.randn(2, 3, 9, 8, dtype=torch.float64, generator=gen)
    low = [t.clone().requires_grad_() for t in (q, k, v)]
    out = at.scaled_dot_product_attention(*low, mask)
    g = torch.autograd.grad(out, low, dout.to(dtype))
    ins_r = [t.double().requires_grad_() for t in (q, k, v)]
    ref = oracle(*ins_r, mask.double())
    g_ref = torch.autograd.grad(ref, ins_r, dout)
    assert_close(out, ref, TOL[dtype], "out")
    for name, a, b in zip(["dq", "dk", "dv"], g, g_ref):
        assert_close(a, b, GRAD_TOL[dtype], name)
    r = attn.attention(q, k, v, attn_mask=mask, return_lse=True)
    without = attn.attention_backward(q, k, v, r.out, dout.to(dtype), r.lse, attn_mask=mask,
                                      mask_gradient=False)
    assert without.backend == "cpu" and without.dattn_mask is None
    with pytest.raises(TypeError, match="attention_backward: mask_gradient must be a bool, got str"):
        attn.attention_backward(q, k, v, r.out, dout.to(dtype), r.lse, attn_mask=mask, mask_gradient="no")
    full = attn.attention_backward(q, k, v, r.out, dout.to(dtype), r.lse, attn_mask=mask)
    assert full.backend == "cpu" and tuple(full.dattn_mask.shape) == shape
    for name, a, b in zip(["dq", "dk", "dv"], without[:3], full[:3]):
        assert_close(a, b, GRAD_TOL[dtype], name + " with and without dattn_mask")
    m_r = mask.double().requires_grad_()
    ref = oracle(*(t.double() for t in (q, k, v)), m_r)
    (dm_ref,) = torch.autograd.grad(ref, [m_r], dout)
    assert_close(full.dattn_mask, dm_ref, GRAD_TOL[dtype], "dattn_mask")
    ml = mask.clone().requires_grad_()
    (dm,) = torch.autograd.grad(at.scaled_dot_product_attention(q, k, v, ml), [ml], dout.to(dtype))
    assert_close(dm, dm_ref, GRAD_TOL[dtype], "dattn_mask through autograd")


def test_dropout_refused_and_extras():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="dropout_p = 0.1 is not supported"):
        at.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    with pytest.raises(TypeError, match="unknown keyword"):
        at.scaled_dot_product_attention(q, q, q, droput=0.0)
    with pytest.raises(ValueError, match="enable_gqa"):
        at.scaled_dot_product_attention(q, torch.randn(1, 4, 3, 4), torch.randn(1, 4, 3, 4))
    # an extra: softcap changes the result, window (0, 0) sees only the diagonal
    v = torch.randn(1, 2, 3, 4)
    out = at.scaled_dot_product_attention(q, q, v, window=(0, 0))
    assert_close(out, v, 1e-6, "window (0, 0)")


def test_alibi_and_sinks_gradients():
    """alibi_slopes and sinks (attn extras) get gradients; checked by finite differences."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    slopes = torch.tensor([0.5, 0.25], dtype=torch.float64, requires_grad=True)
    sinks = torch.tensor([0.1, -0.3], dtype=torch.float64, requires_grad=True)
    f = lambda q, k, v, s, z: at.scaled_dot_product_attention(q, k, v, alibi_slopes=s, sinks=z,  # noqa: E731
                                                              is_causal=True, softcap=2.0)
    assert torch.autograd.gradcheck(f, (q, k, v, slopes, sinks))


def _cpu_has(flag):
    try:
        with open("/proc/cpuinfo") as f:
            return any(flag in line.split() for line in f if line.startswith("flags"))
    except OSError:
        return False


# Head sizes and lengths of real models, so that the fast paths run: key blocks of 128 or 256
# with a ragged last block (S = 300), D a multiple of 32 (the AMX tiles on CPUs that have them),
# GQA, causal with Nq != Nk (bottom-right), a padding mask and a float bias.
BIG = [
    dict(Hq=4, Hkv=2, L=300, S=300, E=64, Ev=64, mask="none", causal=False),
    dict(Hq=2, Hkv=2, L=129, S=300, E=128, Ev=128, mask="none", causal=True),
    dict(Hq=4, Hkv=1, L=70, S=300, E=128, Ev=64, mask="bool", causal=False),
    dict(Hq=2, Hkv=2, L=96, S=257, E=64, Ev=96, mask="float", causal=False),
    dict(Hq=8, Hkv=2, L=1, S=300, E=128, Ev=128, mask="none", causal=False),  # decode
]


# Tighter than TOL/GRAD_TOL (those cover head sizes of 1 and tiny rows): about 4x the largest
# error measured over these cases on the AMX and the AVX-512 paths.
BIG_TOL = {torch.float32: (4e-6, 8e-6), torch.bfloat16: (1e-2, 1.6e-2), torch.float16: (1.5e-3, 2e-3)}


@pytest.mark.parametrize("case", range(len(BIG)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_model_sized_heads_on_the_fast_kernels(case, dtype):
    """attn against torch's float64 math SDPA (on the rounded inputs) at model-sized heads, forward
    and the gradients of q, k, v; on a CPU with AMX the bf16 prefill cases must run on the tiles."""
    import attn
    c = BIG[case]
    gen = torch.Generator().manual_seed(100 + case)
    q = torch.randn(2, c["Hq"], c["L"], c["E"], dtype=torch.float64, generator=gen).to(dtype)
    k = torch.randn(2, c["Hkv"], c["S"], c["E"], dtype=torch.float64, generator=gen).to(dtype)
    v = torch.randn(2, c["Hkv"], c["S"], c["Ev"], dtype=torch.float64, generator=gen).to(dtype)
    mask = None
    if c["mask"] == "bool":
        mask = torch.arange(c["S"]) < torch.tensor([[250], [300]]).view(2, 1, 1, 1)
    elif c["mask"] == "float":
        mask = (torch.randn(1, c["Hq"], c["L"], c["S"], dtype=torch.float64, generator=gen) * 2).to(dtype)
    kw = dict(is_causal=c["causal"], enable_gqa=c["Hq"] != c["Hkv"])
    path = attn.explain_backend(q, k, v, attn_mask=mask, is_causal=c["causal"])
    bwd_path = attn.explain_backend(q, k, v, attn_mask=mask, is_causal=c["causal"], backward=True)
    if dtype == torch.bfloat16 and c["L"] > 1 and _cpu_has("amx_bf16") and _cpu_has("amx_tile"):
        import os
        if os.environ.get("ATTN_CPU_ISA", "") in ("", "amx"):
            assert "AMX tiles" in path, path
            if c["E"] % 32 == 0 and c["Ev"] % 32 == 0:
                assert "AMX tiles" in bwd_path, bwd_path

    low = [t.clone().requires_grad_() for t in (q, k, v)]
    out = at.scaled_dot_product_attention(*low, mask, **kw)
    ins_r = [t.double().requires_grad_() for t in (q, k, v)]
    ref = oracle(*ins_r, None if mask is None else mask.double() if mask.is_floating_point() else mask, **kw)
    assert out.dtype == dtype
    tol, grad_tol = BIG_TOL[dtype]
    assert_close(out, ref, tol, f"out {c} ({path})")
    dout = torch.randn(ref.shape, dtype=torch.float64, generator=gen)
    g = torch.autograd.grad(out, low, dout.to(dtype))
    g_ref = torch.autograd.grad(ref, ins_r, dout)
    for name, a, b in zip(["dq", "dk", "dv"], g, g_ref):
        assert a.dtype == dtype, name
        assert_close(a, b, grad_tol, f"{name} {c} ({bwd_path})")


def eager_with_sinks(q, k, v, mask, sinks):
    """gpt-oss's eager attention: each head's sink logit as one more column of the scores,
    dropped after the softmax."""
    s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5 + mask
    sink = sinks.reshape(1, -1, 1, 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1] @ v


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_hf_finfo_min_mask_with_sinks_against_eager(dtype):
    """HF-style float masks (0 kept, finfo.min not; a padding query row keeps no key) beside
    sinks, as gpt-oss runs them: out, dq, dk, dv and dsinks against the eager formula in float64.
    A row that keeps no key gives zeros (the sink takes its weight)."""
    gen = torch.Generator().manual_seed(5)
    B, H, L, S, E = 2, 2, 5, 7, 8
    q, k, v = (torch.randn(B, H, n, E, dtype=torch.float64, generator=gen) for n in (L, S, S))
    keep = torch.rand(B, 1, L, S, generator=gen) < 0.6
    keep[..., 0, :] = False                      # row 0: no key kept
    keep[..., 1, :] = True                       # row 1: every key
    mask = torch.where(keep, 0.0, torch.finfo(torch.float32).min).double()
    sinks = torch.tensor([0.4, -1.2], dtype=torch.float64)
    dout = torch.randn(B, H, L, E, dtype=torch.float64, generator=gen)

    leaves = [x.clone().requires_grad_() for x in (q, k, v, sinks)]
    want = eager_with_sinks(*leaves[:3], mask, leaves[3])
    (want * dout).sum().backward()
    assert torch.count_nonzero(want[:, :, 0]) == 0

    got_leaves = [x.to(dtype).requires_grad_() for x in (q, k, v, sinks)]
    out = at.scaled_dot_product_attention(*got_leaves[:3], attn_mask=mask.to(dtype), sinks=got_leaves[3])
    (out * dout.to(dtype)).sum().backward()
    assert torch.count_nonzero(out[:, :, 0]) == 0
    assert_close(out, want, TOL[dtype], "out")
    for g, w, name in zip(got_leaves, leaves, ("dq", "dk", "dv", "dsinks")):
        assert_close(g.grad, w.grad, GRAD_TOL[dtype], name)


def test_sinks_beside_a_shifted_mask_gradcheck():
    """The backward of sinks beside a float mask shifted past ±1024 (rows at 5000 + x, a row of
    finfo.min): gradients of q, k, v and sinks by central finite differences."""
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    v = torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=gen, requires_grad=True)
    sinks = torch.tensor([4999.5, 5001.0], dtype=torch.float64, requires_grad=True)
    mask = 5000.0 + torch.rand(3, 5, dtype=torch.float64, generator=gen)
    mask[1] = torch.finfo(torch.float32).min  # nothing kept: the sink takes the row
    f = lambda q, k, v, z: at.scaled_dot_product_attention(q, k, v, attn_mask=mask, sinks=z)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v, sinks))

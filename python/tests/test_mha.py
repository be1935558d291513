"""attn.torch.MultiheadAttention against torch.nn.MultiheadAttention with one state dict:
outputs, attention weights and parameter gradients, batch_first both ways, key_padding_mask,
attn_mask (bool and float, 2-D and 3-D), kdim != vdim, bias_k/bias_v, add_zero_attn."""

import pytest
import torch

import attn.torch as at
from conftest import assert_close

E, H, L, S, N = 12, 3, 5, 7, 2


def pair(**kw):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(E, H, **kw).double()
    mine = at.MultiheadAttention(E, H, **kw).double()
    missing, unexpected = mine.load_state_dict(ref.state_dict())
    assert not missing and not unexpected
    assert [n for n, _ in mine.named_parameters()] == [n for n, _ in ref.named_parameters()]
    return ref, mine


def inputs(batch_first, kdim=E, vdim=E):
    g = torch.Generator().manual_seed(1)
    shape = (lambda n, d: (N, n, d)) if batch_first else (lambda n, d: (n, N, d))
    return (torch.randn(*shape(L, E), dtype=torch.float64, generator=g),
            torch.randn(*shape(S, kdim), dtype=torch.float64, generator=g),
            torch.randn(*shape(S, vdim), dtype=torch.float64, generator=g))


def masks(kind):
    g = torch.Generator().manual_seed(2)
    kpm = attn_mask = None
    if kind in ("kpm", "both"):
        kpm = torch.zeros(N, S, dtype=torch.bool)
        kpm[0, -2:] = True
    if kind in ("attn2d", "both"):
        attn_mask = torch.rand(L, S, generator=g) < 0.3
        attn_mask[:, 0] = False
    if kind == "attn3d":
        attn_mask = torch.rand(N * H, L, S, generator=g) < 0.3
        attn_mask[..., 0] = False
    if kind == "float":
        attn_mask = torch.randn(L, S, dtype=torch.float64, generator=g)
        kpm = torch.randn(N, S, dtype=torch.float64, generator=g)
    if kind == "causal":
        attn_mask = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)[:, :S] if S == L else \
            torch.triu(torch.full((L, S), float("-inf"), dtype=torch.float64), 1)
    return kpm, attn_mask


def check(ref, mine, q, k, v, **kw):
    a, wa = ref(q, k, v, **kw)
    b, wb = mine(q, k, v, **kw)
    assert_close(b, a, 1e-10, "output")
    if wa is None:
        assert wb is None
    else:
        assert_close(wb, wa, 1e-10, "weights")
    g = torch.randn_like(a)
    ga = torch.autograd.grad(a, list(ref.parameters()), g, allow_unused=True)
    gb = torch.autograd.grad(b, list(mine.parameters()), g, allow_unused=True)
    for (name, _), x, y in zip(ref.named_parameters(), gb, ga):
        assert (x is None) == (y is None), name
        if x is not None:
            assert_close(x, y, 1e-9, f"d{name}")


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("mask", ["none", "kpm", "attn2d", "attn3d", "both", "float", "causal"])
@pytest.mark.parametrize("average", [True, False])
def test_against_torch(batch_first, mask, average):
    ref, mine = pair(batch_first=batch_first)
    q, k, v = inputs(batch_first)
    kpm, am = masks(mask)
    check(ref, mine, q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=average)


@pytest.mark.parametrize("options", [
    {"kdim": 4, "vdim": 6}, {"bias": False}, {"add_bias_kv": True}, {"add_zero_attn": True},
    {"add_bias_kv": True, "add_zero_attn": True, "kdim": 5, "vdim": 3}])
def test_constructor_options(options):
    ref, mine = pair(**options)
    q, k, v = inputs(False, options.get("kdim", E), options.get("vdim", E))
    kpm, am = masks("both")
    check(ref, mine, q, k, v, key_padding_mask=kpm, attn_mask=am)


def test_self_attention_need_weights_false_and_unbatched():
    ref, mine = pair(batch_first=True)
    x = inputs(True)[0]
    check(ref, mine, x, x, x, need_weights=False)
    x1 = x[0]
    check(ref, mine, x1, x1, x1)


def test_is_causal_hint():
    ref, mine = pair()
    q, k, v = inputs(False)
    am = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.float64)
    check(ref, mine, q, q, q, attn_mask=am, is_causal=True)
    with pytest.raises(ValueError, match="is_causal"):
        mine(q, q, q, is_causal=True)


def test_float_attn_mask_gradient():
    ref, mine = pair()
    q, k, v = inputs(False)
    m1 = torch.randn(L, S, dtype=torch.float64, requires_grad=True)
    m2 = m1.detach().clone().requires_grad_()
    ref(q, k, v, attn_mask=m1)[0].sum().backward()
    mine(q, k, v, attn_mask=m2)[0].sum().backward()
    assert_close(m2.grad, m1.grad, 1e-10, "dattn_mask")


def test_gqa_num_kv_heads():
    """num_kv_heads = 1 (multi-query): the same as torch's MHA whose k/v projections repeat
    one head's weights for every head."""
    Hkv, hd = 1, E // H
    mine = at.MultiheadAttention(E, H, num_kv_heads=Hkv, batch_first=True).double()
    assert mine.in_proj_weight.shape == (E + 2 * Hkv * hd, E)
    ref = torch.nn.MultiheadAttention(E, H, batch_first=True).double()
    with torch.no_grad():
        Wq, Wk, Wv = mine.in_proj_weight.split([E, hd, hd])
        bq, bk, bv = mine.in_proj_bias.split([E, hd, hd])
        ref.in_proj_weight.copy_(torch.cat([Wq, Wk.repeat(H, 1), Wv.repeat(H, 1)]))
        ref.in_proj_bias.copy_(torch.cat([bq, bk.repeat(H), bv.repeat(H)]))
        ref.out_proj.load_state_dict(mine.out_proj.state_dict())
    x = inputs(True)[0]
    a, wa = ref(x, x, x)
    b, wb = mine(x, x, x)
    assert_close(b, a, 1e-10, "gqa output")
    assert_close(wb, wa, 1e-10, "gqa weights")


def test_dropout_refused_in_training():
    mine = at.MultiheadAttention(E, H, dropout=0.1)
    x = torch.randn(L, N, E)
    with pytest.raises(ValueError, match="dropout"):
        mine(x, x, x)
    mine.eval()
    assert mine(x, x, x)[0].shape == (L, N, E)


@pytest.mark.parametrize("mask", ["none", "kpm", "attn2d", "both", "float", "causal"])
@pytest.mark.parametrize("average", [True, False])
def test_float32_weights_against_torch(mask, average):
    """float32: the weights come from attn's cpu kernels (return_qk="probabilities"), not the
    float64 reference; against torch's float32 MultiheadAttention within float32 rounding."""
    ref, mine = pair(batch_first=True)
    ref, mine = ref.float(), mine.float()
    q, k, v = (t.float() for t in inputs(True))
    kpm, am = masks(mask)
    kpm = kpm.float() if kpm is not None and kpm.dtype == torch.float64 else kpm
    am = am.float() if am is not None and am.dtype == torch.float64 else am
    a, wa = ref(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=average)
    b, wb = mine(q, k, v, key_padding_mask=kpm, attn_mask=am, average_attn_weights=average)
    assert wb.dtype == torch.float32
    assert_close(b, a, 2e-5, "output")
    assert_close(wb, wa, 2e-5, "weights")
    assert ((wb == 0) == (wa == 0)).all(), "masked keys weigh exactly 0"

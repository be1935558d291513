"""torch.autograd.gradcheck (float64, central differences) of attn's backward passes: the core
op with its differentiable options, every family score × distribution pair with its learned
parameters, and the positional encodings."""

import pytest
import torch

import attn.torch as at

torch.manual_seed(0)


def r(*shape, grad=True):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=grad)


@pytest.mark.parametrize("opts", [
    {},
    {"is_causal": True},
    {"is_causal": True, "alignment": "bottom_right", "window": (2, 0)},
    {"softcap": 1.5, "scale": 0.7},
    {"alibi": True},
    {"sinks": True},
    {"float_mask": True},
    {"gqa": True, "float_mask": True, "is_causal": True},
])
def test_core_op(opts):
    opts = dict(opts)
    Hkv = 1 if opts.pop("gqa", False) else 2
    q, k, v = r(2, 2, 3, 4), r(2, Hkv, 5, 4), r(2, Hkv, 5, 3)
    inputs = [q, k, v]
    names = ["q", "k", "v"]
    if opts.pop("float_mask", False):
        inputs.append(r(1, 2, 3, 5)); names.append("attn_mask")
    if opts.pop("alibi", False):
        inputs.append(torch.tensor([0.3, 0.6], dtype=torch.float64, requires_grad=True)); names.append("alibi_slopes")
    if opts.pop("sinks", False):
        inputs.append(torch.tensor([0.2, -0.1], dtype=torch.float64, requires_grad=True)); names.append("sinks")

    def f(*xs):
        kw = dict(zip(names[3:], xs[3:]))
        return at.attention(*xs[:3], **kw, **opts)
    assert torch.autograd.gradcheck(f, tuple(inputs))


def test_core_op_3d_layout():
    q, k, v = r(2, 3, 2 * 4), r(2, 5, 1 * 4), r(2, 5, 1 * 3)
    assert torch.autograd.gradcheck(lambda q, k, v: at.attention(q, k, v, q_num_heads=2, kv_num_heads=1),
                                    (q, k, v))


D, Dk, A, Nq, Nk, Dv = 4, 3, 5, 3, 6, 2

SCORES = {
    "dot": {},
    "scaled_dot": {"scale": 0.8},
    "general": {"W": (D, D)},
    "biased_general": {"W": (D, D), "b": (D,)},
    "activated_general": {"W": (D, D), "b": (1,), "activation": "tanh"},
    "additive": {"W_q": (A, D), "W_k": (A, D), "b": (A,), "w_v": (A,)},
    "cosine": {"temperature": "scalar"},
    "location": {"W_a": (Nk, D)},
    "gaussian": {"bandwidth": "scalar"},
    "triangle": {"bandwidth": "scalar"},
}
DISTRIBUTIONS = ["softmax", "sigmoid", "sparsemax", "entmax15", "topk"]


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
@pytest.mark.parametrize("score", sorted(SCORES))
def test_family_pair(score, distribution):
    if score == "triangle" and distribution != "softmax":
        distribution = "kernel" if distribution == "softmax" else distribution
    q, k, v = r(1, 2, Nq, D), r(1, 2, Nk, D), r(1, 2, Nk, Dv)
    params, names = [], []
    consts = {}
    for name, spec in SCORES[score].items():
        if spec == "scalar":
            params.append(torch.tensor(1.3, dtype=torch.float64, requires_grad=True)); names.append(name)
        elif isinstance(spec, tuple):
            params.append(r(*spec) * 0.5); names.append(name)
        else:
            consts[name] = spec
    if distribution == "sigmoid":
        params.append(torch.tensor(-0.4, dtype=torch.float64, requires_grad=True)); names.append("sigmoid_bias")
    if distribution == "topk":
        consts["top_k"] = 3
    params = [p.detach().requires_grad_() for p in params]

    def f(q, k, v, *ps):
        return at.attention_family(q, k, v, score=score, distribution=distribution,
                                   **dict(zip(names, ps)), **consts)
    # sparse maps have kinks where the support changes; random inputs sit away from them
    assert torch.autograd.gradcheck(f, (q, k, v, *params), atol=1e-6, rtol=1e-4)


def test_family_kernel_triangle():
    q, k, v = r(1, 1, Nq, D), r(1, 1, Nk, D), r(1, 1, Nk, Dv)
    h = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    f = lambda q, k, v, h: at.attention_family(q, k, v, score="triangle", distribution="kernel", bandwidth=h)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v, h))


def test_multidimensional_additive():
    q, k, v = r(1, 1, Nq, D), r(1, 1, Nk, D), r(1, 1, Nk, Dv)
    Wq, Wk, b, wv = r(A, D), r(A, D), r(A), r(Dv, A)
    f = lambda q, k, v, Wq, Wk, b, wv: at.attention_family(q, k, v, score="additive", W_q=Wq, W_k=Wk, b=b, w_v=wv)  # noqa: E731
    assert torch.autograd.gradcheck(f, (q, k, v, Wq, Wk, b, wv))


@pytest.mark.parametrize("layout", ["half_split", "interleaved"])
@pytest.mark.parametrize("positions", [0, 5, "ids"])
def test_rotary(layout, positions):
    x = r(2, 3, 4, 8)
    pos = torch.tensor([3, 1, 4, 1], dtype=torch.int64) if positions == "ids" else positions
    assert torch.autograd.gradcheck(lambda x: at.rotary(x, pos, layout=layout, rotary_dim=6), (x,))


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_relative_bias(bidirectional):
    table = r(8, 2)
    f = lambda t: at.t5_relative_bias(t, 5, 7, bidirectional=bidirectional, max_distance=16)  # noqa: E731
    assert torch.autograd.gradcheck(f, (table,))


def test_t5_bias_through_attention():
    table, q, k, v = r(8, 2), r(1, 2, 4, 3), r(1, 2, 4, 3), r(1, 2, 4, 3)
    f = lambda t, q, k, v: at.scaled_dot_product_attention(q, k, v, at.t5_relative_bias(t, 4, 4), scale=1.0)  # noqa: E731
    assert torch.autograd.gradcheck(f, (table, q, k, v))


def test_general_attention_module_biased_matches_torch_formula():
    # e_ij = k_jᵀ (Wᵀ q_i + b) with b [Dk]: the bias differs per key, so softmax does not cancel it.
    m = at.GeneralAttention(D, Dk, bias=True, dtype=torch.float64)
    assert m.b.shape == (Dk,)
    with torch.no_grad():
        m.b.copy_(torch.randn(Dk, dtype=torch.float64))
    q, k, v = r(2, Nq, D), r(2, Nk, Dk), r(2, Nk, Dv)
    want = torch.softmax((q @ m.W + m.b) @ k.transpose(-1, -2), dim=-1) @ v
    got = m(q, k, v)
    assert torch.allclose(got, want, atol=1e-12), (got - want).abs().max()
    assert torch.autograd.gradcheck(lambda q, k, v, W, b: at.attention_family(
        q, k, v, score="biased_general", W=W, b=b, q_num_heads=1, kv_num_heads=1), (q, k, v, m.W, m.b))


@pytest.mark.parametrize("distribution,k_top", [("hardmax", 1), ("topk", 3), ("topk", 8)])
def test_sparse_rows_backward_from_their_kept_keys(distribution, k_top):
    # float32 runs the fused path, whose forward keeps each row's keys; the autograd Function
    # gives them back to the backward. Its gradients are those of the backward that finds the keys
    # again (the same bits), and of the same formula written in torch (float64, top-k + softmax).
    import attn
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 4, 37, 16, generator=g) for _ in range(3))
    k, v = k[:, :2], v[:, :2]
    q, k, v = (x.contiguous().requires_grad_() for x in (q, k, v))
    dout = torch.randn(2, 4, 37, 16, generator=g)
    opts = {"distribution": distribution, "top_k": k_top} if distribution == "topk" else {"distribution": distribution}
    out = at.attention_family(q, k, v, **opts)
    out.backward(dout)
    again = attn.attention_family_backward(q.detach(), k.detach(), v.detach(), dout, **opts)
    for got, want in ((q.grad, again.dq), (k.grad, again.dk), (v.grad, again.dv)):
        assert torch.equal(got, torch.as_tensor(want))
    q64, k64, v64 = (x.detach().double().repeat_interleave(2, dim=1) if x is not q else x.detach().double()
                     for x in (q, k, v))
    q64, k64, v64 = (x.requires_grad_() for x in (q64, k64, v64))
    s = q64 @ k64.transpose(-1, -2) / 4.0
    top, idx = s.topk(k_top, dim=-1)
    alpha = torch.softmax(top, dim=-1)
    ref = (alpha.unsqueeze(-1) * torch.gather(v64.unsqueeze(2).expand(-1, -1, 37, -1, -1), 3,
                                               idx[..., None].expand(-1, -1, -1, -1, 16))).sum(-2)
    ref.backward(dout.double())
    assert torch.allclose(out.double(), ref, atol=1e-5)
    dk = k64.grad.view(2, 2, 2, 37, 16).sum(2) if distribution == "topk" else torch.zeros(2, 2, 37, 16, dtype=torch.float64)
    dq = q64.grad if distribution == "topk" else torch.zeros_like(q64)
    assert torch.allclose(q.grad.double(), dq, atol=1e-4)
    assert torch.allclose(k.grad.double(), dk, atol=1e-4)
    assert torch.allclose(v.grad.double(), v64.grad.view(2, 2, 2, 37, 16).sum(2), atol=1e-4)
